"""DSR return path: services through the VIP from several clients, replies straight from the reals.

For every encap the DUT offers (`--dut`, suites/conformance/conftest.py): HTTP (TCP) and UDP echo
from every client address, while the DUT's link is captured on the router. Replies carry source =
VIP, the client never sees a real's address, every real serves, and the DUT's link carries only
client→VIP packets and their encapsulation. Where the DUT counts what it forwards, its count must
equal the wire's (l4lab: its TX_ENCAP reason; IPVS and Katran: their per-real packet counters).
Marked hardware: with --target the same tests run on Vagrant or bare-metal hosts over SSH.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from balancer import _abi
from lab.capture import classify_lb_link
from lab.dut import Capability, Dut, L4labDut
from lab.poll import poll

pytestmark = [pytest.mark.topology("default"), pytest.mark.hardware]
GUE_PORT = _abi.Limits.DEFAULT_GUE_PORT
REQUESTS = 18
COUNTER_DEADLINE_S = 6.0  # IPVS sums its per-CPU counters every 2 s


def _clients(lab: Any, family: int) -> list[str]:
    return sorted({str(a.ip) for link in lab.topology.links for ep in link.endpoints
                   if ep.node == "client" for a in ep.all_addresses if a.version == family})


def _encapsulated(dut: Dut) -> int:
    """What the DUT says it encapsulated so far: l4lab's TX_ENCAP reason, another DUT's per-real sum."""
    if isinstance(dut, L4labDut):
        return int(dut.stats()["reasons"]["TX_ENCAP"]["packets"])
    return sum(dut.forwarded().values())


def _counted(dut: Dut, before: int, want: int) -> int:
    """What the DUT counted since `before`, once it reaches `want` (or at the deadline: the caller asserts)."""
    return poll(COUNTER_DEADLINE_S, lambda: _encapsulated(dut) - before, "the DUT's encapsulation counters",
                until=lambda delta: delta >= want, check=False, interval_s=0.2)


def test_replies_bypass_the_lb(lab: Any, dut: Dut, dut_encap: str, tmp_path: Path) -> None:
    dut.configure(dut_encap)
    vips = dut.vips()
    clients = _clients(lab, dut.family)
    reals = dut.reals()
    link = dut.link()
    counting = Capability.COUNTERS in dut.capabilities
    before = _encapsulated(dut) if counting else 0
    pcap = tmp_path / "lb-link.pcap"
    answers: list[dict[str, object]] = []
    with lab.capture(link.node, link.ifname, pcap):
        for vip in vips:
            for kind, port in (("http", 80), ("udp", 9000)):
                args = [kind, "--vip", vip, "--port", str(port), "--count", str(REQUESTS)]
                args += [a for c in clients for a in ("--source", c)]
                answers += json.loads(lab.python("client", "lab.nodes.traffic", *args).stdout)

    failed = [a for a in answers if "error" in a]
    assert not failed, f"{len(failed)} of {len(answers)} requests failed: {failed[:3]}"
    seen = {str(a["node"]) for a in answers}
    assert seen == set(reals), f"reals that answered: {seen}; expected every one of {sorted(reals)}"
    udp = [a for a in answers if "peer" in a]
    assert udp and all(a["peer"] in vips for a in udp), "a UDP reply did not come from the VIP"
    assert {a["source"] for a in answers} == set(clients)

    counts = classify_lb_link(pcap, link.dut_mac, set(vips), set(clients), GUE_PORT)
    assert not counts.stray, f"the LB's link carried other traffic (replies?): {counts.stray[:5]}"
    assert counts.to_lb > 0 and counts.from_lb == counts.to_lb
    if counting:
        sent = _counted(dut, before, counts.to_lb)
        assert sent == counts.to_lb, f"{dut.name} counted {sent} encapsulated packets, the wire carried {counts.to_lb}"
    sys.stdout.write(f"\n{dut.name} {dut_encap}: {len(answers)} answers from {sorted(seen)}, "
                     f"{counts.to_lb} client→VIP packets, 0 replies through the LB\n")


def test_client_never_sees_a_real_address(lab: Any, dut: Dut, dut_encap: str, tmp_path: Path) -> None:
    dut.configure(dut_encap)
    vip = dut.vips()[0]
    reals = set(dut.reals().values())
    pcap = tmp_path / "client.pcap"
    with lab.capture("client", "cl-rt", pcap):
        lab.python("client", "lab.nodes.traffic", "http", "--vip", vip, "--port", "80", "--count", "9")
    from scapy.layers.inet import IP
    from scapy.layers.inet6 import IPv6
    from scapy.utils import rdpcap

    addrs = set()
    for p in rdpcap(str(pcap)):
        for proto in (IP, IPv6):
            if proto in p:
                addrs |= {p[proto].src, p[proto].dst}
    assert vip in addrs
    assert not addrs & reals, f"the client saw real addresses {addrs & reals}"
