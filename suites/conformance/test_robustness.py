"""Robustness on the wire: a storm of malformed, fragmented, option-carrying and random frames at the VIP,
and a flood of a million new flows through a 4096-entry LRU.

Storm (every encap listed): frames are written with a raw AF_PACKET socket in the router's netns
onto rt-lb, addressed to the LB's MAC, so they reach lb-rt unchanged (sent from the client, the
router would drop or rewrite the malformed ones itself). Meanwhile the churn client keeps
CONNS long-lived echo connections through the VIP (pinned to CPU 0). Afterwards: the program is
still attached natively, every connection answered throughout, each named kind of frame was
counted under its reason (exact deltas for the DROP_* reasons, which legitimate traffic never
hits), and every frame has a reason: the deltas of all reasons together equal, exactly, the frames
lb-rt took in. That count is the veth's own: its rx_packets is the number of frames its NAPI poll
consumed, each of which ran the attached XDP program once; it sees nothing but lb-rt, so neither
the router's neighbour or multicast chatter nor a frame rt-lb dropped on a full ring can make the
two disagree (a capture on rt-lb could: it sees frames the ring then drops, and multicast the
old check did not count). The storm's own frames are the generator's count: every send the veth
refused (ENOBUFS) is repeated, so exactly the named and random frames went in, and lb-rt must
have taken in at least those.

Flood: with CONNS established connections alive, the live-frames generator sends FLOOD_FLOWS
UDP datagrams of distinct (source address, port) from the router's rt-lb, from one CPU (from two
CPUs at once, about 40 % of the flood never reached the LB's program). The LB's one session table
(shared by every CPU since issue 11) is over a hundred times smaller than the flood, so the test
asserts the flood filled it: the LRU had to evict. Eviction is the LRU working, not a loss, as long
as the next packet of each flow finds the same real through the unchanged ring and remembers it
again. (A TCP session records no insertion time any more, so which established entries were
evicted cannot be told apart from the survivors afterwards; the table's fill is what shows the
pressure.) A session is *lost* when, after the flood, a connection from before it has no session
entry once it has sent again, or an entry naming another real than the one it had before the
flood. The test asserts 0 lost, then changes the ring (adds a real to the echo VIP): a connection
whose session was lost would now hash to the new real for a third of the flows and be reset, so
every connection must still be answered by its original real. (Measured with per-CPU tables:
deleting the echo sessions right after the ring change resets 63 of the 200.)

Neither test passes quietly without its evidence: XDP exceptions are counted by our own program on
the xdp:xdp_exception tracepoint (lab/observe/xdp_exceptions.py, no BCC) for the LB's program id, and a
counter that cannot start fails the test with the reason.
"""

from __future__ import annotations

import errno
import json
import operator
import random
import socket
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pytest
from pyroute2 import IPRoute

from balancer import _abi
from balancer import config as cfg
from balancer.controller import Instance
from balancer.encaps import IP4_IPIP, IP6_IP6IP6
from balancer.maplayout import SESS4_WAYS, SESSION_SETS, addr_words
from lab.bench.gen.base import Endpoints
from lab.bench.gen.xdplive import OBJECT as TRAFFICGEN
from lab.bench.gen.xdplive import XdpLiveGenerator
from lab.dut import Capability
from lab.harness import Lab, LabBalancer, poll
from lab.harness.settle import wait_client_quiet
from lab.lbconf import lb_link, peer_mac, real_addresses
from lab.nodes.churn_client import ChurnClient
from lab.nodes.tcp_services import Services
from lab.nsexec import entered
from lab.observe.xdp_exceptions import XdpExceptions, xdp_prog_id
from suites.conformance._counters import changed, counters
from suites.conformance._record import recorded
from suites.conformance._robust_frames import named_frames, random_frames

from ._echo import ECHO_PORT

pytestmark = pytest.mark.topology("default")
FLOOD_PORT = 9999  # a UDP VIP port no real listens on: the flood gets no answers, only eviction pressure
CONNS = 200
INTERVAL_S = 0.25
TIMEOUT_S = 2.0
SEED = 6008
COPIES = 150  # of every named kind: 150 x 10-11 kinds
RANDOM_FRAMES = 1500
FLOOD_FLOWS = 1_000_000
FLOOD_RATE_PPS = 100_000.0
FLOOD_MAX_S = 45.0  # 10 s on an idle machine; a shared one sends slower and takes longer
CATCH_UP_S = 10.0
REFUSED_PAUSE_S = 0.002
SEND_BURST = 32
ENCAPS = [IP4_IPIP, IP6_IP6IP6]


