"""The C records builder (``_encode_accel``) and the numpy one in ``arrow_encode`` are twins.

``encode_v2_chunks`` builds the records section of its batches in C when the extension is built,
else with numpy and Arrow kernels. Every comparison here runs the same columns through both, by
swapping the module-level ``arrow_encode._encode_records`` the encoder calls, and requires the
same bytes, which must also be what the record-at-a-time reference ``encode.encode_batch_v2``
writes. When the extension was not built, the comparisons are skipped and the remaining tests
check the numpy path alone.
"""
from __future__ import annotations

import contextlib
import random

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from test_columnar_accel import BYTES, HEADERS, TIMESTAMPS
from pyspark_kafkalog.errors import InvalidRecordError
from pyspark_kafkalog.arrow import arrow_encode
from pyspark_kafkalog.format import accel, codecs
from pyspark_kafkalog.arrow.arrow_encode import (HEADER_TYPE, chunk_bounds, encode_v2_chunks,
                                                  estimated_sizes)
from pyspark_kafkalog.format.batch import V2_HEADER_SIZE
from pyspark_kafkalog.format.columnar import decode_records
from pyspark_kafkalog.format.encode import assign_offsets, encode_batch_v2
from pyspark_kafkalog.format.records import Record

try:
    from pyspark_kafkalog.format import _encode_accel
except ImportError:
    _encode_accel = None

needs_c = pytest.mark.skipif(
    _encode_accel is None,
    reason="the optional C extension pyspark_kafkalog.format._encode_accel is not built "
           "(no compiler at install time?); `pip install -e .` builds it in place")

C = _encode_accel.encode_v2_records if _encode_accel is not None else None
INT64_MAX, INT64_MIN = (1 << 63) - 1, -(1 << 63)


@contextlib.contextmanager
def using(fn):
    saved = arrow_encode._encode_records
    arrow_encode._encode_records = fn
    try:
        yield
    finally:
        arrow_encode._encode_records = saved


# -- building columns -----------------------------------------------------------------------------

def columns(recs):
    """(key, value, timestamps, headers) columns of Records; headers None when no row has any."""
    key = pa.array([r.key for r in recs], pa.binary())
    value = pa.array([r.value for r in recs], pa.binary())
    ts = np.array([r.timestamp for r in recs], dtype=np.int64)
    if not any(r.headers for r in recs):
        return key, value, ts, None
    headers = pa.array([[{"key": k.encode("utf-8"), "value": v} for k, v in r.headers]
                        for r in recs], HEADER_TYPE)
    return key, value, ts, headers


def reference(recs, bounds):
    """What encode_batch_v2 writes for each row range."""
    return [encode_batch_v2(recs[a:b]).data for a, b in zip(bounds[:-1], bounds[1:])]


def assert_reference(got, recs, bounds):
    """``got`` is what encode_batch_v2 writes. Where every timestamp of a batch is below -1 the
    headers differ (encode_batch_v2 keeps Kafka's max timestamp -1, encode_v2_chunks takes the
    largest; the sink never writes negative timestamps), so there only the records are compared."""
    want = reference(recs, bounds)
    assert len(got) == len(want)
    for g, w, a, b in zip(got, want, bounds[:-1], bounds[1:]):
        if max(r.timestamp for r in recs[a:b]) >= -1:
            assert g == w
        else:
            assert g[V2_HEADER_SIZE:] == w[V2_HEADER_SIZE:]


def encode_both(key, value, ts, headers, bounds, compression=codecs.NONE):
    """Batch bytes from the C path and the numpy path; they must agree."""
    with using(None):
        want = [b.data for b in encode_v2_chunks(key, value, ts, headers, bounds, compression)]
    with using(C):
        got = [b.data for b in encode_v2_chunks(key, value, ts, headers, bounds, compression)]
    assert got == want
    return got


def raw_both(key, value, ts, headers, bounds):
    """The records sections themselves: same offsets, same bytes."""
    ts = np.asarray(ts, dtype=np.int64)
    bounds = np.asarray(bounds, dtype=np.int64)
    n = len(value)
    offs, buf = arrow_encode._records_numpy(key, value, ts, headers, bounds, np.diff(bounds), n)
    hrec, hcount = arrow_encode.header_bytes(headers, n)
    c_offs, c_buf = C(key, value, ts, bounds, hrec, hcount, pa.allocate_buffer)
    c_offs = np.frombuffer(c_offs, dtype=np.int64)
    assert c_offs.tolist() == offs.tolist()
    start = int(offs[0])
    assert bytes(memoryview(c_buf)) == bytes(memoryview(buf)[start:start + len(c_buf)])
    assert int(offs[-1]) - start == len(c_buf)


