"""A bench run's results file (reports/schema.py `bench`) and its printed summary, whatever generator ran it."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from lab.bench.gen.base import FrameSpec
from lab.bench.model import ENCAPS, TARGETS, Measured, Options, Report, size_label
from reports.schema import (
    BenchPayload,
    BenchPoint,
    ControllerFigure,
    Floor,
    LatencyFigure,
    MicroFigure,
    Nic,
    Trial,
    case_id,
    results_dir,
    write_result,
)


def latency_figures(m: Measured) -> list[LatencyFigure]:
    """The schema's latency figures of one search: share of PDR, the rate it ran at, min/avg/max µs."""
    figures = []
    for key, lat in sorted(m.latency.items(), key=lambda kv: int(kv[0].rstrip("%"))):
        share = int(key.rstrip("%"))
        figures.append(LatencyFigure(share_of_pdr=share, rate_mpps=m.result.pdr_pps * share / 100 / 1e6,
                                     min_us=lat.min_us, avg_us=lat.avg_us, max_us=lat.max_us,
                                     p50_us=lat.p50_us, p99_us=lat.p99_us))
    return figures


def bench_payload(report: Report, sizes: Sequence[FrameSpec], encaps: Sequence[str]) -> BenchPayload:
    points = []
    for size in sizes:
        label = size_label(size)
        tx, drop = report.ndr.get(("xdp_tx", label)), report.ndr.get(("xdp_drop", label))
        floor = Floor(xdp_tx_mpps=tx.result.ndr_pps / 1e6 if tx else 0.0,
                      xdp_drop_mpps=drop.result.ndr_pps / 1e6 if drop else 0.0)
        for case in encaps:
            m = report.ndr.get((case, label))
            if m is None:
                continue
            trials = [Trial(rate_mpps=t.rate_pps / 1e6, loss=t.loss, duration_s=t.duration_s)
                      for t in m.result.trials]
            points.append(BenchPoint(encap=case, frame_size=size, ndr_mpps=m.result.ndr_pps / 1e6,  # type: ignore[arg-type]
                                     pdr_mpps=m.result.pdr_pps / 1e6, floor=floor,
                                     egress_overhead_bytes=ENCAPS[case].overhead, trials=trials,
                                     latency=latency_figures(m)))
    micro = [MicroFigure(case=name, ns_per_packet=round(ns, 2)) for name, ns in report.micro_ns.items()]
    controller = []
    if report.controller:
        for n, ms in report.controller["ring_build_ms"].items():
            controller.append(ControllerFigure(name=f"Maglev ring build, {n} reals", ms=round(ms, 3)))
        for key, label in (("full_apply", "full apply"), ("incremental_apply", "incremental apply")):
            fig = report.controller[key]
            controller.append(ControllerFigure(name=label, ms=round(fig["ms"], 3), ring_slots=fig["ring_slots"]))
    return BenchPayload(generator=report.generator, egress_mtu=report.egress_mtu, points=points,  # type: ignore[arg-type]
                        micro=micro, controller=controller, nic=Nic(**report.nic) if report.nic else None)


def summary_lines(report: Report, opts: Options) -> list[str]:
    """The figures with the XDP_TX-floor ratio and the target beside them."""
    lines: list[str] = []
    if report.ndr:
        lines.append(f"{'case':<11} {'size':>5} {'NDR Mpps':>9} {'PDR Mpps':>9} {'÷ XDP_TX':>9} "
                     f"{'target':>7}  met")
        for size in opts.sizes:
            label = size_label(size)
            tx = report.ndr.get(("xdp_tx", label))
            floor = tx.result.ndr_pps if tx else 0.0
            for name in ("xdp_drop", "xdp_tx", *opts.encaps):
                m = report.ndr.get((name, label))
                if m is None:
                    continue
                ratio = m.result.ndr_pps / floor if floor else float("nan")
                goal = TARGETS.get(name)
                target = f"{goal:.2f}" if goal else "-"
                met = ("yes" if ratio >= goal else "no") if goal and floor else "-"
                lines.append(f"{name:<11} {label:>5} {m.result.ndr_pps / 1e6:9.3f} "
                             f"{m.result.pdr_pps / 1e6:9.3f} {ratio:9.2f} {target:>7}  {met}")
        with_latency = [(key, m) for key, m in report.ndr.items() if m.latency]
        if with_latency:
            lines.append("latency (µs, min/avg/max) at 10/50/90 % of PDR:")
        for (name, label), m in with_latency:
            lines.append(f"  {name:<11} {label:>5}  " + "   ".join(
                f"{share} {lat.min_us:.1f}/{lat.avg_us:.1f}/{lat.max_us:.1f}" for share, lat in m.latency.items()))
    if report.micro_ns:
        tx_ns = report.micro_ns.get("xdp_tx", 0.0)
        lines.append("test-run micro-benchmark, 64-byte frames, repeat = 1:")
        for name, ns in report.micro_ns.items():
            rel = f"  ({ns / tx_ns:.2f} × XDP_TX)" if tx_ns else ""
            lines.append(f"  {name:<11} {ns:8.1f} ns/packet{rel}")
    if report.controller:
        rb = report.controller["ring_build_ms"]
        lines.append("controller: Maglev ring (65537 slots) build " +
                     ", ".join(f"{n} reals {ms:.1f} ms" for n, ms in rb.items()))
        fa, ia = report.controller["full_apply"], report.controller["incremental_apply"]
        lines.append(f"  full apply ({fa['vips']} VIPs × {fa['reals']} reals) {fa['ms']:.1f} ms, "
                     f"{fa['ring_slots']} ring slots; incremental apply ({ia['change']}) {ia['ms']:.1f} ms, "
                     f"{ia['ring_slots']} ring slots")
    return lines


def write_results(report: Report, opts: Options) -> None:
    if report.ndr or report.micro_ns or report.controller:
        rid = case_id(opts.result_id, None, "quick") if opts.quick else case_id(opts.result_id)
        report.results_file = write_result("bench", rid, bench_payload(report, opts.sizes, opts.encaps),
                                           results_dir(opts.results))


def finish(report: Report, opts: Options, started: float, say: Callable[[str], None]) -> Report:
    """Print the summary, write the results file and say where and how long it took."""
    for line in summary_lines(report, opts):
        say(line)
    write_results(report, opts)
    if report.results_file is not None:
        say(f"wrote {report.results_file}")
    say(f"bench took {time.monotonic() - started:.0f} s (targets are printed, never asserted)")
    return report
