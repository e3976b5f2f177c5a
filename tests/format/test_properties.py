"""Property-based tests (hypothesis) for the record formats and the partition log.

What is checked, against brute-force models built from the generated input:

* encode -> decode is the identity for magic 2 (codecs 0-4, headers with null values, null/empty
  keys and values, CreateTime/LogAppendTime, transactional, offset-delta gaps, delete horizon,
  control batches) and for magic 0/1 (codecs 0-3; magic 0 decodes timestamp -1, type -1);
* ``assign_offsets`` shifts offsets only: records and CRC validity stay, magic 2 bytes after
  position 16 are untouched (no recompression);
* ``PartitionLog.offset_for_timestamp`` (non-monotonic timestamps, magic 1 and 2, compressed or
  not, many segments and index entries) equals "first record in offset order with timestamp >=
  target", also after ``delete_segments_below``;
* ``read_columns(start, end)`` equals the brute-force slice;
* after every append and after ``truncate_to`` the ``.index``/``.timeindex`` files are
  byte-identical to ``LogSegment.rebuilt_indexes()``; truncation ends the log exactly at the start
  of the batch holding the offset, and appending continues from the new log end offset.

Size knob: ``KAFKALOG_FUZZ_SCALE`` (default 1, about 20 s) multiplies every ``max_examples``.
"""
from __future__ import annotations

import os
import tempfile
from typing import List, NamedTuple, Optional

import pytest

from hypothesis import HealthCheck, event, given, settings, target
from hypothesis import strategies as st

from pyspark_kafkalog.format import codecs
from pyspark_kafkalog.format.batch import iter_headers, iter_valid_headers
from pyspark_kafkalog.format.columnar import decode_columns, decode_records
from pyspark_kafkalog.format.encode import (EncodedBatch, assign_offsets, encode_batch_v2,
                                            encode_control_batch, encode_message_set,
                                            encode_records)
from pyspark_kafkalog.format.records import (CONTROL_ABORT, CONTROL_COMMIT, CREATE_TIME,
                                             LOG_APPEND_TIME, NO_TIMESTAMP_TYPE, Record)
from pyspark_kafkalog.log.config import LogConfig
from pyspark_kafkalog.log.partition import PartitionLog
from pyspark_kafkalog.storage import open_storage

SCALE = max(1, int(float(os.environ.get("KAFKALOG_FUZZ_SCALE", "1"))))


pytestmark = pytest.mark.slow   # Hypothesis over the record formats and the log (~30 s)


def examples(n: int) -> settings:
    return settings(max_examples=n * SCALE, deadline=None, derandomize=False,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much])


V2_CODECS = [codecs.NONE, codecs.GZIP, codecs.SNAPPY, codecs.LZ4, codecs.ZSTD]
LEGACY_CODECS = [codecs.NONE, codecs.GZIP, codecs.SNAPPY, codecs.LZ4]
T0 = 1_700_000_000_000

# -- strategies -----------------------------------------------------------------------------------

keys = st.one_of(st.none(), st.just(b""), st.binary(max_size=24))
values = st.one_of(st.none(), st.just(b""), st.binary(max_size=64),
                   st.binary(min_size=1, max_size=8).map(lambda b: b * 25))   # compressible
header = st.tuples(st.text(max_size=8), st.one_of(st.none(), st.just(b""), st.binary(max_size=8)))
headers = st.lists(header, max_size=3).map(tuple)
any_ts = st.one_of(st.integers(min_value=-1, max_value=2**43),
                   # the int64 top (Kafka's timestamps are >= -1): with a -1 first timestamp
                   # the v2 delta overflows an int64 and must wrap like Java's long, both ways
                   st.sampled_from([2**63 - 2, 2**63 - 1]))


def v2_records(ts=any_ts, max_size=12):
    return st.lists(st.builds(Record, keys, values, ts, headers), min_size=1, max_size=max_size)


def legacy_records(ts=any_ts, max_size=12):
    return st.lists(st.builds(Record, keys, values, ts), min_size=1, max_size=max_size)


@st.composite
def offset_deltas(draw, n):
    """None (0..n-1) or strictly increasing deltas with gaps, as after compaction."""
    if draw(st.booleans()):
        return None
    first = draw(st.integers(0, 5))
    gaps = draw(st.lists(st.integers(1, 1000), min_size=n - 1, max_size=n - 1))
    out = [first]
    for g in gaps:
        out.append(out[-1] + g)
    return out


