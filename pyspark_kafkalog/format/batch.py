"""Shallow batch headers for every magic: what the log layer needs without touching records.

A segment is a run of *entries* that all start with ``offset int64, length int32`` and carry
their magic byte at position 16. For magic 2 an entry is a record batch; for magic 0/1 it is a
message (a "wrapper" when compressed). Recovery, index building and offset search read only these
headers, the same way Kafka's ``FileRecords.batches()`` does, so they never decompress.

This module is the one home of the entry walk (docs/format.md §2): the header layout (mirrored
for C in ``_batch_layout.h``), the rules (:class:`EntryScan`, :func:`scan_entries`,
:func:`scan_offsets`) and the errors they raise, so that one corruption gives the same
:class:`CorruptRecordError` whichever reader meets it.
"""
from __future__ import annotations

import struct
from typing import Iterator, NamedTuple, Optional, Tuple

from ..errors import CorruptRecordError
from .crc import crc32, crc32c
from .records import (COMPRESSION_MASK, CONTROL_BIT, CREATE_TIME, LOG_APPEND_TIME, MAGIC_V2,
                      NO_TIMESTAMP, NO_TIMESTAMP_TYPE, TIMESTAMP_TYPE_BIT, TRANSACTIONAL_BIT,
                      DELETE_HORIZON_BIT)

# -- where the fields of an entry's header are (docs/format.md §2-§4) ---------------------------
# The one home of these positions, with the names of Kafka's ``Records``, ``DefaultRecordBatch``
# and ``LegacyRecord``. The C decoder has its mirror in ``_batch_layout.h`` (a test checks that
# the two agree). Positions are from the start of an entry, except the ``LEGACY_*`` ones, which
# are from the start of a magic 0/1 message, ``LOG_OVERHEAD`` bytes into its entry (as in
# ``LegacyRecord``).
BASE_OFFSET_OFFSET = 0            # int64; magic 0/1: the message's offset
LENGTH_OFFSET = 8                 # int32: bytes after this field (Records.SIZE_OFFSET)
LOG_OVERHEAD = 12                 # offset int64 + length int32
PARTITION_LEADER_EPOCH_OFFSET = 12   # int32 (magic 0/1: the CRC is here)
MAGIC_OFFSET = 16                 # int8, in every magic
HEADER_SIZE_UP_TO_MAGIC = 17
CRC_OFFSET = 17                   # uint32, CRC32C of ATTRIBUTES_OFFSET .. end of batch
ATTRIBUTES_OFFSET = 21            # int16
LAST_OFFSET_DELTA_OFFSET = 23     # int32
BASE_TIMESTAMP_OFFSET = 27        # int64
MAX_TIMESTAMP_OFFSET = 35         # int64
PRODUCER_ID_OFFSET = 43           # int64
PRODUCER_EPOCH_OFFSET = 51        # int16
BASE_SEQUENCE_OFFSET = 53         # int32
RECORDS_COUNT_OFFSET = 57         # int32
RECORDS_OFFSET = 61
RECORD_BATCH_OVERHEAD = RECORDS_OFFSET
# magic 0/1 (LegacyRecord), from the message start
LEGACY_CRC_OFFSET = 0             # uint32, CRC32 of LEGACY_MAGIC_OFFSET .. end of message
LEGACY_MAGIC_OFFSET = 4
LEGACY_ATTRIBUTES_OFFSET = 5      # int8
LEGACY_TIMESTAMP_OFFSET = 6       # int64, magic 1 only
LEGACY_KEY_SIZE_OFFSET_V0 = 6
LEGACY_KEY_SIZE_OFFSET_V1 = 14
LEGACY_HEADER_SIZE_V0 = 6         # crc + magic + attributes
LEGACY_HEADER_SIZE_V1 = 14        # ... + timestamp
RECORD_OVERHEAD_V0 = 14           # header + key length + value length
RECORD_OVERHEAD_V1 = 22

V2_HEADER = struct.Struct(">qiibIhiqqqhii")
V2_HEADER_SIZE = RECORD_BATCH_OVERHEAD   # == V2_HEADER.size
V2_CRC_START = ATTRIBUTES_OFFSET  # CRC32C covers attributes .. end of batch
LEGACY_HEADER = struct.Struct(">qiIbb")   # offset, size, crc, magic, attributes
LEGACY_TIMESTAMP = struct.Struct(">q")
_LOG_HEADER = struct.Struct(">qi")
_LENGTH = struct.Struct(">i").unpack_from
_new_tuple = tuple.__new__


