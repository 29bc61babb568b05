"""Path MTU through the LB: a 2 MB TCP upload with the LB's too-big answers, with MSS clamping, and with neither.

Topology `pmtu`: the client's link is 9000, the LB's link 3000 and the router's links to the reals
1500, so the reals advertise MSS 1460 and a full-size client packet (1500) plus the encapsulation
no longer fits the last hop. For every encap, one after the other:

    icmp       LB MTU 1500: the LB answers frag-needed / packet too big itself; the upload completes
               and the client's route cache holds MTU 1500 − overhead.
    mss-clamp  LB MTU 9000 (no answers) and iptables TCPMSS on each real's SYN-ACK (built into this
               kernel, no module needed): MSS 1500 − overhead − 40 (IPv6: 60); completes, no ICMP,
               nothing cached.
    blackhole  LB MTU 9000, no clamp: the router in front of the reals finds the encapsulated
               packet too big and drops it; its ICMP goes to the LB's outer source, the LB passes
               it to its own kernel (not about a VIP flow) and the client never hears: the upload
               stalls. A stall is declared after STALL_S seconds without progress (the client
               then resets the connection) and is the expected outcome.
    udp-df     LB MTU 1500: one 1500-byte UDP datagram with DF (IPv6: unfragmentable) to the VIP
               gets the LB's ICMP; the socket learns 1500 − overhead and a resend fails EMSGSIZE.

Overheads are the datapath's (bpf/include/encap.h, encap_overhead): outer IPv4 20 / IPv6 40,
GUE adds UDP 8, variant 0 adds its 4-byte header. Results: kind pmtu, one file per encap.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import sys
from collections.abc import Iterator
from typing import Any, cast

import pytest

from balancer.encaps import by_id
from lab.dut import Capability
from lab.harness import Lab, LabBalancer
from lab.lbconf import real_addresses
from lab.nodes.tcp_services import Services
from reports.schema import EncapId, PmtuPayload, PmtuScenario, write_result
from suites.conformance._counters import counters

# The outcomes are told apart by the LB's own reasons (TX_ICMP_TOO_BIG, PASS_ICMP_NOT_VIP).
pytestmark = [pytest.mark.topology("pmtu"),
              pytest.mark.needs(Capability.PMTU_GENERATION, Capability.COUNTERS_PER_REASON)]
SINK_PORT = 5001
UDP_PORT = 9000
UNDERLAY_MTU = 1500
NO_ANSWER_MTU = 9000  # larger than any packet here: the LB never answers "too big"
STALL_S = 4.0  # seconds without progress that make an upload "stalled"
UPLOAD_BYTES = 2_000_000
_SHOWN = ("completed", "stalled", "seconds", "route_mtu", "mtu_learnt", "resend", "lb_too_big", "router_too_big",
          "router_icmp", "lb_icmp_passed")  # the fields printed per scenario


def _vip(lab: Lab, family: int) -> str:
    return next(str(v.address) for v in lab.topology.vips if v.address.version == family)


@pytest.fixture(scope="module")
def sinks(lab: Lab) -> Iterator[Services]:
    """The TCP sink on every real, on SINK_PORT of every VIP address."""
    binds = [f"[{v.address}]:{SINK_PORT}" if v.address.version == 6 else f"{v.address}:{SINK_PORT}"
             for v in lab.topology.vips]
    with Services(lab.name, sorted(real_addresses(lab.topology, 4)), "sink", binds) as services:
        yield services


def _configure(balancer: LabBalancer, mtu: int) -> None:
    """The topology's VIPs for the encap, plus a TCP VIP on SINK_PORT, with the LB's MTU set to mtu."""
    conf = balancer.config_for(mtu=mtu)
    first: dict[Any, Any] = {}
    for v in conf.vips:
        first.setdefault(v.address, v)
    extra = tuple(dataclasses.replace(v, port=SINK_PORT, proto="tcp") for v in first.values())
    balancer.apply(dataclasses.replace(conf, vips=conf.vips + extra))


def _route(lab: Lab, vip: str) -> str:
    return lab.run("client", ["ip", "route", "get", vip]).stdout.strip()


def _route_mtu(lab: Lab, vip: str) -> int | None:
    found = re.search(r"\bmtu (\d+)", _route(lab, vip))
    return int(found.group(1)) if found else None


def _forget_paths(lab: Lab, vip: str) -> None:
    """Drop the client's learnt path MTUs, so each scenario starts from the link's MTU."""
    lab.run("client", ["ip", "-4", "route", "flush", "cache"])
    lab.run("client", ["ip", "-6", "route", "flush", "cache"])
    assert _route_mtu(lab, vip) is None, f"the client's route cache kept an MTU: {_route(lab, vip)}"


def _router_counters(lab: Lab, family: int) -> tuple[int, int]:
    """The router's (packets not forwarded for size with DF set, "too big" ICMP errors it sent)."""
    if family == 4:
        text = lab.run("router", ["cat", "/proc/net/snmp"]).stdout.splitlines()
        table: dict[str, str] = {}
        for head, values in zip(text[::2], text[1::2], strict=False):
            proto = head.split(":")[0]
            table |= {f"{proto}{k}": v for k, v in zip(head.split()[1:], values.split()[1:], strict=True)}
        return int(table["IpFragFails"]), int(table["IcmpOutDestUnreachs"])
    rows = dict(ln.split() for ln in lab.run("router", ["cat", "/proc/net/snmp6"]).stdout.splitlines() if ln)
    return int(rows["Ip6FragFails"]), int(rows["Icmp6OutPktTooBigs"])


