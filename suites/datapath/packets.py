"""packets.py: the datapath tests' addresses and packets, as named scapy expressions and small builders.

Addresses come from the documentation prefixes: clients in 198.51.100.0/24 and 2001:db8:c::/48,
VIPs in 203.0.113.0/24 and 2001:db8:f::/48, reals in 192.0.2.0/24 and 2001:db8:a::/48.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from scapy.layers.inet import ICMP, IP, TCP, UDP, IPOption_RR
from scapy.layers.inet6 import (
    ICMPv6DestUnreach,
    ICMPv6EchoRequest,
    ICMPv6PacketTooBig,
    ICMPv6TimeExceeded,
    IPv6,
    IPv6ExtHdrDestOpt,
    IPv6ExtHdrFragment,
    IPv6ExtHdrHopByHop,
)
from scapy.layers.l2 import ARP, Dot1Q, Ether
from scapy.packet import Packet, Raw

from balancer import _abi

CLIENT_MAC = "01:00:00:00:00:00"
LB_MAC = "02:00:00:00:00:00"
ROUTER_MAC = "00:00:de:ad:be:af"

CLIENT4 = "198.51.100.7"
CLIENT6 = "2001:db8:c::7"
ROUTER4 = "198.51.100.1"  # sends ICMP errors about VIP flows
ROUTER6 = "2001:db8:c::1"
OTHER4 = "198.51.100.200"  # an address that is no VIP
OTHER6 = "2001:db8:c::200"

SRC4 = "192.0.2.254"  # outer source of encapsulated packets (fixed)
SRC4_NET = "192.0.2.0/24"  # outer source prefix when flow-derived
SRC6 = "2001:db8:b::1"
SRC6_NET = "2001:db8:b::/64"
GUE_PORT = _abi.Limits.DEFAULT_GUE_PORT
MTU = 1500

REALS4 = ("192.0.2.11", "192.0.2.12", "192.0.2.13")
REALS6 = ("2001:db8:a::11", "2001:db8:a::12", "2001:db8:a::13")

PAYLOAD = b"l4lab datapath test payload"


@dataclass(frozen=True)
class EncapCase:
    """One encapsulation mode under test: the VIP that uses it and the reals behind it."""

    id: str  # outer-to-inner stack, the id used everywhere (ip4-ipip, ip6-ip4ip6, ...)
    vip: str
    mode: str  # Encap member name: IPIP, GUE1, GUE0
    reals: tuple[str, ...]
    outer: int  # 4 or 6
    inner: int  # 4 or 6


ENCAPS = (
    EncapCase("ip4-ipip", "203.0.113.1", "IPIP", REALS4, 4, 4),
    EncapCase("ip4-gue1", "203.0.113.2", "GUE1", REALS4, 4, 4),
    EncapCase("ip4-gue0", "203.0.113.3", "GUE0", REALS4, 4, 4),
    EncapCase("ip6-ip6ip6", "2001:db8:f::1", "IPIP", REALS6, 6, 6),
    EncapCase("ip6-gue1", "2001:db8:f::2", "GUE1", REALS6, 6, 6),
    EncapCase("ip6-ip4ip6", "203.0.113.4", "IPIP", REALS6, 6, 4),
)
ENCAP_IDS = [e.id for e in ENCAPS]

VIP4 = ENCAPS[0].vip  # TCP 80, UDP 443, IPIP to REALS4
VIP6 = ENCAPS[3].vip  # TCP 80, IPIP to REALS6
VIP_PORT = 80
VIP_UDP_PORT = 443


def eth() -> Packet:
    return Ether(src=CLIENT_MAC, dst=LB_MAC)


def ip_for(dst: str, src: str | None = None, **fields: Any) -> Packet:
    """IPv4 or IPv6 header from the client (or src) to dst."""
    if ":" in dst:
        return IPv6(src=src or CLIENT6, dst=dst, **fields)
    return IP(src=src or CLIENT4, dst=dst, **fields)


def tcp_to(dst: str, sport: int = 40000, dport: int = VIP_PORT, flags: str = "A",
           payload: bytes = PAYLOAD, src: str | None = None, df: bool = False, **ip_fields: Any) -> Packet:
    """TCP from the client to dst; `flags` are TCP flags, `df` sets IPv4 don't-fragment."""
    if df and ":" not in dst:
        ip_fields["flags"] = "DF"
    return eth() / ip_for(dst, src, **ip_fields) / TCP(sport=sport, dport=dport, flags=flags) / payload


