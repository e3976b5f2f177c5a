"""The replayed cluster state: a pure, deterministic function of the metadata log.

Every action is validated against the state at its point in the log; invalid actions are no-ops
with an error result, so two processes that read the same entries always agree, and a writer
learns the fate of its own actions by replaying to its own entry (docs/protocol.md, §2-§6).
Only the entry's own timestamp is used as "now", never the replaying process's clock.

Cost follows the change, not the cluster: :meth:`ClusterState.copy` shares every partition,
topic and transaction with the original and copies only the dicts that index them; a handler
takes a private copy of what it changes (``_partition_w``, ``_topic_w``, ...). The state also
records which snapshot parts changed since its base (``dirty``), so a snapshot rewrites only
those (``snapshots.py``).
"""
from __future__ import annotations

from typing import Dict, List, Optional, Set

from ..errors import (CorruptRecordError, InvalidConfigError, InvalidTopicError,
                      UnsupportedVersionError)
from ..format.checkpoint import colliding_topics, validate_topic_name
from ..log.config import LogConfig
from . import actions as A
from . import isr as R
from .lease_replay import LeaseReplay
from .log_dir_replay import LogDirReplay
from .merge_replay import MergeReplay
from .replication_replay import ReplicationReplay
from . import quotas as Q
from .features import (CLIENT_QUOTAS, CONFIG_FEATURES, REPLICATION, SEGMENT_MERGE,
                       STREAMING_SINK, check_readable, unknown_features)
from .cow_map import CowMap
from .partition_state import PartitionState, split_key, tp_key
from .snapshot_shape import check_snapshot

__all__ = ["ClusterState", "PartitionState", "tp_key", "split_key", "OK", "chunk_of",
           "PARTITIONS_PER_PART"]

MAX_DECIDED_TXNS = 10_000
MAX_DELETED_TOPICS = 100_000
MAX_KEPT_RESULTS = 256
SNAPSHOT_VERSION = 2
PARTITIONS_PER_PART = 1024

OK = A.OK


def chunk_of(partition: int) -> int:
    return partition // PARTITIONS_PER_PART


