"""nexthop.py: the next hop's MAC, found in the kernel for `encap.nexthop_mac = "auto"`, and followed.

Every frame the balancer emits goes to one MAC address, the next hop's (the router's). With "auto"
(the default) it is asked of the kernel through netlink for the LB's link, the first datapath
interface that has one of:

* the address ``encap.nexthop`` names, when it is on that interface's link;
* else the gateway of the default route out of it (IPv4 first, then IPv6);

and that address's neighbour entry on the interface. With no usable entry yet, the kernel is asked
to resolve it (a neighbour entry marked "used": it sends the ARP or ND solicitation itself) and given
RESOLVE_S. Still none: a one-line refusal naming the interface and the address looked for. An
instance with no interface has no link to ask about: its frames (it sends none) get no MAC.

`Watch` follows the kernel: on every neighbour or route change it calls back, and the daemon resolves
again and rewrites the datapath's setting when the MAC moved (a router replaced, a VRRP failover:
they announce the new MAC with a gratuitous ARP or an unsolicited NA, which updates the entry).
"""

from __future__ import annotations

import errno
import ipaddress
import select
import socket
import struct
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from balancer.errors import DatapathError, HostError

__all__ = ["AUTO", "NONE", "NextHop", "Watch", "resolve"]

AUTO = "auto"
NONE = "00:00:00:00:00:00"
RESOLVE_S = 3.0  # an ARP/ND exchange takes milliseconds; the kernel retries its solicitation each second
NUD_VALID = 0x02 | 0x04 | 0x08 | 0x10 | 0x40 | 0x80  # reachable, stale, delay, probe, noarp, permanent
NTF_USE = 0x01
RTMGRP_NEIGH, RTMGRP_IPV4_ROUTE, RTMGRP_IPV6_ROUTE = 0x4, 0x40, 0x400
RTM_NEWROUTE, RTM_DELROUTE, RTM_NEWNEIGH, RTM_DELNEIGH = 24, 25, 28, 29


@dataclass(frozen=True)
class NextHop:
    """Where emitted frames go: the MAC and how it was found (source: "encap.nexthop_mac",
    "default route", "encap.nexthop" or "none")."""

    mac: str
    source: str
    address: str = ""
    interface: str = ""

    def describe(self) -> str:
        """``52:54:00:12:34:56 (neighbour 198.51.100.1 on lb-rt, the default route's gateway)``."""
        if self.source == "encap.nexthop_mac":
            return f"{self.mac} (set by encap.nexthop_mac)"
        if self.source == "none":
            return "none (the instance has no interface to find a next hop on)"
        what = "the default route's gateway" if self.source == "default route" else "set by encap.nexthop"
        return f"{self.mac} (neighbour {self.address} on {self.interface}, {what})"

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


def resolve(nexthop_mac: str, nexthop: str | None, interfaces: Sequence[str],
            timeout: float = RESOLVE_S) -> NextHop:
    """The next hop for an encap config's nexthop_mac and nexthop, on the instance's interfaces.

    Raises HostError naming the interface and the address when the kernel knows no MAC for it."""
    if nexthop_mac != AUTO:
        return NextHop(nexthop_mac, "encap.nexthop_mac")
    if not interfaces:
        return NextHop(NONE, "none")
    from pyroute2 import IPRoute  # netlink: only a config with "auto" needs it

    with IPRoute() as ipr:
        ifname, ifindex, address, source = _target(ipr, nexthop, interfaces)
        mac = _neighbour(ipr, ifindex, address)
        if mac is None:
            _solicit(ipr, ifindex, address)
            deadline = time.monotonic() + timeout
            while mac is None and time.monotonic() < deadline:
                time.sleep(0.01)  # polling the kernel's table, bounded by the deadline
                mac = _neighbour(ipr, ifindex, address)
    if mac is None:
        raise HostError(f"no next-hop MAC: {ifname} has no neighbour entry for {address} ({source}) after "
                        f"{timeout:g} s of asking; check that {address} is up on that link (`ip neigh show dev "
                        f'{ifname}`), or set encap.nexthop_mac = "<its MAC>"')
    return NextHop(mac, source, address, ifname)


