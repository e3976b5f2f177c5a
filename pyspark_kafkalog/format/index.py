"""Kafka's segment index files: ``.index``, ``.timeindex`` and ``.txnindex``.

Pure functions (bytes in, bytes out). Offsets and time indexes are decoded to numpy arrays because a
segment's index is read whole and searched many times; the per-entry Python objects would cost more
than the search. Layouts and rules follow Kafka's ``OffsetIndex``, ``TimeIndex``, ``AbstractIndex``,
``TransactionIndex`` and ``AbortedTxn`` (storage module), all big-endian:

* ``.index``: ``relative_offset int32 | position int32`` (8 bytes)
* ``.timeindex``: ``timestamp int64 | relative_offset int32`` (12 bytes)
* ``.txnindex``: ``version int16 | producer_id int64 | first_offset int64 | last_offset int64 |
  last_stable_offset int64`` (34 bytes)

Relative offsets are ``offset - base_offset`` and must lie in ``[0, 2**31 - 1]``: that is the range
Kafka's ``AbstractIndex`` accepts, and why a segment cannot span more than 2**31 offsets.

Indexes are derived data. Malformed bytes raise :class:`CorruptIndexError`, whose remedy is to
rebuild the index from the ``.log``. After an unclean broker shutdown the active segment's index
files are still pre-allocated (zero-filled past the last entry); those zeros are not valid entries,
so they fail the decode checks here, and Kafka rebuilds such indexes during recovery too.
"""
from __future__ import annotations

import operator
import struct
from typing import Iterable, NamedTuple, Optional

import numpy as np

from ..errors import (CorruptIndexError, InvalidRecordError, InvalidRequestError,
                      LogSegmentOffsetOverflowError, UnsupportedVersionError)

OFFSET_ENTRY_SIZE = 8
TIME_ENTRY_SIZE = 12
TXN_ENTRY_SIZE = 34
TXN_INDEX_VERSION = 0
#: Kafka's RecordBatch.NO_TIMESTAMP: what a time lookup answers when no entry qualifies.
NO_TIMESTAMP = -1

_INT32_MAX = 2**31 - 1
_INT64_MIN, _INT64_MAX = -2**63, 2**63 - 1

# Packed (align=False) structured dtypes map one-to-one onto the on-disk entries.
_OFFSET_DTYPE = np.dtype([("rel", ">i4"), ("pos", ">i4")])
_TIME_DTYPE = np.dtype([("ts", ">i8"), ("rel", ">i4")])
_TXN_DTYPE = np.dtype([("version", ">i2"), ("producer_id", ">i8"), ("first_offset", ">i8"),
                       ("last_offset", ">i8"), ("last_stable_offset", ">i8")])
assert _OFFSET_DTYPE.itemsize == OFFSET_ENTRY_SIZE and _TIME_DTYPE.itemsize == TIME_ENTRY_SIZE
assert _TXN_DTYPE.itemsize == TXN_ENTRY_SIZE
_TXN_STRUCT = struct.Struct(">hqqqq")


class AbortedTxn(NamedTuple):
    """One ``.txnindex`` entry: a transaction aborted by a marker in this segment."""

    version: int
    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int

    @classmethod
    def create(cls, producer_id: int, first_offset: int, last_offset: int,
               last_stable_offset: int) -> "AbortedTxn":
        """Build an entry at the only version Kafka writes, so callers need not spell it."""
        return cls(TXN_INDEX_VERSION, producer_id, first_offset, last_offset, last_stable_offset)


# -- shared checks -----------------------------------------------------------------------------

def _base(base_offset) -> int:
    # Segment base offsets are file names of 20 digits: never negative.
    base = operator.index(base_offset)
    if not 0 <= base <= _INT64_MAX:
        raise InvalidRequestError(f"base offset {base} is not a valid segment base offset")
    return base


def _relative(offset: int, base: int) -> int:
    rel = offset - base
    if not 0 <= rel <= _INT32_MAX:
        raise LogSegmentOffsetOverflowError(
            f"offset {offset} does not fit a 32-bit relative offset from base offset {base}")
    return rel


