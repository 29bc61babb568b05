"""Inline SVG charts for the report: axes, series and bars whose every mark carries a <title> (hover value).

No library and no external resource: each function returns one ``<svg>`` element as a string, sized
by its viewBox so it scales with the page and prints sharply. Marks are circles, bars or dots with a
``<title>`` child that browsers show on hover; the page's inlined script (ZOOM_SCRIPT) lets the
reader zoom with the wheel, pan by dragging and reset with a double click on any ``svg.zoomable``.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from html import escape

__all__ = ["ZOOM_SCRIPT", "Bars", "Series", "bar_grid", "line_chart", "sparkline", "timeline"]

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")
_FONT = 'font-family="system-ui, DejaVu Sans, sans-serif"'


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


def _a(text: object) -> str:
    return escape(str(text), quote=True)


def _nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    if not math.isfinite(low) or not math.isfinite(high):
        return [0.0]
    if high <= low:
        high = low + 1.0
    raw = (high - low) / count
    step = 10 ** math.floor(math.log10(raw))
    for mult in (1, 2, 2.5, 5, 10):
        if raw <= step * mult:
            step *= mult
            break
    start = math.floor(low / step) * step
    ticks = []
    value = start
    while value <= high + step * 1e-9:
        ticks.append(round(value, 10))
        value += step
    return ticks


def _fmt(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 1000 or abs(value) < 0.01:
        return f"{value:.3g}"
    return f"{value:.6g}" if value == int(value) else f"{value:.3g}"


def _open(width: int, height: int, label: str) -> str:
    return (f'<svg class="chart zoomable" viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
            f'role="img" aria-label="{_a(label)}" xmlns="http://www.w3.org/2000/svg" {_FONT} font-size="12">'
            f'<title>{_a(label)}</title><rect width="{width}" height="{height}" fill="#fff"/>')


def line_chart(title: str, series: Sequence[Series], *, x_label: str, y_label: str,
               categories: Sequence[str] | None = None, log_x: bool = False, log_y: bool = False,
               y_min: float | None = 0.0, hlines: Sequence[tuple[float, str]] = (),
               width: int = 760, height: int = 380) -> str:
    """Lines over a numeric x axis (log if asked) or over ``categories`` (x = index)."""
    left, right, top, bottom = 64, 16, 30, 92
    pw, ph = width - left - right, height - top - bottom
    xs = [p[0] for s in series for p in s.points]
    ys = [p[1] for s in series for p in s.points if math.isfinite(p[1])] + [v for v, _ in hlines]
    if categories is not None:
        x_lo, x_hi = -0.5, max(len(categories) - 0.5, 0.5)
    else:
        x_lo, x_hi = (min(xs), max(xs)) if xs else (0.0, 1.0)
        if x_hi == x_lo:
            x_lo, x_hi = x_lo - 1, x_hi + 1
    y_lo = min(ys) if ys else 0.0
    y_hi = max(ys) if ys else 1.0
    if log_y:
        positive = [y for y in ys if y > 0] or [1.0]
        y_lo, y_hi = min(positive) / 1.5, max(positive) * 1.5
    else:
        if y_min is not None:
            y_lo = min(y_min, y_lo)
        y_hi = y_hi + (y_hi - y_lo) * 0.08 if y_hi > y_lo else y_lo + 1.0

    def fx(x: float) -> float:
        if log_x and categories is None:
            lo, hi = math.log10(max(x_lo, 1e-9)), math.log10(max(x_hi, 1e-9))
            return left + pw * (math.log10(max(x, 1e-9)) - lo) / ((hi - lo) or 1)
        return left + pw * (x - x_lo) / ((x_hi - x_lo) or 1)

    def fy(y: float) -> float:
        if log_y:
            lo, hi = math.log10(y_lo), math.log10(y_hi)
            return top + ph - ph * (math.log10(max(y, y_lo)) - lo) / ((hi - lo) or 1)
        return top + ph - ph * (y - y_lo) / ((y_hi - y_lo) or 1)

    out = [_open(width, height, title)]
    out.append(f'<text x="{width / 2}" y="18" text-anchor="middle" font-weight="600" font-size="14">{_a(title)}</text>')
    # y grid and ticks
    if log_y:
        yticks = [10.0 ** e * m for e in range(math.floor(math.log10(y_lo)), math.ceil(math.log10(y_hi)) + 1)
                  for m in (1, 2, 5) if y_lo <= 10.0 ** e * m <= y_hi]
    else:
        yticks = [t for t in _nice_ticks(y_lo, y_hi) if y_lo - 1e-9 <= t <= y_hi + 1e-9]
    for t in yticks:
        y = fy(t)
        out.append(f'<line x1="{left}" x2="{left + pw}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e4e4e4"/>'
                   f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{_a(_fmt(t))}</text>')
    # x ticks
    if categories is not None:
        xticks = [(float(i), c) for i, c in enumerate(categories)]
    elif log_x:
        xticks = [(x, _fmt(x)) for x in sorted(set(xs))]
    else:
        xticks = [(t, _fmt(t)) for t in _nice_ticks(x_lo, x_hi) if x_lo <= t <= x_hi]
    for x, text in xticks:
        px = fx(x)
        out.append(f'<line x1="{px:.1f}" x2="{px:.1f}" y1="{top + ph}" y2="{top + ph + 4}" stroke="#555"/>'
                   f'<text x="{px:.1f}" y="{top + ph + 17}" text-anchor="middle">{_a(text)}</text>')
    out.append(f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#888"/>')
    out.append(f'<text x="{left + pw / 2}" y="{top + ph + 36}" text-anchor="middle">{_a(x_label)}</text>')
    out.append(f'<text transform="translate(14 {top + ph / 2}) rotate(-90)" text-anchor="middle">{_a(y_label)}</text>')
    for value, name in hlines:
        y = fy(value)
        out.append(f'<line x1="{left}" x2="{left + pw}" y1="{y:.1f}" y2="{y:.1f}" stroke="#777" '
                   f'stroke-dasharray="6 4"><title>{_a(name)}: {_a(_fmt(value))}</title></line>')
    for s in series:
        pts = sorted(s.points, key=lambda p: p[0])
        finite = [(fx(x), fy(y), tip) for x, y, tip in pts if math.isfinite(y)]
        dash = ' stroke-dasharray="6 4"' if s.dashed else ""
        if s.line and len(finite) > 1:
            path = " ".join(f"{x:.1f},{y:.1f}" for x, y, _ in finite)
            out.append(f'<polyline points="{path}" fill="none" stroke="{s.colour}" stroke-width="2"{dash}/>')
        if s.markers:
            for x, y, tip in finite:
                out.append(f'<circle class="point" cx="{x:.1f}" cy="{y:.1f}" r="4.5" fill="{s.colour}">'
                           f'<title>{_a(s.name)}: {_a(tip)}</title></circle>')
    # legend, below the x label
    lx, ly = left, top + ph + 56
    for s in list(series) + [Series(n, [], "#777", dashed=True) for _, n in hlines]:
        label_w = 26 + 7 * len(s.name)
        if lx + label_w > width - right:
            lx, ly = left, ly + 16
        dash = ' stroke-dasharray="6 4"' if s.dashed else ""
        out.append(f'<line x1="{lx}" x2="{lx + 18}" y1="{ly - 4}" y2="{ly - 4}" stroke="{s.colour}" '
                   f'stroke-width="2"{dash}/><text x="{lx + 22}" y="{ly}">{_a(s.name)}</text>')
        lx += label_w + 12
    out.append("</svg>")
    return "".join(out)


def bar_grid(title: str, panels: Sequence[Bars], *, x_label: str, y_label: str, columns: int = 3,
             panel_width: int = 250, panel_height: int = 170) -> str:
    """Small bar charts side by side (e.g. flows per receive queue, one panel per scenario)."""
    columns = max(1, min(columns, len(panels)))
    rows = math.ceil(len(panels) / columns)
    width, height = columns * panel_width, rows * panel_height + 34
    out = [_open(width, height, title)]
    out.append(f'<text x="{width / 2}" y="18" text-anchor="middle" font-weight="600" font-size="14">{_a(title)}</text>')
    for i, panel in enumerate(panels):
        ox, oy = (i % columns) * panel_width, 34 + (i // columns) * panel_height
        left, top, pw, ph = ox + 46, oy + 32, panel_width - 62, panel_height - 68
        peak = max([*panel.values, panel.reference or 0.0, 1e-9])
        head, _, tail = panel.title.partition(": ")  # "name (source): figures" on two lines
        out.append(f'<text x="{ox + panel_width / 2}" y="{oy + 10}" text-anchor="middle" font-size="11">'
                   f'{_a(head)}</text><text x="{ox + panel_width / 2}" y="{oy + 23}" text-anchor="middle" '
                   f'font-size="10.5" fill="#444">{_a(tail)}</text>')
        out.append(f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#aaa"/>')
        out.append(f'<text x="{left - 4}" y="{top + 4}" text-anchor="end" font-size="10">{_a(_fmt(peak))}</text>'
                   f'<text x="{left - 4}" y="{top + ph}" text-anchor="end" font-size="10">0</text>')
        n = max(len(panel.values), 1)
        bw = pw / n
        for j, value in enumerate(panel.values):
            h = ph * value / peak
            tip = panel.tips[j] if j < len(panel.tips) else f"{j}: {_fmt(value)}"
            out.append(f'<rect class="bar" x="{left + j * bw + 1:.1f}" y="{top + ph - h:.1f}" '
                       f'width="{max(bw - 2, 1):.1f}" height="{h:.1f}" fill="#4c72b0"><title>{_a(tip)}</title></rect>')
            if n <= 16:
                out.append(f'<text x="{left + (j + 0.5) * bw:.1f}" y="{top + ph + 12}" text-anchor="middle" '
                           f'font-size="10">{j}</text>')
        if panel.reference is not None:
            y = top + ph - ph * panel.reference / peak
            out.append(f'<line x1="{left}" x2="{left + pw}" y1="{y:.1f}" y2="{y:.1f}" stroke="#555" '
                       f'stroke-dasharray="5 3"><title>mean {_a(_fmt(panel.reference))}</title></line>')
        out.append(f'<text x="{left + pw / 2}" y="{top + ph + 26}" text-anchor="middle" font-size="10.5">'
                   f'{_a(x_label)}</text>')
        out.append(f'<text transform="translate({ox + 12} {top + ph / 2}) rotate(-90)" text-anchor="middle" '
                   f'font-size="10.5">{_a(y_label)}</text>')
    out.append("</svg>")
    return "".join(out)


def timeline(title: str, events: Sequence[tuple[float, str]], *, x_label: str, width: int = 760) -> str:
    """Events as labelled dots on a time axis, one row each, in order."""
    left, right, top = 250, 60, 30
    row = 24
    height = top + row * len(events) + 48
    pw = width - left - right
    t_hi = max([t for t, _ in events] + [0.1]) * 1.1
    out = [_open(width, height, title)]
    out.append(f'<text x="{width / 2}" y="18" text-anchor="middle" font-weight="600" font-size="14">{_a(title)}</text>')
    for tick in _nice_ticks(0, t_hi):
        if tick > t_hi:
            continue
        x = left + pw * tick / t_hi
        out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{top}" y2="{top + row * len(events)}" stroke="#eee"/>'
                   f'<text x="{x:.1f}" y="{top + row * len(events) + 16}" text-anchor="middle">{_a(_fmt(tick))}</text>')
    for i, (t, name) in enumerate(events):
        y = top + row * i + row / 2
        x = left + pw * t / t_hi
        out.append(f'<text x="{left - 8}" y="{y + 4:.1f}" text-anchor="end">{_a(name)}</text>'
                   f'<line x1="{left}" x2="{x:.1f}" y1="{y:.1f}" y2="{y:.1f}" stroke="#ccc"/>'
                   f'<circle class="point" cx="{x:.1f}" cy="{y:.1f}" r="5" fill="#4c72b0">'
                   f'<title>{_a(name)}: {t:.3f} s</title></circle>'
                   f'<text x="{x + 8:.1f}" y="{y + 4:.1f}" font-size="11">{t:.2f} s</text>')
    out.append(f'<text x="{left + pw / 2}" y="{height - 8}" text-anchor="middle">{_a(x_label)}</text></svg>')
    return "".join(out)


def sparkline(label: str, points: Sequence[tuple[float, str]], width: int = 180, height: int = 36,
              marks: Collection[int] = ()) -> str:
    """A small trend: one value per run in order, each dot titled with its run and value; the points
    in `marks` (a change point) drawn red with a line down the chart."""
    values = [v for v, _ in points]
    lo, hi = min(values), max(values)
    span = (hi - lo) or (abs(hi) or 1.0)
    step = (width - 12) / max(len(points) - 1, 1)

    def y(v: float) -> float:
        return height - 6 - (height - 12) * ((v - lo) / span if hi > lo else 0.5)

    out = [f'<svg class="spark" viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
           f'aria-label="{_a(label)}" xmlns="http://www.w3.org/2000/svg"><title>{_a(label)}</title>']
    if len(points) > 1:
        path = " ".join(f"{6 + i * step:.1f},{y(v):.1f}" for i, (v, _) in enumerate(points))
        out.append(f'<polyline points="{path}" fill="none" stroke="#4c72b0" stroke-width="1.5"/>')
    for i in sorted(marks):
        out.append(f'<line class="change" x1="{6 + i * step:.1f}" x2="{6 + i * step:.1f}" y1="2" y2="{height - 2}" '
                   'stroke="#c44e52" stroke-dasharray="2,2"/>')
    for i, (v, tip) in enumerate(points):
        color = "#c44e52" if i in marks else "#4c72b0"
        out.append(f'<circle class="point" cx="{6 + i * step:.1f}" cy="{y(v):.1f}" r="3" fill="{color}">'
                   f'<title>{_a(tip)}</title></circle>')
    out.append("</svg>")
    return "".join(out)


#: Wheel zooms around the pointer, drag pans, double click resets; every svg.zoomable of the page.
ZOOM_SCRIPT = """
(function () {
  function box(svg) { return svg.viewBox.baseVal; }
  document.querySelectorAll('svg.zoomable').forEach(function (svg) {
    var b = box(svg), home = [b.x, b.y, b.width, b.height], drag = null;
    function at(ev) {
      var r = svg.getBoundingClientRect(), v = box(svg);
      return [v.x + (ev.clientX - r.left) / r.width * v.width, v.y + (ev.clientY - r.top) / r.height * v.height];
    }
    svg.addEventListener('wheel', function (ev) {
      ev.preventDefault();
      var v = box(svg), p = at(ev), k = ev.deltaY < 0 ? 0.8 : 1.25;
      var w = Math.min(home[2], v.width * k), h = Math.min(home[3], v.height * k);
      v.x = p[0] - (p[0] - v.x) * w / v.width; v.y = p[1] - (p[1] - v.y) * h / v.height;
      v.width = w; v.height = h;
      svg.classList.toggle('zoomed', w < home[2]);
    }, {passive: false});
    svg.addEventListener('pointerdown', function (ev) { drag = at(ev); });
    svg.addEventListener('pointermove', function (ev) {
      if (!drag) { return; }
      var v = box(svg), p = at(ev);
      v.x -= p[0] - drag[0]; v.y -= p[1] - drag[1];
    });
    ['pointerup', 'pointerleave'].forEach(function (n) { svg.addEventListener(n, function () { drag = null; }); });
    svg.addEventListener('dblclick', function () {
      var v = box(svg); v.x = home[0]; v.y = home[1]; v.width = home[2]; v.height = home[3];
      svg.classList.remove('zoomed');
    });
  });
})();
"""
