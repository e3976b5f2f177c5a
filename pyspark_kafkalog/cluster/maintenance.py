"""Deleting data and cleaning up: DeleteRecords (KIP-107), retention, and garbage collection.

All of it only raises log start offsets through the metadata log and then deletes files that no
reader may select any more (docs/protocol.md, §6-§7), so any number of these can run at once, be
killed at any point, and be re-run: the next run finishes what the last one started.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Tuple

from ..errors import KafkaLogError, StorageNotFoundError, error_for
from ..log.segment import LogSegment
from .checkpoints import sync_checkpoints
from .state import ClusterState, split_key, tp_key

TopicPartition = Tuple[str, int]
_SEGMENT_FILE = re.compile(r"^(\d{20})\.(log|index|timeindex|txnindex)$")
SEGMENT_SUFFIXES = (".log", ".index", ".timeindex", ".txnindex")


@dataclass
class DeleteRecordsResult:
    """KIP-107's per-partition answer: the new low watermark, or an error."""

    low_watermark: int = -1
    error: Optional[KafkaLogError] = None


@dataclass
class RetentionPlan:
    topic: str
    partition: int
    log_start_offset: int
    new_log_start_offset: int
    segments: List[int] = field(default_factory=list)     # base offsets to delete
    bytes: int = 0
    reason: str = ""
    topic_id: str = ""      # the incarnation planned against: a recreated topic is left alone


def _segments(cluster, state: ClusterState, topic: str, partition: int) -> List[LogSegment]:
    return cluster.partition_view(topic, partition, state).log.segments


def delete_below_log_start(cluster, state: ClusterState, topic: str, partition: int) -> List[int]:
    """Kafka's rule over the visible segments: a segment goes when the next one's base offset
    is <= the log start offset; the newest one never goes this way."""
    ps = state.partition(topic, partition)
    segs = _segments(cluster, state, topic, partition)
    deleted = []
    for seg, nxt in zip(segs, segs[1:]):
        if nxt.base_offset <= ps.log_start_offset:
            seg.delete()
            deleted.append(seg.base_offset)
        else:
            break
    # segments no longer visible at all (their committed range now lies wholly below the log
    # start offset) go too; nothing at or above the log start offset is touched
    d = cluster.partition_dir(topic, partition, state=state)
    visible = {s.base_offset for s in segs}
    for info in cluster.storage.list(d):
        m = _SEGMENT_FILE.match(info.name)
        if m and m.group(2) == "log":
            base = int(m.group(1))
            if base < ps.log_start_offset and base not in visible and base not in deleted:
                LogSegment(cluster.storage, d, base).delete()
                deleted.append(base)
    return sorted(deleted)


def delete_records(cluster, offsets: Mapping[TopicPartition, int]
                   ) -> Dict[TopicPartition, DeleteRecordsResult]:
    """``deleteRecordsBefore``: one metadata entry for every partition, then file deletion."""
    results: Dict[TopicPartition, DeleteRecordsResult] = {}
    request = {}
    for (topic, partition), offset in offsets.items():
        if not isinstance(offset, int) or isinstance(offset, bool) or offset < -1:
            results[(topic, partition)] = DeleteRecordsResult(
                error=error_for("OFFSET_OUT_OF_RANGE", f"invalid offset {offset!r} for "
                                f"{topic}-{partition}: must be >= 0, or -1 for the high watermark"))
            continue
        request[tp_key(topic, partition)] = offset
    if not request:
        return results
    _, state, res = cluster.submit([{"op": "set_log_start", "partitions": request,
                                     "principal": cluster.principal}])
    per = res[0].get("partitions", {}) if res[0].get("error") == "NONE" else {
        k: res[0] for k in request}
    done = []
    for key, r in per.items():
        tp = split_key(key)
        if r.get("error") == "NONE":
            results[tp] = DeleteRecordsResult(low_watermark=r["low_watermark"])
            done.append(tp)
        else:
            results[tp] = DeleteRecordsResult(error=error_for(r["error"], r.get("message", "")))
    for tp in done:
        delete_below_log_start(cluster, state, *tp)
    sync_checkpoints(cluster, state, done)
    return results


