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

_IMAGES = "Array.from(document.images).map(i => ({alt: i.alt, complete: i.complete, width: i.naturalWidth}))"
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
        images = page.evaluate(_IMAGES)
        assert len(images) == 7
        for image in images:
            assert image["complete"] and image["width"] > 0, f"image not loaded: {image['alt']}"
        assert page.evaluate("document.querySelectorAll('section.no-results').length") == 0
        assert page.evaluate("document.title") == "l4lab report (synthetic sample)"
        shot = page.screenshot(tmp_path / "report.png")
        assert page.errors == [], "console errors while loading the report"
    _assert_non_blank_png(shot, 1280)


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
def test_empty_sections_show_their_notice_in_the_browser(tmp_path: Path) -> None:
    write_sample(tmp_path / "results", ["conformance"])
    report = render(tmp_path / "results", tmp_path / "index.html")
    with Browser.start(tmp_path / "profile") as browser:
        page = browser.open(report.as_uri(), width=1024)
        visible = page.evaluate(
            "Array.from(document.querySelectorAll('section.no-results p.empty'))"
            ".filter(p => p.getBoundingClientRect().height > 0).map(p => p.closest('section').id)"
        )
        assert visible == ["demo", "bench", "rss", "pmtu", "churn", "failover", "corpus", "fuzz"]
        assert page.errors == []
