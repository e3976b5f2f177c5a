"""Reading one planned offset range into Arrow record batches: the executor half of the source.

The bytes read follow the range, not the partition: the offset index takes the first read to
within one ``index.interval.bytes`` of ``start`` (log/segment.py), and each read stops about one
index interval past the batch holding ``end - 1`` (the next index entry after it bounds where
that batch can end). Reads are whole batches, at most ``max_bytes`` (plus one batch) at a time,
each starting where the last one stopped; a cluster's immutable segments are read through a
mapping, anything else into Arrow-pool buffers. Each chunk becomes one Arrow record batch
through ``arrow.arrow_decode`` (straight into Spark's layout, in C) or, where that route
declines, the columnar decoder: records never become Python objects.

Rows come out exactly in Spark's Kafka source schema: key, value, topic, partition, offset,
timestamp (microseconds, UTC), timestampType, and headers when asked. Control records are never
returned; under read_committed the rows of aborted Kafka transactions (found while planning) are
dropped.

Data the plan promised and storage no longer holds is data loss, of one of two kinds, told apart
by the cluster's metadata as it is now (read once, on this path only): offsets that retention or
delete-records removed after the read was planned (the log start offset moved past them: an
:class:`OffsetOutOfRangeError`), and committed offsets whose segment file is missing while the
metadata still holds them (data lost on storage: a :class:`MissingCommittedDataError` naming the
``repair`` command that shows and mends the loss). With ``fail_on_data_loss`` false the reader
logs a warning naming the range and skips to what is still there.
"""
from __future__ import annotations

import functools
import logging

from typing import Callable, Iterator, List, Optional, Tuple

from ..errors import (CorruptRecordError, KafkaLogError, MissingCommittedDataError,
                      OffsetOutOfRangeError, StorageNotFoundError)
from ..log.partition import raise_if_log_dir_away
from ..format.batch import V2_HEADER_SIZE, read_header, scan_offsets
from ..arrow.arrow_decode import decode_spark_arrays
from ..format.columnar import arrow_arrays, decode_columns
from ..log.segment import ReadStats
from ..log.transactions import aborted_mask
from ..cluster.isr import committed_missing

DEFAULT_MAX_BYTES = 1 << 20
_log = logging.getLogger(__name__)


@functools.lru_cache(maxsize=2)
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


def _stop(seg, end: int, limit: int, mapped: bool) -> int:
    """Where a chunk's read may stop. A mapped segment costs nothing past ``end`` (the walk
    stops at the first entry beyond it), so only a copying read is bounded, through the offset
    index: reading every small partition's index just for that was ~10% of a packed task."""
    return limit if mapped else _end_bound(seg, end, limit)


def _unread(seg, mapped: bool, n: int) -> None:
    """A mapped chunk's bytes past its last whole entry below ``end`` were never touched (only
    the header that ends the walk): they are not counted as read."""
    if mapped and n > 0:
        seg.stats.log_bytes -= n


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


def _whole_entries(data, end: int, seg, position: int, previous_last_offset: Optional[int]):
    """``(length, last offset)`` of the run of whole entries at the start of ``data`` (read
    from ``position`` of ``seg``) that may hold offsets below ``end``; length 0 if none.

    The walk is ``format.batch``'s (``scan_offsets``: sizes, magic, and offsets increasing from
    ``previous_last_offset``, the last offset before ``position`` when known); CRCs and records
    are the decoder's. It stops at a partial entry, and before an entry that cannot hold offsets
    < ``end`` (a compressed magic 0/1 wrapper tells only its last offset, but the entry before it
    may already reach end - 1).
    """
    length, last_offset = 0, None
    for at, size, base, last in scan_offsets(data, previous_last_offset=previous_last_offset,
                                             file=seg.log_path, base_position=position):
        if last_offset is not None and (last_offset >= end - 1 or base >= end):
            break
        length, last_offset = at + size - position, last
    return length, last_offset


