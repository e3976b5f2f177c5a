"""The log cleaner's core: Kafka's ``LogCleaner`` rules (``buildOffsetMap``, ``cleanSegments``,
``cleanInto``, ``shouldRetainRecord``, ``shouldDiscardBatch``, ``MemoryRecords.filterTo``) as
pure functions over ``.log`` bytes. No storage, no metadata: which segments are cleaned, when,
and how the result is published are the callers' (docs/compaction.md has the rules, and where
we differ from Kafka and why).

A cleaning *round* (Kafka's ``doClean``):

1. :func:`build_offset_map` puts the keys of the dirty range ``[first dirty, first
   uncleanable)`` into an :class:`~.offset_map.OffsetMap` until it is full, and returns the end
   of the range it covers (Kafka's ``offsetMap.latestOffset + 1``);
2. every segment below that end, from the log start, is cleaned, in groups that each become one
   segment named after its first source (:func:`clean_segments`, with one
   :class:`TransactionMetadata` for the round);
3. the next round starts where this one's map ended (a map that filled makes several rounds).

:func:`clean_log` runs rounds over segments in memory (tools, tests, small logs). Records are
decoded by ``format.columnar`` (the C reader), keys hashed and looked up in whole runs, and a
batch whose records all survive is copied byte for byte; others are rebuilt from their records'
own bytes (``_encode_accel.filter_v2_records``), so offsets, timestamps and headers never pass
through Python objects.
"""
from __future__ import annotations

import heapq
import struct
from dataclasses import dataclass, field, fields
from typing import (Dict, Iterable, List, Mapping, NamedTuple, Optional, Sequence, Tuple)

import numpy as np

from ..errors import CorruptRecordError
from ..format import accel, codecs
from ..format import index as idx
from ..format.batch import (LOG_OVERHEAD, V2_CRC_START, V2_HEADER, V2_HEADER_SIZE,
                            BatchHeader, read_header)
from ..format.columnar import Columns, decode_columns
from ..format.crc import crc32c
from ..format.encode import encode_message_set
from ..format.index_builder import IndexBuilder
from ..format.records import (CONTROL_ABORT, CONTROL_BIT, CONTROL_COMMIT, LOG_APPEND_TIME,
                              MAGIC_V2, NO_TIMESTAMP, TIMESTAMP_TYPE_BIT, TRANSACTIONAL_BIT,
                              Record)
from ..format.varint import decode_varint, encode_varint
from .offset_map import OffsetMap, key_digests

_filter_v2 = accel.ENCODE.filter_v2_records if accel.ENCODE is not None else None

#: Kafka's ``delete.retention.ms`` default (1 day).
DEFAULT_DELETE_RETENTION_MS = 86_400_000
_CONTROL_KEY = struct.Struct(">hh")


class AbortedTxn(NamedTuple):
    """One aborted transaction (Kafka's ``AbortedTxn`` without the LSO): its producer, the
    first offset of its data and the offset of its ABORT marker (``transactions.AbortedRange``
    has the same shape)."""

    producer_id: int
    first_offset: int
    last_offset: int


class LastRecord(NamedTuple):
    """A producer's state the cleaner must not lose (Kafka's ``LastRecord``): the last offset
    of its last data batch (None when it wrote none the log still holds) and its epoch."""

    last_data_offset: Optional[int]
    producer_epoch: int


class SourceSegment(NamedTuple):
    """A segment to clean: its base offset, its ``.log`` bytes and its last-modified time
    (only the magic 0/1 tombstone rule reads it)."""

    base_offset: int
    data: bytes
    last_modified_ms: int = 0


@dataclass
class CleanerStats:
    """Kafka's ``CleanerStats``, the counters a round reports."""

    map_bytes_read: int = 0
    map_records_read: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    batches_read: int = 0
    batches_written: int = 0
    records_read: int = 0
    records_kept: int = 0
    #: records without a key in the cleaned range (Kafka's ``invalidMessage``), removed
    invalid_records: int = 0

    def add(self, other: "CleanerStats") -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


