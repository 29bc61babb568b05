"""test_parse.py: the parsing table: which frames pass, which drop, and the reason each one counts."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from scapy.layers.inet import IP, TCP
from scapy.layers.l2 import Dot1Q, Ether
from scapy.packet import Packet

from . import packets as P
from .rig import BalancerFactory, RunBalancer


@dataclass(frozen=True)
class Row:
    description: str
    input: Packet | bytes
    verdict: str
    reason: str


PARSE_TABLE = [
    Row("ARP is not IP: passed", P.ARP_REQUEST, "XDP_PASS", "PASS_NOT_IP"),
    # (A frame shorter than an Ethernet header cannot be tested: BPF_PROG_TEST_RUN refuses it.)
    Row("802.1Q tag cut short", P.VLAN_TRUNCATED, "XDP_DROP", "DROP_MALFORMED_ETH"),
    Row("two stacked 802.1Q tags", P.VLAN_STACKED, "XDP_DROP", "DROP_VLAN_STACKED"),
    Row("one 802.1Q tag, TCP to a VIP", P.VLAN_TCP4, "XDP_TX", "TX_ENCAP"),
    Row("IPv4 header cut at 12 bytes", P.IP4_TRUNCATED, "XDP_DROP", "DROP_MALFORMED_IP"),
    Row("IPv4 IHL 4", P.IP4_BAD_IHL, "XDP_DROP", "DROP_MALFORMED_IP"),
    Row("IPv4 ethertype with version 5", P.IP4_BAD_VERSION, "XDP_DROP", "DROP_MALFORMED_IP"),
    Row("IPv4 total length beyond the frame", P.IP4_LEN_TOO_LONG, "XDP_DROP", "DROP_MALFORMED_IP"),
    Row("IPv4 total length below the header length", P.IP4_LEN_UNDER_IHL, "XDP_DROP", "DROP_MALFORMED_IP"),
    Row("IPv6 header cut at 30 bytes", P.IP6_TRUNCATED, "XDP_DROP", "DROP_MALFORMED_IP"),
    Row("IPv6 payload length beyond the frame", P.IP6_LEN_TOO_LONG, "XDP_DROP", "DROP_MALFORMED_IP"),
    Row("IPv6 payload length 0 (jumbogram)", P.IP6_ZERO_PLEN, "XDP_DROP", "DROP_MALFORMED_IP"),
    Row("IPv6 extension header cut short", P.IP6_EXT_HDR_TRUNCATED, "XDP_DROP", "DROP_MALFORMED_IP"),
    Row("IPv4 options to a VIP", P.IP4_OPTIONS_TO_VIP, "XDP_DROP", "DROP_IP_OPTIONS"),
    Row("IPv4 options to another address", P.IP4_OPTIONS_NOT_VIP, "XDP_PASS", "PASS_FRAG_NOT_VIP"),
    Row("IPv4 first fragment to a VIP", P.IP4_FIRST_FRAGMENT_TO_VIP, "XDP_DROP", "DROP_FRAGMENT"),
    Row("IPv4 later fragment to a VIP", P.IP4_LATER_FRAGMENT_TO_VIP, "XDP_DROP", "DROP_FRAGMENT"),
    Row("IPv4 fragment to another address", P.IP4_FRAGMENT_NOT_VIP, "XDP_PASS", "PASS_FRAG_NOT_VIP"),
    Row("IPv6 fragment header to a VIP", P.IP6_FRAGMENT_TO_VIP, "XDP_DROP", "DROP_FRAGMENT"),
    Row("IPv6 fragment header to another address", P.IP6_FRAGMENT_NOT_VIP, "XDP_PASS", "PASS_FRAG_NOT_VIP"),
    Row("IPv6 hop-by-hop and destination options before TCP", P.IP6_EXT_HDRS_TO_VIP, "XDP_TX", "TX_ENCAP"),
    Row("TCP to an address that is no VIP (v4)", P.TCP4_NOT_VIP, "XDP_PASS", "PASS_NOT_VIP"),
    Row("TCP to an address that is no VIP (v6)", P.TCP6_NOT_VIP, "XDP_PASS", "PASS_NOT_VIP"),
    Row("TCP to a VIP address on a port with no VIP", P.TCP4_VIP_OTHER_PORT, "XDP_PASS", "PASS_NOT_VIP"),
    Row("GRE to a VIP address", P.GRE4_TO_VIP, "XDP_PASS", "PASS_NOT_VIP"),
    Row("TCP header cut at 10 bytes, to a VIP", P.TCP4_TRUNCATED_TO_VIP, "XDP_DROP", "DROP_MALFORMED_L4"),
    Row("TCP header cut at 10 bytes, elsewhere", P.TCP4_TRUNCATED_NOT_VIP, "XDP_PASS", "PASS_NOT_VIP"),
    Row("ICMP header cut at 3 bytes, to a VIP", P.ICMP4_TRUNCATED_TO_VIP, "XDP_DROP", "DROP_MALFORMED_L4"),
    Row("ICMP timestamp request to a VIP", P.ICMP4_TIMESTAMP_TO_VIP, "XDP_DROP", "DROP_ICMP_UNSUPPORTED"),
    Row("UDP to a VIP in a frame padded to 60 bytes", P.UDP4_PADDED, "XDP_TX", "TX_ENCAP"),
]


@pytest.mark.parametrize("row", PARSE_TABLE, ids=[r.description for r in PARSE_TABLE])
def test_parse_table(run_balancer: RunBalancer, row: Row) -> None:
    out = run_balancer.run(row.input)
    assert (out.verdict, out.reason) == (row.verdict, row.reason)
    if row.verdict in ("XDP_PASS", "XDP_DROP"):
        assert out.out == bytes(row.input), "a passed or dropped frame is left untouched"


def test_vlan_tag_is_kept_on_the_encapsulated_frame(run_balancer: RunBalancer) -> None:
    out = Ether(run_balancer.run(P.VLAN_TCP4).out)
    assert out.dst == P.ROUTER_MAC and out[Dot1Q].vlan == 10
    assert bytes(out[Dot1Q].payload[IP].payload) == bytes(P.VLAN_TCP4[IP])


def test_padding_is_not_part_of_the_inner_packet(run_balancer: RunBalancer) -> None:
    out = Ether(run_balancer.run(P.UDP4_PADDED).out)
    inner = out[IP].payload
    assert isinstance(inner, IP)
    assert bytes(inner)[: inner.len] == bytes(P.UDP4_PADDED[IP])[: inner.len]
    assert out[IP].len == 20 + inner.len


def test_vip_traffic_without_settings_is_dropped(balancer_factory: BalancerFactory) -> None:
    b = balancer_factory(configure=False)
    assert (b.run(P.TCP4_SYN).verdict, b.run(P.TCP4_SYN).reason) == ("XDP_DROP", "DROP_NO_SETTINGS")
    assert b.run(P.TCP4_NOT_VIP).reason == "PASS_NOT_VIP", "non-VIP traffic does not need settings"


def test_vip_without_reals_drops_with_no_real(balancer_factory: BalancerFactory) -> None:
    b = balancer_factory()
    b.vip("203.0.113.99", 80, "tcp", 9, [])
    out = b.run(P.tcp_to("203.0.113.99"))
    assert (out.verdict, out.reason) == ("XDP_DROP", "DROP_NO_REAL")


def test_ring_pointing_at_a_removed_real_drops_with_real_missing(balancer_factory: BalancerFactory) -> None:
    b = balancer_factory()
    b.vip("203.0.113.98", 80, "tcp", 9, ["192.0.2.98"])
    b.dp.del_real(b.real_id("192.0.2.98"))
    out = b.run(P.tcp_to("203.0.113.98", flags="S"))
    assert (out.verdict, out.reason) == ("XDP_DROP", "DROP_REAL_MISSING")


def test_ipv6_vip_with_ipv4_real_drops_with_family_mismatch(balancer_factory: BalancerFactory) -> None:
    b = balancer_factory()
    b.vip("2001:db8:f::99", 80, "tcp", 9, [P.REALS4[0]])
    out = b.run(P.tcp_to("2001:db8:f::99", flags="S"))
    assert (out.verdict, out.reason) == ("XDP_DROP", "DROP_FAMILY_MISMATCH")


def test_tcp_with_options_in_the_tcp_header_is_balanced(run_balancer: RunBalancer) -> None:
    frame = P.eth() / IP(src=P.CLIENT4, dst=P.VIP4) / TCP(sport=40100, dport=80, flags="S",
                                                         options=[("MSS", 1460), ("SAckOK", b"")])
    assert run_balancer.run(frame).reason == "TX_ENCAP"
