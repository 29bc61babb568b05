"""history.py: every result's figures by a name stable across runs, and the runs-and-trends section."""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from reports import bench, charts, churn, conformance, demo, failover, pmtu, rss, trend
from reports.bench import BenchPayload
from reports.churn import ChurnPayload
from reports.conformance import ConformancePayload
from reports.demo import DemoPayload
from reports.failover import FailoverPayload
from reports.page import Cell, Section, Table, kind_section, short_commit, when
from reports.pmtu import PmtuPayload
from reports.rss import RssPayload

if TYPE_CHECKING:
    from reports.schema import Result


# Each kind's figures, by its payload class; the kinds without (corpus, fuzz) have none to trend.
_FIGURES: dict[type, Callable[[Result, Any], dict[str, float | str]]] = {
    BenchPayload: bench.figures,
    DemoPayload: demo.figures,
    RssPayload: rss.figures,
    PmtuPayload: pmtu.figures,
    ChurnPayload: churn.figures,
    FailoverPayload: failover.figures,
    ConformancePayload: conformance.figures,
}


def figures(result: Result) -> dict[str, float | str]:
    """The figures of one result by a name that is stable across runs (for trends and comparisons)."""
    of = _FIGURES.get(type(result.payload))
    return of(result, result.payload) if of is not None else {}


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
        spark = charts.sparkline(name, [(v, f"{short_commit(c)} ({t.astimezone(UTC):%Y-%m-%d %H:%M}): {v:.4g}"
                                         + (" — a change beyond the noise (jumpavg)" if i in marks else ""))
                                        for i, (c, (t, v)) in enumerate(ordered)], marks=marks)
        trend_rows.append([Cell(name), Cell(str(len(ordered)), "num"),
                           Cell(" ".join(f"{v:.4g}" for _, (_, v) in ordered), html=spark),
                           Cell(f"{first:.4g}", "num"), Cell(f"{last:.4g}", "num"),
                           Cell(f"{change:+.1f} %" if math.isfinite(change) else "–", "num")])
    if trend_rows:
        section.tables.append(Table("Trend per figure over commits",
                                    ["figure — machine", "commits", "trend", "first", "latest", "change"], trend_rows))
    else:
        section.notes.append("No figure was measured at two commits yet: trends appear once results of a second "
                             "commit are in the results directory.")
    return True
