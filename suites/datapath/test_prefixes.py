"""test_prefixes.py: the prefix tables: client prefixes pinned to reals, VIPs that are prefixes, UDP flow migration.

Rows of description, frame, verdict, reason and the real reached (None: the ring's only real). Pins
apply to new flows only, the longest prefix winning (Katran's LPM_SRC); a VIP that is a prefix serves
every address of it with one ring, by port then by its wildcard, and answers echo for them; a UDP
session to a real down for its VIP (UDP flow migration) is chosen again, a TCP one never is.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from scapy.layers.inet import ICMP, IP
from scapy.packet import Packet

from balancer import _abi, routes

from . import packets as P
from .frames import decode_encap
from .rig import BalancerFactory, RunBalancer

PIN_VIP, PIN_VIP6 = "203.0.113.80", "2001:db8:f::80"
RING_REAL, RING_REAL6 = P.REALS4[0], P.REALS6[0]
PINS = {"198.51.100.0/24": P.REALS4[1], "198.51.100.128/25": P.REALS4[2]}
PINS6 = {"2001:db8:c::/48": P.REALS6[1], "2001:db8:c:1::/64": P.REALS6[2]}
CIDR, CIDR_PORT = "203.0.113.128/25", "2001:db8:f:100::/56"


def real_of(out: bytes) -> str:
    return str(decode_encap(out, P.GUE_PORT).outer.dst)


@dataclass(frozen=True)
class Row:
    description: str
    input: Packet
    verdict: str
    reason: str
    real: str | None = None  # for TX_ENCAP: the real reached; None: the ring's


PIN_TABLE = [
    Row("a client in the /24 goes to its pinned real", P.udp_to(PIN_VIP, src="198.51.100.7"), "XDP_TX", "TX_ENCAP",
        PINS["198.51.100.0/24"]),
    Row("a client in the /25 too: the longest prefix wins", P.udp_to(PIN_VIP, src="198.51.100.200"), "XDP_TX",
        "TX_ENCAP", PINS["198.51.100.128/25"]),
    Row("a client in no pinned prefix follows the ring", P.udp_to(PIN_VIP, src="192.0.2.99"), "XDP_TX", "TX_ENCAP"),
    Row("IPv6: a client in the /48", P.udp_to(PIN_VIP6, src="2001:db8:c:2::9"), "XDP_TX", "TX_ENCAP",
        PINS6["2001:db8:c::/48"]),
    Row("IPv6: a client in the /64 inside it", P.udp_to(PIN_VIP6, src="2001:db8:c:1::9"), "XDP_TX", "TX_ENCAP",
        PINS6["2001:db8:c:1::/64"]),
    Row("IPv6: a client elsewhere", P.udp_to(PIN_VIP6, src="2001:db8:d::9"), "XDP_TX", "TX_ENCAP", RING_REAL6),
]

CIDR_TABLE = [
    Row("TCP to the first address of a /25 VIP", P.tcp_to("203.0.113.128"), "XDP_TX", "TX_ENCAP"),
    Row("TCP to another address of it", P.tcp_to("203.0.113.201"), "XDP_TX", "TX_ENCAP"),
    Row("TCP to it on a port it does not serve", P.tcp_to("203.0.113.201", dport=8080), "XDP_PASS", "PASS_NOT_VIP"),
    Row("TCP to an address outside it", P.tcp_to("203.0.113.127"), "XDP_PASS", "PASS_NOT_VIP"),
    Row("IPv6 UDP to a /56 VIP on its port", P.udp_to("2001:db8:f:1ff::9", dport=443), "XDP_TX", "TX_ENCAP",
        RING_REAL6),
    Row("IPv6 UDP to it on another port: its wildcard", P.udp_to("2001:db8:f:100::1", dport=53), "XDP_TX",
        "TX_ENCAP", P.REALS6[1]),
    Row("echo to an address of the prefix: answered", P.eth() / IP(src=P.CLIENT4, dst="203.0.113.150") /
        ICMP(type=8) / P.PAYLOAD, "XDP_TX", "TX_ICMP_ECHO"),
    Row("a fragment to an address of the prefix: dropped", P.eth() / IP(src=P.CLIENT4, dst="203.0.113.150",
        flags="MF") / P.PAYLOAD, "XDP_DROP", "DROP_FRAGMENT"),
    Row("an exact VIP inside the prefix keeps its own ring", P.tcp_to("203.0.113.140"), "XDP_TX", "TX_ENCAP",
        P.REALS4[2]),
]


def prefix_world(b: RunBalancer, cidr_count: bool = True) -> None:
    b.vip(PIN_VIP, 443, "udp", 0, [RING_REAL], flags=_abi.VipFlag.SRC_ROUTES)
    b.vip(PIN_VIP6, 443, "udp", 1, [RING_REAL6], flags=_abi.VipFlag.SRC_ROUTES)
    for num, pins in ((0, PINS), (1, PINS6)):
        for prefix, real in pins.items():
            b.dp.put_entry(routes.src_route(num, prefix, b.real_id(real)))
    b.ring(2, [RING_REAL])
    b.dp.put_entry(routes.vip_cidr(CIDR, 80, "tcp", vip_num=2))
    b.dp.put_entry(routes.vip_cidr(CIDR, 0, 0, vip_num=2))
    b.ring(3, [RING_REAL6])
    b.dp.put_entry(routes.vip_cidr(CIDR_PORT, 443, "udp", vip_num=3))
    b.ring(4, [P.REALS6[1]])
    b.dp.put_entry(routes.vip_cidr(CIDR_PORT, 0, "udp", vip_num=4))
    b.vip("203.0.113.140", 80, "tcp", 5, [P.REALS4[2]])
    b.settings(cidr_vips=4 if cidr_count else 0)


@pytest.fixture
def prefixes(balancer_factory: BalancerFactory) -> RunBalancer:
    return balancer_factory(world=prefix_world)


@pytest.mark.parametrize("row", PIN_TABLE + CIDR_TABLE, ids=[r.description for r in PIN_TABLE + CIDR_TABLE])
def test_prefix_table(prefixes: RunBalancer, row: Row) -> None:
    out = prefixes.run(row.input)
    assert (out.verdict, out.reason) == (row.verdict, row.reason)
    if row.reason == "TX_ENCAP":
        assert real_of(out.out) == (row.real or RING_REAL)
        if row in PIN_TABLE:
            assert out.events.get("SRC_PINNED", 0) == (row.real not in (None, RING_REAL6))
    elif row.verdict != "XDP_TX":
        assert out.out == bytes(row.input)


def test_a_pin_applies_to_new_flows_only(prefixes: RunBalancer) -> None:
    client = "192.0.2.99"
    first = prefixes.run(P.udp_to(PIN_VIP, src=client))
    assert real_of(first.out) == RING_REAL
    prefixes.dp.put_entry(routes.src_route(0, "192.0.2.0/24", prefixes.real_id(P.REALS4[1])))
    assert real_of(prefixes.run(P.udp_to(PIN_VIP, src=client)).out) == RING_REAL, "the session stays"
    assert real_of(prefixes.run(P.udp_to(PIN_VIP, src=client, sport=40009)).out) == P.REALS4[1]


def test_prefix_vips_cost_nothing_when_none_are_counted(balancer_factory: BalancerFactory) -> None:
    b = balancer_factory(world=False)
    prefix_world(b, cidr_count=False)
    assert b.run(P.tcp_to("203.0.113.201")).reason == "PASS_NOT_VIP"


def test_udp_flow_migration_moves_udp_sessions_off_a_real_down(balancer_factory: BalancerFactory) -> None:
    b = balancer_factory(world=False)
    flags = int(_abi.VipFlag.UDP_MIGRATE)
    b.vip("203.0.113.90", 443, "udp", 0, [P.REALS4[0]], flags=flags)
    b.vip("203.0.113.90", 80, "tcp", 1, [P.REALS4[0]], flags=flags)
    b.vip("203.0.113.91", 443, "udp", 2, [P.REALS4[0]])
    # The TCP flow's session comes from a non-SYN packet: a SYN creates none (session.h).
    udp, tcp, plain = (P.udp_to("203.0.113.90"), P.tcp_to("203.0.113.90"), P.udp_to("203.0.113.91"))
    for frame in (udp, tcp, plain):
        assert real_of(b.run(frame).out) == P.REALS4[0]
    gone = b.real_id(P.REALS4[0])
    for num in (0, 1, 2):
        b.ring(num, [P.REALS4[1]])
        b.dp.put_entry(routes.down_real(num, gone))
    moved = b.run(udp)
    assert real_of(moved.out) == P.REALS4[1] and moved.events.get("UDP_MIGRATED") == 1
    assert real_of(b.run(udp).out) == P.REALS4[1], "the new real is remembered"
    assert real_of(b.run(P.tcp_to("203.0.113.90")).out) == P.REALS4[0], "TCP sessions never move"
    assert real_of(b.run(plain).out) == P.REALS4[0], "a VIP without migration keeps its sessions"



def test_a_pinned_syn_creates_no_session_but_rewrites_a_reused_tuples(balancer_factory: BalancerFactory) -> None:
    """A SYN creates no session, pinned or not (a flood from a pinned prefix inserts nothing); a tuple
    that still has one (a client reusing its port) has it rewritten with the SYN's final choice, so
    that the handshake's ACK follows the SYN: here a pin added since the old connection."""
    b = balancer_factory(world=False)
    b.vip(PIN_VIP, 80, "tcp", 0, [RING_REAL], flags=_abi.VipFlag.SRC_ROUTES)
    b.dp.put_entry(routes.src_route(0, "198.51.100.0/24", b.real_id(P.REALS4[2])))
    for sport in range(40000, 40050):
        syn = b.run(P.tcp_to(PIN_VIP, src="198.51.100.7", sport=sport, flags="S"))
        assert real_of(syn.out) == P.REALS4[2] and syn.events.get("SRC_PINNED") == 1
    assert list(b.dp.sessions()) == []
    client = "192.0.2.99"
    assert real_of(b.run(P.tcp_to(PIN_VIP, src=client)).out) == RING_REAL  # the old connection's session
    b.dp.put_entry(routes.src_route(0, "192.0.2.0/24", b.real_id(P.REALS4[1])))
    assert real_of(b.run(P.tcp_to(PIN_VIP, src=client)).out) == RING_REAL, "the old session stays"
    syn = b.run(P.tcp_to(PIN_VIP, src=client, flags="S"))
    assert real_of(syn.out) == P.REALS4[1] and syn.events.get("SRC_PINNED") == 1
    assert real_of(b.run(P.tcp_to(PIN_VIP, src=client)).out) == P.REALS4[1], "the ACK follows its SYN"
