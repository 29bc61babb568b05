"""Maglev consistent-hashing rings with weights honoured in proportion (Eisenbud et al., NSDI'16).

A ring is a prime-sized array of real ids; the datapath indexes it with the flow hash modulo its
size. Three properties matter and each is tested:

* **Proportional weights.** A real of weight ``w`` owns ``w / Σw`` of the ring, to within one
  slot. The slot counts are fixed first by largest-remainder apportionment (each real gets the floor
  of its exact share, and the slots left over go to the largest remainders), then the reals take
  turns in proportion to weight: real *i*'s *k*-th turn falls at virtual time ``(k + ½) / wᵢ`` and
  turns are played in time order, so a real of weight 10 picks ten slots for every one a real of
  weight 1 picks. On its turn a real takes the next slot of its own permutation that is still
  free, exactly as in Maglev, which keeps disruption near minimal when the set of reals changes.
  Katran's default ring instead uses weights only as a first-round head start (1:10 gives 1:1).
* **Determinism from the set of (address, weight) alone.** Each real's permutation is derived from
  its address bytes (IPv4: 4 bytes, IPv6: 16 bytes) by BLAKE2b (``hashlib.blake2b``, 16-byte
  digest, personalisation ``b"l4lab-maglev"``): the first 8 bytes little-endian modulo the ring size
  give the offset, the next 8 bytes modulo ``size - 1`` plus one give the skip. Ties are broken
  by address order (IPv4 before IPv6, then by bytes). Insertion order and real ids never matter:
  ids are only the labels written into the slots, so every LB node builds the same ring.
* **Drain and empty.** A real of weight 0 owns no slot; with no reals, or all weights 0, every
  slot holds ``NO_REAL`` (0), which the datapath counts as a drop with reason "no real".

The hash, the quotas and the turn schedule are computed with numpy; the fill itself is inherently
sequential (each pick depends on the previous ones): it runs in C (balancer/native/maglev_fill.c,
built by `make native`, about 1 ms for 65537 slots) or, without the library, as a tight Python
loop (about 0.05 s) that gives the same ring. The fill is cached per (address, weight) set and
ring size, so VIPs that share their reals share one fill.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import ipaddress
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from balancer import _abi, objects
from balancer.errors import RingError

__all__ = [
    "DEFAULT_RING_SIZE",
    "MAX_WEIGHT",
    "NO_REAL",
    "Backend",
    "Ring",
    "build_ring",
    "clear_cache",
    "fill",
    "is_prime",
    "permutation",
    "quotas",
    "ring_diff",
    "slot_counts",
]

DEFAULT_RING_SIZE = int(_abi.Limits.DEFAULT_RING_SIZE)
"""The default ring size (prime): the datapath's ``LB_DEFAULT_RING_SIZE``, read from the ABI."""

NO_REAL = 0
"""The id written into slots that no real owns; real ids given by callers start at 1."""

MAX_WEIGHT = 65535
"""The largest weight accepted (weights are 16-bit in the config and the CLI)."""

MAX_REAL_ID = 0xFFFF_FFFF
_PERSON = b"l4lab-maglev"

Ring = npt.NDArray[np.uint32]
"""A ring as built and as written to the datapath: one real id (or NO_REAL) per slot."""


@dataclass(frozen=True)
class Backend:
    """One real as the ring sees it: the id written into its slots, its address and its weight."""

    real_id: int
    address: str
    weight: int = 1


def is_prime(n: int) -> bool:
    """Whether ``n`` is prime (deterministic trial division; ring sizes are at most a few million)."""
    if n < 2:
        return False
    if n % 2 == 0:
        return n == 2
    f = 3
    while f * f <= n:
        if n % f == 0:
            return False
        f += 2
    return True


def permutation(address: str, size: int = DEFAULT_RING_SIZE) -> tuple[int, int]:
    """The (offset, skip) of the real at ``address`` in a ring of ``size`` slots.

    Slot ``j`` of the real's preference list is ``(offset + j * skip) % size``; with a prime size
    and ``1 <= skip < size`` the list visits every slot once.
    """
    _check_size(size)
    digest = hashlib.blake2b(_packed(address), digest_size=16, person=_PERSON).digest()
    offset = int.from_bytes(digest[:8], "little") % size
    skip = int.from_bytes(digest[8:], "little") % (size - 1) + 1
    return offset, skip


