"""Live frames for `l4lab bench --katran`: the floors, l4lab and Katran on the bench veth, per encap and in
a SYN flood, each program's loop cost and NDR, in one run (lab/bench/katran.py holds the test-run table).

Cases, on the bench's testbed (lab/bench/testbed.py), 64-byte frames:
    floor:xdp_drop, floor:xdp_tx   the floors (XDP_DROP; MAC-swap XDP_TX)
    l4lab:<encap>, katran:<encap>  1,024 UDP flows to a UDP VIP, per encap (ip4-ipip, ip4-gue1)
    l4lab:syn-flood, katran:syn-flood
                                   every frame a TCP SYN of a new flow to a TCP VIP (IPIP): 10^6 sources,
                                   1,000 addresses of 198.18.0.0/15 (RFC 2544's benchmarking prefix) × 1,000
                                   source ports, as a spoofed flood sends them

Both balancers get session tables of LIVE_LRU entries per CPU (Katran one per CPU, l4lab one for all).

    loop cost   one thread sends unpaced; the CPU time it spends per frame, median of rounds
    NDR         the zero-loss rate of the bench model's search (lab/bench/model.py), one search per
                case in every round; each NDR and each ratio of NDRs is the median of the rounds,
                printed with its spread (the rounds' range, the median of each load order's rounds)

On veth the whole loop (the generator's program, both veths, the program under test, its XDP_TX,
the counting sink) runs in the sending thread's softirqs on its own CPU: every frame sent arrives,
and a trial's loss is only what the paced sender could not send before its deadline. So the NDR is
the rate the sending threads sustain through that loop, which moves with whatever else the machine
runs; the loop cost (thread CPU time, which leaves out time given to other processes) is the same loop
measured without the scheduler, and floor ÷ program is its ratio. Floor and balancer share the
generator and the sink: the ratio charges each program only its own work and what it sends.

Honesty: in every loop round the sink must count every frame sent (100 % delivered), and the program's
own counter of what it forwarded (l4lab's TX_ENCAP reason, Katran's XDP_TX stat, the floors' count)
must have moved by exactly the frames sent; in the SYN flood, l4lab's SYN_REHASH event and Katran's
LRU_MISS v1 (a SYN's miss) too. Each round loads every program afresh, l4lab's or Katran's first in
turn, and measures the loops, then the searches, each in the seeded order's shuffle (lab/bench/order.py).
A search takes 10-20 s and a round's eight about two minutes, over which the machine's speed can drift
between two programs' searches: the rounds give each ratio as many chances to see both sides of such a
change, and the spread shows how far it moved (docs/architecture.md, decisions).
"""

from __future__ import annotations

import dataclasses
import os
import socket
import statistics
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from balancer import _abi, encaps, maglev
from balancer.controller import Instance
from lab.bench.gen.base import Endpoints
from lab.bench.gen.xdplive import XdpLiveGenerator
from lab.bench.model import (
    GEN_IF,
    GEN_MAC,
    KATRAN_ENCAPS,
    LB_MAC,
    REALS4,
    VIP4,
    VIP_PORT,
    Options,
    lb_config,
    ndr_point,
)
from lab.bench.order import Order, Spread, load_order
from lab.bench.testbed import OBJECT_DIR, PARK_IFS, PREFIX, Testbed, live_generator, object_path, testbed
from lab.dut import katran as K
from lab.errors import LabError

LIVE_LRU = int(_abi.Limits.DEFAULT_LRU_SIZE)  # session entries per CPU, both balancers (the controller's default)
FLOOD_SRC4 = "198.18.0.0"  # RFC 2544's benchmarking prefix, 198.18.0.0/15
FLOOD_ADDRS = 1000
FLOOD_SOURCES = 1_000_000  # FLOOD_ADDRS addresses × 1,000 source ports
FLOOD = "syn-flood"
UDP_FLOWS = 1024


@dataclass(frozen=True)
class LiveCase:
    """One program on the LB veth with the traffic it gets."""

    who: str    # "floor" | "l4lab" | "katran"
    what: str   # floors: "xdp_drop" | "xdp_tx"; balancers: an encap id of KATRAN_ENCAPS, or FLOOD

    @property
    def name(self) -> str:
        return f"{self.who}:{self.what}"

    @property
    def encap(self) -> str:
        """The encap id (IPIP for the flood), "" for the floors."""
        return "" if self.who == "floor" else (encaps.IP4_IPIP if self.what == FLOOD else self.what)


