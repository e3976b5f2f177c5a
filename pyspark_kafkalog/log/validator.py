"""What a broker checks and stamps on every append, before a byte is written (Kafka's
``LogValidator``): each batch within the topic's ``max.message.bytes``, then its offsets and
leader epoch assigned and, for a ``LogAppendTime`` topic, the append time stamped.

One home for both writers: the local log's ``append`` and the cluster producer (which writes
whole segments to shared storage). They differ in one rule only, and on purpose: a batch larger
than ``segment.bytes`` is refused by the local log, as by Kafka's, while the shared-storage
writer gives it a segment of its own (``segment_writer.plan_segments``).
"""
from __future__ import annotations

from typing import Iterable, Optional

from ..format.encode import (EncodedBatch, assign_log_append_time, assign_offsets,
                             check_batch_size)
from ..format.records import LOG_APPEND_TIME
from .config import LogConfig


def check_sizes(batches: Iterable[EncodedBatch], config: LogConfig, where: str) -> None:
    """Every batch within ``max.message.bytes``; all are checked before any is written."""
    for batch in batches:
        check_batch_size(batch, config.max_message_bytes, where)


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
