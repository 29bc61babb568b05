"""test_katran_compatible.py: a VIP with a katran hash sends every flow to the real Katran sends it to (issue 31).

l4lab's program is an lbctl instance (loaded, not attached) configured with `hash = "katran"` and its
variants; Katran's is its BPF balancer built from L4LAB_KATRAN_SRC (lab/dut/katran.py), given the
rings Katran's own control-plane code builds (lab/dut/katran_ring.py) for the same reals and weights,
under its own real numbers. Each of 10⁵ flows per main case (IPv4 and IPv6, Maglev V1 and V2, weights
1:10:3 with one real drained) and 2·10⁴ per hash variant (no source port, destination port only,
port-0 VIPs with and without Katran's F_HASH_SRC_DST_PORT) goes in as a TCP SYN to both programs;
the outer destinations must be the same, every one. The shares show what the rings do with weights:
V1 gives the 1:10:3 reals about 1:1:1, V2 about 1:10:3.

Without a Katran checkout those skip, saying so, and l4lab's program is still checked against the
model (balancer/katran_hash.py, itself checked against Katran by suites/controller/test_katran_hash.py),
flow by flow.
"""

from __future__ import annotations

import ctypes
import ipaddress
import random
import struct
import zlib
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass

import numpy as np
import pytest

from balancer import config as cfg
from balancer import controller, katran_hash, maglev
from balancer.controller import Instance
from balancer.datapath import Datapath
from balancer.libbpf import Program
from lab.checksum import inet_checksum
from lab.dut import katran, katran_ring
from lab.harness import unique_name

from . import packets as P
from .rig import BALANCER_OBJ, require_datapath

RING = katran_hash.DEFAULT_RING_SIZE
ETH = 14
XDP_TX = 3
FLOWS = 100_000          # per main case: IPv4 / IPv6 x Maglev V1 / V2
VARIANT_FLOWS = 20_000   # per hash variant
MODEL_FLOWS = 3_000      # per case, l4lab against the model alone (no Katran checkout)

REALS4 = (("203.0.113.18", 1), ("203.0.113.34", 10), ("203.0.113.50", 3), ("203.0.113.66", 0))
REALS6 = (("2001:db8:e1::2", 1), ("2001:db8:e2::2", 10), ("2001:db8:e3::2", 2))


@dataclass(frozen=True)
class Case:
    """One VIP: its address and port (0: every port), katran hash, ring and weighted reals."""

    id: str
    vip: str
    port: int
    hash: str
    ring: katran_hash.RingKind
    reals: tuple[tuple[str, int], ...]
    flows: int = FLOWS

    @property
    def v6(self) -> bool:
        return ":" in self.vip

    def backends(self, ids: dict[str, int]) -> list[maglev.Backend]:
        return [maglev.Backend(ids[a], a, w) for a, w in self.reals]


CASES = (
    Case("ip4-v1", "198.51.100.100", 80, "katran", "v1", REALS4),
    Case("ip4-v2", "198.51.100.100", 81, "katran", "v2", REALS4),
    Case("ip6-v1", "2001:db8:100::100", 80, "katran", "v1", REALS6),
    Case("ip6-v2", "2001:db8:100::100", 81, "katran", "v2", REALS6),
    Case("ip4-no-sport", "198.51.100.101", 80, "katran-no-sport", "v1", REALS4, VARIANT_FLOWS),
    Case("ip4-any-port", "198.51.100.102", 0, "katran", "v2", REALS4, VARIANT_FLOWS),
    Case("ip4-any-port-src-dst-port", "198.51.100.103", 0, "katran-src-dst-port", "v1", REALS4, VARIANT_FLOWS),
    Case("ip6-dport-only", "2001:db8:100::101", 0, "katran-dport-only", "v2", REALS6, VARIANT_FLOWS),
)


# -------------------------------------------------------------------------------------------- flows


