"""Protocol-buffer style varints with zig-zag signs, as Kafka's v2 records use them.

Decoders take ``(buf, pos)`` and return ``(value, new_pos)`` so a caller walking a records blob
never slices it; the one-byte case is tested first because almost every length and delta in a
real batch fits one byte.
"""
from __future__ import annotations

from ..errors import CorruptRecordError


def wrap_int64(n: int) -> int:
    """Two's-complement wrap to a Java long: Kafka computes timestamp deltas in long arithmetic."""
    return ((n + 2**63) % 2**64) - 2**63


def encode_varint(n: int) -> bytes:
    """Signed (zig-zag) varint; Kafka's ``writeVarint``/``writeVarlong``."""
    v = ((n << 1) ^ (n >> 63)) & 0xFFFFFFFFFFFFFFFF
    if v < 0x80:
        return bytes((v,))
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def decode_varint(buf, pos: int, limit: int | None = None) -> tuple[int, int]:
    """Decode a zig-zag varint (at most 10 bytes, like Kafka's varlong)."""
    b = buf[pos]
    if b < 0x80:
        return (b >> 1) ^ -(b & 1), pos + 1
    result = b & 0x7F
    shift = 7
    pos += 1
    end = len(buf) if limit is None else limit
    while True:
        if pos >= end:
            raise CorruptRecordError("varint runs past the end of its buffer")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            break
        shift += 7
        if shift > 63:
            raise CorruptRecordError("varint longer than 10 bytes")
    return (result >> 1) ^ -(result & 1), pos
