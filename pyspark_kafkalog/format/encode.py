"""Encoders for magic 2 record batches and magic 0/1 message sets, as Kafka's producer writes them.

Every encoder returns an :class:`EncodedBatch`: the bytes plus the facts an appender needs (offset
span, max timestamp and its offset), so appending never has to parse what was just encoded.
Offsets are assigned later by :func:`assign_offsets`, which rewrites header fields only (KIP-31):
for magic 2 they lie outside the CRC, for magic 1 wrappers the wrapper offset is outside it.
"""
from __future__ import annotations

import struct
from typing import NamedTuple, Sequence

from ..errors import InvalidRecordError, RecordTooLargeError
from . import codecs
from .batch import LOG_OVERHEAD, V2_CRC_START, V2_HEADER, V2_HEADER_SIZE, iter_headers
from .crc import crc32, crc32c
from .records import (CONTROL_BIT, CREATE_TIME, DELETE_HORIZON_BIT, LOG_APPEND_TIME, MAGIC_V0,
                      MAGIC_V1, MAGIC_V2, NO_TIMESTAMP, TIMESTAMP_TYPE_BIT, TRANSACTIONAL_BIT,
                      Record)
from .varint import encode_varint, wrap_int64

_I64 = struct.Struct(">q")
_I32 = struct.Struct(">i")


class EncodedBatch(NamedTuple):
    data: bytes
    magic: int
    base_offset: int
    last_offset: int
    max_timestamp: int
    record_count: int
    compression: int


def _encode_v2_record(offset_delta: int, timestamp_delta: int, key, value, headers) -> bytes:
    parts = [b"\x00", encode_varint(timestamp_delta), encode_varint(offset_delta)]
    if key is None:
        parts.append(b"\x01")
    else:
        parts.append(encode_varint(len(key)))
        parts.append(bytes(key))
    if value is None:
        parts.append(b"\x01")
    else:
        parts.append(encode_varint(len(value)))
        parts.append(bytes(value))
    parts.append(encode_varint(len(headers)))
    for hkey, hvalue in headers:
        if hkey is None:
            raise InvalidRecordError("a record header key must not be null")
        kb = hkey.encode("utf-8") if isinstance(hkey, str) else bytes(hkey)
        parts.append(encode_varint(len(kb)))
        parts.append(kb)
        if hvalue is None:
            parts.append(b"\x01")
        else:
            parts.append(encode_varint(len(hvalue)))
            parts.append(bytes(hvalue))
    body = b"".join(parts)
    return encode_varint(len(body)) + body


def encode_batch_v2(records: Sequence[Record], *, base_offset: int = 0, compression: int = 0,
                    timestamp_type: int = CREATE_TIME, log_append_time: int | None = None,
                    producer_id: int = -1, producer_epoch: int = -1, base_sequence: int = -1,
                    partition_leader_epoch: int = -1, transactional: bool = False,
                    control: bool = False, offset_deltas: Sequence[int] | None = None,
                    delete_horizon_ms: int | None = None) -> EncodedBatch:
    """One magic 2 batch, field for field as ``MemoryRecordsBuilder`` writes it."""
    if not records:
        raise InvalidRecordError("a record batch needs at least one record")
    codecs.check_codec(compression, MAGIC_V2)
    if offset_deltas is None:
        offset_deltas = range(len(records))
    elif len(offset_deltas) != len(records) or any(
            b <= a for a, b in zip(offset_deltas, offset_deltas[1:])) or offset_deltas[0] < 0:
        raise InvalidRecordError("offset deltas must be non-negative and strictly increasing")
    base_ts = delete_horizon_ms if delete_horizon_ms is not None else records[0].timestamp
    max_ts, max_delta = NO_TIMESTAMP, offset_deltas[0]
    body = []
    for rec, delta in zip(records, offset_deltas):
        if rec.timestamp > max_ts:
            max_ts, max_delta = rec.timestamp, delta
        body.append(_encode_v2_record(delta, wrap_int64(rec.timestamp - base_ts), rec.key,
                                      rec.value, rec.headers))
    payload = b"".join(body)
    if compression:
        payload = codecs.compress(compression, payload, MAGIC_V2)
    if timestamp_type == LOG_APPEND_TIME:
        if log_append_time is None:
            raise InvalidRecordError("LogAppendTime needs the log append time")
        max_ts = log_append_time
    attrs = compression
    if timestamp_type == LOG_APPEND_TIME:
        attrs |= TIMESTAMP_TYPE_BIT
    if transactional:
        attrs |= TRANSACTIONAL_BIT
    if control:
        attrs |= CONTROL_BIT
    if delete_horizon_ms is not None:
        attrs |= DELETE_HORIZON_BIT
    last_delta = offset_deltas[-1]
    buf = bytearray(V2_HEADER_SIZE + len(payload))
    V2_HEADER.pack_into(buf, 0, base_offset, len(buf) - LOG_OVERHEAD, partition_leader_epoch,
                        MAGIC_V2, 0, attrs, last_delta, base_ts, max_ts, producer_id,
                        producer_epoch, base_sequence, len(records))
    buf[V2_HEADER_SIZE:] = payload
    struct.pack_into(">I", buf, 17, crc32c(memoryview(buf)[V2_CRC_START:]))
    return EncodedBatch(bytes(buf), MAGIC_V2, base_offset, base_offset + last_delta, max_ts,
                        len(records), compression)


