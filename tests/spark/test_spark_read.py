"""spark.read.format("kafkalog"): the golden Kafka-written log dir and kafkalog clusters read back
through a real SparkSession, Spark's Kafka source options, and filter pushdown measured in bytes.

Expected rows are always derived from the ground truth (golden ``expected.jsonl``, or the records
a test produced), never from the implementation.
"""
from __future__ import annotations

import base64
import datetime as dt
import json
import logging
import re

import pytest

from support.golden import GOLDEN, UNDAMAGED, expected_records
from pyspark_kafkalog.admin import Admin, TopicPartition
from pyspark_kafkalog.client.producer import Producer
from pyspark_kafkalog.errors import InvalidConfigError, OffsetOutOfRangeError
from pyspark_kafkalog.format.records import Record

EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
T0 = 1_700_000_000_000
DAMAGED_INFO = {c: json.loads((GOLDEN / c / "expected-recovery.json").read_text())
                for c in ("torn-v2-lz4-0", "corrupt-v2-none-0", "corrupt-v1-gzip-0")
                if (GOLDEN / c / "expected-recovery.json").exists()}


# -- helpers ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def kspark(spark):
    import pyspark_kafkalog
    pyspark_kafkalog.register(spark, filter_pushdown=True)
    return spark


def load(spark, path, **options):
    reader = spark.read.format("kafkalog")
    for k, v in options.items():
        reader = reader.option(k, v if isinstance(v, str) else json.dumps(v))
    return reader.load(str(path))


def b64d(x):
    return None if x is None else base64.b64decode(x)


def ms(ts: dt.datetime) -> int:
    return (ts - EPOCH) // dt.timedelta(milliseconds=1)


def rows_of(df, with_headers=True):
    """(topic, partition, offset, timestamp ms, timestampType, key, value[, headers])."""
    out = []
    for r in df.toArrow().to_pylist():
        row = (r["topic"], r["partition"], r["offset"], ms(r["timestamp"]), r["timestampType"],
               r["key"], r["value"])
        if with_headers:
            row += ([(h["key"], h["value"]) for h in r["headers"]],)
        out.append(row)
    return sorted(out, key=lambda x: (x[0], x[1], x[2]))


def golden_rows(case, keep=lambda e: True, with_headers=True):
    topic = case[:-2]
    out = []
    for e in expected_records(case):
        if e["control"] or not keep(e):
            continue
        row = (topic, 0, e["offset"], e["timestamp"], e["timestampType"], b64d(e["key"]),
               b64d(e["value"]))
        if with_headers:
            row += ([(h["key"], b64d(h["value"])) for h in e["headers"]],)
        out.append(row)
    return out


def aborted_offsets(case) -> set:
    """Transactional data whose producer's next control record is an ABORT (key type 0)."""
    recs = expected_records(case)
    out = set()
    for i, r in enumerate(recs):
        if r["control"] or not r["transactional"]:
            continue
        marker = next((c for c in recs[i + 1:]
                       if c["control"] and c["producerId"] == r["producerId"]), None)
        assert marker is not None, "golden txn cases close every transaction"
        if base64.b64decode(marker["key"])[2:4] == b"\x00\x00":
            out.add(r["offset"])
    return out


def stats_lines(path, phase="read"):
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()
            if json.loads(line)["phase"] == phase]


def read_bytes(spark, path, stats_file, df_fn=lambda df: df, **options):
    """Run a read (count) and return (rows, log bytes the tasks read)."""
    if stats_file.exists():
        stats_file.unlink()
    df = df_fn(load(spark, path, **{"kafkalog.test.statsFile": str(stats_file), **options}))
    n = df.count()
    return n, sum(s["log_bytes"] for s in stats_lines(stats_file))


# -- a kafkalog cluster written with the admin API ----------------------------------------------

