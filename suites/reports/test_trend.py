"""test_trend.py: the side-by-side ratios across commits (reports/trend.py) and their change points, found by
FD.io CSIT's jumpavg: a step beyond the noise is marked once, at the run where it starts, as better or worse
for the ratio's direction; noise alone is marked nowhere; the report shows the table with the marks."""

from __future__ import annotations

import copy
import json
import random
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from reports import side_by_side, trend
from reports.render import render
from reports.schema import parse_result
from suites.reports._page import Page

SAMPLE = Path(__file__).resolve().parent / "data" / "bench.katran_side_by_side.json"
T0 = datetime(2026, 12, 1, tzinfo=UTC)


def _samples(values: list[list[float]]) -> list[trend.Sample]:
    return [trend.Sample(f"{i:040x}", T0 + timedelta(hours=i), sum(v) / len(v), tuple(v))
            for i, v in enumerate(values)]


def _rounds(rng: random.Random, centre: float, n: int = 6, spread: float = 0.02) -> list[float]:
    return [round(rng.gauss(centre, spread), 4) for _ in range(n)]


def test_a_step_in_a_cost_ratio_is_one_change_for_the_better_where_it_starts() -> None:
    rng = random.Random(5)
    runs = [_rounds(rng, 0.75) for _ in range(6)] + [_rounds(rng, 0.60) for _ in range(6)]
    assert trend.classify(_samples(runs), "lower") == [(6, "better")]
    assert trend.classify(_samples(runs), "higher") == [(6, "worse")], "a rate that fell got worse"


def test_noise_alone_is_no_change() -> None:
    rng = random.Random(11)
    runs = [_rounds(rng, 0.62) for _ in range(14)]
    assert trend.classify(_samples(runs), "lower") == []


def _result_at(i: int, ratio: float, rounds: list[float]) -> dict[str, Any]:
    data: dict[str, Any] = copy.deepcopy(json.loads(SAMPLE.read_text(encoding="utf-8")))
    data["commit"] = f"{i + 1:040x}"
    data["timestamp"] = (T0 + timedelta(hours=i)).isoformat()
    sbs = data["payload"]["side_by_side"]
    hit = next(c for c in sbs["cases"] if (c["encap"], c["case"]) == ("ip4-ipip", "session-hit"))
    floor = sbs["floor_xdp_tx_ns"]
    hit["ns"] = floor + ratio * (hit["other_ns"] - floor)
    hit["ratio_above_floor"] = ratio
    hit["round_ratios"] = rounds
    return data


def test_the_report_marks_the_run_where_a_ratio_changed(tmp_path: Path) -> None:
    rng = random.Random(3)
    results = tmp_path / "results"
    results.mkdir()
    centres = [0.74] * 5 + [0.58] * 5
    for i, centre in enumerate(centres):
        rounds = _rounds(rng, centre)
        data = _result_at(i, round(sum(rounds) / len(rounds), 4), rounds)
        parse_result(data)  # a valid result
        (results / f"bench.sbs@{i:02d}.json").write_text(json.dumps(data), encoding="utf-8")
    found = {t.name.split(" — ")[0]: t for t in side_by_side.trends(parse_result(json.loads(p.read_text()))
                                                             for p in sorted(results.glob("*.json")))}
    hit = found["ip4-ipip session-hit: l4lab ÷ katran above the floor"]
    assert len(hit.samples) == 10 and hit.changes == ((5, "better"),)
    page = Page(render(results, tmp_path / "index.html").read_text(encoding="utf-8"))
    table = next(t for t in page.tables if t.caption.startswith("Ratios across runs and commits"))
    row = next(r for r in table.rows if r[0].startswith("ip4-ipip session-hit"))
    assert row[1:3] == ["lower is better", "10"] and row[-1] == f"better at {f'{6:040x}'[:10]}"
    assert 'class="change"' in (tmp_path / "index.html").read_text(encoding="utf-8")


def test_one_run_has_no_trend(tmp_path: Path) -> None:
    results = tmp_path / "results"
    results.mkdir()
    shutil.copy(SAMPLE, results / SAMPLE.name)
    assert side_by_side.trends([parse_result(json.loads(SAMPLE.read_text()))]) == []


def test_a_live_ndr_ratio_is_the_median_of_its_rounds() -> None:
    """With the live rounds in the result, each live NDR ratio's sample is the median of the rounds' ratios,
    the rounds kept for the change-point detector; a result without them keeps the ratio of its medians."""
    before = json.loads(SAMPLE.read_text(encoding="utf-8"))
    before["payload"]["side_by_side"]["live_rounds"] = []  # a result written before the rounds
    old = parse_result(before)
    data = copy.deepcopy(json.loads(SAMPLE.read_text(encoding="utf-8")))
    data["commit"] = f"{9:040x}"
    data["timestamp"] = "2030-01-01T00:00:00+00:00"  # after the sample's run
    rounds = [(3.0, 2.0, 3.3, 2.0), (2.8, 2.0, 3.0, 2.5), (3.4, 2.0, 3.1, 2.0)]  # l4lab, Katran: IPIP, flood
    data["payload"]["side_by_side"]["live_rounds"] = [
        {"first_loaded": first, "ndr": [
            {"case": case, "ndr_mpps": value, "pdr_mpps": value}
            for case, value in zip(("l4lab:ip4-ipip", "katran:ip4-ipip", "l4lab:syn-flood", "katran:syn-flood"),
                                   got, strict=True)]}
        for first, got in zip(("l4lab", "katran", "l4lab"), rounds, strict=True)]
    new = parse_result(data)
    found = {t.name.split(" — ")[0]: t for t in side_by_side.trends([old, new])}
    ipip = found["ip4-ipip live NDR: l4lab ÷ katran"].samples
    assert ipip[1].value == 1.5 and ipip[1].rounds == (1.5, 1.4, 1.7)
    point = next(p for p in old.payload.points if p.encap == "ip4-ipip")  # type: ignore[union-attr]
    assert ipip[0].value == point.ndr_mpps / point.versus[0].ndr_mpps and ipip[0].rounds == ()
    flood = found["syn-flood live NDR: l4lab ÷ katran"].samples
    assert flood[1].value == 1.55 and flood[1].rounds == (1.65, 1.2, 1.55)
