"""Arrow columns to Kafka record batches, vectorised: the write path of the Spark sink.

Encoding one record at a time in Python costs microseconds per record, which would make the sink
the bottleneck of any Spark job. Here a whole column chunk is encoded with numpy and Arrow kernels:

* the varint fields of every record (length, timestamp delta, offset delta, key/value lengths,
  header count) are computed as arrays and written into one "pieces" buffer per field group;
* ``binary_join_element_wise`` interleaves those pieces with the key, value and header bytes, so
  the data buffer of the joined array *is* the records section of the batches, back to back;
* each batch is then a slice of that buffer, compressed, behind a header with its CRC32C.

The records section exists twice: a C extension (``_encode_accel``, built when a compiler is
available) writes it in two passes straight into one buffer, and the numpy/Arrow code above is
the fallback and reference; ``format/accel.py`` chooses (``KAFKALOG_PURE_PYTHON=1`` forces the
fallback). Both give the same bytes.

Rows buffered per partition as pieces (:class:`Piece`: an input batch and the numbers of its
rows) are taken and encoded a batch's worth at a time by :func:`encode_pieces`: the route of the
Python accumulator (``arrow/accumulate.py``). The Spark sink's usual route is the C
accumulator there, which writes each record straight into its batch as the rows come.

The bytes are exactly what :func:`encode.encode_batch_v2` writes for the same records (tested),
which in turn is what Kafka's ``MemoryRecordsBuilder`` writes. Magic 0/1 (legacy message sets,
one CRC per message) go through :func:`encode.encode_records` record by record: they are rare.

Also here: Kafka's murmur2 partitioner over an Arrow binary column (:func:`murmur2_array`),
bit-identical to :func:`partitioner.murmur2`; it too runs in ``_encode_accel`` when built, with
the numpy code as the fallback.
"""
from __future__ import annotations

import struct
from typing import List, NamedTuple, Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import InvalidRecordError
from ..format import accel, codecs
from ..format.batch import LOG_OVERHEAD, V2_CRC_START, V2_HEADER, V2_HEADER_SIZE
from ..format.crc import crc32c
from ..format.encode import EncodedBatch, encode_records
from ..format.records import MAGIC_V2, Record

#: True when :func:`encode_v2_chunks` builds the records section in C.
ACCELERATED: bool = accel.ENCODE is not None
#: The C records builder, or None for the numpy one; tests swap it to compare the two.
_encode_records = accel.ENCODE.encode_v2_records if accel.ENCODE is not None else None

_EMPTY = pa.scalar(b"", pa.binary())
_BINARY = pa.binary()
#: The records section of one call must fit an Arrow binary array (int32 offsets).
_MAX_RECORDS_BYTES = 2**31
HEADER_TYPE = pa.list_(pa.struct([("key", pa.binary()), ("value", pa.binary())]))
#: the columns an encoder takes: key/value binary, timestamp int64 ms, headers (optional)
ENCODE_SCHEMA = pa.schema([("key", pa.binary()), ("value", pa.binary()),
                           ("timestamp", pa.int64()), ("headers", HEADER_TYPE)])


# -- varints, vectorised ------------------------------------------------------------------------

def zigzag(x: np.ndarray) -> np.ndarray:
    """Zig-zag of int64 values as uint64 (Kafka's writeVarint/writeVarlong sign encoding)."""
    x = x.astype(np.int64, copy=False)
    return ((x << 1) ^ (x >> 63)).view(np.uint64)


def varint_size(u: np.ndarray) -> np.ndarray:
    """Bytes of the unsigned varint of each uint64 value (1..10)."""
    size = np.ones(len(u), dtype=np.int64)
    top = int(u.max()) if len(u) else 0
    for bits in range(7, 64, 7):
        if top < (1 << bits):
            break
        size += u >= np.uint64(1 << bits)
    return size


