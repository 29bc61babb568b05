"""The balancer's counters read in-process from its pins (no lbctl subprocess), and their change over a step.

    before = counters(balancer)
    ...
    changed(before, counters(balancer))  # {"TX_ENCAP": 1469, "LRU_HIT": 1200, ...}: only non-zero changes
"""

from __future__ import annotations

from typing import Any

from balancer.controller import Instance
from lab.harness import LabBalancer


def counters(balancer: LabBalancer) -> dict[str, Any]:
    """What `lbctl stats --json` prints for the balancer's instance (asked over ssh on a --target lab)."""
    if balancer.lab.target is not None:
        return balancer.stats()
    inst = Instance.open(balancer.instance)
    try:
        return inst.stats()
    finally:
        inst.close()


def changed(before: dict[str, Any], after: dict[str, Any]) -> dict[str, int]:
    """Reasons (packets) and events that changed between two readings, with their increase."""
    out = {k: int(v["packets"] - before["reasons"][k]["packets"]) for k, v in after["reasons"].items()}
    out |= {k: int(v - before["events"][k]) for k, v in after["events"].items()}
    return {k: v for k, v in out.items() if v}
