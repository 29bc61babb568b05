"""egress.py: a two-arm LB's egress interface, resolved by name into what the datapath needs of it.

One-arm (no `datapath.egress`), the balancer sends each encapsulated frame back out of the interface
it came in on (XDP_TX). Two-arm, it receives on `datapath.interfaces` and sends every encapsulated
frame out of the egress interface instead (XDP_REDIRECT through the devmap lb_egress), from that
interface's own MAC to `encap.nexthop_mac`, the egress link's neighbour; the ICMP answers it makes
itself (echo, too big) still go back by the interface the question came in on. The ifindex and MAC
are load-time constants (.rodata: the verifier drops the two-arm code from a one-arm program) and the
ifindex is also the devmap's one entry, written in the namespace of the process that loads.

    egress = resolve("lb-eg")            # in the LB's namespace
    Datapath.load(obj, egress=egress)
"""

from __future__ import annotations

import errno as _errno
import fcntl
import socket
import struct
from dataclasses import dataclass
from typing import Any

from balancer.errors import DatapathError

_SIOCGIFHWADDR = 0x8927
_SIOCGIFMTU = 0x8921
_ARPHRD_ETHER = 1
_IFREQ = "16s16s"  # struct ifreq: the name, then a 16-byte union (sockaddr or int)


@dataclass(frozen=True)
class Egress:
    """The egress interface as the balancer was loaded with it: name, ifindex, MAC (lower case)."""

    ifname: str
    ifindex: int
    mac: str

    def rodata(self) -> dict[str, int]:
        """The .rodata values that turn two-arm on: the ifindex, and the MAC's bytes first in memory."""
        return {"cfg_egress_ifindex": self.ifindex,
                "cfg_egress_mac": int.from_bytes(bytes.fromhex(self.mac.replace(":", "")), "little")}

    def status(self) -> dict[str, Any]:
        """For `lbctl status`: as loaded, plus the name its ifindex has now ("" once it is gone) and its MTU."""
        try:
            now = socket.if_indextoname(self.ifindex)
        except OSError:
            now = ""
        return {**self.to_json(), "now": now, "mtu": mtu_of(now) if now else 0}

    def to_json(self) -> dict[str, Any]:
        return {"ifname": self.ifname, "ifindex": self.ifindex, "mac": self.mac}

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Egress:
        return cls(str(raw["ifname"]), int(raw["ifindex"]), str(raw["mac"]))


def _ifreq(ifname: str, request: int) -> bytes:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        return fcntl.ioctl(sock.fileno(), request, struct.pack(_IFREQ, ifname.encode(), b""))


def resolve(ifname: str) -> Egress:
    """The egress interface `ifname` of this network namespace; DatapathError naming it if it is
    missing or has no Ethernet MAC to send from."""
    what = f"find the egress interface '{ifname}' (datapath.egress)"
    try:
        ifindex = socket.if_nametoindex(ifname)
        raw = _ifreq(ifname, _SIOCGIFHWADDR)
    except OSError as exc:
        raise DatapathError(what, exc.errno or _errno.ENODEV,
                            "check the name with `ip link` in the LB's namespace") from exc
    family = struct.unpack_from("H", raw, 16)[0]
    if family != _ARPHRD_ETHER:
        raise DatapathError(what, _errno.EINVAL,
                            f"it is not an Ethernet interface (hardware type {family}): the balancer "
                            "writes Ethernet frames")
    return Egress(ifname, ifindex, ":".join(f"{b:02x}" for b in raw[18:24]))


def check_mtu(egress: Egress, mtu: int) -> None:
    """Refuse a too-big limit (datapath.mtu) above the egress interface's MTU: the interface would drop
    what the balancer sends between the two, and the client would never hear why."""
    have = mtu_of(egress.ifname)
    if have and mtu > have:
        raise DatapathError(f"use datapath.mtu = {mtu} with egress '{egress.ifname}'", _errno.EINVAL,
                            f"its MTU is {have}: frames above it would be dropped there, unanswered; "
                            f"set datapath.mtu = {have} (or less)")


def mtu_of(ifname: str) -> int:
    """The interface's MTU (0 when it is gone)."""
    try:
        return int(struct.unpack_from("i", _ifreq(ifname, _SIOCGIFMTU), 16)[0])
    except OSError:
        return 0
