"""Robustness on the wire: a storm of malformed, fragmented, option-carrying and random frames at the VIP,
and a flood of a million new flows through a 4096-entry LRU.

Storm (every encap listed): frames are written with a raw AF_PACKET socket in the router's netns
onto rt-lb, addressed to the LB's MAC, so they reach lb-rt unchanged (sent from the client, the
router would drop or rewrite the malformed ones itself). Meanwhile the churn client keeps
CONNS long-lived echo connections through the VIP (pinned to CPU 0). Afterwards: the program is
still attached natively, every connection answered throughout, each named kind of frame was
counted under its reason (exact deltas for the DROP_* reasons, which legitimate traffic never
hits), and the deltas of all reasons together equal the frames the capture on rt-lb saw go to the LB.

Flood: with CONNS established connections alive, the live-frames generator sends FLOOD_FLOWS
UDP datagrams of distinct (source address, port) from the router's rt-lb, pinned to CPU 0 like
the connections (the LB's LRU is per CPU; lru_size 4096). Every connection must still be answered
by its real; the LRU misses seen are reported.
"""

from __future__ import annotations

import errno
import json
import random
import socket
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from balancer import config as cfg
from lab import nsexec
from lab.capture import Capture
from lab.gen.base import Endpoints
from lab.gen.xdplive import OBJECT as TRAFFICGEN
from lab.gen.xdplive import XdpLiveGenerator
from lab.lbconf import lb_link, peer_mac, real_addresses
from lab.nsexec import entered
from suites.conformance._churn_client import ChurnClient
from suites.conformance._counters import changed, counters
from suites.conformance._record import recorded
from suites.conformance._robust_frames import named_frames, random_frames
from suites.conformance._settle import poll, wait_client_quiet
from suites.conformance._tcp_services import Services
from suites.conformance._wire import read_frames
from suites.conftest import Balancer, Lab

pytestmark = pytest.mark.topology("default")
ECHO_PORT = 7007
FLOOD_PORT = 9999  # a UDP VIP port no real listens on: the flood gets no answers, only eviction pressure
CONNS = 200
INTERVAL_S = 0.25
TIMEOUT_S = 2.0
SEED = 6008
COPIES = 150  # of every named kind: 150 x 10-11 kinds
RANDOM_FRAMES = 1500
FLOOD_FLOWS = 1_000_000
FLOOD_RATE_PPS = 100_000.0
FLOOD_MAX_S = 25.0
CATCH_UP_S = 10.0
REFUSED_PAUSE_S = 0.002
SEND_BURST = 32
ENCAPS = ["ip4-ipip", "ip6-ip6ip6"]


def _vip(lab: Lab, family: int) -> str:
    return next(str(v.address) for v in lab.topology.vips if v.address.version == family)


@pytest.fixture(scope="module")
def echo_services(lab: Lab) -> Iterator[Services]:
    """Name: echo_services. Scope: module. Depends: lab.

    The line echo on every real, on ECHO_PORT of every VIP address (pinned to CPU 0)."""
    binds = [f"[{v.address}]:{ECHO_PORT}" if v.address.version == 6 else f"{v.address}:{ECHO_PORT}"
             for v in lab.topology.vips]
    with Services(lab.name, sorted(real_addresses(lab.topology, 4)), "echo", binds, cpu=0) as services:
        yield services


def _configure(balancer: Balancer) -> None:
    """The topology's VIPs plus a TCP echo VIP on ECHO_PORT and a UDP flood VIP on FLOOD_PORT, per VIP address."""
    conf = balancer.config_for()
    first: dict[Any, cfg.Vip] = {}
    for v in conf.vips:
        first.setdefault(v.address, v)
    extra = tuple(replace(v, port=ECHO_PORT, proto="tcp") for v in first.values())
    extra += tuple(replace(v, port=FLOOD_PORT, proto="udp") for v in first.values())
    balancer.apply(replace(conf, vips=conf.vips + extra))


