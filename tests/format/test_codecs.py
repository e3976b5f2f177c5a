"""Tests for format.codecs: Kafka byte compatibility, kafka-python interop, failure modes."""
from __future__ import annotations

import base64
import gzip
import json
import random
import struct
import types

import cramjam
import lz4.frame
import pytest
import xxhash
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

import kafka.codec as kc
from support.shared_paths import GOLDEN, needs_golden
from pyspark_kafkalog.errors import CorruptRecordError, InvalidConfigError, UnsupportedCodecError
from pyspark_kafkalog.format import codecs
from pyspark_kafkalog.format.codecs import (CODEC_NAMES, GZIP, LZ4, NONE, SNAPPY, ZSTD, check_codec,
                                            codec_id, compress, decompress, xxh32)

ALL = [(c, m) for c in CODEC_NAMES for m in (0, 1, 2) if not (c == ZSTD and m < 2)]
COMPRESSED = [(c, m) for c, m in ALL if c != NONE]

_rng = random.Random(1234)
SAMPLES = {
    "empty": b"",
    "one": b"x",
    "text": b"key-1 value hello hello hello " * 50,
    "random-70k": _rng.randbytes(70_000),  # incompressible, spans two lz4 blocks
    "block-edges": bytes(range(256)) * 256 + b"!",  # 65537 bytes: one past a 64 KiB lz4 block
    "big": b"".join(b"record-%08d|" % i + _rng.randbytes(8) for i in range(30_000)),
}


# -- names and ids ---------------------------------------------------------------------------------

def test_constants_match_kafka_attribute_ids():
    assert (NONE, GZIP, SNAPPY, LZ4, ZSTD) == (0, 1, 2, 3, 4)
    assert CODEC_NAMES == {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}


@pytest.mark.parametrize("value,expected", [
    ("none", 0), ("uncompressed", 0), ("GZIP", 1), ("Snappy", 2), ("lz4", 3), ("ZSTD", 4),
    (0, 0), (4, 4),
])
def test_codec_id(value, expected):
    assert codec_id(value) == expected


@pytest.mark.parametrize("bad", ["brotli", "", "producer", 5, -1, True, None, 2.0])
def test_codec_id_rejects(bad):
    with pytest.raises(InvalidConfigError) as info:
        codec_id(bad)
    assert repr(bad) in str(info.value)


# -- xxh32 -----------------------------------------------------------------------------------------

@given(st.binary(max_size=200), st.integers(0, 2**32 - 1))
def test_xxh32_matches_xxhash(data, seed):
    assert xxh32(data, seed) == xxhash.xxh32_intdigest(data, seed)


def test_xxh32_memoryview_and_long_input():
    data = SAMPLES["random-70k"]
    assert xxh32(memoryview(data)[3:]) == xxhash.xxh32_intdigest(data[3:])


# -- round trips -----------------------------------------------------------------------------------

@pytest.mark.parametrize("codec,magic", ALL)
@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_round_trip(codec, magic, name):
    data = SAMPLES[name]
    packed = compress(codec, data, magic)
    assert type(packed) is bytes
    for form in (packed, memoryview(packed), bytearray(packed)):
        out = decompress(codec, form, magic)
        assert type(out) is bytes and out == data


@pytest.mark.parametrize("codec,magic", ALL)
def test_round_trip_memoryview_slice_input(codec, magic):
    buf = b"HEAD" + SAMPLES["text"] + b"TAIL"
    view = memoryview(buf)[4:-4]
    packed = compress(codec, view, magic)
    framed = memoryview(b"\xff" * 7 + packed + b"\xee" * 5)[7:-5]
    assert decompress(codec, framed, magic) == SAMPLES["text"]


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(ALL), st.binary(max_size=3000))
def test_round_trip_property(codec_magic, data):
    codec, magic = codec_magic
    assert decompress(codec, compress(codec, data, magic), magic) == data


@pytest.mark.parametrize("codec,level", [(GZIP, 1), (GZIP, 9), (LZ4, 1), (LZ4, 17), (ZSTD, -5),
                                         (ZSTD, 19)])