@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("cluster")
    admin = Admin(str(root))
    # big: 4000 records, 50 per batch, ~10 batches per segment, timestamps rising 1 s apart
    admin.create_topic("big", 1, configs={"segment.bytes": 262144})
    big = [Record(b"k%d" % i, bytes([i % 251]) * 500, timestamp=T0 + i * 1000)
           for i in range(4000)]
    Producer(admin.cluster).produce("big", big, batch_records=50)
    # multi: two partitions of 35 and 25 records
    admin.create_topic("multi", 2)
    admin.produce("multi", [Record(b"a%d" % i, b"v%d" % i, timestamp=T0 + i)
                            for i in range(35)], partition=0)
    admin.produce("multi", [Record(b"b%d" % i, b"w%d" % i, timestamp=T0 + i)
                            for i in range(25)], partition=1)
    # lat: LogAppendTime, headers, null keys and values, three partitions by key
    admin.create_topic("lat", 3, configs={"message.timestamp.type": "LogAppendTime"})
    lat = [Record(None if i % 5 == 0 else b"key-%d" % (i % 7),
                  None if i % 4 == 0 else (b"" if i % 4 == 1 else b"value-%d" % i),
                  timestamp=T0 + i,
                  headers=(() if i % 3 == 0 else (("h1", b"x%d" % i), ("h2", None))))
           for i in range(60)]
    before = int(dt.datetime.now(dt.timezone.utc).timestamp() * 1000)
    lat_md = admin.produce("lat", lat)
    after = int(dt.datetime.now(dt.timezone.utc).timestamp() * 1000)
    # dl: 100 records in batches of 10, then delete-records below 45
    admin.create_topic("dl", 1, configs={"segment.bytes": 1024})
    Producer(admin.cluster).produce("dl", [Record(b"d%d" % i, b"x" * 50, timestamp=T0 + i)
                                           for i in range(100)], batch_records=10)
    res = admin.delete_records_before({TopicPartition("dl", 0): 45})
    assert res[TopicPartition("dl", 0)].low_watermark == 45
    return {"root": root, "admin": admin, "big": big, "lat": lat, "lat_md": lat_md,
            "lat_window": (before, after)}


# -- the golden Kafka-written log dir -----------------------------------------------------------

def test_schema_is_sparks_kafka_schema(kspark):
    from pyspark.sql.pandas.types import to_arrow_schema

    from pyspark_kafkalog.connector.range_reader import arrow_schema
    from pyspark_kafkalog.spark.schema import kafka_schema
    for headers in (False, True):
        assert to_arrow_schema(kafka_schema(headers), timezone="UTC").equals(arrow_schema(headers))
    df = load(kspark, GOLDEN, subscribe="m2-none-create")
    assert df.schema == kafka_schema(False)
    assert load(kspark, GOLDEN, subscribe="m2-none-create", includeHeaders="true").schema == \
        kafka_schema(True)


def test_every_undamaged_golden_case_reads_exactly(kspark):
    topics = ",".join(c[:-2] for c in UNDAMAGED)
    df = load(kspark, GOLDEN, subscribe=topics, includeHeaders="true")
    got = rows_of(df)
    want = sorted((r for c in UNDAMAGED for r in golden_rows(c)), key=lambda x: (x[0], x[2]))
    assert len(got) == len(want)
    by_topic = {}
    for r in got:
        by_topic.setdefault(r[0], []).append(r)
    for case in UNDAMAGED:
        assert by_topic.get(case[:-2], []) == golden_rows(case), case


def test_assign_and_pattern_select_the_same_records(kspark):
    cases = ["m1-gzip-create-0", "mixed-v1-to-v2-lz4-0", "gaps-v2-zstd-0"]
    df = load(kspark, GOLDEN, assign={c[:-2]: [0] for c in cases})
    want = sorted((r for c in cases for r in golden_rows(c, with_headers=False)))
    assert rows_of(df, with_headers=False) == want
    df = load(kspark, GOLDEN, subscribePattern="m0-.*")
    assert sorted({r[0] for r in rows_of(df, False)}) == sorted(
        c[:-2] for c in UNDAMAGED if c.startswith("m0-"))


