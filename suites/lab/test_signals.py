"""lab.signals.deferred: a signal that lands inside the block is handled once the block has ended."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator

import pytest

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
