"""A kafkalog cluster: a storage root holding the metadata log and one or more Kafka log dirs.

`Cluster` is the entry point every higher layer (admin API, CLI, Spark source and sink, jobs)
uses. It holds no truth of its own: the metadata log is replayed on demand, and everything it
writes goes through the protocol of docs/protocol.md.
"""
from __future__ import annotations

import getpass
import json
import os
import random
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

from ..errors import (AlreadyExistsError, CorruptRecordError, InvalidConfigError,
                      InvalidRequestError, StorageNotFoundError, UnknownTopicOrPartitionError,
                      UnsupportedVersionError, error_for)
from ..format.checkpoint import new_topic_id, validate_topic_name
from ..log.config import LogConfig
from ..log.logdir import LogDir
from ..log.partition import PartitionLog
from ..log.segment import ReadStats
from ..progress import tracked
from ..storage import open_storage
from ..storage.mounts import MountedStorage
from . import actions as A
from . import log_dirs as L
from .features import CONFIG_FEATURES, check_writable, known as known_features
from .garbage import is_deleted_topic_dir
from .isr import effective_min_isr, leader_of, replica_end
from .config import CLUSTER_SETTINGS
from .metalog import DEFAULT_METADATA_RETENTION_MS, META_DIR, MetadataLog, entry_name
from .state import ClusterState, PartitionState

CLUSTER_FILE = f"{META_DIR}/cluster.json"
DEFAULT_LOGDIR = "logdir-0"
DEFAULT_TXN_TIMEOUT_MS = CLUSTER_SETTINGS["transaction.timeout.ms"].default
STORAGE_CLOCK_REFRESH_S = 30.0
METADATA_WRITE_THREADS = 32


def default_principal() -> str:
    env = os.environ.get("KAFKALOG_PRINCIPAL")
    if env:
        return env
    try:
        return f"User:{getpass.getuser()}"
    except Exception:
        return "User:ANONYMOUS"


@dataclass
class PartitionView:
    """What a reader may see of one partition at one point of the metadata log."""

    topic: str
    partition: int
    log_start_offset: int
    high_watermark: int
    log: PartitionLog
    state: PartitionState


def _check_identity(data: bytes) -> dict:
    """``cluster.json``, refused (UNSUPPORTED_VERSION) if a newer client wrote a version this
    one does not know."""
    try:
        meta = json.loads(data)
    except ValueError as exc:
        raise CorruptRecordError(f"{CLUSTER_FILE} is not valid JSON: {exc}") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("logdirs"), list):
        raise CorruptRecordError(f"{CLUSTER_FILE} does not describe a cluster")
    if meta.get("version") != 1:
        raise UnsupportedVersionError(f"{CLUSTER_FILE} has version {meta.get('version')!r}, "
                                      "which this client does not know (upgrade "
                                      "pyspark-kafkalog)")
    return meta


