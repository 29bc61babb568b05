"""`l4lab bench`: NDR/PDR per encap and frame size beside the floors, plus micro and controller benchmarks.

    l4lab bench [--quick] [--encap ID ...] [--sizes 64,512,imix] [--results DIR]
                [--parts ndr,micro,controller] [--flows N] [--max-rate-mpps X]
    l4lab bench --trex TARGET.toml [--quick] [--encap ID ...] [--sizes ...] [--flows N] [--results DIR]
                [--max-rate-mpps X]

The bench builds its own two-namespace testbed (prefix `bnt-`): a generator namespace whose veth
leads into an LB namespace. The live-frames generator sends UDP flows to a VIP; the program on
the LB veth (the balancer, or a floor program) XDP_TXes each frame back over the same veth pair,
where a counting XDP program on the generator side counts and drops it (it is also the program the
XDP_TX peer rule needs). The XDP_DROP floor counts on the LB side instead. The floors and the
balancer are measured alike: the same generator, the same veths, the same counting sink.

On veth the whole loop runs in the sending thread: after each batch the test run re-enables
softirqs and the LB veth's NAPI (the program under test, its XDP_TX) and then the generator veth's
NAPI (the counter) run right there, on that CPU. Measured here: every frame sent arrives; a trial's
loss is what the paced sender could not send before its deadline. The NDR is therefore the rate
the sending threads sustain through generator, veths, LB program and sink, and it moves with the
CPU share other processes leave them; `l4lab bench --katran` also reports the loop's CPU time per
frame, which does not (lab/bench/katran.py). A trial that lost frames while a sending thread waited
for a CPU longer than the pacer's grace (the thread's run-queue wait, /proc/thread-self/schedstat) is
run again, at most twice; the summary counts those repeats. Both veth ends get one
receive queue per CPU, so each CPU's frames stay on that CPU from generator to counter (one shared
queue loses frames between two producing CPUs at any rate). Two idle veth pairs in the generator
namespace hold the generator's programs attached, which keeps each test run from re-patching the
kernel's XDP dispatcher (lab/bench/gen/xdplive.py says why that matters).

Per frame size, the floors (MAC-swap XDP_TX, XDP_DROP) and every encap are measured in the same
run by the same NDR/PDR search; the figures print with their ratio to the XDP_TX floor and the
target beside them (IPIP ≥ 0.85 ×, GUE ≥ 0.8 ×: printed, never asserted). Then the datapath
test-run micro-benchmark (ns/packet, repeat = 1 runs: repeat > 1 would feed each run the previous
output) and the controller benchmarks (Maglev ring builds, a full and an incremental apply).

Results: one `bench` result (reports/schema.py) with every point and trial, the micro figures and
the controller figures, and latency at 10/50/90 % of PDR where the generator measures it (TRex).

With `--trex TARGET.toml` the same NDR/PDR search runs on hardware instead: a TRex server and the
LB host a target file names, reached over SSH (lab/bench/trex.py).
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from balancer.encaps import IP4_GUE0, IP4_GUE1, IP4_IPIP, IP6_GUE1, IP6_IP6IP6, SAME_FAMILY, EncapCase
from lab.bench.gen.base import Family, FrameSpec, Generator, Latency, TrialResult, mean_frame_size
from lab.bench.ndr import SearchResult, SearchSettings, latency_rates, search
from lab.errors import LabError
from lab.progress import BenchProgress

OBJECT_DIR = Path(__file__).resolve().parents[2] / "build" / "bpf"
PREFIX = "bnt-"
GEN_IF = "bnt-g"
LB_IF = "bnt-l"
# Idle veth ends in the generator namespace where the generator parks its programs (IMIX uses 3).
PARK_IFS = ("bnt-p0", "bnt-p1", "bnt-p2", "bnt-p3")
GEN_MAC = "02:00:00:00:0b:01"
LB_MAC = "02:00:00:00:0b:02"
LINK_MTU = 1600  # above the largest frame plus the largest encap (1518 + 48)
VIP4, VIP6, VIP_PORT = "198.51.100.100", "2001:db8:100::100", 9000
REALS4 = tuple(f"203.0.113.{i}" for i in (18, 34, 50, 66))
REALS6 = tuple(f"2001:db8:e{i}::2" for i in (1, 2, 3, 4))
XDP_TX = 3


# The encap cases benched (id -> case, from balancer/encaps.py) and the NDR ÷ XDP_TX floor each aims for.
ENCAPS: dict[str, EncapCase] = {c.id: c for c in SAME_FAMILY}
TARGETS: dict[str, float] = {IP4_IPIP: 0.85, IP4_GUE1: 0.8, IP4_GUE0: 0.8, IP6_IP6IP6: 0.85, IP6_GUE1: 0.8}
PARTS = ("ndr", "micro", "controller")
FULL_SIZES: tuple[FrameSpec, ...] = (64, 128, 256, 512, 1024, 1280, 1518, "imix")
QUICK_SIZES: tuple[FrameSpec, ...] = (64,)


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


# --- the testbed ----------------------------------------------------------------------------------


def _run(argv: Sequence[str], what: str) -> None:
    done = subprocess.run(list(argv), capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise LabError(f"cannot {what}: '{' '.join(argv)}' failed: {done.stderr.strip()}",
                       step=what, command=" ".join(argv), stderr=done.stderr)


def _object(name: str) -> str:
    path = OBJECT_DIR / name
    if not path.is_file():
        raise LabError(f"BPF object {path} does not exist; run `make bpf`")
    return str(path)


class Testbed:
    """The bench's two namespaces, the veth between them, the counters and the balancer instance."""

    def __init__(self, stack: ExitStack, cpus: int) -> None:
        from balancer.libbpf import BpfObject

        self.stack = stack
        tag = f"{PREFIX}{os.getpid()}"
        self.gen_ns, self.lb_ns = f"{tag}-gen", f"{tag}-lb"
        self.instance_name = tag
        for ns in (self.gen_ns, self.lb_ns):
            _run(["ip", "netns", "add", ns], f"create netns {ns}")
            stack.callback(_delete_netns, ns)
        queues = ["numtxqueues", str(cpus), "numrxqueues", str(cpus)]
        _run(["ip", "link", "add", "name", GEN_IF, "netns", self.gen_ns, "address", GEN_MAC,
              "mtu", str(LINK_MTU), *queues, "type", "veth", "peer", "name", LB_IF, "netns", self.lb_ns,
              "address", LB_MAC, "mtu", str(LINK_MTU), *queues], "create the bench veth pair")
        for a, b in zip(PARK_IFS[::2], PARK_IFS[1::2], strict=True):
            _run(["ip", "link", "add", "name", a, "netns", self.gen_ns, "type", "veth", "peer", "name", b,
                  "netns", self.gen_ns], "create the generator's parking veths")
        for ns, ifname in ((self.gen_ns, GEN_IF), (self.lb_ns, LB_IF)):
            # No IPv6 on the link: the stack's own ND/MLD frames would be counted as received.
            _run(_ns(ns, ["sysctl", "-qw", f"net.ipv6.conf.{ifname}.disable_ipv6=1"]), f"quiet {ifname}")
            _run(_ns(ns, ["ip", "link", "set", ifname, "up"]), f"bring {ifname} up")
        self.gen_counter = BpfObject(_object("floor.o"))
        stack.callback(self.gen_counter.close)
        self.gen_counter.load()
        self.lb_floor = BpfObject(_object("floor.o"))
        stack.callback(self.lb_floor.close)
        self.lb_floor.load()
        self._attach(self.gen_ns, GEN_IF, self.gen_counter.program("xdp_drop"))
        self._lb_link: Any = None
        self.instance: Any = None

    def _attach(self, ns: str, ifname: str, prog: Any) -> Any:
        from lab.nsexec import entered

        with entered(ns):
            link = prog.attach_xdp(socket.if_nametoindex(ifname), "native", ifname)
        self.stack.callback(link.close)
        return link

    def load_balancer(self, obj: Path | None = None) -> None:
        """The balancer instance (build/bpf/balancer.o, or obj), loaded once."""
        from balancer.controller import Instance

        if self.instance is None:
            self.instance = Instance.load(self.instance_name, [], config=lb_config(IP4_IPIP),
                                          obj=str(obj) if obj else _object("balancer.o"))
            self.stack.callback(self.instance.unload)

    def on_lb(self, what: str) -> None:
        """Put `what` on the LB veth: "balancer", "xdp_tx_swap" or "xdp_drop"."""
        if what == "balancer":
            self.load_balancer()
            prog = self.instance.dp.programs["balancer_xdp"]
        else:
            prog = self.lb_floor.program(what)
        self.on_lb_program(prog)

    def on_lb_program(self, prog: Any) -> None:
        """Put any loaded XDP program on the LB veth (e.g. Katran's, lab/bench/katran.py)."""
        if self._lb_link is not None:
            self._lb_link.close()
            self._lb_link = None
        self._lb_link = self._attach(self.lb_ns, LB_IF, prog)

    def gen_count(self) -> int:
        return _count(self.gen_counter)

    def lb_count(self) -> int:
        return _count(self.lb_floor)