def quotas(weights: npt.ArrayLike, size: int = DEFAULT_RING_SIZE) -> npt.NDArray[np.int64]:
    """Slots each weight is entitled to: largest-remainder apportionment of ``size`` slots.

    Each quota is the floor or the ceiling of ``w * size / Σw``; the slots left after the floors go
    to the largest remainders, earlier positions first on equal remainders. All zero → all zero.
    """
    w = np.asarray(weights, dtype=np.int64)
    total = int(w.sum())
    if total == 0:
        return np.zeros(w.shape, dtype=np.int64)
    exact = w * size
    base = exact // total
    remainder = exact % total
    left = size - int(base.sum())
    # Largest remainder first; on equal remainders the earlier position (lower address) wins.
    order = np.lexsort((np.arange(w.size), -remainder))
    base[order[:left]] += 1
    return base


def build_ring(
    reals: Mapping[int, tuple[str, int]] | Sequence[Backend],
    size: int = DEFAULT_RING_SIZE,
) -> Ring:
    """Build the Maglev ring of ``size`` slots (prime) holding the ids of ``reals``.

    ``reals`` is either ``{real_id: (address, weight)}`` or a sequence of :class:`Backend`. Real ids
    are 1..2³²−1 and distinct; addresses are IPv4 or IPv6 and distinct; weights are 0..65535.
    The result depends only on the set of (address, weight) pairs, labelled by the ids.
    """
    _check_size(size)
    backends = _backends(reals)
    live = [b for b in backends if b.weight > 0]
    ring: Ring = np.full(size, NO_REAL, dtype=np.uint32)
    if not live:
        return ring
    live.sort(key=lambda b: _sort_key(b.address))
    owner = _owners(tuple((b.address, b.weight) for b in live), size)
    ids = np.array([b.real_id for b in live], dtype=np.uint32)
    ring[:] = ids[owner]
    return ring


def clear_cache() -> None:
    """Forget the cached fills (benchmarks time the fill itself)."""
    _owners.cache_clear()


@functools.lru_cache(maxsize=32)
def _owners(live: tuple[tuple[str, int], ...], size: int) -> npt.NDArray[np.int64]:
    """For each slot, the index into `live` (address order, weights > 0) of the real that owns it.

    Cached: a ring depends only on its (address, weight) set, and the VIPs of a config usually
    share one set of reals, so an apply of many VIPs fills one ring, not one per VIP."""
    weights = np.array([w for _, w in live], dtype=np.int64)
    counts = quotas(weights, size)

    # The turn schedule: real i's k-th turn at virtual time (k + 1/2) / w_i, address order on ties.
    who = np.repeat(np.arange(len(live), dtype=np.int64), counts)
    starts = np.cumsum(counts) - counts
    k = np.arange(size, dtype=np.int64) - np.repeat(starts, counts)
    when = (2 * k + 1) / (2.0 * weights[who])
    turns = who[np.lexsort((who, when))]

    perms = [permutation(address, size) for address, _ in live]
    owner = fill(size, [p[0] for p in perms], [p[1] for p in perms], turns)
    owner.flags.writeable = False
    return owner


NATIVE_LIB_NAME = "libl4lab_maglev.so"


@functools.cache
def _native() -> Any:
    """The C fill (balancer/native/maglev_fill.c, built by `make native` or `pip install .`), or None.

    Found like the BPF objects (balancer/objects.py: $L4LAB_BUILD_DIR/lib, the package, build/lib).
    """
    path = objects.locate(NATIVE_LIB_NAME, "lib")
    if os.environ.get("L4LAB_MAGLEV_PYTHON") or path is None:
        return None
    try:
        lib = ctypes.CDLL(str(path))
    except OSError:
        return None
    fn = lib.l4lab_maglev_fill
    fn.argtypes = [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                   ctypes.c_void_p]
    fn.restype = ctypes.c_int
    return fn


