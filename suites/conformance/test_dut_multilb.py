"""Several LBs of one kind behind the router's ECMP: a flow keeps its real when ECMP moves it, and when an LB dies.

Topology multi-lb: two instances of the DUT (lab/dut/fleet.py: l4lab and Katran in lb1 and lb2,
announced by BGP with BFD; IPVS in two VMs behind one static ECMP route), the router spreading
flows over them by the L4 hash.

    places alike    PROBES fresh flows go through each instance alone (the other taken out of the
                    route), the second told of the reals in reverse order, as a node that saw a real
                    leave and come back lists it last: every flow must reach the same real through
                    both, as each instance must place flows by the set of reals, never by the order
                    it learnt them in.

Then long-lived echo connections (pinned to CPU 0) run through both instances while the first one

    moves out   is withdrawn from the router's route as an operator would (l4lab: `lbctl unload`,
                which its BGP hook withdraws; Katran: its announcement withdrawn; IPVS: its next hop
                taken out of the route): every connection it carried now reaches the other instance,
                which has never seen it;
    dies        goes silent (l4lab, Katran: the router drops all on its link and BFD notices; IPVS:
                its VM is killed and its tap loses carrier): the connections it carried are lost
                until the router's route leaves it (the outage, recorded), then TCP carries them on.

Either way no connection may break or be answered by another real, and new connections keep
being answered.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from balancer.encaps import IP4_IPIP, EncapCase
from lab.dut import Capability, Fleet
from lab.errors import LabError
from lab.frr import FRR_BIN
from lab.lbconf import real_addresses
from lab.nodes.churn_client import ChurnClient
from lab.nodes.tcp_services import Services
from lab.poll import poll
from reports.schema import ConformanceFigure as Figure
from reports.schema import FailoverPayload, Kind, TimelineEvent, case_id, write_result

from ._traffic import failed, owners

pytestmark = [pytest.mark.topology("multi-lb"),
              pytest.mark.skipif(not (Path(FRR_BIN) / "bgpd").exists() or shutil.which("vtysh") is None,
                                 reason="FRR is missing: run bash scripts/setup.sh --extra frr")]
ECHO_PORT = 7011
CONNS = 60
INTERVAL_S = 0.2
TIMEOUT_S = 6.0  # longer than the failure's detection plus TCP's retransmission
NEW_EVERY_S = 0.5
# Flows compared in "places alike": enough to meet a difference confined to a few ring slots (IPVS mh,
# whose table follows the order of its dest list, differs in 8 of its 4,093 slots for the lab's three
# reals reversed on port 80: about 8 of 4,096 flows, none with probability e^-8; docs/architecture.md).
PROBES = 4096
PROBE_SPORT_BASE = 42000
OBSERVE_S = 2.0
COUNTER_DEADLINE_S = 6.0  # IPVS sums its per-CPU counters every 2 s


@pytest.fixture(scope="module")
def echo(lab: Any) -> Iterator[Services]:
    """The line echo on every real, on ECHO_PORT of the IPv4 VIP, pinned to CPU 0."""
    vip = next(str(v.address) for v in lab.topology.vips if v.address.version == 4)
    with Services(lab, sorted(real_addresses(lab.topology, 4)), "echo", [f"{vip}:{ECHO_PORT}"], cpu=0) as services:
        yield services


def _configure(lab: Any, fleet: Fleet, encap: EncapCase, reverse_second: bool = False) -> None:
    """Every instance serves the VIPs, told of the reals by name (the second in reverse order, if asked)."""
    names = sorted(real_addresses(lab.topology, encap.vip_family))
    fleet.configure(encap, extra_ports=[(ECHO_PORT, "tcp")],
                    orders=[names, list(reversed(names)) if reverse_second else names])


def _client(lab: Any, fleet: Fleet) -> ChurnClient:
    return ChurnClient(lab, "client", fleet.vip(), ECHO_PORT, "--conns", str(CONNS), "--interval", str(INTERVAL_S),
                       "--timeout", str(TIMEOUT_S), "--new-every", str(NEW_EVERY_S), "--cpu", "0")


def _carried(fleet: Fleet, index: int) -> int:
    """Packets member `index` forwarded so far; the lab's ECMP must have given it some connections."""
    got = poll(COUNTER_DEADLINE_S, lambda: fleet.forwarded(index), f"member {index} forwarding", check=False,
               interval_s=0.2)
    if not got:
        raise LabError(f"the router's ECMP sent no connection through member {index} of {CONNS}: "
                       "the check would move nothing")
    return got


def _judge(report: dict[str, Any], what: str) -> None:
    conns, new = report["conns"], report["new"]
    broken = [c for c in conns if c["status"] != "ok" or len(c["nodes"]) > 1]
    sys.stdout.write(f"\n{what}: {len(conns)} connections, {len(broken)} broken or moved to another real; "
                     f"{len(new)} new connections, {len(failed(new))} failed\n")
    assert len(conns) == CONNS and not broken, \
        f"{what}: {len(broken)} of {len(conns)} connections broke or changed real: {broken[:5]}"
    late = [f for f in new if f["t"] > report["marks"]["moved"]]
    assert late and not failed(late), f"{what}: new connections failed afterwards: {failed(late)[:3]}"


