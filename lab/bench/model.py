"""The bench model: what a bench measures and how one NDR point is searched, whatever runs it.

The software bench (run.py), TRex on hardware (trex.py) and Katran side by side (katran.py,
katran_live.py) share it: the encap cases and their targets, the frame sizes, the bench's VIPs and
reals with the balancer config that serves them (`lb_config`), the options, one NDR/PDR point with
its disturbed-trial repeats (`ndr_point`) and the report a run fills. The software testbed is
testbed.py; the results file and the printed summary are results.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from balancer import config as cfg
from balancer.encaps import IP4_GUE0, IP4_GUE1, IP4_IPIP, IP6_GUE1, IP6_IP6IP6, SAME_FAMILY, EncapCase
from lab.bench.gen.base import Family, FrameSpec, Generator, Latency, TrialResult
from lab.bench.ndr import SearchResult, SearchSettings, latency_rates, search

# The software testbed's link (testbed.py), which lb_config addresses by default.
GEN_IF = "bnt-g"
LB_IF = "bnt-l"
GEN_MAC = "02:00:00:00:0b:01"
LB_MAC = "02:00:00:00:0b:02"
LINK_MTU = 1600  # above the largest frame plus the largest encap (1518 + 48)
VIP4, VIP6, VIP_PORT = "198.51.100.100", "2001:db8:100::100", 9000
REALS4 = tuple(f"203.0.113.{i}" for i in (18, 34, 50, 66))
REALS6 = tuple(f"2001:db8:e{i}::2" for i in (1, 2, 3, 4))

# The encap cases benched (id -> case, from balancer/encaps.py) and the NDR ÷ XDP_TX floor each aims for.
ENCAPS: dict[str, EncapCase] = {c.id: c for c in SAME_FAMILY}
TARGETS: dict[str, float] = {IP4_IPIP: 0.85, IP4_GUE1: 0.8, IP4_GUE0: 0.8, IP6_IP6IP6: 0.85, IP6_GUE1: 0.8}
PARTS = ("ndr", "micro", "controller")
FULL_SIZES: tuple[FrameSpec, ...] = (64, 128, 256, 512, 1024, 1280, 1518, "imix")
QUICK_SIZES: tuple[FrameSpec, ...] = (64,)

# The encaps benched against Katran, each with the Katran build (flavour) that encapsulates it.
KATRAN_ENCAPS: dict[str, str] = {IP4_IPIP: "ipip", IP4_GUE1: "gue"}


@dataclass(frozen=True)
class Options:
    """What to measure and how long to try."""

    encaps: tuple[str, ...] = tuple(ENCAPS)
    sizes: tuple[FrameSpec, ...] = FULL_SIZES
    parts: tuple[str, ...] = PARTS
    results: Path | None = None
    flows: int = 1024
    quick: bool = False
    max_rate_pps: float = 12e6
    micro_runs: int = 20000
    result_id: str = "bench_ndr_pdr"
    trex: Path | None = None  # a target file: the hardware bench (lab/bench/trex.py)
    max_rate_given: bool = False  # --max-rate-mpps was given (the hardware bench else uses line rate)

    def search_settings(self, max_rate: float | None = None) -> SearchSettings:
        top = max_rate or self.max_rate_pps
        if self.quick:
            return SearchSettings(max_rate_pps=top, min_rate_pps=1e4, short_s=0.2, full_s=1.0, width=0.05,
                                  max_trials=14)
        return SearchSettings(max_rate_pps=top, min_rate_pps=1e4, short_s=0.5, full_s=5.0, width=0.02,
                              max_trials=30)


@dataclass
class Measured:
    """One search's outcome for printing and the results file, with latency where the generator measures it."""

    name: str
    size: FrameSpec
    result: SearchResult
    latency: dict[str, Latency] = field(default_factory=dict)  # "10%" / "50%" / "90%" of PDR → latency
    repeated: int = 0  # trials run again because a sender waited for a CPU (DISTURBED_WAIT)


@dataclass
class Report:
    """Everything one bench run measured."""

    ndr: dict[tuple[str, str], Measured] = field(default_factory=dict)  # (case, size label) → search
    micro_ns: dict[str, float] = field(default_factory=dict)
    controller: dict[str, Any] = field(default_factory=dict)
    results_file: Path | None = None
    generator: str = "xdp-live"  # the results' generator (reports/schema.py BenchPayload)
    egress_mtu: int = LINK_MTU  # MTU of the LB's egress link
    nic: dict[str, Any] | None = None  # hardware runs: reports/schema.py Nic fields


