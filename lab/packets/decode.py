"""decode.py: the one decoder of encapsulated frames: outer IP, then IPIP / 6in6 / 4in6 / GUE, then the inner packet.

Byte-level claims (checksums, "the inner packet is the client's, byte for byte") need the bytes as
emitted, so the decoder keeps them: a `Frame` (link header and what follows), `IpPacket` views of
the outer and inner packets cut at their own length fields, the UDP and GUE headers as bytes. scapy
reads the GUE header (lab/packets/gue.py) and gives any layer as a packet to show or compare.
"""

from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass

from scapy.layers.inet import IP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import Ether
from scapy.packet import Packet

from lab.packets.gue import GUE

ETH_LEN = 14
ETH_P_IP, ETH_P_IPV6, ETH_P_8021Q, ETH_P_8021AD = 0x0800, 0x86DD, 0x8100, 0x88A8
PROTO_IPIP, PROTO_TCP, PROTO_UDP, PROTO_IPV6 = 4, 6, 17, 41

# (source, destination, protocol, source port, destination port) of an IP packet
FlowKey = tuple[str, str, int, int, int]


def mac_text(raw: bytes) -> str:
    return ":".join(f"{b:02x}" for b in raw)


@dataclass(frozen=True)
class Frame:
    """One Ethernet frame (VLAN tags skipped), or an IP packet seen without its link header."""

    index: int  # position in a capture, from 0
    dst_mac: str  # "" without a link header
    src_mac: str
    ethertype: int  # after any VLAN tags
    payload: bytes  # from the first byte after the link header (Ethernet and tags)
    raw: bytes
    wire_len: int  # the frame's length on the wire (a capture may hold fewer bytes)

    @classmethod
    def of(cls, raw: bytes, index: int = 0, wire_len: int | None = None) -> Frame | None:
        """The frame in raw (None if shorter than an Ethernet header), with up to two VLAN tags skipped."""
        if len(raw) < ETH_LEN:
            return None
        off, ethertype = ETH_LEN, struct.unpack("!H", raw[12:14])[0]
        while ethertype in (ETH_P_8021Q, ETH_P_8021AD) and len(raw) >= off + 4:
            ethertype, off = struct.unpack("!H", raw[off + 2: off + 4])[0], off + 4
        return cls(index, mac_text(raw[0:6]), mac_text(raw[6:12]), ethertype, raw[off:], raw,
                   len(raw) if wire_len is None else wire_len)

    @classmethod
    def of_ip(cls, packet: bytes, index: int = 0) -> Frame:
        """An IP packet without a link header (a scapy IP layer of a capture, a socket's view)."""
        ethertype = ETH_P_IPV6 if packet[:1] and packet[0] >> 4 == 6 else ETH_P_IP
        return cls(index, "", "", ethertype, packet, packet, len(packet))


@dataclass(frozen=True)
class IpPacket:
    """The fields of an IPv4 or IPv6 header the suites check, and the packet's bytes (no trailer)."""

    version: int
    src: str
    dst: str
    proto: int  # IPv4 protocol or IPv6 next header (no extension headers are expected here)
    ttl: int  # TTL or hop limit
    tos: int  # IPv4 TOS byte or IPv6 traffic class
    header_len: int
    raw: bytes  # header and payload, cut at the header's total length
    df: bool = False
    ident: int = 0
    frag: int = 0  # IPv4 fragment offset and MF flag bits (0 for an unfragmented packet)
    flow_label: int = 0
    truncated: bool = False  # the bytes are fewer than the header's length says

    @property
    def payload(self) -> bytes:
        return self.raw[self.header_len:]

    @property
    def layer(self) -> Packet:
        """The packet as scapy reads it (IP or IPv6)."""
        return IP(self.raw) if self.version == 4 else IPv6(self.raw)

    def ports(self) -> tuple[int, int]:
        if self.proto in (PROTO_TCP, PROTO_UDP) and len(self.payload) >= 4:
            sport, dport = struct.unpack("!HH", self.payload[:4])
            return int(sport), int(dport)
        return 0, 0

    def flow(self) -> FlowKey:
        sport, dport = self.ports()
        return self.src, self.dst, self.proto, sport, dport