def check(recs, bounds, compression=codecs.NONE):
    key, value, ts, headers = columns(recs)
    got = encode_both(key, value, ts, headers, bounds, compression)
    if compression == codecs.NONE:
        assert_reference(got, recs, bounds)
    raw_both(key, value, ts, headers, bounds)
    return got


# -- the switch -----------------------------------------------------------------------------------

def test_accelerated_flag_follows_the_extension_and_the_environment():
    pure = accel.PURE_PYTHON   # KAFKALOG_PURE_PYTHON=1, read once
    assert arrow_encode.ACCELERATED == (_encode_accel is not None and not pure)
    assert arrow_encode._encode_records is (C if arrow_encode.ACCELERATED else None)


# -- chosen cases ---------------------------------------------------------------------------------

# lengths around each varint size step: 63/64 (1 -> 2 bytes zig-zagged), 8191/8192, 2**20
SIZES = [0, 1, 12, 63, 64, 100, 8191, 8192, 70_000, (1 << 20) + 3]


@needs_c
def test_null_empty_and_long_keys_and_values():
    rng = random.Random(1)
    recs = []
    for i, size in enumerate(SIZES):
        recs.append(Record(rng.randbytes(size), None, 1000 + i))
        recs.append(Record(None, rng.randbytes(size), 1000 + i))
        recs.append(Record(b"" if i % 2 else None, b"" if i % 3 else None, 1000 - i))
    check(recs, [0, len(recs)])
    check(recs, [0, 1, 7, 8, 20, len(recs)])


@needs_c
def test_headers_none_some_and_null_values():
    rng = random.Random(2)
    recs = [Record(b"k%d" % i, rng.randbytes(i % 50), 10 + i,
                   () if i % 3 else (("h", None), ("", b""), ("ключ", rng.randbytes(i))))
            for i in range(40)]
    check(recs, [0, 40])
    check(recs, [0, 13, 14, 40])
    check([r._replace(headers=()) for r in recs], [0, 40])              # no headers at all
    # a header column whose rows are all null or empty takes the no-header path
    key, value, ts, _ = columns(recs)
    for headers in (pa.array([None] * 40, HEADER_TYPE), pa.array([[]] * 40, HEADER_TYPE)):
        got = encode_both(key, value, ts, headers, [0, 40])
        assert got == reference([r._replace(headers=()) for r in recs], [0, 40])
    # many headers on one record: the header count is a varint of its own
    many = tuple((f"h{j}", None if j % 7 == 0 else bytes([j % 256]) * (j % 5)) for j in range(200))
    check([Record(b"k", b"v", 5, many), Record(None, None, 6)], [0, 2])


