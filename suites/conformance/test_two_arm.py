"""Two-arm: VIP traffic in by one arm, every encapsulated frame out by the other, replies straight from the reals.

Topology `two-arm`: the LB's ingress arm (lb-rt, MTU 3000) and its egress arm (lb-eg, MTU 1500) are two
links to the router; the balancer is loaded with `datapath.egress = "lb-eg"` (lab/lbconf.py), sends to
the MAC of the router's rt-eg and answers too big at the egress arm's MTU. Captured on the router's
ends of both arms (and on the client's link), for every encap:

    arms      HTTP and UDP echo from every client address: every request answered, every real serves;
              the ingress arm carries client→VIP packets towards the LB and nothing from it but its
              own link chatter (ARP, ND); the egress arm carries the same packets encapsulated (each
              inner packet byte for byte one the ingress carried), from lb-eg's MAC to rt-eg's, and
              nothing towards the LB; the LB's TX_ENCAP count equals both. No reply crosses the LB.
    pmtu      a 1500-byte UDP datagram with DF: the LB answers too big with 1500 minus the encap's
              overhead (the egress MTU: the ingress arm would have taken 3000) by the ingress arm,
              from lb-rt's MAC to rt-lb's; the client's socket learns it, a resend fails EMSGSIZE.
    echo      a ping of the VIP is answered by the LB itself, by the ingress arm.
    churn     (one encap per family) test_churn's removal with live connections: the removed real's
              flows fail fast by reset, no flow of a surviving real breaks, new flows avoid it.
    tracer    with rt-eg's MTU lowered below what the LB sends, the redirected frames die in the
              egress's transmit, and the lab tracer names it (redirect_error on lb-eg, node lb)
              while the LB counted them TX_ENCAP: the drop tracer covers the egress as XDP_TX's.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest

from balancer import _abi
from balancer.encaps import IP4_IPIP, IP6_IP6IP6, by_id
from lab.dut import Capability
from lab.harness import Lab, LabBalancer
from lab.harness.settle import wait_client_quiet
from lab.lbconf import egress_link, lb_link, real_addresses
from lab.nodes.tcp_services import Services
from lab.observe.capture import ICMP6_LINK_CONTROL
from lab.packets.decode import PROTO_TCP, PROTO_UDP, Frame, decapsulate, ip_of
from suites.conformance._counters import changed, counters
from suites.conformance._wire import ETH_P_ARP, PROTO_ICMP, PROTO_ICMPV6, first, read_frames
from suites.conformance.test_churn import _check_removal, _configure

pytestmark = [pytest.mark.topology("two-arm"), pytest.mark.needs(Capability.TWO_ARM, Capability.COUNTERS_PER_REASON)]
GUE_PORT = _abi.Limits.DEFAULT_GUE_PORT
REQUESTS = 12  # per kind (HTTP, UDP), spread over the client's source addresses
SNAPLEN = 4096  # whole frames: the ingress arm's MTU is 3000
EGRESS_MTU = 1500
NARROW_MTU = 1280  # rt-eg's MTU in the tracer test: below the frames the LB sends, at least IPv6's minimum


@contextmanager
def _arms(lab: Lab, directory: Path) -> Iterator[tuple[Path, Path]]:
    """Captures of the router's ends of the ingress and the egress arm while the block runs."""
    _, router, router_in = lb_link(lab.topology)
    egress = egress_link(lab.topology)
    assert egress is not None, f"topology '{lab.topology.name}' gives the LB no egress"
    pcaps = directory / "ingress.pcap", directory / "egress.pcap"
    with ExitStack() as stack:
        stack.enter_context(lab.capture(router, router_in, pcaps[0], SNAPLEN))
        stack.enter_context(lab.capture(egress[1], egress[2], pcaps[1], SNAPLEN))
        yield pcaps


def _macs(lab: Lab) -> dict[str, str]:
    """The MACs of both arms' ends: lb-in, router-in, lb-out, router-out."""
    lb_in, router, router_in = lb_link(lab.topology)
    egress = egress_link(lab.topology)
    assert egress is not None
    return {"lb-in": lab.mac("lb", lb_in).lower(), "router-in": lab.mac(router, router_in).lower(),
            "lb-out": lab.mac("lb", egress[0]).lower(), "router-out": lab.mac(egress[1], egress[2]).lower()}