def flows(case: Case, n: int, seed: int) -> Iterator[tuple[bytes, int, int]]:
    """n client flows (source address, source port, destination port) to the case's VIP."""
    rng = random.Random(seed)
    for _ in range(n):
        src = rng.getrandbits(128 if case.v6 else 32).to_bytes(16 if case.v6 else 4, "big")
        if case.v6:
            src = bytes.fromhex("20010db8000c") + src[6:]  # 2001:db8:c::/48
        yield src, rng.randrange(1024, 65536), case.port or rng.choice((53, 80, 443, 8080, rng.randrange(1, 65536)))


def syn(vip: bytes, src: bytes, sport: int, dport: int) -> bytes:
    """A client's TCP SYN frame, checksums computed."""
    tcp = struct.pack("!HHIIBBHHH", sport, dport, 1, 0, 5 << 4, 0x02, 64240, 0, 0)
    if len(vip) == 16:
        pseudo = src + vip + struct.pack("!I3xB", len(tcp), 6)
        tcp = tcp[:16] + struct.pack("!H", inet_checksum(pseudo + tcp)) + tcp[18:]
        ip = struct.pack("!IHBB", 6 << 28, len(tcp), 6, 64) + src + vip
        return bytes.fromhex("02000000000202000000000186dd") + ip + tcp
    pseudo = src + vip + struct.pack("!BBH", 0, 6, len(tcp))
    tcp = tcp[:16] + struct.pack("!H", inet_checksum(pseudo + tcp)) + tcp[18:]
    hdr = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(tcp), 1, 0x4000, 64, 6, 0, src, vip)
    ip = hdr[:10] + struct.pack("!H", inet_checksum(hdr)) + hdr[12:]
    return bytes.fromhex("0200000000020200000000010800") + ip + tcp


def outer_dst(prog: Program, frame: bytes) -> str:
    """The real a program sends the frame to (its IPIP / 6in6 outer destination), or its verdict."""
    res = prog.test_run(frame)
    if res.retval != XDP_TX:
        return f"verdict {res.retval}"
    if res.data[12:14] == b"\x86\xdd":
        return str(ipaddress.IPv6Address(res.data[ETH + 24: ETH + 40]))
    return str(ipaddress.IPv4Address(res.data[ETH + 16: ETH + 20]))


def model_real(case: Case, ring: maglev.Ring, by_id: dict[int, str], src: bytes, sport: int, dport: int) -> str:
    fields = katran_hash.fields_of(case.hash, case.port)
    return by_id[int(ring[katran_hash.ring_slot(katran_hash.flow_hash(ipaddress.ip_address(src), sport, dport,
                                                                      fields))])]


# ------------------------------------------------------------------------------------------ fixtures


def l4lab_config() -> cfg.Config:
    vips = tuple(cfg.Vip(address=ipaddress.ip_address(c.vip), port=c.port, proto="tcp", hash=c.hash,  # type: ignore[arg-type]
                         katran_ring=c.ring, reals=tuple(cfg.Real(ipaddress.ip_address(a), w) for a, w in c.reals))
                 for c in CASES)
    return cfg.Config(datapath=cfg.DatapathConfig(ring_size=RING, max_vips=len(CASES), max_reals=16, lru_size=256),
                      encap=cfg.EncapConfig(nexthop_mac="02:00:00:00:00:01"), vips=vips)


@pytest.fixture(scope="module")
def l4lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Instance]:
    """Name: l4lab. Scope: module. Depends: root, build/bpf/balancer.o, bpffs.

    An lbctl instance (loaded, not attached) serving every case's VIP with its katran hash::

        outer_dst(l4lab.dp.programs["balancer_xdp"], frame)
    """
    require_datapath()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(controller, "PIN_ROOT", "/sys/fs/bpf/lbctl-test")
        mp.setattr(controller, "STATE_ROOT", str(tmp_path_factory.mktemp("state")))
        inst = Instance.load(unique_name("kc", 4), [], config=l4lab_config(), obj=str(BALANCER_OBJ))
        try:
            yield inst
        finally:
            inst.unload()


