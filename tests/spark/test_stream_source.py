"""The streaming source's rules, driven in-process the way Spark drives it (initialOffset, then
per trigger latestOffset -> partitions -> read -> commit), without a SparkSession: options,
admission control, new and deleted partitions, data loss both ways, AvailableNow, consumer
groups and fast catch-up (KIP-333). The Spark end-to-end cases are in test_spark_stream.py."""
import logging

import pytest
from pyspark.sql.streaming.datasource import (ReadAllAvailable, ReadMaxBytes, ReadMaxRows,
                                              ReadMinRows)

from pyspark_kafkalog.admin import Admin
from pyspark_kafkalog.connector.stream_plan import SourceOffset
from pyspark_kafkalog.errors import InvalidConfigError, OffsetOutOfRangeError
from pyspark_kafkalog.spark.read_options import ReadOptions
from pyspark_kafkalog.spark.stream_reader import KafkaLogStreamReader


def reader(root, **opts):
    o = ReadOptions.parse({"path": str(root), **{k: str(v) for k, v in opts.items()}},
                          streaming=True)
    return KafkaLogStreamReader(o, None)


def trigger(r, start, limit=None):
    """One micro-batch: its end offset and the (topic, partition, offset, value) it read."""
    limit = limit or r.getDefaultReadLimit()
    end = r.latestOffset(start, limit)
    rows = []
    for part in r.partitions(start, end):
        for batch in r.read(part):
            d = batch.to_pydict()
            rows += list(zip(d["topic"], d["partition"], d["offset"], d["value"]))
    r.commit(end)
    return end, rows


def produce(admin, topic, n, start=0, partition=None):
    admin.produce(topic, [(f"k{i}".encode(), f"v{i}".encode()) for i in range(start, start + n)],
                  partition=partition)


@pytest.fixture
def root(tmp_path):
    a = Admin(str(tmp_path))
    a.create_topic("t", num_partitions=3)
    return tmp_path


def drain(r, start, limit=None, max_batches=100):
    """Triggers until nothing is new: every row, and each batch's row count."""
    rows, sizes = [], []
    for _ in range(max_batches):
        end, got = trigger(r, start, limit)
        if end == start:
            return start, rows, sizes
        rows += got
        sizes.append(len(got))
        start = end
    raise AssertionError("the source never caught up")


def test_starting_offsets_and_every_record_once(root):
    a = Admin(str(root))
    produce(a, "t", 30)
    # default: latest, as Spark's streaming source
    r = reader(root, subscribe="t")
    start = r.initialOffset()
    assert SourceOffset.from_json(start).positions == {("t", p): hw for p, hw in
                                                       enumerate(_hws(a, "t"))}
    produce(a, "t", 12, 30)
    _, rows, _ = drain(r, start)
    assert sorted(v for *_, v in rows) == sorted(f"v{i}".encode() for i in range(30, 42))
    # earliest reads everything, each record once, in offset order per partition
    r = reader(root, subscribe="t", startingOffsets="earliest")
    _, rows, _ = drain(r, r.initialOffset())
    assert sorted(v for *_, v in rows) == sorted(f"v{i}".encode() for i in range(42))
    for p in range(3):
        offs = [o for _, q, o, _ in rows if q == p]
        assert offs == sorted(offs) and len(offs) == len(set(offs))
    # JSON: must name every subscribed partition, -2 earliest, -1 latest
    r = reader(root, subscribe="t", startingOffsets='{"t":{"0":-2,"1":-1,"2":1}}')
    init = SourceOffset.from_json(r.initialOffset()).positions
    assert init[("t", 0)] == 0 and init[("t", 1)] == _hws(a, "t")[1] and init[("t", 2)] == 1
    with pytest.raises(InvalidConfigError, match="must name all"):
        reader(root, subscribe="t", startingOffsets='{"t":{"0":1}}').initialOffset()


def _hws(a, topic):
    state = a.cluster.state()
    return [state.partition(topic, p).high_watermark
            for p in range(a.cluster.partition_count(topic))]


