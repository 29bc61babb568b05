"""Mixed fleets: Katran and l4lab nodes behind one ECMP router keep every connection on its real (issue 31).

Topology multi-lb (lab/topologies/multi-lb.toml): the router learns the VIP from lb1 and lb2 by BGP
(BFD on) and spreads flows over them with the L4 multipath hash. 200 long-lived TCP connections to a
line echo on the three reals (weights 1, 2, 3) each ask every 0.2 s, and name the real that answers.
A reshuffle gives the router's multipath hash a new seed (lab/mixed_fleet.py): about half of the
connections move to the other LB node, which has no session for them and must hash them onto the
real they already have, or the real it picks answers their next segment with a reset.

- Katran beside l4lab (L4LAB_KATRAN_SRC): lb1 runs Katran's balancer with the ring Katran's own code
  builds (Maglev V1, its default), lb2 l4lab with `hash = "katran"`. Before anything moves, the l4lab
  node's ring gives every connection, including those through Katran, the real that answers it.
  Then three reshuffles; then lb1 dies silently (Katran detached, its FRR frozen: only BFD tells the
  router), comes back as a fresh Katran (no sessions), and lb2 dies silently. 0 connections may break
  and none may change its real; new connections are answered throughout.
- Two l4lab nodes, one in each hashing mode (always runs): lb1 hashes as l4lab does, lb2 as Katran
  does. After three reshuffles the connections that broke must be exactly those the rings predict:
  moved to a node whose ring gives them another real. Some must break: that is what the mode prevents.
  The prediction is checked first against what is running: the router's route lookup and the node's
  ring owner, for every connection, name the real that answered it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from balancer.controller import Instance
from balancer.encaps import IP4_IPIP
from lab import frr, netns, topology
from lab.dut import katran
from lab.harness import LabBalancer, NetnsLab, poll, unique_name
from lab.lbconf import lb_link, real_addresses
from lab.mixed_fleet import KatranNode, ecmp_paths, reshuffle
from lab.nodes.churn_client import ChurnClient
from lab.nodes.tcp_services import Services
from lab.state import LabState, state_dir
from reports import schema
from suites.conformance._owners import ring_owners
from suites.lab import probes
from suites.lab.probes import bpf_available

VIP = "198.51.100.100"
PORT = 7011
CONNS = 200
SEEDS = (101, 202, 303)  # three reshuffles
WEIGHTS = {"real1": 1, "real2": 2, "real3": 3}
WINDOW_S = 1.0  # after each event: every connection asks ~5 times (interval 0.2 s) before the next
CLIENT_ARGS = ("--conns", str(CONNS), "--interval", "0.2", "--timeout", "6", "--new-every", "0.5", "--cpu", "0")


def skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "the mixed-fleet lab needs root"
    return frr.missing() or bpf_available()


pytestmark = pytest.mark.skipif(skip_reason() is not None, reason=str(skip_reason()))


@pytest.fixture
def lab() -> Iterator[NetnsLab]:
    """Name: lab. Scope: function (each test kills nodes). Depends: root, FRR, built BPF objects.

    The multi-lb topology under a unique name, torn down afterwards (frozen daemons thawed first)::

        def test_x(lab):
            ecmp_paths(lab.name, lab.topology, VIP, PORT, flows)
    """
    name = unique_name("mfl")
    topo = topology.load("multi-lb")
    try:
        netns.build(topo, name)
        yield NetnsLab(name, topo)
    finally:
        for proc in LabState.load(name).processes if state_dir(name).exists() else []:
            _signal(proc.pid, signal.SIGCONT)  # a stopped process takes no SIGTERM
        for lb in ("lb1", "lb2"):  # instances a failed test left loaded
            if Instance.state_path(f"{name}-{lb}").exists():
                Instance.open(f"{name}-{lb}").unload()
        probes.remove_lab(name)


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def _l4lab(lab: NetnsLab, node: str, hash_name: str, stack: ExitStack, tmp: Path) -> LabBalancer:
    """lbctl on `node` serving VIP:PORT/tcp with `hash_name` over the weighted reals; unloaded by `stack`."""
    b = LabBalancer(lab, node, IP4_IPIP, tmp / f"{node}.toml")
    conf = b.config_for(weights=WEIGHTS)
    echo = dataclasses.replace(conf.vips[0], port=PORT, hash=hash_name)
    b.write_config(dataclasses.replace(conf, vips=(echo,)))
    b.lbctl("load", "--interface", lb_link(lab.topology, node)[0], "--mode", "native", "--config", b.config_file)
    stack.callback(b.lbctl, "unload", check=False)
    return b


def _paths_now(lab: NetnsLab) -> set[str]:
    """The LB nodes the router's route to VIP leaves for."""
    done = subprocess.run(["ip", "-n", lab.netns("router"), "route", "show", VIP], capture_output=True, text=True,
                          check=True)
    return {n for n in ("lb1", "lb2") if f"rt-{n}" in done.stdout}


