"""side_by_side.py: l4lab and another XDP balancer timed in one run (`l4lab bench --katran`): the
payload part, its section and the trend of each ratio across runs."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC
from typing import TYPE_CHECKING, Literal, cast

from reports import charts, trend
from reports.page import Cell, Section, Table, encap_rank, fmt, kind_section, run_label, short_commit, size_order
from reports.payload import EncapId, Kind, at_least, between, non_empty, rule

if TYPE_CHECKING:
    from reports.bench import BenchPayload, Versus
    from reports.schema import Result


#: The cases of the side-by-side micro-benchmark (lab/bench/katran.py), in table order.
SideCaseName = Literal["non-vip", "session-hit", "new-syn", "new-ack"]


@dataclass(frozen=True)
class SideCase:
    """One row of the side-by-side micro-benchmark: both programs' median on identical packets.

    ``ratio_above_floor`` is (ns - floor) / (other_ns - floor) with the MAC-swap XDP_TX floor of the
    same run; None when the other program is not above the floor. ``calls`` is how many calls of each
    program returned the expected action with its path counter moving by one (every call is checked).
    """

    encap: EncapId | None  # None: a case that encapsulates nothing (non-vip)
    case: SideCaseName
    ns: float = field(metadata=rule(at_least(0)))  # l4lab, median ns per call
    other_ns: float = field(metadata=rule(at_least(0)))
    ratio_above_floor: float | None
    path_counter: str = field(metadata=rule(non_empty))  # l4lab's counter that only this case moves
    other_path_counter: str = field(metadata=rule(non_empty))
    calls: int = field(metadata=rule(at_least(1)))
    round_ratios: list[float | None] = field(default_factory=list)  # the ratio of each round's medians


@dataclass(frozen=True)
class ProgramSize:
    """Both programs' size for one encap, from the kernel's bpf_prog_info of the loaded programs."""

    encap: EncapId
    verified_insns: int = field(metadata=rule(at_least(1)))  # l4lab; instructions the verifier walked
    other_verified_insns: int = field(metadata=rule(at_least(1)))
    xlated_insns: int = field(metadata=rule(at_least(1)))
    other_xlated_insns: int = field(metadata=rule(at_least(1)))


@dataclass(frozen=True)
class LoopCost:
    """CPU time per frame of the whole live-frames loop on veth with one program on the LB side.

    One thread sends unpaced; the loop (generator, veths, the LB program, the sink) runs in its
    softirqs on its CPU, so its CPU time per frame is the loop's cost, robust to other processes'
    load (lab/bench/gen/xdplive.py chain_cost). The median of the run's rounds.
    """

    program: str = field(metadata=rule(non_empty))  # "xdp_drop", "xdp_tx" (the floors), "l4lab", "katran"
    encap: EncapId | None  # None for the floors
    cpu_ns_per_frame: float = field(metadata=rule(at_least(0)))
    frames: int = field(metadata=rule(at_least(1)))  # per round
    rounds: int = field(metadata=rule(at_least(1)))
    delivered: float = field(metadata=rule(between(0, 1)))  # share of the frames the sink counted, worst round
    traffic: Literal["udp-flows", "syn-flood"] = "udp-flows"  # syn-flood: every frame a new flow's TCP SYN


@dataclass(frozen=True)
class SessionTables:
    """One program's session tables as the side-by-side bench loaded them (the IPv4 flows' table for l4lab)."""

    program: str = field(metadata=rule(non_empty))
    tables: int = field(metadata=rule(at_least(1)))   # l4lab: one for all CPUs; Katran: one per CPU
    entries: int = field(metadata=rule(at_least(1)))  # of each table
    bytes: int = field(metadata=rule(at_least(0)))    # of all of them, the kernel's memlock figure


@dataclass(frozen=True)
class SynFlood:
    """One program's NDR when every frame is a new flow's TCP SYN from one of `sources` (live frames, 64 B)."""

    program: str = field(metadata=rule(non_empty))  # "l4lab" or the other program
    encap: EncapId
    sources: int = field(metadata=rule(at_least(1)))
    ndr_mpps: float = field(metadata=rule(at_least(0)))
    pdr_mpps: float = field(metadata=rule(at_least(0)))
    floor_xdp_tx_mpps: float = field(metadata=rule(at_least(0)))  # the same run's MAC-swap floor
    sessions_after: int = field(metadata=rule(at_least(0)))  # entries in its session tables after the search


@dataclass(frozen=True)
class LiveNdr:
    """One live case's NDR in one round (lab/bench/katran_live.py names the cases)."""

    case: str = field(metadata=rule(non_empty))  # "floor:xdp_tx", "l4lab:ip4-ipip", "katran:syn-flood", ...
    ndr_mpps: float = field(metadata=rule(at_least(0)))
    pdr_mpps: float = field(metadata=rule(at_least(0)))