def _read_bytes(seg, start: int, stop: int, mapped: bool):
    """``[start, stop)`` of the segment: through a mapping when ``mapped`` (the segment is
    immutable) and the storage can map, else into a buffer from Arrow's memory pool.

    Why not ``seg.read``: a fresh ``bytes`` per chunk is an allocation the C allocator maps and
    unmaps each time, and its page faults cost as much as decoding the chunk; Arrow's pool
    keeps its pages. A mapping saves the copy out of the page cache as well."""
    if mapped:
        view = seg.read_view(start, stop)
        if view is not None:
            return view
    import pyarrow as pa
    return seg.read_into(start, pa.allocate_buffer(max(stop - start, 0)))


def _read_chunk(seg, offset: int, end: int, max_bytes: int, position: Optional[int] = None,
                mapped: bool = False, previous_last_offset: Optional[int] = None):
    """Whole entries from the one holding ``offset``: ``(bytes, start position, last offset)``
    or None.

    ``position``, when known, is where the previous chunk of this segment stopped: the entry
    there is the next one, so no index lookup and header walk (an extra storage request) is
    needed, and its offsets must come after ``previous_last_offset`` (the previous chunk's
    last). If a single entry there is larger than ``max_bytes``, its header is read to size it.
    """
    size = seg.size()
    mapped = mapped and seg.mapped()
    if position is not None and position < size:
        stop = _stop(seg, end, min(size, position + max_bytes), mapped)
        data = _read_bytes(seg, position, stop, mapped)
        length, last_offset = _whole_entries(data, end, seg, position, previous_last_offset)
        _unread(seg, mapped, len(data) - length)
        if length:
            return data[:length], position, last_offset
    first = seg.find_batch(offset)
    if first is None:
        return None
    stop = _stop(seg, end, min(size, first.position + max_bytes), mapped)
    data = _read_bytes(seg, first.position, max(stop, first.end), mapped)
    length, last_offset = _whole_entries(data, end, seg, first.position,
                                         seg.base_offset - 1 if first.position == 0 else None)
    _unread(seg, mapped, len(data) - length)
    if not length:
        return None
    return data[:length], first.position, last_offset


_MAX_MS = (1 << 63) // 1000   # |ms| below this fits Spark's microsecond timestamps


class _Constants:
    """The ``topic`` and ``partition`` columns, built once per range and sliced per batch."""

    def __init__(self, topic: str, partition: int):
        self.topic, self.partition, self._n = topic, partition, 0
        self._topic = self._partition = None

    def get(self, n: int):
        import numpy as np
        import pyarrow as pa
        if n > self._n:
            self._n = max(n, 2 * self._n, 1 << (n - 1).bit_length())
            self._topic = _topic_column(self.topic, self._n)
            self._partition = pa.array(np.full(self._n, self.partition, dtype=np.int32))
        return self._topic.slice(0, n), self._partition.slice(0, n)


@functools.lru_cache(maxsize=64)
def _topic_column(topic: str, n: int):
    """One topic's column, shared by the ranges of a packed task (a task reads hundreds of
    small partitions of one topic: building it per range was ~10% of such a task). Lengths
    are rounded up to a power of two so that ranges of similar size share one array."""
    import pyarrow as pa
    return pa.repeat(topic, n)


def _assemble(arrays: dict, offsets, consts: _Constants, schema, include_headers: bool,
              start: Optional[int], end: Optional[int], mask=None):
    """One Arrow record batch in Spark's schema from decoded ``arrays`` (key, value, offset,
    timestamp in us, timestampType, headers), keeping ``start <= offset < end`` and, if given,
    the rows ``mask`` does not drop. Arrays are sliced, never concatenated."""
    import pyarrow as pa
    import numpy as np
    lo, hi = 0, len(offsets)
    if start is not None:
        lo = int(np.searchsorted(offsets, start, side="left"))
    if end is not None:
        hi = max(lo, int(np.searchsorted(offsets, end, side="left")))
    n = hi - lo
    if n <= 0:
        return None
    whole = (lo, hi) == (0, len(offsets))

    def cut(name):
        return arrays[name] if whole else arrays[name].slice(lo, n)
    topic, partition = consts.get(n)
    columns = [cut("key"), cut("value"), topic, partition, cut("offset"), cut("timestamp"),
               cut("timestampType")] + ([cut("headers")] if include_headers else [])
    batch = pa.RecordBatch.from_arrays(columns, schema=schema)
    if mask is not None:
        keep = mask[lo:hi]
        if not keep.all():
            batch = batch.filter(pa.array(keep))
    return batch if batch.num_rows else None


