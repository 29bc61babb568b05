"""test_encap.py: every encap mode: outer headers, GUE fields, checksums, inner bytes, jumbo frames."""

from __future__ import annotations

import ipaddress

import pytest
from scapy.layers.inet import IP, UDP
from scapy.layers.inet6 import IPv6, IPv6ExtHdrDestOpt
from scapy.packet import Packet

from balancer import _abi

from . import packets as P
from .frames import decode_encap, ip_packet_of, ipv4_header_ok, l4_checksum_ok_v4, l4_checksum_ok_v6
from .rig import BalancerFactory, RunBalancer

TOS = 0xB9  # DSCP 46 (EF) with ECN ECT(1): both must reach the outer header


def flow(case: P.EncapCase, sport: int = 40000, flags: str = "S") -> Packet:
    if case.inner == 4:
        return P.tcp_to(case.vip, sport=sport, flags=flags, df=True, tos=TOS)
    return P.tcp_to(case.vip, sport=sport, flags=flags, tc=TOS)


@pytest.mark.parametrize("case", P.ENCAPS, ids=P.ENCAP_IDS)
def test_encapsulated_headers(run_balancer: RunBalancer, case: P.EncapCase) -> None:
    frame = flow(case, sport=40200)
    out = run_balancer.run(frame)
    assert (out.verdict, out.reason) == ("XDP_TX", "TX_ENCAP")
    enc = decode_encap(out.out, P.GUE_PORT)

    assert (enc.eth.dst, enc.eth.src) == (P.ROUTER_MAC, P.LB_MAC)
    assert enc.inner.raw == ip_packet_of(frame), "the inner packet is the client's packet, byte for byte"
    assert len(out.out) - len(frame) == case.case.overhead, "the bytes added are the catalogue's overhead"
    inner_proto = 4 if case.inner == 4 else 41
    if case.outer == 4:
        o = enc.outer.layer
        assert isinstance(o, IP)
        assert (o.src, o.ttl, o.tos, o.id, o.flags.DF, o.frag) == (P.SRC4, 64, TOS, 0, True, 0)
        assert o.dst in case.reals
        assert ipv4_header_ok(enc.outer.raw), "outer IPv4 header checksum"
        assert o.proto == (17 if case.mode != "IPIP" else inner_proto)
    else:
        o6 = enc.outer.layer
        assert isinstance(o6, IPv6)
        assert (o6.src, o6.hlim, o6.tc) == (P.SRC6, 64, TOS)
        assert o6.dst in case.reals
        assert o6.nh == (17 if case.mode != "IPIP" else inner_proto)
        assert o6.fl != 0, "the flow label carries the flow hash"
    if case.mode == "IPIP":
        assert not enc.udp and not enc.gue
        return
    assert enc.udp
    sport, dport, csum = enc.udp_sport, enc.udp_dport, enc.udp_checksum
    assert 49152 <= sport <= 65535, "GUE source port in the dynamic range"
    assert dport == P.GUE_PORT
    if case.outer == 4:
        assert csum != 0 and l4_checksum_ok_v4(enc.outer.raw), "outer UDP checksum over IPv4"
    else:
        assert csum != 0 and l4_checksum_ok_v6(enc.outer.raw), "outer UDP checksum over IPv6"
    if case.mode == "GUE0":
        assert enc.gue == bytes([0, inner_proto, 0, 0])
    else:
        assert not enc.gue and enc.inner.raw[0] >> 4 == case.inner


@pytest.mark.parametrize("case", P.ENCAPS, ids=P.ENCAP_IDS)
def test_one_flow_keeps_its_real_source_port_and_label(run_balancer: RunBalancer, case: P.EncapCase) -> None:
    first = decode_encap(run_balancer.run(flow(case, sport=40300)).out, P.GUE_PORT)
    again = decode_encap(run_balancer.run(flow(case, sport=40300, flags="A")).out, P.GUE_PORT)
    assert first.outer.dst == again.outer.dst
    assert (first.udp_sport, first.udp_dport) == (again.udp_sport, again.udp_dport)
    if case.outer == 6:
        assert first.outer.flow_label == again.outer.flow_label


