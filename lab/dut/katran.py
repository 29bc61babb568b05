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
import json
import os
import shutil
import socket
import struct
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from balancer import encaps, maglev
from balancer.katran_hash import RingKind
from balancer.libbpf import BpfObject, Map, MapType, num_possible_cpus
from lab.dut.base import Capability, Dut, HealthCheck, LabLike, LbLink
from lab.errors import LabError
from lab.lbconf import lb_link
from lab.nsexec import entered
from lab.topology import Topology

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


def build(checkout: Checkout, flavour: str = "ipip", out_dir: Path = BUILD_DIR,
          defines: Sequence[str] = ()) -> Path:
    """Compile Katran's balancer (clang to LLVM IR, llc to BPF, as Katran's own build does), with
    the flavour's flags and `defines` (further -D flags, e.g. ICMP_TOOBIG_GENERATION) too."""
    if flavour not in FLAVOURS:
        raise LabError(f"unknown Katran flavour {flavour!r}; use one of {', '.join(FLAVOURS)}")
    for tool in ("clang", "llc"):
        if shutil.which(tool) is None:
            raise LabError(f"building Katran needs {tool}; run `make deps` (it installs clang and llvm)")
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = "-".join([f"balancer-{flavour}", *(d.removeprefix("-D").replace("=", "").lower() for d in defines)])
    out = out_dir / f"{stem}.o"
    ir = out_dir / f"{stem}.ll"
    cflags = ["-I", str(checkout.root), "-D__KERNEL__", "-Wno-unused-value", "-Wno-pointer-sign",
              "-Wno-compare-distinct-pointer-types", "-w", "-O2", "-g", *FLAVOURS[flavour], *defines]
    steps = [["clang", *cflags, "-emit-llvm", "-S", "-c", str(checkout.root / SOURCE), "-o", str(ir)],
             ["llc", "-march=bpf", "-filetype=obj", str(ir), "-o", str(out)]]
    for argv in steps:
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            tail = " | ".join(done.stderr.strip().splitlines()[-3:])
            raise LabError(f"cannot build Katran ({' '.join([flavour, *defines])}) from {checkout.root}: "
                           f"{argv[0]} failed: {tail}",
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
        self.path = str(obj_path)
        self.lru_size = lru_size
        self._obj = BpfObject(self.path)
        self._inner: list[object] = []
        self._links: list[object] = []
        self._vips = vips

    def load(self) -> Katran:
        """Load the object (rings sized for `vips` VIPs), then give every CPU its session table."""
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

    def take_over(self, old: Katran) -> None:
        """Replace `old` on its interfaces: each of its XDP links is pointed at this object's program
        (atomic: no frame meets an interface without a program), then belongs to this object."""
        for link in old._links:
            link.update(self.program)  # type: ignore[attr-defined]
        self._links, old._links = self._links + old._links, []

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


# ---- Katran as a device under test ------------------------------------------------------------

ETH_HEADER = 14
RING_KIND: RingKind = "v1"  # KatranConfig's hashFunction default: Maglev (V1)


class KatranDut(Dut):
    """Katran's XDP balancer built from the user's checkout ($L4LAB_KATRAN_SRC), in native XDP on a
    lab LB node's link like l4lab; its maps programmed by our code (Katran's control plane is a C++
    library with folly, not built here), each VIP's ring written by Katran's own ring code
    (lab/dut/katran_ring.py: katran::Vip with Maglev V1, its control plane's default).

    Built per check where Katran has the feature behind a build flag (lab/dut/katran.toml): GUE
    (`GUE_ENCAP`) for a GUE encap, and for a check that needs the LB to answer too-big,
    `ICMP_TOOBIG_GENERATION` with `MAX_PCKT_SIZE` the LB link's MTU less the encapsulation (its
    default, 1514 bytes, lets a full-size frame through to be encapsulated past the MTU). Every
    other check runs the default build. A restart of the control plane loads and programs a new copy
    and swaps it in behind the XDP link, as KatranLb's start does (new maps: the LRU starts empty).
    """

    name = "katran"

    def __init__(self, lab: LabLike, workdir: Path, options: Mapping[str, str] | None = None,
                 node: str = "lb") -> None:
        super().__init__(lab, workdir, options)
        self.node = node
        self.checkout = Checkout.find(None)
        self.objects: dict[tuple[str, ...], Path] = {}
        self.ring_code: Any = None  # Katran's ring builder, compiled from the checkout
        self.katran: Katran | None = None
        self.flags: tuple[str, ...] = ()  # this check's build: (flavour, -D flags...)
        self._vips: list[tuple[str, int, int]] = []
        self._index: dict[str, int] = {}
        self._announced: list[str] = []

    def start(self) -> None:
        from lab.dut import katran_ring  # it imports BUILD_DIR and Checkout from here: a cycle at the top

        self._object(("ipip",))  # a checkout that does not build fails here, before any check runs
        self.ring_code = katran_ring.build(self.checkout, self.workdir / "katran")

    def stop(self) -> None:
        if self.katran is not None:
            self.katran.close()
            self.katran = None

    def build_info(self) -> str:
        head = subprocess.run(["git", "-C", str(self.checkout.root), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=False).stdout.strip() or "unknown commit"
        flags = " ".join(FLAVOURS[self.flags[0]] + self.flags[1:]) if self.flags else "not built yet"
        return f"Katran {head} from {self.checkout.root}; this check's build: {flags or 'default flags'}"

    def _object(self, flags: tuple[str, ...]) -> Path:
        if flags not in self.objects:
            self.objects[flags] = build_object(self.checkout, flags, self.workdir / "katran")
        return self.objects[flags]

    def _build_for(self, encap_id: str) -> tuple[str, ...]:
        """(flavour, -D flags...) for this check: GUE for a GUE encap; too-big answers if it needs them."""
        case = encaps.by_id(encap_id)
        flags: tuple[str, ...] = ("gue" if case.gue else "ipip",)
        if Capability.PMTU_GENERATION in self.wanted:
            mtu = link_mtu(self.lab.topology, self.node)
            flags += ("-DICMP_TOOBIG_GENERATION", f"-DMAX_PCKT_SIZE={ETH_HEADER + mtu - case.overhead}")
        return flags

    def _new(self) -> Katran:
        """A copy of this check's build loaded, its next hop and GUE sources set, not attached yet."""
        kt = Katran(self._object(self.flags), lru_size=1 << 16, vips=len(self._vips)).load()
        try:
            _, router, router_if = lb_link(self.lab.topology, self.node)
            kt.set_router_mac(self.lab.mac(router, router_if))
            if self.flags[0] == "gue":
                kt.set_sources(*lb_sources(self.lab.topology, self.node))
            self._program(kt)
        except BaseException:
            kt.close()
            raise
        return kt

    def configure(self, encap_id: str, weights: Mapping[str, int] | None = None,
                  extra_ports: Sequence[tuple[int, str]] = (), healthcheck: HealthCheck | None = None) -> None:
        if healthcheck is not None:
            why = self.spec().reference(Capability.HEALTH_CHECKS)
            raise LabError(f"Katran has no health checks of its own ({why})")
        self._remember(encap_id, weights, extra_ports, healthcheck)
        protos = {"tcp": 6, "udp": 17}
        self._vips = [(str(v.address), port, protos[proto]) for v in self.lab.topology.vips
                      if v.address.version == self.family
                      for port, proto in [(p.port, p.proto) for p in v.ports] + list(self.extra_ports)]
        self._index = {n: i + 1 for i, n in enumerate(self.ordered(self.reals()))}
        # Load afresh for every configuration: sessions and VIP numbers start clean, as after a restart.
        self.stop()
        self.flags = self._build_for(encap_id)
        kt = self._new()
        try:
            with entered(self.lab.netns(self.node)):
                kt.attach(lb_link(self.lab.topology, self.node)[0], "native")
        except BaseException:
            kt.close()
            raise
        self.katran = kt

    def _program(self, kt: Katran) -> None:
        for node, index in self._index.items():
            kt.add_real(index, self.reals()[node])
        for num, (addr, port, proto) in enumerate(self._vips):
            kt.add_vip(addr, port, proto, num)
        self._write_rings(kt)

    def _write_rings(self, kt: Katran) -> None:
        """Every VIP's ring as Katran's control plane writes it for the reals and their weights."""
        from lab.dut import katran_ring  # it imports BUILD_DIR and Checkout from here: a cycle at the top

        members = [maglev.Backend(self._index[n], self.reals()[n], w) for n, w in self.weights.items()]
        ring = [int(r) for r in katran_ring.ring(self.ring_code, members, RING_SIZE, RING_KIND)]
        for num in range(len(self._vips)):
            kt.set_ring(num, ring)

    def _loaded(self) -> Katran:
        if self.katran is None:
            raise LabError("Katran is not loaded: configure() it first")
        return self.katran

    def set_weight(self, real: str, weight: int) -> None:
        self.weights[real] = weight
        self._write_rings(self._loaded())

    def remove_real(self, real: str) -> None:
        self.weights.pop(real, None)
        self._write_rings(self._loaded())

    def add_real(self, real: str, weight: int = 1) -> None:
        self.weights[real] = weight
        self._write_rings(self._loaded())

    def restart_control_plane(self, how: str = "crash") -> float:
        """A new copy loaded and programmed, then swapped in behind the XDP link (KatranLb's start:
        katran/lib/KatranLb.cpp attachBpfProgs, modifyXdpProg); the seconds the swap took."""
        old = self._loaded()
        started = time.monotonic()
        new = self._new()
        try:
            new.take_over(old)
        except BaseException:
            new.close()
            raise
        old.close()
        self.katran = new
        return time.monotonic() - started

    def forwarded(self) -> dict[str, int]:
        kt = self._loaded()
        return {n: kt.real_counter(i)[0] for n, i in self._index.items()}

    def link(self) -> LbLink:
        lb_if, router, router_if = lb_link(self.lab.topology, self.node)
        return LbLink(router, router_if, self.lab.mac(self.node, lb_if).lower())

    def announce(self, present: bool) -> None:
        """Add (or remove) the blackhole routes for the topology's VIPs in the LB node, which its bgpd
        announces (`network` with import-check, lab/frr.py): a fleet member in or out of ECMP."""
        for vip in self.lab.topology.vips:
            dst = f"{vip.address}/{vip.address.max_prefixlen}"
            verb = "replace" if present else "del"
            self.lab.run(self.node, ["ip", f"-{vip.address.version}", "route", verb, "blackhole", dst],
                         check=present)

    def evidence(self) -> str:
        if self.katran is None:
            return "katran is not loaded"

        lb_if = lb_link(self.lab.topology, self.node)[0]
        nic = self.lab.run(self.node, ["ethtool", "-S", lb_if], check=False).stdout
        xdp = [ln.strip() for ln in nic.splitlines() if "xdp" in ln and not ln.strip().endswith(": 0")]
        return json.dumps({"build": self.build_info(), "counters": self.katran.counters(),
                           "per_real": self.forwarded(), f"{lb_if} xdp counters (ethtool -S, non-zero)": xdp},
                          indent=1)


def build_object(checkout: Checkout, flags: tuple[str, ...], out_dir: Path) -> Path:
    """Katran's object for (flavour, -D flags...)."""
    return build(checkout, flags[0], out_dir, defines=flags[1:])


def link_mtu(topo: Topology, node: str) -> int:
    """The MTU of `node`'s link (its LB link)."""
    for link in topo.links:
        if node in (link.a.node, link.b.node):
            return int(link.mtu)
    raise LabError(f"topology '{topo.name}' gives node '{node}' no link")


def lb_sources(topo: Topology, node: str) -> tuple[str, str | None]:
    """The LB node's own IPv4 and IPv6 addresses: GUE's outer sources (pckt_srcs)."""
    addrs = [a for link in topo.links for ep in link.endpoints if ep.node == node for a in ep.addresses]
    return next(str(a.ip) for a in addrs if a.version == 4), next((str(a.ip) for a in addrs if a.version == 6), None)
