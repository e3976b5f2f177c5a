"""Shallow batch headers for every magic: what the log layer needs without touching records.

A segment is a run of *entries* that all start with ``offset int64, length int32`` and carry
their magic byte at position 16. For magic 2 an entry is a record batch; for magic 0/1 it is a
message (a "wrapper" when compressed). Recovery, index building and offset search read only these
headers, the same way Kafka's ``FileRecords.batches()`` does, so they never decompress.
"""
from __future__ import annotations

import struct
from typing import Iterator, NamedTuple

from ..errors import CorruptRecordError
from .crc import crc32, crc32c
from .records import (COMPRESSION_MASK, CONTROL_BIT, CREATE_TIME, LOG_APPEND_TIME, MAGIC_V2,
                      NO_TIMESTAMP, NO_TIMESTAMP_TYPE, TIMESTAMP_TYPE_BIT, TRANSACTIONAL_BIT,
                      DELETE_HORIZON_BIT)

LOG_OVERHEAD = 12                 # offset int64 + length int32
MAGIC_OFFSET = 16
HEADER_SIZE_UP_TO_MAGIC = 17
V2_HEADER = struct.Struct(">qiibIhiqqqhii")
V2_HEADER_SIZE = V2_HEADER.size   # 61
V2_CRC_START = 21                 # CRC32C covers attributes .. end of batch
LEGACY_HEADER = struct.Struct(">qiIbb")   # offset, size, crc, magic, attributes
LEGACY_TIMESTAMP = struct.Struct(">q")
RECORD_OVERHEAD_V0 = 14           # crc + magic + attributes + key length + value length
RECORD_OVERHEAD_V1 = 22
_LOG_HEADER = struct.Struct(">qi")


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


def read_header(buf, pos: int) -> BatchHeader:
    """Parse the entry header at ``pos``; the caller has checked the whole entry is in ``buf``."""
    offset, length = _LOG_HEADER.unpack_from(buf, pos)
    size = length + LOG_OVERHEAD
    magic = buf[pos + MAGIC_OFFSET]
    if magic >= MAGIC_V2:
        if length + LOG_OVERHEAD < V2_HEADER_SIZE:
            raise CorruptRecordError(
                f"record batch at position {pos} has size {size}, below the {V2_HEADER_SIZE}-byte "
                "batch header", pos)
        (base_offset, _, ple, magic, crc, attrs, last_delta, base_ts, max_ts, pid, pepoch,
         base_seq, count) = V2_HEADER.unpack_from(buf, pos)
        return BatchHeader(pos, size, magic, base_offset, base_offset + last_delta, max_ts,
                           base_ts, attrs & 0xFFFF, crc, ple, pid, pepoch, base_seq, count)
    _, _, crc, magic, attrs = LEGACY_HEADER.unpack_from(buf, pos)
    attrs &= 0xFF
    if magic == 1:
        if length < RECORD_OVERHEAD_V1:
            raise CorruptRecordError(
                f"message at position {pos} has size {length}, below the magic 1 overhead", pos)
        ts = LEGACY_TIMESTAMP.unpack_from(buf, pos + 18)[0]
    else:
        ts = NO_TIMESTAMP
    compressed = attrs & COMPRESSION_MASK
    return BatchHeader(pos, size, magic, -1 if compressed else offset, offset, ts, ts, attrs,
                       crc, -1, -1, -1, -1, -1 if compressed else 1)


def iter_headers(buf, start: int = 0, end: int | None = None) -> Iterator[BatchHeader]:
    """Walk entries from ``start``. Stops quietly at a partial entry at the end (a torn append).

    Raises :class:`CorruptRecordError` where Kafka's ``FileLogInputStream`` would: an entry whose
    declared size is below the smallest possible message.
    """
    end = len(buf) if end is None else end
    pos = start
    while pos + HEADER_SIZE_UP_TO_MAGIC < end:
        length = _LOG_HEADER.unpack_from(buf, pos)[1]
        if length < RECORD_OVERHEAD_V0:
            raise CorruptRecordError(
                f"entry at position {pos} declares size {length}, smaller than the minimum "
                f"record overhead ({RECORD_OVERHEAD_V0})", pos)
        if pos + LOG_OVERHEAD + length > end:
            return
        header = read_header(buf, pos)
        yield header
        pos = header.end


def validate(buf, header: BatchHeader, buf_position: int = 0) -> None:
    """Kafka's ``ensureValid``: the size is plausible and the stored CRC matches the bytes.

    ``buf_position`` is where ``buf`` starts in the file ``header.position`` refers to.
    """
    pos = header.position
    start, end = pos - buf_position, header.end - buf_position
    if header.magic >= MAGIC_V2:
        if header.magic > MAGIC_V2:
            raise CorruptRecordError(f"unknown magic {header.magic} at position {pos}", pos)
        actual = crc32c(memoryview(buf)[start + V2_CRC_START:end])
    else:
        actual = crc32(memoryview(buf)[start + MAGIC_OFFSET:end])
    if actual != header.crc:
        raise CorruptRecordError(
            f"record batch at position {pos} is corrupt: stored CRC {header.crc:#010x} != "
            f"computed {actual:#010x}", pos)


def iter_valid_headers(buf, start: int = 0, end: int | None = None) -> Iterator[BatchHeader]:
    for header in iter_headers(buf, start, end):
        validate(buf, header)
        yield header