def lb_config(case: str, vips: int = 1, reals: int = 4, weight_bump: int = 0, max_vips: int = 4,
              max_reals: int = 64, *, ifname: str = LB_IF, nexthop_mac: str = GEN_MAC,
              mtu: int = LINK_MTU) -> Any:
    """The balancer config for one encap id: `vips` UDP VIPs of the case's family, `reals` reals each.

    `weight_bump` raises the first real's weight in the first VIP (an incremental change). The
    reals need not exist: every encapsulated frame goes to `nexthop_mac` out of `ifname`.
    """
    c = ENCAPS[case]
    base = VIP4 if c.vip_family == 4 else VIP6
    addrs = real_addresses(c.vip_family, reals)
    vip_list = []
    for v in range(vips):
        entries = [{"address": a, "weight": 1 + (weight_bump if (v, i) == (0, 0) else 0)}
                   for i, a in enumerate(addrs)]
        vip_list.append({"address": base, "port": VIP_PORT + v, "proto": "udp", "encap": c.config_name,
                         "reals": entries})
    return cfg.parse({
        "datapath": {"interfaces": [ifname], "mtu": mtu, "max_vips": max(max_vips, vips + 1),
                     "max_reals": max(max_reals, reals + 1)},
        "encap": {"nexthop_mac": nexthop_mac, "src4": "198.51.100.128/25", "src6": "2001:db8:1b:80::/64"},
        "vips": vip_list,
    }, f"<bench config {case}>")


def real_addresses(family: int, n: int) -> list[str]:
    """n reals' addresses of a family: the bench's four, else as many as asked from the documentation ranges."""
    if n <= len(REALS4):
        return list(REALS4[:n] if family == 4 else REALS6[:n])
    if family == 4:
        return [f"203.0.{113 + i // 250}.{1 + i % 250}" for i in range(n)]
    return [f"2001:db8:e0::{i + 1:x}" for i in range(n)]


def size_label(size: FrameSpec) -> str:
    """A frame size as the results and the summary name it: "64", "imix"."""
    return str(size)


# A trial that lost frames while a sending thread waited for a CPU longer than the pacer's grace
# (2 % of the trial) measured the other processes on the machine, not the loop: it is run again, at
# most REPEATS more times, and the last run counts.
DISTURBED_WAIT = 0.02
REPEATS = 2


def disturbed(result: TrialResult, duration: float) -> bool:
    """Whether a lossy trial's sender waited for a CPU long enough to explain the loss."""
    return result.loss > 0 and result.waited is not None and result.waited > DISTURBED_WAIT * duration


def ndr_point(gen: Generator, name: str, size: FrameSpec, flows: int, family: Family,
              settings: SearchSettings, on_trial: Callable[[float, float, float], None] | None = None) -> Measured:
    """One NDR/PDR search with any generator, then latency at 10/50/90 % of PDR if it measures latency.

    on_trial(rate_pps, duration_s, loss) is told each trial's outcome (progress on a terminal)."""
    measures_latency = False
    repeated = 0

    def trial(rate: float, duration: float) -> float:
        nonlocal measures_latency, repeated
        for attempt in range(1 + REPEATS):
            result = gen.run(rate, duration, size, flows, family)
            if not disturbed(result, duration) or attempt == REPEATS:
                break
            repeated += 1
        measures_latency = measures_latency or result.latency is not None
        if on_trial is not None:
            on_trial(rate, duration, result.loss)
        return result.loss

    outcome = search(trial, settings)
    measured = Measured(name, size, outcome, repeated=repeated)
    if measures_latency and outcome.pdr_pps > 0:
        for share, rate in zip((10, 50, 90), latency_rates(outcome.pdr_pps), strict=True):
            lat = gen.run(rate, settings.full_s, size, flows, family).latency
            if lat is not None:
                measured.latency[f"{share}%"] = lat
    return measured


def repeats(m: Measured) -> str:
    """", n repeated" when trials were run again because a sender waited for a CPU, else ""."""
    return f", {m.repeated} repeated: a sender waited for a CPU" if m.repeated else ""