@contextlib.contextmanager
def _mss_clamp(lab: Lab, family: int, mss: int) -> Iterator[None]:
    """TCPMSS on every real's SYN-ACKs (the real's POSTROUTING), removed again on exit."""
    tool = "iptables" if family == 4 else "ip6tables"
    rule = ["POSTROUTING", "-p", "tcp", "--tcp-flags", "SYN,RST", "SYN", "-j", "TCPMSS", "--set-mss", str(mss)]
    with contextlib.ExitStack() as undo:
        for node in sorted(real_addresses(lab.topology, family)):
            lab.run(node, [tool, "-t", "mangle", "-A", *rule])
            undo.callback(lab.run, node, [tool, "-t", "mangle", "-D", *rule])
        yield


def _delta(before: dict[str, Any], after: dict[str, Any], reason: str) -> int:
    return int(after["reasons"][reason]["packets"] - before["reasons"][reason]["packets"])


def _upload(lab: Lab, balancer: LabBalancer, vip: str, name: str) -> dict[str, Any]:
    """One upload, with the LB's and the router's counters over it and the client's route afterwards."""
    before, router_before = counters(balancer), _router_counters(lab, balancer.family)
    out: dict[str, Any] = json.loads(lab.python(
        "client", "lab.nodes.upload", "--vip", vip, "--port", str(SINK_PORT),
        "--bytes", str(UPLOAD_BYTES), "--stall", str(STALL_S), timeout=STALL_S * 3 + 10).stdout)
    after, router_after = counters(balancer), _router_counters(lab, balancer.family)
    out.update(scenario=name, lb_too_big=_delta(before, after, "TX_ICMP_TOO_BIG"),
               lb_icmp_passed=_delta(before, after, "PASS_ICMP_NOT_VIP"),
               router_too_big=router_after[0] - router_before[0], router_icmp=router_after[1] - router_before[1],
               route_mtu=_route_mtu(lab, vip), route=_route(lab, vip))
    return out


@dataclasses.dataclass
class Outcome:
    """One scenario: its result record, what happened (for the failure message) and what was wrong."""

    scenario: PmtuScenario
    seen: dict[str, Any]
    problem: str | None


def _icmp(lab: Lab, balancer: LabBalancer, vip: str, want_mtu: int) -> Outcome:
    _configure(balancer, UNDERLAY_MTU)
    _forget_paths(lab, vip)
    run = _upload(lab, balancer, vip, "icmp")
    ok = run["completed"] and run["route_mtu"] == want_mtu and run["lb_too_big"] > 0
    return Outcome(PmtuScenario(name="icmp", completed=bool(run["completed"]), seconds=run["seconds"],
                                route_mtu=run["route_mtu"]), run,
                   None if ok else f"icmp: expected a completed upload, LB too-big answers, route MTU {want_mtu}")