@dataclass(frozen=True)
class LiveRound:
    """One round of the live cases' NDR searches, every program loaded afresh; the points, the floors and
    the SYN flood hold the medians of the rounds."""

    first_loaded: str = field(metadata=rule(non_empty))  # whose session tables were created first
    ndr: list[LiveNdr] = field(metadata=rule(non_empty))

    def problems(self) -> Iterator[tuple[str, str]]:
        names = [n.case for n in self.ndr]
        for i, name in enumerate(names):
            if name in names[:i]:
                yield f"ndr[{i}].case", f"repeats {name}; one NDR per case and round"
        for i, n in enumerate(self.ndr):
            if n.pdr_mpps < n.ndr_mpps:
                yield f"ndr[{i}].pdr_mpps", f"must be ≥ ndr_mpps ({n.ndr_mpps}) but got {n.pdr_mpps}"


@dataclass(frozen=True)
class SideBySide:
    """l4lab and another XDP balancer timed in one run on identical packets (lab/bench/katran.py).

    The micro-benchmark (BPF_PROG_TEST_RUN, repeat = 1, interleaved, one CPU) is here; the same
    run's live-frames NDR of both are the payload's points, the other program's in ``versus``.
    """

    program: str = field(metadata=rule(non_empty))  # the other program, e.g. "katran"
    frame_bytes: int = field(metadata=rule(at_least(14)))  # frame length of every timed call
    rounds: int = field(metadata=rule(at_least(1)))
    session_table_entries: int = field(metadata=rule(at_least(1)))  # per-CPU LRU size, both programs
    floor_xdp_drop_ns: float = field(metadata=rule(at_least(0)))
    floor_xdp_tx_ns: float = field(metadata=rule(at_least(0)))  # MAC-swap XDP_TX
    cases: list[SideCase] = field(metadata=rule(non_empty))
    sizes: list[ProgramSize] = field(default_factory=list)
    loop: list[LoopCost] = field(default_factory=list)  # live frames: CPU ns per frame of each program's loop
    seed: int | None = None  # the order's seed (lab/bench/order.py): `l4lab bench --katran --seed N` replays it
    first_loaded: list[str] = field(default_factory=list)  # per round: whose session tables were created first
    session_tables: list[SessionTables] = field(default_factory=list)
    syn_flood: list[SynFlood] = field(default_factory=list)
    prefill: float = field(default=0.0, metadata=rule(at_least(0)))  # tables this full of other flows when timed
    live_rounds: list[LiveRound] = field(default_factory=list)  # each round's live NDRs

    def problems(self) -> Iterator[tuple[str, str]]:
        seen: set[tuple[str | None, str]] = set()
        for i, c in enumerate(self.cases):
            if (c.encap, c.case) in seen:
                yield f"cases[{i}]", f"repeats {c.case} of {c.encap or 'no encap'}; one row per encap and case"
            seen.add((c.encap, c.case))
            above = c.other_ns - self.floor_xdp_tx_ns
            if c.ratio_above_floor is not None and above > 0:
                expected = (c.ns - self.floor_xdp_tx_ns) / above
                if abs(expected - c.ratio_above_floor) > 0.01 + 0.01 * abs(expected):
                    yield (f"cases[{i}].ratio_above_floor",
                           f"must be (ns - floor_xdp_tx_ns) / (other_ns - floor_xdp_tx_ns) = {expected:.3f} "
                           f"but got {c.ratio_above_floor}")


