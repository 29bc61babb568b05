"""test_server_ids.py: the server-id table: which packets carry a real's id, which real they reach, what is counted.

QUIC connection ids (Katran's v1/v2/v3 layouts, long Handshake/Retry and short headers, QUIC v2's
rotated type bits), Katran's TCP option 183 and its UDP stable-routing header, each on a VIP whose
flag asks for it (route.h). Every row: description, frame, verdict, reason, the real it must reach
(None: the ring's, i.e. the ring's only real, RING_REAL) and the server-id event it counts.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import pytest
from scapy.layers.inet import TCP
from scapy.packet import Packet

from balancer import _abi, routes

from . import packets as P
from .frames import decode_encap
from .rig import BalancerFactory, RunBalancer

QUIC_VIP, TCP_VIP, STABLE_VIP, PLAIN_VIP = "203.0.113.70", "203.0.113.71", "203.0.113.72", "203.0.113.73"
RING_REAL = P.REALS4[0]  # every ring here holds this one real: a packet that is not routed reaches it
IDS = {1024: P.REALS4[1], 197634: P.REALS4[2], 0x12345678: P.REALS6[0]}
QUIC_V1, QUIC_V2 = 0x00000001, 0x6B3343CF


def cid(version: int, sid: int) -> bytes:
    """An 8-byte connection id holding `sid` in Katran's layout `version` (1: 16 bits, 2: 24, 3: 32)."""
    if version == 1:
        head = bytes([0x40 | (sid >> 10), (sid >> 2) & 0xFF, (sid & 3) << 6])
    elif version == 2:
        head = bytes([0x80]) + sid.to_bytes(3, "big")
    else:
        head = bytes([0xC0]) + sid.to_bytes(4, "big")
    return head.ljust(8, b"\x5a")


def quic_long(ptype: int, dcid: bytes, version: int = QUIC_V1) -> bytes:
    """A long-header packet: form and fixed bits, the type bits `ptype` (0..3), version, DCID, SCID."""
    return bytes([0xC0 | ptype << 4]) + struct.pack("!I", version) + bytes([len(dcid)]) + dcid + b"\x08" + \
        b"\x11" * 8 + b"quic payload"


def quic_short(dcid: bytes) -> bytes:
    return b"\x41" + dcid + b"quic protected payload"


def tpr(sid: int) -> tuple[int, bytes]:
    return 183, sid.to_bytes(4, "little")


def tcp(flags: str = "A", options: list[object] | None = None, sport: int = 40000) -> Packet:
    return P.eth() / P.ip_for(TCP_VIP) / TCP(sport=sport, dport=80, flags=flags, options=options or []) / P.PAYLOAD


@dataclass(frozen=True)
class Row:
    description: str
    input: Packet | bytes
    real: str | None  # the real it reaches; None: the ring's
    event: str        # SID_ROUTED, SID_UNKNOWN or SID_NONE