class TransactionMetadata:
    """Kafka's ``CleanedTransactionMetadata``: the transactions a walk in offset order has
    seen, to tell aborted data batches (removed) and markers that may go (no data of their
    transaction seen in this round). One per map build and one per cleaning round.

    ``retained_aborted``: the aborted transactions whose marker stays because data of theirs
    was seen (Kafka writes them to the cleaned segment's ``.txnindex``)."""

    def __init__(self, aborted: Iterable[Tuple[int, int, int]] = ()):
        self._pending: List[Tuple[int, int, int]] = []   # heap by first offset
        self._seen = set()
        self._committed = set()                          # producer ids with data seen
        #: producer id -> [AbortedTxn, last observed batch offset or None]
        self._aborted: Dict[int, list] = {}
        self.retained_aborted: List[AbortedTxn] = []
        self.add_aborted(aborted)

    def add_aborted(self, aborted: Iterable[Tuple[int, int, int]]) -> None:
        for pid, first, last in aborted:
            if (pid, first, last) not in self._seen:
                self._seen.add((pid, first, last))
                heapq.heappush(self._pending, (first, pid, last))

    def _consume_up_to(self, offset: int) -> None:
        pending = self._pending
        while pending and pending[0][0] <= offset:
            first, pid, last = heapq.heappop(pending)
            self._aborted.setdefault(pid, [AbortedTxn(pid, first, last), None])

    def on_batch_read(self, h: BatchHeader) -> bool:
        """A data batch: True if it belongs to an aborted transaction (may be discarded)."""
        self._consume_up_to(h.last_offset)
        if not h.is_transactional:
            return False
        ongoing = self._aborted.get(h.producer_id)
        if ongoing is not None:
            ongoing[1] = h.last_offset
            return True
        self._committed.add(h.producer_id)
        return False

    def on_control_batch_read(self, h: BatchHeader, control_type: Optional[int]) -> bool:
        """A control batch (``control_type`` None when it holds no record): True if it may
        be discarded, that is no data of its transaction was seen since it began."""
        self._consume_up_to(h.last_offset)
        if control_type is None:
            return True      # already emptied by an earlier clean
        if control_type == CONTROL_ABORT:
            ongoing = self._aborted.pop(h.producer_id, None)
            if ongoing is not None and ongoing[1] is not None:
                self.retained_aborted.append(ongoing[0])
                return False
            return True
        if control_type == CONTROL_COMMIT:
            if h.producer_id in self._committed:
                self._committed.discard(h.producer_id)
                return False
            return True
        return False


def _segment_ends(segments: Sequence[SourceSegment], end: int) -> List[int]:
    return [s.base_offset for s in segments[1:]] + [end]


def _decode(seg_data, file: Optional[str] = None) -> Columns:
    try:
        return decode_columns(seg_data, validate=True, with_headers=False)
    except CorruptRecordError as exc:
        if file:
            exc.args = (f"{file}: {exc.args[0]}",) + exc.args[1:]
        raise


def _batch_rows(cols: Columns) -> np.ndarray:
    """Row bounds of each decoded batch: batch ``b`` is rows ``[r[b], r[b+1])``."""
    counts = np.frombuffer(cols.batch_counts, dtype=np.int64) if len(cols.batch_counts) else \
        np.zeros(0, dtype=np.int64)
    bounds = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=bounds[1:])
    return bounds


def _control_type(cols: Columns, row: int, count: int) -> Optional[int]:
    if not count:
        return None
    ko = cols.key_offsets
    key = bytes(cols.key_data[ko[row]:ko[row + 1]])
    if not cols.key_valid[row] or len(key) < _CONTROL_KEY.size:
        raise CorruptRecordError("control batch without a valid control record key")
    return _CONTROL_KEY.unpack_from(key)[1]


def _digests(cols: Columns) -> np.ndarray:
    return key_digests(np.frombuffer(cols.key_offsets, dtype=np.int64), cols.key_data)


# -- 1. the offset map ------------------------------------------------------------------------