def _target(ipr: Any, nexthop: str | None, interfaces: Sequence[str]) -> tuple[str, int, str, str]:
    """(interface, ifindex, address, source) of the neighbour to look up."""
    indexes = {}
    for ifname in interfaces:
        found = ipr.link_lookup(ifname=ifname)
        if not found:
            raise DatapathError(f"find interface '{ifname}' to resolve the next hop on", errno.ENODEV,
                                "check the name with `ip link`")
        indexes[ifname] = found[0]
    if nexthop is not None:
        route = ipr.route("get", dst=nexthop)[0]
        oif, via = route.get_attr("RTA_OIF"), route.get_attr("RTA_GATEWAY")
        name = next((n for n, i in indexes.items() if i == oif), None)
        if name is None or via is not None:
            raise HostError(f"encap.nexthop {nexthop} is not on the link of {', '.join(interfaces)} (the kernel "
                            f"routes it {'via ' + via if via else 'through ifindex ' + str(oif)}); name the "
                            "router's address on the datapath interface's link")
        return name, indexes[name], nexthop, "encap.nexthop"
    for family in (socket.AF_INET, socket.AF_INET6):
        for ifname, ifindex in indexes.items():
            gateway = _default_gateway(ipr, family, ifindex)
            if gateway:
                return ifname, ifindex, gateway, "default route"
    raise HostError(f"no next hop to resolve: no default route leaves through {', '.join(interfaces)}; add one "
                    '(`ip route add default via ROUTER dev IF`), set encap.nexthop = "<router address>" or '
                    'encap.nexthop_mac = "<router MAC>"')


def _default_gateway(ipr: Any, family: int, ifindex: int) -> str | None:
    for route in ipr.get_routes(family=family, table=254):
        if route["dst_len"] != 0:
            continue
        if route.get_attr("RTA_OIF") == ifindex and route.get_attr("RTA_GATEWAY"):
            return str(route.get_attr("RTA_GATEWAY"))
        for hop in route.get_attr("RTA_MULTIPATH") or []:
            if hop["oif"] == ifindex and hop.get_attr("RTA_GATEWAY"):
                return str(hop.get_attr("RTA_GATEWAY"))
    return None


def _neighbour(ipr: Any, ifindex: int, address: str) -> str | None:
    """The MAC of address's usable neighbour entry on ifindex, or None."""
    family = socket.AF_INET6 if ipaddress.ip_address(address).version == 6 else socket.AF_INET
    want = ipaddress.ip_address(address)
    for entry in ipr.get_neighbours(family=family, ifindex=ifindex):
        dst, mac = entry.get_attr("NDA_DST"), entry.get_attr("NDA_LLADDR")
        if dst and ipaddress.ip_address(dst) == want and mac and entry["state"] & NUD_VALID:
            return str(mac).lower()
    return None


def _solicit(ipr: Any, ifindex: int, address: str) -> None:
    """Ask the kernel to resolve address on ifindex now (an entry created and marked used)."""
    try:
        ipr.neigh("replace", dst=address, ifindex=ifindex, flags=NTF_USE, state=0)
    except OSError as exc:  # nothing to solicit with (a link down): the lookup below says so
        if exc.errno not in (errno.ENETDOWN, errno.EINVAL):
            raise


class Watch:
    """Calls `changed()` from its own thread after each neighbour or route change in this netns."""

    def __init__(self, changed: Callable[[], None]) -> None:
        self.changed = changed
        self._sock: socket.socket | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, socket.NETLINK_ROUTE)
        sock.bind((0, RTMGRP_NEIGH | RTMGRP_IPV4_ROUTE | RTMGRP_IPV6_ROUTE))
        sock.setblocking(False)
        self._sock = sock
        self._thread = threading.Thread(target=self._loop, name="lbctl-nexthop", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def _loop(self) -> None:
        assert self._sock is not None
        while not self._stop.is_set():
            ready, _, _ = select.select([self._sock], [], [], 0.2)
            if not ready:
                continue
            try:
                data = self._sock.recv(1 << 16)
            except BlockingIOError:
                continue
            except OSError:  # ENOBUFS: events were lost; resolving again covers them
                data = struct.pack("=IHHII", 16, RTM_NEWNEIGH, 0, 0, 0)
            if any(kind in (RTM_NEWROUTE, RTM_DELROUTE, RTM_NEWNEIGH, RTM_DELNEIGH) for kind in _types(data)):
                self.changed()


def _types(data: bytes) -> list[int]:
    """The message types in one netlink datagram."""
    out, off = [], 0
    while off + 16 <= len(data):
        length, kind = struct.unpack_from("=IH", data, off)
        out.append(kind)
        off += max(16, (length + 3) & ~3)
    return out
