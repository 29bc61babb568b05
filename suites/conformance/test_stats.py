"""Stats: the LB's per-VIP, per-real and per-reason counters equal the packets on the wire, exactly.

For every encap the client sends exactly UDP_DATAGRAMS datagrams (one per flow, each answered) to
the VIP's UDP port, opens exactly TCP_CONNECTIONS HTTP connections to its TCP port, and pings the
VIP ECHOS_TO_VIP times and the LB's own address ECHOS_TO_LB times, while the router's link to the
LB is captured. The capture is the reference: every frame towards the LB is classified the way the
datapath must count it (client→VIP TCP/UDP: TX_ENCAP; echo request to the VIP: TX_ICMP_ECHO; ARP:
PASS_NOT_IP; ICMP / ICMPv6 for another address: PASS_ICMP_NOT_VIP; any other IP: PASS_NOT_VIP), and

* each reason's packet and byte deltas equal the capture's (bytes = the frame's length on the wire,
  what the datapath counts), and the deltas of all reasons together equal the frames sent to the LB;
* every frame has a reason: the deltas of all reasons together equal the frames the LB's interface
  took in by its own count (rx_packets: on veth, the frames its NAPI poll ran through XDP), and
  the capture holds exactly those frames (unicast to the LB, and multicast or broadcast, which
  the LB takes in too);
* each VIP's deltas equal the capture's frames (and bytes) to that VIP port;
* each real's deltas equal the encapsulated frames the LB sent to it (counted in input bytes);
* the capture holds exactly the datagrams, first SYNs and echo requests the client sent.

Packets the test cannot control: ARP / neighbour discovery between the router and the LB (the
router gets permanent neighbour entries for the LB, so it sends no requests of its own, but the LB's
kernel, answering the echo requests to its address, may ask for the router's MAC: the router's
ARP reply / neighbour advertisement then reaches the LB), and TCP retransmissions, which are
detected in the capture (same flow, sequence number, length and flags seen again) and reported.
None of them is assumed absent: each is classified under its reason like every other frame, and
the counters must match the wire whatever it carried. Deltas are read in this process
from the pinned maps; after the client's sockets are quiet (every connection closed or in
TIME-WAIT) the counters are polled, with a deadline, until they catch up with the capture.
The counters and the interface's count are read together (the count unchanged before and after);
the capture starts after that reading, and a frame that reached the LB in between (its count moved
by the time the capture listens) makes the test read and start again, so that the counters and
the capture cover the same frames.
"""

from __future__ import annotations

import json
import operator
import struct
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from balancer import _abi
from lab.dut import Capability
from lab.harness import Lab, LabBalancer, poll
from lab.harness.settle import wait_client_quiet
from lab.lbconf import lb_link, real_addresses
from lab.packets.decode import (
    PROTO_TCP,
    PROTO_UDP,
    Frame,
    decapsulate,
    ip_of,
)
from suites.conformance._counters import counters

from ._record import recorded
from ._wire import (
    ETH_P_ARP,
    PROTO_ICMP,
    PROTO_ICMPV6,
    counts_by,
    read_frames,
)

pytestmark = [pytest.mark.topology("default"), pytest.mark.needs(Capability.COUNTERS_PER_REASON)]
GUE_PORT = _abi.Limits.DEFAULT_GUE_PORT
UDP_DATAGRAMS = 25
TCP_CONNECTIONS = 10
QUIET_DEADLINE_S = 20.0
CATCH_UP_DEADLINE_S = 5.0
START_ATTEMPTS = 5
ECHOS_TO_VIP = 3  # answered by the LB itself: TX_ICMP_ECHO
ECHOS_TO_LB = 2  # to the LB's own address, answered by its kernel: PASS_ICMP_NOT_VIP
ICMP_ECHO = b"\x08"
ICMPV6_ECHO = b"\x80"
TCP_SYN = 0x02
TCP_FIN = 0x01
IPV6_HOP_BY_HOP = 0


def _clients(lab: Lab, family: int) -> list[str]:
    return sorted({str(a.ip) for link in lab.topology.links for ep in link.endpoints
                   if ep.node == "client" for a in ep.all_addresses if a.version == family})