class Cluster:
    def __init__(self, url: str, *, create: bool = True, principal: Optional[str] = None,
                 transaction_timeout_ms: int = DEFAULT_TXN_TIMEOUT_MS,
                 clock: Callable[[], float] = time.time,
                 snapshot_interval: int = CLUSTER_SETTINGS["kafkalog.snapshot.interval"].default,
                 metadata_max_retention_ms: int = DEFAULT_METADATA_RETENTION_MS,
                 shared_state: bool = False, **storage_options):
        """``shared_state``: start from (and add to) the metadata state this process replayed
        before for this cluster (``metalog._SHARED``), for processes that open the same cluster
        again and again: Spark's reused Python workers, one write task after another."""
        if not isinstance(url, str) or not url:
            raise InvalidConfigError(f"cluster URL must be a non-empty string, got {url!r}")
        self.url = url
        #: ``fsync``/``direct_io``: this client's settings, also for log dirs on other roots
        self.client_options = L.client_storage_options(url, storage_options)
        # log dirs registered at other URLs are reached through their names (§1.1)
        self.storage = MountedStorage(open_storage(url, **storage_options),
                                      self._open_registered, may_mount=L.is_log_dir_name)
        self.principal = principal or default_principal()
        self.transaction_timeout_ms = transaction_timeout_ms
        self.clock = clock
        self._clock_offset: Optional[Tuple[float, float]] = None   # (storage - ours ms, when)
        self._reserved_ms: Dict[str, float] = {}   # txn -> mtime of its reserve entry (immutable)
        self.metalog = MetadataLog(self.storage, snapshot_interval=snapshot_interval, clock=clock,
                                   retention_ms=metadata_max_retention_ms)
        self.meta = self._load_or_create(create)
        if shared_state:
            self.metalog.share_key = (url, self.meta["cluster_id"])
        #: the log dirs under the root (``cluster.json``); :attr:`logdirs` adds registered ones
        self.root_logdirs: List[str] = list(self.meta["logdirs"])
        self.storage.set_local(self.root_logdirs)
        self.storage.keep_roots(self.root_logdirs)     # never created again once made (§1.1)
        #: draws Kafka's random start index and shift of replica placement (§1.2); seed it for
        #: a placement that repeats
        self.placement_random = random.Random()

    # -- identity -----------------------------------------------------------------------------

    def _load_or_create(self, create: bool) -> dict:
        try:
            return _check_identity(self.storage.read(CLUSTER_FILE))
        except StorageNotFoundError:
            if not create:
                raise UnknownTopicOrPartitionError(
                    f"{self.url} is not a kafkalog cluster (no {CLUSTER_FILE})") from None
        meta = {"version": 1, "cluster_id": new_topic_id(), "logdirs": [DEFAULT_LOGDIR],
                "created": int(self.clock() * 1000)}
        try:
            self.storage.create_if_absent(CLUSTER_FILE, json.dumps(meta, indent=1).encode())
        except AlreadyExistsError:
            return _check_identity(self.storage.read(CLUSTER_FILE))
        self.storage.set_local(meta["logdirs"])   # before its log dirs are first written
        for d in meta["logdirs"]:
            LogDir(self.storage, d).ensure_meta(cluster_id=meta["cluster_id"], node_id=0)
        return meta

    @property
    def cluster_id(self) -> str:
        return self.meta["cluster_id"]

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    # -- metadata -----------------------------------------------------------------------------

    def state(self, refresh: bool = True) -> ClusterState:
        return self.metalog.state(refresh)

    def submit(self, actions: List[A.Action]) -> Tuple[int, ClusterState, List[A.Result]]:
        """Append one entry of typed actions; returns (seq, state after it, their results)."""
        if not all(isinstance(a, A.Action) for a in actions):
            raise TypeError("actions are built through pyspark_kafkalog.cluster.actions")
        seq, state = self.metalog.append(actions)
        return seq, state, state.results[seq]

    def submit_one(self, action: A.Action) -> A.Result:
        """Append one action and raise its error, typed, if replay rejected it."""
        _, _, results = self.submit([action])
        result = results[0]
        if not result.ok:
            raise error_for(result.error, result.message)
        return result

    def features(self, state: Optional[ClusterState] = None) -> Dict[str, dict]:
        """Per feature the cluster uses or this client knows: its kind, whether the cluster
        has it on, and whether this client supports it."""
        state = state or self.state()
        out = {}
        for kind, used in (("reader", state.reader_features), ("writer", state.writer_features)):
            table = known_features(kind)
            for name in sorted(set(used) | set(table)):
                if kind == "writer" and name in state.reader_features:
                    continue   # a reader feature binds writers too: listed once, as reader
                out[name] = {"kind": kind, "enabled": name in used,
                             "supported": name in table,
                             "description": table.get(name, "unknown to this client")}
        return out

    def enable_feature(self, name: str) -> dict:
        """Turn a protocol feature on (docs/protocol.md §2.3): an explicit, logged step, one
        metadata entry. Only a feature this client implements can be enabled; from that entry
        on, clients that lack it refuse to read (reader feature) or to write (writer feature).
        A feature the cluster has on already appends nothing. Returns the feature as
        :meth:`features` describes it, with ``changed``: whether this call turned it on.
        A name this client does not implement (or none) is the caller's mistake:
        :class:`InvalidRequestError`, and nothing is written."""
        for kind in ("reader", "writer"):
            if isinstance(name, str) and name in known_features(kind):
                state = self.state()
                if name in (state.reader_features if kind == "reader"
                            else state.writer_features):
                    return dict(self.features(state)[name], changed=False)
                action = (A.EnableFeatures(reader_features=[name]) if kind == "reader"
                          else A.EnableFeatures(writer_features=[name]))
                self.submit_one(action)
                return dict(self.features()[name], changed=True)
        names = sorted(known_features("reader")) + sorted(known_features("writer"))
        raise InvalidRequestError(f"feature {name!r} is not one this client implements "
                                  f"(it knows: {', '.join(names) or 'none'})")

    def check_writable(self, state: Optional[ClusterState] = None) -> None:
        """Refuse (UNSUPPORTED_VERSION) before writing anything the metadata log does not
        guard itself (segment files, group offsets, checkpoints) when the cluster uses a
        writer feature this client lacks."""
        check_writable((state or self.state()).writer_features)

    # -- log dirs (docs/protocol.md §1.1) ------------------------------------------------------

    @property
    def logdirs(self) -> List[str]:
        """Every log dir, by number: the root's and those registered at other URLs, as of the
        newest state this client replayed."""
        return self.log_dir_names()

    def log_dir_names(self, state: Optional[ClusterState] = None) -> List[str]:
        state = state if state is not None else self.metalog.state(refresh=False)
        registered = [d for d, info in state.log_dirs.items()
                      if d not in self.root_logdirs and "removed" not in info]
        return sorted(self.root_logdirs + registered, key=L.log_dir_number)

    def log_dir_info(self, state: Optional[ClusterState] = None) -> List[dict]:
        """Per log dir: ``log_dir`` (its name), ``url``, ``directory_id`` and ``root`` (whether
        it is under the cluster's root rather than registered at a URL of its own)."""
        state = state or self.state()
        out = []
        for name in self.log_dir_names(state):
            info = None if name in self.root_logdirs else state.log_dirs[name]
            if info is None:
                meta = LogDir(self.storage, name).read_meta() or {}
                out.append({"log_dir": name,
                            "url": f"{L.normalize_log_dir_url(self.url).rstrip('/')}/{name}",
                            "directory_id": meta.get("directory.id"), "root": True})
            else:
                out.append({"log_dir": name, "url": info["url"],
                            "directory_id": info["directory_id"], "root": False})
        return out

    def _open_registered(self, name: str):
        """The storage of a registered log dir, for ``self.storage`` to route its paths to;
        None for a name no state knows (then it is the root's)."""
        info = self.metalog.state(refresh=False).log_dirs.get(name)
        if info is None:
            info = self.metalog.state().log_dirs.get(name)   # registered since that state
        return None if info is None else L.open_registered(name, info, self.client_options)

    def replica_location(self, topic: str, partition: int, logdir: Optional[str] = None,
                         state: Optional[ClusterState] = None
                         ) -> Tuple[Optional[Tuple[str, Dict[str, str]]], str]:
        """Where a replica (default: the leader) is for a process without this ``Cluster`` (a
        Spark executor): ``(None, path)`` for a log dir under the root, path as
        :meth:`partition_dir` gives it; else ``((url, storage options), path)`` of its log
        dir's own root and the path under that root."""
        state = state or self.state()
        path = self.partition_dir(topic, partition, logdir, state)
        name, _, rest = path.partition("/")
        info = None if name in self.root_logdirs else state.log_dirs.get(name)
        if info is None:
            return None, path
        return (info["url"], dict(info["storage_options"])), rest

    # -- topics -------------------------------------------------------------------------------

    def assign_replicas(self, partitions: int, replication_factor: int, start: int = 0,
                        state: Optional[ClusterState] = None, fixed_start_index: int = -1
                        ) -> List[List[str]]:
        """Replicas of partitions ``start…start+partitions-1`` over every log dir, as Kafka
        assigns replicas to brokers (docs/protocol.md §1.2; ``log_dirs.py``)."""
        return L.assign_replicas_to_log_dirs(
            self.log_dir_names(state), partitions, replication_factor,
            fixed_start_index=fixed_start_index, start_partition=start,
            rng=self.placement_random)

    def create_topic(self, topic: str, partitions: int = 1, replication_factor: int = 1,
                     configs: Optional[Dict[str, str]] = None) -> dict:
        validate_topic_name(topic)
        if not isinstance(partitions, int) or partitions < 1:
            from ..errors import InvalidPartitionsError
            raise InvalidPartitionsError(f"partitions must be an int >= 1, got {partitions!r}")
        configs = {k: str(v) for k, v in (configs or {}).items()}
        LogConfig.from_properties(configs)
        state = self.state()
        replicas = self.assign_replicas(partitions, replication_factor, state=state)
        L.check_min_insync_replicas(configs, replication_factor)
        topic_id = new_topic_id()
        self._remove_leftovers(topic, partitions)
        self._enable_config_features(configs, state)
        self.submit_one(A.CreateTopic(topic=topic, topic_id=topic_id, partitions=partitions,
                                      replicas=replicas, configs=configs))
        self._write_partition_metadata(topic_id, [self.partition_dir(topic, p, replicas[p][0])
                                                  for p in range(partitions)])
        return self.describe_topic(topic)

    def _enable_config_features(self, configs: Dict[str, str],
                                state: Optional[ClusterState] = None) -> None:
        """The first topic config that needs a feature (flush.messages, flush.ms,
        segment.merge.lag.ms) turns it on, in an entry of its own before the one that sets it
        (docs/protocol.md §2.3)."""
        needed = sorted({CONFIG_FEATURES[k] for k in configs if k in CONFIG_FEATURES})
        if needed:
            have = (state or self.state()).reader_features
            missing = [f for f in needed if f not in have]
            if missing:
                self.submit_one(A.EnableFeatures(reader_features=missing))

    def _write_partition_metadata(self, topic_id: str, dirs: List[str]) -> None:
        """One ``partition.metadata`` per partition, many at a time: each is an atomic replace
        with its own syncs, and concurrent syncs share the file system's journal commits (a
        topic of thousands of partitions is created about ten times faster)."""
        def write(d: str) -> None:
            PartitionLog(self.storage, d).write_partition_metadata(topic_id)
        if len(dirs) < 8:
            for d in dirs:
                write(d)
            return
        with ThreadPoolExecutor(min(METADATA_WRITE_THREADS, len(dirs))) as pool:
            for _ in tracked("creating partitions", pool.map(write, dirs), len(dirs)):
                pass

    def _remove_leftovers(self, topic: str, partitions: int) -> None:
        """Directories a deleted incarnation of ``topic`` left behind would collide with the new
        one's segment files; remove them first, but only on proof (the protocol's garbage rule,
        §7) and only while the topic still does not exist after listing them: a process that
        loses a creation race to another must never remove the winner's files."""
        listed = [(d, name) for d in self.logdirs for name in self.storage.list_dirs(d)
                  if name.rpartition("-")[0] == topic]
        if not listed:
            return
        state = self.state()              # replayed after the listing
        if topic in state.topics:
            return                        # someone else created it: their dirs, not leftovers
        for d, name in listed:
            if is_deleted_topic_dir(self, state, f"{d}/{name}", topic):
                self.storage.delete_tree(f"{d}/{name}")

    def delete_topic(self, topic: str) -> None:
        state = self.state()
        info = state.topics.get(topic)
        if info is None:
            raise UnknownTopicOrPartitionError(f"topic {topic!r} does not exist")
        self.submit_one(A.DeleteTopic(topic=topic))
        for p, replicas in enumerate(info["replicas"]):
            for d in replicas:
                self.storage.delete_tree(self.partition_dir(topic, p, d))
                LogDir(self.storage, d).remove_partition((topic, p))

    def alter_configs(self, topic: str, set_configs: Optional[Dict[str, str]] = None,
                      delete: Optional[List[str]] = None) -> dict:
        set_configs = {k: str(v) for k, v in (set_configs or {}).items()}
        info = self.state().topics.get(topic)
        if info is not None and info["replicas"]:
            L.check_min_insync_replicas(set_configs, len(info["replicas"][0]))
        LogConfig.from_properties(set_configs)   # bad input changes nothing, not even features
        self._enable_config_features(set_configs)
        self.submit_one(A.AlterConfigs(topic=topic, set=set_configs, delete=list(delete or [])))
        return self.describe_topic(topic)

    def create_partitions(self, topic: str, total: int) -> dict:
        state = self.state()
        info = state.topics.get(topic)
        if info is None:
            raise UnknownTopicOrPartitionError(f"topic {topic!r} does not exist")
        rf = len(info["replicas"][0])
        # Kafka's AddPartitions: the leaders' round goes on from partition 0's leader
        dirs, leader = self.log_dir_names(state), info["replicas"][0][0]
        replicas = self.assign_replicas(max(total - info["partitions"], 0), rf,
                                        start=info["partitions"], state=state,
                                        fixed_start_index=dirs.index(leader)
                                        if leader in dirs else 0)
        self.submit_one(A.CreatePartitions(topic=topic, total=total, replicas=replicas))
        self._write_partition_metadata(
            info["topic_id"], [self.partition_dir(topic, p, replicas[p - info["partitions"]][0])
                               for p in range(info["partitions"], total)])
        return self.describe_topic(topic)

    def partition_count(self, topic: str, state: Optional[ClusterState] = None) -> int:
        """O(1), unlike ``describe_topic``, which lists every partition."""
        info = (state or self.state()).topics.get(topic)
        if info is None:
            raise UnknownTopicOrPartitionError(f"topic {topic!r} does not exist")
        return info["partitions"]

    def list_topics(self) -> List[str]:
        return sorted(self.state().topics)

    def describe_topic(self, topic: str, state: Optional[ClusterState] = None) -> dict:
        state = state or self.state()
        info = state.topics.get(topic)
        if info is None:
            raise UnknownTopicOrPartitionError(f"topic {topic!r} does not exist")
        parts = []
        for p in range(info["partitions"]):
            ps = state.partition(topic, p)
            replicas = info["replicas"][p]
            rep = ps.replication
            # high_watermark: the stored one of a replicated partition (§1.3), which waits for
            # the ISR; last_stable_offset: where it would be without replication
            parts.append({"partition": p, "leader": leader_of(ps, replicas), "replicas": replicas,
                          "isr": in_sync_replicas(replicas, ps), "leader_epoch": ps.leader_epoch,
                          "log_start_offset": ps.log_start_offset,
                          "high_watermark": ps.high_watermark,
                          "joining": list(rep["joining"]) if rep else [],
                          "last_stable_offset": ps.last_stable_offset,
                          "partition_epoch": rep["partition_epoch"] if rep else None})
        return {"topic": topic, "topic_id": info["topic_id"], "partitions": parts,
                "configs": dict(info["configs"])}

    def topic_config(self, topic: str, state: Optional[ClusterState] = None) -> LogConfig:
        state = state or self.state()
        if topic not in state.topics:
            raise UnknownTopicOrPartitionError(f"topic {topic!r} does not exist")
        return state.topic_config(topic)

    # -- data ---------------------------------------------------------------------------------

    def partition_dir(self, topic: str, partition: int, logdir: Optional[str] = None,
                      state: Optional[ClusterState] = None) -> str:
        if logdir is None:
            state = state or self.state()
            info = state.topics.get(topic)
            if info is None or not 0 <= partition < info["partitions"]:
                raise UnknownTopicOrPartitionError(f"no partition {topic}-{partition}")
            logdir = leader_of(state.partition(topic, partition), info["replicas"][partition])
        return f"{logdir}/{topic}-{partition}"

    def partition_view(self, topic: str, partition: int, state: Optional[ClusterState] = None,
                       stats: Optional[ReadStats] = None,
                       isolation_level: str = "read_committed",
                       logdir: Optional[str] = None) -> PartitionView:
        """The partition as a reader may see it: committed data below the high watermark, or
        with ``read_uncommitted`` also the data of writes not yet decided. ``logdir``: that
        replica's files instead of the leader's."""
        state = state or self.state()
        ps = state.partition(topic, partition)
        if ps is None:
            raise UnknownTopicOrPartitionError(f"no partition {topic}-{partition}")
        if isolation_level == "read_committed":
            visible, end, promised = ps.segment_visible, ps.high_watermark, ps.next_visible_offset
        elif isolation_level == "read_uncommitted":   # open writes may not have their files yet
            visible, end, promised = ps.segment_visible_uncommitted, ps.next_offset, None
        else:
            raise InvalidConfigError(f"isolation level must be read_committed or "
                                     f"read_uncommitted, got {isolation_level!r}")
        log = PartitionLog(self.storage, self.partition_dir(topic, partition, logdir, state),
                           state.topic_config(topic), log_start_offset=ps.log_start_offset,
                           stats=stats, segment_filter=visible, high_watermark=end,
                           next_visible=promised)
        return PartitionView(topic, partition, ps.log_start_offset, end, log, ps)

    def partitions(self, state: Optional[ClusterState] = None) -> List[Tuple[str, int]]:
        state = state or self.state()
        return sorted((t, p) for t, info in state.topics.items() for p in range(info["partitions"]))

    def storage_now_ms(self) -> int:
        """The storage's clock (docs/protocol.md §3, "Expiry"): what maintenance and expiry
        compare file and entry times against, so a process whose own clock is wrong judges
        nobody wrongly. The offset between the storage's clock and ours is measured with a
        probe file and kept for ``STORAGE_CLOCK_REFRESH_S`` (on the monotonic clock), so a
        writer pays for a probe rarely, not per reservation."""
        mono = time.monotonic()
        if self._clock_offset is None or mono - self._clock_offset[1] > STORAGE_CLOCK_REFRESH_S:
            before = self.clock()
            storage_now = self.storage.clock(META_DIR)
            self._clock_offset = ((storage_now - (before + self.clock()) / 2) * 1000, mono)
        return int(self.now_ms() + self._clock_offset[0])

    def expired_txns(self, state: Optional[ClusterState] = None) -> List[str]:
        """Open transactions whose reservation is older than its ``timeout_ms`` by the storage's
        clock: the age of the reserve entry's file (its server-side mtime) against a probe
        written now. The writer's own clock, which set the entry's timestamp and so the
        deadline, plays no part: a writer whose clock runs ahead cannot hold the high watermark
        back past its timeout, and one whose clock runs behind is not aborted early. Only a
        reservation whose entry is gone (metadata cleanup) or that an older client wrote (no
        ``seq``) is judged by its deadline against our clock."""
        state = state or self.state()
        if not state.txns:
            return []
        now = None
        expired = []
        for txn, info in sorted(state.txns.items()):
            seq, timeout = info.get("seq"), info.get("timeout_ms")
            reserved = self._reserved_ms.get(txn)
            if reserved is None and seq is not None and timeout is not None:
                try:
                    reserved = self.storage.mtime(entry_name(seq)) * 1000
                    if len(self._reserved_ms) > 10_000:
                        self._reserved_ms.clear()
                    self._reserved_ms[txn] = reserved
                except StorageNotFoundError:
                    reserved = None
            if reserved is None:
                if info["deadline"] < self.now_ms():
                    expired.append(txn)
                continue
            if now is None:
                now = self.storage_now_ms()
            if now - reserved > timeout:
                expired.append(txn)
        return expired

    def abort_expired(self, state: Optional[ClusterState] = None) -> List[str]:
        """Abort open transactions past their timeout (their writers are dead or fenced)."""
        expired = self.expired_txns(state)
        if not expired:
            return []
        _, _, results = self.submit([A.Abort(txns=expired, reason="expired")])
        return list(getattr(results[0], "aborted", []))