def _entries(buf, dtype: np.dtype, kind: str) -> np.ndarray:
    # Trailing bytes that are not a whole entry make Kafka's sanityCheck fail: same here.
    n = len(memoryview(buf).cast("B"))
    if n % dtype.itemsize:
        raise CorruptIndexError(f"{kind} is {n} bytes, not a multiple of {dtype.itemsize} (the "
                                "entry size)")
    return np.frombuffer(memoryview(buf).cast("B"), dtype=dtype)


def _first_bad(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0])


def _as_pairs(entries, kind: str) -> np.ndarray:
    # An (n, 2) integer array is taken as is, so decoded arrays re-encode without a Python loop.
    if isinstance(entries, np.ndarray) and entries.ndim == 2 and entries.shape[1] == 2 \
            and entries.dtype.kind in "iu":
        return entries.astype(np.int64, copy=False)
    try:
        pairs = [(operator.index(a), operator.index(b)) for a, b in entries]
        return np.array(pairs, dtype=np.int64).reshape(-1, 2)
    except OverflowError as exc:
        raise LogSegmentOffsetOverflowError(f"{kind} entry value out of int64 range") from exc


# -- .index --------------------------------------------------------------------------------------

def sanity_check_offset_index(buf, base_offset: int) -> None:
    """Raise CorruptIndexError exactly when Kafka's ``OffsetIndex.sanityCheck`` would.

    Kafka only looks at the last whole entry and the file length, so this is cheap enough to run on
    every open; :func:`decode_offset_index` checks every entry.
    """
    base = _base(base_offset)
    mv = memoryview(buf).cast("B")
    entries = len(mv) // OFFSET_ENTRY_SIZE
    if entries:
        (rel,) = struct.unpack_from(">i", mv, (entries - 1) * OFFSET_ENTRY_SIZE)
        if rel < 0:
            raise CorruptIndexError(f"offset index has {entries} entries but its last offset "
                                    f"{base + rel} is below the base offset {base}")
    if len(mv) % OFFSET_ENTRY_SIZE:
        raise CorruptIndexError(f"offset index is {len(mv)} bytes, not a multiple of "
                                f"{OFFSET_ENTRY_SIZE}")


def decode_offset_index(buf, base_offset: int) -> tuple[np.ndarray, np.ndarray]:
    """Decode a ``.index`` into (absolute offsets, positions), both int64.

    Beyond Kafka's sanity check, every entry is validated because lookups binary-search the arrays:
    offsets must be >= the base and strictly increasing (Kafka's append refuses anything else) and
    positions non-negative and non-decreasing (Kafka also binary-searches by position).
    """
    base = _base(base_offset)
    arr = _entries(buf, _OFFSET_DTYPE, "offset index")
    rel = arr["rel"].astype(np.int64)
    pos = arr["pos"].astype(np.int64)
    if rel.size:
        if (bad := rel < 0).any():
            i = _first_bad(bad)
            raise CorruptIndexError(f"offset index entry {i}: offset {base + rel[i]} is below the "
                                    f"base offset {base}")
        if (bad := np.diff(rel) <= 0).any():
            i = _first_bad(bad) + 1
            raise CorruptIndexError(f"offset index entry {i}: offset {base + rel[i]} is not above "
                                    f"the previous entry's {base + rel[i - 1]}")
        if (bad := pos < 0).any():
            i = _first_bad(bad)
            raise CorruptIndexError(f"offset index entry {i}: negative position {pos[i]}")
        if (bad := np.diff(pos) < 0).any():
            i = _first_bad(bad) + 1
            raise CorruptIndexError(f"offset index entry {i}: position {pos[i]} is below the "
                                    f"previous entry's {pos[i - 1]}")
    return rel + base, pos


