"""The side-by-side result (`l4lab bench --katran`): its schema, and the report's "l4lab vs Katran" section.

SAMPLE is a real result of `l4lab bench --katran /work/katran-src --seed 803` at 498869b on the 2-vCPU lab
VM, its points trimmed to the last three trials of each search (every live round's NDRs kept); its figures
are asserted below as the page must show them.
"""

from __future__ import annotations

import copy
import json
import shutil
import statistics
from pathlib import Path
from typing import Any

import pytest

from reports.history import figures
from reports.render import render
from reports.schema import BenchPayload, ResultsError, load_results, parse_result
from reports.side_by_side import SIDE_BY_SIDE_TITLE
from suites.reports._page import Page

SAMPLE = Path(__file__).resolve().parent / "data" / "bench.katran_side_by_side.json"


def _sample() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(SAMPLE.read_text(encoding="utf-8"))
    return data


def test_the_sample_round_trips(tmp_path: Path) -> None:
    data = _sample()
    result = parse_result(data, SAMPLE)
    assert result.to_json() == data
    assert isinstance(result.payload, BenchPayload)
    sbs = result.payload.side_by_side
    assert sbs is not None and sbs.program == "katran"
    assert {(c.encap, c.case) for c in sbs.cases} == {
        (None, "non-vip"), *((e, c) for e in ("ip4-ipip", "ip4-gue1") for c in ("session-hit", "new-syn", "new-ack"))}
    assert {z.encap for z in sbs.sizes} == {"ip4-ipip", "ip4-gue1"}
    assert [(p.encap, p.frame_size, [v.program for v in p.versus]) for p in result.payload.points] == [
        ("ip4-ipip", 64, ["katran"]), ("ip4-gue1", 64, ["katran"])]
    assert sbs.seed is not None and sbs.first_loaded == ["l4lab", "katran"] * 3
    assert all(len(c.round_ratios) == sbs.rounds for c in sbs.cases)
    assert [(f.program, f.sessions_after) for f in sbs.syn_flood] == [("l4lab", 0), ("katran", 131000)]
    assert {(t.program, t.tables, t.entries) for t in sbs.session_tables} == {("katran", 2, 1000000),
                                                                             ("l4lab", 1, 2097152)}
    assert [r.first_loaded for r in sbs.live_rounds] == ["l4lab", "katran"] * 2
    assert all(len(r.ndr) == 8 for r in sbs.live_rounds)
    shutil.copy(SAMPLE, tmp_path / SAMPLE.name)
    (loaded,) = load_results(tmp_path)
    assert loaded == result


_NDR = {"case": "l4lab:ip4-ipip", "ndr_mpps": 3.0, "pdr_mpps": 3.0}


def _round_ratios(data: dict[str, Any], encap: str) -> list[float]:
    """l4lab's NDR over Katran's in each live round of a result's JSON."""
    out = []
    for rnd in data["payload"]["side_by_side"]["live_rounds"]:
        got = {n["case"]: n["ndr_mpps"] for n in rnd["ndr"]}
        out.append(got[f"l4lab:{encap}"] / got[f"katran:{encap}"])
    return out


def _mutated(path: Path, change: Any) -> Path:
    data = copy.deepcopy(_sample())
    change(data["payload"]["side_by_side"])
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


@pytest.mark.parametrize(("change", "field", "problem"), [
    (lambda s: s["cases"][1].update(case="session-miss"), "payload.side_by_side.cases[1].case",
     '"non-vip" or "session-hit" or "new-syn" or "new-ack"'),
    (lambda s: s["cases"][2].update(ratio_above_floor=0.9), "payload.side_by_side.cases[2].ratio_above_floor",
     "must be (ns - floor_xdp_tx_ns) / (other_ns - floor_xdp_tx_ns)"),
    (lambda s: s["cases"][0].pop("other_path_counter"), "payload.side_by_side.cases[0].other_path_counter",
     "is missing"),
    (lambda s: s["cases"].append(dict(s["cases"][3])), "payload.side_by_side.cases[7]", "repeats new-ack"),
    (lambda s: s["sizes"][0].update(verified_insns=0), "payload.side_by_side.sizes[0].verified_insns",
     "must be ≥ 1"),
    (lambda s: s.update(cases=[]), "payload.side_by_side.cases", "must not be empty"),
    (lambda s: s["cases"][4].update(encap="ip4-vxlan"), "payload.side_by_side.cases[4].encap", '"ip4-ipip"'),
    (lambda s: s.update(live_rounds=[{"first_loaded": "l4lab", "ndr": [_NDR, dict(_NDR)]}]),
     "payload.side_by_side.live_rounds[0].ndr[1].case", "repeats l4lab:ip4-ipip"),
    (lambda s: s.update(live_rounds=[{"first_loaded": "l4lab", "ndr": [dict(_NDR, pdr_mpps=2.5)]}]),
     "payload.side_by_side.live_rounds[0].ndr[0].pdr_mpps", "must be ≥ ndr_mpps"),
    (lambda s: s.update(live_rounds=[{"first_loaded": "l4lab", "ndr": []}]),
     "payload.side_by_side.live_rounds[0].ndr", "must not be empty"),
])
def test_a_malformed_side_by_side_result_names_file_and_field(tmp_path: Path, change: Any, field: str,
                                                             problem: str) -> None:
    path = _mutated(tmp_path / "bench.bad.json", change)
    with pytest.raises(ResultsError) as caught:
        load_results(tmp_path)
    assert (caught.value.file, caught.value.field) == (str(path), field)
    assert problem in caught.value.problem, caught.value.problem


