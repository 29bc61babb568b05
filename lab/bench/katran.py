"""`l4lab bench --katran PATH`: l4lab and Katran timed side by side on identical packets.

Both datapaths are built and loaded in the same run (Katran from the user's checkout, lab/dut/katran.py),
given the same VIP, the same four reals and the same Maglev ring (balancer/maglev.py), and session
tables of the same size per CPU: Katran's loader gives every CPU its own LRU table of `lru_size`
entries; l4lab has one table for all CPUs of `lru_size` entries per possible CPU (the controller's
unit), so a CPU's share of it is the same; the run prints both in entries and bytes. Per encap
(IPIP; GUE, Katran built with GUE_ENCAP) the cases are

    non-vip       TCP to an address that is no VIP                                      XDP_PASS
    session-hit   an ACK of a flow whose session exists                                 XDP_TX
    new-syn       a SYN of a flow never seen (new client address and port every call)   XDP_TX
    new-ack       an ACK of a flow never seen: a session miss                           XDP_TX

beside the floors (XDP_DROP, MAC-swap XDP_TX). Every call is one BPF_PROG_TEST_RUN with
repeat = 1 (repeat > 1 feeds each iteration the previous output), the process pinned to one CPU
(test runs execute on the caller's CPU, where the per-CPU tables live), the cases taking turns
call after call so that they share the machine's weather; each figure is the median.

An order that cannot favour anyone (lab/bench/order.py): the cases are shuffled in every iteration
by a seeded generator (the seed is printed; `--seed` replays it), and every round loads both
programs afresh, the one loaded first rotating round by round, so each program's session tables are
created first in as many rounds as the other's. Each ratio prints with its spread over the rounds
and its median among the rounds of each load order.

Honesty: every call's XDP action is checked, and after every round the counter that only the case
moves must have moved by exactly its number of calls (l4lab: the LRU_HIT / LRU_MISS / SYN_REHASH
events, PASS_NOT_VIP; Katran: `stats` LRU v1 without v2 for hits, LRU_MISS v1 for SYNs, LRU_MISS v2
for ACK misses, XDP_PASS). Each datapath instance serves one encap, so no two cases share a counter.
Ratios are of the cost above the MAC-swap floor, l4lab / Katran, measured in this run only.

Then live frames on the bench veth (lab/bench/katran_live.py), in rounds: the loop cost and the NDR
of the floors, l4lab and Katran per encap, and a SYN flood.

`--prefill F` (Options.prefill) fills every session table to F of its entries with other flows before
each round's timing, through each program's own insert (a new flow's ACK), so new flows are timed into
a used table, as on a loaded balancer, and not into an empty one.

`--baseline OBJ` (Options.baseline) loads another balancer object beside l4lab's, an older build or
a variant of the datapath, and times its cases as "base" in the same rounds (one of another BTF
contract is programmed by the checkout that built it, lab/bench/foreign.py): changes of a few
nanoseconds, which separate runs cannot tell from the machine's noise (the ratios move about ±0.05
from run to run), show as l4lab against base within one run.

The result (reports/schema.py) holds the micro table with each ratio's rounds, the seed, the load
order, the program sizes, the loop costs and every live round's NDRs in `side_by_side`, and the NDRs
(medians of the rounds) as 64-byte points of l4lab with Katran's in `versus`.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import statistics
import struct
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from balancer import _abi, encaps, maglev
from balancer.libbpf import BpfObject
from balancer.maplayout import SESSION_SETS
from lab.bench import foreign, katran_live, sidespec
from lab.bench.baseline import any_baseline, check_baseline
from lab.bench.foreign import ForeignBaseline
from lab.bench.katran_live import FLOOD, FLOOD_SOURCES, live_plan, loop_ns
from lab.bench.model import KATRAN_ENCAPS, LINK_MTU
from lab.bench.order import Order, Spread, above_floor_ratio, load_order, new_seed
from lab.bench.proginfo import program_insns
from lab.checksum import inet_checksum
from lab.cpu import pinned_cpu
from lab.dut import katran as K
from lab.errors import LabError
from reports.schema import (
    BenchPayload,
    BenchPoint,
    Floor,
    LiveNdr,
    LiveRound,
    LoopCost,
    ProgramSize,
    SessionTables,
    SideBySide,
    SideCase,
    SynFlood,
    Trial,
    Versus,
    case_id,
    results_dir,
    write_result,
)

XDP_DROP, XDP_PASS, XDP_TX = 1, 2, 3
ACTIONS = {0: "XDP_ABORTED", 1: "XDP_DROP", 2: "XDP_PASS", 3: "XDP_TX", 4: "XDP_REDIRECT"}
CLIENT_MAC, LB_MAC = "02:00:00:00:0c:01", "02:00:00:00:0c:02"
VIP, VIP_PORT, NOT_VIP = "198.51.100.100", 80, "198.51.100.99"
CLIENT = "192.0.2.10"
REALS = ("203.0.113.18", "203.0.113.34", "203.0.113.50", "203.0.113.66")
SRC4 = "198.51.100.128"
CASES = ("non-vip", "session-hit", "new-syn", "new-ack")
PAYLOAD = b"l4lab bench 69B"  # 14 + 20 + 20 + 15 = 69-byte frames
RING = K.RING_SIZE


@dataclass(frozen=True)
class Options:
    katran: Path | str | None  # a Katran checkout; None: $L4LAB_KATRAN_SRC
    runs: int = 200_000       # calls per case per run (split over the rounds)
    rounds: int = 6           # an even number: each program is loaded first in half of them
    lru_size: int = 1_000_000  # session entries per CPU, both datapaths
    ndr: bool = True
    quick: bool = False
    results: Path | None = None
    baseline: Path | None = None  # another balancer.o (e.g. an older build) timed in the same run as "base"
    seed: int | None = None   # the order's seed (lab/bench/order.py); None: a new one, printed
    prefill: float = 0.0      # each session table this full (of its entries) before a round's timing


@dataclass
class Side:
    """One datapath instance (l4lab or Katran) serving one encap, with its path counters."""

    who: str                      # "l4lab" | "katran" | "base"
    encap: str                    # a case of KATRAN_ENCAPS
    program: Any
    counters: Callable[[], dict[str, int]]
    path_counter: dict[str, str]  # case -> the counter only that case moves
    tables: list[Any] = field(default_factory=list)  # its session tables (balancer.libbpf.Map)
    not_moved: dict[str, str] = field(default_factory=dict)  # case -> a counter that must stay


@dataclass
class Result:
    medians: dict[str, float] = field(default_factory=dict)        # "who:encap:case" or floor -> ns
    round_medians: dict[str, list[float]] = field(default_factory=dict)  # the same, per round
    trimmed: dict[str, float] = field(default_factory=dict)  # the same, 10 %-trimmed means (trimmed_mean)
    first_loaded: list[str] = field(default_factory=list)          # per round: whose maps were created first
    seed: int = 0
    insns: dict[str, tuple[int, int]] = field(default_factory=dict)  # "who:encap" -> (xlated, verified)
    tables: dict[str, tuple[int, int, int]] = field(default_factory=dict)  # who -> (tables, entries each, bytes)
    ndr: dict[str, float] = field(default_factory=dict)            # name -> NDR Mpps at 64 B, median of rounds
    live: dict[str, list[Any]] = field(default_factory=dict)       # name -> lab/bench/model.py Measured per round
    loop: dict[str, list[Any]] = field(default_factory=dict)       # name -> xdplive.ChainCost per round
    flood_sessions: dict[str, list[int]] = field(default_factory=dict)  # SYN flood: who -> sessions, per round
    live_first: list[str] = field(default_factory=list)            # per live round: whose tables came first
    path_counters: dict[str, str] = field(default_factory=dict)    # "who:encap:case" -> counter checked
    calls: int = 0
    rounds: int = 0
    lru_size: int = 0
    prefill: float = 0.0
    results_file: Path | None = None


def options(katran: str | None, quick: bool, results: Path | None, baseline: Path | None = None,
            seed: int | None = None, prefill: float = 0.0) -> Options:
    """200,000 calls per case in 6 rounds with 1,000,000-entry tables per CPU, or a quick run."""
    if quick:
        return Options(katran=katran, runs=20_000, rounds=4, lru_size=1 << 17, quick=True, results=results,
                       baseline=baseline, seed=seed, prefill=prefill)
    return Options(katran=katran, results=results, baseline=baseline, seed=seed, prefill=prefill)


def baseline_lines(result: Result) -> list[str]:
    """l4lab against the baseline: both as ratios to Katran's cost above the floor and their difference,
    then l4lab's time over the baseline's: by the medians, by the trimmed means, and the range over the
    rounds' medians."""
    m, rm = result.medians, result.round_medians
    floor = m["floor:xdp_tx"]
    lines = [f"{'l4lab against --baseline':<24} {'base':>8} {'l4lab':>8}   x Katran above the floor: base, "
             "l4lab, l4lab - base; l4lab / base in time: medians, trimmed means, rounds' medians"]
    for name in sorted(k[5:] for k in m if k.startswith("base:")):
        base, ours, theirs = m["base:" + name], m["l4lab:" + name], m.get("katran:" + name)
        per_round = [o / b for o, b in zip(rm["l4lab:" + name], rm["base:" + name], strict=True)]
        trimmed = result.trimmed["l4lab:" + name] / result.trimmed["base:" + name]
        times = f"{ours / base:.3f} {trimmed:.3f} {min(per_round):.3f}-{max(per_round):.3f}"
        if theirs is None or theirs <= floor:
            lines.append(f"{name:<24} {base:>8.0f} {ours:>8.0f}   {'-':>4} {'-':>4} {'-':>5}   {times}")
            continue
        rb, ro = (base - floor) / (theirs - floor), (ours - floor) / (theirs - floor)
        lines.append(f"{name:<24} {base:>8.0f} {ours:>8.0f}   {rb:.2f} {ro:.2f} {ro - rb:+.2f}   {times}")
    return lines


