"""test_controller_bench.py: controller timings (ring builds, ring writes, a 100 × 100 apply) beside issue 4's targets.

Figures are printed with their targets and written as a `bench` result with controller figures;
they are never asserted (times on this shared 2-vCPU machine move between runs). Each figure is
the median of a few repetitions (L4LAB_CONTROLLER_BENCH_REPEATS, default 3). The datapath is
loaded but never attached, so no namespace is needed; pins go to a unique directory, removed after.
"""

from __future__ import annotations

import dataclasses
import functools
import ipaddress
import os
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from balancer import config as cfg
from balancer import controller, maglev
from balancer.controller import Instance
from balancer.datapath import Datapath
from lab.harness import unique_name
from reports.schema import BenchPayload, ControllerFigure, case_id, write_result

OBJ = Path(__file__).resolve().parents[2] / "build" / "bpf" / "balancer.o"
RING = 65537
BIG_RING = 655373
VIPS, REALS_PER_VIP = 100, 100


@dataclass(frozen=True)
class Figure:
    """One measured operation: its name, median milliseconds, the issue's target (None: none set), slots written."""

    name: str
    ms: float
    target_ms: float | None
    ring_slots: int | None = None


def repeats() -> int:
    raw = os.environ.get("L4LAB_CONTROLLER_BENCH_REPEATS", "3")
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"L4LAB_CONTROLLER_BENCH_REPEATS must be an integer ≥ 1 but got {raw!r}")
    return int(raw)


def median_ms(op: Callable[[], object], times: int) -> float:
    """Median wall time of `times` calls of op, in milliseconds."""
    samples = []
    for _ in range(times):
        t0 = time.perf_counter()
        op()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples) * 1e3


def real_address(vip: int, real: int) -> str:
    """A distinct IPv4 address per (VIP, real) in 10.0.0.0/8: every VIP has its own reals."""
    return str(ipaddress.IPv4Address(0x0A000000 + (vip << 8) + real + 1))


