"""The HTML report: results files in, one self-contained page out (inline SVG charts, no external resource).

    l4lab report [--results DIR] [--out FILE]          # the lead's CLI calls main(argv)
    l4lab report --compare A B [--out FILE]             # two runs side by side with the change
    python -m reports.render --results DIR --out FILE

The page reads only results files (reports.schema). It opens with the encapsulation modes at a
glance (the newest demo run), then one section per kind that has results, then the runs (latest per
machine and generator) and a trend per figure over commits; the kinds without results are left out
and listed last, each with the command that measures it (FILLED_BY). Charts are inline SVG
(reports/svg.py) whose every mark has a <title> (hover value), zoomable with the wheel; every chart
and table links its data as CSV and JSON (data: URLs). The Jinja2 template only lays them out.
"""

from __future__ import annotations

import argparse
import base64
import csv
import io
import json
import math
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jinja2
import pandas as pd
from markupsafe import Markup

from reports import svg, trend
from reports.schema import (
    ENCAP_IDS,
    IMIX_MEAN_FRAME_BYTES,
    BenchPayload,
    ChurnPayload,
    ConformancePayload,
    CorpusPayload,
    DemoEncap,
    DemoPayload,
    FailoverPayload,
    FuzzPayload,
    PmtuPayload,
    Result,
    ResultsError,
    RssPayload,
    Versus,
    load_results,
    of_kind,
    results_dir,
)

__all__ = ["DEFAULT_OUT", "NO_RESULTS", "compare_html", "figures", "main", "render", "render_html"]

DEFAULT_OUT = Path(__file__).resolve().parent / "out" / "index.html"
NO_RESULTS = "no results of this kind"
# The command that fills each section, for the list of sections a report leaves out.
FILLED_BY = {
    "summary": "make demo", "demo": "make demo", "bench": "make bench", "versus": "l4lab bench --katran",
    "rss": "make demo", "pmtu": "make demo", "churn": "l4lab conform", "failover": "l4lab conform",
    "conformance": "l4lab conform", "duts": "l4lab conform --dut ipvs", "corpus": "make test", "fuzz": "make soak",
    "history": "make demo",
}
_TEMPLATES = Path(__file__).resolve().parent / "templates"
_ENCAP_COLOURS = dict(zip(ENCAP_IDS, svg.PALETTE, strict=False))
PREAMBLE_AND_GAP = 20  # bytes on the wire around every frame (L1): preamble + delimiter 8, gap 12
SPREAD_MAX_OVER_MEAN = 1.25  # what the suites call an even spread over a real's queues


@dataclass(frozen=True)
class Download:
    label: str  # CSV or JSON
    filename: str
    href: str  # a data: URL


@dataclass(frozen=True)
class Chart:
    """One inline SVG chart: its title, alt text, markup and the values it plots (downloadable)."""

    title: str
    alt: str
    svg: Markup
    data: list[dict[str, Any]] = field(default_factory=list)

    @property
    def downloads(self) -> list[Download]:
        return _downloads(self.title, self.data)


@dataclass(frozen=True)
class Cell:
    text: str
    css: str = ""
    hint: str = ""  # shown on hover
    html: Markup | None = None  # markup shown instead of text (a sparkline); text stays the data value


@dataclass(frozen=True)
class Table:
    caption: str
    header: list[str]
    rows: list[list[Cell]]

    @property
    def downloads(self) -> list[Download]:
        return _downloads(self.caption, [dict(zip(self.header, (c.text for c in row), strict=False))
                                         for row in self.rows])


@dataclass
class Section:
    """One part of the page; ``empty`` sections print the no-results notice."""

    id: str
    title: str
    intro: str
    charts: list[Chart] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    legend: list[str] = field(default_factory=list)  # shown after the tables
    empty: bool = False


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:60] or "data"


def _downloads(title: str, rows: list[dict[str, Any]]) -> list[Download]:
    """CSV and JSON of ``rows`` as data: URLs (base64, so any text survives the attribute)."""
    if not rows:
        return []
    columns = list(dict.fromkeys(k for row in rows for k in row))
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    stem = _slug(title)

    def url(mime: str, text: str) -> str:
        return f"data:{mime};charset=utf-8;base64," + base64.b64encode(text.encode("utf-8")).decode("ascii")

    return [Download("CSV", f"{stem}.csv", url("text/csv", buffer.getvalue())),
            Download("JSON", f"{stem}.json", url("application/json",
                                                  json.dumps(rows, indent=1, ensure_ascii=False, default=str)))]


def _chart(markup: str, title: str, alt: str, data: list[dict[str, Any]]) -> Chart:
    return Chart(title=title, alt=alt, svg=Markup(markup), data=data)  # noqa: S704 - built by reports/svg.py, escaped


def _fmt(value: float, digits: int = 2) -> str:
    return f"{value:.{digits}f}"


def _p(value: float, equals: str = "") -> str:
    """A p-value for people: tiny ones as an upper bound."""
    return "< 1e-6" if value < 1e-6 else f"{equals}{value:.3g}"


