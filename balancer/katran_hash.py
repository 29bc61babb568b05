"""Katran's flow hash and Maglev rings, modelled so that an l4lab node picks the real a Katran node picks.

Written from Katran's sources (github.com/facebookincubator/katran: katran/lib/bpf/balancer.bpf.c
``get_packet_hash``, katran/lib/linux_includes/jhash.h, katran/lib/MaglevBase.cpp, MaglevHash.cpp,
MaglevHashV2.cpp, Vip.cpp, KatranLb.cpp) and folly's (``IPAddressV4::hash``, ``IPAddressV6::hash``,
folly/hash/Hash.h, FnvHash.h, SpookyHashV2.cpp); no code is copied. The facts:

* **Flow hash** (datapath): IPv4 ``jhash_2words(src, ports, seed4)``, IPv6
  ``jhash_2words(jhash(src, 16, seed6), ports, seed4)``, where ``src`` words and ``ports`` are the
  packet's bytes read as little-endian 32-bit words (``ports``: the source port's two bytes, then the
  destination port's). A packet that matched no VIP of its own address and port (a VIP of port 0,
  every port, or a CIDR VIP, whatever its port) has its destination port zeroed unless that VIP has
  ``F_HASH_SRC_DST_PORT`` or ``F_HASH_DPORT_ONLY``; ``F_HASH_NO_SRC_PORT``
  zeroes the source port; ``F_HASH_DPORT_ONLY`` puts the destination port in the source port's
  place and zeroes the source address. The seeds are Katran's build constants: seed4 = MAX_VIPS ×
  RING_SIZE, seed6 = MAX_VIPS (512 and 65537 by default). The destination address and the
  protocol are not hashed. The slot is ``hash % size``.
* **A real's hash** (control plane): folly's ``IPAddress::hash()`` of the real's address. IPv4:
  ``hash_128_to_64(AF_INET, fnv32(4 address bytes))`` (folly's FNV-1 whose bytes are sign-extended);
  IPv6: ``hash_128_to_64(AF_INET6, hash_128_to_64(h1, h2))`` with (h1, h2) SpookyHash V2 of the 16
  bytes, seeds 0; an IPv4-mapped IPv6 address hashes as its IPv4 address.
* **Permutation**: offset = MurmurHash3_x64_64(hash, 42, seed 0) % size, skip =
  MurmurHash3_x64_64(hash, 2718281828, seed 2307) % (size − 1) + 1.
* **Ring**: reals of weight 0 are left out; the others are sorted by their hash and take turns
  taking the next free slot of their permutation. V1 (``HashFunction::Maglev``, Katran's default):
  in the first round a real takes as many turns in a row as its weight, then one turn per round for
  everyone, so a weight is only a head start: 1:10 gives about 1:1 (docs/architecture.md). V2
  (``MaglevV2``): in every round each real adds its weight to a credit and takes a turn when the
  credit reaches the largest weight (then pays it), so slots follow weights in proportion. One real
  owns every slot.

:func:`flow_hash` and :func:`build_ring` are what the datapath's Katran mode (bpf/include/katran_hash.h,
``LB_VIP_HASH_KATRAN``) and the controller use; the rest is exposed for tests that check each step
against Katran's vectors (``../shared/conformance/katran/maglev_vectors.json``).
"""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Literal, get_args

import numpy as np
import numpy.typing as npt

from balancer import maglev

__all__ = [
    "DEFAULT_MAX_VIPS",
    "DEFAULT_RING_SIZE",
    "RING_KINDS",
    "KATRAN_FLAGS",
    "FlowFields",
    "RingKind",
    "Seeds",
    "build_ring",
    "fields_of",
    "flow_hash",
    "jhash",
    "jhash_2words",
    "murmur3_x64_64",
    "permutation",
    "real_hash",
    "ring_slot",
    "turns",
]

M32: Final = 0xFFFF_FFFF
M64: Final = 0xFFFF_FFFF_FFFF_FFFF
DEFAULT_MAX_VIPS: Final = 512  # MAX_VIPS of Katran's balancer_consts.h
DEFAULT_RING_SIZE: Final = 65537  # RING_SIZE there, and KatranConfig's chRingSize
JHASH_INITVAL: Final = 0xDEADBEEF
AF_INET: Final = 2  # Linux's, as folly hashes it
AF_INET6: Final = 10

RingKind = Literal["v1", "v2"]
RING_KINDS: Final[tuple[RingKind, ...]] = get_args(RingKind)


