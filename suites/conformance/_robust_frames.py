"""The robustness storm's frames: named malformed, option-carrying and fragmented frames at a VIP with the
reason the LB must count each under, and seeded random frames.

    frames = named_frames(family=4, vip="198.51.100.100", src_mac=..., dst_mac=...)
    for name, raw, reason in frames: ...

Named frames of one kind all go to one reason (``reason``); random frames (``random_frames``)
have no single expected reason and are only accounted for in the total.
"""

from __future__ import annotations

import random
import struct
from dataclasses import dataclass

from scapy.layers.inet import IP, TCP, UDP, IPOption_RR
from scapy.layers.inet6 import IPv6, IPv6ExtHdrDestOpt, IPv6ExtHdrFragment, IPv6ExtHdrHopByHop
from scapy.layers.l2 import Ether

SRC4 = "192.0.2.14"  # in the client's /28, assigned to nobody: DSR answers to it die at the router
SRC6 = "2001:db8:c::e"
TCP_PORT = 80
UDP_PORT = 9000


@dataclass(frozen=True)
class StormFrame:
    """One kind of frame of the storm: its name, its bytes, and the reason the LB must count it under."""

    kind: str
    raw: bytes
    reason: str


def _eth(src_mac: str, dst_mac: str, family: int) -> Ether:
    return Ether(src=src_mac, dst=dst_mac, type=0x0800 if family == 4 else 0x86DD)


def named_frames(family: int, vip: str, src_mac: str, dst_mac: str, rng: random.Random,
                 copies: int) -> list[StormFrame]:
    """`copies` frames of every named kind for `family`, with varying source ports (seeded by rng)."""
    eth = _eth(src_mac, dst_mac, family)
    out: list[StormFrame] = []
    for _ in range(copies):
        sport = rng.randrange(1024, 65536)
        tcp = TCP(sport=sport, dport=TCP_PORT, flags="S")
        udp = UDP(sport=sport, dport=UDP_PORT)
        if family == 4:
            good = bytes(IP(src=SRC4, dst=vip) / tcp)
            kinds = [
                ("ip4-truncated-header", bytes(eth) + good[:rng.randrange(1, 20)], "DROP_MALFORMED_IP"),
                ("ip4-bad-ihl", bytes(eth) + bytes([0x40 | rng.randrange(0, 5)]) + good[1:], "DROP_MALFORMED_IP"),
                ("ip4-total-length-beyond-frame",
                 bytes(eth / IP(src=SRC4, dst=vip, len=len(good) + 1 + rng.randrange(0, 1000)) / tcp),
                 "DROP_MALFORMED_IP"),
                ("ip4-total-length-below-header", bytes(eth / IP(src=SRC4, dst=vip, len=rng.randrange(0, 20)) / tcp),
                 "DROP_MALFORMED_IP"),
                ("ip4-options", bytes(eth / IP(src=SRC4, dst=vip, options=[IPOption_RR()]) / tcp), "DROP_IP_OPTIONS"),
                ("ip4-first-fragment", bytes(eth / IP(src=SRC4, dst=vip, flags="MF") / tcp), "DROP_FRAGMENT"),
                ("ip4-later-fragment", bytes(eth / IP(src=SRC4, dst=vip, frag=rng.randrange(1, 8000), proto=6)
                                             / bytes(rng.randrange(8, 200))), "DROP_FRAGMENT"),
            ]
        else:
            good = bytes(IPv6(src=SRC6, dst=vip) / tcp)
            kinds = [
                ("ip6-truncated-header", bytes(eth) + good[:rng.randrange(1, 40)], "DROP_MALFORMED_IP"),
                ("ip6-bad-version", bytes(eth) + bytes([0x40]) + good[1:], "DROP_MALFORMED_IP"),
                ("ip6-payload-length-beyond-frame",
                 bytes(eth / IPv6(src=SRC6, dst=vip, plen=20 + 1 + rng.randrange(0, 1000)) / tcp), "DROP_MALFORMED_IP"),
                ("ip6-zero-payload-length", bytes(eth) + good[:4] + b"\0\0" + good[6:], "DROP_MALFORMED_IP"),
                ("ip6-first-fragment", bytes(eth / IPv6(src=SRC6, dst=vip) / IPv6ExtHdrFragment(m=1) / tcp),
                 "DROP_FRAGMENT"),
                ("ip6-later-fragment",
                 bytes(eth / IPv6(src=SRC6, dst=vip) / IPv6ExtHdrFragment(offset=rng.randrange(1, 8000), nh=6)
                       / bytes(rng.randrange(8, 200))), "DROP_FRAGMENT"),
                ("ip6-extension-chain-beyond-payload",
                 bytes(eth / IPv6(src=SRC6, dst=vip, plen=8) / IPv6ExtHdrHopByHop(nh=60) / IPv6ExtHdrDestOpt() / tcp),
                 "DROP_MALFORMED_IP"),
                # A hop-by-hop and a destination options header before a valid UDP datagram: forwarded.
                ("ip6-extension-headers",
                 bytes(eth / IPv6(src=SRC6, dst=vip) / IPv6ExtHdrHopByHop() / IPv6ExtHdrDestOpt() / udp),
                 "TX_ENCAP"),
            ]
        ip = IP(src=SRC4, dst=vip) if family == 4 else IPv6(src=SRC6, dst=vip)
        hdr = len(bytes(ip))
        # truncated L4: the IP header says exactly what the frame holds, too little for TCP / UDP
        for proto, name, need in ((6, "tcp", 20), (17, "udp", 8)):
            cut = rng.randrange(0 if family == 4 else 1, need)  # IPv6 payload length 0 is malformed IP, not L4
            l4 = bytes(tcp if proto == 6 else udp)[:cut]
            pkt = (IP(src=SRC4, dst=vip, proto=proto) if family == 4 else IPv6(src=SRC6, dst=vip, nh=proto)) / l4
            raw = bytes(pkt)
            assert len(raw) == hdr + cut
            kinds.append((f"ip{family}-truncated-{name}", bytes(eth) + raw, "DROP_MALFORMED_L4"))
        # any TCP flags on a well-formed segment to the VIP: forwarded like any other packet of a flow
        kinds.append((f"ip{family}-random-tcp-flags",
                      bytes(eth / ip / TCP(sport=sport, dport=TCP_PORT, flags=rng.randrange(0, 256) & ~0x02 | 0x04)),
                      "TX_ENCAP"))
        out.extend(StormFrame(k, r, reason) for k, r, reason in kinds)
    return out


