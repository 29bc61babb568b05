"""Bond and VLAN: the LB's uplink a bond of two links carrying VLAN 100, XDP on the bond, a link cut under load.

Topology `bond-vlan`: the LB is a qemu VM (Debian's cloud kernel has bonding and 802.1Q, this machine's
has neither); its switch, at the bond's other end, lives in the same VM (lab/remote/vm_init/lb_init.sh)
and hands VLAN 100 untagged to the router. One VM boot serves the module; the balancer is loaded in it
once per bond mode with `lbctl` (the module's `vm_balancer`), for IPIP over both families and a line
echo VIP (ECHO_PORT, conftest's echo_services on the reals).

    round trip   HTTP and UDP from every client address to both VIPs, captured on the router's end of
                 the LB's link and, in the VM, on the switch's bond: every request answered and every
                 real serving; the router's end carries client→VIP packets to the LB and the same
                 packets encapsulated from it, nothing else (0 replies through the LB), as many as the
                 LB counted TX_ENCAP; on the switch's bond every frame from the LB, its encapsulations
                 above all, carries the 802.1Q tag of VLAN 100 (the balancer kept the client frame's
                 tag: untagged, the switch's trunk port, which has no native VLAN, would drop them).
    pmtu         a 1500-byte UDP datagram with DF: the LB answers too big (by the bond, tagged) and the
                 client learns 1480.
    link failure for each bond mode (802.3ad with its LACP partner, and active-backup): CONNS live
                 connections to the echo VIP, a request on each every INTERVAL_S; link a is cut at both
                 ends (as a pulled cable) and OUTAGE_S later the client reports. No connection breaks, new
                 ones keep being answered, and the switch's counters show where the frames went: over both
                 links (802.3ad) or link a only (active-backup) over two requests per connection before the
                 cut, link b only during it; link a is then restored and both bonds take it back.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from balancer import _abi
from balancer import config as cfg
from lab.dut import Capability
from lab.harness import Lab, poll
from lab.harness.settle import wait_client_quiet
from lab.lbconf import balancer_config, lb_link, real_addresses
from lab.nodes.churn_client import ChurnClient
from lab.nodes.tcp_services import Services
from lab.observe.capture import ICMP6_LINK_CONTROL, classify_lb_link
from lab.packets.decode import Frame, decapsulate, ip_of
from lab.remote import lbvm
from lab.remote.vmnodes import missing
from suites.conformance._echo import ECHO_PORT
from suites.conformance._wire import ETH_P_ARP, PROTO_ICMPV6, first, read_frames

_WHY = missing(lb=True)
pytestmark = [pytest.mark.topology("bond-vlan"), pytest.mark.needs(Capability.BOND_VLAN),
              pytest.mark.skipif(_WHY is not None, reason=f"the LB VM cannot boot here: {_WHY}")]
GUE_PORT = _abi.Limits.DEFAULT_GUE_PORT
VLAN = 100
REQUESTS = 6  # per kind (HTTP, UDP) and VIP; the LB runs under TCG
CONNS = 40
INTERVAL_S = 0.5
TIMEOUT_S = 3.0  # a request's answer: TCG and a link failover both take their time
OUTAGE_S = 3.0
CATCH_UP_S = 20.0
BEFORE_S = 10.0  # how long the frames of two requests per connection may take, before the cut
MODES = ("802.3ad", "active-backup")  # the topology boots 802.3ad


@dataclasses.dataclass
class VmBalancer:
    """The balancer in the LB VM: lbctl over the control channel, the uplink's mode."""

    lab: Lab
    run: lbvm.Run
    instance: str
    config: cfg.Config
    mode: str

    def lbctl(self, *args: str, timeout: float = 300.0) -> str:
        return lbvm.sh(self.run, " ".join([*lbvm.LBCTL, "--instance", self.instance, *args]),
                       f"lbctl {args[0]}", timeout=timeout)

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = json.loads(self.lbctl("stats", "--json"))
        return out

    def uplink(self, mode: str) -> None:
        """The uplink rebuilt in bond mode `mode`, the balancer unloaded and loaded around it."""
        if mode == self.mode:
            return
        self.lbctl("unload")
        lbvm.uplink(self.run, mode)
        self.mode = mode
        lbvm.load_balancer(self.run, self.instance, self.config)


@pytest.fixture(scope="module")
def vm_balancer(lab: Lab) -> Iterator[VmBalancer]:
    """Name: vm_balancer. Scope: module. Depends: lab (bond-vlan).

    lbctl loaded in the LB VM with IPIP to the reals for both families, and a TCP VIP on ECHO_PORT::

        def test_x(vm_balancer):
            before = vm_balancer.stats()["reasons"]["TX_ENCAP"]["packets"]
    """
    node = lab.topology.node("lb")
    assert node.uplink is not None, f"topology '{lab.topology.name}' gives the LB no uplink"
    conf = balancer_config(lab.topology, lab.name, encaps={4: "ipip", 6: "ipip"})
    echo = tuple(dataclasses.replace(v, port=ECHO_PORT) for v in conf.vips if v.proto == "tcp")
    conf = dataclasses.replace(conf, vips=conf.vips + echo)
    b = VmBalancer(lab, lbvm.in_lab(lab.name, "lb"), f"{lab.name}-lb", conf, node.uplink.bond)
    lbvm.load_balancer(b.run, b.instance, conf)
    try:
        yield b
    finally:
        b.lbctl("unload")


