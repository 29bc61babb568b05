"""The controller's configuration: the TOML schema, its validation into frozen dataclasses, and dump.

A file looks like ``balancer/examples/lb.toml``. :func:`load` reads and validates one; every error
is a :class:`~balancer.errors.ConfigError` naming the file, the dotted key with list indexes, the
value found and what was expected (``lb.toml: vips[2].healthcheck.port must be 1..65535 but got 0``).
:func:`dump` writes a :class:`Config` back as TOML that :func:`loads` reads back equal, so commands
that edit the state (``lbctl vip add``) and commands that print it (``lbctl status``) share one form.

Defaults that depend on other keys are resolved at load time and written out by :func:`dump`:
``vips.outer_src`` is ``"flow"`` for IPIP and ``"fixed"`` for GUE; ``vips.healthcheck.port`` is
the VIP's port (a wildcard VIP, port 0, must name one).

A VIP whose ``hash`` starts with ``katran`` picks reals as Katran does (balancer/katran_hash.py),
so that it can share an ECMP group with Katran nodes; ``katran_ring`` (only for those VIPs) names
Katran's Maglev: ``"v1"``, Katran's default, where a weight is only a first-round head start (1:10
gives about 1:1), or ``"v2"``, weights in proportion. ``datapath.katran_max_vips`` is the Katran
build's MAX_VIPS (its flow hash's seeds), and ``datapath.ring_size`` must be its RING_SIZE.
"""

from __future__ import annotations

import ipaddress
import os
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal, cast, get_args

from balancer import _abi, encaps, katran_hash
from balancer import config_routes as routing
from balancer.config_routes import DecapAddress, ServerIdFrom, SrcRoute
from balancer.errors import ConfigError, show_value
from balancer.maglev import is_prime
from balancer.validate import MAC_EXAMPLE, Reader, join

__all__ = [
    "Config",
    "DatapathConfig",
    "DecapAddress",
    "SrcRoute",
    "EncapConfig",
    "HealthCheck",
    "IpAddress",
    "MetricsConfig",
    "Real",
    "Vip",
    "dump",
    "load",
    "loads",
    "parse",
]

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

Mode = Literal["native", "generic", "auto"]
Proto = Literal["tcp", "udp"]
EncapName = encaps.ModeName  # the catalogue's (balancer/encaps.py)
# The katran hashes are Katran's flow hash for its VIP flags: none (source address and port),
# F_HASH_NO_SRC_PORT, F_HASH_DPORT_ONLY, F_HASH_SRC_DST_PORT.
HashName = Literal["5tuple", "no-sport", "dport-only", "katran", "katran-no-sport", "katran-dport-only",
                   "katran-src-dst-port"]
KatranRing = katran_hash.RingKind
OuterSrc = Literal["flow", "fixed"]
GueCsum = Literal["compute", "zero"]
CheckType = Literal["tcp", "http", "udp"]
CheckVia = Literal["direct", "tunnel"]

MODES: Final[tuple[Mode, ...]] = get_args(Mode)
PROTOS: Final[tuple[Proto, ...]] = get_args(Proto)
ENCAPS: Final[tuple[EncapName, ...]] = get_args(EncapName)
HASHES: Final[tuple[HashName, ...]] = get_args(HashName)
KATRAN_RINGS: Final[tuple[KatranRing, ...]] = katran_hash.RING_KINDS
OUTER_SRCS: Final[tuple[OuterSrc, ...]] = get_args(OuterSrc)
GUE_CSUMS: Final[tuple[GueCsum, ...]] = get_args(GueCsum)
CHECK_TYPES: Final[tuple[CheckType, ...]] = get_args(CheckType)
CHECK_VIAS: Final[tuple[CheckVia, ...]] = get_args(CheckVia)

MAX_WEIGHT: Final = 65535
U32_MAX: Final = 0xFFFF_FFFF
_IFNAME = re.compile(r"[^\s/:]{1,15}")


