"""Scale-out: two LB nodes announce the VIPs by BGP (FRR), the router spreads flows over them, BFD fails over.

The multi-lb topology is built once for the module (lab `mlt-<hex>`) and the XDP balancer is loaded
in both LB nodes with lbctl, as an operator would. The tests check that the sessions come up, that
the router holds each VIP as one multipath route through both LBs, that flows spread over both,
that unloading a balancer withdraws its routes (the lab's health hook), and, last, that when an LB
node dies (its FRR killed, its balancer gone) BFD moves every flow to the other within 1 s. The
failover timeline is written as a `failover` result.
"""

from __future__ import annotations

import contextlib
import json
import operator
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from pyroute2 import IPRoute

from balancer import config as cfg
from lab import frr, netns, procs, topology
from lab.errors import LabError
from lab.harness import poll, unique_name
from lab.lbconf import balancer_config, lb_link
from lab.netns import InjectedFailure
from lab.nsexec import entered, nsenter_argv
from lab.services import starttime
from lab.state import LabState, netns_name, state_dir
from suites.lab import probes
from suites.lab.probes import bpf_available

BFD_UP_DEADLINE_S = 10.0

REPO = Path(__file__).resolve().parents[2]
PREFIX = "mlt-"
LBS = ("lb1", "lb2")
VIP4 = "198.51.100.100"
VIP6 = "2001:db8:100::100"
CLIENTS4 = ("192.0.2.2", "192.0.2.3", "192.0.2.4", "192.0.2.5")
ROUTE_TIMEOUT_S = 10.0
FAILOVER_LIMIT_S = 1.0


def skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "the multi-LB lab needs root"
    reason = frr.missing()
    if reason:
        return reason
    return bpf_available()


pytestmark = pytest.mark.skipif(skip_reason() is not None, reason=str(skip_reason()))


@dataclass
class MultiLb:
    """A running multi-lb lab with the balancer loaded in every LB node."""

    name: str
    topo: topology.Topology
    loaded: set[str] = field(default_factory=set)

    def ns(self, node: str) -> str:
        return netns_name(self.name, node)

    def lbctl(self, lb: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "balancer.cli", "--instance", f"{self.name}-{lb}", *args]
        done = subprocess.run(nsenter_argv(self.ns(lb), argv), capture_output=True, text=True, timeout=60,
                              cwd=REPO, check=False)  # fmt: skip
        if check and done.returncode != 0:
            raise LabError(f"lbctl {' '.join(args)} in {lb} failed: {done.stderr.strip()}", command=" ".join(argv))
        return done

    def load(self, lb: str) -> None:
        conf = balancer_config(self.topo, self.name, encaps={4: "ipip", 6: "ipip"}, lb=lb)
        path = state_dir(self.name) / f"{lb}-balancer.toml"
        path.write_text(cfg.dump(conf))
        self.lbctl(lb, "load", "--interface", lb_link(self.topo, lb)[0], "--mode", "native", "--config", str(path))
        self.loaded.add(lb)

    def unload(self, lb: str) -> None:
        self.lbctl(lb, "unload")
        self.loaded.discard(lb)

    def tx_encap(self, lb: str) -> int:
        stats = json.loads(self.lbctl(lb, "stats", "--json").stdout)
        return int(stats["reasons"]["TX_ENCAP"]["packets"])


@pytest.fixture(scope="module")
def mlb() -> Iterator[MultiLb]:
    """The multi-lb topology up, with the balancer loaded (IPIP) in lb1 and lb2.

    Name: mlb
    Scope: module (the failover test, which kills lb1, runs last)
    Depends: root, FRR, the built BPF objects (skips otherwise)

        def test_x(mlb):
            assert router_paths(mlb, VIP4) == {"rt-lb1", "rt-lb2"}
    """
    name = unique_name("lbt")
    lab = MultiLb(name, topology.load("multi-lb"))
    try:
        state = netns.build(lab.topo, name)
        print(f"multi-lb up, BGP Established {state.bgp_established_seconds:.2f} s after FRR started")
        for lb in LBS:
            lab.load(lb)
        yield lab
    finally:
        for lb in sorted(lab.loaded):
            lab.lbctl(lb, "unload", check=False)
        probes.remove_lab(name)