def test_streaming_only_options_are_checked():
    with pytest.raises(InvalidConfigError, match="ending offsets are not valid in streaming"):
        ReadOptions.parse({"path": "/x", "subscribe": "t", "endingOffsets": "latest"},
                          streaming=True)
    with pytest.raises(InvalidConfigError, match="maxOffsetsPerTrigger"):
        ReadOptions.parse({"path": "/x", "subscribe": "t", "maxOffsetsPerTrigger": "0"},
                          streaming=True)
    with pytest.raises(InvalidConfigError, match="must not be above maxOffsetsPerTrigger"):
        ReadOptions.parse({"path": "/x", "subscribe": "t", "maxOffsetsPerTrigger": "5",
                           "minOffsetsPerTrigger": "6"}, streaming=True)
    o = ReadOptions.parse({"path": "/x", "subscribe": "t", "maxTriggerDelay": "30s",
                           "maxBytesPerTrigger": "1MB", "enable.parallel.rebalance": "true"},
                          streaming=True)
    assert (o.max_trigger_delay_ms, o.max_bytes_per_trigger, o.fast_catch_up) == \
        (30_000, 1 << 20, True)


def test_a_plain_kafka_log_dir_cannot_be_followed(tmp_path):
    (tmp_path / "t-0").mkdir()
    r = reader(tmp_path, subscribe="t")
    with pytest.raises(InvalidConfigError, match="needs a kafkalog cluster root"):
        r.initialOffset()


def test_max_offsets_and_max_bytes_per_trigger_hold_every_batch(root):
    a = Admin(str(root))
    produce(a, "t", 200)
    r = reader(root, subscribe="t", startingOffsets="earliest", maxOffsetsPerTrigger=17)
    assert r.getDefaultReadLimit() == ReadMaxRows(17)
    _, rows, sizes = drain(r, r.initialOffset())
    assert len(rows) == 200 and max(sizes) <= 17 and sizes[0] == 17
    r = reader(root, subscribe="t", startingOffsets="earliest", maxBytesPerTrigger=2000)
    assert r.getDefaultReadLimit() == ReadMaxBytes(2000)
    _, rows, sizes = drain(r, r.initialOffset())
    assert len(rows) == 200 and len(sizes) > 1
    # ReadAllAvailable switches every option limit off (Spark's contract)
    r = reader(root, subscribe="t", startingOffsets="earliest", maxOffsetsPerTrigger=17)
    _, rows, sizes = drain(r, r.initialOffset(), ReadAllAvailable())
    assert sizes == [200]


def test_min_offsets_per_trigger_waits_for_data_or_the_delay(root):
    a = Admin(str(root))
    r = reader(root, subscribe="t", minOffsetsPerTrigger=10, maxTriggerDelay="1h")
    start = r.initialOffset()
    assert r.getDefaultReadLimit() == ReadMinRows(10)
    produce(a, "t", 4)
    assert r.latestOffset(start, ReadMinRows(10)) == start      # too little, delay not passed
    produce(a, "t", 6, 4)
    end, rows = trigger(r, start, ReadMinRows(10))
    assert len(rows) == 10
    r2 = reader(root, subscribe="t", minOffsetsPerTrigger=10, maxTriggerDelay="0s")
    s2 = r2.initialOffset()
    produce(a, "t", 1, 10)
    assert len(trigger(r2, s2, ReadMinRows(10))[1]) == 1     # the delay passed


def test_available_now_stops_at_what_existed_at_its_start(root):
    a = Admin(str(root))
    produce(a, "t", 50)
    r = reader(root, subscribe="t", startingOffsets="earliest", maxOffsetsPerTrigger=20)
    start = r.initialOffset()
    r.prepareForTriggerAvailableNow()
    produce(a, "t", 25, 50)                  # after the start: not read by this run
    _, rows, sizes = drain(r, start)
    assert len(rows) == 50 and max(sizes) <= 20
    assert {v for *_, v in rows} == {f"v{i}".encode() for i in range(50)}


def test_new_partitions_and_topics_are_picked_up_from_earliest(root):
    a = Admin(str(root))
    r = reader(root, subscribePattern="t|u.*")
    start = r.initialOffset()
    a.create_partitions("t", 5)
    produce(a, "t", 7, partition=4)
    a.create_topic("u1", num_partitions=1)
    produce(a, "u1", 3)
    start, rows, _ = drain(r, start)
    assert sorted((t, p, v) for t, p, _, v in rows) == sorted(
        [("t", 4, f"v{i}".encode()) for i in range(7)] + [("u1", 0, f"v{i}".encode())
                                                          for i in range(3)])
    assert ("t", 4) in SourceOffset.from_json(start).positions


