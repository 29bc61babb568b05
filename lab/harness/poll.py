"""poll.py: wait for state with a deadline: call a probe until it answers, or fail naming what never happened."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")
INTERVAL_S = 0.05


class PollTimeoutError(AssertionError):
    """The state a test waited for did not come before its deadline (an assertion: the test fails)."""


def poll(deadline_s: float, probe: Callable[[], T | None], what: str, *, interval_s: float = INTERVAL_S) -> T:
    """Call probe() until it returns a truthy value and return that value; after deadline_s seconds
    raise PollTimeoutError("<what> after <deadline_s> s (last: <value>)").

    The probe runs at least once, also with a deadline of 0::

        pid = poll(5.0, lambda: pidfile.exists() and int(pidfile.read_text()), "the daemon's pid file")
    """
    end = time.monotonic() + deadline_s
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() >= end:
            raise PollTimeoutError(f"no {what} after {deadline_s:g} s (last probe: {value!r})")
        time.sleep(interval_s)  # the interval between probes; the loop waits for the state


def poll_until_quiet(deadline_s: float, probe: Callable[[], T], *, interval_s: float = INTERVAL_S) -> T:
    """Call probe() until it returns a falsy value or deadline_s passes; return its last value (the
    caller asserts on it, naming what was still there)."""
    end = time.monotonic() + deadline_s
    while True:
        value = probe()
        if not value or time.monotonic() >= end:
            return value
        time.sleep(interval_s)  # the interval between probes; the loop waits for the state
