"""The report page's structure, parsed with html.parser: sections, charts, tables, header, notices, errors."""

from __future__ import annotations

import base64
import csv
import io
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from reports.render import FILLED_BY, NO_RESULTS, gbps, main, render
from reports.sample import SAMPLE_COMMIT, SAMPLE_MACHINE, SAMPLE_OLDER_COMMIT, demo_payload, write_sample
from reports.schema import (
    ENCAP_IDS,
    FRAME_SIZES,
    BenchPayload,
    BenchPoint,
    ConformancePayload,
    DemoEncap,
    DemoPayload,
    Floor,
    Kind,
    write_result,
)
from suites.reports._page import Page

SECTIONS = ["summary", "demo", "bench", "rss", "pmtu", "churn", "failover", "conformance", "corpus", "fuzz", "history"]
KIND_SECTIONS = [s for s in SECTIONS if s not in ("summary", "history")]
SECTION_TITLES = {"summary": "Encapsulation modes at a glance", "demo": "Demo: real traffic in every encap",
                  "bench": "Encapsulation comparison: throughput", "rss": "Receive-side scaling on a real server",
                  "pmtu": "Path MTU through the balancer", "churn": "Maglev churn: removing one of N reals",
                  "failover": "Failover timelines", "conformance": "Conformance", "corpus": "Katran's fixture corpus",
                  "fuzz": "Fuzzed frames", "history": "Runs and trends"}
# Charts per kind for the sample: bench ratio + absolute per generator (trex, xdp-live), one RSS grid per
# result (the kernel's view, model and NIC for two encaps), churn disruption + collateral, one timeline
# per failover test.
SAMPLE_CHARTS = {"bench": 4, "rss": 5, "churn": 2, "failover": 2}


def _page(path: Path) -> Page:
    return Page(path.read_text(encoding="utf-8"))


def _decode(href: str | None) -> str:
    assert href and href.startswith("data:"), (href or "")[:40]
    head, _, body = href.partition(",")
    assert head.endswith(";base64"), head
    return base64.b64decode(body).decode("utf-8")


def test_every_kind_has_its_section_in_order(sample_report: Path) -> None:
    page = _page(sample_report)
    assert list(page.sections) == SECTIONS
    for section in page.sections.values():
        assert "no-results" not in section.classes, section.id
        assert NO_RESULTS not in section.text, section.id


def test_charts_are_inline_svg_with_a_title_on_every_mark(sample_report: Path) -> None:
    page = _page(sample_report)
    per_section = {s: sum(1 for f in page.figures if f.section == s) for s in SECTIONS}
    assert per_section == {s: SAMPLE_CHARTS.get(s, 0) for s in SECTIONS}
    assert page.images == [], "charts are inline SVG, not images"
    for figure in page.figures:
        assert "zoomable" in (figure.svg.get("class") or ""), figure.caption
        assert (figure.svg.get("viewbox") or "").startswith("0 0 "), "sized by its viewBox: scales and prints"
        assert len((figure.svg.get("aria-label") or "").strip()) > 10
        assert figure.marks > 0 and figure.titled_marks == figure.marks, \
            f"{figure.caption}: {figure.titled_marks} of {figure.marks} marks have a hover title"
        assert figure.caption.strip(), "every chart has a title"
        assert [d.get("download", "").rsplit(".", 1)[-1] for d in figure.downloads] == ["csv", "json"]
    html = sample_report.read_text()
    assert not any(tag in html for tag in ('src="http', "src='http", "<link", "<script src", "<img")), \
        "the page must be self-contained"
    assert len(page.scripts) == 1 and "src" not in page.scripts[0], "one inlined script (zoom)"


def test_every_table_and_chart_downloads_its_data_as_csv_and_json(sample_report: Path) -> None:
    page = _page(sample_report)
    for table in page.tables:
        names = [d.get("download") or "" for d in table.downloads]
        assert [n.rsplit(".", 1)[-1] for n in names] == ["csv", "json"], table.caption
        rows = list(csv.reader(io.StringIO(_decode(table.downloads[0].get("href")))))
        assert rows[0] == table.header, table.caption
        assert len(rows) - 1 == len(table.rows), table.caption
        data = json.loads(_decode(table.downloads[1].get("href")))
        assert len(data) == len(table.rows) and list(data[0]) == table.header
    for figure in page.figures:
        data = json.loads(_decode(figure.downloads[1].get("href")))
        assert data and all(isinstance(row, dict) for row in data), figure.caption