@pytest.mark.skipif("torn-v2-lz4-0" not in DAMAGED_INFO, reason="no torn golden case")
def test_torn_case_reads_the_records_that_survive_recovery(kspark):
    # not listed in replication-offset-checkpoint: read to the log end, where the torn batch stops
    df = load(kspark, GOLDEN, subscribe="torn-v2-lz4", includeHeaders="true")
    assert rows_of(df) == golden_rows("torn-v2-lz4-0")


@pytest.mark.parametrize("case", sorted(c for c in DAMAGED_INFO if c.startswith("corrupt")))
def test_corrupt_case_fails_clearly_and_reads_up_to_the_damage(kspark, case):
    topic = case[:-2]
    with pytest.raises(Exception, match="(?i)corrupt"):
        load(kspark, GOLDEN, subscribe=topic).count()
    first_dropped = DAMAGED_INFO[case]["first_dropped_offset"]
    df = load(kspark, GOLDEN, subscribe=topic, includeHeaders="true",
              endingOffsets={topic: {"0": first_dropped}})
    assert rows_of(df) == golden_rows(case)


def test_read_committed_drops_exactly_the_aborted_transactions(kspark):
    cases = ["txn-v2-none-0", "txn-v2-gzip-0"]
    topics = ",".join(c[:-2] for c in cases)
    uncommitted = rows_of(load(kspark, GOLDEN, subscribe=topics, includeHeaders="true"))
    assert uncommitted == sorted(r for c in cases for r in golden_rows(c))
    want = sorted(r for c in cases
                  for r in golden_rows(c, keep=lambda e, a=aborted_offsets(c):
                                       e["offset"] not in a))
    assert len(want) < len(uncommitted)
    for opts in ({}, {"maxRecordsPerPartition": "100"}):   # ranges split mid-transaction too
        df = load(kspark, GOLDEN, subscribe=topics, includeHeaders="true",
                  **{"kafka.isolation.level": "read_committed"}, **opts)
        assert rows_of(df) == want


def test_starting_and_ending_offsets(kspark):
    t = "m2-none-create"
    df = load(kspark, GOLDEN, subscribe=t, startingOffsets={t: {"0": 100}},
              endingOffsets={t: {"0": 200}})
    assert [r[2] for r in rows_of(df, False)] == list(range(100, 200))
    df = load(kspark, GOLDEN, assign={t: [0]}, startingOffsets={t: {"0": -2}},
              endingOffsets={t: {"0": -1}})
    assert rows_of(df, False) == golden_rows("m2-none-create-0", with_headers=False)
    with pytest.raises(Exception, match="must name all"):
        load(kspark, GOLDEN, subscribe=f"{t},m2-none-logappend",
             startingOffsets={t: {"0": 5}}).count()


@pytest.mark.slow
def test_starting_and_ending_timestamps_through_the_time_index(kspark):
    case, t = "m2-none-create-0", "m2-none-create"
    recs = expected_records(case)

    def first_at(ts):   # Kafka's offsetsForTimes, from the ground truth
        return min((r["offset"] for r in recs if r["timestamp"] >= ts), default=None)

    t_end = max(r["timestamp"] for r in recs)
    end = first_at(t_end)
    t_start = max(r["timestamp"] for r in recs if r["offset"] < end)
    start = first_at(t_start)
    assert start < end
    expect = [r[2] for r in golden_rows(case, keep=lambda e: start <= e["offset"] < end,
                                        with_headers=False)]
    df = load(kspark, GOLDEN, subscribe=t, startingTimestamp=str(t_start),
              endingTimestamp=str(t_end))
    assert [r[2] for r in rows_of(df, False)] == expect
    df = load(kspark, GOLDEN, subscribe=t, startingOffsetsByTimestamp={t: {"0": t_start}},
              endingOffsetsByTimestamp={t: {"0": t_end}},
              startingOffsets="earliest", endingOffsets="latest")
    assert [r[2] for r in rows_of(df, False)] == expect
    # no match: the ending side falls back to latest; the starting side follows the strategy
    df = load(kspark, GOLDEN, subscribe=t, startingTimestamp=str(t_start),
              endingTimestamp=str(t_end + 1))
    assert [r[2] for r in rows_of(df, False)][-1] == recs[-1]["offset"]
    with pytest.raises(Exception, match="startingOffsetsByTimestampStrategy"):
        load(kspark, GOLDEN, subscribe=t, startingTimestamp=str(t_end + 1)).count()
    df = load(kspark, GOLDEN, subscribe=t, startingTimestamp=str(t_end + 1),
              startingOffsetsByTimestampStrategy="latest")
    assert df.count() == 0


