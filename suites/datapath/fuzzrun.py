"""fuzzrun.py: runs fuzzed frames through a program by BPF_PROG_TEST_RUN, fast, and judges each output.

`FastRun` keeps one input buffer, one output buffer and one options struct per program, so a test
run costs the syscall and a few attribute writes (about 10 µs here, against 30 µs through
`Program.test_run`, which allocates per call). Each run is judged from bytes alone (no scapy): a
balancer XDP_TX output must re-parse as an encapsulation whose inner packet is the input's IP packet,
or as an ICMP echo reply or Packet Too Big answering the input; PASS and DROP must leave the frame
untouched; a decap output is either the input untouched or its inner packet behind an Ethernet header.
`ProgramTally` counts verdicts and output kinds, so the caller can hold them against the per-reason
counters of the same runs.
"""

from __future__ import annotations

import ctypes
import errno
import struct
from collections import Counter
from dataclasses import dataclass, field

from balancer.libbpf import Program, _TestRunOpts, lib

ETH_P_IP, ETH_P_IPV6 = 0x0800, 0x86DD
VLAN_TYPES = (0x8100, 0x88A8)
OUT_SIZE = 16384


class FastRun:
    """BPF_PROG_TEST_RUN of one program with buffers allocated once; `out` is the last output."""

    def __init__(self, prog: Program) -> None:
        self.prog = prog
        self.din = ctypes.create_string_buffer(OUT_SIZE)
        self.dout = ctypes.create_string_buffer(OUT_SIZE)
        self.opts = _TestRunOpts(sz=ctypes.sizeof(_TestRunOpts))
        self.opts.data_in = ctypes.cast(self.din, ctypes.c_void_p)
        self.opts.data_out = ctypes.cast(self.dout, ctypes.c_void_p)
        self.opts.repeat = 1
        self._ref = ctypes.byref(self.opts)
        self._fn = lib().bpf_prog_test_run_opts

    def run(self, frame: bytes) -> int | None:
        """The program's return value for `frame`; None when the kernel refuses an skb test run of
        an IPv4 or IPv6 frame too short for its IP header (it does, with EINVAL, before the program
        runs); raises for any other refusal."""
        ctypes.memmove(self.din, frame, len(frame))
        self.opts.data_size_in = len(frame)
        self.opts.data_size_out = OUT_SIZE
        ret = self._fn(self.prog.fd, self._ref)
        if ret == -errno.EINVAL and short_of_ip_header(frame):
            return None
        if ret < 0:
            raise OSError(-ret, f"test-run of {self.prog.name} on {len(frame)} bytes: {frame.hex()}")
        return ctypes.c_int32(self.opts.retval).value

    @property
    def out(self) -> bytes:
        return ctypes.string_at(self.dout, self.opts.data_size_out)


def short_of_ip_header(frame: bytes) -> bool:
    """An untagged IPv4 frame shorter than its IP header (up to 60 bytes) or IPv6 shorter than 40."""
    ethertype = struct.unpack_from("!H", frame, 12)[0]
    return (ethertype == ETH_P_IP and len(frame) < 14 + 60) or (ethertype == ETH_P_IPV6 and len(frame) < 14 + 40)


def inet_checksum(data: bytes) -> int:
    """The Internet checksum of data (0 when data holds a correct checksum)."""
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def l3_offset(frame: bytes) -> tuple[int, int] | None:
    """(offset of the IP header, ethertype) after Ethernet and at most one tag, or None."""
    if len(frame) < 14:
        return None
    ethertype, off = struct.unpack_from("!H", frame, 12)[0], 14
    if ethertype in VLAN_TYPES:
        if len(frame) < 18:
            return None
        ethertype, off = struct.unpack_from("!H", frame, 16)[0], 18
    return off, ethertype


def ip_packet(frame: bytes) -> bytes | None:
    """The IP packet a frame's headers announce (its announced length, cut to what is there)."""
    where = l3_offset(frame)
    if where is None:
        return None
    off, ethertype = where
    if ethertype == ETH_P_IP and len(frame) >= off + 4:
        return frame[off: off + struct.unpack_from("!H", frame, off + 2)[0]]
    if ethertype == ETH_P_IPV6 and len(frame) >= off + 6:
        return frame[off: off + 40 + struct.unpack_from("!H", frame, off + 4)[0]]
    return None


