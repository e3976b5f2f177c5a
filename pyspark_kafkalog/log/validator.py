"""What a broker checks and stamps on every append, before a byte is written (Kafka's
``LogValidator``): each batch within the topic's ``max.message.bytes`` and, in a compacted topic,
a key on every record; then its offsets and leader epoch assigned and, for a ``LogAppendTime``
topic, the append time stamped.

One home for both writers: the local log's ``append`` and the cluster producer (which writes
whole segments to shared storage). They differ in one rule only, and on purpose: a batch larger
than ``segment.bytes`` is refused by the local log, as by Kafka's, while the shared-storage
writer gives it a segment of its own (``segment_writer.plan_segments``).
"""
from __future__ import annotations

from typing import Iterable, Optional, Sequence

from ..errors import InvalidRecordError
from ..format.columnar import decode_columns
from ..format.encode import (EncodedBatch, assign_log_append_time, assign_offsets,
                             check_batch_size)
from ..format.records import LOG_APPEND_TIME
from .config import LogConfig


def check_sizes(batches: Iterable[EncodedBatch], config: LogConfig, where: str) -> None:
    """Every batch within ``max.message.bytes``; all are checked before any is written."""
    for batch in batches:
        check_batch_size(batch, config.max_message_bytes, where)


def check_append(batches: Sequence[EncodedBatch], config: LogConfig, where: str) -> None:
    """All of an append's checks, before anything is written: sizes, then keys."""
    check_sizes(batches, config, where)
    check_keys(batches, config, where)


def check_keys(batches: Iterable[EncodedBatch], config: LogConfig, where: str) -> None:
    """A compacted topic refuses a record without a key, as Kafka's broker does
    (``LogValidator.validateKey``): the cleaner keeps the latest record per key, and a keyless
    one has none. Control batches carry no data and are not checked. Decoding the batches again
    costs, so only compacted topics pay it."""
    if not config.compact:
        return
    for batch in batches:
        cols = decode_columns(batch.data, validate=False, with_headers=False, skip_control=True)
        if 0 in cols.key_valid:
            raise InvalidRecordError("Compacted topic cannot accept message without key in "
                                     f"topic partition {where}.")


def append_time(config: LogConfig, now_ms: int) -> Optional[int]:
    """The time a ``LogAppendTime`` topic stamps on this append; None for ``CreateTime``."""
    return now_ms if config.message_timestamp_type == LOG_APPEND_TIME else None


def stamp(batch: EncodedBatch, base_offset: int, leader_epoch: Optional[int],
          config: LogConfig, now_ms: int, *, in_place: bool = False) -> EncodedBatch:
    """The batch as the log stores it: at ``base_offset``, with the leader epoch and, for a
    ``LogAppendTime`` topic, the append time."""
    batch = assign_offsets(batch, base_offset, leader_epoch, in_place=in_place)
    if config.message_timestamp_type == LOG_APPEND_TIME:
        batch = assign_log_append_time(batch, now_ms)
    return batch