def test_records_deleted_while_behind_fail_or_are_skipped_by_name(root, caplog):
    a = Admin(str(root))
    produce(a, "t", 30, partition=0)
    r = reader(root, assign='{"t":[0]}', startingOffsets="earliest")
    start = r.initialOffset()
    a.delete_records_before({("t", 0): 12})
    with pytest.raises(OffsetOutOfRangeError, match=r"t-0: offsets 0 to 11 were deleted"):
        trigger(r, start)
    r = reader(root, assign='{"t":[0]}', startingOffsets="earliest", failOnDataLoss="false")
    with caplog.at_level(logging.WARNING):
        _, rows, _ = drain(r, start)
    assert [o for _, _, o, _ in rows] == list(range(12, 30))
    assert "t-0: offsets 0 to 11 were deleted" in caplog.text


def test_a_deleted_topic_fails_the_query_or_is_dropped(root, caplog):
    a = Admin(str(root))
    a.create_topic("gone", num_partitions=1)
    produce(a, "gone", 3)
    r = reader(root, subscribe="gone,t", startingOffsets="earliest")
    start = r.initialOffset()
    a.delete_topic("gone")
    with pytest.raises(OffsetOutOfRangeError, match="partition gone-0 is gone"):
        trigger(r, start)
    r = reader(root, subscribe="gone,t", startingOffsets="earliest", failOnDataLoss="false")
    with caplog.at_level(logging.WARNING):
        end, rows = trigger(r, start)
    assert rows == [] and "gone" not in end and "partition gone-0 is gone" in caplog.text


def test_the_group_gets_each_batch_end_and_reports_lag(root):
    a = Admin(str(root))
    produce(a, "t", 9)
    r = reader(root, subscribe="t", startingOffsets="earliest", **{"kafka.group.id": "q1"})
    end, _ = trigger(r, r.initialOffset())
    committed = {tp: om.offset for tp, om in a.list_group_offsets("q1").items()}
    assert committed == SourceOffset.from_json(end).positions
    assert all(row.lag == 0 for row in a.describe_group("q1"))
    produce(a, "t", 4, 9)
    assert sum(row.lag for row in a.describe_group("q1")) == 4
    # groupIdPrefix: a group of its own per query run, as Spark derives it
    r2 = reader(root, subscribe="t", groupIdPrefix="etl")
    assert r2.group_id.startswith("etl-")


def test_report_latest_offset_shows_the_lag(root):
    a = Admin(str(root))
    r = reader(root, subscribe="t", maxOffsetsPerTrigger=2)
    start = r.initialOffset()
    produce(a, "t", 10, partition=1)
    end = r.latestOffset(start, ReadMaxRows(2))
    latest = r.reportLatestOffset()
    assert latest["t"]["1"] - SourceOffset.from_json(end).positions[("t", 1)] == 8


def test_fast_catch_up_reads_fresh_records_first_and_the_gap_in_slices(root):
    """KIP-333: a restart far behind reads the records produced after it at once, and the
    backlog alongside in slices; every record once; the group holds the gap's position."""
    a = Admin(str(root))
    r = reader(root, assign='{"t":[0]}', startingOffsets="earliest")
    checkpoint = r.initialOffset()            # the query stopped here ...
    produce(a, "t", 100, partition=0)         # ... and fell 100 records behind
    r = reader(root, assign='{"t":[0]}', fastCatchUp="true", fastCatchUpThreshold=50,
               fastCatchUpRecordsPerTrigger=30, **{"kafka.group.id": "g"})
    end, rows = trigger(r, checkpoint)        # the restart's first batch opens the gap
    assert SourceOffset.from_json(end).gaps == {("t", 0): (30, 100)}
    assert [o for *_, o, _ in rows] == list(range(30))
    assert a.list_group_offsets("g")[("t", 0)].offset == 30    # the gap's position
    produce(a, "t", 5, 100, partition=0)      # fresh records, produced after the restart
    end2, rows2 = trigger(r, end)
    offsets = [o for *_, o, _ in rows2]
    assert set(range(100, 105)) <= set(offsets)               # fresh data does not wait
    assert SourceOffset.from_json(end2).remaining_gap() == 40
    assert end2["$catchUpRecordsLeft"] == 40                    # what the progress shows
    # a crash during catch-up: a new process resumes the gap and the fresh stream from the
    # offset alone (no new gap opens: the checkpoint already has one)
    r = reader(root, assign='{"t":[0]}', fastCatchUp="true", fastCatchUpThreshold=1,
               fastCatchUpRecordsPerTrigger=30, **{"kafka.group.id": "g"})
    start, rest, _ = drain(r, end2)
    every = [o for *_, o, _ in rows + rows2 + rest]
    assert sorted(every) == list(range(105))                    # each once
    assert SourceOffset.from_json(start).gaps == {}
    assert a.list_group_offsets("g")[("t", 0)].offset == 105
    # a new query (no checkpoint) far behind is not a restart: no gap
    r = reader(root, assign='{"t":[0]}', startingOffsets="earliest", fastCatchUp="true",
               fastCatchUpThreshold=50)
    assert SourceOffset.from_json(r.latestOffset(r.initialOffset(), ReadAllAvailable())).gaps \
        == {}
    # below the threshold there is no gap
    r = reader(root, assign='{"t":[0]}', fastCatchUp="true", fastCatchUpThreshold=1000)
    assert SourceOffset.from_json(r.latestOffset(checkpoint, ReadAllAvailable())).gaps == {}


