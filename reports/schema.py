"""The results schema: one versioned JSON file per case, its dataclasses, validator, writer and loader.

A results file is a JSON object::

    {
      "schema_version": 1,
      "kind": "bench",                        # conformance, bench, rss, pmtu, churn, failover, demo,
                                              # corpus, fuzz
      "id": "test_throughput[ip4-gue1]",     # the test name, optionally with its encap id in brackets
      "machine": {"hostname": "...", "kernel": "6.18.0", "cpus": 2},
      "commit": "<40 hex digits>[-dirty]" or "unknown",
      "timestamp": "2026-12-02T13:20:00+00:00",
      "synthetic": false,                     # true only for generated sample data (reports/sample.py)
      "payload": {...}                        # the kind's payload, below
    }

The payload classes below are the schema: the validator reads their type annotations, so a field
added here is checked everywhere. Numbers must be finite; unknown fields are refused so a typo in
a writer fails loudly instead of vanishing from the report. Every error names the file and the
dotted field path (``payload.points[3].ndr_mpps``).

Results live in ``results/`` at the repository top, or in ``$L4LAB_RESULTS``, or in the directory
given; ``write_result`` writes ``<kind>.<id>@<UTC time>.json`` there (atomically; every run is kept,
so the report can show history and trends) and ``load_results`` reads every ``*.json`` back,
sorted by kind, id and time. A run is named by its commit, time, machine and (bench) generator.

Versions: a field added with a default (older files, which lack it, still parse to the same values)
keeps ``SCHEMA_VERSION``, as ``BenchPoint.latency`` did; a field removed, renamed, made required or
given a new meaning bumps it, and the reader then refuses the older files with a message saying how
to rewrite them.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import os
import platform
import re
import socket
import subprocess
import tempfile
import types
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, TypeVar, Union

from balancer import encaps
from balancer.validate import Reader

__all__ = [
    "ENCAP_IDS",
    "FRAME_SIZES",
    "IMIX_MEAN_FRAME_BYTES",
    "SCHEMA_VERSION",
    "BenchPayload",
    "BenchPoint",
    "ChurnPayload",
    "ChurnPoint",
    "ConformancePayload",
    "ConnectionOutcomes",
    "DemoChurn",
    "CorpusPayload",
    "DemoEncap",
    "DemoPmtu",
    "DemoSpread",
    "DemoPayload",
    "FailoverPayload",
    "Floor",
    "FuzzPayload",
    "FuzzReason",
    "KatranChurn",
    "Kind",
    "LatencyFigure",
    "LoopCost",
    "Machine",
    "Nic",
    "PmtuPayload",
    "PmtuScenario",
    "ProgramSize",
    "Result",
    "ResultsError",
    "RssPayload",
    "RssScenario",
    "SessionTables",
    "SideBySide",
    "SideCase",
    "SynFlood",
    "TimelineEvent",
    "Trial",
    "Versus",
    "case_id",
    "current_commit",
    "current_machine",
    "load_results",
    "of_kind",
    "parse_result",
    "results_dir",
    "split_id",
    "write_result",
]

SCHEMA_VERSION = 1

#: Encapsulation ids, named outer to inner: the one name of a case everywhere (DESIGN decision 11),
#: read from the catalogue (balancer/encaps.py: pure data, loads no BPF).
ENCAP_IDS: tuple[str, ...] = encaps.IDS
EncapId = encaps.EncapId

#: The frame sizes a benchmark reports, in bytes of Ethernet frame without FCS, plus the IMIX mix.
FRAME_SIZES: tuple[int | str, ...] = (64, 128, 256, 512, 1024, 1280, 1518, "imix")
FrameSize = int | Literal["imix"]
#: Mean frame of the simple IMIX the generators send (lab/bench/gen/base.py IMIX: 28 × 64, 16 × 570 and
#: 4 × 1518 bytes per 48 frames), for rates in Gb/s; suites/reports checks it against lab/bench/gen/base.py.
IMIX_MEAN_FRAME_BYTES = (28 * 64 + 16 * 570 + 4 * 1518) / 48

ENV_RESULTS = "L4LAB_RESULTS"
_REPO_TOP = Path(__file__).resolve().parents[1]

_ID_RE = re.compile(r"^(?P<test>[A-Za-z_][A-Za-z0-9_.:/-]*)(?:\[(?P<param>[A-Za-z0-9_.+:/=-]+)\])?$")
_COMMIT_RE = re.compile(r"^(?:[0-9a-f]{40}(?:-dirty)?|unknown)$")


class Kind(enum.StrEnum):
    """What a result measures; selects the payload class."""

    CONFORMANCE = "conformance"
    BENCH = "bench"
    RSS = "rss"
    PMTU = "pmtu"
    CHURN = "churn"
    FAILOVER = "failover"
    DEMO = "demo"
    CORPUS = "corpus"
    FUZZ = "fuzz"


class ResultsError(ValueError):
    """A results file or value does not match the schema.

    ``file`` is the file (or ``<value>`` for data not yet written), ``field`` the dotted path inside
    it (empty for the whole file). The message is ``<file>: <field>: <problem>``.
    """

    def __init__(self, file: str | Path, field: str, problem: str) -> None:
        self.file = str(file)
        self.field = field
        self.problem = problem
        where = f"{self.file}: {field}: " if field else f"{self.file}: "
        super().__init__(where + problem)


class _FieldError(Exception):
    """Internal: a problem at a path inside the value being parsed (the file is added on the way out)."""

    def __init__(self, path: str, problem: str) -> None:
        self.path = path
        self.problem = problem
        super().__init__(f"{path}: {problem}")


def _fail(path: str, value: object, expected: str) -> _FieldError:
    return _FieldError(path, f"must be {expected} but got {json.dumps(value)}")


_READ = Reader(_fail)  # balancer.validate's checks, with the results' message form


# Field checks, attached as dataclass field metadata {"check": ...}: return a problem or None.
_Check = Callable[[Any], "str | None"]


def _at_least(low: float) -> _Check:
    def check(value: Any) -> str | None:
        return None if value >= low else f"must be ≥ {low} but got {value!r}"

    return check


def _between(low: float, high: float) -> _Check:
    def check(value: Any) -> str | None:
        return None if low <= value <= high else f"must be {low}..{high} but got {value!r}"

    return check


def _non_empty(value: Any) -> str | None:
    return None if len(value) > 0 else "must not be empty"


def _frame_size(value: Any) -> str | None:
    if value == "imix" or 64 <= value <= 9018:
        return None
    return f'must be a frame size 64..9018 bytes or "imix" but got {value!r}'


def _rss_source(value: Any) -> str | None:
    if value in ("model", "measured") or re.fullmatch(r"nic:[A-Za-z0-9_.-]+", value):
        return None
    return f'must be "model", "measured" or "nic:<driver>" (e.g. "nic:virtio") but got {value!r}'


def _rule(check: _Check) -> dict[str, _Check]:
    """Field metadata that makes the validator apply ``check`` to the parsed value."""
    return {"check": check}


# --- common parts -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Machine:
    """Where a result was measured."""

    hostname: str = field(metadata=_rule(_non_empty))
    kernel: str = field(metadata=_rule(_non_empty))
    cpus: int = field(metadata=_rule(_at_least(1)))


# --- bench --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Trial:
    """One trial of the NDR/PDR search: offered rate, measured loss ratio and how long it ran."""

    rate_mpps: float = field(metadata=_rule(_at_least(0)))
    loss: float = field(metadata=_rule(_between(0, 1)))  # lost / sent, 0..1
    duration_s: float = field(metadata=_rule(_at_least(0)))


@dataclass(frozen=True)
class Floor:
    """The machine's floor at the same frame size in the same run: MAC-swap XDP_TX and XDP_DROP."""

    xdp_tx_mpps: float = field(metadata=_rule(_at_least(0)))
    xdp_drop_mpps: float = field(metadata=_rule(_at_least(0)))


