"""The order of a side-by-side bench, so that it cannot favour a program: a seeded shuffle of the cases in
every iteration, the programs' load order rotated round after round, and each ratio's spread over rounds.

The seed is printed with the results and `l4lab bench --katran --seed N` replays the same order. The
load order matters as much as the changes the bench measures (docs/architecture.md, decisions: which
program's session tables were created first moved a new SYN's ratio from 0.88 to 1.28 in one harness),
so every program is loaded first in as many rounds as the others, give or take one.
"""

from __future__ import annotations

import random
import secrets
import statistics
from collections.abc import Iterator, MutableSequence, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

T = TypeVar("T")


def new_seed() -> int:
    """A seed for a run that was given none (printed, so the run can be replayed)."""
    return secrets.randbelow(1 << 32)


@dataclass
class Order:
    """One run's order: which program loads first in each round, and a fresh case order per iteration."""

    seed: int
    rng: random.Random = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    def shuffled(self, items: MutableSequence[T]) -> MutableSequence[T]:
        """items, shuffled in place with this run's generator (one call per iteration)."""
        self.rng.shuffle(items)
        return items

    def iterations(self, items: Sequence[T], count: int) -> Iterator[list[T]]:
        """`count` iterations of every item once, each in a new order."""
        work = list(items)
        for _ in range(count):
            self.rng.shuffle(work)
            yield work


def load_order(programs: Sequence[str], round_index: int) -> list[str]:
    """The programs in the order their maps are created in round `round_index`: rotated one place per
    round, so that with two programs each is created first in alternate rounds."""
    if not programs:
        return []
    k = round_index % len(programs)
    return list(programs[k:]) + list(programs[:k])


def above_floor_ratio(ours: float, theirs: float, floor: float) -> float:
    """(ours - floor) / (theirs - floor), NaN when the other program is not above the floor."""
    return (ours - floor) / (theirs - floor) if theirs > floor else float("nan")


@dataclass(frozen=True)
class Spread:
    """A ratio's per-round values: their median, range, and the median over rounds of each load order."""

    values: tuple[float, ...]
    by_first: dict[str, float]  # program created first -> median ratio of those rounds

    @classmethod
    def of(cls, values: Sequence[float], first: Sequence[str]) -> Spread:
        rounds: dict[str, list[float]] = {}
        for value, who in zip(values, first, strict=True):
            if value == value:  # NaN: the other program was not above the floor that round
                rounds.setdefault(who, []).append(value)
        return cls(tuple(values), {who: float(statistics.median(v)) for who, v in rounds.items()})

    @property
    def finite(self) -> list[float]:
        return [v for v in self.values if v == v]

    def text(self) -> str:
        """`rounds 0.55-0.63, median 0.58; l4lab first 0.57, katran first 0.60`, or '' without values."""
        got = self.finite
        if not got:
            return ""
        orders = ", ".join(f"{who} first {ratio:.2f}" for who, ratio in self.by_first.items())
        return f"rounds {min(got):.2f}-{max(got):.2f}, median {statistics.median(got):.2f}; {orders}"
