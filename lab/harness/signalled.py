"""signalled.py: a verb started as its own process and sent a signal at a chosen moment, as `timeout`,
systemd, a CI runner or a closed terminal would; the suites then check what it left."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from lab.poll import poll
from lab.signals import default_sigint


@dataclass(frozen=True)
class Ended:
    pid: int
    returncode: int
    stderr: str

    def last_line(self) -> str:
        return self.stderr.strip().splitlines()[-1] if self.stderr.strip() else ""


def signal_when(argv: Sequence[str], moment: Callable[[int], object], signum: int, *, what: str, cwd: Path,
                deadline_s: float = 60.0, interval_s: float = 0.005, exit_s: float = 120.0) -> Ended:
    """Start `argv`, send it `signum` as soon as moment(its pid) holds, and return how it ended. Fails when it
    ends before the moment, and kills it when it outlives `exit_s` after the signal (or the test fails)."""
    # SIGINT as from a terminal, also when the suite runs as a background job, which ignores it (and
    # passes that on to its children).
    proc = subprocess.Popen(list(argv), cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            preexec_fn=default_sigint)
    try:
        poll(deadline_s, lambda: proc.poll() is not None or moment(proc.pid), what, interval_s=interval_s)
        assert proc.poll() is None, f"`{' '.join(argv)}` ended before {what}: {proc.communicate()[1][-2000:]}"
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=exit_s)
        return Ended(proc.pid, proc.returncode, err)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