def encode_control_batch(control_type: int, *, producer_id: int, producer_epoch: int,
                         timestamp: int, coordinator_epoch: int = 0, base_offset: int = 0,
                         partition_leader_epoch: int = -1) -> EncodedBatch:
    """A transaction marker (COMMIT=1 / ABORT=0): key = version + type, value = version + epoch."""
    key = struct.pack(">hh", 0, control_type)
    value = struct.pack(">hi", 0, coordinator_epoch)
    return encode_batch_v2([Record(key, value, timestamp)], base_offset=base_offset,
                           producer_id=producer_id, producer_epoch=producer_epoch,
                           partition_leader_epoch=partition_leader_epoch, transactional=True,
                           control=True)


def encode_empty_batch_v2(base_offset: int, last_offset: int, *, timestamp: int = NO_TIMESTAMP,
                          timestamp_type: int = CREATE_TIME,
                          partition_leader_epoch: int = -1) -> EncodedBatch:
    """A batch header with no records that spans ``[base_offset, last_offset]``: Kafka's
    ``DefaultRecordBatch.writeEmptyHeader``, as its log cleaner leaves where every record of a
    batch was removed. Consumers skip it and move on past ``last_offset``, so it marks offsets
    that hold no data without a gap that a reader would take for deleted data (the cluster's
    repair uses it, docs/protocol.md §7)."""
    if not 0 <= last_offset - base_offset <= 0x7FFFFFFF:
        raise InvalidRecordError(f"an empty batch cannot span offsets {base_offset}..{last_offset}")
    attrs = TIMESTAMP_TYPE_BIT if timestamp_type == LOG_APPEND_TIME else 0
    buf = bytearray(V2_HEADER_SIZE)
    V2_HEADER.pack_into(buf, 0, base_offset, V2_HEADER_SIZE - LOG_OVERHEAD, partition_leader_epoch,
                        MAGIC_V2, 0, attrs, last_offset - base_offset, NO_TIMESTAMP, timestamp,
                        -1, -1, -1, 0)
    struct.pack_into(">I", buf, 17, crc32c(memoryview(buf)[V2_CRC_START:]))
    return EncodedBatch(bytes(buf), MAGIC_V2, base_offset, last_offset, timestamp, 0, 0)


def _legacy_message(offset: int, magic: int, attrs: int, timestamp: int, key, value) -> bytes:
    klen = -1 if key is None else len(key)
    vlen = -1 if value is None else len(value)
    parts = [_I32.pack(klen)]
    if key is not None:
        parts.append(bytes(key))
    parts.append(_I32.pack(vlen))
    if value is not None:
        parts.append(bytes(value))
    tail = b"".join(parts)
    if magic == MAGIC_V0:
        head = struct.pack(">bb", magic, attrs)
    else:
        head = struct.pack(">bbq", magic, attrs, timestamp)
    body = head + tail
    return _I64.pack(offset) + _I32.pack(4 + len(body)) + struct.pack(">I", crc32(body)) + body


