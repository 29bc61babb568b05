"""DSR return path: services through the VIP from several clients, replies straight from the reals.

For every encap: HTTP (TCP) and UDP echo from every client address, while the LB's link is
captured on the router. Replies carry source = VIP, the client never sees a real's address,
every real serves, and the LB's link carries only client→VIP packets and their encapsulation.
Marked hardware: with --target the same tests run on Vagrant or bare-metal hosts over SSH.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from balancer import _abi
from lab.capture import classify_lb_link
from lab.harness import Lab, LabBalancer
from lab.lbconf import lb_link, real_addresses

pytestmark = [pytest.mark.topology("default"), pytest.mark.hardware]
GUE_PORT = _abi.Limits.DEFAULT_GUE_PORT
REQUESTS = 18


def _clients(lab: Lab, family: int) -> list[str]:
    return sorted({str(a.ip) for link in lab.topology.links for ep in link.endpoints
                   if ep.node == "client" for a in ep.all_addresses if a.version == family})


def test_replies_bypass_the_lb(lab: Lab, balancer: LabBalancer, tmp_path: Path) -> None:
    fam = balancer.family
    vips = sorted({str(v.address) for v in lab.topology.vips if v.address.version == fam})
    clients = _clients(lab, fam)
    reals = real_addresses(lab.topology, fam)
    lb_if, router, router_if = lb_link(lab.topology)
    before = balancer.stats()
    pcap = tmp_path / "lb-link.pcap"
    answers: list[dict[str, object]] = []
    with lab.capture(router, router_if, pcap):
        for vip in vips:
            for kind, port in (("http", 80), ("udp", 9000)):
                args = [kind, "--vip", vip, "--port", str(port), "--count", str(REQUESTS)]
                args += [a for c in clients for a in ("--source", c)]
                answers += json.loads(lab.python("client", "lab.traffic", *args).stdout)
    after = balancer.stats()

    failed = [a for a in answers if "error" in a]
    assert not failed, f"{len(failed)} of {len(answers)} requests failed: {failed[:3]}"
    seen = {str(a["node"]) for a in answers}
    assert seen == set(reals), f"reals that answered: {seen}; expected every one of {sorted(reals)}"
    udp = [a for a in answers if "peer" in a]
    assert udp and all(a["peer"] in vips for a in udp), "a UDP reply did not come from the VIP"
    assert {a["source"] for a in answers} == set(clients)

    lb_mac = lab.mac("lb", lb_if).lower()
    counts = classify_lb_link(pcap, lb_mac, set(vips), set(clients), GUE_PORT)
    assert not counts.stray, f"the LB's link carried other traffic (replies?): {counts.stray[:5]}"
    assert counts.to_lb > 0 and counts.from_lb == counts.to_lb
    sent = after["reasons"]["TX_ENCAP"]["packets"] - before["reasons"]["TX_ENCAP"]["packets"]
    assert sent == counts.to_lb, f"LB counted {sent} encapsulated packets, the wire carried {counts.to_lb}"
    sys.stdout.write(f"\n{balancer.encap_id}: {len(answers)} answers from {sorted(seen)}, "
                     f"{counts.to_lb} client→VIP packets, 0 replies through the LB\n")


def test_client_never_sees_a_real_address(lab: Lab, balancer: LabBalancer, tmp_path: Path) -> None:
    fam = balancer.family
    vip = next(str(v.address) for v in lab.topology.vips if v.address.version == fam)
    reals = set(real_addresses(lab.topology, fam).values())
    pcap = tmp_path / "client.pcap"
    with lab.capture("client", "cl-rt", pcap):
        lab.python("client", "lab.traffic", "http", "--vip", vip, "--port", "80", "--count", "9")
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
