"""Maglev churn: ring disruption against 1/N and Katran, and live TCP connections while reals leave, join and drain.

Ring disruption (no lab): for N = 3, 10, 50, 100 equal-weight reals, removing one changes the
slots it owned plus a few others ("collateral"); collateral must stay ≤ 1 % of the ring, and is
reported beside the theoretical ring/N and Katran's figures (../shared/conformance/katran).

Live (topology `default`, every encap): CONNS long-lived connections to a line echo on each real
(ECHO_PORT, our own service: the lab's HTTP server closes every connection after one answer),
a request on each every INTERVAL_S, and a new connection every NEW_EVERY_S. The LB serves only
the echo VIP (one per family) unless said otherwise, while:

    remove  `lbctl real del` takes one of 3 reals off the VIP. No VIP uses it any more, so its
            lb_reals entry is cleared and sessions naming it no longer hold: the flow's next packet
            is hashed on the new ring to a surviving real, which has no such connection and answers
            RST. Flows of the removed real therefore fail fast by RESET (not timeout), within one
            request interval; flows of surviving reals see 0 resets; new flows land only on live
            reals. (The removed real, still running, keeps those connections open: nothing reaches
            it any more to end them.)
    add     `lbctl real add` brings the third real back: sessions keep every existing flow on its
            real (0 resets), and new flows reach the new real.
    drain   `lbctl real set-weight 0`: the real leaves the ring but stays in lb_reals, so its
            sessions hold: its existing flows keep being answered, and no new flow reaches it.
    no-lru  the VIP bypasses the session tables (lru = false) and the third real is added: every
            flow whose ring slot changed owner (to the new real, or Maglev's few collateral moves
            between the others) is sent there and reset, while the rest survive: the set of reset
            connections must *equal* the set whose owner changed.
    one VIP the topology's VIPs are served too and the real leaves only the echo VIP: its lb_reals
            entry stays (the other VIPs use it), but the controller flushes that VIP's sessions
            naming it, so its flows fail fast exactly as in "remove" (one encap per family).

Every process of the flows (client and echo servers) is pinned to CPU 0. On veth the LB's XDP
runs on the CPU that sent the frame, and the session tables are per CPU: unpinned, a client's ACKs
leave from whichever CPU took the server's reply, miss the session made on the other CPU and are
hashed on the new ring, so a drain or an add resets flows (measured: every flow of a drained real).
A NIC's RSS keeps a flow on one CPU; pinning is the lab's stand-in for it. Results: kind churn.

The oracle is exact, per connection: before and after the change each connection's ring owner is
asked of the loaded program itself (suites/conformance/_owners.py: a test run of its SYN on a
second program instance sharing the live VIP, real, ring and settings maps, with its own empty
session tables), and checked first against the real that really answered the connection.

Marked hardware: with --target the client and the echo servers run on the target's hosts over
ssh (they end when ssh's input closes) and the counters come from `lbctl stats --json` there.
A target's `time_scale` (Vagrant on TCG: lab/remote/target.py) multiplies INTERVAL_S, TIMEOUT_S,
NEW_EVERY_S and OBSERVE_S, and so FAIL_FAST_S: the same connections and the same assertions, at a
request rate the emulated hosts carry.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from balancer import config as cfg
from balancer import maglev
from balancer.encaps import IP4_IPIP, IP6_IP6IP6
from lab.dut import Capability
from lab.harness import Lab, LabBalancer
from lab.lbconf import real_addresses
from lab.nodes.churn_client import ChurnClient
from lab.nodes.tcp_services import Services
from reports.schema import ChurnPayload, ChurnPoint, ConnectionOutcomes, KatranChurn, write_result
from suites.conformance._counters import changed, counters
from suites.conformance._owners import owner_changed, ring_owners
from suites.corpus import corpus_file

from ._echo import ECHO_PORT

pytestmark = [pytest.mark.topology("default"), pytest.mark.hardware]
CONNS = 200
INTERVAL_S = 0.25
TIMEOUT_S = 2.0
NEW_EVERY_S = 0.05
OBSERVE_S = 2.5
FAIL_FAST_S = INTERVAL_S + TIMEOUT_S  # a flow of a removed real must have failed by then
RING = maglev.DEFAULT_RING_SIZE
MOVED = "real3"  # the real that is removed, added, drained


# ---- ring disruption, from the model the controller writes


def _katran() -> dict[int, dict[str, Any]]:
    """Katran's churn figures per n; a missing file skips the test, or fails it under CI, as every
    corpus file does (suites/corpus.py): the comparison is never dropped in silence."""
    return {int(p["n"]): p for p in json.loads(corpus_file("maglev_churn.json").read_text())}


def _reals(n: int) -> dict[int, tuple[str, int]]:
    return {i: (f"2001:db8:5::{i:x}", 1) for i in range(1, n + 1)}


@pytest.mark.needs(Capability.RING_READBACK)
@pytest.mark.parametrize("n", [3, 10, 50, 100])
def test_ring_disruption(n: int) -> None:
    reals = _reals(n)
    old = maglev.build_ring(reals, RING)
    gone = n // 2 + 1
    new = maglev.build_ring({i: r for i, r in reals.items() if i != gone}, RING)
    owned = int(np.count_nonzero(old == gone))
    changed = int(np.count_nonzero(old != new))
    added = maglev.build_ring({**reals, n + 1: ("2001:db8:5::ffff", 1)}, RING)
    gained = int(np.count_nonzero(added == n + 1))
    add_changed = int(np.count_nonzero(added != old))
    kat = _katran()[n]  # the corpus has every n of this test: a row missing is a failure, not a skip
    point = ChurnPoint(n=n, ring_size=RING, slots_owned_by_removed=owned, slots_changed=changed,
                       theoretical_slots=RING / n,
                       katran=KatranChurn(ring_size=RING, slots_owned_by_removed=int(kat["slots_owned_by_removed"]),
                                          slots_changed=int(kat["slots_changed"])))
    write_result("churn", f"test_ring_disruption[n{n}]", ChurnPayload(points=[point]))
    kat_text = (f"Katran: owned {kat['slots_owned_by_removed']}, changed {kat['slots_changed']}, "
                f"collateral {kat['collateral_moves']}")
    evidence = (f"n={n}: removed real owned {owned} of {RING} slots (ring/n {RING / n:.0f}), {changed} changed, "
                f"collateral {changed - owned}; add one: gained {gained}, changed {add_changed}; {kat_text}")
    assert abs(owned - RING / n) <= 1, evidence
    assert 0 <= changed - owned <= 0.01 * RING, evidence
    assert 0 <= add_changed - gained <= 0.01 * RING, evidence
    assert abs(gained - RING / (n + 1)) <= 1, evidence
    # the same order of collateral as Katran's Maglev (theirs: 15, 157, 302, 337 slots)
    assert changed - owned <= 2 * int(kat["collateral_moves"]), evidence


# ---- live connections


def _vip(lab: Lab, family: int) -> str:
    return next(str(v.address) for v in lab.topology.vips if v.address.version == family)


def _configure(balancer: LabBalancer, *, without: str | None = None, lru: bool = True, others: bool = False) -> None:
    """A TCP VIP on ECHO_PORT (per VIP address), optionally without one real, LRU on or off.

    Only that VIP unless `others` (the topology's VIPs too): then `lbctl real del` on the echo VIP
    leaves the real behind the others, its lb_reals entry stays, and sessions naming it hold."""
    conf = balancer.config_for(lru=lru)
    first: dict[Any, cfg.Vip] = {}
    for v in conf.vips:
        first.setdefault(v.address, v)
    vips = tuple(replace(v, port=ECHO_PORT, proto="tcp") for v in first.values())
    vips += conf.vips if others else ()
    if without:
        gone = real_addresses(balancer.lab.topology, balancer.family)[without]
        vips = tuple(replace(v, reals=tuple(r for r in v.reals if str(r.address) != gone)) for v in vips)
    balancer.apply(replace(conf, vips=vips))


def _real_cmd(balancer: LabBalancer, *args: str) -> Callable[[], None]:
    """A change: `lbctl real ARGS` on the echo VIP."""
    vip = _vip(balancer.lab, balancer.family)

    def change() -> None:
        balancer.lbctl("real", args[0], vip, str(ECHO_PORT), "tcp", *args[1:])
    return change


def _run(balancer: LabBalancer, change: Callable[[], None]) -> dict[str, Any]:
    """Connections up, then the change, then OBSERVE_S seconds; the client's report with the marks.

    Each connection's ring owner is asked of the loaded program before the change and after it
    (`_owners`: a test run on the live rings, no side effect): report["before"] and
    report["after"] map a connection's index to the real (node name) its ring slot names."""
    lab = balancer.lab
    vip = _vip(lab, balancer.family)
    k = _scale(lab)
    with ChurnClient(lab, "client", vip, ECHO_PORT, "--conns", str(CONNS),
                     "--interval", str(INTERVAL_S * k), "--timeout", str(TIMEOUT_S * k),
                     "--new-every", str(NEW_EVERY_S * k), "--cpu", "0") as client:
        before_owners = ring_owners(lab, balancer, vip, ECHO_PORT, client.ready["conns"])
        client.mark("change")
        before = counters(balancer)
        change()
        client.mark("applied")
        report = client.stop(after=OBSERVE_S * k)
    report["lb"] = changed(before, counters(balancer))
    report["before"] = before_owners
    report["after"] = ring_owners(lab, balancer, vip, ECHO_PORT, report["conns"])
    sys.stdout.write(f"\n{balancer.encap_id}: {_summary(report)}\n")
    _check_oracle(report)
    return report


def _scale(lab: Lab) -> float:
    """How many times slower than the netns lab the lab's hosts run (a target's time_scale, else 1)."""
    return lab.target.time_scale if lab.target is not None else 1.0


def _check_oracle(report: dict[str, Any]) -> None:
    """The oracle must name the real that really answered each connection before the change."""
    wrong = [(c["index"], c["node"], report["before"][c["index"]]) for c in report["conns"]
             if report["before"][c["index"]] != c["node"]]
    assert not wrong, (f"{len(wrong)} of {len(report['conns'])} connections were answered by another real than "
                       f"the loaded program's ring names (index, answered, predicted): {wrong[:5]}")


def _moved(report: dict[str, Any]) -> set[int]:
    """Connections whose ring owner the change moved."""
    return owner_changed(report["before"], report["after"])


def _fate(report: dict[str, Any], *statuses: str) -> set[int]:
    return {c["index"] for c in report["conns"] if c["status"] in statuses}


def _summary(report: dict[str, Any]) -> str:
    by: dict[str, dict[str, int]] = {}
    for c in report["conns"]:
        by.setdefault(c["node"], {}).setdefault(c["status"], 0)
        by[c["node"]][c["status"]] += 1
    new: dict[str, int] = {}
    for f in report["new"]:
        key = f.get("node") or f.get("error", "?")
        new[key] = new.get(key, 0) + 1
    odd = [c for c in report["conns"] if c["status"] not in ("ok", "reset")][:5]
    failed = [c["failed_at"] - report["marks"]["change"] for c in report["conns"] if c["failed_at"] is not None]
    fail_s = f"failed {min(failed):.2f}..{max(failed):.2f} s after the change" if failed else "none failed"
    owners = f"ring owner changed for {len(_moved(report))}; " if "after" in report else ""
    return (f"connections by real and fate: {by} ({fail_s}); {owners}new flows by real: {new}; "
            f"marks: {report['marks']}; "
            f"LB counters over the change: {report.get('lb')}; examples: {odd}")


def _new_after(report: dict[str, Any], mark: str) -> list[dict[str, Any]]:
    return [f for f in report["new"] if f["t"] > report["marks"][mark]]


def _lab_rings(balancer: LabBalancer) -> tuple[maglev.Ring, maglev.Ring, int]:
    """The rings of the lab's reals with and without MOVED as the controller builds them, and MOVED's id."""
    addrs = real_addresses(balancer.lab.topology, balancer.family)
    ids = {node: i for i, node in enumerate(sorted(addrs), start=1)}
    full = maglev.build_ring({ids[n]: (a, 1) for n, a in addrs.items()}, RING)
    less = maglev.build_ring({ids[n]: (a, 1) for n, a in addrs.items() if n != MOVED}, RING)
    return full, less, ids[MOVED]


def _point(balancer: LabBalancer, report: dict[str, Any]) -> ChurnPayload:
    """The lab's ring change (MOVED in or out of 3 reals) with what happened to the connections."""
    full, less, moved_id = _lab_rings(balancer)
    n = len(real_addresses(balancer.lab.topology, balancer.family))
    kat = _katran().get(n)
    conns = report["conns"]
    outcomes = ConnectionOutcomes(survived=sum(c["status"] == "ok" for c in conns),
                                  reset=sum(c["status"] == "reset" for c in conns),
                                  failed_fast=sum(c["status"] in ("reset", "timeout") for c in conns))
    return ChurnPayload(points=[ChurnPoint(
        n=n, ring_size=RING, slots_owned_by_removed=int(np.count_nonzero(full == moved_id)),
        slots_changed=int(np.count_nonzero(full != less)), theoretical_slots=RING / n, connections=outcomes,
        katran=KatranChurn(ring_size=RING, slots_owned_by_removed=int(kat["slots_owned_by_removed"]),
                           slots_changed=int(kat["slots_changed"])) if kat else None)])


@pytest.mark.needs(Capability.CONSISTENT_HASHING, Capability.OWNER_QUERY)
def test_remove_real(balancer: LabBalancer, echoes: Services) -> None:
    _configure(balancer)
    _check_removal(balancer, "test_remove_real")


@pytest.mark.needs(Capability.CONSISTENT_HASHING, Capability.OWNER_QUERY)
@pytest.mark.parametrize("encap", [IP4_IPIP, IP6_IP6IP6])
def test_remove_real_from_one_vip(balancer: LabBalancer, echoes: Services) -> None:
    """The real leaves the echo VIP but still serves the topology's other VIPs: the controller flushes
    that VIP's sessions of the real, so its flows fail fast exactly as when it leaves every VIP."""
    _configure(balancer, others=True)
    _check_removal(balancer, "test_remove_real_from_one_vip")


def _check_removal(balancer: LabBalancer, test: str) -> None:
    address = real_addresses(balancer.lab.topology, balancer.family)[MOVED]
    report = _run(balancer, _real_cmd(balancer, "del", address))
    change = report["marks"]["change"]
    survivors = [c for c in report["conns"] if c["node"] != MOVED]
    victims = [c for c in report["conns"] if c["node"] == MOVED]
    write_result("churn", f"{test}[{balancer.encap_id}]", _point(balancer, report))

    evidence = _summary(report)
    assert victims and survivors, f"the {CONNS} connections did not spread over the reals: {evidence}"
    broken = [c for c in survivors if c["status"] != "ok"]
    assert not broken, f"{len(broken)} flows of surviving reals broke: {broken[:5]}; {evidence}"
    alive = [c for c in victims if c["status"] not in ("reset", "timeout")]
    assert not alive, f"{len(alive)} flows of the removed {MOVED} still answer: {alive[:3]}; {evidence}"
    fail_fast = FAIL_FAST_S * _scale(balancer.lab)
    slow = [c for c in victims if c["failed_at"] - change > fail_fast + _apply_time(report)]
    assert not slow, f"{len(slow)} flows of {MOVED} took longer than {fail_fast:g} s to fail: {slow[:3]}"
    kinds = {c["status"] for c in victims}
    assert kinds == {"reset"}, f"flows of the removed real should be reset by a surviving real, got {kinds}"
    # Exact: the reset flows are those the old ring gave MOVED, and the new ring gives each of them
    # to a surviving real (which holds no such connection: it answers RST).
    owned = {i for i, node in report["before"].items() if node == MOVED}
    assert _fate(report, "reset", "timeout") == owned, \
        f"reset {sorted(_fate(report, 'reset', 'timeout'))} but the ring gave {MOVED} {sorted(owned)}; {evidence}"
    still = [i for i in owned if report["after"][i] == MOVED]
    assert not still, f"after the removal the ring still gives {MOVED} connections {still[:5]}"
    late = [f for f in _new_after(report, "applied") if f.get("node") != MOVED and "error" not in f]
    wrong = [f for f in _new_after(report, "applied") if f not in late]
    assert late and not wrong, f"new flows after the removal reached {MOVED} or failed: {wrong[:5]}; {evidence}"


def _apply_time(report: dict[str, Any]) -> float:
    return float(report["marks"]["applied"] - report["marks"]["change"])


@pytest.mark.needs(Capability.CONSISTENT_HASHING, Capability.OWNER_QUERY)
def test_add_real(balancer: LabBalancer, echoes: Services) -> None:
    _configure(balancer, without=MOVED)
    address = real_addresses(balancer.lab.topology, balancer.family)[MOVED]
    report = _run(balancer, _real_cmd(balancer, "add", address))
    evidence = _summary(report)
    assert all(c["node"] != MOVED for c in report["conns"]), f"{MOVED} served before it was added: {evidence}"
    broken = [c for c in report["conns"] if c["status"] != "ok"]
    assert not broken, f"{len(broken)} established flows broke when {MOVED} joined (LRU on): {broken[:5]}; {evidence}"
    held = _moved(report)
    assert any(report["after"][i] == MOVED for i in held), \
        f"the new ring should give {MOVED} some connections (the LRU holding them where they are): {evidence}"
    late = _new_after(report, "applied")
    assert any(f.get("node") == MOVED for f in late), f"no new flow reached the added {MOVED}: {evidence}"
    assert all("error" not in f for f in late), f"new flows failed after the add: {evidence}"
    write_result("churn", f"test_add_real[{balancer.encap_id}]", _point(balancer, report))


@pytest.mark.needs(Capability.WEIGHTS, Capability.OWNER_QUERY)
def test_drain_real(balancer: LabBalancer, echoes: Services) -> None:
    _configure(balancer)
    address = real_addresses(balancer.lab.topology, balancer.family)[MOVED]
    report = _run(balancer, _real_cmd(balancer, "set-weight", address, "--weight", "0"))
    evidence = _summary(report)
    drained = [c for c in report["conns"] if c["node"] == MOVED]
    assert drained, f"no connection reached {MOVED} before the drain: {evidence}"
    broken = [c for c in report["conns"] if c["status"] != "ok"]
    assert not broken, f"{len(broken)} flows broke during the drain: {broken[:5]}; {evidence}"
    # Every flow of the drained real changes ring owner (plus Maglev's few collateral moves among
    # the others); the sessions hold all of them, so none broke (asserted above).
    assert {c["index"] for c in drained} <= _moved(report), \
        f"the drain should take every flow of {MOVED} off the ring (sessions hold them): {evidence}"
    idle = [c for c in drained if (c["last_ok_at"] or 0) <= report["marks"]["applied"]]
    assert not idle, f"{len(idle)} flows of the drained {MOVED} got no answer after the drain: {evidence}"
    late = _new_after(report, "applied")
    assert late and all(f.get("node") not in (MOVED, None) for f in late), \
        f"new flows reached the drained {MOVED} or failed: {evidence}"
    write_result("churn", f"test_drain_real[{balancer.encap_id}]", _point(balancer, report))


@pytest.mark.needs(Capability.SESSION_TABLE_OFF, Capability.OWNER_QUERY)
def test_add_real_without_lru(balancer: LabBalancer, echoes: Services) -> None:
    _configure(balancer, without=MOVED, lru=False)
    address = real_addresses(balancer.lab.topology, balancer.family)[MOVED]
    report = _run(balancer, _real_cmd(balancer, "add", address))
    payload = _point(balancer, report)
    write_result("churn", f"test_add_real_without_lru[{balancer.encap_id}]", payload)
    evidence = _summary(report)
    kinds = {c["status"] for c in report["conns"]}
    assert kinds <= {"ok", "reset"}, f"without the LRU a moved flow should be reset, got {kinds}: {evidence}"
    # Exact, per connection: the flows whose ring owner changed (to MOVED) are the reset ones.
    moved, reset = _moved(report), _fate(report, "reset")
    assert any(report["after"][i] == MOVED for i in moved), f"adding {MOVED} gave it no connection: {evidence}"
    assert reset == moved, (f"{len(reset)} of {CONNS} flows reset, {len(moved)} changed ring owner: reset but kept "
                            f"{sorted(reset - moved)[:5]}, moved but not reset {sorted(moved - reset)[:5]}; {evidence}")
    sys.stdout.write(f"{balancer.encap_id}: without the LRU {len(reset)} of {CONNS} connections reset, "
                     f"exactly those whose ring owner changed\n")