@dataclass(frozen=True)
class Seeds:
    """The flow hash's seeds, from the Katran build's MAX_VIPS and ring size."""

    max_vips: int = DEFAULT_MAX_VIPS
    ring_size: int = DEFAULT_RING_SIZE

    @property
    def v4(self) -> int:
        """INIT_JHASH_SEED = CH_RINGS_SIZE = MAX_VIPS × RING_SIZE (32-bit)."""
        return (self.max_vips * self.ring_size) & M32

    @property
    def v6(self) -> int:
        """INIT_JHASH_SEED_V6 = MAX_VIPS."""
        return self.max_vips & M32


@dataclass(frozen=True)
class FlowFields:
    """Which fields Katran's flow hash reads, from the VIP's port and its flags that change hashing."""

    no_sport: bool = False  # F_HASH_NO_SRC_PORT
    dport_only: bool = False  # F_HASH_DPORT_ONLY
    zero_dport: bool = False  # a port-0 or CIDR VIP without F_HASH_SRC_DST_PORT or F_HASH_DPORT_ONLY


# ---------------------------------------------------------------------------------------- jhash (lookup3)


def _rol32(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & M32


def _fold(x: int, y: int, r: int) -> int:
    """One step of lookup3's final mix: x ^= y, x -= y <<< r."""
    return ((x ^ y) - _rol32(y, r)) & M32


def _final(a: int, b: int, c: int) -> int:
    """Jenkins' final mix of (a, b, c); returns c."""
    c = _fold(c, b, 14)
    a = _fold(a, c, 11)
    b = _fold(b, a, 25)
    c = _fold(c, b, 16)
    a = _fold(a, c, 4)
    b = _fold(b, a, 14)
    return _fold(c, b, 24)


def _mix(a: int, b: int, c: int) -> tuple[int, int, int]:
    """lookup3's mix: six steps x -= z, x ^= z <<< r, z += y over (a, b, c) rotated."""
    v = [a, b, c]
    for i, r in enumerate((4, 6, 8, 16, 19, 4)):
        x, y, z = i % 3, (i + 1) % 3, (i + 2) % 3
        v[x] = ((v[x] - v[z]) & M32) ^ _rol32(v[z], r)
        v[z] = (v[z] + v[y]) & M32
    return v[0], v[1], v[2]


def jhash(key: bytes, initval: int) -> int:
    """The Linux kernel's jhash() of ``key`` (words read little-endian), as Katran's BPF uses it."""
    a = b = c = (JHASH_INITVAL + len(key) + initval) & M32
    rest = key
    while len(rest) > 12:
        a = (a + int.from_bytes(rest[0:4], "little")) & M32
        b = (b + int.from_bytes(rest[4:8], "little")) & M32
        c = (c + int.from_bytes(rest[8:12], "little")) & M32
        a, b, c = _mix(a, b, c)
        rest = rest[12:]
    if not rest:
        return c
    tail = rest.ljust(12, b"\0")
    a = (a + int.from_bytes(tail[0:4], "little")) & M32
    b = (b + int.from_bytes(tail[4:8], "little")) & M32
    c = (c + int.from_bytes(tail[8:12], "little")) & M32
    return _final(a, b, c)


def jhash_2words(a: int, b: int, initval: int) -> int:
    """The kernel's jhash_2words(a, b, initval)."""
    seed = (initval + JHASH_INITVAL + 8) & M32
    return _final((a + seed) & M32, (b + seed) & M32, seed)


# ------------------------------------------------------------------------------------------ flow hash


DEFAULT_FIELDS: Final = FlowFields()
DEFAULT_SEEDS: Final = Seeds()


KATRAN_FLAGS: Final = {"katran": 0, "katran-no-sport": 1, "katran-dport-only": 8, "katran-src-dst-port": 128}
"""A config's katran hash and the Katran VIP flag it stands for (F_HASH_NO_SRC_PORT, F_HASH_DPORT_ONLY,
F_HASH_SRC_DST_PORT; balancer_consts.h)."""


def fields_of(hash_name: str, vip_port: int, prefix: bool = False) -> FlowFields:
    """The fields a VIP of port ``vip_port`` (0: every port) with a config's katran hash (a key of
    KATRAN_FLAGS) hashes; ``prefix``: the VIP is a prefix (Katran's CIDR VIPs are found only after the
    exact lookup failed, so their flows lose the destination port as a port-0 VIP's do: fixture #43)."""
    if hash_name not in KATRAN_FLAGS:
        raise ValueError(f"{hash_name!r} is not a katran hash; use one of {', '.join(KATRAN_FLAGS)}")
    keeps_dport = hash_name in ("katran-dport-only", "katran-src-dst-port")
    return FlowFields(no_sport=hash_name == "katran-no-sport", dport_only=hash_name == "katran-dport-only",
                      zero_dport=(vip_port == 0 or prefix) and not keeps_dport)


def flow_hash(src: str | ipaddress.IPv4Address | ipaddress.IPv6Address, sport: int, dport: int,
              fields: FlowFields = DEFAULT_FIELDS, seeds: Seeds = DEFAULT_SEEDS) -> int:
    """Katran's flow hash of a packet from ``src``:``sport`` to a VIP's ``dport`` (32 bits)."""
    addr = ipaddress.ip_address(src)
    packed = addr.packed
    if fields.dport_only:
        packed, sport = bytes(len(packed)), dport
    else:
        if fields.zero_dport:
            dport = 0
        if fields.no_sport:
            sport = 0
    ports = int.from_bytes(sport.to_bytes(2, "big") + dport.to_bytes(2, "big"), "little")
    if addr.version == 4:
        return jhash_2words(int.from_bytes(packed, "little"), ports, seeds.v4)
    return jhash_2words(jhash(packed, seeds.v6), ports, seeds.v4)


def ring_slot(hash32: int, size: int = DEFAULT_RING_SIZE) -> int:
    """The slot Katran reads: hash % size (l4lab's own mode reads hash × size >> 32)."""
    return hash32 % size


# ------------------------------------------------------------------------------------- a real's hash


def _fnv32_folly(data: bytes) -> int:
    """folly's fnv32_buf: FNV-1 from 2166136261, each byte sign-extended before the XOR."""
    h = 2166136261
    for byte in data:
        h = (h * 16777619) & M32
        h ^= (byte - 256 if byte >= 128 else byte) & M32
    return h


def _hash_128_to_64(upper: int, lower: int) -> int:
    """folly's hash_128_to_64 (CityHash's Hash128to64)."""
    mul = 0x9DDFEA08EB382D69
    a = ((lower ^ upper) * mul) & M64
    a ^= a >> 47
    b = ((upper ^ a) * mul) & M64
    b ^= b >> 47
    return (b * mul) & M64


def _rot64(x: int, k: int) -> int:
    return ((x << k) | (x >> (64 - k))) & M64


def _spooky_short_16(data: bytes) -> tuple[int, int]:
    """SpookyHash V2's Hash128 of exactly 16 bytes with seeds 0 (its short path: one ShortMix, ShortEnd)."""
    const = 0xDEADBEEFDEADBEEF
    h = [0, 0, (const + int.from_bytes(data[0:8], "little")) & M64,
         (const + int.from_bytes(data[8:16], "little")) & M64]
    h = _short_mix(h)
    h[3] = (h[3] + (16 << 56)) & M64
    h[2] = (h[2] + const) & M64
    h[3] = (h[3] + const) & M64
    h = _short_end(h)
    return h[0], h[1]


def _short_mix(h: list[int]) -> list[int]:
    """SpookyHash V2's ShortMix: twelve steps; step i rotates h[(i + 2) % 4], adds h[(i + 3) % 4] to
    it and XORs it into h[i % 4]."""
    v = list(h)
    for i, rot in enumerate((50, 52, 30, 41, 54, 48, 38, 37, 62, 34, 5, 36)):
        j = (i + 2) % 4
        v[j] = (_rot64(v[j], rot) + v[(i + 3) % 4]) & M64
        v[i % 4] ^= v[j]
    return v


def _short_end(h: list[int]) -> list[int]:
    """SpookyHash V2's ShortEnd: eleven steps; step i XORs h[(i + 2) % 4] into h[(i + 3) % 4], rotates
    the former and adds it to the latter."""
    v = list(h)
    for i, rot in enumerate((15, 52, 26, 51, 28, 9, 47, 54, 32, 25, 63)):
        dst, src = (i + 3) % 4, (i + 2) % 4
        v[dst] ^= v[src]
        v[src] = _rot64(v[src], rot)
        v[dst] = (v[dst] + v[src]) & M64
    return v


@functools.lru_cache(maxsize=4096)
def real_hash(address: str) -> int:
    """folly's IPAddress::hash() of a real's address: the 64-bit value Katran sorts and permutes reals by."""
    addr = ipaddress.ip_address(address)
    if addr.version == 6 and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    if addr.version == 4:
        return _hash_128_to_64(AF_INET, _fnv32_folly(addr.packed))
    h1, h2 = _spooky_short_16(addr.packed)
    return _hash_128_to_64(AF_INET6, _hash_128_to_64(h1, h2))


# ------------------------------------------------------------------------------------ Maglev (Katran)


def murmur3_x64_64(a: int, b: int, seed: int) -> int:
    """Katran's MurmurHash3_x64_64 of the two 64-bit words (a, b): one block of MurmurHash3 x64-128,
    its finalisation, and h1 + h2."""
    c1, c2 = 0x87C37B91114253D5, 0x4CF5AD432745937F
    h1 = h2 = seed & M64
    k1 = _rot64((a * c1) & M64, 31) * c2 & M64
    h1 ^= k1
    h1 = (_rot64(h1, 27) + h2) & M64
    h1 = (h1 * 5 + 0x52DCE729) & M64
    k2 = _rot64((b * c2) & M64, 33) * c1 & M64
    h2 ^= k2
    h2 = (_rot64(h2, 31) + h1) & M64
    h2 = (h2 * 5 + 0x38495AB5) & M64
    h1 ^= 16
    h2 ^= 16
    h1 = (h1 + h2) & M64
    h2 = (h2 + h1) & M64
    h1, h2 = _fmix64(h1), _fmix64(h2)
    return (h1 + h2) & M64


def _fmix64(k: int) -> int:
    k ^= k >> 33
    k = (k * 0xFF51AFD7ED558CCD) & M64
    k ^= k >> 33
    k = (k * 0xC4CEB9FE1A85EC53) & M64
    return k ^ (k >> 33)


def permutation(address: str, size: int = DEFAULT_RING_SIZE) -> tuple[int, int]:
    """(offset, skip) of the real at ``address`` in a Katran ring of ``size`` slots."""
    h = real_hash(address)
    offset = murmur3_x64_64(h, 42, 0) % size
    skip = murmur3_x64_64(h, 2718281828, 2307) % (size - 1) + 1
    return offset, skip


def turns(weights: Sequence[int], size: int, kind: RingKind) -> npt.NDArray[np.int64]:
    """The order in which the reals (indexes into ``weights``, all > 0, sorted by hash) take slots."""
    w = np.asarray(weights, dtype=np.int64)
    n = len(w)
    if kind == "v1":
        # First round: real i, weight w_i turns in a row; then rounds of one turn each, in order.
        first = np.repeat(np.arange(n, dtype=np.int64), w)
        rest = np.resize(np.arange(n, dtype=np.int64), max(0, size - first.size))
        return np.concatenate([first, rest])[:size]
    # V2: real i's k-th turn (k >= 1) falls in round ceil(k * max / w_i); within a round, in order.
    top = int(w.max())
    rounds = _rounds_for(w, top, size)
    counts = rounds * w // top
    who = np.repeat(np.arange(n, dtype=np.int64), counts)
    k = np.arange(who.size, dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts) + 1
    when = -(-(k * top) // w[who])
    return np.asarray(who[np.lexsort((who, when))][:size], dtype=np.int64)


def _rounds_for(w: npt.NDArray[np.int64], top: int, size: int) -> int:
    """The fewest V2 rounds in which the reals take at least ``size`` turns."""
    lo, hi = 1, -(-(size + w.size) * top // int(w.sum()))  # Σ⌊R·wᵢ/top⌋ > R·Σw/top − n
    while lo < hi:
        mid = (lo + hi) // 2
        if int((mid * w // top).sum()) >= size:
            hi = mid
        else:
            lo = mid + 1
    return lo


def build_ring(reals: Sequence[maglev.Backend], size: int = DEFAULT_RING_SIZE, kind: RingKind = "v1") -> maglev.Ring:
    """Katran's ring of ``size`` slots for ``reals`` (ids, addresses, weights): each slot a real id,
    or ``maglev.NO_REAL`` everywhere when no real has a weight (Katran would keep its old ring)."""
    if kind not in RING_KINDS:
        raise ValueError(f"Katran ring kind must be one of {', '.join(RING_KINDS)} but got {kind!r}")
    ring: maglev.Ring = np.full(size, maglev.NO_REAL, dtype=np.uint32)
    live = [b for b in reals if b.weight > 0]
    if not live:
        return ring
    live.sort(key=lambda b: (real_hash(b.address), b.address))
    owner = _owners(tuple((b.address, b.weight) for b in live), size, kind)
    ring[:] = np.array([b.real_id for b in live], dtype=np.uint32)[owner]
    return ring


@functools.lru_cache(maxsize=32)
def _owners(live: tuple[tuple[str, int], ...], size: int, kind: RingKind) -> npt.NDArray[np.int64]:
    """For each slot, the index into ``live`` (sorted by hash) of its owner; cached like maglev's."""
    if len(live) == 1:
        return np.zeros(size, dtype=np.int64)
    perms = [permutation(address, size) for address, _ in live]
    order = turns([w for _, w in live], size, kind)
    owner = maglev.fill(size, [p[0] for p in perms], [p[1] for p in perms], order)
    owner.flags.writeable = False
    return owner