def fill(size: int, offsets: list[int], skips: list[int], turns: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Play ``turns``: on each, that real takes the next still-free slot of its permutation
    (``offsets[i] + j * skips[i]``, j counting up); for each slot, the index of the real that took it.

    In C when the library is built (about 1 ms for 65537 slots), else in Python (tens of ms);
    both give the same ring, slot for slot."""
    if len(turns) != size or (size and not 0 <= int(np.min(turns)) <= int(np.max(turns)) < len(offsets)):
        raise RingError(f"a fill of {size} slots needs {size} turns, each naming one of {len(offsets)} reals")
    fn = _native()
    if fn is None:
        return np.asarray(_fill_python(size, offsets, skips, [int(t) for t in turns]), dtype=np.int64)
    off = np.ascontiguousarray(offsets, dtype=np.uint64)
    skp = np.ascontiguousarray(skips, dtype=np.uint64)
    trn = np.ascontiguousarray(turns, dtype=np.int64)
    owner = np.empty(size, dtype=np.int64)
    if fn(size, len(offsets), off.ctypes.data, skp.ctypes.data, trn.ctypes.data, owner.ctypes.data) != 0:
        raise RingError(f"cannot fill a ring of {size} slots: out of memory")
    return owner


def ring_diff(old: Ring, new: Ring) -> tuple[npt.NDArray[np.uint32], npt.NDArray[np.uint32]]:
    """The slots where ``new`` differs from ``old``: (indexes, new values), for writing only those."""
    if old.shape != new.shape:
        raise RingError(
            f"cannot diff rings of {old.size} and {new.size} slots; "
            "rebuild the whole ring when the ring size changes"
        )
    indexes = np.flatnonzero(old != new).astype(np.uint32)
    return indexes, new[indexes].astype(np.uint32)


def slot_counts(ring: Ring) -> dict[int, int]:
    """How many slots each id owns in ``ring`` (``NO_REAL`` included when present)."""
    ids, counts = np.unique(ring, return_counts=True)
    return {int(i): int(c) for i, c in zip(ids, counts, strict=True)}


def _fill_python(size: int, offsets: list[int], skips: list[int], turns: list[int]) -> list[int]:
    """fill() in Python: the reference the C fill is tested against, and the fallback without it."""
    taken = bytearray(size)
    owner = [0] * size
    pos = list(offsets)
    for b in turns:
        s = pos[b]
        skip = skips[b]
        while taken[s]:
            s += skip
            if s >= size:
                s -= size
        taken[s] = 1
        owner[s] = b
        s += skip
        if s >= size:
            s -= size
        pos[b] = s
    return owner


def _check_size(size: int) -> None:
    if isinstance(size, bool) or not isinstance(size, int) or not is_prime(size):
        raise RingError(
            f"ring size must be a prime number but got {size!r}; use a prime such as {_near_prime(size)}"
        )


def _near_prime(n: object) -> int:
    """The first prime at or above ``n``, or the default size when ``n`` is not a usable number."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 3:
        return DEFAULT_RING_SIZE
    while not is_prime(n):
        n += 1
    return n


def _packed(address: str) -> bytes:
    try:
        return ipaddress.ip_address(address).packed
    except ValueError as e:
        raise RingError(f"real address {address!r} is not an IPv4 or IPv6 address; fix the address") from e


def _sort_key(address: str) -> tuple[int, bytes]:
    packed = _packed(address)
    return len(packed), packed


def _backends(reals: Mapping[int, tuple[str, int]] | Sequence[Backend]) -> list[Backend]:
    """Normalise and validate the caller's reals."""
    if isinstance(reals, Mapping):
        items = [Backend(real_id, addr, weight) for real_id, (addr, weight) in reals.items()]
    else:
        items = list(reals)
    seen_ids: set[int] = set()
    seen_addrs: dict[bytes, str] = {}
    for b in items:
        if isinstance(b.real_id, bool) or not isinstance(b.real_id, int) or not 1 <= b.real_id <= MAX_REAL_ID:
            raise RingError(
                f"real {b.address}: id must be 1..{MAX_REAL_ID} but got {b.real_id!r}; "
                f"id {NO_REAL} means 'no real'"
            )
        if b.real_id in seen_ids:
            raise RingError(f"real id {b.real_id} is given to two reals; give each real its own id")
        seen_ids.add(b.real_id)
        if isinstance(b.weight, bool) or not isinstance(b.weight, int) or not 0 <= b.weight <= MAX_WEIGHT:
            raise RingError(f"real {b.address}: weight must be 0..{MAX_WEIGHT} but got {b.weight!r}")
        packed = _packed(b.address)
        if packed in seen_addrs:
            raise RingError(
                f"real address {b.address} appears twice (as {seen_addrs[packed]} too); "
                "list each real once"
            )
        seen_addrs[packed] = b.address
    return items