def _count(obj: Any) -> int:
    from lab.bench.gen.xdplive import percpu_total

    return percpu_total(obj.map("fl_count").lookup_percpu(b"\0" * 4))


def _ns(ns: str, argv: list[str]) -> list[str]:
    from lab.nsexec import nsenter_argv

    return nsenter_argv(ns, argv)


def _delete_netns(ns: str) -> None:
    done = subprocess.run(["ip", "netns", "del", ns], capture_output=True, text=True, check=False)
    if done.returncode != 0 and "No such file" not in done.stderr:
        raise LabError(f"cannot delete netns {ns}: {done.stderr.strip()}", step="teardown")


def lb_config(case: str, vips: int = 1, reals: int = 4, weight_bump: int = 0, max_vips: int = 4,
              max_reals: int = 64, *, ifname: str = LB_IF, nexthop_mac: str = GEN_MAC,
              mtu: int = LINK_MTU) -> Any:
    """The balancer config for one encap id: `vips` UDP VIPs of the case's family, `reals` reals each.

    `weight_bump` raises the first real's weight in the first VIP (an incremental change). The
    reals need not exist: every encapsulated frame goes to `nexthop_mac` out of `ifname`.
    """
    from balancer import config as cfg

    c = ENCAPS[case]
    base = VIP4 if c.vip_family == 4 else VIP6
    addrs = _real_addresses(c.vip_family, reals)
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