@needs_c
@pytest.mark.parametrize("start,length", [(0, 37), (3, 30), (5, 1), (13, 24), (36, 1)])
def test_sliced_arrays(start, length):
    rng = random.Random(start)
    recs = [Record(None if i % 4 == 0 else rng.randbytes(i % 9),
                   None if i % 5 == 1 else rng.randbytes(i * 3), 100 + i,
                   () if i % 2 else (("h", None if i % 3 else b"x"),))
            for i in range(37)]
    key, value, ts, headers = columns(recs)
    k, v = key.slice(start, length), value.slice(start, length)
    h, t = headers.slice(start, length), ts[start:start + length]
    assert k.offset == start
    sub = recs[start:start + length]
    bounds = [0, length] if length < 3 else [0, 1, length // 2, length]
    got = encode_both(k, v, t, h, bounds)
    assert got == reference(sub, bounds)
    raw_both(k, v, t, h, bounds)
    # slices of different offsets for key and value (a RecordBatch of sliced columns)
    k2 = pa.concat_arrays([pa.array([b"pad"] * 3, pa.binary()), k]).slice(3)
    got = encode_both(k2, v, t, h, bounds)
    assert got == reference(sub, bounds)


@needs_c
def test_timestamps_far_apart_and_negative_deltas():
    ts = [-1, 0, -1, 2**40, 5, INT64_MAX, INT64_MIN, -1, 1, INT64_MIN, INT64_MAX, 2**62, -(2**62),
          1_700_000_000_000, 1_600_000_000_000]
    recs = [Record(b"k", b"v%d" % i, t) for i, t in enumerate(ts)]
    check(recs, [0, len(recs)])
    check(recs, [0, 1, 2, 5, 6, 7, 11, len(recs)])
    check([r._replace(timestamp=-1) for r in recs], [0, len(recs)])
    check(recs[::-1], [0, 3, len(recs)])
    # timestamps and bounds as strided or read-only numpy arrays (Arrow's to_numpy gives those)
    key, value, ts_col, _ = columns(recs)
    strided = np.repeat(ts_col, 2)[::2]
    readonly = pa.array(ts_col).to_numpy()
    assert not strided.flags.c_contiguous and not readonly.flags.writeable
    bounds = np.repeat(np.array([0, 4, len(recs)], dtype=np.int64), 2)[::2]
    for t in (strided, readonly):
        assert encode_both(key, value, t, None, bounds) == encode_both(key, value, ts_col, None,
                                                                       [0, 4, len(recs)])


@needs_c
def test_many_batches():
    rng = random.Random(5)
    n = 3000
    recs = [Record(None if i % 11 == 0 else rng.randbytes(rng.randrange(20)),
                   rng.randbytes(rng.randrange(200)), 1_700_000_000_000 + rng.randrange(-50, 5000),
                   () if i % 4 else (("a", rng.randbytes(3)),))
            for i in range(n)]
    key, value, ts, headers = columns(recs)
    bounds = chunk_bounds(estimated_sizes(key, value, headers), 8_000, 97)
    assert len(bounds) > 40
    check(recs, bounds)
    check(recs[:300], list(range(301)))      # a batch per record
    # more than 63 rows in one batch: offset deltas of 2 bytes
    check(recs, [0, 2000, n])
    check(recs, [0, n])


@needs_c
def test_single_row():
    check([Record(b"k", b"v", 7)], [0, 1])
    check([Record(None, None, -1)], [0, 1])
    check([Record(b"", b"", INT64_MAX, (("h", None),))], [0, 1])


@needs_c
@pytest.mark.parametrize("codec", [codecs.GZIP, codecs.SNAPPY, codecs.LZ4, codecs.ZSTD])
def test_compressed_batches_agree(codec):
    rng = random.Random(codec)
    recs = [Record(b"key%d" % (i % 10), bytes([i % 7]) * rng.randrange(300), 50 + i)
            for i in range(500)]
    check(recs, [0, 100, 101, 500], codec)


# -- a property -----------------------------------------------------------------------------------

# keys, values, headers and timestamps: the decoder's strategies (test_columnar_accel.py)


@st.composite
def encode_inputs(draw):
    """Records (maybe with a slice prefix to drop) and batch bounds over the kept ones."""
    pad = draw(st.integers(0, 9))
    recs = draw(st.lists(st.builds(Record, BYTES, BYTES, TIMESTAMPS,
                                   st.one_of(st.just(()), HEADERS)),
                         min_size=pad + 1, max_size=pad + 60))
    n = len(recs) - pad
    cuts = draw(st.lists(st.integers(1, n), max_size=6)) if n > 1 else []
    bounds = sorted(set([0, n] + [c for c in cuts if c < n]))
    return recs, pad, bounds


@pytest.mark.slow
@needs_c
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=encode_inputs())
def test_property_c_equals_numpy_equals_reference(data):
    recs, pad, bounds = data
    key, value, ts, headers = columns(recs)
    n = len(recs) - pad
    k, v, t = key.slice(pad), value.slice(pad), ts[pad:]
    h = None if headers is None else headers.slice(pad)
    got = encode_both(k, v, t, h, bounds)
    assert_reference(got, recs[pad:], bounds)
    raw_both(k, v, t, h, bounds)
    assert len(got) == len(bounds) - 1 and n == bounds[-1]


# -- round trip through the decoder ---------------------------------------------------------------

