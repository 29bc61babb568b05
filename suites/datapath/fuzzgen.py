"""fuzzgen.py: fuzzed frames in volume — a few hundred scapy templates, mutated with numpy.

Building 100,000 scapy packets would take minutes; building ~300 templates takes a fraction of a
second, and numpy turns them into any number of frames per chunk: kept valid, truncated, bytes
overwritten, or bits flipped, at positions weighted towards the headers. The templates cover
every header layer the datapath parses: Ethernet with no tag, one 802.1Q tag and QinQ; IPv4 with
and without options, fragments and DF; IPv6 with hop-by-hop, routing, destination-options and
fragment headers; TCP, UDP, ICMP and ICMPv6 echo; ICMP and ICMPv6 errors quoting TCP, UDP, ICMP,
extension headers and truncated quotes; traffic to VIPs, to other addresses and to other ports;
ARP and other ethertypes; and (added at run time) what the balancer emits for valid packets,
IPIP and GUE frames for the decap programs, plus GUE control and variant-0 option frames.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scapy.layers.inet import ICMP, IP, TCP, UDP, IPOption_NOP, IPOption_RR
from scapy.layers.inet6 import (
    ICMPv6EchoRequest,
    IPv6,
    IPv6ExtHdrDestOpt,
    IPv6ExtHdrFragment,
    IPv6ExtHdrHopByHop,
    IPv6ExtHdrRouting,
)
from scapy.layers.l2 import ARP, Dot1AD, Dot1Q, Ether
from scapy.packet import Packet, Raw

from lab.packets.gue import GUE

from . import packets as P

ETH_MIN = 14  # BPF_PROG_TEST_RUN refuses shorter frames (they cannot exist on a wire either)
HEADER_SPAN = 160  # mutations land in the first bytes of a frame, where the headers are


def _l4(kind: str, dport: int, sport: int, size: int) -> Packet:
    body = (P.PAYLOAD * (size // len(P.PAYLOAD) + 1))[:size]
    if kind == "syn":
        return TCP(sport=sport, dport=dport, flags="S") / body
    if kind == "ack":
        return TCP(sport=sport, dport=dport, flags="A") / body
    return UDP(sport=sport, dport=dport) / body


def _l2(tags: str) -> Packet:
    if tags == "vlan":
        return P.eth() / Dot1Q(vlan=10)
    if tags == "qinq":
        return P.eth() / Dot1AD(vlan=100) / Dot1Q(vlan=10)
    return P.eth()


def _v6_ext(name: str) -> Packet | None:
    return {
        "": None,
        "hbh": IPv6ExtHdrHopByHop(),
        "dst": IPv6ExtHdrDestOpt(),
        "rt": IPv6ExtHdrRouting(addresses=[P.OTHER6]),
        "frag": IPv6ExtHdrFragment(m=1, id=9),
        "frag0": IPv6ExtHdrFragment(m=0, offset=0, id=9),
        "hbh+dst": IPv6ExtHdrHopByHop() / IPv6ExtHdrDestOpt(),
    }[name]


def _v4_templates() -> Iterator[Packet]:
    vips4 = [e.vip for e in P.ENCAPS if ":" not in e.vip]
    for dst in [*vips4, P.OTHER4]:
        for kind in ("syn", "ack", "udp"):
            dport = P.VIP_UDP_PORT if kind == "udp" else P.VIP_PORT
            for tags in ("", "vlan", "qinq"):
                yield _l2(tags) / IP(src=P.CLIENT4, dst=dst) / _l4(kind, dport, 40000, 20)
            yield P.eth() / IP(src=P.CLIENT4, dst=dst, options=[IPOption_RR()]) / _l4(kind, dport, 40001, 8)
            yield P.eth() / IP(src=P.CLIENT4, dst=dst, options=[IPOption_NOP()] * 4) / _l4(kind, dport, 40002, 8)
            yield P.eth() / IP(src=P.CLIENT4, dst=dst, flags="MF") / _l4(kind, dport, 40003, 16)
            yield P.eth() / IP(src=P.CLIENT4, dst=dst, frag=10, proto=6) / P.PAYLOAD
        yield P.eth() / IP(src=P.CLIENT4, dst=dst, flags="DF") / _l4("ack", P.VIP_PORT, 40004, 1460)
        yield P.eth() / IP(src=P.CLIENT4, dst=dst) / _l4("ack", P.VIP_PORT, 40005, 1460)
        yield P.eth() / IP(src=P.CLIENT4, dst=dst) / _l4("ack", 8080, 40006, 8)
        yield P.eth() / IP(src=P.CLIENT4, dst=dst) / ICMP(type=8, id=3, seq=4) / P.PAYLOAD
        yield P.eth() / Dot1Q(vlan=7) / IP(src=P.CLIENT4, dst=dst) / ICMP(type=8) / P.PAYLOAD
        yield P.eth() / IP(src=P.CLIENT4, dst=dst) / ICMP(type=13) / (b"\0" * 12)
        yield P.eth() / IP(src=P.CLIENT4, dst=dst, proto=47) / b"\x00\x00\x08\x00" / P.PAYLOAD
        yield P.eth() / IP(src=P.CLIENT4, dst=dst) / IP(src=P.CLIENT4, dst=P.OTHER4) / _l4("ack", 80, 1, 8)
        for quote_len in (None, 8, 20, 28, 40):
            yield P.icmp_error_about(dst, P.CLIENT4, quote_len=quote_len)
        for icmp_type, code in ((3, 4), (3, 1), (11, 0), (12, 0), (3, 3)):
            for inner in (
                IP(src=dst, dst=P.CLIENT4, flags="DF") / UDP(sport=P.VIP_UDP_PORT, dport=40000) / P.PAYLOAD,
                IP(src=dst, dst=P.CLIENT4) / ICMP(type=0) / P.PAYLOAD,
                IP(src=dst, dst=P.CLIENT4, options=[IPOption_RR()]) / TCP(sport=80, dport=40000),
                IP(src=dst, dst=P.CLIENT4, frag=5, proto=6) / P.PAYLOAD,
            ):
                yield P.eth() / IP(src=P.ROUTER4, dst=dst) / ICMP(type=icmp_type, code=code) / Raw(bytes(inner))


def _v6_templates() -> Iterator[Packet]:
    vips6 = [e.vip for e in P.ENCAPS if ":" in e.vip]
    for dst in [*vips6, P.OTHER6]:
        for kind in ("syn", "ack", "udp"):
            dport = P.VIP_UDP_PORT if kind == "udp" else P.VIP_PORT
            for tags in ("", "vlan", "qinq"):
                yield _l2(tags) / IPv6(src=P.CLIENT6, dst=dst) / _l4(kind, dport, 40000, 20)
            for ext in ("hbh", "dst", "rt", "frag", "frag0", "hbh+dst"):
                yield P.eth() / IPv6(src=P.CLIENT6, dst=dst) / _v6_ext(ext) / _l4(kind, dport, 40001, 8)
        yield P.eth() / IPv6(src=P.CLIENT6, dst=dst) / _l4("ack", P.VIP_PORT, 40004, 1440)
        yield P.eth() / IPv6(src=P.CLIENT6, dst=dst) / _l4("ack", 8080, 40006, 8)
        yield P.eth() / IPv6(src=P.CLIENT6, dst=dst) / ICMPv6EchoRequest(id=3, seq=4) / P.PAYLOAD
        yield P.eth() / IPv6(src=P.CLIENT6, dst=dst) / IPv6ExtHdrDestOpt() / ICMPv6EchoRequest() / P.PAYLOAD
        yield P.eth() / Dot1Q(vlan=7) / IPv6(src=P.CLIENT6, dst=dst) / ICMPv6EchoRequest() / P.PAYLOAD
        yield P.eth() / IPv6(src=P.CLIENT6, dst=dst, nh=59)
        yield P.eth() / IPv6(src=P.CLIENT6, dst=dst) / IPv6(src=P.CLIENT6, dst=P.OTHER6) / _l4("ack", 80, 1, 8)
        yield P.eth() / IPv6(src=P.CLIENT6, dst=dst) / IP(src=P.CLIENT4, dst=P.OTHER4) / _l4("ack", 80, 1, 8)
        for v6_type in ("too_big", "unreach", "time"):
            for quote_len in (None, 8, 40, 48, 60):
                yield P.icmp_error_about(dst, P.CLIENT6, quote_len=quote_len, v6_type=v6_type)
            for ext in ("hbh", "dst", "rt", "frag", "hbh+dst"):
                yield P.icmp6_error_quoting_ext(dst, P.CLIENT6, _v6_ext(ext) or Raw(b""), v6_type=v6_type)
            udp_quote = IPv6(src=dst, dst=P.CLIENT6) / UDP(sport=P.VIP_UDP_PORT, dport=40000) / P.PAYLOAD
            yield P.eth() / IPv6(src=P.ROUTER6, dst=dst) / P.icmp6_error(v6_type) / Raw(bytes(udp_quote))


def _other_templates() -> Iterator[Packet | bytes]:
    yield P.ARP_REQUEST
    yield P.eth() / ARP(op=2, psrc=P.VIP4, pdst=P.CLIENT4)
    for ethertype in (0x0000, 0x0800, 0x86DD, 0x8100, 0x88A8, 0x8847, 0x88CC, 0xFFFF):
        yield bytes(Ether(src=P.CLIENT_MAC, dst=P.LB_MAC, type=ethertype)) + bytes(range(64))
    yield P.VLAN_STACKED
    yield P.UDP4_PADDED
    yield bytes(P.TCP4_SYN) + b"\0" * 40  # trailing bytes beyond the IP length


def gue_frames(inner: bytes, outer_dst: str) -> Iterator[Packet]:
    """GUE frames around an inner IP packet for the decap programs: variant 1, variant 0, control."""
    outer: Packet = IPv6(src=P.SRC6, dst=outer_dst) if ":" in outer_dst else IP(src=P.SRC4, dst=outer_dst)
    proto = 4 if inner[0] >> 4 == 4 else 41
    udp = UDP(sport=50000, dport=P.GUE_PORT)
    yield P.eth() / outer / udp / Raw(inner)
    yield P.eth() / outer / udp / GUE(proto=proto) / Raw(inner)
    yield P.eth() / outer / udp / GUE(proto=proto, options=b"\0" * 4) / Raw(inner)
    yield P.eth() / outer / udp / GUE(control=1) / Raw(inner)
    yield P.eth() / outer / UDP(sport=50000, dport=P.GUE_PORT + 1) / Raw(inner)


def ipip_frames(inner: bytes, outer_dst: str) -> Iterator[Packet]:
    """IPIP frames (4in4, 6in6, 4in6, 6in4) around an inner IP packet, and one over VLAN."""
    proto = 4 if inner[0] >> 4 == 4 else 41
    if ":" in outer_dst:
        yield P.eth() / IPv6(src=P.SRC6, dst=outer_dst, nh=proto) / Raw(inner)
        yield P.eth() / Dot1Q(vlan=3) / IPv6(src=P.SRC6, dst=outer_dst, nh=proto) / Raw(inner)
    else:
        yield P.eth() / IP(src=P.SRC4, dst=outer_dst, proto=proto) / Raw(inner)
        yield P.eth() / Dot1Q(vlan=3) / IP(src=P.SRC4, dst=outer_dst, proto=proto) / Raw(inner)


def base_templates() -> list[bytes]:
    """The templates built from scapy expressions alone (no program needed)."""
    out: list[bytes] = []
    for source in (_v4_templates(), _v6_templates(), _other_templates()):
        out.extend(bytes(t) for t in source)
    inner4 = bytes(IP(src=P.CLIENT4, dst=P.VIP4) / TCP(sport=40000, dport=P.VIP_PORT) / P.PAYLOAD)
    inner6 = bytes(IPv6(src=P.CLIENT6, dst=P.VIP6) / UDP(sport=40000, dport=P.VIP_UDP_PORT) / P.PAYLOAD)
    for real in (P.REALS4[0], P.REALS6[0], P.OTHER4, P.OTHER6):
        for inner in (inner4, inner6):
            out.extend(bytes(f) for f in gue_frames(inner, real))
            out.extend(bytes(f) for f in ipip_frames(inner, real))
    return out


@dataclass(frozen=True)
class Templates:
    """Templates padded into one array: row i holds frame i's bytes, lengths[i] its length."""

    frames: npt.NDArray[np.uint8]
    lengths: npt.NDArray[np.int64]

    @classmethod
    def of(cls, frames: list[bytes]) -> Templates:
        width = max(len(f) for f in frames)
        arr = np.zeros((len(frames), width), dtype=np.uint8)
        for i, f in enumerate(frames):
            arr[i, : len(f)] = np.frombuffer(f, dtype=np.uint8)
        return cls(arr, np.array([len(f) for f in frames], dtype=np.int64))


