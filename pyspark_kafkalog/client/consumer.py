"""Reading a cluster: resolve where to start, list offsets, fetch committed records.

A fetch reads exactly what docs/protocol.md §4 lets a reader see, from the segments the
metadata state selects; a segment deleted under the reader is an OFFSET_OUT_OF_RANGE, never a
silently shorter answer.
"""
from __future__ import annotations

import time
from typing import Callable, Dict, Iterator, List, Mapping, Optional, Tuple, Union

from ..errors import InvalidConfigError, OffsetOutOfRangeError, StorageNotFoundError
from ..format.columnar import Columns
from ..format.records import DecodedRecord
from ..cluster.cluster import PartitionView
from .groups import GroupStore, OffsetAndMetadata, topic_ids, validate_group_id
from ..maintenance.repair import names_damaged_segments

EARLIEST, LATEST = "earliest", "latest"
FETCH_MAX_BYTES = 1 << 20   # per fetch, like Kafka's max.partition.fetch.bytes
DECODE_MAX_RECORDS = 1000   # records decoded at a time from a fetch
StartSpec = Union[str, int, Tuple[str, int]]


def parse_start(text: str) -> StartSpec:
    """CLI form: ``earliest``, ``latest``, an offset, or ``@<timestamp ms>``."""
    text = str(text).strip()
    if text in (EARLIEST, LATEST):
        return text
    if text.startswith("@"):
        try:
            return ("timestamp", int(text[1:]))
        except ValueError:
            raise InvalidConfigError(f"invalid timestamp in {text!r}: expected @<ms>") from None
    try:
        return int(text)
    except ValueError:
        raise InvalidConfigError(f"invalid start {text!r}: expected earliest, latest, an offset "
                                 "or @<timestamp ms>") from None


def resolve_offset(view: PartitionView, spec: StartSpec) -> Tuple[int, int]:
    """``(offset, timestamp)`` for a start spec (timestamp -1 unless found by time)."""
    if spec == EARLIEST:
        return view.log_start_offset, -1
    if spec == LATEST:
        return view.high_watermark, -1
    if isinstance(spec, tuple) and spec[0] == "timestamp":
        found = view.log.offset_for_timestamp(spec[1])
        if found is None or found[0] >= view.high_watermark:
            return view.high_watermark, -1
        return found
    if isinstance(spec, int) and not isinstance(spec, bool):
        if not view.log_start_offset <= spec <= view.high_watermark:
            raise OffsetOutOfRangeError(
                f"offset {spec} is out of range for {view.topic}-{view.partition}: log start "
                f"offset {view.log_start_offset}, high watermark {view.high_watermark}")
        return spec, -1
    raise InvalidConfigError(f"invalid start offset spec {spec!r}")


def read_columns(view: PartitionView, start: int, end: Optional[int] = None, *,
                 max_records: Optional[int] = None, max_bytes: int = 1 << 20) -> Columns:
    try:
        return view.log.read_columns(start, end, max_records=max_records, max_bytes=max_bytes)
    except StorageNotFoundError as exc:
        raise OffsetOutOfRangeError(
            f"{view.topic}-{view.partition}: data at or after offset {start} was deleted while "
            f"being read ({exc})") from None


