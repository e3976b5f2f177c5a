"""The C record loop (``_columnar_accel``) and the pure-Python one (``_columnar_py``) are twins.

Every test runs the same input through both implementations, by swapping the module-level
``columnar._scan_v2`` the decoder calls, and requires identical columns, identical Arrow tables,
and identical errors (type, message, position, and the columns left untouched). The pure-Python
loop is the reference; when the extension was not built, the comparisons are skipped and the
rest of the suite tests the Python loop alone.
"""
from __future__ import annotations

import contextlib
import random
import subprocess
import sys
from array import array
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from support.golden import CASES, GOLDEN
from pyspark_kafkalog.errors import CorruptRecordError
from pyspark_kafkalog.format import _columnar_py, accel, codecs, columnar
from pyspark_kafkalog.format.batch import iter_headers
from pyspark_kafkalog.format.columnar import Columns, decode_batch_into, decode_columns, to_arrow
from pyspark_kafkalog.format.encode import encode_batch_v2, encode_message_set
from pyspark_kafkalog.format.records import CREATE_TIME, LOG_APPEND_TIME, Record
from pyspark_kafkalog.format.varint import encode_varint

try:
    from pyspark_kafkalog.format import _columnar_accel
except ImportError:
    _columnar_accel = None

needs_c = pytest.mark.skipif(
    _columnar_accel is None,
    reason="the optional C extension pyspark_kafkalog.format._columnar_accel is not built "
           "(no compiler at install time?); `pip install -e .` builds it in place")

PY = _columnar_py.scan_v2
C = _columnar_accel.scan_v2 if _columnar_accel is not None else None
INT64_MAX, INT64_MIN = (1 << 63) - 1, -(1 << 63)
CODECS = [codecs.NONE, codecs.GZIP, codecs.SNAPPY, codecs.LZ4, codecs.ZSTD]


@contextlib.contextmanager
def using(scan):
    saved = columnar._scan_v2
    columnar._scan_v2 = scan
    try:
        yield
    finally:
        columnar._scan_v2 = saved


def snapshot(cols: Columns) -> dict:
    out = {}
    for name in columnar._GROWING:
        col = getattr(cols, name)
        out[name] = col.tolist() if isinstance(col, array) else bytes(col) if isinstance(
            col, bytearray) else list(col)
    return out


def outcome(fn, cols: Columns):
    """What ``fn(cols)`` did: ('ok', columns) or ('error', type, message, position, columns)."""
    try:
        fn(cols)
    except CorruptRecordError as exc:
        return ("error", type(exc).__name__, str(exc), exc.position, snapshot(cols))
    return ("ok", snapshot(cols))


def seeded_columns() -> Columns:
    """Columns already holding rows (with headers), so appends must continue their offsets."""
    return decode_columns(encode_batch_v2([Record(b"k0", None, 5, (("h", None), ("i", b"v"))),
                                           Record(None, b"v1", 6)]).data)


def both(fn):
    """Run ``fn(cols)`` with each implementation on fresh seeded columns; they must agree."""
    with using(PY):
        want = outcome(fn, seeded_columns())
    with using(C):
        got = outcome(fn, seeded_columns())
    assert got == want
    return want


# -- the switch ------------------------------------------------------------------------------------

def test_accelerated_flag_follows_the_extension_and_the_environment():
    pure = accel.PURE_PYTHON   # KAFKALOG_PURE_PYTHON=1, read once
    assert columnar.ACCELERATED == (_columnar_accel is not None and not pure)
    assert columnar._scan_v2 is (C if columnar.ACCELERATED else PY)


# -- golden corpus ---------------------------------------------------------------------------------

GOLDEN_SEGMENTS = [p for case in CASES for p in sorted((GOLDEN / case).glob("*.log"))]


@needs_c
@pytest.mark.parametrize("path", GOLDEN_SEGMENTS,
                         ids=[f"{p.parent.name}/{p.name[:20]}" for p in GOLDEN_SEGMENTS])
