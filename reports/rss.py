"""rss.py: the receive-side scaling result (flows per receive queue, model or NIC) and its section."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from reports import charts
from reports.page import Cell, Section, Table, chart, encap_rank, fmt, kind_section, newest, pvalue
from reports.payload import at_least, between, non_empty, of_kind, rule

if TYPE_CHECKING:
    from reports.schema import Result


def _rss_source(value: Any) -> str | None:
    if value in ("model", "measured") or re.fullmatch(r"nic:[A-Za-z0-9_.-]+", value):
        return None
    return f'must be "model", "measured" or "nic:<driver>" (e.g. "nic:virtio") but got {value!r}'


@dataclass(frozen=True)
class RssScenario:
    """How one way of encapsulating spreads flows over a real's receive queues."""

    # ipip-fixed-src, ipip-flow-src, gue-sd, gue-sdfn, gue-flow-src-sd, ...
    name: str = field(metadata=rule(non_empty))
    queue_counts: list[int] = field(metadata=rule(non_empty))  # what each queue received, index = queue
    nqueues: int = field(metadata=rule(at_least(1)))
    flows: int = field(metadata=rule(at_least(1)))
    max_over_mean: float = field(metadata=rule(at_least(0)))
    chi2: float = field(metadata=rule(at_least(0)))  # against a uniform spread over nqueues
    p_value: float = field(metadata=rule(between(0, 1)))
    counted: Literal["packets", "flows"] = "packets"
    # model: the Toeplitz prediction for the flows; nic:<driver> (nic:virtio, nic:mlx5_core): a NIC's own
    # per-queue counters; measured: any other measurement (the kernel's RPS CPUs on a real)
    source: str = field(default="measured", metadata=rule(_rss_source))

    def problems(self) -> Iterator[tuple[str, str]]:
        if len(self.queue_counts) != self.nqueues:
            yield "queue_counts", f"has {len(self.queue_counts)} entries but nqueues is {self.nqueues}"
        for i, count in enumerate(self.queue_counts):
            if count < 0:
                yield f"queue_counts[{i}]", f"must be ≥ 0 but got {count}"


@dataclass(frozen=True)
class RssPayload:
    """Receive-side scaling on a real server, one scenario per encap / NIC hash setting."""

    scenarios: list[RssScenario] = field(metadata=rule(non_empty))


SPREAD_MAX_OVER_MEAN = 1.25  # what the suites call an even spread over a real's queues


def spread_verdict(max_over_mean: float, queues_used: int, nqueues: int) -> str:
    if nqueues > 1 and queues_used <= 1:
        return "one queue"
    return "even" if max_over_mean <= SPREAD_MAX_OVER_MEAN else "uneven"


