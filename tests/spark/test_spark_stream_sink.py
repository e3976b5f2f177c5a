"""``df.writeStream.format("kafkalog")``: exactly once per micro-batch (docs/protocol.md §3.2).

* a real streaming query (file source) writes two micro-batches: every row lands once, with the
  keys, values, headers and partitions the batch sink gives the same rows;
* a driver that died after the sink's commit but before Spark's commit log (simulated by
  deleting the batch's file in ``<checkpoint>/commits/``): the restarted query replays the batch,
  the log refuses its ``stream_commit``, the replay's offsets are aborted and its files deleted,
  and later batches are visible;
* ``commit_stream_batch`` without Spark: a batch commits once, lower batches are refused,
  earlier runs' reservations are aborted, the feature is enabled by the first commit;
* the feature gate: a client that does not know ``streamingSink`` refuses to read.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pytest
from kafka.partitioner.default import murmur2 as kp_murmur2

from support.cli_support import run_main
from support.spark_support import write
from pyspark_kafkalog.admin import Admin
from pyspark_kafkalog.cluster import features
from pyspark_kafkalog.connector.arrow_writer import TaskWriter
from pyspark_kafkalog.cluster.cluster import Cluster
from pyspark_kafkalog.connector.spark_job import (commit_stream_batch, parse_stream_producer,
                                                stream_producer_id)
from pyspark_kafkalog.cluster.state import split_key
from pyspark_kafkalog.errors import UnsupportedVersionError
from pyspark_kafkalog.spark.write_options import WriteOptions

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.slow]   # streaming sinks (~4 s)

SOURCE_SCHEMA = "id long, key string, part int"


def add_file(src: Path, name: str, ids) -> None:
    """One JSON file of rows, renamed into place so the file source never sees it half
    written (it skips names starting with '.')."""
    tmp = src / f".{name}.tmp"
    with open(tmp, "w") as f:
        for i in ids:
            f.write(json.dumps({"id": i, "key": None if i % 7 == 0 else f"k{i % 13}",
                                "part": i % 2 if i % 7 == 0 else None}) + "\n")
    os.rename(tmp, src / f"{name}.json")


def to_sink_rows(df):
    """The sink's columns from the source rows: keyed rows (murmur2) and explicit partitions,
    so that where each row lands is determined."""
    from pyspark.sql import functions as F
    return df.select(
        F.col("key"),
        F.concat(F.lit("v"), F.col("id").cast("string")).cast("binary").alias("value"),
        F.array(F.struct(F.lit("id").alias("key"),
                         F.col("id").cast("string").cast("binary").alias("value"))
                ).alias("headers"),
        F.col("part").alias("partition"))


def start(ks, src: Path, root: Path, ckpt: Path, topic: str, **opts):
    w = (to_sink_rows(ks.readStream.schema(SOURCE_SCHEMA).json(str(src)))
         .writeStream.format("kafkalog").option("checkpointLocation", str(ckpt))
         .option("topic", topic))
    for k, v in opts.items():
        w = w.option(k, str(v))
    return w.start(str(root))


def read_topic(ks, root: Path, topic: str):
    """(key, value, headers, partition) of every visible record, through the batch reader."""
    rows = (ks.read.format("kafkalog").option("subscribe", topic)
            .option("includeHeaders", "true").load(str(root))
            .select("key", "value", "headers", "partition").collect())
    return sorted([(None if r.key is None else bytes(r.key), bytes(r.value),
                    tuple((h.key, bytes(h.value)) for h in r.headers or []), r.partition)
                   for r in rows], key=lambda t: t[1])


def expected(ids, partitions: int):
    out = []
    for i in ids:
        key = None if i % 7 == 0 else f"k{i % 13}".encode()
        part = i % 2 if i % 7 == 0 else (kp_murmur2(key) & 0x7FFFFFFF) % partitions
        out.append((key, b"v%d" % i, (("id", b"%d" % i),), part))
    return sorted(out, key=lambda t: t[1])


def entries(root: Path):
    for p in sorted((root / "_kafkalog" / "log").glob("*[0-9].json")):
        yield json.loads(p.read_text())


def stream_commits(root: Path):
    return [(a["sink"], a["batch"]) for e in entries(root) for a in e["actions"]
            if a["op"] == "stream_commit"]


def latest(root, topic: str, p: int) -> int:
    """The partition's high watermark."""
    return Admin(str(root), create=False).list_offsets({(topic, p): "latest"})[(topic, p)].offset