def _lb_addresses(lab: Lab) -> list[tuple[str, str]]:
    """(address, ifname) of the LB's end of its link, every family."""
    lb_if, _, _ = lb_link(lab.topology)
    return [(str(a.ip), lb_if) for link in lab.topology.links for ep in link.endpoints
            if ep.node == "lb" for a in ep.all_addresses]


@pytest.fixture(scope="module")
def quiet_neighbours(lab: Lab) -> Iterator[None]:
    """Name: quiet_neighbours. Scope: module. Depends: lab.

    Permanent neighbour entries on the router for the LB's addresses, so it sends no ARP/ND to it::

        def test_x(lab, quiet_neighbours): ...
    """
    lb_if, router, router_if = lb_link(lab.topology)
    mac = lab.mac("lb", lb_if)
    made = []
    try:
        for addr, _ in _lb_addresses(lab):
            lab.run(router, ["ip", "neigh", "replace", addr, "lladdr", mac, "dev", router_if, "nud", "permanent"])
            made.append(addr)
        yield
    finally:
        for addr in made:
            lab.run(router, ["ip", "neigh", "del", addr, "dev", router_if], check=False)


def _group(mac: str) -> bool:
    """A multicast or broadcast MAC (the I/G bit of its first octet): every station on the link takes it in."""
    return bool(int(mac.split(":")[0], 16) & 1)


def _rx_packets(lab: Lab, node: str, ifname: str) -> int:
    """The frames `ifname` of `node` has taken in, by its own counter (over ssh too on a --target lab)."""
    out = lab.run(node, ["ip", "-j", "-s", "link", "show", "dev", lab.ifname(node, ifname)]).stdout
    return int(json.loads(out)[0]["stats64"]["rx"]["packets"])


def _reading(lab: Lab, balancer: LabBalancer, lb_if: str) -> tuple[int, dict[str, Any]]:
    """(frames the LB's interface took in, the counters), read while no frame arrived between them."""
    got: list[tuple[int, dict[str, Any]]] = []

    def moving() -> bool:
        first = _rx_packets(lab, "lb", lb_if)
        got[:] = [(first, counters(balancer))]
        return _rx_packets(lab, "lb", lb_if) != first

    assert not poll(CATCH_UP_DEADLINE_S, moving, "a quiet link", until=operator.not_, check=False), \
        f"the LB's {lb_if} kept receiving for {CATCH_UP_DEADLINE_S} s"
    return got[0]


def _delta(after: dict[str, Any], before: dict[str, Any], section: str) -> dict[str, tuple[int, int]]:
    out = {}
    for key, now in after[section].items():
        was = before[section].get(key, {"packets": 0, "bytes": 0})
        out[key] = (now["packets"] - was["packets"], now["bytes"] - was["bytes"])
    return {k: v for k, v in out.items() if v != (0, 0)}


