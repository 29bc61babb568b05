"""frames.py: decodes what the datapath emits (encapsulated frames, ICMP answers) and checks checksums."""

from __future__ import annotations

import struct
from dataclasses import dataclass

from scapy.layers.inet import IP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import Dot1Q, Ether
from scapy.packet import Packet
from scapy.utils import checksum

ETH_P_IP, ETH_P_IPV6, ETH_P_8021Q = 0x0800, 0x86DD, 0x8100
IPPROTO_IPIP, IPPROTO_IPV6, IPPROTO_UDP = 4, 41, 17


@dataclass(frozen=True)
class Encapsulated:
    """An encapsulated frame taken apart: Ethernet, outer IP header, optional UDP/GUE, inner bytes."""

    eth: Ether
    outer: Packet  # IP or IPv6, whole outer packet
    outer_bytes: bytes  # the outer IP packet as emitted
    udp: tuple[int, int, int, int] | None  # sport, dport, length, checksum
    gue0: bytes | None  # the 4-byte variant-0 header
    inner: bytes  # the inner IP packet, exactly as long as the outer lengths say


def ip_packet_of(frame: Packet | bytes) -> bytes:
    """The IP packet inside an input frame (after Ethernet and an optional tag), without padding."""
    eth = Ether(bytes(frame))
    ip = eth[IP] if IP in eth else eth[IPv6]
    raw = bytes(ip)
    length = ip.len if isinstance(ip, IP) else 40 + ip.plen
    return raw[:length]


def decode_encap(out: bytes, gue_port: int) -> Encapsulated:
    eth = Ether(out)
    off = 14
    ethertype = struct.unpack("!H", out[12:14])[0]
    if ethertype == ETH_P_8021Q:
        ethertype = struct.unpack("!H", out[16:18])[0]
        off = 18
    if ethertype == ETH_P_IP:
        total = struct.unpack("!H", out[off + 2: off + 4])[0]
        outer_bytes = out[off: off + total]
        outer: Packet = IP(outer_bytes)
        proto, hdr = outer_bytes[9], (outer_bytes[0] & 0xF) * 4
    elif ethertype == ETH_P_IPV6:
        total = 40 + struct.unpack("!H", out[off + 4: off + 6])[0]
        outer_bytes = out[off: off + total]
        outer = IPv6(outer_bytes)
        proto, hdr = outer_bytes[6], 40
    else:
        raise AssertionError(f"emitted frame has ethertype {ethertype:#06x}, not IP: {out.hex()}")
    assert len(outer_bytes) == total, f"outer packet claims {total} bytes, frame holds {len(outer_bytes)}"
    rest = outer_bytes[hdr:]
    udp = gue0 = None
    if proto == IPPROTO_UDP:
        udp = struct.unpack("!HHHH", rest[:8])
        assert udp[1] == gue_port, f"UDP destination {udp[1]} is not the GUE port {gue_port}"
        assert udp[2] == len(rest), f"UDP length {udp[2]} but {len(rest)} bytes follow the IP header"
        rest = rest[8:]
        if rest[0] >> 6 == 0:
            gue0, rest = rest[:4], rest[4:]
    else:
        assert proto in (IPPROTO_IPIP, IPPROTO_IPV6), f"outer protocol {proto} is neither IPIP nor UDP"
    return Encapsulated(eth, outer, outer_bytes, udp, gue0, rest)


def ipv4_header_ok(ip_bytes: bytes) -> bool:
    return checksum(ip_bytes[: (ip_bytes[0] & 0xF) * 4]) == 0


def pseudo6(ip6_bytes: bytes, proto: int, length: int) -> bytes:
    return ip6_bytes[8:40] + struct.pack("!IxxxB", length, proto)


def l4_checksum_ok_v6(ip6_bytes: bytes) -> bool:
    """UDP / ICMPv6 checksum of an IPv6 packet with no extension headers."""
    payload = ip6_bytes[40:]
    return checksum(pseudo6(ip6_bytes, ip6_bytes[6], len(payload)) + payload) == 0


def l4_checksum_ok_v4(ip_bytes: bytes) -> bool:
    """UDP checksum of an IPv4 packet (over the pseudo-header)."""
    hlen = (ip_bytes[0] & 0xF) * 4
    payload = ip_bytes[hlen:]
    pseudo = ip_bytes[12:20] + struct.pack("!BBH", 0, ip_bytes[9], len(payload))
    return checksum(pseudo + payload) == 0


def icmp4_checksum_ok(ip_bytes: bytes) -> bool:
    return checksum(ip_bytes[(ip_bytes[0] & 0xF) * 4:]) == 0


def ip_layer(out: bytes) -> Packet:
    eth = Ether(out)
    layer: Packet = eth[Dot1Q].payload if Dot1Q in eth else eth.payload
    return layer
