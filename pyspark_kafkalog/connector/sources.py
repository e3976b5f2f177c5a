"""Where a reader's records come from: a kafkalog cluster root, or any Kafka log dir.

The Spark source (and anything else that reads ranges of offsets) sees both through one small
interface, :class:`ReadSource`, because they differ only in *who says what is visible*:

* **a kafkalog cluster** (``<root>/_kafkalog/cluster.json`` exists): the replayed metadata log
  (docs/protocol.md §4). Log start offset and high watermark come from the state, and only
  segments in committed ranges are read. Writes not yet committed (open reservations) are never
  visible: they play the part of data above a broker's high watermark, which no Kafka consumer
  sees in either isolation level, so a Spark job's output appears all at once.
* **a Kafka log dir** (for example a copy of a broker's ``log.dirs``), read-only: partitions are
  the ``<topic>-<partition>`` directories, the log start offset is the larger of
  ``log-start-offset-checkpoint`` and the first segment's base offset, and the high watermark is
  ``replication-offset-checkpoint``'s entry (capped at the log end). With ``read_to_log_end``, or
  for a partition the checkpoint does not list, reads go to the log end offset instead.

Planning happens once, on the driver; executors must read exactly what was planned without
replaying anything, so :meth:`ReadSource.view` returns a small picklable
:class:`PartitionHandle` that re-opens the partition from the URL with the planned state.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple
from urllib.parse import urlsplit

from ..errors import InvalidConfigError, StorageNotFoundError, UnknownTopicOrPartitionError
from ..log.config import LogConfig
from ..log.logdir import LOG_START_CHECKPOINT, REPLICATION_CHECKPOINT, LogDir
from ..log.partition import PartitionLog
from ..log.segment import ReadStats
from ..storage import open_storage

CLUSTER = "cluster"
LOGDIR = "logdir"
#: Kafka's internal topics: left out of pattern subscriptions (the consumer's
#: ``exclude.internal.topics=true``), readable when named.
INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__transaction_state", "__cluster_metadata"})

_STORAGE_CACHE: Dict[Tuple[str, Tuple], object] = {}


def cached_storage(url: str, storage_options: Optional[Dict[str, str]] = None, *,
                   create_root: bool = True):
    """One storage object per URL and options per process (Python workers are reused).
    ``create_root`` False for a registered log dir's root, which a reader must never make
    again where it has gone (docs/protocol.md §1.1)."""
    key = (url, tuple(sorted((storage_options or {}).items())), create_root)
    storage = _STORAGE_CACHE.get(key)
    if storage is None:
        storage = _STORAGE_CACHE[key] = open_storage(url, **dict(storage_options or {}),
                                                     create_root=create_root)
    return storage


def _local_path(url: str) -> Optional[str]:
    if "://" not in url:
        return os.path.abspath(url)
    parts = urlsplit(url)
    if parts.scheme.lower() in ("file", "local"):
        return os.path.abspath(parts.path)
    return None


def normalize_url(url: str) -> str:
    """Local paths become absolute (executors may run elsewhere in the tree); URLs stay."""
    if not isinstance(url, str) or not url.strip():
        raise InvalidConfigError(f"invalid path {url!r}: expected a directory or storage URL")
    local = _local_path(url.strip())
    return local if local is not None and "://" not in url else url.strip()


@dataclass
class PartitionHandle:
    """Everything an executor needs to read one partition as the driver planned it."""

    kind: str
    url: str
    storage_options: Dict[str, str]
    topic: str
    partition: int
    dir: str
    log_start_offset: int
    high_watermark: int
    configs: Dict[str, str] = field(default_factory=dict)
    #: cluster only: the partition's replayed state (committed ranges pick the segments)
    state: Optional[dict] = None
    #: cluster only, when the partition's log dir is not under the cluster's root but at a URL
    #: of its own (docs/protocol.md §1.1): that URL and its storage options; ``dir`` is under it
    root: Optional[Tuple[str, Dict[str, str]]] = None
    #: ``(base offset, .log size)`` of its segments as the planner listed them: the task
    #: opens the log from this instead of listing it again (``PartitionLog``'s ``listing``)
    segments: Optional[List[Tuple[int, int]]] = None

    @property
    def immutable(self) -> bool:
        """Whether the partition's segment files are never truncated or rewritten in place
        (a cluster's are published whole and only deleted), so readers may map them. A Kafka
        log dir may be a live broker's, whose active segment grows and can be truncated."""
        return self.kind == CLUSTER

    def promised(self, start: int, end: int) -> Optional[int]:
        """The first offset in ``[start, end)`` that the planned metadata says holds a record,
        or None. Only a cluster makes such promises; in a Kafka log dir (where compaction leaves
        gaps) deletion only ever moves the log start offset, which readers check instead."""
        if self.kind != CLUSTER:
            return None
        start = max(start, self.log_start_offset)
        end = min(end, self.high_watermark)
        for lo, hi, _ in self.state.get("committed") or []:
            first = max(lo, start)
            if first < min(hi, end):
                return first
        return None

    def open(self, stats: Optional[ReadStats] = None) -> PartitionLog:
        storage = cached_storage(*self.root, create_root=False) if self.root is not None \
            else cached_storage(self.url, self.storage_options)
        config = LogConfig.from_properties(self.configs)
        if self.kind == CLUSTER:
            from ..cluster.state import PartitionState
            ps = PartitionState.from_json(self.state)
            return PartitionLog(storage, self.dir, config, log_start_offset=ps.log_start_offset,
                                stats=stats, segment_filter=ps.segment_visible,
                                high_watermark=self.high_watermark, listing=self.segments)
        return PartitionLog(storage, self.dir, config, log_start_offset=self.log_start_offset,
                            stats=stats, listing=self.segments)


class ReadSource:
    """A cluster root or a Kafka log dir, opened once for planning."""

    kind: str = ""
    #: whether the data may hold Kafka transactional batches and markers (only logs Kafka wrote)
    kafka_transactions: bool = False

    def __init__(self, url: str, storage_options: Optional[Dict[str, str]] = None):
        self.url = url
        self.storage_options = dict(storage_options or {})

    def topics(self) -> List[str]:
        raise NotImplementedError

    def partitions(self, topic: str) -> List[int]:
        raise NotImplementedError

    def view(self, topic: str, partition: int,
             stats: Optional[ReadStats] = None) -> Tuple[PartitionHandle, PartitionLog]:
        """The partition's handle (what executors re-open) and its log, opened here."""
        raise NotImplementedError


class ClusterSource(ReadSource):
    kind = CLUSTER

    def __init__(self, url: str, storage_options: Optional[Dict[str, str]] = None, *,
                 cluster=None, state=None):
        """``cluster`` and ``state``: plan against a state the caller already holds (a
        streaming query's, refreshed incrementally) instead of replaying the log again."""
        super().__init__(url, storage_options)
        from ..cluster.cluster import Cluster
        self.cluster = cluster or Cluster(url, create=False, **self.storage_options)
        self.state = state if state is not None else self.cluster.state()   # one for the plan

    def topics(self) -> List[str]:
        return sorted(self.state.topics)

    def partitions(self, topic: str) -> List[int]:
        info = self.state.topics.get(topic)
        return list(range(info["partitions"])) if info else []

    def view(self, topic, partition, stats=None):
        ps = self.state.partition(topic, partition)
        if ps is None:
            raise UnknownTopicOrPartitionError(f"no partition {topic}-{partition} in {self.url}")
        root, path = self.cluster.replica_location(topic, partition, state=self.state)
        handle = PartitionHandle(
            CLUSTER, self.url, self.storage_options, topic, partition, path,
            ps.log_start_offset, ps.high_watermark,
            dict(self.state.topics[topic]["configs"]), ps.to_json(), root=root)
        log = handle.open(stats)
        handle.segments = log.listing()
        return handle, log


class LogDirSource(ReadSource):
    kind = LOGDIR
    kafka_transactions = True

    def __init__(self, url: str, storage_options: Optional[Dict[str, str]] = None, *,
                 read_to_log_end: bool = False, storage=None):
        super().__init__(url, storage_options)
        self.read_to_log_end = read_to_log_end
        self.logdir = LogDir(storage or cached_storage(url, self.storage_options))
        self._tps = self.logdir.partitions()
        if not self._tps and self.logdir.read_meta() is None:
            raise InvalidConfigError(
                f"{url} holds neither a kafkalog cluster (_kafkalog/cluster.json) nor a Kafka log "
                "dir (<topic>-<partition> directories or meta.properties)")
        self._hw = self.logdir.read_checkpoint(REPLICATION_CHECKPOINT)
        self._log_start = self.logdir.read_checkpoint(LOG_START_CHECKPOINT)

    def topics(self) -> List[str]:
        return sorted({t for t, _ in self._tps})

    def partitions(self, topic: str) -> List[int]:
        return sorted(p for t, p in self._tps if t == topic)

    def view(self, topic, partition, stats=None):
        tp = (topic, partition)
        if tp not in self._tps:
            raise UnknownTopicOrPartitionError(
                f"no partition directory {topic}-{partition} in the Kafka log dir {self.url}")
        path = self.logdir.partition_dir(topic, partition)
        log = PartitionLog(self.logdir.storage, path, log_start_offset=self._log_start.get(tp),
                           stats=stats)
        start = log.log_start_offset
        end = log.log_end_offset
        hw = end if self.read_to_log_end or tp not in self._hw else min(self._hw[tp], end)
        handle = PartitionHandle(LOGDIR, self.url, self.storage_options, topic, partition, path,
                                 start, max(hw, start), segments=log.listing())
        return handle, log


def open_source(url: str, storage_options: Optional[Dict[str, str]] = None, *,
                read_to_log_end: bool = False) -> ReadSource:
    """Open ``url`` as a cluster root if it has ``_kafkalog/cluster.json``, else as a Kafka log
    dir. Nothing is created: a missing path is an error."""
    from ..cluster.cluster import CLUSTER_FILE
    url = normalize_url(url)
    local = _local_path(url)
    if local is not None and not os.path.isdir(local):
        raise StorageNotFoundError(f"path {url!r} does not exist or is not a directory")
    storage = cached_storage(url, storage_options)
    if storage.exists(CLUSTER_FILE):
        if read_to_log_end:
            raise InvalidConfigError(
                f"option readToLogEnd applies to Kafka log dirs only; {url} is a kafkalog "
                "cluster, whose readers see exactly the committed data (docs/protocol.md §4)")
        return ClusterSource(url, storage_options)
    return LogDirSource(url, storage_options, read_to_log_end=read_to_log_end, storage=storage)
