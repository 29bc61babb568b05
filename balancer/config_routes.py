"""config_routes.py: the config keys of routing beyond the flow hash, their validation and their TOML.

Per VIP: ``address`` may be a prefix (``"10.200.0.0/24"``: every address of it served by one ring);
``server_id_from`` says where packets carry a real's server id (``"quic"`` connection ids,
``"stable-routing"`` Katran's UDP header, ``"tcp-option"`` Katran's TCP option 183, ``"none"``);
``udp_flow_migration`` moves UDP sessions off reals that health checks take down; ``src_routes`` pins
client prefixes to a real (``[{ prefix = "192.0.2.0/24", real = "203.0.113.9" }]``, the longest
prefix winning). Per real: ``server_id`` (1..4294967295), one id per address and one address per id
across the whole file. At the top: ``[[decap]]`` tables name the LB's own addresses whose IPIP / GUE
packets it decapsulates, and what then becomes of the inner packet (``action``: ``"balance"``,
``"local"``, ``"egress"``). balancer/config.py calls these functions; datapath entries come from
balancer/route_plan.py.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal, get_args

from balancer.errors import ConfigError, show_value

if TYPE_CHECKING:
    from balancer.config import Vip

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
ServerIdFrom = Literal["none", "quic", "stable-routing", "tcp-option"]
DecapActionName = Literal["balance", "local", "egress"]
SERVER_ID_FROMS: Final[tuple[ServerIdFrom, ...]] = get_args(ServerIdFrom)
DECAP_ACTIONS: Final[tuple[DecapActionName, ...]] = get_args(DecapActionName)
SERVER_ID_MAX: Final = 0xFFFF_FFFF
MAX_DECAPS: Final = 64  # lb_decaps' size (LB_MAX_DECAPS)
SID_PROTO: Final[dict[str, str]] = {"quic": "udp", "stable-routing": "udp", "tcp-option": "tcp"}


@dataclass(frozen=True)
class SrcRoute:
    """New flows from a client in `prefix` go to `real` (for one VIP)."""

    prefix: IpNetwork
    real: IpAddress


@dataclass(frozen=True)
class DecapAddress:
    """An address of the LB whose IPIP / GUE packets it decapsulates, and what becomes of the inner packet."""

    address: IpAddress
    action: DecapActionName = "balance"


def vip_address(t: Any, name: str = "address") -> tuple[IpAddress, int | None]:
    """The VIP's address, or a prefix's network address and length (None: a single address)."""
    expected = 'an IPv4 or IPv6 address, or a prefix such as "10.200.0.0/24"'
    value = t.value(name, expected)
    if isinstance(value, str) and "/" in value:
        net = t.check.network(value, t.key(name), strict=True, expected=expected + " without host bits")
        if net.prefixlen == net.max_prefixlen:
            return net.network_address, None
        return net.network_address, net.prefixlen
    return t.check.address(value, t.key(name), expected), None


def server_id_from(t: Any, proto: str) -> ServerIdFrom:
    kind: ServerIdFrom = t.choice("server_id_from", SERVER_ID_FROMS, "none")
    if kind != "none" and SID_PROTO[kind] != proto:
        raise t.error("server_id_from", kind, "", message=f'{t.key("server_id_from")} = "{kind}" needs '
                      f'proto = "{SID_PROTO[kind]}" (the VIP is {proto})')
    return kind


def udp_flow_migration(t: Any, proto: str) -> bool:
    on: bool = t.boolean("udp_flow_migration", False)
    if on and proto != "udp":
        raise t.error("udp_flow_migration", True, "", message=f"{t.key('udp_flow_migration')} applies only "
                      f'to proto = "udp": TCP sessions stay with their real')
    return on


def real_server_id(t: Any) -> int | None:
    if "server_id" not in t.data:
        return None
    sid: int = t.integer("server_id", 1, SERVER_ID_MAX, expected=f"1..{SERVER_ID_MAX} (0 is no id)")
    return sid


def src_routes(t: Any, family: int) -> tuple[SrcRoute, ...]:
    out: list[SrcRoute] = []
    for i, item in enumerate(t.tables("src_routes")):
        expected = f'an IPv{family} prefix such as "{"192.0.2.0/24" if family == 4 else "2001:db8:c::/48"}"'
        prefix = item.check.network(item.value("prefix", expected), item.key("prefix"), version=family,
                                    strict=True, expected=expected + " without host bits (the VIP's family)")
        real = item.address("real")
        if family == 6 and real.version == 4:
            raise item.error("real", str(real), "an IPv6 real (an IPv6 VIP cannot be encapsulated to IPv4)")
        for j, other in enumerate(out):
            if other.prefix == prefix:
                raise t.error(f"src_routes[{i}].prefix", str(prefix), f"a prefix not already listed (src_routes[{j}])")
        out.append(SrcRoute(prefix=prefix, real=real))
    return tuple(out)


def decaps(top: Any) -> tuple[DecapAddress, ...]:
    out: list[DecapAddress] = []
    for item in top.tables("decap"):
        entry = DecapAddress(address=item.address("address"), action=item.choice("action", DECAP_ACTIONS, "balance"))
        if any(d.address == entry.address for d in out):
            raise item.error("address", str(entry.address), "an address not already listed")
        out.append(entry)
    if len(out) > MAX_DECAPS:
        raise top.error("decap", len(out), f"at most {MAX_DECAPS} decap addresses")
    return tuple(out)


def check_server_ids(file: str, vips: Sequence[Vip]) -> None:
    """One server id per real address and one address per server id, across every VIP."""
    by_addr: dict[IpAddress, tuple[int, str]] = {}
    by_id: dict[int, tuple[IpAddress, str]] = {}
    for i, vip in enumerate(vips):
        for j, real in enumerate(vip.reals):
            if real.server_id is None:
                continue
            where = f"vips[{i}].reals[{j}].server_id"
            seen = by_addr.get(real.address)
            if seen and seen[0] != real.server_id:
                raise ConfigError(file, where, real.server_id, "", message=f"{where}: real {real.address} has "
                                  f"server id {seen[0]} at {seen[1]}; one real has one server id")
            other = by_id.get(real.server_id)
            if other and other[0] != real.address:
                raise ConfigError(file, where, real.server_id, "", message=f"{where}: server id "
                                  f"{real.server_id} names real {other[0]} at {other[1]}; give each real its own")
            by_addr[real.address] = (real.server_id, where)
            by_id[real.server_id] = (real.address, where)


def dump_vip(vip: Vip) -> list[str]:
    """The TOML lines of a VIP's routing keys (after its other keys, before its reals)."""
    lines = [f"server_id_from = {show_value(vip.server_id_from)}",
             f"udp_flow_migration = {'true' if vip.udp_flow_migration else 'false'}"]
    if vip.src_routes:
        lines.append("src_routes = [")
        lines += [f"  {{ prefix = {show_value(str(r.prefix))}, real = {show_value(str(r.real))} }},"
                  for r in vip.src_routes]
        lines.append("]")
    return lines


def dump_decaps(entries: Sequence[DecapAddress]) -> list[str]:
    lines: list[str] = []
    for d in entries:
        lines += ["", "[[decap]]", f"address = {show_value(str(d.address))}", f"action = {show_value(d.action)}"]
    return lines
