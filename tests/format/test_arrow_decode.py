"""The fast Arrow route of the reader (``arrow/arrow_decode.py``) against the general decoder.

The fast route may decline a run (it returns None and the reader uses ``decode_columns``), but
when it answers, its Arrow batch must equal what the general decoder gives for the same bytes,
and it must answer for every well-formed run of magic 2 batches whose timestamps Spark can hold:
otherwise the reader would silently have lost its fast path. ``codecs.decompress_into`` must
accept exactly what ``codecs.decompress`` accepts, with the same bytes out.
"""
from __future__ import annotations

import random
import struct

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from support.golden import CASES, GOLDEN
from test_columnar_accel import CODECS, mutate, v2_batches
from pyspark_kafkalog.connector.range_reader import (_assemble, _Constants, arrow_schema,
                                                   to_record_batch)
from pyspark_kafkalog.errors import CorruptRecordError, KafkaLogError
from pyspark_kafkalog.arrow import arrow_decode
from pyspark_kafkalog.format import codecs
from pyspark_kafkalog.arrow.arrow_decode import decode_spark_arrays
from pyspark_kafkalog.format.batch import V2_HEADER_SIZE, iter_headers
from pyspark_kafkalog.format.columnar import decode_columns
from pyspark_kafkalog.format.crc import crc32c
from pyspark_kafkalog.format.encode import encode_batch_v2
from pyspark_kafkalog.format.records import Record

needs_fast = pytest.mark.skipif(not arrow_decode.AVAILABLE,
                                reason="the optional C extension is not built, so the reader "
                                       "always takes the general route")
MAX_MS = (1 << 63) // 1000


def fast(buf, with_headers: bool):
    arrays = decode_spark_arrays(buf, with_headers=with_headers)
    if arrays is None:
        return None
    import numpy as np
    offsets = np.frombuffer(arrays["offset"].buffers()[1], dtype=np.int64, count=arrays["rows"])
    return ("ok", _assemble(arrays, offsets, _Constants("t", 3), arrow_schema(with_headers),
                            with_headers, None, None))


def general(buf, with_headers: bool):
    try:
        cols = decode_columns(buf, skip_control=True, with_headers=with_headers)
        if not len(cols):
            return ("ok", None)
        return ("ok", to_record_batch(cols, "t", 3, arrow_schema(with_headers), with_headers))
    except KafkaLogError as exc:
        return ("error", type(exc).__name__)


def timestamps_fit(buf) -> bool:
    try:
        ts = decode_columns(buf, skip_control=True, with_headers=False).timestamp
    except KafkaLogError:
        return False
    return all(-MAX_MS < t < MAX_MS for t in ts)


def agree(buf, with_headers: bool, must_answer: bool):
    """The fast route equals the general one whenever it answers; returns whether it did."""
    got, want = fast(buf, with_headers), general(buf, with_headers)
    if got is None:
        assert not must_answer, "the fast route declined a well-formed run"
        return False
    assert want[0] == "ok", f"the fast route accepted bytes the general decoder rejects: {want}"
    if want[1] is None:
        assert got[1] is None
    else:
        assert got[1] is not None and got[1].equals(want[1]), (got[1], want[1])
        assert got[1].schema == want[1].schema
    return True


def refresh_crc(buf: bytes) -> bytes:
    """Recompute every whole batch's CRC, so damage reaches the codecs and the record loop."""
    out = bytearray(buf)
    pos = 0
    while pos + V2_HEADER_SIZE <= len(out):
        length = struct.unpack_from(">i", out, pos + 8)[0]
        end = pos + 12 + length
        if length < 0 or end > len(out) or out[pos + 16] != 2:
            break
        struct.pack_into(">I", out, pos + 17, crc32c(bytes(out[pos + 21:end])))
        pos = end
    return bytes(out)


GOLDEN_SEGMENTS = [p for case in CASES for p in sorted((GOLDEN / case).glob("*.log"))]


@needs_fast
@pytest.mark.parametrize("path", GOLDEN_SEGMENTS,
                         ids=[f"{p.parent.name}/{p.name[:20]}" for p in GOLDEN_SEGMENTS])
def test_golden_segments(path):
    data = path.read_bytes()
    headers = list(iter_headers(data))
    clean = bool(headers) and all(h.magic == 2 for h in headers) and general(data, True)[0] == "ok"
    for with_headers in (True, False):
        answered = agree(data, with_headers, must_answer=clean and timestamps_fit(data))
        if any(h.magic < 2 for h in headers):
            assert not answered, "magic 0/1 entries belong to the general decoder"


@pytest.mark.slow
@needs_fast
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=v2_batches(), with_headers=st.booleans(), control=st.booleans())
def test_generated_runs(data, with_headers, control):
    if control:   # a transaction marker in the middle: never returned, on either route
        marker = encode_batch_v2([Record(b"\x00\x00\x00\x00", b"\x00\x00\x00\x00\x00\x00", 5)],
                                 base_offset=2**50, control=True, transactional=True,
                                 producer_id=7, producer_epoch=0)
        data = data + marker.data
    agree(data, with_headers, must_answer=timestamps_fit(data))


def chunk(rng: random.Random) -> bytes:
    out, base = [], rng.choice([0, 5, 2**33])
    for _ in range(rng.randrange(1, 4)):
        recs = []
        for i in range(rng.randrange(1, 30)):
            def field(big=False):
                r = rng.random()
                return None if r < 0.1 else rng.randbytes(rng.randrange(200 if big else 12))
            hdrs = tuple((rng.choice(["a", "trace", ""]), field()) for _ in range(rng.choice([0, 0, 1, 2])))
            recs.append(Record(field(), field(True), 1_700_000_000_000 + rng.randrange(10**6), hdrs))
        b = encode_batch_v2(recs, base_offset=base, compression=rng.choice(CODECS))
        out.append(b.data)
        base = b.last_offset + 1
    return b"".join(out)


