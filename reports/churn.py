"""churn.py: the Maglev churn (ring slots moved when a real goes) result and its section."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from reports import charts
from reports.page import Cell, Section, Table, chart, fmt, kind_section, newest_rows
from reports.payload import at_least, non_empty, of_kind, rule

if TYPE_CHECKING:
    from reports.schema import Result


@dataclass(frozen=True)
class KatranChurn:
    """Katran's figures for the same change, copied from conformance/katran/maglev_churn.json."""

    ring_size: int = field(metadata=rule(at_least(1)))
    slots_owned_by_removed: int = field(metadata=rule(at_least(0)))
    slots_changed: int = field(metadata=rule(at_least(0)))


@dataclass(frozen=True)
class ConnectionOutcomes:
    """What happened to established connections across the change."""

    survived: int = field(metadata=rule(at_least(0)))
    reset: int = field(metadata=rule(at_least(0)))
    failed_fast: int = field(metadata=rule(at_least(0)))


@dataclass(frozen=True)
class ChurnPoint:
    """Ring disruption when one of n equal-weight reals is removed."""

    n: int = field(metadata=rule(at_least(2)))
    ring_size: int = field(metadata=rule(at_least(1)))
    slots_owned_by_removed: int = field(metadata=rule(at_least(0)))
    slots_changed: int = field(metadata=rule(at_least(0)))
    # ring_size / n: only the removed real's share moves
    theoretical_slots: float = field(metadata=rule(at_least(0)))
    katran: KatranChurn | None = None
    connections: ConnectionOutcomes | None = None

    def problems(self) -> Iterator[tuple[str, str]]:
        for name in ("slots_owned_by_removed", "slots_changed"):
            if getattr(self, name) > self.ring_size:
                yield name, f"must be ≤ ring_size ({self.ring_size}) but got {getattr(self, name)}"


@dataclass(frozen=True)
class ChurnPayload:
    """Maglev churn against the number of reals."""

    points: list[ChurnPoint] = field(metadata=rule(non_empty))


@kind_section(
    "churn",
    "Maglev churn: removing one of N reals",
    "Ring slots that change owner when one of N equal-weight reals is removed, as a share of the ring, "
    "beside the theoretical minimum (only the removed real's 1/N moves) and Katran's figures for the "
    "same change (copied into the results from Katran's ring). Collateral is changed − owned by removed.",
)
def section(section: Section, results: list[Result]) -> bool:
    rows = [
        {"time": r.time, "n": pt.n, "point": pt} for r, p in of_kind(results, ChurnPayload) for pt in p.points
    ]
    if not rows:
        return False
    frame = newest_rows(rows, ["n"]).sort_values("n")
    points = list(frame["point"])
    data = [{"n": pt.n, "ring_size": pt.ring_size, "slots_owned_by_removed": pt.slots_owned_by_removed,
             "slots_changed": pt.slots_changed, "theoretical_slots": pt.theoretical_slots,
             "katran_slots_owned": pt.katran.slots_owned_by_removed if pt.katran else None,
             "katran_slots_changed": pt.katran.slots_changed if pt.katran else None} for pt in points]
    katran = [pt for pt in points if pt.katran is not None]

    def pct(v: float, ring: int) -> float:
        return 100 * v / ring

    series = [charts.Series("theoretical: 1/N of the ring",
                            [(pt.n, pct(pt.theoretical_slots, pt.ring_size),
                              f"N={pt.n}: {pct(pt.theoretical_slots, pt.ring_size):.3g} %")
                             for pt in points], "#888", dashed=True, markers=False),
              charts.Series("l4lab: slots changed",
                            [(pt.n, pct(pt.slots_changed, pt.ring_size),
                              f"N={pt.n}: {pt.slots_changed} of {pt.ring_size} slots "
                              f"({pct(pt.slots_changed, pt.ring_size):.3g} %)")
                             for pt in points], charts.PALETTE[0])]
    if katran:
        series.append(charts.Series("Katran: slots changed",
                                    [(pt.n, pct(pt.katran.slots_changed, pt.katran.ring_size),
                                      f"N={pt.n}: {pt.katran.slots_changed} slots") for pt in katran if pt.katran],
                                    charts.PALETTE[1], line=False))
    title = "Ring disruption against the number of reals"
    section.charts.append(chart(
        charts.line_chart(title, series, x_label="reals before the removal, N (log scale)",
                          y_label="slots changed (% of ring, log)", log_x=True, log_y=True, y_min=None),
        title, "Log-log chart: percentage of ring slots changed against N for l4lab and Katran, with the "
               "theoretical 1/N line.", data))

    series = [charts.Series("l4lab", [(pt.n, pct(pt.slots_changed - pt.slots_owned_by_removed, pt.ring_size),
                                       f"N={pt.n}: {pt.slots_changed - pt.slots_owned_by_removed} slots")
                                      for pt in points], charts.PALETTE[0])]
    if katran:
        series.append(charts.Series("Katran", [(pt.n, pct(pt.katran.slots_changed - pt.katran.slots_owned_by_removed,
                                                           pt.katran.ring_size),
                                                f"N={pt.n}: "
                                                f"{pt.katran.slots_changed - pt.katran.slots_owned_by_removed} slots")
                                               for pt in katran if pt.katran], charts.PALETTE[1], line=False))
    title = "Collateral moves: slots changed that the removed real did not own"
    section.charts.append(chart(
        charts.line_chart(title, series, x_label="reals before the removal, N (log scale)",
                          y_label="collateral slots (% of ring)", log_x=True),
        title, "Chart: collateral slot moves as a percentage of the ring against N for l4lab and Katran.", data))

    table_rows = []
    for pt in points:
        k, c = pt.katran, pt.connections
        table_rows.append([
            Cell(str(pt.n), "num"), Cell(str(pt.ring_size), "num"), Cell(str(pt.slots_owned_by_removed), "num"),
            Cell(str(pt.slots_changed), "num"), Cell(fmt(pt.theoretical_slots, 0), "num"),
            Cell(str(pt.slots_changed - pt.slots_owned_by_removed), "num"),
            Cell(f"{k.slots_owned_by_removed} / {k.slots_changed}" if k else "–", "num"),
            Cell(f"{c.survived} / {c.reset} / {c.failed_fast}" if c else "–", "num")])
    section.tables.append(Table(
        "Slots per N (ring of the size given)",
        ["N", "ring slots", "owned by removed", "changed", "theoretical (ring ÷ N)", "collateral",
         "Katran owned / changed", "connections survived / reset / failed fast"], table_rows))
    return True


def figures(result: Result, p: ChurnPayload) -> dict[str, float | str]:
    """This result's figures by names stable across runs (reports/history.py trends and compares them)."""
    out: dict[str, float | str] = {}
    for churn in p.points:
        out[f"churn {result.test} N={churn.n} slots changed"] = float(churn.slots_changed)
    return out