def to_record_batch(cols, topic: str, partition: int, schema, include_headers: bool,
                    aborted=(), start: Optional[int] = None, end: Optional[int] = None,
                    consts: Optional[_Constants] = None):
    """Decoded columns -> one Arrow record batch in Spark's Kafka schema, keeping the rows
    with ``start <= offset < end`` (offsets ascend within a partition); None if no rows."""
    import numpy as np
    import pyarrow as pa

    arrays = arrow_arrays(cols, with_headers=include_headers, batch_fields=bool(aborted))
    offsets = np.frombuffer(cols.offset, dtype=np.int64)
    lo = 0 if start is None else int(np.searchsorted(offsets, start, side="left"))
    hi = len(offsets) if end is None else int(np.searchsorted(offsets, end, side="left"))
    ms = np.frombuffer(cols.timestamp, dtype=np.int64)
    kept = ms[lo:max(lo, hi)]
    if len(kept) and (int(kept.min()) <= -_MAX_MS or int(kept.max()) >= _MAX_MS):
        raise CorruptRecordError(f"{topic}-{partition}: a record timestamp does not fit Spark's "
                                 "timestamp type (microseconds in a 64-bit integer)")
    # rows outside [lo, hi) are sliced away: only the kept ones must fit Spark's type
    us = np.where((ms > -_MAX_MS) & (ms < _MAX_MS), ms, 0) * 1000
    arrays["timestamp"] = pa.array(us, pa.timestamp("us", tz="UTC"))
    if include_headers:
        arrays["headers"] = arrays["headers"].cast(schema.field("headers").type)
    mask = None
    if aborted and len(offsets):
        mask = ~aborted_mask(arrays["producerId"].to_numpy(), offsets,
                             arrays["isTransactional"].to_numpy(zero_copy_only=False), aborted)
    return _assemble(arrays, offsets, consts or _Constants(topic, partition), schema,
                     include_headers, start, end, mask)


def _decode(data, task, include_headers: bool, schema, consts: _Constants, start: int, end: int):
    """One chunk of whole entries -> a record batch (or None): the fast Arrow route when it
    takes the chunk, else the general decoder (which also raises any corruption)."""
    if not task.aborted:
        arrays = decode_spark_arrays(data, with_headers=include_headers)
        if arrays is not None:
            import numpy as np
            offsets = np.frombuffer(arrays["offset"].buffers()[1], dtype=np.int64,
                                    count=arrays["rows"])
            return _assemble(arrays, offsets, consts, schema, include_headers, start, end)
    cols = decode_columns(data, skip_control=True, with_headers=include_headers)
    if not len(cols):
        return None
    handle = task.handle
    return to_record_batch(cols, handle.topic, handle.partition, schema, include_headers,
                           task.aborted, start, end, consts)


def _damaged(handle, seg, exc: CorruptRecordError, position: Optional[int]):
    """A corrupt read as an error naming the segment file and the command that fixes it: the
    cluster's repair, or for a Kafka log dir (a copy; never a live broker's) Kafka's recovery."""
    from ..maintenance.repair import damaged_segment_error, repair_command
    from .sources import CLUSTER
    if handle.kind == CLUSTER:
        fix = repair_command(handle.url, handle.topic, handle.partition)
    else:
        fix = f"kafkalog recover {handle.url.rstrip('/')}/{handle.dir}"
    return damaged_segment_error(exc, seg, position, fix)