def encode_message_set(records: Sequence[Record], *, magic: int, base_offset: int = 0,
                       compression: int = 0, timestamp_type: int = CREATE_TIME,
                       log_append_time: int | None = None,
                       offsets: Sequence[int] | None = None) -> EncodedBatch:
    """Magic 0/1 messages as Kafka's legacy ``MemoryRecordsBuilder`` writes them.

    ``offsets``: each record's absolute offset (strictly increasing; ``base_offset`` is then
    ignored), for a set with gaps, as the log cleaner rewrites a wrapper with its surviving
    messages at their own offsets; by default ``base_offset + i``.

    Uncompressed: one message per record, absolute offsets. Compressed: one wrapper whose offset is
    the absolute offset of its last inner message; inner offsets are relative (0..n-1) for magic 1
    and absolute for magic 0. With LogAppendTime every timestamp written is the append time.
    """
    if magic not in (MAGIC_V0, MAGIC_V1):
        raise InvalidRecordError(f"encode_message_set writes magic 0 or 1, not {magic}")
    if not records:
        raise InvalidRecordError("a message set needs at least one record")
    codecs.check_codec(compression, magic)
    if magic == MAGIC_V0:
        timestamp_type = CREATE_TIME
    if timestamp_type == LOG_APPEND_TIME and log_append_time is None:
        raise InvalidRecordError("LogAppendTime needs the log append time")
    ts_attr = TIMESTAMP_TYPE_BIT if (magic == MAGIC_V1 and timestamp_type == LOG_APPEND_TIME) else 0
    if offsets is None:
        offsets = range(base_offset, base_offset + len(records))
    elif len(offsets) != len(records) or any(b <= a for a, b in zip(offsets, offsets[1:])):
        raise InvalidRecordError("offsets must be one per record and strictly increasing")
    else:
        base_offset = offsets[0]
    max_ts = NO_TIMESTAMP
    messages = []
    for rec, offset in zip(records, offsets):
        ts = NO_TIMESTAMP if magic == MAGIC_V0 else (
            log_append_time if timestamp_type == LOG_APPEND_TIME else rec.timestamp)
        max_ts = max(max_ts, ts)
        # magic 1 wrappers hold offsets relative to the first (Kafka's toInnerOffset)
        inner_offset = offset - base_offset if (compression and magic == MAGIC_V1) else offset
        messages.append(_legacy_message(inner_offset, magic, ts_attr, ts, rec.key, rec.value))
    last_offset = offsets[-1]
    if not compression:
        return EncodedBatch(b"".join(messages), magic, base_offset, last_offset, max_ts,
                            len(records), 0)
    inner = codecs.compress(compression, b"".join(messages), magic)
    wrapper = _legacy_message(last_offset, magic, compression | ts_attr, max_ts, None, inner)
    return EncodedBatch(wrapper, magic, base_offset, last_offset, max_ts, len(records),
                        compression)


def encode_records(records: Sequence[Record], *, magic: int = MAGIC_V2, **kwargs) -> EncodedBatch:
    if magic == MAGIC_V2:
        return encode_batch_v2(records, **kwargs)
    if magic in (MAGIC_V0, MAGIC_V1):
        allowed = {"base_offset", "compression", "timestamp_type", "log_append_time"}
        extra = set(kwargs) - allowed
        if extra:
            raise InvalidRecordError(f"magic {magic} has no {sorted(extra)}")
        return encode_message_set(records, magic=magic, **kwargs)
    raise InvalidRecordError(f"unknown message format version (magic) {magic}")


