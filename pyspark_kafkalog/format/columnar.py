"""Decode runs of batches of any magic straight into columns.

This is the read hot path of the Spark source: records never become Python objects. Each batch
appends to flat column containers (``array`` of ints, lists of byte strings), and batch-level
fields are kept once per batch and expanded with ``numpy.repeat`` only when Arrow arrays are built.
:func:`decode_records` gives a row view over the same decoder for tools and tests, so there is one
decoding implementation, not two.
"""
from __future__ import annotations

import struct
from array import array
from typing import List, Optional

from ..errors import CorruptRecordError
from . import codecs
from .batch import (LOG_OVERHEAD, RECORD_OVERHEAD_V0, V2_HEADER_SIZE, BatchHeader,
                    iter_headers, validate as validate_batch)
from .records import (COMPRESSION_MASK, CREATE_TIME, LOG_APPEND_TIME, MAGIC_V1, MAGIC_V2,
                      NO_TIMESTAMP, NO_TIMESTAMP_TYPE, TIMESTAMP_TYPE_BIT, DecodedRecord)
from .varint import decode_varint, wrap_int64

_LEGACY = struct.Struct(">qiIbb")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")


class Columns:
    """Flat, append-only columns of decoded records plus one row per decoded batch."""

    __slots__ = ("offset", "timestamp", "timestamp_type", "key", "value", "header_count",
                 "header_key", "header_value", "batches", "batch_counts")

    def __init__(self):
        self.offset = array("q")
        self.timestamp = array("q")
        self.timestamp_type = array("b")
        self.key: List[Optional[bytes]] = []
        self.value: List[Optional[bytes]] = []
        self.header_count = array("i")
        self.header_key: List[str] = []
        self.header_value: List[Optional[bytes]] = []
        #: (magic, is_control, is_transactional, producer_id, producer_epoch, leader_epoch, position)
        self.batches: list = []
        self.batch_counts = array("q")

    def __len__(self) -> int:
        return len(self.offset)

    def _truncate(self, n: int, nh: int) -> None:
        del self.offset[n:], self.timestamp[n:], self.timestamp_type[n:], self.key[n:]
        del self.value[n:], self.header_count[n:], self.header_key[nh:], self.header_value[nh:]

    def _keep(self, start: int, first: int, stop: int) -> None:
        """Drop the rows of the current batch (which began at ``start``) outside [first, stop)."""
        if first == start and stop == len(self.offset):
            return
        hc = self.header_count
        h0 = len(self.header_key) - sum(hc[start:])
        hf = h0 + sum(hc[start:first])
        hs = hf + sum(hc[first:stop])
        for col in (self.offset, self.timestamp, self.timestamp_type, self.key, self.value,
                    self.header_count):
            col[start:] = col[first:stop]
        self.header_key[h0:] = self.header_key[hf:hs]
        self.header_value[h0:] = self.header_value[hf:hs]