def test_the_report_shows_the_side_by_side_section(tmp_path: Path) -> None:
    results = tmp_path / "results"
    results.mkdir()
    shutil.copy(SAMPLE, results / SAMPLE.name)
    page = Page(render(results, tmp_path / "index.html").read_text(encoding="utf-8"))
    assert "versus" in page.sections and SIDE_BY_SIDE_TITLE in page.sections["versus"].text
    tables = {t.caption.split(" — ")[0]: t for t in page.tables if t.section == "versus"}
    micro = tables["Test run, median ns per call (69-byte frames, 6 rounds, session tables of 1000000 entries per CPU)"]
    assert micro.header[:6] == ["encap", "case", "Katran (ns)", "l4lab (ns)", "l4lab ÷ Katran, cost above the floor",
                                "over the rounds"]
    rows = {(r[0], r[1]): r for r in micro.rows}
    # 561 ns vs 741 ns over a 230 ns floor: (561 - 230) / (741 - 230) = 0.65; its rounds 0.57 to 0.69
    assert rows[("ip4-ipip", "session hit")][2:8] == ["741", "561", "0.65", "0.57–0.69", "LRU_HIT / LRU hits",
                                                      "199998"]
    assert rows[("ip4-ipip", "new flow, SYN")][2:6] == ["2014", "1122", "0.50", "0.48–0.53"]
    assert rows[("ip4-gue1", "new flow, ACK")][2:5] == ["2605", "1353", "0.47"]
    assert rows[("–", "MAC-swap XDP_TX floor")][3] == "230"
    sizes = tables["Program size: instructions the verifier walked, and after translation"]
    assert sizes.rows[0][:4] == ["ip4-ipip", "107965", "101789", "0.94"]
    loop = tables["Live frames on veth: CPU ns per frame of the whole loop (XDP_TX floor ÷ it), median of 4 rounds"]
    assert loop.header == ["encap", "MAC-swap XDP_TX floor", "l4lab", "Katran"]
    # 331.0 / 514.7 = 0.64, 331.0 / 604.4 = 0.55; the SYN flood's loops are not in this table
    assert loop.rows == [["ip4-ipip", "331", "515 (0.64)", "604 (0.55)"],
                         ["ip4-gue1", "331", "481 (0.69)", "894 (0.37)"]]
    live = tables["Live frames on veth: NDR in Mpps (÷ XDP_TX floor), median of 4 rounds"]
    assert live.header == ["encap", "frame size (bytes)", "XDP_DROP floor", "MAC-swap XDP_TX floor", "l4lab", "Katran",
                           "l4lab ÷ Katran: median of rounds (range)"]
    assert live.rows[0] == ["ip4-ipip", "64", "7.445", "5.357", "3.203 (0.60)", "2.915 (0.54)", "1.10 (1.00–1.14)"]
    assert live.rows[1][0] == "ip4-gue1" and live.rows[1][4:] == ["3.244 (0.61)", "1.914 (0.36)", "1.67 (1.55–1.79)"]
    gue = _round_ratios(_sample(), "ip4-gue1")  # the last cell from the rounds themselves
    assert live.rows[1][6] == f"{statistics.median(gue):.2f} ({min(gue):.2f}–{max(gue):.2f})"
    flood = next(t for t in page.tables if t.caption.startswith("SYN flood"))
    assert flood.rows == [["l4lab", "ip4-ipip", "1,000,000", "3.304 (0.62)", "1.45 (1.03–1.80)", "0"],
                          ["katran", "ip4-ipip", "1,000,000", "2.365 (0.44)", "–", "131,000"]]
    assert "Order: seed 803" in page.sections["versus"].text
    # Its points are the side-by-side run's own: they stay out of the encap comparison's tables.
    assert not any(t.section == "bench" and t.caption.startswith("NDR / PDR") for t in page.tables)


def test_a_result_without_live_rounds_shows_the_ratio_of_its_ndrs(tmp_path: Path) -> None:
    """A result written before the live rounds has one NDR per program: the ratio column divides them."""
    results = tmp_path / "results"
    results.mkdir()
    _mutated(results / SAMPLE.name, lambda s: s.update(live_rounds=[]))
    page = Page(render(results, tmp_path / "index.html").read_text(encoding="utf-8"))
    live = next(t for t in page.tables if t.caption.startswith("Live frames on veth: NDR in Mpps (÷ XDP_TX floor) — "))
    assert [row[6] for row in live.rows] == ["1.10", "1.69"]  # 3.203 / 2.915 and 3.244 / 1.914
    flood = next(t for t in page.tables if t.caption.startswith("SYN flood"))
    assert [row[4] for row in flood.rows] == ["1.40", "–"]  # 3.304 / 2.365


def test_the_section_is_left_out_without_a_side_by_side_result(sample_report: Path) -> None:
    assert "versus" not in Page(sample_report.read_text(encoding="utf-8")).sections


def test_its_figures_have_names_of_their_own() -> None:
    named = figures(parse_result(_sample(), SAMPLE))
    assert named["versus katran ip4-ipip session-hit l4lab ÷ katran above the floor"] == pytest.approx(0.6477)
    assert named["versus katran ip4-gue1 64 B live NDR ÷ XDP_TX floor katran"] == pytest.approx(0.3574, abs=1e-4)
    assert named["versus katran ip4-gue1 64 B live loop floor ÷ l4lab (CPU ns)"] == pytest.approx(0.6878, abs=1e-3)
    assert named["versus katran ip4-ipip syn-flood 64 B live loop floor ÷ l4lab (CPU ns)"] == pytest.approx(
        0.5998, abs=1e-3)
    assert named["versus katran ip4-ipip syn-flood live NDR ÷ XDP_TX floor l4lab"] == pytest.approx(0.6168, abs=1e-4)
    assert not any(name.startswith("bench ") for name in named), "no trend line shared with `l4lab bench`"
