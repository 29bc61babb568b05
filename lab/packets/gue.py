"""gue.py: Generic UDP Encapsulation (draft-ietf-intarea-gue) as a scapy layer, bound to the GUE port.

Two variants share the UDP port. Variant 0 puts a header before the payload: version (2 bits, 0),
C (control), hlen (options length in 32-bit words), proto/ctype (the inner IP protocol, 4 or 41,
or a control type when C is set) and 16 bits of flags, then hlen words of options. Variant 1 has
no header at all: the UDP payload is the IP packet, and its first two bits (01 for both IPv4 and
IPv6) are what tells it from variant 0.

Building:  IP(...)/UDP(dport=port)/GUE()/IP(...)   variant 0, proto filled in from the payload
           IP(...)/UDP(dport=port)/IP(...)         variant 1
Dissecting a UDP datagram to the bound port gives GUE/IP, GUE/IPv6 (variant 0), IP or IPv6
(variant 1), or Raw for anything else (versions 2 and 3, a variant-1 nibble that is not 4 or 6, a
header cut short).

`bind_gue(port)` is the one place the UDP binding is made: at import on the datapath's default
GUE port (`_abi.Limits.DEFAULT_GUE_PORT`); a lab or test configured with another port calls it
again, which moves the binding.
"""

from __future__ import annotations

from typing import Any

from scapy.fields import BitField, ByteEnumField, ShortField, StrLenField
from scapy.layers.inet import IP, UDP
from scapy.layers.inet6 import IPv6
from scapy.packet import Packet, Raw, bind_layers, split_layers

from balancer import _abi

PROTO_IPIP, PROTO_IPV6 = 4, 41


class GUE(Packet):
    """GUE variant 0 header; `GUE(raw)` of variant-1 bytes gives the IP packet they are."""

    name = "GUE"
    fields_desc = [
        BitField("version", 0, 2),
        BitField("control", 0, 1),
        BitField("hlen", None, 5),
        ByteEnumField("proto", 0, {PROTO_IPIP: "IPv4", PROTO_IPV6: "IPv6"}),
        ShortField("flags", 0),
        StrLenField("options", b"", length_from=lambda p: (p.hlen or 0) * 4),
    ]

    @classmethod
    def dispatch_hook(cls, _pkt: bytes | None = None, *args: Any, **kargs: Any) -> type[Packet]:
        if not _pkt:
            return cls
        first = _pkt[0] >> 4
        if first >> 2 == 0:
            return cls if len(_pkt) >= 4 else Raw
        if first == 4:
            return IP if len(_pkt) >= 20 else Raw
        if first == 6:
            return IPv6 if len(_pkt) >= 40 else Raw
        return Raw  # versions 2 and 3, and variant 1 with an IP version that is neither 4 nor 6

    def post_build(self, pkt: bytes, pay: bytes) -> bytes:
        if self.hlen is None:
            words = (len(pkt) - 4 + 3) // 4
            pkt = bytes([pkt[0] & 0xE0 | words]) + pkt[1:]
        return pkt + pay

    def guess_payload_class(self, payload: bytes) -> type[Packet]:
        if self.control:
            return Raw
        return super().guess_payload_class(payload)


bind_layers(GUE, IP, proto=PROTO_IPIP)
bind_layers(GUE, IPv6, proto=PROTO_IPV6)

_bound: int | None = None


def bind_gue(port: int) -> None:
    """Dissect UDP to `port` as GUE (either variant), and fill it in as the destination of UDP/GUE."""
    global _bound
    if _bound == port:
        return
    if _bound is not None:
        split_layers(UDP, GUE, dport=_bound)
    bind_layers(UDP, GUE, dport=port)
    _bound = port


def bound_port() -> int | None:
    return _bound


bind_gue(_abi.Limits.DEFAULT_GUE_PORT)
