"""lab.signals: a signal inside `deferred` is handled once the block has ended; `run_forwarding` passes
one on to its child."""

from __future__ import annotations

import signal
import subprocess
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from lab import signals
from lab.harness.signalled import signal_inside_popen
from lab.signals import HELD, deferred, sigterm_unwinds


@pytest.fixture(autouse=True)
def sigint_as_from_a_terminal() -> Iterator[None]:
    """SIGINT raising KeyboardInterrupt, also when the suite runs as a background job (which ignores it)."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


@pytest.mark.parametrize("signum", HELD)
def test_a_signal_inside_the_block_waits_for_its_end(signum: int) -> None:
    before = {s: signal.getsignal(s) for s in HELD}
    steps = []
    with pytest.raises(KeyboardInterrupt), sigterm_unwinds(), deferred():
        signal.raise_signal(signum)  # its handler runs before raise_signal returns: here, it only records it
        steps.append("after the signal")
        signal.raise_signal(signal.SIGTERM)  # a second one is not handled twice
        steps.append("the block's end")
    assert steps == ["after the signal", "the block's end"]
    assert {s: signal.getsignal(s) for s in HELD} == before


def test_a_block_without_a_signal_leaves_the_handlers_as_they_were() -> None:
    before = {s: signal.getsignal(s) for s in HELD}
    with deferred():
        assert all(signal.getsignal(s) != before[s] for s in HELD)
    assert {s: signal.getsignal(s) for s in HELD} == before


def test_an_ignored_signal_stays_ignored() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with deferred():
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        signal.raise_signal(signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN


def test_outside_the_main_thread_the_block_changes_nothing() -> None:
    seen: list[object] = []

    def body() -> None:
        with deferred():
            seen.append(signal.getsignal(signal.SIGINT))

    worker = threading.Thread(target=body)
    worker.start()
    worker.join()
    assert seen == [signal.default_int_handler]


def test_a_signal_inside_popen_reaches_the_forwarded_child() -> None:
    """A SIGTERM that lands inside Popen, after the fork, must not leave the child (a conform run's
    pytest, building labs) unwatched: it gets its SIGINT and is waited for, as for a later signal."""
    started: list[subprocess.Popen[Any]] = []
    try:
        with signal_inside_popen(signal.SIGTERM) as started, pytest.raises(KeyboardInterrupt, match="SIGTERM"), \
                sigterm_unwinds():
            signals.run_forwarding(["sleep", "30"], grace_s=10)
        # Ended by the SIGINT it was sent (not killed after the grace), and reaped.
        assert started[0].returncode == -signal.SIGINT, "the child was left running or never got the SIGINT"
    finally:
        for child in started:
            if child.poll() is None:
                child.kill()
                child.wait()
