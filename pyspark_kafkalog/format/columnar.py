"""Decode runs of batches of any magic straight into columns.

This is the read hot path of the Spark source: records never become Python objects. Keys, values
and headers land in Arrow's own layout (a data buffer, int64 end offsets, a validity byte per
row), so :func:`to_arrow` wraps memory instead of converting lists; batch-level fields are kept
once per batch and expanded with ``numpy.repeat`` only when Arrow arrays are built.
:func:`decode_records` gives a row view over the same decoder for tools and tests, so there is one
decoding implementation, not two.

The magic 2 record loop exists twice, as in aiokafka: a C extension (``_columnar_accel``, built
when a compiler is available) and the pure-Python reference in ``_columnar_py``. Both produce the
same columns and the same errors; ``format/accel.py`` chooses (``KAFKALOG_PURE_PYTHON=1`` forces
the Python one).
"""
from __future__ import annotations

import struct
from array import array
from operator import attrgetter
from typing import List, Optional

from ..errors import CorruptRecordError
from . import _columnar_py as _py
from . import accel, codecs
from .batch import (HEADER_SIZE_UP_TO_MAGIC, LEGACY_ATTRIBUTES_OFFSET, LENGTH_OFFSET,
                    LOG_OVERHEAD, MAGIC_OFFSET, RECORD_OVERHEAD_V0, V2_HEADER_SIZE, BatchHeader,
                    read_header, size_error, validate as validate_batch)
from .records import (COMPRESSION_MASK, CREATE_TIME, LOG_APPEND_TIME, MAGIC_V1, MAGIC_V2,
                      NO_TIMESTAMP_TYPE, TIMESTAMP_TYPE_BIT, DecodedRecord)

#: True when the magic 2 record loop runs in C.
ACCELERATED: bool = accel.COLUMNAR is not None
#: The magic 2 record loop; tests swap it to compare the implementations.
_scan_v2 = accel.COLUMNAR.scan_v2 if accel.COLUMNAR is not None else _py.scan_v2

_I32_MAX = (1 << 31) - 1
_LENGTH = struct.Struct(">i").unpack_from
# Every container that grows with rows, in the order _mark/_rollback use.
_GROWING = ("offset", "timestamp", "timestamp_type", "header_count", "key_data", "key_offsets",
            "key_valid", "value_data", "value_offsets", "value_valid", "header_key_data",
            "header_key_offsets", "header_value_data", "header_value_offsets",
            "header_value_valid", "batches", "batch_counts")
_GET_GROWING = attrgetter(*_GROWING)


def _binary(data: bytearray, offsets: array, valid: Optional[bytearray]) -> list:
    d = bytes(data)
    if valid is None:
        return [d[offsets[i]:offsets[i + 1]] for i in range(len(offsets) - 1)]
    return [d[offsets[i]:offsets[i + 1]] if valid[i] else None for i in range(len(valid))]


