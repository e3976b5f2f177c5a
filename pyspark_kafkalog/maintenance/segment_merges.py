"""Segment merges under the cluster protocol (docs/protocol.md §4.1): which runs of a partition
may be merged, the ``merge_segments`` entry that lets a merger replace their files, and the
deletion of the segments a merged one covers once ``file.delete.delay.ms`` has passed.

One pass over a partition, in this order:

1. **Finish** what earlier merges left in each of its replicas' directories: a segment whose
   data reaches past the next one's base covers it (a merge replaced the first file of a run);
   covered segments go once the covering ``.log`` is ``file.delete.delay.ms`` old on the
   storage's clock, after a flush of the directory, ``.log`` first. A merge marker left by a
   merger that died while it published has its segment's indexes rebuilt from the ``.log``.
2. **Plan** on the leader: adjacent visible segments, not covered, at or above the log start
   offset, in one gapless stretch of committed data, each at least ``segment.merge.lag.ms``
   old, never the partition's newest (the head, as Kafka never cleans its active segment),
   grouped by the size-tiered rule (``log.segment_merge.plan_runs``).
3. **Build** each run (read, CRC-check, index) before anything is written.
4. **Append** one ``merge_segments`` for the partition, planned on its last merge: of two
   mergers only one is valid.
5. **Publish**, only if the entry applied and within max(``file.delete.delay.ms``, 10 s) of
   it (``log.segment_merge.publish``: a marker, the ``.log``, the indexes): the leader's files,
   and those of every in-sync follower whose copy of the run is the leader's, so the ISR ends
   byte-identical.
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from ..errors import CorruptRecordError, KafkaLogError, KafkaStorageError, StorageNotFoundError
from ..log import segment_merge as SM
from ..log.segment import LOG_SUFFIX, LogSegment, segment_name
from ..cluster import actions as A
from ..cluster.features import SEGMENT_MERGE
from ..cluster.garbage import SEGMENT_SUFFIXES
from ..cluster.isr import leader_of
from ..cluster.state import ClusterState, tp_key

_log = logging.getLogger(__name__)

#: a merger publishes only this soon after its entry at the least, whatever
#: ``file.delete.delay.ms`` is: a later merge's covered segments go ``file.delete.delay.ms``
#: after it published, so a merger paused longer than that between its entry and its publish
#: could put back a shorter file over a longer one (docs/protocol.md §4.1)
MIN_PUBLISH_WINDOW_S = 10.0
#: a merge marker older than the publish window by this much was left by a dead merger
MARKER_MARGIN_MS = 5_000


@dataclass
class PartitionMerges:
    """What one pass did to a partition."""

    topic: str
    partition: int
    #: [base, end, segments, size] per run merged (published on the leader)
    merged: List[List[int]] = field(default_factory=list)
    #: bytes written by the merges (every replica) and the bytes of the runs they replaced
    bytes_written: int = 0
    #: covered segment files deleted, as "<dir>/<base>"
    deleted: List[str] = field(default_factory=list)
    #: segments whose indexes were rebuilt (a merge that died half-published)
    rebuilt: List[str] = field(default_factory=list)
    #: why a planned merge did not publish, if it did not
    skipped: Optional[str] = None
    #: (log dir, why) when the partition's leader could not be reached
    offline: Optional[Tuple[str, str]] = None


def listing(storage, d: str) -> Tuple[Dict[int, Tuple[int, Optional[float]]],
                                        Dict[int, Optional[float]]]:
    """``({base: (.log size, mtime)}, {base: mtime of its merge marker})`` of a partition
    directory."""
    logs, markers = {}, {}
    for info in storage.list(d):
        name = info.name
        if name.endswith(LOG_SUFFIX) and name[:-len(LOG_SUFFIX)].isdigit():
            logs[int(name[:-len(LOG_SUFFIX)])] = (info.size, info.mtime)
        elif name.endswith(SM.MERGING_SUFFIX) and name[:-len(SM.MERGING_SUFFIX)].isdigit():
            markers[int(name[:-len(SM.MERGING_SUFFIX)])] = info.mtime
    return logs, markers


def finish_dir(storage, d: str, config, visible, now_s: float,
               delay_ms: Optional[int] = None, out: Optional[PartitionMerges] = None, *,
               markers: bool = True) -> set:
    """Step 1 in one replica's directory; returns the bases still covered (not yet deleted).
    ``visible(base)``: the segments to look at (the leader's visible ones; a follower's all).
    ``markers``: also mend what dead mergers left (not right after a publish of our own)."""
    delay_ms = config.file_delete_delay_ms if delay_ms is None else delay_ms
    logs, found_markers = listing(storage, d)
    for b, mtime in sorted(found_markers.items()) if markers else ():
        # a merger died while it replaced b's files: once no live one can still be at it
        # (it publishes within its window or gives up), b's indexes are made from its .log
        if mtime is None:
            mtime = storage.mtime(f"{d}/{SM.marker_name(b)}")
        if (now_s - mtime) * 1000 >= max(delay_ms, 1000 * MIN_PUBLISH_WINDOW_S) + MARKER_MARGIN_MS:
            SM.repair_interrupted(storage, d, b, config)
            if out is not None:
                out.rebuilt.append(f"{d}/{b:020d}")
    bases = [b for b in sorted(logs) if visible(b)]
    covered: Dict[int, int] = {}   # covered base -> the base covering it
    for i, b in enumerate(bases[:-1]):
        if b in covered:
            continue
        nxt = bases[i + 1]
        m, m_next = logs[b][1], logs[nxt][1]
        if m is not None and m_next is not None and m < m_next:
            continue   # written before its successor: no merge replaced it since
        end = LogSegment(storage, d, b, config).next_offset()
        for later in bases[i + 1:]:
            if later >= end:
                break
            covered[later] = b
    gone = set()
    flushed = False
    for later, b in sorted(covered.items()):
        mtime = logs[b][1]
        if mtime is None:
            mtime = storage.mtime(f"{d}/{segment_name(b, LOG_SUFFIX)}")
        if (now_s - mtime) * 1000 < delay_ms:
            continue
        if not flushed:   # the merged file is on the device before its sources go
            storage.flush(d)
            flushed = True
        for suffix in SEGMENT_SUFFIXES:   # .log first: without it the rest is no segment
            storage.delete(f"{d}/{segment_name(later, suffix)}")
        gone.add(later)
        if out is not None:
            out.deleted.append(f"{d}/{later:020d}")
    return set(covered) - gone


def _runs(ps, logs, covered: set, config, now_s: float, lag_ms: int) -> List[List[int]]:
    """Step 2: lists of adjacent bases to merge."""
    bases = [b for b in sorted(logs) if ps.segment_visible(b) and b not in covered]
    if len(bases) < 3:
        return []
    head = bases[-1]
    out: List[List[int]] = []
    group: List[int] = []

    def close():
        if len(group) >= 2:
            for i, j in SM.plan_runs([logs[b][0] for b in group], config.segment_bytes):
                out.append(group[i:j])
        group.clear()
    stretch_end = None
    for i, b in enumerate(bases):
        nxt = bases[i + 1] if i + 1 < len(bases) else None
        mtime = logs[b][1]
        old = mtime is not None and (now_s - mtime) * 1000 >= lag_ms
        # the segment ends before the next one starts; it must lie in the same gapless
        # stretch of committed data as the group, and below the high watermark
        if (b == head or not old or b < ps.log_start_offset or nxt is None
                or nxt > ps.high_watermark):
            close()
            stretch_end = None
            continue
        if stretch_end is None or b >= stretch_end:
            close()
            stretch_end = ps.contiguous_committed_end(b)
        if nxt > stretch_end:   # its data may reach past the stretch: not in a run
            close()
            stretch_end = None
            continue
        group.append(b)
    close()
    return out


def followers_in_lockstep(cluster, state: ClusterState, topic: str, p: int, ps,
                           run_sources: List[List[Tuple[int, int]]],
                           lo: int, hi: int) -> List[str]:
    """In-sync followers that hold ``[lo, hi)`` as the leader's very files (same bases and
    sizes): they get the same merged bytes."""
    rep = ps.replication
    if rep is None:
        return []
    out = []
    for r in rep["isr"]:
        if r == rep["leader"]:
            continue
        if not any(s <= lo and hi <= e for s, e in rep["held"].get(r, [])):
            continue
        try:
            logs, _ = listing(cluster.storage, cluster.partition_dir(topic, p, r, state))
        except KafkaLogError:
            continue
        if all(logs.get(b, (None,))[0] == size for sources in run_sources
               for b, size in sources):
            out.append(r)
    return out


def merge_partition(cluster, state: ClusterState, topic: str, p: int, *,
                    now_s: Optional[float] = None, lag_ms: Optional[int] = None,
                    delay_ms: Optional[int] = None) -> PartitionMerges:
    """One pass over one partition (the module's steps). ``lag_ms``/``delay_ms`` override the
    topic's ``segment.merge.lag.ms``/``file.delete.delay.ms`` (tests, benchmarks)."""
    out = PartitionMerges(topic, p)
    ps = state.partition(topic, p)
    if ps is None:
        return out
    info = state.topics[topic]
    config = state.topic_config(topic)
    lag_ms = config.segment_merge_lag_ms if lag_ms is None else lag_ms
    storage = cluster.storage
    replicas = info["replicas"][p]
    leader = leader_of(ps, replicas)
    leader_dir = cluster.partition_dir(topic, p, leader, state)
    now_s = storage.clock(leader_dir.partition("/")[0]) if now_s is None else now_s
    covered = finish_dir(storage, leader_dir, config, ps.segment_visible, now_s, delay_ms, out)
    for r in replicas:
        if r == leader:
            continue
        try:   # a follower's root may be away: the next pass finishes there
            finish_dir(storage, cluster.partition_dir(topic, p, r, state), config,
                       lambda b: True, now_s, delay_ms, out)
        except KafkaLogError as exc:
            _log.info("segment merges: %s-%d on %s: %s", topic, p, r, exc)
    logs, _ = listing(storage, leader_dir)
    groups = _runs(ps, logs, covered, config, now_s, lag_ms)
    if not groups:
        return out
    built = []
    for bases in groups:
        try:
            built.append(SM.build(storage, leader_dir, [(b, logs[b][0]) for b in bases], config))
        except (CorruptRecordError, StorageNotFoundError) as exc:
            # replaced or deleted meanwhile, or damaged (repair's to report): not merged now
            out.skipped = str(exc)
            _log.warning("segment merges: %s-%d: %s", topic, p, exc)
    if not built:
        return out
    followers = followers_in_lockstep(cluster, state, topic, p, ps,
                                       [m.sources for m in built], built[0].base, built[-1].end)
    runs = [[m.base, m.end, len(m.sources), m.size] for m in built]
    action = A.MergeSegments(topic=topic, topic_id=info["topic_id"], partition=p,
                             after=state.segment_merges.get(tp_key(topic, p), -1), runs=runs,
                             log_dirs=[leader] + followers)
    if SEGMENT_MERGE not in cluster.state(refresh=False).reader_features:
        cluster.enable_feature(SEGMENT_MERGE)
    delay = config.file_delete_delay_ms if delay_ms is None else delay_ms
    if not submit_and_publish(cluster, state, topic, p, action, built, [leader] + followers,
                              delay, out):
        return out
    out.merged = runs
    return out


def submit_and_publish(cluster, state: ClusterState, topic: str, p: int, action,
                       built: Sequence[SM.MergedSegment], log_dirs: Sequence[str],
                       delay_ms: int, out: PartitionMerges) -> bool:
    """Steps 4 and 5 of a rewrite, a merge's or a clean's (docs/protocol.md §4.1, §4.2): append
    its entry and, only if it applied, publish every rewritten segment to ``log_dirs`` (leader
    first, whose files are the sources) within the publish window; with no delete delay, the
    segments they cover go at once. False when the entry did not apply (``out.skipped`` says
    why); a publish that stopped half-way also says so, and its entry stands: what was not
    replaced stays whole and readable, and a later pass rewrites it again."""
    storage = cluster.storage
    appended_at = time.monotonic()
    _, _, results = cluster.submit([action])
    if not results[0].ok:
        out.skipped = f"{results[0].error}: {results[0].message}"
        return False
    window = max(delay_ms / 1000, MIN_PUBLISH_WINDOW_S)

    def still_valid():
        if time.monotonic() - appended_at >= window:
            raise KafkaStorageError(f"{topic}-{p}: the {action.OP} entry is older than "
                                    f"{window:.0f} s; a later rewrite may have replaced it")
    dirs = [cluster.partition_dir(topic, p, r, state) for r in log_dirs]
    try:
        for d in dirs:
            for m in built:
                SM.publish(storage, d, m, still_valid, source_dir=dirs[0])
                out.bytes_written += m.size + len(m.index) + len(m.timeindex)
    except KafkaLogError as exc:
        out.skipped = str(exc)
        _log.warning("%s: %s-%d: publishing stopped: %s", action.OP, topic, p, exc)
    if delay_ms == 0 and not out.skipped:   # nothing to wait for: the covered go in this pass
        # (whatever the time now: the pass's clock was read before it began)
        ps = state.partition(topic, p)
        config = state.topic_config(topic)
        for i, d in enumerate(dirs):
            finish_dir(storage, d, config, ps.segment_visible if i == 0 else (lambda b: True),
                       math.inf, 0, out, markers=False)
    return True


def merge_step(cluster, state: ClusterState, items: Sequence[Tuple[str, int]],
               arg: Tuple[Optional[int], Optional[int], Sequence[str]]) -> List[PartitionMerges]:
    """A pass over the partitions ``items`` (a fan-out's group: this process or a Spark task),
    against ``state``; ``arg``: (lag_ms, delay_ms, log dirs known to be offline)."""
    lag_ms, delay_ms, known_offline = arg
    clocks: Dict[str, float] = {}

    def run(state, topic, p, leader):
        if leader not in clocks:   # one probe of the storage's clock per log dir
            clocks[leader] = cluster.storage.clock(leader)
        result = merge_partition(cluster, state, topic, p, now_s=clocks[leader],
                                 lag_ms=lag_ms, delay_ms=delay_ms)
        reported = result.merged or result.deleted or result.rebuilt or result.skipped
        return (result if reported else None), bool(result.merged)
    return each_partition(cluster, state, items, known_offline, run, PartitionMerges)


def each_partition(cluster, state: ClusterState, items: Sequence[Tuple[str, int]],
                   known_offline: Sequence[str], run, make) -> list:
    """The loop of a rewrite pass, a merge's or a clean's: ``run(state, topic, p, leader)``
    per partition gives (what to report or None, whether the partition's rewrite seq moved:
    the state is read again then). A partition whose leader's log dir cannot be reached is
    skipped and reported as ``make(topic, p, offline=(log dir, why))`` (KIP-112: the others go
    on); a damaged or vanished file as ``make(topic, p, skipped=why)``: damage is repair's to
    report and mend, and a file deleted under the pass (retention, delete-records) is the next
    pass's to look at again."""
    from ..cluster.log_dirs import noting_offline
    offline: Dict[str, str] = {d: "" for d in known_offline}
    out = []
    for topic, p in items:
        ps = state.partition(topic, p)
        if ps is None:
            continue
        leader = leader_of(ps, state.topics[topic]["replicas"][p])
        if leader in offline:
            if offline[leader]:
                out.append(make(topic, p, offline=(leader, offline[leader])))
            continue
        with noting_offline(offline, leader):
            try:
                result, moved = run(state, topic, p, leader)
            except (CorruptRecordError, StorageNotFoundError) as exc:
                result, moved = make(topic, p, skipped=str(exc)), False
            if result is not None:
                out.append(result)
            if moved:
                state = cluster.state(refresh=False)
        if leader in offline:
            out.append(make(topic, p, offline=(leader, offline[leader])))
    return out
