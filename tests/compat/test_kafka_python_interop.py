"""Interop with kafka-python, our independent second implementation of Kafka's record formats.

Three directions, for magic 0, 1 and 2 and every codec kafka-python supports with each magic:

1. kafka-python writes (``MemoryRecordsBuilder``), we read (``decode_records``): both readers must
   return exactly the same rows from the same bytes, and those rows must be what was written.
2. We write (``encode_records`` & co., ``assign_offsets``, ``assign_log_append_time``),
   kafka-python reads them and validates every CRC.
3. ``PartitionLog.append`` writes a rolled, indexed log; kafka-python reads every ``.log`` segment
   file as it is on disk, and the indexes are checked against Kafka's recovery rule.

What kafka-python cannot do, and how these tests deal with it:

* zstd exists only for magic 2 (Kafka itself refuses zstd with magic 0/1), so it is tested there.
* Snappy needs python-snappy, which is not installed here. Since 0.7 python-snappy is itself a thin
  layer over cramjam's raw snappy, so ``kafka.codec.snappy`` is given that same layer; kafka-python's
  own xerial framing code (the part that matters for interop) is what runs.
* Its builders only produce what a *producer* sends: the magic 2 base offset is always 0 (the
  offset passed to ``append`` becomes the offset delta), compressed legacy wrappers have offset 0
  and timestamp 0, and there is no LogAppendTime. Placing batches in a log and stamping
  LogAppendTime is a broker's job; the helpers below do it the way a broker does (rewrite the
  fields, recompute the CRC with kafka-python's own ``calc_crc32``/``calc_crc32c``), and the
  unpatched producer shapes are tested as well.
* It cannot write control batches; ours are read by kafka-python (direction 2).
* Magic 0 has no timestamps: kafka-python reports ``None`` for timestamp and timestamp type where
  we report -1 (NO_TIMESTAMP / NO_TIMESTAMP_TYPE); rows are normalised to ours.
* kafka-python's magic 2 builder starts ``max_timestamp`` at the first timestamp, Java (and we) at
  -1, so batch max timestamps differ when every timestamp is below -1; records do not.
* Neither kafka-python's writer nor its reader wraps int64 timestamp deltas the way Java does, so
  it cannot be the oracle for a delta that overflows int64 (see test_v2_timestamp_delta_*).

Timestamps: Kafka's writers accept -1 (NO_TIMESTAMP) and 0..2**63-1 for magic 1 and 2; the bytes
can hold any int64 and Kafka's readers accept whatever is there, so records with timestamps below
-1 are written by kafka-python (direction 1) and read by both, but not fed to our encoder.
"""
from __future__ import annotations

import random
import struct
import types
from pathlib import Path

import cramjam
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kafka.codec as kc
from kafka.record.default_records import ControlRecord, DefaultRecordBatch
from kafka.record.legacy_records import LegacyRecordBatch
from kafka.record.memory_records import MemoryRecords, MemoryRecordsBuilder
from kafka.record.util import calc_crc32, calc_crc32c

from pyspark_kafkalog.format.codecs import CODEC_NAMES, GZIP, LZ4, NONE, SNAPPY, ZSTD
from pyspark_kafkalog.format.columnar import decode_records
from pyspark_kafkalog.format.encode import (assign_log_append_time, assign_offsets,
                                            encode_batch_v2, encode_control_batch,
                                            encode_message_set, encode_records)
from pyspark_kafkalog.format.records import (CONTROL_ABORT, CONTROL_COMMIT, CREATE_TIME,
                                             LOG_APPEND_TIME, NO_TIMESTAMP_TYPE, Record)
from pyspark_kafkalog.log.config import LogConfig
from pyspark_kafkalog.log.partition import PartitionLog
from pyspark_kafkalog.storage import open_storage

CODECS_BY_MAGIC = {0: (NONE, GZIP, SNAPPY, LZ4), 1: (NONE, GZIP, SNAPPY, LZ4),
                   2: (NONE, GZIP, SNAPPY, LZ4, ZSTD)}
MATRIX = [(m, c) for m in (0, 1, 2) for c in CODECS_BY_MAGIC[m]]
MATRIX_IDS = [f"m{m}-{CODEC_NAMES[c]}" for m, c in MATRIX]
# (magic, codec, timestamp type): magic 0 has no timestamp type at all
MATRIX_TS = [(m, c, t) for m, c in MATRIX for t in ((CREATE_TIME,) if m == 0 else
                                                    (CREATE_TIME, LOG_APPEND_TIME))]