def build_offset_map(segments: Sequence[SourceSegment], offset_map: OffsetMap,
                     start_offset: int, end_offset: int,
                     aborted: Iterable[Tuple[int, int, int]] = (),
                     stats: Optional[CleanerStats] = None) -> int:
    """Kafka's ``buildOffsetMap``: clear ``offset_map`` and put the keys of the dirty range
    ``[start_offset, end_offset)`` of ``segments`` (the segments holding it, in order) into it
    until it is full. Data of aborted transactions and control records are left out.

    Returns the end (exclusive) of the range the map covers: ``end_offset`` when every key fit,
    else the offset of the first record whose key did not. Records from there on are kept by
    :func:`clean_segments` (past the map's ``latest_offset``), for the next round.
    """
    offset_map.clear()
    stats = stats if stats is not None else CleanerStats()
    # Kafka's collectAbortedTransactions(start, end): those overlapping the dirty range (one
    # that ended before it would otherwise stay "ongoing" for its producer's later batches)
    txn = TransactionMetadata(t for t in aborted if t[2] >= start_offset and t[1] < end_offset)
    segs = list(segments)
    for seg, next_start in zip(segs, _segment_ends(segs, end_offset)):
        if next_start <= start_offset:
            continue
        if _map_segment(seg, offset_map, start_offset, next_start, txn, stats):
            break
    return offset_map.latest_offset + 1


def _map_segment(seg: SourceSegment, offset_map: OffsetMap, start: int, next_start: int,
                 txn: TransactionMetadata, stats: CleanerStats) -> bool:
    data = seg.data
    cols = _decode(data)
    bounds = _batch_rows(cols)
    nb = len(cols.batches)
    eligible_batch = np.zeros(nb, dtype=bool)
    batch_last = np.full(nb, -1, dtype=np.int64)
    for b, batch in enumerate(cols.batches):
        h = read_header(data, batch[6])
        if h.is_control:
            txn.on_control_batch_read(h, _control_type(cols, int(bounds[b]),
                                                       int(bounds[b + 1] - bounds[b])))
        else:
            eligible_batch[b] = not txn.on_batch_read(h)
        if h.last_offset >= start:
            batch_last[b] = h.last_offset
    stats.map_bytes_read += len(data)
    offs = np.frombuffer(cols.offset, dtype=np.int64) if len(cols.offset) else \
        np.zeros(0, dtype=np.int64)
    counts = np.diff(bounds)
    rows_batch = np.repeat(np.arange(nb), counts)
    keyed = np.frombuffer(cols.key_valid, dtype=np.uint8).astype(bool) if len(offs) else \
        np.zeros(0, dtype=bool)
    eligible = np.flatnonzero(eligible_batch[rows_batch] & keyed & (offs >= start)) if nb else \
        np.zeros(0, dtype=np.int64)
    digests = _digests(cols)[eligible]
    done = offset_map.put_many(digests, offs[eligible])
    if done < len(eligible):
        cut_batch = int(rows_batch[eligible[done]])
        stats.map_records_read += int(eligible[done])
        before = int(batch_last[:cut_batch].max()) if cut_batch else -1
        offset_map.update_latest_offset(max(offset_map.latest_offset, before))
        return True
    stats.map_records_read += len(offs)
    last = int(batch_last.max()) if nb else -1
    offset_map.update_latest_offset(max(offset_map.latest_offset, last, next_start - 1))
    return False


# -- 2. cleaning a group ----------------------------------------------------------------------

@dataclass
class CleanedSegment:
    """A cleaned group: the new segment (named after ``base_offset``, its first source's) as
    pieces of its ``.log``, its indexes (what Kafka's recovery would rebuild), the aborted
    transactions its ``.txnindex`` holds, and the group's statistics."""

    base_offset: int
    pieces: List[bytes] = field(repr=False)
    size: int
    index: bytes = field(repr=False)
    timeindex: bytes = field(repr=False)
    #: Kafka gives the cleaned segment the last source's last-modified time
    last_modified_ms: int
    aborted_txns: List[AbortedTxn]
    stats: CleanerStats
    #: the last offset of its last batch, or None when nothing survived
    last_offset: Optional[int] = None

    @property
    def data(self) -> bytes:
        return b"".join(self.pieces)


def legacy_delete_horizon_ms(last_clean_segment_modified_ms: Optional[int],
                             delete_retention_ms: int) -> int:
    """Kafka's horizon for magic 0/1 tombstones: the last-modified time of the last segment of
    the already clean section, less ``delete.retention.ms``; 0 when nothing was cleaned yet.
    A magic 0/1 tombstone is removed from a segment last modified at or before it."""
    if last_clean_segment_modified_ms is None:
        return 0
    return last_clean_segment_modified_ms - delete_retention_ms


