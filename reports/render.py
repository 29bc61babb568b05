"""The HTML report: results files in, one self-contained page out (charts inlined as base64 PNG).

    l4lab report [--results DIR] [--out FILE]     # the lead's CLI calls main(argv)
    python -m reports.render --results DIR --out FILE

The page reads only results files (reports.schema). Each kind has a section; a kind with no
results keeps its section and says "no results of this kind". Charts are drawn by matplotlib's
Agg canvas on Figure objects (no pyplot, no global state), tables are lists of cells, and the
Jinja2 template only lays them out.
"""

from __future__ import annotations

import argparse
import base64
import io
import math
import sys
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jinja2
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, NullLocator

from reports.schema import (
    ENCAP_IDS,
    BenchPayload,
    ChurnPayload,
    ConformancePayload,
    CorpusPayload,
    DemoPayload,
    FailoverPayload,
    FuzzPayload,
    PmtuPayload,
    Result,
    ResultsError,
    RssPayload,
    load_results,
    of_kind,
    results_dir,
)

__all__ = ["DEFAULT_OUT", "NO_RESULTS", "main", "render", "render_html"]

DEFAULT_OUT = Path(__file__).resolve().parent / "out" / "index.html"
NO_RESULTS = "no results of this kind"
_TEMPLATES = Path(__file__).resolve().parent / "templates"
_ENCAP_COLOURS = dict(
    zip(ENCAP_IDS, ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b"), strict=True)
)


@dataclass(frozen=True)
class Chart:
    """One image: its title (also drawn in the image), alt text and data: URI."""

    title: str
    alt: str
    src: str


@dataclass(frozen=True)
class Cell:
    text: str
    css: str = ""
    hint: str = ""  # shown on hover


@dataclass(frozen=True)
class Table:
    caption: str
    header: list[str]
    rows: list[list[Cell]]


@dataclass
class Section:
    """One kind's part of the page; ``empty`` sections print the no-results notice."""

    id: str
    title: str
    intro: str
    charts: list[Chart] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    empty: bool = False


# --- drawing ------------------------------------------------------------------------------------


def _figure(width: float = 8.0, height: float = 4.2) -> Figure:
    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _chart(fig: Figure, title: str, alt: str) -> Chart:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    encoded = base64.b64encode(buffer.getvalue()).decode("ascii")
    return Chart(title=title, alt=alt, src=f"data:image/png;base64,{encoded}")


def _fmt(value: float, digits: int = 2) -> str:
    return f"{value:.{digits}f}"


def _p(value: float, equals: str = "") -> str:
    """A p-value for people: tiny ones as an upper bound."""
    return "< 1e-6" if value < 1e-6 else f"{equals}{value:.3g}"


def _latest(frame: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Rows of ``frame`` keeping only the newest (column ``time``) per key; ties go to the later row."""
    return frame.sort_values("time", kind="stable").drop_duplicates(keys, keep="last")


def _size_order(size: Any) -> tuple[int, float]:
    return (1, 0.0) if size == "imix" else (0, float(size))


# --- sections -----------------------------------------------------------------------------------


def _demo(results: list[Result]) -> Section:
    section = Section(
        "demo",
        "Demo: real traffic in every encap",
        "Requests sent through the lab by the demo (make demo), the reals that answered, and whether "
        "the LB saw only client→VIP packets (direct server return).",
    )
    rows = [
        {
            "time": r.time,
            "encap": e.encap,
            "requests": e.requests,
            "ok": e.ok,
            "reals": e.reals_seen,
            "dsr": e.lb_saw_only_client_to_vip,
        }
        for r, p in of_kind(results, DemoPayload)
        for e in p.encaps
    ]
    if not rows:
        section.empty = True
        return section
    frame = _latest(pd.DataFrame(rows), ["encap"])
    table_rows = []
    for row in frame.sort_values("encap", key=lambda s: s.map(_encap_rank)).itertuples():
        table_rows.append(
            [
                Cell(row.encap, "key"),
                Cell(str(row.requests), "num"),
                Cell(str(row.ok), "num " + ("ok" if row.ok == row.requests else "bad")),
                Cell(", ".join(row.reals) or "none", "" if row.reals else "bad"),
                Cell("yes" if row.dsr else "no", "ok" if row.dsr else "bad"),
            ]
        )
    section.tables.append(
        Table(
            "Requests per encap",
            ["encap", "requests", "answered", "reals seen", "LB saw only client→VIP"],
            table_rows,
        )
    )
    return section


def _encap_rank(encap: str) -> int:
    return ENCAP_IDS.index(encap) if encap in ENCAP_IDS else len(ENCAP_IDS)


def _micro_and_controller(section: Section, results: list[Result]) -> None:
    """Tables of the newest run's test-run micro-benchmark and controller figures, if any."""
    with_micro = [(r, p) for r, p in of_kind(results, BenchPayload) if p.micro]
    with_controller = [(r, p) for r, p in of_kind(results, BenchPayload) if p.controller]
    if with_micro:
        _, payload = max(with_micro, key=lambda rp: rp[0].time)
        tx = next((m.ns_per_packet for m in payload.micro if m.case in ("xdp_tx", "floor-xdp_tx")), 0.0)
        section.tables.append(Table(
            "Test-run micro-benchmark (64-byte frames, repeat = 1; ns include the timer's own cost)",
            ["path", "ns per packet", "÷ XDP_TX"],
            [[Cell(m.case, "key"), Cell(_fmt(m.ns_per_packet, 1), "num"),
              Cell(_fmt(m.ns_per_packet / tx) if tx else "–", "num")] for m in payload.micro]))
    if with_controller:
        result, payload = max(with_controller, key=lambda rp: rp[0].time)
        section.tables.append(Table(
            f"Controller figures ({result.id})", ["operation", "ms", "ring slots written"],
            [[Cell(c.name, "key"), Cell(_fmt(c.ms, 1), "num"),
              Cell(str(c.ring_slots) if c.ring_slots is not None else "–", "num")] for c in payload.controller]))


def _bench(results: list[Result]) -> Section:
    section = Section(
        "bench",
        "Encapsulation comparison: throughput",
        "NDR (no loss) and PDR (≤ 0.5 % loss) of the balancer per encap and ingress frame size, from "
        "the NDR/PDR search, beside the machine's floor measured in the same run: a MAC-swap XDP_TX "
        "program and XDP_DROP. Compare ratios, not absolute rates: the spread between runs is ±20 %.",
    )
    rows = [
        {
            "time": r.time,
            "generator": p.generator,
            "egress_mtu": p.egress_mtu,
            "encap": pt.encap,
            "size": pt.frame_size,
            "ndr": pt.ndr_mpps,
            "pdr": pt.pdr_mpps,
            "tx": pt.floor.xdp_tx_mpps,
            "drop": pt.floor.xdp_drop_mpps,
            "overhead": pt.egress_overhead_bytes,
            "trials": len(pt.trials),
        }
        for r, p in of_kind(results, BenchPayload)
        for pt in p.points
    ]
    _micro_and_controller(section, results)
    if not rows:
        section.empty = not section.tables
        return section
    frame = _latest(pd.DataFrame(rows), ["encap", "size"])
    frame["ratio"] = [n / t if t > 0 else math.nan for n, t in zip(frame["ndr"], frame["tx"], strict=True)]
    sizes = sorted(set(frame["size"]), key=_size_order)
    encaps = sorted(set(frame["encap"]), key=_encap_rank)
    positions = {size: i for i, size in enumerate(sizes)}
    labels = [str(s) for s in sizes]

    fig = _figure()
    ax = fig.add_subplot()
    for encap in encaps:
        part = frame[frame["encap"] == encap].sort_values("size", key=lambda s: s.map(_size_order))
        ax.plot(
            [positions[s] for s in part["size"]],
            part["ratio"],
            marker="o",
            label=encap,
            color=_ENCAP_COLOURS.get(encap),
        )
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=1, label="XDP_TX floor")
    title = "NDR as a share of the XDP_TX floor, per encap"
    ax.set_title(title)
    ax.set_xticks(range(len(sizes)), labels)
    ax.set_xlabel("ingress frame size (bytes)")
    ax.set_ylabel("NDR ÷ XDP_TX floor (ratio)")
    ax.set_ylim(0, max(1.1, float(frame["ratio"].max()) * 1.05))
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower left", ncols=4, fontsize="small")
    section.charts.append(
        _chart(
            fig,
            title,
            "Line chart: NDR divided by the XDP_TX floor against frame "
            "size, one line per encap, dashed line at the floor (1.0).",
        )
    )

    fig = _figure()
    ax = fig.add_subplot()
    floors = frame.groupby("size")[["tx", "drop"]].mean()
    xs = [positions[s] for s in sizes]
    ax.plot(xs, [floors.loc[s, "drop"] for s in sizes], color="black", linestyle=":", label="XDP_DROP floor")
    ax.plot(xs, [floors.loc[s, "tx"] for s in sizes], color="grey", linestyle="--", label="XDP_TX floor")
    for encap in encaps:
        part = frame[frame["encap"] == encap].sort_values("size", key=lambda s: s.map(_size_order))
        ax.plot(
            [positions[s] for s in part["size"]],
            part["ndr"],
            marker="o",
            label=encap,
            color=_ENCAP_COLOURS.get(encap),
        )
    title = "NDR throughput per encap against frame size"
    ax.set_title(title)
    ax.set_xticks(range(len(sizes)), labels)
    ax.set_xlabel("ingress frame size (bytes)")
    ax.set_ylabel("throughput (Mpps)")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower left", ncols=4, fontsize="small")
    section.charts.append(
        _chart(
            fig,
            title,
            "Line chart: NDR in million packets per second against frame "
            "size, one line per encap, with the XDP_TX and XDP_DROP floors.",
        )
    )

    by_key = {(row.encap, row.size): row for row in frame.itertuples()}
    table_rows = []
    for encap in encaps:
        cells = [Cell(encap, "key")]
        for size in sizes:
            row = by_key.get((encap, size))
            if row is None:
                cells.append(Cell("–", "num missing"))
            else:
                cells.append(
                    Cell(
                        f"{_fmt(row.ndr)} / {_fmt(row.pdr)} ({_fmt(row.ratio)})",
                        "num",
                        f"{row.trials} trials; XDP_TX floor {_fmt(row.tx)} Mpps",
                    )
                )
        table_rows.append(cells)
    section.tables.append(
        Table(
            "NDR / PDR in Mpps (NDR ÷ XDP_TX floor) per encap and ingress frame size (bytes)",
            ["encap", *labels],
            table_rows,
        )
    )

    mtu_rows = []
    for encap in encaps:
        part = frame[frame["encap"] == encap]
        overhead = int(part["overhead"].max())
        mtu = int(part["egress_mtu"].min())
        mtu_rows.append(
            [
                Cell(encap, "key"),
                Cell(str(overhead), "num"),
                Cell(str(mtu), "num"),
                Cell(str(mtu - overhead), "num"),
                Cell(", ".join(sorted(set(part["generator"])))),
            ]
        )
    section.tables.append(
        Table(
            "Egress overhead and the largest client packet that fits without ICMP too-big",
            ["encap", "egress overhead (bytes)", "egress MTU (bytes)", "effective MTU (bytes)", "generator"],
            mtu_rows,
        )
    )
    latency = _latency_table(results)
    if latency is not None:
        section.tables.append(latency)
    return section


def _latency_table(results: list[Result]) -> Table | None:
    """Latency at shares of PDR for the newest point of each encap and size that has any, or None."""
    rows = [
        {"time": r.time, "encap": pt.encap, "size": pt.frame_size, "latency": pt.latency}
        for r, p in of_kind(results, BenchPayload)
        for pt in p.points
        if pt.latency
    ]
    if not rows:
        return None
    frame = _latest(pd.DataFrame(rows), ["encap", "size"])
    ordered = sorted(frame.itertuples(), key=lambda row: (_encap_rank(row.encap), _size_order(row.size)))
    table_rows = []
    for row in ordered:
        for fig in sorted(row.latency, key=lambda f: f.share_of_pdr):
            spread = ", ".join(f"{name} {_fmt(value, 1)} µs" for name, value in (("p50", fig.p50_us),
                                                                                  ("p99", fig.p99_us))
                               if value is not None)
            table_rows.append([
                Cell(row.encap, "key"),
                Cell(str(row.size), "num"),
                Cell(str(fig.share_of_pdr), "num"),
                Cell(_fmt(fig.rate_mpps, 3), "num"),
                Cell(_fmt(fig.min_us, 1), "num"),
                Cell(_fmt(fig.avg_us, 1), "num", spread),
                Cell(_fmt(fig.max_us, 1), "num"),
            ])
    return Table(
        "Latency at 10/50/90 % of PDR (one way, TRex's latency stream; newest run per encap and frame size)",
        ["encap", "frame size (bytes)", "share of PDR (%)", "rate (Mpps)", "min (µs)", "avg (µs)", "max (µs)"],
        table_rows,
    )


def _rss(results: list[Result]) -> Section:
    section = Section(
        "rss",
        "Receive-side scaling on a real server",
        "How the encapsulated flows spread over a real's receive queues, for IPIP with a fixed or a "
        "flow-derived outer source and for GUE under each NIC hash setting (sd: addresses only, sdfn: "
        "addresses and ports). χ² and p are against an even spread; a p near 0 means the spread is not even.",
    )
    found = of_kind(results, RssPayload)
    if not found:
        section.empty = True
        return section
    table_rows = []
    # The NIC model's scenarios first, then what was measured on a real's CPUs.
    found = sorted(found, key=lambda rp: (any(sc.source != "model" for sc in rp[1].scenarios), rp[0].id))
    for result, payload in found:
        scenarios = payload.scenarios
        ncols = min(3, len(scenarios))
        nrows = math.ceil(len(scenarios) / ncols)
        width = max(3.4 * ncols, 5.0)
        fig = _figure(width=width, height=2.8 * nrows + 0.8)
        title = f"Flows per receive queue ({result.id})"
        fig.suptitle(textwrap.fill(title, int(width * 9)))
        for i, sc in enumerate(scenarios):
            ax = fig.add_subplot(nrows, ncols, i + 1)
            ax.bar(range(sc.nqueues), sc.queue_counts, color="#4c72b0")
            mean = sum(sc.queue_counts) / sc.nqueues
            ax.axhline(mean, color="grey", linestyle="--", linewidth=1)
            ax.set_title(
                f"{sc.name}\nmax/mean {_fmt(sc.max_over_mean)}, p {_p(sc.p_value, '= ')}", fontsize="medium"
            )
            ax.set_xlabel("receive queue")
            ax.set_ylabel(f"{sc.counted} per queue")
            ax.set_xticks(range(sc.nqueues))
            table_rows.append(
                [
                    Cell(sc.name, "key"),
                    Cell(result.id),
                    Cell(sc.source),
                    Cell(str(sc.nqueues), "num"),
                    Cell(str(sc.flows), "num"),
                    Cell(
                        _fmt(sc.max_over_mean),
                        "num bad" if sc.max_over_mean > 1.5 else "num",
                        "the busiest queue gets more than 1.5 × the mean" if sc.max_over_mean > 1.5 else "",
                    ),
                    Cell(_fmt(sc.chi2, 1), "num"),
                    Cell(_p(sc.p_value), "num"),
                ]
            )
        names = ", ".join(sc.name for sc in scenarios)
        section.charts.append(
            _chart(
                fig,
                title,
                f"Bar charts of {scenarios[0].counted} per receive queue "
                f"for {names}; dashed line at the mean.",
            )
        )
    section.tables.append(
        Table(
            "Spread per scenario",
            ["scenario", "result", "source", "queues", "flows", "max ÷ mean", "χ²", "p-value"],
            table_rows,
        )
    )
    return section


def _pmtu(results: list[Result]) -> Section:
    section = Section(
        "pmtu",
        "Path MTU through the balancer",
        "A transfer larger than the path MTU after encapsulation: with the LB's own ICMP too-big (icmp), "
        "with TCP MSS clamping (mss-clamp), and with a router behind the LB sending the ICMP (blackhole, "
        "expected to fail). Route MTU is what the client's route cache learnt.",
    )
    rows = [
        {"time": r.time, "encap": p.encap, "name": s.name, "scenario": s}
        for r, p in of_kind(results, PmtuPayload)
        for s in p.scenarios
    ]
    if not rows:
        section.empty = True
        return section
    frame = _latest(pd.DataFrame(rows), ["encap", "name"])
    names = list(dict.fromkeys(s.name for _, p in of_kind(results, PmtuPayload) for s in p.scenarios))
    by_key = {(row.encap, row.name): row.scenario for row in frame.itertuples()}
    table_rows = []
    for encap in sorted(set(frame["encap"]), key=_encap_rank):
        cells = [Cell(encap, "key")]
        for name in names:
            sc = by_key.get((encap, name))
            if sc is None:
                cells.append(Cell("–", "missing"))
                continue
            outcome = (
                f"completed in {_fmt(sc.seconds)} s" if sc.completed else f"failed after {_fmt(sc.seconds)} s"
            )
            mtu = f"route MTU {sc.route_mtu}" if sc.route_mtu is not None else "no route MTU cached"
            as_expected = sc.completed == sc.expected_completed
            remark = (
                "" if as_expected and sc.completed else " (as expected)" if as_expected else " (unexpected)"
            )
            hint = "expected to complete" if sc.expected_completed else "expected to fail"
            cells.append(Cell(f"{outcome}{remark}; {mtu}", "ok" if as_expected else "bad", hint))
        table_rows.append(cells)
    section.tables.append(Table("PMTU outcome per encap and scenario", ["encap", *names], table_rows))
    return section


def _label_n_axis(ax: Any, ns: list[int]) -> None:
    """Tick a log-scale N axis at the measured N values, written as plain numbers."""
    ax.set_xticks(ns, [str(n) for n in ns])
    ax.xaxis.set_minor_locator(NullLocator())


def _churn(results: list[Result]) -> Section:
    section = Section(
        "churn",
        "Maglev churn: removing one of N reals",
        "Ring slots that change owner when one of N equal-weight reals is removed, as a share of the ring, "
        "beside the theoretical minimum (only the removed real's 1/N moves) and Katran's figures for the "
        "same change (copied into the results from Katran's ring). Collateral is changed − owned by removed.",
    )
    rows = [
        {"time": r.time, "n": pt.n, "point": pt} for r, p in of_kind(results, ChurnPayload) for pt in p.points
    ]
    if not rows:
        section.empty = True
        return section
    frame = _latest(pd.DataFrame(rows), ["n"]).sort_values("n")
    points = list(frame["point"])
    ns = [pt.n for pt in points]

    fig = _figure()
    ax = fig.add_subplot()
    ax.plot(
        ns,
        [100 * pt.theoretical_slots / pt.ring_size for pt in points],
        color="grey",
        linestyle="--",
        label="theoretical: 1/N of the ring",
    )
    ax.plot(
        ns, [100 * pt.slots_changed / pt.ring_size for pt in points], marker="o", label="l4lab: slots changed"
    )
    katran = [pt for pt in points if pt.katran is not None]
    if katran:
        ax.plot(
            [pt.n for pt in katran],
            [100 * pt.katran.slots_changed / pt.katran.ring_size for pt in katran if pt.katran],
            marker="s",
            linestyle="none",
            label="Katran: slots changed",
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    low, high = ax.get_ylim()
    ax.set_yticks([v for v in (0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100) if low <= v <= high])
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g} %"))
    ax.yaxis.set_minor_locator(NullLocator())
    _label_n_axis(ax, ns)
    title = "Ring disruption against the number of reals"
    ax.set_title(title)
    ax.set_xlabel("reals before the removal, N (log scale)")
    ax.set_ylabel("ring slots changed (% of ring, log scale)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    section.charts.append(
        _chart(
            fig,
            title,
            "Log-log chart: percentage of ring slots changed against N for "
            "l4lab and Katran, with the theoretical 1/N line.",
        )
    )

    fig = _figure()
    ax = fig.add_subplot()
    ax.plot(
        ns,
        [100 * (pt.slots_changed - pt.slots_owned_by_removed) / pt.ring_size for pt in points],
        marker="o",
        label="l4lab",
    )
    if katran:
        ax.plot(
            [pt.n for pt in katran],
            [
                100 * (pt.katran.slots_changed - pt.katran.slots_owned_by_removed) / pt.katran.ring_size
                for pt in katran
                if pt.katran
            ],
            marker="s",
            linestyle="none",
            label="Katran",
        )
    ax.set_xscale("log")
    _label_n_axis(ax, ns)
    title = "Collateral moves: slots changed that the removed real did not own"
    ax.set_title(title)
    ax.set_xlabel("reals before the removal, N (log scale)")
    ax.set_ylabel("collateral slots (% of ring)")
    ax.set_ylim(bottom=0)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    section.charts.append(
        _chart(
            fig,
            title,
            "Chart: collateral slot moves as a percentage of the ring " "against N for l4lab and Katran.",
        )
    )

    table_rows = []
    for pt in points:
        k = pt.katran
        c = pt.connections
        table_rows.append(
            [
                Cell(str(pt.n), "num"),
                Cell(str(pt.ring_size), "num"),
                Cell(str(pt.slots_owned_by_removed), "num"),
                Cell(str(pt.slots_changed), "num"),
                Cell(_fmt(pt.theoretical_slots, 0), "num"),
                Cell(str(pt.slots_changed - pt.slots_owned_by_removed), "num"),
                Cell(f"{k.slots_owned_by_removed} / {k.slots_changed}" if k else "–", "num"),
                Cell(f"{c.survived} / {c.reset} / {c.failed_fast}" if c else "–", "num"),
            ]
        )
    section.tables.append(
        Table(
            "Slots per N (ring of the size given)",
            [
                "N",
                "ring slots",
                "owned by removed",
                "changed",
                "theoretical (ring ÷ N)",
                "collateral",
                "Katran owned / changed",
                "connections survived / reset / failed fast",
            ],
            table_rows,
        )
    )
    return section


def _failover(results: list[Result]) -> Section:
    section = Section(
        "failover",
        "Failover timelines",
        "What happened, and when, in each failover test; the failover time is how long traffic was "
        "interrupted.",
    )
    found = of_kind(results, FailoverPayload)
    if not found:
        section.empty = True
        return section
    table_rows = []
    for result, payload in found:
        events = sorted(payload.timeline, key=lambda e: e.t)
        fig = _figure(height=1.2 + 0.45 * len(events))
        ax = fig.add_subplot()
        ys = list(range(len(events)))[::-1]
        ax.hlines(ys, 0, [e.t for e in events], color="#cccccc", linewidth=1)
        ax.plot([e.t for e in events], ys, marker="o", linestyle="none", color="#4c72b0")
        for e, y in zip(events, ys, strict=True):
            ax.annotate(
                f"{e.t:.2f} s",
                (e.t, y),
                xytext=(6, 0),
                textcoords="offset points",
                va="center",
                fontsize="small",
            )
        ax.set_yticks(ys, [e.event for e in events])
        ax.set_xlim(0, max(e.t for e in events) * 1.15 + 0.1)
        ax.set_ylim(-0.7, len(events) - 0.3)
        title = f"{result.id}: traffic interrupted for {payload.failover_seconds:.2f} s"
        ax.set_title(title)
        ax.set_xlabel("time since the test started (s)")
        ax.grid(True, axis="x", alpha=0.3)
        section.charts.append(
            _chart(
                fig,
                title,
                f"Timeline of {len(events)} events in {result.id}; "
                f"failover took {payload.failover_seconds:.2f} seconds.",
            )
        )
        table_rows.append(
            [
                Cell(result.id, "key"),
                Cell(_fmt(payload.failover_seconds), "num"),
                Cell(str(len(events)), "num"),
            ]
        )
    section.tables.append(Table("Failover time per test", ["test", "failover (s)", "events"], table_rows))
    return section


def _conformance(results: list[Result]) -> Section:
    section = Section(
        "conformance",
        "Conformance",
        "End-to-end tests, one column per encap; hover a cell for its duration.",
    )
    rows = [
        {"time": r.time, "test": p.test, "encap": p.encap, "outcome": p.outcome, "duration": p.duration_s}
        for r, p in of_kind(results, ConformancePayload)
    ]
    if not rows:
        section.empty = True
        return section
    frame = _latest(pd.DataFrame(rows), ["test", "encap"])
    by_key = {(row.test, row.encap): row for row in frame.itertuples()}
    table_rows = []
    for test in sorted(set(frame["test"])):
        cells = [Cell(test, "key")]
        for encap in ENCAP_IDS:
            row = by_key.get((test, encap))
            if row is None:
                cells.append(Cell("–", "missing", "not run"))
            else:
                cells.append(Cell(row.outcome, row.outcome, f"{row.duration:.2f} s"))
        table_rows.append(cells)
    counts = frame["outcome"].value_counts()
    section.notes.append(
        f"{counts.get('pass', 0)} passed, {counts.get('fail', 0)} failed, {counts.get('skip', 0)} skipped "
        f"of {len(frame)} test × encap cases."
    )
    section.tables.append(Table("Outcome per test and encap", ["test", *ENCAP_IDS], table_rows))
    return section


def _corpus(results: list[Result]) -> Section:
    section = Section(
        "corpus",
        "Katran's fixture corpus",
        "Katran's own datapath fixtures replayed through our programs: what each case proved. "
        "Not applicable cases exercise a feature l4lab does not implement and are not run.",
    )
    found = of_kind(results, CorpusPayload)
    if not found:
        section.empty = True
        return section
    result, p = max(found, key=lambda rp: rp[0].time)
    section.tables.append(
        Table(
            f"What the {p.cases} cases proved ({result.id})",
            ["byte-exact", "verdict and real", "of which Katran's real", "deliberate deviations", "not applicable"],
            [[Cell(str(v), "num") for v in (p.byte_exact, p.verdict_and_real, p.katrans_real, p.deviations,
                                             p.not_applicable)]],
        )
    )
    return section


def _fuzz(results: list[Result]) -> Section:
    section = Section(
        "fuzz",
        "Fuzzed frames",
        "Generated and mutated frames through the balancer and the decap programs by BPF_PROG_TEST_RUN: "
        "aborted runs, runs not counted under exactly one reason, and the reasons counted.",
    )
    found = of_kind(results, FuzzPayload)
    if not found:
        section.empty = True
        return section
    runs = []
    reasons = []
    for result, p in sorted(found, key=lambda rp: rp[0].time):
        runs.append(
            [
                Cell(result.id, "key"),
                Cell(str(p.seed), "num"),
                Cell(str(p.frames), "num"),
                Cell(str(p.runs), "num"),
                Cell(_fmt(p.seconds, 1), "num"),
                Cell(f"{p.frames_per_s:.0f}", "num"),
                Cell(str(p.aborted), "num " + ("ok" if p.aborted == 0 else "bad")),
                Cell(str(p.without_one_reason), "num " + ("ok" if p.without_one_reason == 0 else "bad")),
            ]
        )
    latest_result, latest = max(found, key=lambda rp: rp[0].time)
    for r in sorted(latest.reasons, key=lambda r: (r.program, -r.frames)):
        reasons.append([Cell(r.program, "key"), Cell(r.reason), Cell(str(r.frames), "num")])
    section.tables.append(
        Table(
            "Fuzz runs",
            ["run", "seed", "frames", "test runs", "seconds", "frames/s", "aborted", "without one reason"],
            runs,
        )
    )
    section.tables.append(Table(f"Reasons counted in {latest_result.id}", ["program", "reason", "runs"], reasons))
    return section


# --- the page -----------------------------------------------------------------------------------


def _distinct(values: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(values))


def render_html(results: list[Result], source: str = "", now: datetime | None = None) -> str:
    """The report page for ``results`` (possibly none) as one HTML string."""
    sections = [
        _demo(results),
        _bench(results),
        _rss(results),
        _pmtu(results),
        _churn(results),
        _failover(results),
        _conformance(results),
        _corpus(results),
        _fuzz(results),
    ]
    times = sorted(r.time for r in results)
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(_TEMPLATES),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    template = env.get_template("report.html.j2")
    return template.render(
        sections=sections,
        machines=_distinct(
            [f"{r.machine.hostname} (kernel {r.machine.kernel}, {r.machine.cpus} CPUs)" for r in results]
        ),
        commits=_distinct([r.commit for r in results]),
        first=times[0].astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC") if times else "",
        last=times[-1].astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC") if times else "",
        generated=(now or datetime.now(UTC)).strftime("%Y-%m-%d %H:%M UTC"),
        count=len(results),
        synthetic=sum(1 for r in results if r.synthetic),
        source=source,
        no_results=NO_RESULTS,
    )


def render(results_directory: str | Path | None = None, out: str | Path | None = None) -> Path:
    """Render the results in ``results_directory`` into ``out``; returns the path written.

    Raises ResultsError for a missing directory or an invalid results file.
    """
    source = results_dir(results_directory)
    results = load_results(source)
    target = Path(out) if out is not None else DEFAULT_OUT
    page = render_html(results, source=str(source))
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp")
    tmp.write_text(page, encoding="utf-8")
    tmp.replace(target)
    return target


def main(argv: Sequence[str] | None = None) -> int:
    """``l4lab report``: 0 on success, 2 for bad results or arguments, 1 if the page cannot be written."""
    parser = argparse.ArgumentParser(
        prog="l4lab report", description="Render the results into one HTML page."
    )
    parser.add_argument(
        "--results",
        type=Path,
        default=None,
        help="results directory (default: $L4LAB_RESULTS or results/ at the repository top)",
    )
    parser.add_argument("--out", type=Path, default=None, help=f"HTML file to write (default: {DEFAULT_OUT})")
    args = parser.parse_args(argv)
    try:
        path = render(args.results, args.out)
    except ResultsError as e:
        print(f"l4lab report: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"l4lab report: cannot write the report to {e.filename}: {e.strerror}", file=sys.stderr)
        return 1
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
