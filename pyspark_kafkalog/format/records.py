"""The value types shared by every message format, and the record-batch attribute bits.

A record handed to an encoder is a :class:`Record`; what a decoder hands back is columns (see
``columnar``), or :class:`DecodedRecord` rows for tools and tests that want one object per record.
"""
from __future__ import annotations

from typing import NamedTuple, Optional, Sequence, Tuple

# timestamp types (``timestampType`` in Spark's Kafka schema and in kafka-dump-log)
NO_TIMESTAMP_TYPE = -1
CREATE_TIME = 0
LOG_APPEND_TIME = 1
NO_TIMESTAMP = -1

MAGIC_V0, MAGIC_V1, MAGIC_V2 = 0, 1, 2

# v2 attribute bits (int16). Bits 0-2 are the codec in every magic; bit 3 the timestamp type
# from magic 1 on; the rest exist only in magic 2.
COMPRESSION_MASK = 0x07
TIMESTAMP_TYPE_BIT = 0x08
TRANSACTIONAL_BIT = 0x10
CONTROL_BIT = 0x20
DELETE_HORIZON_BIT = 0x40

# control record types (the int16 after the version in a control record's key)
CONTROL_ABORT = 0
CONTROL_COMMIT = 1

Header = Tuple[str, Optional[bytes]]


def timestamp_type_name(ts_type: int) -> str:
    return {NO_TIMESTAMP_TYPE: "NoTimestampType", CREATE_TIME: "CreateTime",
            LOG_APPEND_TIME: "LogAppendTime"}[ts_type]


def parse_timestamp_type(value) -> int:
    """Accept Kafka's names (``CreateTime``/``LogAppendTime``) or 0/1."""
    from ..errors import InvalidConfigError
    if isinstance(value, int) and value in (CREATE_TIME, LOG_APPEND_TIME):
        return value
    name = str(value).strip().lower()
    if name in ("createtime", "create_time", "0"):
        return CREATE_TIME
    if name in ("logappendtime", "log_append_time", "1"):
        return LOG_APPEND_TIME
    raise InvalidConfigError(f"invalid timestamp type {value!r}: expected CreateTime or LogAppendTime")


class Record(NamedTuple):
    """One record to encode. ``timestamp`` -1 means none (the only choice for magic 0)."""

    key: Optional[bytes]
    value: Optional[bytes]
    timestamp: int = NO_TIMESTAMP
    headers: Sequence[Header] = ()


class DecodedRecord(NamedTuple):
    """One decoded record with the fields of its batch (for tools and tests, not the hot path)."""

    offset: int
    timestamp: int
    timestamp_type: int
    key: Optional[bytes]
    value: Optional[bytes]
    headers: Tuple[Header, ...]
    magic: int
    is_control: bool
    is_transactional: bool
    producer_id: int
    producer_epoch: int
    partition_leader_epoch: int
    batch_position: int