@dataclass(frozen=True)
class LatencyFigure:
    """One-way latency of TRex's latency stream while the point's traffic ran at a share of its PDR."""

    share_of_pdr: int = field(metadata=_rule(_between(1, 100)))  # percent of the point's PDR
    rate_mpps: float = field(metadata=_rule(_at_least(0)))  # the offered rate of that trial
    min_us: float = field(metadata=_rule(_at_least(0)))
    avg_us: float = field(metadata=_rule(_at_least(0)))
    max_us: float = field(metadata=_rule(_at_least(0)))
    p50_us: float | None = field(default=None, metadata=_rule(_at_least(0)))
    p99_us: float | None = field(default=None, metadata=_rule(_at_least(0)))

    def problems(self) -> Iterator[tuple[str, str]]:
        if self.min_us > self.avg_us:
            yield "min_us", f"must be ≤ avg_us ({self.avg_us}) but got {self.min_us}"
        if self.max_us < self.avg_us:
            yield "max_us", f"must be ≥ avg_us ({self.avg_us}) but got {self.max_us}"
        for name in ("p50_us", "p99_us"):
            value = getattr(self, name)
            if value is not None and not self.min_us <= value <= self.max_us:
                yield name, f"must be between min_us ({self.min_us}) and max_us ({self.max_us}) but got {value}"


@dataclass(frozen=True)
class Versus:
    """Another program's figures for the same point, measured interleaved in the same run (DESIGN 14)."""

    program: str = field(metadata=_rule(_non_empty))  # e.g. "katran"
    ndr_mpps: float = field(metadata=_rule(_at_least(0)))
    pdr_mpps: float = field(metadata=_rule(_at_least(0)))


@dataclass(frozen=True)
class Nic:
    """The NIC a hardware run measured: what `ethtool -i` and the PCI id say."""

    model: str = field(metadata=_rule(_non_empty))  # e.g. "Mellanox ConnectX-5 (15b3:1017)"
    driver: str = field(metadata=_rule(_non_empty))  # e.g. "mlx5_core"
    speed_mbps: int | None = None


@dataclass(frozen=True)
class BenchPoint:
    """The throughput of one encap at one ingress frame size."""

    encap: EncapId
    frame_size: FrameSize = field(metadata=_rule(_frame_size))
    ndr_mpps: float = field(metadata=_rule(_at_least(0)))  # no drop rate: 0 loss
    pdr_mpps: float = field(metadata=_rule(_at_least(0)))  # partial drop rate: loss ≤ 0.5 %
    floor: Floor
    egress_overhead_bytes: int = field(metadata=_rule(_at_least(0)))  # bytes the encap adds to each frame
    trials: list[Trial] = field(default_factory=list)
    latency: list[LatencyFigure] = field(default_factory=list)  # TRex only: at 10/50/90 % of PDR
    versus: list[Versus] = field(default_factory=list)  # other programs on the same packets, same run

    def problems(self) -> Iterator[tuple[str, str]]:
        if self.pdr_mpps < self.ndr_mpps:
            yield "pdr_mpps", f"must be ≥ ndr_mpps ({self.ndr_mpps}) but got {self.pdr_mpps}"
        shares = [f.share_of_pdr for f in self.latency]
        for i, share in enumerate(shares):
            if share in shares[:i]:
                yield f"latency[{i}].share_of_pdr", f"repeats {share} % of PDR; one figure per share"


