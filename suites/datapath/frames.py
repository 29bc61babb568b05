"""frames.py: decodes what the datapath emits (encapsulated frames, ICMP answers) and checks checksums."""

from __future__ import annotations

import struct

from scapy.layers.inet import IP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import Dot1Q, Ether
from scapy.packet import Packet
from scapy.utils import checksum

from lab.packets.decode import Encapsulated, decapsulate


def ip_packet_of(frame: Packet | bytes) -> bytes:
    """The IP packet inside an input frame (after Ethernet and an optional tag), without padding."""
    eth = Ether(bytes(frame))
    ip = eth[IP] if IP in eth else eth[IPv6]
    raw = bytes(ip)
    length = ip.len if isinstance(ip, IP) else 40 + ip.plen
    return raw[:length]


def decode_encap(out: bytes, gue_port: int) -> Encapsulated:
    """The emitted frame taken apart (lab/packets/decode.py), with the lengths a table row relies on checked."""
    enc = decapsulate(out, gue_port)
    assert enc is not None, f"emitted frame is not IPIP, 6in6, 4in6 or GUE to UDP {gue_port}: {out.hex()}"
    assert not enc.outer.truncated and not enc.inner.truncated, (
        f"outer packet claims {len(enc.outer.raw)} bytes, frame holds fewer: {out.hex()}")
    if enc.udp:
        assert enc.udp_len == len(enc.outer.payload), (
            f"UDP length {enc.udp_len} but {len(enc.outer.payload)} bytes follow the IP header")
    carried = len(enc.outer.payload) - len(enc.udp) - len(enc.gue)
    assert len(enc.inner.raw) == carried, f"inner packet of {len(enc.inner.raw)} bytes, the outer carries {carried}"
    return enc


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