def _client(balancer: Balancer) -> ChurnClient:
    lab = balancer.lab
    return ChurnClient(lab.name, "client", _vip(lab, balancer.family), ECHO_PORT, "--conns", str(CONNS),
                       "--interval", str(INTERVAL_S), "--timeout", str(TIMEOUT_S), "--new-every", "0.2",
                       "--cpu", "0")


def _failed_conns(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for c in report["conns"] if c["status"] != "ok"]


def _assert_native(balancer: Balancer) -> None:
    lb_if = lb_link(balancer.lab.topology, "lb")[0]
    status = json.loads(balancer.lbctl("status", "--json").stdout)
    assert status["interfaces"].get(lb_if) == "native", (
        f"the LB program is no longer attached natively to {lb_if}: {status['interfaces']}")


def _assert_no_exception(lab: Lab) -> None:
    """No XDP exception (XDP_ABORTED or an action the driver refused) on the LB's node, when a tracer runs."""
    if lab.tracer is not None:
        seen = lab.tracer.report().node("lb").xdp_exceptions()
        assert not seen, f"XDP exceptions on the LB: {seen}"


def _reason_total(delta: dict[str, int]) -> int:
    from balancer._abi import Reason

    names = {r.name for r in Reason if r is not Reason.REASON_COUNT}
    return sum(v for k, v in delta.items() if k in names)


def _tx_dropped(lab: Lab, node: str, ifname: str) -> int:
    """Frames the veth `ifname` in `node` dropped on transmit (its peer's ring was full)."""
    out = nsexec.run(lab.netns(node), ["ip", "-j", "-s", "link", "show", "dev", ifname]).stdout
    return int(json.loads(out)[0]["stats64"]["tx"]["dropped"])


def _send_all(sock: socket.socket, frames: list[bytes]) -> int:
    """Write every frame; return how many sends the veth refused.

    The LB's veth takes frames into a 256-slot ring its XDP NAPI drains; a burst faster than that
    fills it, and then both our sends (ENOBUFS) and the client's forwarded packets are dropped. So
    frames go in bursts of SEND_BURST with a pause between, and a refused frame is repeated after a
    pause, so every frame reaches the LB exactly once."""
    refused = 0
    for i, raw in enumerate(frames):
        if i and i % SEND_BURST == 0:
            time.sleep(REFUSED_PAUSE_S)
        while True:
            try:
                sock.send(raw)
                break
            except OSError as e:
                if e.errno != errno.ENOBUFS:
                    raise
                refused += 1
                time.sleep(REFUSED_PAUSE_S)
    return refused


