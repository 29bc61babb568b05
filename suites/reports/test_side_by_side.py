"""The side-by-side result (`l4lab bench --katran`): its schema, and the report's "l4lab vs Katran" section.

SAMPLE is a real result of `l4lab bench --katran /work/katran-src` at 2a39fac on the 2-vCPU lab VM, trimmed
to the last three trials of each search (a quiet machine, load average under 1; the NDRs on veth still move
with the scheduler from run to run, the loop costs hold); its figures are asserted below as the page must
show them.
"""

from __future__ import annotations

import copy
import json
import shutil
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
    assert [(f.program, f.sessions_after) for f in sbs.syn_flood] == [("l4lab", 0), ("katran", 130832)]
    assert {(t.program, t.tables, t.entries) for t in sbs.session_tables} == {("katran", 2, 1000000),
                                                                             ("l4lab", 1, 2000000)}
    shutil.copy(SAMPLE, tmp_path / SAMPLE.name)
    (loaded,) = load_results(tmp_path)
    assert loaded == result


_NDR = {"case": "l4lab:ip4-ipip", "ndr_mpps": 3.0, "pdr_mpps": 3.0}


def _mutated(path: Path, change: Any) -> Path:
    data = copy.deepcopy(_sample())
    change(data["payload"]["side_by_side"])
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


@pytest.mark.parametrize(("change", "field", "problem"), [
    (lambda s: s["cases"][1].update(case="session-miss"), "payload.side_by_side.cases[1].case",
     '"non-vip" or "session-hit" or "new-syn" or "new-ack"'),
    (lambda s: s["cases"][2].update(ratio_above_floor=0.5), "payload.side_by_side.cases[2].ratio_above_floor",
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
    # 400 ns vs 481 ns over a 170 ns floor: (400 - 170) / (481 - 170) = 0.74; its rounds 0.71 to 0.80
    assert rows[("ip4-ipip", "session hit")][2:8] == ["481", "400", "0.74", "0.71–0.80", "LRU_HIT / LRU hits",
                                                      "199998"]
    assert rows[("ip4-ipip", "new flow, SYN")][2:6] == ["1282", "781", "0.55", "0.52–0.60"]
    assert rows[("ip4-gue1", "new flow, ACK")][2:5] == ["1743", "1122", "0.61"]
    assert rows[("–", "MAC-swap XDP_TX floor")][3] == "170"
    sizes = tables["Program size: instructions the verifier walked, and after translation"]
    assert sizes.rows[0][:4] == ["ip4-ipip", "107965", "88698", "0.82"]
    loop = tables["Live frames on veth: CPU ns per frame of the whole loop (XDP_TX floor ÷ it), median of 4 rounds"]
    assert loop.header == ["encap", "MAC-swap XDP_TX floor", "l4lab", "Katran"]
    # 261.03 / 375.84 = 0.69, 261.03 / 490.50 = 0.53; the SYN flood's loops are not in this table
    assert loop.rows == [["ip4-ipip", "261", "376 (0.69)", "490 (0.53)"],
                         ["ip4-gue1", "261", "369 (0.71)", "739 (0.35)"]]
    live = tables["Live frames on veth: NDR in Mpps (÷ XDP_TX floor)"]
    assert live.header == ["encap", "frame size (bytes)", "XDP_DROP floor", "MAC-swap XDP_TX floor", "l4lab", "Katran",
                           "l4lab ÷ Katran: median of rounds (range)"]
    # A run from before the live rounds: the ratio of its one NDR each, 3.519 / 3.794 and 4.347 / 2.400
    assert live.rows[0] == ["ip4-ipip", "64", "8.522", "5.883", "3.519 (0.60)", "3.794 (0.64)", "0.93"]
    assert live.rows[1][0] == "ip4-gue1" and live.rows[1][4:] == ["4.347 (0.74)", "2.400 (0.41)", "1.81"]
    flood = next(t for t in page.tables if t.caption.startswith("SYN flood"))
    assert flood.rows == [["l4lab", "ip4-ipip", "1,000,000", "5.043 (0.86)", "1.59", "0"],
                          ["katran", "ip4-ipip", "1,000,000", "3.179 (0.54)", "–", "130,832"]]
    assert "Order: seed 364605835" in page.sections["versus"].text
    # Its points are the side-by-side run's own: they stay out of the encap comparison's tables.
    assert not any(t.section == "bench" and t.caption.startswith("NDR / PDR") for t in page.tables)


def test_the_section_is_left_out_without_a_side_by_side_result(sample_report: Path) -> None:
    assert "versus" not in Page(sample_report.read_text(encoding="utf-8")).sections


def test_its_figures_have_names_of_their_own() -> None:
    named = figures(parse_result(_sample(), SAMPLE))
    assert named["versus katran ip4-ipip session-hit l4lab ÷ katran above the floor"] == pytest.approx(0.7395)
    assert named["versus katran ip4-gue1 64 B live NDR ÷ XDP_TX floor katran"] == pytest.approx(0.4079, abs=1e-4)
    assert named["versus katran ip4-gue1 64 B live loop floor ÷ l4lab (CPU ns)"] == pytest.approx(0.7069, abs=1e-3)
    assert named["versus katran ip4-ipip syn-flood 64 B live loop floor ÷ l4lab (CPU ns)"] == pytest.approx(
        0.7245, abs=1e-3)
    assert named["versus katran ip4-ipip syn-flood live NDR ÷ XDP_TX floor l4lab"] == pytest.approx(0.8573, abs=1e-4)
    assert not any(name.startswith("bench ") for name in named), "no trend line shared with `l4lab bench`"
