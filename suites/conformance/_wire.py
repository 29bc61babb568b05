"""_wire.py: reading captured frames as a checker does: flows, encapsulation layers, checksums, byte comparison.

Everything works on raw bytes where a byte-level claim is made (checksums, "identical inner
packet"), and uses scapy only to parse and to show evidence. An encapsulated frame is split into
its outer IP header, the UDP header and 4-byte GUE header when present, and the inner IP packet.
"""

from __future__ import annotations

import ipaddress
import struct
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ETH_LEN = 14
ETH_P_IP = 0x0800
ETH_P_IPV6 = 0x86DD
ETH_P_ARP = 0x0806
PROTO_ICMP = 1
PROTO_IPIP = 4
PROTO_TCP = 6
PROTO_UDP = 17
PROTO_IPV6 = 41
PROTO_ICMPV6 = 58
GUE_SPORT_RANGE = range(49152, 65536)  # RFC 6335 dynamic ports, as bpf/include/encap.h documents

# (source, destination, protocol, source port, destination port) of an IP packet
FlowKey = tuple[str, str, int, int, int]


@dataclass(frozen=True)
class Frame:
    """One captured Ethernet frame: MACs, ethertype and the bytes after the Ethernet header."""

    index: int  # position in the capture, from 0
    dst_mac: str
    src_mac: str
    ethertype: int
    payload: bytes  # from the first byte after the Ethernet header
    raw: bytes
    wire_len: int  # the frame's length on the wire (a capture may hold fewer bytes)


@dataclass(frozen=True)
class IpPacket:
    """The fields of an IPv4 or IPv6 header this suite checks, and the packet's bytes (no trailer)."""

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
    truncated: bool = False  # the capture holds fewer bytes than the header's length says

    @property
    def payload(self) -> bytes:
        return self.raw[self.header_len:]

    def ports(self) -> tuple[int, int]:
        if self.proto in (PROTO_TCP, PROTO_UDP) and len(self.payload) >= 4:
            sport, dport = struct.unpack("!HH", self.payload[:4])
            return int(sport), int(dport)
        return 0, 0

    def flow(self) -> FlowKey:
        sport, dport = self.ports()
        return self.src, self.dst, self.proto, sport, dport


@dataclass(frozen=True)
class Encapsulated:
    """A frame the balancer emitted: outer IP header, optional UDP + GUE headers, the inner packet."""

    frame: Frame
    outer: IpPacket
    inner: IpPacket
    udp: bytes = b""  # the 8-byte outer UDP header (GUE), empty for IPIP
    gue: bytes = b""  # the 4-byte GUE header (variant 0), empty otherwise

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


def mac_text(raw: bytes) -> str:
    return ":".join(f"{b:02x}" for b in raw)


def read_frames(pcap: Path) -> list[Frame]:
    """Every complete Ethernet frame in a pcap file, also while tcpdump is still writing it.

    The classic libpcap format that `tcpdump -w` writes: a 24-byte file header, then per frame a
    16-byte record header (seconds, sub-seconds, captured length, wire length) and the bytes. A
    record not yet completely written at the end of the file is left out.
    """
    data = pcap.read_bytes() if pcap.exists() else b""
    if len(data) < 24:
        return []
    magic = data[:4]
    order = {b"\xd4\xc3\xb2\xa1": "<", b"\x4d\x3c\xb2\xa1": "<", b"\xa1\xb2\xc3\xd4": ">",
             b"\xa1\xb2\x3c\x4d": ">"}.get(magic)
    if order is None:
        raise AssertionError(f"{pcap} is not a libpcap file (magic {magic.hex()}); was it written by tcpdump -w?")
    linktype = struct.unpack(order + "I", data[20:24])[0] & 0xFFFF
    if linktype != 1:
        raise AssertionError(f"{pcap} holds link type {linktype}, not Ethernet (1): capture on a veth, not 'any'")
    frames: list[Frame] = []
    offset = 24
    while offset + 16 <= len(data):
        caplen, wirelen = struct.unpack(order + "II", data[offset + 8: offset + 16])
        if offset + 16 + caplen > len(data):
            break
        raw = data[offset + 16: offset + 16 + caplen]
        offset += 16 + caplen
        if len(raw) < ETH_LEN:
            continue
        ethertype = struct.unpack("!H", raw[12:14])[0]
        frames.append(Frame(len(frames), mac_text(raw[0:6]), mac_text(raw[6:12]), ethertype, raw[ETH_LEN:], raw,
                            wirelen))
    return frames


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


