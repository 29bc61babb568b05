"""live_ab.py: two balancer objects on the bench veth, each pass in a new order: the rate of an unpaced
send from one thread per CPU (the threads the NDR search paces) and one thread's loop cost.

    sudo .venv/bin/python scripts/live_ab.py BASE.o CHANGED.o [--encap ID] [--passes N] [--seed S]

Both objects are loaded once with the side-by-side bench's live config (lab/bench/katran_live.py: 1,024
UDP flows to one VIP, 65,536 session entries per CPU); in every pass each, in a seeded shuffle, gets a
loop of 2^19 frames on the last CPU, then a 2 s unpaced send from both CPUs. Printed per pass and at the
end: CHANGED's two-thread rate over BASE's, median and range over the passes. A change that only
one CPU's loop cannot show (two CPUs writing the same lines) shows here. docs/architecture.md
(decisions) quotes its runs.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
from contextlib import ExitStack

from lab.bench import katran_live as live
from lab.bench.testbed import live_generator, testbed

SEND_S = 2.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("base")
    ap.add_argument("changed")
    ap.add_argument("--encap", default="ip4-ipip")
    ap.add_argument("--passes", type=int, default=10)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    case = live.LiveCase("l4lab", args.encap)
    objs = {"base": args.base, "changed": args.changed}
    rng = random.Random(args.seed)
    rate: dict[str, list[float]] = {k: [] for k in objs}
    loop: dict[str, list[float]] = {k: [] for k in objs}
    cpu = max(os.sched_getaffinity(0))
    with testbed() as bed, ExitStack() as stack:
        programs = {name: live.load_l4lab(stack, case, name, obj).program for name, obj in objs.items()}
        for n in range(args.passes):
            order = list(objs)
            rng.shuffle(order)
            for name in order:
                bed.on_lb_program(programs[name])
                with live_generator(bed, bed.gen_count) as gen:
                    loop[name].append(gen.chain_cost(1 << 19, 64, live.UDP_FLOWS, 4, cpu).cpu_ns_per_frame)
                    rate[name].append(gen.run(12e6, SEND_S, 64, live.UDP_FLOWS, 4).received / SEND_S / 1e6)
            print(f"pass {n + 1}: " + ", ".join(f"{k} {rate[k][-1]:.2f} Mpps two threads, {loop[k][-1]:.0f} ns "
                                                  "one thread" for k in objs), flush=True)
    ratios = [c / b for c, b in zip(rate["changed"], rate["base"], strict=True)]
    print(f"{args.encap}: changed / base two-thread rate, median {statistics.median(ratios):.3f}, range "
          f"{min(ratios):.3f}-{max(ratios):.3f} over {args.passes} passes; one thread's loop (median) base "
          f"{statistics.median(loop['base']):.0f} ns, changed {statistics.median(loop['changed']):.0f} ns")


if __name__ == "__main__":
    main()