def segment_bases(root: Path, topic: str):
    """(partition, base offset) of every complete segment of ``topic``."""
    out = set()
    for log in Path(root).glob(f"logdir-*/{topic}-*/*.log"):
        out.add((int(log.parent.name.rpartition("-")[2]), int(log.stem)))
    return out


# -- Spark: a real streaming query ---------------------------------------------------------------

def test_stream_writes_every_row_once_as_the_batch_sink(ks, tmp_path):
    root, src, ckpt = tmp_path / "c", tmp_path / "in", tmp_path / "ckpt"
    src.mkdir()
    q = start(ks, src, root, ckpt, "s", createTopic="true", **{"topic.partitions": 3})
    try:
        add_file(src, "a", range(0, 40))
        q.processAllAvailable()
        add_file(src, "b", range(40, 70))
        q.processAllAvailable()
    finally:
        q.stop()
    assert q.exception() is None
    got = read_topic(ks, root, "s")
    assert got == expected(range(70), 3)
    # the batch sink writes the same rows the same way
    batch = to_sink_rows(ks.read.schema(SOURCE_SCHEMA).json(str(src)))
    write(batch, root, topic="b", createTopic="true", **{"topic.partitions": 3})
    assert read_topic(ks, root, "b") == got
    query_id = json.loads((ckpt / "metadata").read_text())["id"]
    assert stream_commits(root) == [(query_id, 0), (query_id, 1)]
    state = Cluster(str(root), create=False).state()
    assert state.sinks == {query_id: 1}
    assert features.STREAMING_SINK in state.reader_features
    assert not state.txns


def test_replay_after_a_crash_between_sink_commit_and_commit_log_is_discarded(ks, tmp_path):
    root, src, ckpt = tmp_path / "c", tmp_path / "in", tmp_path / "ckpt"
    src.mkdir()
    Admin(str(root)).create_topic("s", 2)
    q = start(ks, src, root, ckpt, "s")
    try:
        add_file(src, "a", range(0, 30))
        q.processAllAvailable()
        add_file(src, "b", range(30, 50))
        q.processAllAvailable()
    finally:
        q.stop()
    query_id = json.loads((ckpt / "metadata").read_text())["id"]
    assert stream_commits(root) == [(query_id, 0), (query_id, 1)]
    # the driver "died" after the sink committed batch 1, before Spark's commit log recorded it
    for f in (ckpt / "commits").iterdir():
        if f.name.lstrip(".").split(".")[0] == "1":
            f.unlink()
    before = segment_bases(root, "s")

    q = start(ks, src, root, ckpt, "s")
    try:
        q.processAllAvailable()             # Spark replays batch 1
        add_file(src, "c", range(50, 60))
        q.processAllAvailable()             # and goes on with batch 2
    finally:
        q.stop()
    assert q.exception() is None
    assert read_topic(ks, root, "s") == expected(range(60), 2)
    # batch 1 was offered twice and committed once; batch 2 after it
    assert stream_commits(root) == [(query_id, 0), (query_id, 1), (query_id, 1), (query_id, 2)]
    state = Cluster(str(root), create=False).state()
    assert state.sinks == {query_id: 2}
    assert not state.txns
    # the replay reserved offsets, which were aborted and their segment files deleted
    replay = [t for t, o in state.decided.items() if o == "aborted"]
    assert replay
    aborted = {(p, tuple(r)) for p in (0, 1) for r in state.partitions[f"s:{p}"].aborted}
    assert aborted
    for p, (start_, end) in aborted:
        assert not [b for q_, b in segment_bases(root, "s") if q_ == p and start_ <= b < end]
    # batch 2 came after the aborted range: the high watermark moved past it
    for p, (start_, end) in aborted:
        assert latest(root, "s", p) >= end
    assert segment_bases(root, "s") > before


