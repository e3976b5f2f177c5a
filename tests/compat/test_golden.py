"""Ground truth: the log dir Apache Kafka's own classes wrote (../shared/kafka-golden)."""
from __future__ import annotations

import json

import pytest

from support.golden import CASES, DAMAGED, GOLDEN, UNDAMAGED, expected_records, record_json
from pyspark_kafkalog.errors import CorruptRecordError
from pyspark_kafkalog.format.batch import iter_headers
from pyspark_kafkalog.format.columnar import decode_records
from pyspark_kafkalog.format.encode import encode_batch_v2, encode_message_set
from pyspark_kafkalog.format.records import Record
from pyspark_kafkalog.log.logdir import LogDir
from pyspark_kafkalog.log.partition import PartitionLog
from pyspark_kafkalog.storage import open_storage


def test_corpus_is_there():
    assert len(CASES) >= 29, f"golden corpus missing or incomplete at {GOLDEN}"


def _segments(case):
    return sorted((GOLDEN / case).glob("*.log"))


@pytest.mark.parametrize("case", UNDAMAGED)
def test_every_record_decodes_exactly(case):
    got = []
    for seg in _segments(case):
        base = int(seg.name[:20])
        got += [record_json(r, base) for r in decode_records(seg.read_bytes())]
    assert got == expected_records(case)