@dataclass(frozen=True)
class MicroFigure:
    """BPF_PROG_TEST_RUN time of one path (64-byte frames, repeat = 1), beside the floors of the same run."""

    case: str = field(metadata=_rule(_non_empty))  # xdp_drop, xdp_tx or an encap id (balancer/encaps.py)
    ns_per_packet: float = field(metadata=_rule(_at_least(0)))


@dataclass(frozen=True)
class ControllerFigure:
    """How long one controller operation took (Maglev ring build, full or incremental apply)."""

    name: str = field(metadata=_rule(_non_empty))  # e.g. "ring build, 100 reals", "full apply"
    ms: float = field(metadata=_rule(_at_least(0)))
    ring_slots: int | None = None  # ring slots written, for applies


#: The cases of the side-by-side micro-benchmark (lab/bench/katran.py), in table order.
SideCaseName = Literal["non-vip", "session-hit", "new-syn", "new-ack"]


@dataclass(frozen=True)
class SideCase:
    """One row of the side-by-side micro-benchmark: both programs' median on identical packets.

    ``ratio_above_floor`` is (ns - floor) / (other_ns - floor) with the MAC-swap XDP_TX floor of the
    same run; None when the other program is not above the floor. ``calls`` is how many calls of each
    program returned the expected action with its path counter moving by one (every call is checked).
    """

    encap: EncapId | None  # None: a case that encapsulates nothing (non-vip)
    case: SideCaseName
    ns: float = field(metadata=_rule(_at_least(0)))  # l4lab, median ns per call
    other_ns: float = field(metadata=_rule(_at_least(0)))
    ratio_above_floor: float | None
    path_counter: str = field(metadata=_rule(_non_empty))  # l4lab's counter that only this case moves
    other_path_counter: str = field(metadata=_rule(_non_empty))
    calls: int = field(metadata=_rule(_at_least(1)))
    round_ratios: list[float | None] = field(default_factory=list)  # the ratio of each round's medians


@dataclass(frozen=True)
class ProgramSize:
    """Both programs' size for one encap, from the kernel's bpf_prog_info of the loaded programs."""

    encap: EncapId
    verified_insns: int = field(metadata=_rule(_at_least(1)))  # l4lab; instructions the verifier walked
    other_verified_insns: int = field(metadata=_rule(_at_least(1)))
    xlated_insns: int = field(metadata=_rule(_at_least(1)))
    other_xlated_insns: int = field(metadata=_rule(_at_least(1)))


@dataclass(frozen=True)
class LoopCost:
    """CPU time per frame of the whole live-frames loop on veth with one program on the LB side.

    One thread sends unpaced; the loop (generator, veths, the LB program, the sink) runs in its
    softirqs on its CPU, so its CPU time per frame is the loop's cost, robust to other processes'
    load (lab/bench/gen/xdplive.py chain_cost). The median of the run's rounds.
    """

    program: str = field(metadata=_rule(_non_empty))  # "xdp_drop", "xdp_tx" (the floors), "l4lab", "katran"
    encap: EncapId | None  # None for the floors
    cpu_ns_per_frame: float = field(metadata=_rule(_at_least(0)))
    frames: int = field(metadata=_rule(_at_least(1)))  # per round
    rounds: int = field(metadata=_rule(_at_least(1)))
    delivered: float = field(metadata=_rule(_between(0, 1)))  # share of the frames the sink counted, worst round
    traffic: Literal["udp-flows", "syn-flood"] = "udp-flows"  # syn-flood: every frame a new flow's TCP SYN


@dataclass(frozen=True)
class SessionTables:
    """One program's session tables as the side-by-side bench loaded them (the IPv4 flows' table for l4lab)."""

    program: str = field(metadata=_rule(_non_empty))
    tables: int = field(metadata=_rule(_at_least(1)))   # l4lab: one for all CPUs; Katran: one per CPU
    entries: int = field(metadata=_rule(_at_least(1)))  # of each table
    bytes: int = field(metadata=_rule(_at_least(0)))    # of all of them, the kernel's memlock figure


@dataclass(frozen=True)
class SynFlood:
    """One program's NDR when every frame is a new flow's TCP SYN from one of `sources` (live frames, 64 B)."""

    program: str = field(metadata=_rule(_non_empty))  # "l4lab" or the other program
    encap: EncapId
    sources: int = field(metadata=_rule(_at_least(1)))
    ndr_mpps: float = field(metadata=_rule(_at_least(0)))
    pdr_mpps: float = field(metadata=_rule(_at_least(0)))
    floor_xdp_tx_mpps: float = field(metadata=_rule(_at_least(0)))  # the same run's MAC-swap floor
    sessions_after: int = field(metadata=_rule(_at_least(0)))  # entries in its session tables after the search