class Columns:
    """Flat, append-only columns of decoded records plus one row per decoded batch.

    Keys and values are Arrow-shaped: ``*_data`` holds the bytes of all rows back to back,
    ``*_offsets`` row ``i``'s span ``[offsets[i], offsets[i+1])`` (n + 1 entries from 0) and
    ``*_valid`` a 0/1 byte per row (a null has zero length). Header keys and values are the same
    per header, in row order; ``header_count`` says how many belong to each row. ``key``,
    ``value``, ``header_key`` and ``header_value`` are list views for tools and tests (built on
    each change, then cached; do not mutate them).
    """

    __slots__ = _GROWING + ("_cache", "_exported")

    def __init__(self):
        self.offset = array("q")
        self.timestamp = array("q")
        self.timestamp_type = array("b")
        self.header_count = array("i")
        self.key_data = bytearray()
        self.key_offsets = array("q", (0,))
        self.key_valid = bytearray()
        self.value_data = bytearray()
        self.value_offsets = array("q", (0,))
        self.value_valid = bytearray()
        self.header_key_data = bytearray()
        self.header_key_offsets = array("q", (0,))
        self.header_value_data = bytearray()
        self.header_value_offsets = array("q", (0,))
        self.header_value_valid = bytearray()
        #: (magic, is_control, is_transactional, producer_id, producer_epoch, leader_epoch, position)
        self.batches: list = []
        self.batch_counts = array("q")
        self._cache: dict = {}
        self._exported = False

    def __len__(self) -> int:
        return len(self.offset)

    # -- list views (slow) ------------------------------------------------------------------------

    def _view(self, name: str, build):
        got = self._cache.get(name)
        if got is None:
            got = self._cache[name] = build()
        return got

    @property
    def key(self) -> List[Optional[bytes]]:
        return self._view("key", lambda: _binary(self.key_data, self.key_offsets, self.key_valid))

    @property
    def value(self) -> List[Optional[bytes]]:
        return self._view("value", lambda: _binary(self.value_data, self.value_offsets,
                                                   self.value_valid))

    @property
    def header_key(self) -> List[str]:
        return self._view("header_key", lambda: [
            k.decode("utf-8") for k in _binary(self.header_key_data, self.header_key_offsets,
                                               None)])

    @property
    def header_value(self) -> List[Optional[bytes]]:
        return self._view("header_value", lambda: _binary(
            self.header_value_data, self.header_value_offsets, self.header_value_valid))

    # -- mutation helpers -------------------------------------------------------------------------

    def _writable(self) -> None:
        """Called before every append: forget the list views and, if Arrow still shares our
        buffers (a buffer with live exports cannot be resized), continue in copies of them."""
        if self._cache:
            self._cache = {}
        if self._exported:
            for name in _GROWING:
                col = getattr(self, name)
                setattr(self, name, col[:] if not isinstance(col, bytearray) else bytearray(col))
            self._exported = False

    def _mark(self) -> tuple:
        return tuple(map(len, _GET_GROWING(self)))

    def _rollback(self, mark: tuple) -> None:
        self._cache = {}
        for name, n in zip(_GROWING, mark):
            del getattr(self, name)[n:]

    def _keep(self, start: int, first: int, stop: int) -> None:
        """Drop the rows of the current batch (which began at ``start``) outside [first, stop)."""
        if first == start and stop == len(self.offset):
            return
        self._writable()
        hc = self.header_count
        h0 = len(self.header_key_offsets) - 1 - sum(hc[start:])
        hf = h0 + sum(hc[start:first])
        hs = hf + sum(hc[first:stop])
        for col in (self.offset, self.timestamp, self.timestamp_type, self.header_count):
            col[start:] = col[first:stop]
        _cut(self.key_data, self.key_offsets, self.key_valid, start, first, stop)
        _cut(self.value_data, self.value_offsets, self.value_valid, start, first, stop)
        _cut(self.header_key_data, self.header_key_offsets, None, h0, hf, hs)
        _cut(self.header_value_data, self.header_value_offsets, self.header_value_valid,
             h0, hf, hs)


def _cut(data: bytearray, offsets: array, valid: Optional[bytearray], start: int, first: int,
         stop: int) -> None:
    """Replace rows ``start:`` of one variable-width column by its rows ``first:stop``."""
    base, lo, hi = offsets[start], offsets[first], offsets[stop]
    data[base:] = data[lo:hi]
    shift = lo - base
    offsets[start:] = array("q", [o - shift for o in offsets[first:stop + 1]])
    if valid is not None:
        valid[start:] = valid[first:stop]


# -- decoding ---------------------------------------------------------------------------------------