def _vip(lab: Lab, family: int) -> str:
    return next(str(v.address) for v in lab.topology.vips if v.address.version == family)


def _configure(balancer: LabBalancer, echo_reals: int | None = None) -> None:
    """The topology's VIPs plus a TCP echo VIP on ECHO_PORT and a UDP flood VIP on FLOOD_PORT, per VIP
    address; the echo VIPs get only their first `echo_reals` reals when that is given."""
    conf = balancer.config_for()
    first: dict[Any, cfg.Vip] = {}
    for v in conf.vips:
        first.setdefault(v.address, v)
    extra = tuple(replace(v, port=ECHO_PORT, proto="tcp", reals=v.reals[:echo_reals]) for v in first.values())
    extra += tuple(replace(v, port=FLOOD_PORT, proto="udp") for v in first.values())
    balancer.apply(replace(conf, vips=conf.vips + extra))


def _client(balancer: LabBalancer) -> ChurnClient:
    lab = balancer.lab
    return ChurnClient(lab.name, "client", _vip(lab, balancer.family), ECHO_PORT, "--conns", str(CONNS),
                       "--interval", str(INTERVAL_S), "--timeout", str(TIMEOUT_S), "--new-every", "0.2",
                       "--cpu", "0")


def _failed_conns(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for c in report["conns"] if c["status"] != "ok"]


def _assert_native(balancer: LabBalancer) -> None:
    lb_if = lb_link(balancer.lab.topology, "lb")[0]
    status = json.loads(balancer.lbctl("status", "--json").stdout)
    assert status["interfaces"].get(lb_if) == "native", (
        f"the LB program is no longer attached natively to {lb_if}: {status['interfaces']}")


def _lb_program(lab: Lab) -> int:
    """The id of the XDP program on the LB's interface (the balancer's)."""
    return xdp_prog_id(lab.netns("lb"), lb_link(lab.topology, "lb")[0])


def _assert_no_exception(lab: Lab, seen: XdpExceptions, prog_id: int) -> None:
    """The LB's program raised no XDP exception (XDP_ABORTED, or an action veth refused) and is still attached."""
    assert _lb_program(lab) == prog_id, "the LB's XDP program was replaced during the test"
    raised = seen.of_program(prog_id)
    assert not raised, f"XDP exceptions of the LB's program {prog_id}, {{(action, ifindex): events}}: {raised}"


def _reason_total(delta: dict[str, int]) -> int:
    names = {r.name for r in _abi.Reason if r is not _abi.Reason.REASON_COUNT}
    return sum(v for k, v in delta.items() if k in names)


class _Received:
    """Frames an interface of a lab node has taken in (its rx_packets), read over netlink inside the node."""

    def __init__(self, netns: str, ifname: str) -> None:
        with entered(netns):
            self._ipr = IPRoute()
        self.ifname = ifname
        self._index = self._ipr.link_lookup(ifname=ifname)[0]

    def __call__(self) -> int:
        stats = self._ipr.get_links(self._index)[0].get_attr("IFLA_STATS64")
        return int(stats["rx_packets"])

    def close(self) -> None:
        self._ipr.close()


def _reading(balancer: LabBalancer, received: _Received) -> tuple[int, dict[str, Any]]:
    """(frames received, counters) read together: the frame count before and after the counters agree, so
    no frame arrived between them. Fails when frames never stop arriving for CATCH_UP_S."""
    got: list[tuple[int, dict[str, Any]]] = []

    def moving() -> bool:
        first = received()
        now = counters(balancer)
        got[:] = [(first, now)]
        return received() != first

    assert not poll(CATCH_UP_S, moving, "a quiet link", until=operator.not_, check=False), \
        f"{received.ifname} kept receiving for {CATCH_UP_S} s"
    return got[0]


