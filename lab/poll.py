"""poll.py: wait for state with a deadline: call a probe until its answer will do, or fail naming what never came.

Used by the lab's own waits (which raise LabError from the last value, check=False) and by the tests (re-exported
by lab.harness), where a timeout is an assertion.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")
INTERVAL_S = 0.05


class PollTimeoutError(AssertionError):
    """The state a test waited for did not come before its deadline (an assertion: the test fails)."""


def poll(deadline_s: float, probe: Callable[[], T], what: str, *, until: Callable[[T], object] = bool,
         check: bool = True, interval_s: float = INTERVAL_S) -> T:
    """Call probe() until until(value) holds (default: the value is truthy) and return that value;
    after deadline_s seconds raise PollTimeoutError naming `what` and the last value, or with
    check=False return the last value (the caller then asserts with its own evidence). The probe
    runs at least once, also with a deadline of 0::

        pid = poll(5.0, lambda: pidfile.exists() and int(pidfile.read_text()), "the daemon's pid file")
        busy = poll(20.0, lambda: client_busy(lab, vip), "client sockets closed", until=operator.not_, check=False)
    """
    end = time.monotonic() + deadline_s
    while True:
        value = probe()
        if until(value):
            return value
        if time.monotonic() >= end:
            if not check:
                return value
            shown = repr(value)
            raise PollTimeoutError(f"{what}: not so after {deadline_s:g} s (last: "
                                   f"{shown if len(shown) <= 2000 else shown[:2000] + '...'})")
        time.sleep(interval_s)  # the interval between probes; the loop waits for the state