def _pseudo6(ip6: bytes, proto: int, length: int) -> bytes:
    return ip6[8:40] + struct.pack("!IxxxB", length, proto)


def _pseudo4(ip: bytes, proto: int, length: int) -> bytes:
    return ip[12:20] + struct.pack("!xBH", proto, length)


def outer_udp_sum_must_verify(inner: bytes) -> bool:
    """Whether a GUE output's UDP checksum must verify over its bytes. The balancer derives it from the
    inner segment's own checksum where one covers the segment (TCP, UDP with a checksum, over IPv4 or
    IPv6 without extension headers: encap.h, inner_sum_from_headers); then it verifies exactly when the
    inner one does, and over IPv4 when the inner header's and the segment's checksums together do (the
    header is taken as summing to 0xffff, not read: errors of the two that cancel cancel in the outer sum
    too). Otherwise it sums the bytes and must always verify."""
    header = b""
    if len(inner) >= 20 and inner[0] == 0x45:
        proto, hdr, length = inner[9], 20, struct.unpack_from("!H", inner, 2)[0]
        pseudo = _pseudo4
        header = inner[:20]
    elif len(inner) >= 40 and inner[0] >> 4 == 6:
        proto, hdr, length = inner[6], 40, 40 + struct.unpack_from("!H", inner, 4)[0]
        pseudo = _pseudo6
    else:
        return True
    segment = inner[hdr:length]
    if proto not in (6, 17) or (proto == 17 and len(segment) >= 8 and segment[6:8] == b"\0\0"):
        return True
    return inet_checksum(header + pseudo(inner, proto, len(segment)) + segment) == 0


def judge_tx(frame: bytes, out: bytes, gue_port: int, reals: frozenset[bytes] = frozenset(),
             nexthop: bytes = b"") -> tuple[str, str]:
    """(kind, problem) of a balancer XDP_TX output: kind encap, echo or too_big; problem '' if valid.
    When given, an encapsulation must go to one of `reals` (packed addresses) by way of `nexthop`."""
    where = l3_offset(out)
    if where is None:
        return "?", "output shorter than an Ethernet header"
    off, ethertype = where
    if ethertype == ETH_P_IP:
        if len(out) < off + 20 or out[off] != 0x45:
            return "?", "outer IPv4 header is not a 20-byte header"
        total, hdr, proto = struct.unpack_from("!H", out, off + 2)[0], 20, out[off + 9]
        if inet_checksum(out[off: off + 20]):
            return "?", "outer IPv4 header checksum"
        src, dst = out[off + 12: off + 16], out[off + 16: off + 20]
    elif ethertype == ETH_P_IPV6:
        if len(out) < off + 40 or out[off] >> 4 != 6:
            return "?", "outer IPv6 header"
        total, hdr, proto = 40 + struct.unpack_from("!H", out, off + 4)[0], 40, out[off + 6]
        src, dst = out[off + 8: off + 24], out[off + 24: off + 40]
    else:
        return "?", f"output ethertype {ethertype:#06x}"
    if off + total > len(out):
        return "?", f"outer packet claims {total} bytes, the frame holds {len(out) - off}"
    packet = out[off: off + total]
    original = ip_packet(frame)
    if original is None:
        return "?", "XDP_TX for a frame without an IP packet"
    if hdr == 40:
        hdr, proto = skip_ext_headers(packet, hdr, proto)
    if proto in (1, 58):
        return _judge_answer(frame, packet, hdr, proto, src, dst, original)
    rest = packet[hdr:]
    if proto == 17:
        if len(rest) < 8:
            return "encap", "UDP header cut"
        sport, dport, ulen, _ = struct.unpack_from("!HHHH", rest)
        if dport != gue_port or ulen != len(rest):
            return "encap", f"UDP port {dport} length {ulen} (GUE port {gue_port}, {len(rest)} bytes)"
        verifies = inet_checksum((_pseudo6 if hdr == 40 else _pseudo4)(packet, 17, ulen) + rest) == 0
        if verifies != outer_udp_sum_must_verify(original):
            return "encap", f"outer UDP checksum {'verifies' if verifies else 'fails'} (must it? inner segment)"
        rest = rest[8:]
        if rest and rest[0] >> 6 == 0:  # GUE variant 0: a 4-byte header naming the inner protocol
            if rest[1] not in (4, 41):
                return "encap", f"GUE variant 0 names protocol {rest[1]}"
            rest = rest[4:]
    elif proto not in (4, 41):
        return "?", f"outer protocol {proto}"
    if reals and dst not in reals:
        return "encap", "outer destination is not a configured real"
    if nexthop and out[:6] != nexthop:
        return "encap", f"destination MAC {out[:6].hex()} is not the next hop's"
    if rest != original:
        return "encap", "inner packet is not the input's IP packet"
    if proto in (4, 41) and rest[0] >> 4 != (4 if proto == 4 else 6):
        return "encap", f"protocol {proto} around an IPv{rest[0] >> 4} packet"
    return "encap", ""