# --- frames -----------------------------------------------------------------------------------------


def tcp_frame(src: str, sport: int, dst: str, flags: int) -> bytes:
    """Ethernet/IPv4/TCP with PAYLOAD, every checksum valid (69 bytes)."""
    s, d = ipaddress.IPv4Address(src).packed, ipaddress.IPv4Address(dst).packed
    tcp = struct.pack("!HHIIBBHHH", sport, VIP_PORT, 1, 1 if flags & 0x10 else 0, 5 << 4, flags, 65535, 0, 0)
    seg = tcp + PAYLOAD
    check = inet_checksum(s + d + struct.pack("!BBH", 0, socket.IPPROTO_TCP, len(seg)) + seg)
    seg = seg[:16] + struct.pack("!H", check) + seg[18:]
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(seg), 0, 0x4000, 64, socket.IPPROTO_TCP, 0, s, d)
    ip = ip[:10] + struct.pack("!H", inet_checksum(ip)) + ip[12:]
    eth = bytes.fromhex(LB_MAC.replace(":", "")) + bytes.fromhex(CLIENT_MAC.replace(":", "")) + b"\x08\x00"
    return eth + ip + seg


class NewFlows:
    """Frames of flows never seen before: the n-th has client 10.0.0.0 + n and port 1024 + n % 60000."""

    def __init__(self, flags: int, base: int) -> None:
        self.template = bytearray(tcp_frame("10.0.0.1", 1024, VIP, flags))
        self.base = base
        self.n = 0

    def next(self) -> bytes:
        i = self.base + self.n
        self.n += 1
        buf = self.template
        buf[26:30] = (0x0A000000 | (i & 0xFFFFFF)).to_bytes(4, "big")
        buf[34:36] = (1024 + i % 60000).to_bytes(2, "big")
        buf[24:26] = b"\0\0"
        buf[24:26] = inet_checksum(bytes(buf[14:34])).to_bytes(2, "big")
        return bytes(buf)  # the TCP checksum is left stale: neither datapath reads it