def _wait_paths(lab: NetnsLab, want: set[str], timeout: float = 15.0) -> float:
    """Poll until the router's VIP route leads to exactly `want`; when (monotonic) it did."""
    poll(timeout, lambda: _paths_now(lab), f"the router's route to {VIP} leading to {sorted(want)}",
         until=lambda got: got == want, interval_s=0.005)
    return time.monotonic()


def _window() -> None:
    threading.Event().wait(WINDOW_S)  # an observation window (see WINDOW_S), not synchronisation


def _frr_of(lab: NetnsLab, node: str, hook: bool = False) -> list[int]:
    """Pids of the node's FRR daemons (and its health hook, with `hook`)."""
    procs = LabState.load(lab.name).processes
    return [p.pid for p in procs if p.node == node and p.argv and
            (p.argv[0].startswith(str(frr.FRR_BIN)) or (hook and "hook" in p.argv))]


def _reals(lab: NetnsLab) -> dict[str, int]:
    """{address: weight} of the reals, as both kinds of node serve them."""
    return {real_addresses(lab.topology, 4)[n]: w for n, w in WEIGHTS.items()}


class Fleet:
    """The running connections and what moved them: a churn client and the marks of each event."""

    def __init__(self, lab: NetnsLab, client: ChurnClient) -> None:
        self.lab, self.client = lab, client
        self.conns: list[dict[str, Any]] = client.ready["conns"]
        self.started = time.monotonic()
        self.paths = [self.ecmp()]  # the LB node of each connection, after each reshuffle
        self.events: list[tuple[float, str]] = []

    def ecmp(self) -> list[str]:
        return ecmp_paths(self.lab.name, self.lab.topology, VIP, PORT, [(c["addr"], c["port"]) for c in self.conns])

    def event(self, what: str) -> None:
        self.client.mark(what.split(":")[0].replace(" ", "-"))
        self.events.append((time.monotonic() - self.started, what))

    def reshuffle(self, seed: int) -> int:
        """A new multipath seed on the router; how many connections it moved to the other node (some
        each way, at least a fifth in all)."""
        reshuffle(self.lab.name, seed)
        self.event(f"router: multipath hash seed {seed}")
        _window()
        self.paths.append(self.ecmp())
        moves = Counter(f"{a}->{b}" for a, b in zip(self.paths[-2], self.paths[-1], strict=True) if a != b)
        assert set(moves) == {"lb1->lb2", "lb2->lb1"} and moves.total() >= CONNS // 5, f"seed {seed}: {moves}"
        return moves.total()


def test_mixed_fleet_two_l4lab_hash_modes_break_the_connections_that_move(lab: NetnsLab, tmp_path: Path) -> None:
    """lb1 hashes as l4lab, lb2 as Katran: a connection moved to the node whose ring disagrees breaks."""
    with ExitStack() as stack:
        nodes = {lb: _l4lab(lab, lb, hash_name, stack, tmp_path) for lb, hash_name in (("lb1", "5tuple"),
                                                                                    ("lb2", "katran"))}
        _wait_paths(lab, {"lb1", "lb2"})
        stack.enter_context(Services(lab.name, sorted(WEIGHTS), "echo", [f"{VIP}:{PORT}"], cpu=0))
        fleet = Fleet(lab, stack.enter_context(ChurnClient(lab.name, "client", VIP, PORT, *CLIENT_ARGS)))
        owners = {n: ring_owners(lab, b, VIP, PORT, fleet.conns) for n, b in nodes.items()}
        real = {c["index"]: c["node"] for c in fleet.conns}
        wrong = [c["index"] for c, lb in zip(fleet.conns, fleet.paths[0], strict=True)
                 if owners[lb][c["index"]] != real[c["index"]]]
        assert wrong == [], f"the route lookups and rings do not name the real of connections {wrong[:5]}"
        moved = [fleet.reshuffle(seed) for seed in SEEDS]
        report = fleet.client.stop(after=WINDOW_S)
    predicted = {c["index"] for k, c in enumerate(fleet.conns)
                 if any(owners[path[k]][c["index"]] != real[c["index"]] for path in fleet.paths[1:])}
    broken = {c["index"] for c in report["conns"] if c["status"] != "ok"}
    differ = sum(owners["lb1"][i] != owners["lb2"][i] for i in real)
    print(f"\ntwo l4lab nodes, hashes 5tuple and katran: the rings disagree on {differ} of {CONNS} connections; "
          f"reshuffles moved {moved}; {len(broken)} broke, {len(predicted)} predicted")
    assert broken == predicted and len(broken) >= CONNS // 10, (sorted(broken - predicted), sorted(predicted - broken))