def test_levels(codec, level):
    data = SAMPLES["big"]
    assert decompress(codec, compress(codec, data, level=level)) == data


# -- the exact framing Kafka writes ----------------------------------------------------------------

def test_lz4_frame_layout():
    data = SAMPLES["random-70k"] + b"z" * 100_000
    for magic, hc in ((0, 0x1A), (1, 0x82), (2, 0x82)):
        packed = compress(LZ4, data, magic)
        # magic, FLG (v1, independent blocks, no checksums/size), BD (64 KiB), header checksum
        assert packed[:7] == b"\x04\x22\x4d\x18\x60\x40" + bytes([hc])
        assert packed[-4:] == b"\0\0\0\0"
        pos, sizes = 7, []
        while True:
            word = struct.unpack_from("<I", packed, pos)[0]
            pos += 4
            if word == 0:
                break
            sizes.append((word & 0x7FFFFFFF, bool(word >> 31)))
            pos += word & 0x7FFFFFFF
        assert pos == len(packed)
        # 170000 bytes -> 64 KiB, 64 KiB, rest; the first block is random so stored raw
        assert sizes[0] == (65536, True) and not sizes[-1][1] and len(sizes) == 3
    # the v0 header checksum is Kafka's bug: xxh32 over magic + descriptor; v1+ is the real one
    assert (xxhash.xxh32_intdigest(b"\x04\x22\x4d\x18\x60\x40") >> 8) & 0xFF == 0x1A
    assert (xxhash.xxh32_intdigest(b"\x60\x40") >> 8) & 0xFF == 0x82


def test_lz4_v1_frame_is_a_standard_frame():
    data = SAMPLES["big"]
    assert lz4.frame.decompress(compress(LZ4, data, 2)) == data


def test_snappy_xerial_layout():
    data = SAMPLES["big"]
    packed = compress(SNAPPY, data)
    assert packed[:16] == b"\x82SNAPPY\x00" + b"\0\0\0\x01" + b"\0\0\0\x01"
    pos, blocks = 16, []
    while pos < len(packed):
        size = struct.unpack_from(">i", packed, pos)[0]
        blocks.append(cramjam.snappy.decompress_raw(packed[pos + 4:pos + 4 + size]))
        pos += 4 + size
    assert pos == len(packed)
    assert [len(b) for b in blocks[:-1]] == [32 * 1024] * (len(blocks) - 1)  # xerial default
    assert b"".join(bytes(b) for b in blocks) == data
    assert compress(SNAPPY, b"") == packed[:16]  # header only, like SnappyOutputStream


def test_gzip_is_a_gzip_member():
    data = SAMPLES["text"]
    packed = compress(GZIP, data)
    assert packed[:3] == b"\x1f\x8b\x08" and gzip.decompress(packed) == data


# -- what the readers accept -----------------------------------------------------------------------

def _lz4_frame(data, **kw):
    kw.setdefault("block_linked", False)
    return lz4.frame.compress(data, **kw)


def _break_hc(frame):
    """Rewrite a frame's header checksum the way old Kafka computed it (over the magic too)."""
    flg = frame[4]
    end = 14 if flg & 0x08 else 6
    hc = (xxhash.xxh32_intdigest(frame[:end]) >> 8) & 0xFF
    return frame[:end] + bytes([hc]) + frame[end + 1:]


def test_lz4_magic0_accepts_both_checksums_and_newer_magics_verify():
    data = SAMPLES["text"]
    right, wrong = compress(LZ4, data, 2), compress(LZ4, data, 0)
    assert decompress(LZ4, right, 0) == decompress(LZ4, wrong, 0) == data
    for magic in (1, 2):
        assert decompress(LZ4, right, magic) == data
        with pytest.raises(CorruptRecordError, match="descriptor checksum"):
            decompress(LZ4, wrong, magic)