def _link_chatter(frame: Frame) -> bool:
    """ARP, or IPv6 neighbour discovery / MLD: what any host's kernel sends on its link."""
    if frame.ethertype == ETH_P_ARP:
        return True
    ip = ip_of(frame)
    return ip is not None and ip.proto == PROTO_ICMPV6 and bool(ip.payload) and ip.payload[0] in ICMP6_LINK_CONTROL


def _clients(lab: Lab, family: int) -> list[str]:
    return sorted({str(a.ip) for link in lab.topology.links for ep in link.endpoints
                   if ep.node == "client" for a in ep.all_addresses if a.version == family})


def _vip(lab: Lab, family: int) -> str:
    return next(str(v.address) for v in lab.topology.vips if v.address.version == family)


def _split(frames: list[Frame], lb_mac: str) -> tuple[list[Frame], list[Frame]]:
    """(frames towards the LB, frames from the LB) of one arm, link chatter left out."""
    to_lb = [f for f in frames if f.dst_mac == lb_mac and not _link_chatter(f)]
    from_lb = [f for f in frames if f.src_mac == lb_mac and not _link_chatter(f)]
    return to_lb, from_lb


def test_arms(lab: Lab, balancer: LabBalancer, tmp_path: Path) -> None:
    fam = balancer.family
    vip, clients = _vip(lab, fam), _clients(lab, fam)
    outer_reals = set(real_addresses(lab.topology, by_id(balancer.encap_id).outer_family).values())
    macs = _macs(lab)
    before = counters(balancer)
    answers: list[dict[str, Any]] = []
    with _arms(lab, tmp_path) as (ingress, egress):
        for kind, port in (("http", 80), ("udp", 9000)):
            args = [kind, "--vip", vip, "--port", str(port), "--count", str(REQUESTS)]
            answers += json.loads(lab.python("client", "lab.nodes.traffic", *args,
                                             *[a for c in clients for a in ("--source", c)]).stdout)
        wait_client_quiet(lab, vip)
    lb = changed(before, counters(balancer))
    failed = [a for a in answers if "error" in a]
    assert not failed, f"{len(failed)} of {len(answers)} requests failed: {failed[:3]}"
    assert {a["node"] for a in answers} == set(real_addresses(lab.topology, fam)), f"answers: {answers}"

    to_lb, back_in = _split(read_frames(ingress), macs["lb-in"])
    into_egress, emitted = _split(read_frames(egress), macs["lb-out"])
    flows = [ip_of(f) for f in to_lb]
    stray = [str(p) for p in flows if p is None or p.dst != vip or p.src not in clients
             or p.proto not in (PROTO_TCP, PROTO_UDP)]
    assert to_lb and not stray, f"the ingress arm carried more than client→VIP towards the LB: {first(stray)}"
    assert not back_in, f"the LB sent {len(back_in)} frames by the ingress arm: {first([f.raw.hex() for f in back_in])}"
    assert not into_egress, f"{len(into_egress)} frames went to the LB by its egress arm"
    decoded = [decapsulate(f, GUE_PORT) for f in emitted]
    assert all(d is not None for d in decoded), "the egress arm carried a frame that is not encapsulated"
    assert {(f.src_mac, f.dst_mac) for f in emitted} == {(macs["lb-out"], macs["router-out"])}
    assert {d.outer.dst for d in decoded if d} <= outer_reals
    inner = sorted(d.inner.raw for d in decoded if d)
    assert inner == sorted(p.raw for p in flows if p), "the inner packets are not the ingress arm's, byte for byte"
    assert lb.get("TX_ENCAP") == len(emitted) == len(to_lb), \
        f"LB counters {lb}, frames in by the ingress arm {len(to_lb)}, out by the egress arm {len(emitted)}"
    sys.stdout.write(f"\n{balancer.encap_id}: {len(answers)} answers; {len(to_lb)} client→VIP packets in by the "
                     f"ingress arm, {len(emitted)} encapsulated out by the egress arm, 0 replies through the LB\n")


