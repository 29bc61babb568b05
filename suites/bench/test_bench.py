"""`l4lab bench` end to end, quick: the testbed, the generator through it, results that validate; no speed asserted.

The benchmark prints its figures and writes results; it asserts only what can fail without saying
anything about speed: frames come back, every point has its floor and trials, the results file
passes the schema, and nothing of the testbed is left behind.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from lab.bench import cli as bench_cli
from lab.bench import model, testbed
from lab.bench import run as bench_run
from lab.bench.gen.base import Family, FrameSpec, Generator, Latency, TrialResult
from lab.bench.ndr import SearchSettings
from lab.errors import UsageError
from lab.harness import poll
from lab.harness.signalled import signal_inside_popen, signal_when
from lab.signals import sigterm_unwinds
from reports.schema import BenchPayload, parse_result, results_dir

REPO = Path(__file__).resolve().parents[2]


def _needs_root_and_build() -> None:
    if os.geteuid() != 0:
        pytest.skip("the bench needs root (network namespaces, BPF): run as root, e.g. sudo make test")
    if not os.path.ismount("/sys/fs/bpf"):
        pytest.skip("bpffs is not mounted on /sys/fs/bpf: run make deps")
    missing = [o for o in ("balancer.o", "floor.o", "trafficgen.o") if not (testbed.OBJECT_DIR / o).exists()]
    if missing:
        pytest.skip(f"BPF objects missing ({', '.join(missing)}): run make bpf")


def _leftovers(pid: int | None = None) -> list[str]:
    tag = f"{testbed.PREFIX}{pid or os.getpid()}"
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    left = [line.split()[0] for line in names.splitlines() if line.startswith(tag)]
    left += [str(p) for p in Path("/sys/fs/bpf/lbctl").glob(f"{tag}*")]
    return left


@pytest.mark.parametrize("family", [4, 6])
@pytest.mark.parametrize("size", [64, "imix"])
def test_generator_frames_come_back_through_the_xdp_tx_floor(family: int, size: int | str) -> None:
    _needs_root_and_build()
    try:
        with testbed.testbed() as bed:
            bed.on_lb("xdp_tx_swap")
            with testbed.live_generator(bed, bed.gen_count) as gen:
                result = gen.run(50_000, 0.2, size, 64, family)  # type: ignore[arg-type]
            print(f"IPv{family} {size}: {result}")
            # The rate itself is the pacing unit tests' business; a machine busy with other work
            # may delay a thread, so only ask that most frames went and that what went came back.
            assert result.offered == 10_000 and result.sent >= 5_000, result
            assert 0.95 * result.sent <= result.received <= result.sent, result
            assert bed.lb_count() >= result.received  # the LB side saw each frame it sent back
    finally:
        assert _leftovers() == []


@pytest.mark.parametrize("program", ["xdp_tx_swap", "balancer"])
def test_the_live_loop_runs_in_the_sender_so_every_frame_sent_arrives(program: str) -> None:
    """The premise of the loop cost (lab/bench/katran.py): unpaced, nothing is lost in flight on veth."""
    _needs_root_and_build()
    try:
        with testbed.testbed() as bed:
            bed.on_lb(program)
            with testbed.live_generator(bed, bed.gen_count) as gen:
                cost = gen.chain_cost(1 << 15, 64, 1024, 4, max(os.sched_getaffinity(0)))
            print(f"{program}: {cost.cpu_ns_per_frame:.0f} CPU ns per frame, {cost}")
            assert cost.received == cost.frames == 1 << 15, cost
            assert cost.cpu_s > 0, cost
            if program == "balancer":
                assert bed.instance.dp.events()["LRU_HIT"] > 0, "the frames were balanced, sessions hit"
    finally:
        assert _leftovers() == []


def test_quick_bench_writes_results_that_validate(capsys: pytest.CaptureFixture[str]) -> None:
    _needs_root_and_build()
    opts = model.Options(encaps=("ip4-ipip", "ip6-gue1"), sizes=(64,), quick=True, result_id="test_bench_quick")
    try:
        report = bench_run.bench(opts)
    finally:
        assert _leftovers() == []
    out = capsys.readouterr().out
    print(out)
    for name in ("xdp_drop", "xdp_tx", "ip4-ipip", "ip6-gue1", "ns/packet", "Maglev ring", "target"):
        assert name in out
    assert report.results_file is not None and report.results_file.parent == results_dir()
    result = parse_result(json.loads(report.results_file.read_text()), report.results_file)
    assert result.id == "test_bench_quick[quick]"
    payload = result.payload
    assert isinstance(payload, BenchPayload) and payload.generator == "xdp-live"
    assert [(p.encap, p.frame_size) for p in payload.points] == [("ip4-ipip", 64), ("ip6-gue1", 64)]
    for point in payload.points:
        assert point.trials and point.trials[0].rate_mpps == pytest.approx(opts.max_rate_pps / 1e6)
        assert point.floor.xdp_tx_mpps > 0 and point.floor.xdp_drop_mpps > 0
        assert point.egress_overhead_bytes == model.ENCAPS[point.encap].overhead
    assert {m.case for m in payload.micro} == {"xdp_drop", "xdp_tx", "ip4-ipip", "ip6-gue1"}
    assert all(m.ns_per_packet > 0 for m in payload.micro)
    figures = {c.name: c for c in payload.controller}
    assert {f"Maglev ring build, {n} reals" for n in (10, 100, 1000)} <= set(figures)
    incremental, full = figures["incremental apply"].ring_slots, figures["full apply"].ring_slots
    assert incremental is not None and full is not None and incremental < full


@pytest.mark.parametrize(("argv", "message"), [
    (["--sizes", "40"], "frame size must be 64..1518"),
    (["--sizes", "big"], "--sizes must list frame sizes"),
    (["--parts", "ndr,warp"], "--parts must list some of"),
    (["--flows", "0"], "--flows must be"),
    (["--encap", "ip9-warp"], "invalid choice"),
    (["--frobnicate"], "unrecognized arguments"),
])
def test_bad_options_exit_2_with_a_message_naming_the_option(argv: list[str], message: str,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_cli.main(argv) == 2
    assert message in capsys.readouterr().err


def test_options_defaults_quick_and_lists() -> None:
    parser = __import__("argparse").ArgumentParser()
    bench_cli.add_arguments(parser)
    quick = bench_cli.options(parser.parse_args(["--quick"]))
    assert quick.sizes == (64,) and quick.encaps == tuple(model.ENCAPS) and quick.quick
    full = bench_cli.options(parser.parse_args(["--sizes", "64,1518,imix", "--encap", "ip4-gue0",
                                            "--encap", "ip4-gue0", "--parts", "micro"]))
    assert full.sizes == (64, 1518, "imix") and full.encaps == ("ip4-gue0",) and full.parts == ("micro",)
    with pytest.raises(UsageError):
        bench_cli.parse_sizes("64,,")


class _FakeDevice(Generator):
    """A generator and device in one: forwards `capacity` pps and reports a latency that grows with load."""

    def __init__(self, capacity: float) -> None:
        self.capacity = capacity
        self.runs: list[float] = []

    def run(self, rate_pps: float, duration_s: float, frame_size: FrameSpec, flows: int,
            family: Family) -> TrialResult:
        self.runs.append(rate_pps)
        offered = round(rate_pps * duration_s)
        received = min(offered, round(self.capacity * duration_s))
        us = 10 + 100 * rate_pps / self.capacity
        return TrialResult(offered, offered, received, duration_s, Latency(us / 2, us, us * 2))


def test_ndr_point_measures_latency_at_10_50_90_percent_of_pdr_when_the_generator_can() -> None:
    device = _FakeDevice(1e6)
    settings = SearchSettings(max_rate_pps=4e6, short_s=0.1, full_s=1.0, width=0.02)
    measured = model.ndr_point(device, "ip4-ipip", 64, 16, 4, settings)
    assert 0.98e6 <= measured.result.ndr_pps <= 1e6
    assert list(measured.latency) == ["10%", "50%", "90%"]
    assert device.runs[-3:] == pytest.approx([0.1 * measured.result.pdr_pps, 0.5 * measured.result.pdr_pps,
                                              0.9 * measured.result.pdr_pps])
    assert measured.latency["10%"].avg_us < measured.latency["90%"].avg_us


class _Crowded(Generator):
    """A loop that sustains `capacity`; every `every`-th trial a sender waited `wait_share` of it for a CPU and
    fell behind by as much, as a paced software sender does when other processes hold the CPU."""

    name = "crowded"

    def __init__(self, capacity: float, every: int, wait_share: float) -> None:
        self.capacity, self.every, self.wait_share = capacity, every, wait_share
        self.calls = 0

    def run(self, rate_pps: float, duration_s: float, frame_size: FrameSpec, flows: int,
            family: Family) -> TrialResult:
        self.calls += 1
        offered = round(rate_pps * duration_s)
        wait = self.wait_share if self.calls % self.every == 0 else 0.0
        sent = min(offered, round(min(rate_pps, self.capacity) * duration_s * (1 - wait)))
        return TrialResult(offered, sent, sent, duration_s, waited=wait * duration_s)


def test_a_lossy_trial_whose_sender_waited_for_a_cpu_is_run_again() -> None:
    settings = SearchSettings(max_rate_pps=4e6, short_s=0.1, full_s=1.0, width=0.02)
    clean = model.ndr_point(_Crowded(1e6, 10**9, 0.0), "ip4-ipip", 64, 16, 4, settings)
    crowded = model.ndr_point(_Crowded(1e6, 3, 0.3), "ip4-ipip", 64, 16, 4, settings)
    assert clean.repeated == 0 and crowded.repeated > 0
    assert crowded.result.ndr_pps == clean.result.ndr_pps, "the crowded trials were repeated, not counted"
    always = model.ndr_point(_Crowded(1e6, 1, 0.3), "ip4-ipip", 64, 16, 4, settings)
    assert always.result.ndr_pps < 0.75e6, "a machine that is always crowded still loses: the last run counts"
    assert not model.disturbed(TrialResult(1000, 990, 990, 1.0, waited=0.5), 1.0), "within the rate tolerance: no loss"
    assert not model.disturbed(TrialResult(1000, 900, 900, 1.0, waited=0.01), 1.0), "a short wait explains nothing"
    assert not model.disturbed(TrialResult(1000, 900, 900, 1.0), 1.0), "a generator that cannot tell"


def test_a_failing_measurement_still_removes_the_testbed(monkeypatch: pytest.MonkeyPatch) -> None:
    _needs_root_and_build()
    built: list[str] = []

    def explode(bed: testbed.Testbed, opts: model.Options, report: model.Report) -> None:
        bed.on_lb("balancer")  # namespaces, veths, counters, a pinned balancer instance: all built
        built.extend([bed.gen_ns, bed.lb_ns])
        raise RuntimeError("measurement failed")

    monkeypatch.setattr(bench_run, "measure_micro", explode)
    with pytest.raises(RuntimeError, match="measurement failed"):
        bench_run.bench(model.Options(parts=("micro",), quick=True))
    assert built and _leftovers() == []


def test_an_interrupted_testbed_command_finishes_before_the_teardown(tmp_path: Path) -> None:
    """The last CI's leak: a signal while `ip netns add` ran. The command must end (here: do its
    last step) before the interrupt reaches the ExitStack that undoes it, never be killed mid-way."""
    done = tmp_path / "done"

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt("SIGALRM")

    old = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        with pytest.raises(KeyboardInterrupt):
            testbed._run(["sh", "-c", f"sleep 1; touch {done}"], "run a slow command")  # noqa: SLF001
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert done.exists(), "the command was killed before its last step"


def test_a_signal_inside_popen_still_lets_the_command_finish(tmp_path: Path) -> None:
    """CI's leak of `bnt-<pid>-lb`: a SIGTERM that landed inside Popen, after the fork, left `ip netns
    add` running unwatched, and it made the netns after the teardown's delete. The command ends first."""
    done = tmp_path / "done"
    with signal_inside_popen(signal.SIGTERM), pytest.raises(KeyboardInterrupt, match="SIGTERM"), sigterm_unwinds():
        testbed._run(["sh", "-c", f"sleep 0.5; touch {done}"], "run a slow command")  # noqa: SLF001
    assert done.exists(), "the interrupt went on while the command still ran"


def test_a_signal_that_lands_in_a_finalizer_still_unwinds() -> None:
    """Python drops an exception raised in `__del__` (a Popen's finalizer polling its child): a SIGHUP
    that landed there let a killed bench run to the end under load. It is delivered again outside."""

    class SignalsWhileFinalized:
        def __del__(self) -> None:
            signal.raise_signal(signal.SIGTERM)  # runs the handler before it returns: inside the finalizer

    with pytest.raises(KeyboardInterrupt, match="SIGTERM"), sigterm_unwinds():
        SignalsWhileFinalized()  # dropped at once: its __del__ runs on this line
        poll(5.0, lambda: False, "the signal delivered again, as a KeyboardInterrupt here")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_bench_killed_midway_removes_its_testbed(signum: int, tmp_path: Path) -> None:
    """`timeout`, systemd or a CI runner ends a bench by SIGTERM (a closed terminal by SIGHUP): it
    unwinds as on Ctrl-C, exits 130 saying so, and leaves no namespace or pin of its testbed."""
    _needs_root_and_build()
    argv = [str(Path(sys.executable).parent / "l4lab"), "bench", "--quick", "--results", str(tmp_path)]
    ended = signal_when(argv, lambda pid: _leftovers(pid), signum, what="the bench's testbed built", cwd=REPO)
    assert ended.returncode == 130, ended.stderr[-2000:]
    assert ended.last_line() == "l4lab bench: interrupted (what the bench had set up is removed)", ended.stderr
    assert _leftovers(ended.pid) == []


def test_redirect_mode_sends_through_the_devmap_to_the_egress_interface() -> None:
    _needs_root_and_build()
    from lab.bench.gen.base import Endpoints
    from lab.bench.gen.xdplive import XdpLiveGenerator

    try:
        with testbed.testbed() as bed:
            bed.on_lb("xdp_tx_swap")
            ep = Endpoints(src_mac=model.GEN_MAC, dst_mac=model.LB_MAC)
            # The context names an idle interface; only the devmap can get frames onto the bench link.
            with XdpLiveGenerator(bed.gen_ns, testbed.PARK_IFS[3], ep, bed.gen_count,
                                  park_ifnames=testbed.PARK_IFS[:2], egress_ifname=model.GEN_IF,
                                  object_path=testbed.object_path("trafficgen.o")) as gen:
                result = gen.run(50_000, 0.2, 64, 64, 4)
            assert result.sent >= 5_000, result
            assert 0.95 * result.sent <= result.received <= result.sent, result
            assert bed.lb_count() >= result.received
    finally:
        assert _leftovers() == []
