"""test_decap.py: the real-server decap program (XDP and tc) for every encap mode, and what it leaves."""

from __future__ import annotations

import struct
from collections.abc import Callable
from functools import reduce

import pytest
from scapy.layers.inet import IP, UDP
from scapy.layers.inet6 import (
    IPv6,
    IPv6ExtHdrDestOpt,
    IPv6ExtHdrFragment,
    IPv6ExtHdrHopByHop,
    IPv6ExtHdrRouting,
    PadN,
)
from scapy.layers.ipsec import AH
from scapy.layers.l2 import Ether
from scapy.packet import NoPayload, Packet, Raw

from balancer.decap import Decap
from lab.packets.gue import GUE

from . import packets as P
from .frames import ip_packet_of
from .rig import TC_VERDICTS, XDP_VERDICTS, RunBalancer, frame_bytes

HOOKS = ["xdp", "tc"]


def run_decap(decap: Decap, hook: str, frame: Packet | bytes) -> tuple[str, bytes, str]:
    """(verdict, output frame, the one dc_reasons counter that moved)."""
    before = decap.reasons()
    if hook == "xdp":
        action, out = decap.run_xdp(frame_bytes(frame))
        verdict = XDP_VERDICTS.get(action, str(action))
    else:
        action, out = decap.run_tc(frame_bytes(frame))
        verdict = TC_VERDICTS.get(action, str(action))
    after = decap.reasons()
    moved = {k: after[k] - before[k] for k in after if after[k] != before[k]}
    assert len(moved) == 1 and sum(moved.values()) == 1, f"one decap reason per packet, got {moved}"
    return verdict, out, next(iter(moved))


PASS = {"xdp": "XDP_PASS", "tc": "TC_ACT_OK"}
DROP = {"xdp": "XDP_DROP", "tc": "TC_ACT_SHOT"}


@pytest.mark.parametrize("hook", HOOKS)
@pytest.mark.parametrize("case", P.ENCAPS, ids=P.ENCAP_IDS)
def test_decap_restores_the_clients_packet(run_balancer: RunBalancer, decap: Decap, case: P.EncapCase,
                                          hook: str) -> None:
    frame = P.tcp_to(case.vip, sport=49000, flags="S")
    encapsulated = run_balancer.run(frame).out
    verdict, out, reason = run_decap(decap, hook, encapsulated)
    assert verdict == PASS[hook]
    assert reason == ("IPIP" if case.mode == "IPIP" else "GUE")
    assert out[:12] == encapsulated[:12], "MAC addresses kept"
    assert struct.unpack("!H", out[12:14])[0] == (0x0800 if case.inner == 4 else 0x86DD)
    assert out[14:] == ip_packet_of(frame)


def gue(outer: Packet, port: int, body: Packet | bytes) -> Packet:
    """UDP to `port` carrying body: a GUE layer (variant 0, lab/packets/gue.py) or bytes as they are."""
    return P.eth() / outer / UDP(sport=50000, dport=port) / (body if isinstance(body, Packet) else Raw(body))


INNER4 = bytes(IP(src=P.CLIENT4, dst=P.VIP4) / UDP(sport=1, dport=2) / P.PAYLOAD)
INNER6 = bytes(IPv6(src=P.CLIENT6, dst=P.VIP6) / UDP(sport=1, dport=2) / P.PAYLOAD)
LOCAL4, LOCAL6 = P.REALS4[0], P.REALS6[0]

Check = Callable[[bytes], bool]


def outer6(ext: Packet, proto: int, inner: bytes, dst: str = LOCAL6) -> Packet:
    """IPv6 from the LB to dst whose extension headers `ext` end in protocol `proto` (4 or 41)."""
    ext = ext.copy()
    last = ext
    while not isinstance(last.payload, NoPayload):
        last = last.payload
    last.nh = proto
    return P.eth() / IPv6(src=P.SRC6, dst=dst) / ext / Raw(inner)


def inner_is(inner: bytes) -> Check:
    family = b"\x08\x00" if inner[0] >> 4 == 4 else b"\x86\xdd"
    return lambda out: out[12:14] == family and out[14:] == inner