def _check_relative_range(offsets: np.ndarray, base: int) -> None:
    """Every offset must fit a 32-bit relative offset; checked against the offsets themselves so
    that huge values cannot wrap in int64 math."""
    if offsets.min() < base or offsets.max() - base > _INT32_MAX:
        bad = offsets[(offsets < base) | (offsets - base > _INT32_MAX)][0]
        raise LogSegmentOffsetOverflowError(
            f"offset {bad} does not fit a 32-bit relative offset from base offset {base}")


#: Up to this many entries an index is packed without numpy: a small segment's index (a task
#: writing to 1,000 partitions makes thousands of them) costs more in numpy's per-call
#: overhead than in packing its few entries.
_SMALL = 64


def _small_offset_index(entries, base: int) -> Optional[bytes]:
    """The packed ``.index`` of valid int pairs, or None (then numpy's path names the fault)."""
    flat = []
    prev_off = prev_pos = -1
    for off, pos in entries:
        if type(off) is not int or type(pos) is not int or off <= prev_off or pos < prev_pos \
                or not 0 <= off - base <= _INT32_MAX or not 0 <= pos <= _INT32_MAX:
            return None
        flat += (off - base, pos)
        prev_off, prev_pos = off, pos
    return struct.pack(f">{len(flat)}i", *flat)


def _small_time_index(entries, base: int) -> Optional[bytes]:
    """The packed ``.timeindex`` of valid int pairs, or None (as :func:`_small_offset_index`)."""
    flat = []
    prev_ts, prev_off = _INT64_MIN, -1
    for ts, off in entries:
        if type(ts) is not int or type(off) is not int or ts < prev_ts or off < prev_off \
                or not _INT64_MIN <= ts <= _INT64_MAX or not 0 <= off - base <= _INT32_MAX:
            return None
        flat += (ts, off - base)
        prev_ts, prev_off = ts, off
    return struct.pack(">" + "qi" * len(entries), *flat)


def encode_offset_entry(offset: int, position: int, base_offset: int) -> bytes:
    """One ``.index`` entry, for appending to an index as a segment grows."""
    base = _base(base_offset)
    rel = _relative(operator.index(offset), base)
    position = operator.index(position)
    if not 0 <= position <= _INT32_MAX:
        raise InvalidRecordError(f"position {position} does not fit a non-negative int32")
    return struct.pack(">ii", rel, position)


def encode_offset_index(entries: Iterable[tuple[int, int]], base_offset: int) -> bytes:
    """Encode (absolute offset, position) pairs; refuses what :func:`decode_offset_index` would."""
    base = _base(base_offset)
    if type(entries) is list and len(entries) <= _SMALL:
        fast = _small_offset_index(entries, base)
        if fast is not None:
            return fast
    arr = _as_pairs(entries, "offset index")
    offsets, pos = arr[:, 0], arr[:, 1]
    if arr.size:
        _check_relative_range(offsets, base)
        if (bad := np.diff(offsets) <= 0).any():
            i = _first_bad(bad) + 1
            raise InvalidRecordError(f"offset index entry {i}: offset {offsets[i]} is not above "
                                     f"the previous entry's {offsets[i - 1]}")
        if pos.min() < 0 or pos.max() > _INT32_MAX or (np.diff(pos) < 0).any():
            raise InvalidRecordError("offset index positions must be non-decreasing and fit a "
                                     "non-negative int32")
    out = np.empty(len(arr), dtype=_OFFSET_DTYPE)
    out["rel"] = offsets - base
    out["pos"] = pos
    return out.tobytes()


def offset_index_lookup(offsets, positions, target_offset: int,
                        base_offset: int) -> tuple[int, int]:
    """Kafka's ``OffsetIndex.lookup``: the entry with the largest offset <= target.

    With no such entry the answer is (base_offset, 0), the start of the segment, so a reader can
    always scan forward from the returned position.
    """
    offsets = np.asarray(offsets)
    i = int(np.searchsorted(offsets, target_offset, side="right")) - 1
    if i < 0:
        return int(base_offset), 0
    return int(offsets[i]), int(np.asarray(positions)[i])


# -- .timeindex ----------------------------------------------------------------------------------

