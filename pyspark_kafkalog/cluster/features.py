"""Protocol features (docs/protocol.md §2.3), as Delta's reader and writer features.

A cluster lists the features it uses in its metadata log (``protocol`` actions, only ever
added, each an explicit operator step: ``kafkalog --cluster URL features --enable NAME``). A
*reader feature* changes what a reader computes from the log: a client that does not know one
refuses to read. A *writer feature* changes only what writers must do: a client that does not
know one still reads, but refuses to write anything (entries, segments, snapshots, checkpoints).
Either way it refuses with UNSUPPORTED_VERSION naming the feature, before it changes anything.

This client knows the features in ``READER_FEATURES`` and ``WRITER_FEATURES``; a new action or a
new field of an action ships together with the feature that gates it.
"""
from __future__ import annotations

from typing import Dict, Iterable, List

from ..errors import UnsupportedVersionError

#: a streaming micro-batch commits once per sink and batch (``stream_commit``, §3.2)
STREAMING_SINK = "streamingSink"
#: the coordinator's lease and the fencing of coordinator actions by its epoch (§11)
COORDINATOR_LEASE = "coordinatorLease"
#: log dirs at other URLs than the root, registered in the metadata log (§1.1)
LOG_DIR_REGISTRY = "logDirRegistry"
#: a registered log dir that holds no replica removed again (``remove_log_dir``, §1.1)
LOG_DIR_REMOVAL = "logDirRemoval"
#: followers copied to, the ISR and the stored high watermark (§1.3)
REPLICATION = "replication"
#: byte-rate quotas per client id (§12)
CLIENT_QUOTAS = "clientQuotas"
#: the topic configs flush.messages and flush.ms (§3, "Durability")
FLUSH_CONFIGS = "flushConfigs"
#: merge_segments actions and the topic config segment.merge.lag.ms (§4.1)
SEGMENT_MERGE = "segmentMerge"
#: clean_segments actions, the cleaner checkpoints and the compaction topic configs (§4.2)
LOG_COMPACTION = "logCompaction"
#: replica_lost actions: what a follower's files do not hold leaves held[r] and the ISR (§1.3)
REPLICA_CHECK = "replicaCheck"

#: name -> what it means; the features this client implements
READER_FEATURES: Dict[str, str] = {
    STREAMING_SINK: "stream_commit actions: a streaming sink's micro-batch commits at most once "
                    "per (sink, batch), so a batch replayed after a crash is not written twice",
    COORDINATOR_LEASE: "coordinator_lease actions: at most one coordinator acts at a time, and "
                       "actions carrying an older coordinator_epoch are fenced",
    LOG_DIR_REGISTRY: "add_log_dir actions: log dirs at other URLs than the cluster's root "
                      "(another bucket, another disk), where replicas are placed and read",
    LOG_DIR_REMOVAL: "remove_log_dir actions: a registered log dir that holds no replica is "
                     "removed; its name is never given again, and no replica may name it",
    REPLICATION: "replica_progress and alter_isr actions: followers hold copies, the ISR, and a "
                 "high watermark that waits for the ISR (visible = held by every ISR member)",
    CLIENT_QUOTAS: "client_quota actions: produce and fetch byte rates per client id (KIP-13), "
                   "enforced by the coordinator",
    FLUSH_CONFIGS: "the topic configs flush.messages and flush.ms: which writes are made durable "
                   "before their commit, and the coordinator's scheduled flush",
    SEGMENT_MERGE: "merge_segments actions and the topic config segment.merge.lag.ms: runs of "
                   "adjacent committed segments merged into one that replaces the first's files "
                   "and covers the others until they are deleted; readers step over them",
    LOG_COMPACTION: "clean_segments actions and the topic configs min.cleanable.dirty.ratio, "
                    "min.compaction.lag.ms, max.compaction.lag.ms and delete.retention.ms: "
                    "compacted partitions' segments replaced by cleaned ones, and readers that "
                    "go on in a segment replaced under them",
    REPLICA_CHECK: "replica_lost actions: ranges a follower was recorded to hold but whose files "
                   "are gone, cut short or damaged leave what it holds, and it leaves the ISR",
}
#: the topic configs a cluster stores only once a feature is on: an older client would fail to
#: parse the topic's configs, or ignore what they ask of it (§2.3)
CONFIG_FEATURES: Dict[str, str] = {"flush.messages": FLUSH_CONFIGS, "flush.ms": FLUSH_CONFIGS,
                                   "segment.merge.lag.ms": SEGMENT_MERGE,
                                   "min.cleanable.dirty.ratio": LOG_COMPACTION,
                                   "min.compaction.lag.ms": LOG_COMPACTION,
                                   "max.compaction.lag.ms": LOG_COMPACTION,
                                   "delete.retention.ms": LOG_COMPACTION}
WRITER_FEATURES: Dict[str, str] = {}


def known(kind: str) -> Dict[str, str]:
    return READER_FEATURES if kind == "reader" else WRITER_FEATURES


def unknown_features(features: Iterable[str], kind: str) -> List[str]:
    """A writer must know every feature in the cluster's writer list, which also holds its
    reader features (they bind writers too)."""
    table = known(kind)
    return sorted(f for f in features if f not in table
                  and not (kind == "writer" and f in READER_FEATURES))


def check_readable(reader_features: Iterable[str], where: str) -> None:
    missing = unknown_features(reader_features, "reader")
    if missing:
        raise UnsupportedVersionError(
            f"{where}: the cluster uses reader feature(s) {', '.join(missing)}, which this "
            "client does not support; it cannot read this cluster (upgrade pyspark-kafkalog)")


def check_writable(writer_features: Iterable[str], what: str = "write") -> None:
    missing = unknown_features(writer_features, "writer")
    if missing:
        raise UnsupportedVersionError(
            f"cannot {what}: the cluster uses writer feature(s) {', '.join(missing)}, which "
            "this client does not support; it may read but not write (upgrade "
            "pyspark-kafkalog)")