@dataclass(frozen=True)
class SideBySide:
    """l4lab and another XDP balancer timed in one run on identical packets (lab/bench/katran.py).

    The micro-benchmark (BPF_PROG_TEST_RUN, repeat = 1, interleaved, one CPU) is here; the same
    run's live-frames NDR of both are the payload's points, the other program's in ``versus``.
    """

    program: str = field(metadata=_rule(_non_empty))  # the other program, e.g. "katran"
    frame_bytes: int = field(metadata=_rule(_at_least(14)))  # frame length of every timed call
    rounds: int = field(metadata=_rule(_at_least(1)))
    session_table_entries: int = field(metadata=_rule(_at_least(1)))  # per-CPU LRU size, both programs
    floor_xdp_drop_ns: float = field(metadata=_rule(_at_least(0)))
    floor_xdp_tx_ns: float = field(metadata=_rule(_at_least(0)))  # MAC-swap XDP_TX
    cases: list[SideCase] = field(metadata=_rule(_non_empty))
    sizes: list[ProgramSize] = field(default_factory=list)
    loop: list[LoopCost] = field(default_factory=list)  # live frames: CPU ns per frame of each program's loop
    seed: int | None = None  # the order's seed (lab/bench/order.py): `l4lab bench --katran --seed N` replays it
    first_loaded: list[str] = field(default_factory=list)  # per round: whose session tables were created first
    session_tables: list[SessionTables] = field(default_factory=list)
    syn_flood: list[SynFlood] = field(default_factory=list)

    def problems(self) -> Iterator[tuple[str, str]]:
        seen: set[tuple[str | None, str]] = set()
        for i, c in enumerate(self.cases):
            if (c.encap, c.case) in seen:
                yield f"cases[{i}]", f"repeats {c.case} of {c.encap or 'no encap'}; one row per encap and case"
            seen.add((c.encap, c.case))
            above = c.other_ns - self.floor_xdp_tx_ns
            if c.ratio_above_floor is not None and above > 0:
                expected = (c.ns - self.floor_xdp_tx_ns) / above
                if abs(expected - c.ratio_above_floor) > 0.01 + 0.01 * abs(expected):
                    yield (f"cases[{i}].ratio_above_floor",
                           f"must be (ns - floor_xdp_tx_ns) / (other_ns - floor_xdp_tx_ns) = {expected:.3f} "
                           f"but got {c.ratio_above_floor}")


@dataclass(frozen=True)
class BenchPayload:
    """A benchmark run: NDR/PDR of every encap × frame size beside the floor, and/or the test-run
    micro-benchmark and the controller's figures, all measured in one run."""

    generator: Literal["xdp-live", "trex", "test-run"]  # test-run: BPF_PROG_TEST_RUN or controller-only figures
    egress_mtu: int = field(metadata=_rule(_between(576, 65535)))  # MTU of the LB's egress link, bytes
    points: list[BenchPoint] = field(default_factory=list)
    micro: list[MicroFigure] = field(default_factory=list)
    controller: list[ControllerFigure] = field(default_factory=list)
    nic: Nic | None = None  # hardware runs: the LB's NIC
    side_by_side: SideBySide | None = None  # l4lab and another program timed together (`l4lab bench --katran`)

    def problems(self) -> Iterator[tuple[str, str]]:
        if not (self.points or self.micro or self.controller or self.side_by_side):
            yield "points", "must not be empty when there are no micro, controller or side-by-side figures"


# --- rss ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RssScenario:
    """How one way of encapsulating spreads flows over a real's receive queues."""

    # ipip-fixed-src, ipip-flow-src, gue-sd, gue-sdfn, gue-flow-src-sd, ...
    name: str = field(metadata=_rule(_non_empty))
    queue_counts: list[int] = field(metadata=_rule(_non_empty))  # what each queue received, index = queue
    nqueues: int = field(metadata=_rule(_at_least(1)))
    flows: int = field(metadata=_rule(_at_least(1)))
    max_over_mean: float = field(metadata=_rule(_at_least(0)))
    chi2: float = field(metadata=_rule(_at_least(0)))  # against a uniform spread over nqueues
    p_value: float = field(metadata=_rule(_between(0, 1)))
    counted: Literal["packets", "flows"] = "packets"
    # model: the Toeplitz prediction for the flows; nic:<driver> (nic:virtio, nic:mlx5_core): a NIC's own
    # per-queue counters; measured: any other measurement (the kernel's RPS CPUs on a real)
    source: str = field(default="measured", metadata=_rule(_rss_source))

    def problems(self) -> Iterator[tuple[str, str]]:
        if len(self.queue_counts) != self.nqueues:
            yield "queue_counts", f"has {len(self.queue_counts)} entries but nqueues is {self.nqueues}"
        for i, count in enumerate(self.queue_counts):
            if count < 0:
                yield f"queue_counts[{i}]", f"must be ≥ 0 but got {count}"


@dataclass(frozen=True)
class RssPayload:
    """Receive-side scaling on a real server, one scenario per encap / NIC hash setting."""

    scenarios: list[RssScenario] = field(metadata=_rule(_non_empty))


# --- pmtu ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PmtuScenario:
    """Whether a transfer larger than the path MTU completed, and what the client's route learnt."""

    name: str = field(metadata=_rule(_non_empty))  # icmp, mss-clamp, blackhole
    completed: bool
    seconds: float = field(metadata=_rule(_at_least(0)))
    route_mtu: int | None = None  # the MTU in the client's route cache afterwards; None: nothing cached
    expected_completed: bool = True  # a blackhole scenario is expected not to complete


@dataclass(frozen=True)
class PmtuPayload:
    """Path-MTU discovery through the LB for one encap."""

    encap: EncapId
    scenarios: list[PmtuScenario] = field(metadata=_rule(_non_empty))


# --- churn --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KatranChurn:
    """Katran's figures for the same change, copied from conformance/katran/maglev_churn.json."""

    ring_size: int = field(metadata=_rule(_at_least(1)))
    slots_owned_by_removed: int = field(metadata=_rule(_at_least(0)))
    slots_changed: int = field(metadata=_rule(_at_least(0)))


