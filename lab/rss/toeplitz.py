"""A model of NIC receive-side scaling: the Toeplitz hash, the indirection table, and spread statistics.

A NIC that does RSS builds an input from each received packet's headers, hashes it with the
Toeplitz function under a 40-byte secret key, and uses the low bits of the hash to index an
indirection table (RETA) whose entries are receive queues. What goes into the input is the NIC's
"flow hash" setting (``ethtool -N <if> rx-flow-hash udp4 sd|sdfn``):

* ``"sd"``: source address, destination address (4 + 4 or 16 + 16 bytes);
* ``"sdfn"``: the same, then source port and destination port (2 + 2 bytes), all in network order.

Encapsulated traffic is hashed on its *outer* headers: IPIP has no ports the NIC parses, so it is
always ``"sd"``; GUE is UDP, hashed ``"sdfn"`` or ``"sd"`` depending on the NIC's setting.

Everything is vectorised over flows with numpy: the key is expanded once into a table of 256
32-bit values per input byte position, and a hash is the XOR of one table entry per byte.
The key defaults to the one Microsoft publishes with its verification vectors, which many NIC
drivers also use as their default.
"""

from __future__ import annotations

import ipaddress
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

__all__ = [
    "MICROSOFT_KEY",
    "RETA_SIZE",
    "Fields",
    "Flow",
    "Spread",
    "Toeplitz",
    "chi2_sf",
    "flow_input",
    "hash_flows",
    "indirection_table",
    "inputs_v4",
    "nic_input",
    "predict_queues",
    "queues_of",
    "spread",
    "toeplitz",
]

MICROSOFT_KEY = bytes.fromhex(
    "6d5a56da255b0ec24167253d43a38fb0d0ca2bcbae7b30b477cb2da38030f20c6a42b73bbeac01fa"
)
"""The 40-byte RSS key of Microsoft's "Verifying the RSS Hash Calculation" (and many NICs' default)."""

RETA_SIZE = 128
"""Entries in the indirection table of most NICs (the hash's low 7 bits index it)."""

Fields = Literal["sd", "sdfn"]
U32 = npt.NDArray[np.uint32]


@dataclass(frozen=True)
class Flow:
    """The headers a NIC hashes: source and destination address (same family) and ports."""

    src: str
    dst: str
    sport: int = 0
    dport: int = 0


@dataclass(frozen=True)
class Spread:
    """How evenly flows fell on queues: worst queue over the mean, and a chi-square uniformity test.

    ``p_value`` is the probability that a uniform random assignment of the same flows would look at
    least this uneven; a small value (say < 0.001) means the spread is not uniform.
    """

    max_over_mean: float
    chi2: float
    p_value: float
    counts: tuple[int, ...]

    def as_dict(self) -> dict[str, object]:
        """The fields as JSON-ready values, for results files."""
        return {
            "max_over_mean": self.max_over_mean,
            "chi2": self.chi2,
            "p_value": self.p_value,
            "counts": list(self.counts),
        }


class Toeplitz:
    """The Toeplitz hash under one key, expanded for inputs up to ``len(key) - 4`` bytes."""

    def __init__(self, key: bytes = MICROSOFT_KEY) -> None:
        if len(key) < 5:
            raise ValueError(f"an RSS key must be at least 5 bytes but got {len(key)}; use MICROSOFT_KEY")
        self.key = bytes(key)
        self.max_input = len(key) - 4
        nbits = 8 * len(key)
        k = int.from_bytes(key, "big")
        # windows[i]: the 32 key bits starting at input bit i (bit 0 = the first byte's MSB).
        windows = np.array(
            [(k >> (nbits - 32 - i)) & 0xFFFF_FFFF for i in range(8 * self.max_input)], dtype=np.uint32
        ).reshape(self.max_input, 8)
        values = np.arange(256, dtype=np.uint32)
        bits = (values[:, None] >> (7 - np.arange(8, dtype=np.uint32))[None, :]) & 1  # (256, 8)
        picked = np.where(bits[None, :, :] == 1, windows[:, None, :], np.uint32(0))  # (pos, 256, 8)
        self.table: U32 = np.bitwise_xor.reduce(picked, axis=2).astype(np.uint32)  # (pos, 256)

    def hash(self, inputs: npt.NDArray[np.uint8]) -> U32:
        """The hash of each row of ``inputs`` (shape (flows, bytes), all rows the same length)."""
        data = np.asarray(inputs, dtype=np.uint8)
        if data.ndim != 2:
            raise ValueError(f"inputs must be a 2-D array (flows, bytes) but has shape {data.shape}")
        if data.shape[1] > self.max_input:
            raise ValueError(
                f"inputs of {data.shape[1]} bytes are longer than this {len(self.key)}-byte key "
                f"can hash ({self.max_input}); use a longer key"
            )
        if data.shape[1] == 0:
            return np.zeros(data.shape[0], dtype=np.uint32)
        per_byte = self.table[np.arange(data.shape[1])[None, :], data]
        hashes: U32 = np.bitwise_xor.reduce(per_byte, axis=1).astype(np.uint32)
        return hashes

    def hash_bytes(self, data: bytes) -> int:
        """The hash of one input."""
        row = np.frombuffer(data, dtype=np.uint8)[None, :]
        return int(self.hash(row)[0])