def test_read_to_log_end_option(kspark, golden_copy):
    # a stale high watermark in replication-offset-checkpoint hides the tail unless readToLogEnd
    ckpt = golden_copy / "replication-offset-checkpoint"
    lines = ckpt.read_text().splitlines()
    lines = [("m2-none-create 0 500" if line.startswith("m2-none-create ") else line)
             for line in lines]
    ckpt.write_text("\n".join(lines) + "\n")
    assert load(kspark, golden_copy, subscribe="m2-none-create").count() == 500
    assert load(kspark, golden_copy, subscribe="m2-none-create",
                readToLogEnd="true").count() == 708


# -- a kafkalog cluster ----------------------------------------------------------------------

def test_cluster_written_by_admin_produce_reads_back_exactly(kspark, cluster):
    df = load(kspark, cluster["root"], subscribe="lat", includeHeaders="true")
    got = rows_of(df)
    before, after = cluster["lat_window"]
    want = sorted(("lat", md.partition, md.offset, rec.key, rec.value,
                   [tuple(h) for h in rec.headers])
                  for rec, md in zip(cluster["lat"], cluster["lat_md"]))
    assert [(r[0], r[1], r[2], r[5], r[6], r[7]) for r in got] == want
    assert {r[4] for r in got} == {1}                      # LogAppendTime
    assert all(before <= r[3] <= after for r in got)       # the write time, not the record's
    assert any(r[5] is None for r in got) and any(r[6] is None for r in got)
    assert any(r[6] == b"" for r in got) and any(h[1] is None for r in got for h in r[7])
    big = rows_of(load(kspark, cluster["root"], subscribe="big"), False)
    assert [(r[2], r[3], r[4], r[5], r[6]) for r in big] == [
        (i, rec.timestamp, 0, rec.key, rec.value) for i, rec in enumerate(cluster["big"])]


def test_uncommitted_writes_are_invisible_in_both_isolation_levels(kspark, cluster):
    admin = cluster["admin"]
    producer = Producer(admin.cluster)
    pending = producer.write({("multi", 0): producer.encode("multi", [Record(b"x", b"open")])})
    try:
        for level in ("read_uncommitted", "read_committed"):
            df = load(kspark, cluster["root"], subscribe="multi",
                      **{"kafka.isolation.level": level})
            assert df.count() == 60
    finally:
        producer.abort([pending])


@pytest.mark.slow
def test_fail_on_data_loss_after_delete_records(kspark, cluster):
    root = cluster["root"]
    assert [r[2] for r in rows_of(load(kspark, root, subscribe="dl"), False)] == \
        list(range(45, 100))
    with pytest.raises(Exception, match="failOnDataLoss"):
        load(kspark, root, subscribe="dl", startingOffsets={"dl": {"0": 10}}).count()
    df = load(kspark, root, subscribe="dl", startingOffsets={"dl": {"0": 10}},
              failOnDataLoss="false")
    assert [r[2] for r in rows_of(df, False)] == list(range(45, 100))
    with pytest.raises(Exception, match="failOnDataLoss"):
        load(kspark, root, subscribe="dl", endingOffsets={"dl": {"0": 150}}).count()
    df = load(kspark, root, subscribe="dl", startingOffsets={"dl": {"0": 50}},
              endingOffsets={"dl": {"0": 150}}, failOnDataLoss="false")
    assert [r[2] for r in rows_of(df, False)] == list(range(50, 100))