class Wire:
    """What the capture of the LB's link says the counters must be."""

    def __init__(self, frames: list[Frame], lb_mac: str, vips: dict[tuple[str, int, int], str],
                 reals: dict[str, str], clients: list[str]) -> None:
        self.clients = set(clients)
        self.vip_addrs = {addr for addr, _, _ in vips}
        self.reasons: dict[str, list[int]] = {}
        self.vips: dict[str, list[int]] = {}
        self.reals: dict[str, list[int]] = {}
        self.unexpected: list[str] = []  # frames not sent by the client: what the test did not control
        self.tcp_segments: list[tuple[tuple[Any, ...], int]] = []  # (segment identity, frame index)
        self.udp_datagrams = 0
        self.echo_to_vip = 0  # the client's echo requests to the VIP address
        self.echo_to_lb = 0  # the client's echo requests to the LB's own address
        self.encapsulated: dict[str, int] = {}
        self.to_lb = 0  # frames the LB takes in: unicast to it, and multicast or broadcast not sent by it
        for f in frames:
            if f.dst_mac == lb_mac or (_group(f.dst_mac) and f.src_mac != lb_mac):
                self.to_lb += 1
                self._to_lb(f, vips)
            elif f.src_mac == lb_mac:
                enc = decapsulate(f, GUE_PORT)
                if enc is not None:
                    self.encapsulated[enc.outer.dst] = self.encapsulated.get(enc.outer.dst, 0) + 1
        self.real_frames = {node: self.encapsulated.get(addr, 0) for node, addr in reals.items()}

    @staticmethod
    def _add(table: dict[str, list[int]], key: str, frame: Frame) -> None:
        row = table.setdefault(key, [0, 0])
        row[0] += 1
        row[1] += frame.wire_len

    def _to_lb(self, f: Frame, vips: dict[tuple[str, int, int], str]) -> None:
        if f.ethertype == ETH_P_ARP:
            self._add(self.reasons, "PASS_NOT_IP", f)
            self.unexpected.append(f"frame {f.index}: ARP")
            return
        ip = ip_of(f)
        if ip is None:
            self._add(self.reasons, "PASS_NOT_IP", f)
            self.unexpected.append(f"frame {f.index}: ethertype {f.ethertype:#06x}")
            return
        sport, dport = ip.ports()
        vip = vips.get((ip.dst, ip.proto, dport))
        if vip is not None:
            self._add(self.reasons, "TX_ENCAP", f)
            self._add(self.vips, vip, f)
            if ip.proto == PROTO_UDP:
                self.udp_datagrams += 1
            else:
                seq = struct.unpack("!I", ip.payload[4:8])[0]
                flags = ip.payload[13]
                data_len = len(ip.payload) - (ip.payload[12] >> 4) * 4
                self.tcp_segments.append(((ip.flow(), seq, data_len, flags), f.index))
            return
        echo = ip.proto in (PROTO_ICMP, PROTO_ICMPV6) and ip.payload[:1] in (ICMP_ECHO, ICMPV6_ECHO)
        if echo and ip.src in self.clients and ip.dst in self.vip_addrs:
            self._add(self.reasons, "TX_ICMP_ECHO", f)
            self.echo_to_vip += 1
            return
        # an MLD report (ICMPv6 behind a hop-by-hop header) is ICMP to the datapath, which walks the extension
        icmp = ip.proto in (PROTO_ICMP, PROTO_ICMPV6) or (ip.version == 6 and ip.proto == IPV6_HOP_BY_HOP
                                                           and ip.payload[:1] == bytes([PROTO_ICMPV6]))
        reason = "PASS_ICMP_NOT_VIP" if icmp else "PASS_NOT_VIP"
        self._add(self.reasons, reason, f)
        if echo and ip.src in self.clients:
            self.echo_to_lb += 1
        else:
            self.unexpected.append(f"frame {f.index}: IPv{ip.version} {ip.src} > {ip.dst} proto {ip.proto}")

    def syns(self) -> int:
        return sum(1 for (_, _, _, flags), _ in self.tcp_segments if flags & TCP_SYN)

    def retransmissions(self) -> list[tuple[int, tuple[Any, ...]]]:
        """(frame index, segment) of segments carrying data, SYN or FIN seen before with the same
        flow, sequence number, length and flags."""
        seen: set[tuple[Any, ...]] = set()
        out = []
        for ident, index in self.tcp_segments:
            _, _, data_len, flags = ident
            if not (data_len or flags & (TCP_SYN | TCP_FIN)):
                continue  # a pure ACK repeats legitimately (duplicate ACKs)
            if ident in seen:
                out.append((index, ident))
            seen.add(ident)
        return out