def test_katran_compatible_l4lab_program_follows_the_model(l4lab: Instance) -> None:
    """l4lab's program, configured by lbctl with katran hashes, sends each flow where the model says."""
    prog = l4lab.dp.programs["balancer_xdp"]
    by_id = {rid: addr for addr, rid in l4lab.state.real_ids.items()}
    for case in CASES:
        ring = l4lab.dp.ring_array(l4lab.state.vip_nums[cfg_name(case)])
        assert np.array_equal(ring, katran_hash.build_ring(case.backends(l4lab.state.real_ids), RING, case.ring))
        vip = ipaddress.ip_address(case.vip).packed
        wrong = [(src.hex(), sp, dp) for src, sp, dp in flows(case, MODEL_FLOWS, seed=7)
                 if outer_dst(prog, syn(vip, src, sp, dp)) != model_real(case, ring, by_id, src, sp, dp)]
        assert wrong == [], f"{case.id}: {len(wrong)} of {MODEL_FLOWS} flows not where the model says: {wrong[:3]}"


def test_katran_compatible_icmp_errors_follow_the_flows_real(l4lab: Instance) -> None:
    """An ICMP error about a flow without a session is steered where Katran's hash sends the flow
    (forward_steered, forward()'s second copy, hashes as the TCP path does)."""
    prog = l4lab.dp.programs["balancer_xdp"]
    by_id = {rid: addr for addr, rid in l4lab.state.real_ids.items()}
    for case in CASES[:4]:  # IPv4, IPv6; V1, V2
        ring = l4lab.dp.ring_array(l4lab.state.vip_nums[cfg_name(case)])
        for src, sport, dport in flows(case, 200, seed=11):
            err = P.icmp_error_about(case.vip, str(ipaddress.ip_address(src)), vport=dport, cport=sport)
            assert outer_dst(prog, bytes(err)) == model_real(case, ring, by_id, src, sport, dport), (case.id, sport)


def test_katran_compatible_seeds_follow_katran_max_vips() -> None:
    """A Katran fleet built with another MAX_VIPS hashes with other seeds (datapath.katran_max_vips)."""
    require_datapath()
    seeds = katran_hash.Seeds(max_vips=128)
    with Datapath.load(str(BALANCER_OBJ), ring_size=RING, max_vips=2, max_reals=16, lru_size=64,
                       katran_max_vips=seeds.max_vips) as dp:
        dp.set_settings(nexthop_mac="02:00:00:00:00:01", src4="198.51.100.128/25", src6="2001:db8:1b:80::/64")
        moved = 0
        for num, case in enumerate(CASES[0:3:2]):  # ip4-v1, ip6-v1
            ids = {a: i + 1 + 4 * num for i, (a, _) in enumerate(case.reals)}
            for addr, rid in ids.items():
                dp.put_real(rid, addr)
            ring = katran_hash.build_ring(case.backends(ids), RING, case.ring)
            dp.write_ring(num, ring)
            vip = cfg.Vip(address=ipaddress.ip_address(case.vip), port=case.port, proto="tcp", hash="katran")
            dp.put_vip(case.vip, case.port, "tcp", vip_num=num, flags=controller.vip_flags(vip))
            by_id = {rid: a for a, rid in ids.items()}
            vip_bytes = ipaddress.ip_address(case.vip).packed
            for src, sport, dport in flows(case, MODEL_FLOWS, seed=3):
                h = katran_hash.flow_hash(ipaddress.ip_address(src), sport, dport, seeds=seeds)
                got = outer_dst(dp.programs["balancer_xdp"], syn(vip_bytes, src, sport, dport))
                assert got == by_id[int(ring[katran_hash.ring_slot(h)])], (case.id, src.hex(), sport)
                moved += got != model_real(case, ring, by_id, src, sport, dport)
    assert moved > MODEL_FLOWS // 2, "the seeds changed no flow's real: katran_max_vips did not reach the datapath"


