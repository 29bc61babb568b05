"""features.py: the fuzz's world of routing beyond the hash: server-id VIPs, pins, a prefix VIP, decap addresses.

`feature_world` programs them into a balancer beside the standard VIPs (rig.standard_world);
`feature_templates` are frames that reach each new parser (QUIC long and short headers, TCP option
183, stable-routing headers, clients in pinned prefixes, addresses of the prefix VIP, IPIP and GUE to
each kind of decap address), for fuzzgen to mutate; `DECAPS` lets the judges (fuzzrun.py) follow a
tunnel to a decap address to the inner packet the program goes on with.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterator

from scapy.layers.inet import IP, TCP, UDP
from scapy.layers.inet6 import IPv6
from scapy.packet import Packet

from balancer import _abi, routes

from . import packets as P
from .rig import RunBalancer

QUIC_VIP, TCP_SID_VIP, STABLE_VIP, PINNED_VIP, MIGRATE_VIP = (
    "203.0.113.100", "203.0.113.101", "203.0.113.102", "203.0.113.103", "203.0.113.104")
CIDR_VIP = "203.0.113.192/26"
SERVER_IDS = {1024: P.REALS4[1], 197634: P.REALS4[2], 0x12345678: P.REALS6[1]}
PINNED = {"198.51.100.0/25": P.REALS4[2]}
DECAPS = {"198.51.100.250": routes.DecapAction.BALANCE, "2001:db8:c::250": routes.DecapAction.BALANCE,
          "198.51.100.251": routes.DecapAction.LOCAL, "198.51.100.252": routes.DecapAction.EGRESS}
# packed outer destination -> the decap action there, for the judges
DECAP_BY_PACKED = {socket.inet_pton(socket.AF_INET6 if ":" in a else socket.AF_INET, a): int(act)
                   for a, act in DECAPS.items()}
FIRST_NUM = 8  # VIP numbers from here: after the standard world's (0..6), below the tables' max_vips (16)


def feature_world(b: RunBalancer) -> None:
    """The feature VIPs (rings over REALS4), server ids, pins, the prefix VIP, decap addresses."""
    f = _abi.VipFlag
    n = FIRST_NUM
    b.vip(QUIC_VIP, 443, "udp", n, P.REALS4, flags=f.SID_QUIC | f.UDP_MIGRATE)
    b.vip(TCP_SID_VIP, 80, "tcp", n + 1, P.REALS4, flags=f.SID_TCP)
    b.vip(STABLE_VIP, 443, "udp", n + 2, P.REALS4, flags=f.SID_STABLE)
    b.vip(PINNED_VIP, 80, "tcp", n + 3, P.REALS4, flags=f.SRC_ROUTES)
    b.vip(MIGRATE_VIP, 443, "udp", n + 4, P.REALS4[:2], flags=f.UDP_MIGRATE)
    b.ring(n + 5, P.REALS4)
    b.dp.put_entry(routes.vip_cidr(CIDR_VIP, 80, "tcp", vip_num=n + 5))
    b.dp.put_entry(routes.vip_cidr(CIDR_VIP, 0, 0, vip_num=n + 5))
    b.dp.put_entry(routes.down_real(n + 4, b.real_id(P.REALS4[2])))
    for sid, real in SERVER_IDS.items():
        b.dp.put_entry(routes.server_id(sid, b.real_id(real)))
    for prefix, real in PINNED.items():
        b.dp.put_entry(routes.src_route(n + 3, prefix, b.real_id(real)))
    for addr, action in DECAPS.items():
        b.dp.put_entry(routes.decap(addr, action))
    b.settings(cidr_vips=2, decaps=len(DECAPS))


def _cid(layout: int, sid: int) -> bytes:
    if layout == 1:
        return bytes([0x40 | (sid >> 10), (sid >> 2) & 0xFF, (sid & 3) << 6, 1, 2, 3, 4, 5])
    return bytes([0x80 if layout == 2 else 0xC0]) + sid.to_bytes(4, "big")[4 - (3 if layout == 2 else 4):] + b"\x07" * 4


def _quic_payloads() -> Iterator[bytes]:
    for layout, sid in ((1, 1024), (2, 197634), (3, 0x12345678), (1, 1092)):
        dcid = _cid(layout, sid)[:8]
        yield b"\x41" + dcid + b"short header payload"
        for ptype in range(4):
            for version in (b"\x00\x00\x00\x01", b"\x6b\x33\x43\xcf"):
                yield bytes([0xC0 | ptype << 4]) + version + b"\x08" + dcid + b"\x08" + b"\x11" * 8 + b"long"


def feature_templates() -> Iterator[Packet]:
    """Frames that reach each parser of route.h, the prefix VIP and inline decap."""
    for payload in _quic_payloads():
        yield P.udp_to(QUIC_VIP, payload=payload)
    for sid in (1024, 197634, 1021):
        opt = (183, sid.to_bytes(4, "little"))
        yield P.eth() / IP(src=P.CLIENT4, dst=TCP_SID_VIP) / TCP(sport=40000, dport=80, flags="A", options=[opt])
        yield P.eth() / IP(src=P.CLIENT4, dst=TCP_SID_VIP) / TCP(
            sport=40001, dport=80, flags="PA", options=[("NOP", None), ("Timestamp", (5, 6)), opt]) / P.PAYLOAD
        yield P.udp_to(STABLE_VIP, payload=b"\x52" + sid.to_bytes(4, "big")[1:] + b"\0" * 12)
    for src in ("198.51.100.9", "198.51.100.200"):
        yield P.tcp_to(PINNED_VIP, src=src, flags="S")
    yield P.udp_to(MIGRATE_VIP)
    for host in (1, 30, 63):
        addr = str(ipaddress.ip_network(CIDR_VIP)[host])
        yield P.tcp_to(addr)
        yield P.tcp_to(addr, dport=8080)
    inner4 = IP(src=P.CLIENT4, dst=P.VIP4) / TCP(sport=40000, dport=P.VIP_PORT, flags="A") / P.PAYLOAD
    inner6 = IPv6(src=P.CLIENT6, dst=P.VIP6) / TCP(sport=40000, dport=P.VIP_PORT, flags="A") / P.PAYLOAD
    for outer_dst in DECAPS:
        for inner in (inner4, inner6, IP(bytes(inner4), ttl=1)):
            o = IPv6(src=P.SRC6, dst=outer_dst) if ":" in outer_dst else IP(src=P.SRC4, dst=outer_dst)
            yield P.eth() / o / UDP(sport=50000, dport=P.GUE_PORT) / inner
            proto = 4 if isinstance(inner, IP) else 41
            if ":" in outer_dst:
                yield P.eth() / IPv6(src=P.SRC6, dst=outer_dst, nh=proto) / inner
            else:
                yield P.eth() / IP(src=P.SRC4, dst=outer_dst, proto=proto) / inner