@pytest.mark.hardware
def test_counters_equal_the_wire(lab: Lab, balancer: LabBalancer, encap: str, quiet_neighbours: None,
                                 tmp_path: Path) -> None:
    with recorded("test_counters_equal_the_wire", encap):
        fam = balancer.family
        vip = next(str(v.address) for v in lab.topology.vips if v.address.version == fam)
        clients = _clients(lab, fam)
        reals = real_addresses(lab.topology, fam)
        lb_if, router, router_if = lb_link(lab.topology)
        lb_mac = lab.mac("lb", lb_if).lower()
        lb_addr = next(a for a, _ in _lb_addresses(lab) if (":" in a) == (fam == 6))
        config = balancer.config_for()
        vips = {(str(v.address), PROTO_TCP if v.proto == "tcp" else PROTO_UDP, v.port): v.name
                for v in config.vips}
        pcap = tmp_path / "lb-link.pcap"
        sources = [a for c in clients for a in ("--source", c)]

        with ExitStack() as capturing:
            # the counters and the capture must cover the same frames: read, then capture, and start
            # again if a frame reached the LB before the capture was listening
            for _ in range(START_ATTEMPTS):
                rx_before, before = _reading(lab, balancer, lb_if)
                capturing.enter_context(lab.capture(router, router_if, pcap, snaplen=256))
                if _rx_packets(lab, "lb", lb_if) == rx_before:
                    break
                capturing.close()
            else:
                raise AssertionError(f"frames kept reaching the LB while a capture started ({START_ATTEMPTS} tries)")
            answers = _send_the_traffic(lab, vip, lb_addr, sources)
            wait_client_quiet(lab, vip, QUIET_DEADLINE_S)

            def behind() -> list[str]:
                wire = Wire(read_frames(pcap), lb_mac, vips, reals, clients)
                moved = _delta(counters(balancer), before, "reasons")
                got = {k: v[0] for k, v in moved.items()}
                want = {k: v[0] for k, v in wire.reasons.items()}
                emitted = sum(wire.encapsulated.values())
                if got == want and emitted == want.get("TX_ENCAP", 0):
                    return []
                return [f"counters {got}, frames to the LB {want}, encapsulated frames back {emitted}"]

            lag = poll(CATCH_UP_DEADLINE_S, behind, "counters caught up", until=operator.not_, check=False)
            rx_after, after = _reading(lab, balancer, lb_if)
        wire = Wire(read_frames(pcap), lb_mac, vips, reals, clients)

        failed = [a for a in answers if "error" in a]
        assert not failed, f"{len(failed)} requests failed: {failed[:3]}"
        evidence = (f"\ncapture {pcap}; frames the test did not send: {wire.unexpected[:10]}; "
                    f"TCP retransmissions: {wire.retransmissions()}\nstats before: {before}\nafter: {after}")
        assert wire.udp_datagrams == UDP_DATAGRAMS, f"the wire carried {wire.udp_datagrams} datagrams{evidence}"
        assert (wire.echo_to_vip, wire.echo_to_lb) == (ECHOS_TO_VIP, ECHOS_TO_LB), \
            f"the wire carried {wire.echo_to_vip} echo requests to the VIP, {wire.echo_to_lb} to the LB{evidence}"
        retrans_syns = sum(1 for _, (_, _, _, flags) in wire.retransmissions() if flags & TCP_SYN)
        assert wire.syns() - retrans_syns == TCP_CONNECTIONS, f"the wire carried {wire.syns()} SYNs{evidence}"

        reasons = _delta(after, before, "reasons")
        want_reasons = {k: (v[0], v[1]) for k, v in wire.reasons.items()}
        assert reasons == want_reasons, f"reason counters {reasons} differ from the wire {want_reasons}{evidence}"
        to_lb = sum(v[0] for v in want_reasons.values())
        assert not lag, f"counters never caught up with the wire: {lag}"
        taken_in = rx_after - rx_before
        counted = sum(v[0] for v in reasons.values())
        assert counted == taken_in, f"reason deltas sum to {counted} but {lb_if} took in {taken_in} frames{evidence}"
        assert wire.to_lb == taken_in, f"the capture holds {wire.to_lb} frames to the LB, {lb_if} took in {taken_in}"

        vip_moves, real_moves = _check_vips_and_reals(before, after, wire, reals, want_reasons, evidence)

        events = {k: after["events"][k] - before["events"][k] for k in after["events"]}
        sys.stdout.write(f"\n{encap}: {to_lb} frames to the LB (its {lb_if} took in {taken_in}), reasons {reasons}, "
                         f"VIPs {vip_moves}, "
                         f"reals {real_moves}, events {events}, retransmissions {len(wire.retransmissions())}, "
                         f"uncontrolled frames {len(wire.unexpected)}; reals seen "
                         f"{sorted(counts_by(a.get('node') for a in answers).items(), key=str)}\n")


