"""test_gue_layer.py: the scapy GUE layer and the one decoder (lab/packets) against the frames the BPF program emits.

Round trips: the balancer's encapsulated output (a test run) dissects into Ether/IP/UDP/GUE/IP for
variant 0 and Ether/IP/UDP/IP for variant 1, and the same frame built from scapy layers, lengths,
checksums and the GUE protocol left to scapy, is the emitted frame byte for byte. Malformed GUE
headers dissect to Raw or a GUE layer without raising, even with scapy's dissector debugging on.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from scapy.config import conf
from scapy.layers.inet import IP, UDP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import Dot1Q, Ether
from scapy.packet import Packet, Raw

from lab.packets.decode import decapsulate, decapsulate_ip
from lab.packets.gue import GUE, bind_gue, bound_port

from . import packets as P
from .frames import ip_packet_of
from .rig import RunBalancer
from .test_encap import flow

GUE_CASES = [c for c in P.ENCAPS if c.mode != "IPIP"]
KIND = {("IPIP", 4, 4): "ipip", ("IPIP", 6, 6): "ip6ip6", ("IPIP", 6, 4): "ip4ip6", ("GUE1", 4, 4): "gue1",
        ("GUE1", 6, 6): "gue1", ("GUE0", 4, 4): "gue0"}


@pytest.fixture
def strict_dissector() -> Iterator[None]:
    """scapy re-raises what a dissector throws instead of falling back to Raw (restored afterwards)."""
    before = conf.debug_dissector
    conf.debug_dissector = True
    try:
        yield
    finally:
        conf.debug_dissector = before


def _outer_like(o: Packet) -> Packet:
    """A fresh outer header with the emitted one's addresses and the fields scapy cannot derive."""
    if isinstance(o, IP):
        return IP(src=o.src, dst=o.dst, tos=o.tos, ttl=o.ttl, id=o.id, flags=o.flags)
    return IPv6(src=o.src, dst=o.dst, tc=o.tc, fl=o.fl, hlim=o.hlim)


@pytest.mark.parametrize("case", GUE_CASES, ids=[c.id for c in GUE_CASES])
def test_emitted_gue_dissects_and_rebuilds_byte_for_byte(run_balancer: RunBalancer, case: P.EncapCase,
                                                         strict_dissector: None) -> None:
    frame = flow(case, sport=40500)
    out = run_balancer.run(frame)
    assert (out.verdict, out.reason) == ("XDP_TX", "TX_ENCAP")
    assert bound_port() == P.GUE_PORT
    pkt = Ether(out.out)
    udp = pkt[UDP]
    assert udp.dport == P.GUE_PORT
    inner_cls = IP if case.inner == 4 else IPv6
    if case.mode == "GUE0":
        gue = udp.payload
        assert isinstance(gue, GUE), pkt.summary()
        assert (gue.version, gue.control, gue.hlen, gue.proto, gue.flags, gue.options) == (
            0, 0, 0, 4 if case.inner == 4 else 41, 0, b"")
        inner = gue.payload
    else:
        assert GUE not in pkt, pkt.summary()
        inner = udp.payload
    assert isinstance(inner, inner_cls), pkt.summary()
    assert bytes(inner) == ip_packet_of(frame)

    # Built from layers: UDP's destination comes from the binding for variant 0, GUE's proto from its payload.
    head = Ether(dst=pkt.dst, src=pkt.src) / _outer_like(pkt.payload)
    if case.mode == "GUE0":
        rebuilt = head / UDP(sport=udp.sport) / GUE() / inner_cls(bytes(inner))
    else:
        rebuilt = head / UDP(sport=udp.sport, dport=P.GUE_PORT) / inner_cls(bytes(inner))
    assert bytes(rebuilt) == out.out, f"built:\n{rebuilt.show(dump=True)}\nemitted:\n{pkt.show(dump=True)}"