def _real_addresses(family: int, n: int) -> list[str]:
    if n <= len(REALS4):
        return list(REALS4[:n] if family == 4 else REALS6[:n])
    if family == 4:
        return [f"203.0.{113 + i // 250}.{1 + i % 250}" for i in range(n)]
    return [f"2001:db8:e0::{i + 1:x}" for i in range(n)]


# --- the parts --------------------------------------------------------------------------------------


def _size_label(size: FrameSpec) -> str:
    return str(size)


def _generator(bed: Testbed, sink: Callable[[], int]) -> Any:
    from lab.bench.gen.base import Endpoints
    from lab.bench.gen.xdplive import XdpLiveGenerator

    ep = Endpoints(src_mac=GEN_MAC, dst_mac=LB_MAC, dst4=VIP4, dst6=VIP6, dport=VIP_PORT)
    return XdpLiveGenerator(bed.gen_ns, GEN_IF, ep, sink, park_ifnames=PARK_IFS,
                            object_path=_object("trafficgen.o"))


def measure_ndr(bed: Testbed, opts: Options, report: Report, say: Callable[[str], None]) -> None:
    """Floors and every encap, per frame size, in this one run."""
    plan: list[tuple[str, str, Family]] = [("xdp_drop", "xdp_drop", 4), ("xdp_tx", "xdp_tx_swap", 4)]
    plan += [(case, "balancer", ENCAPS[case].vip_family) for case in opts.encaps]
    progress = BenchProgress(len(plan) * len(opts.sizes), opts.search_settings().max_trials)
    for size in opts.sizes:
        max_rate = opts.max_rate_pps * min(1.0, 256 / max(256.0, mean_frame_size(size)) * 2)
        for name, program, family in plan:
            bed.on_lb(program)
            if program == "balancer":
                bed.instance.apply(lb_config(name))
            sink = bed.lb_count if program == "xdp_drop" else bed.gen_count
            progress.start_point(name, _size_label(size))
            with _generator(bed, sink) as gen:
                measured = ndr_point(gen, name, size, opts.flows, family, opts.search_settings(max_rate),
                                     on_trial=progress.trial)
            progress.end_point()
            report.ndr[(name, _size_label(size))] = measured
            outcome = measured.result
            say(f"  {name:<11} {_size_label(size):>5}  NDR {outcome.ndr_pps / 1e6:6.3f} Mpps  "
                f"PDR {outcome.pdr_pps / 1e6:6.3f} Mpps  ({len(outcome.trials)} trials{repeats(measured)})")


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


