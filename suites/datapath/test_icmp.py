"""test_icmp.py: echo replies for VIPs, ICMP errors steered to the flow's real, too-big answers."""

from __future__ import annotations

from collections.abc import Callable
from functools import reduce

import pytest
from scapy.layers.inet import ICMP, IP
from scapy.layers.inet6 import (
    IPv6,
    IPv6ExtHdrDestOpt,
    IPv6ExtHdrFragment,
    IPv6ExtHdrHopByHop,
    IPv6ExtHdrRouting,
    IPv6ExtHdrSegmentRouting,
    PadN,
)
from scapy.layers.l2 import Ether
from scapy.packet import Packet

from . import packets as P
from .frames import decode_encap, icmp4_checksum_ok, ip_packet_of, ipv4_header_ok, l4_checksum_ok_v6
from .rig import BalancerFactory, RunBalancer


def test_echo_request_to_a_vip_is_answered_v4(run_balancer: RunBalancer) -> None:
    out = run_balancer.run(P.ICMP4_ECHO_TO_VIP)
    assert (out.verdict, out.reason) == ("XDP_TX", "TX_ICMP_ECHO")
    reply = Ether(out.out)
    assert (reply.src, reply.dst) == (P.LB_MAC, P.CLIENT_MAC)
    ip = reply[IP]
    assert (ip.src, ip.dst, ip.ttl) == (P.VIP4, P.CLIENT4, 64)
    assert (ip[ICMP].type, ip[ICMP].code, ip[ICMP].id, ip[ICMP].seq) == (0, 0, 7, 1)
    raw = bytes(ip)
    assert ipv4_header_ok(raw) and icmp4_checksum_ok(raw)
    assert bytes(ip[ICMP].payload) == P.PAYLOAD


def test_echo_request_to_a_vip_is_answered_v6(run_balancer: RunBalancer) -> None:
    out = run_balancer.run(P.ICMP6_ECHO_TO_VIP)
    assert (out.verdict, out.reason) == ("XDP_TX", "TX_ICMP_ECHO")
    reply = Ether(out.out)
    assert (reply.src, reply.dst) == (P.LB_MAC, P.CLIENT_MAC)
    ip6 = reply[IPv6]
    assert (ip6.src, ip6.dst, ip6.hlim) == (P.VIP6, P.CLIENT6, 64)
    raw = bytes(ip6)
    assert raw[40] == 129 and l4_checksum_ok_v6(raw)


@pytest.mark.parametrize("frame", [P.ICMP4_ECHO_NOT_VIP, P.ICMP6_ECHO_NOT_VIP, P.ICMP4_ERROR_NOT_VIP_FLOW],
                         ids=["echo-v4-not-vip", "echo-v6-not-vip", "error-about-other-flow"])
def test_icmp_not_about_a_vip_is_passed(run_balancer: RunBalancer, frame: Packet) -> None:
    out = run_balancer.run(frame)
    assert (out.verdict, out.reason) == ("XDP_PASS", "PASS_ICMP_NOT_VIP")
    assert out.out == bytes(frame)


STEER_CASES = [  # (id, encap case, quote length in bytes or None for the whole quoted packet)
    ("ip4-full-quote", P.ENCAPS[0], None),
    ("ip4-8-bytes-of-tcp", P.ENCAPS[0], 28),
    ("ip4-gue1", P.ENCAPS[1], None),
    ("ip6-full-quote", P.ENCAPS[3], None),
    ("ip6-8-bytes-of-tcp", P.ENCAPS[3], 48),
    ("ip6-gue1", P.ENCAPS[4], None),
]


@pytest.mark.parametrize(("case", "quote"), [(c, q) for _, c, q in STEER_CASES],
                         ids=[i for i, _, _ in STEER_CASES])
