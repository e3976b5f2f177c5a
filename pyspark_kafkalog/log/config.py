"""Per-topic log configuration, under Kafka's own config names and with its validation."""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Mapping

from ..config_def import (BOOLEAN, DOUBLE, INT, INT_MAX, LONG, LONG_MAX, STRING, Check,
                          ConfigDef, at_least, between, check, one_of)
from ..errors import InvalidConfigError
from ..format.codecs import codec_id
from ..format.records import LOG_APPEND_TIME, parse_timestamp_type

#: the configs that ask writers for durability (docs/protocol.md §3, "Durability"); a cluster
#: stores them only once the ``flushConfigs`` feature is on (§2.3)
FLUSH_CONFIGS = ("flush.messages", "flush.ms")

# Kafka's message.format.version values (KIP-31/32) -> the magic they write.
_FORMAT_VERSIONS = {"0": 0, "1": 1, "2": 2}


def magic_for_format_version(value: Any) -> int:
    """Map ``message.format.version`` (``0.9.0``, ``0.10.2``, ``2.1``, ``3.0-IV1`` …) to a magic."""
    text = str(value).strip()
    if text in _FORMAT_VERSIONS:
        return _FORMAT_VERSIONS[text]
    parts = text.split("-")[0].split(".")
    try:
        major, minor = int(parts[0]), int(parts[1]) if len(parts) > 1 else 0
    except ValueError:
        raise InvalidConfigError(f"invalid message.format.version {value!r}") from None
    if major == 0 and minor < 10:
        return 0
    if major == 0 and minor < 11:
        return 1
    return 2


@check("[none, gzip, snappy, lz4, zstd, producer]")
def _compression(name: str, value: str, raw: Any) -> None:
    if value.lower() != "producer":
        codec_id(value)


@check("a Kafka version (0.9.0, 0.10.2, 3.0-IV1, ...) or a magic 0, 1, 2")
def _format_version(name: str, value: str, raw: Any) -> None:
    magic_for_format_version(value)


#: Kafka's topic configs (and kafkalog's own ``segment.merge.lag.ms``), with Kafka's names,
#: broker defaults and bounds: the one declaration of each (``LogConfig``'s defaults,
#: ``from_properties``, docs/configuration.md are this table)
TOPIC_CONFIGS = (
    ConfigDef("topic config")
    .define("segment.bytes", INT, 1024 * 1024 * 1024, "the size of a segment file",
            validator=between(14, INT_MAX))
    .define("segment.ms", LONG, 7 * 24 * 3600 * 1000,
            "roll a new segment after this long even if the segment is not full",
            validator=at_least(1))
    .define("segment.index.bytes", INT, 10 * 1024 * 1024,
            "the size of the offset index of a segment", validator=at_least(4))
    .define("index.interval.bytes", INT, 4096,
            "bytes of records between two entries of the offset index", validator=at_least(0))
    .define("retention.ms", LONG, 7 * 24 * 3600 * 1000,
            "delete a segment once its newest record is this old; -1: no time limit",
            validator=at_least(-1))
    .define("retention.bytes", LONG, -1,
            "delete the oldest segments while a partition holds more than this; -1: no limit")
    .define("max.message.bytes", INT, 1048588, "the largest record batch a write may hold",
            validator=at_least(0))
    .define("message.timestamp.type", STRING, "CreateTime",
            "CreateTime (the producer's) or LogAppendTime (the write's commit time)",
            validator=Check(lambda name, value, raw: parse_timestamp_type(value),
                            "[CreateTime, LogAppendTime]"),
            convert=parse_timestamp_type)
    .define("message.format.version", STRING, "3.0-IV1",
            "the record format written (0.9.0: magic 0, 0.10.x: magic 1, later: magic 2)",
            validator=_format_version)
    .define("compression.type", STRING, "producer",
            "the codec of written batches (none, gzip, snappy, lz4, zstd), or producer: the "
            "writer's", validator=_compression)
    .define("cleanup.policy", STRING, "delete",
            "delete: retention deletes old segments; compact: the log cleaner keeps the latest "
            "record per key (both: compact,delete)",
            validator=one_of("delete", "compact", "compact,delete", "delete,compact",
                             case_sensitive=True))
    .define("min.insync.replicas", INT, 1,
            "the in-sync replicas an acks=all write needs", validator=at_least(1))
    .define("file.delete.delay.ms", LONG, 60000,
            "how long a deleted segment's files stay before they are removed",
            validator=at_least(0))
    .define("unclean.leader.election.enable", BOOLEAN, False,
            "elect a leader outside the ISR when no in-sync replica is left (losing records)",
            convert=lambda value: "true" if value else "false")
    .define("flush.messages", LONG, LONG_MAX,
            "a write of this many records to a partition is flushed before its commit",
            validator=between(1, LONG_MAX))
    .define("flush.ms", LONG, LONG_MAX,
            "flush a partition's log dir this long after a write at the latest; 0: every write",
            validator=between(0, LONG_MAX))
    .define("segment.merge.lag.ms", LONG, 60_000,
            "a committed segment is merged with its neighbours only once it is this old "
            "(kafkalog's own)", validator=between(0, LONG_MAX))
    .define("min.cleanable.dirty.ratio", DOUBLE, 0.5,
            "a compacted log is cleaned once this share of its bytes is dirty",
            validator=between(0, 1))
    .define("min.compaction.lag.ms", LONG, 0,
            "a record stays uncompacted for at least this long", validator=between(0, LONG_MAX))
    .define("max.compaction.lag.ms", LONG, LONG_MAX,
            "a record is compacted within this long, whatever the dirty ratio",
            validator=between(1, LONG_MAX))
    .define("delete.retention.ms", LONG, 86_400_000,
            "how long a tombstone stays after its first clean", validator=between(0, LONG_MAX)))
