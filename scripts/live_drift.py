"""live_drift.py: how far the bench veth's live loop drifts within minutes, and whether the two-thread
rate the NDR search paces follows the single-thread loop costs.

    sudo .venv/bin/python scripts/live_drift.py [PASSES]      # Katran objects: build/katran/ (`l4lab bench --katran`)

Every side-by-side live case (lab/bench/katran_live.py) is loaded once; then, PASSES times (default 2),
for each case: one unpaced loop pinned to CPU 0 and one to CPU 1 (CPU ns per frame), then an unpaced
send from one thread per CPU for 2 s. Printed per case and pass: both loop costs, the rate they
predict (the sum of both CPUs' frames per second), the rate the two threads reached and its share of
the prediction. docs/architecture.md (decisions: "the side-by-side bench's live NDRs in rounds")
quotes a run.
"""

from __future__ import annotations

import sys
from contextlib import ExitStack
from pathlib import Path

from lab.bench import katran_live as live
from lab.bench.testbed import testbed

KATRAN_OBJECTS = Path(__file__).resolve().parents[1] / "build" / "katran"
SEND_S = 2.0


def main(passes: int) -> None:
    objs = {flavour: KATRAN_OBJECTS / f"balancer-{flavour}.o" for flavour in ("ipip", "gue")}
    missing = [str(p) for p in objs.values() if not p.is_file()]
    if missing:
        sys.exit(f"no Katran objects at {', '.join(missing)}: run `l4lab bench --katran PATH` once to build them")
    plan = live.live_plan(["ip4-ipip", "ip4-gue1"])
    with testbed() as bed, ExitStack() as stack:
        loaded = live.load_all(stack, bed, plan, objs, ["l4lab", "katran"], "drift")
        for n in range(passes):
            for case in plan:
                bed.on_lb_program(loaded[case.name].program)
                with live.generator(bed, case) as (gen, flows):
                    c0 = gen.chain_cost(1 << 19, 64, flows, 4, 0).cpu_ns_per_frame
                    c1 = gen.chain_cost(1 << 19, 64, flows, 4, 1).cpu_ns_per_frame
                    sent = gen.run(12e6, SEND_S, 64, flows, 4).sent / SEND_S / 1e6
                predicted = 1e3 / c0 + 1e3 / c1
                print(f"pass {n + 1} {case.name:<17} CPU 0 {c0:6.1f} ns, CPU 1 {c1:6.1f} ns: predict {predicted:5.2f} "
                      f"Mpps; two threads {sent:5.2f} Mpps ({sent / predicted:.2f} of it)", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
