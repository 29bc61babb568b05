"""Server-id routing end to end: real QUIC and TCP connections keep their real across a ring change by their ids.

Topology `default`. QUIC: every real runs a real QUIC server (aioquic, lab/nodes/quic_echo.py) whose
connection ids carry its server id in Katran's v2 layout, the LB serves a UDP VIP on QUIC_PORT with
`server_id_from = "quic"`. TCP: every real runs the line echo; the client's kernel writes the id of
the real that answered into every segment as Katran's option 183 (a sock_ops program on the client's
own cgroup, lab/nodes/tcp_sid_client.py), the LB serves a TCP VIP on ECHO_PORT with `server_id_from =
"tcp-option"`. Both VIPs go without the session table (`lru = false`), so that nothing but the ids can
keep a connection where it is: the ring alone decides every other packet. A client holds CONNS
connections to the VIP through two reals, then a third real joins the VIP, which moves the ring
slots of about a third of the flows to it.

    known    the reals' ids are in the config: every connection is answered by its own real after
             the change, the ones whose ring owner moved included (there must be some), and the LB
             counted their packets as routed by id.
    unknown  the reals carry ids the config does not name: the LB counts them unknown and falls back
             to the ring, so exactly the connections whose ring owner moved lose their real (the
             real they now reach has no such connection: QUIC gets no answer, TCP a reset) and the
             others keep it.

The ring owner of each flow, before and after, is asked of the loaded program (suites/conformance/
_owners.py), and checked first against the real that really answered.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import replace

import pytest

from balancer import config as cfg
from balancer.encaps import IP4_GUE1, IP6_IP6IP6
from lab.dut import Capability
from lab.harness import Lab, LabBalancer
from lab.lbconf import real_addresses, vip_binds
from lab.nodes.quic_echo import QuicClient
from lab.nodes.tcp_services import Services
from lab.nodes.tcp_sid_client import TcpSidClient
from suites.conformance._owners import owner_changed, ring_owners

pytestmark = [pytest.mark.topology("default"), pytest.mark.needs(Capability.SERVER_ID_ROUTING)]
QUIC_PORT = 8443
ECHO_PORT = 7007
CONNS = 24
JOINS = "real3"
SERVER_IDS = {"real1": 101, "real2": 102, "real3": 103}


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


def _configure(balancer: LabBalancer, proto: str, *, with_ids: bool, joined: bool) -> None:
    """The one VIP (QUIC on UDP, or TCP with the option): lru off, the reals (JOINS only once joined)
    with or without their ids."""
    conf = balancer.config_for(lru=False)
    vip = next(v for v in conf.vips if v.address.version == balancer.family)
    names = {a: n for n, a in real_addresses(balancer.lab.topology, balancer.family).items()}
    reals = tuple(replace(r, server_id=SERVER_IDS[names[str(r.address)]] if with_ids else None)
                  for r in vip.reals if joined or names[str(r.address)] != JOINS)
    one = replace(vip, port=QUIC_PORT if proto == "udp" else ECHO_PORT, proto=proto, reals=reals,
                  server_id_from="quic" if proto == "udp" else "tcp-option")
    balancer.apply(cfg.loads(cfg.dump(replace(conf, vips=(one,))), "test"))


def _events(balancer: LabBalancer) -> dict[str, int]:
    return dict(balancer.stats()["events"])


def _run(balancer: LabBalancer, with_ids: bool, proto: str = "udp"
         ) -> tuple[dict[int, str], dict[int, str], set[int], dict[str, int]]:
    """(who answered each connection before, after the change; connections whose ring owner moved; events)."""
    lab = balancer.lab
    vip = _vip(lab, balancer.family)
    port = QUIC_PORT if proto == "udp" else ECHO_PORT
    _configure(balancer, proto, with_ids=with_ids, joined=False)
    args = ["--conns", str(CONNS)]
    client_cls: type[QuicClient] = QuicClient
    if proto == "tcp":  # the client writes the option itself, with the id of the real that answered
        client_cls = TcpSidClient
        args += ["--ids", ",".join(f"{n}={i}" for n, i in SERVER_IDS.items())]
    with client_cls(lab, "client", vip, port, *args, ready_timeout=60) as client:
        conns = client.ready["conns"]
        before = {c["index"]: c["node"] for c in conns}
        owners_before = ring_owners(lab, balancer, vip, port, conns, proto=proto)
        assert owners_before == before, f"the ring's owners {owners_before} are not who answered {before}"
        events = _events(balancer)
        _configure(balancer, proto, with_ids=with_ids, joined=True)
        moved = owner_changed(owners_before, ring_owners(lab, balancer, vip, port, conns, proto=proto))
        after = client.round()
    counted = {k: v - events.get(k, 0) for k, v in _events(balancer).items() if v != events.get(k, 0)}
    sys.stdout.write(f"\n{balancer.encap_id} {proto} ids {'known' if with_ids else 'unknown'}: before {before}, after "
                     f"{after}, ring owner moved for {sorted(moved)}, LB events {counted}\n")
    return before, after, moved, counted


@pytest.mark.parametrize("encap", [IP4_GUE1, IP6_IP6IP6])
def test_quic_connections_keep_their_real_by_server_id(balancer: LabBalancer, quic_servers: Services) -> None:
    before, after, moved, counted = _run(balancer, with_ids=True)
    assert moved, "adding a real moved no connection's ring slot: the test would prove nothing"
    assert after == before, f"connections answered by another real, or not at all: {before} -> {after}"
    assert counted.get("SID_ROUTED", 0) >= CONNS and not counted.get("SID_UNKNOWN"), counted


@pytest.mark.parametrize("encap", [IP4_GUE1, IP6_IP6IP6])
def test_quic_connections_with_unknown_ids_follow_the_ring(balancer: LabBalancer, quic_servers: Services) -> None:
    before, after, moved, counted = _run(balancer, with_ids=False)
    lost = {i for i, node in after.items() if node != before[i]}
    assert moved and lost == moved, (f"connections that lost their real {sorted(lost)} are not exactly those whose "
                                     f"ring owner moved {sorted(moved)}")
    assert all(after[i] in ("timeout", "empty") or after[i].startswith("error") for i in lost), after
    assert counted.get("SID_UNKNOWN", 0) >= CONNS and not counted.get("SID_ROUTED"), counted


@pytest.mark.parametrize("encap", [IP4_GUE1, IP6_IP6IP6])
def test_tcp_connections_keep_their_real_by_the_option(balancer: LabBalancer, echo_servers: Services) -> None:
    before, after, moved, counted = _run(balancer, with_ids=True, proto="tcp")
    assert moved, "adding a real moved no connection's ring slot: the test would prove nothing"
    assert after == before, f"connections answered by another real, or reset: {before} -> {after}"
    assert counted.get("SID_ROUTED", 0) >= CONNS and not counted.get("SID_UNKNOWN"), counted


@pytest.mark.parametrize("encap", [IP4_GUE1, IP6_IP6IP6])
def test_tcp_connections_with_unknown_ids_follow_the_ring(balancer: LabBalancer, echo_servers: Services) -> None:
    before, after, moved, counted = _run(balancer, with_ids=False, proto="tcp")
    lost = {i for i, node in after.items() if node != before[i]}
    assert moved and lost == moved, (f"connections that lost their real {sorted(lost)} are not exactly those whose "
                                     f"ring owner moved {sorted(moved)}")
    assert all(after[i] in ("reset", "timeout") for i in lost), after
    assert counted.get("SID_UNKNOWN", 0) >= CONNS and not counted.get("SID_ROUTED"), counted
