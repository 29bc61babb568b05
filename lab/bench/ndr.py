"""The throughput search: RFC 2544 throughput, NDR (zero loss) and PDR (loss ≤ 0.5 %) in one MLRsearch pass.

Pure logic over a `trial(rate_pps, duration_s) -> loss ratio` callable, so the same search drives
the live-frames generator, TRex, and the synthetic device models of the unit tests.

How it searches (after FD.io CSIT's MLRsearch, re-expressed):

1. One short trial at the maximum rate. Its forwarding rate, max × (1 − loss), is the first guess.
2. Short trials narrow two intervals at once: NDR's [highest rate with zero loss, lowest rate with
   loss] and PDR's [highest rate with loss ≤ the PDR ratio, lowest rate above it]. Every trial
   updates both. While a lower bound is unknown the next rate is one width below the forwarding
   rate of the lowest failure, or further down after k failures in a row (width × 2^(k−1), at most
   half); once both bounds are known the search works on the interval that
   is relatively wider: after k passes (fails) in a row it steps width × 2^(k−1) up from the lower
   (down from the upper) bound, otherwise it bisects, until both are narrower than `width`.
3. A full-length confirmation trial at each lower bound. A short trial can pass where a long one
   fails (buffers absorb short bursts), so short lower bounds are not trusted at full length: a
   failed confirmation becomes the new upper bound and the search continues with full-length
   trials until the interval is narrow again and its lower bound passed at full length.

RFC 2544 throughput is the NDR confirmed at full length. Every trial is recorded with its phase.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

PDR_LOSS = 0.005  # partial drop rate: at most 0.5 % loss
Phase = Literal["max", "short", "confirm", "full"]
TrialFn = Callable[[float, float], float]


class SearchError(ValueError):
    """The search was asked for something impossible (bad rates, durations or width)."""


@dataclass(frozen=True)
class SearchTrial:
    """One trial: the rate offered, the loss ratio measured, how long it ran, and why it was run."""

    rate_pps: float
    loss: float
    duration_s: float
    phase: Phase


@dataclass(frozen=True)
class SearchSettings:
    """What the search may do: the rate range, trial lengths, the width goal and a trial budget."""

    max_rate_pps: float
    min_rate_pps: float = 10_000.0
    short_s: float = 0.5
    full_s: float = 5.0
    width: float = 0.02  # relative: stop when (upper − lower) / upper ≤ width
    pdr_loss: float = PDR_LOSS
    max_trials: int = 40

    def check(self) -> None:
        if not 0 < self.min_rate_pps < self.max_rate_pps:
            raise SearchError(f"rates must satisfy 0 < min_rate ({self.min_rate_pps}) < max_rate "
                              f"({self.max_rate_pps})")
        if not 0 < self.short_s <= self.full_s:
            raise SearchError(f"durations must satisfy 0 < short ({self.short_s}) ≤ full ({self.full_s})")
        if not 0 < self.width < 1:
            raise SearchError(f"width must be a ratio 0 < width < 1 but got {self.width}")
        if not 0 <= self.pdr_loss < 1:
            raise SearchError(f"PDR loss ratio must be 0 ≤ ratio < 1 but got {self.pdr_loss}")
        if self.max_trials < 3:
            raise SearchError(f"max_trials must be ≥ 3 but got {self.max_trials}")


@dataclass
class _Interval:
    """Bounds for one loss criterion: lower passed, upper failed (None: not known yet)."""

    lower: float | None = None
    upper: float | None = None

    def update(self, rate: float, passed: bool) -> None:
        if passed:
            if self.lower is None or rate > self.lower:
                self.lower = rate
            if self.upper is not None and self.upper <= rate:
                self.upper = None  # a pass above an earlier failure: noise, trust the newer pass
        else:
            if self.upper is None or rate < self.upper:
                self.upper = rate
            if self.lower is not None and self.lower >= rate:
                self.lower = None

    def width(self, max_rate: float) -> float:
        """Relative width; 0 when the lower bound is the maximum rate; inf while a bound is missing."""
        if self.lower is not None and self.lower >= max_rate:
            return 0.0
        if self.lower is None or self.upper is None:
            return math.inf
        return (self.upper - self.lower) / self.upper


@dataclass(frozen=True)
class SearchResult:
    """NDR and PDR in packets/s (0 when even the minimum rate lost), and every trial run."""

    ndr_pps: float
    pdr_pps: float
    trials: list[SearchTrial] = field(default_factory=list)
    ndr_confirmed: bool = False  # the NDR passed a full-length trial
    pdr_confirmed: bool = False

    @property
    def throughput_pps(self) -> float:
        """RFC 2544 throughput: the highest rate with zero loss at full length (the confirmed NDR)."""
        return self.ndr_pps if self.ndr_confirmed else 0.0


class _Search:
    def __init__(self, trial: TrialFn, s: SearchSettings) -> None:
        self.trial = trial
        self.s = s
        self.trials: list[SearchTrial] = []
        self.ndr = _Interval()
        self.pdr = _Interval()

    def ndr_passes(self, loss: float) -> bool:
        return loss == 0

    def pdr_passes(self, loss: float) -> bool:
        return loss <= self.s.pdr_loss

    def measure(self, rate: float, duration: float, phase: Phase) -> float:
        if len(self.trials) >= self.s.max_trials:
            raise _BudgetSpent
        rate = min(self.s.max_rate_pps, max(self.s.min_rate_pps, rate))
        loss = float(self.trial(rate, duration))
        if not 0 <= loss <= 1 or math.isnan(loss):
            raise SearchError(f"trial at {rate:.0f} pps returned loss {loss}; a loss ratio is 0..1")
        self.trials.append(SearchTrial(rate, loss, duration, phase))
        self.ndr.update(rate, self.ndr_passes(loss))
        self.pdr.update(rate, self.pdr_passes(loss))
        return loss

    def next_rate(self, iv: _Interval, passes: Callable[[float], bool], duration: float) -> float | None:
        """Where to measure next for one interval, or None when it is narrow enough.

        After k consecutive passes (fails) at this duration the step away from the bound just
        moved grows as width × 2^k (MLRsearch's external search); otherwise bisect geometrically.
        """
        s = self.s
        if iv.width(s.max_rate_pps) <= s.width:
            return None
        if iv.upper is None:  # nothing failed above the lower bound
            return s.max_rate_pps
        if iv.lower is None and iv.upper <= s.min_rate_pps:
            return None  # even the minimum rate fails
        streak, last_passed = 0, None
        for t in reversed(self.trials):
            if t.duration_s != duration or (last_passed is not None and passes(t.loss) != last_passed):
                break
            last_passed = passes(t.loss)
            streak += 1
        step = min(0.5, s.width * 2 ** max(0, streak - 1))
        if iv.lower is None:
            # Below the forwarding rate of the failure (what got through), and at least one width down.
            loss = next(t.loss for t in reversed(self.trials) if t.rate_pps == iv.upper)
            guess = min(iv.upper * (1 - loss) * (1 - s.width), iv.upper * (1 - step))
            return float(max(s.min_rate_pps, guess))
        middle = math.sqrt(iv.lower * iv.upper)
        if last_passed is True and iv.lower * (1 + step) < middle:
            return float(iv.lower * (1 + step))
        if last_passed is False and iv.upper * (1 - step) > middle:
            return float(iv.upper * (1 - step))
        return middle

    def narrow(self, duration: float, phase: Phase) -> None:
        while True:
            candidates = [(iv.width(self.s.max_rate_pps), self.next_rate(iv, ok, duration))
                          for iv, ok in ((self.ndr, self.ndr_passes), (self.pdr, self.pdr_passes))]
            todo = [(w, r) for w, r in candidates if r is not None]
            if not todo:
                return
            _, rate = max(todo)
            self.measure(rate, duration, phase)


    def confirm(self, iv: _Interval, passes: Callable[[float], bool]) -> bool:
        """Re-establish iv's lower bound with full-length trials only; True when it holds one."""
        full = self.s.full_s
        candidate = iv.lower
        trusted = [t.rate_pps for t in self.trials if t.duration_s >= full and passes(t.loss)]
        iv.lower = max(trusted) if trusted else None
        phase: Phase = "confirm"
        while candidate is not None and (iv.lower is None or candidate > iv.lower):
            self.measure(candidate, full, phase)
            phase = "full"
            candidate = self.next_rate(iv, passes, full)
        return iv.lower is not None


class _BudgetSpent(Exception):
    """The trial budget is spent: the search stops with what it has (unconfirmed)."""


def search(trial: TrialFn, settings: SearchSettings) -> SearchResult:
    """Find NDR and PDR; see the module docstring. Stops early (unconfirmed) when max_trials is spent."""
    settings.check()
    st = _Search(trial, settings)
    confirmed = {"ndr": False, "pdr": False}
    try:
        loss = st.measure(settings.max_rate_pps, settings.short_s, "max")
        if loss > 0:
            st.measure(settings.max_rate_pps * (1 - loss), settings.short_s, "short")
        st.narrow(settings.short_s, "short")
        if settings.full_s > settings.short_s:
            confirmed["ndr"] = st.confirm(st.ndr, st.ndr_passes)
            confirmed["pdr"] = st.confirm(st.pdr, st.pdr_passes)
        else:
            confirmed = {"ndr": st.ndr.lower is not None, "pdr": st.pdr.lower is not None}
    except _BudgetSpent:
        pass  # stopped early: keep what was confirmed before the budget ran out
    return SearchResult(ndr_pps=st.ndr.lower or 0.0, pdr_pps=max(st.pdr.lower or 0.0, st.ndr.lower or 0.0),
                        trials=list(st.trials), ndr_confirmed=confirmed["ndr"],
                        pdr_confirmed=confirmed["pdr"])


def latency_rates(pdr_pps: float, fractions: tuple[float, ...] = (0.1, 0.5, 0.9)) -> list[float]:
    """The rates at which latency is measured: fractions of the PDR."""
    return [pdr_pps * f for f in fractions]
