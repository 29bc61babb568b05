"""Churn from outside, for every DUT: which flows move when a real leaves, joins or is drained, and what breaks.

Topology `default`, every encap the DUT offers. Two things are measured around one change:

* where new flows go. PROBES fixed TCP flows (client address, source port) are placed before the
  change and again after it, each time as new flows (a SYN every DUT places by its hash; a DUT
  with a connection table first forgets them: `Dut.settle`), and each flow's real is read in its
  answer. The set of flows whose real changed is set against the least any change of that kind
  can move: the removed or drained real's own flows (about 1/N of them), or the flows the added
  real takes (about 1/(N+1)). Moves beyond those ("collateral") may be at most COLLATERAL_LIMIT
  of the other flows: Maglev's own disruption is a few per cent.
* what happens to established connections. CONNS long-lived connections to a line echo
  (ECHO_PORT) run through the change, a request on each every INTERVAL_S, and a new connection
  opens every NEW_EVERY_S (lab/nodes/churn_client.py, pinned to CPU 0 with the echo servers:
  Katran's session tables are per CPU, and veth runs XDP on the sender's CPU). A connection of a
  real that stays must not break (0 resets, 0 timeouts, 0 answered by another real); after a drain
  the drained real's own connections go on too; new connections never reach a removed or drained
  real, and reach an added one.

What becomes of a removed real's own connections is recorded, not judged: l4lab resets them
(its sessions name a real that left), Katran's sessions keep sending them to the real, IPVS drops
them (`expire_nodest_conn` is off by default). l4lab's white-box forms, each connection's ring
owner asked of the loaded program, are test_churn.py's.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from balancer.encaps import SAME_FAMILY, EncapCase
from lab.dut import Capability, Dut
from lab.nodes.churn_client import ChurnClient
from lab.nodes.tcp_services import Services
from reports.schema import ConformanceFigure as Figure

from ._echo import ECHO_PORT
from ._traffic import Flow, owners

pytestmark = [pytest.mark.topology("default")]
CONNS = 100
INTERVAL_S = 0.25
TIMEOUT_S = 2.0
NEW_EVERY_S = 0.1
OBSERVE_S = 2.0
PROBES = 120
COLLATERAL_LIMIT = 0.05
MOVED = "real3"  # the real that leaves, joins or is drained


@dataclass
class Churn:
    """New-flow placement before and after a change, and the connections' fates across it."""

    before: dict[Flow, str]
    after: dict[Flow, str]
    report: dict[str, Any]

    @property
    def moved(self) -> set[Flow]:
        return {f for f, real in self.before.items() if self.after[f] != real}

    def of(self, real: str, when: str = "before") -> set[Flow]:
        placed = self.before if when == "before" else self.after
        return {f for f, r in placed.items() if r == real}

    def broken(self, keep: Callable[[dict[str, Any]], bool] = lambda c: True) -> list[dict[str, Any]]:
        return [c for c in self.report["conns"] if keep(c) and c["status"] != "ok"]

    def new_after_change(self) -> list[dict[str, Any]]:
        return [f for f in self.report["new"] if f["t"] > self.report["marks"]["applied"]]

    def summary(self) -> str:
        fates: dict[str, dict[str, int]] = {}
        for c in self.report["conns"]:
            fates.setdefault(c["node"], {}).setdefault(c["status"], 0)
            fates[c["node"]][c["status"]] += 1
        new: dict[str, int] = {}
        for f in self.new_after_change():
            new[f.get("node") or f.get("error", "?")] = new.get(f.get("node") or f.get("error", "?"), 0) + 1
        return (f"connections by real and fate {fates}; new flows after the change {new}; "
                f"{len(self.moved)} of {len(self.before)} probe flows moved")


def _base(encap: EncapCase, test: int) -> int:
    """The probes' first source port: distinct per encap and check, the same before and after, and
    below the ephemeral range (32768 on): a closed connection of the churn client lingers in
    TIME-WAIT on its port, which a probe could then not take."""
    return 10000 + 3000 * SAME_FAMILY.index(encap) + 1000 * test


def _churn(lab: Any, dut: Dut, encap: EncapCase, change: Callable[[], None], test: int) -> Churn:
    before = owners(lab, dut, PROBES, _base(encap, test))
    with ChurnClient(lab, "client", dut.vips()[0], ECHO_PORT, "--conns", str(CONNS), "--interval",
                     str(INTERVAL_S), "--timeout", str(TIMEOUT_S), "--new-every", str(NEW_EVERY_S),
                     "--cpu", "0") as client:
        client.mark("change")
        change()
        client.mark("applied")
        report = client.stop(after=OBSERVE_S)
    churn = Churn(before, owners(lab, dut, PROBES, _base(encap, test)), report)
    sys.stdout.write(f"\n{dut.name} {encap}: {churn.summary()}\n")
    return churn


