"""The pure-Python record loops behind :mod:`.columnar`.

They live apart from ``columnar`` because they are the reference semantics the C twin
(``_columnar_accel.c``) reproduces error for error: keep the two in step. Every loop is written
for CPython's interpreter rather than for style: locals instead of attributes, bound methods,
inline one- and two-byte varints, and per-batch work (timestamp types, contiguous offsets,
validity) done once after the loop instead of once per record.

Malformed input has exactly these outcomes in the magic 2 scan, each raised at the first point
the loop can tell (the C twin raises the same messages at the same points):

* a read at or past the end of the records blob: "record runs past the end of its batch"
  (a field may read bytes past its own record's end; only the blob's end is a hard stop);
* a varint longer than 10 bytes (values are taken modulo 2**64, like Java's varlong);
* ``length < 6`` or beyond the blob; a negative header count; a null header key; a header key
  that is not UTF-8 (only checked when headers are kept); fields not adding up to ``length``;
* after the loop: bytes left over, then an offset outside int64.
"""
from __future__ import annotations

import struct
from array import array

from ..errors import CorruptRecordError
from .batch import (HEADER_SIZE_UP_TO_MAGIC, LEGACY_ATTRIBUTES_OFFSET, LEGACY_KEY_SIZE_OFFSET_V0,
                    LEGACY_KEY_SIZE_OFFSET_V1, LEGACY_TIMESTAMP_OFFSET, LOG_OVERHEAD, MAGIC_OFFSET,
                    RECORD_OVERHEAD_V0, RECORD_OVERHEAD_V1, crc_error, size_error, v1_size_error)
from .crc import crc32
from .records import COMPRESSION_MASK, CREATE_TIME, LOG_APPEND_TIME, NO_TIMESTAMP_TYPE
from .varint import wrap_int64

INT64_MAX = (1 << 63) - 1
_MASK64 = (1 << 64) - 1
_LOG_HEADER = struct.Struct(">qiI")          # offset, length, CRC of a magic 0/1 message
_INNER_HEADER = struct.Struct(">qiIbb")      # ... plus magic and attributes
_I32 = struct.Struct(">i").unpack_from
_I64 = struct.Struct(">q").unpack_from


#: Zig-zag values of every one-byte varint, and of every two-byte one indexed by its 14 bits: a
#: tuple lookup costs a third of the shifts and masks it replaces.
_ZZ1 = tuple((u >> 1) ^ -(u & 1) for u in range(1 << 7))
_ZZ2 = tuple((u >> 1) ^ -(u & 1) for u in range(1 << 14))


def varint(buf, pos: int):
    """Zig-zag varint from ``pos`` when the inline fast paths do not apply.

    Reads are bounded only by ``buf`` (IndexError past it); the value wraps to 64 bits so that a
    10th byte with high bits set means what Java's ``readVarlong`` makes of it.
    """
    result = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            result &= _MASK64
            return (result >> 1) ^ -(result & 1), pos
        shift += 7
        if shift > 63:
            raise CorruptRecordError("varint longer than 10 bytes")


