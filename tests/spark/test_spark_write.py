"""``df.write.format("kafkalog")``: a real SparkSession writes, Admin (and kafka-python) read back.

What is checked, and how:

* rows round-trip: keys (null too), string/binary values, headers (null value, empty list, none),
  explicit timestamps (CreateTime) and the write time where the column is null;
* partitioner parity: every keyed row of 20,000 random keys lands where kafka-python's
  ``murmur2`` (Kafka's Java ``toPositive(murmur2(key)) % n``) puts it; unkeyed rows spread evenly;
* atomicity: a task that fails mid-job (after it reserved and wrote segments) leaves nothing
  visible, no open reservation, and no segment file after ``Admin.cleanup``; a lost task attempt
  is aborted by the job's commit; two concurrent jobs both land whole;
* save modes and option errors, as Spark and the sink report them;
* every codec and message format version the sink writes is read back by kafka-python's
  ``MemoryRecords`` from the segment files on disk (an independent implementation);
* file count: segments per job with and without ``repartition_by_kafka_partition``.
"""
from __future__ import annotations

import logging
import random
import re
import threading
import time
import types
from datetime import datetime, timezone
from pathlib import Path

import cramjam
import pyarrow as pa
import pytest

import kafka.codec as kc
from kafka.partitioner.default import murmur2 as kp_murmur2
from kafka.record.memory_records import MemoryRecords

from support.spark_support import write
from support.polling import eventually
from pyspark_kafkalog.admin import Admin
from pyspark_kafkalog.connector.arrow_writer import TaskWriter
from pyspark_kafkalog.cluster.cluster import Cluster
from pyspark_kafkalog.errors import InvalidConfigError, KafkaLogError
from pyspark_kafkalog.arrow.arrow_encode import (HEADER_TYPE, chunk_bounds, encode_v2_chunks,
                                                  estimated_sizes, murmur2_array,
                                                  partitions_for_keys, to_records)
from pyspark_kafkalog.format.batch import iter_headers
from pyspark_kafkalog.format.encode import encode_batch_v2
from pyspark_kafkalog.spark.write_options import WriteOptions

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def seg_files(root, topic=None, suffixes=(".log", ".index", ".timeindex")):
    out = []
    for d in sorted(Path(root).glob("logdir-*/*-*")):
        if topic is None or d.name.rpartition("-")[0] == topic:
            out += [p for p in d.iterdir() if p.suffix in suffixes]
    return out


def py_partition(key: bytes, n: int) -> int:
    return (kp_murmur2(key) & 0x7FFFFFFF) % n


# -- round trip ---------------------------------------------------------------------------------

def test_write_then_read_back_same_rows(ks, tmp_path):
    root = tmp_path / "c"
    rng = random.Random(7)
    rows = []
    for i in range(600):
        key = None if i % 9 == 0 else f"k{i % 50}"
        headers = (None if i % 5 == 0 else [] if i % 5 == 1 else
                   [("trace", b"t%d" % i), ("nullvalue", None)][: 1 + i % 2])
        ts = None if i % 7 == 0 else datetime.fromtimestamp(
            (1_600_000_000_000 + rng.randrange(10**9)) / 1000, tz=timezone.utc)
        rows.append((key, f"value-{i}".encode() if i % 11 else b"", headers, ts))
    schema = ("key string, value binary, headers array<struct<key: string, value: binary>>, "
              "timestamp timestamp")
    df = ks.createDataFrame(rows, schema).repartition(3)
    before = int(time.time() * 1000)
    write(df, root, topic="rt", createTopic="true", **{"topic.partitions": 5})
    after = int(time.time() * 1000)
    got = list(Admin(str(root)).consume("rt"))
    assert len(got) == len(rows)
    expected = sorted((((None if k is None else k.encode()), v,
                        tuple((hk, hv) for hk, hv in (h or ())),
                        None if ts is None else round(ts.timestamp() * 1000))
                       for k, v, h, ts in rows), key=repr)
    actual = []
    for r in got:
        assert r.timestamp_type == 0 and r.magic == 2
        if r.key is not None:
            assert r.partition == py_partition(r.key, 5)
        actual.append((r.key, r.value, tuple(r.headers), r.timestamp))
    write_time = [a for a in actual if before <= a[3] <= after]
    assert len(write_time) == sum(1 for r in rows if r[3] is None)
    actual = sorted((a if not before <= a[3] <= after else a[:3] + (None,) for a in actual),
                    key=repr)
    assert actual == expected
    # offsets are dense per partition and the checkpoint files follow the commit
    for p in range(5):
        offs = [r.offset for r in got if r.partition == p]
        assert offs == list(range(len(offs)))
    assert "rt 0 " in (root / "logdir-0" / "replication-offset-checkpoint").read_text()


def test_direct_io_write_reads_back_the_same_rows(ks, tmp_path):
    """``storage.direct_io`` (on by default): the segments (over 1 MiB each, so written with
    O_DIRECT) hold exactly the rows, and the same bytes as a write with it off."""
    df = ks.range(0, 24_000, numPartitions=2).selectExpr(
        "cast(id as string) as key", "cast(repeat(cast(id as string), 20) as binary) as value",
        "timestamp_millis(1700000000000 + id) as timestamp").coalesce(1)
    for name, extra in (("direct", {}), ("buffered", {"storage.direct_io": "false"})):
        write(df, tmp_path / name, topic="d", createTopic="true", **extra)
    logs = {name: [p.read_bytes() for p in seg_files(tmp_path / name, "d", (".log",))]
            for name in ("direct", "buffered")}
    assert max(len(b) for b in logs["direct"]) > (1 << 20)
    got = list(Admin(str(tmp_path / "direct")).consume("d"))
    assert sorted((r.key, r.value, r.timestamp) for r in got) == sorted(
        (str(i).encode(), str(i).encode() * 20, 1_700_000_000_000 + i) for i in range(24_000))
    assert logs["direct"] == logs["buffered"]