def _put_varints(out: np.ndarray, pos: np.ndarray, u: np.ndarray, size: np.ndarray) -> None:
    """Write the unsigned varint of ``u[i]`` at ``out[pos[i]]`` (``size[i]`` bytes)."""
    if len(u) and int(size.max()) == 1:
        out[pos] = u.astype(np.uint8)
        return
    idx = np.arange(len(u))
    u = u.copy()
    j = 0
    while len(idx):
        more = size[idx] > j + 1
        byte = (u[idx] & np.uint64(0x7F)).astype(np.uint8)
        byte[more] |= 0x80
        out[pos[idx] + j] = byte
        u[idx] >>= np.uint64(7)
        idx = idx[more]
        j += 1


def varint_pieces(fields: Sequence[Optional[np.ndarray]]) -> pa.Array:
    """A binary array whose element ``i`` is the varints of ``f[i]`` for each field, in order.

    A field given as ``None`` is a single zero byte (the v2 record's attributes).
    """
    n = len(next(f for f in fields if f is not None))
    sizes = [np.ones(n, np.int64) if f is None else varint_size(f) for f in fields]
    total = sizes[0].copy()
    for size in sizes[1:]:
        total += size
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(total, out=offsets[1:])
    if offsets[-1] >= 2**31:
        raise InvalidRecordError("too many records for one encode call")
    out = np.zeros(int(offsets[-1]), dtype=np.uint8)
    pos = offsets[:-1].copy()
    for f, size in zip(fields, sizes):
        if f is not None:
            _put_varints(out, pos, f, size)
        pos += size
    return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets.astype(np.int32)),
                                                  pa.py_buffer(out)])


# -- column helpers -----------------------------------------------------------------------------

def lengths(arr: pa.Array) -> np.ndarray:
    """Byte length of each element of a binary array, -1 for null (Kafka's null encoding)."""
    if arr.null_count == 0 and pa.types.is_binary(arr.type) and len(arr):
        offs = np.frombuffer(arr.buffers()[1], dtype=np.int32,
                             count=len(arr) + 1, offset=4 * arr.offset)
        return np.diff(offs).astype(np.int64)
    return pc.fill_null(pc.binary_length(arr), -1).to_numpy(zero_copy_only=False).astype(np.int64)


def _join(*arrays) -> pa.Array:
    return pc.binary_join_element_wise(*arrays, _EMPTY, null_handling="replace",
                                       null_replacement="")


def _data(arr: pa.Array):
    """(int64 offsets, data buffer) of a binary array built fresh by a kernel."""
    offs = np.frombuffer(arr.buffers()[1], dtype=np.int32)[arr.offset:arr.offset + len(arr) + 1]
    return offs.astype(np.int64), arr.buffers()[2]


def header_bytes(headers: Optional[pa.Array], n: int):
    """(per-record encoded headers as a binary array, header count per record) or (None, zeros)."""
    if headers is None or headers.null_count == len(headers):
        return None, np.zeros(n, np.int64)
    counts = pc.fill_null(pc.list_value_length(headers), 0).to_numpy(
        zero_copy_only=False).astype(np.int64)
    if not counts.any():
        return None, counts
    flat = headers.flatten()
    if flat.null_count:
        raise InvalidRecordError("a record header must not be null (a struct of key, value)")
    hkey, hval = flat.field("key"), flat.field("value")
    if hkey.null_count:
        raise InvalidRecordError("a record header key must not be null")
    # v2 header: varint key length, key (UTF-8), varint value length (-1 = null), value
    pieces_k = varint_pieces([zigzag(lengths(hkey))])
    pieces_v = varint_pieces([zigzag(lengths(hval))])
    elems = _join(pieces_k, hkey, pieces_v, hval)
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(counts, out=offsets[1:])
    per_record = pc.binary_join(pa.ListArray.from_arrays(pa.array(offsets), elems), _EMPTY)
    return per_record, counts


# -- chunking -----------------------------------------------------------------------------------

#: What a record costs beyond its key, value and headers, for batch sizing (the C accumulator's
#: ESTIMATE_OVERHEAD when it computes the estimates itself).
ESTIMATE_OVERHEAD = 12