def _send_all(sock: socket.socket, frames: list[bytes]) -> int:
    """Write every frame; return how many sends the veth refused.

    The LB's veth takes frames into a 256-slot ring its XDP NAPI drains; a burst faster than that
    fills it, and then both our sends (ENOBUFS) and the client's forwarded packets are dropped. So
    frames go in bursts of SEND_BURST with a pause between, and a refused frame is repeated after a
    pause, so every frame reaches the LB exactly once."""
    refused = 0
    for i, raw in enumerate(frames):
        if i and i % SEND_BURST == 0:
            time.sleep(REFUSED_PAUSE_S)  # pacing the sender, not waiting for a state
        while True:
            try:
                sock.send(raw)
                break
            except OSError as e:
                if e.errno != errno.ENOBUFS:
                    raise
                refused += 1
                time.sleep(REFUSED_PAUSE_S)  # pacing the sender, not waiting for a state
    return refused


@pytest.mark.needs(Capability.COUNTERS_PER_REASON)
@pytest.mark.parametrize("encap", ENCAPS, indirect=True)
def test_storm(balancer: LabBalancer, echo_services: Services) -> None:
    with recorded("test_robustness_storm", balancer.encap_id):
        lab = balancer.lab
        _configure(balancer)
        lb_if, router, router_if = lb_link(lab.topology, "lb")
        lb_mac = peer_mac(lab.name, "lb", lb_if)
        rt_mac = peer_mac(lab.name, router, router_if)
        rng = random.Random(SEED)
        named = named_frames(balancer.family, _vip(lab, balancer.family), rt_mac, lb_mac, rng, COPIES)
        rnd = random_frames(_vip(lab, 4), _vip(lab, 6), rt_mac, lb_mac, rng, RANDOM_FRAMES)
        want: dict[str, int] = {}
        for f in named:
            want[f.reason] = want.get(f.reason, 0) + 1
        drops = {r: n for r, n in want.items() if r.startswith("DROP_")}
        with entered(lab.netns(router)):
            sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
        received = _Received(lab.netns("lb"), lb_if)
        try:
            sock.bind((router_if, 0))
            with XdpExceptions() as exceptions:
                prog_id = _lb_program(lab)
                rx_before, before = _reading(balancer, received)
                with _client(balancer) as client:
                    refused = _send_all(sock, [f.raw for f in named])
                    # legitimate traffic never reaches a DROP_* reason: wait until the named frames are all counted
                    poll(CATCH_UP_S, lambda: any(changed(before, counters(balancer)).get(r, 0) < n
                                                 for r, n in drops.items()),
                         "the named frames counted", until=operator.not_, check=False)
                    mid = counters(balancer)
                    refused += _send_all(sock, rnd)
                    report = client.stop(after=1.0)
                    wait_client_quiet(lab, _vip(lab, balancer.family))
                rx_after, after = _reading(balancer, received)
                _assert_native(balancer)
                _assert_no_exception(lab, exceptions, prog_id)
        finally:
            sock.close()
            received.close()
        sent = len(named) + len(rnd)
        taken_in = rx_after - rx_before
        delta = changed(before, after)
        named_delta = changed(before, mid)
        failed = _failed_conns(report)
        assert not failed, f"{len(failed)} of {len(report['conns'])} connections failed during the storm: {failed[:5]}"
        assert _reason_total(delta) == taken_in, (
            f"reason deltas sum to {_reason_total(delta)} but lb-rt took in {taken_in} frames: {delta}")
        assert taken_in >= sent, f"lb-rt took in {taken_in} frames, fewer than the {sent} the storm sent"
        named_drops = {r: v for r, v in named_delta.items() if r.startswith("DROP_")}
        assert named_drops == drops, (f"the named frames were counted under {named_drops} but must be under "
                                      f"{drops} (kinds: {sorted({(f.kind, f.reason) for f in named})})")
        assert delta.get("TX_ENCAP", 0) >= want["TX_ENCAP"], (
            f"TX_ENCAP counted {delta.get('TX_ENCAP', 0)} of {want['TX_ENCAP']} well-formed named frames")
        unexpected = {k for k in delta if k.startswith("DROP_")} - set(want) - {
            "DROP_MALFORMED_ETH", "DROP_VLAN_STACKED", "DROP_ICMP_UNSUPPORTED", "DROP_MALFORMED_IP",
            "DROP_MALFORMED_L4", "DROP_FRAGMENT", "DROP_IP_OPTIONS"}
        assert not unexpected, f"frames dropped under reasons no storm frame should reach: {unexpected}: {delta}"
        sys.stdout.write(f"\n{balancer.encap_id}: storm {len(named)} named + {len(rnd)} random frames sent "
                         f"({refused} refused sends repeated); lb-rt took in {taken_in} frames "
                         f"({taken_in - sent} of them the client's traffic and the router's), reasons counted "
                         f"{_reason_total(delta)}; 0 XDP exceptions of program {prog_id}; deltas {delta}\n")


