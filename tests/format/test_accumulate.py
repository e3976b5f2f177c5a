"""The sink's accumulators (``arrow/accumulate.py``) and the piece encoder they share.

``BatchAccumulator`` (C ``_encode_accel.Accumulator``) and ``PieceAccumulator`` (the Python
reference) close the same batches, byte for byte, while ``max.message.bytes`` does not bind;
every row comes back once, in order, in its partition; no batch passes ``max.message.bytes``;
``encode_pieces`` (the Python accumulator's route) equals ``encode_v2_chunks`` of its rows.
Seeded loops keep it all deterministic.
"""
from __future__ import annotations

import os
import random
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from kafka.record.memory_records import MemoryRecords
from pyspark_kafkalog.errors import RecordTooLargeError
from pyspark_kafkalog.arrow import accumulate
from pyspark_kafkalog.format import codecs
from pyspark_kafkalog.arrow.accumulate import BatchAccumulator, PieceAccumulator, records_limit
from pyspark_kafkalog.arrow.arrow_encode import (HEADER_TYPE, EncodeInput, Piece,
                                                  encode_pieces, encode_v2_chunks,
                                                  estimated_sizes, slice_pieces, take_pieces)
from pyspark_kafkalog.format.batch import V2_HEADER_SIZE
from pyspark_kafkalog.format.columnar import decode_records
from pyspark_kafkalog.format.encode import assign_offsets

REASON = "the optional C extension _encode_accel is not built"
needs_acc = pytest.mark.skipif(accumulate._Accumulator is None, reason=REASON)
CODECS = [codecs.NONE, codecs.GZIP, codecs.SNAPPY, codecs.LZ4, codecs.ZSTD]
BIG = 10**7   # a max.message.bytes that never binds here


# -- inputs and outputs -------------------------------------------------------------------------

def _bytes(rng):
    c = rng.random()
    return (None if c < 0.1 else b"" if c < 0.2 else
            rng.randbytes(rng.randrange(1, 40) if c < 0.9 else rng.randrange(100, 300)))


def _ts(rng, i, extreme):
    """Mostly rising; some far apart (deltas ~2**62), with ``extreme`` some of -2**63, 2**63-1."""
    c = rng.random()
    if c < 0.6:
        return 1_700_000_000_000 + 7 * i
    if c < 0.9 or not extreme:
        return rng.choice([-1, 0, 2**41, rng.randrange(-2**61, 2**61)])
    return rng.choice([-2**63, 2**63 - 1])


def _headers(rng):
    if rng.random() < 0.3:
        return None   # a null list
    return [(rng.choice(["", "h", "ключ"]), rng.choice([None, b"", rng.randbytes(9)]))
            for _ in range(rng.randrange(4))]


def make_input(rng, n, with_headers, extreme=False):
    """(EncodeInput of sliced Arrow arrays, its rows as (key, value, ts, headers tuple))."""
    pad = rng.randrange(3)
    keys, values = [_bytes(rng) for _ in range(n + pad)], [_bytes(rng) for _ in range(n + pad)]
    ts = [_ts(rng, i, extreme) for i in range(n + pad)]
    hdrs = [_headers(rng) if with_headers else None for _ in range(n + pad)]
    headers = pa.array([None if h is None else [{"key": k.encode(), "value": v} for k, v in h]
                        for h in hdrs], HEADER_TYPE).slice(pad) if with_headers else None
    inp = EncodeInput(pa.array(keys, pa.binary()).slice(pad), pa.array(values, pa.binary())
                      .slice(pad), np.array(ts, np.int64)[pad:], headers)
    return inp, [(k, v, t, tuple(h or ())) for k, v, t, h in zip(keys, values, ts, hdrs)][pad:]


def sizes_of(inp):
    return estimated_sizes(inp.key, inp.value, inp.headers)