@dataclass(frozen=True)
class ConnectionOutcomes:
    """What happened to established connections across the change."""

    survived: int = field(metadata=_rule(_at_least(0)))
    reset: int = field(metadata=_rule(_at_least(0)))
    failed_fast: int = field(metadata=_rule(_at_least(0)))


@dataclass(frozen=True)
class ChurnPoint:
    """Ring disruption when one of n equal-weight reals is removed."""

    n: int = field(metadata=_rule(_at_least(2)))
    ring_size: int = field(metadata=_rule(_at_least(1)))
    slots_owned_by_removed: int = field(metadata=_rule(_at_least(0)))
    slots_changed: int = field(metadata=_rule(_at_least(0)))
    # ring_size / n: only the removed real's share moves
    theoretical_slots: float = field(metadata=_rule(_at_least(0)))
    katran: KatranChurn | None = None
    connections: ConnectionOutcomes | None = None

    def problems(self) -> Iterator[tuple[str, str]]:
        for name in ("slots_owned_by_removed", "slots_changed"):
            if getattr(self, name) > self.ring_size:
                yield name, f"must be ≤ ring_size ({self.ring_size}) but got {getattr(self, name)}"


@dataclass(frozen=True)
class ChurnPayload:
    """Maglev churn against the number of reals."""

    points: list[ChurnPoint] = field(metadata=_rule(_non_empty))


# --- failover -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class TimelineEvent:
    """One thing that happened, in seconds since the test's start."""

    t: float = field(metadata=_rule(_at_least(0)))
    event: str = field(metadata=_rule(_non_empty))


@dataclass(frozen=True)
class FailoverPayload:
    """A failover: its timeline and how long traffic was interrupted."""

    timeline: list[TimelineEvent] = field(metadata=_rule(_non_empty))
    failover_seconds: float = field(metadata=_rule(_at_least(0)))


# --- conformance --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ConformanceFigure:
    """One figure a conformance test measured and asserted (the DUT side by side reads these)."""

    name: str = field(metadata=_rule(_non_empty))
    value: float
    unit: str = ""


@dataclass(frozen=True)
class ConformancePayload:
    """The verdict of one conformance check in one encap, on one device under test (lab/dut/verdict.py).

    `pass`; `finding` (the DUT contradicts the check: its evidence in `detail`); `not-applicable`
    (the DUT lacks a capability the check needs: `detail` names it, `reference` cites the DUT's own
    documentation or source, from its data file lab/dut/<dut>.toml); `error` (the harness, the lab or
    the adapter failed). `fail` and `skip` are the outcomes results written before the four
    verdicts carry. `run` names the `l4lab conform` run the result belongs to ("" outside one);
    `build` says what exactly ran (version, build flags).
    """

    test: str = field(metadata=_rule(_non_empty))
    encap: EncapId | None
    outcome: Literal["pass", "finding", "not-applicable", "error", "fail", "skip"]
    duration_s: float = field(metadata=_rule(_at_least(0)))
    dut: str = "l4lab"
    detail: str = ""
    figures: list[ConformanceFigure] = field(default_factory=list)
    run: str = ""
    reference: str = ""
    build: str = ""


# --- demo ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DemoSpread:
    """The NIC model's spread of one outer-header setting over a real's queues (demo summary)."""

    name: str = field(metadata=_rule(_non_empty))  # fixed-src-sd, flow-src-sdfn, ...
    queues_used: int = field(metadata=_rule(_at_least(0)))
    nqueues: int = field(metadata=_rule(_at_least(1)))
    max_over_mean: float = field(metadata=_rule(_at_least(0)))
    held: bool  # one queue where the outer headers do not vary, max/mean ≤ 1.25 where they do


@dataclass(frozen=True)
class DemoPmtu:
    """A DF datagram larger than the path after encapsulation: the MTU the client learnt from the LB."""

    sent_bytes: int = field(metadata=_rule(_at_least(0)))
    expected_mtu: int = field(metadata=_rule(_at_least(0)))  # egress MTU − the encap's overhead
    learnt_mtu: int | None  # the client socket's path MTU afterwards; None: nothing learnt
    lb_too_big: int = field(metadata=_rule(_at_least(0)))  # the LB's own ICMP answers
    resend: str  # what sending the same datagram again did: EMSGSIZE when the MTU was learnt


@dataclass(frozen=True)
class DemoChurn:
    """One of three reals removed under live connections: who was reset, who suffered as collateral."""

    connections: int = field(metadata=_rule(_at_least(0)))
    on_removed: int = field(metadata=_rule(_at_least(0)))  # connections the removed real served
    reset: int = field(metadata=_rule(_at_least(0)))  # of those, ended by RST (fail fast)
    collateral: int = field(metadata=_rule(_at_least(0)))  # connections of surviving reals that broke
    new_flows: int = field(metadata=_rule(_at_least(0)))  # new flows opened after the removal
    new_to_removed: int = field(metadata=_rule(_at_least(0)))  # of those, answered by the removed real
    new_failed: int = field(metadata=_rule(_at_least(0)))
    ring_collateral_slots: int = field(metadata=_rule(_at_least(0)))  # Maglev slots moved between survivors
    ring_size: int = field(metadata=_rule(_at_least(1)))