class ClusterState(ReplicationReplay, MergeReplay, LogDirReplay, LeaseReplay):
    def __init__(self):
        self.seq = -1
        self.timestamp = -1
        self.topics: Dict[str, dict] = {}
        self.partitions: CowMap[PartitionState] = CowMap()
        self.txns: Dict[str, dict] = {}            # open txns only
        self.decided: Dict[str, str] = {}          # txn -> "committed" | "aborted" (bounded)
        self.acls: List[dict] = []
        self.deleted_topics: Dict[str, str] = {}   # topic id -> name (bounded)
        self.sinks: Dict[str, int] = {}            # streaming sink -> last committed batch
        #: the coordinator's lease (§11): epoch, holder, address, lease_ms, renewed_ms; None
        #: before the first acquire. Never changed in place (a change replaces it whole).
        self.coordinator: Optional[dict] = None
        #: log dirs registered at URLs of their own (§1.1): name -> url, directory_id,
        #: storage_options, added. Never changed in place (a change replaces the dict).
        self.log_dirs: Dict[str, dict] = {}
        #: client quotas (§12): entity -> {config: value}. Never changed in place.
        self.client_quotas: Dict[str, Dict[str, str]] = {}
        #: per partition key, the seq of its last applied merge_segments (§4.1): what the
        #: next merge of that partition must have planned on. Never changed in place.
        self.segment_merges: Dict[str, int] = {}
        #: per partition key, its cleaner checkpoint (§4.2: the first dirty offset of its next
        #: clean). Never changed in place.
        self.cleaner_checkpoints: Dict[str, int] = {}
        self.reader_features: List[str] = []
        self.writer_features: List[str] = []
        self.results: Dict[int, List[A.Result]] = {}   # seq -> per-action results (in memory)
        # snapshot parts of the base this state was loaded from, and what changed since
        self.parts: Dict[str, str] = {}            # part id -> content hash
        self.dirty: Optional[Set[str]] = None      # None: everything (no base to reuse)
        #: partition changes replayed since the base snapshot (or entry 0): what opening the
        #: cluster from that snapshot costs, about 10 us each (``MetadataLog._maybe_snapshot``)
        self.replay_changes = 0
        #: partition keys changed while this is a set (``MetadataLog.poll`` turns it on), so
        #: an incremental fetch learns what changed at the cost of the change
        self.touched: Optional[Set[str]] = None
        # copy-on-write bookkeeping: what this state may change in place (None: everything)
        self._own_partitions: Optional[Set[str]] = None
        self._own_topics: Optional[Set[str]] = None
        self._own_txns: Optional[Set[str]] = None
        self._own_decided = self._own_acls = self._own_deleted = self._own_sinks = True

    # -- copy-on-write ------------------------------------------------------------------------

    def copy(self) -> "ClusterState":
        """A state that can replay further without changing this one: partitions, topics and
        transactions are shared until one of the two changes them. The partition index is a
        copy-on-write map (O(recent changes)); topics and open transactions are plain dicts,
        small next to it."""
        c = ClusterState.__new__(ClusterState)
        c.seq, c.timestamp = self.seq, self.timestamp
        c.topics, c.partitions, c.txns = dict(self.topics), self.partitions.copy(), dict(self.txns)
        c.decided, c.acls, c.deleted_topics = self.decided, self.acls, self.deleted_topics
        c.sinks, c.coordinator, c.log_dirs = self.sinks, self.coordinator, self.log_dirs
        c.client_quotas, c.segment_merges = self.client_quotas, self.segment_merges
        c.cleaner_checkpoints = self.cleaner_checkpoints
        c.touched = None
        c.reader_features, c.writer_features = list(self.reader_features), list(self.writer_features)
        c.results = dict(self.results)
        c.parts = self.parts
        c.dirty = None if self.dirty is None else set(self.dirty)
        c.replay_changes = self.replay_changes
        c._own_partitions, c._own_topics, c._own_txns = set(), set(), set()
        c._own_decided = c._own_acls = c._own_deleted = c._own_sinks = False
        # the original must not change what it now shares either
        self._own_partitions, self._own_topics, self._own_txns = set(), set(), set()
        self._own_decided = self._own_acls = self._own_deleted = self._own_sinks = False
        return c

    def _mark(self, part: str) -> None:
        if self.dirty is not None:
            self.dirty.add(part)

    def _touch(self, key: str) -> None:
        if self.touched is not None:
            self.touched.add(key)

    def _partition_w(self, key: str) -> PartitionState:
        self._touch(key)
        self.replay_changes += 1
        if self._own_partitions is not None and key not in self._own_partitions:
            self.partitions[key] = self.partitions[key].clone()
            self._own_partitions.add(key)
        topic, p = split_key(key)
        self._mark(f"p/{topic}/{chunk_of(p)}")
        return self.partitions[key]

    def _new_partition(self, key: str) -> None:
        self._touch(key)
        self.partitions[key] = PartitionState()
        if self._own_partitions is not None:
            self._own_partitions.add(key)
        topic, p = split_key(key)
        self._mark(f"p/{topic}/{chunk_of(p)}")

    def _topic_w(self, topic: str) -> dict:
        if self._own_topics is not None and topic not in self._own_topics:
            info = self.topics[topic]
            self.topics[topic] = dict(info, configs=dict(info["configs"]),
                                      replicas=list(info["replicas"]))
            self._own_topics.add(topic)
        self._mark(f"t/{topic}")
        return self.topics[topic]

    def _txn_w(self, txn: str) -> dict:
        if self._own_txns is not None and txn not in self._own_txns:
            info = self.txns[txn]
            self.txns[txn] = dict(info, ranges=dict(info["ranges"]))
            self._own_txns.add(txn)
        return self.txns[txn]

    def _decided_w(self) -> Dict[str, str]:
        if not self._own_decided:
            self.decided, self._own_decided = dict(self.decided), True
        return self.decided

    def _acls_w(self) -> List[dict]:
        if not self._own_acls:
            self.acls, self._own_acls = [dict(a) for a in self.acls], True
        return self.acls

    def _sinks_w(self) -> Dict[str, int]:
        if not self._own_sinks:
            self.sinks, self._own_sinks = dict(self.sinks), True
        return self.sinks

    def _deleted_w(self) -> Dict[str, str]:
        if not self._own_deleted:
            self.deleted_topics, self._own_deleted = dict(self.deleted_topics), True
        return self.deleted_topics

    # -- persistence --------------------------------------------------------------------------

    def to_snapshot(self) -> dict:
        """The whole state as one JSON object (a flat snapshot; also how jobs ship a state to
        Spark executors)."""
        return {"version": SNAPSHOT_VERSION, "seq": self.seq, "timestamp": self.timestamp,
                "topics": self.topics,
                "partitions": {k: p.to_json() for k, p in self.partitions.items()},
                "txns": self.txns, "decided": self.decided, "acls": self.acls,
                "deleted_topics": self.deleted_topics, "sinks": self.sinks,
                "log_dirs": self.log_dirs,
                "reader_features": self.reader_features,
                "writer_features": self.writer_features,
                **({} if self.coordinator is None else {"coordinator": self.coordinator}),
                **({"client_quotas": self.client_quotas} if self.client_quotas else {}),
                **({"segment_merges": self.segment_merges} if self.segment_merges else {}),
                **({"cleaner_checkpoints": self.cleaner_checkpoints}
                   if self.cleaner_checkpoints else {})}

    @classmethod
    def from_snapshot(cls, d, *, partitions: Optional[Dict[str, PartitionState]] = None
                      ) -> "ClusterState":
        """The state a flat snapshot holds, after checking its whole shape: a snapshot is
        derived data, so one that does not hold together raises CorruptRecordError and the
        caller falls back to an older one (or to entry 0) instead of acting on it. A snapshot
        that needs a reader feature this client lacks raises UnsupportedVersionError."""
        check_snapshot(d, partitions is not None)
        s = cls()
        s.seq, s.timestamp = d["seq"], d["timestamp"]
        s.reader_features = list(d.get("reader_features") or [])
        s.writer_features = list(d.get("writer_features") or [])
        check_readable(s.reader_features, f"snapshot at {s.seq}")
        s.topics = {t: dict(info, configs=dict(info["configs"]), replicas=list(info["replicas"]))
                    for t, info in d["topics"].items()}
        s.partitions = CowMap(partitions if partitions is not None else {
            k: PartitionState.from_json(v) for k, v in d["partitions"].items()})
        s.txns = {t: dict(info, ranges={k: list(r) for k, r in info["ranges"].items()})
                  for t, info in d["txns"].items()}
        s.decided, s.acls = dict(d["decided"]), [dict(a) for a in d["acls"]]
        s.deleted_topics = dict(d.get("deleted_topics") or {})
        s.sinks = dict(d.get("sinks") or {})
        s.coordinator = dict(d["coordinator"]) if d.get("coordinator") else None
        s.log_dirs = {name: dict(info, storage_options=dict(info.get("storage_options") or {}))
                      for name, info in (d.get("log_dirs") or {}).items()}
        s.client_quotas = {e: dict(v) for e, v in (d.get("client_quotas") or {}).items()}
        s.segment_merges = dict(d.get("segment_merges") or {})
        s.cleaner_checkpoints = dict(d.get("cleaner_checkpoints") or {})
        return s

    # -- queries ------------------------------------------------------------------------------

    def partition(self, topic: str, partition: int) -> Optional[PartitionState]:
        return self.partitions.get(tp_key(topic, partition))

    def topic_config(self, topic: str) -> LogConfig:
        return LogConfig.from_properties(self.topics[topic]["configs"])

    def authorized(self, principal: Optional[str], topic: str, operation: str) -> bool:
        """DENY wins; with no ACL naming this topic (or ``*``) everything is allowed."""
        relevant = [a for a in self.acls if a["topic"] in (topic, "*")]
        if not relevant:
            return True
        matches = [a for a in relevant if a["principal"] in (principal, "*")
                   and a["operation"] in (operation, "ALL")]
        if any(a["permission"] == "DENY" for a in matches):
            return False
        return any(a["permission"] == "ALLOW" for a in matches)

    def unwritable_features(self) -> List[str]:
        """Writer features the cluster uses that this client does not know: it must not write."""
        return unknown_features(self.writer_features, "writer")

    # -- replay -------------------------------------------------------------------------------

    def apply(self, seq: int, entry) -> None:
        """Replay one entry (docs/protocol.md §2). An entry that is not an entry at all stops
        the replay with CorruptRecordError naming it, one of an unknown version or holding an
        action (or field) this client does not know with UnsupportedVersionError: guessing
        would let this process compute another state than its peers. A known action whose
        fields do not have their types is rejected whole before anything changes."""
        if seq != self.seq + 1:
            raise ValueError(f"entry {seq} applied to state at {self.seq}")
        where = f"metadata entry {seq:020d}.json"
        problem = A.check_entry(entry)
        if problem is not None:
            error = UnsupportedVersionError if problem.startswith("version") else CorruptRecordError
            raise error(f"{where}: {problem}; replay stops here (see `kafkalog --cluster URL "
                        "metadata --verify`)")
        parsed = []
        declared = set()      # writer features this entry turns on before a later action
        for i, raw in enumerate(entry["actions"]):
            try:
                parsed.append(A.parse_action(raw))
                if isinstance(parsed[-1], A.EnableFeatures):
                    declared.update(parsed[-1].writer_features)
            except A.UnknownActionError as exc:
                if self._writer_only(raw, declared):
                    parsed.append(None)   # a writer-only feature's action: readers skip it
                    continue
                raise UnsupportedVersionError(
                    f"{where}, action {i}: {exc}; this client is too old for this cluster "
                    "(upgrade pyspark-kafkalog)") from None
            except A.ActionFieldError as exc:
                parsed.append(A.error("INVALID_REQUEST",
                                      f"malformed {raw.get('op') if isinstance(raw, dict) else ''}"
                                      f" action: {exc}"))
        ts = entry["timestamp"]
        results: List[A.Result] = []
        for action in parsed:
            if action is None:
                results.append(A.error("UNSUPPORTED_VERSION", "skipped: a writer feature's "
                                       "action this client does not know"))
            elif isinstance(action, A.Result):
                results.append(action)
            else:
                results.append(self._fenced(action) or HANDLERS[type(action)](self, action, ts))
        self.seq, self.timestamp = seq, max(self.timestamp, ts)
        self.results[seq] = results
        if len(self.results) > MAX_KEPT_RESULTS:
            for old in sorted(self.results)[:-MAX_KEPT_RESULTS]:
                del self.results[old]

    def _writer_only(self, raw, declared=()) -> bool:
        feature = raw.get("feature") if isinstance(raw, dict) else None
        return (isinstance(feature, str)
                and (feature in self.writer_features or feature in declared)
                and feature not in self.reader_features)

    def _create_topic(self, a: A.CreateTopic, ts: int) -> A.Result:
        topic = a.topic
        try:
            validate_topic_name(topic)
        except InvalidTopicError as exc:
            return A.error("INVALID_TOPIC_EXCEPTION", str(exc))
        if topic in self.topics:
            return A.error("TOPIC_ALREADY_EXISTS", f"topic {topic!r} already exists")
        collides = colliding_topics(topic, self.topics)
        if collides:
            return A.error("INVALID_TOPIC_EXCEPTION", f"topic {topic!r} collides with existing "
                           f"topic {', '.join(map(repr, collides))}: '.' and '_' give the same "
                           "metric names (Kafka's Topic.hasCollision)")
        n = a.partitions
        if n < 1:
            return A.error("INVALID_PARTITIONS", "a topic needs at least one partition")
        if len(a.replicas) != n or any(not r for r in a.replicas):
            return A.error("INVALID_REPLICA_ASSIGNMENT",
                           "one non-empty replica list per partition")
        if self._duplicate_replicas(a.replicas):
            return A.error("INVALID_REPLICA_ASSIGNMENT", self._duplicate_replicas(a.replicas))
        if self._removed_log_dir(a.replicas):
            return A.error("INVALID_REPLICA_ASSIGNMENT", self._removed_log_dir(a.replicas))
        try:
            LogConfig.from_properties(a.configs)
        except InvalidConfigError as exc:
            return A.error("INVALID_CONFIG", str(exc))
        refused = self._ungated_configs(a.configs)
        if refused is not None:
            return refused
        self.topics[topic] = {"topic_id": a.topic_id, "partitions": n,
                              "replicas": [list(r) for r in a.replicas],
                              "configs": dict(a.configs), "created": ts}
        if self._own_topics is not None:
            self._own_topics.add(topic)
        self._mark(f"t/{topic}")
        for p in range(n):
            self._new_partition(tp_key(topic, p))
            self._start_replication(topic, p)
        return A.Result()

    def _delete_topic(self, a: A.DeleteTopic, ts: int) -> A.Result:
        topic = a.topic
        if topic not in self.topics:
            return A.error("UNKNOWN_TOPIC_OR_PARTITION", f"topic {topic!r} does not exist")
        info = self.topics.pop(topic)
        self._mark(f"t/{topic}")
        deleted = self._deleted_w()
        deleted[info["topic_id"]] = topic
        if len(deleted) > MAX_DELETED_TOPICS:
            for old in list(deleted)[:len(deleted) - MAX_DELETED_TOPICS]:
                del deleted[old]
        for p in range(info["partitions"]):
            self.partitions.pop(tp_key(topic, p), None)
            self._touch(tp_key(topic, p))
            self._mark(f"p/{topic}/{chunk_of(p)}")
        for txn in [t for t, i in self.txns.items()
                    if any(split_key(k)[0] == topic for k in i["ranges"])]:
            ranges = self._txn_w(txn)["ranges"]
            for key in [k for k in ranges if split_key(k)[0] == topic]:
                del ranges[key]
            if not ranges:
                del self.txns[txn]
                self._decide(txn, "aborted")
        return A.DeleteTopicResult(topic_id=info["topic_id"])

    def _ungated_configs(self, configs) -> Optional[A.Result]:
        """Configs such as flush.messages and segment.merge.lag.ms change what writers or
        maintenance do: stored only behind their feature (``CONFIG_FEATURES``), so that an
        older client refuses the cluster instead of failing to parse the topic's configs or
        acting without what they ask for."""
        named = sorted(k for k in configs if k in CONFIG_FEATURES
                       and CONFIG_FEATURES[k] not in self.reader_features)
        if named:
            needed = sorted({CONFIG_FEATURES[k] for k in named})
            return A.error("INVALID_REQUEST", f"{', '.join(named)} need(s) the feature "
                           f"{', '.join(needed)}, which this cluster has not enabled")
        return None

    def _alter_configs(self, a: A.AlterConfigs, ts: int) -> A.Result:
        topic = a.topic
        if topic not in self.topics:
            return A.error("UNKNOWN_TOPIC_OR_PARTITION", f"topic {topic!r} does not exist")
        configs = dict(self.topics[topic]["configs"])
        configs.update(a.set)
        for key in a.delete:
            configs.pop(key, None)
        try:
            LogConfig.from_properties(configs)
        except InvalidConfigError as exc:
            return A.error("INVALID_CONFIG", str(exc))
        refused = self._ungated_configs(a.set)
        if refused is not None:
            return refused
        self._topic_w(topic)["configs"] = configs
        for p in range(self.topics[topic]["partitions"]):
            key = tp_key(topic, p)
            if self.partitions[key].replication is not None:   # min.insync.replicas may change
                self._partition_w(key)
                self._refresh_hw(key)
        return A.Result()

    def _create_partitions(self, a: A.CreatePartitions, ts: int) -> A.Result:
        topic = a.topic
        if topic not in self.topics:
            return A.error("UNKNOWN_TOPIC_OR_PARTITION", f"topic {topic!r} does not exist")
        current = self.topics[topic]["partitions"]
        if a.total <= current:
            return A.error("INVALID_PARTITIONS", f"topic {topic!r} already has {current} "
                           "partitions; the new count must be larger")
        if len(a.replicas) != a.total - current or any(not r for r in a.replicas):
            return A.error("INVALID_REPLICA_ASSIGNMENT",
                           "one non-empty replica list per new partition")
        if self._duplicate_replicas(a.replicas):
            return A.error("INVALID_REPLICA_ASSIGNMENT", self._duplicate_replicas(a.replicas))
        if self._removed_log_dir(a.replicas):
            return A.error("INVALID_REPLICA_ASSIGNMENT", self._removed_log_dir(a.replicas))
        info = self._topic_w(topic)
        for p in range(current, a.total):
            self._new_partition(tp_key(topic, p))
        info["replicas"] = info["replicas"] + [list(r) for r in a.replicas]
        info["partitions"] = a.total
        for p in range(current, a.total):
            self._start_replication(topic, p)
        return A.Result()

    def _reserve(self, a: A.Reserve, ts: int) -> A.Result:
        txn, producer = a.txn, a.producer
        if txn in self.txns or txn in self.decided:
            return A.error("INVALID_TXN_STATE", f"transaction {txn} already exists")
        if not a.partitions:
            return A.error("INVALID_REQUEST", "a reservation needs at least one partition")
        if a.timeout_ms < 0:
            return A.error("INVALID_REQUEST", f"timeout_ms {a.timeout_ms} is negative")
        for key, count in a.partitions.items():
            topic, _ = split_key(key)
            if key not in self.partitions:
                return A.error("UNKNOWN_TOPIC_OR_PARTITION", f"no partition {key}")
            if not self.authorized(a.principal, topic, "WRITE"):
                return A.error("TOPIC_AUTHORIZATION_FAILED",
                               f"{a.principal} may not write to {topic!r}")
            if count < 1:
                return A.error("INVALID_REQUEST", f"reservation of {count} offsets in {key}")
        if a.acks != "1":
            if REPLICATION not in self.reader_features or a.acks != "all":
                return A.error("INVALID_REQUEST", f"acks {a.acks!r:.20} needs the feature "
                               f"{REPLICATION} and is \"all\" or \"1\"")
            for key in a.partitions:
                bad = self._acks_all_problem(key, 0, 0, appended=False)
                if bad:
                    return A.error(bad[0], f"{key}: {bad[1]}")
        ranges = {}
        for key, count in a.partitions.items():
            p = self._partition_w(key)
            if p.last_producer != producer:
                p.leader_epoch += 1
                p.last_producer = producer
            r = [p.next_offset, p.next_offset + count, p.leader_epoch]
            p.next_offset = r[1]
            p.open[txn] = r
            ranges[key] = r
        # seq and timeout_ms let others judge expiry by the storage's clock (the entry's
        # server-side time), not by the writer's own, which may be wrong either way
        self.txns[txn] = {"deadline": ts + a.timeout_ms, "producer": producer,
                          "ranges": ranges, "seq": self.seq + 1, "timeout_ms": a.timeout_ms}
        if a.acks == "all":
            self.txns[txn]["acks"] = "all"
        if self._own_txns is not None:
            self._own_txns.add(txn)
        return A.ReserveResult(ranges={k: list(r) for k, r in ranges.items()})

    def _commit(self, a: A.Commit, ts: int) -> A.Result:
        """All listed txns commit together or none does (one unit, e.g. a Spark job)."""
        for txn in a.txns:
            if txn in self.txns:
                if ts > self.txns[txn]["deadline"]:
                    return A.error("FENCED_LEADER_EPOCH",
                                   f"transaction {txn} passed its deadline before this commit")
                continue
            outcome = self.decided.get(txn)
            if outcome == "aborted":
                return A.error("FENCED_LEADER_EPOCH", f"transaction {txn} was aborted")
            if outcome is None:
                return A.error("INVALID_TXN_STATE", f"unknown transaction {txn}")
        for txn in a.txns:
            info = self.txns.get(txn)
            if info is not None and info.get("acks") == "all":
                for key, (start, end, _epoch) in info["ranges"].items():
                    bad = self._acks_all_problem(key, start, end, appended=True)
                    if bad:
                        return A.error(bad[0], f"transaction {txn}, {key}: {bad[1]}")
        for txn in a.txns:
            info = self.txns.pop(txn, None)
            if info is None:
                continue   # already committed: commits are idempotent
            for key, (start, end, epoch) in info["ranges"].items():
                if key in self.partitions:
                    p = self._partition_w(key)
                    p.open.pop(txn, None)
                    p.add_committed(start, end, epoch)
                    self._refresh_hw(key)
                    if info.get("acks") == "all":
                        R.add_acked(p, start, end)
            self._decide(txn, "committed")
        return A.Result()

    def _stream_commit(self, a: A.StreamCommit, ts: int) -> A.Result:
        """A streaming micro-batch commits at most once per sink (§3.2): a batch at or below the
        sink's last committed one is a replay after a crash, and nothing of it commits."""
        if STREAMING_SINK not in self.reader_features:
            return A.error("INVALID_REQUEST", f"stream_commit needs the feature {STREAMING_SINK}, "
                           "which this cluster has not enabled")
        last = self.sinks.get(a.sink)
        if last is not None and a.batch <= last:
            return A.error("DUPLICATE_SEQUENCE_NUMBER",
                           f"sink {a.sink} committed batch {last} already; batch {a.batch} is a "
                           "replay")
        result = self._commit(A.Commit(txns=a.txns), ts)
        if result.ok:
            self._sinks_w()[a.sink] = a.batch
        return result

    def _abort(self, a: A.Abort, ts: int) -> A.Result:
        aborted, skipped = [], {}
        for txn in a.txns:
            info = self.txns.pop(txn, None)
            if info is None:
                skipped[txn] = self.decided.get(txn, "unknown")
                continue
            for key, (start, end, _epoch) in info["ranges"].items():
                if key in self.partitions:
                    p = self._partition_w(key)
                    p.open.pop(txn, None)
                    p.add_aborted(start, end)
                    self._refresh_hw(key)
            self._decide(txn, "aborted")
            aborted.append(txn)
        return A.AbortResult(aborted=aborted, skipped=skipped)

    def _set_log_start(self, a: A.SetLogStart, ts: int) -> A.Result:
        """KIP-107: per partition a new low watermark or an error; valid ones all apply."""
        out: Dict[str, A.LogStartResult] = {}
        principal = a.principal
        for key, offset in a.partitions.items():
            topic, _ = split_key(key)
            p = self.partitions.get(key)
            if p is None:
                out[key] = A.LogStartResult("UNKNOWN_TOPIC_OR_PARTITION", f"no partition {key}")
                continue
            expected_id = (a.topic_ids or {}).get(topic)
            if expected_id is not None and self.topics[topic]["topic_id"] != expected_id:
                out[key] = A.LogStartResult("UNKNOWN_TOPIC_OR_PARTITION",
                                            f"topic {topic!r} was recreated (topic id changed)")
                continue
            if principal is not None and not self.authorized(principal, topic, "DELETE"):
                out[key] = A.LogStartResult("TOPIC_AUTHORIZATION_FAILED",
                                            f"{principal} may not delete records of {topic!r}")
                continue
            hw = p.high_watermark
            if offset == -1:
                offset = hw
            if offset < 0 or offset > hw:
                out[key] = A.LogStartResult(
                    "OFFSET_OUT_OF_RANGE",
                    f"offset {offset} is not between 0 and the high watermark {hw}")
                continue
            if offset > p.log_start_offset:
                p = self._partition_w(key)
                p.log_start_offset = offset
                p.committed = p.committed_from(offset, SEGMENT_MERGE in self.reader_features)
                p.aborted = [[max(r[0], offset), r[1]] for r in p.aborted if r[1] > offset]
                R.clip_held(p)
                self._refresh_hw(key)   # §1.3: end(r) counts from the log start offset
            out[key] = A.LogStartResult(low_watermark=p.log_start_offset)
        return A.SetLogStartResult(partitions=out)

    def _client_quota(self, a: A.ClientQuotaChange, ts: int) -> A.Result:
        """A client id's (or the default entity's) byte rates (§12)."""
        if CLIENT_QUOTAS not in self.reader_features:
            return A.error("INVALID_REQUEST", f"client_quota needs the feature {CLIENT_QUOTAS}")
        bad = Q.check_entity(a.entity)
        if bad:
            return A.error("INVALID_REQUEST", f"entity {a.entity!r:.60}: {bad}")
        unknown = [k for k in list(a.set) + list(a.delete) if k not in Q.QUOTA_CONFIGS]
        if unknown:
            return A.error("INVALID_REQUEST", f"unknown quota config {unknown[0]!r:.60}; known: "
                           f"{', '.join(Q.QUOTA_CONFIGS)}")
        try:
            for k, v in a.set.items():
                Q.parse_rate(k, v)
        except ValueError as exc:
            return A.error("INVALID_CONFIG", str(exc))
        values = dict(self.client_quotas.get(a.entity, {}))
        values.update(a.set)
        for k in a.delete:
            values.pop(k, None)
        quotas = dict(self.client_quotas)
        if values:
            quotas[a.entity] = values
        else:
            quotas.pop(a.entity, None)
        self.client_quotas = quotas
        return A.Result()

    def _acl(self, a: A.AclChange, ts: int) -> A.Result:
        add = [{k: acl[k] for k in ("principal", "topic", "operation", "permission")}
               for acl in a.add]
        bad = [e for e in add if e["permission"] not in ("ALLOW", "DENY")]
        if bad:
            return A.error("INVALID_REQUEST", f"permission must be ALLOW or DENY: {bad[0]}")
        acls = self._acls_w()
        for entry in add:
            if entry not in acls:
                acls.append(entry)
        for acl in a.remove:
            entry = {k: acl[k] for k in ("principal", "topic", "operation", "permission")}
            if entry in acls:
                acls.remove(entry)
        return A.Result()

    def _protocol(self, a: A.EnableFeatures, ts: int) -> A.Result:
        """Features are only ever added. A reader feature this client does not know stops the
        replay (it cannot compute the state); an unknown writer feature is recorded, and this
        client then refuses to write (``unwritable_features``)."""
        check_readable(a.reader_features, f"metadata entry {self.seq + 1:020d}.json")
        for f in a.reader_features:
            if f not in self.reader_features:
                self.reader_features.append(f)
            if f not in self.writer_features:      # a reader feature binds writers too
                self.writer_features.append(f)
        for f in a.writer_features:
            if f not in self.writer_features:
                self.writer_features.append(f)
        if REPLICATION in a.reader_features:
            for topic, info in self.topics.items():
                for p in range(info["partitions"]):
                    self._start_replication(topic, p)
        return A.Result()

    def _decide(self, txn: str, outcome: str) -> None:
        decided = self._decided_w()
        decided[txn] = outcome
        if len(decided) > MAX_DECIDED_TXNS:
            for old in list(decided)[:len(decided) - MAX_DECIDED_TXNS]:
                del decided[old]


