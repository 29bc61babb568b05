"""Unit tests of lab/bench/ndr.py: the NDR/PDR search against synthetic devices whose true rates are known."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from lab.bench.ndr import PDR_LOSS, SearchError, SearchSettings, latency_rates, search

Trial = Callable[[float, float], float]


def device(capacity: float, buffer_frames: float = 0.0, noise: float = 0.0, seed: int = 7) -> Trial:
    """A device forwarding `capacity` pps; a buffer absorbs `buffer_frames` of excess per trial."""
    rnd = random.Random(seed)

    def trial(rate: float, duration: float) -> float:
        cap = capacity * (1 + rnd.uniform(-noise, noise))
        lost = max(0.0, (rate - cap) * duration - buffer_frames)
        return min(1.0, lost / (rate * duration))

    return trial


def constant_loss(loss: float) -> Trial:
    """A device that loses the same share of frames at every rate (a lossy link)."""
    return lambda rate, duration: loss


SETTINGS = SearchSettings(max_rate_pps=10e6, short_s=0.5, full_s=5.0, width=0.02)


@pytest.mark.parametrize("capacity", [0.3e6, 1e6, 3e6, 7.5e6])
def test_ndr_and_pdr_bracket_the_true_rates(capacity: float) -> None:
    result = search(device(capacity), SETTINGS)
    # NDR: the highest zero-loss rate is the capacity; PDR: capacity / (1 − 0.5 %).
    assert capacity * (1 - SETTINGS.width) <= result.ndr_pps <= capacity
    true_pdr = capacity / (1 - PDR_LOSS)
    assert true_pdr * (1 - 2 * SETTINGS.width) <= result.pdr_pps <= true_pdr
    assert result.ndr_confirmed and result.pdr_confirmed
    assert result.throughput_pps == result.ndr_pps
    assert result.pdr_pps >= result.ndr_pps


def test_every_trial_is_recorded_in_order_with_its_phase() -> None:
    seen: list[tuple[float, float]] = []
    model = device(2e6)

    def trial(rate: float, duration: float) -> float:
        seen.append((rate, duration))
        return model(rate, duration)

    result = search(trial, SETTINGS)
    assert [(t.rate_pps, t.duration_s) for t in result.trials] == seen
    assert result.trials[0].phase == "max" and result.trials[0].rate_pps == SETTINGS.max_rate_pps
    assert {t.phase for t in result.trials[1:]} <= {"short", "confirm", "full"}


def test_short_trials_come_first_and_full_length_confirms_at_the_end() -> None:
    result = search(device(2e6), SETTINGS)
    durations = [t.duration_s for t in result.trials]
    first_full = durations.index(SETTINGS.full_s)
    assert all(d == SETTINGS.short_s for d in durations[:first_full])
    assert all(d == SETTINGS.full_s for d in durations[first_full:])
    confirms = [t for t in result.trials if t.phase == "confirm"]
    assert [t.rate_pps for t in confirms if t.loss == 0][0] == result.ndr_pps


def test_a_buffer_that_hides_loss_in_short_trials_is_caught_by_the_full_length_trials() -> None:
    capacity, buffer_frames = 2e6, 2e5  # 0.5 s trials hide 0.4 Mpps of excess, 5 s trials 0.04 Mpps
    result = search(device(capacity, buffer_frames), SETTINGS)
    short_passes = [t.rate_pps for t in result.trials if t.duration_s == SETTINGS.short_s and t.loss == 0]
    assert max(short_passes) > capacity * 1.1  # the short trials were fooled...
    assert any(t.phase == "confirm" and t.loss > 0 for t in result.trials)
    true_ndr = capacity + buffer_frames / SETTINGS.full_s
    assert true_ndr * (1 - SETTINGS.width) <= result.ndr_pps <= true_ndr  # ...the result was not
    assert result.ndr_confirmed


def test_a_device_faster_than_the_maximum_rate_passes_at_the_maximum_in_two_trials() -> None:
    result = search(device(50e6), SETTINGS)
    assert result.ndr_pps == result.pdr_pps == SETTINGS.max_rate_pps
    assert len(result.trials) == 2


def test_constant_small_loss_has_no_ndr_but_a_pdr() -> None:
    result = search(constant_loss(0.001), SETTINGS)
    assert result.ndr_pps == 0 and not result.ndr_confirmed and result.throughput_pps == 0
    assert result.pdr_pps == SETTINGS.max_rate_pps and result.pdr_confirmed


def test_a_device_that_loses_even_at_the_minimum_rate_reports_zero() -> None:
    result = search(constant_loss(0.5), SETTINGS)
    assert result.ndr_pps == 0 and result.pdr_pps == 0
    assert not result.ndr_confirmed and not result.pdr_confirmed
    assert min(t.rate_pps for t in result.trials) == SETTINGS.min_rate_pps


def test_noise_of_ten_percent_still_lands_near_the_capacity() -> None:
    capacity = 3e6
    result = search(device(capacity, noise=0.1, seed=3), SETTINGS)
    assert capacity * 0.85 <= result.ndr_pps <= capacity * 1.1
    assert len(result.trials) <= SETTINGS.max_trials


@pytest.mark.parametrize("seed", range(5))
def test_the_trial_budget_is_never_exceeded(seed: int) -> None:
    rnd = random.Random(seed)
    chaotic = SearchSettings(max_rate_pps=10e6, short_s=0.5, full_s=5.0, width=0.02, max_trials=8)
    result = search(lambda rate, duration: rnd.choice([0.0, 0.003, 0.2]), chaotic)
    assert len(result.trials) <= 8
    tight = SearchSettings(max_rate_pps=10e6, short_s=0.5, full_s=5.0, width=0.02, max_trials=3)
    result = search(device(3e6), tight)
    assert len(result.trials) == 3 and not result.ndr_confirmed


def test_without_a_longer_final_duration_the_short_bounds_stand() -> None:
    same = SearchSettings(max_rate_pps=10e6, short_s=1.0, full_s=1.0, width=0.02)
    result = search(device(2e6), same)
    assert {t.duration_s for t in result.trials} == {1.0}
    assert 2e6 * 0.98 <= result.ndr_pps <= 2e6 and result.ndr_confirmed


@pytest.mark.parametrize(("settings", "message"), [
    (SearchSettings(max_rate_pps=1e6, min_rate_pps=2e6), "min_rate"),
    (SearchSettings(max_rate_pps=1e6, short_s=2.0, full_s=1.0), "short"),
    (SearchSettings(max_rate_pps=1e6, width=1.5), "width"),
    (SearchSettings(max_rate_pps=1e6, max_trials=1), "max_trials"),
])
def test_impossible_settings_are_refused_by_name(settings: SearchSettings, message: str) -> None:
    with pytest.raises(SearchError, match=message):
        search(device(1e6), settings)


def test_a_trial_returning_a_loss_outside_0_to_1_is_refused() -> None:
    with pytest.raises(SearchError, match="loss ratio is 0..1"):
        search(lambda rate, duration: 1.5, SETTINGS)


def test_latency_rates_are_10_50_90_percent_of_pdr() -> None:
    assert latency_rates(2e6) == pytest.approx([2e5, 1e6, 1.8e6])
