"""Fuzzing of damaged single batches: random bit flips, truncations, garbage insertion and
overwrites in encoded batches of every magic and codec (and real Kafka-written ones).

The contract, the knobs (``KAFKALOG_FUZZ_SCALE``, ``KAFKALOG_FUZZ_SEED``, ...) and the shared
machinery are in ``fuzz_support.py``.
"""
from __future__ import annotations

import struct

import pytest

from support.fuzz_support import (CORPUS, Findings, SCALE, T0, attempt, case_rng, check_decoded_types,
                          first_difference, first_visible, fix_crcs, full, is_invisible, is_prefix,
                          mutate, payload, touches_invisible)
from pyspark_kafkalog.errors import KafkaLogError
from pyspark_kafkalog.format import codecs
from pyspark_kafkalog.format.batch import iter_headers, read_header
from pyspark_kafkalog.format.columnar import decode_columns, decode_records
from pyspark_kafkalog.format.crc import crc32, crc32c
from pyspark_kafkalog.format.encode import encode_batch_v2, encode_message_set
from pyspark_kafkalog.format.records import Record



# -- (a) single batches ----------------------------------------------------------------------------

def test_damaged_single_batches():
    """Raw damage: decode raises KafkaLogError or returns only undamaged records; never crashes or
    hangs. With validate=False, and with damage behind recomputed CRCs (structure-aware), the
    parsers and codecs still only return records or raise KafkaLogError."""
    f = Findings("test_damaged_single_batches")
    originals = {name: decode_records(data) for name, data in CORPUS}
    per_batch = 40 * SCALE
    for ci, (name, data) in enumerate(CORPUS):
        orig = originals[name]
        headers = list(iter_headers(data))
        for i in range(per_batch):
            if f.full:
                break
            rng = case_rng("single", ci * 100_000 + i)
            mut = mutate(data, rng)
            f.cases += 1
            where = f"{name}: {mut.desc}"
            # 1. as stored: the CRC must catch it
            out = attempt(lambda: decode_records(mut.data), f"decode_records ({where})")
            if out.bad:
                f.add(f"decode_records of damaged bytes: {out.kind}",
                      f"{where} -> {out.describe()}")
            elif out.kind == "ok":
                got = out.value
                got_p, orig_p = [payload(r) for r in got], [payload(r) for r in orig]
                bad_types = check_decoded_types(got)
                if bad_types:
                    f.add("decoded fields of wrong type", f"{where}: {bad_types}")
                if is_invisible(mut, headers):
                    if got_p != orig_p:
                        f.add("CRC-invisible flip changed record content", where)
                elif not is_prefix(got_p, orig_p):
                    f.add("damaged batch decoded to records that are not the original ones "
                          "(corruption returned silently)",
                          f"{where}: {first_difference(got_p, orig_p)}")
                elif (mut.kind in ("flip", "overwrite", "truncate")
                      and not touches_invisible(mut, headers)
                      and not is_prefix([full(r) for r in got], [full(r) for r in orig])):
                    f.add("damaged batch decoded with altered offsets outside the CRC-invisible "
                          "fields", where)
                else:
                    # whatever came back must come from entries wholly before the damage
                    first = first_visible(mut, headers)
                    intact = sum(1 for r in orig if any(
                        h.position == r.batch_position and h.end <= first for h in headers))
                    if len(got) > intact:
                        f.add("records returned from a damaged entry",
                              f"{where}: {len(got)} records back, {intact} before the damage")
            # 2. without CRC validation: parsers must still fail cleanly
            out = attempt(lambda: decode_records(mut.data, validate=False),
                          f"decode_records(validate=False) ({where})")
            if out.bad:
                f.add(f"decode_records(validate=False) of damaged bytes: {out.kind}",
                      f"{where} -> {out.describe()}")
            # 3. damage behind valid CRCs
            fixed = bytearray(mut.data)
            fix_crcs(fixed)
            out = attempt(lambda: decode_records(bytes(fixed)),
                          f"decode_records (CRC fixed, {where})")
            if out.bad:
                f.add(f"decode_records of damage behind recomputed CRCs: {out.kind}",
                      f"{where} + CRCs recomputed -> {out.describe()}")
    f.check()


def _rebuild_v2(data: bytes, blob: bytes) -> bytes:
    """Replace a v2 batch's records section with ``blob`` (already compressed), fix size + CRC."""
    buf = bytearray(data[:61] + blob)
    struct.pack_into(">i", buf, 8, len(buf) - 12)
    struct.pack_into(">I", buf, 17, crc32c(bytes(buf[21:])))
    return bytes(buf)


def _legacy_wrapper(data: bytes, inner_compressed: bytes) -> bytes:
    """Rebuild a magic 0/1 compressed wrapper message around new compressed bytes."""
    h = read_header(data, 0)
    head = data[16:18] + (data[18:26] if h.magic == 1 else b"")
    body = head + struct.pack(">i", -1) + struct.pack(">i", len(inner_compressed)) + \
        inner_compressed
    return data[:8] + struct.pack(">i", 4 + len(body)) + struct.pack(">I", crc32(body)) + body