def _latest(frame: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Rows of ``frame`` keeping only the newest (column ``time``) per key; ties go to the later row."""
    return frame.sort_values("time", kind="stable").drop_duplicates(keys, keep="last")


def _newest(results: Iterable[tuple[Result, Any]], key: Any) -> list[tuple[Result, Any]]:
    """The newest (result, payload) per ``key(result, payload)``, in the order first seen."""
    best: dict[Any, tuple[Result, Any]] = {}
    for r, p in results:
        k = key(r, p)
        if k not in best or r.time >= best[k][0].time:
            best[k] = (r, p)
    return list(best.values())


def _size_order(size: Any) -> tuple[int, float]:
    return (1, 0.0) if size == "imix" else (0, float(size))


def _encap_rank(encap: str) -> int:
    return ENCAP_IDS.index(encap) if encap in ENCAP_IDS else len(ENCAP_IDS)


def gbps(mpps: float, size: Any) -> float:
    """Ingress line rate in Gb/s (L1: the frame plus preamble and gap) of ``mpps`` frames of ``size``."""
    frame = IMIX_MEAN_FRAME_BYTES if size == "imix" else float(size)
    return mpps * (frame + PREAMBLE_AND_GAP) * 8 / 1000


def _short(commit: str) -> str:
    return commit[:10] + ("-dirty" if commit.endswith("-dirty") else "") if commit != "unknown" else commit


def _when(r: Result) -> str:
    return r.time.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")


def _run_label(r: Result, generator: str | None = None) -> str:
    gen = f", {generator}" if generator else ""
    return f"{r.machine.hostname}{gen}, commit {_short(r.commit)}, {_when(r)}"


# --- sections -----------------------------------------------------------------------------------


def _spread_verdict(max_over_mean: float, queues_used: int, nqueues: int) -> str:
    if nqueues > 1 and queues_used <= 1:
        return "one queue"
    return "even" if max_over_mean <= SPREAD_MAX_OVER_MEAN else "uneven"


def _summary(results: list[Result]) -> Section:
    """The encapsulation modes at a glance: the newest demo run's checked figures, one row per encap."""
    section = Section(
        "summary",
        "Encapsulation modes at a glance",
        "The newest demo run (make demo), one row per encap; every figure was checked by the demo. "
        "Green: as expected; yellow: as expected, but worth knowing; red: not as expected.",
    )
    section.legend.append(
        "works: requests answered and reals that answered. DSR held only if 0 frames other than client→VIP "
        "and its encapsulation crossed the LB's link (in brackets: the frames that did). RSS spread: the "
        "NIC model (Toeplitz, 8 queues) over the outer headers the balancer program itself wrote, per NIC "
        "hash setting (sd: addresses, sdfn: addresses and ports): max ÷ mean, or the queues used when "
        "not all (1/8 q: every flow on one queue). PMTU: the path MTU a 1500-byte DF datagram taught the "
        "client through the LB's own ICMP, expected 1500 − the encap's overhead. Churn: one of three reals "
        "removed under live connections; its connections must be reset (fail fast) and no connection of "
        "a surviving real may break (collateral), beside the Maglev slots that moved between survivors.")
    found = of_kind(results, DemoPayload)
    if not found:
        section.empty = True
        return section
    result, payload = max(found, key=lambda rp: rp[0].time)
    section.notes.append(f"Demo run on {_run_label(result)}, the LB {payload.shape} (topology {payload.topology}).")
    shapes = {p.shape: (r, p) for r, p in sorted(found, key=lambda rp: rp[0].time)}
    section.notes.append("LB shapes the demo ran (newest run of each): " + "; ".join(
        f"{shape} (topology {p.topology}, {_run_label(r)})" for shape, (r, p) in sorted(shapes.items())) + ".")
    ndr = _newest_ndr_ratio(results)
    rows = []
    for e in sorted(payload.encaps, key=lambda e: _encap_rank(e.encap)):
        rows.append(_summary_row(e, ndr.get(e.encap)))
    header = ["encap", "works", "DSR (replies via LB)", "RSS spread: fixed outer source",
              "RSS spread: flow outer source", "PMTU learnt (expected)", "churn: removed real's connections reset",
              "churn: collateral"]
    if ndr:
        header.append("NDR ÷ XDP_TX floor (64 B)")
    else:
        rows = [row[:-1] for row in rows]
    section.tables.append(Table("The five encaps compared (newest demo run)", header, rows))
    return section


def _spread_cell(e: DemoEncap, source: str) -> Cell:
    mine = [s for s in e.spread if s.name.startswith(source + "-")]
    if not mine:
        return Cell("–", "missing", "not measured")
    parts = []
    for s in mine:
        fields = s.name.rsplit("-", 1)[-1]
        figure = f"{s.queues_used}/{s.nqueues} q" if s.queues_used < s.nqueues else _fmt(s.max_over_mean)
        parts.append(f"{fields} {figure}")
    # fixed-source sd is expected on one queue: a "collapse" that held is still shown for what it is
    collapsed = any(s.queues_used == 1 and s.nqueues > 1 for s in mine)
    css = "bad" if not all(s.held for s in mine) else ("warn" if collapsed else "ok")
    hint = "as expected" if all(s.held for s in mine) else "not as expected"
    if collapsed:
        hint += "; one queue takes every flow where the outer headers do not vary"
    return Cell(" · ".join(parts), css, hint)


def _summary_row(e: DemoEncap, ratio: float | None) -> list[Cell]:
    works = e.ok == e.requests > 0
    row = [Cell(e.encap, "key"),
           Cell(f"{e.ok}/{e.requests} · {len(e.reals_seen)} reals", "ok" if works else "bad",
                ", ".join(e.reals_seen))]
    replies = e.replies_via_lb
    dsr = e.lb_saw_only_client_to_vip and (replies in (None, 0))
    row.append(Cell(f"{'held' if dsr else 'NO'}" + (f" ({replies})" if replies is not None else ""),
                    "ok" if dsr else "bad",
                    f"LB link: {e.to_lb} in, {e.from_lb} out" if e.to_lb is not None else ""))
    row.append(_spread_cell(e, "fixed-src"))
    row.append(_spread_cell(e, "flow-src"))
    if e.pmtu is None:
        row.append(Cell("–", "missing", "not measured"))
    else:
        p = e.pmtu
        good = p.learnt_mtu == p.expected_mtu and p.lb_too_big > 0
        row.append(Cell(f"{p.learnt_mtu or 'none'} ({p.expected_mtu})", "ok" if good else "bad",
                        f"{p.sent_bytes}-byte DF datagram; LB too-big answers {p.lb_too_big}; resend: {p.resend}"))
    if e.churn is None:
        row += [Cell("–", "missing", "not measured"), Cell("–", "missing", "not measured")]
    else:
        c = e.churn
        row.append(Cell(f"{c.reset}/{c.on_removed}", "ok" if c.on_removed and c.reset == c.on_removed else "bad",
                        f"{c.connections} connections; new flows after: {c.new_flows}, to the removed real "
                        f"{c.new_to_removed}, failed {c.new_failed}"))
        row.append(Cell(f"{c.collateral} conns, {c.ring_collateral_slots} slots",
                        "ok" if c.collateral == 0 else "bad",
                        f"ring slots moved between surviving reals, of {c.ring_size}"))
    row.append(Cell(_fmt(ratio) if ratio is not None else "–", "num" if ratio is not None else "missing"))
    return row


def _newest_ndr_ratio(results: list[Result]) -> dict[str, float]:
    """NDR ÷ XDP_TX floor at 64 B per encap, from the newest software (xdp-live) bench run."""
    out: dict[str, tuple[datetime, float]] = {}
    for r, p in of_kind(results, BenchPayload):
        if p.generator != "xdp-live":
            continue
        for pt in p.points:
            if pt.frame_size == 64 and pt.floor.xdp_tx_mpps > 0 and (pt.encap not in out or r.time >= out[pt.encap][0]):
                out[pt.encap] = (r.time, pt.ndr_mpps / pt.floor.xdp_tx_mpps)
    return {k: v for k, (_, v) in out.items()}


def _demo(results: list[Result]) -> Section:
    section = Section(
        "demo",
        "Demo: real traffic in every encap",
        "Requests sent through the lab by the demo (make demo), the reals that answered, and what the "
        "capture of the LB's link saw (direct server return: only client→VIP in, only its encapsulation out).",
    )
    rows = [
        {"time": r.time, "encap": e.encap, "requests": e.requests, "ok": e.ok, "reals": e.reals_seen,
         "dsr": e.lb_saw_only_client_to_vip, "to_lb": e.to_lb, "from_lb": e.from_lb, "stray": e.replies_via_lb}
        for r, p in of_kind(results, DemoPayload)
        for e in p.encaps
    ]
    if not rows:
        section.empty = True
        return section
    frame = _latest(pd.DataFrame(rows), ["encap"])
    table_rows = []
    for row in frame.sort_values("encap", key=lambda s: s.map(_encap_rank)).itertuples():
        measured = row.stray is not None and not pd.isna(row.stray)
        capture = f"{int(row.to_lb)} / {int(row.from_lb)} / {int(row.stray)}" if measured else "–"
        table_rows.append(
            [
                Cell(row.encap, "key"),
                Cell(str(row.requests), "num"),
                Cell(str(row.ok), "num " + ("ok" if row.ok == row.requests else "bad")),
                Cell(", ".join(row.reals) or "none", "" if row.reals else "bad"),
                Cell("yes" if row.dsr else "no", "ok" if row.dsr else "bad"),
                Cell(capture, "num"),
            ]
        )
    section.tables.append(
        Table(
            "Requests per encap",
            ["encap", "requests", "answered", "reals seen", "LB saw only client→VIP",
             "LB link frames: in / out / other"],
            table_rows,
        )
    )
    return section


def _micro_and_controller(section: Section, results: list[Result]) -> None:
    """Tables of the newest run's test-run micro-benchmark and controller figures, if any."""
    with_micro = [(r, p) for r, p in of_kind(results, BenchPayload) if p.micro and p.side_by_side is None]
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


def _bench_rows(results: list[Result]) -> pd.DataFrame:
    rows = [
        {"time": r.time, "machine": r.machine.hostname, "commit": r.commit, "generator": p.generator,
         "egress_mtu": p.egress_mtu, "encap": pt.encap, "size": pt.frame_size, "ndr": pt.ndr_mpps,
         "pdr": pt.pdr_mpps, "tx": pt.floor.xdp_tx_mpps, "drop": pt.floor.xdp_drop_mpps,
         "overhead": pt.egress_overhead_bytes, "trials": len(pt.trials), "latency": pt.latency,
         "versus": pt.versus, "run": _run_label(r, p.generator)}
        for r, p in of_kind(results, BenchPayload) if p.side_by_side is None  # those have their own section
        for pt in p.points
    ]
    return pd.DataFrame(rows)


def _bench(results: list[Result]) -> Section:
    section = Section(
        "bench",
        "Encapsulation comparison: throughput",
        "NDR (no loss) and PDR (≤ 0.5 % loss) of the balancer per encap and ingress frame size, from "
        "the NDR/PDR search, beside the machine's floor measured in the same run: a MAC-swap XDP_TX "
        "program and XDP_DROP. One block per machine and generator (its newest figures); a TRex run and a "
        "software run never hide each other. Gb/s is the ingress rate on the wire (frame + 20 B preamble "
        "and gap). Compare ratios, not absolute rates: the spread between runs is ±20 %.",
    )
    _micro_and_controller(section, results)
    all_rows = _bench_rows(results)
    if all_rows.empty:
        section.empty = not section.tables
        return section
    frame = _latest(all_rows, ["machine", "generator", "encap", "size"])
    frame = frame.assign(ratio=[n / t if t > 0 else math.nan for n, t in zip(frame["ndr"], frame["tx"], strict=True)])
    for (machine, generator), group in sorted(frame.groupby(["machine", "generator"]), key=lambda kv: kv[0]):
        _bench_group(section, str(machine), str(generator), group)

    mtu_rows = []
    for encap in sorted(set(frame["encap"]), key=_encap_rank):
        part = frame[frame["encap"] == encap]
        overhead = int(part["overhead"].max())
        mtu = int(part["egress_mtu"].min())
        mtu_rows.append([Cell(encap, "key"), Cell(str(overhead), "num"), Cell(str(mtu), "num"),
                         Cell(str(mtu - overhead), "num"), Cell(", ".join(sorted(set(part["generator"]))))])
    section.tables.append(Table(
        "Egress overhead and the largest client packet that fits without ICMP too-big",
        ["encap", "egress overhead (bytes)", "egress MTU (bytes)", "effective MTU (bytes)", "generator"], mtu_rows))
    return section


SIDE_BY_SIDE_TITLE = "l4lab vs Katran"
_SIDE_CASES = {"non-vip": "non-VIP", "session-hit": "session hit", "new-syn": "new flow, SYN",
               "new-ack": "new flow, ACK"}


def _side_by_side(results: list[Result]) -> Section:
    """The newest side-by-side run (l4lab bench --katran): micro table, program sizes, live-frames NDR."""
    found = [(r, p) for r, p in of_kind(results, BenchPayload) if p.side_by_side is not None]
    other = found[-1][1].side_by_side.program if found else "katran"  # type: ignore[union-attr]
    name = other.capitalize() if other.islower() else other
    section = Section(
        "versus",
        SIDE_BY_SIDE_TITLE,
        f"l4lab and {name} timed in one run on identical packets (l4lab bench --katran): single "
        "BPF_PROG_TEST_RUN calls (repeat = 1) taking turns on one CPU, every call's action and path counter "
        "checked, medians in ns; the ratio is l4lab's cost above the MAC-swap XDP_TX floor divided by "
        f"{name}'s. Then both programs' live-frames NDR at 64 B on the bench veth, beside the floors of "
        "the same run. Only ratios within one run are comparable; absolute figures vary ±20 % between runs.",
    )
    if not found:
        section.empty = True
        return section
    result, payload = max(found, key=lambda rp: rp[0].time)
    sbs = payload.side_by_side
    assert sbs is not None
    run = _run_label(result)
    rows = []
    for c in sbs.cases:
        encap = c.encap or "–"
        ratio = _fmt(c.ratio_above_floor) if c.ratio_above_floor is not None else "–"
        css = "num" if c.ratio_above_floor is None else ("num ok" if c.ratio_above_floor <= 1 else "num warn")
        rounds = [r for r in c.round_ratios if r is not None]
        rows.append([Cell(encap, "key"), Cell(_SIDE_CASES.get(c.case, c.case), "key"),
                     Cell(_fmt(c.other_ns, 0), "num"), Cell(_fmt(c.ns, 0), "num"), Cell(ratio, css),
                     Cell(f"{_fmt(min(rounds))}–{_fmt(max(rounds))}" if rounds else "–", "num",
                          "the ratio of each round's medians: " + ", ".join(_fmt(r) for r in rounds)),
                     Cell(f"{c.path_counter} / {c.other_path_counter}", "", "the counter only this case moves, "
                          "checked after every round"),
                     Cell(str(c.calls), "num")])
    for label, ns in (("XDP_DROP floor", sbs.floor_xdp_drop_ns), ("MAC-swap XDP_TX floor", sbs.floor_xdp_tx_ns)):
        rows.append([Cell("–", "key"), Cell(label, "key"), Cell("", "num"), Cell(_fmt(ns, 0), "num"),
                     Cell("–", "num"), Cell("–", "num"), Cell("–"), Cell("", "num")])
    section.tables.append(Table(
        f"Test run, median ns per call ({sbs.frame_bytes}-byte frames, {sbs.rounds} rounds, session tables of "
        f"{sbs.session_table_entries} entries per CPU) — {run}",
        ["encap", "case", f"{name} (ns)", "l4lab (ns)", f"l4lab ÷ {name}, cost above the floor", "over the rounds",
         f"path counter checked (l4lab / {name})", "calls checked"], rows))
    if sbs.seed is not None:
        section.notes.append(
            f"Order: seed {sbs.seed} (`l4lab bench --katran --seed {sbs.seed}` replays it); the cases shuffled in "
            f"every iteration; tables created first per round: {', '.join(sbs.first_loaded)}. Session tables: "
            + "; ".join(f"{t.program} {t.tables} × {t.entries:,} entries, {t.bytes / 2**20:.0f} MiB"
                        for t in sbs.session_tables) + ".")
    if sbs.sizes:
        section.tables.append(Table(
            f"Program size: instructions the verifier walked, and after translation — {run}",
            ["encap", f"{name} verified", "l4lab verified", f"l4lab ÷ {name}", f"{name} xlated", "l4lab xlated"],
            [[Cell(z.encap, "key"), Cell(str(z.other_verified_insns), "num"), Cell(str(z.verified_insns), "num"),
              Cell(_fmt(z.verified_insns / z.other_verified_insns), "num"), Cell(str(z.other_xlated_insns), "num"),
              Cell(str(z.xlated_insns), "num")] for z in sbs.sizes]))
    if sbs.syn_flood:
        section.tables.append(Table(
            f"SYN flood: every frame a new flow's TCP SYN, live frames at 64 B, NDR in Mpps (÷ XDP_TX floor) — {run}",
            ["program", "encap", "sources", "NDR", "sessions in its tables after"],
            [[Cell(f.program, "key"), Cell(f.encap), Cell(f"{f.sources:,}", "num"),
              Cell(f"{_fmt(f.ndr_mpps, 3)} ({_fmt(f.ndr_mpps / f.floor_xdp_tx_mpps) if f.floor_xdp_tx_mpps else '–'})",
                   "num"), Cell(f"{f.sessions_after:,}", "num")] for f in sbs.syn_flood]))
    if sbs.loop:
        cost = {(lc.program, lc.encap): lc for lc in sbs.loop if lc.traffic == "udp-flows"}
        tx_cost = cost.get(("xdp_tx", None))
        loop_rows = []
        for encap in sorted({lc.encap for lc in sbs.loop if lc.encap}, key=_encap_rank):
            cells = [Cell(encap, "key"), Cell(_fmt(tx_cost.cpu_ns_per_frame, 0) if tx_cost else "–", "num")]
            for who in ("l4lab", other):
                got = cost.get((who, encap))
                if got is None:
                    cells.append(Cell("–", "num missing"))
                    continue
                share = ""
                if tx_cost and got.cpu_ns_per_frame:
                    share = f" ({_fmt(tx_cost.cpu_ns_per_frame / got.cpu_ns_per_frame)})"
                cells.append(Cell(f"{_fmt(got.cpu_ns_per_frame, 0)}{share}", "num",
                                  f"{got.frames} frames a round; delivered {_fmt(got.delivered, 3)}"))
            loop_rows.append(cells)
        section.tables.append(Table(
            f"Live frames on veth: CPU ns per frame of the whole loop (XDP_TX floor ÷ it), median of "
            f"{max(lc.rounds for lc in sbs.loop)} rounds — {run}",
            ["encap", "MAC-swap XDP_TX floor", "l4lab", name], loop_rows))
        section.notes.append(
            "On veth the whole loop (generator, both veths, the LB program, the counting sink) runs in the sending "
            "thread's softirqs on one CPU, so its CPU time per frame is the loop's cost and the NDR is the rate "
            "the senders can sustain: frames are not lost in flight, a paced sender falls behind. The CPU-time "
            "ratio does not count time the scheduler gave to other processes; the NDR does.")
    live = []
    for pt in sorted(payload.points, key=lambda pt: (_encap_rank(pt.encap), _size_order(pt.frame_size))):
        tx = pt.floor.xdp_tx_mpps
        theirs: list[Versus | None] = [v for v in pt.versus if v.program == other] or [None]
        for v in theirs:
            them = "–" if v is None else f"{_fmt(v.ndr_mpps, 3)} ({_fmt(v.ndr_mpps / tx) if tx else '–'})"
            live.append([Cell(pt.encap, "key"), Cell(str(pt.frame_size), "num"),
                         Cell(_fmt(pt.floor.xdp_drop_mpps, 3), "num"), Cell(_fmt(tx, 3), "num"),
                         Cell(f"{_fmt(pt.ndr_mpps, 3)} ({_fmt(pt.ndr_mpps / tx) if tx else '–'})", "num"),
                         Cell(them, "num")])
    if live:
        section.tables.append(Table(
            f"Live frames on veth: NDR in Mpps (÷ XDP_TX floor) — {_run_label(result, payload.generator)}",
            ["encap", "frame size (bytes)", "XDP_DROP floor", "MAC-swap XDP_TX floor", "l4lab", name], live))
    else:
        section.notes.append("This run measured no live frames (the test-run table only).")
    _ratio_trends(section, results)
    return section


def _ratio_trends(section: Section, results: list[Result]) -> None:
    """Each ratio over every run of `l4lab bench --katran`, with jumpavg's change points (reports/trend.py)."""
    rows = []
    for t in trend.trends(results):
        marks = {i: change for i, change in t.changes}
        points = [(s.value, f"{_short(s.commit)} ({s.time.astimezone(UTC):%Y-%m-%d %H:%M}): {s.value:.3f}"
                   + (f" — {marks[i]}: a change beyond the noise" if i in marks else ""))
                  for i, s in enumerate(t.samples)]
        spark = svg.sparkline(t.name, points, marks=set(marks))
        last = t.changes[-1] if t.changes else None
        rows.append([Cell(t.name), Cell(f"{t.better} is better"), Cell(str(len(t.samples)), "num"),
                     Cell(" ".join(f"{s.value:.3f}" for s in t.samples), html=Markup(spark)),  # noqa: S704
                     Cell(f"{t.samples[-1].value:.3f}", "num"),
                     Cell(f"{last[1]} at {_short(t.samples[last[0]].commit)}" if last else "none",
                          "warn" if last and last[1] == "worse" else "")])
    if rows:
        section.tables.append(Table(
            "Ratios across runs and commits; a red mark starts a change beyond the noise (FD.io CSIT's jumpavg)",
            ["ratio — machine, result", "direction", "runs", "trend", "latest", "last change"], rows))
    else:
        section.notes.append("Trends of these ratios appear once two runs of `l4lab bench --katran` are in the "
                             "results directory.")


def _bench_group(section: Section, machine: str, generator: str, frame: pd.DataFrame) -> None:
    """Charts and tables of one machine's newest figures from one generator."""
    where = f"{generator} on {machine}"
    sizes = sorted(set(frame["size"]), key=_size_order)
    encaps = sorted(set(frame["encap"]), key=_encap_rank)
    labels = [str(s) for s in sizes]
    pos = {size: i for i, size in enumerate(sizes)}
    ordered = frame.sort_values("size", key=lambda s: s.map(_size_order))

    series, data = [], []
    for encap in encaps:
        part = ordered[ordered["encap"] == encap]
        points = []
        for row in part.itertuples():
            points.append((float(pos[row.size]), float(row.ratio),
                           f"{row.size} B: NDR {_fmt(row.ndr)} Mpps ÷ floor {_fmt(row.tx)} = {_fmt(row.ratio)}"))
            data.append({"generator": generator, "machine": machine, "encap": encap, "frame_size": row.size,
                         "ndr_mpps": row.ndr, "pdr_mpps": row.pdr, "xdp_tx_mpps": row.tx, "xdp_drop_mpps": row.drop,
                         "ndr_over_floor": round(row.ratio, 4), "ndr_gbps": round(gbps(row.ndr, row.size), 4)})
        series.append(svg.Series(encap, points, _ENCAP_COLOURS.get(encap, "#333")))
    title = f"NDR as a share of the XDP_TX floor, per encap ({where})"
    section.charts.append(_chart(
        svg.line_chart(title, series, categories=labels, x_label="ingress frame size (bytes)",
                       y_label="NDR ÷ XDP_TX floor", hlines=[(1.0, "XDP_TX floor")]),
        title, "Line chart: NDR divided by the XDP_TX floor against frame size, one line per encap, "
               "dashed line at the floor (1.0).", data))

    floors = frame.groupby("size")[["tx", "drop"]].mean()
    series = [svg.Series("XDP_DROP floor", [(float(pos[s]), float(floors.loc[s, "drop"]),
                                             f"{s} B: {_fmt(float(floors.loc[s, 'drop']))} Mpps") for s in sizes],
                         "#000", dashed=True),
              svg.Series("XDP_TX floor", [(float(pos[s]), float(floors.loc[s, "tx"]),
                                           f"{s} B: {_fmt(float(floors.loc[s, 'tx']))} Mpps") for s in sizes],
                         "#888", dashed=True)]
    for encap in encaps:
        part = ordered[ordered["encap"] == encap]
        series.append(svg.Series(encap, [(float(pos[r.size]), float(r.ndr),
                                          f"{r.size} B: NDR {_fmt(r.ndr)} Mpps ({_fmt(gbps(r.ndr, r.size))} Gb/s), "
                                          f"PDR {_fmt(r.pdr)} Mpps") for r in part.itertuples()],
                                 _ENCAP_COLOURS.get(encap, "#333")))
    title = f"NDR throughput per encap against frame size ({where})"
    section.charts.append(_chart(
        svg.line_chart(title, series, categories=labels, x_label="ingress frame size (bytes)",
                       y_label="throughput (Mpps)"),
        title, "Line chart: NDR in million packets per second against frame size, one line per encap, "
               "with the XDP_TX and XDP_DROP floors.", data))

    by_key = {(row.encap, row.size): row for row in frame.itertuples()}
    table_rows = []
    for encap in encaps:
        cells = [Cell(encap, "key")]
        for size in sizes:
            row = by_key.get((encap, size))
            if row is None:
                cells.append(Cell("–", "num missing"))
            else:
                cells.append(Cell(f"{_fmt(row.ndr)} / {_fmt(row.pdr)} ({_fmt(row.ratio)})", "num",
                                  f"{row.trials} trials; XDP_TX floor {_fmt(row.tx)} Mpps; {row.run}"))
        table_rows.append(cells)
    section.tables.append(Table(
        f"NDR / PDR in Mpps (NDR ÷ XDP_TX floor) per encap and ingress frame size (bytes) — {where}",
        ["encap", *labels], table_rows))

    csit = []
    for encap in encaps:
        for size in sizes:
            row = by_key.get((encap, size))
            if row is None:
                continue
            csit.append([Cell(encap, "key"), Cell(str(size), "num"), Cell(_fmt(row.ndr, 3), "num"),
                         Cell(_fmt(gbps(row.ndr, size), 3), "num"), Cell(_fmt(row.pdr, 3), "num"),
                         Cell(_fmt(gbps(row.pdr, size), 3), "num"), Cell(_fmt(row.ratio), "num")])
    section.tables.append(Table(
        f"Throughput in Mpps and Gb/s (L1, ingress) — {where}",
        ["encap", "frame size (bytes)", "NDR (Mpps)", "NDR (Gb/s)", "PDR (Mpps)", "PDR (Gb/s)", "NDR ÷ XDP_TX"], csit))

    latency = _latency_table(frame, where)
    if latency is not None:
        section.tables.append(latency)
    versus = _versus_table(frame, where)
    if versus is not None:
        section.tables.append(versus)


LATENCY_CAPTION = "Latency at 10/50/90 % of PDR"


def _latency_table(frame: pd.DataFrame, where: str) -> Table | None:
    """Latency at shares of PDR for the points of ``frame`` that have any, or None."""
    ordered = sorted((row for row in frame.itertuples() if row.latency),
                     key=lambda row: (_encap_rank(row.encap), _size_order(row.size)))
    if not ordered:
        return None
    table_rows = []
    for row in ordered:
        for fig in sorted(row.latency, key=lambda f: f.share_of_pdr):
            table_rows.append([
                Cell(row.encap, "key"), Cell(str(row.size), "num"), Cell(str(fig.share_of_pdr), "num"),
                Cell(_fmt(fig.rate_mpps, 3), "num"), Cell(_fmt(gbps(fig.rate_mpps, row.size), 3), "num"),
                Cell(_fmt(fig.min_us, 1), "num"),
                Cell(_fmt(fig.p50_us, 1) if fig.p50_us is not None else "–", "num"),
                Cell(_fmt(fig.avg_us, 1), "num"),
                Cell(_fmt(fig.p99_us, 1) if fig.p99_us is not None else "–", "num"),
                Cell(_fmt(fig.max_us, 1), "num"),
            ])
    return Table(
        f"{LATENCY_CAPTION} (one way, TRex's latency stream; p50/p99 from its histogram) — {where}",
        ["encap", "frame size (bytes)", "share of PDR (%)", "rate (Mpps)", "rate (Gb/s)", "min (µs)", "p50 (µs)",
         "avg (µs)", "p99 (µs)", "max (µs)"],
        table_rows,
    )


def _versus_table(frame: pd.DataFrame, where: str) -> Table | None:
    """Another program's NDR/PDR beside ours for the points that carry one (measured interleaved)."""
    rows = []
    for row in sorted(frame.itertuples(), key=lambda r: (_encap_rank(r.encap), _size_order(r.size))):
        for v in row.versus:
            ratio = row.ndr / v.ndr_mpps if v.ndr_mpps > 0 else math.nan
            rows.append([Cell(row.encap, "key"), Cell(str(row.size), "num"), Cell(v.program),
                         Cell(_fmt(row.ndr, 3), "num"), Cell(_fmt(v.ndr_mpps, 3), "num"),
                         Cell(_fmt(row.pdr, 3), "num"), Cell(_fmt(v.pdr_mpps, 3), "num"),
                         Cell(_fmt(ratio) if math.isfinite(ratio) else "–", "num")])
    if not rows:
        return None
    return Table(f"l4lab vs another program on the same packets, same run — {where}",
                 ["encap", "frame size (bytes)", "program", "l4lab NDR (Mpps)", "its NDR (Mpps)", "l4lab PDR (Mpps)",
                  "its PDR (Mpps)", "l4lab ÷ it (NDR)"], rows)


def _rss(results: list[Result]) -> Section:
    section = Section(
        "rss",
        "Receive-side scaling on a real server",
        "How the encapsulated flows spread over a real's receive queues, for IPIP with a fixed or a "
        "flow-derived outer source and for GUE under each NIC hash setting (sd: addresses only, sdfn: "
        "addresses and ports). Source: the Toeplitz model (model), a NIC's own queue counters (nic:<driver>) "
        "or the kernel's RPS CPUs (measured). χ² and p are against an even spread; a p near 0 means the "
        "spread is not even.",
    )
    found = _newest(of_kind(results, RssPayload), lambda r, p: (r.machine.hostname, r.id))
    if not found:
        section.empty = True
        return section
    table_rows = []
    found = sorted(found, key=lambda rp: (any(sc.source != "model" for sc in rp[1].scenarios), rp[0].id))
    for result, payload in found:
        panels = []
        for sc in payload.scenarios:
            mean = sum(sc.queue_counts) / max(sc.nqueues, 1)
            subtitle = f"{sc.name} ({sc.source}): max/mean {_fmt(sc.max_over_mean)}, p {_p(sc.p_value, '= ')}"
            panels.append(svg.Bars(subtitle,
                                   [float(c) for c in sc.queue_counts],
                                   [f"queue {i}: {c} {sc.counted}" for i, c in enumerate(sc.queue_counts)], mean))
            table_rows.append([
                Cell(sc.name, "key"), Cell(result.id), Cell(sc.source), Cell(str(sc.nqueues), "num"),
                Cell(str(sc.flows), "num"),
                Cell(_fmt(sc.max_over_mean), "num bad" if sc.max_over_mean > 1.5 else "num",
                     "the busiest queue gets more than 1.5 × the mean" if sc.max_over_mean > 1.5 else ""),
                Cell(_fmt(sc.chi2, 1), "num"), Cell(_p(sc.p_value), "num")])
        title = f"{payload.scenarios[0].counted.capitalize()} per receive queue ({result.id})"
        data = [{"result": result.id, "scenario": sc.name, "source": sc.source, "queue": i, sc.counted: c}
                for sc in payload.scenarios for i, c in enumerate(sc.queue_counts)]
        section.charts.append(_chart(
            svg.bar_grid(title, panels, x_label="receive queue", y_label=payload.scenarios[0].counted),
            title, f"Bar charts of {payload.scenarios[0].counted} per receive queue for "
                   f"{', '.join(sc.name for sc in payload.scenarios)}; dashed line at the mean.", data))
    section.tables.append(Table(
        "Spread per scenario",
        ["scenario", "result", "source", "queues", "flows", "max ÷ mean", "χ²", "p-value"], table_rows))
    side = _rss_side_by_side(found)
    if side is not None:
        section.tables.append(side)
    return section


def _rss_side_by_side(found: list[tuple[Result, RssPayload]]) -> Table | None:
    """The model beside each NIC per encap and scenario, disagreements flagged (a NIC that collapses
    where the model spreads, or the reverse). Only where a NIC result exists."""
    by: dict[tuple[str, str], dict[str, Any]] = {}
    for result, payload in found:
        encap = result.encap or "–"
        for sc in payload.scenarios:
            if sc.source == "measured":
                continue
            used = sum(1 for c in sc.queue_counts if c)
            by.setdefault((encap, sc.name), {})[sc.source] = (sc, _spread_verdict(sc.max_over_mean, used, sc.nqueues))
    sources = sorted({src for v in by.values() for src in v if src != "model"})
    if not sources:
        return None
    rows = []
    for (encap, name), seen in sorted(by.items(), key=lambda kv: (_encap_rank(kv[0][0]), kv[0][1])):
        if not any(src in seen for src in sources):
            continue
        model = seen.get("model")
        cells = [Cell(encap, "key"), Cell(name),
                 Cell(f"{model[1]} ({_fmt(model[0].max_over_mean)})" if model else "–", "num" if model else "missing")]
        disagree = []
        for src in sources:
            nic = seen.get(src)
            if nic is None:
                cells.append(Cell("–", "missing", "not measured"))
                continue
            differs = model is not None and nic[1] != model[1]
            if differs:
                disagree.append(src)
            cells.append(Cell(f"{nic[1]} ({_fmt(nic[0].max_over_mean)})", "bad" if differs else "ok",
                              f"{nic[0].flows} {nic[0].counted} over {nic[0].nqueues} queues"))
        cells.append(Cell("DISAGREE: " + ", ".join(disagree) if disagree else ("agree" if model else "no model"),
                          "bad" if disagree else ("ok" if model else "missing")))
        rows.append(cells)
    return Table("Model beside NIC per encap and setting (verdict and max ÷ mean)",
                 ["encap", "scenario", "model", *sources, "model vs NIC"], rows)


def _pmtu(results: list[Result]) -> Section:
    section = Section(
        "pmtu",
        "Path MTU through the balancer",
        "A transfer larger than the path MTU after encapsulation: with the LB's own ICMP too-big (icmp), "
        "with TCP MSS clamping (mss-clamp), with a router behind the LB sending the ICMP (blackhole, "
        "expected to fail), and a single DF datagram (udp-df, also run by the demo). Route MTU is what the "
        "client learnt.",
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
    data = [{"n": pt.n, "ring_size": pt.ring_size, "slots_owned_by_removed": pt.slots_owned_by_removed,
             "slots_changed": pt.slots_changed, "theoretical_slots": pt.theoretical_slots,
             "katran_slots_owned": pt.katran.slots_owned_by_removed if pt.katran else None,
             "katran_slots_changed": pt.katran.slots_changed if pt.katran else None} for pt in points]
    katran = [pt for pt in points if pt.katran is not None]

    def pct(v: float, ring: int) -> float:
        return 100 * v / ring

    series = [svg.Series("theoretical: 1/N of the ring",
                         [(pt.n, pct(pt.theoretical_slots, pt.ring_size),
                           f"N={pt.n}: {pct(pt.theoretical_slots, pt.ring_size):.3g} %")
                          for pt in points], "#888", dashed=True, markers=False),
              svg.Series("l4lab: slots changed",
                         [(pt.n, pct(pt.slots_changed, pt.ring_size),
                           f"N={pt.n}: {pt.slots_changed} of {pt.ring_size} slots "
                           f"({pct(pt.slots_changed, pt.ring_size):.3g} %)")
                          for pt in points], svg.PALETTE[0])]
    if katran:
        series.append(svg.Series("Katran: slots changed",
                                 [(pt.n, pct(pt.katran.slots_changed, pt.katran.ring_size),
                                   f"N={pt.n}: {pt.katran.slots_changed} slots") for pt in katran if pt.katran],
                                 svg.PALETTE[1], line=False))
    title = "Ring disruption against the number of reals"
    section.charts.append(_chart(
        svg.line_chart(title, series, x_label="reals before the removal, N (log scale)",
                       y_label="slots changed (% of ring, log)", log_x=True, log_y=True, y_min=None),
        title, "Log-log chart: percentage of ring slots changed against N for l4lab and Katran, with the "
               "theoretical 1/N line.", data))

    series = [svg.Series("l4lab", [(pt.n, pct(pt.slots_changed - pt.slots_owned_by_removed, pt.ring_size),
                                    f"N={pt.n}: {pt.slots_changed - pt.slots_owned_by_removed} slots")
                                   for pt in points], svg.PALETTE[0])]
    if katran:
        series.append(svg.Series("Katran", [(pt.n, pct(pt.katran.slots_changed - pt.katran.slots_owned_by_removed,
                                                        pt.katran.ring_size),
                                             f"N={pt.n}: "
                                             f"{pt.katran.slots_changed - pt.katran.slots_owned_by_removed} slots")
                                            for pt in katran if pt.katran], svg.PALETTE[1], line=False))
    title = "Collateral moves: slots changed that the removed real did not own"
    section.charts.append(_chart(
        svg.line_chart(title, series, x_label="reals before the removal, N (log scale)",
                       y_label="collateral slots (% of ring)", log_x=True),
        title, "Chart: collateral slot moves as a percentage of the ring against N for l4lab and Katran.", data))

    table_rows = []
    for pt in points:
        k, c = pt.katran, pt.connections
        table_rows.append([
            Cell(str(pt.n), "num"), Cell(str(pt.ring_size), "num"), Cell(str(pt.slots_owned_by_removed), "num"),
            Cell(str(pt.slots_changed), "num"), Cell(_fmt(pt.theoretical_slots, 0), "num"),
            Cell(str(pt.slots_changed - pt.slots_owned_by_removed), "num"),
            Cell(f"{k.slots_owned_by_removed} / {k.slots_changed}" if k else "–", "num"),
            Cell(f"{c.survived} / {c.reset} / {c.failed_fast}" if c else "–", "num")])
    section.tables.append(Table(
        "Slots per N (ring of the size given)",
        ["N", "ring slots", "owned by removed", "changed", "theoretical (ring ÷ N)", "collateral",
         "Katran owned / changed", "connections survived / reset / failed fast"], table_rows))
    return section


def _failover(results: list[Result]) -> Section:
    section = Section(
        "failover",
        "Failover timelines",
        "What happened, and when, in each failover test; the failover time is how long traffic was "
        "interrupted.",
    )
    found = _newest(of_kind(results, FailoverPayload), lambda r, p: (r.machine.hostname, r.id))
    if not found:
        section.empty = True
        return section
    table_rows = []
    for result, payload in sorted(found, key=lambda rp: rp[0].id):
        events = sorted(payload.timeline, key=lambda e: e.t)
        title = f"{result.id}: traffic interrupted for {payload.failover_seconds:.2f} s"
        section.charts.append(_chart(
            svg.timeline(title, [(e.t, e.event) for e in events], x_label="time since the test started (s)"),
            title, f"Timeline of {len(events)} events in {result.id}; failover took "
                   f"{payload.failover_seconds:.2f} seconds.",
            [{"test": result.id, "t": e.t, "event": e.event} for e in events]))
        table_rows.append([Cell(result.id, "key"), Cell(_fmt(payload.failover_seconds), "num"),
                           Cell(str(len(events)), "num")])
    section.tables.append(Table("Failover time per test", ["test", "failover (s)", "events"], table_rows))
    return section


_OUTCOME_CSS = {"finding": "fail", "error": "fail", "not-applicable": "skip"}  # the four verdicts, as cells


def _conformance(results: list[Result]) -> Section:
    section = Section(
        "conformance",
        "Conformance",
        "End-to-end tests, one column per encap; hover a cell for its duration.",
    )
    rows = [
        {"time": r.time, "test": p.test, "encap": p.encap, "outcome": p.outcome, "duration": p.duration_s}
        for r, p in of_kind(results, ConformancePayload) if p.dut == "l4lab"
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
                cells.append(Cell(row.outcome, _OUTCOME_CSS.get(row.outcome, row.outcome), f"{row.duration:.2f} s"))
        table_rows.append(cells)
    counts = frame["outcome"].value_counts()
    shown = ", ".join(f"{counts[o]} {o}" for o in counts.index)
    section.notes.append(f"{shown} of {len(frame)} test × encap cases (l4lab).")
    section.tables.append(Table("Outcome per test and encap", ["test", *ENCAP_IDS], table_rows))
    return section


def _duts(results: list[Result]) -> Section:
    """The conformance matrix of the newest `l4lab conform` run (reports/conformance.py)."""
    from reports import conformance

    return conformance.section(results)


# --- figures, history and comparison ------------------------------------------------------------


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


def _history(results: list[Result]) -> Section:
    section = Section(
        "history",
        "Runs and trends",
        "Every run is kept. The newest run per machine and generator, then every numeric figure measured "
        "at two or more commits: its value at each commit (newest run per commit, oldest first; hover a dot; a red "
        "mark starts a change beyond the noise, found by FD.io CSIT's jumpavg), the first and the latest value and "
        "the change.",
    )
    if not results:
        section.empty = True
        return section
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
          Cell(_short(r.commit)), Cell(_when(r)), Cell(r.id), Cell(str(counts[(host, gen)]), "num")]
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
        spark = svg.sparkline(name, [(v, f"{_short(c)} ({t.astimezone(UTC):%Y-%m-%d %H:%M}): {v:.4g}"
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
    return section


def _select(results: list[Result], spec: str) -> list[Result]:
    """The results of one run named by ``spec``: a commit (prefix of at least 4 hex digits), a results
    file, or a results directory."""
    path = Path(spec)
    if path.is_dir():
        return load_results(path)
    if path.is_file():
        from reports.schema import parse_result

        return [parse_result(json.loads(path.read_text(encoding="utf-8")), path)]
    if re.fullmatch(r"[0-9a-f]{4,40}", spec):
        chosen = [r for r in results if r.commit.startswith(spec)]
        if chosen:
            return chosen
        raise ResultsError("<compare>", spec, "no result has a commit starting with it; see the runs in the report")
    raise ResultsError("<compare>", spec, "is neither a commit (4+ hex digits), a results file nor a directory")


def compare_html(results: list[Result], a: str, b: str, now: datetime | None = None) -> str:
    """A page with runs ``a`` and ``b`` side by side: every figure either has, and the change."""
    left, right = _select(results, a), _select(results, b)

    def latest(chosen: list[Result]) -> dict[str, float | str]:
        out: dict[str, tuple[datetime, float | str]] = {}
        for r in chosen:
            for name, value in figures(r).items():
                key = f"{name} — {r.machine.hostname}"
                if key not in out or r.time >= out[key][0]:
                    out[key] = (r.time, value)
        return {k: v for k, (_, v) in out.items()}

    fa, fb = latest(left), latest(right)
    rows = []
    for name in sorted(set(fa) | set(fb)):
        va, vb = fa.get(name), fb.get(name)
        if isinstance(va, float | int) and isinstance(vb, float | int):
            change = "same" if va == vb else f"{(vb - va) / va * 100:+.1f} %" if va else "from 0"
            css = "num" if va == vb else "num changed"
        else:
            change = "same" if va == vb else "differs" if va is not None and vb is not None else "only in one"
            css = "" if va == vb else "changed"
        rows.append([Cell(name, "key"), Cell("–" if va is None else f"{va:.4g}" if isinstance(va, float) else str(va)),
                     Cell("–" if vb is None else f"{vb:.4g}" if isinstance(vb, float) else str(vb)), Cell(change, css)])
    section = Section("compare", f"Compare {a} with {b}",
                      f"A: {len(left)} results ({_describe_runs(left)}). B: {len(right)} results "
                      f"({_describe_runs(right)}). Each figure is the newest of its side; change is B against A.")
    section.tables.append(Table(f"Figures of {a} (A) and {b} (B)", ["figure — machine", "A", "B", "change"], rows))
    section.empty = not rows
    return _page([section], left + right, source=f"{a} vs {b}", now=now, title="l4lab comparison")


def _describe_runs(chosen: list[Result]) -> str:
    commits = _distinct([_short(r.commit) for r in chosen])
    return "commits " + ", ".join(commits[:3]) + (" …" if len(commits) > 3 else "") if commits else "none"
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
            ["byte-exact transforms", "verdict-exact", "same real", "of which Katran's real",
             "deliberate deviations", "not applicable"],
            [[Cell(str(v), "num") for v in (p.byte_exact, p.verdict_exact, p.same_real + p.verdict_and_real,
                                             p.katrans_real, p.deviations, p.not_applicable)]],
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


def _nics(results: list[Result]) -> list[str]:
    out = []
    for r, p in of_kind(results, BenchPayload):
        if p.nic is not None:
            speed = f", {p.nic.speed_mbps / 1000:g} Gb/s" if p.nic.speed_mbps else ""
            out.append(f"{p.nic.model}, driver {p.nic.driver}{speed} ({r.machine.hostname}, {p.generator})")
    return _distinct(out)


def _page(sections: list[Section], results: list[Result], source: str, now: datetime | None, title: str) -> str:
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
        title=title,
        sections=sections,
        machines=_distinct(
            [f"{r.machine.hostname} (kernel {r.machine.kernel}, {r.machine.cpus} CPUs)" for r in results]
        ),
        commits=_distinct([r.commit for r in results]),
        generators=_distinct([p.generator for _, p in of_kind(results, BenchPayload)]),
        nics=_nics(results),
        first=times[0].astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC") if times else "",
        last=times[-1].astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC") if times else "",
        generated=(now or datetime.now(UTC)).strftime("%Y-%m-%d %H:%M UTC"),
        count=len(results),
        synthetic=sum(1 for r in results if r.synthetic),
        source=source,
        no_results=NO_RESULTS,
        zoom_script=Markup(svg.ZOOM_SCRIPT),  # noqa: S704 - our own constant
    )


def render_html(results: list[Result], source: str = "", now: datetime | None = None) -> str:
    """The report page for ``results`` (possibly none) as one HTML string."""
    matrix = _duts(results)
    sections = [
        *([matrix] if not matrix.empty else []),
        _summary(results),
        _demo(results),
        _bench(results),
        *([versus] if not (versus := _side_by_side(results)).empty else []),
        _rss(results),
        _pmtu(results),
        _churn(results),
        _failover(results),
        _conformance(results),
        _corpus(results),
        _fuzz(results),
        _history(results),
    ]
    return _page(_left_out(sections), results, source, now, "l4lab report")


def _left_out(sections: list[Section]) -> list[Section]:
    """The sections with data, then one listing those without and the command that fills each."""
    empty = [s for s in sections if s.empty]
    if not empty:
        return sections
    rows = [[Cell(s.title), Cell(FILLED_BY.get(s.id, "make test"))] for s in empty]
    missing = Section("missing", "Not in this report",
                      "Kinds of results these results files hold none of, and the command that measures each.",
                      tables=[Table("sections left out", ["section", "measured by"], rows)])
    return [s for s in sections if not s.empty] + [missing]


def _write(target: Path, page: str) -> Path:
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp")
    tmp.write_text(page, encoding="utf-8")
    tmp.replace(target)
    return target


def render(results_directory: str | Path | None = None, out: str | Path | None = None) -> Path:
    """Render the results in ``results_directory`` into ``out``; returns the path written.

    Raises ResultsError for a missing directory or an invalid results file.
    """
    source = results_dir(results_directory)
    results = load_results(source)
    return _write(Path(out) if out is not None else DEFAULT_OUT, render_html(results, source=str(source)))


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
    parser.add_argument("--compare", nargs=2, metavar=("A", "B"),
                        help="two runs side by side: each a commit (prefix), a results file or a results directory "
                             "(default out: compare.html beside the report)")
    args = parser.parse_args(argv)
    try:
        if args.compare:
            results = load_results(args.results)
            page = compare_html(results, *args.compare)
            path = _write(args.out or DEFAULT_OUT.with_name("compare.html"), page)
        else:
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