def test_golden_segments_decode_identically(path):
    data = path.read_bytes()
    first = next(iter_headers(data), None)
    lo = (first.last_offset + 3) if first is not None else 0
    for kw in ({}, {"with_headers": False}, {"skip_control": True},
               {"min_offset": lo, "max_offset": lo + 40}):
        want = both(lambda cols: decode_columns(data, cols=cols, **kw))
        if want[0] == "ok":
            with using(PY):
                t_py = to_arrow(decode_columns(data, **kw), batch_fields=True)
            with using(C):
                t_c = to_arrow(decode_columns(data, **kw), batch_fields=True)
            assert t_c.equals(t_py) and t_c.schema == t_py.schema


# -- generated batches -----------------------------------------------------------------------------

BYTES = st.one_of(st.none(), st.just(b""), st.binary(max_size=40),
                  st.binary(min_size=100, max_size=300))
HEADERS = st.lists(st.tuples(st.text(max_size=8), st.one_of(st.none(), st.just(b""),
                                                             st.binary(max_size=20))),
                   max_size=3).map(tuple)
TIMESTAMPS = st.one_of(st.integers(-1, 2**41), st.sampled_from([-1, 0, INT64_MAX, INT64_MIN]),
                       st.integers(INT64_MIN, INT64_MAX))


@st.composite
def v2_batches(draw):
    """Raw bytes of 1-3 magic 2 batches with every feature the record loop handles."""
    out, base = [], draw(st.sampled_from([0, 7, 2**40]))
    for _ in range(draw(st.integers(1, 3))):
        recs = draw(st.lists(st.builds(Record, BYTES, BYTES, TIMESTAMPS, HEADERS),
                             min_size=1, max_size=12))
        steps = draw(st.lists(st.integers(1, 1 << 20), min_size=len(recs), max_size=len(recs)))
        gaps = draw(st.booleans())
        deltas = None
        if gaps:
            deltas, d = [], draw(st.integers(0, 70))
            for s in steps:
                deltas.append(d)
                d += s
        log_append = draw(st.booleans())
        batch = encode_batch_v2(recs, base_offset=base, compression=draw(st.sampled_from(CODECS)),
                                timestamp_type=LOG_APPEND_TIME if log_append else CREATE_TIME,
                                log_append_time=draw(TIMESTAMPS) if log_append else None,
                                offset_deltas=deltas)
        out.append(batch.data)
        base = batch.last_offset + 1
    return b"".join(out)


@pytest.mark.slow
@needs_c
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=v2_batches(), with_headers=st.booleans(), window=st.integers(0, 30))
def test_generated_batches_decode_identically(data, with_headers, window):
    want = both(lambda cols: decode_columns(data, with_headers=with_headers, cols=cols))
    assert want[0] == "ok", want
    both(lambda cols: decode_columns(data, min_offset=window, max_offset=window + 9, cols=cols))
    with using(PY):
        t_py = to_arrow(decode_columns(data, with_headers=with_headers), batch_fields=True)
    with using(C):
        t_c = to_arrow(decode_columns(data, with_headers=with_headers), batch_fields=True)
    assert t_c.equals(t_py) and t_c.schema == t_py.schema


# -- damaged record blobs --------------------------------------------------------------------------

def varint(n: int) -> bytes:
    return encode_varint(n)


def record_bytes(ts_delta, off_delta, key, value, headers) -> bytes:
    body = [b"\x00", varint(ts_delta), varint(off_delta)]
    for field in (key, value):
        body.append(varint(-1) if field is None else varint(len(field)) + field)
    body.append(varint(len(headers)))
    for hk, hv in headers:
        body.append(varint(len(hk)) + hk)
        body.append(varint(-1) if hv is None else varint(len(hv)) + hv)
    body = b"".join(body)
    return varint(len(body)) + body