@pytest.mark.parametrize("path", ["c", "numpy"])
def test_encoded_batches_decode_to_the_input_rows(path):
    if path == "c" and C is None:
        pytest.skip("the optional C extension pyspark_kafkalog.format._encode_accel is not built")
    rng = random.Random(9)
    n = 1200
    recs = [Record(None if i % 9 == 0 else rng.randbytes(rng.randrange(30)),
                   None if i % 13 == 0 else rng.randbytes(rng.randrange(300)),
                   rng.choice([-1, 0, 1_700_000_000_000 + i, 2**41 - i]),
                   () if i % 3 else tuple((f"h{j}", None if j == 1 else rng.randbytes(j))
                                          for j in range(i % 4)))
            for i in range(n)]
    key, value, ts, headers = columns(recs)
    bounds = chunk_bounds(estimated_sizes(key, value, headers), 20_000, 150)
    with using(C if path == "c" else None):
        batches = encode_v2_chunks(key, value, ts, headers, bounds, codecs.NONE)
    log, offset = b"", 0
    for batch in batches:
        log += assign_offsets(batch, offset).data
        offset += batch.record_count
    rows = decode_records(log)
    assert [r.offset for r in rows] == list(range(n))
    assert [(r.key, r.value, r.timestamp, r.headers) for r in rows] == [
        (r.key, r.value, r.timestamp, tuple(r.headers)) for r in recs]


# -- errors and limits ----------------------------------------------------------------------------

def _huge(length: int) -> pa.Array:
    """One element of `length` zero bytes that are never touched: calloc'd pages stay unmapped
    until written, so a 1 GiB element costs no memory here."""
    data = pa.py_buffer(np.zeros(length, dtype=np.uint8))
    offsets = pa.py_buffer(np.array([0, length], dtype=np.int32))
    return pa.Array.from_buffers(pa.binary(), 1, [None, offsets, data])


@pytest.mark.parametrize("path", ["c", "numpy"])
def test_too_many_records_for_one_call(path):
    if path == "c" and C is None:
        pytest.skip("the optional C extension pyspark_kafkalog.format._encode_accel is not built")
    big = _huge(1 << 30)            # key + value: 2**31 bytes before any varint
    with using(C if path == "c" else None):
        with pytest.raises(InvalidRecordError, match="too many records for one encode call"):
            encode_v2_chunks(big, big, np.array([0]), None, [0, 1], codecs.NONE)


def outcome(*args):
    try:
        return ("ok", [b.data for b in encode_v2_chunks(*args, codecs.NONE)])
    except Exception as exc:  # noqa: BLE001 - the point is that both paths do the same
        return ("error", type(exc), str(exc))


@needs_c
@pytest.mark.parametrize("case", ["string key", "large_binary value", "chunked key",
                                  "bounds going back", "one timestamp", "too many timestamps",
                                  "2-d timestamps", "short key", "null header key"])
def test_inputs_the_c_code_does_not_take_behave_as_before(case):
    """What the C code does not take goes the numpy way, so odd inputs give what they always
    gave: the same error, or (a broadcast timestamp) the same bytes."""
    value = pa.array([b"x", b"yy"], pa.binary())
    args = {"key": value, "value": value, "ts": [5, 6], "headers": None, "bounds": [0, 2]}
    args.update({
        "string key": {"key": pa.array(["ab", None], pa.string())},
        "large_binary value": {"value": value.cast(pa.large_binary())},
        "chunked key": {"key": pa.chunked_array([value])},
        "bounds going back": {"bounds": [0, 2, 1, 2]},
        "one timestamp": {"ts": [5]},
        "too many timestamps": {"ts": [5, 6, 7]},
        "2-d timestamps": {"ts": [[5, 1], [6, 1]]},
        "short key": {"key": value.slice(1)},
        "null header key": {"headers": pa.array([[{"key": None, "value": b"v"}], None],
                                                HEADER_TYPE)},
    }[case])
    call = (args["key"], args["value"], args["ts"], args["headers"], args["bounds"])
    with using(None):
        want = outcome(*call)
    with using(C):
        got = outcome(*call)
    assert got == want


class FakeArray:
    def __init__(self, n, offset, bufs):
        self.n, self.offset, self.bufs = n, offset, bufs

    def __len__(self):
        return self.n

    def buffers(self):
        return list(self.bufs)


