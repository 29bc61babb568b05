"""_daemon.py: `lbctl run` in a lab's LB node, and the JSON lines it logs, for the suites that need the daemon.

    with contextlib.ExitStack() as stack:
        daemon = start_daemon(stack, balancer, tmp_path)
        daemon.wait("running")
        daemon.wait("applied", where=lambda e: e.get("trigger") == "health")
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lab.harness import REPO, LabBalancer, poll


class Daemon:
    """`lbctl run --config FILE` in the LB node; its JSON log lines in a file."""

    def __init__(self, b: LabBalancer, config: Path, log: Path) -> None:
        self.log_path = log
        self.log = log.open("a")
        self.offset = log.stat().st_size
        self.proc = subprocess.Popen(b.lab.python_argv(b.node, "balancer.cli", "--instance", b.instance,
                                                       "run", "--config", str(config)),
                                     cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self.log)

    def events(self) -> list[dict[str, Any]]:
        with self.log_path.open() as f:
            f.seek(self.offset)
            return [json.loads(line) for line in f if line.startswith("{")]

    def wait(self, event: str, timeout: float = 30.0,
             where: Callable[[dict[str, Any]], bool] | None = None) -> dict[str, Any]:
        """The first `event` logged (that `where` accepts), polled for until `timeout`."""
        def first() -> dict[str, Any] | None:
            found = [e for e in self.events() if e.get("event") == event and (where is None or where(e))]
            if found:
                return found[0]
            assert self.proc.poll() is None, \
                f"lbctl run exited {self.proc.returncode}: {self.log_path.read_text()[-2000:]}"
            return None

        got = poll(timeout, first, f"'{event}' logged by lbctl run", check=False, interval_s=0.02)
        assert got is not None, \
            f"lbctl run logged no such '{event}' within {timeout:g} s: {self.log_path.read_text()[-2000:]}"
        return got

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout=15)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self.log.close()
        return code


def start_daemon(stack: contextlib.ExitStack, b: LabBalancer, tmp_path: Path) -> Daemon:
    """`lbctl run` of b's config file, logging to tmp_path, stopped when stack closes."""
    log = tmp_path / "lbctl-run.log"
    log.touch()
    daemon = Daemon(b, b.config_path, log)
    stack.callback(daemon.stop)
    return daemon