def skip_ext_headers(packet: bytes, hdr: int, proto: int) -> tuple[int, int]:
    """(offset, protocol) past IPv6 hop-by-hop, routing and destination-options headers."""
    while proto in (0, 43, 60) and len(packet) >= hdr + 2:
        proto, hdr = packet[hdr], hdr + (packet[hdr + 1] + 1) * 8
    return hdr, proto


def icmp_checksum_ok(packet: bytes, hdr: int, v4: bool) -> bool:
    icmp = packet[hdr:]
    if v4:
        return inet_checksum(icmp) == 0
    return inet_checksum(_pseudo6(packet, 58, len(icmp)) + icmp) == 0


def _judge_answer(frame: bytes, packet: bytes, hdr: int, proto: int, src: bytes, dst: bytes,
                  original: bytes) -> tuple[str, str]:
    """An ICMP answer to the client: an echo reply, or a too-big quoting the input."""
    v4 = proto == 1
    orig_src, orig_dst = (original[12:16], original[16:20]) if v4 else (original[8:24], original[24:40])
    icmp = packet[hdr:]
    if len(icmp) < 8:
        return "?", "ICMP header cut"
    kind = "echo" if icmp[0] in (0, 129) else "too_big" if (icmp[0], icmp[1]) in ((3, 4), (2, 0)) else "?"
    if kind == "?":
        return kind, f"ICMP type {icmp[0]} code {icmp[1]}"
    if dst != orig_src:
        return kind, "the answer is not addressed to the input's source"
    if kind == "echo":
        # Right whenever the request's was (IPv4 replies are summed afresh, IPv6 ones updated).
        if icmp_checksum_ok(original, hdr, v4) and not icmp_checksum_ok(packet, hdr, v4):
            return kind, "ICMP checksum of the reply is wrong, the request's was right"
        if src != orig_dst or len(packet) != len(original):
            return kind, "echo reply is not the request turned around"
        return kind, ""
    if not icmp_checksum_ok(packet, hdr, v4):
        return kind, "ICMP checksum"
    quote = icmp[8:]
    if not quote or not original.startswith(quote):
        return kind, "too-big quote is not the head of the input's IP packet"
    return kind, ""


def judge_decap(frame: bytes, out: bytes) -> tuple[bool, str]:
    """(decapsulated, problem) of a decap output: untouched, or the inner packet behind the input's
    Ethernet header (and its tag, if it had one)."""
    if out == frame:
        return False, ""
    where = l3_offset(out)
    if where is None or len(out) <= where[0] or len(out) > len(frame):
        return True, f"output of {len(out)} bytes from {len(frame)}"
    off, ethertype = where
    inner = out[off:]
    if not frame.endswith(inner) or out[:off - 2] != frame[:off - 2]:
        return True, "output is not the input's tail behind the input's Ethernet header"
    version = inner[0] >> 4
    if (ethertype, version) not in ((ETH_P_IP, 4), (ETH_P_IPV6, 6)):
        return True, f"ethertype {ethertype:#06x} in front of an IPv{version} packet"
    return True, ""


@dataclass
class ProgramTally:
    """What one program did with the fuzzed frames: verdicts, output kinds, problems (first few)."""

    name: str
    verdicts: Counter[str] = field(default_factory=Counter)
    kinds: Counter[str] = field(default_factory=Counter)
    problems: Counter[str] = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)

    def problem(self, what: str, frame: bytes) -> None:
        self.problems[what] += 1
        if self.problems[what] <= 3:
            self.examples.append(f"{self.name}: {what}: {frame.hex()}")


