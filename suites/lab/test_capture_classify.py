"""test_capture_classify.py: how lab.observe.capture.classify_lb_link sorts a capture of the LB's link (the DSR
check's judge): a host's own link control (ND, MLD) is no reply, anything else unexpected is stray."""

from __future__ import annotations

from pathlib import Path

from scapy.layers.inet import ICMP, IP, TCP
from scapy.layers.inet6 import (
    ICMPv6EchoReply,
    ICMPv6MLReport2,
    ICMPv6ND_NS,
    IPv6,
    IPv6ExtHdrHopByHop,
    RouterAlert,
)
from scapy.layers.l2 import Ether
from scapy.utils import wrpcap

from lab.observe.capture import classify_lb_link, link_control

LB_MAC = "02:00:00:00:00:0b"
ROUTER_MAC = "02:00:00:00:00:0a"
VIP, CLIENT, REAL = "198.51.100.100", "192.0.2.2", "203.0.113.34"


def classify(tmp_path: Path, frames: list) -> tuple[int, int, list[str]]:
    pcap = tmp_path / "lb.pcap"
    wrpcap(str(pcap), frames)
    counts = classify_lb_link(pcap, LB_MAC, {VIP}, {CLIENT}, 6080)
    return counts.to_lb, counts.from_lb, counts.stray


def test_link_control_of_the_hosts_is_not_stray_but_a_reply_is(tmp_path: Path) -> None:
    to_lb = Ether(src=ROUTER_MAC, dst=LB_MAC) / IP(src=CLIENT, dst=VIP) / TCP(sport=40000, dport=80, flags="S")
    encapsulated = Ether(src=LB_MAC, dst=ROUTER_MAC) / IP(src="10.0.0.1", dst=REAL, proto=4) / \
        IP(src=CLIENT, dst=VIP) / TCP(sport=40000, dport=80, flags="S")
    mld = Ether(src=LB_MAC, dst="33:33:00:00:00:16") / \
        IPv6(src="fe80::1", dst="ff02::16", hlim=1) / IPv6ExtHdrHopByHop(options=[RouterAlert()]) / ICMPv6MLReport2()
    ns = Ether(src=ROUTER_MAC, dst="33:33:ff:00:00:01") / IPv6(src="fe80::2", dst="ff02::1:ff00:1") / \
        ICMPv6ND_NS(tgt="fe80::1")
    assert classify(tmp_path, [to_lb, encapsulated, mld, ns]) == (1, 1, [])

    reply = Ether(src=LB_MAC, dst=ROUTER_MAC) / IP(src=VIP, dst=CLIENT) / TCP(sport=80, dport=40000, flags="SA")
    echo6 = Ether(src=LB_MAC, dst=ROUTER_MAC) / IPv6(src="2001:db8::100", dst="2001:db8::2") / ICMPv6EchoReply()
    hop_by_hop_echo = Ether(src=LB_MAC, dst=ROUTER_MAC) / IPv6(src="fe80::1", dst="ff02::16") / \
        IPv6ExtHdrHopByHop(options=[RouterAlert()]) / ICMPv6EchoReply()
    _, _, stray = classify(tmp_path, [to_lb, reply, echo6, hop_by_hop_echo])
    assert len(stray) == 3, stray
    assert all(s.startswith("from LB:") for s in stray)


def test_link_control_is_a_hosts_mld_nd_or_igmp_never_a_forwarded_packet() -> None:
    """The DUT checks leave out what a whole-host DUT (IPVS in a VM) says about its own link: its MLDv2
    report behind a hop-by-hop header, ND, IGMP; an encapsulated frame or a reply is never left out."""
    mld = IPv6(src="fe80::1", dst="ff02::16", hlim=1) / IPv6ExtHdrHopByHop(options=[RouterAlert()]) / \
        ICMPv6MLReport2()
    ns = IPv6(src="fe80::2", dst="ff02::1:ff00:1") / ICMPv6ND_NS(tgt="fe80::1")
    igmp = IP(src="192.0.2.1", dst="224.0.0.22", proto=2, options=[])
    mdns = IP(src="192.0.2.1", dst="224.0.0.251") / TCP()
    assert all(link_control(IPv6(bytes(p)) if isinstance(p, IPv6) else IP(bytes(p))) for p in (mld, ns, igmp, mdns))

    encapsulated = IP(src="10.0.0.1", dst=REAL, proto=4) / IP(src=CLIENT, dst=VIP) / TCP(sport=40000, dport=80)
    gue6 = IPv6(src="2001:db8::1", dst="2001:db8:100::34") / IPv6(src="2001:db8::2", dst="2001:db8::100") / TCP()
    echo6 = IPv6(src="2001:db8::100", dst="2001:db8::2") / ICMPv6EchoReply()
    hop_by_hop_echo = IPv6(src="fe80::1", dst="ff02::16") / IPv6ExtHdrHopByHop(options=[RouterAlert()]) / \
        ICMPv6EchoReply()
    unreachable = IP(src=VIP, dst=CLIENT) / ICMP(type=3, code=4)
    for p in (encapsulated, gue6, echo6, hop_by_hop_echo, unreachable):
        parsed = IPv6(bytes(p)) if isinstance(p, IPv6) else IP(bytes(p))
        assert not link_control(parsed), p.summary()