def _clients(lab: Lab, family: int) -> list[str]:
    return sorted({str(a.ip) for link in lab.topology.links for ep in link.endpoints
                   if ep.node == "client" for a in ep.all_addresses if a.version == family})


@dataclasses.dataclass
class RoundTrip:
    answers: list[dict[str, Any]]
    router_pcap: Path
    switch_pcap: Path
    lb_mac: str
    tx_encap: int


@pytest.fixture(scope="module")
def round_trip(lab: Lab, vm_balancer: VmBalancer, tmp_path_factory: pytest.TempPathFactory) -> RoundTrip:
    """Name: round_trip. Scope: module. Depends: vm_balancer.

    One round of HTTP and UDP requests to both VIPs, captured on the router's end of the LB's link and in
    the VM on the switch's bond, with the LB's TX_ENCAP count over it (the LB's lbctl costs seconds
    under TCG: one round serves the checks that read it)::

        def test_x(round_trip):
            assert round_trip.answers
    """
    vm_balancer.uplink(MODES[0])
    tmp = tmp_path_factory.mktemp("bond-vlan")
    _, router, router_if = lb_link(lab.topology)
    before = vm_balancer.stats()["reasons"]["TX_ENCAP"]["packets"]
    answers: list[dict[str, Any]] = []
    with lab.capture(router, router_if, tmp / "router.pcap", 2048), \
            lbvm.capture(vm_balancer.run, "swbond", tmp / "switch.pcap") as switch:
        for vip in lab.topology.vips:
            sources = [a for c in _clients(lab, vip.address.version) for a in ("--source", c)]
            for kind, port in (("http", 80), ("udp", 9000)):
                out = lab.python("client", "lab.nodes.traffic", kind, "--vip", str(vip.address), "--port",
                                 str(port), "--count", str(REQUESTS), "--timeout", str(TIMEOUT_S), *sources).stdout
                answers += json.loads(out)
            wait_client_quiet(lab, str(vip.address))
        (tmp / "switch-so-far.pcap").write_bytes(b"")
        poll(CATCH_UP_S, lambda: _lagging(tmp / "router.pcap", tmp / "switch-so-far.pcap", switch),
             "the capture in the VM caught up with the router's", until=lambda lag: lag <= 0, check=False)
    after = vm_balancer.stats()["reasons"]["TX_ENCAP"]["packets"]
    return RoundTrip(answers, tmp / "router.pcap", tmp / "switch.pcap", lab.mac("lb", "bond0").lower(), after - before)


def _lagging(router: Path, so_far: Path, switch: Callable[[], bytes]) -> int:
    """How many encapsulated frames the router's capture holds beyond the VM's so far."""
    so_far.write_bytes(switch())
    seen = [sum(decapsulate(f, GUE_PORT) is not None for f in read_frames(p)) for p in (router, so_far)]
    return seen[0] - seen[1]


def test_vip_traffic_through_the_bond_bypasses_the_lb_on_return(lab: Lab, round_trip: RoundTrip) -> None:
    failed = [a for a in round_trip.answers if "error" in a]
    assert not failed, f"{len(failed)} of {len(round_trip.answers)} requests failed: {failed[:3]}"
    reals = set(real_addresses(lab.topology, 4))
    assert {a["node"] for a in round_trip.answers} == reals, f"answers: {round_trip.answers}"
    vips = {str(v.address) for v in lab.topology.vips}
    clients = set(_clients(lab, 4)) | set(_clients(lab, 6))
    counts = classify_lb_link(round_trip.router_pcap, round_trip.lb_mac, vips, clients, GUE_PORT)
    assert not counts.stray, f"the LB's link carried other traffic (replies?): {counts.stray[:5]}"
    assert counts.to_lb > 0 and counts.from_lb == counts.to_lb == round_trip.tx_encap, \
        f"to the LB {counts.to_lb}, encapsulated from it {counts.from_lb}, the LB counted {round_trip.tx_encap}"
    sys.stdout.write(f"\nbond-vlan: {len(round_trip.answers)} answers, {counts.to_lb} client→VIP packets in, "
                     f"{counts.from_lb} encapsulated out, 0 replies through the LB\n")