# How a chunk's frames are made, as shares: kept valid, truncated, bytes overwritten, bits flipped,
# 16-bit fields set to boundary values (lengths, ports, checksums: 0, 1, the frame's own lengths ±1,
# the MTU, the sign bit, all ones). Edited frames are also truncated one time in five.
MUTATIONS = {"valid": 0.15, "truncated": 0.2, "bytes": 0.3, "bits": 0.2, "fields": 0.15}
MAX_EDITS = 4
BOUNDARY_VALUES = np.array([0, 1, 7, 8, 20, 40, 1280, 1500, 0x7FFF, 0x8000, 0xFFFE, 0xFFFF], dtype=np.int64)


def mutate(t: Templates, count: int, rng: np.random.Generator) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64]]:
    """`count` fuzzed frames drawn from the templates: (frames padded to one width, lengths)."""
    pick = rng.integers(0, len(t.lengths), count)
    frames = t.frames[pick].copy()
    lengths = t.lengths[pick].copy()
    kind = rng.choice(len(MUTATIONS), count, p=list(MUTATIONS.values()))
    rows = np.arange(count)
    span = np.maximum(np.minimum(lengths, HEADER_SPAN) - 12, 1)  # edits land after the MACs
    edits = rng.integers(1, MAX_EDITS + 1, count)
    for j in range(MAX_EDITS):
        pos = 12 + rng.integers(0, 1 << 30, count) % span
        chosen = j < edits
        overwrite = chosen & (kind == 2)
        frames[rows[overwrite], pos[overwrite]] = rng.integers(0, 256, int(overwrite.sum()), dtype=np.uint8)
        flip = chosen & (kind == 3)
        bits = (np.uint8(1) << rng.integers(0, 8, int(flip.sum())).astype(np.uint8)).astype(np.uint8)
        frames[rows[flip], pos[flip]] ^= bits
        field = chosen & (kind == 4) & (pos + 1 < lengths)
        n = int(field.sum())
        # Boundary values, or a length the frame itself makes true ± 1 (total, from its IP header on).
        own = lengths[field] - rng.choice([14, 18, 34, 54], n) + rng.integers(-1, 2, n)
        values = np.where(rng.random(n) < 0.5, BOUNDARY_VALUES[rng.integers(0, len(BOUNDARY_VALUES), n)], own)
        values &= 0xFFFF
        frames[rows[field], pos[field]] = (values >> 8).astype(np.uint8)
        frames[rows[field], pos[field] + 1] = (values & 0xFF).astype(np.uint8)
    cut = (kind == 1) | ((kind >= 2) & (rng.random(count) < 0.2))
    lengths[cut] = ETH_MIN + rng.integers(0, 1 << 30, int(cut.sum())) % (lengths[cut] - ETH_MIN + 1)
    return frames, lengths


def new_seed() -> int:
    """A fresh seed for a run (printed and recorded, so any run can be replayed)."""
    return random.SystemRandom().randrange(1 << 32)