def _collateral(churn: Churn, least: set[Flow], dut: Dut, figures: list[Figure]) -> None:
    """The flows that moved beyond `least` (those the change had to move) stay few; the figures."""
    others = set(churn.before) - least
    collateral = churn.moved - least
    n = len(dut.reals())
    figures += [Figure("probe flows moved", round(100 * len(churn.moved) / len(churn.before), 1), "%"),
                Figure("least the change moves", round(100 * len(least) / len(churn.before), 1), "%"),
                Figure("collateral moves", round(100 * len(collateral) / max(1, len(others)), 1), "%"),
                Figure("1/N", round(100 / n, 1), "%")]
    assert len(collateral) <= COLLATERAL_LIMIT * len(others), \
        (f"{len(collateral)} of {len(others)} flows of the other reals moved too (collateral above "
         f"{COLLATERAL_LIMIT:.0%}): {sorted(collateral)[:5]}; {churn.summary()}")


@pytest.mark.needs(Capability.CONSISTENT_HASHING)
def test_removing_a_real_moves_only_its_flows_and_breaks_no_other(
        lab: Any, dut: Dut, dut_encap: EncapCase, echoes: Services, dut_figures: list[Figure]) -> None:
    dut.configure(dut_encap, extra_ports=[(ECHO_PORT, "tcp")])
    churn = _churn(lab, dut, dut_encap, lambda: dut.remove_real(MOVED), 0)
    owned = churn.of(MOVED)
    assert owned, f"no probe flow reached {MOVED} before its removal: {churn.summary()}"
    assert not churn.of(MOVED, "after"), f"new flows still reach the removed {MOVED}: {churn.summary()}"
    _collateral(churn, owned, dut, dut_figures)
    broken = churn.broken(lambda c: c["node"] != MOVED)
    assert not broken, f"{len(broken)} connections of the reals that stay broke: {broken[:5]}; {churn.summary()}"
    late = churn.new_after_change()
    assert late and all(f.get("node") not in (MOVED, None) for f in late), \
        f"new connections after the removal failed or reached {MOVED}: {churn.summary()}"
    theirs = [c["status"] for c in churn.report["conns"] if c["node"] == MOVED]
    dut_figures += [Figure("connections of the other reals broken", 0)] + [
        Figure(f"removed real's connections: {s}", theirs.count(s)) for s in sorted(set(theirs))]


@pytest.mark.needs(Capability.CONSISTENT_HASHING)
def test_adding_a_real_moves_only_the_flows_it_takes_and_breaks_none(
        lab: Any, dut: Dut, dut_encap: EncapCase, echoes: Services, dut_figures: list[Figure]) -> None:
    dut.configure(dut_encap, extra_ports=[(ECHO_PORT, "tcp")])
    dut.remove_real(MOVED)
    churn = _churn(lab, dut, dut_encap, lambda: dut.add_real(MOVED), 1)
    assert not churn.of(MOVED), f"{MOVED} took flows before it was added: {churn.summary()}"
    gained = churn.of(MOVED, "after")
    assert gained, f"no new flow reached the added {MOVED}: {churn.summary()}"
    _collateral(churn, gained, dut, dut_figures)
    broken = churn.broken()
    assert not broken, f"{len(broken)} established connections broke when {MOVED} joined: {broken[:5]}"
    late = churn.new_after_change()
    assert late and all("error" not in f for f in late), f"new connections failed after the add: {churn.summary()}"
    assert any(f.get("node") == MOVED for f in late), f"no new connection reached the added {MOVED}"
    dut_figures.append(Figure("connections broken", 0))


@pytest.mark.needs(Capability.WEIGHTS)
def test_a_drained_real_keeps_its_connections_and_gets_no_new_flow(
        lab: Any, dut: Dut, dut_encap: EncapCase, echoes: Services, dut_figures: list[Figure]) -> None:
    dut.configure(dut_encap, extra_ports=[(ECHO_PORT, "tcp")])
    churn = _churn(lab, dut, dut_encap, lambda: dut.set_weight(MOVED, 0), 2)
    owned = churn.of(MOVED)
    assert owned, f"no probe flow reached {MOVED} before the drain: {churn.summary()}"
    assert not churn.of(MOVED, "after"), f"new flows still reach the drained {MOVED}: {churn.summary()}"
    _collateral(churn, owned, dut, dut_figures)
    broken = churn.broken()
    assert not broken, f"{len(broken)} connections broke during the drain: {broken[:5]}; {churn.summary()}"
    drained = [c for c in churn.report["conns"] if c["node"] == MOVED]
    idle = [c for c in drained if (c["last_ok_at"] or 0) <= churn.report["marks"]["applied"]]
    assert drained and not idle, \
        f"{len(idle)} of {len(drained)} connections of the drained {MOVED} got no answer after the drain"
    late = churn.new_after_change()
    assert late and all(f.get("node") not in (MOVED, None) for f in late), \
        f"new connections after the drain failed or reached {MOVED}: {churn.summary()}"
    dut_figures += [Figure("connections broken", 0), Figure("drained real's connections answered", len(drained))]
