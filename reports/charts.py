"""The report's charts, drawn by matplotlib into inline SVG whose every mark carries a <title> (hover value).

Each function returns one ``<svg>`` element as a string, sized by its viewBox so it scales with the
page and prints sharply; nothing in it loads at view time and nothing needs JavaScript. matplotlib
draws a series' markers as ``<use>`` elements inside the group of the artist's gid, and a bar as one
``<path>`` inside its own; ``_svg`` wraps each in ``<g class="point|bar">`` with its ``<title>``, which
browsers show on hover. Text stays text (svg.fonttype none, DejaVu Sans, the font matplotlib ships
and measures with), ids are salted with the chart's title (svg.hashsalt) so two charts on one page
never share one and the same input gives the same bytes.
"""

from __future__ import annotations

import io
import math
import re
import textwrap
import types
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from html import escape
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["PALETTE", "Bars", "Series", "bar_grid", "line_chart", "sparkline", "timeline"]

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")
_RC = {"svg.fonttype": "none", "text.parse_math": False, "font.family": "DejaVu Sans", "font.size": 10,
       "axes.titlesize": 11, "axes.edgecolor": "#888", "axes.grid": True, "grid.color": "#e4e4e4",
       "legend.frameon": False}
_PX = 72  # one SVG user unit per pixel: a figure of w × h px is w/72 × h/72 inches at matplotlib's 72 pt per inch
Mark = Literal["point", "bar", "line", "change"]  # change: the line marking a change point
# What each mark kind wraps inside its artist's group: a marker is a <use>, a bar or a line a <path>.
_ELEMENT: dict[Mark, str] = {"point": "use", "bar": "path", "line": "path", "change": "path"}


@dataclass(frozen=True)
class Series:
    """One line: points (x, y, hover text); x is a position on a numeric axis or a category index."""

    name: str
    points: list[tuple[float, float, str]]
    colour: str = "#1f77b4"
    dashed: bool = False
    markers: bool = True
    line: bool = True


@dataclass(frozen=True)
class Bars:
    """One small bar chart of a grid: its subtitle and one bar per category, each with a hover text."""

    title: str
    values: list[float]
    tips: list[str] = field(default_factory=list)
    reference: float | None = None  # a dashed horizontal line (e.g. the mean)


class _Tips:
    """The hover texts of one figure, by the gid of the artist whose marks they title."""

    def __init__(self) -> None:
        self.by_gid: dict[str, tuple[Mark, list[str]]] = {}

    def gid(self, kind: Mark, tips: Sequence[str]) -> str:
        gid = f"l4lab-tips-{len(self.by_gid)}"
        self.by_gid[gid] = (kind, list(tips))
        return gid


def _matplotlib() -> types.ModuleType:
    """matplotlib, loaded by the first chart: it is the report extra and takes a second to import, and writing
    results (reports/schema.py imports every kind's module, so this one) must need neither."""
    import matplotlib.figure
    import matplotlib.lines
    import matplotlib.ticker

    return matplotlib


def _figure(width: int, height: int, **layout: Any) -> Figure:
    figure: Figure = _matplotlib().figure.Figure(figsize=(width / _PX, height / _PX), dpi=_PX, **layout)
    return figure


def _group_end(svg: str, start: int) -> int:
    """The index just past the </g> closing the <g> opened at ``start``."""
    depth = 0
    for tag in re.finditer(r"<g[\s>]|</g>", svg[start:]):
        depth += -1 if tag.group() == "</g>" else 1
        if depth == 0:
            return start + tag.end()
    raise ValueError("matplotlib wrote an unclosed <g>")


def _titled(svg: str, gid: str, kind: Mark, tips: list[str]) -> str:
    """``svg`` with each mark of the artist ``gid`` wrapped in <g class=kind><title>tip</title>…</g>."""
    start = svg.index(f'<g id="{gid}">')
    end = _group_end(svg, start)
    group = svg[start:end]
    marks = list(re.finditer(rf"<{_ELEMENT[kind]} [^>]*?/>", re.sub(r"<defs>.*?</defs>", _blank, group, flags=re.S)))
    if kind in ("line", "change"):
        marks = marks[:1]
    if len(marks) != len(tips):
        raise ValueError(f"chart artist {gid}: {len(marks)} marks drawn for {len(tips)} hover texts")
    out, at = [], 0
    for mark, tip in zip(marks, tips, strict=True):
        out += [group[at:mark.start()], f'<g class="{kind}"><title>{escape(tip)}</title>', mark.group(), "</g>"]
        at = mark.end()
    out.append(group[at:])
    return svg[:start] + '<g class="series">' + "".join(out)[len(f'<g id="{gid}">'):] + svg[end:]


def _blank(match: re.Match[str]) -> str:
    return " " * len(match.group())  # keeps offsets, hides <defs> (a marker's shape is not a mark)