def test_tables_are_rectangular_with_the_expected_columns(sample_report: Path) -> None:
    page = _page(sample_report)
    for table in page.tables:
        assert table.caption.strip(), f"table without caption in {table.section}"
        assert table.rows, f"empty table {table.caption!r}"
        for row in table.rows:
            assert len(row) == len(table.header), (table.caption, row)
    by_caption = {t.caption: t for t in page.tables}
    conformance = next(t for t in page.tables if t.section == "conformance")
    assert conformance.header == ["test", *ENCAP_IDS]
    assert len(conformance.rows) == 8
    assert [row for row in conformance.rows if "finding" in row] == [
        ["test_syn_rehash", "pass", "pass", "pass", "pass", "finding", "pass"]
    ]
    ndr = next(t for c, t in by_caption.items() if c.startswith("NDR / PDR") and "xdp-live" in c)
    assert ndr.header == ["encap", *(str(s) for s in FRAME_SIZES)]
    assert [row[0] for row in ndr.rows] == list(ENCAP_IDS)
    mtu = next(t for c, t in by_caption.items() if c.startswith("Egress overhead"))
    effective = {row[0]: (int(row[1]), int(row[3])) for row in mtu.rows}
    assert effective["ip4-ipip"] == (20, 1480)
    assert effective["ip6-gue1"] == (48, 1452)
    demo = next(t for t in page.tables if t.section == "demo")
    assert len(demo.header) == 6 and len(demo.rows) == len(ENCAP_IDS)
    summary = next(t for t in page.tables if t.section == "summary")
    assert [row[0] for row in summary.rows] == list(ENCAP_IDS)
    assert summary.header[:6] == ["encap", "works", "DSR (replies via LB)", "RSS spread: fixed outer source",
                                  "RSS spread: flow outer source", "PMTU learnt (expected)"]
    assert summary.rows[0][2:6] == ["held (0)", "sd 1/8 q", "sd 1.05", "1480 (1480)"]
    pmtu = next(t for t in page.tables if t.section == "pmtu")
    assert pmtu.header == ["encap", "icmp", "mss-clamp", "blackhole"]
    assert all("(as expected)" in row[3] for row in pmtu.rows)


def test_header_names_machine_commit_date_and_synthetic(sample_report: Path) -> None:
    page = _page(sample_report)
    assert SAMPLE_MACHINE.hostname in page.header_text
    assert f"kernel {SAMPLE_MACHINE.kernel}" in page.header_text
    assert SAMPLE_COMMIT in page.header_text
    assert "2026-01-01 12:00 UTC" in page.header_text
    assert "SYNTHETIC SAMPLE DATA" in page.header_text


def test_measured_results_carry_no_synthetic_banner(tmp_path: Path) -> None:
    write_result("demo", "demo", demo_payload(), tmp_path / "results")
    page = _page(render(tmp_path / "results", tmp_path / "index.html"))
    assert "SYNTHETIC" not in page.text
    assert list(page.sections) == ["summary", "demo", "history", "missing"]


def _left_out(page: Page) -> dict[str, str]:
    """{section title: command} of the closing "Not in this report" table."""
    table = next(t for t in page.tables if t.section == "missing")
    assert table.header == ["section", "measured by"]
    return dict((row[0], row[1]) for row in table.rows)


@pytest.mark.parametrize("only", ["bench", "conformance", "churn"])
def test_sections_without_results_are_left_out_and_listed_with_their_command(tmp_path: Path, only: str) -> None:
    write_sample(tmp_path / "results", [only])
    page = _page(render(tmp_path / "results", tmp_path / "index.html"))
    assert list(page.sections) == [s for s in SECTIONS if s in (only, "history")] + ["missing"]
    assert NO_RESULTS not in page.text and not any("no-results" in s.classes for s in page.sections.values())
    assert _left_out(page) == {SECTION_TITLES[s]: FILLED_BY[s] for s in SECTIONS if s not in (only, "history")}
    assert {f.section for f in page.figures} <= {only}


