"""Server-id routing end to end: real QUIC, TCP and UDP flows keep their real across a ring change by their ids.

Topology `default`. QUIC: every real runs a real QUIC server (aioquic, lab/nodes/quic_echo.py) whose
connection ids carry its server id in Katran's v2 layout, the LB serves a UDP VIP on QUIC_PORT with
`server_id_from = "quic"`. TCP: every real runs the line echo; the client's kernel writes the id of
the real that answered into every segment as Katran's option 183 (a sock_ops program on the client's
own cgroup, lab/nodes/tcp_sid_client.py), the LB serves a TCP VIP on ECHO_PORT with `server_id_from =
"tcp-option"`. UDP: the reals' UDP echo (the lab's own service); each datagram of the client's flows
starts with Katran's stable-routing header carrying the id of the real that answered its flow's first
one (lab/nodes/udp_client.py), the LB serves the UDP VIP on UDP_ECHO_PORT with `server_id_from =
"stable-routing"`. The VIPs go without the session table (`lru = false`), so that nothing but the
ids can keep a connection where it is: the ring alone decides every other packet. A client holds
CONNS connections (or flows) to the VIP through two reals, then a third real joins the VIP, which
moves the ring slots of about a third of the flows to it.

    known    the reals' ids are in the config: every connection is answered by its own real after
             the change, the ones whose ring owner moved included (there must be some), and the LB
             counted their packets as routed by id.
    unknown  the reals carry ids the config does not name: the LB counts them unknown and falls back
             to the ring, so exactly the connections whose ring owner moved lose their real (the
             real they now reach has no such connection: QUIC gets no answer, TCP a reset; a UDP
             flow, which has none to lose, is answered by its new ring owner) and the others keep it.

The ring owner of each flow, before and after, is asked of the loaded program (suites/conformance/
_owners.py), and checked first against the real that really answered.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass, replace

import pytest

from balancer import config as cfg
from balancer.encaps import IP4_GUE1, IP6_IP6IP6
from lab.dut import Capability
from lab.harness import Lab, LabBalancer
from lab.lbconf import real_addresses, vip_binds
from lab.nodes.quic_echo import QuicClient
from lab.nodes.tcp_services import Services
from lab.nodes.tcp_sid_client import TcpSidClient
from lab.nodes.udp_client import UdpClient
from suites.conformance._owners import owner_changed, ring_owners

pytestmark = [pytest.mark.topology("default"), pytest.mark.needs(Capability.SERVER_ID_ROUTING)]
QUIC_PORT = 8443
ECHO_PORT = 7007
UDP_ECHO_PORT = 9000  # the default topology's UDP echo on the VIPs
CONNS = 24
JOINS = "real3"
SERVER_IDS = {"real1": 101, "real2": 102, "real3": 103}
IDS_ARG = ("--ids", ",".join(f"{n}={i}" for n, i in SERVER_IDS.items()))


@dataclass(frozen=True)
class Carrier:
    """Where a flow carries its server id: the VIP's `server_id_from`, protocol and port, and the client
    that holds CONNS such flows (with its arguments: the ids it writes itself)."""

    server_id_from: str
    proto: str
    port: int
    client: type[QuicClient]
    args: tuple[str, ...] = ()


QUIC = Carrier("quic", "udp", QUIC_PORT, QuicClient)
TCP_OPTION = Carrier("tcp-option", "tcp", ECHO_PORT, TcpSidClient, IDS_ARG)
STABLE_ROUTING = Carrier("stable-routing", "udp", UDP_ECHO_PORT, UdpClient, ("--stable-routing", *IDS_ARG))


@dataclass(frozen=True)
class Outcome:
    """Who answered each connection before and after the change, its ring owner after, those whose
    ring owner moved, and the LB's events meanwhile."""

    before: dict[int, str]
    after: dict[int, str]
    owners_after: dict[int, str]
    moved: set[int]
    counted: dict[str, int]


def _vip(lab: Lab, family: int) -> str:
    return next(str(v.address) for v in lab.topology.vips if v.address.version == family)


@pytest.fixture(scope="module")
def quic_servers(lab: Lab) -> Iterator[Services]:
    """A QUIC echo on every real, on QUIC_PORT of every VIP address, each with its SERVER_IDS id."""
    nodes = sorted(real_addresses(lab.topology, 4))
    with Services(lab, nodes, "serve", vip_binds(lab.topology, QUIC_PORT), module="lab.nodes.quic_echo",
                  node_args={n: ["--server-id", str(SERVER_IDS[n])] for n in nodes}) as servers:
        yield servers


@pytest.fixture(scope="module")
def echo_servers(lab: Lab) -> Iterator[Services]:
    """The line echo on every real, on ECHO_PORT of every VIP address."""
    with Services(lab, sorted(real_addresses(lab.topology, 4)), "echo", vip_binds(lab.topology, ECHO_PORT),
                  cpu=0) as servers:
        yield servers


