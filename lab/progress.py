"""Progress of long work on a terminal: the step in progress on one rewritten line, slow steps kept with their time.

    progress = StepProgress()                 # quiet unless stderr is a terminal
    netns.build(topo, lab, on_step=progress.step)
    progress.done()

    bench = BenchProgress(points=14)          # NDR/PDR search: the trial in progress and the time left
    bench.start_point("ip4-gue1", "64")
    bench.trial(rate_pps, duration_s, loss)   # after each trial
    bench.end_point()

Both write to stderr only when it is a terminal (or when told to), so logs, pipes and CI output
stay exactly what they were. The estimate of the time left is the mean time of the finished points
times the points left (the trial budget of the first point before any has finished).
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

SLOW_S = 1.0  # a step that took longer is kept on its own line with its duration


def _clock(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    return f"{seconds // 60} min {seconds % 60:02d} s" if seconds >= 60 else f"{seconds} s"


class _Line:
    """One status line, rewritten in place; permanent lines are printed above it."""

    def __init__(self, stream: TextIO | None, enabled: bool | None) -> None:
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.shown = False

    def show(self, text: str) -> None:
        if self.enabled:
            self.stream.write("\r\033[K" + text)
            self.stream.flush()
            self.shown = True

    def keep(self, text: str) -> None:
        if self.enabled:
            self.stream.write("\r\033[K" + text + "\n")
            self.stream.flush()
            self.shown = False

    def clear(self) -> None:
        if self.enabled and self.shown:
            self.stream.write("\r\033[K")
            self.stream.flush()
            self.shown = False


class StepProgress:
    """Names each step as it starts (`l4lab up`: links, nodes, VM boots, BGP waits)."""

    def __init__(self, stream: TextIO | None = None, enabled: bool | None = None) -> None:
        self.line = _Line(stream, enabled)
        self.started = time.monotonic()
        self.current: tuple[str, float] | None = None
        self.count = 0

    @property
    def enabled(self) -> bool:
        return self.line.enabled

    def _finish_current(self) -> None:
        if self.current is not None:
            what, t0 = self.current
            took = time.monotonic() - t0
            if took >= SLOW_S:
                self.line.keep(f"  {what}: {took:.1f} s")
        self.current = None

    def step(self, what: str) -> None:
        self._finish_current()
        self.count += 1
        self.current = (what, time.monotonic())
        self.line.show(f"[{time.monotonic() - self.started:5.1f} s] step {self.count}: {what}")

    def done(self) -> None:
        self._finish_current()
        self.line.clear()


class BenchProgress:
    """The NDR/PDR point and trial in progress, and an estimate of the time left."""

    def __init__(self, points: int, trial_budget: int = 30, stream: TextIO | None = None,
                 enabled: bool | None = None) -> None:
        self.line = _Line(stream, enabled)
        self.points = points
        self.trial_budget = trial_budget
        self.done_points = 0
        self.point_times: list[float] = []
        self.label = ""
        self.trials = 0
        self.point_t0 = time.monotonic()
        self.trial_seconds: list[float] = []

    def start_point(self, name: str, size: str) -> None:
        self.label, self.trials, self.point_t0 = f"{name} {size}", 0, time.monotonic()
        self.line.show(f"[point {self.done_points + 1}/{self.points}] {self.label}: starting · {self.left()}")

    def trial(self, rate_pps: float, duration_s: float, loss: float) -> None:
        self.trials += 1
        self.trial_seconds.append(duration_s)
        self.line.show(f"[point {self.done_points + 1}/{self.points}] {self.label}: trial {self.trials}, "
                       f"{rate_pps / 1e6:.3f} Mpps for {duration_s:g} s, loss {loss:.3%} · {self.left()}")

    def end_point(self) -> None:
        self.done_points += 1
        self.point_times.append(time.monotonic() - self.point_t0)
        self.line.clear()

    def left(self) -> str:
        """About how long the rest of the search takes."""
        remaining = self.points - self.done_points
        if self.point_times:
            per_point = sum(self.point_times) / len(self.point_times)
            spent = time.monotonic() - self.point_t0
            return f"~{_clock(max(0.0, per_point * remaining - spent))} left"
        if self.trial_seconds:
            mean = sum(self.trial_seconds) / len(self.trial_seconds)
            return f"≤ {_clock(mean * self.trial_budget * remaining)} left (trial budget)"
        return "time left unknown yet"

    def done(self) -> None:
        self.line.clear()