@st.composite
def v2_batches(draw, ts=any_ts, max_records=12):
    recs = draw(v2_records(ts, max_records))
    kw = dict(
        base_offset=draw(st.integers(0, 2**40)),
        compression=draw(st.sampled_from(V2_CODECS)),
        timestamp_type=draw(st.sampled_from([CREATE_TIME, LOG_APPEND_TIME])),
        producer_id=draw(st.one_of(st.just(-1), st.integers(0, 2**62))),
        producer_epoch=draw(st.integers(-1, 2**15 - 1)),
        base_sequence=draw(st.integers(-1, 2**31 - 1)),
        partition_leader_epoch=draw(st.integers(-1, 2**31 - 1)),
        transactional=draw(st.booleans()),
        offset_deltas=draw(offset_deltas(len(recs))),
        delete_horizon_ms=draw(st.one_of(st.none(), st.integers(0, 2**43))),
    )
    if kw["timestamp_type"] == LOG_APPEND_TIME:
        kw["log_append_time"] = draw(st.integers(0, 2**43))
    return recs, kw


@st.composite
def legacy_batches(draw, ts=any_ts, max_records=12):
    magic = draw(st.sampled_from([0, 1]))
    recs = draw(legacy_records(ts, max_records))
    kw = dict(magic=magic, base_offset=draw(st.integers(0, 2**40)),
              compression=draw(st.sampled_from(LEGACY_CODECS)),
              timestamp_type=draw(st.sampled_from([CREATE_TIME, LOG_APPEND_TIME])))
    if kw["timestamp_type"] == LOG_APPEND_TIME:
        kw["log_append_time"] = draw(st.integers(0, 2**43))
    return recs, kw


# -- helpers --------------------------------------------------------------------------------------

def payload(r) -> tuple:
    """What a record carries besides its offset and batch position."""
    return (r.timestamp, r.timestamp_type, r.key, r.value, r.headers)


def columns_rows(cols) -> list:
    """(offset, timestamp, timestamp_type, key, value, headers) rows of a Columns."""
    rows, h = [], 0
    keys, values, hkeys, hvalues = cols.key, cols.value, cols.header_key, cols.header_value
    for i in range(len(cols)):
        n = cols.header_count[i]
        hdrs = tuple(zip(hkeys[h:h + n], hvalues[h:h + n]))
        h += n
        rows.append((cols.offset[i], cols.timestamp[i], cols.timestamp_type[i], keys[i],
                     values[i], hdrs))
    return rows


def expected_v2(recs, kw) -> list:
    base = kw["base_offset"]
    deltas = kw["offset_deltas"] or range(len(recs))
    lat = kw["timestamp_type"] == LOG_APPEND_TIME
    return [(base + d, kw["log_append_time"] if lat else r.timestamp, kw["timestamp_type"],
             r.key, r.value, tuple(r.headers)) for r, d in zip(recs, deltas)]


def expected_legacy(recs, kw) -> list:
    magic, base = kw["magic"], kw["base_offset"]
    out = []
    for i, r in enumerate(recs):
        if magic == 0:
            ts, tt = -1, NO_TIMESTAMP_TYPE
        elif kw["timestamp_type"] == LOG_APPEND_TIME:
            ts, tt = kw["log_append_time"], LOG_APPEND_TIME
        else:
            ts, tt = r.timestamp, CREATE_TIME
        out.append((base + i, ts, tt, r.key, r.value, ()))
    return out


def rows(decoded) -> list:
    return [(r.offset, r.timestamp, r.timestamp_type, r.key, r.value, r.headers) for r in decoded]


# -- encode -> decode ------------------------------------------------------------------------------