MATRIX_TS_IDS = [f"m{m}-{CODEC_NAMES[c]}-{'lat' if t else 'create'}" for m, c, t in MATRIX_TS]

LAT = 1_700_000_000_123          # a log append time
INT64_MAX = 2**63 - 1
_rng = random.Random(20240917)
BIG_RANDOM = _rng.randbytes(21_000)                   # incompressible, > 20 KB
BIG_TEXT = b"".join(b"row-%06d;" % i for i in range(2_600))   # compressible, ~26 KB
HEADERS = (("trace", b"abc"), ("null-value", None), ("", b""), ("ünï-cødé", b"\x00\xff"))


@pytest.fixture(autouse=True, scope="module")
def kafka_python_snappy():
    """kafka.codec wants python-snappy; give it the raw-block layer python-snappy wraps."""
    if kc.has_snappy():
        yield
        return
    shim = types.SimpleNamespace(compress=lambda b: bytes(cramjam.snappy.compress_raw(bytes(b))),
                                 decompress=lambda b: bytes(cramjam.snappy.decompress_raw(bytes(b))))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(kc, "snappy", shim)
        assert kc.has_snappy()
        yield


# -- corpus -----------------------------------------------------------------------------------------

def kafka_valid_timestamps():
    return [-1, 0, 1, 1_600_000_000_000, 2**31, 2**40 + 7, 2**62, 1_599_999_999_999]


def corpus(magic: int, *, negative: bool = False) -> list:
    """Batches (lists of Records) covering the awkward cases, for ``magic``."""
    ts = kafka_valid_timestamps()
    if negative and magic > 0:
        ts += [-2, -12_345, -2**62]
    hdr = HEADERS if magic == 2 else ()

    def r(i, key, value, headers=()):
        return Record(key, value, ts[i % len(ts)] if magic else -1, tuple(headers) if magic == 2 else ())

    batches = [
        # null keys, null and empty values, empty keys, headers (one null-valued)
        [r(0, None, b"v0"), r(1, b"k1", None, hdr), r(2, b"", b""), r(3, None, None, hdr[:2]),
         r(4, b"k4", b"x" * 100, hdr[1:2])],
        # one big incompressible value, one big compressible value
        [r(5, b"big", BIG_RANDOM, hdr)],
        [r(6, None, BIG_TEXT), r(7, b"after-big", b"small")],
        # a single record with a null value only (tombstone)
        [r(1, b"tomb", None)],
        # many records in one batch
        [r(i, None if i % 7 == 0 else b"key-%d" % i,
           None if i % 11 == 0 else b"" if i % 13 == 0 else b"value-%d" % i * (i % 5 + 1),
           hdr[: i % 5]) for i in range(400)],
    ]
    if magic:
        # timestamps that are not monotonic, and the extremes (deltas still fit in int64)
        batches.append([Record(b"a", b"1", 2**62, hdr), Record(b"b", b"2", 0), Record(b"c", b"3", -1),
                        Record(b"d", b"4", 5)])
        batches.append([Record(b"max", b"v", INT64_MAX), Record(b"zero", b"v", 0),
                        Record(b"none", b"v", -1)])
        batches.append([Record(b"zero", b"v", 0), Record(b"max", b"v", INT64_MAX)])
    if negative and magic:
        batches.append([Record(b"n", b"v", -2**61), Record(b"p", b"v", 2**62),
                        Record(b"m", b"v", -5)])
        batches.append([Record(b"only-negative", b"v", -17), Record(b"n2", b"v", -99)])
    return [[rec._replace(headers=tuple(rec.headers) if magic == 2 else ()) for rec in b]
            for b in batches]


def expected_rows(batches, magic, first_offset, ts_type=CREATE_TIME, lat=None):
    """What every reader must return: one row per record, offsets following on."""
    rows, off = [], first_offset
    lats = lat if isinstance(lat, list) else [lat] * len(batches)
    for recs, batch_lat in zip(batches, lats):
        for rec in recs:
            if magic == 0:
                ts, tt = -1, NO_TIMESTAMP_TYPE
            elif ts_type == LOG_APPEND_TIME:
                ts, tt = batch_lat, LOG_APPEND_TIME
            else:
                ts, tt = rec.timestamp, CREATE_TIME
            rows.append((off, ts, tt, rec.key, rec.value, tuple(rec.headers) if magic == 2 else ()))
            off += 1
    return rows