def _scan_v2(blob: bytes, count: int, base_offset: int, base_ts: int, ts_type: int,
             max_ts: int, cols: Columns, with_headers: bool) -> None:
    """Parse ``count`` magic-2 records from a (decompressed) blob into ``cols``.

    Varints are decoded inline with a one-byte fast path: function calls per field would cost
    more than the parsing itself.
    """
    offsets, timestamps, keys, values = cols.offset, cols.timestamp, cols.key, cols.value
    ts_types = cols.timestamp_type
    hcounts, hkeys, hvals = cols.header_count, cols.header_key, cols.header_value
    log_append = ts_type == LOG_APPEND_TIME
    end = len(blob)
    pos = 0
    try:
        for _ in range(count):
            b = blob[pos]
            if b < 0x80:
                length = (b >> 1) ^ -(b & 1)
                pos += 1
            else:
                length, pos = decode_varint(blob, pos)
            rec_end = pos + length
            if length < 6 or rec_end > end:
                raise CorruptRecordError(f"record length {length} does not fit its batch")
            pos += 1  # record attributes: unused by every Kafka version so far
            b = blob[pos]
            if b < 0x80:
                ts_delta = (b >> 1) ^ -(b & 1)
                pos += 1
            else:
                ts_delta, pos = decode_varint(blob, pos, rec_end)
            b = blob[pos]
            if b < 0x80:
                off_delta = (b >> 1) ^ -(b & 1)
                pos += 1
            else:
                off_delta, pos = decode_varint(blob, pos, rec_end)
            b = blob[pos]
            if b < 0x80:
                klen = (b >> 1) ^ -(b & 1)
                pos += 1
            else:
                klen, pos = decode_varint(blob, pos, rec_end)
            if klen < 0:
                keys.append(None)
            else:
                keys.append(blob[pos:pos + klen])
                pos += klen
            b = blob[pos]
            if b < 0x80:
                vlen = (b >> 1) ^ -(b & 1)
                pos += 1
            else:
                vlen, pos = decode_varint(blob, pos, rec_end)
            if vlen < 0:
                values.append(None)
            else:
                values.append(blob[pos:pos + vlen])
                pos += vlen
            b = blob[pos]
            if b < 0x80:
                nh = (b >> 1) ^ -(b & 1)
                pos += 1
            else:
                nh, pos = decode_varint(blob, pos, rec_end)
            if nh < 0:
                raise CorruptRecordError(f"negative header count {nh}")
            for _h in range(nh):
                hk_len, pos = decode_varint(blob, pos, rec_end)
                if hk_len < 0:
                    raise CorruptRecordError("null header key")
                hk = blob[pos:pos + hk_len]
                pos += hk_len
                hv_len, pos = decode_varint(blob, pos, rec_end)
                if hv_len < 0:
                    hv = None
                else:
                    hv = blob[pos:pos + hv_len]
                    pos += hv_len
                if with_headers:
                    hkeys.append(hk.decode("utf-8"))
                    hvals.append(hv)
            if pos != rec_end or klen > length or vlen > length:
                raise CorruptRecordError("record fields do not add up to its declared length")
            hcounts.append(nh if with_headers else 0)
            offsets.append(base_offset + off_delta)
            try:
                timestamps.append(max_ts if log_append else base_ts + ts_delta)
            except OverflowError:   # Java's long arithmetic wraps; so does the format
                timestamps.append(wrap_int64(base_ts + ts_delta))
            ts_types.append(ts_type)
    except IndexError:
        raise CorruptRecordError("record runs past the end of its batch") from None
    except UnicodeDecodeError:
        raise CorruptRecordError("record header key is not valid UTF-8") from None
    if pos != end:
        raise CorruptRecordError(
            f"batch declares {count} records but {end - pos} bytes remain after them")


def _legacy_messages(buf, start: int, end: int):
    """Yield ``(offset, magic, attributes, timestamp, key, value)`` of magic 0/1 messages."""
    pos = start
    while pos < end:
        if pos + LOG_OVERHEAD + RECORD_OVERHEAD_V0 > end:
            raise CorruptRecordError("truncated message inside a compressed wrapper")
        offset, size, _crc, magic, attrs = _LEGACY.unpack_from(buf, pos)
        msg_end = pos + LOG_OVERHEAD + size
        if size < RECORD_OVERHEAD_V0 or msg_end > end or magic not in (0, 1):
            raise CorruptRecordError(f"malformed message at inner position {pos}")
        p = pos + 18
        ts = NO_TIMESTAMP
        if magic == MAGIC_V1:
            ts = _I64.unpack_from(buf, p)[0]
            p += 8
        klen = _I32.unpack_from(buf, p)[0]
        p += 4
        key = None if klen < 0 else bytes(buf[p:p + klen])
        p += max(klen, 0)
        vlen = _I32.unpack_from(buf, p)[0] if p + 4 <= msg_end else -2
        p += 4
        value = None if vlen < 0 else bytes(buf[p:p + vlen])
        p += max(vlen, 0)
        if vlen < -1 or p != msg_end:
            raise CorruptRecordError(f"message fields at inner position {pos} do not add up")
        yield offset, magic, attrs & 0xFF, ts, key, value
        pos = msg_end


