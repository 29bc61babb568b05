"""pmtu.py: the path MTU through the balancer result and its section."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from reports.page import Cell, Section, Table, encap_rank, fmt, kind_section, newest_rows
from reports.payload import EncapId, at_least, non_empty, of_kind, rule

if TYPE_CHECKING:
    from reports.schema import Result


@dataclass(frozen=True)
class PmtuScenario:
    """Whether a transfer larger than the path MTU completed, and what the client's route learnt."""

    name: str = field(metadata=rule(non_empty))  # icmp, mss-clamp, blackhole
    completed: bool
    seconds: float = field(metadata=rule(at_least(0)))
    route_mtu: int | None = None  # the MTU in the client's route cache afterwards; None: nothing cached
    expected_completed: bool = True  # a blackhole scenario is expected not to complete


@dataclass(frozen=True)
class PmtuPayload:
    """Path-MTU discovery through the LB for one encap."""

    encap: EncapId
    scenarios: list[PmtuScenario] = field(metadata=rule(non_empty))


@kind_section(
    "pmtu",
    "Path MTU through the balancer",
    "A transfer larger than the path MTU after encapsulation: with the LB's own ICMP too-big (icmp), "
    "with TCP MSS clamping (mss-clamp), with a router behind the LB sending the ICMP (blackhole, "
    "expected to fail), and a single DF datagram (udp-df, also run by the demo). Route MTU is what the "
    "client learnt.",
)
def section(section: Section, results: list[Result]) -> bool:
    rows = [
        {"time": r.time, "encap": p.encap, "name": s.name, "scenario": s}
        for r, p in of_kind(results, PmtuPayload)
        for s in p.scenarios
    ]
    if not rows:
        return False
    frame = newest_rows(rows, ["encap", "name"])
    names = list(dict.fromkeys(s.name for _, p in of_kind(results, PmtuPayload) for s in p.scenarios))
    by_key = {(row.encap, row.name): row.scenario for row in frame.itertuples()}
    table_rows = []
    for encap in sorted(set(frame["encap"]), key=encap_rank):
        cells = [Cell(encap, "key")]
        for name in names:
            sc = by_key.get((encap, name))
            if sc is None:
                cells.append(Cell("–", "missing"))
                continue
            outcome = (
                f"completed in {fmt(sc.seconds)} s" if sc.completed else f"failed after {fmt(sc.seconds)} s"
            )
            mtu = f"route MTU {sc.route_mtu}" if sc.route_mtu is not None else "no route MTU cached"
            as_expected = sc.completed == sc.expected_completed
            remark = (
                "" if as_expected and sc.completed else " (as expected)" if as_expected else " (unexpected)"
            )
            hint = "expected to complete" if sc.expected_completed else "expected to fail"
            cells.append(Cell(f"{outcome}{remark}; {mtu}", "ok" if as_expected else "bad", hint))
        table_rows.append(cells)
    section.tables.append(Table("PMTU outcome per encap and scenario", ["encap", *names], table_rows))
    return True


def figures(result: Result, p: PmtuPayload) -> dict[str, float | str]:
    """This result's figures by names stable across runs (reports/history.py trends and compares them)."""
    out: dict[str, float | str] = {}
    for sc in p.scenarios:
        out[f"pmtu {result.id} {sc.name}"] = "completed" if sc.completed else "failed"
        if sc.route_mtu is not None:
            out[f"pmtu {result.id} {sc.name} route MTU"] = float(sc.route_mtu)
    return out