# -- the two readers, normalised to one row shape ----------------------------------------------------

def _b(x):
    return None if x is None else bytes(x)


def our_rows(buf, **kw):
    """(rows, [(batch position, magic) per row]) from our decoder (CRCs validated)."""
    recs = decode_records(buf, **kw)
    rows = [(r.offset, r.timestamp, r.timestamp_type, _b(r.key), _b(r.value),
             tuple((k, _b(v)) for k, v in r.headers)) for r in recs]
    return rows, [(r.batch_position, r.magic) for r in recs]


def kp_batches(buf):
    """kafka-python's batches with their positions; every CRC is checked before iterating."""
    out, pos = [], 0
    for batch in MemoryRecords(bytes(buf)):
        assert batch.validate_crc(), f"kafka-python: CRC mismatch in the batch at position {pos}"
        out.append((pos, batch))
        pos += batch.size_in_bytes
    assert pos == len(buf), f"kafka-python stopped at {pos} of {len(buf)} bytes"
    return out


def kp_rows(buf):
    rows, where = [], []
    for pos, batch in kp_batches(buf):
        for rec in batch:
            assert rec.validate_crc(), f"kafka-python: inner message CRC mismatch at {rec.offset}"
            ts = -1 if rec.timestamp is None else rec.timestamp
            tt = NO_TIMESTAMP_TYPE if rec.timestamp_type is None else rec.timestamp_type
            rows.append((rec.offset, ts, tt, rec.key, rec.value,
                         tuple((k, v) for k, v in rec.headers)))
            where.append((pos, batch.magic))
    return rows, where


def assert_rows_equal(actual, expected, who):
    assert len(actual) == len(expected), f"{who}: {len(actual)} records, expected {len(expected)}"
    for i, (a, e) in enumerate(zip(actual, expected)):
        assert a == e, f"{who}: record #{i} differs\n  got      {_short(a)}\n  expected {_short(e)}"


def _short(row):
    return tuple(x[:40] + b"..." if isinstance(x, bytes) and len(x) > 40 else x for x in row)


def assert_same_everywhere(buf, expected):
    ours, our_where = our_rows(buf)
    theirs, their_where = kp_rows(buf)
    assert_rows_equal(theirs, expected, "kafka-python")
    assert_rows_equal(ours, expected, "pyspark_kafkalog")
    assert our_where == their_where, "batch positions / magics differ between the readers"


# -- kafka-python as a writer (plus the broker-side patches a producer never makes) ----------------

def kp_build(magic, codec, records, offset=0, **producer):
    b = MemoryRecordsBuilder(magic, codec, batch_size=1 << 24, offset=offset, **producer)
    for rec in records:
        md = b.append(rec.timestamp, rec.key, rec.value,
                      headers=list(rec.headers) if magic == 2 else None)
        assert md is not None, "kafka-python refused a record"
    b.close()
    return bytearray(b.buffer())


def kp_place(buf: bytearray, magic: int, codec: int, first: int, count: int) -> bytearray:
    """Move a kafka-python batch to offsets first..first+count-1 as a broker would.

    Only fields outside the CRCs change: the v2 base offset, the legacy wrapper offset.
    """
    if magic == 2:
        struct.pack_into(">q", buf, 0, first)
    elif codec:
        struct.pack_into(">q", buf, 0, first + count - 1)   # wrapper offset = last offset
    # uncompressed legacy messages already carry absolute offsets (built with offset=first)
    return buf


def kp_stamp_log_append_time(buf: bytearray, magic: int, now: int) -> bytearray:
    """Set LogAppendTime as a broker does, recomputing CRCs with kafka-python's functions."""
    if magic == 2:
        attrs = struct.unpack_from(">h", buf, 21)[0] | 0x08
        struct.pack_into(">h", buf, 21, attrs)
        struct.pack_into(">q", buf, 35, now)
        struct.pack_into(">I", buf, 17, calc_crc32c(bytes(buf[21:])))
    elif magic == 1:
        pos = 0
        while pos < len(buf):
            end = pos + 12 + struct.unpack_from(">i", buf, pos + 8)[0]
            struct.pack_into(">bq", buf, pos + 17, buf[pos + 17] | 0x08, now)
            struct.pack_into(">I", buf, pos + 12, calc_crc32(bytes(buf[pos + 16:end])))
            pos = end
    return buf