HANDLERS = {
    A.CreateTopic: ClusterState._create_topic,
    A.DeleteTopic: ClusterState._delete_topic,
    A.AlterConfigs: ClusterState._alter_configs,
    A.CreatePartitions: ClusterState._create_partitions,
    A.Reserve: ClusterState._reserve,
    A.Commit: ClusterState._commit,
    A.StreamCommit: ClusterState._stream_commit,
    A.CoordinatorLeaseChange: ClusterState._coordinator_lease,
    A.AddLogDir: ClusterState._add_log_dir,
    A.RemoveLogDir: ClusterState._remove_log_dir,
    A.Abort: ClusterState._abort,
    A.SetLogStart: ClusterState._set_log_start,
    A.AclChange: ClusterState._acl,
    A.EnableFeatures: ClusterState._protocol,
    A.ReplicaProgress: ClusterState._replica_progress,
    A.ReplicaLost: ClusterState._replica_lost,
    A.AlterIsr: ClusterState._alter_isr,
    A.ElectLeader: ClusterState._elect_leader,
    A.ReassignPartitions: ClusterState._reassign_partitions,
    A.CompleteReassignment: ClusterState._complete_reassignment,
    A.ClientQuotaChange: ClusterState._client_quota,
    A.MergeSegments: ClusterState._merge_segments,
    A.CleanSegments: ClusterState._clean_segments,
}
assert set(HANDLERS) == set(A.ACTIONS.values()), "every action needs a handler"