def toeplitz(data: bytes, key: bytes = MICROSOFT_KEY) -> int:
    """The Toeplitz hash of ``data`` under ``key``, bit by bit (the reference for the table method)."""
    if len(data) + 4 > len(key):
        raise ValueError(f"{len(data)} bytes of input need a key of at least {len(data) + 4} bytes")
    k = int.from_bytes(key, "big")
    nbits = 8 * len(key)
    result = 0
    for i in range(8 * len(data)):
        if data[i // 8] & (0x80 >> (i % 8)):
            result ^= (k >> (nbits - 32 - i)) & 0xFFFF_FFFF
    return result


def flow_input(flow: Flow, fields: Fields = "sdfn") -> bytes:
    """The bytes a NIC hashes for ``flow``: addresses, then ports when ``fields`` is ``"sdfn"``."""
    src = ipaddress.ip_address(flow.src)
    dst = ipaddress.ip_address(flow.dst)
    if src.version != dst.version:
        raise ValueError(f"flow {flow.src} -> {flow.dst} mixes IPv4 and IPv6; a packet has one family")
    data = src.packed + dst.packed
    if fields == "sdfn":
        data += flow.sport.to_bytes(2, "big") + flow.dport.to_bytes(2, "big")
    elif fields != "sd":
        raise ValueError(f'fields must be "sd" or "sdfn" but got {fields!r}')
    return data


def nic_input(frame: bytes, fields: Fields = "sdfn") -> bytes:
    """The bytes an RSS NIC hashes for an Ethernet frame: its outer addresses, and its UDP ports when
    ``fields`` (the NIC's udp4/udp6 setting) is ``"sdfn"``.

    Any other protocol after the outer IP header (IPIP, 6in6, 4in6) is hashed on addresses only: a
    NIC does not look inside the tunnel. IPv6 extension headers are not followed (the LB writes none).
    """
    offset = 14
    ethertype = int.from_bytes(frame[12:14], "big")
    while ethertype in (0x8100, 0x88A8):  # VLAN tags
        ethertype = int.from_bytes(frame[offset + 2: offset + 4], "big")
        offset += 4
    if ethertype == 0x0800:
        ihl = (frame[offset] & 0x0F) * 4
        proto, data, l4 = frame[offset + 9], frame[offset + 12: offset + 20], offset + ihl
    elif ethertype == 0x86DD:
        proto, data, l4 = frame[offset + 6], frame[offset + 8: offset + 40], offset + 40
    else:
        raise ValueError(f"ethertype 0x{ethertype:04x} is neither IPv4 nor IPv6: an RSS NIC does not hash it")
    if fields not in ("sd", "sdfn"):
        raise ValueError(f'fields must be "sd" or "sdfn" but got {fields!r}')
    if proto == 17 and fields == "sdfn":
        data += frame[l4: l4 + 4]
    return bytes(data)


def inputs_v4(
    src: npt.ArrayLike,
    dst: npt.ArrayLike,
    sport: npt.ArrayLike = 0,
    dport: npt.ArrayLike = 0,
    fields: Fields = "sdfn",
) -> npt.NDArray[np.uint8]:
    """Hash inputs for IPv4 flows given as integer arrays (addresses as 32-bit host-order ints).

    The fast path for generated flows: no string parsing. Scalars broadcast against arrays.
    """
    s, d, sp, dp = np.broadcast_arrays(
        np.asarray(src, dtype=np.uint64),
        np.asarray(dst, dtype=np.uint64),
        np.asarray(sport, dtype=np.uint64),
        np.asarray(dport, dtype=np.uint64),
    )
    cols = [s.astype(">u4").view(np.uint8).reshape(-1, 4), d.astype(">u4").view(np.uint8).reshape(-1, 4)]
    if fields == "sdfn":
        cols += [
            sp.astype(">u2").view(np.uint8).reshape(-1, 2),
            dp.astype(">u2").view(np.uint8).reshape(-1, 2),
        ]
    elif fields != "sd":
        raise ValueError(f'fields must be "sd" or "sdfn" but got {fields!r}')
    return np.ascontiguousarray(np.concatenate(cols, axis=1))


def hash_flows(flows: Sequence[Flow], fields: Fields = "sdfn", key: bytes = MICROSOFT_KEY) -> U32:
    """The RSS hash of each flow (IPv4 and IPv6 may be mixed; each is hashed on its own input)."""
    hasher = _hasher(key)
    out = np.zeros(len(flows), dtype=np.uint32)
    rows = [flow_input(f, fields) for f in flows]
    for length in {len(r) for r in rows}:
        idx = [i for i, r in enumerate(rows) if len(r) == length]
        data = np.frombuffer(b"".join(rows[i] for i in idx), dtype=np.uint8).reshape(len(idx), length)
        out[idx] = hasher.hash(data)
    return out


def indirection_table(nqueues: int, size: int = RETA_SIZE) -> U32:
    """The default indirection table: entry ``i`` is queue ``i % nqueues`` (what drivers install)."""
    if nqueues < 1:
        raise ValueError(f"a NIC needs at least 1 receive queue but got {nqueues}")
    if size < 1 or size & (size - 1):
        raise ValueError(f"the indirection table size must be a power of two but got {size}; use {RETA_SIZE}")
    return (np.arange(size, dtype=np.uint32) % nqueues).astype(np.uint32)


def queues_of(hashes: npt.ArrayLike, table: npt.ArrayLike) -> U32:
    """The receive queue of each hash: the indirection table indexed by the hash's low bits."""
    reta = np.asarray(table, dtype=np.uint32)
    h = np.asarray(hashes, dtype=np.uint32)
    queues: U32 = reta[h & np.uint32(reta.size - 1)]
    return queues


def predict_queues(
    flows: Sequence[Flow],
    nqueues: int,
    fields: Fields = "sdfn",
    key: bytes = MICROSOFT_KEY,
    table: npt.ArrayLike | None = None,
) -> U32:
    """The queue each flow lands on at a NIC with ``nqueues`` queues (default round-robin table)."""
    reta = indirection_table(nqueues) if table is None else table
    return queues_of(hash_flows(flows, fields, key), reta)


def spread(queues: npt.ArrayLike, nqueues: int) -> Spread:
    """How evenly ``queues`` (one queue number per flow) cover ``nqueues`` queues."""
    q = np.asarray(queues, dtype=np.int64)
    if nqueues < 1:
        raise ValueError(f"nqueues must be at least 1 but got {nqueues}")
    if q.size == 0:
        raise ValueError("cannot judge the spread of zero flows; send at least one")
    if q.min() < 0 or q.max() >= nqueues:
        raise ValueError(f"queue numbers must be 0..{nqueues - 1} but got {q.min()}..{q.max()}")
    counts = np.bincount(q, minlength=nqueues)
    mean = q.size / nqueues
    chi2 = float(((counts - mean) ** 2).sum() / mean)
    p = chi2_sf(chi2, nqueues - 1) if nqueues > 1 else 1.0
    return Spread(
        max_over_mean=float(counts.max() / mean),
        chi2=chi2,
        p_value=p,
        counts=tuple(int(c) for c in counts),
    )


def chi2_sf(x: float, dof: int) -> float:
    """P(X ≥ x) for X chi-square distributed with ``dof`` degrees of freedom.

    This is the regularized upper incomplete gamma function Q(dof/2, x/2), computed by its power
    series when x/2 < dof/2 + 1 (then Q = 1 − P) and by its continued fraction otherwise.
    """
    if dof < 1:
        raise ValueError(f"degrees of freedom must be at least 1 but got {dof}")
    if x <= 0:
        return 1.0
    a = dof / 2.0
    z = x / 2.0
    log_prefix = a * math.log(z) - z - math.lgamma(a)
    if z < a + 1.0:
        # P(a, z) = z^a e^-z / Γ(a+1) · Σ z^n / ((a+1)…(a+n))
        term = 1.0 / a
        total = term
        n = 0
        while abs(term) > abs(total) * 1e-16 and n < 10_000:
            n += 1
            term *= z / (a + n)
            total += term
        return max(0.0, 1.0 - math.exp(log_prefix) * total)
    # Q(a, z) = z^a e^-z / Γ(a) · 1 / (z + 1 - a - 1·(1-a) / (z + 3 - a - 2·(2-a) / (z + 5 - a - …)))
    # evaluated with the modified Lentz method.
    tiny = 1e-300
    b = z + 1.0 - a
    c = 1.0 / tiny
    d = 1.0 / b
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1.0 / d
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-16:
            break
    return min(1.0, math.exp(log_prefix) * h)


_HASHERS: dict[bytes, Toeplitz] = {}


def _hasher(key: bytes) -> Toeplitz:
    """One expanded table per key, built on first use."""
    hasher = _HASHERS.get(key)
    if hasher is None:
        hasher = _HASHERS[key] = Toeplitz(key)
    return hasher
