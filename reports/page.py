"""The report's building blocks: sections, tables, cells and charts, with their CSV/JSON downloads, and
the small formatters every section uses."""

from __future__ import annotations

import base64
import csv
import functools
import io
import json
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC
from typing import TYPE_CHECKING, Any

from reports import charts
from reports.payload import ENCAP_IDS

if TYPE_CHECKING:
    import pandas as pd

    from reports.schema import Result


ENCAP_COLOURS = dict(zip(ENCAP_IDS, charts.PALETTE, strict=False))


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
    svg: str  # <svg> markup by reports/charts.py, text escaped there
    data: list[dict[str, Any]] = field(default_factory=list)

    @property
    def downloads(self) -> list[Download]:
        return _downloads(self.title, self.data)


@dataclass(frozen=True)
class Cell:
    text: str
    css: str = ""
    hint: str = ""  # shown on hover
    html: str | None = None  # <svg> markup shown instead of text (a sparkline); text stays the data value


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


#: Fills a section from the results; False when they hold nothing for it.
Fill = Callable[[Section, "list[Result]"], bool]


def kind_section(id: str, title: str, intro: str) -> Callable[[Fill], Callable[[list[Result]], Section]]:
    """Make a section function of ``fill``: the section opens with this heading and is marked empty (the
    no-results notice; render.FILLED_BY names the command that fills it) when ``fill`` returns False."""

    def make(fill: Fill) -> Callable[[list[Result]], Section]:
        @functools.wraps(fill)
        def build(results: list[Result]) -> Section:
            section = Section(id, title, intro)
            section.empty = not fill(section, results)
            return section

        return build

    return make


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


def chart(markup: str, title: str, alt: str, data: list[dict[str, Any]]) -> Chart:
    return Chart(title=title, alt=alt, svg=markup, data=data)


def fmt(value: float, digits: int = 2) -> str:
    return f"{value:.{digits}f}"


def pvalue(value: float, equals: str = "") -> str:
    """A p-value for people: tiny ones as an upper bound."""
    return "< 1e-6" if value < 1e-6 else f"{equals}{value:.3g}"


def newest_rows(rows: list[dict[str, Any]], keys: list[str]) -> pd.DataFrame:
    """A frame of ``rows`` keeping only the newest (column ``time``) per key; ties go to the later row."""
    import pandas as pd  # the report extra: writing results (schema.py imports every kind's module) needs none

    return pd.DataFrame(rows).sort_values("time", kind="stable").drop_duplicates(keys, keep="last")


def newest(results: Iterable[tuple[Result, Any]], key: Any) -> list[tuple[Result, Any]]:
    """The newest (result, payload) per ``key(result, payload)``, in the order first seen."""
    best: dict[Any, tuple[Result, Any]] = {}
    for r, p in results:
        k = key(r, p)
        if k not in best or r.time >= best[k][0].time:
            best[k] = (r, p)
    return list(best.values())


def size_order(size: Any) -> tuple[int, float]:
    return (1, 0.0) if size == "imix" else (0, float(size))


def encap_rank(encap: str) -> int:
    return ENCAP_IDS.index(encap) if encap in ENCAP_IDS else len(ENCAP_IDS)


def short_commit(commit: str) -> str:
    return commit[:10] + ("-dirty" if commit.endswith("-dirty") else "") if commit != "unknown" else commit


def when(r: Result) -> str:
    return r.time.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")


def run_label(r: Result, generator: str | None = None) -> str:
    gen = f", {generator}" if generator else ""
    return f"{r.machine.hostname}{gen}, commit {short_commit(r.commit)}, {when(r)}"


def distinct(values: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(values))