def _decode_legacy(buf, h: BatchHeader, cols: Columns) -> int:
    """Decode one magic 0/1 entry (plain message or compressed wrapper); returns rows added."""
    magic, attrs, ts, key, value = _py.legacy_message(buf, h.position, h.end)
    codec = attrs & COMPRESSION_MASK
    if codec == 0:
        ts_type = (NO_TIMESTAMP_TYPE if magic == 0 else
                   LOG_APPEND_TIME if attrs & TIMESTAMP_TYPE_BIT else CREATE_TIME)
        cols.offset.append(h.last_offset)
        cols.timestamp.append(ts)
        cols.timestamp_type.append(ts_type)
        cols.header_count.append(0)
        for data, offsets, valid, v in ((cols.key_data, cols.key_offsets, cols.key_valid, key),
                                        (cols.value_data, cols.value_offsets, cols.value_valid,
                                         value)):
            if v is not None:
                data += v
            offsets.append(len(data))
            valid.append(v is not None)
        return 1
    if value is None:
        raise CorruptRecordError(f"compressed wrapper at {h.position} has a null value")
    inner = codecs.decompress(codec, value, magic)
    wrapper_type = NO_TIMESTAMP_TYPE if magic == 0 else h.timestamp_type
    rows, last_inner, bad = _py.scan_legacy_inner(
        inner, magic, wrapper_type,
        h.max_timestamp if wrapper_type == LOG_APPEND_TIME else None, cols)
    if not rows:
        raise CorruptRecordError(f"compressed wrapper at {h.position} holds no messages")
    if magic == MAGIC_V1 and h.last_offset != 0:
        if h.last_offset < last_inner:
            raise CorruptRecordError(
                f"wrapper offset {h.last_offset} is below its last inner offset {last_inner}")
        base = h.last_offset - last_inner
        if base:
            offs = cols.offset
            try:
                offs[-rows:] = array("q", [o + base for o in offs[-rows:]])
            except OverflowError:
                raise CorruptRecordError(
                    f"inner offsets of the wrapper at {h.position} overflow a 64-bit integer"
                ) from None
    if bad is not None:
        raise CorruptRecordError(f"bad inner message in the wrapper at {h.position}")
    return rows