def random_frames(vip4: str, vip6: str, src_mac: str, dst_mac: str, rng: random.Random, count: int) -> list[bytes]:
    """`count` seeded random frames to the LB's MAC: random bytes after an IPv4 / IPv6 / other
    EtherType, and IP headers to a VIP with random fields and random payloads."""
    out: list[bytes] = []
    for i in range(count):
        style = i % 4
        if style == 0:  # garbage after an IP EtherType (or a random one)
            etype = rng.choice([0x0800, 0x86DD, 0x8100, 0x88A8, rng.randrange(0, 0x10000)])
            body = rng.randbytes(rng.randrange(0, 300))
            out.append(bytes(Ether(src=src_mac, dst=dst_mac, type=etype)) + body)
        elif style == 1:  # an IPv4 header to the VIP with random fields, random payload
            hdr = bytearray(bytes(IP(src=SRC4, dst=vip4, proto=rng.choice([6, 17, 1, rng.randrange(256)]))))
            for off in rng.sample(range(0, 12), 3):
                hdr[off] = rng.randrange(256)
            out.append(bytes(_eth(src_mac, dst_mac, 4)) + bytes(hdr) + rng.randbytes(rng.randrange(0, 200)))
        elif style == 2:  # an IPv6 header to the VIP with random fields, random payload
            nh = rng.choice([0, 6, 17, 43, 44, 58, 60, rng.randrange(256)])
            hdr = bytearray(bytes(IPv6(src=SRC6, dst=vip6, nh=nh)))
            for off in rng.sample(range(0, 8), 2):
                hdr[off] = rng.randrange(256)
            out.append(bytes(_eth(src_mac, dst_mac, 6)) + bytes(hdr) + rng.randbytes(rng.randrange(0, 200)))
        else:  # a well-formed header with random TCP/UDP bytes after it
            vip, fam = (vip4, 4) if rng.random() < 0.5 else (vip6, 6)
            proto = rng.choice([6, 17])
            ip = IP(src=SRC4, dst=vip, proto=proto) if fam == 4 else IPv6(src=SRC6, dst=vip, nh=proto)
            ports = struct.pack("!HH", rng.randrange(65536), rng.choice([TCP_PORT, UDP_PORT]))
            payload = ports + rng.randbytes(rng.randrange(0, 60))
            out.append(bytes(_eth(src_mac, dst_mac, fam) / ip / payload))
    return out