@dataclass(frozen=True)
class DemoEncap:
    """Real traffic balanced through the lab in one encap, and what the demo checked beside it."""

    encap: EncapId
    requests: int = field(metadata=_rule(_at_least(0)))
    ok: int = field(metadata=_rule(_at_least(0)))
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

    encaps: list[DemoEncap] = field(metadata=_rule(_non_empty))
    shape: LbShape = "one-arm"
    topology: str = "default"


# --- corpus -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CorpusPayload:
    """Katran's fixture corpus replayed through our programs: what each case proved.

    Since issue 30 in five counts (byte_exact: transforms only; verdict_exact; same_real; deviations;
    not_applicable); files before it have verdict_and_real instead of the middle two, and byte_exact
    counted unchanged frames too."""

    cases: int = field(metadata=_rule(_at_least(1)))
    byte_exact: int = field(metadata=_rule(_at_least(0)))  # our transformed output is Katran's, byte for byte
    deviations: int = field(metadata=_rule(_at_least(0)))  # deliberately otherwise, pinned verdict and reason
    not_applicable: int = field(metadata=_rule(_at_least(0)))  # something l4lab does not do, and why
    verdict_and_real: int = field(default=0, metadata=_rule(_at_least(0)))  # before issue 30 only
    katrans_real: int = field(default=0, metadata=_rule(_at_least(0)))  # of same_real: Katran's own real
    verdict_exact: int = field(default=0, metadata=_rule(_at_least(0)))  # Katran's verdict, frame untouched
    same_real: int = field(default=0, metadata=_rule(_at_least(0)))  # Katran's encapsulation, its real or a live one

    def problems(self) -> Iterator[tuple[str, str]]:
        total = (self.byte_exact + self.verdict_and_real + self.verdict_exact + self.same_real + self.deviations
                 + self.not_applicable)
        if total != self.cases:
            yield "cases", f"must equal the counts' sum ({total}) but got {self.cases}"
        if self.katrans_real > self.verdict_and_real + self.same_real:
            yield "katrans_real", (f"must be ≤ same_real ({self.same_real + self.verdict_and_real}) but got "
                                   f"{self.katrans_real}")


# --- fuzz ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FuzzReason:
    """How many fuzzed frames one program counted under one reason."""

    program: str = field(metadata=_rule(_non_empty))  # balancer_xdp, decap_xdp, decap_tc
    reason: str = field(metadata=_rule(_non_empty))
    frames: int = field(metadata=_rule(_at_least(0)))


@dataclass(frozen=True)
class FuzzPayload:
    """Generated frames through the datapath by BPF_PROG_TEST_RUN, and what the programs made of them."""

    seed: int = field(metadata=_rule(_at_least(0)))
    frames: int = field(metadata=_rule(_at_least(1)))  # frames generated; each runs through every program
    runs: int = field(metadata=_rule(_at_least(1)))  # test runs in all (frames × programs, less refused)
    seconds: float = field(metadata=_rule(_at_least(0)))
    frames_per_s: float = field(metadata=_rule(_at_least(0)))
    runs_per_s: float = field(metadata=_rule(_at_least(0)))
    refused: int = field(metadata=_rule(_at_least(0)))  # skb test runs the kernel refuses (IP header cut)
    aborted: int = field(metadata=_rule(_at_least(0)))  # XDP_ABORTED or any verdict a program must not return
    # Per program and verdict, runs minus the deltas of that verdict's reasons, in both directions
    # (a TC_ACT_SHOT without a DROP_ reason counts here).
    without_one_reason: int = field(metadata=_rule(_at_least(0)))
    tx_checked: int = field(metadata=_rule(_at_least(0)))  # XDP_TX outputs re-parsed
    reasons: list[FuzzReason] = field(metadata=_rule(_non_empty))


Payload = (
    BenchPayload
    | RssPayload
    | PmtuPayload
    | ChurnPayload
    | FailoverPayload
    | ConformancePayload
    | DemoPayload
    | CorpusPayload
    | FuzzPayload
)

PAYLOADS: Mapping[Kind, type[Any]] = {
    Kind.CONFORMANCE: ConformancePayload,
    Kind.BENCH: BenchPayload,
    Kind.RSS: RssPayload,
    Kind.PMTU: PmtuPayload,
    Kind.CHURN: ChurnPayload,
    Kind.FAILOVER: FailoverPayload,
    Kind.DEMO: DemoPayload,
    Kind.CORPUS: CorpusPayload,
    Kind.FUZZ: FuzzPayload,
}


@dataclass(frozen=True)
class Result:
    """One results file."""

    kind: Kind
    id: str
    machine: Machine
    commit: str
    timestamp: str
    payload: Payload
    synthetic: bool = False
    schema_version: int = SCHEMA_VERSION

    @property
    def test(self) -> str:
        """The test name part of the id."""
        return split_id(self.id)[0]

    @property
    def encap(self) -> str | None:
        """The encap id named in the id's brackets, if any."""
        return split_id(self.id)[1]

    @property
    def time(self) -> datetime:
        return datetime.fromisoformat(self.timestamp)

    def to_json(self) -> dict[str, Any]:
        """The JSON object of this result, keys in the schema's order."""
        return {
            "schema_version": self.schema_version,
            "kind": self.kind.value,
            "id": self.id,
            "machine": dataclasses.asdict(self.machine),
            "commit": self.commit,
            "timestamp": self.timestamp,
            "synthetic": self.synthetic,
            "payload": dataclasses.asdict(self.payload),
        }


# --- ids ----------------------------------------------------------------------------------------


