"""test_charts.py: matplotlib's SVG as the report inlines it (reports/charts.py): every mark titled with its own
hover text in order, the same bytes for the same input, no id shared between two charts of one page."""

from __future__ import annotations

import math
import re
from html.parser import HTMLParser

from reports import charts


class _Marks(HTMLParser):
    """(class, title) of every <g class="point|bar|change"> in an SVG, in document order."""

    def __init__(self, svg: str) -> None:
        super().__init__(convert_charrefs=True)
        self.marks: list[tuple[str, str]] = []
        self._open: str | None = None  # the class of the mark whose first child we expect to be its <title>
        self._title: list[str] | None = None
        self.feed(svg)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "title" and self._open is not None:
            self._title = []
            return
        css = dict(attrs).get("class") or ""
        self._open = css if tag == "g" and css in ("point", "bar", "change") else None

    def handle_data(self, data: str) -> None:
        if self._title is not None:
            self._title.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "title" and self._title is not None and self._open is not None:
            self.marks.append((self._open, "".join(self._title)))
            self._title, self._open = None, None


def _line() -> str:
    return charts.line_chart(
        "Two series & a <floor>",
        [charts.Series("a", [(0, 1.0, "first of a"), (1, 2.0, "second of a"), (2, math.nan, "never drawn")]),
         charts.Series("b", [(1, 1.5, "only of b")], colour="#ff7f0e", line=False)],
        x_label="x", y_label="y", categories=["64", "128", "imix"], hlines=[(2.5, "floor")])


def test_every_point_carries_its_own_hover_text_in_order() -> None:
    assert _Marks(_line()).marks == [("point", "a: first of a"), ("point", "a: second of a"),
                                     ("point", "b: only of b")], "a NaN point is neither drawn nor titled"


def test_every_bar_and_change_mark_carries_its_hover_text() -> None:
    grid = charts.bar_grid("Flows per queue", [charts.Bars("s1 (model): even", [3.0, 0.0], ["q0: 3", "q1: 0"], 1.5),
                                               charts.Bars("s2", [1.0], ["q0: 1"])],
                           x_label="queue", y_label="flows")
    assert _Marks(grid).marks == [("bar", "q0: 3"), ("bar", "q1: 0"), ("bar", "q0: 1")]
    spark = charts.sparkline("trend", [(1.0, "run 1"), (1.0, "run 2"), (2.0, "run 3 changed")], marks={2})
    assert sorted(_Marks(spark).marks) == [("change", "a change beyond the noise starts here"),
                                           ("point", "run 1"), ("point", "run 2"), ("point", "run 3 changed")]


def test_the_svg_is_labelled_self_contained_and_escapes_text() -> None:
    svg = _line()
    assert svg.startswith('<svg class="chart" viewBox="0 0 760 380" ') and svg.endswith("</svg>")
    assert 'aria-label="Two series &amp; a &lt;floor&gt;"' in svg
    assert "<title>Two series &amp; a &lt;floor&gt;</title>" in svg
    assert not re.search(r"<script|<style|<image|href=\"http|<metadata", svg), "nothing to load, run or apply page-wide"


def test_the_same_input_gives_the_same_bytes_and_two_charts_share_no_id() -> None:
    assert _line() == _line()
    other = charts.line_chart("Another chart", [charts.Series("a", [(0, 1.0, "p")])], x_label="x", y_label="y")
    ids = [set(re.findall(r' id="([^"]+)"', svg)) for svg in (_line(), other)]
    assert ids[0] and ids[1] and not ids[0] & ids[1], ids[0] & ids[1]