@pytest.mark.parametrize("encap", ENCAPS, indirect=True)
def test_storm(balancer: Balancer, echo_services: Services, tmp_path: Path) -> None:
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
        pcap = tmp_path / "rt-lb.pcap"
        try:
            sock.bind((router_if, 0))
            with _client(balancer) as client, Capture(lab.name, router, router_if, pcap, snaplen=96):
                before = counters(balancer)
                dropped_before = _tx_dropped(lab, router, router_if)
                refused = _send_all(sock, [f.raw for f in named])
                # legitimate traffic never reaches a DROP_* reason: wait until the named frames are all counted
                poll(CATCH_UP_S, lambda: any(changed(before, counters(balancer)).get(r, 0) < n
                                             for r, n in drops.items()))
                mid = counters(balancer)
                refused += _send_all(sock, rnd)
                report = client.stop(after=1.0)
                wait_client_quiet(lab, _vip(lab, balancer.family))
        finally:
            sock.close()
        frames = read_frames(pcap)
        # a frame rt-lb dropped on transmit (a refused send, or the router forwarding the client's traffic into
        # a full ring) was captured there (the tap runs before the veth's xmit) but never reached the LB
        dropped = _tx_dropped(lab, router, router_if) - dropped_before
        to_lb = sum(1 for f in frames if f.dst_mac == lb_mac) - dropped
        poll(CATCH_UP_S, lambda: _reason_total(changed(before, counters(balancer))) < to_lb)
        after = counters(balancer)
        delta = changed(before, after)
        named_delta = changed(before, mid)
        sys.stdout.write(f"\n{balancer.encap_id}: storm {len(named)} named + {len(rnd)} random frames; "
                         f"capture to LB {to_lb} ({dropped} dropped by rt-lb, {refused} refused sends repeated); "
                         f"reason deltas {delta}\n")
        _assert_native(balancer)
        failed = _failed_conns(report)
        assert not failed, f"{len(failed)} of {len(report['conns'])} connections failed during the storm: {failed[:5]}"
        assert _reason_total(delta) == to_lb, (
            f"reason deltas sum to {_reason_total(delta)} but the LB received {to_lb} frames: {delta}")
        named_drops = {r: v for r, v in named_delta.items() if r.startswith("DROP_")}
        assert named_drops == drops, (f"the named frames were counted under {named_drops} but must be under "
                                      f"{drops} (kinds: {sorted({(f.kind, f.reason) for f in named})})")
        assert delta.get("TX_ENCAP", 0) >= want["TX_ENCAP"], (
            f"TX_ENCAP counted {delta.get('TX_ENCAP', 0)} of {want['TX_ENCAP']} well-formed named frames")
        unexpected = {k for k in delta if k.startswith("DROP_")} - set(want) - {
            "DROP_MALFORMED_ETH", "DROP_VLAN_STACKED", "DROP_ICMP_UNSUPPORTED", "DROP_MALFORMED_IP",
            "DROP_MALFORMED_L4", "DROP_FRAGMENT", "DROP_IP_OPTIONS"}
        assert not unexpected, f"frames dropped under reasons no storm frame should reach: {unexpected}: {delta}"
        _assert_no_exception(lab)


@pytest.mark.parametrize("encap", ENCAPS, indirect=True)
def test_lru_flood(balancer: Balancer, echo_services: Services) -> None:
    with recorded("test_robustness_lru_flood", balancer.encap_id):
        if not TRAFFICGEN.is_file():
            pytest.skip(f"{TRAFFICGEN} missing: run make bpf")
        lab = balancer.lab
        _configure(balancer)
        lb_if, router, router_if = lb_link(lab.topology, "lb")
        fam = balancer.family
        ep = Endpoints(src_mac=peer_mac(lab.name, router, router_if), dst_mac=peer_mac(lab.name, "lb", lb_if),
                       src4="192.0.2.64", dst4=_vip(lab, 4), src6="2001:db8:c::1:0", dst6=_vip(lab, 6),
                       sport=1024, dport=FLOOD_PORT)
        gen = XdpLiveGenerator(lab.netns(router), router_if, ep, lambda: 0, cpus=[0], src_addrs=16)
        try:
            with _client(balancer) as client:
                before = counters(balancer)
                result = gen.run(FLOOD_RATE_PPS, FLOOD_FLOWS / FLOOD_RATE_PPS, 64 if fam == 4 else 78,
                                 FLOOD_FLOWS, fam)  # type: ignore[arg-type]
                client.mark("flood-done")
                report = client.stop(after=2 * INTERVAL_S + TIMEOUT_S)
                after = counters(balancer)
        finally:
            gen.close()
        delta = changed(before, after)
        sys.stdout.write(f"\n{balancer.encap_id}: flood sent {result.sent} of {result.offered} frames in "
                         f"{result.duration:.1f} s ({result.sent / max(result.duration, 1e-9):.0f} pps); "
                         f"LB deltas {delta}\n")
        _assert_native(balancer)
        _assert_no_exception(lab)
        failed = _failed_conns(report)
        assert not failed, (f"{len(failed)} of {len(report['conns'])} established connections failed "
                            f"under the flood: {failed[:5]}")
        assert len(report["conns"]) >= CONNS
        assert result.sent >= FLOOD_FLOWS, (
            f"the generator sent only {result.sent} of {FLOOD_FLOWS} flows in {result.duration:.1f} s")
        assert delta.get("LRU_MISS", 0) >= FLOOD_FLOWS * 0.99, f"LRU misses {delta.get('LRU_MISS', 0)}: {delta}"
