"""The partition log: append as a broker does, roll, index, truncate, delete, seek cheaply."""
from __future__ import annotations

import random

import pytest

from pyspark_kafkalog.errors import OffsetOutOfRangeError, RecordTooLargeError
from pyspark_kafkalog.format.columnar import decode_records
from pyspark_kafkalog.format.encode import encode_records
from pyspark_kafkalog.format.records import LOG_APPEND_TIME, Record
from pyspark_kafkalog.log.config import LogConfig
from pyspark_kafkalog.log.partition import PartitionLog
from pyspark_kafkalog.log.segment import ReadStats
from pyspark_kafkalog.storage import open_storage


def _batch(n, start_ts=1_000, value=None, magic=2, compression=0, step=1):
    rng = random.Random(start_ts)
    return encode_records([Record(b"k%d" % i, value if value is not None else rng.randbytes(200),
                                  start_ts + i * step) for i in range(n)],
                          magic=magic, compression=compression)


def _log(tmp_path, **props):
    return PartitionLog(open_storage(str(tmp_path)), "t-0", LogConfig.from_properties(props))


def _assert_indexes_rebuilt(log):
    for seg in log.segments:
        index, timeindex = seg.rebuilt_indexes()
        assert log.storage.read(seg.path(".index")) == index, seg
        assert log.storage.read(seg.path(".timeindex")) == timeindex, seg


def test_append_assigns_offsets_from_the_log_end(tmp_path):
    log = _log(tmp_path)
    r1 = log.append([_batch(3), _batch(2)], leader_epoch=4)
    assert (r1.first_offset, r1.last_offset) == (0, 4)
    r2 = _log(tmp_path).append([_batch(1)])
    assert (r2.first_offset, r2.last_offset) == (5, 5)
    recs = decode_records(open(tmp_path / "t-0" / "00000000000000000000.log", "rb").read())
    assert [r.offset for r in recs] == list(range(6))
    assert {r.partition_leader_epoch for r in recs[:5]} == {4}
    assert [tuple(e) for e in _log(tmp_path).leader_epochs()] == [(4, 0)]


@pytest.mark.parametrize("magic,compression", [(2, 0), (2, 3), (1, 0), (1, 1), (0, 0), (0, 2)])
def test_roll_by_segment_bytes_and_index_interval(tmp_path, magic, compression):
    log = _log(tmp_path, **{"segment.bytes": 20_000, "index.interval.bytes": 1_000})
    for i in range(40):
        log.append([_batch(7, start_ts=10_000 + i * 10, magic=magic, compression=compression)])
    assert len(log.segments) > 3
    for seg in log.segments:
        assert seg.size() <= 20_000
    _assert_indexes_rebuilt(log)
    reopened = _log(tmp_path)
    assert reopened.log_end_offset == 280
    cols = reopened.read_columns(0)
    assert list(cols.offset) == list(range(280))


def test_roll_by_segment_ms_uses_record_timestamps(tmp_path):
    """KIP-32: segment age is measured from the first batch's timestamp, not the clock."""
    log = _log(tmp_path, **{"segment.ms": 1000})
    log.append([_batch(1, start_ts=5_000)])
    log.append([_batch(1, start_ts=5_900)])
    assert len(log.segments) == 1
    log.append([_batch(1, start_ts=6_001)])
    assert [s.base_offset for s in log.segments] == [0, 2]


def test_log_append_time_stamps_batches(tmp_path):
    log = _log(tmp_path, **{"message.timestamp.type": "LogAppendTime"})
    log.append([_batch(3), _batch(2, magic=1, compression=1)], now_ms=123_456)
    recs = decode_records(open(tmp_path / "t-0" / "00000000000000000000.log", "rb").read())
    assert {r.timestamp for r in recs} == {123_456}
    assert {r.timestamp_type for r in recs} == {LOG_APPEND_TIME}


def test_too_large_batches_are_refused_and_nothing_changes(tmp_path):
    log = _log(tmp_path, **{"max.message.bytes": 500})
    log.append([_batch(2)])
    before = (tmp_path / "t-0" / "00000000000000000000.log").read_bytes()
    with pytest.raises(RecordTooLargeError, match="max.message.bytes"):
        log.append([_batch(100)])
    assert (tmp_path / "t-0" / "00000000000000000000.log").read_bytes() == before


def test_reading_mid_segment_costs_one_index_interval(tmp_path):
    log = _log(tmp_path, **{"index.interval.bytes": 4096})
    for i in range(100):
        log.append([_batch(10, start_ts=i * 1000 + k * 10) for k in range(20)])
    seg = log.segments[0]
    assert seg.size() > 1_500_000
    stats = ReadStats()
    fresh = PartitionLog(log.storage, "t-0", stats=stats)
    target = 13_337
    data, _ = fresh.read(target, max_bytes=1)
    assert any(r.offset == target for r in decode_records(data))
    assert stats.log_bytes <= 2 * 4096 + len(data), stats
    # an offset-for-timestamp lookup is just as local
    stats.reset()
    assert fresh.offset_for_timestamp(50_005) == (10_005, 50_005)  # batch 50*20, record 5
    assert stats.log_bytes <= 4 * 4096, stats


