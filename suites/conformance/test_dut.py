"""Core checks of the encapsulation and of path MTU, for every DUT (`--dut l4lab|ipvs|katran`) and encap.

Each check grades the DUT by what crosses the wire and what the client and the reals see, never
by the DUT's word alone: every frame it emits is its encapsulation of a client packet, the real
gets the client's packet as the client sent it (RFC 2003 §3.1 and RFC 2473 §3.1 allow the
forwarding LB to take one off the TTL / hop limit), a large upload completes because the DUT tells
the client its path MTU, and a datagram that no longer fits once encapsulated is answered, or
counted as the drop it is, never counted forwarded and lost. Against a foreign DUT a failed
assertion here is a finding about it (lab/dut/verdict.py); against l4lab it is a failure.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from balancer import _abi
from balancer.encaps import EncapCase
from lab.dut import Capability, Dut
from lab.lbconf import real_addresses
from lab.nodes.tcp_services import Services
from lab.observe.capture import decapsulate, link_control
from lab.packets.decode import decapsulate as decapsulate_frame
from lab.packets.gue import GUE
from lab.poll import poll
from reports.schema import ConformanceFigure as Figure

from ._traffic import exchange, failed, settled_counters
from ._wire import read_frames

pytestmark = [pytest.mark.topology("default")]
GUE_PORT = _abi.Limits.DEFAULT_GUE_PORT
REQUESTS = 12
SINK_PORT = 5001
UDP_PORT = 9000
UPLOAD_BYTES = 300_000
STALL_S = 4.0
LINK_MTU = 1500
COUNTER_DEADLINE_S = 6.0  # IPVS sums its per-CPU counters every 2 s


def _send_and_capture(lab: Any, dut: Dut, pcap: Path) -> list[dict[str, Any]]:
    answers = exchange(lab, dut, pcap, REQUESTS)
    bad = failed(answers)
    assert answers and not bad, f"{len(bad)} of {len(answers)} requests through {dut.name} failed: {bad[:3]}"
    return answers


def _frames(pcap: Path, dut_mac: str) -> tuple[list[Any], list[Any]]:
    """(IP packets to the DUT, IP packets from it) on its link, the hosts' talk about the link left out."""
    from scapy.layers.inet import IP
    from scapy.layers.inet6 import IPv6
    from scapy.layers.l2 import Ether
    from scapy.utils import rdpcap

    into, out = [], []
    for pkt in rdpcap(str(pcap)):
        if Ether not in pkt or (IP not in pkt and IPv6 not in pkt):
            continue
        outer = pkt[IP] if IP in pkt else pkt[IPv6]
        if (isinstance(outer, IPv6) and outer.nh == 58) or link_control(outer):
            continue  # neighbour discovery, and MLD or IGMP of a DUT that is a whole host
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
    """The fields of an inner IP header that a balancer has no business changing (the TTL apart)."""
    from scapy.layers.inet import IP

    if isinstance(ip, IP):
        return {"tos": ip.tos, "len": ip.len, "id": ip.id, "flags": str(ip.flags), "frag": ip.frag, "proto": ip.proto}
    return {"tc": ip.tc, "fl": ip.fl, "plen": ip.plen, "nh": ip.nh}


def _ttl(ip: Any) -> int:
    return int(ip.ttl if hasattr(ip, "ttl") else ip.hlim)


def test_inner_packet_is_the_clients_unchanged(lab: Any, dut: Dut, dut_encap: EncapCase, tmp_path: Path,
                                               dut_figures: list[Figure]) -> None:
    """Every client packet that reached the DUT left it once, encapsulated, with the client's header
    and L4 unchanged; its TTL as sent or one less (the LB forwarded it: RFC 2003 §3.1, RFC 2473 §3.1)."""
    dut.configure(dut_encap)
    pcap = tmp_path / "dut-link.pcap"
    _send_and_capture(lab, dut, pcap)
    into, out = _frames(pcap, dut.link().dut_mac)
    assert into, f"the capture holds no client packet reaching {dut.name}"
    received = {_flow(p): p for p in into}
    changed: list[str] = []
    lowered: set[int] = set()
    compared = 0
    for outer in out:
        inner = decapsulate(outer, GUE_PORT)
        original = received.get(_flow(inner))
        if original is None:
            continue
        compared += 1
        sent, got = _header(original), _header(inner)
        drop = _ttl(original) - _ttl(inner)
        lowered.add(drop)
        if sent != got or drop not in (0, 1):
            diff = {k: f"{sent[k]} -> {got[k]}" for k in sent if sent[k] != got[k]}
            changed.append(f"{inner.src} > {inner.dst}: {diff}, TTL {_ttl(original)} -> {_ttl(inner)}")
    assert compared == len(out) == len(into), \
        f"{len(into)} client packets reached the DUT, it sent {len(out)}, {compared} of them carry a client packet"
    assert not changed, f"{len(changed)} of {compared} inner packets differ from the client's: {changed[:3]}"
    dut_figures += [Figure("inner packets compared", compared),
                    Figure("inner TTL lowered by", max(lowered), "hops")]


