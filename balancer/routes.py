"""routes.py: the map entries of routing beyond the flow hash, as (map, key, value) triples.

Server ids (``lb_server_ids``: a real's host id, which QUIC connection ids, Katran's TCP option and
its UDP stable-routing header carry), client source prefixes pinned to a real per VIP
(``lb_src_routes``), VIPs that are prefixes (``lb_vip_cidrs``), the LB's own addresses whose tunnel
packets it decapsulates (``lb_decaps``) and reals that health checks took down for a VIP with UDP
flow migration (``lb_down_reals``). Layouts come from the generated ``_abi``; ``Datapath.put_entry``
and ``Transaction.put_entry`` write the triples (bpf/include/route.h, decap_inline.h read them).
"""

from __future__ import annotations

import ctypes
import ipaddress
import socket
from typing import NamedTuple

from balancer import _abi
from balancer.datapath import addr_words, proto_number

DecapAction = _abi.DecapAction
LPM_DATA_BITS = 32  # the bits of an LPM key before the address: VIP number, or port / proto / family


class Entry(NamedTuple):
    """One entry of one map: what `put_entry` writes and `delete_entry` removes."""

    map: str
    key: bytes
    value: bytes


def _u32x4(raw16: bytes) -> ctypes.Array[ctypes.c_uint32]:
    return (ctypes.c_uint32 * 4).from_buffer_copy(raw16)


def u32(value: int) -> bytes:
    return int(value).to_bytes(4, "little")


def server_id(sid: int, real_id: int) -> Entry:
    """The real a server id names."""
    return Entry("lb_server_ids", u32(sid), u32(real_id))


def src_route(vip_num: int, prefix: str, real_id: int) -> Entry:
    """New flows of a VIP from a client in `prefix` go to the real (the longest prefix wins)."""
    net = ipaddress.ip_network(prefix, strict=True)
    raw, _ = addr_words(str(net.network_address))
    key = _abi.SrcKey(prefixlen=LPM_DATA_BITS + net.prefixlen, vip_num=vip_num, addr=_u32x4(raw))
    return Entry("lb_src_routes", bytes(key), u32(real_id))


def vip_cidr(prefix: str, port: int, proto: str | int, *, vip_num: int, flags: int = 0,
             encap: int = _abi.Encap.IPIP) -> Entry:
    """A VIP that is a prefix: every address of it served by the VIP's one ring (proto 0 and port 0:
    the address-only entry that makes the prefix's addresses VIPs for ICMP echo and the drops)."""
    net = ipaddress.ip_network(prefix, strict=True)
    raw, fam = addr_words(str(net.network_address))
    key = _abi.VipCidrKey(prefixlen=LPM_DATA_BITS + net.prefixlen, port=socket.htons(port),
                          proto=proto_number(proto), family=fam, addr=_u32x4(raw))
    meta = _abi.VipMeta(vip_num=vip_num, flags=int(flags), encap=int(encap))
    return Entry("lb_vip_cidrs", bytes(key), bytes(meta))


def decap(address: str, action: DecapAction) -> Entry:
    """What inline decap does with IPIP / GUE packets addressed to this address of the LB."""
    raw, fam = addr_words(address)
    return Entry("lb_decaps", bytes(_abi.AddrKey(addr=_u32x4(raw), family=fam)), u32(action))


def down_real(vip_num: int, real_id: int) -> Entry:
    """A real health checks took down for a VIP: its UDP sessions there are chosen again."""
    return Entry("lb_down_reals", bytes(_abi.DownKey(vip_num=vip_num, real_id=real_id)), u32(1))