def cfg_name(case: Case) -> str:
    host = f"[{case.vip}]" if case.v6 else case.vip
    return f"{host}:{case.port}/tcp"


# ------------------------------------------------------------------------------------ against Katran


def katran_numbers() -> dict[str, int]:
    """Katran's own numbers for the reals: not l4lab's ids (labels must not matter), shared by VIPs."""
    addrs = sorted({a for c in CASES for a, _ in c.reals}, key=lambda a: ipaddress.ip_address(a).packed, reverse=True)
    return {a: i + 1 for i, a in enumerate(addrs)}


@pytest.fixture(scope="module")
def katran_balancer(katran_checkout: katran.Checkout, katran_ring_code: ctypes.CDLL,
                    tmp_path_factory: pytest.TempPathFactory) -> Iterator[katran.Katran]:
    """Name: katran_balancer. Scope: module. Depends: katran_checkout, katran_ring_code, root.

    Katran's BPF balancer (IPIP build, not attached) with every case's VIP and its hash flags, the reals
    under Katran's own numbers, and the rings Katran's ring code builds for them::

        outer_dst(katran_balancer.program, frame)
    """
    require_datapath()
    obj = katran.build(katran_checkout, "ipip", tmp_path_factory.mktemp("katran"))
    with ExitStack() as stack:
        kt = stack.enter_context(katran.Katran(obj, lru_size=1024, vips=len(CASES)).load())
        kt.set_router_mac("02:00:00:00:00:01")
        nums = katran_numbers()
        for addr, num in nums.items():
            kt.add_real(num, addr)
        for vip_num, case in enumerate(CASES):
            kt.add_vip(case.vip, case.port, 6, vip_num, flags=katran_hash.KATRAN_FLAGS[case.hash])
            kt.set_ring(vip_num, list(katran_ring.ring(katran_ring_code, case.backends(nums), RING, case.ring)))
        yield kt


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_katran_compatible_flows_reach_the_real_katran_picks(case: Case, l4lab: Instance,
                                                            katran_balancer: katran.Katran) -> None:
    """Every flow: Katran's program and l4lab's (hash = katran) send its SYN to the same real."""
    ours, theirs = l4lab.dp.programs["balancer_xdp"], katran_balancer.program
    vip = ipaddress.ip_address(case.vip).packed
    reached: Counter[str] = Counter()
    differ: list[tuple[str, int, int, str, str]] = []
    for src, sport, dport in flows(case, case.flows, seed=zlib.crc32(case.id.encode())):
        frame = syn(vip, src, sport, dport)
        a, b = outer_dst(ours, frame), outer_dst(theirs, frame)
        reached[b] += 1
        if a != b:
            differ.append((src.hex(), sport, dport, a, b))
    weights = dict(case.reals)
    print(f"\n{case.id}: {case.flows} flows, {case.hash}, Maglev {case.ring}; per real (weight: flows) "
          f"{ {a: (weights.get(a), n) for a, n in sorted(reached.items())} }; {len(differ)} differ")
    assert differ == [], f"{len(differ)} of {case.flows} flows reach another real than Katran's: {differ[:5]}"
    assert set(reached) == {a for a, w in case.reals if w > 0}, "a live real got no flow, or a drained one got some"
    light, heavy = (reached[a] for a, w in sorted(case.reals, key=lambda r: r[1]) if w in (1, 10))
    if case.ring == "v1" and case.hash == "katran":  # V1: a weight is a first-round head start, 1:10 gives ~1:1
        assert 0.8 < heavy / light < 1.25, (light, heavy)
    elif case.ring == "v2" and case.hash == "katran":  # V2: in proportion
        assert 9 < heavy / light < 11, (light, heavy)
