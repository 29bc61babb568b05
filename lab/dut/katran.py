"""katran.py: Katran's XDP balancer, built from a user's own checkout and programmed by our code.

The project contains no Katran code, object or script: `build()` compiles the balancer of the
checkout that `L4LAB_KATRAN_SRC` (or `l4lab bench --katran PATH`) names, and `Katran` programs its
maps from their documented layout (katran/lib/bpf/balancer_structs.h, balancer_maps.h,
balancer_consts.h), facts restated here as struct formats:

    vip_map    key   vip_definition  address (16 bytes, IPv4 in the first 4), port (network order),
                                     proto, one pad byte                                   20 bytes
               value vip_meta        flags, vip_num (u32 each)                              8 bytes
    reals      u32 index -> real_definition: address (16), flags (F_IPV6 = 1), 3 pad bytes  20 bytes
    ch_rings   u32 vip_num * 65537 + slot -> real index
    ctl_array  [0] = the next hop's MAC and 2 zero bytes
    pckt_srcs  [0] / [1] = the LB's IPv4 / IPv6 outer source as a real_definition (GUE builds)
    lru_mapping  one LRU hash per CPU (key flow_key 40 bytes, value real_pos_lru 16 bytes)
    stats      per CPU, two u64 per counter; global counters at MAX_VIPS (512) + counter id

Used by the side-by-side bench (lab/bench/katran.py) and as a device under test attached in native
XDP on a lab's LB veth: load(), attach(), add_vip(), add_real(), remove_real(), set_ring(),
counter(). A flavour is the default IPIP build or GUE (`-DGUE_ENCAP -DGUE_DPORT=6080`).
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import socket
import struct
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from lab.errors import LabError

ENV = "L4LAB_KATRAN_SRC"
SOURCE = Path("katran/lib/bpf/balancer.bpf.c")
BUILD_DIR = Path(__file__).resolve().parents[2] / "build" / "katran"
HOW_TO_GET = ("get a Katran checkout with `git clone https://github.com/facebookincubator/katran` "
              "and pass its path (`l4lab bench --katran PATH`, or L4LAB_KATRAN_SRC=PATH for the tests)")

MAX_VIPS = 512      # MAX_VIPS in balancer_consts.h: global counters start at this index of `stats`
RING_SIZE = 65537   # RING_SIZE in balancer_consts.h
F_IPV6 = 1          # real_definition.flags: the real is IPv6
GUE_PORT = 6080

# Global counter ids (balancer_consts.h): stats[MAX_VIPS + id] = (v1, v2).
LRU_CNTRS = 0       # v1: packets to a VIP, v2: session-table misses
LRU_MISS_CNTR = 1   # v1: TCP SYN misses, v2: TCP non-SYN misses
FALLBACK_LRU_CNTR = 3
XDP_TOTAL_CNTR = 16
XDP_TX_CNTR = 17
XDP_DROP_CNTR = 18
XDP_PASS_CNTR = 19

FLAVOURS: dict[str, tuple[str, ...]] = {
    "ipip": (),
    "gue": ("-DGUE_ENCAP", f"-DGUE_DPORT={GUE_PORT}"),
}
FLOW_KEY_SIZE, REAL_POS_SIZE = 40, 16


@dataclass(frozen=True)
class Checkout:
    """A Katran source tree: its root holds katran/lib/bpf/balancer.bpf.c."""

    root: Path

    @classmethod
    def find(cls, path: str | os.PathLike[str] | None) -> Checkout:
        """The checkout at path (or $L4LAB_KATRAN_SRC); LabError saying how to get one otherwise."""
        given = path if path is not None else os.environ.get(ENV)
        if not given:
            raise LabError(f"no Katran checkout given: {HOW_TO_GET}")
        root = Path(given).expanduser().resolve()
        if not (root / SOURCE).is_file():
            raise LabError(f"{root} is not a Katran checkout: it has no {SOURCE}; {HOW_TO_GET}")
        return cls(root)


def build(checkout: Checkout, flavour: str = "ipip", out_dir: Path = BUILD_DIR) -> Path:
    """Compile Katran's balancer (clang to LLVM IR, llc to BPF, as Katran's own build does)."""
    if flavour not in FLAVOURS:
        raise LabError(f"unknown Katran flavour {flavour!r}; use one of {', '.join(FLAVOURS)}")
    for tool in ("clang", "llc"):
        if shutil.which(tool) is None:
            raise LabError(f"building Katran needs {tool}; run `make deps` (it installs clang and llvm)")
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / f"balancer-{flavour}.o"
    ir = out_dir / f"balancer-{flavour}.ll"
    cflags = ["-I", str(checkout.root), "-D__KERNEL__", "-Wno-unused-value", "-Wno-pointer-sign",
              "-Wno-compare-distinct-pointer-types", "-w", "-O2", "-g", *FLAVOURS[flavour]]
    steps = [["clang", *cflags, "-emit-llvm", "-S", "-c", str(checkout.root / SOURCE), "-o", str(ir)],
             ["llc", "-march=bpf", "-filetype=obj", str(ir), "-o", str(out)]]
    for argv in steps:
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            tail = " | ".join(done.stderr.strip().splitlines()[-3:])
            raise LabError(f"cannot build Katran ({flavour}) from {checkout.root}: {argv[0]} failed: {tail}",
                           step="build katran", command=" ".join(argv), stderr=done.stderr)
    ir.unlink(missing_ok=True)
    return out


def _addr16(address: str) -> tuple[bytes, bool]:
    ip = ipaddress.ip_address(address)
    return ip.packed.ljust(16, b"\0"), ip.version == 6


def vip_key(address: str, port: int, proto: int) -> bytes:
    raw, _ = _addr16(address)
    return raw + struct.pack("!H", port) + struct.pack("BB", proto, 0)


def real_value(address: str) -> bytes:
    raw, v6 = _addr16(address)
    return raw + struct.pack("B3x", F_IPV6 if v6 else 0)


class Katran:
    """One loaded Katran balancer object: its per-CPU session tables, maps and programs."""

    PROGRAM = "balancer_ingress"

    def __init__(self, obj_path: Path | str, *, lru_size: int = 1000, vips: int = 1) -> None:
        from balancer.libbpf import BpfObject

        self.path = str(obj_path)
        self.lru_size = lru_size
        self._obj = BpfObject(self.path)
        self._inner: list[object] = []
        self._links: list[object] = []
        self._vips = vips

    def load(self) -> Katran:
        """Load the object (rings sized for `vips` VIPs), then give every CPU its session table."""
        from balancer.libbpf import Map, MapType, num_possible_cpus

        try:
            self._obj.set_max_entries("ch_rings", self._vips * RING_SIZE)
            self._obj.load()
            outer = self._obj.map("lru_mapping")
            for cpu in range(min(num_possible_cpus(), outer.max_entries)):
                inner = Map.create(MapType.LRU_HASH, f"kt_lru_{cpu}", FLOW_KEY_SIZE, REAL_POS_SIZE,
                                   self.lru_size)
                self._inner.append(inner)
                outer.update(cpu.to_bytes(4, "little"), inner.fd.to_bytes(4, "little"))
        except BaseException:
            self.close()
            raise
        return self

    @property
    def program(self):  # type: ignore[no-untyped-def]
        return self._obj.program(self.PROGRAM)

    @property
    def session_tables(self) -> list[object]:
        """The per-CPU LRU session tables (balancer.libbpf.Map), CPU 0 first."""
        return list(self._inner)

    def attach(self, ifname: str, mode: str = "native") -> None:
        """Attach in XDP (a BPF link; close() detaches it)."""
        self._links.append(self.program.attach_xdp(socket.if_nametoindex(ifname), mode, ifname))

    def set_router_mac(self, mac: str) -> None:
        """ctl_array[0]: the destination MAC of every frame Katran sends (it never reads neighbours)."""
        self._obj.map("ctl_array").update(b"\0" * 4, bytes.fromhex(mac.replace(":", "")) + b"\0\0")

    def set_sources(self, src4: str, src6: str | None = None) -> None:
        """pckt_srcs[0] / [1]: the outer IPv4 / IPv6 source of GUE frames (GUE builds only)."""
        m = self._obj.map("pckt_srcs")
        m.update((0).to_bytes(4, "little"), real_value(src4))
        if src6:
            m.update((1).to_bytes(4, "little"), real_value(src6))

    def add_vip(self, address: str, port: int, proto: int, vip_num: int, flags: int = 0) -> None:
        if not 0 <= vip_num < self._vips:
            raise LabError(f"Katran VIP number {vip_num} is outside the {self._vips} loaded")
        self._obj.map("vip_map").update(vip_key(address, port, proto), struct.pack("<II", flags, vip_num))

    def add_real(self, index: int, address: str) -> None:
        if index <= 0:
            raise LabError(f"Katran real index {index}: index 0 means 'no real'")
        self._obj.map("reals").update(index.to_bytes(4, "little"), real_value(address))

    def remove_real(self, index: int) -> None:
        self._obj.map("reals").update(index.to_bytes(4, "little"), b"\0" * 20)

    def set_ring(self, vip_num: int, ring: Sequence[int]) -> None:
        """ch_rings for one VIP: RING_SIZE real indexes (e.g. l4lab's Maglev ring for the same reals)."""
        if len(ring) != RING_SIZE:
            raise LabError(f"a Katran ring has {RING_SIZE} slots but got {len(ring)}")
        m = self._obj.map("ch_rings")
        base = vip_num * RING_SIZE
        keys = b"".join((base + i).to_bytes(4, "little") for i in range(RING_SIZE))
        m.update_batch_raw(keys, b"".join(int(r).to_bytes(4, "little") for r in ring))

    def counter(self, counter_id: int) -> tuple[int, int]:
        """A global counter (v1, v2) summed over CPUs: stats[MAX_VIPS + counter_id]."""
        return self._stats("stats", MAX_VIPS + counter_id)

    def real_counter(self, index: int) -> tuple[int, int]:
        """(packets, bytes) sent to one real."""
        return self._stats("reals_stats", index)

    def counters(self) -> dict[str, int]:
        """The global counters the bench checks paths with, by name."""
        out = {}
        for name, cid in (("LRU", LRU_CNTRS), ("LRU_MISS", LRU_MISS_CNTR), ("FALLBACK_LRU", FALLBACK_LRU_CNTR),
                          ("XDP_TOTAL", XDP_TOTAL_CNTR), ("XDP_TX", XDP_TX_CNTR), ("XDP_DROP", XDP_DROP_CNTR),
                          ("XDP_PASS", XDP_PASS_CNTR)):
            v1, v2 = self.counter(cid)
            out[f"{name}.v1"], out[f"{name}.v2"] = v1, v2
        return out

    def _stats(self, map_name: str, index: int) -> tuple[int, int]:
        vals = self._obj.map(map_name).lookup_percpu(index.to_bytes(4, "little")) or []
        return (sum(struct.unpack_from("<Q", v, 0)[0] for v in vals),
                sum(struct.unpack_from("<Q", v, 8)[0] for v in vals))

    def close(self) -> None:
        for link in self._links:
            link.close()  # type: ignore[attr-defined]
        self._links = []
        for m in self._inner:
            m.close()  # type: ignore[attr-defined]
        self._inner = []
        self._obj.close()

    def __enter__(self) -> Katran:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