def test_mixed_fleet_katran_beside_katran_compatible_l4lab_breaks_nothing(lab: NetnsLab, tmp_path: Path,
                                                                         katran_checkout: katran.Checkout) -> None:
    """lb1 Katran, lb2 l4lab (hash = "katran"): 3 reshuffles, each node dying once: 0 broken, no real changed."""
    with ExitStack() as stack:
        l4lab = _l4lab(lab, "lb2", "katran", stack, tmp_path)
        kt = stack.enter_context(KatranNode(lab.name, lab.topology, "lb1", katran_checkout, VIP, PORT, _reals(lab),
                                            tmp_path / "katran"))
        _wait_paths(lab, {"lb1", "lb2"})
        stack.enter_context(Services(lab.name, sorted(WEIGHTS), "echo", [f"{VIP}:{PORT}"], cpu=0))
        fleet = Fleet(lab, stack.enter_context(ChurnClient(lab.name, "client", VIP, PORT, *CLIENT_ARGS)))
        owners = ring_owners(lab, l4lab, VIP, PORT, fleet.conns)
        others = [c["index"] for c in fleet.conns if owners[c["index"]] != c["node"]]
        assert others == [], f"l4lab's ring gives connections {others[:5]} another real than the one answering"
        through = {lb: fleet.paths[0].count(lb) for lb in ("lb1", "lb2")}
        moved = [fleet.reshuffle(seed) for seed in SEEDS]
        outages = _kill_and_revive_katran(fleet, kt) + [_kill_l4lab(fleet, l4lab)]
        report = fleet.client.stop(after=WINDOW_S)
    conns, new = report["conns"], report["new"]
    broken = [c for c in conns if c["status"] != "ok"]
    print(f"\nKatran (lb1) beside l4lab hash=katran (lb2): {len(conns)} connections ({through} at first); "
          f"reshuffles moved {moved}; BFD moved the route {[round(t, 3) for t in outages]} s after each node's "
          f"FRR froze; "
          f"{len(broken)} broken; {len(new)} new connections, {sum('error' in f for f in new)} failed")
    assert len(conns) == CONNS and broken == [], broken[:5]
    assert all(c["nodes"] == [c["node"]] for c in conns), "a connection was answered by another real"
    last = report["marks"]["l4lab-dies"]
    assert all(c["last_ok_at"] is not None and c["last_ok_at"] > last for c in conns), "a connection went quiet"
    assert new and all("error" not in f for f in new), [f for f in new if "error" in f][:5]
    _write_timeline(fleet, max(outages))


def _kill_and_revive_katran(fleet: Fleet, kt: KatranNode) -> list[float]:
    """lb1 dies silently (Katran detached, FRR frozen), then comes back as a fresh Katran: route move times."""
    fleet.event("katran dies: lb1's Katran detached, its FRR frozen")
    kt.stop(announce=False)
    for pid in _frr_of(fleet.lab, "lb1"):
        os.kill(pid, signal.SIGSTOP)
    t0 = time.monotonic()
    gone = _wait_paths(fleet.lab, {"lb2"}) - t0
    fleet.event("router: the route leads to lb2 only (BFD)")
    _window()
    kt.start()
    for pid in _frr_of(fleet.lab, "lb1"):
        os.kill(pid, signal.SIGCONT)
    _wait_paths(fleet.lab, {"lb1", "lb2"})
    fleet.event("katran back: a fresh Katran on lb1 (no sessions), routed again")
    _window()
    return [gone]


def _kill_l4lab(fleet: Fleet, l4lab: LabBalancer) -> float:
    """lb2 dies silently (its hook frozen first, then lbctl unload, then FRR frozen): the route move time."""
    fleet.event("l4lab dies: lb2 unloaded, its hook and FRR frozen")
    daemons = _frr_of(fleet.lab, "lb2")
    for pid in set(_frr_of(fleet.lab, "lb2", hook=True)) - set(daemons):
        os.kill(pid, signal.SIGSTOP)  # the hook first: it would withdraw the route properly
    l4lab.lbctl("unload")
    for pid in daemons:
        os.kill(pid, signal.SIGSTOP)
    t0 = time.monotonic()
    gone = _wait_paths(fleet.lab, {"lb1"}) - t0
    fleet.event("router: the route leads to lb1 only (BFD)")
    _window()
    return gone


def _write_timeline(fleet: Fleet, failover: float) -> None:
    payload = schema.FailoverPayload(
        timeline=[schema.TimelineEvent(t=round(t, 4), event=e) for t, e in fleet.events],
        failover_seconds=round(failover, 4))
    schema.write_result("failover", schema.case_id("test_mixed_fleet", IP4_IPIP, "multi-lb", "katran"), payload)
