"""test_order.py: the side-by-side bench's order (lab/bench/order.py): a seed replays it, every iteration is
a new permutation of every case, each program is loaded first in alternate rounds, and a ratio's spread
is read per round and per load order."""

from __future__ import annotations

import math
from collections import Counter

import pytest

from lab.bench import cli as bench_cli
from lab.bench.order import Order, Spread, above_floor_ratio, load_order


def test_a_seed_replays_the_same_order_and_another_seed_does_not() -> None:
    cases = [f"case-{i}" for i in range(16)]
    first = [list(turn) for turn in Order(1234).iterations(cases, 50)]
    assert [list(turn) for turn in Order(1234).iterations(cases, 50)] == first
    assert [list(turn) for turn in Order(1235).iterations(cases, 50)] != first


def test_every_iteration_runs_every_case_once_and_no_case_keeps_a_place() -> None:
    cases = [f"case-{i}" for i in range(16)]
    places: dict[str, Counter[int]] = {c: Counter() for c in cases}
    for turn in Order(7).iterations(cases, 1600):
        assert sorted(turn) == sorted(cases)
        for place, c in enumerate(turn):
            places[c][place] += 1
    for c, seen in places.items():
        # 1,600 iterations over 16 places: 100 expected in each; a fixed order would put 1,600 in one.
        assert len(seen) == 16 and max(seen.values()) < 160, (c, seen)


def test_each_program_is_loaded_first_in_alternate_rounds() -> None:
    assert [load_order(["l4lab", "katran"], r)[0] for r in range(6)] == ["l4lab", "katran"] * 3
    assert [load_order(["l4lab", "katran", "base"], r) for r in range(3)] == [
        ["l4lab", "katran", "base"], ["katran", "base", "l4lab"], ["base", "l4lab", "katran"]]


def test_a_ratio_spread_is_read_per_round_and_per_load_order() -> None:
    assert above_floor_ratio(130, 180, 80) == pytest.approx(0.5)
    assert math.isnan(above_floor_ratio(130, 80, 80)), "the other program not above the floor: no ratio"
    spread = Spread.of([0.5, 0.7, 0.6, float("nan")], ["l4lab", "katran", "l4lab", "katran"])
    assert spread.by_first == {"l4lab": pytest.approx(0.55), "katran": pytest.approx(0.7)}
    assert spread.text() == "rounds 0.50-0.70, median 0.60; l4lab first 0.55, katran first 0.70"
    assert Spread.of([float("nan")], ["l4lab"]).text() == ""


def test_seed_needs_katran_and_a_32_bit_value(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_cli.main(["--seed", "5"]) == 2
    assert "it needs --katran" in capsys.readouterr().err