def _configure(balancer: LabBalancer, carrier: Carrier, *, with_ids: bool, joined: bool) -> None:
    """The one VIP (QUIC or stable routing on UDP, or TCP with the option): lru off, the reals (JOINS
    only once joined) with or without their ids."""
    conf = balancer.config_for(lru=False)
    vip = next(v for v in conf.vips if v.address.version == balancer.family)
    names = {a: n for n, a in real_addresses(balancer.lab.topology, balancer.family).items()}
    reals = tuple(replace(r, server_id=SERVER_IDS[names[str(r.address)]] if with_ids else None)
                  for r in vip.reals if joined or names[str(r.address)] != JOINS)
    one = replace(vip, port=carrier.port, proto=carrier.proto, reals=reals, server_id_from=carrier.server_id_from)
    balancer.apply(cfg.loads(cfg.dump(replace(conf, vips=(one,))), "test"))


def _events(balancer: LabBalancer) -> dict[str, int]:
    return dict(balancer.stats()["events"])


def _run(balancer: LabBalancer, with_ids: bool, carrier: Carrier = QUIC) -> Outcome:
    """CONNS connections through two reals, then the third joins: who answered, before and after."""
    lab = balancer.lab
    vip = _vip(lab, balancer.family)
    proto, port = carrier.proto, carrier.port
    _configure(balancer, carrier, with_ids=with_ids, joined=False)
    with carrier.client(lab, "client", vip, port, "--conns", str(CONNS), *carrier.args, ready_timeout=60) as client:
        conns = client.ready["conns"]
        before = {c["index"]: c["node"] for c in conns}
        owners_before = ring_owners(lab, balancer, vip, port, conns, proto=proto)
        assert owners_before == before, f"the ring's owners {owners_before} are not who answered {before}"
        events = _events(balancer)
        _configure(balancer, carrier, with_ids=with_ids, joined=True)
        owners_after = ring_owners(lab, balancer, vip, port, conns, proto=proto)
        moved = owner_changed(owners_before, owners_after)
        after = client.round()
    counted = {k: v - events.get(k, 0) for k, v in _events(balancer).items() if v != events.get(k, 0)}
    sys.stdout.write(f"\n{balancer.encap_id} {carrier.server_id_from} ids {'known' if with_ids else 'unknown'}: "
                     f"before {before}, after {after}, ring owner moved for {sorted(moved)}, LB events {counted}\n")
    return Outcome(before, after, owners_after, moved, counted)


def _kept(o: Outcome) -> None:
    """Known ids: every connection answered by its own real, some of them against the ring."""
    assert o.moved, "adding a real moved no connection's ring slot: the test would prove nothing"
    assert o.after == o.before, f"connections answered by another real, or not at all: {o.before} -> {o.after}"
    assert o.counted.get("SID_ROUTED", 0) >= CONNS and not o.counted.get("SID_UNKNOWN"), o.counted


def _lost(o: Outcome) -> set[int]:
    """Unknown ids: exactly the connections whose ring owner moved lost their real; returns them."""
    lost = {i for i, node in o.after.items() if node != o.before[i]}
    assert o.moved and lost == o.moved, (f"connections that lost their real {sorted(lost)} are not exactly those "
                                         f"whose ring owner moved {sorted(o.moved)}")
    assert o.counted.get("SID_UNKNOWN", 0) >= CONNS and not o.counted.get("SID_ROUTED"), o.counted
    return lost


@pytest.mark.parametrize("encap", [IP4_GUE1, IP6_IP6IP6])
def test_quic_connections_keep_their_real_by_server_id(balancer: LabBalancer, quic_servers: Services) -> None:
    _kept(_run(balancer, with_ids=True))


@pytest.mark.parametrize("encap", [IP4_GUE1, IP6_IP6IP6])
def test_quic_connections_with_unknown_ids_follow_the_ring(balancer: LabBalancer, quic_servers: Services) -> None:
    o = _run(balancer, with_ids=False)
    assert all(o.after[i] in ("timeout", "empty") or o.after[i].startswith("error") for i in _lost(o)), o.after


@pytest.mark.parametrize("encap", [IP4_GUE1, IP6_IP6IP6])
def test_tcp_connections_keep_their_real_by_the_option(balancer: LabBalancer, echo_servers: Services) -> None:
    _kept(_run(balancer, with_ids=True, carrier=TCP_OPTION))


@pytest.mark.parametrize("encap", [IP4_GUE1, IP6_IP6IP6])
def test_tcp_connections_with_unknown_ids_follow_the_ring(balancer: LabBalancer, echo_servers: Services) -> None:
    o = _run(balancer, with_ids=False, carrier=TCP_OPTION)
    assert all(o.after[i] in ("reset", "timeout") for i in _lost(o)), o.after


@pytest.mark.parametrize("encap", [IP4_GUE1, IP6_IP6IP6])
def test_udp_flows_keep_their_real_by_the_stable_routing_header(balancer: LabBalancer) -> None:
    _kept(_run(balancer, with_ids=True, carrier=STABLE_ROUTING))


@pytest.mark.parametrize("encap", [IP4_GUE1, IP6_IP6IP6])
def test_udp_flows_with_unknown_stable_routing_ids_follow_the_ring(balancer: LabBalancer) -> None:
    o = _run(balancer, with_ids=False, carrier=STABLE_ROUTING)
    lost = _lost(o)
    assert all(o.after[i] == o.owners_after[i] for i in lost), \
        f"flows that lost their real are not answered by their new ring owner: {o.after} vs {o.owners_after}"