def test_data_deleted_between_planning_and_reading(cluster, tmp_path):
    """Executors read what the driver planned; segments deleted meanwhile are data loss."""
    import shutil

    from pyspark_kafkalog.connector.range_reader import read_range
    from pyspark_kafkalog.connector.read_plan import plan
    from pyspark_kafkalog.connector.sources import open_source
    from pyspark_kafkalog.spark.read_options import ReadOptions
    root = tmp_path / "copy"
    shutil.copytree(cluster["root"], root)
    opts = ReadOptions.parse({"path": str(root), "subscribe": "big"})
    (task,) = plan(open_source(str(root)), opts)
    Admin(str(root)).delete_records_before({TopicPartition("big", 0): 2500})
    with pytest.raises(OffsetOutOfRangeError, match="failOnDataLoss"):
        list(read_range(task, include_headers=False))
    rows = sum(b.num_rows for b in read_range(task, include_headers=False,
                                               fail_on_data_loss=False))
    assert 1500 <= rows < 4000


@pytest.mark.parametrize("max_bytes", [1, 700, 30_000, 1 << 20])
def test_range_reads_chunk_by_chunk_and_map_only_cluster_segments(cluster, max_bytes,
                                                                  monkeypatch):
    """Chunks of any size (down to one batch at a time, the ``position`` path and its
    fallback) give exactly the planned range; a cluster's immutable segments are read through
    a mapping, a Kafka log dir's (possibly a live broker's) never are."""
    from pyspark_kafkalog.connector.range_reader import read_range
    from pyspark_kafkalog.connector.read_plan import Bounds, plan
    from pyspark_kafkalog.connector.sources import open_source
    from pyspark_kafkalog.spark.read_options import ReadOptions
    from pyspark_kafkalog.storage.local import LocalStorage
    mapped = []
    real_map = LocalStorage.map
    monkeypatch.setattr(LocalStorage, "map",
                        lambda self, path: mapped.append(path) or real_map(self, path))
    opts = ReadOptions.parse({"path": str(cluster["root"]), "subscribe": "big",
                              "startingOffsets": '{"big":{"0":777}}',
                              "endingOffsets": '{"big":{"0":3333}}'})
    (task,) = plan(open_source(str(cluster["root"])), opts, Bounds())
    offsets, values = [], []
    for batch in read_range(task, include_headers=False, max_bytes=max_bytes):
        offsets += batch.column("offset").to_pylist()
        values += batch.column("value").to_pylist()
    assert offsets == list(range(777, 3333))
    assert values == [r.value for r in cluster["big"][777:3333]]
    assert mapped and all(p.endswith(".log") for p in mapped)

    mapped.clear()
    for case in UNDAMAGED:
        opts = ReadOptions.parse({"path": str(GOLDEN), "subscribe": case[:-2]})
        got = [o for t in plan(open_source(str(GOLDEN)), opts, Bounds())
               for b in read_range(t, include_headers=True, max_bytes=max_bytes)
               for o in b.column("offset").to_pylist()]
        assert got == [r[2] for r in golden_rows(case)], case
    assert mapped == [], "a Kafka log dir's segments must not be mapped"


def test_min_partitions_and_max_records_per_partition_split_ranges(kspark, cluster):
    root = cluster["root"]
    full = rows_of(load(kspark, root, subscribe="multi"), False)
    assert len(full) == 60
    df = load(kspark, root, subscribe="multi")
    assert df.rdd.getNumPartitions() == 2   # packed, but spread over local[2]'s two cores
    df = load(kspark, root, subscribe="multi", openCostInBytes="128MB")
    assert df.rdd.getNumPartitions() == 2   # an open cost of the whole budget: one range a task
    df = load(kspark, root, subscribe="multi", maxRecordsPerPartition="10")
    assert df.rdd.getNumPartitions() == 4 + 3
    assert rows_of(df, False) == full
    df = load(kspark, root, subscribe="multi", minPartitions="5")
    assert df.rdd.getNumPartitions() >= 5
    assert rows_of(df, False) == full


# -- filter pushdown: bytes read follow the selected range ------------------------------------

