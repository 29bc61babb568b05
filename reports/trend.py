"""Each side-by-side ratio across commits, as FD.io CSIT keeps its trends: every `l4lab bench --katran`
result carries its commit, and a change beyond the noise is found by CSIT's own change-point detector,
`jumpavg` (PyPI): it groups a series of runs into stretches of one normal distribution each by the
minimum description length, so a new group starts only where a jump costs fewer bits than the noise.

A sample is one run; where the run kept its per-round ratios (lab/bench/order.py) the sample is those
rounds, so the detector weighs a run's own spread. Ratios of cost (l4lab ÷ Katran above the floor)
are better lower; ratios of rate (NDR ÷ the XDP_TX floor, l4lab ÷ Katran) better higher.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from reports.schema import BenchPayload, Result, of_kind

Direction = Literal["lower", "higher"]
Change = Literal["better", "worse"]
UNIT = 0.001  # the ratios' resolution: jumpavg counts bits in units of this


@dataclass(frozen=True)
class Sample:
    """One run's value of a ratio: its commit and time, the value, and the rounds it came from (if kept)."""

    commit: str
    time: datetime
    value: float
    rounds: tuple[float, ...] = ()


@dataclass(frozen=True)
class Trend:
    """A ratio over the runs, oldest first, with where jumpavg starts a new group and which way it moved."""

    name: str
    better: Direction
    samples: tuple[Sample, ...]
    changes: tuple[tuple[int, Change], ...]  # (index of the first sample of a new group, better or worse)


def _series(results: Iterable[Result]) -> dict[str, tuple[Direction, list[Sample]]]:
    out: dict[str, tuple[Direction, list[Sample]]] = {}

    def add(name: str, better: Direction, r: Result, value: float, rounds: Sequence[float | None] = ()) -> None:
        got = tuple(x for x in rounds if x is not None)
        out.setdefault(name, (better, []))[1].append(Sample(r.commit, r.time, value, got))

    for r, p in of_kind(list(results), BenchPayload):
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
                    add(f"{pt.encap} live NDR: l4lab ÷ {v.program} — {where}", "higher", r, pt.ndr_mpps / v.ndr_mpps)
        floods = {f.program: f for f in sbs.syn_flood}
        theirs = floods.get(sbs.program)
        if "l4lab" in floods and theirs is not None and theirs.ndr_mpps > 0:
            add(f"syn-flood live NDR: l4lab ÷ {sbs.program} — {where}", "higher", r,
                floods["l4lab"].ndr_mpps / theirs.ndr_mpps)
    return out


def change_points(values: Sequence[float]) -> list[int]:
    """Where jumpavg starts a new group in a plain series (one value per run), whichever way it moved."""
    import jumpavg

    if len(values) < 2 or min(values) < 0 or max(values) <= 0:
        return []  # jumpavg counts bits of positive values (counts, times, rates and ratios are)
    starts, start = [], 0
    for group in jumpavg.classify(list(values), unit=UNIT * max(1.0, max(values))):
        if start:
            starts.append(start)
        start += len(group.run_list)
    return starts


def classify(samples: Sequence[Sample], better: Direction) -> list[tuple[int, Change]]:
    """Where jumpavg starts a new group in the samples, and whether that group is better or worse."""
    import jumpavg

    if any(min((*s.rounds, s.value)) <= 0 for s in samples):
        return []  # jumpavg counts bits of positive values; a cost below the floor has no ratio to trend
    runs = [list(s.rounds) if len(s.rounds) > 1 else s.value for s in samples]
    groups = jumpavg.classify(runs, unit=UNIT)
    changes: list[tuple[int, Change]] = []
    start = 0
    for group in groups:
        if start and group.comment in ("regression", "progression"):
            up = group.comment == "progression"  # jumpavg's words assume higher is better
            changes.append((start, "better" if up == (better == "higher") else "worse"))
        start += len(group.run_list)
    return changes


def trends(results: Iterable[Result]) -> list[Trend]:
    """Every side-by-side ratio measured at two or more runs, with its change points."""
    found = []
    for name, (better, samples) in sorted(_series(results).items()):
        if len(samples) < 2:
            continue
        ordered = tuple(sorted(samples, key=lambda s: s.time))
        found.append(Trend(name, better, ordered, tuple(classify(ordered, better))))
    return found