# --- the two datapaths ------------------------------------------------------------------------------


L4LAB_PATHS = {"non-vip": "PASS_NOT_VIP", "session-hit": "LRU_HIT", "new-syn": "SYN_REHASH", "new-ack": "LRU_MISS"}


def l4lab_spec(encap_id: str, lru_size: int, obj: Path | None = None) -> dict[str, Any]:
    path = str(obj or Path(__file__).resolve().parents[2] / "build" / "bpf" / "balancer.o")
    return sidespec.spec(path, encap_id, lru_size, VIP, VIP_PORT, REALS, list(ring()), CLIENT_MAC, SRC4)


def l4lab_side(stack: ExitStack, encap_id: str, lru_size: int, obj: Path | None = None, who: str = "l4lab") -> Side:
    dp = sidespec.program(l4lab_spec(encap_id, lru_size, obj))
    stack.callback(dp.close)
    return Side(who, encap_id, dp.programs["balancer_xdp"], lambda: sidespec.counters(dp), L4LAB_PATHS,
                tables=dp.session_tables[:1])  # IPv4 flows: the one the frames use


def foreign_side(stack: ExitStack, encap_id: str, lru_size: int, base: ForeignBaseline) -> Side:
    """The baseline of another contract, loaded and programmed by its own checkout (lab/bench/foreign.py)."""
    program, table, child = foreign.load(stack, base, l4lab_spec(encap_id, lru_size, base.obj))
    return Side("base", encap_id, program, child.counters, L4LAB_PATHS, tables=[table])


