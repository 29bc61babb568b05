"""demo.py: the demo's result (real traffic in every encap) and its two sections: the modes at a glance and
the requests."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Literal

from reports.bench import BenchPayload
from reports.page import Cell, Section, Table, encap_rank, fmt, kind_section, newest_rows, run_label
from reports.payload import EncapId, at_least, non_empty, of_kind, rule

if TYPE_CHECKING:
    from reports.schema import Result


@dataclass(frozen=True)
class DemoSpread:
    """The NIC model's spread of one outer-header setting over a real's queues (demo summary)."""

    name: str = field(metadata=rule(non_empty))  # fixed-src-sd, flow-src-sdfn, ...
    queues_used: int = field(metadata=rule(at_least(0)))
    nqueues: int = field(metadata=rule(at_least(1)))
    max_over_mean: float = field(metadata=rule(at_least(0)))
    held: bool  # one queue where the outer headers do not vary, max/mean ≤ 1.25 where they do


@dataclass(frozen=True)
class DemoPmtu:
    """A DF datagram larger than the path after encapsulation: the MTU the client learnt from the LB."""

    sent_bytes: int = field(metadata=rule(at_least(0)))
    expected_mtu: int = field(metadata=rule(at_least(0)))  # egress MTU − the encap's overhead
    learnt_mtu: int | None  # the client socket's path MTU afterwards; None: nothing learnt
    lb_too_big: int = field(metadata=rule(at_least(0)))  # the LB's own ICMP answers
    resend: str  # what sending the same datagram again did: EMSGSIZE when the MTU was learnt


@dataclass(frozen=True)
class DemoChurn:
    """One of three reals removed under live connections: who was reset, who suffered as collateral."""

    connections: int = field(metadata=rule(at_least(0)))
    on_removed: int = field(metadata=rule(at_least(0)))  # connections the removed real served
    reset: int = field(metadata=rule(at_least(0)))  # of those, ended by RST (fail fast)
    collateral: int = field(metadata=rule(at_least(0)))  # connections of surviving reals that broke
    new_flows: int = field(metadata=rule(at_least(0)))  # new flows opened after the removal
    new_to_removed: int = field(metadata=rule(at_least(0)))  # of those, answered by the removed real
    new_failed: int = field(metadata=rule(at_least(0)))
    ring_collateral_slots: int = field(metadata=rule(at_least(0)))  # Maglev slots moved between survivors
    ring_size: int = field(metadata=rule(at_least(1)))


@dataclass(frozen=True)
class DemoEncap:
    """Real traffic balanced through the lab in one encap, and what the demo checked beside it."""

    encap: EncapId
    requests: int = field(metadata=rule(at_least(0)))
    ok: int = field(metadata=rule(at_least(0)))
    reals_seen: list[str]  # the reals that answered
    lb_saw_only_client_to_vip: bool  # DSR: the LB never saw a reply
    to_lb: int | None = None  # frames router → LB in the capture (all client → VIP)
    from_lb: int | None = None  # frames LB → router (all encapsulated client → VIP)
    replies_via_lb: int | None = None  # frames on the LB's link that were neither: 0 when DSR held
    spread: list[DemoSpread] = field(default_factory=list)
    pmtu: DemoPmtu | None = None
    churn: DemoChurn | None = None

    def problems(self) -> Iterator[tuple[str, str]]:
        if self.ok > self.requests:
            yield "ok", f"must be ≤ requests ({self.requests}) but got {self.ok}"


LbShape = Literal["one-arm", "two-arm", "bond-vlan"]  # how the LB is wired (lab/lbconf.py shape())


@dataclass(frozen=True)
class DemoPayload:
    """The `make demo` run: one entry per encap, and the LB's shape and topology it ran in."""

    encaps: list[DemoEncap] = field(metadata=rule(non_empty))
    shape: LbShape = "one-arm"
    topology: str = "default"


