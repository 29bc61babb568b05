"""fuzz.py: the fuzzed frames result and its section."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from reports.page import Cell, Section, Table, fmt, kind_section
from reports.payload import at_least, non_empty, of_kind, rule

if TYPE_CHECKING:
    from reports.schema import Result


@dataclass(frozen=True)
class FuzzReason:
    """How many fuzzed frames one program counted under one reason."""

    program: str = field(metadata=rule(non_empty))  # balancer_xdp, decap_xdp, decap_tc
    reason: str = field(metadata=rule(non_empty))
    frames: int = field(metadata=rule(at_least(0)))


@dataclass(frozen=True)
class FuzzPayload:
    """Generated frames through the datapath by BPF_PROG_TEST_RUN, and what the programs made of them."""

    seed: int = field(metadata=rule(at_least(0)))
    frames: int = field(metadata=rule(at_least(1)))  # frames generated; each runs through every program
    runs: int = field(metadata=rule(at_least(1)))  # test runs in all (frames × programs, less refused)
    seconds: float = field(metadata=rule(at_least(0)))
    frames_per_s: float = field(metadata=rule(at_least(0)))
    runs_per_s: float = field(metadata=rule(at_least(0)))
    refused: int = field(metadata=rule(at_least(0)))  # skb test runs the kernel refuses (IP header cut)
    aborted: int = field(metadata=rule(at_least(0)))  # XDP_ABORTED or any verdict a program must not return
    # Per program and verdict, runs minus the deltas of that verdict's reasons, in both directions
    # (a TC_ACT_SHOT without a DROP_ reason counts here).
    without_one_reason: int = field(metadata=rule(at_least(0)))
    tx_checked: int = field(metadata=rule(at_least(0)))  # XDP_TX outputs re-parsed
    reasons: list[FuzzReason] = field(metadata=rule(non_empty))


@kind_section(
    "fuzz",
    "Fuzzed frames",
    "Generated and mutated frames through the balancer and the decap programs by BPF_PROG_TEST_RUN: "
    "aborted runs, runs not counted under exactly one reason, and the reasons counted.",
)
def section(section: Section, results: list[Result]) -> bool:
    found = of_kind(results, FuzzPayload)
    if not found:
        return False
    runs = []
    reasons = []
    for result, p in sorted(found, key=lambda rp: rp[0].time):
        runs.append(
            [
                Cell(result.id, "key"),
                Cell(str(p.seed), "num"),
                Cell(str(p.frames), "num"),
                Cell(str(p.runs), "num"),
                Cell(fmt(p.seconds, 1), "num"),
                Cell(f"{p.frames_per_s:.0f}", "num"),
                Cell(str(p.aborted), "num " + ("ok" if p.aborted == 0 else "bad")),
                Cell(str(p.without_one_reason), "num " + ("ok" if p.without_one_reason == 0 else "bad")),
            ]
        )
    latest_result, latest = max(found, key=lambda rp: rp[0].time)
    for r in sorted(latest.reasons, key=lambda r: (r.program, -r.frames)):
        reasons.append([Cell(r.program, "key"), Cell(r.reason), Cell(str(r.frames), "num")])
    section.tables.append(
        Table(
            "Fuzz runs",
            ["run", "seed", "frames", "test runs", "seconds", "frames/s", "aborted", "without one reason"],
            runs,
        )
    )
    section.tables.append(Table(f"Reasons counted in {latest_result.id}", ["program", "reason", "runs"], reasons))
    return True