def router_paths(lab: MultiLb, vip: str) -> set[str]:
    """The router's interfaces that its route to `vip` leaves by (several: a multipath route)."""
    family = socket.AF_INET6 if ":" in vip else socket.AF_INET
    with entered(lab.ns("router")):
        ipr = IPRoute()
    with ipr:
        names = {link["index"]: link.get_attr("IFLA_IFNAME") for link in ipr.get_links()}
        out: set[str] = set()
        # A dump, not a lookup (dst=...): a lookup answers with the one path it would take.
        for route in ipr.get_routes(family=family):
            if route.get_attr("RTA_DST") != vip or route["dst_len"] != (128 if family == socket.AF_INET6 else 32):
                continue
            hops = route.get_attr("RTA_MULTIPATH")
            if hops:
                out |= {names.get(h["oif"], str(h["oif"])) for h in hops}
            elif route.get_attr("RTA_OIF"):
                out.add(names.get(route.get_attr("RTA_OIF"), "?"))
        return out


def wait_paths(lab: MultiLb, vip: str, want: set[str], timeout: float = ROUTE_TIMEOUT_S) -> float:
    """Poll the router's route to `vip` until it leaves by exactly `want`; the seconds it took."""
    started = time.monotonic()
    return wait_all_paths(lab, {vip: want}, timeout)[vip] - started


def wait_all_paths(lab: MultiLb, wants: dict[str, set[str]], timeout: float = ROUTE_TIMEOUT_S) -> dict[str, float]:
    """Poll the router's routes until each VIP's leaves by exactly its set; when (monotonic) each did."""
    reached: dict[str, float] = {}

    def unreached() -> dict[str, list[str]]:
        """The routes of the VIPs not yet leaving by their set (noting when each got there)."""
        now = {vip: router_paths(lab, vip) for vip in wants if vip not in reached}
        for vip, got in now.items():
            if got == wants[vip]:
                reached[vip] = time.monotonic()
        return {vip: sorted(got) for vip, got in now.items() if vip not in reached}

    poll(timeout, unreached, f"the router's VIP routes leaving by { {v: sorted(w) for v, w in wants.items()} }",
         until=operator.not_, interval_s=0.002)
    return reached


def test_bgp_sessions_are_established(mlb: MultiLb) -> None:
    for node in ("router", *LBS):
        states = frr.neighbor_states(mlb.name, node)
        expected = {str(peer) for _, peer, _ in frr.peers(mlb.topo, node)}
        assert set(states) == expected and len(expected) == (4 if node == "router" else 2)
        assert set(states.values()) == {"Established"}, states
    # BFD comes up after BGP (its sessions start once the peers are configured): poll, with a deadline.
    bfd = poll(BFD_UP_DEADLINE_S, lambda: frr.vtysh(mlb.name, "router", "show bfd peers brief"),
               "four BFD sessions up", until=lambda text: text.count(" up ") == 4, check=False, interval_s=0.1)
    assert bfd.count(" up ") == 4, bfd


def test_vtysh_through_l4lab_exec_reaches_the_nodes_daemons(mlb: MultiLb) -> None:
    argv = [sys.executable, "-m", "lab.cli", "exec", "router", "--name", mlb.name, "--", "vtysh", "-c", "show ip bgp"]
    done = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, timeout=30, check=False)
    assert done.returncode == 0, done.stderr
    assert "local router ID is 192.0.2.1" in done.stdout
    assert f"{VIP4}/32" in done.stdout


@pytest.mark.parametrize("vip", [VIP4, VIP6], ids=["ip4", "ip6"])
def test_router_learns_each_vip_as_a_multipath_route_via_every_lb(mlb: MultiLb, vip: str) -> None:
    wait_paths(mlb, vip, {"rt-lb1", "rt-lb2"})
    rib = json.loads(frr.vtysh(mlb.name, "router", f"show {'ipv6' if ':' in vip else 'ip'} route {vip} json"))
    (entry,) = rib[f"{vip}/{128 if ':' in vip else 32}"]
    assert entry["protocol"] == "bgp" and entry["installed"]
    assert sorted(h["interfaceName"] for h in entry["nexthops"]) == ["rt-lb1", "rt-lb2"]