def case_id(test: str, encap: str | None = None, *more: str) -> str:
    """The id of a case: ``test``, ``test[encap]`` or ``test[encap-more-...]`` (pytest's form)."""
    if encap is not None and encap not in ENCAP_IDS:
        raise ResultsError("<value>", "id", f"encap must be one of {', '.join(ENCAP_IDS)} but got {encap!r}")
    param = "-".join(p for p in (encap, *more) if p)
    value = f"{test}[{param}]" if param else test
    _check_id(value)
    return value


def split_id(value: str) -> tuple[str, str | None]:
    """(test name, encap id or None) of an id; the encap is the bracket's leading encap id."""
    match = _ID_RE.match(value)
    if match is None:
        raise ResultsError("<value>", "id", _id_problem(value))
    param = match["param"] or ""
    for encap in ENCAP_IDS:
        if param == encap or param.startswith(encap + "-"):
            return match["test"], encap
    return match["test"], None


def _id_problem(value: str) -> str:
    return (
        f"must be a test name optionally followed by [params], e.g. 'test_tcp[ip4-gue1]', but got {value!r}"
    )


def _check_id(value: str) -> None:
    if _ID_RE.match(value) is None:
        raise _FieldError("id", _id_problem(value))


# --- the validator ------------------------------------------------------------------------------

T = TypeVar("T")