def _svg(fig: Figure, label: str, tips: _Tips, css: str = "chart") -> str:
    """The figure as one <svg> element: labelled, its auto ids dropped and every mark titled."""
    buffer = io.StringIO()
    with _matplotlib().rc_context({"svg.hashsalt": label}):
        fig.savefig(buffer, format="svg", metadata={"Date": None, "Creator": None})
    svg = buffer.getvalue()
    svg = svg[svg.index("<svg "):]
    svg = re.sub(r"<metadata>.*?</metadata>\s*", "", svg, flags=re.S)
    # matplotlib's <style> would apply to the whole page; the template gives charts the same rule
    svg = re.sub(r"<defs>\s*<style[^>]*>.*?</style>\s*</defs>\s*", "", svg, flags=re.S)
    svg = re.sub(r' id="(?:figure|axes|patch|line2d|text|matplotlib\.axis|xtick|ytick|legend|PathCollection'
                 r'|LineCollection|Collection|image)_\d+"', "", svg)
    for gid, (kind, texts) in tips.by_gid.items():
        svg = _titled(svg, gid, kind, texts)
    box = re.search(r'viewBox="0 0 ([\d.]+) ([\d.]+)"', svg)
    if box is None:
        raise ValueError("matplotlib wrote an <svg> without a viewBox")
    width, height = (round(float(v)) for v in box.groups())
    opening = (f'<svg class="{css}" viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
               f'aria-label="{escape(label)}" xmlns="http://www.w3.org/2000/svg" '
               f'xmlns:xlink="http://www.w3.org/1999/xlink"><title>{escape(label)}</title>')
    return opening + svg[svg.index(">") + 1:].strip()


def _plot_series(ax: Any, s: Series, tips: _Tips) -> None:
    finite = sorted((p for p in s.points if math.isfinite(p[1])), key=lambda p: p[0])
    if not finite:
        return
    xs, ys, texts = [p[0] for p in finite], [p[1] for p in finite], [f"{s.name}: {p[2]}" for p in finite]
    style = "--" if s.dashed else "-"
    if s.line and len(finite) > 1:
        ax.plot(xs, ys, style, color=s.colour, linewidth=2, label=s.name)
    if s.markers:
        ax.plot(xs, ys, "o", color=s.colour, markersize=6, gid=tips.gid("point", texts),
                label="_" if s.line and len(finite) > 1 else s.name)


def _plain_numbers(axis: Any) -> None:
    """Ticks of a log axis as plain numbers (100, 0.5), not the mathtext powers matplotlib writes by default."""
    ticker = _matplotlib().ticker
    axis.set_major_formatter(ticker.FuncFormatter(lambda value, _pos: f"{value:g}"))
    axis.set_minor_formatter(ticker.NullFormatter())


def line_chart(title: str, series: Sequence[Series], *, x_label: str, y_label: str,
               categories: Sequence[str] | None = None, log_x: bool = False, log_y: bool = False,
               y_min: float | None = 0.0, hlines: Sequence[tuple[float, str]] = (),
               width: int = 760, height: int = 380) -> str:
    """Lines over a numeric x axis (log if asked) or over ``categories`` (x = index)."""
    tips = _Tips()
    with _matplotlib().rc_context(_RC):
        fig = _figure(width, height, layout="constrained")
        ax = fig.add_subplot()
        ax.set_title(title, fontweight="bold")
        ax.set_xlabel(x_label)
        ax.set_ylabel(y_label)
        if log_x:
            ax.set_xscale("log")
            _plain_numbers(ax.xaxis)
        if log_y:
            ax.set_yscale("log")
            _plain_numbers(ax.yaxis)
        if categories is not None:
            ax.set_xticks(range(len(categories)), list(categories))
            ax.set_xlim(-0.5, max(len(categories) - 0.5, 0.5))
        elif log_x:
            xs = sorted({p[0] for s in series for p in s.points})
            ax.set_xticks(xs, [f"{x:g}" for x in xs])
            ax.minorticks_off()
        for value, name in hlines:
            ax.axhline(value, color="#777", linestyle="--", linewidth=1.2, label=name,
                       gid=tips.gid("line", [f"{name}: {value:g}"]))
        for s in series:
            _plot_series(ax, s, tips)
        if y_min is not None and not log_y:
            ax.set_ylim(bottom=min(y_min, ax.get_ylim()[0]))
        fig.legend(loc="outside lower center", ncols=min(max(len(series) + len(hlines), 1), 6))
        return _svg(fig, title, tips)


