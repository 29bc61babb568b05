"""Pinned client prefixes, inline decap, prefix VIPs and UDP flow migration end to end, in the default lab.

    pinned   the VIPs pin the client's own prefix to real3 (`src_routes`): every new connection
             (curl, each its own source port) is answered by real3, where without the pin the ring
             spreads them over the reals; the LB counts each as pinned.
    decap    the LB's own address on its uplink is a decap address (`[[decap]] action = "balance"`):
             UDP requests to the VIP's echo, sent inside GUE to that address as a chained LB or a
             tunnelled health check sends them (lab/nodes/tunnel_client.py), are stripped there,
             balanced like any client packet, and answered by the reals straight to the client.
    prefix   the VIP is a prefix (Katran's CIDR VIPs): the router routes it to the LB, every real holds
             ADDRESSES of it on lo with a line echo on each; TCP connections to each address are
             answered, each by the real the VIP's one ring gives it (asked of the loaded program),
             and the ring spreads them over more than one real.
    migrate  `lbctl run` probes each real (TCP to its own address); a UDP VIP with
             `udp_flow_migration` and a TCP VIP share the reals. Once the daemon takes down the real
             holding the most UDP flows (its probe listener stopped; the real itself serves on), the
             next datagram of each of that real's UDP flows goes to another real and is answered,
             the LB counting the migration, while every other UDP flow and every TCP connection,
             that real's included, stays with its real.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from balancer import config as cfg
from balancer.encaps import IP4_GUE1, IP4_IPIP, IP6_GUE1, IP6_IP6IP6
from lab.dut import Capability
from lab.harness import Lab, LabBalancer
from lab.lbconf import real_addresses
from lab.nodes.churn_client import ChurnClient
from lab.nodes.tcp_services import Services
from lab.nodes.udp_client import UdpClient
from suites.conformance._daemon import start_daemon
from suites.conformance._owners import ring_owners

pytestmark = [pytest.mark.topology("default")]
REQUESTS = 20
PINNED_TO = "real3"
ECHO_PORT = 9000  # the default topology's UDP echo on the VIPs
TCP_ECHO_PORT = 7031  # the line echo these tests start on the reals
PREFIXES = {4: ipaddress.ip_network("198.51.100.32/28"), 6: ipaddress.ip_network("2001:db8:200::/120")}
PREFIX_HOSTS = (1, 7, 14)  # the addresses of the prefix the reals hold and the client reaches
PREFIX_CONNS = 8  # TCP connections to each of them
HEALTH_PORT = 7040  # the daemon's probes, to each real's own address
FLOWS = 24


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


@pytest.mark.needs(Capability.CIDR_VIPS)
@pytest.mark.parametrize("encap", [IP4_IPIP, IP6_GUE1])
def test_a_prefix_vip_serves_every_address_of_it_by_one_ring(balancer: LabBalancer, tmp_path: Path) -> None:
    lab, net = balancer.lab, PREFIXES[balancer.family]
    addresses = [str(net[i]) for i in PREFIX_HOSTS]
    conf = balancer.config_for()
    vip = replace(conf.vips[0], address=net.network_address, prefix_len=net.prefixlen, port=TCP_ECHO_PORT,
                  proto="tcp")
    balancer.apply(replace(conf, vips=(vip,)))
    answered: dict[str, dict[int, str]] = {}
    with contextlib.ExitStack() as stack:
        _route_prefix_to_lb(stack, lab, net, balancer.family)
        reals = sorted(real_addresses(lab.topology, balancer.family))
        for node in reals:
            for addr in addresses:
                _add_address(stack, lab, node, addr)
        stack.enter_context(Services(lab, reals, "echo", [_bind(a, TCP_ECHO_PORT) for a in addresses], cpu=0))
        for addr in addresses:
            client = stack.enter_context(ChurnClient(lab, "client", addr, TCP_ECHO_PORT, "--conns", str(PREFIX_CONNS),
                                                     "--interval", "3600", "--new-every", "3600", "--cpu", "0"))
            conns = client.ready["conns"]
            answered[addr] = {c["index"]: c["node"] for c in conns}
            owners = ring_owners(lab, balancer, addr, TCP_ECHO_PORT, conns)
            assert answered[addr] == owners, f"{addr}: answered by {answered[addr]}, the VIP's ring says {owners}"
    spread = Counter(node for by_conn in answered.values() for node in by_conn.values())
    sys.stdout.write(f"\n{balancer.encap_id} prefix VIP {net}: {len(addresses)} addresses x {PREFIX_CONNS} "
                     f"connections answered by {dict(spread)}, each by its ring owner\n")
    assert all(len(by_conn) == PREFIX_CONNS for by_conn in answered.values()), answered
    assert set(spread) <= set(reals) and len(spread) >= 2, f"the ring should spread the connections: {spread}"


@pytest.mark.needs(Capability.UDP_FLOW_MIGRATION)
@pytest.mark.parametrize("encap", [IP4_IPIP, IP6_GUE1])
def test_udp_flows_leave_a_real_health_checks_took_down(balancer: LabBalancer, tmp_path: Path) -> None:
    lab, family = balancer.lab, balancer.family
    conf = _migration_config(balancer)
    balancer.write_config(conf)
    reals = real_addresses(lab.topology, family)
    vip = _vip(lab, family)
    with contextlib.ExitStack() as stack:
        probed = {n: stack.enter_context(Services(lab, [n], "echo", [_bind(a, HEALTH_PORT)])) for n, a in reals.items()}
        stack.enter_context(Services(lab, sorted(reals), "echo", [_bind(vip, TCP_ECHO_PORT)], cpu=0))
        daemon = start_daemon(stack, balancer, tmp_path)
        assert daemon.wait("running")["health_targets"] == 2 * len(reals)
        udp = stack.enter_context(UdpClient(lab, "client", vip, ECHO_PORT, "--conns", str(FLOWS), "--cpu", "0"))
        tcp = stack.enter_context(ChurnClient(lab, "client", vip, TCP_ECHO_PORT, "--conns", str(FLOWS), "--interval",
                                              "0.5", "--timeout", "3", "--new-every", "3600", "--cpu", "0"))
        before = {c["index"]: c["node"] for c in udp.ready["conns"]}
        assert udp.round() == before, "UDP flows changed real with nothing changed"
        on_tcp = Counter(c["node"] for c in tcp.ready["conns"])
        down = max((n for n in reals if on_tcp[n]), key=lambda n: sum(v == n for v in before.values()))
        leaving = {i for i, node in before.items() if node == down}
        events = _events(balancer)
        probed[down].stop()
        daemon.wait("applied", where=lambda e: e.get("trigger") == "health" and
                    all(reals[down] in e.get("down", {}).get(v.name, []) for v in conf.vips))
        after = udp.round()
        report = tcp.stop(after=1.0)
    counted = _events(balancer) - events
    broken = [c for c in report["conns"] if c["status"] != "ok" or len(c["nodes"]) > 1]
    sys.stdout.write(f"\n{balancer.encap_id}: {down} down; its {len(leaving)} UDP flows now answered by "
                     f"{sorted(after[i] for i in leaving)}, LB events {dict(counted)}; {on_tcp[down]} of "
                     f"{len(report['conns'])} TCP connections on {down}, {len(broken)} broken or moved\n")
    assert leaving, f"no UDP flow on {down}: the test would prove nothing"
    assert all(after[i] in reals and after[i] != down for i in leaving), f"{down}'s UDP flows: {after}"
    assert {i: after[i] for i in before if i not in leaving} == {i: n for i, n in before.items() if i not in leaving}
    assert counted["UDP_MIGRATED"] >= len(leaving), counted
    assert not broken and len(report["conns"]) == FLOWS, f"TCP connections broken or moved: {broken[:3]}"


def _migration_config(balancer: LabBalancer) -> cfg.Config:
    """The topology's UDP echo VIP with UDP flow migration, and a TCP VIP on the line echo, both probing
    each real's own address on HEALTH_PORT (fall 2 in 0.3 s steps)."""
    conf = balancer.config_for()
    check = cfg.HealthCheck(port=HEALTH_PORT, type="tcp", interval_s=0.3, timeout_s=0.25, rise=1, fall=2)
    udp = next(v for v in conf.vips if v.proto == "udp")
    return replace(conf, vips=(replace(udp, udp_flow_migration=True, healthcheck=check),
                               replace(udp, port=TCP_ECHO_PORT, proto="tcp", healthcheck=check)))


