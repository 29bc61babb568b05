"""Run `make test`'s parts as concurrent streams: the first one's output live, each other's kept in a
log and printed whole when it ends; exit 0 only when every stream exits 0.

    python -m suites.streams --logs build/test-streams 'pytest suites/a' 'pytest suites/b && next'

Why two: a test mostly waits (handshakes, health intervals, a TCG guest on one vCPU), so one pytest
keeps under one of the machine's two CPUs busy (docs/architecture.md, "`make test` in two concurrent streams").
Each stream is a shell line in its own process group; SIGINT or SIGTERM to this runner is passed on
as SIGINT to every group, so pytest tears its labs down as on Ctrl-C, then it is killed after GRACE_S;
the kept logs are printed then too, and the runner exits 128 + the signal's number.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType
from typing import TextIO

from lab.signals import deferred

GRACE_S = 120.0


def _interrupt(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGINT)
    deadline = time.monotonic() + GRACE_S
    for proc in procs:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _say(text: str, stream: TextIO = sys.stdout) -> None:
    """One line in one write: print() writes the text and its newline apart, and stream 1, writing to
    the same file, can land between them."""
    stream.flush()
    os.write(stream.fileno(), f"{text}\n".encode())


def _show_logs(logs: list[Path | None]) -> None:
    for n, log in enumerate(logs, 1):
        if log:
            _say(f"\n===== stream {n} (log {log}) =====")
            sys.stdout.buffer.write(log.read_bytes())
            sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m suites.streams", description=__doc__.splitlines()[0])
    p.add_argument("--logs", type=Path, required=True, help="folder for the logs of the streams after the first")
    p.add_argument("streams", nargs="+", help="one shell line per stream")
    args = p.parse_args(argv)
    args.logs.mkdir(parents=True, exist_ok=True)
    logs: list[Path | None] = [None] + [args.logs / f"stream-{n}.log" for n in range(2, len(args.streams) + 1)]
    procs: list[subprocess.Popen[bytes]] = []
    started = time.monotonic()

    stopping: list[int] = []

    def stop(signum: int, _frame: FrameType | None) -> None:
        if stopping:  # a second SIGINT would cut pytest's teardown short and leave its labs
            _say(f"streams: signal {signum}: still waiting for the streams' teardown", sys.stderr)
            return
        stopping.append(signum)
        _say(f"streams: signal {signum}: interrupting every stream", sys.stderr)
        _interrupt(procs)
        _show_logs(logs)  # what the kept streams printed up to their teardown
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    # Started with the signals held: one that landed inside Popen, after the fork, would leave that
    # stream running outside `procs`, where stop() cannot reach it.
    with deferred():
        for n, (line, log) in enumerate(zip(args.streams, logs, strict=True), 1):
            # Said before the start: the first stream writes to this same terminal at once.
            _say(f"streams: {n} starts: {line}" + (f" (log {log})" if log else ""))
            out = open(log, "wb") if log else None  # noqa: SIM115 - closed below, once the child has its copy
            procs.append(subprocess.Popen(["bash", "-c", f"set -euo pipefail; {line}"], stdout=out,
                                          stderr=subprocess.STDOUT if out else None, start_new_session=True))
            if out:
                out.close()  # the child holds its own descriptor
    ends: dict[int, float] = {}
    while len(ends) < len(procs):
        # Block until some stream's shell exits, leaving it to Popen to reap (WNOWAIT).
        os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOWAIT)
        for n, proc in enumerate(procs):
            if n not in ends and proc.poll() is not None:
                ends[n] = time.monotonic() - started
    codes = [proc.returncode for proc in procs]
    _show_logs(logs)
    for n, (line, code) in enumerate(zip(args.streams, codes, strict=True)):
        _say(f"streams: {n + 1} exit {code} after {ends[n]:.0f} s: {line}")
    return 0 if all(c == 0 for c in codes) else 1


if __name__ == "__main__":
    sys.exit(main())
