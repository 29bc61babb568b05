"""emitted.py: the encapsulated frames the real balancer program emits for many generated flows (BPF_PROG_TEST_RUN).

`emit_flows` loads build/bpf/balancer.o through balancer.datapath.Datapath (no lab, no attach),
programs one TCP VIP with the default lab's reals, outer source prefixes and Maglev ring, runs one
SYN per flow through the program and returns the outer headers of every frame it XDP_TXed: the
fields a NIC's RSS hash reads (outer addresses, and the UDP ports for GUE), as byte arrays.

Frames are patched from one template (source address, source port, IPv4 header checksum and TCP
checksum recomputed for every flow), which is fast enough for tens of thousands of flows.
"""

from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from balancer import _abi, maglev
from balancer.datapath import Datapath
from lab.checksum import inet_checksum

XDP_TX = 3
ETH = 14
RING_SIZE = 65537
U8 = npt.NDArray[np.uint8]


@dataclass(frozen=True)
class Emitted:
    """Outer headers of the frames emitted for one real: addresses and ports as byte rows."""

    src: U8  # (flows, 4 or 16) outer source addresses, network order
    dst: U8  # (flows, 4 or 16) outer destination addresses
    ports: U8  # (flows, 4) outer UDP source and destination ports, network order (GUE), else zeros
    flows_total: int  # flows run through the program, all reals together
    verdicts: dict[int, int]  # XDP action -> frames

    @property
    def flows(self) -> int:
        return int(self.src.shape[0])


def _template(vip: str, port: int) -> tuple[bytearray, int, int]:
    """A client SYN to vip:port as bytes, with the offsets of the source address and the IP header."""
    v6 = ipaddress.ip_address(vip).version == 6
    eth = bytes.fromhex("020000000002" "020000000001") + (b"\x86\xdd" if v6 else b"\x08\x00")
    tcp = struct.pack("!HHIIBBHHH", 40000, port, 1, 0, 5 << 4, 0x02, 64240, 0, 0)
    dst = ipaddress.ip_address(vip).packed
    if v6:
        ip = struct.pack("!IHBB", 6 << 28, len(tcp), 6, 64) + bytes(16) + dst
        return bytearray(eth + ip + tcp), ETH + 8, ETH + 40
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(tcp), 1, 0x4000, 64, 6, 0, bytes(4), dst)
    return bytearray(eth + ip + tcp), ETH + 12, ETH + 20


def _frame(tmpl: bytearray, src_off: int, l4_off: int, src: bytes, sport: int) -> bytes:
    f = bytearray(tmpl)
    f[src_off: src_off + len(src)] = src
    f[l4_off: l4_off + 2] = struct.pack("!H", sport)
    segment = bytes(f[l4_off:])
    if len(src) == 4:
        f[ETH + 10: ETH + 12] = b"\0\0"
        f[ETH + 10: ETH + 12] = struct.pack("!H", inet_checksum(bytes(f[ETH: ETH + 20])))
        pseudo = bytes(f[ETH + 12: ETH + 20]) + struct.pack("!BBH", 0, 6, len(segment))
    else:
        pseudo = bytes(f[ETH + 8: ETH + 40]) + struct.pack("!I3xB", len(segment), 6)
    f[l4_off + 16: l4_off + 18] = struct.pack("!H", inet_checksum(pseudo + segment))
    return bytes(f)


def client_flows(n: int, family: int, seed: int) -> tuple[list[bytes], list[int]]:
    """n distinct (source address, source port) pairs from the documentation prefixes.

    IPv4 clients come from 192.0.2.0/24 and 203.0.113.0/24, IPv6 from random host bits of
    2001:db8:c::/64; source ports from Linux's default ephemeral range 32768-60999.
    """
    rng = np.random.default_rng(seed)
    pairs: set[tuple[bytes, int]] = set()
    bases4 = [ipaddress.IPv4Address("192.0.2.0"), ipaddress.IPv4Address("203.0.113.0")]
    base6 = int(ipaddress.IPv6Address("2001:db8:c::"))
    while len(pairs) < n:
        want = n - len(pairs)
        ports = rng.integers(32768, 61000, size=want)
        if family == 4:
            hosts = rng.integers(1, 255, size=want)
            nets = rng.integers(0, 2, size=want)
            addrs = [(bases4[int(b)] + int(h)).packed for b, h in zip(nets, hosts, strict=True)]
        else:
            host = rng.integers(1, 2**63, size=want, dtype=np.int64)
            addrs = [ipaddress.IPv6Address(base6 + int(h)).packed for h in host]
        pairs.update(zip(addrs, (int(p) for p in ports), strict=True))
    chosen = sorted(pairs)[:n]
    return [a for a, _ in chosen], [p for _, p in chosen]


def emit_flows(obj: str, *, vip: str, port: int, reals: list[str], encap: int, flow_src: bool,
               src4: str, src6: str, flows: int, real: str, seed: int = 1,
               gue_port: int = _abi.Limits.DEFAULT_GUE_PORT) -> Emitted:
    """Run one SYN per generated flow through the balancer; the outer headers of those sent to `real`."""
    family = ipaddress.ip_address(vip).version
    with Datapath.load(obj, ring_size=RING_SIZE, lru_size=4096, fallback_size=1024, max_vips=4) as dp:
        dp.set_settings(nexthop_mac="02:00:00:00:00:01", src4=src4, src6=src6, gue_port=gue_port, mtu=1500)
        ids = {i + 1: (a, 1) for i, a in enumerate(reals)}
        for rid, (addr, _) in ids.items():
            dp.put_real(rid, addr)
        dp.write_ring(0, [int(x) for x in maglev.build_ring(ids, RING_SIZE)])
        flags = int(_abi.VipFlag.OUTER_SRC_FLOW) if flow_src else 0
        dp.put_vip(vip, port, "tcp", vip_num=0, flags=flags, encap=encap)
        tmpl, src_off, l4_off = _template(vip, port)
        srcs, sports = client_flows(flows, family, seed)
        prog = dp.programs["balancer_xdp"]
        rows: list[bytes] = []
        verdicts: dict[int, int] = {}
        for src, sport in zip(srcs, sports, strict=True):
            result = prog.test_run(_frame(tmpl, src_off, l4_off, src, sport))
            verdicts[result.retval] = verdicts.get(result.retval, 0) + 1
            if result.retval == XDP_TX:
                rows.append(result.data[:ETH + 48])
    outer6 = bool(rows) and rows[0][12:14] == b"\x86\xdd"
    table = np.frombuffer(b"".join(r.ljust(ETH + 48, b"\0") for r in rows), dtype=np.uint8).reshape(-1, ETH + 48)
    if outer6:
        src_a, dst_a, udp = table[:, ETH + 8: ETH + 24], table[:, ETH + 24: ETH + 40], ETH + 40
        is_udp = table[:, ETH + 6] == 17
    else:
        src_a, dst_a, udp = table[:, ETH + 12: ETH + 16], table[:, ETH + 16: ETH + 20], ETH + 20
        is_udp = table[:, ETH + 9] == 17
    ports = np.where(is_udp[:, None], table[:, udp: udp + 4], 0).astype(np.uint8)
    mine = np.all(dst_a == np.frombuffer(ipaddress.ip_address(real).packed, dtype=np.uint8), axis=1)
    return Emitted(np.ascontiguousarray(src_a[mine]), np.ascontiguousarray(dst_a[mine]),
                   np.ascontiguousarray(ports[mine]), flows, verdicts)