def test_icmp_error_about_a_vip_flow_goes_to_the_flows_real(balancer_factory: BalancerFactory,
                                                            case: P.EncapCase, quote: int | None) -> None:
    b = balancer_factory()
    client = P.CLIENT4 if case.inner == 4 else P.CLIENT6
    reals = set()
    for sport in range(46000, 46012):  # several flows, so the test fails if steering ignored the quote
        fwd = decode_encap(b.run(P.tcp_to(case.vip, sport=sport, flags="S")).out, P.GUE_PORT)
        assert b.run(P.tcp_to(case.vip, sport=sport, flags="A")).events == {"LRU_MISS": 1}, \
            "the handshake's ACK creates the session (the SYN does not)"
        err = P.icmp_error_about(case.vip, client, cport=sport, quote_len=quote)
        out = b.run(err)
        assert (out.verdict, out.reason) == ("XDP_TX", "TX_ENCAP")
        assert out.events.get("ICMP_STEERED") == 1 and "LRU_HIT" in out.events
        enc = decode_encap(out.out, P.GUE_PORT)
        assert enc.outer.dst == fwd.outer.dst, "the error reaches the real that serves the flow"
        assert enc.inner.raw == ip_packet_of(err)
        reals.add(enc.outer.dst)
    assert len(reals) > 1


def test_icmp_error_follows_the_ring_when_the_flow_has_no_session(balancer_factory: BalancerFactory) -> None:
    b = balancer_factory()
    case = P.ENCAPS[0]
    for sport in range(46100, 46110):
        err = P.icmp_error_about(case.vip, P.CLIENT4, cport=sport)
        steered = decode_encap(b.run(err).out, P.GUE_PORT)
        fwd = decode_encap(b.run(P.tcp_to(case.vip, sport=sport, flags="S")).out, P.GUE_PORT)
        assert steered.outer.dst == fwd.outer.dst, "same hash for the quoted flow reversed"


def test_icmpv6_destination_unreachable_is_steered(run_balancer: RunBalancer) -> None:
    err = P.icmp_error_about(P.VIP6, P.CLIENT6, cport=46200, v6_type="unreach")
    out = run_balancer.run(err)
    assert out.reason == "TX_ENCAP" and out.events.get("ICMP_STEERED") == 1


@pytest.mark.parametrize("case", P.ENCAPS, ids=P.ENCAP_IDS)
def test_too_big_is_answered_with_the_real_limit(run_balancer: RunBalancer, case: P.EncapCase) -> None:
    """The limit is the MTU less the catalogue's overhead (balancer/encaps.py, checked in test_encaps.py)."""
    limit = P.MTU - case.case.overhead
    fits = run_balancer.run(P.sized_tcp_to(case.vip, limit, sport=47000))
    assert fits.reason == "TX_ENCAP", "a packet of exactly the limit is encapsulated"
    frame = P.sized_tcp_to(case.vip, limit + 1, sport=47001)
    out = run_balancer.run(frame)
    assert (out.verdict, out.reason) == ("XDP_TX", "TX_ICMP_TOO_BIG")
    eth = Ether(out.out)
    assert (eth.src, eth.dst) == (P.LB_MAC, P.CLIENT_MAC)
    original = ip_packet_of(frame)
    if case.inner == 4:
        raw = bytes(eth[IP])
        ip = IP(raw)
        assert (ip.src, ip.dst, ip.ttl, ip.proto, ip.len) == (case.vip, P.CLIENT4, 64, 1, 576)
        assert ipv4_header_ok(raw) and icmp4_checksum_ok(raw)
        icmp = raw[20:28]
        assert (icmp[0], icmp[1], int.from_bytes(icmp[6:8], "big")) == (3, 4, limit)
        assert raw[28:] == original[:548]
    else:
        raw = bytes(eth[IPv6])
        assert len(raw) == 1280
        ip6 = IPv6(raw)
        assert (ip6.src, ip6.dst, ip6.hlim, ip6.nh) == (case.vip, P.CLIENT6, 64, 58)
        assert l4_checksum_ok_v6(raw)
        assert (raw[40], raw[41], int.from_bytes(raw[44:48], "big")) == (2, 0, limit)
        assert raw[48:] == original[:1232]


def test_too_big_quotes_a_short_packet_whole(balancer_factory: BalancerFactory) -> None:
    b = balancer_factory()
    b.settings(mtu=200)
    frame = P.sized_tcp_to(P.VIP4, 300, sport=47100)
    raw = bytes(Ether(b.run(frame).out)[IP])
    assert len(raw) == 28 + 300 and raw[28:] == ip_packet_of(frame)
    assert icmp4_checksum_ok(raw) and int.from_bytes(raw[26:28], "big") == 180