def udp_to(dst: str, sport: int = 40000, dport: int = VIP_UDP_PORT, payload: bytes = PAYLOAD,
           src: str | None = None, **ip_fields: Any) -> Packet:
    return eth() / ip_for(dst, src, **ip_fields) / UDP(sport=sport, dport=dport) / payload


def sized_tcp_to(dst: str, ip_len: int, df: bool = True, sport: int = 41000) -> Packet:
    """A TCP packet whose IP packet is exactly ip_len bytes."""
    hdr = 20 if ":" not in dst else 40
    return tcp_to(dst, sport=sport, payload=b"x" * (ip_len - hdr - 20), df=df)


def icmp_error_about(vip: str, client: str, vport: int = VIP_PORT, cport: int = 40000,
                     quote_len: int | None = None, v6_type: str = "too_big") -> Packet:
    """An ICMP error from a router to the VIP, quoting a reply packet of the flow (VIP -> client)."""
    if ":" in vip:
        quoted = bytes(IPv6(src=vip, dst=client) / TCP(sport=vport, dport=cport, flags="SA") / PAYLOAD)
        if quote_len is not None:
            quoted = quoted[:quote_len]
        err = ICMPv6PacketTooBig(mtu=1280) if v6_type == "too_big" else ICMPv6DestUnreach(code=4)
        return eth() / IPv6(src=ROUTER6, dst=vip) / err / Raw(quoted)
    quoted = bytes(IP(src=vip, dst=client, flags="DF") / TCP(sport=vport, dport=cport, flags="SA") / PAYLOAD)
    if quote_len is not None:
        quoted = quoted[:quote_len]
    return eth() / IP(src=ROUTER4, dst=vip) / ICMP(type=3, code=4, nexthopmtu=1400) / Raw(quoted)


def icmp6_error(v6_type: str) -> Packet:
    """The ICMPv6 error header of a type: too_big, unreach or time."""
    if v6_type == "too_big":
        return ICMPv6PacketTooBig(mtu=1280)
    if v6_type == "unreach":
        return ICMPv6DestUnreach(code=4)
    return ICMPv6TimeExceeded(code=0)


def icmp6_error_quoting_ext(vip: str, client: str, ext: Packet, cport: int = 40000, v6_type: str = "too_big",
                            quote_dst: str | None = None, quote_len: int | None = None) -> Packet:
    """An ICMPv6 error from a router to the VIP quoting a reply of the flow whose IPv6 header is
    followed by the extension headers `ext` (sent to quote_dst, a next segment, when given)."""
    quoted = bytes(IPv6(src=vip, dst=quote_dst or client) / ext
                   / TCP(sport=VIP_PORT, dport=cport, flags="SA") / PAYLOAD)
    if quote_len is not None:
        quoted = quoted[:quote_len]
    return eth() / IPv6(src=ROUTER6, dst=vip) / icmp6_error(v6_type) / Raw(quoted)


# -- named packets of the parsing table ------------------------------------------------------------

ARP_REQUEST = eth() / ARP(psrc=CLIENT4, pdst=VIP4)
VLAN_TRUNCATED = bytes(Ether(src=CLIENT_MAC, dst=LB_MAC, type=0x8100)) + b"\x00\x01"
VLAN_STACKED = Ether(src=CLIENT_MAC, dst=LB_MAC) / Dot1Q(vlan=10) / Dot1Q(vlan=20) \
    / IP(src=CLIENT4, dst=VIP4) / TCP(sport=40000, dport=VIP_PORT) / PAYLOAD
VLAN_TCP4 = Ether(src=CLIENT_MAC, dst=LB_MAC) / Dot1Q(vlan=10) / IP(src=CLIENT4, dst=VIP4) \
    / TCP(sport=40001, dport=VIP_PORT, flags="S") / PAYLOAD