def kp_write_log(magic, codec, batches, first_offset=0, ts_type=CREATE_TIME, lat=None):
    parts, off = [], first_offset
    for recs in batches:
        legacy_relative = magic == 1 and codec   # KIP-31: inner offsets 0..n-1
        buf = kp_build(magic, codec, recs, offset=0 if (magic == 2 or legacy_relative) else off)
        kp_place(buf, magic, codec, off, len(recs))
        if ts_type == LOG_APPEND_TIME:
            kp_stamp_log_append_time(buf, magic, lat)
        parts.append(bytes(buf))
        off += len(recs)
    return b"".join(parts)


# == 1. kafka-python writes, we read ================================================================

@pytest.mark.parametrize("magic,codec,ts_type", MATRIX_TS, ids=MATRIX_TS_IDS)
def test_kafka_python_writes_we_read(magic, codec, ts_type):
    batches = corpus(magic, negative=True)
    buf = kp_write_log(magic, codec, batches, first_offset=1000, ts_type=ts_type, lat=LAT)
    assert_same_everywhere(buf, expected_rows(batches, magic, 1000, ts_type, LAT))


@pytest.mark.parametrize("magic,codec", MATRIX, ids=MATRIX_IDS)
def test_kafka_python_producer_shaped_batches(magic, codec):
    """Unplaced producer output: v2 base offset 0 with the offsets in the deltas, legacy wrappers
    at offset 0 with absolute inner offsets (Kafka reads a 0 wrapper offset as "inner offsets are
    absolute")."""
    batches = corpus(magic)[:3]
    parts, off = [], 0
    for recs in batches:
        parts.append(bytes(kp_build(magic, codec, recs, offset=off)))
        off += len(recs)
    buf = b"".join(parts)
    assert_same_everywhere(buf, expected_rows(batches, magic, 0))


@pytest.mark.parametrize("magic", [0, 1, 2])
def test_kafka_python_mixed_codecs_and_magics_in_one_buffer(magic):
    """A buffer like a segment after codec changes and format upgrades: magic <= ``magic``."""
    parts, expected, off = [], [], 0
    for m in range(magic + 1):
        for codec in CODECS_BY_MAGIC[m]:
            recs = corpus(m)[0]
            parts.append(kp_write_log(m, codec, [recs], first_offset=off))
            expected += expected_rows([recs], m, off)
            off += len(recs)
    assert_same_everywhere(b"".join(parts), expected)


@pytest.mark.parametrize("codec", CODECS_BY_MAGIC[2], ids=[CODEC_NAMES[c] for c in CODECS_BY_MAGIC[2]])
def test_kafka_python_producer_state_is_read(codec):
    recs = corpus(2)[0]
    buf = kp_build(2, codec, recs, transactional=True, producer_id=4242, producer_epoch=7,
                   base_sequence=100)
    struct.pack_into(">q", buf, 0, 50)
    buf = bytes(buf)
    (_, kb), = kp_batches(buf)
    ours = decode_records(buf)
    assert [(r.producer_id, r.producer_epoch, r.is_transactional, r.is_control) for r in ours] == \
        [(kb.producer_id, kb.producer_epoch, kb.is_transactional, kb.is_control_batch)] * len(recs)
    assert (kb.producer_id, kb.producer_epoch, kb.is_transactional) == (4242, 7, True)
    assert_same_everywhere(buf, expected_rows([recs], 2, 50))


# == 2. we write, kafka-python reads ================================================================

def our_write_log(magic, codec, batches, first_offset, ts_type=CREATE_TIME, lat=None,
                  stamp_after=False, leader_epoch=-1):
    """Encode at offset 0, then move each batch with assign_offsets (and maybe stamp LAT later)."""
    parts, encoded, off = [], [], first_offset
    for recs in batches:
        kw = dict(compression=codec)
        if not stamp_after:
            kw.update(timestamp_type=ts_type, log_append_time=lat)
        b = encode_records(recs, magic=magic, **kw)
        assert (b.base_offset, b.last_offset, b.record_count) == (0, len(recs) - 1, len(recs))
        b = assign_offsets(b, off, leader_epoch)
        assert (b.base_offset, b.last_offset) == (off, off + len(recs) - 1)
        if stamp_after and ts_type == LOG_APPEND_TIME:
            b = assign_log_append_time(b, lat)
        parts.append(b.data)
        encoded.append(b)
        off += len(recs)
    return b"".join(parts), encoded