def random_parts(rng, n, nparts):
    if rng.random() < 0.2:      # all rows to one partition (PieceAccumulator's shortcut)
        return np.full(n, rng.randrange(nparts), np.int64)
    return np.array([rng.randrange(nparts) for _ in range(n)], np.int64)


def random_case(seed, extreme=False):
    rng = random.Random(seed)
    nparts, with_headers = rng.randint(1, 5), rng.random() < 0.5
    inputs = [make_input(rng, rng.randrange(1, 60), with_headers and rng.random() < 0.8, extreme)
              for _ in range(rng.randint(1, 6))]
    return rng, nparts, inputs, [random_parts(rng, len(i), nparts) for i, _ in inputs]


def accumulators(nparts, codec, records, size, max_bytes):
    """[(name, accumulator)]: the Python one, and the C one when it is built."""
    kw = dict(compression=codec, level=None, batch_records=records, batch_size=size,
              max_message_bytes=max_bytes)
    out = [("python", PieceAccumulator("t", nparts, magic=2, **kw))]
    if accumulate._Accumulator is not None:
        out.append(("c", BatchAccumulator("t", nparts, **kw)))
    return out


def run(acc, inputs, parts):
    """[(closed batches, pending)] for each append, then for the drain."""
    calls = [(acc.append(inp, part, sizes_of(inp)), acc.pending)
             for (inp, _), part in zip(inputs, parts)]
    return calls + [(acc.drain(), acc.pending)]


def decode(data):
    return [(r.key, r.value, r.timestamp, r.headers) for r in decode_records(bytes(data))]


def by_partition(closed, codec):
    """{partition: its batches in order}, as bytes (as records for gzip, zstd, snappy)."""
    out = {}
    for p, b in closed:
        assert b.base_offset == 0 and b.last_offset == b.record_count - 1
        out.setdefault(p, []).append(bytes(b.data) if codec in (codecs.NONE, codecs.LZ4)
                                     else (b.record_count, b.max_timestamp, decode(b.data)))
    return out


def log_of(batches):
    """One partition's batches renumbered from offset 0, back to back."""
    log, offset = b"", 0
    for b in batches:
        log += bytes(assign_offsets(b, offset).data)
        offset += b.record_count
    return log


def routed(inputs, parts, nparts):
    want = {p: [] for p in range(nparts)}
    for (_, rows), part in zip(inputs, parts):
        for row, p in zip(rows, part.tolist()):
            want[p].append(row)
    return want


def check_rows(closed, want):
    """Each partition's batches decode to the rows routed there, in input order."""
    assert {p for p, _ in closed} <= set(want)
    for p, rows in want.items():
        assert decode(log_of([b for q, b in closed if q == p])) == rows, p


# -- the C accumulator is the Python one ----------------------------------------------------------

@needs_acc
@pytest.mark.parametrize("codec", [codecs.NONE, codecs.LZ4, codecs.GZIP])
def test_c_accumulator_equals_python_accumulator(codec):
    for seed in range(150 if codec == codecs.NONE else 50):
        rng, nparts, inputs, parts = random_case(seed, extreme=True)
        (_, py), (_, c) = accumulators(nparts, codec, rng.randint(1, 20), rng.randint(50, 3000),
                                       BIG)
        want, got = run(py, inputs, parts), run(c, inputs, parts)
        for i, ((g, g_pending), (w, w_pending)) in enumerate(zip(got, want)):
            assert g_pending == w_pending, (seed, i)
            assert by_partition(g, codec) == by_partition(w, codec), (seed, i)
        assert len(got) == len(want) and got[-1][1] == 0


