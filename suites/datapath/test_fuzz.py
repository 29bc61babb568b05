"""test_fuzz.py: random, truncated, malformed frames: never ABORTED, inner bytes intact, always one reason.

Hypothesis runs derandomized (the same examples every run, so CI is reproducible); raise
L4LAB_FUZZ_EXAMPLES to search further locally.
"""

from __future__ import annotations

import os
import struct

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scapy.layers.inet import IP, TCP, UDP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import Ether
from scapy.packet import Packet

from . import packets as P
from .conftest import Balancer
from .frames import decode_encap

EXAMPLES = int(os.environ.get("L4LAB_FUZZ_EXAMPLES", "300"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

BASES = [bytes(f) for f in (
    P.TCP4_SYN, P.TCP6_SYN, P.UDP4, P.VLAN_TCP4, P.IP6_EXT_HDRS_TO_VIP, P.ICMP4_ECHO_TO_VIP,
    P.ICMP6_ECHO_TO_VIP, P.icmp_error_about(P.VIP4, P.CLIENT4), P.icmp_error_about(P.VIP6, P.CLIENT6),
    P.tcp_to(P.ENCAPS[1].vip), P.tcp_to(P.ENCAPS[4].vip), P.tcp_to(P.ENCAPS[5].vip),
    P.sized_tcp_to(P.VIP4, 1490), P.sized_tcp_to(P.VIP6, 1490),
)]


def ip_packet_bounds(frame: bytes) -> tuple[int, int] | None:
    """(offset, length) of the IP packet the frame's headers announce, or None."""
    off = 14
    ethertype = struct.unpack("!H", frame[12:14])[0]
    if ethertype == 0x8100:
        ethertype, off = struct.unpack("!H", frame[16:18])[0], 18
    if ethertype == 0x0800 and len(frame) >= off + 4:
        return off, struct.unpack("!H", frame[off + 2: off + 4])[0]
    if ethertype == 0x86DD and len(frame) >= off + 6:
        return off, 40 + struct.unpack("!H", frame[off + 4: off + 6])[0]
    return None


def check_one(b: Balancer, frame: bytes) -> None:
    out = b.run(frame)  # asserts exactly one reason moved
    assert out.verdict != "XDP_ABORTED", frame.hex()
    if out.verdict in ("XDP_PASS", "XDP_DROP"):
        assert out.out == frame, f"{out.reason} changed the frame {frame.hex()}"
        return
    assert out.verdict == "XDP_TX", out
    bounds = ip_packet_bounds(frame)
    assert bounds is not None, f"{out.reason} for a frame without an IP packet: {frame.hex()}"
    off, length = bounds
    ip_packet = frame[off: off + length]
    if out.reason == "TX_ENCAP":
        inner = decode_encap(out.out, P.GUE_PORT).inner
        assert inner == ip_packet, f"inner bytes differ for {frame.hex()}"
    elif out.reason == "TX_ICMP_TOO_BIG":
        quote_at = off + (28 if frame[off] >> 4 == 4 else 48)
        quote = out.out[quote_at:]
        assert quote and ip_packet.startswith(quote), f"quote is not the original's head: {frame.hex()}"
    else:
        assert out.reason == "TX_ICMP_ECHO" and len(out.out) == len(frame)


def reasons_total(b: Balancer) -> int:
    return sum(b.dp.reasons().values())


def test_fuzz_random_frames(balancer: Balancer) -> None:
    start, runs = reasons_total(balancer), 0

    @FUZZ
    @given(ethertype=st.sampled_from([0x0800, 0x86DD, 0x8100, 0x88A8, 0x0806]) | st.integers(0, 0xFFFF),
           body=st.binary(min_size=0, max_size=160))
    def one(ethertype: int, body: bytes) -> None:
        nonlocal runs
        check_one(balancer, bytes(Ether(src=P.CLIENT_MAC, dst=P.LB_MAC, type=ethertype)) + body)
        runs += 1

    one()
    assert runs >= min(EXAMPLES, 100), "hypothesis ran the examples"
    assert reasons_total(balancer) - start == runs


def test_fuzz_mutated_packets(balancer: Balancer) -> None:
    start, runs = reasons_total(balancer), 0

    @FUZZ
    @given(base=st.sampled_from(BASES), data=st.data())
    def one(base: bytes, data: st.DataObject) -> None:
        nonlocal runs
        frame = bytearray(base)
        for _ in range(data.draw(st.integers(0, 4), label="mutations")):
            pos = data.draw(st.integers(12, min(len(frame) - 1, 120)), label="position")
            frame[pos] = data.draw(st.integers(0, 255), label="byte")
        cut = data.draw(st.integers(14, len(frame)), label="length")
        check_one(balancer, bytes(frame[:cut]))
        runs += 1

    one()
    assert runs >= min(EXAMPLES, 100), "hypothesis ran the examples"
    assert reasons_total(balancer) - start == runs


def test_fuzz_header_fields(balancer: Balancer) -> None:
    start, runs = reasons_total(balancer), 0
    vips4 = [e.vip for e in P.ENCAPS if ":" not in e.vip] + [P.OTHER4]
    vips6 = [e.vip for e in P.ENCAPS if ":" in e.vip] + [P.OTHER6]

    @FUZZ
    @given(v6=st.booleans(), data=st.data())
    def one(v6: bool, data: st.DataObject) -> None:
        nonlocal runs
        l4 = data.draw(st.sampled_from(["tcp", "udp", "icmp", "other"]), label="l4")
        payload = data.draw(st.binary(max_size=64), label="payload")
        sport = data.draw(st.integers(0, 0xFFFF), label="sport")
        dport = data.draw(st.sampled_from([80, 443, 0, 8080]), label="dport")
        seg: Packet | None
        ip: Packet
        if l4 == "tcp":
            seg = TCP(sport=sport, dport=dport, flags=data.draw(st.integers(0, 0xFF), label="tcp flags"),
                      dataofs=data.draw(st.sampled_from([None, 0, 4, 5, 15]), label="dataofs"))
        elif l4 == "udp":
            ulen = data.draw(st.sampled_from([None, 0, 7, 9000]), label="ulen")
            seg = UDP(sport=sport, dport=dport, len=ulen)
        else:
            seg = None
        if v6:
            other_nh = data.draw(st.sampled_from([0, 43, 44, 60, 59]), label="nh")
            nh = {"tcp": 6, "udp": 17, "icmp": 58}.get(l4, other_nh)
            ip = IPv6(src=P.CLIENT6, dst=data.draw(st.sampled_from(vips6), label="dst6"), nh=nh,
                      plen=data.draw(st.sampled_from([None, 0, 8, 2000]), label="plen"))
        else:
            proto = {"tcp": 6, "udp": 17, "icmp": 1}.get(l4, data.draw(st.integers(0, 255), label="proto"))
            ip = IP(src=P.CLIENT4, dst=data.draw(st.sampled_from(vips4), label="dst4"), proto=proto,
                    ihl=data.draw(st.sampled_from([None, 4, 5, 6, 15]), label="ihl"),
                    flags=data.draw(st.integers(0, 7), label="ipflags"),
                    frag=data.draw(st.sampled_from([0, 0, 1, 100]), label="frag"),
                    len=data.draw(st.sampled_from([None, 10, 20, 1000]), label="len"))
        pkt = P.eth() / ip / seg / payload if seg is not None else P.eth() / ip / payload
        check_one(balancer, bytes(pkt))
        runs += 1

    one()
    assert runs >= min(EXAMPLES, 100), "hypothesis ran the examples"
    assert reasons_total(balancer) - start == runs
