"""Per-topic log configuration, under Kafka's own config names and with its validation."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from ..errors import InvalidConfigError
from ..format.codecs import codec_id
from ..format.records import CREATE_TIME, LOG_APPEND_TIME, parse_timestamp_type

_INT_MAX = 2**31 - 1
_LONG_MAX = 2**63 - 1

# Kafka name -> (attribute, parser, minimum or None)
_KEYS = {
    "segment.bytes": ("segment_bytes", int, 14),
    "segment.ms": ("segment_ms", int, 1),
    "segment.index.bytes": ("segment_index_bytes", int, 4),
    "index.interval.bytes": ("index_interval_bytes", int, 0),
    "retention.ms": ("retention_ms", int, -1),
    "retention.bytes": ("retention_bytes", int, None),
    "max.message.bytes": ("max_message_bytes", int, 0),
    "message.timestamp.type": ("message_timestamp_type", parse_timestamp_type, None),
    "message.format.version": ("message_format_version", None, None),
    "compression.type": ("compression_type", None, None),
    "cleanup.policy": ("cleanup_policy", None, None),
    "min.insync.replicas": ("min_insync_replicas", int, 1),
    "file.delete.delay.ms": ("file_delete_delay_ms", int, 0),
    "unclean.leader.election.enable": ("unclean_leader_election_enable", None, None),
    "flush.messages": ("flush_messages", int, 1),
    "flush.ms": ("flush_ms", int, 0),
    "segment.merge.lag.ms": ("segment_merge_lag_ms", int, 0),
}
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


@dataclass(frozen=True)
class LogConfig:
    """Defaults are Kafka's broker defaults."""

    segment_bytes: int = 1024 * 1024 * 1024
    segment_ms: int = 7 * 24 * 3600 * 1000
    segment_index_bytes: int = 10 * 1024 * 1024
    index_interval_bytes: int = 4096
    retention_ms: int = 7 * 24 * 3600 * 1000
    retention_bytes: int = -1
    max_message_bytes: int = 1048588
    message_timestamp_type: int = CREATE_TIME
    message_format_version: str = "3.0-IV1"
    compression_type: str = "producer"
    cleanup_policy: str = "delete"
    min_insync_replicas: int = 1
    file_delete_delay_ms: int = 60000
    unclean_leader_election_enable: str = "false"
    flush_messages: int = _LONG_MAX
    flush_ms: int = _LONG_MAX
    #: kafkalog's own, named after Kafka's min.compaction.lag.ms: a committed segment is merged
    #: with its neighbours only once it is this old (its .log's age on the storage's clock).
    #: A minute: a streaming query reads the newest segments within a trigger or two, so the
    #: head it tails stays as it was written, and the unmerged head is a minute of commits
    #: (docs/protocol.md §4.1)
    segment_merge_lag_ms: int = 60_000

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
        """Validate Kafka-named properties; unknown names and bad values raise InvalidConfigError."""
        values = {}
        for name, raw in (props or {}).items():
            if name not in _KEYS:
                raise InvalidConfigError(f"unknown topic config {name!r}; known: {sorted(_KEYS)}")
            attr, parse, minimum = _KEYS[name]
            try:
                value = parse(raw) if parse else str(raw)
            except (TypeError, ValueError):
                raise InvalidConfigError(f"invalid value {raw!r} for {name}") from None
            if minimum is not None and value < minimum:
                raise InvalidConfigError(f"invalid value {raw!r} for {name}: must be >= {minimum}")
            if name in FLUSH_CONFIGS + ("segment.merge.lag.ms",) and value > _LONG_MAX:
                raise InvalidConfigError(f"invalid value {raw!r} for {name}: must be <= {_LONG_MAX}")
            if name == "segment.bytes" and value > _INT_MAX:
                raise InvalidConfigError(f"invalid value {raw!r} for {name}: must be <= {_INT_MAX}")
            if name == "compression.type" and value.lower() != "producer":
                codec_id(value)
            if name == "message.format.version":
                magic_for_format_version(value)
            if name == "cleanup.policy" and value not in ("delete", "compact", "compact,delete",
                                                           "delete,compact"):
                raise InvalidConfigError(f"invalid value {raw!r} for cleanup.policy")
            if name == "unclean.leader.election.enable":
                if value.strip().lower() not in ("true", "false"):   # Kafka's BOOLEAN
                    raise InvalidConfigError(f"invalid value {raw!r} for {name}: true or false")
                value = value.strip().lower()
            values[attr] = value
        return cls(**values)

    def to_properties(self) -> dict:
        out = {}
        for name, (attr, _, _) in _KEYS.items():
            value = getattr(self, attr)
            if attr == "message_timestamp_type":
                value = "LogAppendTime" if value == LOG_APPEND_TIME else "CreateTime"
            out[name] = str(value)
        return out