@needs_acc
def test_sizes_left_to_the_c_accumulator_are_estimated_sizes():
    """Without headers the C accumulator estimates the sizes itself (the sink's keyed case):
    the same batches as with ``estimated_sizes`` given, nulls and empty values included."""
    for seed in range(120):
        rng = random.Random(5000 + seed)
        nparts = rng.randint(1, 4)
        inputs = [make_input(rng, rng.randrange(1, 60), False) for _ in range(rng.randint(1, 5))]
        parts = [random_parts(rng, len(i), nparts) for i, _ in inputs]
        size = rng.choice([1, 40, 200, 3000])   # 1: every record is a batch of its own
        records = rng.randint(1, 30)
        given, own = (BatchAccumulator("t", nparts, compression=codecs.NONE, level=None,
                                       batch_records=records, batch_size=size,
                                       max_message_bytes=BIG) for _ in range(2))
        for (inp, _), part in zip(inputs, parts):
            assert by_partition(own.append(inp, part), 0) == \
                by_partition(given.append(inp, part, sizes_of(inp)), 0), seed
        assert by_partition(own.drain(), 0) == by_partition(given.drain(), 0), seed


@needs_acc
def test_the_c_accumulator_needs_sizes_with_headers():
    inp, _ = make_input(random.Random(8), 5, True)
    hrec, hcount = inp.header_bytes()
    assert hrec is not None
    acc = accumulate._Accumulator(2, 10, 100, 1000, V2_HEADER_SIZE, pa.allocate_buffer)
    with pytest.raises(ValueError, match="sizes are needed with headers"):
        acc.append(inp.key, inp.value, inp.timestamps, hrec, hcount, np.zeros(5, np.int64), None)
    rows = make_input(random.Random(8), 5, True)[1]
    for impl, acc in accumulators(2, codecs.NONE, 2, 100, BIG):   # the wrappers estimate them
        check_rows(acc.append(inp, np.zeros(5, np.int64)) + acc.drain(), {0: rows, 1: []})


@pytest.mark.parametrize("impl", ["python", "c"])
@pytest.mark.parametrize("codec", [codecs.NONE, codecs.SNAPPY, codecs.ZSTD])
def test_every_row_lands_once_in_order(impl, codec):
    if impl == "c" and accumulate._Accumulator is None:
        pytest.skip(REASON)
    for seed in range(40):
        rng, nparts, inputs, parts = random_case(1000 + seed)
        acc = dict(accumulators(nparts, codec, rng.randint(1, 20), rng.randint(50, 3000),
                                BIG))[impl]
        closed = [b for batches, _ in run(acc, inputs, parts) for b in batches]
        check_rows(closed, routed(inputs, parts, nparts))


def test_kafka_python_reads_the_batches():
    """An independent decoder agrees: CRCs, null keys and values, headers."""
    for seed in range(10):
        rng, nparts, inputs, parts = random_case(2000 + seed)
        want = routed(inputs, parts, nparts)
        for _, acc in accumulators(nparts, codecs.LZ4, 7, 1000, BIG):
            closed = [b for batches, _ in run(acc, inputs, parts) for b in batches]
            for p in range(nparts):
                got = []
                for batch in MemoryRecords(log_of([b for q, b in closed if q == p])):
                    assert batch.validate_crc()
                    got += [(r.key, r.value, r.timestamp, tuple(r.headers)) for r in batch]
                assert got == want[p]


# -- max.message.bytes ------------------------------------------------------------------------

@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("max_bytes", [2000, 3500, 5000])
def test_batches_stay_within_max_message_bytes(codec, max_bytes):
    rng = random.Random(max_bytes + codec)
    inputs, parts = [], []
    for _ in range(4):
        n = rng.randrange(10, 50)
        values = [os.urandom(rng.randrange(100, 700)) for _ in range(n)]   # incompressible
        ts = 1_700_000_000_000 + np.arange(n, dtype=np.int64)
        inputs.append((EncodeInput(pa.array([b"k%d" % i for i in range(n)]), pa.array(values),
                                   ts, None),
                       [(b"k%d" % i, v, int(t), ()) for i, (v, t) in enumerate(zip(values, ts))]))
        parts.append(random_parts(rng, n, 3))
    for impl, acc in accumulators(3, codec, 1000, 10**6, max_bytes):
        closed = [b for batches, _ in run(acc, inputs, parts) for b in batches]
        assert max(len(b.data) for _, b in closed) <= max_bytes, impl
        assert any(b.record_count > 1 for _, b in closed), impl
        check_rows(closed, routed(inputs, parts, 3))