def _filter_records_py(records, count: int, keep, ts_shift: int) -> bytes:
    """The Python twin of ``_encode_accel.filter_v2_records``."""
    out = bytearray()
    pos = 0
    mv = memoryview(records)
    for i in range(count):
        length, p = decode_varint(records, pos)
        nxt = p + length
        if length < 1 or nxt > len(records):
            raise ValueError("filter_v2_records: malformed record")
        if keep[i]:
            if not ts_shift:
                out += mv[pos:nxt]
            else:
                delta, q = decode_varint(records, p + 1)
                body = (mv[p:p + 1].tobytes() + encode_varint(delta - ts_shift)
                        + mv[q:nxt].tobytes())
                out += encode_varint(len(body)) + body
        pos = nxt
    return bytes(out)


def filter_records(records, count: int, keep: np.ndarray, ts_shift: int = 0) -> bytes:
    """The kept records of an uncompressed magic 2 records section (see the C twin)."""
    keep = np.ascontiguousarray(keep, dtype=np.uint8)
    if _filter_v2 is not None:
        return _filter_v2(records, count, keep, ts_shift)
    return _filter_records_py(records, count, keep, ts_shift)


def _v2_batch(h: BatchHeader, records: bytes, count: int, base_ts: int, max_ts: int,
              horizon: bool) -> bytes:
    """A magic 2 batch with ``h``'s fields and last offset (Kafka's ``overrideLastOffset``:
    the producer's last sequence stays), the given records (compressed with ``h``'s codec)."""
    codec = h.compression
    payload = codecs.compress(codec, records, MAGIC_V2) if codec else records
    attrs = h.attributes | (0x40 if horizon else 0)
    buf = bytearray(V2_HEADER_SIZE + len(payload))
    V2_HEADER.pack_into(buf, 0, h.base_offset, len(buf) - LOG_OVERHEAD,
                        h.partition_leader_epoch, MAGIC_V2, 0, attrs,
                        h.last_offset - h.base_offset, base_ts, max_ts, h.producer_id,
                        h.producer_epoch, h.base_sequence, count)
    buf[V2_HEADER_SIZE:] = payload
    struct.pack_into(">I", buf, 17, crc32c(memoryview(buf)[V2_CRC_START:]))
    return bytes(buf)


def empty_batch(h: BatchHeader) -> bytes:
    """Kafka's ``DefaultRecordBatch.writeEmptyHeader`` for a batch whose records all went but
    whose producer state must stay: same offsets, producer id, epoch, base sequence, leader
    epoch, timestamp type, transactional and control flags and max timestamp; no records, no
    codec, no delete horizon, base timestamp -1."""
    attrs = h.attributes & (TIMESTAMP_TYPE_BIT | TRANSACTIONAL_BIT | CONTROL_BIT)
    buf = bytearray(V2_HEADER_SIZE)
    V2_HEADER.pack_into(buf, 0, h.base_offset, V2_HEADER_SIZE - LOG_OVERHEAD,
                        h.partition_leader_epoch, MAGIC_V2, 0, attrs,
                        h.last_offset - h.base_offset, NO_TIMESTAMP, h.max_timestamp,
                        h.producer_id, h.producer_epoch, h.base_sequence, 0)
    struct.pack_into(">I", buf, 17, crc32c(memoryview(buf)[V2_CRC_START:]))
    return bytes(buf)


def _is_last_of_producer(h: BatchHeader, last_records: Mapping[int, LastRecord]) -> bool:
    last = last_records.get(h.producer_id)
    if last is None:
        return False
    if last.last_data_offset is not None:
        return h.last_offset == last.last_data_offset
    return h.is_control and h.producer_epoch == last.producer_epoch