@pytest.fixture(scope="module")
def sinks(lab: Any) -> Iterator[Services]:
    """The TCP sink (counts what it reads) on every real, on SINK_PORT of every VIP."""
    binds = [f"[{v.address}]:{SINK_PORT}" if v.address.version == 6 else f"{v.address}:{SINK_PORT}"
             for v in lab.topology.vips]
    with Services(lab.name, sorted(real_addresses(lab.topology, 4)), "sink", binds) as services:
        yield services


def _learnt_mtu(lab: Any, vip: str) -> tuple[int | None, str]:
    route = lab.run("client", ["ip", "route", "get", vip]).stdout
    found = re.search(r"\bmtu (\d+)", route)
    return (int(found.group(1)) if found else None), route.strip()


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
    learnt, route = _learnt_mtu(lab, vip)
    sys.stdout.write(f"\n{dut.name} {dut_encap}: upload {run}; the client learnt MTU {learnt}\n")
    assert run.get("completed"), f"the upload did not complete (a PMTU blackhole?): {run}"
    assert learnt == LINK_MTU - dut_encap.overhead, \
        f"the client learnt MTU {learnt}, expected {LINK_MTU} - {dut_encap.overhead}: {route}"
    dut_figures.append(Figure("learnt MTU", learnt, "bytes"))


def test_a_datagram_too_big_once_encapsulated_is_never_lost_silently(
        lab: Any, dut: Dut, dut_encap: EncapCase, tmp_path: Path, dut_figures: list[Figure]) -> None:
    """A full-size datagram with DF no longer fits the 1500-byte link once encapsulated. The DUT, as
    built and configured by default, must answer too-big (the client learns the path MTU) or, if it
    sends nothing back, count exactly what it put on the wire: a frame it counts as forwarded that
    the link never carried is lost without a trace."""
    dut.configure(dut_encap)
    vip = dut.vips()[0]
    lab.run("client", ["ip", f"-{dut.family}", "route", "flush", "cache"])
    counting = Capability.COUNTERS in dut.capabilities
    before = settled_counters(dut) if counting else {}
    link = dut.link()
    pcap = tmp_path / "dut-link.pcap"
    with lab.capture(link.node, link.ifname, pcap, snaplen=128):
        run = json.loads(lab.python("client", "lab.nodes.udp_df", "--vip", vip, "--port", str(UDP_PORT),
                                    "--size", str(LINK_MTU)).stdout)
    want = LINK_MTU - dut_encap.overhead
    carried = sum(1 for f in read_frames(pcap) if f.src_mac == link.dut_mac
                  and decapsulate_frame(f, GUE_PORT) is not None)
    sys.stdout.write(f"\n{dut.name} {dut_encap}: {run}; {carried} encapsulated frames on the DUT's link\n")
    if run["mtu_learnt"] == want:
        dut_figures.append(Figure("learnt MTU", want, "bytes"))
        return
    sent = 2 if run["resend"] == "sent" else 1
    if not counting:
        assert carried == sent, (f"no too-big reached the client (its path MTU is {run['mtu_learnt']}) and "
                                 f"{dut.name} put {carried} of the {sent} datagrams on its link")
        return
    counted = poll(COUNTER_DEADLINE_S, lambda: sum(dut.forwarded().values()) - sum(before.values()),
                   f"{dut.name}'s forwarded counters", until=lambda n: n >= sent, check=False, interval_s=0.2)
    assert counted == carried, (
        f"no too-big reached the client (its path MTU stayed {run['mtu_learnt']}, {want} would fit): "
        f"{dut.name} counted {counted} of the {sent} {LINK_MTU}-byte datagrams as forwarded, and its link "
        f"carried {carried} of them: lost without a trace")
    dut_figures.append(Figure("datagrams counted = carried", counted))
