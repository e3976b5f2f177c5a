"""Log compaction under the cluster protocol (docs/protocol.md §4.2): which part of a compacted
partition may be cleaned and when, its offset map and groups, and the ``clean_segments`` entry
that lets the cleaner replace their files. The cleaning of bytes is ``log/cleaner.py``'s.

One pass over a partition:

1. **Finish** what earlier merges and cleans left (covered segments past
   ``file.delete.delay.ms``, dead rewriters' markers): ``segment_merges.finish_dir``. While
   covered segments still wait, the partition is not cleaned again (unless asked to): a clean
   would publish their covering file anew and restart their wait.
2. **Plan** on the leader: the cleanable segments (at or above the log start offset, below the
   head, old enough for ``min.compaction.lag.ms``, in one gapless stretch of committed data),
   the dirty section from the partition's cleaner checkpoint, and whether it is due (dirty
   ratio, ``max.compaction.lag.ms``, or asked for).
3. **Build** the offset map over the dirty section, as much as ``log.cleaner.dedupe.buffer.size``
   holds, and clean every group up to where it stopped, in memory, writing nothing.
4. **Append** one ``clean_segments`` planned on the partition's last rewrite, and **publish**
   as a merge does (``segment_merges.submit_and_publish``): leader and in-step followers.

A kafkalog cluster's writers write no producer ids and no transaction markers, so there is no
producer state or aborted transaction for the cleaner to keep: it cleans with none.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, List, Optional, Sequence, Tuple

from ..cluster import actions as A
from ..cluster.features import LOG_COMPACTION
from ..cluster.isr import leader_of
from ..cluster.state import ClusterState, tp_key
from ..errors import CorruptRecordError, KafkaLogError, StorageNotFoundError
from ..log import cleaner as C
from ..log import segment_merge as SM
from ..log.config import LogConfig
from ..log.offset_map import OffsetMap
from ..log.segment import LOG_SUFFIX, LogSegment, segment_name
from .segment_merges import (PartitionMerges, each_partition, finish_dir,
                             followers_in_lockstep, listing, submit_and_publish)

_log = logging.getLogger(__name__)

#: Kafka's ``log.cleaner.dedupe.buffer.size`` default: the offset map's memory
DEFAULT_DEDUPE_BUFFER_SIZE = 128 << 20
#: Kafka's ``log.cleaner.io.buffer.load.factor``
DEFAULT_LOAD_FACTOR = 0.9


@dataclass
class CleanerSettings:
    """The cleaner's own settings (the coordinator's, or a command's): the offset map's memory
    and load factor, and a throttle called with every byte count read or written
    (``log.cleaner.io.max.bytes.per.second``)."""
    dedupe_buffer_size: int = DEFAULT_DEDUPE_BUFFER_SIZE
    load_factor: float = DEFAULT_LOAD_FACTOR
    throttle: Optional[Callable[[int], None]] = None


@dataclass
class PartitionClean:
    """What one pass did to a compacted partition (Kafka's ``CleanerStats``, in part)."""

    topic: str
    partition: int
    #: [base, end, segments, size] per group cleaned (published on the leader)
    cleaned: List[List[int]] = field(default_factory=list)
    #: the partition's cleaner checkpoint after the clean
    cleaned_to: Optional[int] = None
    #: dirty bytes over clean plus dirty bytes when planned (Kafka's ``max-dirty-percent``)
    dirty_ratio: float = 0.0
    #: how late the clean was, past ``max.compaction.lag.ms`` (Kafka's
    #: ``max-compaction-delay-secs``), 0 when it was not due by lag
    compaction_delay_ms: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    records_read: int = 0
    records_kept: int = 0
    elapsed_s: float = 0.0
    deleted: List[str] = field(default_factory=list)
    rebuilt: List[str] = field(default_factory=list)
    skipped: Optional[str] = None
    offline: Optional[Tuple[str, str]] = None

    @property
    def recopy_ratio(self) -> float:
        """Bytes written over bytes read (Kafka's ``cleaner-recopy-percent``)."""
        return self.bytes_written / self.bytes_read if self.bytes_read else 0.0


class Throttle:
    """Kafka's ``Throttler`` for ``log.cleaner.io.max.bytes.per.second``: every byte the
    cleaners read or write, in all their threads, is counted, and a cleaner that is ahead of the
    rate sleeps until it is not."""

    def __init__(self, bytes_per_second: float, clock=time.monotonic, sleep=time.sleep):
        self.rate, self.clock, self.sleep = bytes_per_second, clock, sleep
        self._lock = threading.Lock()
        self._start, self._bytes = clock(), 0

    def __call__(self, nbytes: int) -> None:
        with self._lock:
            self._bytes += nbytes
            ahead = self._bytes / self.rate - (self.clock() - self._start)
        if ahead > 0:
            self.sleep(ahead)


class _Stored:
    """A source segment whose bytes are read when the cleaner needs them and not kept: the
    offset map and the groups see the log one segment at a time, so memory follows the
    largest group, not the log."""

    __slots__ = ("storage", "path", "base_offset", "size", "last_modified_ms", "throttle")

    def __init__(self, storage, d: str, base: int, size: int, mtime: Optional[float],
                 throttle):
        self.storage, self.path = storage, f"{d}/{segment_name(base, LOG_SUFFIX)}"
        self.base_offset, self.size, self.throttle = base, size, throttle
        self.last_modified_ms = int((mtime or 0) * 1000)

    @property
    def data(self) -> bytes:
        data = self.storage.read(self.path)
        if len(data) != self.size:
            raise CorruptRecordError(f"{self.path} has {len(data)} bytes, the listing said "
                                     f"{self.size}: another rewrite replaced it; try again")
        if self.throttle is not None:
            self.throttle(len(data))
        return data


def _cleanable(cluster, ps, config: LogConfig, d: str, logs, covered: set, now_ms: int
               ) -> Tuple[List[int], int]:
    """Step 2's segments: the bases that may be cleaned, in order, and the first uncleanable
    offset (docs/protocol.md §4.2, "The head is never cleaned")."""
    visible = [b for b in sorted(logs) if ps.segment_visible(b) and b not in covered]
    if not visible:
        return [], 0
    head = visible[-1]
    bases = [b for b in visible if b >= ps.log_start_offset]
    out: List[int] = []
    stretch_end = ps.contiguous_committed_end(bases[0]) if bases else 0
    for i, b in enumerate(bases):
        nxt = bases[i + 1] if i + 1 < len(bases) else None
        if b == head or nxt is None or nxt > ps.high_watermark or nxt > stretch_end:
            return out, b
        if config.min_compaction_lag_ms > 0:
            newest = LogSegment(cluster.storage, d, b, config).largest_timestamp()
            if newest > now_ms - config.min_compaction_lag_ms:
                return out, b
        out.append(b)
    return out, head


#: a segment's offsets relative to its base are int32 in its indexes
_MAX_RELATIVE_OFFSET = (1 << 31) - 1


def _groups(bases: Sequence[int], logs, segment_bytes: int, end: int) -> List[List[int]]:
    """Kafka's ``groupSegmentsBySize`` by the listed ``.log`` sizes: a group fits
    ``segment.bytes``, and its offsets fit its indexes' relative offsets (a log cleaned before
    may hold few records over many offsets). ``end``: the offset after the last base's
    segment."""
    groups: List[List[int]] = []
    size = 0
    nexts = dict(zip(bases, list(bases[1:]) + [end]))
    for b in bases:
        if (groups and size + logs[b][0] <= segment_bytes
                and nexts[b] - 1 - groups[-1][0] <= _MAX_RELATIVE_OFFSET):
            groups[-1].append(b)
            size += logs[b][0]
        else:
            groups.append([b])
            size = logs[b][0]
    return groups


def clean_partition(cluster, state: ClusterState, topic: str, p: int, *,
                    now_s: Optional[float] = None, force: bool = False,
                    delay_ms: Optional[int] = None,
                    settings: Optional[CleanerSettings] = None) -> PartitionClean:
    """One pass over one compacted partition (the module's steps); a partition of a topic that
    is not compacted is left alone. ``force``: clean whatever is dirty, due or not;
    ``delay_ms`` overrides the topic's ``file.delete.delay.ms`` (tests, benchmarks)."""
    out = PartitionClean(topic, p)
    config = state.topic_config(topic) if topic in state.topics else None
    ps = state.partition(topic, p)
    if config is None or not config.compact or ps is None:
        return out
    settings = settings or CleanerSettings()
    started = time.monotonic()
    storage = cluster.storage
    info = state.topics[topic]
    replicas = info["replicas"][p]
    leader = leader_of(ps, replicas)
    leader_dir = cluster.partition_dir(topic, p, leader, state)
    now_s = storage.clock(leader_dir.partition("/")[0]) if now_s is None else now_s
    now_ms = int(now_s * 1000)
    merges = PartitionMerges(topic, p)
    covered = finish_dir(storage, leader_dir, config, ps.segment_visible, now_s, delay_ms, merges)
    for r in replicas:
        if r != leader:
            try:   # a follower's root may be away: the next pass finishes there
                finish_dir(storage, cluster.partition_dir(topic, p, r, state), config,
                           lambda b: True, now_s, delay_ms, merges)
            except KafkaLogError as exc:
                _log.info("log cleaner: %s-%d on %s: %s", topic, p, r, exc)
    out.deleted, out.rebuilt = merges.deleted, merges.rebuilt
    if covered and not force:
        # an earlier rewrite's covered segments wait for file.delete.delay.ms after the file
        # that covers them was published; a clean now would publish that file again, and
        # restart their wait: with cleans more frequent than the delay they would never go
        out.skipped = (f"{len(covered)} covered segment(s) wait for file.delete.delay.ms "
                       "before the next clean")
        return out
    logs, _ = listing(storage, leader_dir)
    bases, uncleanable = _cleanable(cluster, ps, config, leader_dir, logs, covered, now_ms)
    if not bases:
        return out
    key = tp_key(topic, p)
    first_dirty = max(state.cleaner_checkpoints.get(key, 0), bases[0])
    ends = bases[1:] + [uncleanable]
    clean_bytes = sum(logs[b][0] for b, e in zip(bases, ends) if e <= first_dirty)
    dirty = [b for b, e in zip(bases, ends) if e > first_dirty]
    dirty_bytes = sum(logs[b][0] for b in dirty)
    if not dirty_bytes:
        return out
    out.dirty_ratio = dirty_bytes / (clean_bytes + dirty_bytes)
    due = force or out.dirty_ratio >= config.min_cleanable_dirty_ratio
    if config.max_compaction_lag_ms < (1 << 63) - 1:
        oldest = LogSegment(storage, leader_dir, dirty[0], config).first_batch_timestamp()
        late = now_ms - config.max_compaction_lag_ms - oldest
        if oldest >= 0 and late >= 0:
            due, out.compaction_delay_ms = True, late
    if not due:
        return out
    sources = {b: _Stored(storage, leader_dir, b, logs[b][0], logs[b][1], settings.throttle)
               for b in bases}
    offset_map = OffsetMap(settings.dedupe_buffer_size, settings.load_factor)
    stats = C.CleanerStats()
    holding = [sources[b] for b in dirty]
    try:
        cleaned_to = C.build_offset_map(holding, offset_map, first_dirty, uncleanable, (), stats)
        if cleaned_to <= first_dirty:
            out.skipped = "the offset map took no key (log.cleaner.dedupe.buffer.size)"
            return out
        clean_section = [b for b in bases if b < first_dirty]
        horizon = C.legacy_delete_horizon_ms(
            sources[clean_section[-1]].last_modified_ms if clean_section else None,
            config.delete_retention_ms)
        cleanable = [b for b in bases if b < cleaned_to]
        txn = C.TransactionMetadata(())
        built = []
        after_last = dict(zip(bases, ends))[cleanable[-1]]
        for group in _groups(cleanable, logs, config.segment_bytes, after_last):
            cleaned = C.clean_segments(
                [sources[b] for b in group], offset_map, now_ms=now_ms,
                delete_retention_ms=config.delete_retention_ms, txn=txn,
                legacy_delete_horizon=horizon,
                index_interval_bytes=config.index_interval_bytes, retain_last_batch=True)
            stats.add(cleaned.stats)
            unchanged = len(group) == 1 and cleaned.size == logs[group[0]][0]
            if unchanged or cleaned.last_offset is None:
                continue
            if settings.throttle is not None:
                settings.throttle(cleaned.size)
            built.append(SM.MergedSegment(
                base=group[0], end=cleaned.last_offset + 1,
                sources=[(b, logs[b][0]) for b in group], size=cleaned.size,
                index=cleaned.index, timeindex=cleaned.timeindex,
                pieces=[memoryview(x) for x in cleaned.pieces], config=config))
    except (CorruptRecordError, StorageNotFoundError) as exc:
        # replaced or deleted meanwhile, or damaged (repair's to report): not cleaned now
        out.skipped = str(exc)
        _log.warning("log cleaner: %s-%d: %s", topic, p, exc)
        return out
    out.bytes_read = stats.bytes_read + stats.map_bytes_read
    out.records_read, out.records_kept = stats.records_read, stats.records_kept
    runs = [[m.base, m.end, len(m.sources), m.size] for m in built]
    followers = (followers_in_lockstep(cluster, state, topic, p, ps, [m.sources for m in built],
                                       built[0].base, built[-1].end) if built else [])
    if not runs and cleaned_to <= state.cleaner_checkpoints.get(key, 0):
        return out   # nothing to rewrite, and the checkpoint would not move
    # with no runs (every key was unique) the checkpoint alone moves: the next pass does not
    # build the same map again
    action = A.CleanSegments(topic=topic, topic_id=info["topic_id"], partition=p,
                             after=state.segment_merges.get(key, -1), runs=runs,
                             cleaned_to=cleaned_to, log_dirs=[leader] + followers)
    if LOG_COMPACTION not in cluster.state(refresh=False).reader_features:
        cluster.enable_feature(LOG_COMPACTION)
    delay = config.file_delete_delay_ms if delay_ms is None else delay_ms
    applied = submit_and_publish(cluster, state, topic, p, action, built, [leader] + followers,
                                 delay, merges)
    out.skipped = merges.skipped   # out.deleted and .rebuilt are merges' lists, filled in place
    if not applied:
        return out
    out.bytes_written = merges.bytes_written
    out.cleaned, out.cleaned_to = runs, cleaned_to
    out.elapsed_s = time.monotonic() - started
    return out


def clean_step(cluster, state: ClusterState, items: Sequence[Tuple[str, int]],
               arg: Tuple[bool, Optional[int], Sequence[str], Optional[CleanerSettings]]
               ) -> List[PartitionClean]:
    """A pass over the compacted partitions among ``items`` (a fan-out's group: this process or
    a Spark task), against ``state``; ``arg``: (force, delay_ms, log dirs known to be offline,
    settings). Every compacted partition is reported, cleaned or not: its dirty ratio is the
    cleaner's metric."""
    force, delay_ms, known_offline, settings = arg

    def run(state, topic, p, leader):
        if topic not in state.topics or not state.topic_config(topic).compact:
            return None, False
        result = clean_partition(cluster, state, topic, p, force=force, delay_ms=delay_ms,
                                 settings=settings)
        return result, bool(result.cleaned or result.cleaned_to is not None)
    return each_partition(cluster, state, items, known_offline, run, PartitionClean)
