"""demo_bench.py: the demo's throughput comparison of its encaps: the software bench, cut short.

`l4lab bench`'s own testbed and NDR/PDR search (lab/bench/run.py): live XDP frames from a generator
veth into the balancer, which XDP_TXes each one encapsulated back to a counting sink; 64-byte frames,
1,024 UDP flows, every encap beside the XDP_TX and XDP_DROP floors measured the same way in the same
run. The search is cut to a few seconds a case (short trials, a 10 % bracket): the figures are
coarser than `make bench`'s, and say so in the demo's summary. The result is a `bench` result like
the full bench's, under its own id (demo_bench_ndr_pdr), so the report's throughput section shows
it, labelled with the machine and the generator.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from lab.bench.model import Options, Report
from lab.bench.ndr import SearchSettings
from lab.bench.run import bench

RESULT_ID = "demo_bench_ndr_pdr"
METHOD = ("software bench (live XDP frames on a veth pair, 64-byte UDP frames, 1,024 flows), NDR of a "
          "short search: trials of 0.1 s, then 0.5 s, to a 10 % bracket; `make bench` searches longer")


@dataclass(frozen=True)
class DemoOptions(Options):
    """The bench's options with the demo's short search."""

    def search_settings(self, max_rate: float | None = None) -> SearchSettings:
        return SearchSettings(max_rate_pps=max_rate or self.max_rate_pps, min_rate_pps=1e4, short_s=0.1,
                              full_s=0.5, width=0.1, max_trials=10)


def throughput(say: Callable[[str], None]) -> Report:
    """Measure and write the demo's bench result; `say` gets the bench's lines."""
    opts = DemoOptions(sizes=(64,), parts=("ndr",), result_id=RESULT_ID)
    return bench(opts, say=say)


def table(report: Report) -> list[str]:
    """The demo's throughput lines: NDR and PDR per case, and the NDR's ratio to the XDP_TX floor's."""
    floor = report.ndr.get(("xdp_tx", "64"))
    lines = [f"throughput: {METHOD}", f"  {'case':<11}{'NDR Mpps':>10}{'PDR Mpps':>10}{'NDR ÷ XDP_TX':>14}"]
    for (name, _size), m in report.ndr.items():
        ratio = m.result.ndr_pps / floor.result.ndr_pps if floor and floor.result.ndr_pps else float("nan")
        lines.append(f"  {name:<11}{m.result.ndr_pps / 1e6:10.3f}{m.result.pdr_pps / 1e6:10.3f}{ratio:14.2f}")
    return lines