def _largest_timestamp(seg: LogSegment) -> float:
    """Kafka's ``LogSegment.largestTimestamp``: the largest record timestamp, or for a segment
    without timestamps (magic 0, or records written with timestamp -1) its file's mtime."""
    ts = seg.largest_timestamp()
    return ts if ts >= 0 else seg.created_ms()


def plan_retention(cluster, state: ClusterState, now_ms: int,
                   partitions: Optional[List[TopicPartition]] = None) -> List[RetentionPlan]:
    """Which whole segments ``retention.ms`` (by each segment's largest timestamp, KIP-32) and
    ``retention.bytes`` (per partition) remove, and the log start offset that follows."""
    plans = []
    for topic, partition in partitions or cluster.partitions(state):
        for _attempt in range(3):
            try:
                plan = _plan_partition(cluster, state, topic, partition, now_ms)
                break
            except StorageNotFoundError:
                # delete-records or another retention run deleted a segment under us; they only
                # raise the log start offset, so plan again from a newer state
                state = cluster.state()
        else:
            continue   # still racing: the next run plans this partition
        if plan is not None:
            plans.append(plan)
    return plans


def _plan_partition(cluster, state: ClusterState, topic: str, partition: int,
                    now_ms: int) -> Optional[RetentionPlan]:
    ps = state.partition(topic, partition)
    if ps is None:
        return None
    config = state.topic_config(topic)
    if "delete" not in config.cleanup_policy:
        return None
    segs = _segments(cluster, state, topic, partition)
    sizes = [s.size() for s in segs]
    total = sum(sizes)
    cut, reasons = 0, set()
    while cut < len(segs):
        seg = segs[cut]
        by_time = (config.retention_ms >= 0
                   and now_ms - _largest_timestamp(seg) > config.retention_ms)
        by_size = config.retention_bytes >= 0 and total - sizes[cut] >= config.retention_bytes
        if not (by_time or by_size):
            break
        reasons.add("retention.ms" if by_time else "retention.bytes")
        total -= sizes[cut]
        cut += 1
    if cut == 0:
        return None
    new_lso = segs[cut].base_offset if cut < len(segs) else ps.high_watermark
    return RetentionPlan(topic, partition, ps.log_start_offset,
                         max(new_lso, ps.log_start_offset),
                         [s.base_offset for s in segs[:cut]], sum(sizes[:cut]),
                         ",".join(sorted(reasons)), state.topics[topic]["topic_id"])


def apply_retention(cluster, plans: List[RetentionPlan]) -> ClusterState:
    """One ``set_log_start`` entry for every partition trimmed, then the file deletions."""
    state = cluster.state()
    if not plans:
        return state
    # retention is the cluster's own policy, not a user's request: no principal, no ACL check
    _, state, results = cluster.submit([{
        "op": "set_log_start", "principal": None, "reason": "retention",
        "topic_ids": {p.topic: p.topic_id for p in plans if p.topic_id},
        "partitions": {tp_key(p.topic, p.partition): p.new_log_start_offset for p in plans}}])
    outcome = results[0].get("partitions", {})
    for p in plans:
        if outcome.get(tp_key(p.topic, p.partition), {}).get("error") != "NONE":
            continue   # deleted, recreated or otherwise changed since planning: touch nothing
        # segments wholly below the new log start offset are no longer visible: delete them
        d = cluster.partition_dir(p.topic, p.partition, state=state)
        for base in p.segments:
            LogSegment(cluster.storage, d, base).delete()
        delete_below_log_start(cluster, state, p.topic, p.partition)
    sync_checkpoints(cluster, state, [(p.topic, p.partition) for p in plans])
    return state