def katran_side(stack: ExitStack, encap_id: str, obj: Path, lru_size: int) -> Side:
    kt = K.Katran(obj, lru_size=lru_size).load()
    stack.callback(kt.close)
    kt.set_router_mac(CLIENT_MAC)
    if KATRAN_ENCAPS[encap_id] == "gue":
        kt.set_sources(SRC4, "2001:db8:1b::80")
    kt.add_vip(VIP, VIP_PORT, socket.IPPROTO_TCP, 0)
    for i, addr in enumerate(REALS):
        kt.add_real(i + 1, addr)
    kt.set_ring(0, list(ring()))
    def counters() -> dict[str, int]:
        c = kt.counters()
        c["LRU hits"] = c["LRU.v1"] - c["LRU.v2"]  # v1 counts every VIP packet, v2 the misses
        return c

    return Side("katran", encap_id, kt.program, counters,
                {"non-vip": "XDP_PASS.v1", "session-hit": "LRU hits", "new-syn": "LRU_MISS.v1",
                 "new-ack": "LRU_MISS.v2"}, tables=kt.session_tables)


def map_bytes(m: Any) -> int:
    """The kernel's memory charge of a map (memlock in its fdinfo): a preallocated table's whole size."""
    for line in Path(f"/proc/self/fdinfo/{m.fd}").read_text().splitlines():
        if line.startswith("memlock:"):
            return int(line.split()[1])
    raise LabError(f"map '{m.name}': its fdinfo has no memlock line (kernel too old?)")


def table_entries(m: Any) -> int:
    """A session table's entries: an LRU's elements, or the ways of l4lab's IPv4 sets
    (bpf/include/session4.h: sets of WAYS ways each)."""
    if m.name == SESSION_SETS:
        return int(m.max_entries) * int(_abi.Sess4.WAYS)
    return int(m.max_entries)


def table_sizes(side: Side) -> tuple[int, int, int]:
    """(tables, entries of each, bytes of all) of a side's session tables."""
    entries = {table_entries(m) for m in side.tables}
    return len(side.tables), max(entries, default=0), sum(map_bytes(m) for m in side.tables)



def ring() -> Any:
    return maglev.build_ring({i + 1: (a, 1) for i, a in enumerate(REALS)}, RING)


# --- timing -----------------------------------------------------------------------------------------


def pinned() -> AbstractContextManager[int]:
    """This process on one CPU (the highest it may use) for the block; yields the CPU."""
    return pinned_cpu(max(os.sched_getaffinity(0)))


@dataclass
class Timed:
    name: str
    program: Any
    frame: Callable[[], bytes]
    action: int
    side: Side | None = None
    case: str = ""
    samples: list[int] = field(default_factory=list)  # this round's


def side_cases(side: Side, flow_base: int) -> list[Timed]:
    hit_frame = tcp_frame(CLIENT, 45000, VIP, 0x10)
    for frame in (tcp_frame(CLIENT, 45000, VIP, 0x02), hit_frame, hit_frame):  # the ACK creates the session
        res = side.program.test_run(frame)
        if res.retval != XDP_TX:
            raise LabError(f"{side.who} {side.encap}: priming the session returned {ACTIONS.get(res.retval)}")
    not_vip = tcp_frame(CLIENT, 45000, NOT_VIP, 0x10)
    syns, acks = NewFlows(0x02, flow_base), NewFlows(0x10, flow_base + (1 << 23))
    tag = f"{side.who}:{side.encap}:"
    cases = [Timed(tag + "session-hit", side.program, lambda: hit_frame, XDP_TX, side, "session-hit"),
             Timed(tag + "new-syn", side.program, syns.next, XDP_TX, side, "new-syn"),
             Timed(tag + "new-ack", side.program, acks.next, XDP_TX, side, "new-ack")]
    if side.encap == encaps.IP4_IPIP:
        cases.insert(0, Timed(f"{side.who}:non-vip", side.program, lambda: not_vip, XDP_PASS, side, "non-vip"))
    return cases


