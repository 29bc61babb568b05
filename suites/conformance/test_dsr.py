"""DSR return path and the DUT's counters against the wire, for every DUT (`--dut`) and encap it offers.

HTTP (TCP) and UDP echo from every client address through every VIP, while the DUT's link is
captured on the router: replies carry source = VIP, every request is answered, every real serves,
the client never sees a real's address, and the DUT's link carries only client→VIP packets and
their encapsulation, one out for each one in. A DUT that counts what it forwards per real
(l4lab's per-real counters, `ipvsadm -Ln --stats`'s InPkts, Katran's reals_stats) must count, per
real, exactly the encapsulated frames the wire carried to that real.
Marked hardware: with --target the same checks run on Vagrant or bare-metal hosts over SSH.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from balancer import _abi
from balancer.encaps import EncapCase
from lab.dut import Capability, Dut
from lab.observe.capture import classify_lb_link
from lab.packets.decode import decapsulate
from lab.poll import poll
from reports.schema import ConformanceFigure as Figure

from ._traffic import clients, exchange, failed, requests, settled_counters
from ._wire import read_frames

pytestmark = [pytest.mark.topology("default"), pytest.mark.hardware]
GUE_PORT = _abi.Limits.DEFAULT_GUE_PORT
REQUESTS = 18
COUNTER_DEADLINE_S = 6.0  # IPVS sums its per-CPU counters every 2 s


def _all_answered(dut: Dut, answers: list[dict[str, Any]]) -> None:
    bad = failed(answers)
    assert answers and not bad, f"{len(bad)} of {len(answers)} requests through {dut.name} failed: {bad[:3]}"
    seen = {str(a["node"]) for a in answers}
    assert seen == set(dut.reals()), f"reals that answered: {sorted(seen)}; expected every one of {sorted(dut.reals())}"


def test_replies_bypass_the_lb(lab: Any, dut: Dut, dut_encap: EncapCase, tmp_path: Path,
                               dut_figures: list[Figure]) -> None:
    dut.configure(dut_encap)
    pcap = tmp_path / "lb-link.pcap"
    answers = exchange(lab, dut, pcap, REQUESTS)
    _all_answered(dut, answers)
    udp = [a for a in answers if "peer" in a]
    assert udp and all(a["peer"] in dut.vips() for a in udp), "a UDP reply did not come from the VIP"
    sources = clients(lab, dut.family)
    assert {a["source"] for a in answers} == set(sources)

    link = dut.link()
    counts = classify_lb_link(pcap, link.dut_mac, set(dut.vips()), set(sources), GUE_PORT)
    assert not counts.stray, f"the DUT's link carried other traffic (replies?): {counts.stray[:5]}"
    assert counts.to_lb > 0 and counts.from_lb == counts.to_lb, \
        f"{counts.to_lb} client→VIP packets reached the DUT but it sent {counts.from_lb} encapsulated"
    dut_figures += [Figure("packets in", counts.to_lb), Figure("packets out encapsulated", counts.from_lb),
                    Figure("replies through the DUT", 0)]
    sys.stdout.write(f"\n{dut.name} {dut_encap}: {len(answers)} answers, {counts.to_lb} client→VIP packets "
                     f"= {counts.from_lb} encapsulated, 0 replies through the LB\n")


def test_client_never_sees_a_real_address(lab: Any, dut: Dut, dut_encap: EncapCase, tmp_path: Path) -> None:
    from scapy.layers.inet import IP
    from scapy.layers.inet6 import IPv6
    from scapy.utils import rdpcap

    dut.configure(dut_encap)
    vip = dut.vips()[0]
    reals = set(dut.reals().values())
    pcap = tmp_path / "client.pcap"
    with lab.capture("client", "cl-rt", pcap):
        answers = requests(lab, dut, "http", 80, 9)
    # Nine answered requests: a client that saw nothing has seen no real's address either.
    bad = failed(answers)
    assert answers and not bad, f"{len(bad)} of {len(answers)} requests through {dut.name} failed: {bad[:3]}"
    addrs = set()
    for p in rdpcap(str(pcap)):
        for proto in (IP, IPv6):
            if proto in p:
                addrs |= {p[proto].src, p[proto].dst}
    assert vip in addrs, f"the client's capture holds no packet of {vip}"
    assert not addrs & reals, f"the client saw real addresses {addrs & reals}"


@pytest.mark.needs(Capability.COUNTERS)
def test_per_real_counters_equal_the_wire(lab: Any, dut: Dut, dut_encap: EncapCase, tmp_path: Path,
                                          dut_figures: list[Figure]) -> None:
    """Each real's forwarded-packet counter moves by exactly the frames the wire carried to it."""
    dut.configure(dut_encap)
    before = settled_counters(dut)
    pcap = tmp_path / "lb-link.pcap"
    answers = exchange(lab, dut, pcap, REQUESTS)
    _all_answered(dut, answers)
    link = dut.link()
    by_addr = {a: n for n, a in dut.reals().items()}
    wire = Counter(by_addr.get(e.outer.dst, e.outer.dst) for f in read_frames(pcap)
                   if f.src_mac == link.dut_mac and (e := decapsulate(f, GUE_PORT)) is not None)
    want = {n: wire.get(n, 0) for n in dut.reals()}
    assert sum(want.values()) > 0, f"no encapsulated frame left {dut.name} on {link.ifname}"

    def moved() -> dict[str, int]:
        now = dut.forwarded()
        return {n: now[n] - before.get(n, 0) for n in dut.reals()}

    counted = poll(COUNTER_DEADLINE_S, moved, f"{dut.name}'s per-real counters", until=lambda got: got == want,
                   check=False, interval_s=0.2)
    assert counted == want, f"{dut.name} counted {counted} packets per real, the wire carried {want}"
    dut_figures += [Figure(f"packets to {n} (counted = wire)", v) for n, v in sorted(want.items())]
    sys.stdout.write(f"\n{dut.name} {dut_encap}: per-real counters {counted} = the wire {want}\n")
