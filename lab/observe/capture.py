"""capture.py: tcpdump in a lab node, and the DSR reading of a capture of the LB's link.

`Capture` runs tcpdump inside a node's namespace, ready once it says it is listening, in
immediate mode (otherwise frames wait in a TPACKET_V3 block and are lost when it stops).
`classify_lb_link` reads a capture of the LB's one-armed link: frames towards the LB must be
client→VIP, frames from the LB must be the same packets encapsulated (IPIP or GUE, either
variant); anything else — above all a reply from the VIP — is listed as stray.
"""

from __future__ import annotations

import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lab.errors import LabError
from lab.nsexec import nsenter_argv
from lab.state import netns_name


class Capture:
    """tcpdump on one interface of a node, written to a pcap file; ready when it says listening."""

    def __init__(self, lab: str, node: str, ifname: str, path: Path, snaplen: int = 512) -> None:
        argv = ["tcpdump", "-i", ifname, "--immediate-mode", "-U", "-n", "-s", str(snaplen), "-w", str(path)]
        self.path = path
        self.proc = subprocess.Popen(nsenter_argv(netns_name(lab, node), argv), stderr=subprocess.PIPE,
                                     stdout=subprocess.DEVNULL, text=True)
        deadline = time.monotonic() + 10
        assert self.proc.stderr is not None
        while time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            if "listening on" in line:
                return
            if not line and self.proc.poll() is not None:
                break
        self.proc.kill()
        self.proc.wait()
        raise LabError(f"tcpdump on {ifname} in {netns_name(lab, node)} did not start",
                       command=" ".join(argv))

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> Capture:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass
class LbLinkCounts:
    to_lb: int = 0      # frames towards the LB, all client → VIP
    from_lb: int = 0    # frames from the LB, all encapsulated client → VIP
    stray: list[str] = field(default_factory=list)


def decapsulate(outer: Any, gue_port: int) -> Any:
    """The inner IP packet (scapy) of an IPIP, 6in6, 4in6 or GUE (variant 0 or 1) packet, else the payload as is."""
    from lab.packets.decode import decapsulate_ip  # scapy (~0.7 s to import): only decapsulating needs it

    enc = decapsulate_ip(bytes(outer), gue_port)
    return enc.inner.layer if enc is not None else outer.payload


# ICMPv6 types a host sends about its own link, never a client's reply: multicast listener query,
# report, done (130-132) and MLDv2 report (143), router/neighbour solicitation and advertisement,
# redirect (133-137).
ICMP6_LINK_CONTROL = frozenset({130, 131, 132, 133, 134, 135, 136, 137, 143})
IP6_EXT_HEADERS = frozenset({0, 43, 60})  # hop-by-hop (MLD's router alert), routing, destination options
IPPROTO_IGMP = 2


def _icmp6_link_control(ip6: Any) -> bool:
    """Whether an IPv6 packet is ND or MLD (after any hop-by-hop/routing/destination options headers)."""
    raw = bytes(ip6.payload)
    nh, off = int(ip6.nh), 0
    while nh in IP6_EXT_HEADERS and off + 2 <= len(raw):
        nh, off = raw[off], off + (raw[off + 1] + 1) * 8
    return nh == 58 and off < len(raw) and raw[off] in ICMP6_LINK_CONTROL


def link_control(ip: Any) -> bool:
    """Whether an IP packet is a host talking about its own link (never a client's packet, nor one a
    balancer forwards): IPv6 ND or MLD, IPv4 IGMP or anything to 224.0.0.0/24 (RFC 5771's local
    network control block). A DUT that is a whole host (IPVS in a VM) sends these on its own."""
    from scapy.layers.inet6 import IPv6

    if isinstance(ip, IPv6):
        return _icmp6_link_control(ip)
    return int(ip.proto) == IPPROTO_IGMP or str(ip.dst).startswith("224.0.0.")


def classify_lb_link(pcap: Path, lb_mac: str, vips: set[str], clients: set[str],
                     gue_port: int) -> LbLinkCounts:
    from scapy.layers.inet import IP
    from scapy.layers.inet6 import IPv6
    from scapy.layers.l2 import Ether
    from scapy.utils import rdpcap

    out = LbLinkCounts()
    for pkt in rdpcap(str(pcap)):
        if Ether not in pkt or (IP not in pkt and IPv6 not in pkt):
            continue
        outer = pkt[IP] if IP in pkt else pkt[IPv6]
        if isinstance(outer, IPv6) and _icmp6_link_control(outer):
            continue  # neighbour discovery or multicast listener reports of the router or the LB
        if pkt[Ether].dst.lower() == lb_mac:
            if outer.src in clients and outer.dst in vips:
                out.to_lb += 1
            else:
                out.stray.append(f"to LB: {outer.src} > {outer.dst}")
            continue
        inner = decapsulate(outer, gue_port)
        if isinstance(inner, IP | IPv6) and inner.src in clients and inner.dst in vips:
            out.from_lb += 1
        else:
            out.stray.append(f"from LB: {outer.src} > {outer.dst} {outer.summary()}")
    return out