@dataclass(frozen=True)
class DatapathConfig:
    """How the XDP program is loaded: interfaces, attach mode, map sizes and load-time constants."""

    interfaces: tuple[str, ...] = ("lb-rt",)
    mode: Mode = "native"
    mtu: int = int(_abi.Limits.DEFAULT_MTU)
    max_vips: int = int(_abi.Limits.DEFAULT_MAX_VIPS)
    max_reals: int = int(_abi.Limits.DEFAULT_MAX_REALS)
    ring_size: int = int(_abi.Limits.DEFAULT_RING_SIZE)
    lru_size: int = int(_abi.Limits.DEFAULT_LRU_SIZE)  # session entries per possible CPU, one table for all
    fallback_size: int = 16384  # accepted and ignored: there is no fallback table since issue 11
    udp_timeout_s: int = int(_abi.Limits.DEFAULT_UDP_TIMEOUT_S)  # idle UDP sessions expire within 1-1 1/16 of it
    frags: bool = False
    object: str = ""  # the BPF object to run (a path or a name, balancer/objects.py); "" = lbctl's default
    katran_max_vips: int = int(_abi.Limits.DEFAULT_KATRAN_MAX_VIPS)  # the Katran fleet's MAX_VIPS (hash seeds)
    egress: str = ""  # two-arm: the interface encapsulated frames leave by ("": one-arm, balancer/egress.py)


@dataclass(frozen=True)
class EncapConfig:
    """What every encapsulated frame carries: next-hop MAC, GUE port and the outer source prefixes.

    ``nexthop_mac = "auto"`` finds the MAC in the kernel (balancer/nexthop.py): the neighbour entry of
    ``nexthop``, else of the default route's gateway on the datapath interface."""

    nexthop_mac: str = "auto"
    gue_port: int = int(_abi.Limits.DEFAULT_GUE_PORT)
    src4: ipaddress.IPv4Network = ipaddress.IPv4Network("198.51.100.128/25")
    src6: ipaddress.IPv6Network = ipaddress.IPv6Network("2001:db8:1b:80::/64")
    nexthop: IpAddress | None = None  # with nexthop_mac = "auto": the router's address on the LB's link


@dataclass(frozen=True)
class Real:
    """A real server behind a VIP, with its Maglev weight (0 = drained: no new flows)."""

    address: IpAddress
    weight: int = 1
    server_id: int | None = None  # the id QUIC connection ids, TCP option 183 or stable routing carry

    @property
    def family(self) -> int:
        """4 or 6."""
        return self.address.version


@dataclass(frozen=True)
class HealthCheck:
    """How the controller probes each real of a VIP; ``port`` is already resolved (never 0)."""

    port: int
    type: CheckType = "tcp"
    path: str = "/"
    interval_s: float = 1.0
    timeout_s: float = 0.5
    rise: int = 2
    fall: int = 2
    via: CheckVia = "direct"


@dataclass(frozen=True)
class Vip:
    """A virtual service (address, port, proto), how it is hashed and encapsulated, and its reals."""

    address: IpAddress
    port: int
    proto: Proto
    encap: EncapName = "ipip"
    hash: HashName = "5tuple"
    lru: bool = True
    outer_src: OuterSrc = "flow"
    gue_csum: GueCsum = "compute"  # GUE outer UDP checksum; "zero" over IPv6 needs reals that accept it
    reals: tuple[Real, ...] = ()
    healthcheck: HealthCheck | None = None
    prefix_len: int | None = None  # a VIP that is a prefix: address is its network address
    server_id_from: ServerIdFrom = "none"
    udp_flow_migration: bool = False
    src_routes: tuple[SrcRoute, ...] = ()
    katran_ring: KatranRing = "v1"  # Katran's Maglev, for the katran hashes only

    @property
    def family(self) -> int:
        """4 or 6."""
        return self.address.version

    @property
    def katran(self) -> bool:
        """Whether the VIP hashes and rings as Katran does."""
        return self.hash.startswith("katran")

    @property
    def key(self) -> tuple[IpAddress, int, Proto]:
        """(address, port, proto): what identifies the VIP, unique within a config (a prefix VIP's
        address is its network address: two prefixes from one address are refused)."""
        return self.address, self.port, self.proto

    @property
    def address_text(self) -> str:
        """The address, or the prefix of a VIP that is one (``10.200.0.0/24``)."""
        return str(self.address) if self.prefix_len is None else f"{self.address}/{self.prefix_len}"

    @property
    def name(self) -> str:
        """``198.51.100.100:80/tcp``, ``[2001:db8:100::100]:80/tcp`` or ``10.200.0.0/24:80/tcp``."""
        host = f"[{self.address_text}]" if self.address.version == 6 else self.address_text
        return f"{host}:{self.port}/{self.proto}"