@pytest.mark.slow
def test_offset_filter_reads_far_fewer_bytes(kspark, cluster, tmp_path):
    stats = tmp_path / "stats.jsonl"
    root = cluster["root"]
    n_full, full = read_bytes(kspark, root, stats, subscribe="big")
    assert n_full == 4000 and full >= 2_000_000
    n, tail = read_bytes(kspark, root, stats, lambda df: df.filter("offset >= 3990"),
                         subscribe="big")
    assert n == 10 and tail < full / 50
    n, head = read_bytes(kspark, root, stats, lambda df: df.filter("offset < 20"),
                         subscribe="big")
    assert n == 20 and head < full / 50
    n, mid = read_bytes(kspark, root, stats,
                        lambda df: df.filter("offset between 2000 and 2009"), subscribe="big")
    assert n == 10 and mid < full / 50
    # and on a Kafka-written log dir
    n_full, full = read_bytes(kspark, GOLDEN, stats, subscribe="m2-gzip-create")
    n, tail = read_bytes(kspark, GOLDEN, stats, lambda df: df.filter("offset >= 2110"),
                         subscribe="m2-gzip-create")
    assert n == 8 and tail < full / 10


@pytest.mark.slow
def test_timestamp_filter_reads_far_fewer_bytes(kspark, cluster, tmp_path):
    stats = tmp_path / "stats.jsonl"
    root = cluster["root"]
    _, full = read_bytes(kspark, root, stats, subscribe="big")
    since = dt.datetime.fromtimestamp((T0 + 3950 * 1000) / 1000, dt.timezone.utc)
    n, tail = read_bytes(kspark, root, stats,
                         lambda df: df.filter(df.timestamp >= since), subscribe="big")
    assert n == 50 and tail < full / 20
    n, _ = read_bytes(kspark, root, stats, lambda df: df.filter(df.timestamp > since),
                      subscribe="big")
    assert n == 49
    # an upper bound cannot narrow (timestamps need not follow offsets) but stays correct
    until = dt.datetime.fromtimestamp((T0 + 10 * 1000) / 1000, dt.timezone.utc)
    n, _ = read_bytes(kspark, root, stats, lambda df: df.filter(df.timestamp < until),
                      subscribe="big")
    assert n == 10


def test_partition_and_topic_filters_select_partitions(kspark, cluster, tmp_path):
    stats = tmp_path / "stats.jsonl"
    root = cluster["root"]
    df = load(kspark, root, subscribePattern="multi|big").filter(
        "topic = 'multi' and partition = 1")
    assert [r[2] for r in rows_of(df, False)] == list(range(25))
    assert df.rdd.getNumPartitions() == 1
    n, _ = read_bytes(kspark, root, stats, lambda df: df.filter("partition in (0, 5)"),
                      subscribe="multi")
    assert n == 35
    assert {(s["topic"], s["partition"]) for s in stats_lines(stats)} == {("multi", 0)}


# -- options ---------------------------------------------------------------------------------

def test_option_errors_surface_through_spark(kspark, cluster):
    with pytest.raises(Exception, match="kafka.bootstrap.servers"):
        load(kspark, cluster["root"], subscribe="big",
             **{"kafka.bootstrap.servers": "localhost:9092"}).count()
    with pytest.raises(Exception, match="fixed schema"):
        kspark.read.format("kafkalog").schema("value string").option("subscribe", "big") \
            .load(str(cluster["root"])).count()
    with pytest.raises(Exception, match="does not exist"):
        load(kspark, cluster["root"] / "nope", subscribe="big").count()


def parse(**options):
    from pyspark_kafkalog.spark.read_options import ReadOptions
    return ReadOptions.parse({"path": "/data", **options})


