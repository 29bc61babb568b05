"""SIGTERM and SIGHUP unwind like Ctrl-C, so what a long verb set up is removed by its own `with` blocks.

Python's default for SIGTERM ends the process at once: a bench killed by `timeout`, systemd or a CI
runner left its namespaces and BPF objects behind. Raised as KeyboardInterrupt, the signal runs every
`finally` and ExitStack callback on the way out, as an interrupt from the keyboard does. `deferred`
holds signals while a resource is made and journaled; `run_forwarding` lets a child that builds things
(a pytest run) unwind them before the interrupt goes on.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

RETRY_S = 0.05  # a signal that came in libbpf's print callback or a finalizer is sent again after this


def _in_libbpf_callback(frame: FrameType | None) -> bool:
    # Looked up, not imported: libbpf (80 ms of imports) loads only for verbs that use it, and a process
    # that never imported it is not in its callback.
    libbpf = sys.modules.get("balancer.libbpf")
    return libbpf is not None and bool(libbpf.in_callback(frame))


def _in_finalizer(frame: FrameType | None) -> bool:
    """Whether `frame` or a caller of it is a `__del__`, where Python ignores any exception raised."""
    while frame is not None:
        if frame.f_code.co_name == "__del__":
            return True
        frame = frame.f_back
    return False


@contextmanager
def sigterm_unwinds() -> Iterator[None]:
    """Within the block, SIGTERM and SIGHUP raise KeyboardInterrupt (named after the signal)."""

    def stop(signum: int, frame: FrameType | None) -> None:
        # Raised in libbpf's print callback (ctypes) or in a finalizer (Popen.__del__ polling a child),
        # the exception is printed and dropped and the verb runs on: deliver the signal again shortly.
        if _in_libbpf_callback(frame) or _in_finalizer(frame):
            threading.Timer(RETRY_S, os.kill, (os.getpid(), signum)).start()
            return
        raise KeyboardInterrupt(signal.Signals(signum).name)

    old = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


HELD = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextmanager
def deferred() -> Iterator[None]:
    """Within the block, SIGINT, SIGTERM and SIGHUP wait; the first that came is handled as usual when
    it ends. For a step that must not be cut in two: a resource made and its removal journaled, or a
    namespace that pyroute2 makes in a forked child, which would finish it after an interrupted
    parent had unwound."""
    if threading.current_thread() is not threading.main_thread():
        yield  # Python runs signal handlers in the main thread only: nothing interrupts this one
        return
    caught: list[int] = []

    def hold(signum: int, frame: FrameType | None) -> None:
        caught.append(signum)

    # An ignored signal (SIGINT in a background job) stays ignored, also for the children made in the block.
    old = {s: signal.signal(s, hold) for s in HELD if signal.getsignal(s) is not signal.SIG_IGN}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        if caught:
            signal.raise_signal(caught[0])  # runs the handler restored above before it returns


def default_sigint() -> None:
    """A child's preexec_fn: SIGINT at its default, also when this process ignores it (a background job)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run_forwarding(argv: list[str], *, grace_s: float, **popen: Any) -> int:
    """Run `argv` to its end and return its exit status. It runs in a session of its own, so a Ctrl-C at the
    terminal reaches this process only; an interrupt here (Ctrl-C, or SIGTERM and SIGHUP under
    sigterm_unwinds) is passed on as one SIGINT, and the child gets `grace_s` to unwind what it built
    before it is killed and the interrupt goes on. (subprocess.run would kill it 0.25 s after the
    interrupt, in the middle of its own clean-up.)"""
    child: subprocess.Popen[Any] | None = None
    try:
        # Started with the interrupts held: one that landed inside Popen, after the fork, would leave
        # the child building unwatched. The child takes the SIGINT it is sent even when this process
        # ignores SIGINT (a background job).
        with deferred():
            child = subprocess.Popen(argv, start_new_session=True, preexec_fn=default_sigint, **popen)
        return child.wait()
    except KeyboardInterrupt:
        if child is None:
            raise
        with deferred():
            child.send_signal(signal.SIGINT)
            try:
                child.wait(grace_s)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        raise