@needs_c
def test_c_checks_what_it_is_given():
    """Called directly with inconsistent inputs, the C function raises; it never reads or
    writes outside a buffer."""
    value = pa.array([b"x", None, b"yyy"], pa.binary())
    ts = np.array([1, 2, 3], dtype=np.int64)
    bounds = np.array([0, 3], dtype=np.int64)
    hc = np.zeros(3, dtype=np.int64)
    alloc = pa.allocate_buffer
    ok_offs, ok_data = C(value, value, ts, bounds, None, hc, alloc)
    assert np.frombuffer(ok_offs, np.int64)[-1] == len(ok_data)
    assert C(value, value, ts, bounds, None, None, alloc)[1] == ok_data   # hcount None = zeros
    with pytest.raises(ValueError, match="elements"):
        C(value.slice(1), value, ts, bounds, None, hc, alloc)
    with pytest.raises(ValueError, match="entries"):
        C(value, value, ts[:2], bounds, None, hc, alloc)
    with pytest.raises(TypeError, match="int64"):
        C(value, value, ts.astype(np.int32), bounds, None, hc, alloc)
    with pytest.raises(TypeError, match="int64"):
        C(value, value, ts.astype(np.uint64), bounds, None, hc, alloc)
    for bad in ([0, 2], [1, 3], [0, 2, 1, 3], [0], [0, 4]):
        with pytest.raises(ValueError, match="bounds"):
            C(value, value, ts, np.array(bad, dtype=np.int64), None, hc, alloc)
    with pytest.raises(TypeError):
        C(value, pa.array([[1]] * 3), ts, bounds, None, hc, alloc)
    # offsets past the data buffer, running backwards, or a buffer too short for them
    # (pyarrow validates offsets when it builds an array: change them afterwards)
    data = pa.py_buffer(b"abcd")
    for offs in ([0, 2, 9, 9], [0, 3, 1, 4], [-1, 0, 0, 0], [0, 1, 2, 5]):
        raw = np.array([0, 1, 2, 3], dtype=np.int32)
        arr = pa.Array.from_buffers(pa.binary(), 3, [None, pa.py_buffer(raw), data])
        raw[:] = offs
        with pytest.raises(ValueError, match="data buffer"):
            C(arr, value, ts, bounds, None, hc, alloc)
    # pyarrow does not build arrays whose buffers are too short: the C code reads only len(),
    # .offset and .buffers(), so a stand-in does
    offsets = np.array([0, 1, 2, 3], dtype=np.int32).tobytes()
    for offset, bufs in ((0, [None, offsets[:12], data]), (1, [None, offsets, data]),
                         (-1, [None, offsets, data]), (0, [b"", offsets, data]),
                         (0, [None, None, data])):
        fake = FakeArray(3, offset, bufs)
        with pytest.raises(ValueError, match="do not fit"):
            C(fake, value, ts, bounds, None, hc, alloc)
    fake = FakeArray(3, 0, [None, offsets, None])      # no data buffer: spans must be empty
    with pytest.raises(ValueError, match="data buffer"):
        C(fake, value, ts, bounds, None, hc, alloc)
    empty = FakeArray(3, 0, [None, bytes(16), None])
    assert C(empty, value, ts, bounds, None, hc, alloc)[1] == C(
        pa.array([b""] * 3, pa.binary()), value, ts, bounds, None, hc, alloc)[1]
    with pytest.raises(ValueError, match="too small"):
        C(value, value, ts, bounds, None, hc, lambda size: bytearray(max(size - 1, 0)))
    with pytest.raises(ZeroDivisionError):
        C(value, value, ts, bounds, None, hc, lambda size: 1 // 0)


def test_assign_offsets_in_place_only_on_writable_data():
    """The sink's batches are stamped where they are (the producer owns them); anything else is
    copied, and the original is left as it was."""
    import pyarrow as pa
    original = encode_batch_v2([Record(b"k", b"v", 1), Record(None, b"w", 2)]).data
    want = assign_offsets(encode_batch_v2([Record(b"k", b"v", 1), Record(None, b"w", 2)]),
                          1000, 7).data
    for make, patched in ((bytes, False), (bytearray, True),
                          (lambda b: memoryview(bytearray(b)), True),
                          (lambda b: memoryview(b), False)):
        data = make(original)
        batch = encode_batch_v2([Record(b"k", b"v", 1), Record(None, b"w", 2)])._replace(data=data)
        moved = assign_offsets(batch, 1000, 7, in_place=True)
        assert bytes(moved.data) == bytes(want) and moved.base_offset == 1000
        assert (moved.data is data) == patched
        assert (bytes(data) == bytes(want)) == patched   # untouched unless patched
    pool = memoryview(pa.allocate_buffer(len(original))).cast("B")
    pool[:] = original
    batch = encode_batch_v2([Record(b"k", b"v", 1)])._replace(data=pool)
    assert assign_offsets(batch, 5, in_place=True).data is pool