@pytest.mark.parametrize("codec", CODECS)
def test_a_single_record_too_big_is_refused(codec):
    inp = EncodeInput(pa.array([b"a", b"b", b"c"]), pa.array([b"s", os.urandom(3000), b"s"]),
                      np.array([1, 2, 3], np.int64), None)
    for batch_size in (100, 10**6):     # closed by append, or only by drain
        for impl, acc in accumulators(2, codec, 100, batch_size, 2000):
            with pytest.raises(RecordTooLargeError, match="max.message.bytes") as info:
                acc.append(inp, np.array([0, 1, 1], np.int64), sizes_of(inp))
                acc.drain()
            assert "append to t-1 is " in str(info.value), impl
    if codec != codecs.NONE:    # bigger than the limit, but compressed below it: no error
        inp = EncodeInput(pa.nulls(3, pa.binary()), pa.array([bytes(10_000)] * 3),
                          np.arange(3, dtype=np.int64), None)
        for impl, acc in accumulators(1, codec, 100, 10**6, 2000):
            closed = acc.append(inp, np.zeros(3, np.int64), sizes_of(inp)) + acc.drain()
            assert all(len(b.data) <= 2000 for _, b in closed), impl
            check_rows(closed, {0: [(None, bytes(10_000), i, ()) for i in range(3)]})


@pytest.mark.parametrize("bad", [-1, 3, 2**40])
def test_a_partition_out_of_range_is_a_value_error(bad):
    inp, _ = make_input(random.Random(5), 4, True)
    for impl, acc in accumulators(3, codecs.NONE, 10, 10**5, BIG):
        with pytest.raises(ValueError, match=rf"row 2 has partition {bad}\b") as info:
            acc.append(inp, np.array([0, 2, bad, 1], np.int64), sizes_of(inp))
        assert not isinstance(info.value, RecordTooLargeError), impl


# -- records_limit and max_compressed_size ----------------------------------------------------

def _seeded(seed, n, alphabet=256):
    return bytes(b % alphabet for b in random.Random(seed).randbytes(n))


DATA = st.one_of(st.binary(max_size=2000), st.integers(0, 200_000).map(bytes),
                 st.builds(_seeded, st.integers(0, 2**32), st.integers(0, 200_000)),
                 st.builds(_seeded, st.integers(0, 2**32), st.integers(0, 70_000), st.just(4)))


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(data=DATA)
def test_max_compressed_size_bounds_every_codec(data):
    for codec, level in [(c, None) for c in CODECS] + [(codecs.GZIP, 0), (codecs.GZIP, 9),
                                                       (codecs.LZ4, 9), (codecs.ZSTD, 1)]:
        assert len(codecs.compress(codec, data, level=level)) <= codecs.max_compressed_size(
            codec, len(data)), (codec, level)


def test_max_compressed_size_bounds_random_bytes():
    for n in (0, 1, 100, 32_768, 32_769, 65_536, 65_537, 200_000):
        data = os.urandom(n)
        for codec in CODECS:
            assert len(codecs.compress(codec, data)) <= codecs.max_compressed_size(codec, n)


@pytest.mark.parametrize("codec", CODECS)
def test_records_limit_is_the_largest_that_fits(codec):
    for m in (0, 1, V2_HEADER_SIZE, V2_HEADER_SIZE + 1, 100, 200, 300, 1000, 2000, 65_536,
              1_048_588, 10**7, 2**31 - 1):
        n = records_limit(codec, m)
        assert n >= 0
        if n > 0:
            assert V2_HEADER_SIZE + codecs.max_compressed_size(codec, n) <= m
        assert V2_HEADER_SIZE + codecs.max_compressed_size(codec, n + 1) > m, (m, n)
    assert records_limit(codecs.NONE, 1000) == 1000 - V2_HEADER_SIZE