def test_damaged_compressed_contents_behind_valid_crcs():
    """Damage *inside* compressed payloads, re-compressed and re-checksummed, so the record and
    message parsers behind the codecs see it (a buggy or hostile writer, not bit rot)."""
    f = Findings("test_damaged_compressed_contents_behind_valid_crcs")
    compressed = []
    for name, data in CORPUS:
        h = next(iter_headers(data))
        if h.compression and h.end == len(data):
            compressed.append((name, data, h))
    assert len(compressed) >= 13
    for ci, (name, data, h) in enumerate(compressed):
        if h.magic == 2:
            inner = codecs.decompress(h.compression, data[61:], 2)
        else:
            (wrapper_value,) = [m for m in _values_of_legacy_wrapper(data)]
            inner = codecs.decompress(h.compression, wrapper_value, h.magic)
        for i in range(40 * SCALE):
            if f.full:
                break
            rng = case_rng("inner", ci * 100_000 + i)
            mut = mutate(inner, rng)
            if h.magic == 2 and rng.random() < 0.3:   # also the record count
                buf = bytearray(data[:61])
                struct.pack_into(">i", buf, 57, rng.choice([0, -1, 2**31 - 1,
                                                            h.record_count + rng.randrange(-3, 4)]))
                data_h = bytes(buf) + data[61:]
                extra = "; record count " + str(struct.unpack_from(">i", buf, 57)[0])
            else:
                data_h, extra = data, ""
            try:
                blob = codecs.compress(h.compression, mut.data, h.magic)
            except KafkaLogError:
                continue
            if h.magic == 2:
                damaged = _rebuild_v2(data_h, blob)
            else:
                damaged = _legacy_wrapper(data, blob)
            f.cases += 1
            where = f"{name}: decompressed contents {mut.desc}{extra}, recompressed, CRC fixed"
            out = attempt(lambda: decode_records(damaged), f"decode_records ({where})")
            if out.bad:
                f.add(f"decode_records: {out.kind}", f"{where} -> {out.describe()}")
            elif out.kind == "ok":
                bad_types = check_decoded_types(out.value)
                if bad_types:
                    f.add("decoded fields of wrong type", f"{where}: {bad_types}")
            out = attempt(lambda: decode_columns(damaged, with_headers=False),
                          f"decode_columns ({where})")
            if out.bad:
                f.add(f"decode_columns(with_headers=False): {out.kind}",
                      f"{where} -> {out.describe()}")
    f.check()


def _values_of_legacy_wrapper(data: bytes):
    h = read_header(data, 0)
    p = 26 if h.magic == 1 else 18
    klen = struct.unpack_from(">i", data, p)[0]
    p += 4 + max(klen, 0)
    vlen = struct.unpack_from(">i", data, p)[0]
    yield data[p + 4:p + 4 + vlen]


def test_inner_legacy_message_shorter_than_its_header_is_a_kafkalog_error():
    """Regression found by the fuzzer: a magic 1 message inside a compressed wrapper whose size
    field (14..17) is too small for a magic 1 header, as the last inner message."""
    inner = struct.pack(">qiIbbq", 0, 14, 0, 1, 0, T0)          # 26 bytes: size 14, magic 1
    wrapper = _legacy_wrapper(
        encode_message_set([Record(b"k", b"v", T0)], magic=1, compression=codecs.GZIP).data,
        codecs.compress(codecs.GZIP, inner, 1))
    out = attempt(lambda: decode_records(wrapper), "decode_records")
    assert not out.bad, (
        "BUG pyspark_kafkalog/format/columnar.py _legacy_messages: an inner magic 1 message with "
        "size 14 (below the 22-byte magic 1 minimum) at the end of the decompressed wrapper "
        "makes the key-length read run off the buffer; expected CorruptRecordError, got "
        f"{out.describe()}. Bytes (hex): {wrapper.hex()}")


@pytest.mark.parametrize("where", ["v2 base offset", "magic 1 inner offset"])
def test_offsets_beyond_int64_are_a_kafkalog_error(where):
    """Regression found by the fuzzer: offsets that do not fit an int64 must be reported as
    corrupt, not crash the decoder. The v2 base offset is outside the CRC, so a damaged one on
    storage gets here; the inner offsets of a magic 1 wrapper need a bad writer."""
    if where == "v2 base offset":
        buf = bytearray(encode_batch_v2([Record(b"a", b"1", T0), Record(b"b", b"2", T0)]).data)
        struct.pack_into(">q", buf, 0, 2**63 - 1)     # last offset = 2**63: not an int64
        data = bytes(buf)
    else:
        b = encode_message_set([Record(b"a", b"1", T0), Record(b"b", b"2", T0)], magic=1,
                               compression=codecs.GZIP, base_offset=10)
        (value,) = _values_of_legacy_wrapper(b.data)
        inner = bytearray(codecs.decompress(codecs.GZIP, value, 1))
        last = list(iter_headers(inner))[-1]
        struct.pack_into(">q", inner, last.position, -2**63 + 1)   # base = 11 - that > int64
        data = _legacy_wrapper(b.data, codecs.compress(codecs.GZIP, bytes(inner), 1))
    out = attempt(lambda: decode_records(data), "decode_records")
    assert out.kind == "error", (
        "BUG pyspark_kafkalog/format/columnar.py (_scan_v2 / _decode_legacy): an absolute "
        f"offset beyond int64 ({where}) makes array('q').append raise; expected "
        f"CorruptRecordError, got {out.describe()}. Bytes (hex): {data.hex()}")