def test_ecmp_spreads_flows_over_the_lbs(mlb: MultiLb) -> None:
    before = {lb: mlb.tx_encap(lb) for lb in LBS}
    argv = [sys.executable, "-m", "lab.nodes.traffic", "http", "--vip", VIP4, "--port", "80", "--count", "200"]
    argv += [a for c in CLIENTS4 for a in ("--source", c)]
    done = subprocess.run(nsenter_argv(mlb.ns("client"), argv), capture_output=True, text=True, timeout=180,
                          cwd=REPO, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    results = json.loads(done.stdout)
    assert [r for r in results if r.get("status") != 200] == []
    share = {lb: mlb.tx_encap(lb) - before[lb] for lb in LBS}
    answered = {r["node"] for r in results}
    print(f"200 HTTP requests from {len(CLIENTS4)} clients: packets encapsulated per LB {share}, "
          f"reals {sorted(answered)}")  # fmt: skip
    assert answered == {"real1", "real2", "real3"}
    total = sum(share.values())
    assert total >= 200 * 3  # SYN, ACK, request, FIN... at least three packets per request
    for lb, packets in share.items():
        assert packets >= total * 0.2, f"{lb} got {packets} of {total} packets: ECMP does not spread"


def test_unloading_a_balancer_withdraws_its_routes_and_loading_announces_them(mlb: MultiLb) -> None:
    started = time.monotonic()
    mlb.unload("lb2")
    gone = max(wait_paths(mlb, VIP4, {"rt-lb1"}), wait_paths(mlb, VIP6, {"rt-lb1"}))
    withdrawn = time.monotonic() - started
    assert probes.http_get(mlb.ns("client"), VIP4) in {"real1\n", "real2\n", "real3\n"}
    mlb.load("lb2")
    back = max(wait_paths(mlb, VIP4, {"rt-lb1", "rt-lb2"}), wait_paths(mlb, VIP6, {"rt-lb1", "rt-lb2"}))
    print(f"lb2 unloaded: routes withdrawn after {withdrawn:.2f} s (route gone {gone:.2f} s after unload "
          f"returned); loaded again: announced within {back:.2f} s")  # fmt: skip


class UdpProber:
    """Flows of UDP echo to the VIP from several sources and ports, one probe per flow per round."""

    def __init__(self, lab: MultiLb, period: float = 0.01, wait: float = 0.05) -> None:
        self.period = period
        self.wait = wait
        self.socks: list[socket.socket] = []
        with entered(lab.ns("client")):
            for src in CLIENTS4:
                for _ in range(4):
                    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                    s.bind((src, 0))
                    s.setblocking(False)
                    self.socks.append(s)
        self.rounds: list[tuple[float, int]] = []  # (send time, flows that did not answer)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> UdpProber:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        for s in self.socks:
            s.close()

    def _run(self) -> None:
        seq = 0
        while not self._stop.is_set():
            seq += 1
            sent = time.monotonic()
            tag = f"probe {seq}".encode()
            for s in self.socks:
                s.sendto(tag, (VIP4, 9000))
            waiting = set(self.socks)
            deadline = sent + self.wait
            while waiting and (left := deadline - time.monotonic()) > 0:
                for s in select.select(list(waiting), [], [], left)[0]:
                    while True:
                        try:
                            data = s.recv(2048)
                        except BlockingIOError:
                            break
                        if data.endswith(tag):
                            waiting.discard(s)
            self.rounds.append((sent, len(waiting)))
            self._stop.wait(max(0.0, sent + self.period - time.monotonic()))  # the probe rate

    def interruption(self, since: float) -> tuple[float | None, float | None]:
        """(send time of the first lost round, of the first round after the last lost one) after `since`."""
        lost = [t for t, missing in self.rounds if t >= since and missing]
        if not lost:
            return None, None
        after = [t for t, missing in self.rounds if t > lost[-1] and not missing]
        return lost[0], (after[0] if after else None)


def test_bfd_moves_flows_off_a_dead_lb_within_one_second(mlb: MultiLb) -> None:
    from reports import schema

    wait_paths(mlb, VIP4, {"rt-lb1", "rt-lb2"})
    state = LabState.load(mlb.name)
    daemons = [p for p in state.processes if p.node == "lb1" and p.argv and p.argv[0].startswith(str(frr.FRR_BIN))]
    hook = [p for p in state.processes if p.node == "lb1" and "hook" in p.argv]
    assert len(daemons) == 3 and len(hook) == 1
    frozen = [*hook, *daemons]
    try:
        with UdpProber(mlb) as prober:
            poll(5.0, lambda: list(prober.rounds), "UDP echo answering before any failure",
                 until=lambda rounds: len(rounds) >= 20 and not any(m for _, m in rounds[-10:]), interval_s=0.01)
            start = time.monotonic()
            # lb1 dies silently, as a hung machine does. Its hook freezes first (it would withdraw the
            # routes properly), then its data plane goes: without XDP, lb1's kernel drops VIP packets...
            os.kill(hook[0].pid, signal.SIGSTOP)
            mlb.unload("lb1")
            unloaded = time.monotonic()
            # ...then its FRR freezes: no BGP withdrawal, no TCP FIN, no BFD down message; only the
            # silence of BFD (3 x 100 ms) tells the router.
            t0 = time.monotonic()
            for proc in daemons:
                os.kill(proc.pid, signal.SIGSTOP)
            moved = wait_all_paths(mlb, {VIP4: {"rt-lb2"}, VIP6: {"rt-lb2"}}, timeout=5.0)
            route_gone, v6_gone = moved[VIP4], moved[VIP6]
            threading.Event().wait(0.5)  # a measurement window: nothing may be lost after the failover
    finally:
        for proc in frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)  # a stopped process takes no SIGTERM
    first_lost, restored = prober.interruption(start)
    assert first_lost is not None, "no probe was lost: the test did not take lb1's data plane away"
    assert restored is not None, "flows through lb1 never came back"
    failover = route_gone - t0  # BFD detection, BGP, zebra: the control plane's part
    outage = restored - first_lost  # what the client saw: flows via lb1 unanswered
    events = sorted([
        (0.0, "lb1: health hook frozen (SIGSTOP), `lbctl unload` starts"),
        (max(0.0, first_lost - start), "client: first UDP echo via lb1 lost (its XDP balancer is gone)"),
        (unloaded - start, "lb1: `lbctl unload` returned"),
        (t0 - start, "lb1: FRR daemons frozen (SIGSTOP): no BFD from here, no BGP withdrawal"),
        (route_gone - start, "router: IPv4 VIP route leaves only by rt-lb2 (BFD down, BGP session dropped)"),
        (v6_gone - start, "router: IPv6 VIP route leaves only by rt-lb2"),
        (restored - start, "client: every flow answered again"),
    ])  # fmt: skip
    payload = schema.FailoverPayload(
        timeline=[schema.TimelineEvent(t=round(t, 4), event=e) for t, e in events],
        failover_seconds=round(outage, 4),
    )
    path = schema.write_result("failover", schema.case_id("test_bfd_failover", "ip4-ipip", "multi-lb"), payload)
    lost_rounds = sum(1 for t, m in prober.rounds if t >= start and m)
    print(f"BFD failover: the router's route moved {failover:.3f} s after lb1's FRR froze "
          f"(IPv6 {v6_gone - t0:.3f} s); flows via lb1 went unanswered for {outage:.3f} s, from the loss of "
          f"its XDP balancer to the route change ({lost_rounds} probe rounds of 10 ms with losses); "
          f"result {path}")  # fmt: skip
    for t, e in events:
        print(f"  {t:7.3f} s  {e}")
    assert failover <= FAILOVER_LIMIT_S
    assert restored - t0 <= FAILOVER_LIMIT_S and outage <= FAILOVER_LIMIT_S
    # BFD declares the peer down 3 x 100 ms after its last packet, which left lb1 at most 100 ms before t0.
    assert failover >= 0.15, "the route moved before BFD could have noticed: something else told the router"
    assert not any(m for t, m in prober.rounds if t > route_gone + 0.1)