def test_complete_output_mode_is_refused(ks, tmp_path):
    root, src = tmp_path / "c", tmp_path / "in"
    src.mkdir()
    Admin(str(root)).create_topic("s", 1)
    add_file(src, "a", range(5))
    counts = (ks.readStream.schema(SOURCE_SCHEMA).json(str(src)).groupBy("key").count()
              .selectExpr("key", "cast(count as string) as value"))
    q = (counts.writeStream.format("kafkalog").outputMode("complete").option("topic", "s")
         .option("checkpointLocation", str(tmp_path / "ckpt")).start(str(root)))
    try:
        with pytest.raises(Exception, match="output mode Complete is not supported"):
            q.processAllAvailable()
    finally:
        q.stop()
    assert list(Admin(str(root)).consume("s")) == []


# -- commit_stream_batch, without Spark ----------------------------------------------------------

QUERY = "5488d14c-40ad-41ec-917b-d463e74e8d04"


def reserve(root: str, producer: str, values) -> list:
    """A task of ``producer`` that reserved and wrote ``values`` to topic t."""
    tw = TaskWriter(Cluster(root, create=False), WriteOptions.parse({"path": root, "topic": "t"}),
                    producer=producer)
    tw.add(pa.RecordBatch.from_pydict({"value": [v.encode() for v in values]}))
    return tw.finish()


def segment_paths(root: str, pending) -> list:
    """The .log files of the pending writes' ranges."""
    out = []
    for p in pending:
        for key, (start_, end, _e) in p.ranges.items():
            topic, part = split_key(key)
            out += [f for f in Path(root).glob(f"logdir-*/{topic}-{part}/*.log")
                    if start_ <= int(f.stem) < end]
    return out


@pytest.fixture
def root(tmp_path) -> str:
    root = str(tmp_path / "c")
    Admin(root).create_topic("t", 1)
    return root


def values(root: str) -> list:
    return [r.value.decode() for r in Admin(root, create=False).consume("t")]


def test_producer_id_names_query_batch_and_run():
    p = stream_producer_id(QUERY, 7, "r1")
    assert p == f"spark-stream:{QUERY}:7:r1"
    assert parse_stream_producer(p) == (QUERY, 7, "r1")
    assert parse_stream_producer("spark-job:abc") is None


def test_a_batch_commits_once_and_lower_batches_are_refused(root):
    first = reserve(root, stream_producer_id(QUERY, 3, "run1"), ["a", "b"])
    assert commit_stream_batch(Cluster(root, create=False), first,
                               stream_producer_id(QUERY, 3, "run1"), QUERY, 3)
    again = reserve(root, stream_producer_id(QUERY, 3, "run2"), ["a", "b"])
    files = segment_paths(root, again)
    assert files and all(f.exists() for f in files)
    assert not commit_stream_batch(Cluster(root, create=False), again,
                                   stream_producer_id(QUERY, 3, "run2"), QUERY, 3)
    assert not any(f.exists() for f in files)
    lower = reserve(root, stream_producer_id(QUERY, 2, "run2"), ["c"])
    assert not commit_stream_batch(Cluster(root, create=False), lower,
                                   stream_producer_id(QUERY, 2, "run2"), QUERY, 2)
    assert values(root) == ["a", "b"]
    state = Cluster(root, create=False).state()
    assert state.sinks == {QUERY: 3}
    assert not state.txns
    assert all(state.decided[p.txn] == "aborted" for p in again + lower)
    # the next batch commits, visible after the aborted gaps
    nxt = reserve(root, stream_producer_id(QUERY, 4, "run2"), ["d"])
    assert commit_stream_batch(Cluster(root, create=False), nxt,
                               stream_producer_id(QUERY, 4, "run2"), QUERY, 4)
    assert values(root) == ["a", "b", "d"]


def test_the_next_commit_aborts_reservations_of_earlier_runs(root):
    other = "0f0f0f0f-0000-0000-0000-000000000000"
    dead = reserve(root, stream_producer_id(QUERY, 5, "dead"), ["lost"])        # died at 5
    ahead = reserve(root, stream_producer_id(QUERY, 9, "dead"), ["ahead"])      # a later batch
    others = reserve(root, stream_producer_id(other, 1, "x"), ["other query"])
    plain = reserve(root, "spark-job:j", ["batch job"])
    dead_files = segment_paths(root, dead)
    assert latest(root, "t", 0) == 0     # held back by the open reservations
    mine = reserve(root, stream_producer_id(QUERY, 5, "new"), ["x"])
    assert commit_stream_batch(Cluster(root, create=False), mine,
                               stream_producer_id(QUERY, 5, "new"), QUERY, 5)
    state = Cluster(root, create=False).state()
    assert state.decided[dead[0].txn] == "aborted"
    assert not any(f.exists() for f in dead_files)
    assert set(state.txns) == {ahead[0].txn, others[0].txn, plain[0].txn}