# -- encode_pieces ---------------------------------------------------------------------------

def random_pieces(rng):
    inputs = [make_input(rng, rng.randrange(0, 30), rng.random() < 0.6) for _ in range(3)]
    pieces, rows = [], []
    for _ in range(rng.randint(1, 6)):
        inp, inp_rows = rng.choice(inputs)
        idx = None if rng.random() < 0.3 else sorted(rng.sample(range(len(inp)),
                                                                rng.randrange(len(inp) + 1)))
        if idx is not None:     # sorted, shuffled, maybe a row twice, maybe empty
            if rng.random() < 0.4:
                rng.shuffle(idx)
            idx = np.array(idx + idx[:1] * (rng.random() < 0.2), np.int64)
        pieces.append(Piece(inp, idx))
        rows += inp_rows if idx is None else [inp_rows[i] for i in idx.tolist()]
    return pieces, rows


def reference_chunks(rows, with_headers, bounds, codec):
    headers = pa.array([[{"key": k.encode(), "value": v} for k, v in r[3]] for r in rows],
                       HEADER_TYPE) if with_headers else None
    return encode_v2_chunks(pa.array([r[0] for r in rows], pa.binary()),
                            pa.array([r[1] for r in rows], pa.binary()),
                            np.array([r[2] for r in rows], np.int64), headers, bounds, codec)


@pytest.mark.parametrize("codec", [codecs.NONE, codecs.LZ4, codecs.GZIP])
def test_encode_pieces_equals_chunks_of_the_taken_rows(codec):
    rng = random.Random(7 + codec)
    for _ in range(150):
        pieces, rows = random_pieces(rng)
        n = len(rows)
        if n == 0:
            assert encode_pieces(pieces, [0], magic=2, compression=codec) == []
            continue
        bounds = [0] + sorted(rng.sample(range(1, n), rng.randrange(min(n - 1, 6) + 1))) + [n]
        with_headers = any(p.input.headers is not None for p in pieces)
        got = encode_pieces(pieces, bounds, magic=2, compression=codec)
        want = reference_chunks(rows, with_headers, bounds, codec)
        assert by_partition([(0, b) for b in got], codec) == by_partition(
            [(0, b) for b in want], codec)
        assert decode(log_of(got)) == rows
        a = rng.randrange(n + 1)
        b = rng.randrange(a, n + 1)
        key, value, ts, _ = take_pieces(slice_pieces(pieces, a, b))
        assert list(zip(key.to_pylist(), value.to_pylist(), ts.tolist())) == [
            r[:3] for r in rows[a:b]]


# -- the C functions keep memory safe ---------------------------------------------------------

@needs_acc
def test_accumulator_checks_its_arguments():
    A, alloc = accumulate._Accumulator, pa.allocate_buffer
    for args in ((0, 10, 100, 1000), (2**24 + 1, 10, 100, 1000), (2, 0, 100, 1000),
                 (2, 10, 0, 1000), (2, 10, 100, 0), (2, 10, 100, 2**31)):
        with pytest.raises(ValueError):
            A(*args, V2_HEADER_SIZE, alloc)
    acc = A(2, 10, 100, 1000, V2_HEADER_SIZE, alloc)
    inp, _ = make_input(random.Random(4), 3, False)
    k, v, ts, part, sizes = inp.key, inp.value, inp.timestamps, np.zeros(3, np.int64), sizes_of(inp)
    for args, error, match in (((k, v, ts, None, None, part[:2], sizes), ValueError, "partitions"),
                               ((k, v, ts, None, None, part, sizes[:2]), ValueError, "sizes"),
                               ((k, v, ts, None, None, part.astype(np.int32), sizes), TypeError,
                                "int64"),
                               ((k.slice(1), v, ts, None, None, part, sizes), ValueError,
                                "elements")):
        with pytest.raises(error, match=match):
            acc.append(*args)
    assert acc.pending == 0 and acc.drain() == []
    small = A(1, 10, 10**6, 10**6, V2_HEADER_SIZE, lambda size: bytearray(size - 1))
    with pytest.raises(ValueError, match="too small"):
        small.append(k, v, ts, None, None, part, sizes)


