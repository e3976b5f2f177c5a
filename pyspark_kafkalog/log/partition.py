"""A partition's log: its ordered segments, with Kafka's read, append, roll, truncate and
delete-below-log-start rules.

This layer holds no durable state of its own: everything (segments, indexes, leader epochs) is
re-read from storage, so a process that dies loses nothing but its cache. Concurrency between
writers is *not* handled here: the cluster layer's protocol decides who may append or truncate.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple

from ..errors import (AlreadyExistsError, CorruptRecordError, InvalidTopicError, KafkaLogError,
                      KafkaStorageError, MissingCommittedDataError, OffsetOutOfRangeError,
                      RecordTooLargeError, StorageNotFoundError)
from ..format import checkpoint as ckpt
from ..format.batch import iter_headers
from ..format.columnar import Columns, decode_columns
from ..format.encode import EncodedBatch
from .config import LogConfig
from .validator import append_time, check_append, stamp
from .file_names import log_file_base, parse_segment_file
from .segment import (INDEX_SUFFIX, TIMEINDEX_SUFFIX, LogSegment, ReadStats,
                      SegmentRecovery)

_INT32_MAX = 2**31 - 1
LEADER_EPOCH_FILE = "leader-epoch-checkpoint"
PARTITION_METADATA_FILE = "partition.metadata"


def parse_partition_dir(name: str) -> Tuple[str, int]:
    """``<topic>-<partition>`` -> (topic, partition); the topic itself may contain dashes."""
    topic, sep, part = name.rpartition("-")
    if not sep or not topic or not part.isdigit():
        raise InvalidTopicError(f"{name!r} is not a <topic>-<partition> directory name")
    return topic, int(part)


@dataclass
class AppendResult:
    first_offset: int
    last_offset: int
    log_append_time: int = -1
    rolled: List[int] = field(default_factory=list)   # base offsets of segments created


@dataclass
class RecoveryReport:
    partition_dir: str
    segments: List[SegmentRecovery]
    deleted_segments: List[str]
    log_end_offset: int

    @property
    def truncated_bytes(self) -> int:
        return sum(s.truncated_bytes for s in self.segments)


#: a log dir's identity file (Kafka's); ``logdir.py`` names it too
META_PROPERTIES_FILE = "meta.properties"


def raise_if_log_dir_away(storage, partition_dir: str, name: str) -> None:
    """Raise KafkaStorageError when the log dir holding ``partition_dir`` cannot be read now (its
    ``meta.properties`` is gone: a root renamed, unmounted, a bucket away). A reader that misses
    files there must not take them for deleted data (``failOnDataLoss``): they are on a root it
    cannot reach, and on the other in-sync replicas."""
    parent = partition_dir.rstrip("/").rpartition("/")[0]
    path = f"{parent}/{META_PROPERTIES_FILE}" if parent else META_PROPERTIES_FILE
    try:
        there = storage.exists(path)
        why = None if there else f"{path} is missing"
    except (KafkaLogError, OSError) as exc:
        why = str(exc)
    if why is not None:
        raise KafkaStorageError(
            f"{name}: the log dir of the replica being read cannot be read ({why}); its root is "
            "away. Retry: a coordinator elects another in-sync replica after "
            "broker.session.timeout.ms")


class PartitionLog:
    def __init__(self, storage, dir_path: str, config: Optional[LogConfig] = None, *,
                 log_start_offset: Optional[int] = None, stats: Optional[ReadStats] = None,
                 segment_filter=None, high_watermark: Optional[int] = None,
                 next_visible=None, listing: Optional[Sequence[Tuple[int, int]]] = None):
        """``segment_filter(base_offset) -> bool`` hides segments (the cluster protocol shows only
        committed ones); ``high_watermark``, when given, is authoritative for reads.
        ``next_visible(offset)``, when given, is the first offset >= ``offset`` that the reader's
        metadata says holds data (or None): data it promises that no listed segment holds was
        deleted after that metadata was read, and is an OffsetOutOfRangeError, never skipped.
        ``listing``: ``(base offset, .log size)`` of the segments as a recent listing found them
        (a read planned on the driver hands its listing to the task), instead of listing again:
        over a thousand small ranges a listing each was ~15% of a packed task. A segment gone
        since is found missing when read, as it would be after any listing."""
        self.storage = storage
        self.segment_filter = segment_filter
        self.next_visible = next_visible
        self.high_watermark = high_watermark
        self.dir = dir_path.rstrip("/")
        self.topic, self.partition = parse_partition_dir(self.dir.rsplit("/", 1)[-1])
        self.config = config or LogConfig()
        self.stats = stats or ReadStats()
        self._checkpointed_log_start = log_start_offset
        self.segments: List[LogSegment] = []
        if listing is None:
            self.refresh()
        else:
            self._set_segments(dict(listing))

    # -- segments ---------------------------------------------------------------------------

    def refresh(self) -> None:
        """Re-list segments from storage (another process may have rolled or deleted some)."""
        sizes = {}
        for info in self.storage.list(self.dir):
            base = log_file_base(info.name)
            if base is not None:
                if self.segment_filter is None or self.segment_filter(base):
                    sizes[base] = info.size
        self._set_segments(sizes)

    def listing(self) -> List[Tuple[int, int]]:
        """``(base offset, .log size)`` per segment, as the last listing found them."""
        return [(seg.base_offset, seg._size) for seg in self.segments]

    def _set_segments(self, sizes) -> None:
        old = {s.base_offset: s for s in self.segments}
        self.segments = [old.get(b) or LogSegment(self.storage, self.dir, b, self.config,
                                                  self.stats) for b in sorted(sizes)]
        for i, seg in enumerate(self.segments):
            if seg._size is not None and seg._size != sizes[seg.base_offset]:
                seg.invalidate()   # a rewrite replaced it (§4.1, §4.2): its indexes too
            # the listing's size is as fresh as a stat would be, and saves one per segment
            # (read planning sizes every range from them)
            seg._size = sizes[seg.base_offset]
            # every segment but the newest is complete; under the cluster protocol all are
            seg.sealed = self.segment_filter is not None or i + 1 < len(self.segments)

    def _path(self, name: str) -> str:
        return f"{self.dir}/{name}"

    @property
    def active_segment(self) -> Optional[LogSegment]:
        return self.segments[-1] if self.segments else None

    def segment_for(self, offset: int) -> Optional[int]:
        """Index of the segment that would hold ``offset`` (largest base <= offset)."""
        found = None
        for i, seg in enumerate(self.segments):
            if seg.base_offset <= offset:
                found = i
            else:
                break
        return found

    @property
    def log_start_offset(self) -> int:
        if self.high_watermark is not None:   # under the cluster protocol: the metadata's word
            return self._checkpointed_log_start or 0
        first = self.segments[0].base_offset if self.segments else 0
        if self._checkpointed_log_start is None:
            return first
        return max(first, self._checkpointed_log_start)

    @log_start_offset.setter
    def log_start_offset(self, value: int) -> None:
        self._checkpointed_log_start = value

    @property
    def log_end_offset(self) -> int:
        if not self.segments:
            return self._checkpointed_log_start or 0
        return self.segments[-1].next_offset()

    def size_in_bytes(self) -> int:
        return sum(seg.size() for seg in self.segments)

    # -- reading ----------------------------------------------------------------------------

    def _check_fetch_offset(self, offset: int, high_watermark: Optional[int]) -> int:
        if self.high_watermark is not None:
            hw = self.high_watermark if high_watermark is None else min(high_watermark,
                                                                         self.high_watermark)
        else:
            leo = self.log_end_offset
            hw = leo if high_watermark is None else min(high_watermark, leo)
        if offset < self.log_start_offset or offset > hw:
            raise OffsetOutOfRangeError(
                f"offset {offset} is out of range for {self.topic}-{self.partition}: log start "
                f"offset {self.log_start_offset}, high watermark {hw}")
        return hw

    def read(self, offset: int, max_bytes: int = 1 << 20, *,
             high_watermark: Optional[int] = None) -> Tuple[bytes, int]:
        """Raw whole entries from the segment holding ``offset`` (one segment, like a fetch).

        Returns ``(data, base_offset_of_segment)``. Entries may start below ``offset`` (a batch
        holds several offsets) or reach past the high watermark; decoders trim by offset.
        """
        hw = self._check_fetch_offset(offset, high_watermark)
        if offset == hw:
            return b"", -1
        i = self.segment_for(offset)
        i = 0 if i is None else i
        looked_again = set()   # (why, base): once per file and reason, then the error stands
        while i < len(self.segments):
            seg = self.segments[i]
            try:
                data, _ = seg.read_from(offset, max_bytes)
            except (CorruptRecordError, StorageNotFoundError) as exc:
                # deleted since the listing (a merge's or clean's covered segment, whose data
                # the covering one holds, docs/protocol.md §4.1, or retention), or replaced by a
                # log clean (§4.2: the offsets from here on are in the new file): look again;
                # what the metadata promises and no file holds is reported below
                why = type(exc)
                if (why, seg.base_offset) in looked_again or (
                        why is CorruptRecordError and not seg.replaced()):
                    raise
                looked_again.add((why, seg.base_offset))
                self.refresh()
                i = self.segment_for(offset)
                i = 0 if i is None else i
                continue
            if data:
                self._check_nothing_skipped(offset, seg.base_offset)
                return data, seg.base_offset
            i += 1
        self._check_nothing_skipped(offset, hw)
        return b"", -1

    def _check_nothing_skipped(self, offset: int, found: int) -> None:
        """Reading ``offset`` found data only from ``found`` on: if the metadata promises data in
        between, report it, never return less. Files missing because the replica's root cannot
        be read now are not deleted data: that is a storage error, to retry."""
        if self.next_visible is None or found <= offset:
            return
        expected = self.next_visible(offset)
        if expected is not None and expected < found:
            raise_if_log_dir_away(self.storage, self.dir, f"{self.topic}-{self.partition}")
            raise MissingCommittedDataError(
                f"{self.topic}-{self.partition}: the metadata says offset {expected} holds "
                f"committed data, but {self._why_missing(expected)}")

    def _why_missing(self, expected: int) -> str:
        """What the listed segments show about the missing ``expected``. This layer cannot tell
        whether the log start offset moved past it since the metadata was read (only the
        metadata can), so it says what is on storage and names no log start offset."""
        i = self.segment_for(expected)
        gone = "it was deleted after the metadata was read, or lost"
        if i is None:
            where = (f"the first committed one starts at offset {self.segments[0].base_offset}"
                     if self.segments else "the partition has none")
            return f"no segment file holds it ({where}): {gone}"
        seg = self.segments[i]
        name = seg.log_path.rsplit("/", 1)[-1]
        end = seg.next_offset()
        if end > expected:
            return f"segment file {name} has no entry for it"
        nxt = (f"the next one starts at offset {self.segments[i + 1].base_offset}"
               if i + 1 < len(self.segments) else "no later one is there")
        return (f"it is in a gap between segment files ({name} ends at offset {end - 1}, "
                f"{nxt}): {gone}")

    def read_columns(self, start: int, end: Optional[int] = None, *, max_bytes: int = 1 << 20,
                     high_watermark: Optional[int] = None, skip_control: bool = True,
                     with_headers: bool = True, max_records: Optional[int] = None) -> Columns:
        """Decode the records in ``[start, end)`` (bounded by the high watermark) into columns."""
        hw = self._check_fetch_offset(start, high_watermark)
        end = hw if end is None else min(end, hw)
        cols = Columns()
        offset = start
        while offset < end and (max_records is None or len(cols) < max_records):
            data, _ = self.read(offset, max_bytes, high_watermark=hw)
            if not data:
                break
            decode_columns(data, min_offset=offset, max_offset=end, skip_control=skip_control,
                           with_headers=with_headers, cols=cols)
            last = None
            for h in iter_headers(data):
                last = h
            if last.last_offset + 1 <= offset:
                raise CorruptRecordError(
                    f"{self.dir}: offsets stop increasing at {last.last_offset} (reading from "
                    f"{offset}); run `kafkalog recover`", last.position)
            offset = last.last_offset + 1
        return cols

    def offset_for_timestamp(self, timestamp: int) -> Optional[Tuple[int, int]]:
        """Kafka's ``offsetsForTimes``: the earliest offset whose timestamp is >= ``timestamp``.

        Returns ``(offset, record timestamp)`` or None when no record qualifies.
        """
        start = self.log_start_offset
        for i, seg in enumerate(self.segments):
            if i + 1 < len(self.segments) and self.segments[i + 1].base_offset <= start:
                continue   # wholly below the log start offset
            if seg.largest_timestamp() >= timestamp:
                found = seg.find_offset_by_timestamp(timestamp, start)
                if found is not None:
                    return found
        return None

    # -- appending --------------------------------------------------------------------------

    def _create_segment(self, base_offset: int) -> LogSegment:
        self.storage.makedirs(self.dir)
        seg = LogSegment(self.storage, self.dir, base_offset, self.config, self.stats)
        try:
            self.storage.create_if_absent(seg.log_path, b"")
        except AlreadyExistsError:
            if self.storage.size(seg.log_path):
                raise
        self.storage.replace(seg.path(INDEX_SUFFIX), b"")
        self.storage.replace(seg.path(TIMEINDEX_SUFFIX), b"")
        seg._size = 0
        self.segments.append(seg)
        return seg

    def _should_roll(self, seg: LogSegment, size: int, batch: EncodedBatch, now_ms: int) -> bool:
        """Kafka's ``LogSegment.shouldRoll``: size, time (KIP-32), index fullness, offset range."""
        cfg = self.config
        cur = seg.size()
        if cur > cfg.segment_bytes - size:
            return True
        if cur > 0:
            first_ts = seg.first_batch_timestamp()
            waited = (batch.max_timestamp - first_ts if first_ts >= 0
                      else now_ms - seg.created_ms())
            if waited > cfg.segment_ms:
                return True
            builder = seg._append_state()
            if (len(builder.offset_entries) >= cfg.max_index_entries
                    or len(builder.final_time_entries()) >= cfg.segment_index_bytes // 12 - 1):
                return True   # Kafka rolls when either index is full
        return batch.last_offset - seg.base_offset > _INT32_MAX

    def append(self, batches: Sequence[EncodedBatch], *, leader_epoch: int = -1,
               now_ms: Optional[int] = None) -> AppendResult:
        """Append encoded batches at the log end offset, as a broker's ``UnifiedLog.append``."""
        if not batches:
            raise ValueError("nothing to append")
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        cfg = self.config
        if self.active_segment is not None:
            # recovered before anything is decided from it: this append may roll away from it,
            # and a dead writer's torn tail or stale indexes would then stay in a segment no one
            # appends to again
            self.active_segment.prepare_append()
        next_offset = self.log_end_offset
        first = next_offset
        result = AppendResult(first, first - 1)
        if append_time(cfg, now_ms) is not None:
            result.log_append_time = now_ms
        seg = self.active_segment
        pending: List[bytes] = []
        pending_headers = []
        pending_size = 0

        def flush():
            nonlocal pending, pending_headers, pending_size
            if pending:
                seg.append(b"".join(pending), pending_headers)
            pending, pending_headers, pending_size = [], [], 0

        check_append(batches, cfg, f"{self.topic}-{self.partition}")
        for batch in batches:
            size = len(batch.data)
            if size > cfg.segment_bytes:
                raise RecordTooLargeError(
                    f"batch of {size} bytes exceeds segment.bytes={cfg.segment_bytes}")
            batch = stamp(batch, next_offset, leader_epoch, cfg, now_ms)
            if seg is None:
                seg = self._create_segment(next_offset)
                result.rolled.append(next_offset)
            elif self._should_roll_pending(seg, pending_size, size, batch, now_ms):
                flush()
                seg = self._create_segment(next_offset)
                result.rolled.append(next_offset)
            pending.append(batch.data)
            headers = [h._replace(position=seg.size() + pending_size + h.position)
                       for h in iter_headers(batch.data)]
            pending_headers.extend(headers)
            pending_size += size
            next_offset = batch.last_offset + 1
        flush()
        result.last_offset = next_offset - 1
        if leader_epoch >= 0:
            self.assign_leader_epoch(leader_epoch, first)
        return result

    def _should_roll_pending(self, seg, pending_size, size, batch, now_ms) -> bool:
        if pending_size == 0:
            return self._should_roll(seg, size, batch, now_ms)
        cfg = self.config
        if seg.size() + pending_size > cfg.segment_bytes - size:
            return True
        return batch.last_offset - seg.base_offset > _INT32_MAX

    # -- leader epochs ------------------------------------------------------------------------

    def leader_epochs(self) -> List[ckpt.EpochEntry]:
        try:
            text = self.storage.read(self._path(LEADER_EPOCH_FILE)).decode("utf-8")
        except StorageNotFoundError:
            return []
        return ckpt.parse_leader_epoch_checkpoint(text)

    def assign_leader_epoch(self, epoch: int, start_offset: int) -> None:
        """Record that ``epoch`` starts at ``start_offset`` (no-op unless newer than the latest)."""
        entries = self.leader_epochs()
        if entries and entries[-1].epoch >= epoch:
            return
        entries.append(ckpt.EpochEntry(epoch, start_offset))
        self.storage.replace(self._path(LEADER_EPOCH_FILE),
                             ckpt.format_leader_epoch_checkpoint(entries).encode())

    def write_partition_metadata(self, topic_id: str) -> None:
        self.storage.makedirs(self.dir)
        self.storage.replace(self._path(PARTITION_METADATA_FILE),
                             ckpt.format_partition_metadata(topic_id).encode())

    # -- truncation, deletion, recovery -------------------------------------------------------

    def truncate_to(self, offset: int) -> int:
        """Remove every record at or above ``offset`` (whole batches, as Kafka truncates)."""
        if offset < 0:
            raise OffsetOutOfRangeError(f"cannot truncate to negative offset {offset}")
        removed = 0
        for seg in list(reversed(self.segments)):
            if seg.base_offset >= offset and seg is not self.segments[0]:
                removed += seg.size()
                seg.delete()
                self.segments.remove(seg)
            else:
                removed += seg.truncate_to(offset)
                break
        entries = [e for e in self.leader_epochs() if e.start_offset < offset]
        if self.storage.exists(self._path(LEADER_EPOCH_FILE)):
            self.storage.replace(self._path(LEADER_EPOCH_FILE),
                                 ckpt.format_leader_epoch_checkpoint(entries).encode())
        return removed

    def delete_segments_below(self, log_start_offset: int) -> List[int]:
        """Delete segments whose every offset is below ``log_start_offset``; never the active one.

        Kafka's rule: a segment goes when the *next* segment's base offset <= the log start offset.
        """
        self.log_start_offset = max(self.log_start_offset, log_start_offset)
        deleted = []
        while len(self.segments) > 1 and self.segments[1].base_offset <= self.log_start_offset:
            seg = self.segments.pop(0)
            seg.delete()
            deleted.append(seg.base_offset)
        return deleted

    def recover(self, *, apply: bool = True) -> RecoveryReport:
        """Validate every segment; cut at the first damage and drop the segments after it."""
        results: List[SegmentRecovery] = []
        deleted: List[str] = []
        prev_last = None
        for i, seg in enumerate(self.segments):
            res = seg.recover(previous_last_offset=prev_last, apply=apply)
            results.append(res)
            prev_last = res.next_offset - 1
            if res.truncated_bytes:
                for later in self.segments[i + 1:]:
                    deleted.append(later.log_path)
                    if apply:
                        later.delete()
                if apply:
                    self.segments = self.segments[:i + 1]
                break
        leo = prev_last + 1 if prev_last is not None else self.log_start_offset
        if apply:
            self._delete_orphan_files()
            epochs = self.leader_epochs()
            kept = [e for e in epochs if e.start_offset < leo]
            if kept != epochs:   # no epoch may start at an offset that no longer exists
                self.storage.replace(self._path(LEADER_EPOCH_FILE),
                                     ckpt.format_leader_epoch_checkpoint(kept).encode())
        return RecoveryReport(self.dir, results, deleted, leo)

    def _delete_orphan_files(self) -> None:
        """Index files without a ``.log`` (left by a deletion that was cut short)."""
        bases = {s.base_offset for s in self.segments}
        for info in self.storage.list(self.dir):
            parsed = parse_segment_file(info.name)
            if parsed and parsed[0] not in bases and parsed[1] != "log":
                self.storage.delete(self._path(info.name))