@pytest.mark.parametrize("case", P.ENCAPS, ids=P.ENCAP_IDS)
def test_flows_spread_over_reals_ports_and_labels(run_balancer: RunBalancer, case: P.EncapCase) -> None:
    outs = [decode_encap(run_balancer.run(flow(case, sport=42000 + i)).out, P.GUE_PORT)
            for i in range(48)]
    assert {o.outer.dst for o in outs} == set(case.reals), "every real gets some of 48 flows"
    if case.mode != "IPIP":
        assert len({o.udp_sport for o in outs if o.udp}) >= 40, "GUE source ports follow the flow"
    if case.outer == 6:
        assert len({o.outer.flow_label for o in outs}) >= 40, "flow labels follow the flow"


@pytest.mark.parametrize("case", P.ENCAPS, ids=P.ENCAP_IDS)
def test_outer_source_from_the_flow_stays_in_the_prefix(balancer_factory: BalancerFactory,
                                                        case: P.EncapCase) -> None:
    b = balancer_factory(world=False)
    b.settings(src4=P.SRC4_NET, src6=P.SRC6_NET)
    b.vip(case.vip, P.VIP_PORT, "tcp", 0, case.reals, case.mode, flags=_abi.VipFlag.OUTER_SRC_FLOW)
    net = ipaddress.ip_network(P.SRC4_NET if case.outer == 4 else P.SRC6_NET)
    srcs = []
    for i in range(32):
        enc = decode_encap(b.run(flow(case, sport=43000 + i)).out, P.GUE_PORT)
        assert ipaddress.ip_address(enc.outer.src) in net
        if case.outer == 4:
            assert ipv4_header_ok(enc.outer.raw)
            if case.mode != "IPIP":
                assert l4_checksum_ok_v4(enc.outer.raw), "checksum covers the flow-derived source"
        elif case.mode != "IPIP":
            assert l4_checksum_ok_v6(enc.outer.raw), "checksum covers the flow-derived source"
        srcs.append(enc.outer.src)
    assert len(set(srcs)) >= 24, "32 flows use many outer sources"
    again = decode_encap(b.run(flow(case, sport=43000, flags="A")).out, P.GUE_PORT)
    assert again.outer.src == srcs[0]


@pytest.mark.parametrize("case", P.ENCAPS, ids=P.ENCAP_IDS)
def test_jumbo_frame_through_the_frags_program(balancer_factory: BalancerFactory, case: P.EncapCase) -> None:
    b = balancer_factory()
    b.settings(mtu=9000)
    frame = P.sized_tcp_to(case.vip, 8900, sport=44000)
    assert len(bytes(frame)) > 4096, "large enough to span several buffers in the test run"
    out = b.run(frame, frags=True)
    assert (out.verdict, out.reason) == ("XDP_TX", "TX_ENCAP")
    enc = decode_encap(out.out, P.GUE_PORT)
    assert enc.inner.raw == ip_packet_of(frame)
    if case.outer == 6 and case.mode != "IPIP":
        assert l4_checksum_ok_v6(enc.outer.raw), "UDP checksum over all fragments of the buffer"
    if case.outer == 4 and case.mode != "IPIP":
        assert l4_checksum_ok_v4(enc.outer.raw), "UDP checksum over all fragments of the buffer"


GUE_CASES = [c for c in P.ENCAPS if c.mode != "IPIP"]


@pytest.mark.parametrize("case", GUE_CASES, ids=[c.id for c in GUE_CASES])
def test_gue_checksum_is_zero_when_the_vip_opts_in(balancer_factory: BalancerFactory, case: P.EncapCase) -> None:
    """gue_csum = "zero": the outer UDP checksum is 0 over IPv4 and, by the operator's choice, IPv6."""
    b = balancer_factory(world=False)
    b.vip(case.vip, P.VIP_PORT, "tcp", 0, case.reals, case.mode, flags=_abi.VipFlag.GUE_CSUM_ZERO)
    out = b.run(flow(case, sport=43100))
    assert (out.verdict, out.reason) == ("XDP_TX", "TX_ENCAP")
    enc = decode_encap(out.out, P.GUE_PORT)
    assert enc.udp and enc.udp_checksum == 0, f"outer UDP checksum {enc.udp.hex()}"
    assert enc.inner.raw == ip_packet_of(flow(case, sport=43100))


def outer_udp_verifies(case: P.EncapCase, out: bytes) -> bool:
    enc = decode_encap(out, P.GUE_PORT)
    return l4_checksum_ok_v4(enc.outer.raw) if case.outer == 4 else l4_checksum_ok_v6(enc.outer.raw)