# LogAppendTime either given to the encoder or stamped later with assign_log_append_time
WRITE_CASES = [(m, c, t, False) for m, c, t in MATRIX_TS] + \
    [(m, c, t, True) for m, c, t in MATRIX_TS if t == LOG_APPEND_TIME]
WRITE_IDS = [i + "-encoded" for i in MATRIX_TS_IDS] + \
    [i + "-assigned" for (m, c, t), i in zip(MATRIX_TS, MATRIX_TS_IDS) if t == LOG_APPEND_TIME]


@pytest.mark.parametrize("magic,codec,ts_type,stamp_after", WRITE_CASES, ids=WRITE_IDS)
def test_we_write_kafka_python_reads(magic, codec, ts_type, stamp_after):
    batches = corpus(magic)
    buf, encoded = our_write_log(magic, codec, batches, 123_456, ts_type, LAT, stamp_after)
    assert_same_everywhere(buf, expected_rows(batches, magic, 123_456, ts_type, LAT))
    # batch-level facts agree with what the encoder reported
    kbs = kp_batches(buf)
    if magic == 2:
        assert len(kbs) == len(encoded)
        for (_, kb), eb in zip(kbs, encoded):
            assert (kb.base_offset, kb.last_offset, kb.records_count) == \
                (eb.base_offset, eb.last_offset, eb.record_count)
            assert kb.compression_type == codec and kb.max_timestamp == eb.max_timestamp
            assert kb.timestamp_type == ts_type
    elif codec:
        assert len(kbs) == len(encoded)
        for (_, kb), eb in zip(kbs, encoded):
            assert kb.base_offset == eb.last_offset, "legacy wrapper offset must be the last offset"
            assert kb.compression_type == codec


@pytest.mark.parametrize("magic,codec", MATRIX, ids=MATRIX_IDS)
def test_we_write_at_offset_zero_kafka_python_reads(magic, codec):
    """No assign_offsets at all: the encoders' own base_offset (0 and a large one), called
    directly rather than through encode_records."""
    for base in (0, 2**40):
        recs = corpus(magic)[0]
        if magic == 2:
            b = encode_batch_v2(recs, compression=codec, base_offset=base)
        else:
            b = encode_message_set(recs, magic=magic, compression=codec, base_offset=base)
        assert_same_everywhere(b.data, expected_rows([recs], magic, base))


@pytest.mark.parametrize("codec", CODECS_BY_MAGIC[2], ids=[CODEC_NAMES[c] for c in CODECS_BY_MAGIC[2]])
def test_we_write_v2_batch_fields_kafka_python_reads(codec):
    recs = corpus(2)[0]
    b = encode_batch_v2(recs, compression=codec, producer_id=99, producer_epoch=3, base_sequence=12,
                        transactional=True)
    b = assign_offsets(b, 777, partition_leader_epoch=5)
    (_, kb), = kp_batches(b.data)
    assert (kb.base_offset, kb.leader_epoch, kb.producer_id, kb.producer_epoch, kb.base_sequence,
            kb.is_transactional, kb.is_control_batch) == (777, 5, 99, 3, 12, True, False)
    assert_same_everywhere(b.data, expected_rows([recs], 2, 777))
    # offset gaps inside a batch (as after compaction)
    deltas = [0, 3, 4, 10, 11]
    g = assign_offsets(encode_batch_v2(recs, compression=codec, offset_deltas=deltas), 40)
    want = [(40 + d,) + row[1:] for d, row in zip(deltas, expected_rows([recs], 2, 0))]
    assert_same_everywhere(g.data, want)
    (_, kg), = kp_batches(g.data)
    assert kg.last_offset == 51