def _route_prefix_to_lb(stack: contextlib.ExitStack, lab: Lab, net: ipaddress.IPv4Network | ipaddress.IPv6Network,
                        family: int) -> None:
    """The router's route for the prefix VIP, by the LB (as its route for the topology's VIP)."""
    via = str(_interface(lab, "lb", family).ip)
    lab.run("router", ["ip", "route", "add", str(net), "via", via])
    stack.callback(lab.run, "router", ["ip", "route", "del", str(net), "via", via])


def _add_address(stack: contextlib.ExitStack, lab: Lab, node: str, address: str) -> None:
    """One address of the prefix VIP on the real's lo, as the topology's VIP is."""
    host = f"{address}/{128 if ':' in address else 32}"
    lab.run(node, ["ip", "addr", "add", host, "dev", "lo"])
    stack.callback(lab.run, node, ["ip", "addr", "del", host, "dev", "lo"])


def _bind(address: str, port: int) -> str:
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def _interface(lab: Lab, node: str, family: int) -> ipaddress.IPv4Interface | ipaddress.IPv6Interface:
    """The node's first address of the family with its prefix (the client's own /28 or /64)."""
    found: ipaddress.IPv4Interface | ipaddress.IPv6Interface = next(
        i for ep in lab.topology.endpoints_of(node) for i in ep.addresses if i.version == family)
    return found