@examples(150)
@given(v2_batches())
def test_v2_encode_decode_identity(spec):
    recs, kw = spec
    batch = encode_batch_v2(recs, **kw)
    expected = expected_v2(recs, kw)
    decoded = decode_records(batch.data)
    assert rows(decoded) == expected
    for r in decoded:
        assert (r.magic, r.is_control, r.is_transactional) == (2, False, kw["transactional"])
        assert (r.producer_id, r.producer_epoch, r.partition_leader_epoch) == (
            kw["producer_id"], kw["producer_epoch"], kw["partition_leader_epoch"])
        assert r.batch_position == 0
    # the EncodedBatch facts and the shallow header agree with what was encoded
    (h,) = list(iter_valid_headers(batch.data))
    assert h.size == len(batch.data) and h.magic == 2 == batch.magic
    assert h.base_offset == batch.base_offset == kw["base_offset"]
    assert h.last_offset == batch.last_offset == expected[-1][0]
    assert h.record_count == batch.record_count == len(recs)
    assert h.compression == batch.compression == kw["compression"]
    assert h.timestamp_type == kw["timestamp_type"]
    assert h.is_transactional == kw["transactional"] and not h.is_control
    assert h.has_delete_horizon == (kw["delete_horizon_ms"] is not None)
    if kw["delete_horizon_ms"] is not None:
        assert h.base_timestamp == kw["delete_horizon_ms"]
    if kw["timestamp_type"] == LOG_APPEND_TIME:
        max_ts = kw["log_append_time"]
    else:
        max_ts = max(-1, max(r.timestamp for r in recs))
    assert h.max_timestamp == batch.max_timestamp == max_ts
    # headers off: same records, no headers
    cols = decode_columns(batch.data, with_headers=False)
    assert list(cols.header_count) == [0] * len(recs) and not cols.header_key
    assert [(o, k, v) for o, _, _, k, v, _ in columns_rows(cols)] == [
        (e[0], e[3], e[4]) for e in expected]


@examples(100)
@given(v2_batches(max_records=8), st.data())
def test_v2_decode_offset_window_is_a_filter(spec, data):
    recs, kw = spec
    batch = encode_batch_v2(recs, **kw)
    expected = expected_v2(recs, kw)
    lo, hi = expected[0][0] - 2, expected[-1][0] + 2
    min_off = data.draw(st.one_of(st.none(), st.integers(lo, hi)), label="min_offset")
    max_off = data.draw(st.one_of(st.none(), st.integers(lo, hi)), label="max_offset")
    cols = decode_columns(batch.data, min_offset=min_off, max_offset=max_off)
    assert columns_rows(cols) == [
        e for e in expected
        if (min_off is None or e[0] >= min_off) and (max_off is None or e[0] < max_off)]


@examples(30)
@given(st.sampled_from([CONTROL_ABORT, CONTROL_COMMIT]), st.integers(0, 2**62),
       st.integers(0, 2**15 - 1), st.integers(0, 2**43), st.integers(0, 2**31 - 1),
       st.integers(0, 2**40))
def test_control_batch_roundtrip(ctype, pid, epoch, ts, coord_epoch, base):
    batch = encode_control_batch(ctype, producer_id=pid, producer_epoch=epoch, timestamp=ts,
                                 coordinator_epoch=coord_epoch, base_offset=base)
    (r,) = decode_records(batch.data)
    assert (r.offset, r.timestamp, r.is_control, r.is_transactional, r.producer_id,
            r.producer_epoch) == (base, ts, True, True, pid, epoch)
    assert r.key == bytes([0, 0, 0, ctype]) and r.value[:2] == b"\0\0"
    assert int.from_bytes(r.value[2:], "big") == coord_epoch
    assert len(decode_columns(batch.data, skip_control=True)) == 0


@examples(150)
@given(legacy_batches())
def test_legacy_encode_decode_identity(spec):
    recs, kw = spec
    batch = encode_message_set(recs, **kw)
    expected = expected_legacy(recs, kw)
    decoded = decode_records(batch.data)
    assert rows(decoded) == expected
    for r in decoded:
        assert (r.magic, r.is_control, r.is_transactional, r.producer_id) == (
            kw["magic"], False, False, -1)
    assert (batch.magic, batch.base_offset, batch.last_offset, batch.record_count,
            batch.compression) == (kw["magic"], kw["base_offset"], expected[-1][0], len(recs),
                                   kw["compression"])
    hs = list(iter_valid_headers(batch.data))
    assert sum(h.size for h in hs) == len(batch.data)
    assert len(hs) == (1 if kw["compression"] else len(recs))
    assert hs[-1].last_offset == batch.last_offset
    assert batch.max_timestamp == max(e[1] for e in expected)