@dataclass(frozen=True)
class _Entry:
    """One TCP session of the echo VIP in one CPU's table: the real it names and when it was made."""

    cpu: int
    real: str
    made_ns: int


def _echo_sessions(balancer: LabBalancer) -> dict[int, list[_Entry]]:
    """{client port: its session entries} of the TCP echo VIP, from the session table."""
    vip_raw, fam = addr_words(_vip(balancer.lab, balancer.family))
    inst = Instance.open(balancer.instance)
    out: dict[int, list[_Entry]] = {}
    try:
        dp = inst.dp
        for _, _, flow, sess in dp.sessions():
            if bytes(flow.dst) != vip_raw or flow.family != fam or flow.proto != socket.IPPROTO_TCP \
                    or flow.dport != socket.htons(ECHO_PORT):
                continue
            real = dp.real(sess.real_id)
            out.setdefault(socket.ntohs(flow.sport), []).append(
                _Entry(0, real[0] if real else f"real id {sess.real_id}", int(sess.atime_ns)))
    finally:
        inst.close()
    return out


def _session_fill(balancer: LabBalancer) -> tuple[int, int]:
    """(entries, capacity) of the session table of the lab's family."""
    inst = Instance.open(balancer.instance)
    try:
        if balancer.family == 4:  # the IPv4 sets: a session a way
            sets = inst.dp.maps[SESSION_SETS]
            return sum(1 for t, _, _, _ in inst.dp.sessions() if t == SESSION_SETS), sets.max_entries * SESS4_WAYS
        table = inst.dp.maps["lb_sessions"]
        return sum(1 for _ in table.items()), table.max_entries
    finally:
        inst.close()


def _established(lab: Lab, vip: str) -> set[int]:
    """Local ports of the client's established TCP connections to the echo VIP."""
    out = lab.run("client", ["ss", "-Htn", "state", "established"]).stdout
    peer = f"[{vip}]:{ECHO_PORT}" if ":" in vip else f"{vip}:{ECHO_PORT}"
    ports = set()
    for line in out.splitlines():
        cols = line.split()
        if len(cols) >= 4 and cols[3] == peer:
            ports.add(int(cols[2].rsplit(":", 1)[1]))
    return ports


def _echo_ring_share(balancer: LabBalancer, real: str) -> float:
    """The share of the echo VIP's Maglev ring slots that name `real`."""
    inst = Instance.open(balancer.instance)
    try:
        vip = inst.dp.vips()[(_vip(balancer.lab, balancer.family), ECHO_PORT, socket.IPPROTO_TCP)]
        ring = inst.dp.ring_array(vip.vip_num)
        ids, slots = np.unique(ring, return_counts=True)
        mine = sum(int(n) for i, n in zip(ids, slots, strict=True) if (inst.dp.real(int(i)) or ("",))[0] == real)
        return mine / len(ring)
    finally:
        inst.close()


def _flood(gen: XdpLiveGenerator, family: int) -> tuple[int, float]:
    """Send FLOOD_FLOWS frames, one per flow, at up to FLOOD_RATE_PPS, for at most FLOOD_MAX_S: (sent, seconds).

    The generator's flow sequence carries on from one run to the next, so when a shared machine
    sends slower than asked, further runs send the flows still missing."""
    sent, t0 = 0, time.monotonic()
    while sent < FLOOD_FLOWS and time.monotonic() - t0 < FLOOD_MAX_S:
        left = min(FLOOD_FLOWS - sent, round(FLOOD_RATE_PPS * (FLOOD_MAX_S - (time.monotonic() - t0))))
        if left <= 0:
            break
        result = gen.run(FLOOD_RATE_PPS, left / FLOOD_RATE_PPS, 64 if family == 4 else 78,
                         FLOOD_FLOWS, family)  # type: ignore[arg-type]
        sent += result.sent
    return sent, time.monotonic() - t0