DECAP_TABLE: list[tuple[str, Packet | bytes, str, str, Check | None]] = [
    # (description, input, verdict kind, reason, check of the output or None for "unchanged")
    ("plain IPv4 is not ours to touch", P.tcp_to(LOCAL4), "pass", "PASS_NOT_ENCAP", None),
    ("plain IPv6", P.tcp_to(LOCAL6), "pass", "PASS_NOT_ENCAP", None),
    ("ARP", P.ARP_REQUEST, "pass", "PASS_NOT_ENCAP", None),
    ("IPIP to an address that is not local",
     P.eth() / IP(src=P.SRC4, dst="192.0.2.99", proto=4) / Raw(INNER4),
     "pass", "PASS_NOT_LOCAL", None),
    ("GUE to an address that is not local", gue(IP(src=P.SRC4, dst="192.0.2.99"), P.GUE_PORT, INNER4),
     "pass", "PASS_NOT_LOCAL", None),
    ("UDP to another port", gue(IP(src=P.SRC4, dst=LOCAL4), 6081, INNER4), "pass", "PASS_NOT_ENCAP", None),
    ("GUE over IPv4 with a zero UDP checksum (gue_csum = \"zero\")",
     P.eth() / IP(src=P.SRC4, dst=LOCAL4) / UDP(sport=50000, dport=P.GUE_PORT, chksum=0) / Raw(INNER4),
     "pass", "GUE", inner_is(INNER4)),
    ("GUE over IPv6 with a zero UDP checksum (the operator's opt-in)",
     P.eth() / IPv6(src=P.SRC6, dst=LOCAL6) / UDP(sport=50000, dport=P.GUE_PORT, chksum=0) / Raw(INNER6),
     "pass", "GUE", inner_is(INNER6)),
    ("IPIP fragment: left to reassembly", P.eth() / IP(src=P.SRC4, dst=LOCAL4, proto=4, flags="MF")
     / Raw(INNER4), "pass", "PASS_NOT_ENCAP", None),
    ("GUE variant 0 with one word of options",
     gue(IP(src=P.SRC4, dst=LOCAL4), P.GUE_PORT, GUE(proto=4, options=b"\0" * 4) / Raw(INNER4)),
     "pass", "GUE", lambda out: out[14:] == INNER4),
    ("GUE variant 0 announcing IPv6 over IPv4",
     gue(IP(src=P.SRC4, dst=LOCAL4), P.GUE_PORT, GUE(proto=41) / Raw(INNER6)),
     "pass", "GUE", lambda out: out[12:14] == b"\x86\xdd" and out[14:] == INNER6),
    ("GUE variant 0 control message: left to the stack",
     gue(IP(src=P.SRC4, dst=LOCAL4), P.GUE_PORT, GUE(control=1) / Raw(INNER4)),
     "pass", "PASS_GUE_CONTROL", None),
    ("GUE variant 0 control message over IPv6",
     gue(IPv6(src=P.SRC6, dst=LOCAL6), P.GUE_PORT, GUE(control=1, options=b"\0" * 4) / Raw(INNER6)),
     "pass", "PASS_GUE_CONTROL", None),
    ("GUE variant 0 control message to an address that is not local",
     gue(IP(src=P.SRC4, dst="192.0.2.99"), P.GUE_PORT, GUE(control=1) / Raw(INNER4)),
     "pass", "PASS_NOT_LOCAL", None),
    ("GUE variant 0 naming protocol 17",
     gue(IP(src=P.SRC4, dst=LOCAL4), P.GUE_PORT, GUE(proto=17) / Raw(INNER4)),
     "drop", "DROP_MALFORMED", None),
    ("GUE variant 1 with IP version 5", gue(IP(src=P.SRC4, dst=LOCAL4), P.GUE_PORT, b"\x55" + INNER4[1:]),
     "drop", "DROP_MALFORMED", None),
    ("GUE version 2", gue(IP(src=P.SRC4, dst=LOCAL4), P.GUE_PORT, b"\x80" + INNER4[1:]),
     "drop", "DROP_MALFORMED", None),
    ("IPIP announcing IPv4 that carries IPv6", P.eth() / IP(src=P.SRC4, dst=LOCAL4, proto=4) / Raw(INNER6),
     "drop", "DROP_MALFORMED", None),
    ("GUE header cut short", gue(IP(src=P.SRC4, dst=LOCAL4), P.GUE_PORT, b"\0\x04"),
     "drop", "DROP_MALFORMED", None),
    # Outer IPv6 extension headers before the tunnel.
    ("6in6 after hop-by-hop", outer6(IPv6ExtHdrHopByHop(), 41, INNER6), "pass", "IPIP", inner_is(INNER6)),
    ("4in6 after hop-by-hop and destination options",
     outer6(IPv6ExtHdrHopByHop() / IPv6ExtHdrDestOpt(), 4, INNER4), "pass", "IPIP", inner_is(INNER4)),
    ("6in6 after a routing header with no segments left",
     outer6(IPv6ExtHdrRouting(addresses=[LOCAL6], segleft=0), 41, INNER6), "pass", "IPIP", inner_is(INNER6)),
    ("GUE variant 1 after destination options",
     P.eth() / IPv6(src=P.SRC6, dst=LOCAL6) / IPv6ExtHdrDestOpt() / UDP(sport=50000, dport=P.GUE_PORT)
     / Raw(INNER6), "pass", "GUE", inner_is(INNER6)),
    ("GUE variant 0 after hop-by-hop with 32 bytes of options",
     P.eth() / IPv6(src=P.SRC6, dst=LOCAL6) / IPv6ExtHdrHopByHop(options=[PadN(optdata=b"\0" * 28)])
     / UDP(sport=50000, dport=P.GUE_PORT) / GUE(proto=4) / Raw(INNER4), "pass", "GUE", inner_is(INNER4)),
    ("6in6 after a fragment header: left to reassembly",
     outer6(IPv6ExtHdrFragment(m=1, id=5), 41, INNER6), "pass", "PASS_NOT_ENCAP", None),
    ("6in6 after AH: the stack authenticates",
     outer6(AH(spi=1, icv=b"\0" * 12), 41, INNER6), "pass", "PASS_NOT_ENCAP", None),
    ("6in6 with a routing header that has segments left: not yet at its destination",
     outer6(IPv6ExtHdrRouting(addresses=["2001:db8:e::1"], segleft=1), 41, INNER6),
     "pass", "PASS_NOT_LOCAL", None),
    ("6in6 after nine destination-options headers: beyond the walk's bound",
     outer6(reduce(lambda a, b: a / b, [IPv6ExtHdrDestOpt() for _ in range(9)]), 41, INNER6),
     "pass", "PASS_NOT_ENCAP", None),
    ("hop-by-hop cut short", bytes(P.eth() / IPv6(src=P.SRC6, dst=LOCAL6, nh=0, plen=4) / b"\x29\0\0\0"),
     "pass", "PASS_NOT_ENCAP", None),
    ("6in6 after hop-by-hop to an address that is not local",
     outer6(IPv6ExtHdrHopByHop(), 41, INNER6, dst="2001:db8:a::99"),
     "pass", "PASS_NOT_LOCAL", None),
]


