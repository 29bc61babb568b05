"""The DUT's control plane from outside: a restart breaks nothing, and health checks drain and restore a real.

Topology `default`, IPv4 in IPIP (what is checked here does not depend on the encapsulation).

    restart  CONNS long-lived echo connections and a stream of new ones run while the control plane
             dies and starts again: `crash` kills it (SIGKILL), `graceful` stops it as an operator
             would (l4lab: `lbctl run`; IPVS: keepalived; Katran: its control plane's start, a new
             copy swapped in behind the XDP link). No connection may break or move, every new
             connection is answered, and the restarted control plane still controls: a real it is
             told to drain gets no new flow.
    health   every real serves an HTTP health endpoint on its own address (HEALTH_PORT); the DUT
             probes it (HTTP GET, or a TCP connect), `fall` failures drain a real, one success (or
             `rise`) restores it. One real's endpoint stops: new flows leave it, none fails; it
             comes back: new flows reach it again. The seconds each took are recorded.

Clients and echo servers are pinned to CPU 0 (Katran's session tables are per CPU; see
test_dut_churn.py).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from balancer.encaps import IP4_IPIP, EncapCase
from lab import services
from lab.dut import Capability, Dut, HealthCheck
from lab.lbconf import real_addresses
from lab.nodes.churn_client import ChurnClient
from lab.nodes.tcp_services import Services
from lab.poll import poll
from reports.schema import ConformanceFigure as Figure

from ._echo import ECHO_PORT
from ._traffic import failed, requests

pytestmark = [pytest.mark.topology("default")]
HEALTH_PORT = 8080
CONNS = 100
INTERVAL_S = 0.25
TIMEOUT_S = 3.0
NEW_EVERY_S = 0.1
OBSERVE_S = 2.0
ROUND = 15  # new flows per look at where they go
HEALTH_DEADLINE_S = 20.0
MOVED = "real3"


def _round(lab: Any, dut: Dut) -> set[str]:
    """The reals that answered ROUND new flows; a failed flow is a finding."""
    answers = requests(lab, dut, "http", 80, ROUND)
    bad = failed(answers)
    assert not bad, f"{len(bad)} of {len(answers)} new flows through {dut.name} failed: {bad[:3]}"
    return {str(a["node"]) for a in answers}


@pytest.mark.needs(Capability.HITLESS_RESTART)
@pytest.mark.parametrize("how", ["crash", "graceful"])
@pytest.mark.parametrize("dut_encap", [IP4_IPIP], indirect=True)
def test_a_control_plane_restart_breaks_nothing(lab: Any, dut: Dut, dut_encap: EncapCase, how: str,
                                                echoes: Services, dut_figures: list[Figure]) -> None:
    dut.configure(dut_encap, extra_ports=[(ECHO_PORT, "tcp")])
    with ChurnClient(lab, "client", dut.vips()[0], ECHO_PORT, "--conns", str(CONNS), "--interval", str(INTERVAL_S),
                     "--timeout", str(TIMEOUT_S), "--new-every", str(NEW_EVERY_S), "--cpu", "0") as client:
        start = client.mark("restart")
        down = dut.restart_control_plane(how)
        back = client.mark("restarted")
        report = client.stop(after=OBSERVE_S)
    conns, new = report["conns"], report["new"]
    broken = [c for c in conns if c["status"] != "ok" or len(c["nodes"]) > 1]
    during = [f for f in new if start <= f["t"] <= back]
    sys.stdout.write(f"\n{dut.name} {how} restart: control plane down {down:.2f} s; {len(conns)} connections, "
                     f"{len(broken)} broken or moved; {len(new)} new connections, {len(during)} during the restart\n")
    assert len(conns) == CONNS and not broken, f"{len(broken)} of {len(conns)} connections broke or moved: {broken[:5]}"
    bad = failed(new)
    assert new and not bad, f"{len(bad)} of {len(new)} new connections failed across the restart: {bad[:3]}"
    dut.set_weight(MOVED, 0)
    serving = _round(lab, dut)
    assert MOVED not in serving, f"the restarted control plane drained {MOVED}, yet new flows reach it: {serving}"
    dut_figures += [Figure("control plane down", round(down, 3), "s"), Figure("connections broken", 0),
                    Figure("new connections during the restart", len(during))]


@pytest.fixture(scope="module")
def health(lab: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str, bool], None]]:
    """Name: health. Scope: module. Depends: lab.

    An HTTP health endpoint on every real's own IPv4 address, HEALTH_PORT; `health(real, up)` stops
    or starts one. All of them stop at the end::

        def test_x(health):
            health("real3", False)
    """
    run_dir = tmp_path_factory.mktemp("health")
    addrs = real_addresses(lab.topology, 4)
    running: dict[str, Any] = {}

    def switch(node: str, up: bool) -> None:
        if not up and node in running:
            services.stop(running.pop(node))
        elif up and node not in running:
            (run_dir / f"{node}.ready").unlink(missing_ok=True)
            proc = services.start(lab.name, lab.netns(node), node, [("http", addrs[node], HEALTH_PORT)], run_dir)
            running[node] = proc
            services.wait_ready([proc], run_dir)

    try:
        for node in sorted(addrs):
            switch(node, True)
        yield switch
    finally:
        for node in list(running):
            services.stop(running.pop(node))


def _until(lab: Any, dut: Dut, held: Callable[[set[str]], bool], what: str) -> tuple[float, set[str]]:
    """Rounds of new flows until `held(reals that answered)`; (seconds it took, the last round's reals)."""
    t0 = time.monotonic()
    seen = poll(HEALTH_DEADLINE_S, lambda: _round(lab, dut), what, until=held, check=False, interval_s=0.1)
    assert held(seen), f"{what}: not so after {HEALTH_DEADLINE_S:g} s; new flows reach {sorted(seen)}"
    return time.monotonic() - t0, seen


@pytest.mark.needs(Capability.HEALTH_CHECKS)
@pytest.mark.parametrize("kind", ["http", "tcp"])
@pytest.mark.parametrize("dut_encap", [IP4_IPIP], indirect=True)
def test_a_real_failing_its_health_check_is_drained_then_restored(
        lab: Any, dut: Dut, dut_encap: EncapCase, kind: str, health: Callable[[str, bool], None],
        tmp_path: Path, dut_figures: list[Figure]) -> None:
    check = HealthCheck(HEALTH_PORT, kind)
    dut.configure(dut_encap, healthcheck=check)
    everyone = set(dut.reals())
    _until(lab, dut, lambda seen: seen == everyone, "every real serving new flows")
    health(MOVED, False)
    try:
        drained, _ = _until(lab, dut, lambda seen: MOVED not in seen,
                            f"{MOVED} drained after its health endpoint stopped")
    finally:
        health(MOVED, True)
    restored, _ = _until(lab, dut, lambda seen: MOVED in seen, f"{MOVED} restored after its health endpoint came back")
    sys.stdout.write(f"\n{dut.name} {kind} health check: {MOVED} drained {drained:.2f} s after its endpoint "
                     f"stopped, restored {restored:.2f} s after it came back\n")
    dut_figures += [Figure("drained after", round(drained, 2), "s"), Figure("restored after", round(restored, 2), "s")]