def parse_ip(data: bytes) -> IpPacket | None:
    """The IP packet at the start of data, cut at its total length; None if it is not IPv4/IPv6."""
    if not data:
        return None
    version = data[0] >> 4
    if version == 4 and len(data) >= 20:
        ihl = (data[0] & 0x0F) * 4
        total = struct.unpack("!H", data[2:4])[0]
        ident, flags_frag = struct.unpack("!HH", data[4:8])
        return IpPacket(
            version=4, src=str(ipaddress.IPv4Address(data[12:16])), dst=str(ipaddress.IPv4Address(data[16:20])),
            proto=data[9], ttl=data[8], tos=data[1], header_len=ihl, raw=data[:total],
            df=bool(flags_frag & 0x4000), ident=ident, frag=flags_frag & 0x3FFF, truncated=len(data) < total)
    if version == 6 and len(data) >= 40:
        word0 = struct.unpack("!I", data[:4])[0]
        total = 40 + struct.unpack("!H", data[4:6])[0]
        return IpPacket(
            version=6, src=str(ipaddress.IPv6Address(data[8:24])), dst=str(ipaddress.IPv6Address(data[24:40])),
            proto=data[6], ttl=data[7], tos=(word0 >> 20) & 0xFF, header_len=40, raw=data[:total],
            flow_label=word0 & 0xFFFFF, truncated=len(data) < total)
    return None


def ip_of(frame: Frame) -> IpPacket | None:
    if frame.ethertype not in (ETH_P_IP, ETH_P_IPV6):
        return None
    return parse_ip(frame.payload)


@dataclass(frozen=True)
class Encapsulated:
    """An encapsulated frame taken apart: the frame, outer IP, UDP and GUE headers when present, inner IP."""

    frame: Frame
    outer: IpPacket
    inner: IpPacket
    udp: bytes = b""  # the 8-byte outer UDP header (GUE), empty for IPIP / 6in6 / 4in6
    gue: bytes = b""  # the variant-0 GUE header with its options, empty otherwise

    @property
    def kind(self) -> str:
        """ipip (4in4), ip6ip6, ip4ip6 (4in6), ip6ip4 (6in4), gue0 or gue1."""
        if self.udp:
            return "gue0" if self.gue else "gue1"
        return {(4, 4): "ipip", (6, 6): "ip6ip6", (6, 4): "ip4ip6", (4, 6): "ip6ip4"}[
            (self.outer.version, self.inner.version)]

    @property
    def eth(self) -> Ether:
        return Ether(self.frame.raw)

    @property
    def gue_layer(self) -> GUE | None:
        """The variant-0 header as scapy reads it (None for variant 1 and IPIP)."""
        return GUE(self.gue) if self.gue else None

    @property
    def udp_sport(self) -> int:
        return int(struct.unpack("!H", self.udp[:2])[0]) if self.udp else 0

    @property
    def udp_dport(self) -> int:
        return int(struct.unpack("!H", self.udp[2:4])[0]) if self.udp else 0

    @property
    def udp_len(self) -> int:
        return int(struct.unpack("!H", self.udp[4:6])[0]) if self.udp else 0

    @property
    def udp_checksum(self) -> int:
        return int(struct.unpack("!H", self.udp[6:8])[0]) if self.udp else 0


def _gue_inner(datagram: bytes) -> tuple[bytes, bytes] | None:
    """(variant-0 header, inner bytes) of a GUE datagram's payload; None when it carries no IP packet."""
    kind = GUE.dispatch_hook(datagram)
    if kind in (IP, IPv6):
        return b"", datagram  # variant 1: the payload is the IP packet
    if kind is not GUE:
        return None
    layer = GUE(datagram[:4])  # the fixed part only: what follows is parsed as IP below, not by scapy
    if layer.control or layer.proto not in (PROTO_IPIP, PROTO_IPV6):
        return None  # a control message, an unknown version or protocol: no IP packet to take out
    size = 4 + (layer.hlen or 0) * 4
    return datagram[:size], datagram[size:]


def decapsulate(frame: Frame | bytes, gue_port: int) -> Encapsulated | None:
    """The layers of an IPIP / 6in6 / 4in6 / 6in4 / GUE (variant 0 or 1) frame; None for anything else.

    `frame` is an Ethernet frame (bytes or a `Frame`); UDP is GUE only to `gue_port`.
    """
    f = Frame.of(frame) if isinstance(frame, bytes) else frame
    outer = ip_of(f) if f is not None else None
    if f is None or outer is None:
        return None
    if outer.proto in (PROTO_IPIP, PROTO_IPV6):
        inner = parse_ip(outer.payload)
        return Encapsulated(f, outer, inner) if inner is not None else None
    if outer.proto != PROTO_UDP or len(outer.payload) < 8:
        return None
    udp = outer.payload[:8]
    if struct.unpack("!H", udp[2:4])[0] != gue_port:
        return None
    parts = _gue_inner(outer.payload[8:])
    if parts is None:
        return None
    gue, rest = parts
    inner = parse_ip(rest)
    if inner is None or (gue and gue[1] != (PROTO_IPIP if inner.version == 4 else PROTO_IPV6)):
        return None
    return Encapsulated(f, outer, inner, udp, gue)


def decapsulate_ip(packet: bytes, gue_port: int) -> Encapsulated | None:
    """decapsulate() for an IP packet without its link header."""
    return decapsulate(Frame.of_ip(packet), gue_port)
