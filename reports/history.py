"""history.py: every result's figures by a name stable across runs, and the runs-and-trends section."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from markupsafe import Markup

from reports import svg, trend
from reports.bench import BenchPayload
from reports.churn import ChurnPayload
from reports.conformance import ConformancePayload
from reports.demo import DemoPayload
from reports.failover import FailoverPayload
from reports.page import (
    Cell,
    Section,
    Table,
    kind_section,
    short_commit,
    when,
)
from reports.pmtu import PmtuPayload
from reports.rss import RssPayload

if TYPE_CHECKING:
    from reports.schema import Result


def figures(result: Result) -> dict[str, float | str]:
    """The figures of one result by a name that is stable across runs (for trends and comparisons)."""
    out: dict[str, float | str] = {}
    p = result.payload
    if isinstance(p, BenchPayload) and p.side_by_side is not None:
        sbs = p.side_by_side
        for row in sbs.cases:
            key = f"versus {sbs.program} {row.encap or '-'} {row.case}"
            out[f"{key} l4lab (ns)"] = row.ns
            out[f"{key} {sbs.program} (ns)"] = row.other_ns
            if row.ratio_above_floor is not None:
                out[f"{key} l4lab ÷ {sbs.program} above the floor"] = row.ratio_above_floor
        for z in sbs.sizes:
            out[f"versus {sbs.program} {z.encap} verified insns l4lab"] = float(z.verified_insns)
            out[f"versus {sbs.program} {z.encap} verified insns {sbs.program}"] = float(z.other_verified_insns)
        tx_loop = next((lc.cpu_ns_per_frame for lc in sbs.loop if lc.program == "xdp_tx"), 0.0)
        for lc in sbs.loop:
            if lc.encap and lc.cpu_ns_per_frame > 0 and tx_loop > 0:
                what = lc.encap if lc.traffic == "udp-flows" else f"{lc.encap} {lc.traffic}"
                out[f"versus {sbs.program} {what} 64 B live loop floor ÷ {lc.program} (CPU ns)"] = round(
                    tx_loop / lc.cpu_ns_per_frame, 4)
        for f in sbs.syn_flood:
            if f.floor_xdp_tx_mpps > 0:
                out[f"versus {sbs.program} {f.encap} syn-flood live NDR ÷ XDP_TX floor {f.program}"] = round(
                    f.ndr_mpps / f.floor_xdp_tx_mpps, 4)
        for pt in p.points:
            key = f"versus {sbs.program} {pt.encap} {pt.frame_size} B live NDR ÷ XDP_TX floor"
            if pt.floor.xdp_tx_mpps > 0:
                out[f"{key} l4lab"] = round(pt.ndr_mpps / pt.floor.xdp_tx_mpps, 4)
                for v in pt.versus:
                    out[f"{key} {v.program}"] = round(v.ndr_mpps / pt.floor.xdp_tx_mpps, 4)
    elif isinstance(p, BenchPayload):
        for pt in p.points:
            key = f"bench {p.generator} {pt.encap} {pt.frame_size} B"
            out[f"{key} NDR (Mpps)"] = pt.ndr_mpps
            out[f"{key} PDR (Mpps)"] = pt.pdr_mpps
            if pt.floor.xdp_tx_mpps > 0:
                out[f"{key} NDR ÷ XDP_TX floor"] = round(pt.ndr_mpps / pt.floor.xdp_tx_mpps, 4)
            for v in pt.versus:
                out[f"{key} {v.program} NDR (Mpps)"] = v.ndr_mpps
        for m in p.micro:
            out[f"micro {m.case} (ns/packet)"] = m.ns_per_packet
        for c in p.controller:
            out[f"controller {c.name} (ms)"] = c.ms
    elif isinstance(p, DemoPayload):
        for e in p.encaps:
            out[f"demo {e.encap} answered"] = f"{e.ok}/{e.requests}"
            out[f"demo {e.encap} DSR"] = "held" if e.lb_saw_only_client_to_vip else "broken"
            for s in e.spread:
                out[f"demo {e.encap} spread {s.name} max÷mean"] = s.max_over_mean
            if e.pmtu is not None:
                out[f"demo {e.encap} PMTU learnt"] = float(e.pmtu.learnt_mtu or 0)
            if e.churn is not None:
                out[f"demo {e.encap} churn collateral"] = float(e.churn.collateral)
                out[f"demo {e.encap} churn reset"] = f"{e.churn.reset}/{e.churn.on_removed}"
    elif isinstance(p, RssPayload):
        for rss in p.scenarios:
            out[f"rss {result.id} {rss.name} ({rss.source}) max÷mean"] = rss.max_over_mean
    elif isinstance(p, PmtuPayload):
        for sc in p.scenarios:
            out[f"pmtu {result.id} {sc.name}"] = "completed" if sc.completed else "failed"
            if sc.route_mtu is not None:
                out[f"pmtu {result.id} {sc.name} route MTU"] = float(sc.route_mtu)
    elif isinstance(p, ChurnPayload):
        for churn in p.points:
            out[f"churn {result.test} N={churn.n} slots changed"] = float(churn.slots_changed)
    elif isinstance(p, FailoverPayload):
        out[f"failover {result.id} (s)"] = p.failover_seconds
    elif isinstance(p, ConformancePayload):
        out[f"conformance {p.test} {p.encap}"] = p.outcome
    return out


@kind_section(
    "history",
    "Runs and trends",
    "Every run is kept. The newest run per machine and generator, then every numeric figure measured "
    "at two or more commits: its value at each commit (newest run per commit, oldest first; hover a dot; a red "
    "mark starts a change beyond the noise, found by FD.io CSIT's jumpavg), the first and the latest value and "
    "the change.",
)
def section(section: Section, results: list[Result]) -> bool:
    if not results:
        return False
    runs: dict[tuple[str, str], Result] = {}
    counts: dict[tuple[str, str], int] = {}
    for r in results:
        gen = r.payload.generator if isinstance(r.payload, BenchPayload) else f"({r.kind.value})"
        key = (r.machine.hostname, gen)
        counts[key] = counts.get(key, 0) + 1
        if key not in runs or r.time >= runs[key].time:
            runs[key] = r
    section.tables.append(Table(
        "Newest run per machine and generator",
        ["machine", "generator or kind", "commit", "time", "result", "results kept"],
        [[Cell(f"{r.machine.hostname} (kernel {r.machine.kernel}, {r.machine.cpus} CPUs)", "key"), Cell(gen),
          Cell(short_commit(r.commit)), Cell(when(r)), Cell(r.id), Cell(str(counts[(host, gen)]), "num")]
         for (host, gen), r in sorted(runs.items())]))
    series: dict[str, dict[str, tuple[datetime, float]]] = {}
    for r in results:
        for name, value in figures(r).items():
            if isinstance(value, float | int):
                figure = f"{name} — {r.machine.hostname}"
                seen = series.setdefault(figure, {})
                if r.commit not in seen or r.time >= seen[r.commit][0]:
                    seen[r.commit] = (r.time, float(value))
    trend_rows = []
    for name, by_commit in sorted(series.items()):
        if len(by_commit) < 2:
            continue
        ordered = sorted(by_commit.items(), key=lambda kv: kv[1][0])
        first, last = ordered[0][1][1], ordered[-1][1][1]
        change = (last - first) / first * 100 if first else math.nan
        marks = set(trend.change_points([v for _, (_, v) in ordered]))
        spark = svg.sparkline(name, [(v, f"{short_commit(c)} ({t.astimezone(UTC):%Y-%m-%d %H:%M}): {v:.4g}"
                                      + (" — a change beyond the noise (jumpavg)" if i in marks else ""))
                                     for i, (c, (t, v)) in enumerate(ordered)], marks=marks)
        trend_rows.append([Cell(name), Cell(str(len(ordered)), "num"),
                           Cell(" ".join(f"{v:.4g}" for _, (_, v) in ordered), html=Markup(spark)),  # noqa: S704
                           Cell(f"{first:.4g}", "num"), Cell(f"{last:.4g}", "num"),
                           Cell(f"{change:+.1f} %" if math.isfinite(change) else "–", "num")])
    if trend_rows:
        section.tables.append(Table("Trend per figure over commits",
                                    ["figure — machine", "commits", "trend", "first", "latest", "change"], trend_rows))
    else:
        section.notes.append("No figure was measured at two commits yet: trends appear once results of a second "
                             "commit are in the results directory.")
    return True
