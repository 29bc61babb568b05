"""The one traffic generator interface: the flows a trial sends (endpoints, frames), and what it measured."""

from __future__ import annotations

import abc
import ipaddress
import socket
import struct
from dataclasses import dataclass
from typing import Literal, Self

from lab.checksum import inet_checksum
from lab.errors import LabError

#: A frame size in bytes of Ethernet frame without FCS (64..1518 here), or the IMIX mix.
FrameSpec = int | Literal["imix"]
Family = Literal[4, 6]

#: The simple IMIX: (frame size, frames) per cycle of 48 frames (28 × 64, 16 × 570, 4 × 1518).
IMIX: tuple[tuple[int, int], ...] = ((64, 28), (570, 16), (1518, 4))
MIN_FRAME = 64
MAX_FRAME = 1518
#: How far short of the offered frame count a generator may fall and still have held the rate
#: (scheduling hiccups of a software generator on a shared machine).
RATE_TOLERANCE = 0.01
ETH_P_IP = 0x0800
ETH_P_IPV6 = 0x86DD


class GeneratorError(LabError):
    """A generator cannot run the trial asked for (bad arguments, missing package, unreachable server)."""


@dataclass(frozen=True)
class Endpoints:
    """Addresses of the generated flows: flow 0 is (src, sport) → (dst, dport); flows vary src and sport."""

    src_mac: str
    dst_mac: str
    src4: str = "192.0.2.10"
    dst4: str = "198.51.100.100"
    src6: str = "2001:db8:c::10"
    dst6: str = "2001:db8:100::100"
    sport: int = 1024
    dport: int = 9000
    ttl: int = 64
    l4: Literal["udp", "tcp-syn"] = "udp"  # tcp-syn: every frame a TCP SYN (a SYN flood when flows vary)


def _mac(text: str) -> bytes:
    raw = bytes.fromhex(text.replace(":", ""))
    if len(raw) != 6:
        raise GeneratorError(f"MAC address must be 6 bytes like 02:00:00:00:00:01 but got {text!r}")
    return raw


def _udp_check(pseudo: bytes, udp: bytes) -> int:
    check = inet_checksum(pseudo + udp)
    return check or 0xFFFF


def _eth_ip(family: Family, ep: Endpoints, proto: int, l4_len: int) -> tuple[bytes, bytes]:
    """(Ethernet + IP header with a valid checksum, the L4 checksum's pseudo-header) for flow 0."""
    eth = _mac(ep.dst_mac) + _mac(ep.src_mac) + struct.pack("!H", ETH_P_IP if family == 4 else ETH_P_IPV6)
    if family == 4:
        src, dst = ipaddress.IPv4Address(ep.src4).packed, ipaddress.IPv4Address(ep.dst4).packed
        df = 0x4000 if proto == socket.IPPROTO_TCP else 0
        ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + l4_len, 0, df, ep.ttl, proto, 0, src, dst)
        ip = ip[:10] + struct.pack("!H", inet_checksum(ip)) + ip[12:]
        return eth + ip, src + dst + struct.pack("!BBH", 0, proto, l4_len)
    src, dst = ipaddress.IPv6Address(ep.src6).packed, ipaddress.IPv6Address(ep.dst6).packed
    ip = struct.pack("!IHBB16s16s", 6 << 28, l4_len, proto, ep.ttl, src, dst)
    return eth + ip, src + dst + struct.pack("!IxxxB", l4_len, proto)


def build_frame(size: int, family: Family, ep: Endpoints) -> bytes:
    """An Ethernet/IP/UDP frame of `size` bytes (no FCS) for flow 0, every checksum valid; a TCP SYN
    frame instead when ep.l4 says so."""
    if ep.l4 == "tcp-syn":
        return build_syn_frame(size, family, ep)
    ip_len = 20 if family == 4 else 40
    payload_len = size - 14 - ip_len - 8
    if payload_len < 0:
        raise GeneratorError(f"a {size}-byte IPv{family} UDP frame is too short for its headers "
                             f"({14 + ip_len + 8} bytes)")
    payload = bytes((i * 7 + 1) & 0xFF for i in range(payload_len))
    udp_len = 8 + payload_len
    udp = struct.pack("!HHHH", ep.sport, ep.dport, udp_len, 0) + payload
    head, pseudo = _eth_ip(family, ep, socket.IPPROTO_UDP, udp_len)
    return head + udp[:6] + struct.pack("!H", _udp_check(pseudo, udp)) + udp[8:]