class BatchHeader(NamedTuple):
    """The header facts of one entry at ``position`` in a buffer (no CRC check implied).

    For a compressed magic 0/1 wrapper, ``base_offset`` and ``record_count`` are -1: only
    decompressing tells them, and the shallow paths never need them.
    """

    position: int
    size: int                      # whole entry, including the 12-byte log overhead
    magic: int
    base_offset: int
    last_offset: int
    max_timestamp: int
    base_timestamp: int
    attributes: int
    crc: int
    partition_leader_epoch: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    @property
    def end(self) -> int:
        return self.position + self.size

    @property
    def compression(self) -> int:
        return self.attributes & COMPRESSION_MASK

    @property
    def timestamp_type(self) -> int:
        if self.magic == 0:
            return NO_TIMESTAMP_TYPE
        return LOG_APPEND_TIME if self.attributes & TIMESTAMP_TYPE_BIT else CREATE_TIME

    @property
    def is_transactional(self) -> bool:
        return self.magic >= MAGIC_V2 and bool(self.attributes & TRANSACTIONAL_BIT)

    @property
    def is_control(self) -> bool:
        return self.magic >= MAGIC_V2 and bool(self.attributes & CONTROL_BIT)

    @property
    def has_delete_horizon(self) -> bool:
        return self.magic >= MAGIC_V2 and bool(self.attributes & DELETE_HORIZON_BIT)


# -- the walk's errors: one shape, "[<file>: ]<what> at position <p>..." ----------------------
# Every reader of entries raises these, so one corruption reads the same wherever it is found.
# ``position`` is where the entry starts in the file (or in the buffer, when that is all a
# decoder has); ``file`` is left out where the reader does not know it.

def _corrupt(text: str, position: int, file: Optional[str]) -> CorruptRecordError:
    return CorruptRecordError(f"{file}: {text}" if file else text, position)


def size_error(position: int, length: int, file: Optional[str] = None) -> CorruptRecordError:
    return _corrupt(f"entry at position {position} declares size {length}, smaller than the "
                    f"minimum record overhead ({RECORD_OVERHEAD_V0})", position, file)


def batch_size_error(position: int, size: int, file: Optional[str] = None) -> CorruptRecordError:
    return _corrupt(f"record batch at position {position} has size {size}, below the "
                    f"{V2_HEADER_SIZE}-byte batch header", position, file)


def v1_size_error(position: int, length: int, file: Optional[str] = None) -> CorruptRecordError:
    return _corrupt(f"message at position {position} has size {length}, below the magic 1 "
                    "overhead", position, file)


def magic_error(position: int, magic: int, file: Optional[str] = None) -> CorruptRecordError:
    signed = magic - 256 if magic > 127 else magic    # as Kafka prints the byte
    return _corrupt(f"entry at position {position} has unknown magic {signed}", position, file)


def crc_error(position: int, stored: int, actual: int,
              file: Optional[str] = None) -> CorruptRecordError:
    return _corrupt(f"record batch at position {position} is corrupt: stored CRC {stored:#010x} "
                    f"!= computed {actual:#010x}", position, file)


def torn_error(position: int, have: int, need: int,
               file: Optional[str] = None) -> CorruptRecordError:
    return _corrupt(f"torn entry at position {position} ({have} of {need} bytes)", position, file)


def trailing_error(position: int, count: int, file: Optional[str] = None) -> CorruptRecordError:
    return _corrupt(f"{count} trailing bytes at position {position} do not hold an entry",
                    position, file)


def offsets_error(position: int, first: int, last: int, previous: int,
                  file: Optional[str] = None) -> CorruptRecordError:
    return _corrupt(f"entry at position {position} holds offsets {first}..{last}, not after the "
                    f"last offset {previous} of the entry before it", position, file)


