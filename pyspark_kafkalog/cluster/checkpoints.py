"""Kafka's own checkpoint files, derived from the metadata state (docs/protocol.md, §8).

kafkalog never reads these back as truth; they exist so that Kafka's tools and brokers looking at
a log dir see the same high watermarks, log start offsets and leader epochs that readers do.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Dict, Iterable, Mapping, Optional, Sequence, Tuple

from ..format import checkpoint as ckpt
from ..log.logdir import (LOG_START_CHECKPOINT, RECOVERY_POINT_CHECKPOINT,
                          REPLICATION_CHECKPOINT, LogDir)
from ..log.partition import LEADER_EPOCH_FILE
from .isr import leader_of
from .log_dirs import noting_offline
from .partition_state import split_key


#: above this many partitions in the cluster, a commit rewrites no derived file: the log-dir-wide
#: ones hold a line per partition of the log dir (O(cluster) bytes per rewrite), and the
#: partitions' ``leader-epoch-checkpoint`` go with the recovery point they must not lag behind;
#: all are left to maintenance (cleanup, retention), docs/protocol.md §8
INLINE_CHECKPOINT_MAX_PARTITIONS = 1000
#: ... and a commit that made more than this many partitions visible rewrites none either: every
#: Spark job begins an epoch in each partition it writes (§5), so each would be a
#: ``leader-epoch-checkpoint`` replaced, about 0.5 ms apiece (0.5-0.8 s of a 1,000-partition
#: job's commit, docs/spark-write.md), and each replace frees the old file's inode
INLINE_CHECKPOINT_MAX_WRITTEN = 100


Spans = Sequence[Sequence[int]]


def sync_checkpoints(cluster, state, tps: Iterable[Tuple[str, int]], *,
                     log_dir_files: Optional[bool] = None,
                     written: Optional[Mapping[Tuple[str, int], Spans]] = None,
                     recovery_point: bool = True,
                     skip_offline: bool = False) -> Dict[str, str]:
    """Rewrite the checkpoint files of ``tps``. ``log_dir_files``: also the log-dir-wide
    files; by default only while the cluster is small enough for that to cost little.

    ``skip_offline`` (maintenance): a log dir that cannot be reached is left as it is and the
    others are written; returned, each with why (else a storage error is raised, and nothing is
    returned but ``{}``). The files are derived, so the next run writes what it missed.

    ``written``: the ``[start, end)`` ranges a commit just made visible, per partition. A
    partition's ``leader-epoch-checkpoint`` then changed only if one of its epochs begins inside
    them (a new writer's first commit there, §5); otherwise it is left alone. The files that did
    change are replaced together (``Storage.replace_many``): one by one, with two fsyncs each,
    they were most of a 1,000-partition job's commit (docs/spark-write.md).

    A commit (``written`` given) in a cluster of more than ``INLINE_CHECKPOINT_MAX_PARTITIONS``,
    or over more than ``INLINE_CHECKPOINT_MAX_WRITTEN`` partitions, or on a remote store
    (``Storage.remote``: S3, GCS), rewrites nothing. Why the
    epochs may lag with the recovery point: a log dir of ours has no clean-shutdown marker, so
    Kafka loading it recovers every segment from the ``recovery-point-offset-checkpoint`` on
    and assigns the epochs it finds in their batches (LogLoader, ``LogSegment.recover``); an
    epoch that begins past the recovery point is rebuilt. Maintenance writes the epochs before
    the recovery point, so it never passes them. Rewriting them per commit was still most of a
    1,000-partition job's commit (0.3-0.5 s).

    The ``recovery-point-offset-checkpoint`` says what is on the device (Kafka recovers only
    from it on). ``recovery_point``: whether to move it. A commit moves it only when its
    writes were flushed (§3 "Durability"); any other caller flushes each log dir first
    (``Storage.flush``), so the high watermark it writes there is durable; the replicator,
    whose passes come every few hundred ms, leaves it. Kafka moves its recovery point by
    flushing too."""
    if written is not None and cluster.storage.remote:
        return {}   # each file a priced request per commit: maintenance writes them
    if log_dir_files is None:
        total = sum(info["partitions"] for info in state.topics.values())
        log_dir_files = total <= INLINE_CHECKPOINT_MAX_PARTITIONS
        if written is not None and (not log_dir_files
                                    or len(written) > INLINE_CHECKPOINT_MAX_WRITTEN):
            return {}
    by_dir = defaultdict(dict)
    epochs = defaultdict(dict)   # per log dir
    recovery_points: dict = {}   # per log dir, for a commit: what the file says now
    for topic, p in tps:
        ps = state.partition(topic, p)
        if ps is None:
            continue
        # the leader's log dir only: a follower's derived files are the coordinator's, written
        # for what it holds (docs/protocol.md §1.3), and a commit must not say otherwise
        for logdir in [leader_of(ps, state.topics[topic]["replicas"][p])]:
            by_dir[logdir][(topic, p)] = ps
            entries = ps.leader_epoch_entries()
            # a commit that does not move the recovery point need not catch up with it
            if written is not None and not (_epoch_begins_in(entries, written.get((topic, p)))
                                            or recovery_point and _past_recovery_point(
                                                cluster, logdir, topic, p, entries,
                                                recovery_points)):
                continue
            path, data = epoch_file(cluster, state, topic, p, logdir, entries)
            epochs[logdir][path] = data
    offline: Dict[str, str] = {}
    if skip_offline:
        for logdir, files in epochs.items():
            with noting_offline(offline, logdir):
                cluster.storage.replace_many(files)
    else:   # one barrier for them all
        cluster.storage.replace_many({k: v for files in epochs.values() for k, v in files.items()})
    if not log_dir_files:
        return offline
    for logdir, parts in by_dir.items():
        if logdir in offline:
            continue
        with noting_offline(offline if skip_offline else None, logdir):
            write_log_dir_files(cluster, logdir,
                                {tp: ps.high_watermark for tp, ps in parts.items()},
                                {tp: ps.log_start_offset for tp, ps in parts.items()},
                                recovery_point=recovery_point, flush=written is None)
    return offline


def epoch_file(cluster, state, topic: str, p: int, logdir: str, entries) -> Tuple[str, bytes]:
    """A replica's ``leader-epoch-checkpoint``: its path and the bytes that describe
    ``entries`` (the leader's for the offsets that replica holds)."""
    path = f"{cluster.partition_dir(topic, p, logdir, state)}/{LEADER_EPOCH_FILE}"
    return path, ckpt.format_leader_epoch_checkpoint(list(entries)).encode()


def write_log_dir_files(cluster, logdir: str, ends: Mapping[Tuple[str, int], int],
                        starts: Mapping[Tuple[str, int], int], *, recovery_point: bool,
                        flush: bool) -> None:
    """The log-dir-wide files for some of its replicas: ``ends`` as the high watermark (and as
    the recovery point, with ``recovery_point``; after a flush of the log dir, with ``flush``,
    so that the point is on the device), ``starts`` as the log start offsets. The leader's
    (``sync_checkpoints``) and a follower's (the replicator, whose copies are durable when
    copied) are the same files under the same rules."""
    ld = LogDir(cluster.storage, logdir)
    ld.merge_checkpoint(REPLICATION_CHECKPOINT, ends)
    if recovery_point:
        if flush:
            cluster.storage.flush(logdir)
        ld.merge_checkpoint(RECOVERY_POINT_CHECKPOINT, ends)
    ld.merge_checkpoint(LOG_START_CHECKPOINT, starts)


def _past_recovery_point(cluster, logdir: str, topic: str, p: int, entries,
                         recovery_points: dict) -> bool:
    """Whether an epoch begins at or past the partition's recovery point as its log dir's file
    has it. Such an epoch may be missing from ``leader-epoch-checkpoint`` (a commit while the
    cluster had more than INLINE_CHECKPOINT_MAX_PARTITIONS left it to maintenance, §8), and the
    commit is about to move the recovery point past it: the file is rewritten first."""
    if logdir not in recovery_points:
        recovery_points[logdir] = LogDir(cluster.storage, logdir).read_checkpoint(
            RECOVERY_POINT_CHECKPOINT)
    point = recovery_points[logdir].get((topic, p), 0)
    return any(start >= point for _, start in entries)


def _epoch_begins_in(entries, spans: Optional[Spans]) -> bool:
    return any(s[0] <= start < s[1] for s in spans or () for _, start in entries)


def written_ranges(pending) -> dict:
    """``{(topic, p): [[start, end], ...]}`` of pending writes (``PendingWrite.ranges``)."""
    out: dict = defaultdict(list)
    for pw in pending:
        for key, r in pw.ranges.items():
            out[split_key(key)].append(r[:2])
    return dict(out)