def test_keyed_rows_match_kafka_python_partitioner(ks, tmp_path):
    """20,000 random keys (random bytes, 0-40 long, and text), 7 partitions."""
    root = tmp_path / "c"
    rng = random.Random(2024)
    keys = {rng.randbytes(rng.randrange(0, 41)) for _ in range(15_000)}
    keys |= {f"user-{i}".encode() for i in range(5_000)}
    keys = sorted(keys)
    assert len(keys) >= 19_000
    df = ks.createDataFrame([(k, b"v") for k in keys], "key binary, value binary").repartition(4)
    write(df, root, topic="parity", createTopic="true", **{"topic.partitions": 7})
    got = list(Admin(str(root)).consume("parity"))
    assert sorted(r.key for r in got) == keys
    wrong = [(r.key, r.partition) for r in got if r.partition != py_partition(r.key, 7)]
    assert not wrong, wrong[:5]
    # the vectorised partitioner agrees on its own, too (more partition counts, sliced input)
    arr = pa.array(keys, pa.binary()).slice(3)
    for n in (1, 2, 3, 12, 100, 1009):
        assert partitions_for_keys(arr, n).tolist() == [py_partition(k, n) for k in keys[3:]]
    h = murmur2_array(arr)
    assert [int(x) for x in h] == [kp_murmur2(k) & 0xFFFFFFFF for k in keys[3:]]


def test_unkeyed_rows_spread_evenly_and_sticky(ks, tmp_path):
    root = tmp_path / "c"
    df = ks.range(40_000, numPartitions=2).selectExpr("cast(id as string) as value")
    write(df, root, topic="spread", createTopic="true", **{"topic.partitions": 4,
                                                           "batch.records": 1000})
    got = list(Admin(str(root)).consume("spread"))
    assert len(got) == 40_000
    counts = [sum(1 for r in got if r.partition == p) for p in range(4)]
    assert all(8_000 <= c <= 12_000 for c in counts), counts
    # sticky: runs of batch.records rows per partition, not row-by-row round robin
    batches = {}
    for r in got:
        batches.setdefault(r.partition, []).append(int(r.value))
    assert all(len(v) % 1000 == 0 for v in batches.values()), [len(v) for v in batches.values()]


def test_topic_and_partition_columns(ks, tmp_path):
    root = tmp_path / "c"
    admin = Admin(str(root))
    admin.create_topic("a", 3)
    admin.create_topic("b", 2)
    rows = [("a", 2, None, "x1"), ("b", None, "k", "x2"), ("a", None, None, "x3"),
            ("b", 1, "k", "x4")]
    df = ks.createDataFrame(rows, "topic string, partition int, key string, value string")
    write(df, root)
    a, b = list(admin.consume("a")), list(admin.consume("b"))
    assert sorted(r.value for r in a) == [b"x1", b"x3"] and sorted(r.value for r in b) == [
        b"x2", b"x4"]
    assert [r.partition for r in a if r.value == b"x1"] == [2]
    assert {r.value: r.partition for r in b} == {b"x2": py_partition(b"k", 2), b"x4": 1}
    # the topic option overrides the column
    write(df.drop("partition"), root, topic="b")
    assert len(list(admin.consume("b"))) == 6
    assert len(list(admin.consume("a"))) == 2


def test_log_append_time_topic(ks, tmp_path):
    root = tmp_path / "c"
    Admin(str(root)).create_topic("lat", 1, configs={"message.timestamp.type": "LogAppendTime"})
    df = ks.createDataFrame([("v", datetime(2001, 1, 1, tzinfo=timezone.utc))],
                            "value string, timestamp timestamp")
    before = int(time.time() * 1000)
    write(df, root, topic="lat")
    (r,) = Admin(str(root)).consume("lat")
    assert r.timestamp_type == 1 and r.timestamp >= before


