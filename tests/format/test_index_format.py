"""Index file codecs against Kafka-written golden indexes and Kafka's lookup/sanity rules."""
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st


from pyspark_kafkalog.errors import (CorruptIndexError, InvalidRecordError,  # noqa: E402
                                     LogSegmentOffsetOverflowError, UnsupportedVersionError)
from pyspark_kafkalog.format import index as ix  # noqa: E402
from support.shared_paths import GOLDEN, GOLDEN_CASE_COUNT, needs_golden  # noqa: E402

OFFSET_FILES = sorted(GOLDEN.glob("*/*.index"))
TIME_FILES = sorted(GOLDEN.glob("*/*.timeindex"))

INT32_MAX = 2**31 - 1


def _base(path: Path) -> int:
    return int(path.name.split(".")[0])


# -- golden files -------------------------------------------------------------------------------

@needs_golden
def test_golden_inventory():
    # 29 partition dirs x 3 segments; some magic-0 .timeindex files are legitimately empty.
    assert len(OFFSET_FILES) == len(TIME_FILES) == 3 * GOLDEN_CASE_COUNT
    assert sum(p.stat().st_size > 0 for p in OFFSET_FILES) > 80
    assert sum(p.stat().st_size > 0 for p in TIME_FILES) > 50


@needs_golden
@pytest.mark.parametrize("path", OFFSET_FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_golden_offset_index(path):
    buf, base = path.read_bytes(), _base(path)
    ix.sanity_check_offset_index(buf, base)
    offsets, positions = ix.decode_offset_index(buf, base)
    assert offsets.dtype == positions.dtype == np.int64
    assert len(offsets) == len(buf) // ix.OFFSET_ENTRY_SIZE
    assert (offsets >= base).all() and (np.diff(offsets) > 0).all()
    assert (positions > 0).all() and (np.diff(positions) > 0).all()
    assert ix.encode_offset_index(zip(offsets, positions), base) == buf
    assert ix.encode_offset_index(np.column_stack([offsets, positions]), base) == buf
    assert b"".join(ix.encode_offset_entry(o, p, base) for o, p in zip(offsets, positions)) == buf
    for o, p in zip(offsets, positions):  # every entry finds itself, and the gap before it
        assert ix.offset_index_lookup(offsets, positions, o, base) == (o, p)
    assert ix.offset_index_lookup(offsets, positions, base - 1, base) == (base, 0)


@needs_golden
@pytest.mark.parametrize("path", TIME_FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_golden_time_index(path):
    buf, base = path.read_bytes(), _base(path)
    ix.sanity_check_time_index(buf, base)
    timestamps, offsets = ix.decode_time_index(buf, base)
    assert len(timestamps) == len(buf) // ix.TIME_ENTRY_SIZE
    assert (offsets >= base).all() and (np.diff(offsets) >= 0).all()
    # Kafka's maybeAppend only ever appends a strictly greater timestamp.
    assert (np.diff(timestamps) > 0).all() and (timestamps >= 0).all()
    assert ix.encode_time_index(zip(timestamps, offsets), base) == buf
    assert b"".join(ix.encode_time_entry(t, o, base) for t, o in zip(timestamps, offsets)) == buf
    if len(timestamps):
        assert ix.time_index_lookup(timestamps, offsets, timestamps[0] - 1, base) == (-1, base)
        assert ix.time_index_lookup(timestamps, offsets, timestamps[-1], base) == (
            timestamps[-1], offsets[-1])


# -- lookups vs brute force ---------------------------------------------------------------------

@st.composite
def offset_indexes(draw):
    base = draw(st.integers(0, 2**40))
    rels = sorted(set(draw(st.lists(st.integers(0, INT32_MAX), max_size=40))))
    positions = sorted(draw(st.lists(st.integers(0, INT32_MAX), min_size=len(rels),
                                     max_size=len(rels))))
    return base, [(base + r, p) for r, p in zip(rels, positions)]


@st.composite
def time_indexes(draw):
    base = draw(st.integers(0, 2**40))
    n = draw(st.integers(0, 40))
    ts = sorted(draw(st.lists(st.integers(-1, 50), min_size=n, max_size=n)))  # ties allowed
    rels = sorted(draw(st.lists(st.integers(0, 60), min_size=n, max_size=n)))
    return base, [(t, base + r) for t, r in zip(ts, rels)]


@given(offset_indexes(), st.data())
@settings(max_examples=200, deadline=None)
def test_offset_lookup_matches_brute_force(index, data):
    base, entries = index
    buf = ix.encode_offset_index(entries, base)
    assert len(buf) == ix.OFFSET_ENTRY_SIZE * len(entries)
    offsets, positions = ix.decode_offset_index(buf, base)
    assert list(zip(offsets.tolist(), positions.tolist())) == entries
    near = [o + d for o, _ in entries for d in (-1, 0, 1)] or [base - 1, base, base + 1]
    target = data.draw(st.sampled_from(near) | st.integers(base - 3, base + INT32_MAX + 3))
    below = [e for e in entries if e[0] <= target]
    expected = max(below) if below else (base, 0)
    assert ix.offset_index_lookup(offsets, positions, target, base) == expected


@given(time_indexes(), st.integers(-3, 55))
@settings(max_examples=200, deadline=None)
def test_time_lookup_matches_brute_force(index, target):
    base, entries = index
    timestamps, offsets = ix.decode_time_index(ix.encode_time_index(entries, base), base)
    assert list(zip(timestamps.tolist(), offsets.tolist())) == entries
    below = [e for e in entries if e[0] <= target]
    if below:
        best = max(t for t, _ in below)
        expected = next(e for e in entries if e[0] == best)  # earliest entry of a tie
    else:
        expected = (ix.NO_TIMESTAMP, base)
    assert ix.time_index_lookup(timestamps, offsets, target, base) == expected


def test_empty_indexes():
    offsets, positions = ix.decode_offset_index(b"", 100)
    assert offsets.size == positions.size == 0
    assert ix.offset_index_lookup(offsets, positions, 10**6, 100) == (100, 0)
    timestamps, offsets = ix.decode_time_index(b"", 100)
    assert ix.time_index_lookup(timestamps, offsets, 10**6, 100) == (-1, 100)
    ix.sanity_check_offset_index(b"", 100)
    ix.sanity_check_time_index(b"", 100)
    assert ix.encode_offset_index([], 100) == ix.encode_time_index([], 100) == b""


def test_exact_layout():
    assert ix.encode_offset_entry(105, 4096, 100) == struct.pack(">ii", 5, 4096)
    ts = 1_700_000_000_000
    assert ix.encode_time_entry(ts, 105, 100) == struct.pack(">qi", ts, 5)
    txn = ix.AbortedTxn.create(7, 10, 20, 9)
    assert ix.encode_txn_index([txn]) == struct.pack(">hqqqq", 0, 7, 10, 20, 9)
    assert ix.TXN_ENTRY_SIZE == 34


# -- sanity checks: exactly Kafka's cases ---------------------------------------------------------

def _kafka_offset_sanity(buf: bytes) -> bool:
    """Oracle: OffsetIndex.sanityCheck looks at the last whole entry and the length only."""
    n = len(buf) // 8
    if n and struct.unpack_from(">i", buf, (n - 1) * 8)[0] < 0:
        return False
    return len(buf) % 8 == 0


def _kafka_time_sanity(buf: bytes) -> bool:
    n = len(buf) // 12
    if n:
        first_ts = struct.unpack_from(">q", buf, 0)[0]
        last_ts, last_rel = struct.unpack_from(">qi", buf, (n - 1) * 12)
        if last_ts < first_ts or last_rel < 0:
            return False
    return len(buf) % 12 == 0


def _passes(check, buf) -> bool:
    try:
        check(buf, 1000)
        return True
    except CorruptIndexError:
        return False


@given(st.binary(max_size=64))
@settings(max_examples=300, deadline=None)
def test_sanity_checks_match_kafka(buf):
    assert _passes(ix.sanity_check_offset_index, buf) == _kafka_offset_sanity(buf)
    assert _passes(ix.sanity_check_time_index, buf) == _kafka_time_sanity(buf)
    # A decode is at least as strict as Kafka's sanity check.
    if _passes(ix.decode_offset_index, buf):
        assert _kafka_offset_sanity(buf)
    if _passes(ix.decode_time_index, buf):
        assert _kafka_time_sanity(buf)


def test_timestamps_at_the_int64_ends_are_ordered_without_wrapping():
    """-2**63 after 1 goes backwards, though their int64 difference wraps to a positive one;
    Hypothesis found it (the decode took it, Kafka's sanity check refuses it)."""
    buf = struct.pack(">qiqi", 1, 0, -2**63, 0)
    assert not _kafka_time_sanity(buf)
    with pytest.raises(CorruptIndexError, match="below the previous"):
        ix.decode_time_index(buf, 1000)
    with pytest.raises(InvalidRecordError, match="non-decreasing|must both"):
        ix.encode_time_index([(1, 1000), (-2**63, 1000)], 1000)
    ts, _ = ix.decode_time_index(struct.pack(">qiqi", -2**63, 0, 2**63 - 1, 1), 1000)
    assert ts.tolist() == [-2**63, 2**63 - 1]


@needs_golden
def test_truncated_and_garbled_golden():
    path = max(OFFSET_FILES, key=lambda p: p.stat().st_size)
    buf, base = path.read_bytes(), _base(path)
    for cut in (1, 4, 7):
        with pytest.raises(CorruptIndexError, match="multiple of 8"):
            ix.sanity_check_offset_index(buf[:-cut], base)
        with pytest.raises(CorruptIndexError, match="multiple of 8"):
            ix.decode_offset_index(buf[:-cut], base)
    negative_last = buf[:-8] + struct.pack(">ii", -1, 10)
    with pytest.raises(CorruptIndexError, match="below the base offset"):
        ix.sanity_check_offset_index(negative_last, base)
    # Kafka's sanity check never looks at middle entries; the decode does.
    swapped = buf[8:16] + buf[:8] + buf[16:]
    ix.sanity_check_offset_index(swapped, base)
    with pytest.raises(CorruptIndexError, match="entry 1: offset .* not above"):
        ix.decode_offset_index(swapped, base)
    # A pre-allocated, zero-filled tail (unclean shutdown) passes Kafka's check but is not data.
    padded = buf + bytes(80)
    ix.sanity_check_offset_index(padded, base)
    with pytest.raises(CorruptIndexError):
        ix.decode_offset_index(padded, base)

    path = max(TIME_FILES, key=lambda p: p.stat().st_size)
    buf, base = path.read_bytes(), _base(path)
    with pytest.raises(CorruptIndexError, match="multiple of 12"):
        ix.sanity_check_time_index(buf[:-5], base)
    with pytest.raises(CorruptIndexError, match="multiple of 12"):
        ix.decode_time_index(buf + b"\0", base)
    with pytest.raises(CorruptIndexError, match="below its first timestamp"):
        ix.sanity_check_time_index(buf + bytes(12), base)
    with pytest.raises(CorruptIndexError, match="last offset"):
        ix.sanity_check_time_index(buf + struct.pack(">qi", 2**62, -3), base)
    with pytest.raises(CorruptIndexError, match="timestamp .* below"):
        ix.decode_time_index(buf[12:24] + buf[:12] + buf[24:], base)


def test_decode_rejects_bad_positions():
    with pytest.raises(CorruptIndexError, match="negative position"):
        ix.decode_offset_index(struct.pack(">ii", 1, -5), 0)
    with pytest.raises(CorruptIndexError, match="position 5 is below"):
        ix.decode_offset_index(struct.pack(">iiii", 1, 9, 2, 5), 0)


def test_encode_refuses_what_decode_would():
    with pytest.raises(LogSegmentOffsetOverflowError):
        ix.encode_offset_entry(99, 0, 100)
    with pytest.raises(LogSegmentOffsetOverflowError):
        ix.encode_offset_index([(100 + INT32_MAX + 1, 0)], 100)
    with pytest.raises(LogSegmentOffsetOverflowError):
        ix.encode_time_index([(5, 2**70)], 100)
    with pytest.raises(InvalidRecordError):
        ix.encode_offset_index([(105, 0), (105, 10)], 100)
    with pytest.raises(InvalidRecordError):
        ix.encode_offset_index([(105, 10), (106, 0)], 100)
    with pytest.raises(InvalidRecordError):
        ix.encode_time_index([(5, 105), (4, 106)], 100)
    with pytest.raises(InvalidRecordError):
        ix.encode_offset_entry(105, -1, 100)
    assert ix.encode_offset_index([(100 + INT32_MAX, INT32_MAX)], 100) == b"\x7f\xff\xff\xff" * 2


# -- .txnindex ----------------------------------------------------------------------------------

i64 = st.integers(-2**63, 2**63 - 1)


@given(st.lists(st.tuples(i64, i64, st.integers(-2**62, 2**62), i64), max_size=20))
@settings(max_examples=100, deadline=None)
def test_txn_index_round_trip(rows):
    last, txns = None, []
    for pid, first, last_offset, lso in rows:  # make last offsets strictly increasing
        last_offset = last_offset if last is None else max(last_offset, last + 1)
        txns.append(ix.AbortedTxn.create(pid, first, last_offset, lso))
        last = last_offset
    buf = ix.encode_txn_index(txns)
    assert len(buf) == ix.TXN_ENTRY_SIZE * len(txns)
    assert ix.decode_txn_index(buf) == txns
    assert ix.decode_txn_index(buf, strict=True) == txns
    # Kafka's reader ignores a torn final entry.
    assert ix.decode_txn_index(buf + buf[:33]) == txns


def test_txn_index_errors():
    good = ix.encode_txn_index([ix.AbortedTxn.create(1, 10, 20, 5),
                                ix.AbortedTxn.create(2, 15, 30, 5)])
    with pytest.raises(CorruptIndexError, match="not a multiple of 34"):
        ix.decode_txn_index(good + b"\0", strict=True)
    with pytest.raises(UnsupportedVersionError, match="entry 1 has version 1"):
        ix.decode_txn_index(good[:34] + b"\0\x01" + good[36:])
    ix.sanity_check_txn_index(good, 20)
    with pytest.raises(CorruptIndexError, match="entry 0: last offset 20"):
        ix.sanity_check_txn_index(good, 21)
    with pytest.raises(InvalidRecordError, match="not above"):
        ix.encode_txn_index([ix.AbortedTxn.create(1, 10, 20, 5),
                             ix.AbortedTxn.create(2, 15, 20, 5)])
    with pytest.raises(UnsupportedVersionError):
        ix.encode_txn_index([ix.AbortedTxn(1, 1, 10, 20, 5)])
    with pytest.raises(InvalidRecordError, match="int64"):
        ix.encode_txn_index([ix.AbortedTxn.create(2**63, 10, 20, 5)])


# -- small indexes are packed without numpy: the same bytes, the same refusals -------------------

_pairs = st.lists(st.tuples(st.integers(-2**63, 2**63 - 1), st.integers(-2**31, 2**32)),
                  max_size=70)


def _outcome(fn, entries, base):
    try:
        return fn(entries, base)
    except Exception as exc:   # the type and message must agree too
        return type(exc), str(exc)


@settings(max_examples=300, deadline=None)
@given(base=st.integers(0, 2**40), deltas=_pairs, sort=st.booleans())
def test_small_index_fast_path_matches_numpy(base, deltas, sort):
    """Lists of up to 64 entries take a pure-Python path (a 1,000-partition write makes
    thousands of tiny indexes); a generator takes numpy's. Valid or not, both must agree."""
    pairs = [(base + abs(a) % 5000 if sort else base + a % 2**33, b) for a, b in deltas]
    if sort:
        pairs = sorted(set(pairs))
    for encode in (ix.encode_offset_index, ix.encode_time_index):
        entries = pairs if encode is ix.encode_offset_index else [(b, a) for a, b in pairs]
        assert _outcome(encode, list(entries), base) == \
            _outcome(encode, (e for e in entries), base)


def test_small_index_fast_path_is_taken_and_exact():
    entries = [(100 + 10 * i, 4096 * i) for i in range(1, 7)]
    want = b"".join(struct.pack(">ii", o - 100, p) for o, p in entries)
    assert ix.encode_offset_index(entries, 100) == want
    assert ix._small_offset_index(entries, 100) == want
    times = [(1_700_000_000_000 + i, 100 + i) for i in range(6)]
    want = b"".join(struct.pack(">qi", t, o - 100) for t, o in times)
    assert ix.encode_time_index(times, 100) == want == ix._small_time_index(times, 100)
    assert ix._small_offset_index([(100, 0), (100, 1)], 100) is None   # numpy names it
