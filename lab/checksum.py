"""checksum.py: the Internet checksum (RFC 1071), for frames the lab builds by hand."""

from __future__ import annotations

import struct


def inet_checksum(data: bytes) -> int:
    """The ones'-complement sum of 16-bit words, complemented (an odd length is zero-padded)."""
    if len(data) % 2:
        data += b"\0"
    total: int = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF
