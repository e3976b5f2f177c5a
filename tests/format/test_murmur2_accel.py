"""Kafka's murmur2 partitioner over a column: the C kernels (``_encode_accel.murmur2_hashes`` /
``murmur2_partitions``), the numpy code of ``arrow_encode`` and the scalar reference
``partitioner.murmur2`` agree bit for bit, and all of them agree with kafka-python's partitioner
and Kafka's own test vectors.

``murmur2_array`` / ``partitions_for_keys`` call the C kernels when the extension is built; the
comparisons swap the module-level ``arrow_encode._murmur2_hashes`` / ``_murmur2_partitions`` to
None for the numpy path, as ``test_encode_accel`` does for the records builder. Without the
extension, the C comparisons are skipped and the numpy path is still checked against the
references.
"""
from __future__ import annotations

import contextlib
import random
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings, strategies as st
from kafka.partitioner.default import murmur2 as kp_murmur2

from test_encode_accel import FakeArray   # the C checks take array look-alikes
from pyspark_kafkalog.arrow import arrow_encode
from pyspark_kafkalog.format import accel
from pyspark_kafkalog.arrow.arrow_encode import murmur2_array, partitions_for_keys
from pyspark_kafkalog.format.partitioner import murmur2, partition_for_key

try:
    from pyspark_kafkalog.format import _encode_accel
except ImportError:
    _encode_accel = None

C_HASHES = getattr(_encode_accel, "murmur2_hashes", None)
C_PARTITIONS = getattr(_encode_accel, "murmur2_partitions", None)

needs_c = pytest.mark.skipif(
    C_HASHES is None,
    reason="the optional C extension pyspark_kafkalog.format._encode_accel is not built (or is "
           "stale, without murmur2_hashes); `pip install -e .` or "
           "`python setup.py build_ext --inplace` builds it in place")

#: Kafka's UtilsTest.testMurmur2 (signed Java ints)
KAFKA_VECTORS = [
    (b"21", -973932308),
    (b"foobar", -790332482),
    (b"a-little-bit-long-string", -985981536),
    (b"a-little-bit-longer-string", -1486304829),
    (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
    (b"abc", 479470107),
]
PARTITION_COUNTS = [1, 2, 3, 7, 12, 100, 1009, 2**31 - 1, 2**31, 2**31 + 1, 2**40]


@contextlib.contextmanager
def using(hashes, partitions):
    saved = arrow_encode._murmur2_hashes, arrow_encode._murmur2_partitions
    arrow_encode._murmur2_hashes, arrow_encode._murmur2_partitions = hashes, partitions
    try:
        yield
    finally:
        arrow_encode._murmur2_hashes, arrow_encode._murmur2_partitions = saved


def numpy_path():
    return using(None, None)


def c_path():
    return using(C_HASHES, C_PARTITIONS)


def ref_hash(key):
    """The scalar reference as uint32 (nulls hash as b"", as the column functions do), checked
    against kafka-python on the way."""
    k = b"" if key is None else key
    h = murmur2(k) & 0xFFFFFFFF
    assert h == kp_murmur2(k) & 0xFFFFFFFF
    return h


def check(arr, counts=PARTITION_COUNTS):
    """Every path gives the reference's hashes and partitions (same dtypes, too)."""
    keys = arr.to_pylist()
    want_h = [ref_hash(k) for k in keys]
    paths = [numpy_path()] + ([c_path()] if C_HASHES is not None else [])
    for path in paths:
        with path:
            h = murmur2_array(arr)
            assert h.dtype == np.uint32 and h.shape == (len(keys),)
            assert h.tolist() == want_h
            for n in counts:
                p = partitions_for_keys(arr, n)
                assert p.dtype == np.int64 and p.shape == (len(keys),)
                assert p.tolist() == [(x & 0x7FFFFFFF) % n for x in want_h]
                assert [int(x) for x, k in zip(p, keys) if k is not None] == \
                    [partition_for_key(k, n) for k in keys if k is not None]


# -- the switch -----------------------------------------------------------------------------------

def test_c_kernels_follow_the_extension_and_the_environment():
    pure = accel.PURE_PYTHON   # KAFKALOG_PURE_PYTHON=1, read once
    on = C_HASHES is not None and not pure
    assert arrow_encode._murmur2_hashes is (C_HASHES if on else None)
    assert arrow_encode._murmur2_partitions is (C_PARTITIONS if on else None)


# -- the same bits on every path ------------------------------------------------------------------

def test_kafka_vectors():
    arr = pa.array([k for k, _ in KAFKA_VECTORS], pa.binary())
    want = [v & 0xFFFFFFFF for _, v in KAFKA_VECTORS]
    assert [murmur2(k) for k, _ in KAFKA_VECTORS] == [v for _, v in KAFKA_VECTORS]
    with numpy_path():
        assert murmur2_array(arr).tolist() == want
    if C_HASHES is not None:
        with c_path():
            assert murmur2_array(arr).tolist() == want
        signed = np.empty(len(arr), np.int32)     # an int32 out holds Java's signed value
        C_HASHES(arr, signed)
        assert signed.tolist() == [v for _, v in KAFKA_VECTORS]
    check(arr)


def test_empty_array():
    check(pa.array([], pa.binary()))
    check(pa.array([b"x", b"y"], pa.binary()).slice(2))


def test_every_length_up_to_20():
    """Every tail length (0-3 bytes) after 0-5 whole blocks, with bytes >= 0x80 (Java's signed
    bytes: the tail must be taken unsigned)."""
    rng = random.Random(20)
    keys = []
    for length in range(21):
        keys += [bytes(rng.randrange(256) for _ in range(length)) for _ in range(8)]
        keys += [b"\xff" * length, b"\x80" * length, b"\x00" * length]
    check(pa.array(keys, pa.binary()))


@pytest.mark.slow
def test_long_keys():
    rng = random.Random(7)
    keys = [rng.randbytes(n) for n in (64, 255, 1000, 4097, 65_537)]
    check(pa.array(keys, pa.binary()), counts=[1, 12, 1009])


@pytest.mark.slow
@needs_c
def test_quarter_megabyte_key_c_equals_numpy():
    """Too long for the scalar references to be quick (the numpy code, too, takes one round of
    numpy calls per 4-byte block of the longest key): the two column paths agree."""
    rng = random.Random(8)
    arr = pa.array([b"k", rng.randbytes((1 << 18) + 3), None, b"abcde"], pa.binary())
    got = []
    for path in (numpy_path(), c_path()):
        with path:
            got.append((murmur2_array(arr).tolist(), partitions_for_keys(arr, 12).tolist()))
    assert got[0] == got[1]


def test_nulls_hash_as_the_empty_key():
    """The column functions give a null the empty key's hash on both paths (callers mask
    nulls: ``choose_partitions`` sends them to the sticky partitioner)."""
    arr = pa.array([None, b"a", None, b"", b"abcdef", None], pa.binary())
    check(arr)
    check(pa.array([None] * 5, pa.binary()))
    check(arr.slice(1, 4))


@pytest.mark.parametrize("start,length", [(0, None), (3, 50), (3, None), (64, 1), (7, 0),
                                          (99, None)])
def test_sliced_arrays(start, length):
    rng = random.Random(start)
    keys = [None if rng.random() < 0.1 else rng.randbytes(rng.randrange(0, 30))
            for _ in range(100)]
    arr = pa.array(keys, pa.binary())
    check(arr.slice(start, length) if length is not None else arr.slice(start))


def test_text_keys_and_large_binary_keys_are_cast():
    keys = [f"user-{i}" for i in range(200)] + [None, "", "ünïcödé"]
    for arr in (pa.array(keys, pa.string()), pa.array(keys, pa.large_string()),
                pa.array([None if k is None else k.encode() for k in keys], pa.large_binary())):
        check_like(pa.array([None if k is None else k.encode() for k in keys], pa.binary()),
                   arr)


def check_like(binary, other):
    """``other`` (another type) gives what its binary cast gives, on every path."""
    check(binary)
    paths = [numpy_path()] + ([c_path()] if C_HASHES is not None else [])
    for path in paths:
        with path:
            assert murmur2_array(other).tolist() == murmur2_array(binary).tolist()
            assert partitions_for_keys(other, 7).tolist() == \
                partitions_for_keys(binary, 7).tolist()


def test_many_keys_like_the_sink():
    keys = [b"key-%08d" % (i % 10_000) for i in range(50_000)]
    check(pa.array(keys, pa.binary()), counts=[1, 12, 1009])


@settings(max_examples=300, deadline=None)
@given(keys=st.lists(st.none() | st.binary(max_size=40), max_size=60),
       start=st.integers(0, 10), n=st.integers(1, 2**31 + 5))
def test_property_c_equals_numpy_equals_reference(keys, start, n):
    check(pa.array(keys, pa.binary()).slice(min(start, len(keys))), counts=[1, 5, n])


# -- what the C code does not take, and what it checks -------------------------------------------

def outcome(fn, *args):
    try:
        with np.errstate(divide="ignore"):
            return "ok", fn(*args).tolist()
    except Exception as exc:   # noqa: BLE001 - the comparison is of the error's type
        return "error", type(exc)


@needs_c
@pytest.mark.parametrize("case", ["zero partitions", "negative partitions", "chunked keys",
                                  "int keys"])
def test_inputs_the_c_code_does_not_take_behave_as_before(case):
    keys = pa.array([b"a", None, b"abcde"], pa.binary())
    args = {"zero partitions": (keys, 0), "negative partitions": (keys, -3),
            "chunked keys": (pa.chunked_array([keys]), 3),
            "int keys": (pa.array([1, 2, 3]), 3)}[case]
    with numpy_path():
        want = outcome(partitions_for_keys, *args), outcome(murmur2_array, args[0])
    with c_path():
        got = outcome(partitions_for_keys, *args), outcome(murmur2_array, args[0])
    assert got == want


@needs_c
def test_choose_partitions_is_the_same_on_both_paths():
    from pyspark_kafkalog.connector.arrow_writer import Sticky, choose_partitions
    rng = random.Random(3)
    keys = pa.array([None if rng.random() < 0.3 else rng.randbytes(rng.randrange(0, 20))
                     for _ in range(2000)], pa.binary())
    sizes = np.full(len(keys), 100, np.int64)
    got = []
    for path in (numpy_path(), c_path()):
        with path:
            got.append(choose_partitions("t", 9, keys, None, sizes,
                                         Sticky(9, 0, 16, 1 << 20)).tolist())
    assert got[0] == got[1]
    assert all(p == partition_for_key(k, 9)
               for p, k in zip(got[0], keys.to_pylist()) if k is not None)


@needs_c
def test_c_checks_what_it_is_given():
    """Called directly with inconsistent inputs, the C functions raise; they never read or
    write outside a buffer."""
    keys = pa.array([b"x", None, b"yyy"], pa.binary())
    h, p = np.empty(3, np.uint32), np.empty(3, np.int64)
    assert C_HASHES(keys, h) is None and C_PARTITIONS(keys, 5, p) is None
    assert h.tolist() == [ref_hash(k) for k in keys.to_pylist()]
    assert p.tolist() == [(x & 0x7FFFFFFF) % 5 for x in h.tolist()]
    for bad in (np.empty(3, np.int64), np.empty(3, np.float32), np.empty(3, np.uint16),
                np.empty((3, 2), np.uint32)[:, 0], bytearray(12), b"\0" * 12):
        with pytest.raises((TypeError, BufferError, ValueError)):
            C_HASHES(keys, bad)
    for bad in (np.empty(3, np.uint32), np.empty(3, np.float64), np.empty(3, np.uint64),
                np.empty(6, np.int64)[::2]):
        with pytest.raises((TypeError, BufferError, ValueError)):
            C_PARTITIONS(keys, 5, bad)
    with pytest.raises(TypeError, match="uint32 or int32"):
        C_HASHES(keys, np.empty(3, np.float32))
    with pytest.raises(TypeError, match="int64"):
        C_PARTITIONS(keys, 5, np.empty(3, np.uint64))
    readonly = np.empty(3, np.int64)
    readonly.flags.writeable = False
    with pytest.raises((TypeError, BufferError, ValueError)):
        C_PARTITIONS(keys, 5, readonly)
    with pytest.raises(ValueError, match="entries"):
        C_HASHES(keys, np.empty(4, np.uint32))
    with pytest.raises(ValueError, match="entries"):
        C_PARTITIONS(keys, 5, np.empty(2, np.int64))
    for n in (0, -1):
        with pytest.raises(ValueError, match="num_partitions"):
            C_PARTITIONS(keys, n, p)
    with pytest.raises(OverflowError):
        C_PARTITIONS(keys, 1 << 64, p)
    with pytest.raises(TypeError):
        C_HASHES(pa.array([[1]] * 3), h)
    # offsets past the data buffer, running backwards, or negative (pyarrow validates offsets
    # when it builds an array: change them afterwards)
    data = pa.py_buffer(b"abcd")
    for offs in ([0, 2, 9, 9], [0, 3, 1, 4], [-1, 0, 0, 0], [0, 1, 2, 5]):
        raw = np.array([0, 1, 2, 3], dtype=np.int32)
        arr = pa.Array.from_buffers(pa.binary(), 3, [None, pa.py_buffer(raw), data])
        raw[:] = offs
        with pytest.raises(ValueError, match="data buffer"):
            C_HASHES(arr, h)
        with pytest.raises(ValueError, match="data buffer"):
            C_PARTITIONS(arr, 5, p)
    # pyarrow does not build arrays whose buffers are too short: a stand-in does
    offsets = np.array([0, 1, 2, 3], dtype=np.int32).tobytes()
    for offset, bufs in ((0, [None, offsets[:12], data]), (1, [None, offsets, data]),
                         (-1, [None, offsets, data]), (0, [b"", offsets, data]),
                         (0, [None, None, data])):
        with pytest.raises(ValueError, match="do not fit"):
            C_HASHES(FakeArray(3, offset, bufs), h)
    with pytest.raises(ValueError, match="data buffer"):   # no data buffer: spans must be empty
        C_HASHES(FakeArray(3, 0, [None, offsets, None]), h)
    empty = np.zeros(4, np.int32).tobytes()                # ... and empty ones read nothing
    C_HASHES(FakeArray(3, 0, [None, empty, None]), h)
    assert h.tolist() == [ref_hash(b"")] * 3
    # a null's offsets are never read (the numpy code forces its length to 0 as well)
    valid = pa.py_buffer(bytes([0b011]))
    arr = FakeArray(3, 0, [valid, np.array([0, 1, 2, 99], np.int32).tobytes(), data])
    C_HASHES(arr, h)
    assert h.tolist() == [ref_hash(b"a"), ref_hash(b"b"), ref_hash(b"")]
    with pytest.raises(TypeError, match="pyarrow binary"):
        C_HASHES(FakeArray(3, 0, [None, offsets]), h)


@needs_c
def test_threads_share_the_c_kernels():
    """The loop runs without the GIL: concurrent calls each get their own, right, answer."""
    rng = random.Random(11)
    arrays = [pa.array([rng.randbytes(rng.randrange(0, 24)) for _ in range(20_000)], pa.binary())
              for _ in range(4)]
    with numpy_path():
        want = [partitions_for_keys(a, 31).tolist() for a in arrays]
    with c_path(), ThreadPoolExecutor(4) as pool:
        for _ in range(3):
            got = list(pool.map(lambda a: partitions_for_keys(a, 31).tolist(), arrays))
            assert got == want