def read_header(buf, pos: int, base_position: int = 0, file: Optional[str] = None) -> BatchHeader:
    """Parse the entry header at ``pos``; the caller has checked the whole entry is in the file
    and ``buf`` holds at least its first ``V2_HEADER_SIZE`` bytes (or all of it, if shorter).

    ``buf[0]`` is at ``base_position`` in the file: the header and any error carry file
    positions. Raises what §2 calls corruption once the magic is known: an unknown magic, or a
    size below the magic's minimum.
    """
    magic = buf[pos + MAGIC_OFFSET]
    at = pos + base_position
    if magic == MAGIC_V2:
        size = _LENGTH(buf, pos + LENGTH_OFFSET)[0] + LOG_OVERHEAD
        if size < V2_HEADER_SIZE:
            raise batch_size_error(at, size, file)
        (base_offset, _, ple, magic, crc, attrs, last_delta, base_ts, max_ts, pid, pepoch,
         base_seq, count) = V2_HEADER.unpack_from(buf, pos)
        # tuple.__new__ skips NamedTuple's Python-level __new__: this runs once per batch
        return _new_tuple(BatchHeader, (at, size, magic, base_offset, base_offset + last_delta,
                                        max_ts, base_ts, attrs & 0xFFFF, crc, ple, pid, pepoch,
                                        base_seq, count))
    if magic > MAGIC_V2:
        raise magic_error(at, magic, file)
    offset, length, crc, magic, attrs = LEGACY_HEADER.unpack_from(buf, pos)
    size = length + LOG_OVERHEAD
    attrs &= 0xFF
    if magic == 1:
        if length < RECORD_OVERHEAD_V1:
            raise v1_size_error(at, length, file)
        ts = LEGACY_TIMESTAMP.unpack_from(buf, pos + LOG_OVERHEAD + LEGACY_TIMESTAMP_OFFSET)[0]
    else:
        ts = NO_TIMESTAMP
    compressed = attrs & COMPRESSION_MASK
    return _new_tuple(BatchHeader, (at, size, magic, -1 if compressed else offset, offset, ts, ts,
                                    attrs, crc, -1, -1, -1, -1, -1 if compressed else 1))


class EntryScan:
    """The walk of docs/format.md §2, one entry at a time: the one home of its rules.

    ``LogSegment.walk`` walks a file in windows with it (there an entry larger than the window
    is stepped over by its header alone). :func:`scan_entries` (headers) and
    :func:`scan_offsets` (offsets only) walk a buffer with its steps inlined, as do the hot
    loops that inline the walk on purpose (``columnar``'s decoder, ``_columnar_py.legacy_run``,
    the C ``scan_run_arrow``): the same rules, the same errors.

    Beyond Kafka's size and magic checks, offsets must increase: an entry's first offset (a
    compressed magic 0/1 wrapper tells only its last) must be above the last offset of the entry
    before it, as Kafka's log requires. A magic 2 base offset lies outside the CRC, so this is the
    only check that sees a flipped bit there. Gaps are allowed: compaction leaves them in Kafka's
    logs (a cluster's segments are contiguous, but repair's stricter rule is its own).
    ``last_offset`` is that of the entry before the next one, None while unknown (a walk that
    starts at an index entry). ``check_offsets=False`` is for bytes that are not (yet) a log:
    a producer's batches each start at offset 0.
    """

    __slots__ = ("file", "last_offset", "check_offsets")

    def __init__(self, file: Optional[str] = None, last_offset: Optional[int] = None,
                 check_offsets: bool = True):
        self.file = file
        self.last_offset = last_offset
        self.check_offsets = check_offsets

    def entry_size(self, buf, pos: int, base_position: int = 0) -> int:
        """Step 2: the whole size (log overhead included) the entry at ``pos`` declares; its
        first ``LOG_OVERHEAD`` bytes must be in ``buf``."""
        length = _LENGTH(buf, pos + LENGTH_OFFSET)[0]
        if length < RECORD_OVERHEAD_V0:
            raise size_error(pos + base_position, length, self.file)
        return length + LOG_OVERHEAD

    def header(self, buf, pos: int, base_position: int = 0) -> BatchHeader:
        """Step 4 and the offset rule, for an entry the caller found whole in the file (see
        :func:`read_header` for what ``buf`` must hold)."""
        h = read_header(buf, pos, base_position, self.file)
        if self.check_offsets:
            first = h.base_offset if h.magic == MAGIC_V2 else h.last_offset
            previous = self.last_offset
            if previous is not None and first <= previous:
                raise offsets_error(h.position, first, h.last_offset, previous, self.file)
            self.last_offset = h.last_offset
        return h

    def torn(self, position: int, have: int, need: int) -> CorruptRecordError:
        return torn_error(position, have, need, self.file)

    def trailing(self, position: int, count: int) -> CorruptRecordError:
        return trailing_error(position, count, self.file)