def sanity_check_time_index(buf, base_offset: int) -> None:
    """Raise CorruptIndexError exactly when Kafka's ``TimeIndex.sanityCheck`` would.

    Kafka compares only the last whole entry against the first entry and the base offset, then the
    file length; it does not look at the entries in between.
    """
    base = _base(base_offset)
    mv = memoryview(buf).cast("B")
    entries = len(mv) // TIME_ENTRY_SIZE
    if entries:
        first_ts, _ = struct.unpack_from(">qi", mv, 0)
        last_ts, last_rel = struct.unpack_from(">qi", mv, (entries - 1) * TIME_ENTRY_SIZE)
        if last_ts < first_ts:
            raise CorruptIndexError(f"time index has {entries} entries but its last timestamp "
                                    f"{last_ts} is below its first timestamp {first_ts}")
        if last_rel < 0:
            raise CorruptIndexError(f"time index has {entries} entries but its last offset "
                                    f"{base + last_rel} is below the base offset {base}")
    if len(mv) % TIME_ENTRY_SIZE:
        raise CorruptIndexError(f"time index is {len(mv)} bytes, not a multiple of "
                                f"{TIME_ENTRY_SIZE}")


def decode_time_index(buf, base_offset: int) -> tuple[np.ndarray, np.ndarray]:
    """Decode a ``.timeindex`` into (timestamps, absolute offsets), both int64.

    Every entry is validated because lookups binary-search it: offsets >= the base, and timestamps
    and offsets non-decreasing (Kafka's ``maybeAppend`` refuses to go backwards in either; it only
    ever appends a strictly greater timestamp, so ties never appear in Kafka-written files).
    """
    base = _base(base_offset)
    arr = _entries(buf, _TIME_DTYPE, "time index")
    ts = arr["ts"].astype(np.int64)
    rel = arr["rel"].astype(np.int64)
    if rel.size:
        if (bad := rel < 0).any():
            i = _first_bad(bad)
            raise CorruptIndexError(f"time index entry {i}: offset {base + rel[i]} is below the "
                                    f"base offset {base}")
        if (bad := ts[1:] < ts[:-1]).any():   # not np.diff: it wraps at the int64 ends
            i = _first_bad(bad) + 1
            raise CorruptIndexError(f"time index entry {i}: timestamp {ts[i]} is below the "
                                    f"previous entry's {ts[i - 1]}")
        if (bad := np.diff(rel) < 0).any():
            i = _first_bad(bad) + 1
            raise CorruptIndexError(f"time index entry {i}: offset {base + rel[i]} is below the "
                                    f"previous entry's {base + rel[i - 1]}")
    return ts, rel + base


def encode_time_entry(timestamp: int, offset: int, base_offset: int) -> bytes:
    """One ``.timeindex`` entry, for appending to an index as a segment grows."""
    base = _base(base_offset)
    rel = _relative(operator.index(offset), base)
    timestamp = operator.index(timestamp)
    if not _INT64_MIN <= timestamp <= _INT64_MAX:
        raise InvalidRecordError(f"timestamp {timestamp} does not fit an int64")
    return struct.pack(">qi", timestamp, rel)


def encode_time_index(entries: Iterable[tuple[int, int]], base_offset: int) -> bytes:
    """Encode (timestamp, absolute offset) pairs; refuses what :func:`decode_time_index` would."""
    base = _base(base_offset)
    if type(entries) is list and len(entries) <= _SMALL:
        fast = _small_time_index(entries, base)
        if fast is not None:
            return fast
    arr = _as_pairs(entries, "time index")
    ts, offsets = arr[:, 0], arr[:, 1]
    if arr.size:
        _check_relative_range(offsets, base)
        if (ts[1:] < ts[:-1]).any() or (np.diff(offsets) < 0).any():
            raise InvalidRecordError("time index timestamps and offsets must both be "
                                     "non-decreasing")
    out = np.empty(len(arr), dtype=_TIME_DTYPE)
    out["ts"] = ts
    out["rel"] = offsets - base
    return out.tobytes()