# -- assign_offsets --------------------------------------------------------------------------------

any_batch = st.one_of(
    v2_batches(max_records=8).map(lambda s: (encode_batch_v2(s[0], **s[1]), s[1])),
    legacy_batches(max_records=8).map(lambda s: (encode_message_set(s[0], **s[1]), s[1])))


@examples(150)
@given(any_batch, st.integers(0, 2**40), st.integers(-1, 2**31 - 1))
def test_assign_offsets_shifts_offsets_only(spec, new_base, epoch):
    batch, kw = spec
    moved = assign_offsets(batch, new_base, epoch)
    shift = new_base - batch.base_offset
    assert (moved.base_offset, moved.last_offset) == (new_base, batch.last_offset + shift)
    assert (moved.magic, moved.record_count, moved.compression, moved.max_timestamp) == (
        batch.magic, batch.record_count, batch.compression, batch.max_timestamp)
    before, after = decode_records(batch.data), decode_records(moved.data)   # validates CRCs
    list(iter_valid_headers(moved.data))
    assert [r.offset + shift for r in before] == [r.offset for r in after]
    assert [payload(r) for r in before] == [payload(r) for r in after]
    hs_before, hs_after = list(iter_headers(batch.data)), list(iter_headers(moved.data))
    assert hs_after[-1].last_offset == moved.last_offset
    if batch.magic == 2:
        assert moved.data[16:] == batch.data[16:], "magic 2 bytes after the epoch must not change"
        assert hs_after[0].base_offset == new_base
        if epoch != -1:
            assert {r.partition_leader_epoch for r in after} == {epoch}
    elif not (batch.magic == 0 and batch.compression):
        # magic 1 wrappers and plain messages: only each entry's offset field is rewritten
        assert len(moved.data) == len(batch.data)
        for hb, ha in zip(hs_before, hs_after):
            assert moved.data[ha.position + 8:ha.end] == batch.data[hb.position + 8:hb.end]


@examples(60)
@given(v2_batches(max_records=4), st.integers(1, 2**20))
def test_assign_offsets_leader_epoch_does_not_depend_on_shift(spec, distance):
    """assign_offsets(b, base, -1) must treat the partition leader epoch the same way whether
    or not ``base`` happens to equal the batch's current base offset."""
    recs, kw = spec
    batch = encode_batch_v2(recs, **kw)
    same = decode_records(assign_offsets(batch, batch.base_offset, -1).data)[0]
    other = decode_records(assign_offsets(batch, batch.base_offset + distance, -1).data)[0]
    assert same.partition_leader_epoch == other.partition_leader_epoch, (
        "BUG pyspark_kafkalog/format/encode.py assign_offsets: with partition_leader_epoch=-1 "
        f"the batch keeps its epoch {same.partition_leader_epoch} when the base offset is "
        f"unchanged but gets {other.partition_leader_epoch} when it moves (the early return "
        "for shift == 0 skips the epoch rewrite).")


# -- partition log ---------------------------------------------------------------------------------

small_header = st.tuples(st.text(max_size=4),
                         st.one_of(st.none(), st.just(b""), st.binary(max_size=8)))


class Spec(NamedTuple):
    magic: int
    compression: int
    records: list
    deltas: Optional[list]


@st.composite
def log_batches(draw, magics=(1, 2), ts=st.integers(T0, T0 + 400)):
    """One batch to append: small records, non-monotonic CreateTime timestamps."""
    magic = draw(st.sampled_from(magics))
    codec = draw(st.sampled_from(V2_CODECS if magic == 2 else LEGACY_CODECS))
    n = draw(st.integers(1, 6))
    recs = draw(st.lists(st.builds(Record, st.one_of(st.none(), st.binary(max_size=12)),
                                   st.one_of(st.none(), st.binary(max_size=40)), ts,
                                   st.lists(small_header, max_size=2).map(tuple) if magic == 2
                                   else st.just(())),
                         min_size=n, max_size=n))
    deltas = draw(offset_deltas(n)) if magic == 2 else None
    return Spec(magic, codec, recs, deltas)