def _describe(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " or ".join(json.dumps(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        return " or ".join(_describe(a) for a in typing.get_args(tp))
    if origin is list:
        return f"a list of {_describe(typing.get_args(tp)[0])}"
    if tp is type(None):
        return "null"
    if dataclasses.is_dataclass(tp):
        return "an object"
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(tp, str(tp))


def _parse(value: Any, tp: Any, path: str) -> Any:
    origin = typing.get_origin(tp)
    if origin is Literal:
        if value in typing.get_args(tp) and not isinstance(value, bool):
            return value
        raise _READ.fail(path, value, _describe(tp))
    if origin in (Union, types.UnionType):
        objects = [a for a in typing.get_args(tp) if dataclasses.is_dataclass(a)]
        if isinstance(value, dict) and len(objects) == 1:  # an object or null: name the field inside that is wrong
            return _parse(value, objects[0], path)
        for alternative in typing.get_args(tp):
            try:
                return _parse(value, alternative, path)
            except _FieldError:
                continue
        raise _READ.fail(path, value, _describe(tp))
    if origin is list:
        _READ.array(value, path, _describe(tp))
        (item,) = typing.get_args(tp)
        return [_parse(v, item, f"{path}[{i}]") for i, v in enumerate(value)]
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return _parse_dataclass(value, tp, path)
    if tp is type(None):
        if value is None:
            return None
        raise _READ.fail(path, value, "null")
    if tp is bool:
        return _READ.boolean(value, path)
    if tp is int:
        return _READ.integer(value, path)
    if tp is float:
        return _READ.number(value, path, finite="a finite number")
    if tp is str:
        return _READ.string(value, path)
    raise TypeError(f"schema type {tp!r} at {path} has no validator")


def _parse_dataclass(value: Any, cls: type[T], path: str) -> T:
    prefix = f"{path}." if path else ""
    value = _READ.table(value, path, "an object")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]

    def unknown(where: str, _value: object, known: Sequence[str]) -> _FieldError:
        return _FieldError(where, f"is not a field of {cls.__name__} (known: {', '.join(known)})")

    Reader(_fail, unknown).known_keys(value, tuple(fields), path)
    kwargs: dict[str, Any] = {}
    for name, f in fields.items():
        where = prefix + name
        if name not in value:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise _FieldError(where, f"is missing; it must be {_describe(hints[name])}")
            continue
        parsed = _parse(value[name], hints[name], where)
        check = f.metadata.get("check")
        if check is not None and parsed is not None:
            problem = check(parsed)
            if problem:
                raise _FieldError(where, problem)
        kwargs[name] = parsed
    instance = cls(**kwargs)
    problems = getattr(instance, "problems", None)
    if problems is not None:
        for name, problem in problems():
            raise _FieldError(prefix + name, problem)
    return instance


def _parse_result(data: Any) -> Result:
    if not isinstance(data, dict):
        raise _FieldError("", f"must be a JSON object but got {type(data).__name__}")
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        raise _FieldError(
            "schema_version",
            f"is {json.dumps(version)} but this reader knows version {SCHEMA_VERSION}; "
            "re-run the suite that wrote it, or update l4lab",
        )
    kind_value = data.get("kind")
    if kind_value not in tuple(k.value for k in Kind):  # a tuple: the value may be unhashable JSON
        known = ", ".join(k.value for k in Kind)
        raise _FieldError("kind", f"must be one of {known} but got {json.dumps(kind_value)}")
    kind = Kind(kind_value)
    for key in ("schema_version", "kind", "id", "machine", "commit", "timestamp", "payload"):
        if key not in data:
            raise _FieldError(key, "is missing")
    Reader(_fail, lambda where, _value, _known: _FieldError(where, "is not a field of a result")).known_keys(
        data, tuple(f.name for f in dataclasses.fields(Result)), "")
    result_id = _parse(data["id"], str, "id")
    _check_id(result_id)
    commit = _parse(data["commit"], str, "commit")
    if not _COMMIT_RE.match(commit):
        raise _FieldError(
            "commit", f"must be 40 lower-case hex digits (git rev-parse HEAD) or unknown but got {commit!r}"
        )
    timestamp = _parse(data["timestamp"], str, "timestamp")
    try:
        moment = datetime.fromisoformat(timestamp)
    except ValueError:
        moment = None
    if moment is None or moment.tzinfo is None:
        raise _FieldError("timestamp", f"must be ISO 8601 with a time zone but got {timestamp!r}")
    return Result(
        kind=kind,
        id=result_id,
        machine=_parse_dataclass(data["machine"], Machine, "machine"),
        commit=commit,
        timestamp=timestamp,
        payload=_parse_dataclass(data["payload"], PAYLOADS[kind], "payload"),
        synthetic=_parse(data.get("synthetic", False), bool, "synthetic"),
        schema_version=version,
    )


def parse_result(data: Any, file: str | Path = "<value>") -> Result:
    """The Result in a decoded JSON value; raises ResultsError naming ``file`` and the field."""
    try:
        return _parse_result(data)
    except _FieldError as e:
        raise ResultsError(file, e.path, e.problem) from None


# --- where results come from --------------------------------------------------------------------


def results_dir(directory: str | Path | None = None) -> Path:
    """The results directory: ``directory``, else ``$L4LAB_RESULTS``, else ``results/`` at the repo top."""
    if directory is not None:
        return Path(directory)
    env = os.environ.get(ENV_RESULTS)
    return Path(env) if env else _REPO_TOP / "results"


def current_machine() -> Machine:
    """This machine: hostname, kernel release and online CPUs."""
    return Machine(hostname=socket.gethostname(), kernel=platform.release(), cpus=os.cpu_count() or 1)


def current_commit(repo: str | Path = _REPO_TOP) -> str:
    """``git rev-parse HEAD`` of the repository, with ``-dirty`` if the tree differs; "unknown" if none."""

    def git(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=False)

    try:
        head = git("rev-parse", "--verify", "-q", "HEAD")
    except FileNotFoundError:
        return "unknown"
    if head.returncode != 0:
        return "unknown"
    commit = head.stdout.strip()
    dirty = git("diff", "--quiet", "HEAD", "--").returncode != 0
    return commit + ("-dirty" if dirty else "")


def _file_name(kind: Kind, result_id: str, moment: datetime, n: int = 0) -> str:
    # A test name holds no '+', so test_x[ip4-gue1] -> test_x+ip4-gue1 cannot meet another test's file;
    # the UTC time (and a counter within one second) keeps every run of a case.
    name = re.sub(r"[^A-Za-z0-9_.+=-]", "_", result_id.replace("[", "+").replace("]", ""))
    stamp = moment.astimezone(UTC).strftime("%Y%m%dT%H%M%SZ") + (f"-{n}" if n else "")
    return f"{kind.value}.{name}@{stamp}.json"


def write_result(
    kind: Kind | str,
    id: str,
    payload: Any,
    directory: str | Path | None = None,
    *,
    machine: Machine | None = None,
    commit: str | None = None,
    timestamp: datetime | None = None,
    synthetic: bool = False,
) -> Path:
    """Validate and write one result; returns its path. ``payload`` is a payload dataclass or a dict.

    Raises ResultsError (file ``<value>``) if the payload does not match the kind's schema.
    """
    try:
        kind = Kind(kind)
    except ValueError:
        known = ", ".join(k.value for k in Kind)
        raise ResultsError("<value>", "kind", f"must be one of {known} but got {kind!r}") from None
    if dataclasses.is_dataclass(payload) and not isinstance(payload, type):
        if not isinstance(payload, PAYLOADS[kind]):
            raise ResultsError(
                "<value>",
                "payload",
                f"a {kind.value} result needs a {PAYLOADS[kind].__name__} but got {type(payload).__name__}",
            )
        payload = dataclasses.asdict(payload)
    moment = timestamp or datetime.now(UTC)
    data = {
        "schema_version": SCHEMA_VERSION,
        "kind": kind.value,
        "id": id,
        "machine": dataclasses.asdict(machine or current_machine()),
        "commit": commit or current_commit(),
        "timestamp": moment.isoformat(timespec="seconds"),
        "synthetic": synthetic,
        "payload": payload,
    }
    result = parse_result(data)  # refuse to write what the loader would refuse to read
    target_dir = results_dir(directory)
    target_dir.mkdir(parents=True, exist_ok=True)
    n = 0
    while (target := target_dir / _file_name(kind, id, moment, n)).exists():
        n += 1
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=target_dir)
    try:
        os.fchmod(fd, 0o644)  # mkstemp makes 0600; results are for every user of the machine to read
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(result.to_json(), out, indent=1, ensure_ascii=False)
            out.write("\n")
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def load_results(directory: str | Path | None = None) -> list[Result]:
    """Every result in the directory (``*.json``), sorted by kind, id and timestamp.

    Raises ResultsError naming the file and field for the first file that is not a valid result,
    and for a directory that does not exist.
    """
    source = results_dir(directory)
    if not source.is_dir():
        raise ResultsError(
            source,
            "",
            "results directory does not exist; run the suites or `make demo` first, or pass --results",
        )
    results = []
    for path in sorted(source.glob("*.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            problem = f"is not JSON ({e.msg} at line {e.lineno} column {e.colno})"
            raise ResultsError(path, "", problem) from None
        except UnicodeDecodeError as e:
            raise ResultsError(path, "", f"is not UTF-8 text ({e.reason} at byte {e.start})") from None
        results.append(parse_result(data, path))
    results.sort(key=lambda r: (r.kind.value, r.id, r.time))
    return results


P = TypeVar("P")


def of_kind(results: list[Result], payload_class: type[P]) -> list[tuple[Result, P]]:
    """The results whose payload is a ``payload_class``, each with its payload typed."""
    return [(r, r.payload) for r in results if isinstance(r.payload, payload_class)]