def reals_map(n: int) -> dict[int, tuple[str, int]]:
    return {i + 1: (real_address(i // 200, i % 200), 1) for i in range(n)}


def apply_config(bump: bool = False) -> cfg.Config:
    """VIPS VIPs × REALS_PER_VIP reals on 65537-slot rings; bump doubles one real's weight in VIP 0."""
    vips = []
    for v in range(VIPS):
        reals = tuple(cfg.Real(ipaddress.ip_address(real_address(v, r)), 2 if bump and v == 0 and r == 0 else 1)
                      for r in range(REALS_PER_VIP))
        vips.append(cfg.Vip(address=ipaddress.ip_address("198.51.100.100"), port=1000 + v, proto="tcp", reals=reals))
    return cfg.Config(
        datapath=cfg.DatapathConfig(ring_size=RING, max_vips=VIPS + 4, max_reals=VIPS * REALS_PER_VIP + 16,
                                    lru_size=1024, fallback_size=1024),
        encap=cfg.EncapConfig(nexthop_mac="02:00:00:00:00:01"),
        vips=tuple(vips),
    )


@pytest.fixture
def pinned_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Name: pinned_names. Scope: function. Depends: bpffs.

    A unique instance name whose pins and state go to test-only roots; asserts the pins are gone after.
        def test_x(pinned_names: str) -> None: Instance.load(pinned_names, [], ...)
    """
    name = unique_name("tbench", 4)
    monkeypatch.setattr(controller, "PIN_ROOT", "/sys/fs/bpf/lbctl-test")
    monkeypatch.setattr(controller, "STATE_ROOT", str(tmp_path / "state"))
    yield name
    assert not Path(Instance.pin_dir(name)).exists(), f"{name}: pins left behind"


def _uncached_build(reals: dict[int, tuple[str, int]], size: int) -> None:
    maglev.clear_cache()  # the figure is the fill, not a cache hit
    maglev.build_ring(reals, size)


def ring_figures(n_repeats: int) -> list[Figure]:
    figures = []
    for size in (RING, BIG_RING):
        for n in (10, 100, 1000):
            reals = reals_map(n)
            ms = median_ms(functools.partial(_uncached_build, reals, size), n_repeats)
            target = 20.0 if (n, size) == (1000, RING) else None
            figures.append(Figure(f"Maglev ring build, {n} reals, {size} slots", ms, target))
    return figures


def ring_write_figures(n_repeats: int) -> list[Figure]:
    """A whole 65537-slot ring written with Datapath.write_ring, then a one-real change (diff + slots)."""
    reals = reals_map(100)
    ring = maglev.build_ring(reals, RING)
    changed = dict(reals)
    changed[1] = (changed[1][0], 2)
    new_ring = maglev.build_ring(changed, RING)
    ring_list = [int(v) for v in ring]
    with Datapath.load(str(OBJ), max_vips=4, max_reals=256, ring_size=RING, lru_size=1024,
                       fallback_size=1024) as dp:
        whole = median_ms(lambda: dp.write_ring(0, ring_list), n_repeats)
        assert dp.ring(0) == ring_list, "the whole ring must read back as written"
        samples: list[float] = []
        slots_written = 0
        for _ in range(n_repeats):
            dp.write_ring(0, ring_list)  # back to the old ring, untimed
            t0 = time.perf_counter()
            idx, vals = maglev.ring_diff(ring, new_ring)
            dp.write_ring_slots(0, [int(i) for i in idx], [int(v) for v in vals])
            samples.append(time.perf_counter() - t0)
            slots_written = len(idx)
        assert np.array_equal(np.array(dp.ring(0), dtype=np.uint32), new_ring), "the changed ring must read back"
    return [Figure(f"write whole ring, {RING} slots", whole, 50.0, RING),
            Figure("one-real change: ring_diff + write_ring_slots", statistics.median(samples) * 1e3, 5.0,
                   slots_written)]


def apply_figures(name: str) -> list[Figure]:
    """Instance.apply of VIPS × REALS_PER_VIP from empty, then a one-real weight change (rings rebuilt by apply)."""
    full = apply_config()
    empty = dataclasses.replace(full, vips=())
    inst = Instance.load(name, [], config=empty, obj=str(OBJ))
    try:
        t0 = time.perf_counter()
        full_report = inst.apply(full)
        t_full = (time.perf_counter() - t0) * 1e3
        t0 = time.perf_counter()
        one_report = inst.apply(apply_config(bump=True))
        t_one = (time.perf_counter() - t0) * 1e3
        st = inst.state
        vip0 = apply_config(bump=True).vips[0]
        want = maglev.build_ring({st.real_ids[str(r.address)]: (str(r.address), r.weight) for r in vip0.reals}, RING)
        got = np.array(inst.dp.ring(st.vip_nums[vip0.name]), dtype=np.uint32)
        assert np.array_equal(got, want), f"{vip0.name}: the ring in the map must be the changed config's ring"
        services = [k for k in inst.dp.vips() if k[1] != 0]  # (address, 0, 0) is the address-only entry
        assert len(services) == VIPS, f"every VIP must be in the datapath after apply: {len(services)}"
    finally:
        inst.unload()
    assert full_report.ring_slots == VIPS * RING, f"the full apply must write every ring: {full_report}"
    assert 0 < one_report.ring_slots < RING, f"the one-real change must write part of one ring: {one_report}"
    return [Figure(f"apply {VIPS} VIPs × {REALS_PER_VIP} reals from empty", t_full, 2000.0, full_report.ring_slots),
            Figure("apply one-real weight change after it", t_one, None, one_report.ring_slots)]


def table(figures: list[Figure]) -> str:
    lines = [f"{'operation':<52} {'ms':>9} {'target':>9}  {'slots':>8}"]
    for f in figures:
        target = f"≤ {f.target_ms:.0f}" if f.target_ms is not None else "-"
        verdict = "" if f.target_ms is None else ("  ok" if f.ms <= f.target_ms else "  MISSED")
        slots = "" if f.ring_slots is None else str(f.ring_slots)
        lines.append(f"{f.name:<52} {f.ms:>9.2f} {target:>9}  {slots:>8}{verdict}")
    return "\n".join(lines)


def test_controller_bench(pinned_names: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("loading BPF maps needs root")
    if not OBJ.exists():
        pytest.skip(f"{OBJ} missing: run make bpf")
    n = repeats()
    figures = ring_figures(n) + ring_write_figures(n) + apply_figures(pinned_names)
    print(f"\ncontroller bench: medians of {n} repetitions (apply: one run)\n" + table(figures))
    payload = BenchPayload(generator="test-run", egress_mtu=1500,
                           controller=[ControllerFigure(name=f.name, ms=round(f.ms, 3), ring_slots=f.ring_slots)
                                       for f in figures])
    path = write_result("bench", case_id("test_controller_bench"), payload)
    print(f"written {path}")
    assert all(f.ms > 0 for f in figures), f"every operation was timed: {figures}"