def bar_grid(title: str, panels: Sequence[Bars], *, x_label: str, y_label: str, columns: int = 3,
             panel_width: int = 250, panel_height: int = 190) -> str:
    """Small bar charts side by side (e.g. flows per receive queue, one panel per scenario)."""
    columns = max(1, min(columns, len(panels)))
    rows = math.ceil(len(panels) / columns)
    tips = _Tips()
    width, height = columns * panel_width, rows * panel_height + 34
    # Fixed margins in pixels per panel (the solver of constrained layout takes seconds on a grid).
    inner_w, inner_h = panel_width - 62, panel_height - 80
    margins = {"left": 46 / width, "right": 1 - 16 / width, "wspace": 62 / inner_w,
               "top": 1 - 78 / height, "bottom": 36 / height, "hspace": 80 / inner_h}
    with _matplotlib().rc_context({**_RC, "axes.grid": False}):
        fig = _figure(width, height)
        fig.suptitle(title, fontweight="bold", fontsize=10, y=1 - 8 / height, va="top")
        axes = list(fig.subplots(rows, columns, squeeze=False, gridspec_kw=margins).flat)
        for ax, panel in zip(axes, panels, strict=False):
            head, _, tail = panel.title.partition(": ")  # "name (source): figures" on two lines
            ax.set_title(f"{head}\n{tail}" if tail else head, fontsize=8)
            texts = [panel.tips[j] if j < len(panel.tips) else f"{j}: {v:g}" for j, v in enumerate(panel.values)]
            for bar, text in zip(ax.bar(range(len(panel.values)), panel.values, color="#4c72b0"), texts, strict=True):
                bar.set_gid(tips.gid("bar", [text]))
            if panel.reference is not None:
                ax.axhline(panel.reference, color="#555", linestyle="--", linewidth=1,
                           gid=tips.gid("line", [f"mean {panel.reference:g}"]))
            n = len(panel.values)
            ax.set_xticks(range(n) if n <= 16 else [], [str(j) for j in range(n)] if n <= 16 else [], fontsize=7)
            ax.set_xlabel(x_label, fontsize=8)
            ax.set_ylabel(y_label, fontsize=8)
            ax.tick_params(axis="y", labelsize=7)
        for ax in axes[len(panels):]:
            ax.set_axis_off()  # the grid's empty cells
        return _svg(fig, title, tips)


def timeline(title: str, events: Sequence[tuple[float, str]], *, x_label: str, width: int = 760) -> str:
    """Events as labelled dots on a time axis, one row each, in order."""
    tips = _Tips()
    # Long event names wrap onto lines of their row: the axis keeps at least half the width.
    names = [textwrap.fill(name, 44) for _, name in events]
    lines = sum(name.count("\n") + 1 for name in names)
    with _matplotlib().rc_context(_RC):
        fig = _figure(width, 90 + 16 * lines + 10 * len(events), layout="constrained")
        fig.suptitle(title, fontweight="bold", fontsize=11)
        ax = fig.add_subplot()
        rows = list(range(len(events)))
        times = [t for t, _ in events]
        ax.hlines(rows, 0, times, color="#ccc")
        ax.plot(times, rows, "o", color="#4c72b0", markersize=7,
                gid=tips.gid("point", [f"{name}: {t:.3f} s" for t, name in events]))
        for t, row in zip(times, rows, strict=True):
            ax.annotate(f"{t:.2f} s", (t, row), xytext=(6, 0), textcoords="offset points", va="center", fontsize=8)
        ax.set_yticks(rows, names, fontsize=9)
        ax.set_ylim(len(events) - 0.5, -0.5)
        ax.set_xlim(0, max([*times, 0.1]) * 1.15)
        ax.set_xlabel(x_label)
        return _svg(fig, title, tips)


def sparkline(label: str, points: Sequence[tuple[float, str]], width: int = 180, height: int = 36,
              marks: Collection[int] = ()) -> str:
    """A small trend: one value per run in order, each dot titled with its run and value; the points
    in `marks` (a change point) drawn red with a dashed line across the chart."""
    # No axes: lines in figure coordinates draw a table cell's many sparklines several times faster.
    values = [v for v, _ in points]
    low, high = min(values), max(values)
    xs = [0.04 + 0.92 * i / max(len(points) - 1, 1) for i in range(len(points))]
    ys = [0.15 + 0.7 * ((v - low) / (high - low) if high > low else 0.5) for v in values]
    tips = _Tips()
    line = _matplotlib().lines.Line2D
    with _matplotlib().rc_context(_RC):
        fig = _figure(width, height)
        if len(points) > 1:
            fig.add_artist(line(xs, ys, color="#4c72b0", linewidth=1.5, transform=fig.transFigure))
        for i in sorted(marks):
            fig.add_artist(line([xs[i], xs[i]], [0.04, 0.96], color="#c44e52", linestyle=(0, (2, 2)),
                                  linewidth=1, transform=fig.transFigure,
                                  gid=tips.gid("change", ["a change beyond the noise starts here"])))
        for red in (False, True):
            chosen = [i for i in range(len(points)) if (i in marks) == red]
            if chosen:
                fig.add_artist(line([xs[i] for i in chosen], [ys[i] for i in chosen], marker="o", linestyle="none",
                                      markersize=4, color="#c44e52" if red else "#4c72b0", transform=fig.transFigure,
                                      gid=tips.gid("point", [points[i][1] for i in chosen])))
        return _svg(fig, label, tips, css="spark")