def _lower_ttl(inner: bytearray) -> bool:
    """The inline decap's hop: TTL / hop limit one lower, the IPv4 checksum updated as RFC 1624 says
    (so a wrong one stays wrong, as in bpf/include/decap_inline.h); False when it would run out."""
    if inner[0] >> 4 == 4:
        if inner[8] <= 1:
            return False
        old = struct.unpack_from("!H", inner, 8)[0]
        inner[8] -= 1
        new = struct.unpack_from("!H", inner, 8)[0]
        total = (~struct.unpack_from("!H", inner, 10)[0] & 0xFFFF) + (~old & 0xFFFF) + new
        while total >> 16:
            total = (total & 0xFFFF) + (total >> 16)
        struct.pack_into("!H", inner, 10, ~total & 0xFFFF)
        return True
    if inner[7] <= 1:
        return False
    inner[7] -= 1
    return True


def _outer(frame: bytes, l2: int) -> tuple[int, bytes, int] | None:
    """(next protocol, destination, offset past the outer IP headers) of an outer header the balancer
    parses whole and hands to inline decap: IPv4 without options or fragments, lengths right; IPv6
    with hop-by-hop, destination-options and finished routing headers walked (tunnel.h)."""
    if frame[12:14] == b"\x08\x00" or (l2 == 18 and frame[16:18] == b"\x08\x00"):
        if len(frame) < l2 + 20 or frame[l2] != 0x45:
            return None
        total, frag = struct.unpack_from("!H", frame, l2 + 2)[0], struct.unpack_from("!H", frame, l2 + 6)[0]
        if total < 20 or total > len(frame) - l2 or frag & 0x3FFF:
            return None
        return frame[l2 + 9], frame[l2 + 16: l2 + 20], l2 + 20
    if len(frame) < l2 + 40 or frame[l2] >> 4 != 6:
        return None
    plen = struct.unpack_from("!H", frame, l2 + 4)[0]
    if plen == 0 or 40 + plen > len(frame) - l2:
        return None
    nh, off = frame[l2 + 6], l2 + 40
    for _ in range(8):
        if nh not in (0, 43, 60):
            break
        if off > 384 or len(frame) < off + 8 or (nh == 43 and frame[off + 3]):
            return None
        nh, off = frame[off], off + (frame[off + 1] + 1) * 8
    if nh in (0, 43, 60, 44, 51) or off > 384 or off > l2 + 40 + plen:
        return None
    return nh, frame[l2 + 24: l2 + 40], off


def decapped(frame: bytes, decaps: dict[bytes, int], gue_port: int) -> tuple[int, bytes] | None:
    """(decap action, the frame it becomes) for a tunnel to one of the LB's decap addresses whose inner
    packet inline decap goes on with, as bpf/include/decap_inline.h and tunnel.h read it; None else."""
    where = l3_offset(frame)
    if where is None or (where[0] == 18 and frame[12:14] != b"\x81\x00"):
        return None
    l2 = where[0]
    outer = _outer(frame, l2)
    if outer is None or outer[1] not in decaps:
        return None
    proto, dst, off = outer
    if proto == 17:
        if len(frame) < off + 8 or struct.unpack_from("!H", frame, off + 2)[0] != gue_port:
            return None
        off += 8
        if len(frame) < off + 4:
            return None
        first = frame[off]
        if first >> 6 == 0:
            if first & 0x20 or frame[off + 1] not in (4, 41):
                return None  # a control message passes; another protocol is dropped (malformed)
            off += 4 + (first & 0x1F) * 4
        elif first >> 6 != 1:
            return None
    elif proto not in (4, 41):
        return None
    if off > 512 or len(frame) <= off:
        return None
    inner = bytearray(frame[off:])
    version = inner[0] >> 4
    if version not in (4, 6) or len(inner) < (20 if version == 4 else 40) or \
            (proto in (4, 41) and version != (4 if proto == 4 else 6)) or not _lower_ttl(inner):
        return None
    ethertype = b"\x08\x00" if version == 4 else b"\x86\xdd"
    return decaps[dst], frame[:l2 - 2] + ethertype + bytes(inner)