@kind_section(
    "summary",
    "Encapsulation modes at a glance",
    "The newest demo run (make demo), one row per encap; every figure was checked by the demo. "
    "Green: as expected; yellow: as expected, but worth knowing; red: not as expected.",
)
def summary_section(section: Section, results: list[Result]) -> bool:
    """The encapsulation modes at a glance: the newest demo run's checked figures, one row per encap."""
    section.legend.append(
        "works: requests answered and reals that answered. DSR held only if 0 frames other than client→VIP "
        "and its encapsulation crossed the LB's link (in brackets: the frames that did). RSS spread: the "
        "NIC model (Toeplitz, 8 queues) over the outer headers the balancer program itself wrote, per NIC "
        "hash setting (sd: addresses, sdfn: addresses and ports): max ÷ mean, or the queues used when "
        "not all (1/8 q: every flow on one queue). PMTU: the path MTU a 1500-byte DF datagram taught the "
        "client through the LB's own ICMP, expected 1500 − the encap's overhead. Churn: one of three reals "
        "removed under live connections; its connections must be reset (fail fast) and no connection of "
        "a surviving real may break (collateral), beside the Maglev slots that moved between survivors.")
    found = of_kind(results, DemoPayload)
    if not found:
        return False
    result, payload = max(found, key=lambda rp: rp[0].time)
    section.notes.append(f"Demo run on {run_label(result)}, the LB {payload.shape} (topology {payload.topology}).")
    shapes = {p.shape: (r, p) for r, p in sorted(found, key=lambda rp: rp[0].time)}
    section.notes.append("LB shapes the demo ran (newest run of each): " + "; ".join(
        f"{shape} (topology {p.topology}, {run_label(r)})" for shape, (r, p) in sorted(shapes.items())) + ".")
    ndr = _newest_ndr_ratio(results)
    rows = []
    for e in sorted(payload.encaps, key=lambda e: encap_rank(e.encap)):
        rows.append(_summary_row(e, ndr.get(e.encap)))
    header = ["encap", "works", "DSR (replies via LB)", "RSS spread: fixed outer source",
              "RSS spread: flow outer source", "PMTU learnt (expected)", "churn: removed real's connections reset",
              "churn: collateral"]
    if ndr:
        header.append("NDR ÷ XDP_TX floor (64 B)")
    else:
        rows = [row[:-1] for row in rows]
    section.tables.append(Table("The five encaps compared (newest demo run)", header, rows))
    return True


def _spread_cell(e: DemoEncap, source: str) -> Cell:
    mine = [s for s in e.spread if s.name.startswith(source + "-")]
    if not mine:
        return Cell("–", "missing", "not measured")
    parts = []
    for s in mine:
        fields = s.name.rsplit("-", 1)[-1]
        figure = f"{s.queues_used}/{s.nqueues} q" if s.queues_used < s.nqueues else fmt(s.max_over_mean)
        parts.append(f"{fields} {figure}")
    # fixed-source sd is expected on one queue: a "collapse" that held is still shown for what it is
    collapsed = any(s.queues_used == 1 and s.nqueues > 1 for s in mine)
    css = "bad" if not all(s.held for s in mine) else ("warn" if collapsed else "ok")
    hint = "as expected" if all(s.held for s in mine) else "not as expected"
    if collapsed:
        hint += "; one queue takes every flow where the outer headers do not vary"
    return Cell(" · ".join(parts), css, hint)


def _summary_row(e: DemoEncap, ratio: float | None) -> list[Cell]:
    works = e.ok == e.requests > 0
    row = [Cell(e.encap, "key"),
           Cell(f"{e.ok}/{e.requests} · {len(e.reals_seen)} reals", "ok" if works else "bad",
                ", ".join(e.reals_seen))]
    replies = e.replies_via_lb
    dsr = e.lb_saw_only_client_to_vip and (replies in (None, 0))
    row.append(Cell(f"{'held' if dsr else 'NO'}" + (f" ({replies})" if replies is not None else ""),
                    "ok" if dsr else "bad",
                    f"LB link: {e.to_lb} in, {e.from_lb} out" if e.to_lb is not None else ""))
    row.append(_spread_cell(e, "fixed-src"))
    row.append(_spread_cell(e, "flow-src"))
    if e.pmtu is None:
        row.append(Cell("–", "missing", "not measured"))
    else:
        p = e.pmtu
        good = p.learnt_mtu == p.expected_mtu and p.lb_too_big > 0
        row.append(Cell(f"{p.learnt_mtu or 'none'} ({p.expected_mtu})", "ok" if good else "bad",
                        f"{p.sent_bytes}-byte DF datagram; LB too-big answers {p.lb_too_big}; resend: {p.resend}"))
    if e.churn is None:
        row += [Cell("–", "missing", "not measured"), Cell("–", "missing", "not measured")]
    else:
        c = e.churn
        row.append(Cell(f"{c.reset}/{c.on_removed}", "ok" if c.on_removed and c.reset == c.on_removed else "bad",
                        f"{c.connections} connections; new flows after: {c.new_flows}, to the removed real "
                        f"{c.new_to_removed}, failed {c.new_failed}"))
        row.append(Cell(f"{c.collateral} conns, {c.ring_collateral_slots} slots",
                        "ok" if c.collateral == 0 else "bad",
                        f"ring slots moved between surviving reals, of {c.ring_size}"))
    row.append(Cell(fmt(ratio) if ratio is not None else "–", "num" if ratio is not None else "missing"))
    return row