UTF8_TRAPS = [b"\xc0\x80", b"\xe0\x80\x80", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xf5",
              b"\xc2", b"\xe2\x82", b"\xf0\x9f\x98", b"\x80", b"\xff", b"\xef\xbf\xbf",
              b"\xf0\x90\x80\x80", b"\xf4\x8f\xbf\xbf", b"\xed\x9f\xbf", b"\xee\x80\x80",
              "é€😀".encode()]


def random_blob(rng: random.Random):
    """A records blob (mostly well formed) and its record count."""
    n = rng.randrange(0, 6)
    parts = []
    for i in range(n):
        def field(big=False):
            r = rng.random()
            return (None if r < 0.15 else b"" if r < 0.25 else
                    rng.randbytes(rng.randrange(150 if big else 20)))
        headers = []
        for _ in range(rng.choice([0, 0, 1, 2])):
            hk = (rng.choice(UTF8_TRAPS) if rng.random() < 0.2 else
                  rng.choice([b"trace", b"", "ключ".encode()]))
            headers.append((hk, field()))
        ts = rng.choice([0, 1, -1, 300, 10**6, INT64_MAX, INT64_MIN, rng.randrange(-2**63, 2**63)])
        off = i if rng.random() < 0.8 else rng.randrange(-2**31, 2**31)
        parts.append(record_bytes(ts, off, field(), field(big=True), headers))
    return b"".join(parts), n


def mutate(rng: random.Random, blob: bytes) -> bytes:
    b = bytearray(blob)
    for _ in range(rng.choice([0, 1, 1, 2, 3])):
        op = rng.randrange(6)
        if op == 0 and b:                                   # flip a bit
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
        elif op == 1 and b:                                 # random byte
            b[rng.randrange(len(b))] = rng.randrange(256)
        elif op == 2:                                       # truncate
            del b[rng.randrange(len(b) + 1):]
        elif op == 3:                                       # insert junk / a long varint
            junk = rng.choice([rng.randbytes(rng.randrange(1, 4)), b"\xff" * rng.randrange(9, 12),
                               b"\x80" * 9 + b"\x7f", b"\xfe\xff\xff\xff\x0f"])
            at = rng.randrange(len(b) + 1)
            b[at:at] = junk
        elif op == 4 and b:                                 # delete a byte
            del b[rng.randrange(len(b))]
        else:                                               # a huge or negative length
            at = rng.randrange(len(b) + 1)
            b[at:at] = varint(rng.choice([-2, -1, 2**31, 2**62, INT64_MAX, INT64_MIN]))
    return bytes(b)


def scan_params(rng: random.Random, count: int):
    return (rng.choice([count, count, count, count + 1, max(count - 1, 0), 0, 2**31 - 1]),
            rng.choice([0, 100, INT64_MAX - 2, INT64_MIN, 2**40]),
            rng.choice([0, -1, 1_700_000_000_000, INT64_MAX, INT64_MIN]),
            rng.choice([CREATE_TIME, LOG_APPEND_TIME]),
            rng.choice([-1, 1_700_000_000_123]),
            rng.random() < 0.8)


def compare_scan(blob, count, base_offset, base_ts, ts_type, max_ts, with_headers):
    """Both loops on the same blob, through decode_batch_into's rollback like the real caller."""
    def run(scan, cols):
        mark = cols._mark()
        try:
            scan(blob, count, base_offset, base_ts, ts_type, max_ts, cols, with_headers)
        except BaseException:
            cols._rollback(mark)
            raise
    want = outcome(lambda cols: run(PY, cols), seeded_columns())
    got = outcome(lambda cols: run(C, cols), seeded_columns())
    assert got == want, (blob.hex(), count, base_offset, base_ts, ts_type, max_ts, with_headers)
    if want[0] == "error":
        assert want[-1] == snapshot(seeded_columns()), "a failed batch must leave no trace"
    return want


