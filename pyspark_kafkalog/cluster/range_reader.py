"""Reading one planned offset range into Arrow record batches: the executor half of the source.

The bytes read follow the range, not the partition: the offset index takes the first read to
within one ``index.interval.bytes`` of ``start`` (log/segment.py), and each read stops about one
index interval past the batch holding ``end - 1`` (the next index entry after it bounds where
that batch can end). Reads are whole batches, at most ``max_bytes`` (plus one batch) at a time;
each becomes one Arrow record batch through the columnar decoder, so records never become
Python objects.

Rows come out exactly in Spark's Kafka source schema: key, value, topic, partition, offset,
timestamp (microseconds, UTC), timestampType, and headers when asked. Control records are never
returned; under read_committed the rows of aborted Kafka transactions (found while planning) are
dropped.

A segment that disappears under the reader (retention or delete-records ran after planning) is
data loss: an :class:`OffsetOutOfRangeError` with ``fail_on_data_loss``, else the reader skips to
what is still there.
"""
from __future__ import annotations

import struct
from typing import Iterator, Optional

from ..errors import CorruptRecordError, OffsetOutOfRangeError, StorageNotFoundError
from ..format.batch import (HEADER_SIZE_UP_TO_MAGIC, LOG_OVERHEAD, MAGIC_OFFSET, RECORD_OVERHEAD_V0,
                            V2_HEADER_SIZE, read_header)
from ..format.columnar import decode_columns, to_arrow
from ..log.segment import ReadStats
from ..log.transactions import aborted_mask

DEFAULT_MAX_BYTES = 4 << 20


def arrow_schema(include_headers: bool):
    """Spark's Kafka source schema as Arrow (what ``to_arrow_schema(..., timezone="UTC")``
    makes of ``datasource.kafka_schema``)."""
    import pyarrow as pa
    fields = [("key", pa.binary()), ("value", pa.binary()), ("topic", pa.string()),
              ("partition", pa.int32()), ("offset", pa.int64()),
              ("timestamp", pa.timestamp("us", tz="UTC")), ("timestampType", pa.int32())]
    if include_headers:
        fields.append(("headers", pa.list_(pa.field("element", pa.struct(
            [("key", pa.string()), ("value", pa.binary())])))))
    return pa.schema(fields)


def _end_bound(seg, end: int, limit: int) -> int:
    """A byte position by which the batch holding ``end - 1`` has ended, if below ``limit``.

    The first offset-index entry at or past ``end - 1`` points at a batch that holds ``end - 1``
    or comes after the one that does; one header read tells which, so the bound is exact.
    """
    import numpy as np
    offsets, positions = seg.offset_index()
    k = int(np.searchsorted(offsets, end - 1, side="left"))
    if k >= len(offsets) or positions[k] >= limit:
        return limit
    pos = int(positions[k])
    head = seg.read(pos, min(seg.size(), pos + V2_HEADER_SIZE))
    try:
        header = read_header(head, 0)
    except Exception:   # an index entry we cannot use costs bytes, never correctness
        return limit
    if header.base_offset >= end and pos > 0:
        return pos                      # end - 1 lies in an earlier batch
    return min(limit, pos + header.size)


_Q = struct.Struct(">q").unpack_from
_I = struct.Struct(">i").unpack_from


def _whole_entries(data, end: int):
    """``(length, last offset)`` of the run of whole entries at the start of ``data`` that may
    hold offsets below ``end``; length 0 if none.

    A lean walk (the decoder walks the entries again, with all their checks): it stops at a
    partial entry, and before an entry that cannot hold offsets < ``end`` (a compressed magic
    0/1 wrapper tells only its last offset, but the entry before it may already reach end - 1).
    """
    n = len(data)
    pos, last_offset = 0, None
    while pos + HEADER_SIZE_UP_TO_MAGIC < n:
        length = _I(data, pos + 8)[0]
        if length < RECORD_OVERHEAD_V0:
            raise CorruptRecordError(f"entry at position {pos} declares size {length}")
        if pos + LOG_OVERHEAD + length > n:
            break
        first = _Q(data, pos)[0]
        if data[pos + MAGIC_OFFSET] >= 2:
            if length + LOG_OVERHEAD < V2_HEADER_SIZE:
                raise CorruptRecordError(f"record batch at position {pos} is too short")
            base, last = first, first + _I(data, pos + 23)[0]
        else:
            base, last = -1, first
        if last_offset is not None and (last_offset >= end - 1 or base >= end):
            break
        pos += LOG_OVERHEAD + length
        last_offset = last
    return pos, last_offset