def estimated_sizes(key: pa.Array, value: pa.Array, headers: Optional[pa.Array]) -> np.ndarray:
    """Uncompressed bytes each record will take in a batch (close enough for batch sizing)."""
    size = np.maximum(lengths(key), 0) + np.maximum(lengths(value), 0) + ESTIMATE_OVERHEAD
    if headers is not None and headers.null_count < len(headers):
        flat = headers.flatten()
        if len(flat):
            hsize = (np.maximum(lengths(flat.field("key")), 0)
                     + np.maximum(lengths(flat.field("value")), 0) + 2)
            counts = pc.fill_null(pc.list_value_length(headers), 0).to_numpy(
                zero_copy_only=False).astype(np.int64)
            ends = np.cumsum(counts)
            csum = np.concatenate([[0], np.cumsum(hsize)])
            size = size + (csum[ends] - csum[ends - counts])
    return size


def chunk_bounds(sizes: np.ndarray, max_bytes: int, max_records: int) -> List[int]:
    """Greedy batch boundaries ``[0, b1, ..., n]``: at most ``max_records`` records and, unless
    a single record is bigger, at most ``max_bytes`` estimated bytes per batch."""
    n = len(sizes)
    cum = np.concatenate([[0], np.cumsum(sizes)])
    bounds, start = [0], 0
    while start < n:
        end = int(np.searchsorted(cum, cum[start] + max_bytes, side="right")) - 1
        end = max(min(end, start + max_records, n), start + 1)
        bounds.append(end)
        start = end
    return bounds


# -- magic 2 ------------------------------------------------------------------------------------

def encode_v2_chunks(key: pa.Array, value: pa.Array, timestamps: np.ndarray,
                     headers: Optional[pa.Array], bounds: Sequence[int], compression: int,
                     level: Optional[int] = None) -> List[EncodedBatch]:
    """One magic 2 batch per ``[bounds[i], bounds[i+1])`` row range, offsets relative to 0.

    ``key``/``value``: binary arrays (null = null key / value), ``timestamps``: int64 ms (create
    time), ``headers``: a ``list<struct<key: binary, value: binary>>`` array or None.
    """
    n = len(value)
    if n == 0:
        return []
    if bounds[0] != 0 or bounds[-1] != n:
        raise ValueError(f"bounds {bounds[0]}..{bounds[-1]} must cover the {n} rows")
    codecs.check_codec(compression, MAGIC_V2)
    timestamps = np.asarray(timestamps, dtype=np.int64)
    bounds = np.asarray(bounds, dtype=np.int64)
    counts = np.diff(bounds)
    if _encode_records is not None and _c_takes(key, value, timestamps, headers, bounds, counts,
                                                n):
        hrec, hcount = header_bytes(headers, n)
        # the C code reads flat int64 buffers; Arrow's pool spares it fresh pages to fault in
        raw_offs, buf = _encode_records(key, value, np.ascontiguousarray(timestamps),
                                        np.ascontiguousarray(bounds), hrec, hcount,
                                        pa.allocate_buffer)
        offs = np.frombuffer(raw_offs, dtype=np.int64)
    else:
        offs, buf = _records_numpy(key, value, timestamps, headers, bounds, counts, n)
    view = memoryview(buf)
    max_ts = np.maximum.reduceat(timestamps, bounds[:-1]) if n else []
    out = []
    for i in range(len(counts)):
        a, b = int(bounds[i]), int(bounds[i + 1])
        payload = view[offs[a]:offs[b]]
        if compression:
            payload = codecs.compress(compression, payload, MAGIC_V2, level=level)
        out.append(v2_batch(payload, b - a, int(timestamps[a]), int(max_ts[i]), compression))
    return out


def _c_takes(key, value, timestamps: np.ndarray, headers, bounds: np.ndarray,
             counts: np.ndarray, n: int) -> bool:
    """Inputs the numpy code would encode, in the layout the C code reads (binary arrays have
    int32 offsets); anything else goes the numpy way, which then fails as it always did."""
    return (isinstance(key, pa.Array) and isinstance(value, pa.Array) and key.type == _BINARY
            and value.type == _BINARY and len(key) == n
            and (headers is None or isinstance(headers, pa.Array))
            and timestamps.ndim == 1 and len(timestamps) == n and bounds.ndim == 1
            and bool((counts >= 0).all()))