def assign_offsets(batch: EncodedBatch, base_offset: int,
                   partition_leader_epoch: int | None = None, *,
                   in_place: bool = False) -> EncodedBatch:
    """Move an encoded batch to ``base_offset``, rewriting only what lies outside the CRCs.

    ``partition_leader_epoch`` (magic 2 only) is stamped when given and kept otherwise. Magic 0
    compressed wrappers store absolute inner offsets, so they alone must be re-encoded (Kafka
    recompresses them on append too). With ``in_place``, a magic 2 batch whose ``data`` is
    writable (a ``bytearray`` or a writable ``memoryview``) is patched where it is instead of
    copied: only for a caller that owns it.
    """
    shift = base_offset - batch.base_offset
    if shift == 0 and (batch.magic < MAGIC_V2 or partition_leader_epoch is None):
        return batch
    if batch.magic == MAGIC_V2 and in_place and (
            isinstance(batch.data, bytearray)
            or (isinstance(batch.data, memoryview) and not batch.data.readonly)):
        _I64.pack_into(batch.data, 0, base_offset)
        if partition_leader_epoch is not None:
            _I32.pack_into(batch.data, 12, partition_leader_epoch)
        return batch._replace(base_offset=base_offset, last_offset=batch.last_offset + shift)
    if batch.magic == MAGIC_V2:   # one copy: the new fields around views of the old bytes
        view = memoryview(batch.data)
        epoch = view[12:16] if partition_leader_epoch is None else _I32.pack(partition_leader_epoch)
        data = b"".join((_I64.pack(base_offset), view[8:12], epoch, view[16:]))
        return batch._replace(data=data, base_offset=base_offset,
                              last_offset=batch.last_offset + shift)
    if batch.compression and batch.magic == MAGIC_V0:
        from .columnar import decode_records
        recs = [Record(r.key, r.value) for r in decode_records(batch.data)]
        return encode_message_set(recs, magic=MAGIC_V0, base_offset=base_offset,
                                  compression=batch.compression)
    data = bytearray(batch.data)
    for header in iter_headers(batch.data):
        _I64.pack_into(data, header.position, header.last_offset + shift)
    return batch._replace(data=bytes(data), base_offset=base_offset,
                          last_offset=batch.last_offset + shift)


def assign_log_append_time(batch: EncodedBatch, now_ms: int) -> EncodedBatch:
    """Stamp LogAppendTime on an encoded batch as a broker does, without recompressing.

    Magic 2: set the timestamp-type bit and max timestamp and recompute the CRC. Magic 1: the same
    on each (wrapper) message. Magic 0 has no timestamps.
    """
    if batch.magic == MAGIC_V0:
        return batch
    data = bytearray(batch.data)
    if batch.magic == MAGIC_V2:
        attrs = struct.unpack_from(">h", data, 21)[0] | TIMESTAMP_TYPE_BIT
        struct.pack_into(">h", data, 21, attrs)
        _I64.pack_into(data, 35, now_ms)
        struct.pack_into(">I", data, 17, crc32c(memoryview(data)[V2_CRC_START:]))
    else:
        for h in iter_headers(batch.data):
            p = h.position
            struct.pack_into(">bq", data, p + 17, h.attributes | TIMESTAMP_TYPE_BIT, now_ms)
            struct.pack_into(">I", data, p + 12, crc32(memoryview(data)[p + 16:h.end]))
    return batch._replace(data=bytes(data), max_timestamp=now_ms)


def check_batch_size(batch: EncodedBatch, max_message_bytes: int, where: str) -> None:
    """Kafka's broker check on append (``UnifiedLog.analyzeAndValidateRecords``): each entry as
    stored, that is after compression, must fit the topic's ``max.message.bytes``, else
    ``RecordTooLargeError`` (error code 10) and nothing of the append is written. The one place
    of this rule: the raw log, the cluster producer and the Spark sink's accumulators call it.

    An entry is a batch for magic 2 or a compressed wrapper, but one message for uncompressed
    magic 0/1, so a message set is checked message by message (only when the whole set is too
    big: the usual case costs one ``len``). ``where``: the partition, as ``topic-partition``."""
    size = len(batch.data)
    if size <= max_message_bytes:
        return
    if batch.magic < MAGIC_V2 and not batch.compression:
        size = max(h.size for h in iter_headers(batch.data))
        if size <= max_message_bytes:
            return
    raise RecordTooLargeError(
        f"the record batch size in the append to {where} is {size} bytes, which exceeds the "
        f"topic's max.message.bytes ({max_message_bytes})")