def test_no_results_at_all_lists_every_section_and_its_command(tmp_path: Path) -> None:
    (tmp_path / "results").mkdir()
    page = _page(render(tmp_path / "results", tmp_path / "index.html"))
    assert list(page.sections) == ["missing"]
    assert sorted(_left_out(page).values()) == sorted(FILLED_BY[s] for s in SECTIONS)
    assert {"make bench", "l4lab conform", "make soak", "make demo"} <= set(_left_out(page).values())
    assert page.figures == [] and [t.section for t in page.tables] == ["missing"]
    assert "none (no results)" in page.header_text


def test_newest_result_of_a_case_wins(tmp_path: Path) -> None:
    t0 = datetime(2026, 2, 1, tzinfo=UTC)
    for name, outcome, when in (("a", "pass", t0 + timedelta(hours=1)), ("b", "fail", t0)):
        payload = ConformancePayload(test="test_tcp", encap="ip4-ipip", outcome=outcome, duration_s=1)  # type: ignore[arg-type]
        write_result("conformance", f"test_tcp_{name}[ip4-ipip]", payload, tmp_path / "r", timestamp=when)
    page = _page(render(tmp_path / "r", tmp_path / "index.html"))
    (table,) = [t for t in page.tables if t.section == "conformance"]
    assert table.rows == [["test_tcp", "pass", "–", "–", "–", "–", "–"]]


def test_text_from_results_is_escaped(tmp_path: Path) -> None:
    evil = DemoEncap(
        encap="ip4-ipip", requests=1, ok=1, reals_seen=["<b>r1</b>"], lb_saw_only_client_to_vip=True
    )
    write_result("demo", "demo", DemoPayload(encaps=[evil]), tmp_path / "r")
    html = render(tmp_path / "r", tmp_path / "index.html").read_text()
    assert "<b>r1</b>" not in html and "&lt;b&gt;r1&lt;/b&gt;" in html