@dataclass
class Through:
    """Connections through both instances across an event that befell the first."""

    via_first: int  # packets the first had carried
    value: float  # what the event returned
    second_then: int  # packets the second had carried when the route left the first
    report: dict[str, Any]  # the client's


def _through(lab: Any, fleet: Fleet, encap: EncapCase, event: str, observe_s: float) -> Through:
    """Connections through both instances while `event` (withdraw, kill) befalls the first."""
    _configure(lab, fleet, encap)
    with _client(lab, fleet) as client:
        via_first = _carried(fleet, 0)
        client.mark(event)
        value = getattr(fleet, event)(0)
        client.mark("moved")
        second_then = fleet.forwarded(1)
        report = client.stop(after=observe_s)
    return Through(via_first, value, second_then, report)


@pytest.mark.needs(Capability.MULTI_LB)
@pytest.mark.parametrize("dut_encap", [IP4_IPIP], indirect=True)
def test_every_lb_sends_a_flow_to_the_same_real(lab: Any, dut_fleet: Fleet, dut_encap: EncapCase,
                                                 dut_figures: list[Figure]) -> None:
    """The same PROBES fresh flows through each instance alone; the second was told of the reals in
    reverse order. Each flow must reach the same real through both."""
    placed = []
    for alone in range(len(dut_fleet.members)):
        _configure(lab, dut_fleet, dut_encap, reverse_second=True)
        for other in range(len(dut_fleet.members)):
            if other != alone:
                dut_fleet.withdraw(other)
        placed.append(owners(lab, dut_fleet.members[alone], PROBES, sport_base=PROBE_SPORT_BASE))
    first, second = placed[0], placed[1]
    assert first.keys() == second.keys(), "the two passes did not send the same flows"
    reals = set(real_addresses(lab.topology, dut_encap.vip_family))
    assert set(first.values()) == reals, f"the flows reached {sorted(set(first.values()))} of the reals {sorted(reals)}"
    differ = sorted(f for f in first if first[f] != second[f])
    sys.stdout.write(f"\n{dut_fleet.name}: {len(first)} flows through each instance alone, "
                     f"{len(differ)} placed differently\n")
    assert not differ, (f"{len(differ)} of {len(first)} flows reach another real through member 1 (told of the "
                        f"reals in reverse order) than through member 0: "
                        f"{[(f, first[f], second[f]) for f in differ[:5]]}")
    dut_figures += [Figure("flows compared", len(first)), Figure("flows placed differently", 0)]


@pytest.mark.needs(Capability.MULTI_LB)
@pytest.mark.parametrize("dut_encap", [IP4_IPIP], indirect=True)
def test_a_flow_ecmp_moves_to_another_lb_keeps_its_real(lab: Any, dut_fleet: Fleet, dut_encap: EncapCase,
                                                        echo: Services, dut_figures: list[Figure]) -> None:
    moved = _through(lab, dut_fleet, dut_encap, "withdraw", OBSERVE_S)
    after = poll(COUNTER_DEADLINE_S, lambda: dut_fleet.forwarded(1), "the other instance forwarding",
                 until=lambda n: n > moved.second_then, check=False, interval_s=0.2)
    assert after > moved.second_then, f"the other instance carried nothing after the withdrawal ({after})"
    _judge(moved.report, f"{dut_fleet.name}: member 0 withdrawn from ECMP")
    dut_figures += [Figure("packets through the withdrawn LB", moved.via_first), Figure("connections broken", 0)]


@pytest.mark.needs(Capability.MULTI_LB)
@pytest.mark.parametrize("dut_encap", [IP4_IPIP], indirect=True)
def test_no_connection_is_lost_when_an_lb_dies(lab: Any, dut_fleet: Fleet, dut_encap: EncapCase,
                                              echo: Services, dut_figures: list[Figure]) -> None:
    died = _through(lab, dut_fleet, dut_encap, "kill", OBSERVE_S + TIMEOUT_S)
    outage = died.value
    _judge(died.report, f"{dut_fleet.name}: member 0 died, the router took {outage:.3f} s to route around it")
    timeline = [TimelineEvent(t=0.0, event=f"{dut_fleet.name} member 0 dies (silent)"),
                TimelineEvent(t=round(outage, 4),
                              event=f"router: the VIP's route leaves only by member 1; all {CONNS} connections go on")]
    write_result(Kind.FAILOVER, case_id("test_no_connection_is_lost_when_an_lb_dies", dut_encap, dut_fleet.name),
                 FailoverPayload(timeline=timeline, failover_seconds=round(outage, 4)))
    dut_figures += [Figure("packets through the dead LB", died.via_first),
                    Figure("outage until rerouted", round(outage, 3), "s"), Figure("connections lost", 0)]