def scan_v2(blob, count: int, base_offset: int, base_ts: int, ts_type: int, max_ts: int,
            cols, with_headers: bool) -> None:
    """Append ``count`` magic-2 records of a decompressed blob to ``cols``.

    On error the columns are left partly appended; the caller rolls the batch back.
    """
    if type(blob) is not bytes:   # indexing and slicing bytes is what the loop is tuned for
        blob = bytes(blob)
    end = len(blob)
    kdata, vdata = cols.key_data, cols.value_data
    kt, vt = len(kdata), len(vdata)
    kofs, vofs = cols.key_offsets.append, cols.value_offsets.append
    hkdata, hvdata = cols.header_key_data, cols.header_value_data
    hkofs, hvofs = cols.header_key_offsets.append, cols.header_value_offsets.append
    hvvalid = cols.header_value_valid.append
    log_append = ts_type == LOG_APPEND_TIME
    # Under LogAppendTime every row gets max_ts after the loop; a throwaway list keeps the
    # loop free of a per-record branch.
    scratch: list = []
    ts_append = scratch.append if log_append else cols.timestamp.append
    knull: list = []
    vnull: list = []
    gaps: list = []
    hrows: list = []
    knull_add, vnull_add, gap_add, hrow_add = knull.append, vnull.append, gaps.append, hrows.append
    zz1, zz2 = _ZZ1, _ZZ2
    pos = 0
    try:
        for i in range(count):
            # length (1, 2 or more bytes), then skip the attributes byte
            b = blob[pos]
            if b < 0x80:
                length = zz1[b]
                pos += 1
            else:
                c = blob[pos + 1]
                if c < 0x80:
                    length = zz2[(b & 0x7F) | (c << 7)]
                    pos += 2
                else:
                    length, pos = varint(blob, pos)
            rec_end = pos + length
            if length < 6 or rec_end > end:
                raise CorruptRecordError(f"record length {length} does not fit its batch")
            pos += 1
            # timestamp delta
            b = blob[pos]
            if b < 0x80:
                ts_delta = zz1[b]
                pos += 1
            else:
                c = blob[pos + 1]
                if c < 0x80:
                    ts_delta = zz2[(b & 0x7F) | (c << 7)]
                    pos += 2
                else:
                    ts_delta, pos = varint(blob, pos)
            # offset delta: only deltas that differ from the row number are remembered
            b = blob[pos]
            if b < 0x80:
                off_delta = zz1[b]
                pos += 1
            else:
                c = blob[pos + 1]
                if c < 0x80:
                    off_delta = zz2[(b & 0x7F) | (c << 7)]
                    pos += 2
                else:
                    off_delta, pos = varint(blob, pos)
            if off_delta != i:
                gap_add(i)
                gap_add(off_delta)
            # key
            b = blob[pos]
            if b < 0x80:
                klen = zz1[b]
                pos += 1
            else:
                c = blob[pos + 1]
                if c < 0x80:
                    klen = zz2[(b & 0x7F) | (c << 7)]
                    pos += 2
                else:
                    klen, pos = varint(blob, pos)
            if klen < 0:
                knull_add(i)
            else:
                kdata += blob[pos:pos + klen]
                pos += klen
                kt += klen
            # value
            b = blob[pos]
            if b < 0x80:
                vlen = zz1[b]
                pos += 1
            else:
                c = blob[pos + 1]
                if c < 0x80:
                    vlen = zz2[(b & 0x7F) | (c << 7)]
                    pos += 2
                else:
                    vlen, pos = varint(blob, pos)
            if vlen < 0:
                vnull_add(i)
            else:
                vdata += blob[pos:pos + vlen]
                pos += vlen
                vt += vlen
            # headers
            b = blob[pos]
            if b < 0x80:
                nh = zz1[b]
                pos += 1
            else:
                nh, pos = varint(blob, pos)
            if nh:
                if nh < 0:
                    raise CorruptRecordError(f"negative header count {nh}")
                for _h in range(nh):
                    b = blob[pos]
                    if b < 0x80:
                        hk_len = zz1[b]
                        pos += 1
                    else:
                        hk_len, pos = varint(blob, pos)
                    if hk_len < 0:
                        raise CorruptRecordError("null header key")
                    hk_pos = pos
                    pos += hk_len
                    b = blob[pos]
                    if b < 0x80:
                        hv_len = zz1[b]
                        pos += 1
                    else:
                        hv_len, pos = varint(blob, pos)
                    if with_headers:
                        hk = blob[hk_pos:hk_pos + hk_len]
                        str(hk, "utf-8")
                        hkdata += hk
                        hkofs(len(hkdata))
                        if hv_len < 0:
                            hvvalid(0)
                        else:
                            hvdata += blob[pos:pos + hv_len]
                            pos += hv_len
                            hvvalid(1)
                        hvofs(len(hvdata))   # not a running sum: hv_len may be absurd here
                    elif hv_len > 0:
                        pos += hv_len
                if with_headers:
                    hrow_add(i)
                    hrow_add(nh)
            if pos != rec_end:
                raise CorruptRecordError("record fields do not add up to its declared length")
            kofs(kt)   # only now are klen and vlen known to be sane
            vofs(vt)
            try:
                ts_append(base_ts + ts_delta)
            except OverflowError:   # Java's long arithmetic wraps; so does the format
                ts_append(wrap_int64(base_ts + ts_delta))
    except IndexError:
        raise CorruptRecordError("record runs past the end of its batch") from None
    except UnicodeDecodeError:
        raise CorruptRecordError("record header key is not valid UTF-8") from None
    if pos != end:
        raise CorruptRecordError(
            f"batch declares {count} records but {end - pos} bytes remain after them")
    if count <= 0:
        return
    _fill_offsets(cols.offset, base_offset, count, gaps)
    if log_append:
        cols.timestamp.extend(array("q", (max_ts,)) * count)
    cols.timestamp_type.extend(array("b", (ts_type,)) * count)
    _fill_valid(cols.key_valid, count, knull)
    _fill_valid(cols.value_valid, count, vnull)
    hcounts = cols.header_count
    h0 = len(hcounts)
    hcounts.frombytes(bytes(4 * count))
    for j in range(0, len(hrows), 2):
        hcounts[h0 + hrows[j]] = hrows[j + 1]