@pytest.mark.needs(Capability.SESSION_READBACK)
@pytest.mark.parametrize("encap", ENCAPS, indirect=True)
def test_lru_flood(balancer: LabBalancer, echo_services: Services) -> None:
    with recorded("test_robustness_lru_flood", balancer.encap_id):
        if not TRAFFICGEN.is_file():
            pytest.skip(f"{TRAFFICGEN} missing: run make bpf")
        lab = balancer.lab
        fam = balancer.family
        vip = _vip(lab, fam)
        reals = real_addresses(lab.topology, fam)
        added_node = sorted(reals)[-1]
        _configure(balancer, echo_reals=len(reals) - 1)  # the echo VIP without its last real, added after the flood
        assert _echo_ring_share(balancer, reals[added_node]) == 0.0
        lb_if, router, router_if = lb_link(lab.topology, "lb")
        ep = Endpoints(src_mac=peer_mac(lab.name, router, router_if), dst_mac=peer_mac(lab.name, "lb", lb_if),
                       src4="192.0.2.64", dst4=_vip(lab, 4), src6="2001:db8:c::1:0", dst6=_vip(lab, 6),
                       sport=1024, dport=FLOOD_PORT)
        with XdpExceptions() as exceptions, _client(balancer) as client, ExitStack() as stack:
            prog_id = _lb_program(lab)
            ports = _established(lab, vip)
            missing = poll(CATCH_UP_S, lambda: ports - set(_echo_sessions(balancer)), "a session per connection",
                           until=operator.not_, check=False)
            assert not missing, f"established connections without a session entry before the flood: {missing}"
            before_sessions = _echo_sessions(balancer)
            gen = XdpLiveGenerator(lab.netns(router), router_if, ep, lambda: 0, cpus=[0], src_addrs=16)
            stack.callback(gen.close)
            before = counters(balancer)
            sent, took = _flood(gen, fam)
            client.mark("flood-done")
            filled, capacity = _session_fill(balancer)
            after = counters(balancer)
            # every connection sends again within INTERVAL_S and so remakes an evicted entry
            live = ports & _established(lab, vip)
            poll(CATCH_UP_S, lambda: live - set(_echo_sessions(balancer)), "a session per live connection",
                 until=operator.not_, check=False)
            after_sessions = _echo_sessions(balancer)
            client.mark("ring-change")
            _configure(balancer)
            share = _echo_ring_share(balancer, reals[added_node])
            report = client.stop(after=2 * INTERVAL_S + TIMEOUT_S)
            _assert_native(balancer)
            _assert_no_exception(lab, exceptions, prog_id)
        delta = changed(before, after)
        lost = {p: (before_sessions[p], after_sessions.get(p)) for p in live
                if {e.real for e in after_sessions.get(p, [])} != {e.real for e in before_sessions[p]}}
        assert sent >= FLOOD_FLOWS, f"the generator sent only {sent} of {FLOOD_FLOWS} flows in {took:.1f} s"
        assert delta.get("LRU_MISS", 0) >= FLOOD_FLOWS * 0.99, f"LRU misses {delta.get('LRU_MISS', 0)}: {delta}"
        assert len(live) >= CONNS, f"only {len(live)} of {CONNS} connections were established before and after"
        assert filled >= 0.9 * capacity, (f"the flood left the session table at {filled} of {capacity} entries: "
                                          "the LRU never had to evict, the test did not test it")
        assert not lost, f"{len(lost)} of {len(live)} sessions lost (before, after): {list(lost.items())[:5]}"
        assert share > 0.2, f"{added_node} took only {share:.1%} of the echo VIP's ring"
        failed = _failed_conns(report)
        assert not failed, (f"{len(failed)} of {len(report['conns'])} established connections failed "
                            f"under the flood or after the ring change: {failed[:5]}")
        assert len(report["conns"]) >= CONNS
        sys.stdout.write(f"\n{balancer.encap_id}: flood sent {sent} frames of {FLOOD_FLOWS} flows in "
                         f"{took:.1f} s ({sent / max(took, 1e-9):.0f} pps); "
                         f"the session table full ({filled} of {capacity}); {len(live)} connections from before the "
                         f"flood, {len(lost)} sessions lost; then {added_node} took "
                         f"{share:.0%} of the ring and 0 of {len(report['conns'])} connections failed or moved; "
                         f"LB deltas {delta}\n")
