"""Decode a run of magic 2 batches straight into Spark's Arrow layout: the read hot path.

Why a second route next to :func:`.columnar.decode_columns`: that decoder appends into growing
Python buffers, batch by batch, and Arrow then needs int32 offsets, validity bitmaps and
microsecond timestamps made from them. Growing buffers are copied as they grow, and large fresh
allocations from the C allocator are page-faulted in again for every chunk; together that cost
more than the decoding itself. Here the C twin's record loop runs twice over the run of batches:
once to count rows and bytes, then into buffers of exactly that size from Arrow's memory pool
(which keeps its pages), already in the layout Spark wants.

It is a fast path, not a second set of rules: the same C parser validates records, and anything
it does not take (magic 0/1 entries, a corrupt batch, a timestamp Spark cannot hold, more than
2 GiB in a column, no C extension) returns None so that the caller uses
:func:`.columnar.decode_columns`, which gives the rows or the exact error.
"""
from __future__ import annotations

import struct
from typing import Optional

from ..errors import KafkaLogError
from . import codecs
from .batch import (HEADER_SIZE_UP_TO_MAGIC, LOG_OVERHEAD, MAGIC_OFFSET, RECORD_OVERHEAD_V0,
                    V2_HEADER_SIZE, read_header, validate as validate_batch)
from .columnar import _accel
from .records import MAGIC_V2

_LENGTH = struct.Struct(">i").unpack_from

#: Whether :func:`decode_spark_arrays` can ever take a run (the C extension is there).
AVAILABLE: bool = _accel is not None and hasattr(_accel, "scan_v2_arrow")


def _binary(pa, typ, rows: int, nulls: int, validity, offsets, data):
    return pa.Array.from_buffers(typ, rows, [validity if nulls else None, offsets, data],
                                 null_count=nulls)


def decode_spark_arrays(buf, *, with_headers: bool) -> Optional[dict]:
    """Every whole magic 2 batch in ``buf`` (control batches skipped, CRCs checked) as Arrow
    arrays in Spark's Kafka schema: ``key``, ``value``, ``offset``, ``timestamp`` (us, UTC),
    ``timestampType`` and, with ``with_headers``, ``headers``; plus ``rows``. None when this
    path does not take the run (see the module docstring)."""
    if not AVAILABLE:
        return None
    import pyarrow as pa

    items = []
    view = memoryview(buf).cast("B")
    pos, end = 0, len(view)
    try:
        while pos + HEADER_SIZE_UP_TO_MAGIC < end:
            if view[pos + MAGIC_OFFSET] != MAGIC_V2:
                return None
            length = _LENGTH(view, pos + 8)[0]
            if length < RECORD_OVERHEAD_V0:
                return None
            if pos + LOG_OVERHEAD + length > end:
                break   # a partial entry at the end, as decode_columns ignores it
            h = read_header(view, pos)
            pos = h.end
            if h.is_control:
                continue
            if h.record_count < 0:
                return None
            validate_batch(view, h)
            blob = view[h.position + V2_HEADER_SIZE:h.end]
            if h.compression:
                blob = codecs.decompress_into(h.compression, blob, MAGIC_V2, pa.allocate_buffer)
            items.append((blob, h.record_count, h.base_offset, h.base_timestamp,
                          h.timestamp_type, h.max_timestamp))
    except KafkaLogError:
        return None   # decode_columns raises it again, with its position
    got = _accel.scan_v2_arrow(items, with_headers, pa.allocate_buffer)
    if got is None:
        return None
    rows, knulls, vnulls, nheaders, hvnulls, b = got
    out = {
        "rows": rows,
        "offset": pa.Array.from_buffers(pa.int64(), rows, [None, b[0]]),
        "timestamp": pa.Array.from_buffers(pa.timestamp("us", tz="UTC"), rows, [None, b[1]]),
        "timestampType": pa.Array.from_buffers(pa.int32(), rows, [None, b[2]]),
        "key": _binary(pa, pa.binary(), rows, knulls, b[3], b[4], b[5]),
        "value": _binary(pa, pa.binary(), rows, vnulls, b[6], b[7], b[8]),
    }
    if with_headers:
        entries = pa.StructArray.from_arrays(
            [pa.Array.from_buffers(pa.string(), nheaders, [None, b[10], b[11]]),
             _binary(pa, pa.binary(), nheaders, hvnulls, b[12], b[13], b[14])],
            names=["key", "value"])
        out["headers"] = pa.Array.from_buffers(
            pa.list_(pa.field("element", entries.type)), rows, [None, b[9]], children=[entries])
    return out