@pytest.mark.parametrize("options, match", [
    ({}, "exactly one of the options assign, subscribe, subscribePattern"),
    ({"subscribe": "a", "assign": '{"a":[0]}'}, "exactly one"),
    ({"subscribe": " , "}, "subscribe"),
    ({"assign": "[0,1]"}, "assign"),
    ({"assign": '{"a":[]}'}, "assign"),
    ({"subscribePattern": "("}, "subscribePattern"),
    ({"subscribe": "a", "startingOffsets": "latest"}, "startingOffsets='latest'"),
    ({"subscribe": "a", "endingOffsets": "earliest"}, "endingOffsets='earliest'"),
    ({"subscribe": "a", "startingOffsets": '{"a":{"0":-1}}'}, "can't be latest"),
    ({"subscribe": "a", "endingOffsets": '{"a":{"0":-2}}'}, "can't be earliest"),
    ({"subscribe": "a", "startingOffsets": '{"a":{"x":1}}'}, "startingOffsets"),
    ({"subscribe": "a", "startingOffsets": "soon"}, "startingOffsets='soon'"),
    ({"subscribe": "a", "startingTimestamp": "yesterday"}, "startingTimestamp"),
    ({"subscribe": "a", "endingOffsetsByTimestamp": '{"a":{"0":-5}}'}, "endingOffsetsByTimestamp"),
    ({"subscribe": "a", "startingOffsetsByTimestampStrategy": "maybe"},
     "startingOffsetsByTimestampStrategy='maybe'"),
    ({"subscribe": "a", "failOnDataLoss": "yes"}, "failOnDataLoss='yes'"),
    ({"subscribe": "a", "minPartitions": "0"}, "minPartitions='0'"),
    ({"subscribe": "a", "maxRecordsPerPartition": "-3"}, "maxRecordsPerPartition"),
    ({"subscribe": "a", "includeHeaders": "1"}, "includeHeaders='1'"),
    ({"subscribe": "a", "kafka.isolation.level": "serializable"}, "kafka.isolation.level"),
    ({"subscribe": "a", "kafka.bootstrap.servers": "b:9092"}, "no brokers"),
    ({"subscribe": "a", "kafka.auto.offset.reset": "earliest"}, "startingOffsets"),
    ({"subscribe": "a", "kafka.value.deserializer": "x"}, "value.deserializer"),
    ({"subscribe": "a", "kafka.no.such.config": "1"}, "kafka.no.such.config"),
    ({"subscribe": "a", "topic": "a"}, "write option"),
])
def test_option_errors(options, match):
    with pytest.raises(InvalidConfigError, match=match):
        parse(**options)


def test_an_unknown_option_is_a_warning(caplog):
    """Spark's Kafka source ignores options it does not know (#34): a warning, once, naming the
    option and the known one it most likely meant (this case was an error before)."""
    with caplog.at_level(logging.WARNING, logger="pyspark_kafkalog.spark.option_table"):
        o = parse(subscribe="a", startingOfsets="latest")
    assert o.starting.kind == "earliest"
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and re.search("did you mean startingOffsets", warned[0])


def test_options_parse_and_precedence():
    from pyspark_kafkalog.spark.read_options import ReadOptions
    with pytest.raises(InvalidConfigError, match="needs a path"):
        ReadOptions.parse({"subscribe": "a"})
    o = parse(SUBSCRIBE="a, b", STARTINGOFFSETS='{"a":{"0":5},"b":{"0":-2}}',
              endingTimestamp="1700000000000", endingOffsets="earliest",
              includeHeaders="TRUE", **{"kafka.isolation.level": "READ_COMMITTED",
                                        "kafka.group.id": "ignored", "groupIdPrefix": "x",
                                        "maxOffsetsPerTrigger": "10",
                                        "kafka.ssl.keystore.location": "k",
                                        "kafka.max.poll.records": "5", "storage.endpoint_url": "u"})
    assert o.subscription.topics == ("a", "b")
    assert o.starting.lookup() == {("a", 0): 5, ("b", 0): -2}
    assert o.ending.kind == "timestamp" and o.ending.timestamp == 1_700_000_000_000
    assert o.include_headers and o.read_committed and o.fail_on_data_loss
    assert o.storage_options == {"endpoint_url": "u"}
    # the schema-time parse only looks at includeHeaders
    lenient = ReadOptions.parse({"includeHeaders": "true", "bogus": "1"}, validate=False)
    assert lenient.include_headers