def test_a_trigger_costs_what_changed(root):
    """The fetch session: after the first (full) fetch, a trigger replays only new metadata
    entries; with nothing new it reads one entry name that does not exist."""
    a = Admin(str(root))
    a.create_topic("wide", num_partitions=300)
    r = reader(root, subscribe="wide")
    start = r.initialOffset()
    storage = r._cluster.storage
    calls = []
    real_read = storage.read

    def counting_read(path, *args, **kw):
        calls.append(path)
        return real_read(path, *args, **kw)
    storage.read = counting_read
    try:
        r.latestOffset(start, ReadAllAvailable())
        assert len(calls) <= 2, calls
        calls.clear()
        produce(a, "wide", 1, partition=7)
        end = r.latestOffset(start, ReadAllAvailable())
        assert len([c for c in calls if "_kafkalog/log/" in c]) <= 4, calls
        assert SourceOffset.from_json(end).positions[("wide", 7)] == 1
    finally:
        storage.read = real_read
    assert r._session.full_fetches == 1 and r._session.incremental_fetches >= 2


def test_starting_timestamp_headers_and_task_splitting(root):
    a = Admin(str(root))
    from pyspark_kafkalog.format.records import Record
    a.produce("t", [Record(b"k", b"early", 1_000, [("h", b"1")])], partition=0)
    a.produce("t", [Record(b"k", f"late{i}".encode(), 5_000 + i, [("h", b"2")])
                    for i in range(40)], partition=0)
    r = reader(root, assign='{"t":[0]}', startingTimestamp=5_000, includeHeaders="true",
               minPartitions=4)
    start = r.initialOffset()
    assert SourceOffset.from_json(start).positions == {("t", 0): 1}
    produce(a, "t", 8, partition=0)
    end = r.latestOffset(start, ReadAllAvailable())
    parts = r.partitions(start, end)
    assert len(parts) == 4                                # minPartitions, as in batch
    batches = [b for p in parts for b in r.read(p)]
    assert "headers" in batches[0].schema.names
    assert sum(b.num_rows for b in batches) == 48


@pytest.mark.slow
def test_the_steady_state_shortcut_agrees_with_looking_at_everything(tmp_path):
    """Looking only at what the fetch session says changed (plus the backlog) must give the
    same end offsets as a reader that looks at every partition (a new one, each trigger)."""
    import random
    rng = random.Random(7)
    a = Admin(str(tmp_path))
    a.create_topic("w", num_partitions=20)
    opts = dict(subscribePattern="w.*", startingOffsets="earliest")
    r = reader(tmp_path, **opts)
    start = r.initialOffset()
    for i in range(25):
        for _ in range(rng.randint(0, 4)):
            produce(a, "w", rng.randint(1, 6), partition=rng.randrange(20))
        if i == 10:
            a.create_topic("w2", num_partitions=2)
            produce(a, "w2", 3, partition=1)
        if i == 15:
            a.delete_records_before({("w", 3): _hws(a, "w")[3]})
        limit = ReadMaxRows(rng.randint(1, 30)) if rng.random() < 0.6 else ReadAllAvailable()
        end = r.latestOffset(start, limit)
        fresh = reader(tmp_path, **opts)
        fresh._first_trigger = False
        assert fresh.latestOffset(start, limit) == end, i
        assert r.reportLatestOffset() == fresh.reportLatestOffset()
        r.commit(end)
        start = end
    assert r.stats["steady"] == 24          # every trigger after the first took the shortcut