def listed(out: str, feature: str) -> dict:
    """One feature's row of ``features --list --json`` (one JSON object a line)."""
    rows = [json.loads(line) for line in out.splitlines()]
    return next(r for r in rows if r["feature"] == feature)


def test_the_first_stream_commit_enables_the_feature(root):
    rc, out, _ = run_main("--cluster", root, "--json", "features", "--list")
    assert rc == 0 and listed(out, "streamingSink")["enabled"] is False
    empty = commit_stream_batch(Cluster(root, create=False), [],
                                stream_producer_id(QUERY, 0, "r"), QUERY, 0)
    assert empty and features.STREAMING_SINK not in Cluster(root, create=False).state(
    ).reader_features                               # an empty micro-batch commits nothing
    pending = reserve(root, stream_producer_id(QUERY, 1, "r"), ["a"])
    assert commit_stream_batch(Cluster(root, create=False), pending,
                               stream_producer_id(QUERY, 1, "r"), QUERY, 1)
    rc, out, _ = run_main("--cluster", root, "--json", "features", "--list")
    assert rc == 0 and listed(out, "streamingSink") == {
        "feature": "streamingSink", "kind": "reader", "enabled": True, "supported": True,
        "description": features.READER_FEATURES["streamingSink"]}
    ops = [a["op"] for e in entries(Path(root)) for a in e["actions"]]
    assert ops.index("protocol") < ops.index("stream_commit")


def test_a_client_without_the_feature_refuses_to_read_after_the_sink_ran(root, monkeypatch):
    pending = reserve(root, stream_producer_id(QUERY, 0, "r"), ["a"])
    commit_stream_batch(Cluster(root, create=False), pending,
                        stream_producer_id(QUERY, 0, "r"), QUERY, 0)
    assert values(root) == ["a"]
    monkeypatch.delitem(features.READER_FEATURES, features.STREAMING_SINK)
    with pytest.raises(UnsupportedVersionError, match="streamingSink"):
        values(root)
    rc, _, err = run_main("--cluster", root, "consume", "--topic", "t")
    assert rc == 1 and "streamingSink" in err and len(err.strip().splitlines()) == 1


def test_old_decision_markers_are_swept_at_most_every_ten_minutes(tmp_path, monkeypatch):
    """A stream decides a batch every few seconds: its markers go after an hour (a job's after
    a day), and the folder is listed at most once per interval, not at every commit."""
    import time as _time
    from pyspark_kafkalog.connector import spark_job as sj
    cluster = Cluster(str(tmp_path))
    jobs = tmp_path / "_kafkalog" / "jobs"
    jobs.mkdir(parents=True, exist_ok=True)
    now = _time.time()
    ages = {sj.marker_path(sj.stream_producer_id("q", 1, "r")): 2 * 3600,
            sj.marker_path(sj.job_producer_id("young")): 2 * 3600,
            sj.marker_path(sj.job_producer_id("old")): 2 * 86400}
    for path, age in ages.items():
        f = tmp_path / path
        f.write_text("{}")
        os.utime(f, (now - age, now - age))
    monkeypatch.setattr(sj, "_LAST_SWEEP", {})
    sj._sweep_markers(cluster)
    left = sorted(p.name for p in jobs.iterdir() if p.name.endswith(".json"))
    assert left == [Path(sj.marker_path(sj.job_producer_id("young"))).name]
    late = tmp_path / sj.marker_path(sj.stream_producer_id("q", 2, "r"))
    late.write_text("{}")
    os.utime(late, (now - 7200, now - 7200))
    listed = []
    real_list = cluster.storage.list
    monkeypatch.setattr(cluster.storage, "list", lambda d="": listed.append(d) or real_list(d))
    sj._sweep_markers(cluster)                  # within the interval: no listing at all
    assert listed == [] and late.exists()