def _current_partition(handle):
    """The partition's state as the cluster's metadata says now, or None (a Kafka log dir, a
    partition that is gone, metadata that cannot be read). One replay of what is new in the
    metadata log: called on the data-loss path only."""
    from .sources import CLUSTER
    if handle.kind != CLUSTER:
        return None
    from ..cluster.cluster import Cluster
    try:
        cluster = Cluster(handle.url, create=False, shared_state=True, **handle.storage_options)
        return cluster.state().partition(handle.topic, handle.partition)
    except (KafkaLogError, OSError):
        return None


def missing_committed_message(topic: str, partition: int, url: str, what: str,
                              log_start_offset: int, advice: bool = True,
                              plural: bool = False) -> str:
    """The text of a :class:`MissingCommittedDataError` for a read: ``what`` is missing from
    storage while the metadata still holds it (``plural``: them) as committed. ``advice``: name
    failOnDataLoss."""
    from ..maintenance.repair import repair_command
    fix = repair_command(url.rstrip("/"), topic, partition)
    them = "them" if plural else "it"
    return (f"{topic}-{partition}: {what}, yet the metadata still holds {them} as committed (the "
            f"log start offset is {log_start_offset}: neither retention nor delete-records "
            "removed it). A committed segment is missing: data lost on storage (a deleted "
            "file, or a machine crash before an unflushed write reached the device). "
            f"`{fix} --dry-run` shows the offsets lost, and `{fix}` makes them a gap that "
            "readers step over" + (". Set the option failOnDataLoss to false to read what is "
                                   "still there instead of failing" if advice else ""))


def missing_committed(handle, log, start: int, end: int,
                      end_of: Callable[[object], Optional[int]]) -> List[Tuple[int, int]]:
    """``[first, last]`` runs of offsets in ``[start, end)`` that the metadata of ``handle`` (a
    cluster partition as planned) holds as committed and that none of ``log``'s listed segments
    holds: data lost on storage, found before reading. ``end_of(segment)`` is the offset after
    the segment's last entry (a read of its tail; the caller caches it, segment files being
    immutable), or None when it cannot tell, which makes this return nothing for the range (the
    reading task finds what is missing)."""
    from ..cluster.partition_state import PartitionState
    from .sources import CLUSTER
    if handle.kind != CLUSTER or handle.state is None:
        return []
    ps = PartitionState.from_json(handle.state)
    lo, hi = max(start, ps.log_start_offset), min(end, handle.high_watermark)
    if not any(max(s, lo) < min(e, hi) for s, e, _ in ps.committed):
        return []
    held = []
    segments = log.segments
    for i, seg in enumerate(segments):
        if seg.base_offset >= hi:
            break
        if i + 1 < len(segments) and segments[i + 1].base_offset <= lo:
            continue                                # wholly below the range
        seg_end = end_of(seg)
        if seg_end is None:
            return []
        held.append((seg.base_offset, seg_end))
    return [(s, e - 1) for s, e in committed_missing(ps, [[lo, hi]], held)]


