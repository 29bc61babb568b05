"""cpu.py: run a block on one CPU (test runs and per-CPU tables see one CPU), then restore the affinity."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator


@contextlib.contextmanager
def pinned_cpu(cpu: int | None = None) -> Iterator[int]:
    """Pin this process to `cpu` (default: the lowest it may use) for the block; yields the CPU::

        with pinned_cpu() as cpu:
            dp.run(frame)  # runs, and counts, on `cpu`
    """
    before = os.sched_getaffinity(0)
    chosen = min(before) if cpu is None else cpu
    os.sched_setaffinity(0, {chosen})
    try:
        yield chosen
    finally:
        os.sched_setaffinity(0, before)