def test_too_big_without_df_is_dropped(run_balancer: RunBalancer) -> None:
    frame = P.sized_tcp_to(P.VIP4, P.MTU, df=False, sport=47200)
    out = run_balancer.run(frame)
    assert (out.verdict, out.reason) == ("XDP_DROP", "DROP_TOO_BIG_NO_DF")


# ICMPv6 errors whose quoted packet carries extension headers between IPv6 and TCP. Each row: id,
# the extension headers, the error type, where the quoted packet was sent (None: to the client, a
# string: to a next segment while the routing header names the client), quote length, steered?
NEXT_SEGMENT = "2001:db8:e::1"
QUOTED_EXT_TABLE: list[tuple[str, Callable[[], Packet], str, str | None, int | None, bool]] = [
    ("hop-by-hop, packet too big", lambda: IPv6ExtHdrHopByHop(), "too_big", None, None, True),
    ("destination options, destination unreachable", lambda: IPv6ExtHdrDestOpt(), "unreach", None, None, True),
    ("hop-by-hop + routing (done) + destination options, time exceeded",
     lambda: IPv6ExtHdrHopByHop() / IPv6ExtHdrRouting(addresses=[NEXT_SEGMENT], segleft=0) / IPv6ExtHdrDestOpt(),
     "time", None, None, True),
    ("hop-by-hop, only 8 bytes of TCP quoted", lambda: IPv6ExtHdrHopByHop(), "too_big", None, 40 + 8 + 8, True),
    ("first fragment", lambda: IPv6ExtHdrFragment(m=1, id=9), "too_big", None, None, True),
    ("segment routing header, the client is the last segment still ahead",
     lambda: IPv6ExtHdrSegmentRouting(addresses=[P.CLIENT6, NEXT_SEGMENT], segleft=1), "unreach",
     NEXT_SEGMENT, None, True),
    ("later fragment: no ports in the quote", lambda: IPv6ExtHdrFragment(offset=100, id=9), "too_big", None,
     None, False),
    ("type-0 routing header with segments left (deprecated, not read)",
     lambda: IPv6ExtHdrRouting(addresses=[P.CLIENT6], segleft=1), "unreach", NEXT_SEGMENT, None, False),
    ("nine destination-options headers: beyond the walk's bound",
     lambda: reduce(lambda a, b: a / b, [IPv6ExtHdrDestOpt() for _ in range(9)]), "too_big", None, None, False),
    ("hop-by-hop cut short in the quote", lambda: IPv6ExtHdrHopByHop(options=[PadN(optdata=b"\0" * 12)]),
     "too_big", None, 40 + 8, False),
]


@pytest.mark.parametrize("row", QUOTED_EXT_TABLE, ids=[r[0] for r in QUOTED_EXT_TABLE])
def test_icmpv6_error_quoting_extension_headers(balancer_factory: BalancerFactory,
                                                row: tuple[str, Callable[[], Packet], str, str | None,
                                                           int | None, bool]) -> None:
    description, ext, v6_type, quote_dst, quote_len, steered = row
    b = balancer_factory()
    case = P.ENCAPS[3]  # ip6-ip6ip6
    reals = set()
    for sport in range(46300, 46308):  # several flows: steering must follow each flow's own real
        fwd = decode_encap(b.run(P.tcp_to(case.vip, sport=sport, flags="A")).out, P.GUE_PORT)  # inserts
        err = P.icmp6_error_quoting_ext(case.vip, P.CLIENT6, ext(), cport=sport, v6_type=v6_type,
                                        quote_dst=quote_dst, quote_len=quote_len)
        out = b.run(err)
        if not steered:
            assert (out.verdict, out.reason) == ("XDP_DROP", "DROP_ICMP_UNSUPPORTED"), description
            assert "ICMP_STEERED" not in out.events
            return
        assert (out.verdict, out.reason) == ("XDP_TX", "TX_ENCAP"), description
        assert out.events.get("ICMP_STEERED") == 1 and "LRU_HIT" in out.events
        enc = decode_encap(out.out, P.GUE_PORT)
        assert enc.outer.dst == fwd.outer.dst, f"{description}: the error reaches the flow's real"
        assert enc.inner.raw == ip_packet_of(err)
        reals.add(enc.outer.dst)
    assert len(reals) > 1, "the flows were spread, so the quote decided"
