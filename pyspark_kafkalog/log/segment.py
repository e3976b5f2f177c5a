"""One segment: ``<base>.log`` plus its ``.index`` and ``.timeindex``.

Reads go through the offset index and then walk batch *headers* forward from the indexed position
in small windows, so finding a mid-segment offset costs about one ``index.interval.bytes`` of log
reads, never a scan from the segment head. Indexes are derived data: a missing, torn or
pre-allocated index is read as far as it is valid and otherwise ignored (the reads just walk
further), and writers restore the invariant "index == what Kafka's recovery rebuilds".
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Iterator, List, Optional, Tuple

import numpy as np

from ..errors import CorruptRecordError, KafkaLogError, StorageNotFoundError
from ..format import index as idx
from ..format.batch import (HEADER_SIZE_UP_TO_MAGIC, V2_HEADER_SIZE, BatchHeader, EntryScan,
                            read_header, scan_entries, validate)
from ..format.columnar import decode_records
from ..format.index_builder import IndexBuilder
from .config import LogConfig
from .file_names import (INDEX_SUFFIX, LOG_SUFFIX, TIMEINDEX_SUFFIX,  # noqa: F401 (re-exported)
                         TXNINDEX_SUFFIX, segment_name)

_INT32_MAX = 2**31 - 1
_EMPTY = (np.zeros(0, np.int64), np.zeros(0, np.int64))
_log = logging.getLogger(__name__)
_HEADER_BYTES = V2_HEADER_SIZE     # enough bytes to parse any entry header


@dataclass
class ReadStats:
    """Bytes and requests that reads cost; tests assert on these instead of on time."""

    log_bytes: int = 0
    index_bytes: int = 0
    requests: int = 0

    def reset(self) -> None:
        self.log_bytes = self.index_bytes = self.requests = 0


@dataclass
class SegmentRecovery:
    """What recovering one segment found (``kafkalog recover`` prints this)."""

    segment: str
    base_offset: int
    original_bytes: int
    valid_bytes: int
    truncated_bytes: int
    first_dropped_offset: Optional[int] = None
    error: Optional[str] = None
    next_offset: Optional[int] = None
    index_rebuilt: bool = True
    extra: dict = field(default_factory=dict)


class LogSegment:
    def __init__(self, storage, dir_path: str, base_offset: int,
                 config: Optional[LogConfig] = None, stats: Optional[ReadStats] = None):
        self.storage = storage
        self.dir = dir_path
        self.base_offset = base_offset
        self.config = config or LogConfig()
        self.stats = stats or ReadStats()
        self._offset_index: Optional[Tuple[np.ndarray, np.ndarray]] = None
        self._time_index: Optional[Tuple[np.ndarray, np.ndarray]] = None
        self._builder: Optional[IndexBuilder] = None   # writer state, valid while we append
        self._size: Optional[int] = None
        self._map = None                      # read_view's mapping; False: cannot map
        self._first_batch_ts: Optional[int] = None
        self._timeindex_raw_len = -1          # length of .timeindex when loaded (-1: missing)
        #: a sealed segment is complete: a partial entry at its end is damage, not an append
        self.sealed = False
        self._indexes_distrusted = False

    def path(self, suffix: str) -> str:
        name = segment_name(self.base_offset, suffix)
        return f"{self.dir}/{name}" if self.dir else name

    @property
    def log_path(self) -> str:
        return self.path(LOG_SUFFIX)

    def __repr__(self) -> str:
        return f"LogSegment({self.log_path})"

    # -- reading ------------------------------------------------------------------------------

    def size(self, refresh: bool = False) -> int:
        if self._size is None or refresh:
            self._size = self.storage.size(self.log_path)
        return self._size

    def replaced(self) -> bool:
        """Whether the ``.log`` on storage is no longer the size this segment read it at: a
        rewrite replaced it since (a log clean, docs/protocol.md §4.2). False when nothing was
        read yet, or the file cannot be looked at."""
        known = self._size
        if known is None:
            return False
        try:
            return self.storage.size(self.log_path) != known
        except KafkaLogError:
            return False

    def read(self, start: int, end: int) -> bytes:
        if self._map:   # a caller already mapped it (it knows the file is immutable)
            data = bytes(self._map[start:min(end, len(self._map))])
        else:
            data = self.storage.read(self.log_path, start, end)
        self.stats.log_bytes += len(data)
        self.stats.requests += 1
        return data

    def mapped(self) -> bool:
        """Whether :meth:`read_view` works here (maps the file on first use)."""
        if self._map is None:
            self._map = self.storage.map(self.log_path) or False
        return self._map is not False

    def read_view(self, start: int, end: int) -> Optional[memoryview]:
        """``[start, end)`` through a read-only mapping of the log file, or None when the
        storage cannot map it. Only for segments nothing truncates in place (see
        ``Storage.map``): callers decide, the segment cannot know."""
        if not self.mapped():
            return None
        view = self._map[start:min(end, len(self._map))]
        self.stats.log_bytes += len(view)
        self.stats.requests += 1
        return view

    def read_into(self, start: int, out) -> memoryview:
        """Read from ``start`` into the writable buffer ``out``; the filled part of it."""
        n = self.storage.read_into(self.log_path, start, out)
        self.stats.log_bytes += n
        self.stats.requests += 1
        return memoryview(out).cast("B")[:n]

    def _read_index_file(self, suffix: str) -> Optional[bytes]:
        try:
            data = self.storage.read(self.path(suffix))
        except StorageNotFoundError:
            return None
        self.stats.index_bytes += len(data)
        self.stats.requests += 1
        return data

    def _load_index(self, suffix: str, entry_size: int, valid_prefix):
        """(raw file length or -1 if missing, the valid prefix of its entries)."""
        raw = self._read_index_file(suffix)
        buf = raw or b""
        return (-1 if raw is None else len(raw),
                valid_prefix(buf[:len(buf) - len(buf) % entry_size], self.base_offset))

    def offset_index(self) -> Tuple[np.ndarray, np.ndarray]:
        """(absolute offsets, positions), as far as the index file is valid."""
        if self._indexes_distrusted:
            return _EMPTY
        if self._offset_index is None:
            _, (offsets, positions) = self._load_index(INDEX_SUFFIX, idx.OFFSET_ENTRY_SIZE,
                                                       _valid_prefix_offset_index)
            if len(positions) and positions[-1] >= self.size():   # stale: points past the log
                keep = positions < self.size()
                offsets, positions = offsets[keep], positions[keep]
            self._offset_index = (offsets, positions)
        return self._offset_index

    def time_index(self) -> Tuple[np.ndarray, np.ndarray]:
        """(timestamps, absolute offsets), as far as the index file is valid."""
        if self._indexes_distrusted:
            return _EMPTY
        if self._time_index is None:
            self._timeindex_raw_len, self._time_index = self._load_index(
                TIMEINDEX_SUFFIX, idx.TIME_ENTRY_SIZE, _valid_prefix_time_index)
        return self._time_index

    def invalidate(self) -> None:
        self._offset_index = self._time_index = self._size = self._builder = None
        self._first_batch_ts = None
        self._indexes_distrusted = False

    def _distrust_indexes(self, why: str) -> None:
        """An index entry disagrees with the log: from now on walk the log instead.

        Indexes are derived data with no checksum, so every entry a read relies on is checked
        against the batch it points at; one bad entry makes the whole file suspect. Reads stay
        correct (only slower) and ``kafkalog recover`` (in a cluster: ``repair``) rebuilds the
        files.
        """
        if not self._indexes_distrusted:
            _log.warning("%s: ignoring its indexes (%s); `kafkalog recover` rebuilds them (in a "
                         "kafkalog cluster: `kafkalog --cluster URL repair`)", self.log_path, why)
        self._indexes_distrusted = True
        self._builder = None

    def _time_index_complete(self) -> bool:
        """The .timeindex exists and every byte of it decoded to a valid entry."""
        tss, _ = self.time_index()
        return self._timeindex_raw_len == len(tss) * idx.TIME_ENTRY_SIZE

    def walk(self, start: int = 0, end: Optional[int] = None, *, with_body: bool = False,
             window: Optional[int] = None, strict: Optional[bool] = None
             ) -> Iterator[Tuple[BatchHeader, Optional[bytes]]]:
        """Yield entry headers (file positions) from ``start``; with ``with_body`` also the bytes.

        The rules and errors are ``format.batch.EntryScan``'s (docs/format.md §2), offsets
        included: from the segment head the first entry must start at or after the segment's
        base offset, and every entry after the last offset of the one before it. Reads windows
        of about ``index.interval.bytes``; without bodies, a batch larger than the window is
        skipped by its header alone. A partial entry at ``end`` ends the walk quietly unless
        ``strict`` (default: the segment is sealed), where it is damage and raises.
        """
        strict = self.sealed if strict is None else strict
        end = self.size() if end is None else end
        window = window or max(self.config.index_interval_bytes, 4096)
        scan = EntryScan(self.log_path, self.base_offset - 1 if start == 0 else None)
        buf, buf_start = b"", start
        pos = start
        while pos + HEADER_SIZE_UP_TO_MAGIC < end:
            need = min(_HEADER_BYTES, end - pos)
            if pos + need > buf_start + len(buf):
                buf_start, buf = pos, self.read(pos, min(end, pos + max(window, need)))
                if len(buf) < need:   # the file ends before the size it was listed at
                    raise scan.torn(pos, len(buf), need)
            rel = pos - buf_start
            size = scan.entry_size(buf, rel, buf_start)
            entry_end = pos + size
            if entry_end > end:
                if strict:
                    raise scan.torn(pos, end - pos, size)
                return
            body = None
            if with_body:
                if entry_end > buf_start + len(buf):
                    if size > window:
                        buf_start, buf = pos, self.read(pos, entry_end)
                    else:
                        buf_start, buf = pos, self.read(pos, min(end, pos + window))
                    rel = 0
                body = buf[rel:rel + size]
            yield scan.header(buf, rel, buf_start), body
            pos = entry_end
        if strict and pos < end:
            raise scan.trailing(pos, end - pos)

    def lookup(self, offset: int) -> Tuple[int, int]:
        """The offset-index entry (offset, position) to start from for ``offset``."""
        if offset <= self.base_offset:   # the segment's head: no need to read its index
            return self.base_offset, 0
        offsets, positions = self.offset_index()
        return idx.offset_index_lookup(offsets, positions, offset, self.base_offset)

    def lookup_position(self, offset: int) -> int:
        return self.lookup(offset)[1]

    def _walk_from_entry(self, entry: Tuple[int, int], end: Optional[int] = None, **kwargs):
        """Walk from an index entry, first checking that the entry points at its batch; on a
        mismatch the indexes are distrusted and the walk restarts at the segment head."""
        entry_offset, pos = entry
        if pos == 0:
            yield from self.walk(0, end, **kwargs)
            return
        first = True
        try:
            for header, body in self.walk(pos, end, **kwargs):
                if first and header.last_offset != entry_offset:
                    raise CorruptRecordError("entry does not match the log")
                first = False
                yield header, body
            if not first:
                return
            reason = "no whole entry there"
        except CorruptRecordError as exc:
            if not first:
                raise
            reason = str(exc)
        if self.replaced():   # not a bad index: the caller's listing is older than the file
            raise CorruptRecordError(f"{self.log_path} was replaced since it was listed (a log "
                                     "clean, docs/protocol.md §4.2)")
        self._distrust_indexes(f"offset index entry {entry} ({reason})")
        yield from self.walk(0, end, **kwargs)

    def find_batch(self, offset: int, end: Optional[int] = None) -> Optional[BatchHeader]:
        """The first entry whose last offset is >= ``offset`` (Kafka's ``translateOffset``)."""
        for header, _ in self._walk_from_entry(self.lookup(offset), end):
            if header.last_offset >= offset:
                return header
        return None

    def read_from(self, offset: int, max_bytes: int, end: Optional[int] = None) -> Tuple[bytes, int]:
        """Whole entries starting with the one holding ``offset``, about ``max_bytes`` of them.

        At least one entry is returned even if it is larger than ``max_bytes`` (Kafka's
        ``minOneMessage``), so a consumer can always make progress.
        """
        end = self.size() if end is None else end
        first = self.find_batch(offset, end)
        if first is None:
            return b"", end
        stop = min(end, first.position + max(max_bytes, first.size))
        data = self.read(first.position, stop)
        last_end = first.position
        for h in scan_entries(data, file=self.log_path, base_position=first.position,
                              previous_last_offset=self.base_offset - 1 if first.position == 0
                              else None):
            last_end = h.end
        return data[:last_end - first.position], first.position

    def _last_entry(self) -> Tuple[int, int]:
        offsets, positions = self.offset_index()
        if len(positions):
            return int(offsets[-1]), int(positions[-1])
        return self.base_offset, 0

    def next_offset(self) -> int:
        """The offset after the last entry (the base offset if empty)."""
        last = None
        for header, _ in self._walk_from_entry(self._last_entry()):
            last = header
        return self.base_offset if last is None else last.last_offset + 1

    def verified_end(self) -> int:
        """The offset after the last entry, found from the last index entry, with that entry's
        CRC checked and a partial entry at the end counted as damage: what a replica check
        trusts a copy to hold (each batch before it was checked when the copy was made).
        Raises ``CorruptRecordError`` where the tail is damaged or cut short."""
        last = None
        was, self.sealed = self.sealed, True
        try:
            for header, body in self._walk_from_entry(self._last_entry(), with_body=True):
                last = (header, body)
        finally:
            self.sealed = was
        if last is None:
            return self.base_offset
        validate(last[1], last[0], last[0].position, self.log_path)
        return last[0].last_offset + 1

    def largest_timestamp(self) -> int:
        """Max timestamp of the segment: the time index's last entry, or the tail's batches.

        A Kafka broker's active segment has no final time-index entry yet, so the batches after
        the last offset-index entry are checked too (about one index interval of reads).
        """
        tss, toffs = self.time_index()
        if not self._time_index_complete():
            self._distrust_indexes("the time index is missing or damaged")
            tss, toffs = _EMPTY
        best = -1
        pending = (int(tss[-1]), int(toffs[-1])) if len(tss) else None
        last_entry = self._last_entry()
        if pending and pending[1] < last_entry[0]:   # checked apart only if the tail won't see it
            h = self.find_batch(pending[1])
            if h is None or (h.last_offset, h.max_timestamp) != (pending[1], pending[0]):
                self._distrust_indexes(f"time index entry {pending} does not match the log")
                return self.largest_timestamp()
            best, pending = pending[0], None
        for header, _ in self._walk_from_entry(last_entry):
            if pending and header.last_offset >= pending[1]:
                if (header.last_offset, header.max_timestamp) != (pending[1], pending[0]):
                    self._distrust_indexes(f"time index entry {pending} does not match the log")
                    return self.largest_timestamp()
                pending = None
            best = max(best, header.max_timestamp)
        if pending:
            self._distrust_indexes(f"time index entry {pending} points past the log")
            return self.largest_timestamp()
        return best

    def find_offset_by_timestamp(self, timestamp: int, starting_offset: int) -> Optional[Tuple[int, int]]:
        """Earliest (offset, timestamp) with timestamp >= target and offset >= starting_offset."""
        tss, toffs = self.time_index()
        entry_ts, ts_offset = idx.time_index_lookup(tss, toffs, timestamp, self.base_offset)
        check = entry_ts >= 0 and ts_offset >= starting_offset
        for header, body in self._walk_from_entry(self.lookup(max(ts_offset, starting_offset)),
                                                  with_body=True):
            if check and header.last_offset >= ts_offset:
                check = False
                if header.last_offset != ts_offset or header.max_timestamp != entry_ts:
                    self._distrust_indexes(f"time index entry ({entry_ts}, {ts_offset}) does "
                                           "not match the log")
                    return self.find_offset_by_timestamp(timestamp, starting_offset)
            if header.max_timestamp >= timestamp and header.last_offset >= starting_offset:
                for rec in decode_records(body):
                    if rec.timestamp >= timestamp and rec.offset >= starting_offset:
                        return rec.offset, rec.timestamp
        return None

    def first_batch_timestamp(self) -> int:
        if self._first_batch_ts is None:
            self._first_batch_ts = -1
            for header, _ in self.walk(0):
                self._first_batch_ts = header.max_timestamp
                break
        return self._first_batch_ts

    def created_ms(self) -> float:
        try:
            return self.storage.mtime(self.log_path) * 1000
        except Exception:
            return time.time() * 1000

    # -- recovery and index rebuilding --------------------------------------------------------

    def recover(self, *, previous_last_offset: Optional[int] = None, apply: bool = True,
                chunk_bytes: int = 8 << 20) -> SegmentRecovery:
        """Validate every entry, cut at the first torn or corrupt one, rebuild both indexes.

        Beyond Kafka's CRC and size checks we also cut where offsets stop increasing or leave the
        segment's relative range: a magic 2 base offset is outside the CRC, so only this catches
        a flipped byte there.
        """
        size = self.size(refresh=True)
        builder = IndexBuilder(self.base_offset, self.config.index_interval_bytes)
        prev_last = self.base_offset - 1 if previous_last_offset is None else previous_last_offset
        error = None
        first_dropped = None
        try:
            for header, body in self.walk(0, size, with_body=True, window=chunk_bytes,
                                          strict=False):
                validate(body, header, header.position)
                base = header.base_offset if header.base_offset >= 0 else header.last_offset
                if header.magic < 2 and header.compression:
                    # the wrapper offset is outside the CRC: keep it only if it still decodes
                    decode_records(body, validate=False)
                if (header.last_offset <= prev_last or base <= prev_last or base > header.last_offset
                        or header.last_offset - self.base_offset > _INT32_MAX
                        or base < self.base_offset):
                    raise CorruptRecordError(
                        f"offsets {base}..{header.last_offset} at position {header.position} do "
                        f"not follow {prev_last} within segment {self.base_offset}", header.position)
                builder.add(header.size, header.last_offset, header.max_timestamp)
                prev_last = header.last_offset
        except CorruptRecordError as exc:
            error = str(exc)
        valid = builder.valid_bytes
        if valid < size:
            if error is None:
                error = f"torn entry at position {valid} ({size - valid} bytes to the end)"
            first_dropped = self._first_offset_at(valid, size, prev_last + 1)
        result = SegmentRecovery(self.log_path, self.base_offset, size, valid, size - valid,
                                 first_dropped, error, prev_last + 1)
        self._recovery_builder = builder
        if apply:
            # indexes first: they describe the valid prefix, so they never point past the log
            self._write_indexes(builder, full=True)
            if valid < size:
                self.storage.truncate(self.log_path, valid)
            self._size = valid
            self._builder = builder
        return result

    def _first_offset_at(self, position: int, size: int, next_offset: int) -> int:
        """The first offset lost: a magic 2 batch says it in its header (there may be a gap
        before it); otherwise it is the offset after the last valid entry."""
        if size - position >= _HEADER_BYTES:
            try:
                header = read_header(self.read(position, position + _HEADER_BYTES), 0)
                if header.magic == 2 and header.base_offset >= next_offset:
                    return header.base_offset
            except CorruptRecordError:
                pass
        return next_offset

    def rebuilt_indexes(self) -> Tuple[bytes, bytes]:
        """The .index and .timeindex bytes Kafka would rebuild from this segment (no writes)."""
        result_builder = IndexBuilder(self.base_offset, self.config.index_interval_bytes)
        for header, _ in self.walk(0, window=8 << 20, strict=False):
            result_builder.add(header.size, header.last_offset, header.max_timestamp)
        return (idx.encode_offset_index(result_builder.offset_entries, self.base_offset),
                idx.encode_time_index(result_builder.final_time_entries(), self.base_offset))

    def _write_indexes(self, builder: IndexBuilder, *, full: bool,
                       old_offset_entries: int = 0, old_time_entries: int = 0) -> None:
        """Bring both index files to the builder's state (whole rewrite or tail rewrite).

        The time index is written first. Dying between the two writes then leaves the *offset*
        index stale, and resuming from a stale offset index re-derives both files; the other order
        would let a stale final time entry pass for an interval entry (docs/format.md, §7).
        """
        st = self.storage
        offset_entries = builder.offset_entries
        time_entries = builder.final_time_entries()
        if full or not st.guarantees.append:
            st.replace(self.path(TIMEINDEX_SUFFIX),
                       idx.encode_time_index(time_entries, self.base_offset))
            st.replace(self.path(INDEX_SUFFIX),
                       idx.encode_offset_index(offset_entries, self.base_offset))
        else:
            keep = old_time_entries
            st.truncate(self.path(TIMEINDEX_SUFFIX), keep * idx.TIME_ENTRY_SIZE)
            if time_entries[keep:]:
                st.append(self.path(TIMEINDEX_SUFFIX),
                          idx.encode_time_index(time_entries[keep:], self.base_offset))
            new = offset_entries[old_offset_entries:]
            if new:
                st.append(self.path(INDEX_SUFFIX), idx.encode_offset_index(new, self.base_offset))
        self._timeindex_raw_len = len(time_entries) * idx.TIME_ENTRY_SIZE
        self._offset_index = (np.array([o for o, _ in offset_entries], dtype=np.int64),
                              np.array([p for _, p in offset_entries], dtype=np.int64))
        self._time_index = (np.array([t for t, _ in time_entries], dtype=np.int64),
                            np.array([o for _, o in time_entries], dtype=np.int64))

    # -- writing ------------------------------------------------------------------------------

    def prepare_append(self) -> None:
        """Recover this segment for appending, once per process (see :meth:`_append_state`)."""
        self._append_state()

    def _append_state(self) -> IndexBuilder:
        """The index rule's state at the end of the log, for appending.

        The first append of a process recovers the segment, as a broker recovers its unflushed
        segments after an unclean shutdown: every batch is validated, a torn or corrupt tail is
        cut, and both indexes are rewritten if they differ from the rebuild. Nothing a dead or
        buggy writer left is trusted; later appends by the same process keep the state.
        """
        if self._builder is None:
            self.invalidate()
            report = self.recover(apply=False)
            builder = self._recovery_builder
            if report.truncated_bytes or not self._stored_indexes_equal(builder):
                self.recover()
            else:
                self._builder = builder
                self._size = builder.valid_bytes
        return self._builder

    def _stored_indexes_equal(self, builder: IndexBuilder) -> bool:
        try:
            return (self.storage.read(self.path(INDEX_SUFFIX)) ==
                    idx.encode_offset_index(builder.offset_entries, self.base_offset) and
                    self.storage.read(self.path(TIMEINDEX_SUFFIX)) ==
                    idx.encode_time_index(builder.final_time_entries(), self.base_offset))
        except StorageNotFoundError:
            return False

    def append(self, data: bytes, headers: List[BatchHeader]) -> None:
        """Append whole, already offset-assigned entries and extend both indexes."""
        builder = self._append_state()
        old_offset_entries = len(builder.offset_entries)
        old_time_entries = len(builder.time_entries)
        if builder.valid_bytes == 0:
            self._first_batch_ts = headers[0].max_timestamp if headers else None
        for h in headers:
            builder.add(h.size, h.last_offset, h.max_timestamp)
        if self.storage.guarantees.append:
            self.storage.append(self.log_path, data)
        else:
            self.storage.replace(self.log_path, self.read(0, self.size()) + data)
        self._size = builder.valid_bytes
        self._write_indexes(builder, full=False, old_offset_entries=old_offset_entries,
                            old_time_entries=old_time_entries)

    def truncate_to(self, offset: int) -> int:
        """Drop every entry from the one holding ``offset`` on; returns the bytes removed."""
        header = self.find_batch(offset)
        if header is None:
            return 0
        size = self.size(refresh=True)
        # indexes first, so no index entry ever points past the log
        self.storage.replace(self.path(INDEX_SUFFIX), b"")
        self.storage.replace(self.path(TIMEINDEX_SUFFIX), b"")
        self.storage.truncate(self.log_path, header.position)
        self.invalidate()
        self.recover()
        return size - header.position

    def delete(self) -> None:
        """The log goes first: orphan index files are harmless and cleaned up on open."""
        self.storage.delete(self.log_path)
        for suffix in (INDEX_SUFFIX, TIMEINDEX_SUFFIX, TXNINDEX_SUFFIX):
            self.storage.delete(self.path(suffix))


def _valid_prefix_offset_index(buf: bytes, base: int) -> Tuple[np.ndarray, np.ndarray]:
    """Entries up to the first that breaks the index's order (e.g. Kafka's zero pre-allocation)."""
    raw = np.frombuffer(buf, dtype=[("rel", ">i4"), ("pos", ">i4")])
    rel, pos = raw["rel"].astype(np.int64), raw["pos"].astype(np.int64)
    ok = (rel >= 0) & (pos > 0)
    ok[1:] &= (np.diff(rel) > 0) & (np.diff(pos) > 0)
    bad = np.flatnonzero(~ok)
    n = int(bad[0]) if len(bad) else len(rel)
    return rel[:n] + base, pos[:n]


def _valid_prefix_time_index(buf: bytes, base: int) -> Tuple[np.ndarray, np.ndarray]:
    raw = np.frombuffer(buf, dtype=[("ts", ">i8"), ("rel", ">i4")])
    ts, rel = raw["ts"].astype(np.int64), raw["rel"].astype(np.int64)
    ok = (rel >= 0) & ~((ts == 0) & (rel == 0))   # an all-zero entry is pre-allocation
    ok[1:] &= (np.diff(ts) > 0) & (np.diff(rel) >= 0)
    bad = np.flatnonzero(~ok)
    n = int(bad[0]) if len(bad) else len(ts)
    return ts[:n], rel[:n] + base
