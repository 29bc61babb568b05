"""_wire.py: reading captured frames as a checker does: flows, encapsulation layers, checksums, byte comparison.

Everything works on raw bytes where a byte-level claim is made (checksums, "identical inner
packet"), and uses scapy only to parse and to show evidence. Frames, IP packets and encapsulated
frames are lab/packets/decode.py's (the one decoder, shared with the datapath tables and captures).
"""

from __future__ import annotations

import functools
import ipaddress
import struct
import subprocess
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from lab.packets.decode import FlowKey, Frame, IpPacket

ETH_P_ARP = 0x0806
PROTO_ICMP = 1
PROTO_ICMPV6 = 58
GUE_SPORT_RANGE = range(49152, 65536)  # RFC 6335 dynamic ports, as bpf/include/encap.h documents


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
        frame = Frame.of(raw, len(frames), wirelen)
        if frame is not None:
            frames.append(frame)
    return frames


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


# What the LB writes or carries through: tshark judges these layers only. Everything else is switched
# off, because tshark picks application dissectors by port number, and random client ports or GUE
# source ports then make it misread payloads the LB never touches (seen: a client datagram read as a
# malformed "Unknown Command (Rsp)").
_WIRE_LAYERS = frozenset({"frame", "eth", "ethertype", "vlan", "arp", "ip", "ipv6", "udp", "tcp", "icmp", "icmpv6",
                          "data"})


@functools.lru_cache(maxsize=1)
def _tshark_disabled() -> tuple[str, ...]:
    """Every dissector tshark knows but the wire layers (its own _ws.* bookkeeping stays on)."""
    done = subprocess.run(["tshark", "-G", "protocols"], capture_output=True, text=True, timeout=60, check=False)
    if done.returncode != 0:
        raise AssertionError(f"tshark -G protocols failed: exit {done.returncode}: {done.stderr.strip()[-300:]}")
    names = (line.split("\t")[2] for line in done.stdout.splitlines() if line.count("\t") >= 2)
    return tuple(n for n in names if n not in _WIRE_LAYERS and not n.startswith("_ws"))


def tshark_errors(pcap: Path, gue_port: int, dissect_gue_as_ip: bool) -> list[str]:
    """Frames of the capture that tshark finds malformed or flags with an error-level expert note.

    Checksum validation is switched on for IP, TCP and UDP (Wireshark leaves it off by default), and
    only the wire layers are dissected (_WIRE_LAYERS). Wireshark 4.0 has no GUE dissector: with
    dissect_gue_as_ip, the payload of UDP to gue_port is dissected as an IP packet (right for
    variant 1, whose payload is the inner packet).
    """
    argv = ["tshark", "-n", "-r", str(pcap), "-o", "ip.check_checksum:TRUE", "-o", "tcp.check_checksum:TRUE",
            "-o", "udp.check_checksum:TRUE"]
    for name in _tshark_disabled():
        argv += ["--disable-protocol", name]
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