def _records_numpy(key: pa.Array, value: pa.Array, timestamps: np.ndarray,
                   headers: Optional[pa.Array], bounds: np.ndarray, counts: np.ndarray, n: int):
    """(int64 offsets of each record, buffer of the records back to back), with numpy and Arrow
    kernels: the fallback and reference for ``_encode_accel.encode_v2_records``."""
    starts = np.repeat(bounds[:-1], counts)
    offset_delta = np.arange(n, dtype=np.int64) - starts
    ts_delta = timestamps - timestamps[starts]
    klen, vlen = lengths(key), lengths(value)
    hrec, hcount = header_bytes(headers, n)
    hlen = np.zeros(n, np.int64) if hrec is None else lengths(hrec)
    z_ts, z_off, z_k, z_v, z_hc = (zigzag(ts_delta), zigzag(offset_delta), zigzag(klen),
                                   zigzag(vlen), zigzag(hcount))
    body = (1 + varint_size(z_ts) + varint_size(z_off) + varint_size(z_k) + np.maximum(klen, 0)
            + varint_size(z_v) + np.maximum(vlen, 0) + varint_size(z_hc) + hlen)
    z_body = zigzag(body)
    if int(body.sum()) + int(varint_size(z_body).sum()) >= _MAX_RECORDS_BYTES:
        raise InvalidRecordError("too many records for one encode call")
    prefix = varint_pieces([z_body, None, z_ts, z_off, z_k])
    middle = varint_pieces([z_v])
    suffix = varint_pieces([z_hc])
    parts = [prefix, key, middle, value, suffix] + ([] if hrec is None else [hrec])
    records = _join(*parts)
    return _data(records)


def v2_batch(payload, count: int, base_ts: int, max_ts: int, compression: int) -> EncodedBatch:
    """The batch header in front of ``payload``, in a buffer from Arrow's pool (fresh memory
    from the C allocator would be page-faulted in again for every batch): the payload is
    copied once, and the producer stamps the result in place (``assign_offsets(in_place=True)``)."""
    size = V2_HEADER_SIZE + len(payload)
    data = memoryview(pa.allocate_buffer(size)).cast("B")
    data[V2_HEADER_SIZE:] = memoryview(payload).cast("B")
    return v2_header(data, count, base_ts, max_ts, compression)


def v2_header(data: memoryview, count: int, base_ts: int, max_ts: int,
              compression: int) -> EncodedBatch:
    """Writes the header into the first ``V2_HEADER_SIZE`` bytes of ``data`` (a writable view
    whose records follow) and the CRC over the header's tail and the records, in place."""
    V2_HEADER.pack_into(data, 0, 0, len(data) - LOG_OVERHEAD, -1, MAGIC_V2, 0, compression,
                        count - 1, base_ts, max_ts, -1, -1, -1, count)
    struct.pack_into(">I", data, 17, crc32c(data[V2_CRC_START:]))
    return EncodedBatch(data, MAGIC_V2, 0, count - 1, max_ts, count, compression)


# -- rows buffered as pieces of several input batches ------------------------------------------

class EncodeInput:
    """One input batch's columns as the encoders take them (``key``/``value`` binary arrays,
    ``timestamps`` int64 ms, ``headers`` a ``HEADER_TYPE`` array or None). Every Kafka
    partition's piece of the batch shares it, so its headers are encoded once."""

    __slots__ = ("key", "value", "timestamps", "headers", "_hdr")

    def __init__(self, key: pa.Array, value: pa.Array, timestamps: np.ndarray,
                 headers: Optional[pa.Array]):
        self.key, self.value, self.headers = key, value, headers
        self.timestamps = np.ascontiguousarray(timestamps, dtype=np.int64)
        self._hdr = None

    def __len__(self) -> int:
        return len(self.value)

    def header_bytes(self):
        """(per-row encoded headers or None, header counts or None when there are none)."""
        if self._hdr is None:
            hrec, hcount = header_bytes(self.headers, len(self))
            self._hdr = (hrec, None if hrec is None else np.ascontiguousarray(hcount))
        return self._hdr


