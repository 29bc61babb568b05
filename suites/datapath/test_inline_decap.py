"""test_inline_decap.py: the inline decap table: tunnels to the LB's own addresses and what becomes of their inners.

IPIP (4in4, 6in6, 4in6) and GUE (variants 1 and 0) addressed to a decap address are stripped, the
inner packet's TTL / hop limit lowered by one, then balanced afresh (a tail call: the one reason
counted is the inner packet's, with the event DECAP_INLINE), handed to the host, or sent back out.
Rows of description, frame, verdict, reason and what the output must be.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from scapy.layers.inet import IP, UDP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import Dot1Q, Ether
from scapy.packet import Packet, Raw

from balancer import routes
from lab.packets.gue import GUE

from . import packets as P
from .frames import decode_encap
from .rig import BalancerFactory, RunBalancer

BALANCE4, BALANCE6, LOCAL4, EGRESS4 = "198.51.100.250", "2001:db8:c::250", "198.51.100.251", "198.51.100.252"
INNER4 = IP(src=P.CLIENT4, dst=P.VIP4, ttl=9) / P.tcp_to(P.VIP4)[IP].payload
INNER6 = IPv6(src=P.CLIENT6, dst=P.VIP6, hlim=9) / P.tcp_to(P.VIP6)[IPv6].payload
INNER4_NOT_VIP = IP(src=P.CLIENT4, dst=P.OTHER4, ttl=9) / P.tcp_to(P.OTHER4)[IP].payload
INNER4_TTL1 = IP(src=P.CLIENT4, dst=P.VIP4, ttl=1) / P.tcp_to(P.VIP4)[IP].payload
INNER6_HL1 = IPv6(src=P.CLIENT6, dst=P.VIP6, hlim=1) / P.tcp_to(P.VIP6)[IPv6].payload


def gue(outer_dst: str, inner: Packet, variant: int = 1, dport: int = P.GUE_PORT, **gue_fields: object) -> Packet:
    outer: Packet = IPv6(src=P.SRC6, dst=outer_dst) if ":" in outer_dst else IP(src=P.SRC4, dst=outer_dst)
    udp = UDP(sport=50000, dport=dport)
    if variant == 0:
        return P.eth() / outer / udp / GUE(proto=4 if isinstance(inner, IP) else 41, **gue_fields) / inner
    return P.eth() / outer / udp / inner


def ipip(outer_dst: str, inner: Packet) -> Packet:
    proto = 4 if isinstance(inner, IP) else 41
    if ":" in outer_dst:
        return P.eth() / IPv6(src=P.SRC6, dst=outer_dst, nh=proto) / inner
    return P.eth() / IP(src=P.SRC4, dst=outer_dst, proto=proto) / inner


def lowered(inner: Packet) -> bytes:
    """The inner packet as it leaves: its TTL / hop limit one lower (checksum recomputed)."""
    copy = inner.copy()
    if isinstance(copy, IP):
        copy.ttl -= 1
        copy.chksum = None
    else:
        copy.hlim -= 1
    return bytes(copy)


@dataclass(frozen=True)
class Row:
    description: str
    input: Packet
    verdict: str
    reason: str
    inner: Packet | None = None  # the inner packet the output carries, its TTL one lower


TABLE = [
    Row("GUE variant 1 to a balancing address: the inner TCP balanced", gue(BALANCE4, INNER4), "XDP_TX", "TX_ENCAP",
        INNER4),
    Row("GUE variant 0 to it", gue(BALANCE4, INNER4, variant=0), "XDP_TX", "TX_ENCAP", INNER4),
    Row("IPIP 4in4 to it", ipip(BALANCE4, INNER4), "XDP_TX", "TX_ENCAP", INNER4),
    Row("IPIP 6in6 to the IPv6 balancing address", ipip(BALANCE6, INNER6), "XDP_TX", "TX_ENCAP", INNER6),
    Row("IPIP 4in6 to it", ipip(BALANCE6, INNER4), "XDP_TX", "TX_ENCAP", INNER4),
    Row("GUE over IPv6 around IPv6", gue(BALANCE6, INNER6), "XDP_TX", "TX_ENCAP", INNER6),
    Row("GUE in GUE to it: both stripped, then balanced", gue(BALANCE4, IP(bytes(gue(BALANCE4, INNER4)[IP]))),
        "XDP_TX", "TX_ENCAP"),
    Row("an inner packet to no VIP: passed, decapsulated", gue(BALANCE4, INNER4_NOT_VIP), "XDP_PASS", "PASS_NOT_VIP",
        INNER4_NOT_VIP),
    Row("GUE to a local address: the inner packet to the host", gue(LOCAL4, INNER4), "XDP_PASS", "PASS_DECAP_LOCAL",
        INNER4),
    Row("GUE to an egress address: sent back out, MACs swapped", gue(EGRESS4, INNER4), "XDP_TX", "TX_DECAP_EGRESS",
        INNER4),
    Row("an inner TTL of 1: dropped untouched", gue(BALANCE4, INNER4_TTL1), "XDP_DROP", "DROP_TTL_EXPIRED"),
    Row("an inner hop limit of 1: dropped untouched", gue(BALANCE6, INNER6_HL1), "XDP_DROP", "DROP_TTL_EXPIRED"),
    Row("a GUE control message: passed untouched", gue(BALANCE4, INNER4, variant=0, control=1), "XDP_PASS",
        "PASS_NOT_VIP"),
    Row("GUE around something that is not IP", gue(BALANCE4, Raw(b"\x50" + bytes(INNER4)[1:])), "XDP_DROP",
        "DROP_DECAP_MALFORMED"),
    Row("GUE to an address that is no decap address", gue(P.OTHER4, INNER4), "XDP_PASS", "PASS_NOT_VIP"),
    Row("UDP to a balancing address on another port", gue(BALANCE4, INNER4, dport=P.GUE_PORT + 1), "XDP_PASS",
        "PASS_NOT_VIP"),
]


def decap_world(b: RunBalancer, count: bool = True) -> None:
    b.vip(P.VIP4, P.VIP_PORT, "tcp", 0, [P.REALS4[0]])
    b.vip(P.VIP6, P.VIP_PORT, "tcp", 1, [P.REALS6[0]])
    for addr, action in ((BALANCE4, routes.DecapAction.BALANCE), (BALANCE6, routes.DecapAction.BALANCE),
                         (LOCAL4, routes.DecapAction.LOCAL), (EGRESS4, routes.DecapAction.EGRESS)):
        b.dp.put_entry(routes.decap(addr, action))
    b.settings(decaps=4 if count else 0)


@pytest.fixture
def decapping(balancer_factory: BalancerFactory) -> RunBalancer:
    return balancer_factory(world=decap_world)


@pytest.mark.parametrize("row", TABLE, ids=[r.description for r in TABLE])
def test_inline_decap_table(decapping: RunBalancer, row: Row) -> None:
    out = decapping.run(row.input)
    assert (out.verdict, out.reason) == (row.verdict, row.reason)
    balanced = row.reason == "TX_ENCAP" or row.inner is INNER4_NOT_VIP
    assert out.events.get("DECAP_INLINE", 0) == (2 if "GUE in GUE" in row.description else int(balanced))
    if row.reason == "TX_ENCAP" and row.inner is not None:
        assert decode_encap(out.out, P.GUE_PORT).inner.raw == lowered(row.inner)
    elif row.inner is not None:
        eth = Ether(out.out)
        assert bytes(eth.payload) == lowered(row.inner)
        want_macs = (P.CLIENT_MAC, P.LB_MAC) if row.reason == "TX_DECAP_EGRESS" else (P.LB_MAC, P.CLIENT_MAC)
        assert (eth.dst, eth.src) == want_macs
    elif row.verdict in ("XDP_PASS", "XDP_DROP"):
        assert out.out == bytes(row.input), "passed or dropped untouched"


def test_the_multi_buffer_program_balances_through_its_own_array(decapping: RunBalancer) -> None:
    out = decapping.run(gue(BALANCE4, INNER4), frags=True)
    assert (out.verdict, out.reason) == ("XDP_TX", "TX_ENCAP")


def test_a_vlan_tag_stays_in_front_of_the_inner_packet(decapping: RunBalancer) -> None:
    frame = Ether(src=P.CLIENT_MAC, dst=P.LB_MAC) / Dot1Q(vlan=7) / gue(LOCAL4, INNER4)[IP]
    eth = Ether(decapping.run(frame).out)
    assert eth[Dot1Q].vlan == 7 and bytes(eth[Dot1Q].payload) == lowered(INNER4)


def test_no_decap_addresses_counted_no_decap(balancer_factory: BalancerFactory) -> None:
    b = balancer_factory(world=False)
    decap_world(b, count=False)
    frame = gue(BALANCE4, INNER4)
    out = b.run(frame)
    assert (out.reason, out.out) == ("PASS_NOT_VIP", bytes(frame))