# -- atomicity ----------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:Arrow optimization failed:RuntimeWarning")
def test_failing_task_leaves_nothing_visible_and_no_files(ks, tmp_path):
    """Task 2 of 4 raises on one row, after it (and the others) reserved and wrote segments."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType
    root = tmp_path / "c"
    admin = Admin(str(root))
    admin.create_topic("boom", 4)
    admin.produce("boom", [(b"before", b"committed earlier")], partition=0)

    @F.udf(StringType())
    def explode_on(v):
        if v == "row-7777":
            raise ValueError("injected failure")
        return v

    df = (ks.range(0, 10_000, numPartitions=4)
          .selectExpr("cast(id % 97 as string) as key", "concat('row-', id) as value")
          .withColumn("value", explode_on("value")))
    # small batches and a tiny buffer: every task reserves and writes segments early and often
    with pytest.raises(Exception, match="injected failure"):
        write(df, root, topic="boom", maxTasks=0,   # the 4 tasks, not one per core
              **{"batch.records": 100, "buffer.memory": 4096})
    got = list(admin.consume("boom"))
    assert [(r.key, r.value) for r in got] == [(b"before", b"committed earlier")]
    # Spark aborts the job while the other tasks may still run: an attempt that reserves after
    # the abort finds the decision and aborts itself (no waiting for transaction.timeout.ms)
    deadline = time.time() + 30
    while admin.cluster.state().txns and time.time() < deadline:
        time.sleep(0.2)
    state = admin.cluster.state()
    assert not state.txns, "the job left open reservations"
    outcomes = sorted(state.decided.values())
    # one committed produce before; the job's tasks had reserved (many times) and were aborted
    assert outcomes.count("committed") == 1 and outcomes.count("aborted") >= 4, outcomes
    # the job's abort decides every reservation, but a task Spark has not yet stopped can still
    # be writing files into its aborted range (a zombie, docs/protocol.md §5): cleanup deletes
    # them once it is done, so it runs until no zombie writes any more
    expected = ["00000000000000000000.index", "00000000000000000000.log",
                "00000000000000000000.timeindex"]

    def left():
        return sorted(p.name for p in seg_files(root, "boom"))

    def cleaned():
        admin.cleanup()
        return left() == expected
    eventually(cleaned, "cleanup removes the aborted attempts' segments", deadline_s=30,
               describe=left, interval_s=0.5)
    assert left() == expected, left()
    # the topic still takes writes, and what the failed job reserved stays a gap
    write(ks.createDataFrame([("after",)], "value string"), root, topic="boom")
    assert sorted(r.value for r in admin.consume("boom")) == [b"after", b"committed earlier"]


def _batches(n, start=0):
    keys = pa.array([b"k%d" % (i % 13) for i in range(start, start + n)], pa.binary())
    vals = pa.array([b"v%d" % i for i in range(start, start + n)], pa.binary())
    return [pa.RecordBatch.from_arrays([keys, vals], names=["key", "value"])]


def test_lost_task_attempt_is_aborted_by_the_job_commit(tmp_path):
    """Spark retried a task: attempt 0 reserved and wrote, then died; only attempt 1's message
    reaches commit(). Attempt 0's reservation is aborted in the commit entry and its files go."""
    from pyspark.sql.types import BinaryType, StructField, StructType
    from pyspark_kafkalog.spark.writer import KafkaLogWriter
    root = str(tmp_path / "c")
    Admin(root).create_topic("retry", 3)
    schema = StructType([StructField("key", BinaryType()), StructField("value", BinaryType())])
    writer = KafkaLogWriter(WriteOptions.parse({"path": root, "topic": "retry"}), schema, False)
    # attempt 0: reserves and writes, and its process dies before returning a message
    lost = TaskWriter(Cluster(root), writer.options, producer=writer.producer)
    for b in _batches(500):
        lost.add(b)
    lost_pending = lost.finish()
    assert lost_pending and seg_files(root, "retry")
    # attempt 1 and another task succeed
    msg1 = writer.write(iter(_batches(500)))
    msg2 = writer.write(iter(_batches(300, start=500)))
    assert msg1.records == 500 and msg2.records == 300
    writer.commit([msg1, msg2])
    admin = Admin(root)
    got = list(admin.consume("retry"))
    assert sorted(r.value for r in got) == sorted([b"v%d" % i for i in range(500)] +
                                                  [b"v%d" % i for i in range(500, 800)])
    state = admin.cluster.state()
    assert not state.txns
    assert state.decided[lost_pending[0].txn] == "aborted"
    lost_files = {f"{b:020d}" for p in lost_pending for bs in p.segments.values() for b in bs}
    assert not {p.stem for p in seg_files(root, "retry")} & lost_files, "lost attempt's files"
    admin.cleanup()
    assert len(list(admin.consume("retry"))) == 800


def test_attempt_after_the_job_is_decided_aborts_itself(tmp_path):
    """Spark decides a job while attempts may still run: one that reserves after the decision
    finds the decision entry and aborts its own write at once (no wait for the timeout)."""
    from pyspark.sql.types import BinaryType, StructField, StructType
    from pyspark_kafkalog.errors import InvalidTxnStateError
    from pyspark_kafkalog.spark.writer import KafkaLogWriter
    root = str(tmp_path / "c")
    admin = Admin(root)
    admin.create_topic("late", 2)
    schema = StructType([StructField("key", BinaryType()), StructField("value", BinaryType())])
    for decide in ("commit", "abort"):
        writer = KafkaLogWriter(WriteOptions.parse({"path": root, "topic": "late"}), schema,
                                False)
        first = writer.write(iter(_batches(40)))
        if decide == "commit":
            writer.commit([first])
        else:
            writer.abort([first])
        with pytest.raises(InvalidTxnStateError, match="already committed or aborted"):
            writer.write(iter(_batches(40, start=1000)))
        state = admin.cluster.state()
        assert not state.txns
    assert sorted(r.value for r in admin.consume("late")) == sorted(b"v%d" % i
                                                                    for i in range(40))
    admin.cleanup()
    assert len(seg_files(root, "late", (".log",))) == 2


def test_commit_after_the_deadline_fails_whole(tmp_path):
    from pyspark.sql.types import BinaryType, StructField, StructType
    from pyspark_kafkalog.errors import FencedLeaderEpochError
    from pyspark_kafkalog.spark.writer import KafkaLogWriter
    root = str(tmp_path / "c")
    Admin(root).create_topic("slow", 2)
    schema = StructType([StructField("key", BinaryType()), StructField("value", BinaryType())])
    writer = KafkaLogWriter(WriteOptions.parse({"path": root, "topic": "slow",
                                                "transaction.timeout.ms": "1"}), schema, False)
    m1 = writer.write(iter(_batches(50)))
    time.sleep(0.05)
    m2 = writer.write(iter(_batches(50)))
    time.sleep(0.05)
    with pytest.raises(FencedLeaderEpochError, match="transaction.timeout.ms"):
        writer.commit([m1, m2])
    admin = Admin(root)
    assert list(admin.consume("slow")) == []
    admin.cleanup()
    assert seg_files(root, "slow") == []


