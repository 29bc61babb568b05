"""`l4lab bench`: NDR/PDR per encap and frame size beside the floors, plus micro and controller benchmarks.

    l4lab bench [--quick] [--encap ID ...] [--sizes 64,512,imix] [--results DIR]
                [--parts ndr,micro,controller] [--flows N] [--max-rate-mpps X]
    l4lab bench --trex TARGET.toml [--quick] [--encap ID ...] [--sizes ...] [--flows N] [--results DIR]
                [--max-rate-mpps X]

The bench builds its own two-namespace testbed (prefix `bnt-`): a generator namespace whose veth
leads into an LB namespace. The live-frames generator sends UDP flows to a VIP; the program on
the LB veth (the balancer, or a floor program) XDP_TXes each frame back over the same veth pair,
where a counting XDP program on the generator side counts and drops it (it is also the program the
XDP_TX peer rule needs). The XDP_DROP floor counts on the LB side instead. The floors and the
balancer are measured alike: the same generator, the same veths, the same counting sink.

On veth the whole loop runs in the sending thread: after each batch the test run re-enables
softirqs and the LB veth's NAPI (the program under test, its XDP_TX) and then the generator veth's
NAPI (the counter) run right there, on that CPU. Measured here: every frame sent arrives; a trial's
loss is what the paced sender could not send before its deadline. The NDR is therefore the rate
the sending threads sustain through generator, veths, LB program and sink, and it moves with the
CPU share other processes leave them; `l4lab bench --katran` also reports the loop's CPU time per
frame, which does not (lab/bench/katran.py). A trial that lost frames while a sending thread waited
for a CPU longer than the pacer's grace (the thread's run-queue wait, /proc/thread-self/schedstat) is
run again, at most twice; the summary counts those repeats. Both veth ends get one
receive queue per CPU, so each CPU's frames stay on that CPU from generator to counter (one shared
queue loses frames between two producing CPUs at any rate). Two idle veth pairs in the generator
namespace hold the generator's programs attached, which keeps each test run from re-patching the
kernel's XDP dispatcher (lab/bench/gen/xdplive.py says why that matters).

Per frame size, the floors (MAC-swap XDP_TX, XDP_DROP) and every encap are measured in the same
run by the same NDR/PDR search; the figures print with their ratio to the XDP_TX floor and the
target beside them (IPIP ≥ 0.85 ×, GUE ≥ 0.8 ×: printed, never asserted). Then the datapath
test-run micro-benchmark (ns/packet, repeat = 1 runs: repeat > 1 would feed each run the previous
output) and the controller benchmarks (Maglev ring builds, a full and an incremental apply).

Results: one `bench` result (reports/schema.py) with every point and trial, the micro figures and
the controller figures, and latency at 10/50/90 % of PDR where the generator measures it (TRex).

With `--trex TARGET.toml` the same NDR/PDR search runs on hardware instead: a TRex server and the
LB host a target file names, reached over SSH (lab/bench/trex.py).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from balancer import maglev
from balancer.controller import Instance
from balancer.encaps import IP4_IPIP
from lab.bench.gen.base import Endpoints, Family, build_frame, mean_frame_size
from lab.bench.model import (
    ENCAPS,
    GEN_MAC,
    LB_MAC,
    VIP4,
    VIP6,
    VIP_PORT,
    Options,
    Report,
    lb_config,
    ndr_point,
    real_addresses,
    repeats,
    size_label,
)
from lab.bench.results import finish
from lab.bench.testbed import PREFIX, Testbed, check_environment, live_generator, object_path, testbed
from lab.errors import LabError
from lab.progress import BenchProgress

XDP_TX = 3


def measure_ndr(bed: Testbed, opts: Options, report: Report, say: Callable[[str], None]) -> None:
    """Floors and every encap, per frame size, in this one run."""
    plan: list[tuple[str, str, Family]] = [("xdp_drop", "xdp_drop", 4), ("xdp_tx", "xdp_tx_swap", 4)]
    plan += [(case, "balancer", ENCAPS[case].vip_family) for case in opts.encaps]
    progress = BenchProgress(len(plan) * len(opts.sizes), opts.search_settings().max_trials)
    for size in opts.sizes:
        max_rate = opts.max_rate_pps * min(1.0, 256 / max(256.0, mean_frame_size(size)) * 2)
        for name, program, family in plan:
            bed.on_lb(program)
            if program == "balancer":
                bed.instance.apply(lb_config(name))
            sink = bed.lb_count if program == "xdp_drop" else bed.gen_count
            progress.start_point(name, size_label(size))
            with live_generator(bed, sink) as gen:
                measured = ndr_point(gen, name, size, opts.flows, family, opts.search_settings(max_rate),
                                     on_trial=progress.trial)
            progress.end_point()
            report.ndr[(name, size_label(size))] = measured
            outcome = measured.result
            say(f"  {name:<11} {size_label(size):>5}  NDR {outcome.ndr_pps / 1e6:6.3f} Mpps  "
                f"PDR {outcome.pdr_pps / 1e6:6.3f} Mpps  ({len(outcome.trials)} trials{repeats(measured)})")


def measure_micro(bed: Testbed, opts: Options, report: Report) -> None:
    """ns/packet of the balancer per encap and of the floors, from repeat = 1 test runs."""
    runs = 2000 if opts.quick else opts.micro_runs
    ep = Endpoints(src_mac=GEN_MAC, dst_mac=LB_MAC, dst4=VIP4, dst6=VIP6, dport=VIP_PORT)
    frame4 = build_frame(64, 4, ep)
    report.micro_ns["xdp_drop"] = _ns_per_packet(bed.lb_floor.program("xdp_drop"), frame4, runs, 1)
    report.micro_ns["xdp_tx"] = _ns_per_packet(bed.lb_floor.program("xdp_tx_swap"), frame4, runs, XDP_TX)
    bed.load_balancer()
    for case in opts.encaps:
        bed.instance.apply(lb_config(case))
        frame = build_frame(64, ENCAPS[case].vip_family, ep)
        report.micro_ns[case] = _ns_per_packet(bed.instance.dp.programs["balancer_xdp"], frame, runs, XDP_TX)


def _ns_per_packet(prog: Any, frame: bytes, runs: int, want: int) -> float:
    first = prog.test_run(frame)
    if first.retval != want:
        raise LabError(f"test run of '{prog.name}' on the bench frame returned action {first.retval}, "
                       f"expected {want}; check the balancer's reason counters (lbctl stats)")
    total = 0
    for _ in range(runs):
        total += prog.test_run(frame).duration_ns
    return total / runs


def measure_controller(opts: Options, report: Report) -> None:
    """Maglev ring builds for 10/100/1000 reals, a full apply and an incremental apply."""
    builds: dict[str, float] = {}
    for n in (10, 100, 1000):
        reals = {i + 1: (a, 1) for i, a in enumerate(real_addresses(4, n))}
        times = []
        for _ in range(1 if opts.quick else 3):
            maglev.clear_cache()  # the figure is the fill, not a cache hit
            t0 = time.perf_counter()
            maglev.build_ring(reals, maglev.DEFAULT_RING_SIZE)
            times.append(time.perf_counter() - t0)
        builds[str(n)] = min(times) * 1e3
    report.controller["ring_build_ms"] = builds
    vips, reals_n = 8, 100
    name = f"{PREFIX}{os.getpid()}-ctl"
    size: dict[str, Any] = {"max_vips": 16, "max_reals": 256}
    inst = Instance.load(name, [], config=lb_config(IP4_IPIP, vips=1, reals=1, **size),
                         obj=object_path("balancer.o"))
    try:
        full = lb_config(IP4_IPIP, vips=vips, reals=reals_n, **size)
        t0 = time.perf_counter()
        full_report = inst.apply(full)
        t_full = time.perf_counter() - t0
        t0 = time.perf_counter()
        inc_report = inst.apply(lb_config(IP4_IPIP, vips=vips, reals=reals_n, weight_bump=1, **size))
        t_inc = time.perf_counter() - t0
    finally:
        inst.unload()
    report.controller["full_apply"] = {"vips": vips, "reals": reals_n, "ms": t_full * 1e3,
                                       "ring_slots": full_report.ring_slots}
    report.controller["incremental_apply"] = {"change": "one real's weight 1 → 2 in one VIP",
                                              "ms": t_inc * 1e3, "ring_slots": inc_report.ring_slots}


# --- results and printing --------------------------------------------------------------------------


def bench(opts: Options, say: Callable[[str], None] = print) -> Report:
    """Run the parts asked for, print the summary, write the results; returns what was measured."""
    check_environment()
    report = Report()
    started = time.monotonic()
    if "ndr" in opts.parts or "micro" in opts.parts:
        with testbed() as bed:
            if "ndr" in opts.parts:
                say(f"NDR/PDR search ({'quick' if opts.quick else 'full'}), {opts.flows} flows:")
                measure_ndr(bed, opts, report, say)
            if "micro" in opts.parts:
                measure_micro(bed, opts, report)
    if "controller" in opts.parts:
        measure_controller(opts, report)
    return finish(report, opts, started, say)