def _fill_offsets(offsets: array, base: int, count: int, gaps: list) -> None:
    """Offsets are ``base + row`` except at the (rare) rows listed in ``gaps``."""
    o0 = len(offsets)
    if base + count - 1 <= INT64_MAX:
        offsets.extend(range(base, base + count))
        try:
            for j in range(0, len(gaps), 2):
                offsets[o0 + gaps[j]] = base + gaps[j + 1]
            return
        except OverflowError:
            del offsets[o0:]
    values = list(range(base, base + count))
    for j in range(0, len(gaps), 2):
        values[gaps[j]] = base + gaps[j + 1]
    try:
        offsets.extend(values)
    except OverflowError:
        raise CorruptRecordError(
            f"record offsets overflow a 64-bit integer (base offset {base})") from None


def _fill_valid(valid: bytearray, count: int, nulls: list) -> None:
    v0 = len(valid)
    valid += b"\x01" * count
    for i in nulls:
        valid[v0 + i] = 0


# -- magic 0 and 1 --------------------------------------------------------------------------------

def legacy_run(buf, pos: int, end: int, cols, validate: bool, min_offset, max_offset):
    """Decode consecutive uncompressed magic 0/1 messages from ``pos``; returns ``(pos, done)``.

    A message holds one record, so the general path's per-entry header tuple, generator and row
    list would cost more than the record itself. This loop applies the same rules in the same
    order (entry walk, offset window, CRC, fields) and returns, not done, at the first entry it
    does not handle: another magic, a compressed wrapper, or a negative offset at or past
    ``max_offset`` (whose odd trimming only the general path reproduces).

    The entry walk is ``batch.scan_entries``' rules and errors, inlined (its offset rule aside,
    as in ``columnar.decode_columns``); the layout's names are bound to locals for speed.
    """
    up_to_magic, overhead, min_v0, min_v1 = (HEADER_SIZE_UP_TO_MAGIC, LOG_OVERHEAD,
                                             RECORD_OVERHEAD_V0, RECORD_OVERHEAD_V1)
    magic_at, attrs_at = MAGIC_OFFSET, LOG_OVERHEAD + LEGACY_ATTRIBUTES_OFFSET
    ts_at = LOG_OVERHEAD + LEGACY_TIMESTAMP_OFFSET
    key_v0 = LOG_OVERHEAD + LEGACY_KEY_SIZE_OFFSET_V0
    key_v1 = LOG_OVERHEAD + LEGACY_KEY_SIZE_OFFSET_V1
    offsets, timestamps, ts_types = cols.offset, cols.timestamp, cols.timestamp_type
    kdata, vdata = cols.key_data, cols.value_data
    kofs, vofs = cols.key_offsets.append, cols.value_offsets.append
    kvalid, vvalid = cols.key_valid.append, cols.value_valid.append
    hcounts, batches, bcounts = cols.header_count.append, cols.batches.append, cols.batch_counts
    unpack_header = _LOG_HEADER.unpack_from
    mv = memoryview(buf)
    try:
        while pos + up_to_magic < end:
            magic = buf[pos + magic_at]
            if magic > 1 or buf[pos + attrs_at] & COMPRESSION_MASK:
                return pos, False
            offset, length, crc = unpack_header(buf, pos)
            if length < min_v0:
                raise size_error(pos, length)
            msg_end = pos + overhead + length
            if msg_end > end:
                return pos, True
            if magic == 1 and length < min_v1:
                raise v1_size_error(pos, length)
            if min_offset is not None and offset < min_offset:
                pos = msg_end
                continue
            if max_offset is not None and offset >= max_offset:
                if offset >= 0:
                    return pos, True
                return pos, False
            if validate:
                actual = crc32(mv[pos + magic_at:msg_end])
                if actual != crc:
                    raise crc_error(pos, crc, actual)
            attrs = buf[pos + attrs_at]
            if magic:
                ts = _I64(buf, pos + ts_at)[0]
                p = pos + key_v1
                ts_type = LOG_APPEND_TIME if attrs & 0x08 else CREATE_TIME
            else:
                ts = -1
                p = pos + key_v0
                ts_type = NO_TIMESTAMP_TYPE
            klen = _I32(buf, p)[0]
            p += 4
            kpos = p
            if klen > 0:
                p += klen
            vlen = _I32(buf, p)[0] if p + 4 <= msg_end else -2
            p += 4
            vpos = p
            if vlen > 0:
                p += vlen
            if vlen < -1 or p != msg_end:
                raise CorruptRecordError(
                    f"message fields at inner position {pos} do not add up", pos)
            if klen < 0:
                kvalid(0)
            else:
                kdata += buf[kpos:kpos + klen]
                kvalid(1)
            kofs(len(kdata))
            if vlen < 0:
                vvalid(0)
            else:
                vdata += buf[vpos:p]
                vvalid(1)
            vofs(len(vdata))
            offsets.append(offset)
            timestamps.append(ts)
            ts_types.append(ts_type)
            hcounts(0)
            batches((magic, False, False, -1, -1, -1, pos))
            bcounts.append(1)
            pos = msg_end
    finally:
        mv.release()
    return pos, False