def _read_chunk(seg, offset: int, end: int, max_bytes: int):
    """Whole entries from the one holding ``offset``: ``(bytes, last offset)`` or None."""
    first = seg.find_batch(offset)
    if first is None:
        return None
    stop = _end_bound(seg, end, min(seg.size(), first.position + max_bytes))
    data = seg.read(first.position, max(stop, first.end))
    length, last_offset = _whole_entries(data, end)
    if not length:
        return None
    return (data if length == len(data) else memoryview(data)[:length]), last_offset


def to_record_batch(cols, topic: str, partition: int, schema, include_headers: bool,
                    aborted=(), start: Optional[int] = None, end: Optional[int] = None):
    """Decoded columns -> one Arrow record batch in Spark's Kafka schema, keeping the rows
    with ``start <= offset < end`` (offsets ascend within a partition); None if no rows."""
    import numpy as np
    import pyarrow as pa

    table = to_arrow(cols, with_headers=include_headers, batch_fields=bool(aborted))
    if start is not None or end is not None:
        offsets = np.frombuffer(cols.offset, dtype=np.int64)
        lo = 0 if start is None else int(np.searchsorted(offsets, start, side="left"))
        hi = len(offsets) if end is None else int(np.searchsorted(offsets, end, side="left"))
        if (lo, hi) != (0, len(offsets)):
            table = table.slice(lo, max(hi - lo, 0))
    if aborted:
        mask = aborted_mask(table.column("producerId").to_numpy(),
                            table.column("offset").to_numpy(),
                            table.column("isTransactional").to_numpy(zero_copy_only=False),
                            aborted)
        if mask.any():
            table = table.filter(pa.array(~mask))
    n = table.num_rows
    if n == 0:
        return None

    def col(name):
        return table.column(name).combine_chunks()

    timestamps = col("timestamp").cast(pa.timestamp("ms", tz="UTC"))
    try:
        timestamps = timestamps.cast(pa.timestamp("us", tz="UTC"))
    except pa.ArrowInvalid as exc:
        raise CorruptRecordError(f"{topic}-{partition}: a record timestamp does not fit Spark's "
                                 f"timestamp type ({exc})") from None
    arrays = [col("key"), col("value"), pa.repeat(topic, n),
              pa.array(np.full(n, partition, dtype=np.int32)), col("offset"), timestamps,
              col("timestampType")]
    if include_headers:
        arrays.append(col("headers").cast(schema.field("headers").type))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def read_range(task, *, include_headers: bool, fail_on_data_loss: bool = True,
               stats: Optional[ReadStats] = None, max_bytes: int = DEFAULT_MAX_BYTES
               ) -> Iterator:
    """Yield Arrow record batches of ``task`` (a :class:`read_plan.ReadTask`)."""
    schema = arrow_schema(include_headers)
    handle = task.handle
    name = f"{handle.topic}-{handle.partition}"
    log = handle.open(stats=stats)
    offset, end = task.start, task.end

    def lost(what: str) -> OffsetOutOfRangeError:
        return OffsetOutOfRangeError(
            f"{name}: {what} after the read was planned (retention or delete-records ran). Some "
            "data may have been lost; set the option failOnDataLoss to false to read what is "
            "still there instead of failing")

    if offset < log.log_start_offset:
        if fail_on_data_loss:
            raise lost(f"offsets from {offset} to {log.log_start_offset} were deleted")
        offset = log.log_start_offset
    segments = log.segments
    i = log.segment_for(offset) or 0
    while offset < end:
        # offsets the plan promised but no listed segment holds were deleted since planning
        gap_end = end if i >= len(segments) else min(end, segments[i].base_offset)
        if offset < gap_end:
            missing = handle.promised(offset, gap_end)
            if missing is not None and fail_on_data_loss:
                raise lost(f"offset {missing} was deleted")
            offset = gap_end
            continue
        if i >= len(segments):
            break
        seg = segments[i]
        if i + 1 < len(segments) and segments[i + 1].base_offset <= offset:
            i += 1
            continue
        try:
            chunk = _read_chunk(seg, offset, end, max_bytes)
        except StorageNotFoundError:
            if fail_on_data_loss:
                raise lost(f"segment {seg.log_path} (offsets from {seg.base_offset}) was "
                           "deleted") from None
            i += 1
            continue
        if chunk is None:
            i += 1
            continue
        data, last_offset = chunk
        if last_offset < offset:
            raise CorruptRecordError(f"{seg.log_path}: offsets stop increasing at {last_offset} "
                                     f"(reading from {offset}); run `kafkalog recover`")
        # whole batches, trimmed to [offset, end) afterwards as Arrow slices: the decoder's
        # own min/max trimming walks rows in Python
        cols = decode_columns(data, skip_control=True, with_headers=include_headers)
        lo = offset
        offset = last_offset + 1
        if len(cols):
            batch = to_record_batch(cols, handle.topic, handle.partition, schema,
                                    include_headers, task.aborted, lo, end)
            if batch is not None:
                yield batch