def fuzz_loop(seed: int, n: int) -> dict:
    """Seeded random blobs through both loops; returns how many ended in each outcome."""
    rng = random.Random(seed)
    kinds: dict = {}
    for _ in range(n):
        blob, count = random_blob(rng)
        if rng.random() < 0.8:
            blob = mutate(rng, blob)
        res = compare_scan(blob, *scan_params(rng, count))
        key = " ".join(res[2].split()[:2]) if res[0] == "error" else "ok"
        kinds[key] = kinds.get(key, 0) + 1
    return kinds


@needs_c
def test_seeded_damaged_blobs_fail_identically():
    kinds = fuzz_loop(20240601, 4000)
    # the loop reached every way a blob can be malformed
    for prefix in ("ok", "record runs", "varint longer", "record length", "negative header",
                   "null header", "record header", "record fields", "batch declares",
                   "record offsets"):
        assert any(k.startswith(prefix) for k in kinds), (prefix, kinds)


@pytest.mark.slow
@needs_c
def test_damaged_blobs_never_crash_the_interpreter():
    """A larger run in a child process, so an out-of-bounds read shows up as a failed test
    with the signal instead of taking pytest down."""
    code = (f"import sys; sys.path.insert(0, {str(Path(__file__).parents[1])!r}); import runpy; "
            f"ns = runpy.run_path({__file__!r}); print(ns['fuzz_loop'](7, 15000))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=str(Path(__file__).parents[2]))
    assert proc.returncode == 0, (
        f"child exited with {proc.returncode} (negative = killed by that signal):\n"
        f"{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")


@pytest.mark.slow
@needs_c
@settings(max_examples=500, deadline=None)
@given(recs=st.lists(st.tuples(st.integers(INT64_MIN, INT64_MAX), st.integers(-5, 40), BYTES,
                               BYTES, st.lists(st.tuples(st.binary(max_size=6), BYTES),
                                               max_size=3)), max_size=5),
       cut=st.integers(0, 400), flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 7)),
                                               max_size=3),
       params=st.randoms(use_true_random=False))
def test_generated_damaged_blobs_fail_identically(recs, cut, flips, params):
    blob = bytearray(b"".join(record_bytes(*r) for r in recs))
    for at, bit in flips:
        if blob:
            blob[at % len(blob)] ^= 1 << bit
    if cut:
        del blob[max(len(blob) - cut, 0):]
    compare_scan(bytes(blob), *scan_params(params, len(recs)))


@needs_c
@pytest.mark.parametrize("key", UTF8_TRAPS + [bytes([b]) for b in range(0x80, 0x100, 7)])
def test_header_keys_are_checked_as_python_decodes_utf8(key):
    blob = record_bytes(0, 0, b"k", b"v", [(key, b"x")])
    want = compare_scan(blob, 1, 0, 0, CREATE_TIME, -1, True)
    try:
        key.decode("utf-8")
        assert want[0] == "ok"
    except UnicodeDecodeError:
        assert want[2] == "record header key is not valid UTF-8"
    assert compare_scan(blob, 1, 0, 0, CREATE_TIME, -1, False)[0] == "ok"


@needs_c
def test_timestamps_wrap_like_java_longs():
    blob = record_bytes(INT64_MAX, 0, None, None, []) + record_bytes(INT64_MIN, 1, None, None, [])
    res = compare_scan(blob, 2, 0, 10, CREATE_TIME, -1, True)
    assert res[1]["timestamp"][-2:] == [INT64_MIN + 9, INT64_MIN + 10]