def in_sync_replicas(replicas: List[str], ps: Optional[PartitionState] = None) -> List[str]:
    """A partition's ISR: the one its replication state holds (§1.3), else (one replica, or no
    feature ``replication``) its leader alone, as nothing copies to followers (§1.2)."""
    if ps is not None and ps.replication is not None:
        return list(ps.replication["isr"])
    return replicas[:1]


def isr_health(isr_size: int, replication_factor: int,
               min_insync_replicas: int) -> Dict[str, bool]:
    """Kafka's partition-level flags: under-replicated (ISR smaller than the replicas), under
    and at min ISR, against the effective min ISR (``min(min.insync.replicas, RF)``, the one
    that freezes the high watermark, §1.3; Kafka's ``Partition.effectiveMinIsr``)."""
    need = effective_min_isr(min_insync_replicas, replication_factor)
    return {"under_replicated": isr_size < replication_factor,
            "under_min_isr": isr_size < need, "at_min_isr": isr_size == need}


def replication_summary(state: ClusterState) -> Dict[str, object]:
    """Kafka's ReplicaManager gauges over every partition, from the real ISR: how many
    partitions there are, how many have an ISR smaller than their replicas
    (``UnderReplicatedPartitions``), smaller than the effective ``min.insync.replicas``
    (``UnderMinIsrPartitionCount``) or equal to it (``AtMinIsrPartitionCount``); partitions by
    ISR size (``{size: count}``); and the largest replication lag, in offsets, of any follower
    of a replicated partition (LSO - end(r), §1.3; Kafka's ``MaxLag``; 0 without any)."""
    out: Dict[str, object] = {"partitions": 0, "under_replicated_partitions": 0,
                              "under_min_isr_partitions": 0, "at_min_isr_partitions": 0,
                              "replication_max_lag_offsets": 0}
    sizes: Dict[int, int] = {}
    for topic, info in state.topics.items():
        min_isr = state.topic_config(topic).min_insync_replicas
        for p, replicas in enumerate(info["replicas"]):
            ps = state.partition(topic, p)
            isr = len(in_sync_replicas(replicas, ps))
            health = isr_health(isr, len(replicas), min_isr)
            out["partitions"] += 1
            out["under_replicated_partitions"] += health["under_replicated"]
            out["under_min_isr_partitions"] += health["under_min_isr"]
            out["at_min_isr_partitions"] += health["at_min_isr"]
            sizes[isr] = sizes.get(isr, 0) + 1
            if ps is not None and ps.replication is not None:
                leader = leader_of(ps, replicas)
                lso = ps.last_stable_offset
                for r in replicas:
                    if r != leader:
                        out["replication_max_lag_offsets"] = max(
                            out["replication_max_lag_offsets"], lso - replica_end(ps, r, leader))
    out["partitions_by_isr_size"] = dict(sorted(sizes.items()))
    return out