def damaged_runs(seed: int, n: int) -> dict:
    rng = random.Random(seed)
    seen = {"answered": 0, "declined": 0}
    for _ in range(n):
        buf = chunk(rng)
        assert agree(buf, True, must_answer=True)
        damaged = mutate(rng, buf)
        if rng.random() < 0.8:
            damaged = refresh_crc(damaged)
        with_headers = rng.random() < 0.5
        seen["answered" if agree(damaged, with_headers, must_answer=False) else "declined"] += 1
    return seen


@needs_fast
def test_damaged_runs_never_disagree():
    seen = damaged_runs(20261121, 600)
    assert seen["answered"] and seen["declined"], seen   # both outcomes were exercised


@needs_fast
def test_timestamps_spark_cannot_hold_go_to_the_general_route():
    buf = encode_batch_v2([Record(b"k", b"v", MAX_MS)]).data
    assert decode_spark_arrays(buf, with_headers=False) is None
    with pytest.raises(CorruptRecordError, match="timestamp"):
        to_record_batch(decode_columns(buf), "t", 0, arrow_schema(False), False)


# -- decompress_into -----------------------------------------------------------------------------

def lz4_frames(rng: random.Random):
    payload = rng.randbytes(rng.randrange(0, 3000)) * rng.randrange(1, 60)
    return codecs.compress(codecs.LZ4, payload, 2), payload


def outcome(fn):
    try:
        return ("ok", bytes(fn()))
    except CorruptRecordError:
        return ("error",)


def test_decompress_into_accepts_what_decompress_accepts():
    import pyarrow as pa
    rng = random.Random(7)
    kinds = {"ok": 0, "error": 0}
    for i in range(1500):
        frame, payload = lz4_frames(rng)
        assert bytes(codecs.decompress_into(codecs.LZ4, frame, 2, pa.allocate_buffer)) == payload
        if i % 3:
            frame = mutate(rng, frame)
        want = outcome(lambda: codecs.decompress(codecs.LZ4, frame, 2))
        got = outcome(lambda: codecs.decompress_into(codecs.LZ4, frame, 2, pa.allocate_buffer))
        assert got == want, frame.hex()
        kinds[want[0]] += 1
    assert kinds["ok"] > 100 and kinds["error"] > 100, kinds


def test_decompress_into_sizes_its_buffer_from_the_input():
    """A frame of many tiny blocks cannot make the reader allocate max-block bytes per block."""
    header = codecs._LZ4_HEADER
    tiny = struct.pack("<I", 1) + b"\x00"          # a 1-byte block: at most a few bytes out
    frame = header + tiny * 10_000 + b"\0\0\0\0"
    asked = []

    def allocate(n):
        asked.append(n)
        return bytearray(n)
    try:
        codecs.decompress_into(codecs.LZ4, frame, 2, allocate)
    except CorruptRecordError:
        pass
    assert asked and asked[0] <= 10_000 * (255 + 64), asked


def test_other_codecs_fall_back_to_decompress():
    payload = b"kafkalog" * 100
    for codec in (codecs.NONE, codecs.GZIP, codecs.SNAPPY, codecs.ZSTD):
        frame = codecs.compress(codec, payload, 2)
        assert bytes(codecs.decompress_into(codec, frame, 2, bytearray)) == payload


def with_payload(batch: bytes, codec: int, payload: bytes) -> bytes:
    """``batch`` (one v2 batch) with another records payload and codec, CRC refreshed."""
    head = bytearray(batch[:V2_HEADER_SIZE])
    struct.pack_into(">i", head, 8, V2_HEADER_SIZE - 12 + len(payload))
    attrs = struct.unpack_from(">h", head, 21)[0]
    struct.pack_into(">h", head, 21, (attrs & ~7) | codec)
    return refresh_crc(bytes(head) + payload)


@needs_fast
def test_lz4_frames_with_block_checksums_take_the_general_route():
    from pyspark_kafkalog.format.codecs import xxh32
    recs = [Record(b"k%d" % i, b"v" * i, 1_700_000_000_000 + i) for i in range(50)]
    plain = encode_batch_v2(recs).data
    records = plain[V2_HEADER_SIZE:]
    import lz4.block
    block = lz4.block.compress(records, store_size=False)
    descriptor = bytes([0x70, 0x40])   # independent blocks + block checksums, 64 KiB blocks
    frame = (b"\x04\x22\x4d\x18" + descriptor + bytes([(xxh32(descriptor) >> 8) & 0xFF])
             + struct.pack("<I", len(block)) + block + struct.pack("<I", xxh32(block))
             + b"\0\0\0\0")
    batch = with_payload(plain, codecs.LZ4, frame)
    assert general(batch, False)[0] == "ok"
    assert agree(batch, False, must_answer=False) is False   # declined, not misread
    ok = with_payload(plain, codecs.LZ4, codecs.compress(codecs.LZ4, records, 2))
    assert agree(ok, False, must_answer=True)


@needs_fast
def test_decompression_failures_decline_and_other_errors_propagate(monkeypatch):
    buf = encode_batch_v2([Record(b"k", b"v" * 100, 5)], compression=codecs.GZIP).data

    def corrupt(codec, view):
        raise CorruptRecordError("bad")
    monkeypatch.setattr(arrow_decode, "_decompress", corrupt)
    assert decode_spark_arrays(buf, with_headers=False) is None

    def broken(codec, view):
        raise MemoryError("out of memory")
    monkeypatch.setattr(arrow_decode, "_decompress", broken)
    with pytest.raises(MemoryError):
        decode_spark_arrays(buf, with_headers=False)