def _newest_ndr_ratio(results: list[Result]) -> dict[str, float]:
    """NDR ÷ XDP_TX floor at 64 B per encap, from the newest software (xdp-live) bench run."""
    out: dict[str, tuple[datetime, float]] = {}
    for r, p in of_kind(results, BenchPayload):
        if p.generator != "xdp-live":
            continue
        for pt in p.points:
            if pt.frame_size == 64 and pt.floor.xdp_tx_mpps > 0 and (pt.encap not in out or r.time >= out[pt.encap][0]):
                out[pt.encap] = (r.time, pt.ndr_mpps / pt.floor.xdp_tx_mpps)
    return {k: v for k, (_, v) in out.items()}


@kind_section(
    "demo",
    "Demo: real traffic in every encap",
    "Requests sent through the lab by the demo (make demo), the reals that answered, and what the "
    "capture of the LB's link saw (direct server return: only client→VIP in, only its encapsulation out).",
)
def section(section: Section, results: list[Result]) -> bool:
    rows = [
        {"time": r.time, "encap": e.encap, "requests": e.requests, "ok": e.ok, "reals": e.reals_seen,
         "dsr": e.lb_saw_only_client_to_vip, "to_lb": e.to_lb, "from_lb": e.from_lb, "stray": e.replies_via_lb}
        for r, p in of_kind(results, DemoPayload)
        for e in p.encaps
    ]
    if not rows:
        return False
    frame = newest_rows(rows, ["encap"])
    table_rows = []
    for row in frame.sort_values("encap", key=lambda s: s.map(encap_rank)).itertuples():
        measured = row.stray is not None and not math.isnan(row.stray)  # None: not captured
        capture = f"{int(row.to_lb)} / {int(row.from_lb)} / {int(row.stray)}" if measured else "–"
        table_rows.append(
            [
                Cell(row.encap, "key"),
                Cell(str(row.requests), "num"),
                Cell(str(row.ok), "num " + ("ok" if row.ok == row.requests else "bad")),
                Cell(", ".join(row.reals) or "none", "" if row.reals else "bad"),
                Cell("yes" if row.dsr else "no", "ok" if row.dsr else "bad"),
                Cell(capture, "num"),
            ]
        )
    section.tables.append(
        Table(
            "Requests per encap",
            ["encap", "requests", "answered", "reals seen", "LB saw only client→VIP",
             "LB link frames: in / out / other"],
            table_rows,
        )
    )
    return True


def figures(result: Result, p: DemoPayload) -> dict[str, float | str]:
    """This result's figures by names stable across runs (reports/history.py trends and compares them)."""
    out: dict[str, float | str] = {}
    for e in p.encaps:
        out[f"demo {e.encap} answered"] = f"{e.ok}/{e.requests}"
        out[f"demo {e.encap} DSR"] = "held" if e.lb_saw_only_client_to_vip else "broken"
        for s in e.spread:
            out[f"demo {e.encap} spread {s.name} max÷mean"] = s.max_over_mean
        if e.pmtu is not None:
            out[f"demo {e.encap} PMTU learnt"] = float(e.pmtu.learnt_mtu or 0)
        if e.churn is not None:
            out[f"demo {e.encap} churn collateral"] = float(e.churn.collateral)
            out[f"demo {e.encap} churn reset"] = f"{e.churn.reset}/{e.churn.on_removed}"
    return out
