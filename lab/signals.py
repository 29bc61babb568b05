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

RETRY_S = 0.05  # a signal that came during libbpf's print callback is sent again after this


@contextmanager
def sigterm_unwinds() -> Iterator[None]:
    """Within the block, SIGTERM and SIGHUP raise KeyboardInterrupt (named after the signal)."""

    def stop(signum: int, frame: FrameType | None) -> None:
        if libbpf.in_callback(frame):  # raised there, ctypes would drop it: deliver it again once C returns
            threading.Timer(RETRY_S, os.kill, (os.getpid(), signum)).start()
            return
        raise KeyboardInterrupt(signal.Signals(signum).name)

    old = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