def with_byte_flipped(frame: Packet, offset_from_l4: int) -> bytes:
    """The frame's bytes with one byte of its L4 header or payload inverted (negative: of its IP header)."""
    raw = bytearray(bytes(frame))
    raw[14 + (20 if IP in frame else 40) + offset_from_l4] ^= 0xFF
    return bytes(raw)


@pytest.mark.parametrize("case", GUE_CASES, ids=[c.id for c in GUE_CASES])
def test_gue_checksum_is_derived_from_the_inner_tcp_checksum(balancer_factory: BalancerFactory,
                                                             case: P.EncapCase) -> None:
    """The outer UDP checksum of a TCP segment comes from the segment's own checksum, not its bytes
    (encap.h): it verifies exactly when the inner one does, so a segment that arrived corrupted is
    dropped by the real's UDP, where its TCP would have dropped it. Over IPv4 the inner header is taken
    by its checksum too: a header that arrived corrupted is dropped there, where its IP would have."""
    b = balancer_factory(world=False)
    b.vip(case.vip, P.VIP_PORT, "tcp", 0, case.reals, case.mode)
    good = flow(case, sport=43300)
    cases = [(bytes(good), True), (with_byte_flipped(good, 16), False),  # the TCP checksum
             (with_byte_flipped(good, 20), False)]                       # a payload byte
    if case.inner == 4:
        cases.append((with_byte_flipped(good, -10), False))  # the inner IPv4 header checksum (byte 10)
    for frame, verifies in cases:
        out = b.run(frame)
        assert (out.verdict, out.reason) == ("XDP_TX", "TX_ENCAP")
        assert decode_encap(out.out, P.GUE_PORT).inner.raw == ip_packet_of(frame)
        assert outer_udp_verifies(case, out.out) == verifies


BYTE_SUMMED = [(c, "udp-without-checksum") for c in GUE_CASES] + \
    [(c, "ipv6-extension-header") for c in GUE_CASES if c.inner == 6]


@pytest.mark.parametrize(("case", "inner"), BYTE_SUMMED, ids=[f"{c.id}-{k}" for c, k in BYTE_SUMMED])
def test_gue_checksum_is_summed_over_bytes_no_inner_checksum_covers(balancer_factory: BalancerFactory,
                                                                    case: P.EncapCase, inner: str) -> None:
    """Where no inner checksum covers the segment (UDP with checksum 0) or headers lie outside it
    (IPv6 extension headers), the outer checksum is summed over the bytes: it verifies even with a
    payload byte changed (nothing else would catch that) or a wrong inner checksum."""
    b = balancer_factory(world=False)
    if inner == "udp-without-checksum":
        b.vip(case.vip, P.VIP_UDP_PORT, "udp", 0, case.reals, case.mode)
        frame = P.eth() / P.ip_for(case.vip) / UDP(sport=43400, dport=P.VIP_UDP_PORT, chksum=0) / P.PAYLOAD
        changed = with_byte_flipped(frame, 12)
    else:
        b.vip(case.vip, P.VIP_PORT, "tcp", 0, case.reals, case.mode)
        frame = P.eth() / P.ip_for(case.vip) / IPv6ExtHdrDestOpt() / flow(case, sport=43500)[IPv6].payload
        changed = with_byte_flipped(frame, 8 + 16)  # the TCP checksum, behind the 8-byte option header
    for raw in (bytes(frame), changed):
        out = b.run(raw)
        assert (out.verdict, out.reason) == ("XDP_TX", "TX_ENCAP")
        assert decode_encap(out.out, P.GUE_PORT).inner.raw == ip_packet_of(raw)
        assert outer_udp_verifies(case, out.out)


@pytest.mark.parametrize("case", [P.ENCAPS[0], P.ENCAPS[4]], ids=[P.ENCAPS[0].id, P.ENCAPS[4].id])
def test_jumbo_frame_over_the_mtu_is_answered_too_big(balancer_factory: BalancerFactory,
                                                      case: P.EncapCase) -> None:
    b = balancer_factory()
    frame = P.sized_tcp_to(case.vip, 8900, sport=44100)
    out = b.run(frame, frags=True)
    assert (out.verdict, out.reason) == ("XDP_TX", "TX_ICMP_TOO_BIG")
    assert len(out.out) == 14 + (576 if case.inner == 4 else 1280)