@st.composite
def log_configs(draw):
    return LogConfig.from_properties({
        "segment.bytes": draw(st.integers(900, 2500)),   # a batch here is at most ~850 bytes
        "index.interval.bytes": draw(st.integers(0, 400)),
        "segment.ms": draw(st.sampled_from([150, 7 * 24 * 3600 * 1000])),
    })


def appends(magics=(1, 2), min_size=3, max_size=16):
    """Append calls, each of 1-4 batches."""
    return st.lists(st.lists(log_batches(magics), min_size=1, max_size=4), min_size=min_size,
                    max_size=max_size)


def encode_spec(spec: Spec) -> EncodedBatch:
    if spec.magic == 2:
        return encode_batch_v2(spec.records, compression=spec.compression,
                               offset_deltas=spec.deltas)
    return encode_records(spec.records, magic=spec.magic, compression=spec.compression)


class Model:
    """Brute-force model of a partition: every record appended, in offset order."""

    def __init__(self):
        self.records: List[tuple] = []   # (offset, ts, ts_type, key, value, headers)
        self.batches: List[tuple] = []   # (base, last) of every log entry

    def append(self, first_offset: int, specs) -> int:
        nxt = first_offset
        for spec in specs:
            deltas = spec.deltas or range(len(spec.records))
            for r, d in zip(spec.records, deltas):
                tt = NO_TIMESTAMP_TYPE if spec.magic == 0 else CREATE_TIME
                self.records.append((nxt + d, r.timestamp if spec.magic else -1, tt, r.key,
                                     r.value, tuple(r.headers)))
            if spec.magic < 2 and not spec.compression:   # one entry per message
                self.batches.extend((nxt + d, nxt + d) for d in deltas)
            else:
                self.batches.append((nxt, nxt + deltas[-1]))
            nxt += deltas[-1] + 1
        return nxt

    def truncate(self, base: int) -> None:
        self.records = [r for r in self.records if r[0] < base]
        self.batches = [b for b in self.batches if b[0] < base]

    def first_at_or_after(self, ts: int, start: int):
        for r in self.records:
            if r[0] >= start and r[1] >= ts:
                return r[0], r[1]
        return None


def append(log: PartitionLog, model: Model, specs) -> None:
    leo = log.log_end_offset
    res = log.append([encode_spec(s) for s in specs], now_ms=T0)   # no wall clock: repeatable
    assert res.first_offset == leo
    nxt = model.append(leo, specs)
    assert res.last_offset == nxt - 1 == log.log_end_offset - 1


def all_rows(log: PartitionLog) -> list:
    out = []
    for seg in log.segments:
        out.extend(rows(decode_records(log.storage.read(seg.log_path))))
    return out


def assert_indexes_rebuilt(log: PartitionLog, when: str) -> None:
    for seg in log.segments:
        index, timeindex = seg.rebuilt_indexes()
        assert log.storage.read(seg.path(".index")) == index, f"{when}: {seg} .index != rebuilt"
        assert log.storage.read(seg.path(".timeindex")) == timeindex, (
            f"{when}: {seg} .timeindex != rebuilt")