PREFILL_BASE = 1 << 22  # the prefill's flows: past every case's (side_cases), before the new ACKs' (1 << 23)


def prefill(side: Side, fraction: float) -> int:
    """Fills the side's session table to `fraction` of its entries the way traffic does: new flows' ACKs
    through its program, each a miss that inserts (its new-ack counter must move by every one). l4lab's one
    table serves every CPU and Katran's pinned CPU has its own, so each ends the same fraction full.
    Returns the flows sent."""
    _, entries, _ = table_sizes(side)
    count = int(entries * fraction)
    if not count:
        return 0
    flows, counter = NewFlows(0x10, PREFILL_BASE), side.path_counter["new-ack"]
    before = side.counters().get(counter, 0)
    for _ in range(count):
        res = side.program.test_run(flows.next())
        if res.retval != XDP_TX:
            raise LabError(f"{side.who} {side.encap}: a prefill ACK returned {ACTIONS.get(res.retval)}")
    moved = side.counters().get(counter, 0) - before
    if moved != count:
        raise LabError(f"{side.who} {side.encap}: {count} prefill flows moved {counter} by {moved}: "
                       "not every one was a new flow's miss")
    return count


def time_round(cases: list[Timed], sides: list[Side], per_round: int, order: Order) -> None:
    """Single test runs, every iteration in a new order; then every case's own counter moved by per_round."""
    before = {id(s): s.counters() for s in sides}
    for c in cases:
        c.samples = []
    for turn in order.iterations(cases, per_round):
        for c in turn:
            res = c.program.test_run(c.frame())
            if res.retval != c.action:
                raise LabError(f"{c.name}: returned {ACTIONS.get(res.retval, res.retval)}, "
                               f"expected {ACTIONS[c.action]}")
            c.samples.append(res.duration_ns)
    for s in sides:
        check_paths(s, [c for c in cases if c.side is s], before[id(s)], per_round)


def check_paths(side: Side, cases: list[Timed], before: dict[str, int], calls: int) -> None:
    """Each case's path counter moved by exactly `calls`, and its must-stay counter not at all."""
    after = side.counters()
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    for c in cases:
        moved = delta.get(side.path_counter[c.case], 0)
        if moved != calls:
            raise LabError(f"{c.name}: counter {side.path_counter[c.case]} moved by {moved} in a round "
                           f"of {calls} calls: the case did not take its path every time "
                           f"(counter changes: { {k: v for k, v in delta.items() if v} })")
        still = side.not_moved.get(c.case)
        if still and delta.get(still, 0):
            raise LabError(f"{c.name}: counter {still} moved by {delta[still]}: some calls missed")


# --- the run ----------------------------------------------------------------------------------------


def load_sides(stack: ExitStack, first: list[str], objs: dict[str, Path], opts: Options,
               baseline: Path | ForeignBaseline | None) -> list[Side]:
    """Every program's instance per encap, created program by program in the order `first` gives."""
    sides = []
    for who in first:
        for encap_id in KATRAN_ENCAPS:
            if who == "katran":
                sides.append(katran_side(stack, encap_id, objs[KATRAN_ENCAPS[encap_id]], opts.lru_size))
            elif who == "base" and isinstance(baseline, ForeignBaseline):
                sides.append(foreign_side(stack, encap_id, opts.lru_size, baseline))
            else:
                obj = baseline if who == "base" and isinstance(baseline, Path) else None
                sides.append(l4lab_side(stack, encap_id, opts.lru_size, obj, who))
    return sides