class Piece(NamedTuple):
    """Rows of one input batch, in order: ``rows`` are their numbers (int64), None for all."""
    input: EncodeInput
    rows: Optional[np.ndarray]

    def __len__(self) -> int:
        return len(self.input) if self.rows is None else len(self.rows)


def slice_pieces(pieces: Sequence[Piece], a: int, b: int) -> List[Piece]:
    """The rows ``[a, b)`` of the pieces' concatenation, as pieces."""
    out, pos = [], 0
    for p in pieces:
        n = len(p)
        lo, hi = max(a - pos, 0), min(b - pos, n)
        if lo < hi:
            if lo == 0 and hi == n:
                out.append(p)
            else:
                rows = np.arange(lo, hi, dtype=np.int64) if p.rows is None else p.rows[lo:hi]
                out.append(Piece(p.input, rows))
        pos += n
        if pos >= b:
            break
    return out


def _take(arr: pa.Array, idx: Optional[pa.Array]) -> pa.Array:
    return arr if idx is None else arr.take(idx)


def take_pieces(pieces: Sequence[Piece]):
    """(key, value, timestamps, headers) of the pieces' rows, materialised (the fallback)."""
    keys, values, ts, hdrs = [], [], [], []
    with_headers = any(p.input.headers is not None for p in pieces)
    for p in pieces:
        inp = p.input
        idx = None if p.rows is None else pa.array(p.rows, pa.int64())
        keys.append(_take(inp.key, idx))
        values.append(_take(inp.value, idx))
        ts.append(inp.timestamps if p.rows is None else inp.timestamps[p.rows])
        if with_headers:
            h = inp.headers if inp.headers is not None else pa.nulls(len(inp), HEADER_TYPE)
            hdrs.append(_take(h, idx))

    def cat(arrs, t):
        return pa.concat_arrays(arrs) if arrs else pa.array([], t)
    return (cat(keys, _BINARY), cat(values, _BINARY),
            np.concatenate(ts) if ts else np.zeros(0, np.int64),
            cat(hdrs, HEADER_TYPE) if with_headers else None)


def encode_pieces(pieces: Sequence[Piece], bounds: Sequence[int], *, magic: int,
                  compression: int, level: Optional[int] = None) -> List[EncodedBatch]:
    """:func:`encode_chunks` of the pieces' concatenation, taken from their input batches."""
    key, value, ts, headers = take_pieces(pieces)
    return encode_chunks(key, value, ts, headers, bounds, magic=magic, compression=compression,
                         level=level)


# -- magic 0/1 (and a reference path) -----------------------------------------------------------

def to_records(key: pa.Array, value: pa.Array, timestamps: np.ndarray,
               headers: Optional[pa.Array]) -> List[Record]:
    """The rows as :class:`Record` objects (the record-at-a-time path)."""
    keys, values = key.to_pylist(), value.to_pylist()
    ts = np.asarray(timestamps, dtype=np.int64).tolist()
    if headers is None:
        hdrs = [()] * len(values)
    else:
        hdrs = [() if h is None else tuple((d["key"].decode("utf-8"), d["value"]) for d in h)
                for h in headers.to_pylist()]
    return [Record(k, v, t, h) for k, v, t, h in zip(keys, values, ts, hdrs)]


