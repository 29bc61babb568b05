"""mlrsearch_compare.py: lab/bench/ndr.py's NDR/PDR search against FD.io CSIT's MLRsearch on the same devices.

    .venv/bin/pip install MLRsearch==1.2.1      # not a dependency of l4lab: this script only measures
    .venv/bin/python scripts/mlrsearch_compare.py

The devices are suites/bench/test_ndr.py's model (a capacity, ±noise per trial, no buffer): 0.6, 1.3,
2.7 and 4.1 Mpps, without noise and with ±3 %. Both searches get the bench's full settings (0.5 s short
trials, 5 s full trials, 2 % width, NDR at 0 loss and PDR at 0.5 %); MLRsearch with exceed ratio 0 and
a duration sum of one full trial (the classic RFC 2544 reading), for each number of preceding targets.
Printed per search: trials, trial seconds, and the NDR found as a share of the true capacity.
docs/architecture.md (decisions) quotes the result.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from MLRsearch import AbstractMeasurer, Config, MeasurementResult, MultipleLossRatioSearch, SearchGoal

from lab.bench.ndr import SearchSettings, search

SETTINGS = SearchSettings(max_rate_pps=12e6, min_rate_pps=1e4, short_s=0.5, full_s=5.0, width=0.02, max_trials=30)
DEVICES = [(cap, noise) for cap in (0.6e6, 1.3e6, 2.7e6, 4.1e6) for noise in (0.0, 0.03)]
Trial = Callable[[float, float], float]


def device(capacity: float, noise: float, seed: int = 7) -> Trial:
    rnd = random.Random(seed)

    def trial(rate: float, duration: float) -> float:
        cap = capacity * (1 + rnd.uniform(-noise, noise))
        return min(1.0, max(0.0, (rate - cap) * duration) / (rate * duration))
    return trial


class Measurer(AbstractMeasurer):
    """MLRsearch's measurer over a trial callable, counting the trials."""

    def __init__(self, trial: Trial) -> None:
        self.trial = trial
        self.durations: list[float] = []

    def measure(self, intended_duration: float, intended_load: float) -> MeasurementResult:
        loss = self.trial(intended_load, intended_duration)
        self.durations.append(intended_duration)
        offered = max(1, round(intended_load * intended_duration))
        return MeasurementResult(intended_duration=intended_duration, intended_load=intended_load,
                                 offered_count=offered, loss_count=round(loss * offered))


def mlr_ndr(trial: Trial, preceding: int) -> tuple[float, list[float]]:
    s = SETTINGS
    goal = {"exceed_ratio": 0.0, "relative_width": s.width, "initial_trial_duration": s.short_s,
            "final_trial_duration": s.full_s, "duration_sum": s.full_s, "preceding_targets": preceding,
            "fail_fast": False}
    ndr, pdr = SearchGoal(loss_ratio=0.0, **goal), SearchGoal(loss_ratio=s.pdr_loss, **goal)
    cfg = Config()
    cfg.goals = [ndr, pdr]
    cfg.min_load, cfg.max_load, cfg.search_duration_max, cfg.warmup_duration = s.min_rate_pps, s.max_rate_pps, 3600, None
    measurer = Measurer(trial)
    found = MultipleLossRatioSearch(cfg).search(measurer, debug=lambda _line: None)[ndr].conditional_throughput
    return (float(found) if found is not None else 0.0), measurer.durations


def main() -> None:
    rows: dict[str, tuple[int, float, list[float]]] = {}
    for cap, noise in DEVICES:
        durations: list[float] = []
        result = search(lambda rate, dur, t=device(cap, noise): (durations.append(dur), t(rate, dur))[1], SETTINGS)
        n, s, shares = rows.get("lab/bench/ndr.py", (0, 0.0, []))
        rows["lab/bench/ndr.py"] = (n + len(durations), s + sum(durations), [*shares, result.ndr_pps / cap])
        for preceding in (1, 2, 3):
            got, durs = mlr_ndr(device(cap, noise), preceding)
            key = f"MLRsearch, {preceding} preceding target{'s' if preceding > 1 else ''}"
            n, s, shares = rows.get(key, (0, 0.0, []))
            rows[key] = (n + len(durs), s + sum(durs), [*shares, got / cap])
    print(f"{len(DEVICES)} devices, 0.5 s / 5 s trials, 2 % width:")
    for name, (n, s, shares) in rows.items():
        print(f"  {name:<34} {n:3d} trials {s:6.1f} trial seconds; NDR ÷ capacity "
              f"{min(shares):.3f}-{max(shares):.3f}, mean {sum(shares) / len(shares):.3f}")


if __name__ == "__main__":
    main()