def time_micro(opts: Options, objs: dict[str, Path], result: Result, say: Callable[[str], None]) -> None:
    """The test-run table: rounds of freshly loaded programs, load order rotated, cases shuffled."""
    order = Order(result.seed)
    per_round = max(1, opts.runs // opts.rounds)
    samples: dict[str, list[list[int]]] = {}
    with ExitStack() as stack:
        floor = BpfObject(str(Path(__file__).resolve().parents[2] / "build" / "bpf" / "floor.o"))
        stack.callback(floor.close)
        floor.load()
        frame = tcp_frame(CLIENT, 45000, VIP, 0x10)
        floors = [Timed("floor:xdp_drop", floor.program("xdp_drop"), lambda: frame, XDP_DROP),
                  Timed("floor:xdp_tx", floor.program("xdp_tx_swap"), lambda: frame, XDP_TX)]
        baseline = any_baseline(stack, Path(opts.baseline)) if opts.baseline else None
        programs = ["l4lab", "katran", *(["base"] if baseline else [])]
        with pinned() as cpu:
            say(f"timing on CPU {cpu}: {opts.rounds} rounds × {per_round} calls per case, every iteration in a "
                "new order; the programs loaded afresh each round, the first loaded rotating")
            for r in range(opts.rounds):
                first = load_order(programs, r)
                with ExitStack() as round_stack:
                    sides = load_sides(round_stack, first, objs, opts, baseline)
                    filled = {f"{s.who}:{s.encap}": prefill(s, opts.prefill) for s in sides}
                    if opts.prefill and r == 0:
                        say(f"  tables {opts.prefill:.0%} full before timing (flows sent: "
                            f"{', '.join(f'{k} {v:,}' for k, v in filled.items())})")
                    cases = floors + [c for n, side in enumerate(sides) for c in side_cases(side, n << 20)]
                    time_round(cases, sides, per_round, order)
                    for side in sides:
                        result.insns.setdefault(f"{side.who}:{side.encap}", program_insns(side.program))
                        result.tables.setdefault(side.who, table_sizes(side))
                for c in cases:
                    samples.setdefault(c.name, []).append(c.samples)
                    if c.side is not None:
                        result.path_counters[c.name] = c.side.path_counter[c.case]
                result.first_loaded.append(first[0])
                say(f"  round {r + 1}/{opts.rounds} ({first[0]} loaded first): {per_round} calls per case, "
                    "actions and path counters checked")
    result.calls, result.rounds, result.lru_size = per_round * opts.rounds, opts.rounds, opts.lru_size
    result.prefill = opts.prefill
    result.medians = {name: float(statistics.median(x for got in rounds for x in got))
                      for name, rounds in samples.items()}
    result.round_medians = {name: [float(statistics.median(got)) for got in rounds] for name, rounds in samples.items()}
    result.trimmed = {name: trimmed_mean([x for got in rounds for x in got]) for name, rounds in samples.items()}


def trimmed_mean(values: list[int], cut: float = 0.1) -> float:
    """The mean of the values without the lowest and the highest `cut` of them. The test-run clock counts
    in steps of about 10 ns (2-3 % of a session hit), so a median moves by whole steps; the mean of the
    middle 80 % of 10^5 calls resolves a fraction of a step, and leaves out the interrupts' outliers."""
    ordered = sorted(values)
    k = int(len(ordered) * cut)
    middle = ordered[k:len(ordered) - k] or ordered
    return float(statistics.fmean(middle))


def run(opts: Options, say: Callable[[str], None] = print) -> Result:
    if opts.baseline:
        check_baseline(Path(opts.baseline), foreign=True)  # before minutes of building Katran
    checkout = K.Checkout.find(opts.katran)
    objs = {flavour: K.build(checkout, flavour) for flavour in K.FLAVOURS}
    say(f"built Katran from {checkout.root}: {', '.join(str(p) for p in objs.values())}")
    result = Result(seed=opts.seed if opts.seed is not None else new_seed())
    say(f"order: seed {result.seed} (`l4lab bench --katran --seed {result.seed}` replays it)")
    started = time.monotonic()
    time_micro(opts, objs, result, say)
    for line in table(result):
        say(line)
    if opts.baseline:
        for line in baseline_lines(result):
            say(line)
    if opts.ndr:
        katran_live.measure(opts, objs, result, say)
    write_results(result, opts)
    if result.results_file:
        say(f"wrote {result.results_file}")
    say(f"side-by-side bench took {time.monotonic() - started:.0f} s")
    return result


def ratio(result: Result, case: str, encap: str | None) -> float:
    key = case if encap is None else f"{encap}:{case}"
    m = result.medians
    return above_floor_ratio(m[f"l4lab:{key}"], m[f"katran:{key}"], m["floor:xdp_tx"])


def round_ratios(result: Result, case: str, encap: str | None, who: str = "l4lab") -> list[float]:
    """The ratio in each round, from that round's medians."""
    key = case if encap is None else f"{encap}:{case}"
    rm = result.round_medians
    return [above_floor_ratio(ours, theirs, floor)
            for ours, theirs, floor in zip(rm[f"{who}:{key}"], rm[f"katran:{key}"], rm["floor:xdp_tx"], strict=True)]


def spread(result: Result, case: str, encap: str | None) -> Spread:
    return Spread.of(round_ratios(result, case, encap), result.first_loaded)


def table(result: Result) -> list[str]:
    m = result.medians
    lines = [f"side by side: {result.calls} calls per case in {result.rounds} rounds, medians in ns (test run, "
             "repeat = 1, 69-byte frames)",
             *table_lines(result),
             f"{'case':<24} {'Katran':>8} {'l4lab':>8}   l4lab / Katran, cost above the MAC-swap floor; its spread "
             "over the rounds"]
    rows: list[tuple[str, str, str | None]] = [("non-VIP", "non-vip", None)]
    for encap_id in KATRAN_ENCAPS:
        name = "GUE" if encaps.by_id(encap_id).gue else "IPIP"
        rows += [(f"{name} session hit", "session-hit", encap_id),
                 (f"{name} new flow, SYN", "new-syn", encap_id), (f"{name} new flow, ACK", "new-ack", encap_id)]
    for label, case, encap in rows:
        key = f"{encap}:{case}" if encap else case
        lines.append(f"{label:<24} {m[f'katran:{key}']:>8.0f} {m[f'l4lab:{key}']:>8.0f}   "
                     f"{ratio(result, case, encap):.2f}  {spread(result, case, encap).text()}")
    lines.append(f"{'floor XDP_DROP':<24} {m['floor:xdp_drop']:>8.0f}")
    lines.append(f"{'floor MAC-swap XDP_TX':<24} {m['floor:xdp_tx']:>8.0f}")
    for encap_id in KATRAN_ENCAPS:
        k, o = result.insns[f"katran:{encap_id}"], result.insns[f"l4lab:{encap_id}"]
        lines.append(f"{'verified insns ' + encap_id:<24} {k[1]:>8} {o[1]:>8}   {o[1] / k[1]:.2f} "
                     f"(xlated {k[0]} / {o[0]})")
    return lines


def table_lines(result: Result) -> list[str]:
    """The session tables each program had, as loaded (every round alike)."""
    lines = []
    for who, (count, entries, size) in sorted(result.tables.items()):
        shape = f"one table of {entries:,} entries for all CPUs" if who != "katran" else \
            f"{count} tables (one per CPU) of {entries:,} entries"
        lines.append(f"  session tables, {who}: {shape}, {size / 2**20:.0f} MiB ({result.lru_size:,} per CPU)")
    if result.prefill:
        lines.append(f"  every table {result.prefill:.0%} full of other flows before each round's timing")
    return lines


def side_by_side(result: Result) -> Any:
    """The micro table, program sizes, tables, loop costs and SYN flood as the schema's SideBySide."""
    rows: list[Any] = []
    for name in result.medians:
        who, _, rest = name.partition(":")
        if who != "l4lab":
            continue
        encap_id, _, case = rest.rpartition(":")
        r = ratio(result, case, encap_id or None)
        rows.append(SideCase(encap=encap_id or None, case=case, ns=result.medians[name],  # type: ignore[arg-type]
                             other_ns=result.medians[f"katran:{rest}"],
                             ratio_above_floor=round(r, 4) if r == r else None,
                             path_counter=result.path_counters[name],
                             other_path_counter=result.path_counters[f"katran:{rest}"], calls=result.calls,
                             round_ratios=[round(x, 4) if x == x else None
                                           for x in round_ratios(result, case, encap_id or None)]))
    sizes = [ProgramSize(encap=encap_id, verified_insns=result.insns[f"l4lab:{encap_id}"][1],  # type: ignore[arg-type]
                         other_verified_insns=result.insns[f"katran:{encap_id}"][1],
                         xlated_insns=result.insns[f"l4lab:{encap_id}"][0],
                         other_xlated_insns=result.insns[f"katran:{encap_id}"][0]) for encap_id in KATRAN_ENCAPS]
    tables = [SessionTables(program=who, tables=n, entries=entries, bytes=size)
              for who, (n, entries, size) in sorted(result.tables.items()) if who != "base"]
    return SideBySide(program="katran", frame_bytes=len(tcp_frame(CLIENT, 45000, VIP, 0x10)), rounds=result.rounds,
                      session_table_entries=result.lru_size, floor_xdp_drop_ns=result.medians["floor:xdp_drop"],
                      floor_xdp_tx_ns=result.medians["floor:xdp_tx"], cases=rows, sizes=sizes,
                      loop=loop_costs(result), seed=result.seed, first_loaded=list(result.first_loaded),
                      session_tables=tables, syn_flood=syn_flood(result), prefill=result.prefill,
                      live_rounds=live_rounds(result))


def loop_costs(result: Result) -> list[Any]:
    """Every live case's loop cost as the schema's LoopCost (the SYN flood's with traffic "syn-flood")."""
    loop = []
    for case in live_plan(list(KATRAN_ENCAPS)) if result.loop else []:
        costs = result.loop[case.name]
        loop.append(LoopCost(program=case.what if case.who == "floor" else case.who,
                             encap=case.encap or None,  # type: ignore[arg-type]
                             cpu_ns_per_frame=round(loop_ns(result, case.name), 2), frames=costs[0].frames,
                             rounds=len(costs), delivered=min(c.delivered for c in costs),
                             traffic="syn-flood" if case.what == FLOOD else "udp-flows"))
    return loop


def syn_flood(result: Result) -> list[Any]:
    """The SYN flood's NDR of both programs (medians of the rounds), with the sessions each had inserted."""
    out = []
    for who in ("l4lab", "katran"):
        name = f"{who}:{FLOOD}"
        if name not in result.live:
            continue
        out.append(SynFlood(program=who, encap=encaps.IP4_IPIP, sources=FLOOD_SOURCES,  # type: ignore[arg-type]
                            ndr_mpps=result.ndr[name], pdr_mpps=katran_live.pdr_mpps(result, name),
                            floor_xdp_tx_mpps=result.ndr["floor:xdp_tx"],
                            sessions_after=max(result.flood_sessions.get(who, [0]))))
    return out


def live_rounds(result: Result) -> list[Any]:
    """Every live round's NDR of every case, with whose tables were created first that round."""
    names = [case.name for case in live_plan(list(KATRAN_ENCAPS)) if case.name in result.live]
    return [LiveRound(first_loaded=first, ndr=[LiveNdr(case=name, ndr_mpps=result.live[name][r].result.ndr_pps / 1e6,
                                                       pdr_mpps=result.live[name][r].result.pdr_pps / 1e6)
                                               for name in names])
            for r, first in enumerate(result.live_first)]


def live_points(result: Result) -> list[Any]:
    """The live-frames NDR of l4lab per encap (medians of the rounds) as the schema's BenchPoints, Katran's in
    `versus`; the trials of every round."""
    if not {"floor:xdp_tx", "floor:xdp_drop"} <= result.live.keys():
        return []
    floor = Floor(xdp_tx_mpps=result.ndr["floor:xdp_tx"], xdp_drop_mpps=result.ndr["floor:xdp_drop"])
    points = []
    for encap_id in KATRAN_ENCAPS:
        ours, theirs = f"l4lab:{encap_id}", f"katran:{encap_id}"
        if ours not in result.live or theirs not in result.live:
            continue
        points.append(BenchPoint(
            encap=encap_id, frame_size=64, ndr_mpps=result.ndr[ours],  # type: ignore[arg-type]
            pdr_mpps=katran_live.pdr_mpps(result, ours), floor=floor,
            egress_overhead_bytes=encaps.by_id(encap_id).overhead,
            trials=[Trial(rate_mpps=t.rate_pps / 1e6, loss=t.loss, duration_s=t.duration_s)
                    for m in result.live[ours] for t in m.result.trials],
            versus=[Versus(program="katran", ndr_mpps=result.ndr[theirs],
                           pdr_mpps=katran_live.pdr_mpps(result, theirs))]))
    return points


def write_results(result: Result, opts: Options) -> None:
    """One `bench` result: the micro table and sizes (side_by_side), the live-frames NDR (points, with versus)."""
    points = live_points(result)
    payload = BenchPayload(generator="xdp-live" if points else "test-run",
                           egress_mtu=LINK_MTU if points else 1500, points=points,
                           side_by_side=side_by_side(result))
    rid = case_id("bench_katran_side_by_side", None, "quick") if opts.quick else case_id("bench_katran_side_by_side")
    result.results_file = write_result("bench", rid, payload, results_dir(opts.results))