def test_teardown_ends_every_frr_daemon_and_hook() -> None:
    """A multi-lb lab of its own goes down with nothing left, FRR daemons and hooks included."""
    name = unique_name("lbt")
    try:
        state = netns.build(topology.load("multi-lb"), name)
        started = [p for p in state.processes if p.node in ("router", *LBS)]
        assert len(started) == 3 * 3 + 2  # zebra, bfdd, bgpd in three nodes; a hook per LB
        assert all(starttime(p.pid) == p.starttime for p in started)
        assert len(_frr_of(name)) == 3 * 3
        netns.teardown(name)
        assert [p.pid for p in started if starttime(p.pid) == p.starttime] == []
        assert probes.leftovers(name) == []
        assert _frr_of(name) == []
    finally:
        probes.remove_lab(name)


@pytest.mark.parametrize("from_end", [1, 2, 3, 6, 9])
def test_failure_while_starting_frr_leaves_nothing(from_end: int) -> None:
    topo = topology.load("multi-lb")
    name = unique_name("lbt")
    try:
        counter = netns.Builder(topo, name)
        counter.build()
        netns.teardown(name)
        k = counter.steps + 1 - from_end
        with pytest.raises(InjectedFailure, match=f"injected failure at step {k}: "):
            netns.build(topo, name, fail_at=k)
        assert probes.leftovers(name) == []
        assert _frr_of(name) == []
    finally:
        probes.remove_lab(name)


def _frr_of(lab: str) -> list[int]:
    """Pids of live FRR daemons whose command line names lab `lab`'s run directory."""
    marker = str(state_dir(lab)).encode() + b"/"
    return [p.pid for p in procs.walk()
            if p.argv and p.argv[0].startswith(str(frr.FRR_BIN).encode()) and any(marker in a for a in p.argv)]