def clean_segments(sources: Sequence[SourceSegment], offset_map: OffsetMap, *, now_ms: int,
                   delete_retention_ms: int = DEFAULT_DELETE_RETENTION_MS,
                   txn: Optional[TransactionMetadata] = None,
                   last_records: Mapping[int, LastRecord] = {},
                   legacy_delete_horizon: int = 0,
                   index_interval_bytes: int = 4096,
                   retain_last_batch: bool = False) -> CleanedSegment:
    """Kafka's ``cleanSegments``: clean a group of adjacent segments into one named after the
    first. ``offset_map`` is the round's map (:func:`build_offset_map`); ``txn`` the round's
    :class:`TransactionMetadata` (one for all the round's groups, in offset order, built with
    every aborted transaction of the log); ``last_records`` the producers' state (the log's
    producer state, or :func:`last_records_of`); ``legacy_delete_horizon``:
    :func:`legacy_delete_horizon_ms`. The rules are docs/compaction.md's.

    ``retain_last_batch``: the group's last batch is kept even when nothing of it survives
    (magic 2: emptied, as a producer's last batch is; magic 0/1: as it is), so that the new
    segment ends where the group ended. A cluster needs it: a segment whose data reaches the
    next one's base is how a replaced segment's successors are known to be covered (the
    group's other files, docs/protocol.md §4.1), and readers see no gap at its end."""
    txn = txn if txn is not None else TransactionMetadata()
    stats = CleanerStats()
    builder = IndexBuilder(sources[0].base_offset, index_interval_bytes)
    pieces: List[bytes] = []
    retained_before = len(txn.retained_aborted)
    last_written: Optional[int] = None
    for i, seg in enumerate(sources):
        retain_legacy_deletes = seg.last_modified_ms > legacy_delete_horizon
        for piece, size, last_offset, max_ts in _clean_into(
                seg.data, offset_map, now_ms, delete_retention_ms, txn, last_records,
                retain_legacy_deletes, stats,
                retain_last=retain_last_batch and i == len(sources) - 1):
            pieces.append(piece)
            builder.add(size, last_offset, max_ts)
            last_written = last_offset
    base = sources[0].base_offset
    return CleanedSegment(
        base_offset=base, pieces=pieces, size=builder.valid_bytes,
        index=idx.encode_offset_index(builder.offset_entries, base),
        timeindex=idx.encode_time_index(builder.final_time_entries(), base),
        last_modified_ms=sources[-1].last_modified_ms,
        aborted_txns=list(txn.retained_aborted[retained_before:]), stats=stats,
        last_offset=last_written)