def decode_batch_into(buf, h: BatchHeader, cols: Columns, *, with_headers: bool = True) -> int:
    """Decode one entry whose header is ``h`` into ``cols``; returns the number of rows added.

    All or nothing: a corrupt entry leaves ``cols`` as it was.
    """
    cols._writable()
    mark = cols._mark()
    try:
        if h.magic == MAGIC_V2:
            if h.record_count < 0:
                raise CorruptRecordError(f"negative record count in the batch at {h.position}")
            codec = h.compression
            blob = memoryview(buf)[h.position + V2_HEADER_SIZE:h.end]
            if codec:
                blob = codecs.decompress(codec, blob, MAGIC_V2)
            _scan_v2(blob, h.record_count, h.base_offset, h.base_timestamp, h.timestamp_type,
                     h.max_timestamp, cols, with_headers)
            n = h.record_count
        else:
            n = _decode_legacy(buf, h, cols)
        cols.batches.append((h.magic, h.is_control, h.is_transactional, h.producer_id,
                             h.producer_epoch, h.partition_leader_epoch, h.position))
        cols.batch_counts.append(n)
    except BaseException:
        cols._rollback(mark)
        raise
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

    The entry walk is :func:`batch.scan_entries`' rules and errors, inlined so that runs of
    uncompressed magic 0/1 messages (one record each) can go through a loop without a header
    object per message. Not its offset rule: a buffer is not always a log (a producer's batches
    each start at offset 0); the log's readers walk what they read with ``scan_entries`` first.
    """
    cols = Columns() if cols is None else cols
    cols._writable()
    end = len(buf) if end is None else end
    pos = start
    while pos + HEADER_SIZE_UP_TO_MAGIC < end:
        if (buf[pos + MAGIC_OFFSET] < MAGIC_V2
                and not buf[pos + LOG_OVERHEAD + LEGACY_ATTRIBUTES_OFFSET] & COMPRESSION_MASK):
            pos, done = _py.legacy_run(buf, pos, end, cols, validate, min_offset, max_offset)
            if done or pos + HEADER_SIZE_UP_TO_MAGIC >= end:
                break
        length = _LENGTH(buf, pos + LENGTH_OFFSET)[0]
        if length < RECORD_OVERHEAD_V0:
            raise size_error(pos, length)
        if pos + LOG_OVERHEAD + length > end:
            break
        h = read_header(buf, pos)
        pos = h.end
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
    keys, values, hkeys, hvalues = cols.key, cols.value, cols.header_key, cols.header_value
    out: List[DecodedRecord] = []
    i = h = 0
    for batch, count in zip(cols.batches, cols.batch_counts):
        magic, control, txn, pid, pepoch, ple, position = batch
        for _ in range(count):
            nh = cols.header_count[i]
            headers = tuple(zip(hkeys[h:h + nh], hvalues[h:h + nh]))
            out.append(DecodedRecord(cols.offset[i], cols.timestamp[i], cols.timestamp_type[i],
                                     keys[i], values[i], headers, magic, control, txn,
                                     pid, pepoch, ple, position))
            i += 1
            h += nh
    return out


# -- Arrow ------------------------------------------------------------------------------------------

def _arrow_binary(pa, np, data: bytearray, offsets: array, valid: Optional[bytearray],
                  small, large):
    """A (large_)binary/string array over our buffers: int32 offsets (one small copy) while the
    data fits them, else the int64 offsets as they are. The data buffer is shared, not copied."""
    n = len(offsets) - 1
    offs = np.frombuffer(offsets, dtype=np.int64)
    if len(data) <= _I32_MAX:
        typ, offs = small, offs.astype(np.int32)
    else:
        typ = large
    bitmap, nulls = None, 0
    if valid is not None and n:
        flags = np.frombuffer(valid, dtype=np.uint8)
        nulls = n - int(np.count_nonzero(flags))
        if nulls:
            bitmap = pa.py_buffer(np.packbits(flags, bitorder="little"))
    return pa.Array.from_buffers(typ, n, [bitmap, pa.py_buffer(offs), pa.py_buffer(data)],
                                 null_count=nulls)


def arrow_arrays(cols: Columns, *, with_headers: bool = True, batch_fields: bool = False) -> dict:
    """Arrow arrays for the decoded columns, without a Python object per row.

    Fixed-width columns and the key/value/header data buffers are shared with ``cols`` (handed to
    Arrow through numpy/``py_buffer`` without copying); ``cols`` stays usable, and switches to
    copies of its buffers if it is appended to while Arrow still holds them.

    Returns ``{name: array}``: ``offset`` (int64), ``timestamp`` (int64, ms), ``timestampType``
    (int32), ``key``/``value`` (binary; large_binary past 2 GiB of data) and, when asked,
    ``headers`` (list<struct<key: string, value: binary>>) and the batch-level fields.
    """
    import numpy as np
    import pyarrow as pa

    n = len(cols)
    cols._exported = True
    arrays = {
        "key": _arrow_binary(pa, np, cols.key_data, cols.key_offsets, cols.key_valid,
                             pa.binary(), pa.large_binary()),
        "value": _arrow_binary(pa, np, cols.value_data, cols.value_offsets, cols.value_valid,
                               pa.binary(), pa.large_binary()),
        "offset": pa.array(np.frombuffer(cols.offset, dtype=np.int64) if n else [], pa.int64()),
        "timestamp": pa.array(np.frombuffer(cols.timestamp, dtype=np.int64) if n else [],
                              pa.int64()),
        "timestampType": pa.array(np.frombuffer(cols.timestamp_type, dtype=np.int8).astype(
            np.int32) if n else [], pa.int32()),
    }
    if with_headers:
        entries = pa.StructArray.from_arrays(
            [_arrow_binary(pa, np, cols.header_key_data, cols.header_key_offsets, None,
                           pa.string(), pa.large_string()),
             _arrow_binary(pa, np, cols.header_value_data, cols.header_value_offsets,
                           cols.header_value_valid, pa.binary(), pa.large_binary())],
            names=["key", "value"])
        large = len(entries) > _I32_MAX
        offsets = np.zeros(n + 1, dtype=np.int64 if large else np.int32)
        np.cumsum(np.frombuffer(cols.header_count, dtype=np.int32), out=offsets[1:])
        arrays["headers"] = pa.Array.from_buffers(
            (pa.large_list if large else pa.list_)(entries.type), n,
            [None, pa.py_buffer(offsets)], children=[entries])
    if batch_fields:
        counts = np.frombuffer(cols.batch_counts, dtype=np.int64) if cols.batches else []
        fields = list(zip(*cols.batches)) if cols.batches else [()] * 7
        for name, idx, typ in (("magic", 0, pa.int8()), ("isControl", 1, pa.bool_()),
                               ("isTransactional", 2, pa.bool_()), ("producerId", 3, pa.int64()),
                               ("producerEpoch", 4, pa.int16()),
                               ("partitionLeaderEpoch", 5, pa.int32())):
            arrays[name] = pa.array(np.repeat(np.asarray(fields[idx]), counts)
                                    if cols.batches else [], typ)
    return arrays


def to_arrow(cols: Columns, *, with_headers: bool = True, batch_fields: bool = False):
    """:func:`arrow_arrays` as a ``pyarrow.Table``."""
    import pyarrow as pa
    return pa.table(arrow_arrays(cols, with_headers=with_headers, batch_fields=batch_fields))
