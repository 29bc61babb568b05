"""maplayout.py: the bytes of the balancer's map keys and values, from addresses, ports and flags.

The structs are bpf/include/abi.h's, generated into balancer/_abi.py; these functions fill them the
way the datapath reads them (network order where the packet has it, families, the VIP index's hash).
"""

from __future__ import annotations

import ctypes
import errno as _errno
import ipaddress
import socket
import struct
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from balancer import _abi
from balancer.errors import DatapathError

PROTOS = {"tcp": socket.IPPROTO_TCP, "udp": socket.IPPROTO_UDP}


def addr_words(address: str) -> tuple[bytes, int]:
    """16 bytes in network order (IPv4 in the first 4) and the lb_family of an address."""
    ip = ipaddress.ip_address(address)
    fam = _abi.Family.INET if ip.version == 4 else _abi.Family.INET6
    return ip.packed.ljust(16, b"\0"), int(fam)


# The LRU session tables: IPv6 flows, keyed by struct lb_flow. IPv4 flows live in SESSION_SETS
# (bpf/include/session4.h), an array of sets of ways that Datapath.sessions() walks through its memory.
SESSION_TABLES = ("lb_sessions",)
SESSION_SETS = "lb_sess4_sets"

# struct lb_sess4_set as 32-bit words: WAYS keys {src, dst, ports, tag}, then WAYS sessions {real_id, hash,
# atime_ns (two words)}; a way's key is named in sessions() by its words with the tag cut to the protocol.
SESS4_WAYS = int(_abi.Sess4.WAYS)
SESS4_SET_WORDS = ctypes.sizeof(_abi.Sess4Set) // 4
SESS4_KEY_WORDS = ctypes.sizeof(_abi.Sess4Key) // 4
SESS4_TAG_WORD = _abi.Sess4Key.tag.offset // 4
SESS4_SESSIONS_AT = _abi.Sess4Set.sess.offset // 4
SESS4_SESSION_WORDS = ctypes.sizeof(_abi.Session) // 4
SESS4_PROTO = int(_abi.Sess4.PROTO)
SESS4_CHECK = int(_abi.Sess4.CHECK)  # 0: the way is empty; all ones: it is being written
SESS4_OVERFLOW = int(_abi.Sess4.OVERFLOW) & 0xFFFFFFFF  # BTF hands the enum member back signed
SESS4_CHECK_LOW = SESS4_CHECK & -SESS4_CHECK  # the check's lowest bit (SESS4_CHECK_SHIFT in session4.h)


