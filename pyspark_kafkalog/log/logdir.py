"""A Kafka log dir: ``meta.properties``, the three offset checkpoint files and the
``<topic>-<partition>`` directories under one root.

The checkpoint files cover every partition of the dir. Updating one partition's entries is a
read-modify-write of the whole file through an atomic replace: safe for one writer per log dir
(the CLI's raw ``produce`` and ``recover``); the cluster layer serialises writers of a shared dir.
"""
from __future__ import annotations

import re
from typing import Dict, List, Mapping, Optional, Tuple

from ..errors import (InvalidConfigError, InvalidPartitionsError, StorageNotFoundError,
                      UnknownTopicOrPartitionError)
from ..format import checkpoint as ckpt
from .config import LogConfig
from .partition import (META_PROPERTIES_FILE, PARTITION_METADATA_FILE, PartitionLog,
                        parse_partition_dir)
from .segment import ReadStats

REPLICATION_CHECKPOINT = "replication-offset-checkpoint"
LOG_START_CHECKPOINT = "log-start-offset-checkpoint"
RECOVERY_POINT_CHECKPOINT = "recovery-point-offset-checkpoint"
META_PROPERTIES = META_PROPERTIES_FILE
# Kafka renames partition dirs it is deleting or moving: <topic>-<p>.<uuid>-delete / -future / -stray
_LIVE_DIR = re.compile(r"^(.+)-(\d+)$")

TopicPartition = Tuple[str, int]


class LogDir:
    def __init__(self, storage, path: str = ""):
        self.storage = storage
        self.path = path.strip("/")

    def _p(self, name: str) -> str:
        return f"{self.path}/{name}" if self.path else name

    # -- meta.properties ----------------------------------------------------------------------

    def read_meta(self) -> Optional[dict]:
        try:
            return ckpt.parse_meta_properties(self.storage.read(self._p(META_PROPERTIES)).decode("latin-1"))
        except StorageNotFoundError:
            return None

    def ensure_meta(self, cluster_id: Optional[str] = None, node_id: int = 0) -> dict:
        """Write a KRaft ``meta.properties`` (version 1) unless one exists; return the current one."""
        meta = self.read_meta()
        if meta is not None:
            return meta
        props = {"version": "1",
                 "cluster.id": cluster_id or ckpt.new_topic_id(),
                 "node.id": str(node_id),
                 "directory.id": ckpt.new_topic_id()}
        text = ckpt.format_meta_properties(props)
        try:
            self.storage.create_if_absent(self._p(META_PROPERTIES), text.encode())
        except FileExistsError:
            pass
        return self.read_meta()

    # -- checkpoints --------------------------------------------------------------------------

    def read_checkpoint(self, name: str) -> Dict[TopicPartition, int]:
        try:
            text = self.storage.read(self._p(name)).decode("utf-8")
        except StorageNotFoundError:
            return {}
        return ckpt.parse_offset_checkpoint(text)

    def update_checkpoint(self, name: str, updates: Mapping[TopicPartition, Optional[int]]) -> None:
        """Set (or with None remove) entries, keeping the order of the others."""
        current = self.read_checkpoint(name)
        for tp, value in updates.items():
            if value is None:
                current.pop(tp, None)
            else:
                current[tp] = value
        self.storage.replace(self._p(name), ckpt.format_offset_checkpoint(current).encode())

    def remove_partition(self, tp: TopicPartition) -> None:
        """Forget a deleted partition in every checkpoint file that mentions it."""
        for name in (REPLICATION_CHECKPOINT, LOG_START_CHECKPOINT, RECOVERY_POINT_CHECKPOINT):
            if tp in self.read_checkpoint(name):
                self.update_checkpoint(name, {tp: None})

    def merge_checkpoint(self, name: str, updates: Mapping[TopicPartition, int],
                         attempts: int = 5) -> bool:
        """Raise entries to at least ``updates`` when concurrent processes rewrite the same file.

        Every value kept in these files only grows, so each writer re-reads, takes the maximum,
        replaces, and re-reads to check that no one overwrote it with older values; it retries a
        few times. A rewriter that loses every time leaves a stale (never a wrong-way) value that
        the next commit or maintenance run repairs (docs/protocol.md, §8).
        """
        for _ in range(attempts):
            current = self.read_checkpoint(name)
            merged = dict(current)
            for tp, value in updates.items():
                merged[tp] = max(value, current.get(tp, value))
            if merged != current:
                self.storage.replace(self._p(name), ckpt.format_offset_checkpoint(merged).encode())
            check = self.read_checkpoint(name)
            if all(check.get(tp, -1) >= v for tp, v in updates.items()):
                return True
        return False

    def update_partition_state(self, tp: TopicPartition, *, high_watermark: int,
                               log_start_offset: int, recovery_point: int) -> None:
        self.update_checkpoint(REPLICATION_CHECKPOINT, {tp: high_watermark})
        self.update_checkpoint(LOG_START_CHECKPOINT, {tp: log_start_offset})
        self.update_checkpoint(RECOVERY_POINT_CHECKPOINT, {tp: recovery_point})

    # -- partitions ---------------------------------------------------------------------------

    def partitions(self) -> List[TopicPartition]:
        out = []
        for name in self.storage.list_dirs(self.path):
            m = _LIVE_DIR.match(name)
            if m and "." not in m.group(2):
                try:
                    out.append(parse_partition_dir(name))
                except Exception:
                    continue
        return sorted(out)

    def partition_dir(self, topic: str, partition: int) -> str:
        ckpt.validate_topic_name(topic)
        if not isinstance(partition, int) or partition < 0:
            raise InvalidPartitionsError(f"invalid partition {partition!r}: must be an int >= 0")
        return self._p(f"{topic}-{partition}")

    def open_partition(self, topic: str, partition: int, config: Optional[LogConfig] = None, *,
                       create: bool = False, topic_id: Optional[str] = None,
                       stats: Optional[ReadStats] = None) -> PartitionLog:
        path = self.partition_dir(topic, partition)
        exists = bool(self.storage.list(path)) or path.rsplit("/", 1)[-1] in self.storage.list_dirs(self.path)
        if not exists:
            if not create:
                raise UnknownTopicOrPartitionError(f"no partition directory {path!r} in {self.storage.url}")
            self.storage.makedirs(path)
            PartitionLog(self.storage, path, config).write_partition_metadata(
                topic_id or ckpt.new_topic_id())
        elif create and not self.storage.exists(f"{path}/{PARTITION_METADATA_FILE}"):
            PartitionLog(self.storage, path, config).write_partition_metadata(
                topic_id or ckpt.new_topic_id())
        lso = self.read_checkpoint(LOG_START_CHECKPOINT).get((topic, partition))
        return PartitionLog(self.storage, path, config, log_start_offset=lso, stats=stats)

    def high_watermark(self, topic: str, partition: int) -> Optional[int]:
        return self.read_checkpoint(REPLICATION_CHECKPOINT).get((topic, partition))


def split_url(url: str) -> Tuple[str, str]:
    """``.../logdir/topic-0`` -> (``.../logdir``, ``topic-0``), for any URL or local path."""
    stripped = url.rstrip("/")
    if not stripped:
        raise InvalidConfigError(f"invalid path {url!r}")
    if "://" in stripped:
        scheme, rest = stripped.split("://", 1)
        if "/" not in rest.strip("/"):
            raise InvalidConfigError(f"{url!r} names no directory inside its storage root")
        parent, name = rest.rsplit("/", 1)
        return f"{scheme}://{parent}", name
    import os
    path = os.path.abspath(stripped)
    return os.path.dirname(path), os.path.basename(path)