def legacy_message(buf, pos: int, end: int):
    """``(magic, attributes, timestamp, key, value)`` of the one magic 0/1 message that fills
    ``buf[pos:end]`` (a compressed wrapper, or a plain message the general path decodes)."""
    if pos + 26 > end:
        raise CorruptRecordError("truncated message inside a compressed wrapper")
    _, size, _, magic, attrs = _INNER_HEADER.unpack_from(buf, pos)
    if magic not in (0, 1) or size < (22 if magic else 14) or pos + 12 + size != end:
        raise CorruptRecordError(f"malformed message at inner position {pos}")
    ts = _I64(buf, pos + 18)[0] if magic else -1
    p = pos + (26 if magic else 18)
    klen = _I32(buf, p)[0]
    p += 4
    key = None if klen < 0 else bytes(buf[p:p + klen])
    p += max(klen, 0)
    vlen = _I32(buf, p)[0] if p + 4 <= end else -2
    p += 4
    if vlen < -1 or p + max(vlen, 0) != end:
        raise CorruptRecordError(f"message fields at inner position {pos} do not add up")
    return magic, attrs & 0xFF, ts, key, None if vlen < 0 else memoryview(buf)[p:end]


def scan_legacy_inner(blob, magic: int, wrapper_ts_type: int, log_append_ts, cols):
    """Append the messages of a decompressed wrapper; returns ``(rows, last inner offset, bad)``.

    A structural error anywhere in the wrapper wins over a message of the wrong magic or with a
    codec of its own: those only set ``bad`` (the first one's position), for the caller to raise
    after its wrapper-offset check, so errors come in the order they always have.
    """
    end = len(blob)
    offsets, timestamps = cols.offset.append, cols.timestamp.append
    kdata, vdata = cols.key_data, cols.value_data
    kofs, vofs = cols.key_offsets.append, cols.value_offsets.append
    kvalid, vvalid = cols.key_valid.append, cols.value_valid.append
    unpack = _INNER_HEADER.unpack_from
    bad = None
    rows = 0
    offset = None
    pos = 0
    while pos < end:
        if pos + 26 > end:
            raise CorruptRecordError("truncated message inside a compressed wrapper")
        offset, size, _crc, imagic, attrs = unpack(blob, pos)
        msg_end = pos + 12 + size
        if size < 14 or msg_end > end or imagic not in (0, 1) or (imagic and size < 22):
            raise CorruptRecordError(f"malformed message at inner position {pos}")
        if imagic:
            ts = _I64(blob, pos + 18)[0]
            p = pos + 26
        else:
            ts = -1
            p = pos + 18
        klen = _I32(blob, p)[0]
        p += 4
        if klen < 0:
            kvalid(0)
        else:
            kdata += blob[p:p + klen]
            p += klen
            kvalid(1)
        kofs(len(kdata))
        vlen = _I32(blob, p)[0] if p + 4 <= msg_end else -2
        p += 4
        if vlen < 0:
            vvalid(0)
        else:
            vdata += blob[p:p + vlen]
            p += vlen
            vvalid(1)
        vofs(len(vdata))
        if vlen < -1 or p != msg_end:
            raise CorruptRecordError(f"message fields at inner position {pos} do not add up")
        if bad is None and (imagic != magic or attrs & COMPRESSION_MASK):
            bad = pos
        offsets(offset)
        timestamps(ts if log_append_ts is None else log_append_ts)
        rows += 1
        pos = msg_end
    if rows:
        cols.timestamp_type.extend(array("b", (wrapper_ts_type,)) * rows)
        cols.header_count.frombytes(bytes(4 * rows))
    return rows, offset, bad