def live_plan(encap_ids: list[str]) -> list[LiveCase]:
    """The floors, then l4lab and Katran per encap, then both in the SYN flood (the printing order)."""
    plan = [LiveCase("floor", "xdp_drop"), LiveCase("floor", "xdp_tx")]
    for what in [*encap_ids, FLOOD]:
        plan += [LiveCase("l4lab", what), LiveCase("katran", what)]
    return plan


@dataclass
class Loaded:
    """A program ready for the veth, with the counters that say which path its frames took."""

    program: Any
    forwarded: Callable[[], int]  # frames the program itself counted as sent on (or dropped, XDP_DROP floor)
    path: Callable[[], int] | None = None  # the flood: SYNs that took the new-connection path
    path_name: str = ""
    sessions: Callable[[], int] | None = None  # entries in its session tables


# --- loading ----------------------------------------------------------------------------------------


def l4lab_config(case: LiveCase) -> Any:
    """The bench model's config for the encap (the flood: its VIP made TCP), LIVE_LRU entries per CPU."""

    config = lb_config(case.encap)
    if case.what == FLOOD:
        config = dataclasses.replace(config, vips=tuple(dataclasses.replace(v, proto="tcp") for v in config.vips))
    return dataclasses.replace(config, datapath=dataclasses.replace(config.datapath, lru_size=LIVE_LRU))


def load_l4lab(stack: ExitStack, case: LiveCase, tag: str, obj: str | None = None) -> Loaded:
    """l4lab for the case: this checkout's balancer.o, or `obj` (scripts/live_ab.py's A/B)."""
    inst = Instance.load(f"{PREFIX}{os.getpid()}-{tag}", [], config=l4lab_config(case),
                         obj=obj or str(OBJECT_DIR / "balancer.o"))
    stack.callback(inst.unload)
    dp = inst.dp
    return Loaded(dp.programs["balancer_xdp"], lambda: dp.reasons()["TX_ENCAP"],
                  (lambda: dp.events()["SYN_REHASH"]) if case.what == FLOOD else None, "SYN_REHASH",
                  lambda: sum(1 for _ in dp.sessions()))


def load_katran(stack: ExitStack, case: LiveCase, objs: dict[str, Path]) -> Loaded:
    kt = K.Katran(objs[KATRAN_ENCAPS[case.encap]], lru_size=LIVE_LRU).load()
    stack.callback(kt.close)
    kt.set_router_mac(GEN_MAC)
    if KATRAN_ENCAPS[case.encap] == "gue":
        kt.set_sources("198.51.100.128", "2001:db8:1b:80::")
    proto = socket.IPPROTO_TCP if case.what == FLOOD else socket.IPPROTO_UDP
    kt.add_vip(VIP4, VIP_PORT, proto, 0)
    reals = {i + 1: (a, 1) for i, a in enumerate(REALS4)}
    for rid, (addr, _) in reals.items():
        kt.add_real(rid, addr)
    kt.set_ring(0, list(maglev.build_ring(reals, K.RING_SIZE)))

    tables: list[Any] = kt.session_tables

    def sessions() -> int:
        return sum(len(list(m.items())) for m in tables)

    return Loaded(kt.program, lambda: kt.counter(K.XDP_TX_CNTR)[0],
                  (lambda: kt.counter(K.LRU_MISS_CNTR)[0]) if case.what == FLOOD else None, "LRU_MISS.v1", sessions)


def load_all(stack: ExitStack, bed: Testbed, plan: list[LiveCase], objs: dict[str, Path], first: list[str],
             tag: str) -> dict[str, Loaded]:
    """Every case's program, the balancers' created program by program in the order `first` gives."""
    loaded = {"floor:xdp_drop": Loaded(bed.lb_floor.program("xdp_drop"), bed.lb_count),
              "floor:xdp_tx": Loaded(bed.lb_floor.program("xdp_tx_swap"), bed.lb_count)}
    for who in first:
        for case in (c for c in plan if c.who == who):
            loaded[case.name] = (load_katran(stack, case, objs) if who == "katran"
                                 else load_l4lab(stack, case, f"{case.what}-{tag}"))
    return loaded


# --- traffic ----------------------------------------------------------------------------------------