def _clamped(lab: Lab, balancer: LabBalancer, vip: str, want_mtu: int) -> Outcome:
    _configure(balancer, NO_ANSWER_MTU)
    _forget_paths(lab, vip)
    mss = want_mtu - (40 if balancer.family == 4 else 60)
    with _mss_clamp(lab, balancer.family, mss):
        run = _upload(lab, balancer, vip, "mss-clamp") | {"mss": mss}
    ok = run["completed"] and run["route_mtu"] is None and run["lb_too_big"] == 0 and run["router_too_big"] == 0
    return Outcome(PmtuScenario(name="mss-clamp", completed=bool(run["completed"]), seconds=run["seconds"],
                                route_mtu=run["route_mtu"]), run,
                   None if ok else f"mss-clamp: expected a completed upload with MSS {mss}, no ICMP, no drop for size")


def _blackhole(lab: Lab, balancer: LabBalancer, vip: str) -> Outcome:
    _configure(balancer, NO_ANSWER_MTU)
    _forget_paths(lab, vip)
    run = _upload(lab, balancer, vip, "blackhole")
    ok = (not run["completed"] and bool(run.get("stalled")) and run["lb_too_big"] == 0 and run["router_too_big"] > 0
          and run["router_icmp"] > 0 and run["lb_icmp_passed"] > 0 and run["route_mtu"] is None)
    return Outcome(PmtuScenario(name="blackhole", completed=bool(run["completed"]), seconds=run["seconds"],
                                route_mtu=run["route_mtu"], expected_completed=False), run,
                   None if ok else "blackhole: expected a stall, the router dropping for size and its ICMP "
                   "reaching the LB (passed to the LB's kernel), nothing learnt by the client")


def _udp_df(lab: Lab, balancer: LabBalancer, vip: str, want_mtu: int) -> Outcome:
    _configure(balancer, UNDERLAY_MTU)
    _forget_paths(lab, vip)
    before = counters(balancer)
    run: dict[str, Any] = json.loads(lab.python("client", "lab.nodes.udp_df", "--vip", vip,
                                                "--port", str(UDP_PORT), "--size", str(UNDERLAY_MTU)).stdout)
    run.update(scenario="udp-df", lb_too_big=_delta(before, counters(balancer), "TX_ICMP_TOO_BIG"),
               route=_route(lab, vip), route_mtu=_route_mtu(lab, vip))
    ok = (run["mtu_learnt"] == want_mtu and run["route_mtu"] == want_mtu and run["resend"] == "EMSGSIZE"
          and run["lb_too_big"] >= 1)
    # "completed" for a datagram: the sender learnt the path MTU from the LB's answer.
    return Outcome(PmtuScenario(name="udp-df", completed=run["mtu_learnt"] == want_mtu, seconds=0.0,
                                route_mtu=run["route_mtu"]), run,
                   None if ok else f"udp-df: expected the LB's ICMP, path MTU {want_mtu} learnt, EMSGSIZE on resend")


def test_pmtu(lab: Lab, balancer: LabBalancer, sinks: Services) -> None:
    vip = _vip(lab, balancer.family)
    want_mtu = UNDERLAY_MTU - by_id(balancer.encap_id).overhead
    outcomes = [_icmp(lab, balancer, vip, want_mtu), _clamped(lab, balancer, vip, want_mtu),
                _blackhole(lab, balancer, vip), _udp_df(lab, balancer, vip, want_mtu)]
    payload = PmtuPayload(encap=cast(EncapId, balancer.encap_id), scenarios=[o.scenario for o in outcomes])
    write_result("pmtu", f"test_pmtu[{balancer.encap_id}]", payload)
    sys.stdout.write(f"\n{balancer.encap_id}: " + "; ".join(
        f"{o.seen['scenario']}: " + ", ".join(f"{k} {o.seen.get(k)}" for k in _SHOWN if k in o.seen)
        for o in outcomes) + "\n")
    problems = [o.problem for o in outcomes if o.problem]
    evidence = "\n".join(json.dumps(o.seen, sort_keys=True) for o in outcomes)
    assert not problems, f"{balancer.encap_id} (overhead {by_id(balancer.encap_id).overhead}):\n" + \
        "\n".join(problems) + f"\nwhat happened:\n{evidence}"