@pytest.mark.parametrize("magic,codec", MATRIX, ids=MATRIX_IDS)
def test_payloads_spanning_codec_blocks_both_ways(magic, codec):
    """~170 KB per batch: several 64 KiB lz4 blocks and 32 KiB xerial snappy chunks."""
    ts = 1_700_000_000_000 if magic else -1
    recs = [Record(b"r%d" % i, v, ts + i if magic else -1, HEADERS[:2] if magic == 2 else ())
            for i, v in enumerate([BIG_RANDOM, BIG_TEXT, BIG_RANDOM, BIG_TEXT, BIG_TEXT, BIG_RANDOM,
                                   BIG_TEXT])]
    want = expected_rows([recs, recs], magic, 10)
    assert_same_everywhere(kp_write_log(magic, codec, [recs, recs], first_offset=10), want)
    assert_same_everywhere(our_write_log(magic, codec, [recs, recs], 10)[0], want)


def test_we_write_control_batches_kafka_python_reads():
    parts = [encode_control_batch(t, producer_id=11, producer_epoch=2, timestamp=1_000 + t,
                                  coordinator_epoch=9) for t in (CONTROL_COMMIT, CONTROL_ABORT)]
    buf = assign_offsets(parts[0], 5).data + assign_offsets(parts[1], 6).data
    kinds = []
    for _, kb in kp_batches(buf):
        assert kb.is_control_batch and kb.is_transactional and kb.producer_id == 11
        for rec in kb:
            assert isinstance(rec, ControlRecord) and rec.version == 0
            kinds.append((rec.offset, rec.commit, rec.abort, rec.timestamp))
    assert kinds == [(5, True, False, 1_001), (6, False, True, 1_000)]
    ours = decode_records(buf)
    assert [(r.offset, r.is_control, r.key) for r in ours] == \
        [(5, True, b"\x00\x00\x00\x01"), (6, True, b"\x00\x00\x00\x00")]


@pytest.mark.parametrize("magic,codec", [(m, c) for m, c in MATRIX if m > 0],
                         ids=[i for (m, _), i in zip(MATRIX, MATRIX_IDS) if m > 0])
def test_assign_log_append_time_twice_and_reassign_offsets(magic, codec):
    """A batch stamped, moved, re-stamped (a follower re-appending): CRCs stay valid."""
    recs = corpus(magic)[0]
    b = encode_records(recs, magic=magic, compression=codec)
    b = assign_log_append_time(assign_offsets(b, 10), 5)
    b = assign_offsets(assign_log_append_time(b, LAT), 2**33)
    assert_same_everywhere(b.data, expected_rows([recs], magic, 2**33, LOG_APPEND_TIME, LAT))


def test_v2_timestamp_delta_overflowing_int64_round_trips_like_java():
    """Java computes ``timestamp - baseTimestamp`` and ``baseTimestamp + delta`` in wrapping int64
    arithmetic (MemoryRecordsBuilder / DefaultRecord.readFrom), so a batch holding NO_TIMESTAMP
    (-1) and Long.MAX_VALUE round-trips in Kafka. kafka-python does not wrap either, so it is no
    oracle here; this checks our encoder and decoder against Java's arithmetic."""
    recs = [Record(b"a", b"1", -1), Record(b"b", b"2", INT64_MAX)]
    b = encode_batch_v2(recs)
    got = [r.timestamp for r in decode_records(b.data)]
    assert got == [-1, INT64_MAX], (
        f"BUG in pyspark_kafkalog.format.encode.encode_batch_v2: timestamps [-1, 2**63-1] are "
        f"encoded with a timestamp delta of 2**63, which encode_varint truncates to 64 bits "
        f"without wrapping like Java (delta -2**63), so they decode as {got}")


def test_v2_timestamp_delta_wrapped_by_java_is_decoded():
    """The bytes Java writes for the batch above: delta = -2**63 (wrapped)."""
    from pyspark_kafkalog.format.varint import encode_varint

    def record(offset_delta, ts_delta):
        body = (b"\x00" + encode_varint(ts_delta) + encode_varint(offset_delta) + b"\x02a"
                + b"\x02v" + b"\x00")
        return encode_varint(len(body)) + body

    payload = record(0, 0) + record(1, -2**63)
    header = struct.pack(">qiibIhiqqqhii", 0, 49 + len(payload), -1, 2, 0, 0, 1, -1, INT64_MAX,
                         -1, -1, -1, 2)
    buf = bytearray(header + payload)
    struct.pack_into(">I", buf, 17, calc_crc32c(bytes(buf[21:])))
    try:
        got = [r.timestamp for r in decode_records(bytes(buf))]
    except Exception as exc:   # noqa: BLE001 - the point is which exception
        pytest.fail(f"BUG in pyspark_kafkalog.format.columnar._scan_v2: a Java-written batch with "
                    f"timestamps [-1, 2**63-1] (delta -2**63) raises {type(exc).__name__}: {exc}; "
                    f"Java reads base + delta with int64 wraparound")
    assert got == [-1, INT64_MAX]