def shape(log: PartitionLog) -> None:
    """Steer generation towards logs with many segments and index entries."""
    segs = len(log.segments)
    entries = sum(len(log.storage.read(s.path(".index"))) // 8 for s in log.segments)
    target(float(segs), label="segments")
    target(float(entries), label="offset index entries")
    event(f"segments: {min(segs, 8)}{'+' if segs >= 8 else ''}")
    event(f"index entries: {min(entries, 10)}{'+' if entries >= 10 else ''}")


def new_log(tmp: str, config: LogConfig) -> PartitionLog:
    return PartitionLog(open_storage(tmp, fsync=False), "prop-0", config)


def ts_targets(model: Model, extra: list) -> list:
    tss = sorted({r[1] for r in model.records})
    targets = {-1, 0, T0 - 1, tss[0] - 1, tss[-1], tss[-1] + 1, tss[-1] + 1000}
    for t in tss:
        targets.update((t - 1, t, t + 1))
    return sorted(targets | set(extra))


@examples(40)
@given(log_configs(), appends(), st.lists(st.integers(T0 - 10, T0 + 410), max_size=5),
       st.data())
def test_offset_for_timestamp_matches_brute_force(config, ops, extra_targets, data):
    with tempfile.TemporaryDirectory() as tmp:
        log, model = new_log(tmp, config), Model()
        for specs in ops:
            append(log, model, specs)
        shape(log)
        targets = ts_targets(model, extra_targets)
        for t in targets:
            assert log.offset_for_timestamp(t) == model.first_at_or_after(t, 0), f"target {t}"
        # a fresh reader (everything re-read from storage) answers the same
        reopened = PartitionLog(log.storage, "prop-0", config)
        for t in targets[::3]:
            assert reopened.offset_for_timestamp(t) == model.first_at_or_after(t, 0), (
                f"reopened, target {t}")
        # delete whole segments below a random log start offset: those records are excluded
        lso = data.draw(st.integers(0, log.log_end_offset), label="log_start_offset")
        log.delete_segments_below(lso)
        assert log.log_start_offset == lso
        assert log.segments[0].base_offset <= lso
        for t in targets:
            assert log.offset_for_timestamp(t) == model.first_at_or_after(t, lso), (
                f"after delete_segments_below({lso}), target {t}")


@examples(40)
@given(log_configs(), appends(magics=(0, 1, 2)), st.data())
def test_read_columns_matches_brute_force(config, ops, data):
    with tempfile.TemporaryDirectory() as tmp:
        log, model = new_log(tmp, config), Model()
        for specs in ops:
            append(log, model, specs)
        shape(log)
        assert all_rows(log) == model.records
        leo = log.log_end_offset
        assert columns_rows(log.read_columns(0)) == model.records
        for _ in range(6):
            start = data.draw(st.integers(0, leo), label="start")
            end = data.draw(st.one_of(st.none(), st.integers(start, leo + 3)), label="end")
            max_bytes = data.draw(st.sampled_from([1, 200, 1 << 20]), label="max_bytes")
            got = columns_rows(log.read_columns(start, end, max_bytes=max_bytes))
            want = [r for r in model.records if r[0] >= start and (end is None or r[0] < end)]
            assert got == want, f"read_columns({start}, {end}, max_bytes={max_bytes})"


@examples(40)
@given(log_configs(), appends(magics=(0, 1, 2), max_size=12), st.data())
def test_indexes_and_truncate_to(config, ops, data):
    with tempfile.TemporaryDirectory() as tmp:
        log, model = new_log(tmp, config), Model()
        for i, specs in enumerate(ops):
            append(log, model, specs)
            assert_indexes_rebuilt(log, f"after append #{i}")
        shape(log)
        entries = [(seg.base_offset, h) for seg in log.segments
                   for h in iter_headers(log.storage.read(seg.log_path))]
        assert [h.last_offset for _, h in entries] == [b[1] for b in model.batches]

        offset = data.draw(st.integers(0, log.log_end_offset), label="truncate_to")
        holding = next((i for i, b in enumerate(model.batches) if b[1] >= offset), None)
        log.truncate_to(offset)
        if holding is None:   # at the log end offset: nothing to remove
            assert all_rows(log) == model.records
        else:
            base = model.batches[holding][0]
            model.truncate(base)
            assert log.log_end_offset == base, (
                f"truncate_to({offset}): log ends at {log.log_end_offset}, not at {base}, the "
                "start of the batch holding it")
            kept = [(sb, h) for sb, h in entries[:holding]]
            now = [(seg.base_offset, h) for seg in log.segments
                   for h in iter_headers(log.storage.read(seg.log_path))]
            assert now == kept, f"truncate_to({offset}) did not keep exactly the earlier batches"
            last_seg = log.segments[-1]
            assert last_seg.size(refresh=True) == (now[-1][1].end if now and now[-1][0] ==
                                                   last_seg.base_offset else 0)
            assert all_rows(log) == model.records
        assert_indexes_rebuilt(log, f"after truncate_to({offset})")
        # a fresh reader sees the same log end, and appending continues from it
        reopened = PartitionLog(log.storage, "prop-0", config)
        assert reopened.log_end_offset == log.log_end_offset
        more = data.draw(appends(magics=(0, 1, 2), min_size=1, max_size=3), label="more")
        for specs in more:
            append(reopened, model, specs)
            assert_indexes_rebuilt(reopened, "after truncate + append")
        assert all_rows(reopened) == model.records
        assert columns_rows(reopened.read_columns(0)) == model.records