def measure_micro(bed: Testbed, opts: Options, report: Report) -> None:
    """ns/packet of the balancer per encap and of the floors, from repeat = 1 test runs."""
    from lab.bench.gen.base import Endpoints, build_frame

    runs = 2000 if opts.quick else opts.micro_runs
    ep = Endpoints(src_mac=GEN_MAC, dst_mac=LB_MAC, dst4=VIP4, dst6=VIP6, dport=VIP_PORT)
    frame4 = build_frame(64, 4, ep)
    report.micro_ns["xdp_drop"] = _ns_per_packet(bed.lb_floor.program("xdp_drop"), frame4, runs, 1)
    report.micro_ns["xdp_tx"] = _ns_per_packet(bed.lb_floor.program("xdp_tx_swap"), frame4, runs, XDP_TX)
    bed.load_balancer()
    for case in opts.encaps:
        bed.instance.apply(lb_config(case))
        frame = build_frame(64, ENCAPS[case].vip_family, ep)
        report.micro_ns[case] = _ns_per_packet(bed.instance.dp.programs["balancer_xdp"], frame, runs, XDP_TX)


def _ns_per_packet(prog: Any, frame: bytes, runs: int, want: int) -> float:
    first = prog.test_run(frame)
    if first.retval != want:
        raise LabError(f"test run of '{prog.name}' on the bench frame returned action {first.retval}, "
                       f"expected {want}; check the balancer's reason counters (lbctl stats)")
    total = 0
    for _ in range(runs):
        total += prog.test_run(frame).duration_ns
    return total / runs


def measure_controller(opts: Options, report: Report) -> None:
    """Maglev ring builds for 10/100/1000 reals, a full apply and an incremental apply."""
    from balancer import maglev
    from balancer.controller import Instance

    builds: dict[str, float] = {}
    for n in (10, 100, 1000):
        reals = {i + 1: (a, 1) for i, a in enumerate(_real_addresses(4, n))}
        times = []
        for _ in range(1 if opts.quick else 3):
            maglev.clear_cache()  # the figure is the fill, not a cache hit
            t0 = time.perf_counter()
            maglev.build_ring(reals, maglev.DEFAULT_RING_SIZE)
            times.append(time.perf_counter() - t0)
        builds[str(n)] = min(times) * 1e3
    report.controller["ring_build_ms"] = builds
    vips, reals_n = 8, 100
    name = f"{PREFIX}{os.getpid()}-ctl"
    size: dict[str, Any] = {"max_vips": 16, "max_reals": 256}
    inst = Instance.load(name, [], config=lb_config(IP4_IPIP, vips=1, reals=1, **size),
                         obj=_object("balancer.o"))
    try:
        full = lb_config(IP4_IPIP, vips=vips, reals=reals_n, **size)
        t0 = time.perf_counter()
        full_report = inst.apply(full)
        t_full = time.perf_counter() - t0
        t0 = time.perf_counter()
        inc_report = inst.apply(lb_config(IP4_IPIP, vips=vips, reals=reals_n, weight_bump=1, **size))
        t_inc = time.perf_counter() - t0
    finally:
        inst.unload()
    report.controller["full_apply"] = {"vips": vips, "reals": reals_n, "ms": t_full * 1e3,
                                       "ring_slots": full_report.ring_slots}
    report.controller["incremental_apply"] = {"change": "one real's weight 1 → 2 in one VIP",
                                              "ms": t_inc * 1e3, "ring_slots": inc_report.ring_slots}


