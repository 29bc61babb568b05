"""SIGTERM and SIGHUP unwind like Ctrl-C, so what a long verb set up is removed by its own `with` blocks.

Python's default for SIGTERM ends the process at once: a bench killed by `timeout`, systemd or a CI
runner left its namespaces and BPF objects behind. Raised as KeyboardInterrupt, the signal runs every
`finally` and ExitStack callback on the way out, as an interrupt from the keyboard does.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

from balancer import libbpf

RETRY_S = 0.05  # a signal that came in libbpf's print callback or a finalizer is sent again after this


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
        if libbpf.in_callback(frame) or _in_finalizer(frame):
            threading.Timer(RETRY_S, os.kill, (os.getpid(), signum)).start()
            return
        raise KeyboardInterrupt(signal.Signals(signum).name)

    old = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