def time_index_lookup(timestamps, offsets, target_ts: int, base_offset: int) -> tuple[int, int]:
    """Kafka's ``TimeIndex.lookup``: the entry with the largest timestamp <= target.

    With no such entry the answer is (NO_TIMESTAMP, base_offset). Kafka never writes equal
    timestamps; should a foreign file hold ties, the earliest entry of the tie is returned, so a
    forward scan from it cannot miss a record at that timestamp.
    """
    timestamps = np.asarray(timestamps)
    i = int(np.searchsorted(timestamps, target_ts, side="right")) - 1
    if i < 0:
        return NO_TIMESTAMP, int(base_offset)
    ts = timestamps[i]
    i = int(np.searchsorted(timestamps, ts, side="left"))
    return int(ts), int(np.asarray(offsets)[i])


# -- .txnindex -----------------------------------------------------------------------------------

def decode_txn_index(buf, *, strict: bool = False) -> list[AbortedTxn]:
    """Decode a ``.txnindex``.

    Kafka's reader stops at the last whole entry and silently ignores a torn tail (the file is
    appended without pre-allocation, so a crash can cut an entry); ``strict=True`` reports it
    instead. Kafka rejects entries newer than the version it writes; we reject any version other
    than 0, since no other has ever been defined and the rest of the entry would be guesswork.
    """
    mv = memoryview(buf).cast("B")
    whole = len(mv) - len(mv) % TXN_ENTRY_SIZE
    if strict and whole != len(mv):
        raise CorruptIndexError(f"transaction index is {len(mv)} bytes, not a multiple of "
                                f"{TXN_ENTRY_SIZE}")
    arr = np.frombuffer(mv[:whole], dtype=_TXN_DTYPE)
    if (bad := arr["version"] != TXN_INDEX_VERSION).any():
        i = _first_bad(bad)
        raise UnsupportedVersionError(f"transaction index entry {i} has version "
                                      f"{int(arr['version'][i])}; only {TXN_INDEX_VERSION} exists")
    return [AbortedTxn(*row) for row in arr.tolist()]


def sanity_check_txn_index(buf, start_offset: int) -> None:
    """Raise CorruptIndexError when Kafka's ``TransactionIndex.sanityCheck`` would.

    An aborted transaction listed in a segment's index ends inside or after that segment, so a last
    offset below the segment's start offset means the file belongs elsewhere or is garbage.
    """
    for i, txn in enumerate(decode_txn_index(buf)):
        if txn.last_offset < start_offset:
            raise CorruptIndexError(f"transaction index entry {i}: last offset {txn.last_offset} "
                                    f"is below the segment start offset {start_offset}")


def encode_txn_index(txns: Iterable[AbortedTxn]) -> bytes:
    """Encode aborted transactions; last offsets must increase, as Kafka's append demands."""
    out = bytearray()
    last = None
    for i, txn in enumerate(txns):
        version, producer_id, first, last_offset, lso = (operator.index(v) for v in txn)
        if version != TXN_INDEX_VERSION:
            raise UnsupportedVersionError(f"cannot write aborted transaction version {version}")
        if last is not None and last_offset <= last:
            raise InvalidRecordError(f"aborted transaction {i}: last offset {last_offset} is not "
                                     f"above the previous entry's {last}")
        try:
            out += _TXN_STRUCT.pack(version, producer_id, first, last_offset, lso)
        except struct.error as exc:
            raise InvalidRecordError(f"aborted transaction {i}: value out of int64 range") from exc
        last = last_offset
    return bytes(out)


__all__ = [
    "OFFSET_ENTRY_SIZE", "TIME_ENTRY_SIZE", "TXN_ENTRY_SIZE", "TXN_INDEX_VERSION", "NO_TIMESTAMP",
    "AbortedTxn", "decode_offset_index", "encode_offset_index", "encode_offset_entry",
    "offset_index_lookup", "sanity_check_offset_index", "decode_time_index", "encode_time_index",
    "encode_time_entry", "time_index_lookup", "sanity_check_time_index", "decode_txn_index",
    "encode_txn_index", "sanity_check_txn_index",
]