@pytest.mark.parametrize("kw", [
    {},  # lz4.frame stores the content size: Kafka skips it
    {"store_size": False, "content_checksum": True},
    {"block_checksum": True},
    {"block_checksum": True, "content_checksum": True, "block_size": lz4.frame.BLOCKSIZE_MAX4MB},
    {"block_size": lz4.frame.BLOCKSIZE_MAX256KB},
    {"block_size": lz4.frame.BLOCKSIZE_MAX1MB, "compression_level": 12},
])
def test_lz4_reads_foreign_frames(kw):
    data = SAMPLES["big"]
    frame = _lz4_frame(data, **kw)
    for magic in (1, 2):
        assert decompress(LZ4, frame, magic) == data
    assert decompress(LZ4, _break_hc(frame), 0) == data


def test_lz4_block_checksum_is_verified(monkeypatch):
    frame = bytearray(_lz4_frame(SAMPLES["text"], block_checksum=True, store_size=False))
    frame[-5] ^= 1  # last byte of the only block's checksum (the end mark follows)
    for fast in (True, False):
        if not fast:  # the pure-Python fallback when xxhash is absent
            monkeypatch.setitem(codecs._loaded, "xxhash", codecs._MISSING)
        with pytest.raises(CorruptRecordError, match="block checksum"):
            decompress(LZ4, bytes(frame))


def test_lz4_rejects_what_kafka_rejects():
    data = SAMPLES["text"]
    linked = lz4.frame.compress(SAMPLES["big"], block_linked=True)  # dependent blocks
    assert not linked[4] & 0x20
    with pytest.raises(CorruptRecordError, match="independent"):
        decompress(LZ4, linked)
    good = compress(LZ4, data)
    with pytest.raises(CorruptRecordError, match="prematurely"):
        decompress(LZ4, good[:-4])  # no end mark
    assert decompress(LZ4, good + b"trailing") == data  # bytes after the end mark are ignored


def test_snappy_reads_raw_and_concatenated_streams():
    data = SAMPLES["big"]
    assert decompress(SNAPPY, bytes(cramjam.snappy.compress_raw(data))) == data
    assert decompress(SNAPPY, compress(SNAPPY, data) + compress(SNAPPY, b"tail")) == data + b"tail"
    assert decompress(SNAPPY, compress(SNAPPY, b"")) == b""
    assert decompress(SNAPPY, compress(SNAPPY, data) + b"\0\0") == data  # like SnappyInputStream


def test_gzip_reads_multi_member_and_ignores_trailing_garbage():
    a, b = SAMPLES["text"], SAMPLES["random-70k"]
    assert decompress(GZIP, gzip.compress(a) + compress(GZIP, b)) == a + b
    assert decompress(GZIP, compress(GZIP, a) + b"\0" * 20) == a  # as GZIPInputStream does


def test_zstd_reads_streamed_and_concatenated_frames():
    data = SAMPLES["big"]
    cctx = zstandard.ZstdCompressor(write_content_size=False)
    chunker = cctx.compressobj()
    streamed = chunker.compress(data) + chunker.flush()
    assert zstandard.frame_content_size(streamed) == -1  # what zstd-jni's stream writes
    assert decompress(ZSTD, streamed) == data
    both = streamed + compress(ZSTD, b"tail") + cctx.compress(b"")
    assert decompress(ZSTD, both) == data + b"tail"
    assert decompress(ZSTD, b"") == b""  # zstd-jni: an empty source is an empty stream
    for bad in (streamed[:-3], b"\x28\xb5\x2f\xfd garbage"):  # the cached context survives
        with pytest.raises(CorruptRecordError):
            decompress(ZSTD, bad)
        assert decompress(ZSTD, streamed) == data


# -- errors ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("codec", [5, 7, -1, 99])
def test_unknown_codec(codec):
    for call in (lambda: check_codec(codec, 2), lambda: compress(codec, b"x"),
                 lambda: decompress(codec, b"x")):
        with pytest.raises(UnsupportedCodecError, match=str(codec)):
            call()


