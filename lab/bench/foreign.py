"""A baseline object of another BTF contract, programmed by the checkout it was built in.

The object before a change that added maps or fields (issue 30's server ids, prefixes, inline decap)
cannot be programmed by this checkout's controller. When such an object sits where `make bpf` puts
it (CHECKOUT/build/bpf/balancer.o), its own checkout's controller loads and programs it in a child
process (lab/bench/sidespec.py run on that checkout), which pins the program and the session table;
the bench opens both and times the program in the same rounds as l4lab's and Katran's. Counters are
read through the child, in the layout only it knows.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from balancer.libbpf import Map, Program, map_from_pin, obj_get
from lab.errors import LabError
from lab.signals import deferred

CHILD = Path(__file__).with_name("sidespec.py")


@dataclass(frozen=True)
class ForeignBaseline:
    """A balancer.o and the checkout whose controller programs it."""

    obj: Path
    checkout: Path


def checkout_of(obj: Path) -> Path | None:
    """The other checkout a balancer object was built in by `make bpf` (CHECKOUT/build/bpf/balancer.o),
    if it looks like one; never this checkout, whose controller would program it already."""
    path = obj.resolve()
    root = path.parents[2] if len(path.parents) > 2 else None
    if root is None or path.name != "balancer.o" or path.parent != root / "build" / "bpf":
        return None
    if root == Path(__file__).resolve().parents[2]:
        return None
    return root if (root / "balancer" / "datapath.py").is_file() else None


class Child:
    """The child process holding the baseline's Datapath: a line of JSON per request."""

    def __init__(self, base: ForeignBaseline, pin_dir: str) -> None:
        self.base = base
        self.stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 -- closed by stop(), on the bench's stack
        env = {**os.environ, "PYTHONPATH": str(base.checkout)}  # its `balancer` before this checkout's
        self.proc = subprocess.Popen([sys.executable, str(CHILD), pin_dir], env=env, cwd=base.checkout,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr, text=True)

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:  # it ended already (an import failed): say what it printed
            self.reply()
            raise

    def reply(self) -> Any:
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if not line:
            self.stderr.seek(0)
            tail = self.stderr.read()[-2000:]
            raise LabError(f"--baseline {self.base.obj}: the child programming it with {self.base.checkout}'s "
                           f"controller ended (exit {self.proc.poll()}): {tail.strip() or 'no output'}")
        got = json.loads(line)
        if isinstance(got, dict) and "error" in got:
            raise LabError(f"--baseline {self.base.obj}: {self.base.checkout}'s controller could not load or "
                           f"program it: {got['error']}")
        return got

    def counters(self) -> dict[str, int]:
        self.send("counters")
        return {str(k): int(v) for k, v in self.reply().items()}

    def stop(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()  # the child closes its Datapath and exits
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout:
            self.proc.stdout.close()
        self.stderr.close()


def load(stack: ExitStack, base: ForeignBaseline, spec: dict[str, Any]) -> tuple[Program, Map, Child]:
    """The baseline's program and IPv4 session table, loaded and programmed by its own checkout; all of
    it (child, fds, pins) released with the stack."""
    pin_dir = tempfile.mkdtemp(prefix="l4lab-baseline-", dir="/sys/fs/bpf")
    stack.callback(shutil.rmtree, pin_dir, True)
    # The child and its stop() on the stack as one step: an interrupt between them (or inside Popen)
    # would leave it pinning into a folder the teardown has already removed.
    with deferred():
        child = Child(base, pin_dir)
        stack.callback(child.stop)
    child.send(json.dumps(spec))
    child.reply()  # {"ready": true}, or the child's error raised
    prog_fd = obj_get(os.path.join(pin_dir, "prog"), "baseline program")
    stack.callback(os.close, prog_fd)
    table = map_from_pin(os.path.join(pin_dir, "sessions"))
    stack.callback(table.close)
    for name in os.listdir(pin_dir):  # the fds hold them now
        os.unlink(os.path.join(pin_dir, name))
    return Program(prog_fd, "balancer_xdp"), table, child