# --- results and printing --------------------------------------------------------------------------


def latency_figures(m: Measured) -> list[Any]:
    """The schema's latency figures of one search: share of PDR, the rate it ran at, min/avg/max µs."""
    from reports.schema import LatencyFigure

    figures = []
    for key, lat in sorted(m.latency.items(), key=lambda kv: int(kv[0].rstrip("%"))):
        share = int(key.rstrip("%"))
        figures.append(LatencyFigure(share_of_pdr=share, rate_mpps=m.result.pdr_pps * share / 100 / 1e6,
                                     min_us=lat.min_us, avg_us=lat.avg_us, max_us=lat.max_us,
                                     p50_us=lat.p50_us, p99_us=lat.p99_us))
    return figures


def bench_payload(report: Report, sizes: Sequence[FrameSpec], encaps: Sequence[str]) -> Any:
    from reports.schema import BenchPayload, BenchPoint, ControllerFigure, Floor, MicroFigure, Nic, Trial

    points = []
    for size in sizes:
        label = _size_label(size)
        tx, drop = report.ndr.get(("xdp_tx", label)), report.ndr.get(("xdp_drop", label))
        floor = Floor(xdp_tx_mpps=tx.result.ndr_pps / 1e6 if tx else 0.0,
                      xdp_drop_mpps=drop.result.ndr_pps / 1e6 if drop else 0.0)
        for case in encaps:
            m = report.ndr.get((case, label))
            if m is None:
                continue
            trials = [Trial(rate_mpps=t.rate_pps / 1e6, loss=t.loss, duration_s=t.duration_s)
                      for t in m.result.trials]
            points.append(BenchPoint(encap=case, frame_size=size, ndr_mpps=m.result.ndr_pps / 1e6,  # type: ignore[arg-type]
                                     pdr_mpps=m.result.pdr_pps / 1e6, floor=floor,
                                     egress_overhead_bytes=ENCAPS[case].overhead, trials=trials,
                                     latency=latency_figures(m)))
    micro = [MicroFigure(case=name, ns_per_packet=round(ns, 2)) for name, ns in report.micro_ns.items()]
    controller = []
    if report.controller:
        for n, ms in report.controller["ring_build_ms"].items():
            controller.append(ControllerFigure(name=f"Maglev ring build, {n} reals", ms=round(ms, 3)))
        for key, label in (("full_apply", "full apply"), ("incremental_apply", "incremental apply")):
            fig = report.controller[key]
            controller.append(ControllerFigure(name=label, ms=round(fig["ms"], 3), ring_slots=fig["ring_slots"]))
    return BenchPayload(generator=report.generator, egress_mtu=report.egress_mtu, points=points,  # type: ignore[arg-type]
                        micro=micro, controller=controller, nic=Nic(**report.nic) if report.nic else None)


