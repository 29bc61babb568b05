"""The core conformance checks, for any device under test (`--dut l4lab|ipvs`): DSR, encap, churn, weights.

Each test grades the DUT by what crosses the wire and what the reals answer, never by the DUT's
word alone: replies must bypass it, every frame it emits must be its encapsulation of a client
packet, removing a real must move only that real's flows, a drained real must get no new flow.
Where the DUT keeps counters, they must agree with the wire. Against a foreign DUT a failure is
a finding about it (suites/conformance/conftest.py); against l4lab it is a failure.
"""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from balancer import _abi
from balancer.encaps import SAME_FAMILY, EncapCase
from lab.capture import classify_lb_link, decapsulate
from lab.dut import Capability, Dut
from lab.harness import poll
from lab.lbconf import real_addresses
from lab.nodes.tcp_services import Services
from lab.packets.gue import GUE
from reports.schema import ConformanceFigure as Figure

pytestmark = [pytest.mark.topology("default")]
GUE_PORT = _abi.Limits.DEFAULT_GUE_PORT
REQUESTS = 12
CHURN_FLOWS = 90
SINK_PORT = 5001
UPLOAD_BYTES = 300_000
STALL_S = 4.0
# Maglev's own disruption when one of three reals leaves is a few per cent of the others' flows.
COLLATERAL_LIMIT = 0.05


def _clients(lab: Any, family: int) -> list[str]:
    return sorted({str(a.ip) for link in lab.topology.links for ep in link.endpoints
                   if ep.node == "client" for a in ep.all_addresses if a.version == family})


def _requests(lab: Any, dut: Dut, kind: str, port: int, count: int, sport_base: int = 0,
              vip: str | None = None) -> list[dict[str, Any]]:
    args = [kind, "--vip", vip or dut.vips()[0], "--port", str(port), "--count", str(count)]
    args += [a for c in _clients(lab, dut.family) for a in ("--source", c)]
    if sport_base:
        args += ["--sport-base", str(sport_base)]
    answers: list[dict[str, Any]] = json.loads(lab.python("client", "lab.nodes.traffic", *args).stdout)
    return answers


def _send_and_capture(lab: Any, dut: Dut, pcap: Path) -> list[dict[str, Any]]:
    link = dut.link()
    answers: list[dict[str, Any]] = []
    with lab.capture(link.node, link.ifname, pcap):
        for vip in dut.vips():
            answers += _requests(lab, dut, "http", 80, REQUESTS, vip=vip)
            answers += _requests(lab, dut, "udp", 9000, REQUESTS, vip=vip)
    return answers


def test_replies_bypass_the_dut(lab: Any, dut: Dut, dut_encap: EncapCase, tmp_path: Path,
                                dut_figures: list[Figure]) -> None:
    dut.configure(dut_encap)
    before = dut.forwarded()
    pcap = tmp_path / "dut-link.pcap"
    answers = _send_and_capture(lab, dut, pcap)

    failed = [a for a in answers if "error" in a]
    assert not failed, f"{len(failed)} of {len(answers)} requests failed: {failed[:3]}"
    seen = {str(a["node"]) for a in answers}
    assert seen == set(dut.reals()), f"reals that answered: {sorted(seen)}; expected {sorted(dut.reals())}"
    udp = [a for a in answers if "peer" in a]
    assert udp and all(a["peer"] in dut.vips() for a in udp), "a UDP reply did not come from the VIP"

    link = dut.link()
    counts = classify_lb_link(pcap, link.dut_mac, set(dut.vips()), set(_clients(lab, dut.family)), GUE_PORT)
    assert not counts.stray, f"the DUT's link carried other traffic (replies?): {counts.stray[:5]}"
    assert counts.to_lb > 0 and counts.from_lb == counts.to_lb, \
        f"{counts.to_lb} client→VIP packets reached the DUT but it sent {counts.from_lb} encapsulated"
    if Capability.COUNTERS in dut.capabilities:
        # IPVS sums per-CPU counters every 2 s: poll until the delta reaches the wire's count
        counted = poll(6.0, lambda: sum(dut.forwarded().values()) - sum(before.values()), "forwarded packets counted",
                       until=lambda delta: delta >= counts.to_lb, check=False, interval_s=0.2)
        assert counted == counts.to_lb, f"{dut.name} counted {counted} forwarded packets, the wire {counts.to_lb}"
    dut_figures += [Figure("packets in", counts.to_lb), Figure("packets out encapsulated", counts.from_lb),
                    Figure("replies through the DUT", 0)]
    if Capability.COUNTERS in dut.capabilities:
        dut_figures.append(Figure("packets the DUT counted", counted))
    sys.stdout.write(f"\n{dut.name} {dut_encap}: {len(answers)} answers from {sorted(seen)}, "
                     f"{counts.to_lb} packets in = {counts.from_lb} out encapsulated, 0 replies through it\n")