def build_syn_frame(size: int, family: Family, ep: Endpoints) -> bytes:
    """An Ethernet/IP/TCP SYN of `size` bytes for flow 0: the MSS and SACK-permitted options a client
    sends, as many NOPs more as fit (the TCP header at most 60 bytes), Ethernet padding for the rest."""
    ip_len = 20 if family == 4 else 40
    tcp_len = min(60, (size - 14 - ip_len) // 4 * 4)
    if tcp_len < 28:
        raise GeneratorError(f"a {size}-byte IPv{family} TCP SYN frame is too short for its headers "
                             f"({14 + ip_len + 28} bytes)")
    options = struct.pack("!BBH", 2, 4, 1460) + b"\x01\x01\x04\x02"  # MSS; NOP NOP SACK-permitted
    options += b"\x01" * (tcp_len - 20 - len(options))
    tcp = struct.pack("!HHIIBBHHH", ep.sport, ep.dport, 1, 0, tcp_len // 4 << 4, 0x02, 64240, 0, 0) + options
    head, pseudo = _eth_ip(family, ep, socket.IPPROTO_TCP, tcp_len)
    frame = head + tcp[:16] + struct.pack("!H", inet_checksum(pseudo + tcp)) + tcp[18:]
    return frame + b"\0" * (size - len(frame))


@dataclass(frozen=True)
class Latency:
    """One-way latency of a latency stream over a trial, in microseconds."""

    min_us: float
    avg_us: float
    max_us: float
    p50_us: float | None = None
    p99_us: float | None = None


@dataclass(frozen=True)
class TrialResult:
    """What one trial measured.

    `offered` is what the rate asked for over the duration (rate × duration); `sent` what the
    generator really put on the wire. A software generator that shares CPUs with the device under
    test may fall short of the rate. Within RATE_TOLERANCE of the offered count the rate counts as
    held and `loss` is (sent − received) / sent; further short, the frames it could not send in
    time count as lost too, because the rate was not sustained: (offered − received) / offered.
    """

    offered: int
    sent: int
    received: int
    duration: float
    latency: Latency | None = None
    # Seconds the sending thread that waited longest was ready to run but had no CPU (from
    # /proc/thread-self/schedstat), for generators that share the CPUs; None where unknown.
    waited: float | None = None

    @property
    def sustained(self) -> bool:
        """Whether the generator sent (nearly) everything the rate asked for."""
        return self.sent >= self.offered * (1 - RATE_TOLERANCE)

    @property
    def loss(self) -> float:
        base = self.sent if self.sustained else self.offered
        if base <= 0:
            return 0.0
        return min(1.0, max(0.0, (base - self.received) / base))


def check_frame_spec(frame_size: FrameSpec) -> None:
    """Raise GeneratorError unless frame_size is 64..1518 bytes or "imix"."""
    if frame_size == "imix":
        return
    if isinstance(frame_size, bool) or not isinstance(frame_size, int) \
            or not MIN_FRAME <= frame_size <= MAX_FRAME:
        raise GeneratorError(f"frame size must be {MIN_FRAME}..{MAX_FRAME} bytes or 'imix' "
                             f"but got {frame_size!r}")


def frame_mix(frame_size: FrameSpec) -> tuple[tuple[int, int], ...]:
    """(size, share) pairs: one size with share 1, or the IMIX cycle."""
    check_frame_spec(frame_size)
    return IMIX if frame_size == "imix" else ((int(frame_size), 1),)


def mean_frame_size(frame_size: FrameSpec) -> float:
    mix = frame_mix(frame_size)
    return sum(size * n for size, n in mix) / sum(n for _, n in mix)


class Generator(abc.ABC):
    """Sends `flows` UDP flows of `family` at `rate_pps` for `duration_s` and counts what came back."""

    name: str = "generator"

    @abc.abstractmethod
    def run(self, rate_pps: float, duration_s: float, frame_size: FrameSpec, flows: int,
            family: Family) -> TrialResult:
        """One trial; raises GeneratorError when it cannot be run as asked."""

    def close(self) -> None:  # noqa: B027 (optional hook, nothing to release by default)
        """Release what the generator holds (programs, connections)."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def check_trial(rate_pps: float, duration_s: float, flows: int, family: int) -> None:
    """Raise GeneratorError naming the argument that a trial cannot use."""
    if not rate_pps > 0:
        raise GeneratorError(f"rate must be > 0 packets/s but got {rate_pps!r}")
    if not duration_s > 0:
        raise GeneratorError(f"duration must be > 0 s but got {duration_s!r}")
    if not 1 <= flows <= 1 << 24:
        raise GeneratorError(f"flows must be 1..{1 << 24} but got {flows!r}")
    if family not in (4, 6):
        raise GeneratorError(f"family must be 4 or 6 but got {family!r}")
