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
    NDR         the zero-loss rate of the bench model's search (lab/bench/model.py)

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
turn, and measures the cases in the seeded order's shuffle (lab/bench/order.py).
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
    repeats,
)
from lab.bench.order import Order, load_order
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


def load_l4lab(stack: ExitStack, case: LiveCase, tag: str) -> Loaded:
    inst = Instance.load(f"{PREFIX}{os.getpid()}-{tag}", [], config=l4lab_config(case),
                         obj=str(OBJECT_DIR / "balancer.o"))
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
    """Loop costs in rounds (programs loaded afresh each round, load order rotated, cases shuffled),
    then each case's NDR search, then the summary lines."""
    plan = live_plan(list(KATRAN_ENCAPS))
    order = Order(result.seed + 1)  # its own stream: a replay of the table alone leaves this one as it was
    frames, rounds = (1 << 18, 2) if opts.quick else (1 << 20, 4)
    cpu = max(os.sched_getaffinity(0))
    with testbed() as bed:
        say(f"live frames on veth, 64 B (lab/bench/testbed.py): CPU time per frame of the whole loop, "
            f"{rounds} rounds × {frames} frames sent unpaced from CPU {cpu}, session tables of {LIVE_LRU:,} "
            "entries per CPU; the SYN flood: every frame a new flow, 10^6 sources:")
        for r in range(rounds):
            first = load_order(["l4lab", "katran"], r)
            with ExitStack() as stack:
                loaded = load_all(stack, bed, plan, objs, first, str(r))
                for case in order.shuffled(list(plan)):
                    result.loop.setdefault(case.name, []).append(loop_round(bed, case, loaded[case.name], frames, cpu))
            result.live_first.append(first[0])
        print_loops(plan, result, say)
        search_all(bed, plan, objs, order, opts, result, say)
    summary(result, say)


def print_loops(plan: list[LiveCase], result: Any, say: Callable[[str], None]) -> None:
    tx_ns = loop_ns(result, "floor:xdp_tx")
    for case in plan:
        say(f"  {case.name:<16} {loop_ns(result, case.name):7.1f} ns/frame  floor ÷ this "
            f"{share(tx_ns, loop_ns(result, case.name))}  (every round: all frames delivered, counters checked)")


def search_all(bed: Testbed, plan: list[LiveCase], objs: dict[str, Path], order: Order, opts: Any, result: Any,
               say: Callable[[str], None]) -> None:
    """Each case's NDR search, in a shuffled order, the programs loaded once more (the next load order)."""
    settings = Options(quick=opts.quick).search_settings()
    say("NDR search (zero loss; on veth a lost frame is one the paced sender could not send in time):")
    with ExitStack() as stack:
        first = load_order(["l4lab", "katran"], len(result.live_first))
        loaded = load_all(stack, bed, plan, objs, first, "ndr")
        for case in order.shuffled(list(plan)):
            got = loaded[case.name]
            bed.on_lb_program(got.program)
            with generator(bed, case) as (gen, flows):
                measured = ndr_point(gen, case.name, 64, flows, 4, settings)
            result.live[case.name] = measured
            result.ndr[case.name] = measured.result.ndr_pps / 1e6
            if case.what == FLOOD and got.sessions is not None:
                result.flood_sessions[case.who] = got.sessions()
        for case in plan:
            measured = result.live[case.name]
            say(f"  {case.name:<16} NDR {result.ndr[case.name]:6.3f} Mpps  PDR {measured.result.pdr_pps / 1e6:6.3f} "
                f"Mpps  ({len(measured.result.trials)} trials{repeats(measured)})")


def summary(result: Any, say: Callable[[str], None]) -> None:
    """The lines scripts read: per encap and for the flood, NDR and loop cost against the XDP_TX floor."""
    floor_ndr, tx_ns = result.ndr["floor:xdp_tx"], loop_ns(result, "floor:xdp_tx")
    for what in [*KATRAN_ENCAPS, FLOOD]:
        ours, theirs = result.ndr[f"l4lab:{what}"], result.ndr[f"katran:{what}"]
        say(f"  {what}: NDR l4lab {share(ours, floor_ndr)} × XDP_TX floor, Katran {share(theirs, floor_ndr)} ×; "
            f"loop cost floor ÷ l4lab {share(tx_ns, loop_ns(result, 'l4lab:' + what))}, "
            f"floor ÷ Katran {share(tx_ns, loop_ns(result, 'katran:' + what))}; "
            f"NDR l4lab ÷ Katran {share(ours, theirs)}")
    if result.flood_sessions:
        say(f"  {FLOOD}: sessions in the tables after its NDR search: "
            + ", ".join(f"{who} {n:,}" for who, n in sorted(result.flood_sessions.items())))
    if floor_ndr <= 0:
        say("  the XDP_TX floor's NDR is 0 (no trial without loss): the machine is too busy for the NDR; "
            "the loop costs above do not depend on it")


def share(part: float, whole: float) -> str:
    """part / whole with two decimals, or "–" when whole is not positive."""
    return f"{part / whole:.2f}" if whole > 0 else "–"


def loop_ns(result: Any, name: str) -> float:
    """The median CPU ns per frame of one program's loop over the rounds."""
    return float(statistics.median(c.cpu_ns_per_frame for c in result.loop[name]))