@pytest.mark.parametrize("magic", [0, 1])
def test_zstd_needs_magic_2(magic):
    with pytest.raises(UnsupportedCodecError, match="magic"):
        check_codec(ZSTD, magic)
    with pytest.raises(UnsupportedCodecError):
        compress(ZSTD, b"x", magic)
    with pytest.raises(UnsupportedCodecError):
        decompress(ZSTD, compress(ZSTD, b"x"), magic)


@pytest.mark.parametrize("codec,module,pip", [(LZ4, "lz4.block", "lz4"),
                                              (SNAPPY, "cramjam", "cramjam"),
                                              (ZSTD, "zstandard", "zstandard")])
def test_missing_library(monkeypatch, codec, module, pip):
    real = codecs._import

    def fake_import(name):
        if name == module:
            raise ImportError(f"No module named {name!r}")
        return real(name)

    packed = compress(codec, b"data")
    monkeypatch.setattr(codecs, "_loaded", {})
    monkeypatch.setattr(codecs, "_import", fake_import)
    for call in (lambda: check_codec(codec, 2), lambda: compress(codec, b"data"),
                 lambda: decompress(codec, packed)):
        with pytest.raises(UnsupportedCodecError, match=f"pip install {pip}"):
            call()
    assert decompress(GZIP, compress(GZIP, b"data")) == b"data"  # other codecs still work


GARBAGE = [b"\xff", b"not compressed at all", bytes(range(256)) * 4]


@pytest.mark.parametrize("codec,magic", COMPRESSED)
@pytest.mark.parametrize("garbage", GARBAGE)
def test_garbage_is_corrupt(codec, magic, garbage):
    with pytest.raises(CorruptRecordError):
        decompress(codec, garbage, magic)