def test_two_concurrent_jobs_both_land_whole(ks, tmp_path):
    root = tmp_path / "c"
    Admin(str(root)).create_topic("both", 3)
    errors = []

    def job(tag):
        try:
            # Spark looks Python data sources up in the thread's *active* session, which a new
            # thread does not have (docs/spark-write.md)
            ks._jvm.org.apache.spark.sql.SparkSession.setActiveSession(ks._jsparkSession)
            df = (ks.range(0, 6000, numPartitions=3)
                  .selectExpr("cast(id % 31 as string) as key", f"concat('{tag}-', id) as value"))
            write(df, root, topic="both", **{"batch.records": 500})
        except Exception as exc:   # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=job, args=(t,)) for t in ("A", "B")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, [str(getattr(e, "java_exception", e)) for e in errors]
    got = list(Admin(str(root)).consume("both"))
    values = sorted(r.value for r in got)
    assert values == sorted([f"A-{i}".encode() for i in range(6000)] +
                            [f"B-{i}".encode() for i in range(6000)])
    for p in range(3):
        offs = [r.offset for r in got if r.partition == p]
        assert offs == sorted(offs) and len(set(offs)) == len(offs)


# -- save modes and errors ----------------------------------------------------------------------

@pytest.mark.slow
def test_save_modes(ks, tmp_path):
    from pyspark.errors import AnalysisException
    root = tmp_path / "c"
    Admin(str(root)).create_topic("modes", 1)
    df = ks.createDataFrame([("v",)], "value string")

    def writer():
        return df.write.format("kafkalog").option("topic", "modes")
    # Ignore: refused by Spark before the source runs, as Spark's Kafka sink refuses it
    with pytest.raises(AnalysisException, match="UNSUPPORTED_DATA_SOURCE_SAVE_MODE"):
        writer().mode("ignore").save(str(root))
    with pytest.raises(Exception, match="append-only"):
        writer().mode("overwrite").save(str(root))
    with pytest.raises(Exception, match="append-only"):
        df.write.option("topic", "modes").save(str(root), format="kafkalog", mode="overwrite")
    assert list(Admin(str(root)).consume("modes")) == []
    # Append, and ErrorIfExists (Spark's default) as Spark's Kafka sink has it: an append, however
    # the mode and format are given
    writer().mode("append").save(str(root))
    writer().save(str(root))
    writer().mode("errorifexists").save(str(root))
    writer().mode("ignore").mode("error").save(str(root))
    writer().save(str(root), mode="default")
    df.write.option("topic", "modes").save(str(root), format="KafkaLog")
    assert [r.value for r in Admin(str(root)).consume("modes")] == [b"v"] * 6
    # other formats keep Spark's own ErrorIfExists
    df.write.parquet(str(tmp_path / "pq"))
    with pytest.raises(AnalysisException, match="PATH_ALREADY_EXISTS"):
        df.write.format("parquet").save(str(tmp_path / "pq"))
    with pytest.raises(AnalysisException, match="PATH_ALREADY_EXISTS"):
        df.write.format("kafkalog").format("parquet").save(str(tmp_path / "pq"))


def test_save_mode_wrapper_is_installed_once_and_narrow():
    import pyspark_kafkalog.spark.save_mode as sm
    from pyspark.sql.readwriter import DataFrameWriter
    sm.install()
    save = DataFrameWriter.save
    sm.install()
    assert DataFrameWriter.save is save                     # a second register() adds nothing
    assert not hasattr(save.__wrapped__, "__wrapped__")
    try:
        from pyspark.sql.connect.readwriter import DataFrameWriter as Connect
    except ImportError:
        Connect = None
    if Connect is not None:
        assert Connect._kafkalog_save_mode
    for source, mode, want in [("kafkalog", None, True), ("KAFKALOG", "ErrorIfExists", True),
                               ("kafkalog", "error", True), ("kafkalog", "default", True),
                               ("kafkalog", "append", False), ("kafkalog", "ignore", False),
                               ("kafkalog", "overwrite", False), ("kafka", None, False),
                               ("parquet", "error", False), (None, None, False)]:
        assert sm.append_instead(source, mode) is want, (source, mode)


def _segments_per_partition(root, topic, partitions):
    return [len(list((root / "logdir-0" / f"{topic}-{p}").glob("*.log")))
            for p in range(partitions)]