@pytest.mark.parametrize("hook", HOOKS)
@pytest.mark.parametrize("row", DECAP_TABLE, ids=[r[0] for r in DECAP_TABLE])
def test_decap_table(decap: Decap, hook: str,
                     row: tuple[str, Packet | bytes, str, str, Check | None]) -> None:
    description, frame, kind, reason, check = row
    verdict, out, got_reason = run_decap(decap, hook, frame)
    assert (verdict, got_reason) == ((PASS if kind == "pass" else DROP)[hook], reason), description
    if check is None:
        if kind == "pass":
            assert out == frame_bytes(frame), "left untouched"
    else:
        assert check(out), f"{description}: {out.hex()}"


def tagged(frame: Packet, vlan: int = 10) -> bytes:
    """The frame with one 802.1Q tag (VLAN `vlan`, priority 5) after the MAC addresses."""
    raw = bytes(frame)
    return raw[:12] + struct.pack("!HH", 0x8100, (5 << 13) | vlan) + raw[12:]


@pytest.mark.parametrize("hook", HOOKS)
@pytest.mark.parametrize("case", [P.ENCAPS[0], P.ENCAPS[2], P.ENCAPS[4]], ids=lambda c: c.id)
def test_decap_of_a_tagged_frame(run_balancer: RunBalancer, decap: Decap, case: P.EncapCase, hook: str) -> None:
    """XDP keeps the tag in the frame; tc moves it into the skb's metadata, where the kernel's
    receive path keeps tags (a test run does not untag, so tc sees this one in the frame), and
    passes the untagged inner frame: the test run's output shows the frame without it."""
    frame = P.tcp_to(case.vip, sport=49100, flags="S")
    encapsulated = tagged(Ether(run_balancer.run(frame).out))
    verdict, out, reason = run_decap(decap, hook, encapsulated)
    assert (verdict, reason) == (PASS[hook], "IPIP" if case.mode == "IPIP" else "GUE")
    inner_type = struct.pack("!H", 0x0800 if case.inner == 4 else 0x86DD)
    assert out[:12] == encapsulated[:12], "MAC addresses kept"
    if hook == "xdp":
        assert out[12:16] == encapsulated[12:16], "the tag stays in the frame"
        assert out[16:18] == inner_type and out[18:] == ip_packet_of(frame)
    else:
        assert out[12:14] == inner_type and out[14:] == ip_packet_of(frame)