@contextmanager
def generator(bed: Testbed, case: LiveCase) -> Iterator[tuple[Any, int]]:
    """The case's generator and its flow count: UDP flows, or the SYN flood's new source every frame."""
    sink = bed.lb_count if case.name == "floor:xdp_drop" else bed.gen_count
    if case.what != FLOOD:
        with live_generator(bed, sink) as gen:
            yield gen, UDP_FLOWS
        return
    ep = Endpoints(src_mac=GEN_MAC, dst_mac=LB_MAC, src4=FLOOD_SRC4, dst4=VIP4, dport=VIP_PORT, l4="tcp-syn")
    with XdpLiveGenerator(bed.gen_ns, GEN_IF, ep, sink, park_ifnames=PARK_IFS, src_addrs=FLOOD_ADDRS,
                          object_path=object_path("trafficgen.o")) as gen:
        yield gen, FLOOD_SOURCES


def loop_round(bed: Testbed, case: LiveCase, got: Loaded, frames: int, cpu: int) -> Any:
    """One unpaced loop of `frames`, checked: all delivered, the program's counters moved by every frame."""
    bed.on_lb_program(got.program)
    with generator(bed, case) as (gen, flows):
        before = (got.forwarded(), got.path() if got.path else 0)
        cost = gen.chain_cost(frames, 64, flows, 4, cpu)
        after = (got.forwarded(), got.path() if got.path else 0)
    sent = cost.frames + cost.warm
    if cost.received != cost.frames:
        raise LabError(f"{case.name}: the sink counted {cost.received} of {cost.frames} frames sent: the loop "
                       "lost frames (run `l4lab trace` beside the bench to see where)")
    if after[0] - before[0] != sent:
        raise LabError(f"{case.name}: the program counted {after[0] - before[0]} frames sent on, but {sent} "
                       "were sent: some took another path (lbctl stats / Katran's stats say which)")
    if got.path and after[1] - before[1] != sent:
        raise LabError(f"{case.name}: {got.path_name} moved by {after[1] - before[1]} for {sent} SYNs of new "
                       "flows: some SYNs did not take the new-connection path")
    return cost


# --- the measurement --------------------------------------------------------------------------------


def measure(opts: Any, objs: dict[str, Path], result: Any, say: Callable[[str], None]) -> None:
    """Rounds of every case's loop cost, then every case's NDR search, each round with the programs
    loaded afresh (load order rotated) and the cases shuffled; then the medians and the summary lines."""
    plan = live_plan(list(KATRAN_ENCAPS))
    order = Order(result.seed + 1)  # its own stream: a replay of the table alone leaves this one as it was
    frames, rounds = (1 << 18, 2) if opts.quick else (1 << 20, 4)
    settings = Options(quick=opts.quick).search_settings()
    cpu = max(os.sched_getaffinity(0))
    with testbed() as bed:
        say(f"live frames on veth, 64 B (lab/bench/testbed.py), {rounds} rounds, the programs loaded afresh in "
            f"each: CPU time per frame of the whole loop, {frames} frames sent unpaced from CPU {cpu}, then each "
            "case's NDR search (zero loss; on veth a lost frame is one the paced sender could not send in time); "
            f"session tables of {LIVE_LRU:,} entries per CPU; the SYN flood: every frame a new flow, 10^6 sources:")
        for r in range(rounds):
            first = load_order(["l4lab", "katran"], r)
            with ExitStack() as stack:
                loaded = load_all(stack, bed, plan, objs, first, str(r))
                for case in order.shuffled(list(plan)):
                    result.loop.setdefault(case.name, []).append(loop_round(bed, case, loaded[case.name], frames, cpu))
                for case in order.shuffled(list(plan)):
                    search_case(bed, case, loaded[case.name], settings, result)
            result.live_first.append(first[0])
            say(f"  round {r + 1}/{rounds} ({first[0]} loaded first): NDR Mpps "
                + ", ".join(f"{c.name} {result.live[c.name][-1].result.ndr_pps / 1e6:.3f}" for c in plan))
        result.ndr = {name: ndr_mpps(result, name) for name in result.live}
        print_loops(plan, result, say)
        print_searches(plan, result, say)
    summary(result, say)


def search_case(bed: Testbed, case: LiveCase, got: Loaded, settings: Any, result: Any) -> None:
    """One NDR search of one case, kept as this round's; the flood's sessions counted after it."""
    bed.on_lb_program(got.program)
    with generator(bed, case) as (gen, flows):
        measured = ndr_point(gen, case.name, 64, flows, 4, settings)
    result.live.setdefault(case.name, []).append(measured)
    if case.what == FLOOD and got.sessions is not None:
        result.flood_sessions.setdefault(case.who, []).append(got.sessions())