def _send_the_traffic(lab: Lab, vip: str, lb_addr: str, sources: list[str]) -> list[dict[str, Any]]:
    """UDP datagrams and HTTP requests to the VIP, echo requests to the VIP and to the LB's own address."""
    answers: list[dict[str, Any]] = json.loads(lab.python(
        "client", "lab.nodes.traffic", "udp", "--vip", vip, "--port", "9000", "--count", str(UDP_DATAGRAMS),
        *sources).stdout)
    answers += json.loads(lab.python("client", "lab.nodes.traffic", "http", "--vip", vip, "--port", "80",
                                     "--count", str(TCP_CONNECTIONS), *sources).stdout)
    for target, count in ((vip, ECHOS_TO_VIP), (lb_addr, ECHOS_TO_LB)):
        echoed = json.loads(lab.python("client", "lab.nodes.echo", "--count", str(count), target).stdout)
        assert echoed["answered"] == count, f"echo requests to {target}: {echoed}"
    return answers


def _check_vips_and_reals(before: dict[str, Any], after: dict[str, Any], wire: Wire, reals: dict[str, str],
                          want_reasons: dict[str, tuple[int, int]], evidence: str
                          ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Per-VIP counters against the frames to each VIP, per-real against the frames to each real."""
    vip_moves = _delta(after, before, "vips")
    want_vips = {k: (v[0], v[1]) for k, v in wire.vips.items()}
    assert vip_moves == want_vips, f"per-VIP counters {vip_moves} differ from the wire {want_vips}{evidence}"

    real_moves = dict(_delta(after, before, "reals"))
    want_reals = {reals[n]: c for n, c in wire.real_frames.items() if c}
    got_reals = {addr: v[0] for addr, v in real_moves.items()}
    assert got_reals == want_reals, (f"per-real packet counters {got_reals} differ from the encapsulated "
                                     f"frames on the wire per outer destination {want_reals}{evidence}")
    assert sum(v[1] for v in real_moves.values()) == want_reasons["TX_ENCAP"][1], \
        "per-real bytes (input frame lengths) do not add up to the TX_ENCAP bytes"
    return vip_moves, real_moves


def test_wire_model_counts_every_frame_the_lb_takes_in() -> None:
    """The model itself, on frames a Vagrant run met: the router's broadcast ARP request reaches
    the LB (PASS_NOT_IP, with its bytes) like its unicast reply; what the LB sent, and unicast to
    another station, is not the LB's to count."""
    from scapy.layers.inet import ICMP, IP, UDP
    from scapy.layers.l2 import ARP, Ether

    lb, router, other = "02:00:00:00:00:0b", "02:00:00:00:00:01", "02:00:00:00:00:0c"
    vip, client, real = "198.51.100.100", "192.0.2.10", "203.0.113.18"
    sent = [
        Ether(dst="ff:ff:ff:ff:ff:ff", src=router) / ARP(op=1, psrc="10.0.0.1", pdst="10.0.0.2"),
        Ether(dst=lb, src=router) / ARP(op=2, psrc="10.0.0.1", pdst="10.0.0.2"),
        Ether(dst=lb, src=router) / IP(src=client, dst=vip) / UDP(sport=40000, dport=9000) / b"x",
        Ether(dst=lb, src=router) / IP(src=client, dst=vip) / ICMP(type=8),
        Ether(dst="ff:ff:ff:ff:ff:ff", src=lb) / ARP(op=1, psrc="10.0.0.2", pdst="10.0.0.1"),
        Ether(dst=other, src=router) / ARP(op=2),
    ]
    frames = [Frame.of(bytes(p), i) for i, p in enumerate(sent)]
    wire = Wire([f for f in frames if f is not None], lb, {(vip, PROTO_UDP, 9000): "udp-vip"},
                {"real1": real}, [client])
    assert wire.to_lb == 4
    assert {k: v[0] for k, v in wire.reasons.items()} == {"PASS_NOT_IP": 2, "TX_ENCAP": 1, "TX_ICMP_ECHO": 1}
    assert wire.reasons["PASS_NOT_IP"][1] == len(bytes(sent[0])) + len(bytes(sent[1]))
    assert (wire.udp_datagrams, wire.echo_to_vip) == (1, 1)
    assert len(wire.unexpected) == 2, wire.unexpected