def _frames(pcap: Path, dut_mac: str) -> tuple[list[Any], list[Any]]:
    from scapy.layers.inet import IP
    from scapy.layers.inet6 import IPv6
    from scapy.layers.l2 import Ether
    from scapy.utils import rdpcap

    into, out = [], []
    for pkt in rdpcap(str(pcap)):
        if Ether not in pkt or (IP not in pkt and IPv6 not in pkt):
            continue
        outer = pkt[IP] if IP in pkt else pkt[IPv6]
        if isinstance(outer, IPv6) and outer.nh == 58:
            continue  # neighbour discovery
        (into if pkt[Ether].dst.lower() == dut_mac else out).append(outer)
    return into, out


def test_outer_header_is_the_encap(lab: Any, dut: Dut, dut_encap: EncapCase, tmp_path: Path) -> None:
    from scapy.layers.inet import IP, UDP

    dut.configure(dut_encap)
    pcap = tmp_path / "dut-link.pcap"
    _send_and_capture(lab, dut, pcap)
    _, out = _frames(pcap, dut.link().dut_mac)
    assert out, "the DUT sent nothing"
    family, mode = dut_encap.vip_family, dut_encap.config_name
    reals = set(dut.reals().values())
    wrong: list[str] = []
    for outer in out:
        proto = outer.proto if isinstance(outer, IP) else outer.nh
        if outer.dst not in reals:
            wrong.append(f"outer destination {outer.dst} is not a real")
        elif mode == "ipip" and proto != (4 if family == 4 else 41):
            wrong.append(f"IPIP frame carries protocol {proto}")
        elif mode.startswith("gue"):
            if proto != 17 or outer[UDP].dport != GUE_PORT:
                wrong.append(f"GUE frame is not UDP to {GUE_PORT}: {outer.summary()}")
                continue
            variant = 0 if isinstance(GUE(bytes(outer[UDP].payload)), GUE) else 1
            if variant != int(mode[-1]):
                wrong.append(f"GUE variant {variant}, expected {mode[-1]}: {bytes(outer[UDP].payload)[:4].hex()}")
    assert not wrong, f"{len(wrong)} of {len(out)} frames are not {dut_encap}: {wrong[:5]}"


def _flow(ip: Any) -> tuple[Any, ...]:
    """What identifies one client packet, checksums left out (the DUT's side of a link may carry
    partial checksums that its NIC completes)."""
    from scapy.layers.inet import TCP

    l4 = ip.payload
    return (ip.src, ip.dst, getattr(l4, "sport", None), getattr(l4, "dport", None),
            getattr(l4, "seq", None), getattr(l4, "ack", None),
            str(l4.flags) if isinstance(l4, TCP) else None, bytes(l4.payload))


def _header(ip: Any) -> dict[str, Any]:
    """The fields of an inner IP header that a balancer has no business changing."""
    from scapy.layers.inet import IP

    if isinstance(ip, IP):
        return {"tos": ip.tos, "len": ip.len, "id": ip.id, "flags": str(ip.flags), "frag": ip.frag,
                "ttl": ip.ttl, "proto": ip.proto}
    return {"tc": ip.tc, "fl": ip.fl, "plen": ip.plen, "nh": ip.nh, "hlim": ip.hlim}


def test_inner_packet_is_the_clients_unchanged(lab: Any, dut: Dut, dut_encap: EncapCase, tmp_path: Path) -> None:
    """The real must see the client's packet as the client sent it: the same header (TTL too), the same L4."""
    dut.configure(dut_encap)
    pcap = tmp_path / "dut-link.pcap"
    _send_and_capture(lab, dut, pcap)
    into, out = _frames(pcap, dut.link().dut_mac)
    received = {_flow(p): p for p in into}
    changed: list[str] = []
    compared = 0
    for outer in out:
        inner = decapsulate(outer, GUE_PORT)
        original = received.get(_flow(inner))
        if original is None:
            continue
        compared += 1
        sent, got = _header(original), _header(inner)
        if sent != got:
            diff = {k: f"{sent[k]} -> {got[k]}" for k in sent if sent[k] != got[k]}
            changed.append(f"{inner.src} > {inner.dst}: {diff}")
    assert compared == len(out), f"only {compared} of {len(out)} inner packets matched a client packet"
    assert not changed, f"{len(changed)} of {compared} inner packets differ from the client's: {changed[:3]}"