def collect_garbage(cluster, *, temp_file_max_age_s: float = 3600.0) -> Dict[str, List[str]]:
    """Remove what dead, aborted or fenced writers left (docs/protocol.md, §7).

    Garbage is only what the metadata names as such: segments in an aborted range, segments below
    the log start offset (Kafka's rule), and the directories of a deleted topic. Committed data is
    never garbage, whatever the high watermark is: a segment committed above a high watermark that
    an older open reservation holds back is committed, only not visible yet. Nothing is deleted
    because the state merely lacks it (a snapshot, a listing or a replay can be behind).

    The state is replayed *before* listing segment files (a segment written after that replay
    belongs to a reservation the state does not know, and is not in an aborted range of it), and
    again *after* listing partition directories (a topic created meanwhile is live in it).
    """
    cluster.abort_expired()
    state = cluster.state()
    removed: Dict[str, List[str]] = {"segments": [], "dirs": [], "temp": [], "unknown_dirs": []}
    listed = {logdir: cluster.storage.list_dirs(logdir) for logdir in cluster.logdirs}
    after = cluster.state()
    live_dirs = {}
    for topic, info in after.topics.items():
        for p, replicas in enumerate(info["replicas"]):
            for d in replicas:
                live_dirs[f"{d}/{topic}-{p}"] = (topic, p)
    for logdir in cluster.logdirs:
        removed["temp"] += cluster.storage.cleanup_temp_files(logdir, temp_file_max_age_s)
        for name in listed[logdir]:
            path = f"{logdir}/{name}"
            if path not in live_dirs:
                if "-" in name and name.rpartition("-")[2].isdigit():
                    if _deleted_topic_dir(cluster, after, path, name.rpartition("-")[0]):
                        cluster.storage.delete_tree(path)
                        removed["dirs"].append(path)
                    else:
                        removed["unknown_dirs"].append(path)
                continue
            topic, p = live_dirs[path]
            ps = state.partition(topic, p)
            if ps is None or state.topics[topic]["topic_id"] != after.topics[topic]["topic_id"]:
                continue   # created (or recreated) after our first replay: the next run
            removed["temp"] += cluster.storage.cleanup_temp_files(path, temp_file_max_age_s)
            bases = {}
            for info in cluster.storage.list(path):
                m = _SEGMENT_FILE.match(info.name)
                if m:
                    bases.setdefault(int(m.group(1)), set()).add(m.group(2))
            for base, kinds in sorted(bases.items()):
                if not is_garbage_segment(ps, base, "log" in kinds):
                    continue
                for suffix in SEGMENT_SUFFIXES:
                    cluster.storage.delete(f"{path}/{base:020d}{suffix}")
                removed["segments"].append(f"{path}/{base:020d}")
            removed["segments"] += [f"{path}/{b:020d}" for b in
                                    delete_below_log_start(cluster, state, topic, p)]
    sync_checkpoints(cluster, state, cluster.partitions(state))
    return removed


def is_garbage_segment(ps, base: int, has_log: bool) -> bool:
    """The protocol's garbage rule for the files of one segment base in a live partition (§7).
    A ``.log`` goes only in an aborted range (segments below the log start offset that still
    have one are for ``delete_below_log_start``, which applies Kafka's rule to them). Indexes
    without their ``.log`` are never read; they go unless a write the state knows of, or does
    not know of yet, may still be writing them (``.log`` is written last)."""
    if has_log:
        return ps.is_aborted(base) and not ps.is_committed(base)
    return base < ps.next_offset and not ps.in_open_range(base)


def _deleted_topic_dir(cluster, state: ClusterState, path: str, topic: str) -> bool:
    """A partition directory is a deleted topic's only on positive evidence: its
    ``partition.metadata`` names a topic id that the metadata log deleted (or that is no longer
    the id of a live topic of that name), or, without that file, its topic's name was deleted."""
    from ..format.checkpoint import parse_partition_metadata
    try:
        topic_id = parse_partition_metadata(
            cluster.storage.read(f"{path}/partition.metadata").decode("utf-8", "replace"))
    except (StorageNotFoundError, KafkaLogError, ValueError):
        topic_id = None
    if topic_id is not None:
        if topic_id in state.deleted_topics:
            return True
        live = state.topics.get(topic)
        return live is not None and live["topic_id"] != topic_id
    return topic in state.deleted_topics.values()
