"""The report page as the tests see it: sections, figures (inline SVG), tables and downloads parsed with html.parser."""

from __future__ import annotations

from dataclasses import dataclass, field
from html.parser import HTMLParser


@dataclass
class Figure:
    section: str
    img: dict[str, str | None] = field(default_factory=dict)
    caption: str = ""
    svg: dict[str, str | None] = field(default_factory=dict)  # the chart's <svg> attributes
    marks: int = 0  # marks of class point / bar (a <g> around matplotlib's marker or bar)
    titled_marks: int = 0  # of those, how many carry a <title> (hover value)
    downloads: list[dict[str, str | None]] = field(default_factory=list)


@dataclass
class Table:
    section: str
    caption: str = ""
    header: list[str] = field(default_factory=list)
    rows: list[list[str]] = field(default_factory=list)
    downloads: list[dict[str, str | None]] = field(default_factory=list)


@dataclass
class Section:
    id: str
    classes: list[str]
    text: str = ""


class Page(HTMLParser):
    """Collects what the structural tests assert on; ``text`` is all visible text of the page."""

    def __init__(self, html: str) -> None:
        super().__init__(convert_charrefs=True)
        self.sections: dict[str, Section] = {}
        self.images: list[dict[str, str | None]] = []
        self.figures: list[Figure] = []
        self.tables: list[Table] = []
        self.header_text = ""
        self.text = ""
        self._section: Section | None = None
        self._figure: Figure | None = None
        self._table: Table | None = None
        self._row: list[str] | None = None
        self._cell: list[str] | None = None
        self.scripts: list[dict[str, str | None]] = []
        self.downloads: list[dict[str, str | None]] = []
        self._mark: bool = False  # the last start tag opened a point or bar, whose first child titles it
        self._last_table: Table | None = None
        self._in: list[str] = []  # open elements we track text for: caption, figcaption, header, style
        self.feed(html)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "section":
            self._section = Section(a.get("id") or "", (a.get("class") or "").split())
            self.sections[self._section.id] = self._section
        elif tag == "figure":
            self._figure = Figure(self._section.id if self._section else "")
            self.figures.append(self._figure)
        elif tag == "img":
            self.images.append(a)
            if self._figure is not None:
                self._figure.img = a
        elif tag == "svg" and self._figure is not None and not self._figure.svg:
            self._figure.svg = a
        elif tag == "g" and (a.get("class") or "") in ("point", "bar") and self._figure is not None:
            self._figure.marks += 1
        elif tag == "title" and self._mark and self._figure is not None:
            self._figure.titled_marks += 1
        elif tag == "script":
            self.scripts.append(a)
        elif tag == "a" and "download" in a:
            self.downloads.append(a)
            if self._figure is not None:
                self._figure.downloads.append(a)
            elif self._last_table is not None:
                self._last_table.downloads.append(a)
        elif tag == "table":
            self._table = Table(self._section.id if self._section else "")
            self.tables.append(self._table)
        elif tag == "tr":
            self._row = []
        elif tag in ("td", "th"):
            self._cell = []
        if tag in ("caption", "figcaption", "header", "style", "script", "title"):
            self._in.append(tag)
        # a mark's hover text is the <title> that is its first child
        self._mark = tag == "g" and (a.get("class") or "") in ("point", "bar")

    def handle_endtag(self, tag: str) -> None:
        if tag == "section":
            self._section = None
            self._last_table = None
        elif tag == "figure":
            self._figure = None
        elif tag == "table":
            self._last_table = self._table
            self._table = None
        elif tag in ("td", "th") and self._row is not None and self._cell is not None:
            self._row.append("".join(self._cell).strip())
            self._cell = None
        elif tag == "tr" and self._table is not None and self._row is not None:
            if not self._table.header:
                self._table.header = self._row
            else:
                self._table.rows.append(self._row)
            self._row = None
        if self._in and self._in[-1] == tag:
            self._in.pop()

    def handle_data(self, data: str) -> None:
        if "style" in self._in or "script" in self._in or "title" in self._in:
            return
        self.text += data
        if self._section is not None:
            self._section.text += data
        if self._cell is not None:
            self._cell.append(data)
        if "header" in self._in:
            self.header_text += data
        if self._in and self._in[-1] == "caption" and self._table is not None:
            self._table.caption += data
        if self._in and self._in[-1] == "figcaption" and self._figure is not None:
            self._figure.caption += data
