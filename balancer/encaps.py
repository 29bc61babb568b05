"""encaps.py: the catalogue of encapsulation cases, the one place their ids and facts are written.

A case is one way the balancer wraps a client's packet for a real: the VIP's family, the outer
family, the datapath mode (`_abi.Encap`, the value the C reads from the VIP's metadata) and the
bytes the wrapping adds. Its id names it everywhere (test ids, results, reports, benches, `l4lab
--encap`), by one rule taken from CSIT's test names: the outer stack first, then what it carries::

    ip4-ipip     IPv4 VIP, IPv4 reals: IPv4 in IPv4          (Linux's "ipip")
    ip4-gue1     IPv4 in UDP over IPv4, GUE variant 1 (no GUE header)
    ip4-gue0     IPv4 in GUE variant 0 (4-byte header) in UDP over IPv4
    ip6-ip6ip6   IPv6 in IPv6                                  (Linux's "ip6ip6")
    ip6-gue1     IPv6 in UDP over IPv6, GUE variant 1
    ip6-ip4ip6   IPv4 VIP, IPv6 reals: IPv4 in IPv6            (4in6)

A case is a `str` (its id), so it compares, hashes, formats and serialises as the id, and carries
its facts as attributes::

    >>> IP4_GUE0 == "ip4-gue0", IP4_GUE0.overhead, IP4_GUE0.config_name
    (True, 32, 'gue0')

Facts of one use (a bench's target ratio, a DUT's capabilities, a test's VIP address) stay with
that use, keyed by the case. Adding a mode: its `_abi.Encap` member (C), its name in ModeName, a
row in CASES and its id in EncapId (suites/controller/test_encaps.py checks they agree), and the
tests that are new. Importing this module loads nothing (no libbpf).
"""

from __future__ import annotations

from typing import Any, Final, Literal, cast

from balancer._abi import Encap, Gue

__all__ = [
    "CASES",
    "IDS",
    "IP4_GUE0",
    "IP4_GUE1",
    "IP4_IPIP",
    "IP6_GUE1",
    "IP6_IP4IP6",
    "IP6_IP6IP6",
    "ModeName",
    "SAME_FAMILY",
    "EncapCase",
    "EncapId",
    "by_id",
    "mode_of",
]

# Header sizes the overheads are made of (the LB writes no IPv4 options and no IPv6 extension headers).
IPV4_HEADER: Final = 20  # RFC 791
IPV6_HEADER: Final = 40  # RFC 8200
UDP_HEADER: Final = 8  # RFC 768
GUE0_HEADER: Final = int(Gue.HDR_LEN)  # GUE variant 0 base header (bpf/include/gue.h); variant 1 has none

IpVersion = Literal[4, 6]

#: The modes as configs name them (`encap = "gue1"`): `_abi.Encap`'s members, lower case.
ModeName = Literal["ipip", "gue1", "gue0"]

#: Every case's id, in catalogue order (mypy checks ids against it; a test checks it equals IDS).
EncapId = Literal["ip4-ipip", "ip4-gue1", "ip4-gue0", "ip6-ip6ip6", "ip6-gue1", "ip6-ip4ip6"]


class EncapCase(str):
    """One encapsulation case: a `str` equal to its id, with the encapsulation's facts."""

    vip_family: IpVersion  # 4 or 6, as ip.version and _abi.Family write them
    outer_family: IpVersion
    mode: Encap

    def __new__(cls, id: EncapId, vip_family: IpVersion, outer_family: IpVersion, mode: Encap) -> EncapCase:
        case = super().__new__(cls, id)
        for name, value in (("vip_family", vip_family), ("outer_family", outer_family), ("mode", mode)):
            object.__setattr__(case, name, value)
        return case

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"encap case {self} is read-only: the catalogue is balancer/encaps.py")

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return by_id, (str(self),)  # copies and pickles are the catalogue's own object

    def __repr__(self) -> str:
        return repr(str(self))  # as its id: messages (argparse's choices, f"{x!r}") show 'ip4-gue1'

    @property
    def id(self) -> str:
        """The id as a plain str (`ip4-gue1`)."""
        return str(self)

    @property
    def gue(self) -> bool:
        """Whether the outer header carries UDP (GUE, either variant)."""
        return self.mode in (Encap.GUE1, Encap.GUE0)

    @property
    def config_name(self) -> ModeName:
        """The mode as balancer configs write it (`encap = "gue1"` in lb.toml, `lbctl vip add --encap`)."""
        return cast(ModeName, self.mode.name.lower())

    @property
    def overhead(self) -> int:
        """Bytes the encapsulation adds in front of the client's IP packet."""
        outer = IPV4_HEADER if self.outer_family == 4 else IPV6_HEADER
        if self.gue:
            outer += UDP_HEADER
        if self.mode == Encap.GUE0:
            outer += GUE0_HEADER
        return outer

    @property
    def cross_family(self) -> bool:
        """Whether the reals are reached in the other family than the VIP's (4in6)."""
        return self.vip_family != self.outer_family


IP4_IPIP: Final = EncapCase("ip4-ipip", 4, 4, Encap.IPIP)
IP4_GUE1: Final = EncapCase("ip4-gue1", 4, 4, Encap.GUE1)
IP4_GUE0: Final = EncapCase("ip4-gue0", 4, 4, Encap.GUE0)
IP6_IP6IP6: Final = EncapCase("ip6-ip6ip6", 6, 6, Encap.IPIP)
IP6_GUE1: Final = EncapCase("ip6-gue1", 6, 6, Encap.GUE1)
IP6_IP4IP6: Final = EncapCase("ip6-ip4ip6", 4, 6, Encap.IPIP)

#: Every case, in the order reports list them.
CASES: Final[tuple[EncapCase, ...]] = (IP4_IPIP, IP4_GUE1, IP4_GUE0, IP6_IP6IP6, IP6_GUE1, IP6_IP4IP6)
IDS: Final[tuple[str, ...]] = tuple(c.id for c in CASES)
#: The cases whose reals are reached in the VIP's own family: those a lab sweeps with one address per real.
SAME_FAMILY: Final[tuple[EncapCase, ...]] = tuple(c for c in CASES if not c.cross_family)

_BY_ID: Final = {c.id: c for c in CASES}
_MODES: Final = {m.name.lower(): m for m in Encap}


def by_id(id: str) -> EncapCase:
    """The case of an id; ValueError naming the known ids otherwise."""
    try:
        return _BY_ID[id]
    except KeyError:
        raise ValueError(f"unknown encap id {id!r}: expected one of {', '.join(IDS)}") from None


def mode_of(name: str) -> Encap:
    """The datapath mode of a config's encap name (`ipip`, `gue1`, `gue0`)."""
    try:
        return _MODES[name]
    except KeyError:
        raise ValueError(f"unknown encap {name!r}: expected one of {', '.join(_MODES)}") from None

