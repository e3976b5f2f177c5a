"""Decode a run of magic 2 batches straight into Spark's Arrow layout: the read hot path.

Why a second route next to :func:`.columnar.decode_columns`: that decoder appends into growing
Python buffers, batch by batch, and Arrow then needs int32 offsets, validity bitmaps and
microsecond timestamps made from them. Growing buffers are copied as they grow, and large fresh
allocations from the C allocator are page-faulted in again for every chunk; together that cost
more than the decoding itself. Here one C call walks the chunk's entries (CRC checked through
the crc32c package, LZ4 decompressed into pool memory by ``codecs.decompress_into``) and runs
the C twin's record loop into buffers from Arrow's memory pool (which keeps its pages), sized
up front and already in the layout Spark wants: one pass without headers (the batch headers
bound rows and bytes), two with (count, then fill).

It is a fast path, not a second set of rules: the same C parser validates records, and anything
it does not take (magic 0/1 entries, a corrupt batch, a timestamp Spark cannot hold, more than
2 GiB in a column, no C extension: ``format/accel.py``) returns None so that the caller uses
:func:`.columnar.decode_columns`, which gives the rows or the exact error.
"""
from __future__ import annotations

from typing import Optional

from ..format import accel, codecs
from ..format.crc import package_crc32c as crc32c
from ..format.records import MAGIC_V2

#: The C route (``_columnar_accel.scan_run_arrow``), or None.
_scan_run_arrow = getattr(accel.COLUMNAR, "scan_run_arrow", None)
#: Whether :func:`decode_spark_arrays` can ever take a run (the C extension and crc32c are
#: there).
AVAILABLE: bool = _scan_run_arrow is not None and crc32c is not None


def _binary(pa, typ, rows: int, nulls: int, validity, offsets, data):
    return pa.Array.from_buffers(typ, rows, [validity if nulls else None, offsets, data],
                                 null_count=nulls)


def _lz4_into():
    cramjam = codecs._lib("cramjam", required=False)
    return getattr(getattr(cramjam, "lz4", None), "decompress_block_into", None)


def _decompress(codec: int, view):
    import pyarrow as pa
    return codecs.decompress_into(codec, view, MAGIC_V2, pa.allocate_buffer)


def decode_spark_arrays(buf, *, with_headers: bool) -> Optional[dict]:
    """Every whole magic 2 batch in ``buf`` (control batches skipped, CRCs checked) as Arrow
    arrays in Spark's Kafka schema: ``key``, ``value``, ``offset``, ``timestamp`` (us, UTC),
    ``timestampType`` and, with ``with_headers``, ``headers``; plus ``rows``. None when this
    path does not take the run (see the module docstring)."""
    if not AVAILABLE:
        return None
    import pyarrow as pa

    got = _scan_run_arrow(buf, with_headers, pa.allocate_buffer, crc32c, _decompress,
                          _lz4_into())
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