def decapsulate(frame: Frame, gue_port: int) -> Encapsulated | None:
    """The layers of an IPIP / 6in6 / 4in6 / GUE (variant 0 or 1) frame; None for anything else."""
    outer = ip_of(frame)
    if outer is None:
        return None
    if outer.proto in (PROTO_IPIP, PROTO_IPV6):
        inner = parse_ip(outer.payload)
        return Encapsulated(frame, outer, inner) if inner is not None else None
    if outer.proto != PROTO_UDP or len(outer.payload) < 8:
        return None
    udp = outer.payload[:8]
    if struct.unpack("!H", udp[2:4])[0] != gue_port:
        return None
    rest = outer.payload[8:]
    gue = b""
    if rest and rest[0] >> 6 == 0:  # GUE version 0 (variant 0): a header first; variant 1 starts 0b01
        gue, rest = rest[:4], rest[4:]
    inner = parse_ip(rest)
    return Encapsulated(frame, outer, inner, udp, gue) if inner is not None else None


def ones_sum(data: bytes) -> int:
    """The 16-bit ones'-complement sum of data (odd length padded with a zero byte)."""
    if len(data) % 2:
        data += b"\0"
    total: int = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return total


def ipv4_header_ok(packet: IpPacket) -> bool:
    """An IPv4 header checksum is valid when the sum over the header, checksum included, is 0xffff."""
    return packet.version == 4 and ones_sum(packet.raw[: packet.header_len]) == 0xFFFF


def pseudo_header(packet: IpPacket, proto: int, length: int) -> bytes:
    src = ipaddress.ip_address(packet.src).packed
    dst = ipaddress.ip_address(packet.dst).packed
    if packet.version == 4:
        return src + dst + struct.pack("!BBH", 0, proto, length)
    return src + dst + struct.pack("!IxxxB", length, proto)


def l4_checksum_ok(packet: IpPacket) -> bool:
    """The TCP or UDP checksum of packet (over the pseudo-header) is valid."""
    segment = packet.payload
    return ones_sum(pseudo_header(packet, packet.proto, len(segment)) + segment) == 0xFFFF


def normalised(packet: IpPacket) -> bytes:
    """The packet's bytes with the fields a router may change zeroed: TTL / hop limit, IPv4 header checksum."""
    raw = bytearray(packet.raw)
    if packet.version == 4:
        raw[8] = 0
        raw[10:12] = b"\0\0"
    else:
        raw[7] = 0
    return bytes(raw)


def reply_key(packet: IpPacket) -> FlowKey:
    """The key of the flow a reply answers (addresses and ports swapped)."""
    src, dst, proto, sport, dport = packet.flow()
    return dst, src, proto, dport, sport


def show(raw: bytes, first_layer: str = "Ether") -> str:
    """scapy's show() of a frame or IP packet, as text for an assertion message."""
    from scapy.layers.inet import IP
    from scapy.layers.inet6 import IPv6
    from scapy.layers.l2 import Ether

    layer: Any = {"Ether": Ether, "IP": IP, "IPv6": IPv6}[first_layer]
    shown = layer(raw).show(dump=True)
    return str(shown)


def show_ip(raw: bytes) -> str:
    return show(raw, "IP" if raw and raw[0] >> 4 == 4 else "IPv6")


def tshark_errors(pcap: Path, gue_port: int, dissect_gue_as_ip: bool) -> list[str]:
    """Frames of the capture that tshark finds malformed or flags with an error-level expert note.

    Checksum validation is switched on for IP, TCP and UDP (Wireshark leaves it off by default).
    Wireshark 4.0 has no GUE dissector: with dissect_gue_as_ip, the payload of UDP to gue_port is
    dissected as an IP packet (right for variant 1, whose payload is the inner packet).
    """
    argv = ["tshark", "-n", "-r", str(pcap), "-o", "ip.check_checksum:TRUE", "-o", "tcp.check_checksum:TRUE",
            "-o", "udp.check_checksum:TRUE"]
    if dissect_gue_as_ip:
        argv += ["-d", f"udp.port=={gue_port},ip"]
    argv += ["-Y", "_ws.malformed || _ws.expert.severity >= error", "-T", "fields", "-e", "frame.number",
             "-e", "_ws.col.Info", "-e", "_ws.expert.message"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    if done.returncode != 0:
        raise AssertionError(f"tshark could not read {pcap}: exit {done.returncode}: {done.stderr.strip()[-500:]}")
    return [line for line in done.stdout.splitlines() if line.strip()]


def counts_by(values: Iterable[Any]) -> dict[Any, int]:
    out: dict[Any, int] = {}
    for v in values:
        out[v] = out.get(v, 0) + 1
    return out


def first(items: Sequence[str], n: int = 5) -> str:
    """At most n items, one per line, for an assertion message."""
    more = f"\n  … and {len(items) - n} more" if len(items) > n else ""
    return "\n  " + "\n  ".join(items[:n]) + more