# -- Kafka transactions: interleaved producers and an open transaction (a synthetic log dir) ---

def _txn_log_dir(root):
    """offsets 0-1 plain, 2-4 P1 (aborted at 7), 5-6 + 8-9 P2 (committed at 11), 10 plain,
    12-13 P1 (committed at 14), 15-16 P3 (never closed), 17-18 plain."""
    from pyspark_kafkalog.format.encode import encode_batch_v2, encode_control_batch
    from pyspark_kafkalog.log.logdir import LogDir
    from pyspark_kafkalog.storage import open_storage

    def data(n, pid=-1):
        recs = [Record(b"k", b"v", timestamp=T0)] * n
        return encode_batch_v2(recs, producer_id=pid, producer_epoch=0 if pid >= 0 else -1,
                               transactional=pid >= 0)

    def marker(kind, pid):
        return encode_control_batch(kind, producer_id=pid, producer_epoch=0, timestamp=T0)

    logdir = LogDir(open_storage(str(root)))
    log = logdir.open_partition("tx", 0, create=True)
    for b in [data(2), data(3, 1), data(2, 2), marker(0, 1), data(2, 2), data(1), marker(1, 2),
              data(2, 1), marker(1, 1), data(2, 3), data(2)]:
        log.append([b])
    logdir.update_partition_state(("tx", 0), high_watermark=19, log_start_offset=0,
                                  recovery_point=19)
    return root


@pytest.mark.slow
def test_read_committed_with_interleaved_and_open_transactions(kspark, tmp_path):
    root = _txn_log_dir(tmp_path / "txlog")
    offsets = lambda df: [r[2] for r in rows_of(df, False)]  # noqa: E731
    assert offsets(load(kspark, root, subscribe="tx")) == [0, 1, 2, 3, 4, 5, 6, 8, 9, 10, 12, 13,
                                                            15, 16, 17, 18]
    committed = [0, 1, 5, 6, 8, 9, 10, 12, 13]     # stops at the last stable offset, 15
    for split in ("1", "4"):                        # ranges that end inside transactions too
        df = load(kspark, root, subscribe="tx", maxRecordsPerPartition=split,
                  **{"kafka.isolation.level": "read_committed"})
        assert offsets(df) == committed, split


def test_transaction_scan_reads_headers_and_markers_only(tmp_path):
    from pyspark_kafkalog.log.logdir import LogDir
    from pyspark_kafkalog.log.segment import ReadStats
    from pyspark_kafkalog.log.transactions import scan_transactions
    from pyspark_kafkalog.storage import open_storage
    root = _txn_log_dir(tmp_path / "txlog")
    log = LogDir(open_storage(str(root))).open_partition("tx", 0, stats=ReadStats())
    scan = scan_transactions(log, 0, 19, 19)
    assert scan.aborted == [(1, 2, 7)] and scan.open == {3: 15}
    assert scan.last_stable_offset == 15
    # a range ending inside P2's transaction follows it to its COMMIT marker
    scan = scan_transactions(log, 5, 6, 19)
    assert scan.aborted == [] and scan.open == {} and scan.last_stable_offset == 19
    scan = scan_transactions(log, 3, 4, 19)
    assert scan.aborted == [(1, 3, 7)]


def test_default_registration_never_reuses_a_filtered_plan(kspark, cluster):
    """Without pushdown (the default), a DataFrame queried with a filter and then without one
    returns all rows the second time (PySpark 4.3 would reuse the pushed-down plan otherwise)."""
    import pyspark_kafkalog
    from pyspark.sql import functions as F
    pyspark_kafkalog.register(kspark)
    try:
        df = load(kspark, str(cluster["root"]), subscribe="multi")
        assert df.count() == 60
        assert df.where(F.col("offset") >= 30).count() == 5
        assert df.count() == 60
    finally:
        pyspark_kafkalog.register(kspark, filter_pushdown=True)
