"""signalled.py: a verb started as its own process and sent a signal at a chosen moment, as `timeout`,
systemd, a CI runner or a closed terminal would; the suites then check what it left."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


@contextmanager
def signal_inside_popen(signum: int, argv_has: str = "") -> Iterator[list[subprocess.Popen[Any]]]:
    """Within the block, a Popen whose command line contains `argv_has` raises `signum` in this process
    once its child is forked and before Popen returns: the window where an interrupt leaves the child
    running unwatched. Yields every Popen started in the block, for the caller to check and clean up."""
    started: list[subprocess.Popen[Any]] = []
    real = subprocess.Popen

    class SignalledWhileStarting(real):  # type: ignore[valid-type,misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            started.append(self)
            if argv_has in " ".join(str(a) for a in self.args):
                signal.raise_signal(signum)

    subprocess.Popen = SignalledWhileStarting  # type: ignore[misc]
    try:
        yield started
    finally:
        subprocess.Popen = real  # type: ignore[misc]