@kind_section(
    "rss",
    "Receive-side scaling on a real server",
    "How the encapsulated flows spread over a real's receive queues, for IPIP with a fixed or a "
    "flow-derived outer source and for GUE under each NIC hash setting (sd: addresses only, sdfn: "
    "addresses and ports). Source: the Toeplitz model (model), a NIC's own queue counters (nic:<driver>) "
    "or the kernel's RPS CPUs (measured). χ² and p are against an even spread; a p near 0 means the "
    "spread is not even.",
)
def section(section: Section, results: list[Result]) -> bool:
    found = newest(of_kind(results, RssPayload), lambda r, p: (r.machine.hostname, r.id))
    if not found:
        return False
    table_rows = []
    found = sorted(found, key=lambda rp: (any(sc.source != "model" for sc in rp[1].scenarios), rp[0].id))
    for result, payload in found:
        panels = []
        for sc in payload.scenarios:
            mean = sum(sc.queue_counts) / max(sc.nqueues, 1)
            subtitle = f"{sc.name} ({sc.source}): max/mean {fmt(sc.max_over_mean)}, p {pvalue(sc.p_value, '= ')}"
            panels.append(charts.Bars(subtitle,
                                      [float(c) for c in sc.queue_counts],
                                      [f"queue {i}: {c} {sc.counted}" for i, c in enumerate(sc.queue_counts)], mean))
            table_rows.append([
                Cell(sc.name, "key"), Cell(result.id), Cell(sc.source), Cell(str(sc.nqueues), "num"),
                Cell(str(sc.flows), "num"),
                Cell(fmt(sc.max_over_mean), "num bad" if sc.max_over_mean > 1.5 else "num",
                     "the busiest queue gets more than 1.5 × the mean" if sc.max_over_mean > 1.5 else ""),
                Cell(fmt(sc.chi2, 1), "num"), Cell(pvalue(sc.p_value), "num")])
        title = f"{payload.scenarios[0].counted.capitalize()} per receive queue ({result.id})"
        data = [{"result": result.id, "scenario": sc.name, "source": sc.source, "queue": i, sc.counted: c}
                for sc in payload.scenarios for i, c in enumerate(sc.queue_counts)]
        section.charts.append(chart(
            charts.bar_grid(title, panels, x_label="receive queue", y_label=payload.scenarios[0].counted),
            title, f"Bar charts of {payload.scenarios[0].counted} per receive queue for "
                   f"{', '.join(sc.name for sc in payload.scenarios)}; dashed line at the mean.", data))
    section.tables.append(Table(
        "Spread per scenario",
        ["scenario", "result", "source", "queues", "flows", "max ÷ mean", "χ²", "p-value"], table_rows))
    side = _rss_side_by_side(found)
    if side is not None:
        section.tables.append(side)
    return True


def _rss_side_by_side(found: list[tuple[Result, RssPayload]]) -> Table | None:
    """The model beside each NIC per encap and scenario, disagreements flagged (a NIC that collapses
    where the model spreads, or the reverse). Only where a NIC result exists."""
    by: dict[tuple[str, str], dict[str, Any]] = {}
    for result, payload in found:
        encap = result.encap or "–"
        for sc in payload.scenarios:
            if sc.source == "measured":
                continue
            used = sum(1 for c in sc.queue_counts if c)
            by.setdefault((encap, sc.name), {})[sc.source] = (sc, spread_verdict(sc.max_over_mean, used, sc.nqueues))
    sources = sorted({src for v in by.values() for src in v if src != "model"})
    if not sources:
        return None
    rows = []
    for (encap, name), seen in sorted(by.items(), key=lambda kv: (encap_rank(kv[0][0]), kv[0][1])):
        if not any(src in seen for src in sources):
            continue
        model = seen.get("model")
        cells = [Cell(encap, "key"), Cell(name),
                 Cell(f"{model[1]} ({fmt(model[0].max_over_mean)})" if model else "–", "num" if model else "missing")]
        disagree = []
        for src in sources:
            nic = seen.get(src)
            if nic is None:
                cells.append(Cell("–", "missing", "not measured"))
                continue
            differs = model is not None and nic[1] != model[1]
            if differs:
                disagree.append(src)
            cells.append(Cell(f"{nic[1]} ({fmt(nic[0].max_over_mean)})", "bad" if differs else "ok",
                              f"{nic[0].flows} {nic[0].counted} over {nic[0].nqueues} queues"))
        cells.append(Cell("DISAGREE: " + ", ".join(disagree) if disagree else ("agree" if model else "no model"),
                          "bad" if disagree else ("ok" if model else "missing")))
        rows.append(cells)
    return Table("Model beside NIC per encap and setting (verdict and max ÷ mean)",
                 ["encap", "scenario", "model", *sources, "model vs NIC"], rows)


def figures(result: Result, p: RssPayload) -> dict[str, float | str]:
    """This result's figures by names stable across runs (reports/history.py trends and compares them)."""
    out: dict[str, float | str] = {}
    for rss in p.scenarios:
        out[f"rss {result.id} {rss.name} ({rss.source}) max÷mean"] = rss.max_over_mean
    return out