@pytest.mark.parametrize("case", P.ENCAPS, ids=P.ENCAP_IDS)
def test_decoder_names_every_mode(run_balancer: RunBalancer, case: P.EncapCase) -> None:
    frame = flow(case, sport=40600)
    enc = decapsulate(run_balancer.run(frame).out, P.GUE_PORT)
    assert enc is not None
    assert enc.kind == KIND[(case.mode, case.outer, case.inner)]
    assert enc.inner.raw == ip_packet_of(frame)
    layer = enc.gue_layer
    if case.mode == "GUE0":
        assert layer is not None and layer.proto == (4 if case.inner == 4 else 41)
    else:
        assert layer is None
    if case.mode != "IPIP":
        assert decapsulate(run_balancer.run(frame).out, P.GUE_PORT + 1) is None, "UDP to another port is no GUE"


INNER4 = bytes(IP(src="198.51.100.1", dst="203.0.113.2") / UDP(sport=1, dport=2))
MALFORMED = {
    "empty": (b"", Raw),
    "one-byte": (b"\x00", Raw),
    "three-bytes": (b"\x00\x04\x00", Raw),
    "hlen-beyond-the-datagram": (bytes([0x1F, 4, 0, 0]) + INNER4[:8], GUE),
    "control-message": (bytes([0x20, 0, 0, 0]) + INNER4, GUE),
    "unknown-protocol": (bytes([0, 99, 0, 0]) + INNER4, GUE),
    "version-2": (bytes([0x80, 4, 0, 0]) + INNER4, Raw),
    "version-3": (bytes([0xC0, 4, 0, 0]) + INNER4, Raw),
    "variant-1-nibble-5": (bytes([0x50]) + INNER4[1:], Raw),
    "variant-1-truncated-ip": (INNER4[:12], Raw),
}


@pytest.mark.parametrize("name", MALFORMED)
def test_malformed_gue_dissects_without_exception(name: str, strict_dissector: None) -> None:
    payload, expect = MALFORMED[name]
    wire = bytes(Ether() / IP(src="192.0.2.1", dst="192.0.2.11") / UDP(sport=50000, dport=P.GUE_PORT) / Raw(payload))
    pkt = Ether(wire)
    shown = pkt.show(dump=True)
    assert shown and pkt.summary()
    first = pkt[UDP].payload
    if payload:
        assert isinstance(first, expect), f"{name}: {first!r}"
    if expect is GUE:
        assert not isinstance(first.payload, IP | IPv6), f"{name}: {first.payload!r}"
    enc = decapsulate(wire, P.GUE_PORT)
    assert enc is None, f"{name} decoded as {enc.kind if enc else ''}"


def test_bind_gue_moves_the_binding_to_another_port() -> None:
    default = bound_port()
    assert default == P.GUE_PORT
    other = P.GUE_PORT + 1000
    try:
        bind_gue(other)
        built = IP() / UDP(sport=50000) / GUE() / IP(INNER4)
        assert built[UDP].dport == other
        assert GUE in IP(bytes(built))
        moved_away = IP(bytes(IP() / UDP(sport=50000, dport=default) / Raw(bytes([0, 4, 0, 0]) + INNER4)))
        assert GUE not in moved_away
    finally:
        bind_gue(default)
    assert GUE in IP(bytes(IP() / UDP(sport=50000, dport=default) / Raw(bytes([0, 4, 0, 0]) + INNER4)))


def test_decoder_reads_through_vlan_tags_and_bare_ip_packets(strict_dissector: None) -> None:
    tagged = bytes(Ether() / Dot1Q(vlan=3) / Dot1Q(vlan=7) / IP(src="192.0.2.1", dst="192.0.2.11")
                   / UDP(sport=50000) / GUE() / IP(INNER4))
    enc = decapsulate(tagged, P.GUE_PORT)
    assert enc is not None and enc.kind == "gue0" and enc.inner.raw == INNER4
    assert enc.gue_layer is not None and enc.gue_layer.proto == 4
    bare = decapsulate_ip(bytes(IPv6(src="2001:db8::1", dst="2001:db8::2") / IP(INNER4)), P.GUE_PORT)
    assert bare is not None and bare.kind == "ip4ip6" and bare.frame.dst_mac == "" and bare.inner.raw == INNER4
    wrong = bytes(IP(src="192.0.2.1", dst="192.0.2.11") / UDP(sport=50000) / GUE(proto=41) / IP(INNER4))
    assert decapsulate_ip(wrong, P.GUE_PORT) is None, "variant 0 naming IPv6 around an IPv4 packet"
