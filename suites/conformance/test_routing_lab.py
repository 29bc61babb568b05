"""Pinned client prefixes and inline decap end to end, in the default lab.

    pinned   the VIPs pin the client's own prefix to real3 (`src_routes`): every new connection
             (curl, each its own source port) is answered by real3, where without the pin the ring
             spreads them over the reals; the LB counts each as pinned.
    decap    the LB's own address on its uplink is a decap address (`[[decap]] action = "balance"`):
             UDP requests to the VIP's echo, sent inside GUE to that address as a chained LB or a
             tunnelled health check sends them (lab/nodes/tunnel_client.py), are stripped there,
             balanced like any client packet, and answered by the reals straight to the client.
"""

from __future__ import annotations

import ipaddress
import json
from collections import Counter
from dataclasses import replace

import pytest

from balancer import config as cfg
from balancer.encaps import IP4_GUE1, IP4_IPIP, IP6_GUE1, IP6_IP6IP6
from lab.dut import Capability
from lab.harness import Lab, LabBalancer
from lab.lbconf import real_addresses

pytestmark = [pytest.mark.topology("default")]
REQUESTS = 20
PINNED_TO = "real3"
ECHO_PORT = 9000  # the default topology's UDP echo on the VIPs


def _vip(lab: Lab, family: int) -> str:
    return next(str(v.address) for v in lab.topology.vips if v.address.version == family)


def _events(balancer: LabBalancer) -> Counter[str]:
    return Counter(balancer.stats()["events"])


def _curls(lab: Lab, family: int) -> Counter[str]:
    vip = _vip(lab, family)
    url = f"http://[{vip}]/" if family == 6 else f"http://{vip}/"
    return Counter(lab.run("client", ["curl", "-s", "--max-time", "3", url]).stdout.strip()
                   for _ in range(REQUESTS))


@pytest.mark.needs(Capability.SOURCE_PINNING)
@pytest.mark.parametrize("encap", [IP4_IPIP, IP6_IP6IP6])
def test_a_pinned_client_prefix_sends_new_flows_to_its_real(balancer: LabBalancer) -> None:
    lab = balancer.lab
    spread = _curls(lab, balancer.family)
    assert len(spread) >= 2, f"without a pin the ring should spread {REQUESTS} connections: {spread}"
    conf = balancer.config_for()
    real = ipaddress.ip_address(real_addresses(lab.topology, balancer.family)[PINNED_TO])
    pins = (cfg.SrcRoute(prefix=_interface(lab, "client", balancer.family).network, real=real),)
    balancer.apply(replace(conf, vips=tuple(replace(v, src_routes=pins) for v in conf.vips)))
    before = _events(balancer)
    pinned = _curls(lab, balancer.family)
    counted = _events(balancer) - before
    assert pinned == Counter({PINNED_TO: REQUESTS}), f"pinned to {PINNED_TO}, answered by {pinned}"
    assert counted["SRC_PINNED"] >= REQUESTS, counted


@pytest.mark.needs(Capability.INLINE_DECAP)
@pytest.mark.parametrize("encap", [IP4_GUE1, IP6_GUE1])
def test_tunnelled_requests_to_the_lb_are_balanced(balancer: LabBalancer) -> None:
    lab = balancer.lab
    conf = balancer.config_for()
    lb = _interface(lab, "lb", balancer.family).ip
    balancer.apply(replace(conf, decap=(cfg.DecapAddress(address=lb),)))
    before = _events(balancer)
    out = lab.python("client", "lab.nodes.tunnel_client", "--lb", str(lb), "--gue-port", str(conf.encap.gue_port),
                     "--vip", _vip(lab, balancer.family), "--port", str(ECHO_PORT), "--count", str(REQUESTS))
    answers = Counter(json.loads(out.stdout)["answers"])
    counted = _events(balancer) - before
    assert set(answers) <= set(real_addresses(lab.topology, balancer.family)), f"answers: {answers}"
    assert sum(answers.values()) == REQUESTS and counted["DECAP_INLINE"] == REQUESTS, (answers, counted)


def _interface(lab: Lab, node: str, family: int) -> ipaddress.IPv4Interface | ipaddress.IPv6Interface:
    """The node's first address of the family with its prefix (the client's own /28 or /64)."""
    found: ipaddress.IPv4Interface | ipaddress.IPv6Interface = next(
        i for ep in lab.topology.endpoints_of(node) for i in ep.addresses if i.version == family)
    return found