def runs(results: Iterable[Result]) -> list[tuple[Result, BenchPayload]]:
    """The bench results that carry a side-by-side run, in the order given."""
    # bench.py imports this module (its payload holds a SideBySide): the bench payload is picked by kind here
    bench = [(r, cast("BenchPayload", r.payload)) for r in results if r.kind is Kind.BENCH]
    return [(r, p) for r, p in bench if p.side_by_side is not None]


SIDE_BY_SIDE_TITLE = "l4lab vs Katran"


_SIDE_CASES = {"non-vip": "non-VIP", "session-hit": "session hit", "new-syn": "new flow, SYN",
               "new-ack": "new flow, ACK"}


def _intro(name: str) -> str:
    return (f"l4lab and {name} timed in one run on identical packets (l4lab bench --katran): single "
            "BPF_PROG_TEST_RUN calls (repeat = 1) taking turns on one CPU, every call's action and path counter "
            "checked, medians in ns; the ratio is l4lab's cost above the MAC-swap XDP_TX floor divided by "
            f"{name}'s. Then both programs' live-frames NDR at 64 B on the bench veth, beside the floors of "
            "the same run. Only ratios within one run are comparable; absolute figures vary ±20 % between runs.")


@kind_section("versus", SIDE_BY_SIDE_TITLE, _intro("Katran"))
def section(section: Section, results: list[Result]) -> bool:
    """The newest side-by-side run (l4lab bench --katran): micro table, program sizes, live-frames NDR."""
    found = runs(results)
    if not found:
        return False
    other = found[-1][1].side_by_side.program  # type: ignore[union-attr]
    name = other.capitalize() if other.islower() else other
    section.intro = _intro(name)
    result, payload = max(found, key=lambda rp: rp[0].time)
    sbs = payload.side_by_side
    assert sbs is not None
    run = run_label(result)
    section.tables.append(_test_run_table(sbs, name, run))
    if sbs.seed is not None:
        section.notes.append(
            f"Order: seed {sbs.seed} (`l4lab bench --katran --seed {sbs.seed}` replays it); the cases shuffled in "
            f"every iteration; tables created first per round: {', '.join(sbs.first_loaded)}. Session tables: "
            + "; ".join(f"{t.program} {t.tables} × {t.entries:,} entries, {t.bytes / 2**20:.0f} MiB"
                        for t in sbs.session_tables) + ".")
    if sbs.sizes:
        section.tables.append(_sizes_table(sbs, name, run))
    if sbs.syn_flood:
        section.tables.append(_syn_flood_table(sbs, run))
    if sbs.loop:
        section.tables.append(_loop_table(sbs, other, name, run))
        section.notes.append(_LOOP_NOTE)
    live = _live_table(result, payload, other, name)
    if live is not None:
        section.tables.append(live)
    else:
        section.notes.append("This run measured no live frames (the test-run table only).")
    _ratio_trends(section, results)
    return True