# == hypothesis: both directions over random records, codecs and magics =============================

def _records(magic, timestamps):
    headers = st.lists(st.tuples(st.text(max_size=6), st.one_of(st.none(), st.binary(max_size=6))),
                       max_size=3).map(tuple) if magic == 2 else st.just(())
    return st.builds(
        Record,
        st.one_of(st.none(), st.binary(max_size=12)),
        st.one_of(st.none(), st.just(b""), st.binary(max_size=48),
                  st.sampled_from([BIG_RANDOM, BIG_TEXT])),
        timestamps if magic else st.just(-1),
        headers)


KAFKA_TS = st.one_of(st.sampled_from([-1, 0, INT64_MAX // 2]), st.integers(0, 2**62))
ANY_TS = st.one_of(KAFKA_TS, st.integers(-2**61, 2**62))   # deltas always fit in int64


@st.composite
def logs(draw, timestamps):
    """1-4 batches, each with its own magic, codec, timestamp type and 1-15 records."""
    out = []
    for _ in range(draw(st.integers(1, 4))):
        magic = draw(st.sampled_from((0, 1, 2)))
        codec = draw(st.sampled_from(CODECS_BY_MAGIC[magic]))
        ts_type = CREATE_TIME if magic == 0 else draw(st.sampled_from((CREATE_TIME, LOG_APPEND_TIME)))
        lat = draw(st.integers(0, 2**50))
        recs = draw(st.lists(_records(magic, timestamps), min_size=1, max_size=15))
        out.append((magic, codec, ts_type, lat, recs))
    return out, draw(st.integers(0, 2**40))


@pytest.mark.slow
@settings(max_examples=60, deadline=None)
@given(logs(KAFKA_TS), st.booleans())
def test_hypothesis_we_write_kafka_python_reads(spec, stamp_after):
    batches, first = spec
    parts, expected, off = [], [], first
    for magic, codec, ts_type, lat, recs in batches:
        data, _ = our_write_log(magic, codec, [recs], off, ts_type, lat, stamp_after)
        parts.append(data)
        expected += expected_rows([recs], magic, off, ts_type, lat)
        off += len(recs)
    assert_same_everywhere(b"".join(parts), expected)


@pytest.mark.slow
@settings(max_examples=60, deadline=None)
@given(logs(ANY_TS))
def test_hypothesis_kafka_python_writes_we_read(spec):
    batches, first = spec
    parts, expected, off = [], [], first
    for magic, codec, ts_type, lat, recs in batches:
        parts.append(kp_write_log(magic, codec, [recs], off, ts_type, lat))
        expected += expected_rows([recs], magic, off, ts_type, lat)
        off += len(recs)
    assert_same_everywhere(b"".join(parts), expected)


# == 3. whole log: PartitionLog.append, kafka-python reads the segment files ========================

def _kafka_recovery_indexes(entries, base, interval):
    """Kafka's LogSegment.recover() rule, from kafka-python's view of one segment's entries.

    ``entries``: (position, size, last_offset, max_timestamp). Returns (.index, .timeindex) bytes.
    """
    offset_index, time_index = [], []
    valid = last_entry = 0
    max_ts, max_ts_offset = -1, -1

    def maybe_append_time():
        if max_ts > (time_index[-1][0] if time_index else -1):
            time_index.append((max_ts, max_ts_offset))

    for pos, size, last_offset, ts in entries:
        assert pos == valid
        if ts > max_ts:
            max_ts, max_ts_offset = ts, last_offset
        if valid - last_entry > interval:
            offset_index.append((last_offset, valid))
            maybe_append_time()
            last_entry = valid
        valid += size
    maybe_append_time()   # the final entry a closed (or recovered) segment gets
    return (b"".join(struct.pack(">ii", o - base, p) for o, p in offset_index),
            b"".join(struct.pack(">qi", t, o - base) for t, o in time_index))


def _kp_entry_facts(buf, pos, kb):
    """(position, size, last offset, max timestamp) of one entry as Kafka's FileRecords sees it."""
    if isinstance(kb, DefaultRecordBatch):
        return pos, kb.size_in_bytes, kb.last_offset, kb.max_timestamp
    assert isinstance(kb, LegacyRecordBatch)
    ts = struct.unpack_from(">q", buf, pos + 18)[0] if kb.magic == 1 else -1
    return pos, kb.size_in_bytes, kb.base_offset, ts   # a legacy entry's offset is its last


def _log_plan(magics):
    """(magic, codec, records) for each batch to append, cycling codecs, with big and many."""
    plan = []
    for magic in magics:
        codecs_ = CODECS_BY_MAGIC[magic]
        for i, recs in enumerate(corpus(magic) * 2):
            plan.append((magic, codecs_[i % len(codecs_)], recs))
    return plan


LOG_CASES = [((0,), CREATE_TIME), ((1,), CREATE_TIME), ((1,), LOG_APPEND_TIME),
             ((2,), CREATE_TIME), ((2,), LOG_APPEND_TIME), ((0, 1, 2), CREATE_TIME),
             ((0, 1, 2), LOG_APPEND_TIME)]


@pytest.mark.parametrize("magics,ts_type", LOG_CASES,
                         ids=[f"m{''.join(map(str, m))}-{'lat' if t else 'create'}"
                              for m, t in LOG_CASES])
def test_partition_log_segments_read_by_kafka_python(tmp_path, magics, ts_type):
    interval = 512
    props = {"segment.bytes": 30 * 1024, "index.interval.bytes": interval}   # max batch ~28 KB
    if ts_type == LOG_APPEND_TIME:
        props["message.timestamp.type"] = "LogAppendTime"
    storage = open_storage(str(tmp_path))
    log = PartitionLog(storage, "t-0", LogConfig.from_properties(props))
    plan = _log_plan(magics)

    expected, off, now = [], 0, LAT
    # several append calls of 1-3 batches (both the pending and the per-call roll paths)
    i = 0
    while i < len(plan):
        chunk = plan[i:i + 1 + i % 3]
        i += len(chunk)
        batches = [encode_records(recs, magic=m, compression=c) for m, c, recs in chunk]
        result = log.append(batches, now_ms=now)
        assert (result.first_offset, result.last_offset) == \
            (off, off + sum(len(r) for _, _, r in chunk) - 1)
        for m, _, recs in chunk:
            expected += expected_rows([recs], m, off, ts_type, now)
            off += len(recs)
        now += 1_000

    files = sorted((tmp_path / "t-0").glob("*.log"))
    assert len(files) >= 4, f"expected several segments, got {[f.name for f in files]}"
    assert [f.name for f in files] == [Path(s.log_path).name for s in log.segments]

    theirs, ours = [], []
    for path, seg in zip(files, log.segments):
        buf = path.read_bytes()
        base = int(path.name[:-4])
        assert base == seg.base_offset
        seg_rows, _ = kp_rows(buf)
        assert seg_rows, f"{path.name} is empty"
        assert seg_rows[0][0] == base, f"{path.name} starts at offset {seg_rows[0][0]}"
        theirs += seg_rows
        ours += our_rows(buf)[0]
        index = storage.read(seg.path(".index"))
        timeindex = storage.read(seg.path(".timeindex"))
        assert (index, timeindex) == seg.rebuilt_indexes(), f"{path.name}: indexes != rebuilt"
        facts = [_kp_entry_facts(buf, pos, kb) for pos, kb in kp_batches(buf)]
        kafka_index, kafka_timeindex = _kafka_recovery_indexes(facts, base, interval)
        assert index == kafka_index, f"{path.name}: .index differs from Kafka's recovery rule"
        assert timeindex == kafka_timeindex, \
            f"{path.name}: .timeindex differs from Kafka's recovery rule"

    assert [r[0] for r in theirs] == list(range(off)), "offsets are not continuous across segments"
    assert_rows_equal(theirs, expected, "kafka-python over the segment files")
    assert_rows_equal(ours, expected, "pyspark_kafkalog over the segment files")

    # a fresh PartitionLog over the same directory sees the same log
    reopened = PartitionLog(open_storage(str(tmp_path)), "t-0", LogConfig.from_properties(props))
    assert reopened.log_end_offset == off
    cols = reopened.read_columns(0)
    assert list(cols.offset) == list(range(off))
    assert [_b(v) for v in cols.value] == [r[4] for r in expected]