def summary_lines(report: Report, opts: Options) -> list[str]:
    """The figures with the XDP_TX-floor ratio and the target beside them."""
    lines: list[str] = []
    if report.ndr:
        lines.append(f"{'case':<11} {'size':>5} {'NDR Mpps':>9} {'PDR Mpps':>9} {'÷ XDP_TX':>9} "
                     f"{'target':>7}  met")
        for size in opts.sizes:
            label = _size_label(size)
            tx = report.ndr.get(("xdp_tx", label))
            floor = tx.result.ndr_pps if tx else 0.0
            for name in ("xdp_drop", "xdp_tx", *opts.encaps):
                m = report.ndr.get((name, label))
                if m is None:
                    continue
                ratio = m.result.ndr_pps / floor if floor else float("nan")
                goal = TARGETS.get(name)
                target = f"{goal:.2f}" if goal else "-"
                met = ("yes" if ratio >= goal else "no") if goal and floor else "-"
                lines.append(f"{name:<11} {label:>5} {m.result.ndr_pps / 1e6:9.3f} "
                             f"{m.result.pdr_pps / 1e6:9.3f} {ratio:9.2f} {target:>7}  {met}")
        with_latency = [(key, m) for key, m in report.ndr.items() if m.latency]
        if with_latency:
            lines.append("latency (µs, min/avg/max) at 10/50/90 % of PDR:")
        for (name, label), m in with_latency:
            lines.append(f"  {name:<11} {label:>5}  " + "   ".join(
                f"{share} {lat.min_us:.1f}/{lat.avg_us:.1f}/{lat.max_us:.1f}" for share, lat in m.latency.items()))
    if report.micro_ns:
        tx_ns = report.micro_ns.get("xdp_tx", 0.0)
        lines.append("test-run micro-benchmark, 64-byte frames, repeat = 1:")
        for name, ns in report.micro_ns.items():
            rel = f"  ({ns / tx_ns:.2f} × XDP_TX)" if tx_ns else ""
            lines.append(f"  {name:<11} {ns:8.1f} ns/packet{rel}")
    if report.controller:
        rb = report.controller["ring_build_ms"]
        lines.append("controller: Maglev ring (65537 slots) build " +
                     ", ".join(f"{n} reals {ms:.1f} ms" for n, ms in rb.items()))
        fa, ia = report.controller["full_apply"], report.controller["incremental_apply"]
        lines.append(f"  full apply ({fa['vips']} VIPs × {fa['reals']} reals) {fa['ms']:.1f} ms, "
                     f"{fa['ring_slots']} ring slots; incremental apply ({ia['change']}) {ia['ms']:.1f} ms, "
                     f"{ia['ring_slots']} ring slots")
    return lines


def write_results(report: Report, opts: Options) -> None:
    from reports.schema import case_id, results_dir, write_result

    if report.ndr or report.micro_ns or report.controller:
        rid = case_id(opts.result_id, None, "quick") if opts.quick else case_id(opts.result_id)
        report.results_file = write_result("bench", rid, bench_payload(report, opts.sizes, opts.encaps),
                                           results_dir(opts.results))


# --- entry points ----------------------------------------------------------------------------------


def check_environment() -> None:
    """Raise LabError naming what is missing: root, bpffs, the built objects."""
    if os.geteuid() != 0:
        raise LabError("l4lab bench needs root (it creates namespaces and loads BPF programs); "
                       "run it with sudo")
    if not os.path.ismount("/sys/fs/bpf"):
        raise LabError("bpffs is not mounted on /sys/fs/bpf; run `make deps` "
                       "or `mount -t bpf bpf /sys/fs/bpf`")
    for name in ("balancer.o", "floor.o", "trafficgen.o"):
        _object(name)


@contextmanager
def testbed() -> Iterator[Testbed]:
    """The bench testbed, removed on the way out even when a measurement fails."""
    with ExitStack() as stack:
        yield Testbed(stack, max(1, len(os.sched_getaffinity(0))))


def bench(opts: Options, say: Callable[[str], None] = print) -> Report:
    """Run the parts asked for, print the summary, write the results; returns what was measured."""
    check_environment()
    report = Report()
    started = time.monotonic()
    if "ndr" in opts.parts or "micro" in opts.parts:
        with testbed() as bed:
            if "ndr" in opts.parts:
                say(f"NDR/PDR search ({'quick' if opts.quick else 'full'}), {opts.flows} flows:")
                measure_ndr(bed, opts, report, say)
            if "micro" in opts.parts:
                measure_micro(bed, opts, report)
    if "controller" in opts.parts:
        measure_controller(opts, report)
    return finish(report, opts, started, say)


def finish(report: Report, opts: Options, started: float, say: Callable[[str], None]) -> Report:
    """Print the summary, write the results file and say where and how long it took."""
    for line in summary_lines(report, opts):
        say(line)
    write_results(report, opts)
    if report.results_file is not None:
        say(f"wrote {report.results_file}")
    say(f"bench took {time.monotonic() - started:.0f} s (targets are printed, never asserted)")
    return report