def session_sets(entries: int) -> int:
    """The sets of SESSION_SETS for `entries` sessions: one way each, 4 ways a set, a power of two (up)."""
    sets = max(2, -(-entries // SESS4_WAYS))
    return 1 << (sets - 1).bit_length()


def sess4_check(src: int, dst: int, ports: int, proto: int, real_id: int, hash32: int) -> int:
    """The check bits of a SESSION_SETS way's tag (sess4_check_words in bpf/include/session4.h): a checksum
    of its key words (src, dst, ports as the map holds them, read little-endian), protocol, real and flow
    hash; never 0 (empty) nor all ones (being written). suites/datapath/test_sessions4.py holds it to the
    datapath's ways."""
    m = 0xFFFFFFFF
    x = (src * 0x9E3779B1 ^ dst * 0x85EBCA77 ^ ports * 0xC2B2AE3D ^ (real_id ^ (proto << 24)) * 0x27D4EB2F
         ^ hash32 * 0x165667B1) & m
    x ^= x >> 15
    check = (x >> 1) & SESS4_CHECK
    if check == 0:
        return SESS4_CHECK_LOW
    if check == SESS4_CHECK:
        return SESS4_CHECK ^ SESS4_CHECK_LOW
    return check


def sess4_valid(src: int, dst: int, ports: int, tag: int, real_id: int, hash32: int) -> bool:
    """Whether a way read from SESSION_SETS holds a session: its check neither empty nor "being written",
    and the checksum of its content (sess4_check). The one rule every reader of the sets applies."""
    check = tag & SESS4_CHECK
    return check not in (0, SESS4_CHECK) and \
        check == sess4_check(src, dst, ports, tag & SESS4_PROTO, real_id, hash32)


def sess4_held(words: npt.NDArray[np.uint32]) -> npt.NDArray[np.bool_]:
    """Which ways of SESSION_SETS (its memory as words, a row a set) look held: a check neither empty nor
    "being written", read once, as a (sets, ways) mask. The candidates only: a reader still takes a way by
    its checksum (sess4_valid)."""
    checks = words[:, SESS4_TAG_WORD:SESS4_WAYS * SESS4_KEY_WORDS:SESS4_KEY_WORDS] & SESS4_CHECK
    held: npt.NDArray[np.bool_] = (checks != 0) & (checks != SESS4_CHECK)
    return held


def sess4_key(flow: _abi.Flow) -> bytes:
    """An IPv4 flow's key words in SESSION_SETS (struct lb_sess4_key), its tag cut to the protocol."""
    return bytes(_abi.Sess4Key(src=flow.src[0], dst=flow.dst[0], ports=flow.sport | flow.dport << 16,
                               tag=flow.proto))


def session_key(flow: _abi.Flow) -> tuple[str, bytes]:
    """The session table of a flow (struct lb_flow) and the flow's key in it: an IPv4 flow's key words in
    SESSION_SETS (where in the sets the flow's hash and the datapath's choices decide), an IPv6 flow's
    struct lb_flow in lb_sessions."""
    if flow.family == _abi.Family.INET:
        return SESSION_SETS, sess4_key(flow)
    return "lb_sessions", bytes(flow)


def session_flow(table: str, key: bytes) -> _abi.Flow:
    """A session table's key (as session_key gives it) as the flow (struct lb_flow) it stands for."""
    if table == "lb_sessions":
        return _abi.Flow.from_buffer_copy(key)
    k = _abi.Sess4Key.from_buffer_copy(key)
    return _abi.Flow(src=(ctypes.c_uint32 * 4)(k.src), dst=(ctypes.c_uint32 * 4)(k.dst), sport=k.ports & 0xFFFF,
                     dport=k.ports >> 16, proto=k.tag & SESS4_PROTO, family=int(_abi.Family.INET))


def words_addr(raw: bytes, family: int) -> str:
    if family == _abi.Family.INET:
        return str(ipaddress.IPv4Address(raw[:4]))
    return str(ipaddress.IPv6Address(raw[:16]))


def u32x4(raw16: bytes) -> ctypes.Array[ctypes.c_uint32]:
    return (ctypes.c_uint32 * 4).from_buffer_copy(raw16)


def proto_number(proto: str | int) -> int:
    if isinstance(proto, int):
        return proto
    if proto not in PROTOS:
        raise DatapathError(f"use protocol '{proto}'", _errno.EINVAL, "use tcp or udp")
    return PROTOS[proto]


INDEX_SLOTS = int(_abi.Limits.VIP_INDEX_SLOTS)
INDEX_HASH = int(_abi.Limits.VIP_INDEX_HASH) & 0xFFFFFFFF  # BTF hands the enum member back signed
INDEX_SHIFT = 32 - (INDEX_SLOTS - 1).bit_length()  # the product's top bits are the slot
SLOT_WORDS = ctypes.sizeof(_abi.VipSlot) // 4  # meta (3 words), then the key (5): the last is port/proto/family
META_WORDS = ctypes.sizeof(_abi.VipMeta) // 4
SLOT_SHARED = int(_abi.VipSlotState.SHARED) << 24  # a slot's last word when keys share it (family = SHARED)


def vip_slot(key: bytes) -> int:
    """The lb_vip_index slot of an lb_vips key (struct lb_vip_slot in bpf/include/abi.h; find_vip)."""
    w0, w1, w2, w3, w4 = (int(w) for w in struct.unpack_from("<5I", key))
    return (((w0 ^ w1 ^ w2 ^ w3 ^ w4) * INDEX_HASH) & 0xFFFFFFFF) >> INDEX_SHIFT


def slot_family(tail: int) -> int:
    return (int(tail) >> 24) & 0xFF


def vip_index_from(entries: Sequence[tuple[bytes, bytes]]) -> npt.NDArray[np.uint32]:
    """lb_vip_index as lb_vips' (key, meta) entries make it: (INDEX_SLOTS, SLOT_WORDS) words, a slot
    empty (zero), the one key that has it with its meta, or SHARED (zero but the family)."""
    index = np.zeros((INDEX_SLOTS, SLOT_WORDS), dtype="<u4")
    seen: set[int] = set()
    for key, meta in entries:
        i = vip_slot(key)
        if i in seen:
            index[i] = 0
            index[i, -1] = SLOT_SHARED
        else:
            seen.add(i)
            index[i] = np.frombuffer(meta + key, dtype="<u4")
    return index


def vip_key(address: str, port: int, proto: str | int) -> bytes:
    raw, fam = addr_words(address)
    key = _abi.VipKey(addr=u32x4(raw), port=socket.htons(port), proto=proto_number(proto), family=fam)
    return bytes(key)


def settings_bytes(*, nexthop_mac: str, src4: str = "0.0.0.0/32", src6: str = "::/128",
                   gue_port: int = _abi.Limits.DEFAULT_GUE_PORT, mtu: int = _abi.Limits.DEFAULT_MTU,
                   cidr_vips: int = 0, decaps: int = 0) -> bytes:
    """struct lb_settings: next-hop MAC, outer source prefixes (host bits = flow-derived), GUE port, MTU,
    and how many entries lb_vip_cidrs and lb_decaps hold (0 spares other packets their lookups)."""
    s = _abi.Settings()
    ctypes.memmove(ctypes.addressof(s) + _abi.Settings.nexthop_mac.offset,
                   bytes.fromhex(nexthop_mac.replace(":", "")), 6)
    s.gue_port = socket.htons(gue_port)
    net4 = ipaddress.IPv4Network(src4, strict=False)
    net6 = ipaddress.IPv6Network(src6, strict=False)
    s.src4 = int.from_bytes(net4.network_address.packed, "little")
    s.src4_mask = int.from_bytes(net4.hostmask.packed, "little")
    s.src6 = u32x4(net6.network_address.packed)
    s.src6_mask = u32x4(net6.hostmask.packed)
    s.mtu = mtu
    s.configured = 1
    s.cidr_vips = cidr_vips
    s.decaps = decaps
    return bytes(s)


def real_bytes(address: str, flags: int = _abi.RealFlag.PRESENT) -> bytes:
    raw, fam = addr_words(address)
    return bytes(_abi.Real(addr=u32x4(raw), family=fam, flags=int(flags)))


def vip_entry(address: str, port: int, proto: str | int, vip_num: int, flags: int, encap: int
               ) -> tuple[bytes, bytes]:
    """lb_vips' key and value for a VIP."""
    meta = _abi.VipMeta(vip_num=vip_num, flags=int(flags), encap=int(encap))
    return vip_key(address, port, proto), bytes(meta)


def real_entry(real_id: int, address: str, flags: int = _abi.RealFlag.PRESENT) -> tuple[bytes, bytes]:
    """lb_reals' key and value for a real; id 0 is refused (it means 'no real')."""
    if real_id <= 0:
        raise DatapathError(f"store real {address} under id {real_id}", _errno.EINVAL,
                            "real id 0 is reserved for 'no real'")
    return real_id.to_bytes(4, "little"), real_bytes(address, flags)