def test_pmtu_is_the_egress_arms(lab: Lab, balancer: LabBalancer, tmp_path: Path) -> None:
    vip = _vip(lab, balancer.family)
    macs = _macs(lab)
    want = EGRESS_MTU - by_id(balancer.encap_id).overhead
    lab.run("client", ["ip", f"-{balancer.family}", "route", "flush", "cache"])
    before = counters(balancer)
    with _arms(lab, tmp_path) as (ingress, egress):
        run = json.loads(lab.python("client", "lab.nodes.udp_df", "--vip", vip, "--port", "9000",
                                    "--size", str(EGRESS_MTU)).stdout)
    lb = changed(before, counters(balancer))
    assert (run["mtu_learnt"], run["resend"]) == (want, "EMSGSIZE"), f"the client's socket: {run}"
    assert lb.get("TX_ICMP_TOO_BIG", 0) >= 1 and "TX_ENCAP" not in lb, f"LB counters {lb}"
    icmp = PROTO_ICMP if balancer.family == 4 else PROTO_ICMPV6
    answers = [f for f in _split(read_frames(ingress), macs["lb-in"])[1] if (ip := ip_of(f)) and ip.proto == icmp]
    assert answers and all(f.dst_mac == macs["router-in"] for f in answers), "too big did not leave by the ingress arm"
    assert not _split(read_frames(egress), macs["lb-out"])[1], "the egress arm carried something for a too-big packet"


def test_echo_is_answered_by_the_ingress_arm(lab: Lab, balancer: LabBalancer, tmp_path: Path) -> None:
    vip = _vip(lab, balancer.family)
    macs = _macs(lab)
    before = counters(balancer)
    with _arms(lab, tmp_path) as (ingress, egress):
        done = json.loads(lab.python("client", "lab.nodes.echo", "--count", "3", vip).stdout)
    assert done["answered"] == 3, f"the client's echo: {done}"
    assert changed(before, counters(balancer)).get("TX_ICMP_ECHO") == 3
    replies = _split(read_frames(ingress), macs["lb-in"])[1]
    assert len(replies) == 3 and {f.dst_mac for f in replies} == {macs["router-in"]}
    assert not _split(read_frames(egress), macs["lb-out"])[1]


@pytest.mark.needs(Capability.CONSISTENT_HASHING, Capability.OWNER_QUERY)
@pytest.mark.parametrize("encap", [IP4_IPIP, IP6_IP6IP6])
def test_remove_real_two_arm(balancer: LabBalancer, echoes: Services) -> None:
    _configure(balancer)
    _check_removal(balancer, "test_remove_real_two_arm")


@pytest.mark.parametrize("encap", [IP4_IPIP])
def test_the_tracer_names_a_dead_egress(lab: Lab, balancer: LabBalancer) -> None:
    if lab.tracer is None:
        pytest.skip("the lab tracer needs BCC and kernel headers: run `bash scripts/setup.sh --extra trace`")
    egress = egress_link(lab.topology)
    assert egress is not None
    _, router, router_out, mtu = egress
    vip = _vip(lab, 4)
    lab.run(router, ["ip", "link", "set", router_out, "mtu", str(NARROW_MTU)])
    try:
        lab.tracer.clear()
        before = counters(balancer)
        run = json.loads(lab.python("client", "lab.nodes.udp_df", "--vip", vip, "--port", "9000",
                                    "--size", str(EGRESS_MTU - 100)).stdout)
        lb = changed(before, counters(balancer))
        dead = lab.tracer.report().node("lb").redirect_errors()
    finally:
        lab.run(router, ["ip", "link", "set", router_out, "mtu", str(mtu)])
    assert lb.get("TX_ENCAP", 0) >= 1, f"the LB did not encapsulate the datagram: {lb}, {run}"
    assert dead.get((egress[0], "drops"), 0) >= 1, f"the tracer saw no dropped redirect on {egress[0]}: {dead}"
    sys.stdout.write(f"\ntracer: {dead} while the LB counted {lb}\n")