@names_damaged_segments
def fetch_chunks(view: PartitionView, start: int, end: Optional[int] = None, *,
                 max_bytes: int = FETCH_MAX_BYTES, max_records: int = DECODE_MAX_RECORDS,
                 on_fetch: Optional[Callable[[int], object]] = None
                 ) -> Iterator[Tuple[List[DecodedRecord], int]]:
    """``(records, next offset)`` from ``start``: one fetch of at most ``max_bytes`` of log at a
    time, decoded a run of batches of about ``max_records`` records at a time.

    So a reader holds one fetch and a few thousand decoded records, however long the partition
    (a megabyte of small records decodes to tens of thousands of objects). The next offset is
    the one after the last batch decoded, so a consumer's position moves past offsets that hold
    no record for it (control batches), as Kafka's does. A fetch that finds nothing ends it.
    ``on_fetch(nbytes)`` is called after each fetch, before its records are handed out (where a
    client over its fetch quota waits, KIP-13).
    """
    from ..format.batch import iter_headers
    from ..format.columnar import decode_records
    offset = start
    end = view.high_watermark if end is None else min(end, view.high_watermark)
    while offset < end:
        try:
            data, _ = view.log.read(offset, max_bytes)
        except StorageNotFoundError as exc:
            raise OffsetOutOfRangeError(f"{view.topic}-{view.partition}: offset {offset} was "
                                        f"deleted while being read ({exc})") from None
        if not data:
            return
        if on_fetch is not None:
            on_fetch(len(data))
        part_start, part_records, reached = 0, 0, offset - 1
        last = None
        for h in iter_headers(data):
            if 0 <= end <= h.base_offset:
                break
            last = h
            part_records += max(0, h.last_offset - reached)
            reached = max(reached, h.last_offset)
            if part_records >= max_records:
                rows = decode_records(data, part_start, h.end, min_offset=offset,
                                      max_offset=end, skip_control=True)
                offset = max(offset, min(end, h.last_offset + 1))
                part_start, part_records = h.end, 0
                yield rows, offset
        if last is None:
            return
        if part_start < last.end:
            rows = decode_records(data, part_start, last.end, min_offset=offset, max_offset=end,
                                  skip_control=True)
            offset = max(offset + (not rows), min(end, last.last_offset + 1))
            yield rows, offset
        del data


def iter_records(view: PartitionView, start: int, end: Optional[int] = None, *,
                 max_records: Optional[int] = None) -> Iterator[DecodedRecord]:
    """Committed records from ``start``, in offset order, at most ``max_records``."""
    left = max_records
    if left is not None and left <= 0:
        return
    for rows, _ in fetch_chunks(view, start, end):
        for r in rows:
            yield r
            if left is not None:
                left -= 1
                if left <= 0:
                    return