def test_the_tag_is_kept_on_what_the_lb_encapsulates(round_trip: RoundTrip) -> None:
    frames = read_frames(round_trip.switch_pcap)
    from_lb = [f for f in frames if f.src_mac == round_trip.lb_mac]
    to_lb = [f for f in frames if f.dst_mac == round_trip.lb_mac]
    untagged = [f.raw[:18].hex() for f in from_lb + to_lb if f.raw[12:14] != b"\x81\x00"
                or int.from_bytes(f.raw[14:16], "big") & 0xFFF != VLAN]
    assert not untagged, f"frames on the trunk without VLAN {VLAN}'s tag: {first(untagged)}"
    encapsulated = [d for f in from_lb if (d := decapsulate(f, GUE_PORT)) is not None]
    other = [f.raw[:40].hex() for f in from_lb if decapsulate(f, GUE_PORT) is None and not _link_chatter(f)]
    assert len(encapsulated) == round_trip.tx_encap, \
        f"{len(encapsulated)} tagged encapsulations on the trunk, the LB counted {round_trip.tx_encap}"
    assert not other, f"the LB sent other frames on the trunk: {first(other)}"


def test_pmtu_through_the_bond(lab: Lab, vm_balancer: VmBalancer) -> None:
    vip = next(str(v.address) for v in lab.topology.vips if v.address.version == 4)
    lab.run("client", ["ip", "-4", "route", "flush", "cache"])
    before = vm_balancer.stats()["reasons"]["TX_ICMP_TOO_BIG"]["packets"]
    run = json.loads(lab.python("client", "lab.nodes.udp_df", "--vip", vip, "--port", "9000", "--size", "1500").stdout)
    answered = vm_balancer.stats()["reasons"]["TX_ICMP_TOO_BIG"]["packets"] - before
    assert (run["mtu_learnt"], run["resend"]) == (1480, "EMSGSIZE") and answered >= 1, \
        f"the client's socket: {run}; the LB's too-big answers: {answered}"


def _link_chatter(frame: Frame) -> bool:
    """ARP, or IPv6 neighbour discovery / MLD: what the LB's kernel says on its link."""
    ip = ip_of(frame)
    return frame.ethertype == ETH_P_ARP or (ip is not None and ip.proto == PROTO_ICMPV6 and ip.payload[:1] != b""
                                            and ip.payload[0] in ICMP6_LINK_CONTROL)


def _moved(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]) -> dict[str, int]:
    """Frames each of the switch's ends exchanged with the LB between two readings (both directions)."""
    return {name: sum(after[name]) - sum(before[name]) for name in before}


@pytest.mark.parametrize("mode", MODES)
def test_a_link_failure_breaks_no_connection(lab: Lab, vm_balancer: VmBalancer, echo_services: Services,
                                             mode: str) -> None:
    vm_balancer.uplink(mode)
    vip = next(str(v.address) for v in lab.topology.vips if v.address.version == 4)
    links = ("sw0a", "sw0b")
    with ChurnClient(lab, "client", vip, ECHO_PORT, "--conns", str(CONNS), "--interval", str(INTERVAL_S),
                     "--timeout", str(TIMEOUT_S), "--new-every", "0.25", ready_timeout=120.0) as client:
        start = lbvm.link_packets(vm_balancer.run, links, "sw")
        before = poll(BEFORE_S, lambda: _moved(start, lbvm.link_packets(vm_balancer.run, links, "sw")),
                      "the links carrying the requests", until=lambda m: sum(m.values()) >= 4 * CONNS, check=False)
        client.mark("cut")
        lbvm.set_link(vm_balancer.run, "a", up=False)
        try:
            cut = lbvm.link_packets(vm_balancer.run, links, "sw")
            report = client.stop(after=OUTAGE_S, timeout=60.0)  # the outage: requests go on meanwhile
            during = _moved(cut, lbvm.link_packets(vm_balancer.run, links, "sw"))
        finally:
            lbvm.set_link(vm_balancer.run, "a", up=True)
    lbvm.settled(vm_balancer.run, mode)  # link a is taken back (the next test starts from both)
    broken = [c for c in report["conns"] if c["status"] != "ok"]
    late = [f for f in report["new"] if f["t"] > report["marks"]["cut"]]
    summary = (f"{mode}: {len(report['conns'])} connections, {len(broken)} broken; {len(late)} new ones during "
               f"the cut, {sum('error' in f for f in late)} failed; frames on the links before the cut {before}, "
               f"during it {during}")
    sys.stdout.write(f"\n{summary}\n")
    assert len(report["conns"]) == CONNS and not broken, f"{summary}: {broken[:5]}"
    assert late and not [f for f in late if "error" in f], f"{summary}: {late[:5]}"
    if mode == "active-backup":
        assert before["sw0a"] > 0 and before["sw0b"] == 0, f"active-backup used more than link a: {summary}"
    else:
        assert before["sw0a"] > 0 and before["sw0b"] > 0, f"{mode} did not spread over both links: {summary}"
    assert during["sw0a"] == 0 and during["sw0b"] > CONNS, f"the traffic did not move to link b: {summary}"