def encode_chunks(key: pa.Array, value: pa.Array, timestamps: np.ndarray,
                  headers: Optional[pa.Array], bounds: Sequence[int], *, magic: int,
                  compression: int, level: Optional[int] = None) -> List[EncodedBatch]:
    """Encode row ranges as batches of ``magic`` (the vectorised path for magic 2)."""
    if magic == MAGIC_V2:
        return encode_v2_chunks(key, value, timestamps, headers, bounds, compression, level)
    records = to_records(key, value, timestamps, headers)
    out = []
    for a, b in zip(bounds[:-1], bounds[1:]):
        chunk = records[a:b]
        if magic == 0:
            chunk = [r._replace(timestamp=-1, headers=()) for r in chunk]
        elif any(r.headers for r in chunk):
            raise InvalidRecordError(f"message format {magic} has no record headers")
        out.append(encode_records(chunk, magic=magic, compression=compression))
    return out


# -- Kafka's default partitioner over a column --------------------------------------------------

_M = np.uint32(0x5BD1E995)
#: The C murmur2 kernels of ``_encode_accel`` (same bits, much faster), or None for the numpy
#: code below, their fallback and reference; tests swap them to compare the two. ``getattr``:
#: an extension built before they existed still serves ``_encode_records``.
_murmur2_hashes = getattr(accel.ENCODE, "murmur2_hashes", None)
_murmur2_partitions = getattr(accel.ENCODE, "murmur2_partitions", None)


def murmur2_array(arr: pa.Array) -> np.ndarray:
    """Kafka's ``Utils.murmur2`` of every element of a binary array (uint32; nulls give junk:
    callers mask them)."""
    arr = arr.cast(pa.binary()) if not pa.types.is_binary(arr.type) else arr
    n = len(arr)
    if _murmur2_hashes is not None:
        h = np.empty(n, np.uint32)
        _murmur2_hashes(arr, h)   # a null hashes as b"", as below
        return h
    if n == 0:
        return np.zeros(0, np.uint32)
    offs = np.frombuffer(arr.buffers()[1], dtype=np.int32)[arr.offset:arr.offset + n + 1]
    offs = offs.astype(np.int64)
    data_buf = arr.buffers()[2]
    data = (np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None
            else np.zeros(0, np.uint8))
    start, length = offs[:-1], np.diff(offs)
    if arr.null_count:
        length = np.where(arr.is_null().to_numpy(zero_copy_only=False), 0, length)
    h = (np.uint32(0x9747B28C) ^ length.astype(np.uint32)).astype(np.uint32)
    n4 = length >> 2
    idx = np.arange(n)
    j = 0
    with np.errstate(over="ignore"):
        while True:
            idx = idx[n4[idx] > j]
            if not len(idx):
                break
            p = start[idx] + 4 * j
            k = (data[p].astype(np.uint32) | (data[p + 1].astype(np.uint32) << 8)
                 | (data[p + 2].astype(np.uint32) << 16) | (data[p + 3].astype(np.uint32) << 24))
            k = k * _M
            k ^= k >> np.uint32(24)
            k = k * _M
            h[idx] = (h[idx] * _M) ^ k
            j += 1
        rest = length & 3
        tail = start + (n4 << 2)
        for r_min, shift, pos in ((3, 16, 2), (2, 8, 1)):
            sel = np.flatnonzero(rest >= r_min)
            if len(sel):
                h[sel] ^= data[tail[sel] + pos].astype(np.uint32) << np.uint32(shift)
        sel = np.flatnonzero(rest >= 1)
        if len(sel):
            h[sel] ^= data[tail[sel]].astype(np.uint32)
            h[sel] = h[sel] * _M
        h ^= h >> np.uint32(13)
        h = h * _M
        h ^= h >> np.uint32(15)
    return h


def partitions_for_keys(arr: pa.Array, num_partitions: int) -> np.ndarray:
    """``toPositive(murmur2(key)) % numPartitions`` per element (int64; nulls give junk)."""
    if _murmur2_partitions is not None and num_partitions >= 1:
        arr = arr.cast(pa.binary()) if not pa.types.is_binary(arr.type) else arr
        part = np.empty(len(arr), np.int64)
        _murmur2_partitions(arr, num_partitions, part)
        return part
    h = murmur2_array(arr)
    return (h & np.uint32(0x7FFFFFFF)).astype(np.int64) % num_partitions