class Consumer:
    """An iterator over the committed records of a topic's partitions, one partition after the
    other, each read one bounded fetch at a time; with a consumer group it resumes from the
    group's offsets and commits them.

    Positions follow Kafka's consumer. A partition's *position* is the offset after the last
    record handed out (:meth:`positions`); :meth:`commit` commits positions, as Kafka's
    ``commitSync()``. With ``enable_auto_commit`` the consumer commits only what the caller has
    *consumed*: a record counts once the caller asks for the next one (or the iteration ends),
    since until then it may still be in the caller's hands. That happens at most every
    ``auto_commit_interval_ms`` while iterating, when the iteration ends, and on :meth:`close`
    (also the end of a ``with`` block). A consumer that is dropped unclosed commits nothing
    more, so a crash never commits records that were not processed.

    ``start``, committed offsets and the end of each partition (its high watermark, or the end
    of the log for ``read_uncommitted``) are all taken from one metadata snapshot when the
    consumer is made: a bad start fails at the call, and records committed later are left for
    the next consumer, so that the iteration ends.
    """

    def __init__(self, cluster, topic: str, partitions: List[int], *, start: StartSpec = EARLIEST,
                 max_records: Optional[int] = None, isolation_level: str = "read_committed",
                 group: Optional[str] = None, enable_auto_commit: bool = True,
                 auto_commit_interval_ms: int = 5000, max_bytes: int = FETCH_MAX_BYTES,
                 wrap: Callable[[int, DecodedRecord], object] = lambda p, r: r,
                 quota=None):
        if max_records is not None and max_records < 0:
            raise InvalidConfigError(f"max_records must be >= 0, got {max_records}")
        if auto_commit_interval_ms < 0:
            raise InvalidConfigError(f"auto_commit_interval_ms must be >= 0, got "
                                     f"{auto_commit_interval_ms}")
        self.topic, self.group = topic, group
        self._store = None
        if group is not None:
            validate_group_id(group)
            self._store = GroupStore(cluster.storage, guard=cluster.check_writable)
        self._now_ms = cluster.now_ms
        state = cluster.state()
        self._topic_id = state.topics[topic]["topic_id"] if topic in state.topics else None
        spec = parse_start(start) if isinstance(start, str) else start
        committed = self._store.fetch(group, topic_ids(state)) if self._store else {}
        self._plan = []   # (partition, view, first offset), resolved now: errors come early
        for p in partitions:
            view = cluster.partition_view(topic, p, state, isolation_level=isolation_level)
            om = committed.get((topic, p))
            if om is not None and start == EARLIEST and om.offset <= view.state.next_offset:
                begin = max(om.offset, view.log_start_offset)
            else:                            # beyond the log's end: Kafka's auto.offset.reset
                begin = resolve_offset(view, spec)[0]
            self._plan.append((p, view, begin))
        self._left = max_records
        self._max_bytes = max_bytes
        #: KIP-13: ``quota.fetched(nbytes)`` waits out the client's throttle time
        #: (``coordinator.quota_client.QuotaClient``); None: not throttled
        self.quota = quota
        self._on_fetch = quota.fetched if quota is not None else None
        self._wrap = wrap
        self._auto = enable_auto_commit and group is not None
        self._interval = auto_commit_interval_ms / 1000.0
        self._next_commit = time.monotonic() + self._interval
        self._position: Dict[int, int] = {}
        self._consumed: Dict[int, int] = {}
        self._pending: Optional[Tuple[int, int]] = None
        self._stream = self._records()
        self._closed = False

    def _records(self):
        """(partition, record or None, position after it); None moves a position only."""
        for p, view, begin in self._plan:
            if self._left is not None and self._left <= 0:
                return
            yield p, None, begin
            for rows, next_offset in fetch_chunks(view, begin, max_bytes=self._max_bytes,
                                                  on_fetch=self._on_fetch):
                for r in rows:
                    yield p, r, r.offset + 1
                    if self._left is not None:
                        self._left -= 1
                        if self._left <= 0:
                            return
                yield p, None, next_offset

    def __iter__(self):
        return self

    def __next__(self):
        if self._pending is not None:         # asked for the next: the last one is consumed
            p, offset = self._pending
            self._consumed[p] = offset
            self._pending = None
            if self._auto and time.monotonic() >= self._next_commit:
                self._commit(self._consumed)
        if self._closed:
            raise StopIteration
        for p, r, after in self._stream:
            self._position[p] = after
            if r is None:
                self._consumed[p] = after
                continue
            self._pending = (p, after)
            return self._wrap(p, r)
        if self._auto:                        # a clean end: everything handed out is consumed
            self._commit(self._consumed)
            self._auto = False
        self._closed = True
        raise StopIteration

    def positions(self) -> Dict[Tuple[str, int], int]:
        """Per partition reached so far, the offset after the last record handed out."""
        return {(self.topic, p): o for p, o in self._position.items()}

    def commit(self, offsets: Optional[Mapping[Tuple[str, int], int]] = None) -> None:
        """Commit ``offsets`` (default: :meth:`positions`, every record handed out) for the
        group, under the id of the topic they were read from."""
        if self._store is None:
            raise InvalidConfigError("commit needs a consumer group (group=...)")
        if offsets is None:
            self._commit(self._position)
            return
        parts = {}
        for (topic, p), offset in offsets.items():
            if topic != self.topic:
                raise InvalidConfigError(f"this consumer reads {self.topic!r}, not {topic!r}")
            parts[p] = int(offset)
        self._commit(parts)

    def _commit(self, parts: Mapping[int, int]) -> None:
        self._next_commit = time.monotonic() + self._interval
        if parts:
            self._store.commit(self.group, {(self.topic, p): OffsetAndMetadata(
                o, topic_id=self._topic_id) for p, o in parts.items()}, now_ms=self._now_ms())

    def close(self) -> None:
        """Stop; with auto-commit, commit what the caller has consumed (not the record it holds)."""
        if self._auto:
            self._auto = False
            self._commit(self._consumed)
        self._closed = True
        self._stream.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