def test_main_writes_the_page(
    sample_results: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "deep" / "report.html"
    assert main(["--results", str(sample_results), "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {out}"
    assert list(_page(out).sections) == SECTIONS
    assert [p.name for p in out.parent.iterdir()] == ["report.html"], "no temporary file may remain"


def test_main_refuses_invalid_results_naming_file_and_field(
    sample_results: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The sample's five-scenario RSS result (directory order differs between file systems).
    path = next(sample_results.glob("rss.test_real_rss_spread@*.json"))
    data = json.loads(path.read_text())
    data["payload"]["scenarios"][2]["chi2"] = -1
    path.write_text(json.dumps(data))
    out = tmp_path / "index.html"
    assert main(["--results", str(sample_results), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"l4lab report: {path}: payload.scenarios[2].chi2: must be ≥ 0 but got -1.0"
    assert not out.exists()


def test_main_refuses_a_missing_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--results", str(tmp_path / "nothing"), "--out", str(tmp_path / "x.html")]) == 2
    assert "results directory does not exist" in capsys.readouterr().err


def test_every_kind_is_rendered_somewhere() -> None:
    assert {k.value for k in Kind} == set(KIND_SECTIONS)


def test_smallest_valid_results_render(tmp_path: Path) -> None:
    """One point, one scenario, one event each: no division by zero, no empty-axis crash, all charts drawn."""
    r = tmp_path / "r"
    floor = {"xdp_tx_mpps": 0.0, "xdp_drop_mpps": 0.0}
    point = {
        "encap": "ip6-gue1",
        "frame_size": "imix",
        "ndr_mpps": 0.0,
        "pdr_mpps": 0.0,
        "floor": floor,
        "egress_overhead_bytes": 48,
    }
    write_result("bench", "test_b", {"generator": "trex", "egress_mtu": 9000, "points": [point]}, r)
    scenario = {
        "name": "gue-sd",
        "queue_counts": [0],
        "nqueues": 1,
        "flows": 1,
        "max_over_mean": 0,
        "chi2": 0,
        "p_value": 1,
    }
    write_result("rss", "test_r", {"scenarios": [scenario]}, r)
    write_result(
        "churn",
        "test_c",
        {
            "points": [
                {
                    "n": 2,
                    "ring_size": 7,
                    "slots_owned_by_removed": 3,
                    "slots_changed": 3,
                    "theoretical_slots": 3.5,
                }
            ]
        },
        r,
    )
    write_result("failover", "test_f", {"timeline": [{"t": 0, "event": "x"}], "failover_seconds": 0}, r)
    write_result(
        "pmtu",
        "test_p[ip4-gue0]",
        {"encap": "ip4-gue0", "scenarios": [{"name": "icmp", "completed": False, "seconds": 3}]},
        r,
    )
    page = _page(render(r, tmp_path / "index.html"))
    assert {f.section for f in page.figures} == {"bench", "rss", "churn", "failover"}
    pmtu = next(t for t in page.tables if t.section == "pmtu")
    assert pmtu.rows == [["ip4-gue0", "failed after 3.00 s (unexpected); no route MTU cached"]]
    mtu = next(t for t in page.tables if t.caption.startswith("Egress overhead"))
    assert mtu.rows == [["ip6-gue1", "48", "9000", "8952", "trex"]]


LATENCY_CAPTION = "Latency at 10/50/90 % of PDR"
LATENCY_HEADER = ["encap", "frame size (bytes)", "share of PDR (%)", "rate (Mpps)", "rate (Gb/s)", "min (µs)",
                  "p50 (µs)", "avg (µs)", "p99 (µs)", "max (µs)"]


def test_latency_table_lists_each_share_of_the_points_that_have_latency(sample_report: Path) -> None:
    page = _page(sample_report)
    (table,) = [t for t in page.tables if t.caption.startswith(LATENCY_CAPTION)]
    assert table.section == "bench"
    assert table.header == LATENCY_HEADER
    # The sample's TRex run: two encaps at 64 and 1518 bytes, three shares each, in encap and size order.
    assert [(row[0], row[1], row[2]) for row in table.rows] == [
        (encap, size, share) for encap in ("ip4-ipip", "ip4-gue1") for size in ("64", "1518")
        for share in ("10", "50", "90")]
    for row in table.rows:
        low, p50, avg, p99, high = (float(v) for v in row[5:10])
        assert low <= p50 <= p99 <= high and low <= avg <= high, row
        assert float(row[4]) == pytest.approx(gbps(float(row[3]), int(row[1])), rel=1e-3)


def test_latency_table_is_absent_without_latency(tmp_path: Path) -> None:
    r = tmp_path / "r"
    write_sample(r, ["bench"])
    for path in r.glob("bench.*.json"):  # drop every latency figure, keep the points
        data = json.loads(path.read_text())
        for point in data["payload"]["points"]:
            point["latency"] = []
        path.write_text(json.dumps(data))
    page = _page(render(r, tmp_path / "index.html"))
    captions = [t.caption for t in page.tables if t.section == "bench"]
    assert any(c.startswith("NDR / PDR") for c in captions)
    assert not any(c.startswith(LATENCY_CAPTION) for c in captions), captions


def test_gbps_is_the_l1_line_rate() -> None:
    """14.88 Mpps of 64-byte frames fill 10 Gb/s once preamble and gap (20 B) are counted (DESIGN.md)."""
    assert gbps(14.88, 64) == pytest.approx(10.0, rel=1e-3)
    assert gbps(0.8127, 1518) == pytest.approx(10.0, rel=1e-3)


def _bench_point(encap: str, size: int, ndr: float) -> BenchPoint:
    return BenchPoint(encap=encap, frame_size=size, ndr_mpps=ndr, pdr_mpps=ndr, egress_overhead_bytes=20,  # type: ignore[arg-type]
                      floor=Floor(xdp_tx_mpps=4.0, xdp_drop_mpps=5.0))


def test_a_trex_and_a_software_run_of_the_same_point_both_appear(tmp_path: Path) -> None:
    r = tmp_path / "r"
    t0 = datetime(2026, 2, 1, tzinfo=UTC)
    for generator, ndr, when in (("trex", 21.5, t0), ("xdp-live", 3.25, t0 + timedelta(hours=1))):
        write_result("bench", f"bench_{generator.replace('-', '_')}", BenchPayload(
            generator=generator, egress_mtu=1500, points=[_bench_point("ip4-ipip", 64, ndr)]), r,  # type: ignore[arg-type]
            timestamp=when)
    page = _page(render(r, tmp_path / "index.html"))
    ndr = {t.caption.rsplit("— ", 1)[1]: t.rows for t in page.tables if t.caption.startswith("NDR / PDR")}
    assert set(ndr) == {f"trex on {_host()}", f"xdp-live on {_host()}"}
    assert ndr[f"trex on {_host()}"][0][1].startswith("21.50 / 21.50")
    assert ndr[f"xdp-live on {_host()}"][0][1].startswith("3.25 / 3.25")
    assert sum(1 for f in page.figures if f.section == "bench") == 4


def _host() -> str:
    import socket

    return socket.gethostname()


def test_history_keeps_runs_and_shows_a_trend_per_figure(sample_report: Path) -> None:
    page = _page(sample_report)
    runs = next(t for t in page.tables if t.caption == "Newest run per machine and generator")
    assert {row[1] for row in runs.rows} >= {"trex", "xdp-live", "(demo)"}
    trend = next(t for t in page.tables if t.caption == "Trend per figure over commits")
    row = next(r for r in trend.rows if r[0] == "bench xdp-live ip4-ipip 64 B NDR (Mpps) — synthetic-sample")
    assert row[1] == "2", "the sample measured this figure at two commits"
    first, latest = float(row[3]), float(row[4])
    assert row[5] == f"{(latest - first) / first * 100:+.1f} %"
    assert "trex" not in " ".join(r[0] for r in trend.rows), "the TRex figures were measured at one commit only"


def test_compare_puts_two_runs_side_by_side(sample_results: Path, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "compare.html"
    assert main(["--results", str(sample_results), "--compare", SAMPLE_OLDER_COMMIT[:8], SAMPLE_COMMIT[:8],
                 "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {out}"
    page = _page(out)
    (table,) = page.tables
    assert table.header == ["figure — machine", "A", "B", "change"]
    rows = {r[0]: r[1:] for r in table.rows}
    a, b, change = rows["bench xdp-live ip4-ipip 64 B NDR (Mpps) — synthetic-sample"]
    assert change == f"{(float(b) - float(a)) / float(a) * 100:+.1f} %"
    assert rows["demo ip4-ipip DSR — synthetic-sample"] == ["–", "held", "only in one"]
    assert len(table.downloads) == 2
    assert main(["--results", str(sample_results), "--compare", "deadbeef", SAMPLE_COMMIT[:8],
                 "--out", str(out)]) == 2
    assert "deadbeef: no result has a commit starting with it" in capsys.readouterr().err


def test_rss_model_beside_nic_flags_disagreement(sample_report: Path) -> None:
    page = _page(sample_report)
    table = next(t for t in page.tables if t.caption.startswith("Model beside NIC"))
    assert table.header == ["encap", "scenario", "model", "nic:virtio", "model vs NIC"]
    verdicts = {(r[0], r[1]): (r[2].split()[0], r[3].split()[0], r[4]) for r in table.rows}
    # The sample's virtio NIC spreads fixed-source GUE under "sd" where the model collapses it.
    assert verdicts[("ip4-gue1", "gue-fixed-src-sd")] == ("one", "even", "DISAGREE: nic:virtio")
    assert verdicts[("ip4-ipip", "ipip-fixed-src-sd")] == ("one", "one", "agree")
    assert verdicts[("ip4-ipip", "ipip-flow-src-sd")][2] == "agree"


def test_header_names_generators_and_the_nic(sample_report: Path) -> None:
    page = _page(sample_report)
    assert "xdp-live, trex" in page.header_text or "trex, xdp-live" in page.header_text
    assert "MT27800 Family [ConnectX-5], driver mlx5_core, 25 Gb/s" in page.header_text
