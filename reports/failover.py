"""failover.py: the failover timelines result and its section."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from reports import charts
from reports.page import Cell, Section, Table, chart, fmt, kind_section, newest
from reports.payload import at_least, non_empty, of_kind, rule

if TYPE_CHECKING:
    from reports.schema import Result


@dataclass(frozen=True)
class TimelineEvent:
    """One thing that happened, in seconds since the test's start."""

    t: float = field(metadata=rule(at_least(0)))
    event: str = field(metadata=rule(non_empty))


@dataclass(frozen=True)
class FailoverPayload:
    """A failover: its timeline and how long traffic was interrupted."""

    timeline: list[TimelineEvent] = field(metadata=rule(non_empty))
    failover_seconds: float = field(metadata=rule(at_least(0)))


@kind_section(
    "failover",
    "Failover timelines",
    "What happened, and when, in each failover test; the failover time is how long traffic was "
    "interrupted.",
)
def section(section: Section, results: list[Result]) -> bool:
    found = newest(of_kind(results, FailoverPayload), lambda r, p: (r.machine.hostname, r.id))
    if not found:
        return False
    table_rows = []
    for result, payload in sorted(found, key=lambda rp: rp[0].id):
        events = sorted(payload.timeline, key=lambda e: e.t)
        title = f"{result.id}: traffic interrupted for {payload.failover_seconds:.2f} s"
        section.charts.append(chart(
            charts.timeline(title, [(e.t, e.event) for e in events], x_label="time since the test started (s)"),
            title, f"Timeline of {len(events)} events in {result.id}; failover took "
                   f"{payload.failover_seconds:.2f} seconds.",
            [{"test": result.id, "t": e.t, "event": e.event} for e in events]))
        table_rows.append([Cell(result.id, "key"), Cell(fmt(payload.failover_seconds), "num"),
                           Cell(str(len(events)), "num")])
    section.tables.append(Table("Failover time per test", ["test", "failover (s)", "events"], table_rows))
    return True


def figures(result: Result, p: FailoverPayload) -> dict[str, float | str]:
    """This result's figures by names stable across runs (reports/history.py trends and compares them)."""
    out: dict[str, float | str] = {}
    out[f"failover {result.id} (s)"] = p.failover_seconds
    return out