def print_loops(plan: list[LiveCase], result: Any, say: Callable[[str], None]) -> None:
    tx_ns = loop_ns(result, "floor:xdp_tx")
    for case in plan:
        say(f"  {case.name:<16} {loop_ns(result, case.name):7.1f} ns/frame  floor ÷ this "
            f"{share(tx_ns, loop_ns(result, case.name))}  (every round: all frames delivered, counters checked)")


def print_searches(plan: list[LiveCase], result: Any, say: Callable[[str], None]) -> None:
    say("NDR, median of the rounds (each search: zero loss, every trial's frames counted by the sink):")
    for case in plan:
        runs = result.live[case.name]
        ndrs = [m.result.ndr_pps / 1e6 for m in runs]
        repeated = sum(m.repeated for m in runs)
        say(f"  {case.name:<16} NDR {result.ndr[case.name]:6.3f} Mpps  PDR {pdr_mpps(result, case.name):6.3f} "
            f"Mpps  (rounds {min(ndrs):.3f}-{max(ndrs):.3f}; {sum(len(m.result.trials) for m in runs)} trials"
            + (f", {repeated} repeated: a sender waited for a CPU" if repeated else "") + ")")


def summary(result: Any, say: Callable[[str], None]) -> None:
    """The lines scripts read: per encap and for the flood, NDR and loop cost against the XDP_TX floor, each
    NDR ratio the median of the rounds' ratios with its spread (lab/bench/order.py)."""
    tx_ns = loop_ns(result, "floor:xdp_tx")
    for what in [*KATRAN_ENCAPS, FLOOD]:
        ours, theirs = f"l4lab:{what}", f"katran:{what}"
        versus = Spread.of(round_ratios(result, ours, theirs), result.live_first)
        say(f"  {what}: NDR l4lab {fmt(median_ratio(result, ours, 'floor:xdp_tx'))} × XDP_TX floor, "
            f"Katran {fmt(median_ratio(result, theirs, 'floor:xdp_tx'))} ×; "
            f"loop cost floor ÷ l4lab {share(tx_ns, loop_ns(result, ours))}, "
            f"floor ÷ Katran {share(tx_ns, loop_ns(result, theirs))}; "
            f"NDR l4lab ÷ Katran {fmt(median_ratio(result, ours, theirs))}; {versus.text()}")
    if result.flood_sessions:
        say(f"  {FLOOD}: sessions in the tables after its NDR search, the most of any round: "
            + ", ".join(f"{who} {max(n):,}" for who, n in sorted(result.flood_sessions.items())))
    if result.ndr["floor:xdp_tx"] <= 0:
        say("  the XDP_TX floor's NDR is 0 (no trial without loss): the machine is too busy for the NDR; "
            "the loop costs above do not depend on it")


def round_ratios(result: Any, part: str, whole: str) -> list[float]:
    """One case's NDR over another's in each round (NaN where the other's is 0)."""
    return [ratio_of(a.result.ndr_pps, b.result.ndr_pps)
            for a, b in zip(result.live[part], result.live[whole], strict=True)]


def median_ratio(result: Any, part: str, whole: str) -> float:
    """The median of the rounds' ratios, leaving out rounds where `whole` found no NDR (NaN if none had one)."""
    got = [x for x in round_ratios(result, part, whole) if x == x]
    return float(statistics.median(got)) if got else float("nan")


def ndr_mpps(result: Any, name: str) -> float:
    return float(statistics.median(m.result.ndr_pps for m in result.live[name])) / 1e6


def pdr_mpps(result: Any, name: str) -> float:
    return float(statistics.median(m.result.pdr_pps for m in result.live[name])) / 1e6


def ratio_of(part: float, whole: float) -> float:
    return part / whole if whole > 0 else float("nan")


def fmt(x: float) -> str:
    """Two decimals, or "–" for NaN."""
    return f"{x:.2f}" if x == x else "–"


def share(part: float, whole: float) -> str:
    """part / whole with two decimals, or "–" when whole is not positive."""
    return fmt(ratio_of(part, whole))


def loop_ns(result: Any, name: str) -> float:
    """The median CPU ns per frame of one program's loop over the rounds."""
    return float(statistics.median(c.cpu_ns_per_frame for c in result.loop[name]))