REENTRANT = """
import sys, numpy as np, pyarrow as pa
from pyspark_kafkalog.format import _encode_accel as C
from pyspark_kafkalog.arrow.arrow_encode import v2_header
from pyspark_kafkalog.format.columnar import decode_records
one = lambda n, v: (pa.nulls(n, pa.binary()), pa.array(v), np.arange(n, dtype=np.int64), None,
                    None, np.zeros(n, np.int64), np.full(n, 10, np.int64))
calls = []
def alloc(size):
    calls.append(size)
    if len(calls) == 2:     # while append grows partition 0's open batch
        acc.append(*one(1, [b"q" * 500_000])) if sys.argv[1] == "append" else acc.drain()
    return bytearray(size)
acc = C.Accumulator(1, 1000, 10**9, 10**8, 61, alloc)
try:
    acc.append(*one(2, [b"x" * 40_000, b"y" * 40_000]))
    closed = acc.drain()
except Exception:
    sys.exit(0)     # refusing is fine
for _, buf, end, count, base_ts, max_ts in closed:      # what comes out must be valid
    batch = v2_header(memoryview(buf)[:end], count, base_ts, max_ts, 0)
    assert [r.offset for r in decode_records(bytes(batch.data))] == list(range(count))
"""


@needs_acc
@pytest.mark.parametrize("reenter", ["append", "drain"])
def test_a_reentrant_allocate_cannot_break_the_accumulator(reenter):
    proc = subprocess.run([sys.executable, "-c", REENTRANT, reenter], capture_output=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr.decode()[-500:]


# -- buffers grow ------------------------------------------------------------------------------

@pytest.mark.parametrize("codec", [codecs.NONE, codecs.LZ4])
def test_big_records_grow_the_buffers(codec):
    rng = random.Random(11)
    big = [os.urandom(300_000), os.urandom(100_000), os.urandom(70_000)]
    values = [b"s"] + big + [rng.randbytes(rng.randrange(60)) for _ in range(6000)] + big[:1]
    n = len(values)
    keys = [b"%d" % i for i in range(n)]
    part = np.array([i % 2 if i > 4 else 0 for i in range(n)], np.int64)
    want = {p: [(k, v, i, ()) for i, (k, v) in enumerate(zip(keys, values)) if part[i] == p]
            for p in range(2)}
    for batch_size in (10**6, 1000):
        for impl, acc in accumulators(2, codec, 5000, batch_size, 2**24):
            closed = []
            for a in range(0, n, 700):    # several appends: batches stay open between them
                inp = EncodeInput(pa.array(keys[a:a + 700]), pa.array(values[a:a + 700]),
                                  np.arange(a, min(a + 700, n), dtype=np.int64), None)
                closed += acc.append(inp, part[a:a + 700], sizes_of(inp))
            check_rows(closed + acc.drain(), want)


# -- an empty input ------------------------------------------------------------------------------

def test_an_empty_input_batch_closes_nothing():
    empty = pa.array([], pa.binary())
    inp = EncodeInput(empty, empty, np.zeros(0, np.int64), None)
    for impl, acc in accumulators(3, codecs.NONE, 5, 100, BIG)[::-1]:
        assert acc.append(inp, np.zeros(0, np.int64), np.zeros(0, np.int64)) == [], impl
        assert acc.pending == 0 and acc.drain() == []