def _clean_into(data, offset_map: OffsetMap, now_ms: int, retention_ms: int,
                txn: TransactionMetadata, last_records: Mapping[int, LastRecord],
                retain_legacy_deletes: bool, stats: CleanerStats, retain_last: bool = False):
    """Kafka's ``cleanInto`` + ``filterTo`` over one source ``.log``: yields ``(bytes, size,
    last offset, max timestamp)`` of each batch written."""
    cols = _decode(data)
    n = len(cols.offset)
    stats.bytes_read += len(data)
    stats.batches_read += len(cols.batches)
    stats.records_read += n
    if not cols.batches:
        return
    bounds = _batch_rows(cols)
    offs = np.frombuffer(cols.offset, dtype=np.int64)
    if n:
        found = offset_map.get_many(_digests(cols))
        keyed = np.frombuffer(cols.key_valid, dtype=np.uint8).view(bool)
        valued = np.frombuffer(cols.value_valid, dtype=np.uint8).view(bool)
        past = offs > offset_map.latest_offset
        latest = keyed & (offs >= found)
        timestamps = np.frombuffer(cols.timestamp, dtype=np.int64)
    view = memoryview(data)
    for b, batch in enumerate(cols.batches):
        r0, r1 = int(bounds[b]), int(bounds[b + 1])
        count = r1 - r0
        h = read_header(data, batch[6])
        # checkBatchRetention
        if h.is_control:
            can_discard = txn.on_control_batch_read(h, _control_type(cols, r0, count))
            discard_records = (can_discard and h.has_delete_horizon
                               and h.base_timestamp <= now_ms)
        else:
            can_discard = txn.on_batch_read(h)
            discard_records = can_discard
        retain_empty = h.producer_id >= 0 and _is_last_of_producer(h, last_records)
        if retain_last and b == len(cols.batches) - 1:
            retain_empty = True   # the group's last batch (clean_segments' retain_last_batch)
        if discard_records and not retain_empty:
            continue                                           # BatchRetention.DELETE
        marker_for_empty_txn = can_discard and h.is_control
        # shouldRetainRecord, per record
        if discard_records or not count:
            keep = None
            kept = 0
        elif h.is_control:
            keep = np.ones(count, dtype=bool)
            kept = count
        else:
            if h.magic >= MAGIC_V2:
                retain_deletes = not h.has_delete_horizon or now_ms < h.base_timestamp
            else:
                retain_deletes = retain_legacy_deletes
            keep = past[r0:r1] | (latest[r0:r1] & (valued[r0:r1] | retain_deletes))
            stats.invalid_records += int(np.count_nonzero(~past[r0:r1] & ~keyed[r0:r1]))
            kept = int(np.count_nonzero(keep))
        if kept:
            tombstones = bool(np.any(keep & ~valued[r0:r1]))
            need_horizon = (h.magic >= MAGIC_V2 and (tombstones or marker_for_empty_txn)
                            and not h.has_delete_horizon)
            stats.records_kept += kept
            stats.batches_written += 1
            if kept == count and not need_horizon:             # the original batch
                stats.bytes_written += h.size
                yield view[h.position:h.end], h.size, h.last_offset, h.max_timestamp
                continue
            ts = timestamps[r0:r1][keep]
            if h.magic >= MAGIC_V2:
                records = view[h.position + V2_HEADER_SIZE:h.end]
                if h.compression:
                    records = codecs.decompress(h.compression, records, MAGIC_V2)
                if need_horizon:
                    base_ts = now_ms + retention_ms
                    shift = base_ts - h.base_timestamp
                else:
                    base_ts, shift = h.base_timestamp, 0
                body = filter_records(records, count, keep, shift)
                max_ts = (h.max_timestamp if h.timestamp_type == LOG_APPEND_TIME
                          else int(ts.max()))
                out = _v2_batch(h, body, kept, base_ts, max_ts, need_horizon)
                last = h.last_offset
            else:
                out, last, max_ts = _legacy_rebuild(cols, h, r0, keep, ts)
            stats.bytes_written += len(out)
            yield out, len(out), last, max_ts
        elif retain_empty:                                     # BatchRetention.RETAIN_EMPTY
            if h.magic < MAGIC_V2:
                if not retain_last:
                    raise CorruptRecordError("a magic 0/1 entry cannot be kept empty")
                # no empty entry exists before magic 2: the group's last one stays whole
                stats.batches_written += 1
                stats.bytes_written += h.size
                yield view[h.position:h.end], h.size, h.last_offset, h.max_timestamp
                continue
            out = empty_batch(h)
            stats.batches_written += 1
            stats.bytes_written += len(out)
            yield out, len(out), h.last_offset, h.max_timestamp


def _legacy_rebuild(cols: Columns, h: BatchHeader, r0: int, keep: np.ndarray, ts: np.ndarray):
    """A magic 0/1 compressed wrapper with its kept messages at their own offsets, recompressed
    with its codec (Kafka's ``buildRetainedRecordsInto`` for magic < 2)."""
    rows = (np.flatnonzero(keep) + r0).tolist()
    keys, values = cols.key, cols.value
    records = [Record(keys[r], values[r], int(cols.timestamp[r])) for r in rows]
    offsets = [int(cols.offset[r]) for r in rows]
    lat = h.timestamp_type == LOG_APPEND_TIME
    enc = encode_message_set(records, magic=h.magic, compression=h.compression,
                             timestamp_type=h.timestamp_type if h.magic else 0,
                             log_append_time=h.max_timestamp if lat else None, offsets=offsets)
    return enc.data, enc.last_offset, enc.max_timestamp


# -- producer state ---------------------------------------------------------------------------

def last_records_of(segments: Iterable[SourceSegment]) -> Dict[int, LastRecord]:
    """The producer state the cleaner keeps, from the log itself (every segment, the active one
    too): per producer id, the last offset of its last data batch and its latest epoch (data
    or marker). For logs without Kafka's producer snapshots; every producer counts as active
    (no ``producer.id.expiration.ms``)."""
    state: Dict[int, LastRecord] = {}
    for seg in segments:
        data = seg.data
        pos = 0
        while pos + LOG_OVERHEAD <= len(data):
            h = read_header(data, pos)
            pos = h.end
            if h.magic < MAGIC_V2 or h.producer_id < 0:
                continue
            prev = state.get(h.producer_id)
            last_data = prev.last_data_offset if prev else None
            if not h.is_control:
                last_data = h.last_offset
            state[h.producer_id] = LastRecord(last_data, h.producer_epoch)
    return state