@pytest.mark.parametrize("codec,magic", [(c, m) for c, m in COMPRESSED if c != ZSTD] + [(ZSTD, 2)])
def test_truncated_and_flipped_are_corrupt(codec, magic):
    packed = compress(codec, SAMPLES["big"], magic)
    with pytest.raises(CorruptRecordError):
        decompress(codec, packed[: len(packed) // 2], magic)
    if codec == GZIP:  # the only codec whose stream Kafka checksums (the member CRC32)
        flipped = bytearray(packed)
        flipped[len(flipped) // 2] ^= 0x55
        with pytest.raises(CorruptRecordError):
            decompress(codec, bytes(flipped), magic)


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(COMPRESSED),
       st.sampled_from([b"", b"\x1f\x8b\x08", b"\x04\x22\x4d\x18\x60\x40",
                        b"\x82SNAPPY\x00\0\0\0\x01\0\0\0\x01", b"\x28\xb5\x2f\xfd"]),
       st.binary(max_size=300))
def test_fuzz_only_corrupt_record_error(codec_magic, prefix, tail):
    codec, magic = codec_magic
    try:
        out = decompress(codec, prefix + tail, magic, max_output=1 << 20)
    except CorruptRecordError:
        return
    assert isinstance(out, bytes) and len(out) <= 1 << 20


@pytest.mark.parametrize("codec,magic", COMPRESSED)
def test_max_output_guard(codec, magic):
    data = b"\0" * 3_000_000
    packed = compress(codec, data, magic)
    assert decompress(codec, packed, magic, max_output=len(data)) == data
    with pytest.raises(CorruptRecordError, match="max_output"):
        decompress(codec, packed, magic, max_output=len(data) - 1)
    with pytest.raises(CorruptRecordError, match="max_output"):
        decompress(codec, packed, magic, max_output=1000)


def test_snappy_bomb_claim_is_rejected_before_allocating():
    bomb = bytes([0xFF, 0xFF, 0xFF, 0xFF, 0x07]) + b"\0" * 4  # claims ~2 GiB from 9 bytes
    with pytest.raises(CorruptRecordError):
        decompress(SNAPPY, bomb)


# -- interop with kafka-python's kafka.codec -------------------------------------------------------

@pytest.fixture
def kafka_snappy(monkeypatch):
    """kafka.codec wants python-snappy; that package is a thin layer over cramjam's raw snappy."""
    shim = types.SimpleNamespace(compress=lambda b: bytes(cramjam.snappy.compress_raw(b)),
                                 decompress=lambda b: bytes(cramjam.snappy.decompress_raw(b)))
    monkeypatch.setattr(kc, "snappy", shim)


INTEROP_DATA = [b"", b"a", SAMPLES["text"], SAMPLES["random-70k"], SAMPLES["big"]]


@pytest.mark.parametrize("data", INTEROP_DATA, ids=lambda d: str(len(d)))
def test_interop_gzip(data):
    assert decompress(GZIP, kc.gzip_encode(data)) == data
    assert kc.gzip_decode(compress(GZIP, data)) == data


@pytest.mark.parametrize("data", INTEROP_DATA, ids=lambda d: str(len(d)))
def test_interop_snappy(kafka_snappy, data):
    theirs = kc.snappy_encode(data, xerial_compatible=True)
    assert compress(SNAPPY, data) == theirs  # same framing, same 32 KiB blocks, same raw codec
    assert decompress(SNAPPY, theirs) == data
    assert decompress(SNAPPY, kc.snappy_encode(data, xerial_compatible=False)) == data
    if data:  # kafka-python only detects xerial framing with at least one block
        assert kc.snappy_decode(compress(SNAPPY, data)) == data


@pytest.mark.parametrize("data", INTEROP_DATA, ids=lambda d: str(len(d)))
def test_interop_lz4(data):
    for magic in (1, 2):
        assert decompress(LZ4, kc.lz4_encode(data), magic) == data
        assert kc.lz4_decode(compress(LZ4, data, magic)) == data
    assert decompress(LZ4, kc.lz4_encode_old_kafka(data), 0) == data
    assert kc.lz4_decode_old_kafka(compress(LZ4, data, 0)) == data


@pytest.mark.parametrize("data", INTEROP_DATA, ids=lambda d: str(len(d)))
def test_interop_zstd(data):
    assert decompress(ZSTD, kc.zstd_encode(data)) == data
    assert kc.zstd_decode(compress(ZSTD, data)) == data


# -- the Kafka-written golden corpus ---------------------------------------------------------------

def _varint(buf, pos):
    shift = result = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7


def _sized(buf, pos, length):
    return (None, pos) if length < 0 else (bytes(buf[pos:pos + length]), pos + length)


def _v2_records(buf, count):
    """(key, value) of each record in a v2 records section, checking it ends exactly."""
    pos, out = 0, []
    for _ in range(count):
        length, pos = _varint(buf, pos)
        end = pos + length
        pos += 1  # attributes
        _, pos = _varint(buf, pos)  # timestamp delta
        _, pos = _varint(buf, pos)  # offset delta
        n, pos = _varint(buf, pos)
        key, pos = _sized(buf, pos, n)
        n, pos = _varint(buf, pos)
        value, pos = _sized(buf, pos, n)
        headers, pos = _varint(buf, pos)
        for _ in range(headers):
            n, pos = _varint(buf, pos)
            pos += n
            n, pos = _varint(buf, pos)
            pos += max(n, 0)
        assert pos == end
        out.append((key, value))
    assert pos == len(buf)
    return out


def _walk(buf, stop, stats, inner=False):
    """(key, value) of every record in a segment or a decompressed v0/v1 message set."""
    pos, out = 0, []
    while pos + 17 <= stop:
        size = struct.unpack_from(">i", buf, pos + 8)[0]
        end = pos + 12 + size
        if end > stop:
            assert not inner, "inner message set overruns its wrapper"
            break  # a torn tail
        magic, attrs = buf[pos + 16], buf[pos + 17]
        if magic == 2:
            codec = struct.unpack_from(">h", buf, pos + 21)[0] & 7
            count = struct.unpack_from(">i", buf, pos + 57)[0]
            payload = memoryview(buf)[pos + 61:end]
            if codec:
                payload = decompress(codec, payload, 2)
                stats[codec] = stats.get(codec, 0) + 1
            out += _v2_records(payload, count)
        else:
            codec = attrs & 7
            body = pos + 18 + (8 if magic == 1 else 0)
            n = struct.unpack_from(">i", buf, body)[0]
            key, body = _sized(buf, body + 4, n)
            n = struct.unpack_from(">i", buf, body)[0]
            value, body = _sized(buf, body + 4, n)
            assert body == end
            if codec:
                assert not inner and key is None
                inner_set = decompress(codec, value, magic)
                stats[codec] = stats.get(codec, 0) + 1
                out += _walk(inner_set, len(inner_set), stats, inner=True)
            else:
                out.append((key, value))
        pos = end
    assert not inner or pos == stop
    return out


def _cases():
    return sorted(p for p in GOLDEN.iterdir() if p.is_dir()) if GOLDEN.is_dir() else []


@needs_golden
@pytest.mark.parametrize("case", _cases(), ids=lambda p: p.name)
def test_golden_corpus(case):
    damage = {}
    if (case / "expected-recovery.json").exists():
        damage = json.loads((case / "expected-recovery.json").read_text())
    got, stats = [], {}
    for log in sorted(case.glob("*.log")):
        data = log.read_bytes()
        stop = damage["valid_bytes"] if damage.get("segment") == log.name else len(data)
        got += _walk(data, stop, stats)
    expected = []
    for line in (case / "expected.jsonl").read_text().splitlines():
        rec = json.loads(line)
        expected.append(tuple(None if rec[f] is None else base64.b64decode(rec[f])
                              for f in ("key", "value")))
    assert got == expected
    named = case.name.split("-")
    if named[1] in ("gzip", "snappy", "lz4", "zstd"):
        assert stats.get(codec_id(named[1]), 0) > 0, "no compressed payload found"


@needs_golden
def test_golden_magic0_lz4_uses_the_broken_checksum():
    data = (GOLDEN / "m0-lz4-notime-0" / "00000000000000000000.log").read_bytes()
    assert data[16] == 0 and data[17] & 7 == LZ4
    assert struct.unpack_from(">i", data, 18)[0] == -1  # null key, then the value's length
    size = struct.unpack_from(">i", data, 22)[0]
    value = data[26:26 + size]
    assert value[:7] == codecs._LZ4_HEADER_V0
    assert decompress(LZ4, value, 0)
    with pytest.raises(CorruptRecordError, match="descriptor checksum"):
        decompress(LZ4, value, 1)


@needs_golden
@pytest.mark.parametrize("case,header", [("corrupt-v1-gzip-0", 8), ("torn-v2-lz4-0", None)])
def test_golden_damaged_payloads_are_corrupt(case, header):
    """The flipped byte lands in a gzip member (its CRC32 catches it); the torn lz4 frame is cut."""
    damage = json.loads((GOLDEN / case / "expected-recovery.json").read_text())
    data = (GOLDEN / case / damage["segment"]).read_bytes()
    pos = damage["damaged_batch_position"]
    magic, attrs = data[pos + 16], data[pos + 17]
    if magic == 2:
        codec, payload = struct.unpack_from(">h", data, pos + 21)[0] & 7, data[pos + 61:]
    else:
        body = pos + 18 + header  # v1: timestamp; then a null key and the value
        assert struct.unpack_from(">i", data, body)[0] == -1
        size = struct.unpack_from(">i", data, body + 4)[0]
        codec, payload = attrs & 7, data[body + 8:body + 8 + size]
    assert codec in (GZIP, LZ4)
    with pytest.raises(CorruptRecordError):
        decompress(codec, payload, magic)


def test_snappy_raw_highest_ratio_still_decodes():
    zeros = b"\0" * 1_000_000  # runs of 64-byte copies: the densest snappy encoding there is
    assert decompress(SNAPPY, bytes(cramjam.snappy.compress_raw(zeros))) == zeros