def test_offsets_outside_int64_are_corruption_not_overflow():
    blob = record_bytes(0, 0, None, None, []) + record_bytes(0, 5, None, None, [])
    for scan in filter(None, (PY, C)):
        cols = Columns()
        with pytest.raises(CorruptRecordError, match="overflow a 64-bit integer"):
            scan(blob, 2, INT64_MAX - 2, 0, CREATE_TIME, -1, cols, True)
        # the row past the end of int64 is a gap: the others alone would fit
        cols = Columns()
        scan(record_bytes(0, 0, None, None, []) + record_bytes(0, -9, None, None, []), 2,
             INT64_MAX, 0, CREATE_TIME, -1, cols, True)
        assert cols.offset.tolist() == [INT64_MAX, INT64_MAX - 9]


# -- columns, Arrow and the magic 0/1 loop ---------------------------------------------------------

def test_columns_are_arrow_ready_and_list_views_agree():
    data = encode_batch_v2([Record(None, b"", 1, (("a", None),)), Record(b"", None, 2),
                            Record(b"key", b"value", 3, (("b", b""), ("c", b"x")))]).data
    cols = decode_columns(data)
    assert bytes(cols.key_data) == b"key" and cols.key_offsets.tolist() == [0, 0, 0, 3]
    assert list(cols.key_valid) == [0, 1, 1] and list(cols.value_valid) == [1, 0, 1]
    assert cols.key == [None, b"", b"key"] and cols.value == [b"", None, b"value"]
    assert cols.header_key == ["a", "b", "c"] and cols.header_value == [None, b"", b"x"]
    assert bytes(cols.header_key_data) == b"abc" and list(cols.header_value_valid) == [0, 1, 1]
    assert cols.header_count.tolist() == [1, 0, 2]


def test_to_arrow_switches_to_large_types_past_int32_offsets(monkeypatch):
    data = encode_batch_v2([Record(b"k", b"v" * 50, 1, (("h", b"x" * 20),)),
                            Record(None, None, 2)]).data
    small = to_arrow(decode_columns(data))
    monkeypatch.setattr(columnar, "_I32_MAX", 10)
    large = to_arrow(decode_columns(data))
    assert str(large.schema.field("value").type) == "large_binary"
    assert str(large.schema.field("headers").type) == (
        "list<item: struct<key: string, value: large_binary>>")
    assert large.to_pylist() == small.to_pylist()


def test_columns_stay_usable_after_to_arrow_shares_their_buffers():
    first = encode_batch_v2([Record(b"a", b"1", 1, (("h", b"x"),))]).data
    second = encode_batch_v2([Record(b"b", None, 2)], base_offset=1).data
    cols = decode_columns(first)
    table = to_arrow(cols)
    decode_columns(second, cols=cols)   # must not hit "cannot resize a buffer with exports"
    assert table.column("key").to_pylist() == [b"a"]
    assert to_arrow(cols).column("key").to_pylist() == [b"a", b"b"]
    assert cols.value == [b"1", None]


@pytest.mark.parametrize("magic", [0, 1])
def test_fused_legacy_loop_matches_the_per_entry_path(magic):
    rng = random.Random(magic)
    recs = [Record(rng.choice([None, b"", b"key"]), rng.choice([None, b"", rng.randbytes(30)]),
                   1_700_000_000_000 + i if magic else -1) for i in range(40)]
    data = b"".join(encode_message_set([r], magic=magic, base_offset=i).data
                    for i, r in enumerate(recs))
    for kw in ({}, {"min_offset": 5, "max_offset": 17}):
        fused = decode_columns(data, **kw)
        general = Columns()
        for h in iter_headers(data):
            if kw and not 5 <= h.last_offset < 17:
                continue
            decode_batch_into(data, h, general)
        assert snapshot(fused) == snapshot(general)
    last = list(iter_headers(data))[-1].position
    damaged = bytearray(data)
    damaged[last + 12] ^= 0x10   # the stored CRC itself: only validation can tell
    with pytest.raises(CorruptRecordError, match="stored CRC") as err:
        decode_columns(bytes(damaged))
    assert err.value.position == last
    assert len(decode_columns(bytes(damaged), validate=False)) == 40
