"""Kafka's own checkpoint files, derived from the metadata state (docs/protocol.md, §8).

kafkalog never reads these back as truth; they exist so that Kafka's tools and brokers looking at
a log dir see the same high watermarks, log start offsets and leader epochs that readers do.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Iterable, Optional, Tuple

from ..format import checkpoint as ckpt
from ..log.logdir import (LOG_START_CHECKPOINT, RECOVERY_POINT_CHECKPOINT,
                          REPLICATION_CHECKPOINT, LogDir)
from ..log.partition import LEADER_EPOCH_FILE


#: above this many partitions in the cluster, a commit rewrites only the partitions'
#: ``leader-epoch-checkpoint``; the log-dir-wide files (one line per partition of the log dir, so
#: O(cluster) bytes per rewrite) are left to maintenance (cleanup, retention), docs/protocol.md §8
INLINE_CHECKPOINT_MAX_PARTITIONS = 1000


def sync_checkpoints(cluster, state, tps: Iterable[Tuple[str, int]], *,
                     log_dir_files: Optional[bool] = None) -> None:
    """Rewrite the checkpoint files of ``tps``. ``log_dir_files``: also the log-dir-wide
    files; by default only while the cluster is small enough for that to cost little."""
    if log_dir_files is None:
        total = sum(info["partitions"] for info in state.topics.values())
        log_dir_files = total <= INLINE_CHECKPOINT_MAX_PARTITIONS
    by_dir = defaultdict(dict)
    for topic, p in tps:
        ps = state.partition(topic, p)
        if ps is None:
            continue
        for logdir in state.topics[topic]["replicas"][p]:
            by_dir[logdir][(topic, p)] = ps
            entries = ps.leader_epoch_entries()
            path = f"{cluster.partition_dir(topic, p, logdir)}/{LEADER_EPOCH_FILE}"
            cluster.storage.replace(path, ckpt.format_leader_epoch_checkpoint(entries).encode())
    if not log_dir_files:
        return
    for logdir, parts in by_dir.items():
        ld = LogDir(cluster.storage, logdir)
        hw = {tp: ps.high_watermark for tp, ps in parts.items()}
        ld.merge_checkpoint(REPLICATION_CHECKPOINT, hw)
        ld.merge_checkpoint(RECOVERY_POINT_CHECKPOINT, hw)
        ld.merge_checkpoint(LOG_START_CHECKPOINT,
                            {tp: ps.log_start_offset for tp, ps in parts.items()})