# -- rounds over segments in memory -----------------------------------------------------------

def group_segments(segments: Sequence[SourceSegment], max_bytes: int) -> List[List[int]]:
    """Kafka's ``groupSegmentsBySize`` (by ``.log`` size): runs of adjacent segments whose
    total size fits ``segment.bytes`` (a larger one alone), as indexes into ``segments``."""
    groups: List[List[int]] = []
    for i, seg in enumerate(segments):
        if groups:
            g = groups[-1]
            size = sum(len(segments[j].data) for j in g)
            if size + len(seg.data) <= max_bytes:
                g.append(i)
                continue
        groups.append([i])
    return groups


@dataclass
class CleanResult:
    """The log after :func:`clean_log`: its segments, the rounds it took, the statistics, and
    its aborted transactions (what its ``.txnindex`` files hold: pass them to the next clean)."""

    segments: List[SourceSegment]
    rounds: int
    stats: CleanerStats
    aborted_txns: List[AbortedTxn]


def clean_log(segments: Sequence[SourceSegment], *, first_dirty_offset: int,
              first_uncleanable_offset: int, offset_map: OffsetMap, now_ms: int,
              delete_retention_ms: int = DEFAULT_DELETE_RETENTION_MS,
              aborted: Sequence[Tuple[int, int, int]] = (),
              last_records: Optional[Mapping[int, LastRecord]] = None,
              segment_bytes: int = 1 << 30, index_interval_bytes: int = 4096,
              max_rounds: Optional[int] = None) -> CleanResult:
    """Clean a log in memory, in as many rounds as the map needs: ``segments`` in offset
    order (the active segment last, never cleaned: ``first_uncleanable_offset`` is at most its
    base). Returns the new segment list (cleaned groups, then the untouched rest)."""
    segs = list(segments)
    if last_records is None:
        last_records = last_records_of(segs)
    stats = CleanerStats()
    dirty, rounds = first_dirty_offset, 0
    retained: List[AbortedTxn] = []
    while dirty < first_uncleanable_offset and (max_rounds is None or rounds < max_rounds):
        holding = [s for s, nxt in zip(segs, _segment_ends(segs, 1 << 62))
                   if nxt > dirty and s.base_offset < first_uncleanable_offset]
        end = build_offset_map(holding, offset_map, dirty, first_uncleanable_offset, aborted,
                               stats)
        if end <= dirty:
            raise RuntimeError("the offset map took no key: it is too small")
        # Kafka's logSegments(0, firstDirtyOffset): the segments holding offsets below it
        clean_section = [s for s in segs if s.base_offset < dirty]
        horizon = legacy_delete_horizon_ms(
            clean_section[-1].last_modified_ms if clean_section else None, delete_retention_ms)
        cleanable = [s for s in segs if s.base_offset < end]
        rest = segs[len(cleanable):]
        txn = TransactionMetadata(aborted)
        out: List[SourceSegment] = []
        retained: List[AbortedTxn] = []
        for group in group_segments(cleanable, segment_bytes):
            cleaned = clean_segments([cleanable[i] for i in group], offset_map, now_ms=now_ms,
                                     delete_retention_ms=delete_retention_ms, txn=txn,
                                     last_records=last_records,
                                     legacy_delete_horizon=horizon,
                                     index_interval_bytes=index_interval_bytes)
            stats.add(cleaned.stats)
            retained += cleaned.aborted_txns
            out.append(SourceSegment(cleaned.base_offset, cleaned.data,
                                     cleaned.last_modified_ms))
        segs = out + rest
        # the log's aborted transactions now: as the cleaned segments' .txnindex files hold
        # them (those with data left), and those whose marker is in a segment not cleaned
        rest_base = rest[0].base_offset if rest else 1 << 62
        aborted = sorted(set(retained) | {AbortedTxn(*t) for t in aborted
                                          if t[2] >= rest_base}, key=lambda t: t[1])
        dirty = end
        rounds += 1
    return CleanResult(segs, rounds, stats, list(aborted))