TCP4_SYN = tcp_to(VIP4, flags="S")
TCP6_SYN = tcp_to(VIP6, flags="S")
UDP4 = udp_to(VIP4)
TCP4_NOT_VIP = tcp_to(OTHER4)
TCP6_NOT_VIP = tcp_to(OTHER6)
TCP4_VIP_OTHER_PORT = tcp_to(VIP4, dport=8080)
GRE4_TO_VIP = eth() / IP(src=CLIENT4, dst=VIP4, proto=47) / b"\x00\x00\x08\x00" / PAYLOAD
IP4_TRUNCATED = bytes(TCP4_SYN)[:14 + 12]
IP4_BAD_IHL = eth() / IP(src=CLIENT4, dst=VIP4, ihl=4) / TCP(sport=40000, dport=VIP_PORT) / PAYLOAD
IP4_BAD_VERSION = eth() / IP(src=CLIENT4, dst=VIP4, version=5) / TCP(sport=40000, dport=VIP_PORT) / PAYLOAD
IP4_LEN_TOO_LONG = eth() / IP(src=CLIENT4, dst=VIP4, len=400) / TCP(sport=40000, dport=VIP_PORT) / PAYLOAD
IP4_LEN_UNDER_IHL = eth() / IP(src=CLIENT4, dst=VIP4, len=16) / TCP(sport=40000, dport=VIP_PORT) / PAYLOAD
IP6_TRUNCATED = bytes(TCP6_SYN)[:14 + 30]
IP6_LEN_TOO_LONG = eth() / IPv6(src=CLIENT6, dst=VIP6, plen=400) / TCP(sport=40000, dport=VIP_PORT) / PAYLOAD
IP6_ZERO_PLEN = eth() / IPv6(src=CLIENT6, dst=VIP6, plen=0) / TCP(sport=40000, dport=VIP_PORT) / PAYLOAD
IP4_OPTIONS_TO_VIP = eth() / IP(src=CLIENT4, dst=VIP4, options=[IPOption_RR()]) \
    / TCP(sport=40000, dport=VIP_PORT) / PAYLOAD
IP4_OPTIONS_NOT_VIP = eth() / IP(src=CLIENT4, dst=OTHER4, options=[IPOption_RR()]) \
    / TCP(sport=40000, dport=VIP_PORT) / PAYLOAD
IP4_FIRST_FRAGMENT_TO_VIP = eth() / IP(src=CLIENT4, dst=VIP4, flags="MF") \
    / TCP(sport=40000, dport=VIP_PORT) / PAYLOAD
IP4_LATER_FRAGMENT_TO_VIP = eth() / IP(src=CLIENT4, dst=VIP4, frag=100, proto=6) / PAYLOAD
IP4_FRAGMENT_NOT_VIP = eth() / IP(src=CLIENT4, dst=OTHER4, flags="MF") / TCP(sport=40000, dport=80) / PAYLOAD
IP6_FRAGMENT_TO_VIP = eth() / IPv6(src=CLIENT6, dst=VIP6) / IPv6ExtHdrFragment(m=1, id=7) \
    / TCP(sport=40000, dport=VIP_PORT) / PAYLOAD
IP6_FRAGMENT_NOT_VIP = eth() / IPv6(src=CLIENT6, dst=OTHER6) / IPv6ExtHdrFragment(m=1, id=7) \
    / TCP(sport=40000, dport=VIP_PORT) / PAYLOAD
IP6_EXT_HDRS_TO_VIP = eth() / IPv6(src=CLIENT6, dst=VIP6) / IPv6ExtHdrHopByHop() / IPv6ExtHdrDestOpt() \
    / TCP(sport=40002, dport=VIP_PORT, flags="S") / PAYLOAD
IP6_EXT_HDR_TRUNCATED = bytes(eth() / IPv6(src=CLIENT6, dst=VIP6, nh=0, plen=1) / b"\x06")
TCP4_TRUNCATED_TO_VIP = eth() / IP(src=CLIENT4, dst=VIP4, proto=6) / bytes(TCP(sport=40000, dport=80))[:10]
TCP4_TRUNCATED_NOT_VIP = eth() / IP(src=CLIENT4, dst=OTHER4, proto=6) / bytes(TCP(sport=40000, dport=80))[:10]
UDP4_PADDED = Ether(bytes(udp_to(VIP4, payload=b"p")).ljust(60, b"\0"))

ICMP4_ECHO_TO_VIP = eth() / IP(src=CLIENT4, dst=VIP4) / ICMP(type=8, id=7, seq=1) / PAYLOAD
ICMP6_ECHO_TO_VIP = eth() / IPv6(src=CLIENT6, dst=VIP6) / ICMPv6EchoRequest(id=7, seq=1) / PAYLOAD
ICMP4_ECHO_NOT_VIP = eth() / IP(src=CLIENT4, dst=OTHER4) / ICMP(type=8) / PAYLOAD
ICMP6_ECHO_NOT_VIP = eth() / IPv6(src=CLIENT6, dst=OTHER6) / ICMPv6EchoRequest() / PAYLOAD
ICMP4_TIMESTAMP_TO_VIP = eth() / IP(src=CLIENT4, dst=VIP4) / ICMP(type=13) / (b"\0" * 12)
ICMP4_TRUNCATED_TO_VIP = eth() / IP(src=CLIENT4, dst=VIP4, proto=1) / b"\x08\x00\x00"
ICMP4_ERROR_NOT_VIP_FLOW = icmp_error_about(OTHER4, CLIENT4)