@dataclass(frozen=True)
class MetricsConfig:
    """Where the Prometheus-style metrics endpoint listens."""

    listen: str = "127.0.0.1:9100"

    @property
    def host(self) -> str:
        """The address part of ``listen``, without IPv6 brackets."""
        return _split_listen(self.listen)[0]

    @property
    def port(self) -> int:
        """The port part of ``listen``."""
        return _split_listen(self.listen)[1]


@dataclass(frozen=True)
class Config:
    """A whole, validated controller configuration."""

    datapath: DatapathConfig = field(default_factory=DatapathConfig)
    encap: EncapConfig = field(default_factory=EncapConfig)
    vips: tuple[Vip, ...] = ()
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    decap: tuple[DecapAddress, ...] = ()  # the LB's own addresses whose tunnel packets it decapsulates


# ---------------------------------------------------------------------------------------------- load


def load(path: str | os.PathLike[str]) -> Config:
    """Read and validate the TOML file at ``path``; errors name the file as given."""
    file = os.fspath(path)
    try:
        with open(file, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise ConfigError(
            file, "", None, "", message=f"cannot read the file: {e.strerror}; check the path"
        ) from e
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(file, "", None, "", message=f"not UTF-8 text ({e.reason}); save it as UTF-8") from e
    return loads(text, file)


def loads(text: str, file: str = "<config>") -> Config:
    """Parse and validate TOML ``text``; ``file`` is the name errors start with."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(file, "", None, "", message=f"not valid TOML: {e}") from e
    return parse(data, file)


def parse(data: Mapping[str, Any], file: str = "<config>") -> Config:
    """Validate an already-decoded TOML document into a :class:`Config`."""
    top = _Table(file, "", data, ("datapath", "encap", "vips", "metrics", "decap"))
    datapath = _datapath(top.table("datapath"))
    encap = _encap(top.table("encap"))
    vips = tuple(_vip(t) for t in top.tables("vips"))
    metrics = _metrics(top.table("metrics"))
    _check_vips(file, datapath, vips)
    return Config(datapath=datapath, encap=encap, vips=vips, metrics=metrics, decap=routing.decaps(top))


def _datapath(t: _Table) -> DatapathConfig:
    d = DatapathConfig()
    interfaces = t.check.array(t.value("interfaces", "a list of interface names", list(d.interfaces)),
                               t.key("interfaces"), "a list of interface names")
    if not interfaces:
        raise t.error("interfaces", interfaces, "at least one interface name")
    for i, name in enumerate(interfaces):
        key = f"interfaces[{i}]"
        if not isinstance(name, str) or not _IFNAME.fullmatch(name) or name in (".", ".."):
            raise t.error(key, name, "an interface name of 1..15 characters without '/', ':' or spaces")
        if name in interfaces[:i]:
            raise t.error(key, name, "an interface not listed before")
    egress = t.string("egress", "an interface name (two-arm), or absent (one-arm)", d.egress)
    if egress and (not _IFNAME.fullmatch(egress) or egress in (".", "..")):
        raise t.error("egress", egress, "an interface name of 1..15 characters without '/', ':' or spaces")
    if egress in interfaces:
        raise t.error("egress", egress, "an interface not in datapath.interfaces (leave egress out for one-arm)")
    ring_size = t.integer("ring_size", 3, U32_MAX, d.ring_size)
    if not is_prime(ring_size):
        raise t.error("ring_size", ring_size, "a prime number (Maglev needs one), such as 65537")
    max_vips = t.integer("max_vips", 1, U32_MAX, d.max_vips)
    if max_vips * ring_size > U32_MAX:
        raise t.error(
            "max_vips",
            max_vips,
            f"at most {U32_MAX // ring_size} with ring_size = {ring_size} "
            "(max_vips × ring_size slots must fit a 32-bit index)",
        )
    return DatapathConfig(
        interfaces=tuple(interfaces),
        mode=t.choice("mode", MODES, d.mode),
        mtu=t.integer("mtu", 68, 9216, d.mtu),
        max_vips=max_vips,
        max_reals=t.integer("max_reals", 2, U32_MAX, d.max_reals),
        ring_size=ring_size,
        lru_size=t.integer("lru_size", 1, U32_MAX, d.lru_size),
        fallback_size=t.integer("fallback_size", 1, U32_MAX, d.fallback_size),
        udp_timeout_s=t.integer("udp_timeout_s", 1, 86400, d.udp_timeout_s),
        frags=t.boolean("frags", d.frags),
        object=_object(t),
        katran_max_vips=t.integer("katran_max_vips", 1, U32_MAX, d.katran_max_vips),
        egress=egress,
    )


def _object(t: _Table) -> str:
    expected = 'a BPF object: a path such as "/opt/l4lab/balancer.o" or a file name such as "balancer.o"'
    name = t.string("object", expected, "")
    if name and ("\0" in name or not name.strip() or name != name.strip()):
        raise t.error("object", name, expected)
    return name


def _encap(t: _Table) -> EncapConfig:
    d = EncapConfig()
    expected = f'"auto" or a MAC address such as "{MAC_EXAMPLE}"'
    mac = t.value("nexthop_mac", expected, d.nexthop_mac)
    if mac != "auto":
        mac = t.check.mac(mac, t.key("nexthop_mac"), expected)
        if int(mac[:2], 16) & 1:
            raise t.error("nexthop_mac", mac, "a unicast MAC address (the next hop's), not a multicast one")
    nexthop = t.address("nexthop") if "nexthop" in t.data else None
    if nexthop is not None and mac != "auto":
        raise t.error("nexthop", str(nexthop), "", message=f'{t.key("nexthop")} applies only to nexthop_mac = '
                      f'"auto" (it names the address whose MAC is looked up); remove one of the two')
    return EncapConfig(
        nexthop_mac=mac,
        nexthop=nexthop,
        gue_port=t.integer("gue_port", 1, 65535, d.gue_port),
        src4=cast(ipaddress.IPv4Network, t.network("src4", 4, d.src4)),
        src6=cast(ipaddress.IPv6Network, t.network("src6", 6, d.src6)),
    )


def _vip(t: _Table) -> Vip:
    address, prefix_len = routing.vip_address(t)
    port = t.integer("port", 0, 65535, expected="0..65535 (0 = every port)")
    proto = cast(Proto, t.choice("proto", PROTOS))
    encap = cast(EncapName, t.choice("encap", ENCAPS, "ipip"))
    reals: list[Real] = []
    for i, item in enumerate(t.tables("reals")):
        real = Real(address=item.address("address"), weight=item.integer("weight", 0, MAX_WEIGHT, 1),
                    server_id=routing.real_server_id(item))
        if address.version == 6 and real.address.version == 4:
            raise item.error(
                "",
                None,
                "",
                message=f"{item.path}: an IPv6 VIP cannot be encapsulated to IPv4 real {real.address}; "
                "use an IPv6 real",
            )
        for j, other in enumerate(reals):
            if other.address == real.address:
                raise t.error(
                    f"reals[{i}].address", str(real.address), f"an address not already listed (reals[{j}])"
                )
        reals.append(real)
    check: HealthCheck | None = None
    if "healthcheck" in t.data:
        check = _healthcheck(t.table("healthcheck"), port)
    hash_name = cast(HashName, t.choice("hash", HASHES, "5tuple"))
    if "katran_ring" in t.data and not hash_name.startswith("katran"):
        raise t.error("katran_ring", t.data["katran_ring"], "",
                      message=f'{t.key("katran_ring")} applies only to a katran hash (hash = "katran"...), '
                      f'not to hash = "{hash_name}"; remove it or set hash = "katran"')
    return Vip(
        address=address,
        port=port,
        proto=proto,
        encap=encap,
        hash=hash_name,
        katran_ring=cast(KatranRing, t.choice("katran_ring", KATRAN_RINGS, "v1")),
        lru=t.boolean("lru", True),
        outer_src=cast(OuterSrc, t.choice("outer_src", OUTER_SRCS, "flow" if encap == "ipip" else "fixed")),
        gue_csum=cast(GueCsum, t.choice("gue_csum", GUE_CSUMS, "compute")),
        reals=tuple(reals),
        healthcheck=check,
        prefix_len=prefix_len,
        server_id_from=routing.server_id_from(t, proto),
        udp_flow_migration=routing.udp_flow_migration(t, proto),
        src_routes=routing.src_routes(t, address.version),
    )


def _healthcheck(t: _Table, vip_port: int) -> HealthCheck:
    kind = cast(CheckType, t.choice("type", CHECK_TYPES, "tcp"))
    if vip_port == 0 and "port" not in t.data:
        raise t.error(
            "port", None, "", message=f"{t.key('port')} is required when the VIP's port is 0 (every port)"
        )
    port = t.integer("port", 1, 65535, vip_port or 1)
    if kind != "http" and "path" in t.data:
        raise t.error("path", t.data["path"], "", message=f'{t.key("path")} applies only to type = "http"')
    path = t.string("path", 'an HTTP path starting with "/"', "/")
    if not path.startswith("/") or any(c.isspace() or not c.isprintable() for c in path):
        raise t.error("path", path, 'an HTTP path starting with "/", without spaces or control characters')
    interval = t.number("interval_s", 0.01, 3600.0, 1.0)
    timeout = t.number("timeout_s", 0.001, 3600.0, 0.5)
    if timeout > interval:
        raise t.error("timeout_s", timeout, f"at most interval_s ({interval})")
    return HealthCheck(
        port=port,
        type=kind,
        path=path,
        interval_s=interval,
        timeout_s=timeout,
        rise=t.integer("rise", 1, 1000, 2),
        fall=t.integer("fall", 1, 1000, 2),
        via=cast(CheckVia, t.choice("via", CHECK_VIAS, "direct")),
    )


def _metrics(t: _Table) -> MetricsConfig:
    listen = t.string("listen", 'host:port, such as "127.0.0.1:9100" or "[::1]:9100"', "127.0.0.1:9100")
    try:
        _split_listen(listen)
    except ValueError as e:
        raise t.error(
            "listen", listen, 'host:port with an IP address, such as "127.0.0.1:9100" or "[::1]:9100"'
        ) from e
    return MetricsConfig(listen=listen)


def _check_vips(file: str, datapath: DatapathConfig, vips: tuple[Vip, ...]) -> None:
    """Rules across VIPs: unique keys, and the map sizes must hold them."""
    seen: dict[tuple[IpAddress, int, Proto], int] = {}
    for i, vip in enumerate(vips):
        if vip.key in seen:
            raise ConfigError(
                file,
                f"vips[{i}]",
                vip.name,
                "",
                message=f"vips[{i}]: VIP {vip.name} is already defined as vips[{seen[vip.key]}]; "
                "merge the two or change address, port or proto",
            )
        seen[vip.key] = i
    if len(vips) > datapath.max_vips:
        raise ConfigError(
            file, "datapath.max_vips", datapath.max_vips, f"at least the number of VIPs ({len(vips)})"
        )
    routing.check_server_ids(file, vips)
    distinct = {r.address for v in vips for r in v.reals} | {r.real for v in vips for r in v.src_routes}
    if len(distinct) > datapath.max_reals - 1:
        raise ConfigError(
            file,
            "datapath.max_reals",
            datapath.max_reals,
            f"at least {len(distinct) + 1} "
            f"(the {len(distinct)} distinct real addresses, plus id 0 = no real)",
        )


def _split_listen(listen: str) -> tuple[str, int]:
    """("host", port) from "host:port" or "[v6]:port"; ValueError if either part is not valid."""
    host, sep, port_text = listen.rpartition(":")
    if not sep or not port_text.isdigit():
        raise ValueError(listen)
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        ipaddress.IPv6Address(host)
    else:
        ipaddress.IPv4Address(host)
    port = int(port_text)
    if not 1 <= port <= 65535:
        raise ValueError(listen)
    return host, port


_MISSING: Any = object()


class _Table:
    """One TOML table being validated: knows its path for messages and rejects unknown keys.

    The checks are balancer.validate's; this adds the config's wording: a missing key says so,
    a choice lists its options as ``"a" | "b"``.
    """

    def __init__(self, file: str, path: str, data: Mapping[str, Any], known: tuple[str, ...]) -> None:
        self.file = file
        self.path = path
        self.data = data
        self.check = Reader(self._fail, self._unknown)
        self.check.known_keys(data, known, path)

    def _fail(self, key: str, value: object, expected: str) -> ConfigError:
        return ConfigError(self.file, key, value, expected)

    def _unknown(self, key: str, _value: object, known: Sequence[str]) -> ConfigError:
        return ConfigError(self.file, key, None, "",
                           message=f"{key} is not a known key; known keys here: {', '.join(sorted(known))}")

    def key(self, name: str) -> str:
        return join(self.path, name)

    def error(self, name: str, value: object, expected: str, *, message: str | None = None) -> ConfigError:
        return ConfigError(self.file, self.key(name), value, expected, message=message)

    def value(self, name: str, expected: str, default: Any = _MISSING) -> Any:
        """The raw value at ``name``, or ``default``; missing without a default is an error."""
        if name in self.data:
            return self.data[name]
        if default is _MISSING:
            raise self.error(name, None, expected, message=f"{self.key(name)} is missing; it must be {expected}")
        return default

    def string(self, name: str, expected: str, default: str = _MISSING) -> str:
        return self.check.string(self.value(name, expected, default), self.key(name), expected=expected)

    def integer(self, name: str, lo: int, hi: int, default: int = _MISSING, *, expected: str = "") -> int:
        expected = expected or f"{lo}..{hi}"
        value = self.value(name, f"an integer {expected}", default)
        return self.check.integer(value, self.key(name), lo, hi, expected=f"an integer {expected}",
                                  range_expected=expected)

    def number(self, name: str, lo: float, hi: float, default: float) -> float:
        expected = f"a number of seconds {lo:g}..{hi:g}"
        return self.check.number(self.value(name, expected, default), self.key(name), lo, hi, expected=expected)

    def boolean(self, name: str, default: bool) -> bool:
        return self.check.boolean(self.value(name, "true or false", default), self.key(name))

    def choice(self, name: str, options: tuple[str, ...], default: str = _MISSING) -> Any:
        expected = " | ".join(f'"{o}"' for o in options)
        return self.check.string(self.value(name, expected, default), self.key(name), choices=options,
                                 expected=expected)

    def address(self, name: str) -> IpAddress:
        expected = "an IPv4 or IPv6 address"
        return self.check.address(self.value(name, expected), self.key(name), expected)

    def network(
        self, name: str, version: int, default: ipaddress.IPv4Network | ipaddress.IPv6Network
    ) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
        expected = f'an IPv{version} prefix such as "{default}" (a single address = fixed source)'
        text = self.string(name, expected, str(default))
        net = self.check.network(text, self.key(name), version=version, strict=False, expected=expected)
        if ipaddress.ip_address(text.split("/")[0]) != net.network_address:
            raise self.error(name, text, f'a prefix without host bits, such as "{net}"')
        return net

    def table(self, name: str) -> _Table:
        value = self.check.table(self.data.get(name, {}), self.key(name))
        return _Table(self.file, self.key(name), value, _KNOWN[self._kind(name)])

    def tables(self, name: str) -> list[_Table]:
        items = self.check.array(self.data.get(name, []), self.key(name), "an array of tables")
        known = _KNOWN[self._kind(name)]
        return [_Table(self.file, self.key(f"{name}[{i}]"), self.check.table(item, self.key(f"{name}[{i}]")),
                       known) for i, item in enumerate(items)]

    def _kind(self, name: str) -> str:
        """The schema name of a child table: its path without list indexes (``vips.reals``)."""
        parent = re.sub(r"\[\d+\]", "", self.path)
        return f"{parent}.{name}" if parent else name


_KNOWN: Final[dict[str, tuple[str, ...]]] = {
    "datapath": (
        "interfaces",
        "mode",
        "mtu",
        "max_vips",
        "max_reals",
        "ring_size",
        "lru_size",
        "fallback_size",
        "udp_timeout_s",
        "frags",
        "object",
        "katran_max_vips",
        "egress",
    ),
    "encap": ("nexthop_mac", "gue_port", "src4", "src6", "nexthop"),
    "vips": ("address", "port", "proto", "encap", "hash", "lru", "outer_src", "gue_csum", "reals", "healthcheck",
             "server_id_from", "udp_flow_migration", "src_routes", "katran_ring"),
    "vips.reals": ("address", "weight", "server_id"),
    "vips.src_routes": ("prefix", "real"),
    "decap": ("address", "action"),
    "vips.healthcheck": ("type", "port", "path", "interval_s", "timeout_s", "rise", "fall", "via"),
    "metrics": ("listen",),
}


# ---------------------------------------------------------------------------------------------- dump


def dump(config: Config) -> str:
    """The TOML text of ``config``, every value explicit; ``loads(dump(c)) == c``."""
    d = config.datapath
    e = config.encap
    lines = [
        "[datapath]",
        f"interfaces = {_toml(list(d.interfaces))}",
        f"mode = {_toml(d.mode)}",
        f"mtu = {d.mtu}",
        f"max_vips = {d.max_vips}",
        f"max_reals = {d.max_reals}",
        f"ring_size = {d.ring_size}",
        f"lru_size = {d.lru_size}",
        f"fallback_size = {d.fallback_size}",
        f"udp_timeout_s = {d.udp_timeout_s}",
        f"frags = {_toml(d.frags)}",
        *([f"object = {_toml(d.object)}"] if d.object else []),
        f"katran_max_vips = {d.katran_max_vips}",
        *([f"egress = {_toml(d.egress)}"] if d.egress else []),
        "",
        "[encap]",
        f"nexthop_mac = {_toml(e.nexthop_mac)}",
        f"gue_port = {e.gue_port}",
        f"src4 = {_toml(str(e.src4))}",
        f"src6 = {_toml(str(e.src6))}",
        *([f"nexthop = {_toml(str(e.nexthop))}"] if e.nexthop is not None else []),
        "",
        "[metrics]",
        f"listen = {_toml(config.metrics.listen)}",
    ]
    for vip in config.vips:
        lines += [
            "",
            "[[vips]]",
            f"address = {_toml(vip.address_text)}",
            f"port = {vip.port}",
            f"proto = {_toml(vip.proto)}",
            f"encap = {_toml(vip.encap)}",
            f"hash = {_toml(vip.hash)}",
            f"lru = {_toml(vip.lru)}",
            f"outer_src = {_toml(vip.outer_src)}",
            f"gue_csum = {_toml(vip.gue_csum)}",
            *routing.dump_vip(vip),
        ]
        if vip.katran:
            lines.append(f"katran_ring = {_toml(vip.katran_ring)}")
        if vip.reals:
            lines.append("reals = [")
            lines += [f"  {{ address = {_toml(str(r.address))}, weight = {r.weight}"
                      + (f", server_id = {r.server_id}" if r.server_id is not None else "") + " },"
                      for r in vip.reals]
            lines.append("]")
        else:
            lines.append("reals = []")
        hc = vip.healthcheck
        if hc is not None:
            lines += [
                "",
                "[vips.healthcheck]",
                f"type = {_toml(hc.type)}",
                f"port = {hc.port}",
            ]
            if hc.type == "http":
                lines.append(f"path = {_toml(hc.path)}")
            lines += [
                f"interval_s = {hc.interval_s!r}",
                f"timeout_s = {hc.timeout_s!r}",
                f"rise = {hc.rise}",
                f"fall = {hc.fall}",
                f"via = {_toml(hc.via)}",
            ]
    lines += routing.dump_decaps(config.decap)
    return "\n".join(lines) + "\n"


def _toml(value: str | bool | list[str]) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return show_value(value)