@pytest.mark.parametrize("option,tasks", [(None, 2), ("0", 8), ("3", 3), ("50", 8)])
def test_a_write_runs_on_at_most_max_tasks_tasks(ks, tmp_path, option, tasks):
    """Every task writes a segment to every partition its rows reach, so the sink coalesces a
    DataFrame of more partitions than the session's cores (local[2]: 2) to that many tasks, or
    to maxTasks (0: never); each input partition's rows stay together and in order."""
    root = tmp_path / "c"
    df = ks.range(0, 800, 1, 8).selectExpr("cast(id % 4 as int) as partition",
                                           "cast(id as string) as value")
    opts = {} if option is None else {"maxTasks": option}
    write(df, root, topic="t", createTopic="true", **{"topic.partitions": 4}, **opts)
    assert _segments_per_partition(root, "t", 4) == [tasks] * 4
    got = list(Admin(str(root)).consume("t"))
    assert sorted(int(r.value) for r in got) == list(range(800))
    for p in range(4):   # an input partition (100 ids) is one run, in order, in one segment
        values = [int(r.value) for r in got if r.partition == p]
        runs = [values[i:i + 25] for i in range(0, 200, 25)]
        assert all(run == sorted(run) and run[-1] - run[0] == 96 for run in runs)
        assert sorted(run[0] // 100 for run in runs) == list(range(8))


@pytest.mark.parametrize("on_top", [True, False])
def test_a_smaller_coalesce_of_the_users_own_is_kept(ks, tmp_path, on_top):
    """Spark merges a coalesce directly over another into the outer one (CollapseRepartition),
    so the sink adds none over a plan that already ends in a smaller one (on top, or under
    projections)."""
    root = tmp_path / "c"
    df = ks.range(0, 80, 1, 8)
    cols = ("cast(id % 4 as int) as partition", "cast(id as string) as value")
    df = df.selectExpr(*cols).coalesce(1) if on_top else df.coalesce(1).selectExpr(*cols)
    write(df, root, topic="t", createTopic="true", **{"topic.partitions": 4})
    assert _segments_per_partition(root, "t", 4) == [1] * 4
    assert [int(r.value) for r in Admin(str(root)).consume("t", partition=0)] == list(
        range(0, 80, 4))


def test_max_tasks_keeps_options_and_mode_and_refuses_bad_values(ks, tmp_path):
    root = tmp_path / "c"
    df = ks.range(0, 40, 1, 4).selectExpr("cast(id % 2 as int) as partition",
                                          "cast(id as string) as value")
    (df.write.format("kafkalog").options(topic="t", createTopic="true")
     .option("topic.partitions", "2").option("compression.type", "gzip").save(str(root)))
    got = list(Admin(str(root)).consume("t"))   # the default mode is still an append
    assert sorted(int(r.value) for r in got) == list(range(40))
    assert _segments_per_partition(root, "t", 2) == [2, 2]          # 2 tasks, not 4
    logs = sorted((root / "logdir-0").glob("t-*/*.log"))
    assert {h.attributes & 7 for f in logs for h in iter_headers(f.read_bytes())} == {1}  # gzip
    for bad in ("-1", "two"):
        with pytest.raises(Exception, match="maxTasks"):
            write(df, root, topic="t", maxTasks=bad)
    assert len(list(Admin(str(root)).consume("t"))) == 40          # nothing more was written
    with pytest.raises(KafkaLogError, match="maxTasks applies to df.write"):
        WriteOptions.parse({"path": "/x", "maxTasks": "2"}, streaming=True)


@pytest.mark.parametrize("opts,needle", [
    ({}, "cluster root"),
    ({"path": "/x", "kafka.bootstrap.servers": "h:9092"}, "no brokers"),
    ({"path": "/x", "kafka.compression.type": "gzip"}, "use the option compression.type"),
    ({"path": "/x", "kafka.value.serializer": "x"}, "as in Spark's Kafka sink"),
    ({"path": "/x", "kafka.lingerr.ms": "5"}, "not a Kafka producer config"),
    ({"path": "/x", "subscribe": "t"}, "read option"),
    ({"path": "/x", "compression.type": "brotli"}, "unknown compression codec"),
    ({"path": "/x", "compression.type": "zstd", "message.format.version": "0.10.2"}, "zstd"),
    ({"path": "/x", "message.format.version": "banana"}, "message.format.version"),
    ({"path": "/x", "batch.size": "0"}, "batch.size must be >= 1"),
    ({"path": "/x", "batch.records": "many"}, "integer"),
    ({"path": "/x", "createTopic": "maybe"}, "true or false"),
    ({"path": "/x", "topic": "t", "topic.partitions": "3"}, "createTopic=true"),
    ({"path": "/x", "createTopic": "true"}, "needs the topic option"),
    ({"path": "/x", "topic": "t", "createTopic": "true",
      "topic.config.retention.mss": "1"}, "unknown topic config"),
    ({"path": "/x", "topic": "bad/name"}, "topic"),
])
def test_option_errors(opts, needle):
    with pytest.raises(KafkaLogError, match=needle):
        WriteOptions.parse(opts)


def test_an_unknown_option_is_a_warning(caplog):
    """Spark's Kafka sink ignores options it does not know (#34): a warning naming the option
    and the known one it most likely meant (this case was an error before)."""
    with caplog.at_level(logging.WARNING, logger="pyspark_kafkalog.spark.option_table"):
        o = WriteOptions.parse({"path": "/x", "topik": "t"})
    assert o.topic is None
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1
    assert re.search("unknown option topik='t'.*did you mean topic", warned[0])


def test_options_parse():
    o = WriteOptions.parse({"PATH": "/r", "Topic": "t", "compression.type": "LZ4",
                            "message.format.version": "0.10.2", "CREATETOPIC": "true",
                            "topic.partitions": "6", "topic.config.retention.ms": "1000",
                            "storage.endpoint_url": "http://x", "compression.lz4.level": "9",
                            "transaction.timeout.ms": "120000"})
    assert (o.path, o.topic, o.compression, o.magic, o.create_topic, o.topic_partitions) == (
        "/r", "t", 3, 1, True, 6)
    assert o.topic_configs == {"retention.ms": "1000"} and o.compression_levels == {3: 9}
    assert o.cluster_kwargs() == {"endpoint_url": "http://x", "transaction_timeout_ms": 120000}
    assert WriteOptions.parse({"path": "/r", "message.format.version": "2"}).magic == 2
    assert WriteOptions.parse({"path": "/r"}).transaction_timeout_ms == 900_000
    # delivery tuning of a Kafka producer is a documented no-op
    WriteOptions.parse({"path": "/r", "kafka.acks": "all", "kafka.linger.ms": "5",
                        "kafka.ssl.truststore.location": "/x", "kafka.enable.idempotence": "1"})


@pytest.mark.slow
def test_errors_through_spark(ks, tmp_path, golden_copy):
    root = tmp_path / "c"
    admin = Admin(str(root))
    admin.create_topic("e", 2)
    ok = ks.createDataFrame([("k", "v")], "key string, value string")

    def fails(df, needle, **opts):
        with pytest.raises(Exception, match=needle):
            write(df, opts.pop("path", root), **opts)

    fails(ok, "no topic")
    fails(ok, "does not exist", topic="nope")
    fails(ok, "plain Kafka log", path=golden_copy, topic="e")
    (tmp_path / "empty").mkdir()
    fails(ok, "not a kafkalog cluster root", path=tmp_path / "empty", topic="e")
    fails(ks.createDataFrame([("v", 1)], "value string, extra int"),
          r"unknown column\(s\) \['extra'\]", topic="e")
    fails(ks.createDataFrame([("v", 5)], "value string, partition int"),
          r"a row has partition 5 but topic 'e' has 2 partitions \(0..1\)", topic="e")
    fails(ks.createDataFrame([("v", [("h", b"x")])],
                             "value string, headers array<struct<key:string,value:binary>>"),
          "no record headers", topic="e", **{"message.format.version": "1"})
    assert list(admin.consume("e")) == []
    # read-schema columns (offset, timestampType) are ignored, so a read -> write copy works
    df = ks.createDataFrame([(b"k", b"v", 5, 0)], "key binary, value binary, offset long, "
                            "timestampType int")
    write(df, root, topic="e")
    assert [r.value for r in admin.consume("e")] == [b"v"]


@pytest.mark.parametrize("ddl,topic,needle", [
    ("value string, extra int", "t", r"unknown column\(s\) \['extra'\]"),
    ("Value string, key string", "t", "case-sensitive"),
    ("key string", "t", "needs a 'value' column"),
    ("value int", "t", "column 'value' must be string or binary"),
    ("value string, partition string", "t", "column 'partition' must be int"),
    ("value string, timestamp long", "t", "column 'timestamp' must be timestamp"),
    ("value string, headers map<string,binary>", "t", "column 'headers' must be array<struct"),
    ("value string", None, "no topic"),
    ("value string, topic int", None, "column 'topic' must be string"),
    ("value string, v variant", "t", r"unknown column\(s\) \['v'\]"),
])
def test_column_errors(ks, tmp_path, ddl, topic, needle):
    """The column rules, checked on the driver before any task runs (no Spark job needed; the
    session only parses the DDL, which needs a SparkContext)."""
    from pyspark.sql.types import _parse_datatype_string
    from pyspark_kafkalog.spark.writer import _check_columns
    with pytest.raises(InvalidConfigError, match=needle):
        _check_columns(_parse_datatype_string(ddl), topic)


def test_row_errors_in_a_task(tmp_path):
    root = str(tmp_path / "c")
    Admin(root).create_topic("t", 2)
    opts = WriteOptions.parse({"path": root})

    def add(**cols):
        tw = TaskWriter(Cluster(root), opts, producer="spark-job:x")
        tw.add(pa.RecordBatch.from_pydict(cols))

    with pytest.raises(KafkaLogError, match="null topic"):
        add(value=["v"], topic=pa.array([None], pa.string()))
    with pytest.raises(KafkaLogError, match="topic 'nope' does not exist"):
        add(value=["v"], topic=["nope"])
    with pytest.raises(KafkaLogError, match="a row has partition -1 but topic 't' has 2"):
        add(value=["v", "w"], topic=["t", "t"], partition=pa.array([None, -1], pa.int32()))
    with pytest.raises(KafkaLogError, match="timestamp -1000 ms .before 1970"):
        add(value=["v"], topic=["t"], timestamp=pa.array([-1_000_000], pa.timestamp("us")))


@pytest.mark.parametrize("unit", ["s", "ms", "us", "ns"])
def test_timestamp_columns_of_every_unit_sliced_and_with_nulls(tmp_path, unit):
    """CreateTime is the column in ms (read in place when it has no nulls, so a slice's offset
    must be honoured), or the write time where it is null."""
    from pyspark_kafkalog.connector.spark_job import commit_job
    root = str(tmp_path / "c")
    admin = Admin(root)
    admin.create_topic("t", 1)
    now_ms = 1_800_000_000_000
    ms = [1_700_000_000_000 + 1000 * i for i in range(8)]        # whole seconds, for unit s
    scale = {"s": 1, "ms": 1000, "us": 1000_000, "ns": 1000_000_000}[unit]
    col = pa.array([m * scale // 1000 for m in ms], pa.timestamp(unit))
    with_nulls = pa.array([None if i % 3 == 0 else m * scale // 1000 for i, m in enumerate(ms)],
                          pa.timestamp(unit))
    tw = TaskWriter(Cluster(root), WriteOptions.parse({"path": root, "topic": "t"}),
                    producer="spark-job:ts", clock=lambda: now_ms / 1000)
    for c in (col.slice(3), with_nulls.slice(1)):
        tw.add(pa.RecordBatch.from_arrays([pa.array([b"v"] * len(c)), c],
                                          names=["value", "timestamp"]))
    commit_job(Cluster(root), tw.finish(), "spark-job:ts")
    want = ms[3:] + [now_ms if i % 3 == 0 else m for i, m in enumerate(ms)][1:]
    assert [r.timestamp for r in admin.consume("t")] == want


def test_max_message_bytes_splits_batches_and_rejects_huge_records(tmp_path):
    root = str(tmp_path / "c")
    Admin(root).create_topic("small", 1, configs={"max.message.bytes": "2000"})
    opts = WriteOptions.parse({"path": root})
    tw = TaskWriter(Cluster(root), opts, producer="spark-job:x")
    tw.add(pa.RecordBatch.from_pydict({"value": [b"x" * 300] * 40, "topic": ["small"] * 40}))
    (pending,) = tw.finish()
    # ~310 bytes a record: at most 6 fit a batch of 2000 bytes, so at least 7 batches
    assert tw.stats.batches >= 7
    (log,) = Path(root).rglob("small-0/*.log")
    data = log.read_bytes()
    headers = list(iter_headers(data))
    assert sum(h.last_offset - h.base_offset + 1 for h in headers) == 40
    assert all(h.size <= 2000 for h in headers), [h.size for h in headers]
    assert Admin(root).cluster.state().txns   # reserved, not committed
    tw.abort()
    tw = TaskWriter(Cluster(root), opts, producer="spark-job:x")
    tw.add(pa.RecordBatch.from_pydict({"value": [b"x" * 3000], "topic": ["small"]}))
    with pytest.raises(KafkaLogError, match="max.message.bytes"):
        tw.finish()


# -- independent validation of the bytes: kafka-python reads the segments -----------------------

@pytest.fixture
def kafka_python_snappy(monkeypatch):
    """kafka.codec wants python-snappy; give it the raw-block layer python-snappy wraps."""
    if not kc.has_snappy():
        monkeypatch.setattr(kc, "snappy", types.SimpleNamespace(
            compress=lambda b: bytes(cramjam.snappy.compress_raw(bytes(b))),
            decompress=lambda b: bytes(cramjam.snappy.decompress_raw(bytes(b)))))


FORMATS = [(m, c) for m in (0, 1, 2) for c in ("none", "gzip", "snappy", "lz4", "zstd")
           if not (c == "zstd" and m < 2)]


@pytest.mark.slow
def test_every_codec_and_format_reads_back_with_kafka_python(ks, tmp_path, kafka_python_snappy):
    root = tmp_path / "c"
    rows = [(None if i % 4 == 0 else f"key-{i}", (f"value-{i}-" * (i % 9)).encode() or None,
             datetime.fromtimestamp((1_650_000_000_000 + i * 1001) / 1000, tz=timezone.utc),
             [("h", b"%d" % i), ("n", None)] if i % 3 == 0 else [])
            for i in range(300)]
    schema = ("key string, value binary, timestamp timestamp, "
              "headers array<struct<key:string,value:binary>>")
    full = ks.createDataFrame(rows, schema).repartition(2).cache()
    no_headers = full.drop("headers")
    for magic, codec in FORMATS:
        topic = f"f{magic}-{codec}"
        write(full if magic == 2 else no_headers, root, topic=topic, createTopic="true",
              **{"topic.partitions": 2, "message.format.version": magic,
                 "compression.type": codec, "batch.records": 37})
        seen = []
        for f in seg_files(root, topic, (".log",)):
            pos, buf = 0, f.read_bytes()
            for batch in MemoryRecords(buf):
                assert batch.magic == magic and batch.validate_crc()
                if codec != "none":
                    assert batch.compression_type != 0
                for rec in batch:
                    assert rec.validate_crc()
                    seen.append((rec.key, rec.value, rec.timestamp,
                                 tuple(rec.headers) if magic == 2 else ()))
                pos += batch.size_in_bytes
            assert pos == len(buf)
        want = sorted((((None if k is None else k.encode()), v,
                        None if magic == 0 else round(ts.timestamp() * 1000),
                        tuple(h) if magic == 2 else ()) for k, v, ts, h in rows), key=repr)
        assert sorted(seen, key=repr) == sorted(want, key=repr), topic
        # and ours agrees with kafka-python on the same files
        assert len(list(Admin(str(root)).consume(topic))) == len(rows)
    full.unpersist()


# -- the vectorised encoder is the reference encoder, byte for byte -----------------------------

def test_vectorised_encoder_is_byte_identical():
    rng = random.Random(3)
    n = 2000
    keys = pa.array([None if i % 10 == 0 else rng.randbytes(rng.randrange(0, 30))
                     for i in range(n)], pa.binary())
    vals = pa.array([None if i % 17 == 0 else rng.randbytes(rng.randrange(0, 300))
                     for i in range(n)], pa.binary())
    ts = [rng.randrange(0, 2**44) for _ in range(n)]
    hdrs = pa.array([None if i % 5 == 0 else
                     [{"key": b"h%d" % j, "value": None if j == 1 else rng.randbytes(j)}
                      for j in range(i % 4)] for i in range(n)], HEADER_TYPE)
    for a, b in ((0, n), (13, 977)):
        k, v, h = keys.slice(a, b), vals.slice(a, b), hdrs.slice(a, b)
        t = ts[a:a + b]
        bounds = chunk_bounds(estimated_sizes(k, v, h), 40_000, 300)
        assert len(bounds) > 3
        got = encode_v2_chunks(k, v, t, h, bounds, 0)
        recs = to_records(k, v, t, h)
        for i, (x, y) in enumerate(zip(bounds[:-1], bounds[1:])):
            assert got[i] == encode_batch_v2(recs[x:y])


# -- file count: the shuffle helper -------------------------------------------------------------

@pytest.mark.slow
def test_segment_counts_with_and_without_the_shuffle(ks, tmp_path):
    """8 input partitions x 8 Kafka partitions: one segment per (task, partition) without the
    shuffle, the 8 input partitions coalesced to the 2 cores' tasks (maxTasks); exactly one per
    partition with it; the same records land in the same partitions."""
    from pyspark_kafkalog.spark.shuffle import spark_hash_int
    from pyspark_kafkalog.spark.writer import repartition_by_kafka_partition
    from pyspark.sql import functions as F
    root = tmp_path / "c"
    admin = Admin(str(root))
    admin.create_topic("plain", 8)
    admin.create_topic("shuffled", 8)
    df = ks.range(0, 16_000, numPartitions=8).selectExpr("cast(id as string) as key",
                                                          "cast(id * 7 as string) as value")
    write(df, root, topic="plain")
    shuffled = repartition_by_kafka_partition(df, str(root), "shuffled")
    assert shuffled.rdd.getNumPartitions() == 8
    write(shuffled, root, topic="shuffled")
    plain_segs = len(seg_files(root, "plain", (".log",)))
    shuffled_segs = len(seg_files(root, "shuffled", (".log",)))
    assert (plain_segs, shuffled_segs) == (2 * 8, 8)
    a = sorted((r.partition, r.key, r.value) for r in admin.consume("plain"))
    b = sorted((r.partition, r.key, r.value) for r in admin.consume("shuffled"))
    assert a == b and len(a) == 16_000
    # the helper's Spark hash is Spark's
    vals = [0, 1, -1, 42, 2**31 - 1, -2**31, 123456]
    got = ks.createDataFrame([(v,) for v in vals], "v int").select(F.hash("v")).collect()
    assert [r[0] for r in got] == [spark_hash_int(v) for v in vals]


@pytest.mark.slow
def test_shuffle_helper_unkeyed_and_explicit(ks, tmp_path):
    from pyspark_kafkalog.spark.writer import repartition_by_kafka_partition
    root = tmp_path / "c"
    Admin(str(root)).create_topic("u", 4)
    df = ks.range(0, 8000, numPartitions=4).selectExpr(
        "cast(id as string) as value", "if(id < 10, 3, null) as partition")
    out = repartition_by_kafka_partition(df, str(root), "u", num_tasks=2,
                                         **{"batch.records": 500})
    assert out.rdd.getNumPartitions() == 2
    write(out, root, topic="u")
    got = list(Admin(str(root)).consume("u"))
    assert len(got) == 8000
    assert all(r.partition == 3 for r in got if int(r.value) < 10)
    assert len(seg_files(root, "u", (".log",))) == 4


@pytest.mark.slow
def test_spark_sql_murmur2_matches_kafka_python(ks):
    """The shuffle helper computes Kafka's partition in Spark SQL; it must be the sink's."""
    from pyspark.sql import functions as F
    from pyspark_kafkalog.spark.shuffle import kafka_murmur2, kafka_partition
    rng = random.Random(99)
    keys = [rng.randbytes(rng.randrange(0, 23)) for _ in range(3000)] + [b"", b"a", b"abcd"]
    df = ks.createDataFrame([(k,) for k in keys], "key binary")
    got = df.select("key", kafka_murmur2(F.col("key")).alias("h"),
                    kafka_partition(F.col("key"), F.lit(11)).alias("p")).collect()
    assert [(bytes(r.key), r.h, r.p) for r in got] == [
        (k, kp_murmur2(k) & 0xFFFFFFFF, py_partition(k, 11)) for k in keys]


@pytest.mark.slow
def test_end_to_end_with_the_spark_reader(ks, tmp_path):
    """Write with format("kafkalog"), read back with format("kafkalog"), copy topic to topic."""
    root = str(tmp_path / "c")
    rows = [(None if i % 3 == 0 else f"k{i}", f"v{i}",
             datetime.fromtimestamp((1_700_000_000_000 + i) / 1000, tz=timezone.utc),
             [("h", b"%d" % i)] if i % 2 else [])
            for i in range(500)]
    df = ks.createDataFrame(rows, "key string, value string, timestamp timestamp, "
                                  "headers array<struct<key:string,value:binary>>")
    write(df, root, topic="src", createTopic="true", **{"topic.partitions": 3})
    read = (ks.read.format("kafkalog").option("subscribe", "src")
            .option("includeHeaders", "true").load(root))
    got = sorted(((None if r.key is None else bytes(r.key).decode(), bytes(r.value).decode(),
                   round(r.timestamp.timestamp() * 1000), r.timestampType,
                   [(h.key, bytes(h.value)) for h in r.headers], r.partition, r.offset)
                  for r in read.collect()), key=repr)
    admin = Admin(root)
    placed = {r.value.decode(): (r.partition, r.offset) for r in admin.consume("src")}
    assert got == sorted(((k, v, 1_700_000_000_000 + i, 0, h, *placed[v])
                          for i, (k, v, _, h) in enumerate(rows)), key=repr)
    # topic to topic: the read schema's extra columns are ignored, partitions kept
    write(read.drop("topic"), root, topic="copy", createTopic="true", **{"topic.partitions": 3})
    copy = sorted(((r.partition, r.key, r.value, r.timestamp, r.headers)
                   for r in admin.consume("copy")), key=repr)
    assert copy == sorted(((r.partition, r.key, r.value, r.timestamp, r.headers)
                           for r in admin.consume("src")), key=repr)


@pytest.mark.slow
def test_writes_from_a_thread_pool_find_the_format(ks, tmp_path):
    """PySpark 4.3 looks a Python data source up for a write in the calling thread's active
    session; threads other than the session's own have none. ``register`` makes the writer's
    session active for a kafkalog save, so a thread pool of writers works."""
    from concurrent.futures import ThreadPoolExecutor
    root = str(tmp_path / "c")
    df = ks.range(0, 10).selectExpr("CAST(id AS STRING) AS key", "CAST('v' AS BINARY) AS value")
    write(df, root, topic="t", createTopic="true")

    def job(_):
        df.write.format("kafkalog").option("topic", "t").save(root)   # default mode: append
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(job, range(4)))
    latest = Admin(root, create=False).list_offsets({("t", 0): "latest"})
    assert latest[("t", 0)].offset == 50
