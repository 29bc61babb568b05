"""Progress on long work: `l4lab up` names each step on a terminal, the bench shows its trial and time left;
both stay quiet when their output is not a terminal."""

from __future__ import annotations

import io
import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lab import netns, progress, topology
from lab.progress import BenchProgress, StepProgress
from suites.lab import probes

REPO = Path(__file__).resolve().parents[2]


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(progress.time, "monotonic", fake)
    return fake


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_steps_are_named_and_slow_ones_kept_with_their_time(clock: FakeClock) -> None:
    out = Tty()
    steps = StepProgress(out)
    steps.step("make node lb")
    clock.now += 0.2
    steps.step("wait for VM real real1 to boot")
    clock.now += 4.25
    steps.step("wait for every BGP session to be Established")
    clock.now += 2.0
    steps.done()
    text = out.getvalue()
    assert "step 1: make node lb" in text and "step 3: wait for every BGP session" in text
    kept = [line.split("\x1b[K")[-1] for line in text.split("\n")[:-1]]
    assert kept == ["  wait for VM real real1 to boot: 4.2 s", "  wait for every BGP session to be Established: 2.0 s"]
    assert "make node lb:" not in text, "fast steps are shown, not kept"
    assert text.endswith(": 2.0 s\n"), "the status line ends cleared: the last slow step kept"


def test_bench_shows_the_trial_and_estimates_the_time_left(clock: FakeClock) -> None:
    out = Tty()
    bench = BenchProgress(points=4, trial_budget=10, stream=out)
    bench.start_point("xdp_drop", "64")
    bench.trial(2_000_000, 0.5, 0.0)
    assert "[point 1/4] xdp_drop 64: trial 1, 2.000 Mpps for 0.5 s, loss 0.000%" in out.getvalue()
    assert "≤ 20 s left (trial budget)" in out.getvalue(), "before any point ended: 4 points × 10 trials × 0.5 s"
    clock.now += 12.0
    bench.end_point()
    bench.start_point("ip4-ipip", "64")
    assert out.getvalue().endswith("[point 2/4] ip4-ipip 64: starting · ~36 s left")
    clock.now += 6.0
    bench.trial(1_500_000, 0.5, 0.0125)
    assert out.getvalue().endswith("trial 1, 1.500 Mpps for 0.5 s, loss 1.250% · ~30 s left")


def test_quiet_when_not_a_terminal(clock: FakeClock) -> None:
    out = io.StringIO()  # isatty() is False
    steps, bench = StepProgress(out), BenchProgress(points=2, stream=out)
    steps.step("make node lb")
    clock.now += 5
    steps.done()
    bench.start_point("xdp_tx", "64")
    bench.trial(1e6, 1.0, 0.0)
    bench.end_point()
    assert out.getvalue() == ""
    assert not steps.enabled


@pytest.mark.skipif(os.geteuid() != 0, reason="the lab needs root")
def test_build_names_every_step(lab_name: str) -> None:
    seen: list[str] = []
    builder = netns.Builder(topology.load("default"), lab_name, programs=False, on_step=seen.append)
    try:
        builder.build()
    finally:
        netns.teardown(lab_name)
    assert len(seen) == builder.steps > 20
    assert "wait for links up and addresses usable" in seen
    assert probes.leftovers(lab_name) == []


def _up_on_a_terminal(lab: str) -> str:
    """`l4lab up` with stderr on a pseudo-terminal; everything it wrote there."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "lab.cli", "up", "--name", lab, "--no-bpf"], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=slave, stdin=subprocess.DEVNULL)
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            break
        try:
            data = os.read(master, 4096)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    assert proc.wait(timeout=30) == 0
    return b"".join(chunks).decode(errors="replace")


@pytest.mark.skipif(os.geteuid() != 0, reason="the lab needs root")
def test_up_shows_its_steps_on_a_terminal_only(lab_name: str) -> None:
    try:
        shown = _up_on_a_terminal(lab_name)
    finally:
        netns.teardown(lab_name)
    assert "step 1: " in shown and "wait for links up and addresses usable" in shown, shown[-500:]
    try:
        piped = subprocess.run([sys.executable, "-m", "lab.cli", "up", "--name", lab_name, "--no-bpf"], cwd=REPO,
                               capture_output=True, text=True, timeout=120, check=True)
    finally:
        netns.teardown(lab_name)
    assert piped.stderr == "", "no progress when stderr is not a terminal"
    assert piped.stdout.startswith(f"lab '{lab_name}' up (default:")
    assert probes.leftovers(lab_name) == []