TABLE = [
    Row("QUIC short header, CID v1, id 1024", P.udp_to(QUIC_VIP, payload=quic_short(cid(1, 1024))), IDS[1024],
        "SID_ROUTED"),
    Row("QUIC short header, CID v2, id 197634", P.udp_to(QUIC_VIP, payload=quic_short(cid(2, 197634))),
        IDS[197634], "SID_ROUTED"),
    Row("QUIC short header, CID v3, a 32-bit id to an IPv6 real",
        P.udp_to(QUIC_VIP, payload=quic_short(cid(3, 0x12345678))), IDS[0x12345678], "SID_ROUTED"),
    Row("QUIC Handshake (long header), CID v1", P.udp_to(QUIC_VIP, payload=quic_long(2, cid(1, 1024))),
        IDS[1024], "SID_ROUTED"),
    Row("QUIC Retry (long header), CID v2", P.udp_to(QUIC_VIP, payload=quic_long(3, cid(2, 197634))),
        IDS[197634], "SID_ROUTED"),
    Row("QUIC Initial: the client's own CID, never read", P.udp_to(QUIC_VIP, payload=quic_long(0, cid(1, 1024))),
        None, "SID_NONE"),
    Row("QUIC 0-RTT: the client's own CID", P.udp_to(QUIC_VIP, payload=quic_long(1, cid(1, 1024))), None, "SID_NONE"),
    Row("QUIC v2 Initial (type bits 01, v1's 0-RTT rotated)",
        P.udp_to(QUIC_VIP, payload=quic_long(1, cid(1, 1024), QUIC_V2)), None, "SID_NONE"),
    Row("QUIC v2 0-RTT (type bits 10, v1's Handshake rotated)",
        P.udp_to(QUIC_VIP, payload=quic_long(2, cid(1, 1024), QUIC_V2)), None, "SID_NONE"),
    Row("QUIC v2 Handshake (type bits 11)", P.udp_to(QUIC_VIP, payload=quic_long(3, cid(1, 1024), QUIC_V2)),
        IDS[1024], "SID_ROUTED"),
    Row("QUIC Handshake with a 4-byte DCID: shorter than the ids Katran reads",
        P.udp_to(QUIC_VIP, payload=quic_long(2, cid(1, 1024)[:4])), None, "SID_NONE"),
    Row("QUIC short header, CID v1, id 1092 no real has", P.udp_to(QUIC_VIP, payload=quic_short(cid(1, 1092))),
        None, "SID_UNKNOWN"),
    Row("QUIC short header, CID v1, id 0", P.udp_to(QUIC_VIP, payload=quic_short(cid(1, 0))), None, "SID_NONE"),
    Row("QUIC short header, CID layout v0 (no id)", P.udp_to(QUIC_VIP, payload=quic_short(b"\x01" * 8)), None,
        "SID_NONE"),
    Row("QUIC short header cut inside its CID", P.udp_to(QUIC_VIP, payload=b"\x41\x40\x01"), None, "SID_NONE"),
    Row("UDP with no payload to a QUIC VIP", P.udp_to(QUIC_VIP, payload=b""), None, "SID_NONE"),
    Row("TCP option 183, id 1024 little-endian", tcp(options=[tpr(1024)]), IDS[1024], "SID_ROUTED"),
    Row("TCP option 183 after NOPs and a timestamp",
        tcp(options=[("NOP", None), ("NOP", None), ("Timestamp", (1, 2)), tpr(197634)]), IDS[197634], "SID_ROUTED"),
    Row("TCP option 183 on a SYN: never read", tcp("S", [tpr(1024)]), None, "SID_NONE"),
    Row("TCP option 183 with length 4", tcp(options=[(183, b"\x00\x04")]), None, "SID_NONE"),
    Row("TCP option 183 after EOL", tcp(options=[("EOL", None), tpr(1024)]), None, "SID_NONE"),
    Row("TCP option 183 with an id no real has", tcp(options=[tpr(1021)]), None, "SID_UNKNOWN"),
    Row("TCP without options", tcp(), None, "SID_NONE"),
    Row("stable-routing header 0x52, id 197634", P.udp_to(STABLE_VIP, payload=b"\x52\x03\x04\x02" + b"\0" * 12),
        IDS[197634], "SID_ROUTED"),
    Row("stable-routing header with id 0", P.udp_to(STABLE_VIP, payload=b"\x52" + b"\0" * 15), None, "SID_NONE"),
    Row("UDP to a stable-routing VIP without the header", P.udp_to(STABLE_VIP, payload=b"\x51\x03\x04\x02" * 4),
        None, "SID_NONE"),
    Row("QUIC CID to a VIP that does not route by server id", P.udp_to(PLAIN_VIP, payload=quic_short(cid(1, 1024))),
        None, ""),
]


def server_id_world(b: RunBalancer) -> None:
    """The four VIPs (QUIC, TCP option, stable routing, none), each ring holding RING_REAL, and IDS."""
    b.vip(QUIC_VIP, 443, "udp", 0, [RING_REAL], flags=_abi.VipFlag.SID_QUIC)
    b.vip(TCP_VIP, 80, "tcp", 1, [RING_REAL], flags=_abi.VipFlag.SID_TCP)
    b.vip(STABLE_VIP, 443, "udp", 2, [RING_REAL], flags=_abi.VipFlag.SID_STABLE)
    b.vip(PLAIN_VIP, 443, "udp", 3, [RING_REAL])
    for sid, real in IDS.items():
        b.dp.put_entry(routes.server_id(sid, b.real_id(real)))


@pytest.fixture
def sid_balancer(balancer_factory: BalancerFactory) -> RunBalancer:
    return balancer_factory(world=server_id_world)


@pytest.mark.parametrize("row", TABLE, ids=[r.description for r in TABLE])
def test_server_id_table(sid_balancer: RunBalancer, row: Row) -> None:
    out = sid_balancer.run(row.input)
    assert (out.verdict, out.reason) == ("XDP_TX", "TX_ENCAP")
    assert str(decode_encap(out.out, P.GUE_PORT).outer.dst) == (row.real or RING_REAL)
    sid_events = {k: v for k, v in out.events.items() if k.startswith("SID_")}
    assert sid_events == ({row.event: 1} if row.event else {})


def test_a_routed_packet_writes_its_real_into_the_session(sid_balancer: RunBalancer) -> None:
    """A flow's later packets without an id (a short header that lost it, a segment without the
    option) follow the real its id chose; Katran does the same with its LRU."""
    quic = (P.udp_to(QUIC_VIP, payload=quic_short(cid(1, 1024))), P.udp_to(QUIC_VIP, payload=b"x"))
    for with_id, without_id in (quic, (tcp(options=[tpr(1024)]), tcp())):
        first = sid_balancer.run(with_id)
        later = sid_balancer.run(without_id)
        assert str(decode_encap(first.out, P.GUE_PORT).outer.dst) == IDS[1024]
        assert str(decode_encap(later.out, P.GUE_PORT).outer.dst) == IDS[1024]
        assert later.events.get("LRU_HIT") == 1


def test_an_id_whose_real_is_gone_falls_back_to_the_ring(sid_balancer: RunBalancer) -> None:
    sid_balancer.dp.del_real(sid_balancer.real_ids[IDS[1024]])
    out = sid_balancer.run(P.udp_to(QUIC_VIP, sport=40100, payload=quic_short(cid(1, 1024))))
    assert str(decode_encap(out.out, P.GUE_PORT).outer.dst) == RING_REAL
    assert out.events.get("SID_UNKNOWN") == 1