def _decode_legacy(buf, h: BatchHeader, cols: Columns) -> int:
    """Decode one magic 0/1 entry (plain message or compressed wrapper); returns rows added."""
    msgs = list(_legacy_messages(buf, h.position, h.end))
    _, magic, attrs, ts, key, value = msgs[0]
    codec = attrs & COMPRESSION_MASK
    if codec == 0:
        rows = [(h.last_offset, ts, key, value,
                 NO_TIMESTAMP_TYPE if magic == 0 else
                 (LOG_APPEND_TIME if attrs & TIMESTAMP_TYPE_BIT else CREATE_TIME))]
    else:
        if value is None:
            raise CorruptRecordError(f"compressed wrapper at {h.position} has a null value")
        inner_bytes = codecs.decompress(codec, value, magic)
        inner = list(_legacy_messages(inner_bytes, 0, len(inner_bytes)))
        if not inner:
            raise CorruptRecordError(f"compressed wrapper at {h.position} holds no messages")
        wrapper_type = NO_TIMESTAMP_TYPE if magic == 0 else h.timestamp_type
        if magic == MAGIC_V1 and h.last_offset != 0:
            last_inner = inner[-1][0]
            if h.last_offset < last_inner:
                raise CorruptRecordError(
                    f"wrapper offset {h.last_offset} is below its last inner offset {last_inner}")
            base = h.last_offset - last_inner
        else:
            base = 0
        rows = []
        for off, imagic, iattrs, its, ikey, ivalue in inner:
            if imagic != magic or iattrs & COMPRESSION_MASK:
                raise CorruptRecordError(f"bad inner message in the wrapper at {h.position}")
            if wrapper_type == LOG_APPEND_TIME:
                its = h.max_timestamp
            rows.append((base + off, its, ikey, ivalue, wrapper_type))
    for off, ts, key, value, ts_type in rows:
        cols.offset.append(off)
        cols.timestamp.append(ts)
        cols.timestamp_type.append(ts_type)
        cols.key.append(key)
        cols.value.append(value)
        cols.header_count.append(0)
    return len(rows)


def decode_batch_into(buf, h: BatchHeader, cols: Columns, *, with_headers: bool = True) -> int:
    """Decode one entry whose header is ``h`` into ``cols``; returns the number of rows added."""
    if h.magic == MAGIC_V2:
        mv = memoryview(buf)
        payload = mv[h.position + V2_HEADER_SIZE:h.end]
        codec = h.compression
        blob = codecs.decompress(codec, payload, MAGIC_V2) if codec else bytes(payload)
        if h.record_count < 0:
            raise CorruptRecordError(f"negative record count in the batch at {h.position}")
        _scan_v2(blob, h.record_count, h.base_offset, h.base_timestamp, h.timestamp_type,
                 h.max_timestamp, cols, with_headers)
        n = h.record_count
    else:
        n = _decode_legacy(buf, h, cols)
    cols.batches.append((h.magic, h.is_control, h.is_transactional, h.producer_id,
                         h.producer_epoch, h.partition_leader_epoch, h.position))
    cols.batch_counts.append(n)
    return n