def read_range(task, *, include_headers: bool, fail_on_data_loss: bool = True,
               stats: Optional[ReadStats] = None, max_bytes: int = DEFAULT_MAX_BYTES,
               on_fetch: Optional[Callable[[int], object]] = None) -> Iterator:
    """Yield Arrow record batches of ``task`` (a :class:`read_plan.ReadTask`).
    ``on_fetch(nbytes)`` is called after each chunk is read and before it is decoded and handed
    out: where a client over its fetch quota waits (KIP-13)."""
    schema = arrow_schema(include_headers)
    handle = task.handle
    name = f"{handle.topic}-{handle.partition}"
    log = handle.open(stats=stats)
    offset, end = task.start, task.end

    now = []      # the partition's metadata as it is now, read at the first loss

    def lost(what: str, first: int) -> OffsetOutOfRangeError:
        """``what`` (from offset ``first`` on) is not on storage: deleted by retention or
        delete-records after planning, or a committed segment missing (told apart by the
        metadata as it is now). Without ``fail_on_data_loss`` the caller skips it: warned."""
        from .sources import CLUSTER
        if handle.kind == CLUSTER:   # files on a root that is away are not lost (§1.3)
            raise_if_log_dir_away(log.storage, log.dir, name)
        if not now:
            now.append(_current_partition(handle))
        ps = now[0]
        if (ps is not None and ps.log_start_offset <= first < ps.high_watermark
                and ps.is_committed(first)):
            error = MissingCommittedDataError(missing_committed_message(
                handle.topic, handle.partition, handle.url, f"{what} from storage",
                ps.log_start_offset))
        else:
            moved = (f": the log start offset is now {ps.log_start_offset}"
                     if ps is not None and ps.log_start_offset > first else "")
            error = OffsetOutOfRangeError(
                f"{name}: {what} after the read was planned (retention or delete-records "
                f"ran{moved}). Some data may have been lost; set the option failOnDataLoss to "
                "false to read what is still there instead of failing")
        if not fail_on_data_loss:
            _log.warning("%s; failOnDataLoss=false: skipping it", error)
        return error

    if offset < log.log_start_offset:
        error = lost(f"offsets from {offset} to {log.log_start_offset} were deleted", offset)
        if fail_on_data_loss:
            raise error
        offset = log.log_start_offset
    consts = _Constants(handle.topic, handle.partition)
    segments = log.segments
    i = log.segment_for(offset) or 0
    # looked at again after a miss (a merge's covered segment, retention): once per missing
    # file, so a listing that keeps naming a file that is gone ends as data loss
    missed = set()
    rewritten = set()   # segments found replaced under this read (a log clean), looked at anew
    position = None   # where the next entry of segments[i] starts, once a chunk was read there
    last_offset = None   # the last offset of the chunk read before, at position
    while offset < end:
        # offsets the plan promised but no listed segment holds were deleted since planning
        gap_end = end if i >= len(segments) else min(end, segments[i].base_offset)
        if offset < gap_end:
            missing = handle.promised(offset, gap_end)
            if missing is not None:
                error = lost(f"offset {missing} was deleted", missing)   # raises if the
                # root is away
                if fail_on_data_loss:
                    raise error
            offset = gap_end
            continue
        if i >= len(segments):
            break
        seg = segments[i]
        if i + 1 < len(segments) and segments[i + 1].base_offset <= offset:
            i, position = i + 1, None
            continue
        try:
            chunk = _read_chunk(seg, offset, end, max_bytes, position, handle.immutable,
                                last_offset)
        except StorageNotFoundError:
            if seg.base_offset not in missed:   # the listing is stale: look again first
                missed.add(seg.base_offset)
                log.refresh()
                segments = log.segments
                i, position = log.segment_for(offset) or 0, None
                continue
            error = lost(f"segment {seg.log_path} (offsets from {seg.base_offset}) was "
                         "deleted", max(offset, seg.base_offset))
            if fail_on_data_loss:
                raise error from None
            i, position = i + 1, None
            continue
        except CorruptRecordError as exc:
            # a log clean replaced the file after this read listed it (docs/protocol.md §4.2):
            # the offsets not read yet are in the new file (the same records, or the latest of
            # their keys), so the read goes on there, as a Kafka consumer does after the
            # cleaner swapped a segment
            if seg.base_offset not in rewritten and seg.replaced():
                rewritten.add(seg.base_offset)
                log.refresh()
                segments = log.segments
                i, position, last_offset = log.segment_for(offset) or 0, None, None
                continue
            raise _damaged(handle, seg, exc, 0 if position is None else position) from None
        if chunk is None:
            i, position = i + 1, None
            continue
        data, start_position, last_offset = chunk
        if last_offset < offset:
            raise _damaged(handle, seg, CorruptRecordError(
                f"offsets stop increasing at {last_offset} (reading from {offset})"), None)
        position = start_position + len(data)
        if on_fetch is not None:
            on_fetch(len(data))
        # whole batches, trimmed to [offset, end) afterwards as Arrow slices: the decoder's
        # own min/max trimming walks rows in Python
        try:
            batch = _decode(data, task, include_headers, schema, consts, offset, end)
        except CorruptRecordError as exc:
            raise _damaged(handle, seg, exc, start_position) from None
        offset = last_offset + 1
        if batch is not None:
            yield batch
