"""What the admin API returns: typed results with the fields of Kafka's ``Admin`` client results
where the meaning is the same, so callers never index into dicts."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, NamedTuple, Optional


class TopicPartition(NamedTuple):
    topic: str
    partition: int


@dataclass(frozen=True)
class PartitionInfo:
    partition: int
    replicas: List[str]
    leader_epoch: int
    log_start_offset: int
    high_watermark: int
    #: the replica writers write and readers read (the first: Kafka's preferred leader)
    leader: str = ""
    #: in-sync replicas, leader first: the replicated partition's ISR (docs/protocol.md §1.3),
    #: else the leader alone (one replica, or the cluster has no feature ``replication``)
    isr: List[str] = field(default_factory=list)
    #: caught-up replicas about to join the ISR (§1.3): they hold the high watermark back
    joining: List[str] = field(default_factory=list)
    #: the start of the lowest open write, else the log end: where ``high_watermark`` is
    #: without replication; a replicated partition's ``high_watermark`` waits for its ISR
    last_stable_offset: int = -1
    #: +1 at every ISR change; None when the partition is not replicated
    partition_epoch: Optional[int] = None


@dataclass(frozen=True)
class LogDirInfo:
    """A log dir of the cluster: under its root (``root``) or registered at a URL of its own."""
    log_dir: str
    url: str
    directory_id: Optional[str]
    root: bool


@dataclass(frozen=True)
class TopicDescription:
    name: str
    topic_id: str
    partitions: List[PartitionInfo]
    configs: Dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class RecordMetadata:
    topic: str
    partition: int
    offset: int


@dataclass(frozen=True)
class ConsumerRecord:
    topic: str
    partition: int
    offset: int
    timestamp: int
    timestamp_type: int
    key: Optional[bytes]
    value: Optional[bytes]
    headers: tuple
    magic: int = 2
    is_transactional: bool = False
    producer_id: int = -1


@dataclass(frozen=True)
class ListOffsetsResult:
    offset: int
    timestamp: int = -1


@dataclass(frozen=True)
class GroupPartitionLag:
    topic: str
    partition: int
    committed_offset: Optional[int]
    log_end_offset: int
    lag: Optional[int]


def describe_topic_result(raw: dict) -> TopicDescription:
    return TopicDescription(raw["topic"], raw["topic_id"],
                            [PartitionInfo(**p) for p in raw["partitions"]], raw["configs"])