def _owners(answers: list[dict[str, Any]]) -> dict[tuple[str, int], str]:
    bad = [a for a in answers if "error" in a]
    assert not bad, f"{len(bad)} of {len(answers)} flows failed: {bad[:3]}"
    return {(str(a["source"]), int(a["sport"])): str(a["node"]) for a in answers}


@pytest.mark.needs(Capability.CONSISTENT_HASHING)
def test_removing_a_real_moves_only_its_flows(lab: Any, dut: Dut, dut_encap: EncapCase,
                                              dut_figures: list[Figure]) -> None:
    dut.configure(dut_encap)
    base = 41000 + 100 * SAME_FAMILY.index(dut_encap)
    first = _owners(_requests(lab, dut, "udp", 9000, CHURN_FLOWS, sport_base=base))
    victim = Counter(first.values()).most_common(1)[0][0]
    dut.remove_real(victim)
    try:
        dut.settle()
        second = _owners(_requests(lab, dut, "udp", 9000, CHURN_FLOWS, sport_base=base))
    finally:
        dut.add_real(victim)
    assert victim not in second.values(), f"{victim} still answered after it was removed"
    others = [f for f, real in first.items() if real != victim]
    moved = [f for f in others if second[f] != first[f]]
    collateral = len(moved) / len(others)
    sys.stdout.write(f"\n{dut.name} {dut_encap}: removed {victim} ({len(first) - len(others)} flows); "
                     f"{len(moved)} of {len(others)} other flows moved (collateral {collateral:.1%})\n")
    assert collateral <= COLLATERAL_LIMIT, \
        f"{len(moved)} of {len(others)} flows of surviving reals moved: {moved[:5]}"
    dut_figures += [Figure("collateral", round(100 * collateral, 2), "%"),
                    Figure("flows of the removed real", len(first) - len(others))]


@pytest.mark.needs(Capability.WEIGHTS)
def test_a_drained_real_gets_no_new_flow(lab: Any, dut: Dut, dut_encap: EncapCase) -> None:
    dut.configure(dut_encap)
    drained = sorted(dut.reals())[-1]
    dut.set_weight(drained, 0)
    try:
        answers = _requests(lab, dut, "http", 80, 30)
    finally:
        dut.set_weight(drained, 1)
    owners = Counter(str(a.get("node")) for a in answers if "error" not in a)
    assert sum(owners.values()) == len(answers), f"requests failed: {[a for a in answers if 'error' in a][:3]}"
    assert owners[drained] == 0, f"{drained} at weight 0 took {owners[drained]} new connections"
    assert len(owners) == len(dut.reals()) - 1, f"the others did not all serve: {dict(owners)}"


@pytest.fixture(scope="module")
def sinks(lab: Any) -> Iterator[Services]:
    """The TCP sink (counts what it reads) on every real, on SINK_PORT of every VIP."""
    binds = [f"[{v.address}]:{SINK_PORT}" if v.address.version == 6 else f"{v.address}:{SINK_PORT}"
             for v in lab.topology.vips]
    with Services(lab.name, sorted(real_addresses(lab.topology, 4)), "sink", binds) as services:
        yield services


@pytest.mark.needs(Capability.PMTU_GENERATION)
def test_a_large_upload_completes_and_the_client_learns_the_mtu(lab: Any, dut: Dut, dut_encap: EncapCase,
                                                                 sinks: Services, dut_figures: list[Figure]) -> None:
    """Full-size client packets no longer fit once encapsulated: the DUT must say so to the client."""
    dut.configure(dut_encap, extra_ports=[(SINK_PORT, "tcp")])
    vip = dut.vips()[0]
    lab.run("client", ["ip", f"-{dut.family}", "route", "flush", "cache"])
    run = json.loads(lab.python("client", "lab.nodes.upload", "--vip", vip, "--port", str(SINK_PORT),
                                "--bytes", str(UPLOAD_BYTES), "--stall", str(STALL_S),
                                timeout=STALL_S * 3 + 10).stdout)
    route = lab.run("client", ["ip", "route", "get", vip]).stdout
    found = re.search(r"\bmtu (\d+)", route)
    learnt = int(found.group(1)) if found else None
    sys.stdout.write(f"\n{dut.name} {dut_encap}: upload {run}; the client learnt MTU {learnt}\n")
    assert run.get("completed"), f"the upload did not complete (a PMTU blackhole?): {run}"
    assert learnt == 1500 - dut_encap.overhead, \
        f"the client learnt MTU {learnt}, expected 1500 - {dut_encap.overhead}: {route.strip()}"
    dut_figures.append(Figure("learnt MTU", learnt, "bytes"))