def decode_columns(buf, start: int = 0, end: Optional[int] = None, *, validate: bool = True,
                   min_offset: Optional[int] = None, max_offset: Optional[int] = None,
                   skip_control: bool = False, with_headers: bool = True,
                   cols: Optional[Columns] = None) -> Columns:
    """Decode every whole entry in ``buf[start:end]`` into columns.

    ``min_offset``/``max_offset`` (exclusive) skip whole batches by their headers and trim the
    edge batches, so a reader can hand over a byte range found through the offset index. A partial
    entry at the end is ignored (a fetch that stopped mid-batch); a corrupt one raises
    :class:`CorruptRecordError` with its position.
    """
    cols = Columns() if cols is None else cols
    for h in iter_headers(buf, start, end):
        if min_offset is not None and h.last_offset < min_offset:
            continue
        if max_offset is not None and h.base_offset >= max_offset and h.base_offset >= 0:
            break
        if skip_control and h.is_control:
            continue
        if validate:
            validate_batch(buf, h)
        first_row = len(cols.offset)
        try:
            n = decode_batch_into(buf, h, cols, with_headers=with_headers)
        except CorruptRecordError as exc:
            if exc.position is None:
                exc.position = h.position
            raise
        if min_offset is not None or max_offset is not None:
            offs = cols.offset
            lo, hi = first_row, first_row + n
            while lo < hi and min_offset is not None and offs[lo] < min_offset:
                lo += 1
            stop = lo
            while stop < hi and (max_offset is None or offs[stop] < max_offset):
                stop += 1
            if lo != first_row or stop != hi:
                cols._keep(first_row, lo, stop)
                cols.batch_counts[-1] = stop - lo
            if max_offset is not None and stop < hi:
                break
    return cols


def decode_records(buf, start: int = 0, end: Optional[int] = None, **kwargs) -> List[DecodedRecord]:
    """Row view of :func:`decode_columns` for tools and tests."""
    cols = decode_columns(buf, start, end, **kwargs)
    out: List[DecodedRecord] = []
    i = h = 0
    for batch, count in zip(cols.batches, cols.batch_counts):
        magic, control, txn, pid, pepoch, ple, position = batch
        for _ in range(count):
            nh = cols.header_count[i]
            headers = tuple(zip(cols.header_key[h:h + nh], cols.header_value[h:h + nh]))
            out.append(DecodedRecord(cols.offset[i], cols.timestamp[i], cols.timestamp_type[i],
                                     cols.key[i], cols.value[i], headers, magic, control, txn,
                                     pid, pepoch, ple, position))
            i += 1
            h += nh
    return out




def to_arrow(cols: Columns, *, with_headers: bool = True, batch_fields: bool = False):
    """Arrow arrays for the decoded columns, without a Python object per row for fixed-width
    columns (``array`` buffers are handed to Arrow through numpy without copying).

    Returns a ``pyarrow.Table`` with ``offset`` (int64), ``timestamp`` (int64, ms),
    ``timestampType`` (int32), ``key``/``value`` (binary) and, when asked, ``headers``
    (list<struct<key: string, value: binary>>) and the batch-level fields.
    """
    import numpy as np
    import pyarrow as pa

    n = len(cols)
    arrays = {
        "key": pa.array(cols.key, type=pa.binary()),
        "value": pa.array(cols.value, type=pa.binary()),
        "offset": pa.array(np.frombuffer(cols.offset, dtype=np.int64) if n else [], pa.int64()),
        "timestamp": pa.array(np.frombuffer(cols.timestamp, dtype=np.int64) if n else [],
                              pa.int64()),
        "timestampType": pa.array(np.frombuffer(cols.timestamp_type, dtype=np.int8).astype(
            np.int32) if n else [], pa.int32()),
    }
    if with_headers:
        counts = np.frombuffer(cols.header_count, dtype=np.int32) if n else np.zeros(0, np.int32)
        offsets = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(counts, out=offsets[1:])
        entries = pa.StructArray.from_arrays(
            [pa.array(cols.header_key, pa.string()), pa.array(cols.header_value, pa.binary())],
            names=["key", "value"])
        arrays["headers"] = pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), entries)
    if batch_fields:
        counts = np.frombuffer(cols.batch_counts, dtype=np.int64) if cols.batches else []
        fields = list(zip(*cols.batches)) if cols.batches else [()] * 7
        for name, idx, typ in (("magic", 0, pa.int8()), ("isControl", 1, pa.bool_()),
                               ("isTransactional", 2, pa.bool_()), ("producerId", 3, pa.int64()),
                               ("producerEpoch", 4, pa.int16()),
                               ("partitionLeaderEpoch", 5, pa.int32())):
            arrays[name] = pa.array(np.repeat(np.asarray(fields[idx]), counts)
                                    if cols.batches else [], typ)
    return pa.table(arrays)