def scan_entries(buf, start: int = 0, end: Optional[int] = None, *, validate_crc: bool = False,
                 check_offsets: bool = True, previous_last_offset: Optional[int] = None,
                 strict: bool = False, file: Optional[str] = None,
                 base_position: int = 0) -> Iterator[BatchHeader]:
    """The whole entries of ``buf[start:end]``, walked by :class:`EntryScan`'s rules.

    ``buf[0]`` is at ``base_position`` in ``file``; headers and errors carry file positions.
    ``previous_last_offset``: the last offset of the entry before ``start``, when known.
    ``validate_crc`` adds Kafka's ``ensureValid`` (:func:`validate`) per entry. A partial entry
    at ``end`` ends the walk quietly (a read that stopped mid-batch, or a torn append), unless
    ``strict`` (``end`` is the end of a complete file), where it is damage.
    """
    # EntryScan.entry_size and .header, inlined: this loop runs once per batch of every chunk
    # the Spark reader reads (tests/format/test_entry_scan.py holds the two to the same results)
    end = len(buf) if end is None else end
    previous = previous_last_offset
    pos = start
    while pos + HEADER_SIZE_UP_TO_MAGIC < end:
        length = _LENGTH(buf, pos + LENGTH_OFFSET)[0]
        if length < RECORD_OVERHEAD_V0:
            raise size_error(pos + base_position, length, file)
        size = length + LOG_OVERHEAD
        if pos + size > end:
            if strict:
                raise torn_error(pos + base_position, end - pos, size, file)
            return
        h = read_header(buf, pos, base_position, file)
        if check_offsets:
            first = h.base_offset if h.magic == MAGIC_V2 else h.last_offset
            if previous is not None and first <= previous:
                raise offsets_error(h.position, first, h.last_offset, previous, file)
            previous = h.last_offset
        if validate_crc:
            validate(buf, h, base_position, file)
        yield h
        pos += size
    if strict and pos < end:
        raise trailing_error(pos + base_position, end - pos, file)


def scan_offsets(buf, start: int = 0, end: Optional[int] = None, *,
                 previous_last_offset: Optional[int] = None, file: Optional[str] = None,
                 base_position: int = 0) -> Iterator[Tuple[int, int, int, int]]:
    """:func:`scan_entries` (not strict, no CRCs) without a header object per entry:
    ``(position, size, base offset, last offset)`` of each whole entry, the base offset -1 for
    magic 0/1 (a compressed wrapper's is unknown without decompressing).

    For readers that only cut a run of entries by offset (the Spark range reader, once per
    entry of every chunk it reads): the same rules and errors, with a third of the work per
    entry. The size and magic checks are ``read_header``'s, inlined; tests hold the two to the
    same results.
    """
    end = len(buf) if end is None else end
    previous = previous_last_offset
    pos = start
    while pos + HEADER_SIZE_UP_TO_MAGIC < end:
        offset, length = _LOG_HEADER.unpack_from(buf, pos)
        if length < RECORD_OVERHEAD_V0:
            raise size_error(pos + base_position, length, file)
        size = length + LOG_OVERHEAD
        if pos + size > end:
            return
        magic = buf[pos + MAGIC_OFFSET]
        if magic == MAGIC_V2:
            if size < V2_HEADER_SIZE:
                raise batch_size_error(pos + base_position, size, file)
            first = base = offset
            last = offset + _LENGTH(buf, pos + LAST_OFFSET_DELTA_OFFSET)[0]
        elif magic > MAGIC_V2:
            raise magic_error(pos + base_position, magic, file)
        else:
            if magic == 1 and length < RECORD_OVERHEAD_V1:
                raise v1_size_error(pos + base_position, length, file)
            first = last = offset
            base = -1
        if previous is not None and first <= previous:
            raise offsets_error(pos + base_position, first, last, previous, file)
        previous = last
        yield pos + base_position, size, base, last
        pos += size


def iter_headers(buf, start: int = 0, end: Optional[int] = None) -> Iterator[BatchHeader]:
    """Walk entries from ``start`` without the offset rule (for bytes that may not be a log
    yet, such as a producer's batches). Stops quietly at a partial entry at the end.

    Raises :class:`CorruptRecordError` where Kafka's ``FileLogInputStream`` would: an entry whose
    declared size is below the smallest possible message, or whose magic is unknown.
    """
    return scan_entries(buf, start, end, check_offsets=False)


def validate(buf, header: BatchHeader, buf_position: int = 0, file: Optional[str] = None) -> None:
    """Kafka's ``ensureValid``: the size is plausible and the stored CRC matches the bytes.

    ``buf_position`` is where ``buf`` starts in the file ``header.position`` refers to.
    """
    pos = header.position
    start, end = pos - buf_position, header.end - buf_position
    if header.magic == MAGIC_V2:
        actual = crc32c(memoryview(buf)[start + V2_CRC_START:end])
    elif header.magic > MAGIC_V2:
        raise magic_error(pos, header.magic, file)
    else:
        actual = crc32(memoryview(buf)[start + MAGIC_OFFSET:end])
    if actual != header.crc:
        raise crc_error(pos, header.crc, actual, file)


def iter_valid_headers(buf, start: int = 0, end: Optional[int] = None) -> Iterator[BatchHeader]:
    return scan_entries(buf, start, end, validate_crc=True, check_offsets=False)