@pytest.mark.parametrize("case", UNDAMAGED)
def test_partition_log_reads_all_records(case):
    """The log layer (index seeks, segment hops) returns the same records as a flat decode."""
    log = LogDir(open_storage(str(GOLDEN))).open_partition(case[:-2], 0)
    expected = expected_records(case)
    assert log.log_start_offset == expected[0]["offset"]
    assert log.log_end_offset == expected[-1]["offset"] + 1
    cols = log.read_columns(log.log_start_offset, skip_control=False, max_bytes=64 * 1024)
    assert list(cols.offset) == [e["offset"] for e in expected]
    assert list(cols.timestamp) == [e["timestamp"] for e in expected]
    # a read from the middle starts exactly at the requested offset
    mid = expected[len(expected) // 2]["offset"]
    cols = log.read_columns(mid, mid + 5, skip_control=False)
    assert list(cols.offset) == [e["offset"] for e in expected if mid <= e["offset"] < mid + 5]


@pytest.mark.parametrize("case", UNDAMAGED)
def test_indexes_rebuild_byte_identical(case):
    log = PartitionLog(open_storage(str(GOLDEN)), case)
    assert len(log.segments) == 3
    for seg in log.segments:
        index, timeindex = seg.rebuilt_indexes()
        assert index == (GOLDEN / case / seg.path(".index").split("/")[-1]).read_bytes()
        assert timeindex == (GOLDEN / case / seg.path(".timeindex").split("/")[-1]).read_bytes()


@pytest.mark.parametrize("case", DAMAGED)
def test_damaged_cases_recover_to_valid_bytes(case, golden_copy):
    expected = json.loads((GOLDEN / case / "expected-recovery.json").read_text())
    storage = open_storage(str(golden_copy))
    damaged = golden_copy / case / expected["segment"]
    with pytest.raises(CorruptRecordError) if expected["damage"] == "corrupt" else _no_error():
        decode_records(damaged.read_bytes())
    report = PartitionLog(storage, case).recover()
    cut = [s for s in report.segments if s.truncated_bytes]
    assert len(cut) == 1
    assert cut[0].segment.endswith(expected["segment"])
    assert cut[0].valid_bytes == expected["valid_bytes"]
    assert cut[0].first_dropped_offset == expected["first_dropped_offset"]
    assert damaged.stat().st_size == expected["valid_bytes"]
    # exactly the listed records survive, and the rebuilt indexes are what Kafka rebuilds
    log = PartitionLog(storage, case)
    got = []
    for seg in log.segments:
        data = storage.read(seg.log_path)
        got += [record_json(r, seg.base_offset) for r in decode_records(data)]
        index, timeindex = seg.rebuilt_indexes()
        assert storage.read(seg.path(".index")) == index
        assert storage.read(seg.path(".timeindex")) == timeindex
    assert got == expected_records(case)
    # a second recovery finds nothing to do
    again = PartitionLog(storage, case).recover()
    assert again.truncated_bytes == 0


class _no_error:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.mark.parametrize("case", ["m2-none-create-0", "m1-none-create-0", "m1-none-logappend-0",
                                  "m0-none-notime-0", "txn-v2-none-0", "gaps-v2-zstd-0"])
def test_encoder_reproduces_kafka_batches(case):
    """Re-encoding each decoded batch gives Kafka's bytes: byte for byte where no codec is
    involved, and the same records (codec output differs between zstd builds) otherwise."""
    for seg in _segments(case):
        buf = seg.read_bytes()
        for h in iter_headers(buf):
            raw = buf[h.position:h.end]
            recs = decode_records(raw)
            if h.magic == 2:
                enc = encode_batch_v2(
                    [Record(r.key, r.value, r.timestamp, r.headers) for r in recs],
                    base_offset=h.base_offset, compression=h.compression,
                    timestamp_type=h.timestamp_type, producer_id=h.producer_id,
                    producer_epoch=h.producer_epoch, base_sequence=h.base_sequence,
                    partition_leader_epoch=h.partition_leader_epoch,
                    transactional=h.is_transactional, control=h.is_control,
                    offset_deltas=[r.offset - h.base_offset for r in recs])
            else:
                enc = encode_message_set([Record(r.key, r.value, r.timestamp) for r in recs],
                                         magic=h.magic, base_offset=recs[0].offset,
                                         compression=h.compression,
                                         timestamp_type=h.timestamp_type,
                                         log_append_time=h.max_timestamp)
            if h.compression == 0:
                assert enc.data == raw, f"{seg.name} batch at {h.position}"
            else:
                assert decode_records(enc.data) == [r._replace(batch_position=0) for r in recs]


def test_root_checkpoints_match_the_logs():
    logdir = LogDir(open_storage(str(GOLDEN)))
    hw = logdir.read_checkpoint("replication-offset-checkpoint")
    lso = logdir.read_checkpoint("log-start-offset-checkpoint")
    assert len(hw) == len(UNDAMAGED) == 26
    for case in UNDAMAGED:
        topic = case[:-2]
        exp = expected_records(case)
        assert hw[(topic, 0)] == exp[-1]["offset"] + 1
        assert lso[(topic, 0)] == exp[0]["offset"]
        assert logdir.open_partition(topic, 0).log_start_offset == exp[0]["offset"]
    assert sorted(t for t, _ in logdir.partitions()) == sorted(c[:-2] for c in CASES)


@pytest.mark.parametrize("case", ["m2-gzip-create-0", "txn-v2-none-0", "m0-snappy-notime-0"])
def test_arrow_columns_match_rows(case):
    from pyspark_kafkalog.format.columnar import decode_columns, to_arrow
    seg = _segments(case)[0].read_bytes()
    rows = decode_records(seg)
    table = to_arrow(decode_columns(seg), batch_fields=True)
    assert table.num_rows == len(rows)
    assert table.column("offset").to_pylist() == [r.offset for r in rows]
    assert table.column("timestamp").to_pylist() == [r.timestamp for r in rows]
    assert table.column("timestampType").to_pylist() == [r.timestamp_type for r in rows]
    assert table.column("key").to_pylist() == [r.key for r in rows]
    assert table.column("value").to_pylist() == [r.value for r in rows]
    assert table.column("headers").to_pylist() == [
        [{"key": k, "value": v} for k, v in r.headers] for r in rows]
    assert table.column("isControl").to_pylist() == [r.is_control for r in rows]
    assert table.column("producerId").to_pylist() == [r.producer_id for r in rows]
