"""The report in a real browser: headless Chromium loads it without errors, every image decodes, tables fit.

Needs Chromium (`bash scripts/setup.sh --extra browser`); skipped with that command if it is missing.
The screenshot is kept in the test's tmp directory (pytest keeps the last few runs' directories).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from PIL import Image

from reports.render import render
from reports.sample import write_sample

pytest.importorskip(
    "websocket", reason="websocket-client is not installed; run `pip install websocket-client==1.9.2`"
)

from suites.reports._browser import SETUP_HINT, Browser, find_chromium  # noqa: E402

pytestmark = pytest.mark.skipif(
    find_chromium() is None, reason=f"Chromium is not installed; run `{SETUP_HINT}`"
)

_CHARTS = """Array.from(document.querySelectorAll('svg.chart')).map(s => ({
  label: s.getAttribute('aria-label'), width: s.getBoundingClientRect().width,
  height: s.getBoundingClientRect().height, marks: s.querySelectorAll('.point, .bar').length}))"""
_SECTIONS = """Array.from(document.querySelectorAll('main section')).map(s => ({
  id: s.id, height: s.getBoundingClientRect().height, downloads: s.querySelectorAll('a[download]').length,
  tables: s.querySelectorAll('table').length, charts: s.querySelectorAll('svg.chart').length,
  empty: s.classList.contains('no-results')}))"""
_DOWNLOADS = """Array.from(document.querySelectorAll('a[download]')).map(a => ({
  name: a.getAttribute('download'), ok: a.href.startsWith('data:') && atob(a.href.split(',')[1]).length > 0}))"""
# Zoom the first chart with the wheel at its centre: its viewBox must shrink; double click restores it.
_ZOOM = """(() => {
  const s = document.querySelector('svg.zoomable'), r = s.getBoundingClientRect();
  const before = s.getAttribute('viewBox');
  s.dispatchEvent(new WheelEvent('wheel', {deltaY: -100, clientX: r.left + r.width / 2,
                                           clientY: r.top + r.height / 2, bubbles: true, cancelable: true}));
  const zoomed = s.getAttribute('viewBox');
  s.dispatchEvent(new MouseEvent('dblclick', {bubbles: true}));
  return {before: before, zoomed: zoomed, reset: s.getAttribute('viewBox')};
})()"""


def _check_sections(page: object, expect_empty: set[str]) -> list[dict[str, object]]:
    sections = page.evaluate(_SECTIONS)  # type: ignore[attr-defined]
    for s in sections:
        assert s["height"] > 0, f"section {s['id']} does not render"
        assert s["empty"] == (s["id"] in expect_empty), s
        assert s["downloads"] == 2 * (s["tables"] + s["charts"]), f"{s['id']}: a CSV and a JSON per table and chart"
    downloads = page.evaluate(_DOWNLOADS)  # type: ignore[attr-defined]
    assert all(d["ok"] for d in downloads), [d for d in downloads if not d["ok"]]
    return sections


# Widths in CSS pixels of every table and of the column they sit in (main's content box).
_TABLES = """(() => {
  const main = document.querySelector('main').getBoundingClientRect();
  return Array.from(document.querySelectorAll('table')).map(t => ({
    caption: t.caption ? t.caption.textContent : '',
    right: t.getBoundingClientRect().right, left: t.getBoundingClientRect().left,
    mainLeft: main.left, mainRight: main.right}));
})()"""


def _assert_non_blank_png(path: Path, min_width: int) -> None:
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    with Image.open(path) as image:
        assert image.width >= min_width and image.height > 2000, image.size
        grey = image.convert("L")
        histogram = grey.histogram()
        ink = sum(histogram[:200]) / (grey.width * grey.height)
        assert ink > 0.01, f"{path}: only {ink:.2%} of the pixels are not near-white"
        assert (
            len(image.convert("RGB").getcolors(maxcolors=1 << 20) or []) > 100
        ), "too few colours for charts"


@pytest.mark.slow
def test_report_renders_in_chromium(sample_report: Path, tmp_path: Path) -> None:
    with Browser.start(tmp_path / "profile") as browser:
        page = browser.open(sample_report.as_uri(), width=1280)
        charts = page.evaluate(_CHARTS)
        assert len(charts) == 13
        for chart in charts:
            assert chart["width"] > 300 and chart["height"] > 100 and chart["marks"] > 0, chart
        sections = _check_sections(page, expect_empty=set())
        assert [s["id"] for s in sections][0] == "summary"
        zoom = page.evaluate(_ZOOM)
        assert zoom["zoomed"] != zoom["before"] and zoom["reset"] == zoom["before"], zoom
        assert page.evaluate("document.title") == "l4lab report (synthetic sample)"
        shot = page.screenshot(tmp_path / "report.png")
        assert page.errors == [], "console errors while loading the report"
    _assert_non_blank_png(shot, 1280)


@pytest.mark.slow
def test_mixed_generators_render_in_chromium(tmp_path: Path) -> None:
    write_sample(tmp_path / "results", ["bench"])
    report = render(tmp_path / "results", tmp_path / "index.html")
    with Browser.start(tmp_path / "profile") as browser:
        page = browser.open(report.as_uri(), width=1024)
        sections = _check_sections(page, expect_empty=set())
        assert [s["id"] for s in sections] == ["bench", "history", "missing"]
        bench = next(s for s in sections if s["id"] == "bench")
        assert bench["charts"] == 4, "one pair of charts per generator (trex, xdp-live)"
        captions = page.evaluate("Array.from(document.querySelectorAll('#bench caption')).map(c => c.textContent)")
        assert any("trex on" in c for c in captions) and any("xdp-live on" in c for c in captions)
        assert page.errors == []


@pytest.mark.slow
@pytest.mark.parametrize("width", [1280, 900, 700])
def test_no_table_is_wider_than_the_page(sample_report: Path, tmp_path: Path, width: int) -> None:
    with Browser.start(tmp_path / "profile") as browser:
        page = browser.open(sample_report.as_uri(), width=width)
        tables = page.evaluate(_TABLES)
        assert len(tables) >= 8
        for t in tables:
            assert t["left"] >= t["mainLeft"] - 0.5 and t["right"] <= t["mainRight"] + 0.5, (
                f"table {t['caption']!r} spans {t['left']:.0f}..{t['right']:.0f} px, "
                f"the page column {t['mainLeft']:.0f}..{t['mainRight']:.0f} px at viewport {width} px"
            )
        assert page.evaluate(
            "document.documentElement.scrollWidth <= window.innerWidth"
        ), "page scrolls sideways"
        assert page.errors == []


@pytest.mark.slow
def test_sections_left_out_are_listed_in_the_browser(tmp_path: Path) -> None:
    write_sample(tmp_path / "results", ["conformance"])
    report = render(tmp_path / "results", tmp_path / "index.html")
    with Browser.start(tmp_path / "profile") as browser:
        page = browser.open(report.as_uri(), width=1024)
        sections = _check_sections(page, expect_empty=set())
        assert [s["id"] for s in sections] == ["conformance", "history", "missing"]
        listed = page.evaluate("Array.from(document.querySelectorAll('#missing tbody tr'))"
                               ".filter(r => r.getBoundingClientRect().height > 0).length")
        assert listed == 9  # summary, demo, bench, rss, pmtu, churn, failover, corpus, fuzz
        assert page.errors == []


@pytest.mark.slow
def test_no_results_at_all_render_in_the_browser(tmp_path: Path) -> None:
    (tmp_path / "results").mkdir()
    report = render(tmp_path / "results", tmp_path / "index.html")
    with Browser.start(tmp_path / "profile") as browser:
        page = browser.open(report.as_uri(), width=1024)
        sections = _check_sections(page, expect_empty=set())
        assert [s["id"] for s in sections] == ["missing"]
        assert page.errors == [], "the zoom script must not fail on a page without charts"