def _test_run_table(sbs: SideBySide, name: str, run: str) -> Table:
    rows = []
    for c in sbs.cases:
        encap = c.encap or "–"
        ratio = fmt(c.ratio_above_floor) if c.ratio_above_floor is not None else "–"
        css = "num" if c.ratio_above_floor is None else ("num ok" if c.ratio_above_floor <= 1 else "num warn")
        rounds = [r for r in c.round_ratios if r is not None]
        rows.append([Cell(encap, "key"), Cell(_SIDE_CASES.get(c.case, c.case), "key"),
                     Cell(fmt(c.other_ns, 0), "num"), Cell(fmt(c.ns, 0), "num"), Cell(ratio, css),
                     Cell(f"{fmt(min(rounds))}–{fmt(max(rounds))}" if rounds else "–", "num",
                          "the ratio of each round's medians: " + ", ".join(fmt(r) for r in rounds)),
                     Cell(f"{c.path_counter} / {c.other_path_counter}", "", "the counter only this case moves, "
                          "checked after every round"),
                     Cell(str(c.calls), "num")])
    for label, ns in (("XDP_DROP floor", sbs.floor_xdp_drop_ns), ("MAC-swap XDP_TX floor", sbs.floor_xdp_tx_ns)):
        rows.append([Cell("–", "key"), Cell(label, "key"), Cell("", "num"), Cell(fmt(ns, 0), "num"),
                     Cell("–", "num"), Cell("–", "num"), Cell("–"), Cell("", "num")])
    return Table(
        f"Test run, median ns per call ({sbs.frame_bytes}-byte frames, {sbs.rounds} rounds, session tables of "
        f"{sbs.session_table_entries} entries per CPU"
        f"{f', {sbs.prefill:.0%} full of other flows' if sbs.prefill else ''}) — {run}",
        ["encap", "case", f"{name} (ns)", "l4lab (ns)", f"l4lab ÷ {name}, cost above the floor", "over the rounds",
         f"path counter checked (l4lab / {name})", "calls checked"], rows)


def _sizes_table(sbs: SideBySide, name: str, run: str) -> Table:
    return Table(
        f"Program size: instructions the verifier walked, and after translation — {run}",
        ["encap", f"{name} verified", "l4lab verified", f"l4lab ÷ {name}", f"{name} xlated", "l4lab xlated"],
        [[Cell(z.encap, "key"), Cell(str(z.other_verified_insns), "num"), Cell(str(z.verified_insns), "num"),
          Cell(fmt(z.verified_insns / z.other_verified_insns), "num"), Cell(str(z.other_xlated_insns), "num"),
          Cell(str(z.xlated_insns), "num")] for z in sbs.sizes])


def _syn_flood_table(sbs: SideBySide, run: str) -> Table:
    theirs = next((f for f in sbs.syn_flood if f.program == sbs.program), None)
    rows = []
    for f in sbs.syn_flood:
        versus = Cell("–", "num")
        if f.program == "l4lab" and theirs is not None:
            versus = _versus_cell(_live_ratios(sbs, "l4lab:syn-flood", f"{sbs.program}:syn-flood"),
                                  f.ndr_mpps, theirs.ndr_mpps)
        floor = fmt(f.ndr_mpps / f.floor_xdp_tx_mpps) if f.floor_xdp_tx_mpps else "–"
        rows.append([Cell(f.program, "key"), Cell(f.encap), Cell(f"{f.sources:,}", "num"),
                     Cell(f"{fmt(f.ndr_mpps, 3)} ({floor})", "num"), versus, Cell(f"{f.sessions_after:,}", "num")])
    return Table(
        f"SYN flood: every frame a new flow's TCP SYN, live frames at 64 B, NDR in Mpps (÷ XDP_TX floor) — {run}",
        ["program", "encap", "sources", "NDR", f"÷ {sbs.program}'s NDR: median of rounds (range)",
         "sessions in its tables after"], rows)


def _versus(rounds: list[float], ours: float, theirs: float) -> float:
    """One NDR over another's: the median of the rounds' ratios, or (a result written before the rounds) the
    ratio of the two NDRs; NaN when the other found none."""
    if rounds:
        return float(statistics.median(rounds))
    return ours / theirs if theirs > 0 else float("nan")


def _versus_cell(rounds: list[float], ours: float, theirs: float) -> Cell:
    """_versus() with the rounds' range, each round's ratio in the title."""
    value = _versus(rounds, ours, theirs)
    if rounds:
        return Cell(f"{fmt(value)} ({fmt(min(rounds))}–{fmt(max(rounds))})", "num",
                    "each round's ratio: " + ", ".join(fmt(r) for r in rounds))
    return Cell(fmt(value) if value == value else "–", "num")