def test_reads_outside_the_log_are_typed_errors(tmp_path):
    log = _log(tmp_path)
    log.append([_batch(5)])
    with pytest.raises(OffsetOutOfRangeError, match="offset 6"):
        log.read(6)
    assert log.read(5) == (b"", -1)
    log.log_start_offset = 2
    with pytest.raises(OffsetOutOfRangeError):
        log.read_columns(1)


def test_truncate_to_removes_whole_batches_and_later_segments(tmp_path):
    log = _log(tmp_path, **{"segment.bytes": 2_000, "index.interval.bytes": 200})
    for i in range(30):
        log.append([_batch(4, start_ts=100 * i)])
    assert len(log.segments) > 4
    log.truncate_to(50)                  # batches hold 4 offsets: 48..51 goes whole
    assert log.log_end_offset == 48
    _assert_indexes_rebuilt(log)
    assert _log(tmp_path).log_end_offset == 48
    r = log.append([_batch(2)])
    assert r.first_offset == 48
    assert list(_log(tmp_path).read_columns(0).offset) == list(range(50))


def test_delete_segments_below_log_start_offset(tmp_path):
    log = _log(tmp_path, **{"segment.bytes": 2_000})
    for i in range(30):
        log.append([_batch(4, start_ts=100 * i)])
    bases = [s.base_offset for s in log.segments]
    deleted = log.delete_segments_below(bases[2] + 1)
    assert deleted == bases[:2]
    assert [s.base_offset for s in log.segments] == bases[2:]
    assert log.log_start_offset == bases[2] + 1
    # the active segment is never deleted, even when everything is below the log start offset
    log.delete_segments_below(10_000)
    assert len(log.segments) == 1
    assert sorted(p.name for p in (tmp_path / "t-0").iterdir() if p.suffix == ".log") == [
        f"{log.segments[0].base_offset:020d}.log"]


def test_append_repairs_a_torn_tail_first(tmp_path):
    log = _log(tmp_path, **{"index.interval.bytes": 100})
    for i in range(10):
        log.append([_batch(3, start_ts=i)])
    path = tmp_path / "t-0" / "00000000000000000000.log"
    size = path.stat().st_size
    with open(path, "ab") as f:
        f.write(_batch(3).data[:40])      # a crash in the middle of an append
    fresh = _log(tmp_path, **{"index.interval.bytes": 100})
    r = fresh.append([_batch(1)])
    assert r.first_offset == 30
    assert path.stat().st_size == size + len(_batch(1).data)
    _assert_indexes_rebuilt(fresh)


def test_stale_and_missing_indexes_are_repaired_on_append(tmp_path):
    log = _log(tmp_path, **{"index.interval.bytes": 100})
    for i in range(20):
        log.append([_batch(3, start_ts=i)])
    (tmp_path / "t-0" / "00000000000000000000.index").write_bytes(b"")
    (tmp_path / "t-0" / "00000000000000000000.timeindex").unlink()
    fresh = _log(tmp_path, **{"index.interval.bytes": 100})
    assert list(fresh.read_columns(0).offset) == list(range(60))
    fresh.append([_batch(1, start_ts=99)])
    _assert_indexes_rebuilt(fresh)


def test_memory_storage_behaves_like_local(tmp_path):
    import uuid
    st = open_storage(f"memory://t{uuid.uuid4().hex}")
    log = PartitionLog(st, "t-3", LogConfig.from_properties({"segment.bytes": 3000}))
    for i in range(20):
        log.append([_batch(5, start_ts=i * 5)])
    assert len(log.segments) > 2
    _assert_indexes_rebuilt(log)
    assert list(PartitionLog(st, "t-3").read_columns(0).offset) == list(range(100))
    assert PartitionLog(st, "t-3").offset_for_timestamp(52) == (52, 52)


@pytest.mark.parametrize("torn", [False, True])
def test_a_first_append_that_rolls_repairs_the_segment_it_leaves(tmp_path, torn):
    """A writer killed after writing a batch to the .log but before its index entries (and,
    ``torn``, half-way through the next batch) leaves the active segment behind; the next
    process's first append rolls to a new segment, and the one it leaves is repaired first:
    its indexes are what Kafka rebuilds and no torn batch stays inside the log."""
    log = _log(tmp_path, **{"segment.bytes": 8000, "index.interval.bytes": 500})
    for i in range(6):
        log.append([_batch(5, start_ts=1_000 + 10 * i)])
    seg = log.active_segment
    dead = _batch(4, start_ts=5_000)                     # what the dead writer appended
    from pyspark_kafkalog.format.encode import assign_offsets
    data = assign_offsets(dead, log.log_end_offset, -1).data
    log.storage.append(seg.log_path, data + (data[:100] if torn else b""))
    reopened = _log(tmp_path, **{"segment.bytes": 8000, "index.interval.bytes": 500})
    r = reopened.append([_batch(30, start_ts=9_000)])   # too big for the rest: it rolls
    assert r.rolled == [r.first_offset] and r.first_offset == 34
    _assert_indexes_rebuilt(reopened)
    offsets = [rec.offset for s in reopened.segments
               for rec in decode_records(reopened.storage.read(s.log_path))]
    assert offsets == list(range(64))