_DEFAULTS = TOPIC_CONFIGS.defaults(by_attr=True)


@dataclass(frozen=True)
class LogConfig:
    """Defaults are Kafka's broker defaults, from :data:`TOPIC_CONFIGS`."""

    segment_bytes: int = _DEFAULTS["segment_bytes"]
    segment_ms: int = _DEFAULTS["segment_ms"]
    segment_index_bytes: int = _DEFAULTS["segment_index_bytes"]
    index_interval_bytes: int = _DEFAULTS["index_interval_bytes"]
    retention_ms: int = _DEFAULTS["retention_ms"]
    retention_bytes: int = _DEFAULTS["retention_bytes"]
    max_message_bytes: int = _DEFAULTS["max_message_bytes"]
    message_timestamp_type: int = _DEFAULTS["message_timestamp_type"]
    message_format_version: str = _DEFAULTS["message_format_version"]
    compression_type: str = _DEFAULTS["compression_type"]
    cleanup_policy: str = _DEFAULTS["cleanup_policy"]
    min_insync_replicas: int = _DEFAULTS["min_insync_replicas"]
    file_delete_delay_ms: int = _DEFAULTS["file_delete_delay_ms"]
    #: "true" or "false" (see :attr:`unclean_leader_election`)
    unclean_leader_election_enable: str = _DEFAULTS["unclean_leader_election_enable"]
    flush_messages: int = _DEFAULTS["flush_messages"]
    flush_ms: int = _DEFAULTS["flush_ms"]
    #: kafkalog's own, named after Kafka's min.compaction.lag.ms: a committed segment is merged
    #: with its neighbours only once it is this old (its .log's age on the storage's clock).
    #: A minute: a streaming query reads the newest segments within a trigger or two, so the
    #: head it tails stays as it was written, and the unmerged head is a minute of commits
    #: (docs/protocol.md §4.1)
    segment_merge_lag_ms: int = _DEFAULTS["segment_merge_lag_ms"]
    min_cleanable_dirty_ratio: float = _DEFAULTS["min_cleanable_dirty_ratio"]
    min_compaction_lag_ms: int = _DEFAULTS["min_compaction_lag_ms"]
    max_compaction_lag_ms: int = _DEFAULTS["max_compaction_lag_ms"]
    delete_retention_ms: int = _DEFAULTS["delete_retention_ms"]

    @property
    def compact(self) -> bool:
        """Whether the log is compacted (``cleanup.policy`` ``compact`` or ``compact,delete``):
        its records must have keys, and the log cleaner keeps the latest record per key."""
        return "compact" in self.cleanup_policy.split(",")

    @property
    def unclean_leader_election(self) -> bool:
        return self.unclean_leader_election_enable == "true"

    def flushes(self, records: int) -> bool:
        """Whether a write of ``records`` records to one partition of this topic must be durable
        before its commit (docs/protocol.md §3, "Durability"). Kafka forces a flush once
        ``flush.messages`` records are unflushed; here each write's segment files are its own,
        so the count is the write's. ``flush.ms`` = 0 leaves no record unflushed for any time.
        A larger ``flush.ms`` is the coordinator's scheduled flush (``maintenance/flush.py``), as
        it is Kafka's log flusher."""
        return records >= self.flush_messages or self.flush_ms == 0

    @property
    def magic(self) -> int:
        return magic_for_format_version(self.message_format_version)

    @property
    def max_index_entries(self) -> int:
        return self.segment_index_bytes // 8

    @classmethod
    def from_properties(cls, props: Mapping[str, Any] | None = None) -> "LogConfig":
        """Validate Kafka-named properties against :data:`TOPIC_CONFIGS`; unknown names and bad
        values raise InvalidConfigError."""
        return cls(**TOPIC_CONFIGS.parse(props, by_attr=True))

    def to_properties(self) -> dict:
        out = {}
        for key in TOPIC_CONFIGS.keys.values():
            value = getattr(self, key.attr)
            if key.attr == "message_timestamp_type":
                value = "LogAppendTime" if value == LOG_APPEND_TIME else "CreateTime"
            out[key.name] = str(value)
        return out


# every config is a field and every field a config
assert [f.name for f in fields(LogConfig)] == TOPIC_CONFIGS.attrs()