def _loop_table(sbs: SideBySide, other: str, name: str, run: str) -> Table:
    cost = {(lc.program, lc.encap): lc for lc in sbs.loop if lc.traffic == "udp-flows"}
    tx_cost = cost.get(("xdp_tx", None))
    loop_rows = []
    for encap in sorted({lc.encap for lc in sbs.loop if lc.encap}, key=encap_rank):
        cells = [Cell(encap, "key"), Cell(fmt(tx_cost.cpu_ns_per_frame, 0) if tx_cost else "–", "num")]
        for who in ("l4lab", other):
            got = cost.get((who, encap))
            if got is None:
                cells.append(Cell("–", "num missing"))
                continue
            share = ""
            if tx_cost and got.cpu_ns_per_frame:
                share = f" ({fmt(tx_cost.cpu_ns_per_frame / got.cpu_ns_per_frame)})"
            cells.append(Cell(f"{fmt(got.cpu_ns_per_frame, 0)}{share}", "num",
                              f"{got.frames} frames a round; delivered {fmt(got.delivered, 3)}"))
        loop_rows.append(cells)
    return Table(
        f"Live frames on veth: CPU ns per frame of the whole loop (XDP_TX floor ÷ it), median of "
        f"{max(lc.rounds for lc in sbs.loop)} rounds — {run}",
        ["encap", "MAC-swap XDP_TX floor", "l4lab", name], loop_rows)


_LOOP_NOTE = (
    "On veth the whole loop (generator, both veths, the LB program, the counting sink) runs in the sending "
    "thread's softirqs on one CPU, so its CPU time per frame is the loop's cost and the NDR is the rate "
    "the senders can sustain: frames are not lost in flight, a paced sender falls behind. The CPU-time "
    "ratio does not count time the scheduler gave to other processes; the NDR does."
)


def _live_table(result: Result, payload: BenchPayload, other: str, name: str) -> Table | None:
    live = []
    sbs = payload.side_by_side
    rounds = f", median of {len(sbs.live_rounds)} rounds" if sbs is not None and sbs.live_rounds else ""
    for pt in sorted(payload.points, key=lambda pt: (encap_rank(pt.encap), size_order(pt.frame_size))):
        tx = pt.floor.xdp_tx_mpps
        theirs: list[Versus | None] = [v for v in pt.versus if v.program == other] or [None]
        for v in theirs:
            them = "–" if v is None else f"{fmt(v.ndr_mpps, 3)} ({fmt(v.ndr_mpps / tx) if tx else '–'})"
            versus = Cell("–", "num") if v is None or sbs is None else _versus_cell(
                _live_ratios(sbs, f"l4lab:{pt.encap}", f"{v.program}:{pt.encap}"), pt.ndr_mpps, v.ndr_mpps)
            live.append([Cell(pt.encap, "key"), Cell(str(pt.frame_size), "num"),
                         Cell(fmt(pt.floor.xdp_drop_mpps, 3), "num"), Cell(fmt(tx, 3), "num"),
                         Cell(f"{fmt(pt.ndr_mpps, 3)} ({fmt(pt.ndr_mpps / tx) if tx else '–'})", "num"),
                         Cell(them, "num"), versus])
    if not live:
        return None
    return Table(f"Live frames on veth: NDR in Mpps (÷ XDP_TX floor){rounds} — "
                 f"{run_label(result, payload.generator)}",
                 ["encap", "frame size (bytes)", "XDP_DROP floor", "MAC-swap XDP_TX floor", "l4lab", name,
                  f"l4lab ÷ {name}: median of rounds (range)"], live)


def _ratio_trends(section: Section, results: list[Result]) -> None:
    """Each ratio over every run of `l4lab bench --katran`, with jumpavg's change points (reports/trend.py)."""
    rows = []
    for t in trends(results):
        marks = {i: change for i, change in t.changes}
        points = [(s.value, f"{short_commit(s.commit)} ({s.time.astimezone(UTC):%Y-%m-%d %H:%M}): {s.value:.3f}"
                   + (f" — {marks[i]}: a change beyond the noise" if i in marks else ""))
                  for i, s in enumerate(t.samples)]
        spark = charts.sparkline(t.name, points, marks=set(marks))
        last = t.changes[-1] if t.changes else None
        rows.append([Cell(t.name), Cell(f"{t.better} is better"), Cell(str(len(t.samples)), "num"),
                     Cell(" ".join(f"{s.value:.3f}" for s in t.samples), html=spark),
                     Cell(f"{t.samples[-1].value:.3f}", "num"),
                     Cell(f"{last[1]} at {short_commit(t.samples[last[0]].commit)}" if last else "none",
                          "warn" if last and last[1] == "worse" else "")])
    if rows:
        section.tables.append(Table(
            "Ratios across runs and commits; a red mark starts a change beyond the noise (FD.io CSIT's jumpavg)",
            ["ratio — machine, result", "direction", "runs", "trend", "latest", "last change"], rows))
    else:
        section.notes.append("Trends of these ratios appear once two runs of `l4lab bench --katran` are in the "
                             "results directory.")


def _series(results: Iterable[Result]) -> dict[str, tuple[trend.Direction, list[trend.Sample]]]:
    out: dict[str, tuple[trend.Direction, list[trend.Sample]]] = {}

    def add(name: str, better: trend.Direction, r: Result, value: float, rounds: Sequence[float | None] = ()) -> None:
        got = tuple(x for x in rounds if x is not None)
        out.setdefault(name, (better, []))[1].append(trend.Sample(r.commit, r.time, value, got))

    for r, p in runs(results):
        sbs = p.side_by_side
        if sbs is None or r.synthetic:
            continue
        where = f"{r.machine.hostname}, {r.id}"
        for c in sbs.cases:
            if c.ratio_above_floor is not None:
                add(f"{c.encap or '-'} {c.case}: l4lab ÷ {sbs.program} above the floor — {where}", "lower", r,
                    c.ratio_above_floor, c.round_ratios)
        for pt in p.points:
            for v in pt.versus:
                if v.ndr_mpps > 0:
                    live = _live_ratios(sbs, f"l4lab:{pt.encap}", f"{v.program}:{pt.encap}")
                    add(f"{pt.encap} live NDR: l4lab ÷ {v.program} — {where}", "higher", r,
                        _versus(live, pt.ndr_mpps, v.ndr_mpps), live)
        floods = {f.program: f for f in sbs.syn_flood}
        theirs = floods.get(sbs.program)
        if "l4lab" in floods and theirs is not None and theirs.ndr_mpps > 0:
            live = _live_ratios(sbs, "l4lab:syn-flood", f"{sbs.program}:syn-flood")
            add(f"syn-flood live NDR: l4lab ÷ {sbs.program} — {where}", "higher", r,
                _versus(live, floods["l4lab"].ndr_mpps, theirs.ndr_mpps), live)
    return out


def _live_ratios(sbs: SideBySide, ours: str, theirs: str) -> list[float]:
    """One NDR over another's in each live round that has both (none for results written before rounds)."""
    out = []
    for rnd in sbs.live_rounds:
        got = {n.case: n.ndr_mpps for n in rnd.ndr}
        if got.get(theirs, 0) > 0 and ours in got:
            out.append(got[ours] / got[theirs])
    return out


def trends(results: Iterable[Result]) -> list[trend.Trend]:
    """Every side-by-side ratio measured at two or more runs, with its change points."""
    found = []
    for name, (better, samples) in sorted(_series(results).items()):
        if len(samples) < 2:
            continue
        ordered = tuple(sorted(samples, key=lambda s: s.time))
        found.append(trend.Trend(name, better, ordered, tuple(trend.classify(ordered, better))))
    return found


def figures(p: BenchPayload, sbs: SideBySide) -> dict[str, float | str]:
    """This result's figures by names stable across runs (reports/history.py trends and compares them)."""
    out: dict[str, float | str] = {}
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
    return out
