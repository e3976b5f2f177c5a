"""Real Structured Streaming queries over ``readStream.format("kafkalog")``: batches bounded by
the trigger options, the progress Spark reports, Trigger.AvailableNow, and a restart from a
checkpoint written by the first version of the source (tests/data/streaming/checkpoint-v1,
made by ``KAFKALOG_REGEN_FIXTURES=1 pytest tests/spark/test_spark_stream.py -k checkpoint``)."""
import json
import os
import shutil
from pathlib import Path

import pytest

from pyspark_kafkalog.admin import Admin

FIXTURE = Path(__file__).resolve().parents[1] / "data" / "streaming" / "checkpoint-v1"


pytestmark = pytest.mark.slow   # streaming queries (~4 s)


def fill(root, topic="t", partitions=2, per_partition=10, start=0):
    a = Admin(str(root))
    if topic not in a.list_topics():
        a.create_topic(topic, num_partitions=partitions)
    for p in range(partitions):
        a.produce(topic, [(f"k{p}-{i}".encode(), f"v{p}-{i}".encode())
                          for i in range(start, start + per_partition)], partition=p)
    return a


def stream(ks, root, **opts):
    r = ks.readStream.format("kafkalog")
    for k, v in opts.items():
        r = r.option(k, str(v))
    return r.load(str(root))


def test_every_batch_respects_max_offsets_per_trigger_and_reports_progress(ks, tmp_path):
    root = tmp_path / "c"
    fill(root, per_partition=25)
    df = stream(ks, root, subscribe="t", startingOffsets="earliest", maxOffsetsPerTrigger=15)
    q = (df.selectExpr("CAST(value AS STRING) v", "partition", "offset").writeStream
         .format("memory").queryName("bounded").option("checkpointLocation",
                                                          str(tmp_path / "ck")).start())
    try:
        q.processAllAvailable()
        rows = ks.sql("select v from bounded").collect()
        progress = [p for p in q.recentProgress if p["numInputRows"]]
    finally:
        q.stop()
    assert sorted(r.v for r in rows) == sorted(f"v{p}-{i}" for p in range(2) for i in range(25))
    assert all(p["numInputRows"] <= 15 for p in progress) and len(progress) >= 4
    last = progress[-1]
    source = last["sources"][0]
    assert json.loads(source["latestOffset"]) == {"t": {"0": 25, "1": 25}}
    assert json.loads(source["endOffset"]) == {"t": {"0": 25, "1": 25}}
    assert "latestOffset" in last["durationMs"]


def test_available_now_reads_what_existed_at_start_in_bounded_batches(ks, tmp_path):
    root = tmp_path / "c"
    fill(root, per_partition=20)
    df = stream(ks, root, subscribe="t", startingOffsets="earliest", maxOffsetsPerTrigger=8)
    q = (df.selectExpr("CAST(value AS STRING) v").writeStream.format("memory")
         .queryName("availnow").option("checkpointLocation", str(tmp_path / "ck"))
         .trigger(availableNow=True).start())
    q.awaitTermination(300)
    rows = ks.sql("select v from availnow").collect()
    sizes = [p["numInputRows"] for p in q.recentProgress if p["numInputRows"]]
    assert len(rows) == 40 and max(sizes) <= 8 and len(sizes) >= 5


def _checkpoint_query(ks, root, ck, out):
    """A query that can restart from its checkpoint (the memory sink cannot): parquet files."""
    df = stream(ks, root, subscribe="t", startingOffsets="earliest", maxOffsetsPerTrigger=8)
    return (df.selectExpr("CAST(value AS STRING) v").writeStream.format("parquet")
            .option("path", str(out)).option("checkpointLocation", str(ck)).start())


def test_restart_from_a_checkpoint_written_by_the_first_version(ks, tmp_path):
    """The offsets in a checkpoint are Spark's Kafka JSON; a later version must carry on from
    one the first version wrote, reading only what comes after it."""
    root = tmp_path / "c"
    fill(root)                                      # offsets 0..9 in t-0 and t-1
    if os.environ.get("KAFKALOG_REGEN_FIXTURES"):
        ck = tmp_path / "ck"
        q = _checkpoint_query(ks, root, ck, tmp_path / "regen")
        q.processAllAvailable()
        q.stop()
        shutil.rmtree(FIXTURE, ignore_errors=True)
        shutil.copytree(ck, FIXTURE, ignore=shutil.ignore_patterns("*.crc"))
    ck = tmp_path / "restart"
    shutil.copytree(FIXTURE, ck)
    written = max(int(f.name) for f in (ck / "offsets").iterdir() if f.name.isdigit())
    last = json.loads((ck / "offsets" / str(written)).read_text().splitlines()[-1])
    assert last == {"t": {"0": 10, "1": 10}}        # what the first version wrote
    fill(root, start=10, per_partition=3)            # new records after the checkpoint
    out = tmp_path / "out"
    q = _checkpoint_query(ks, root, ck, out)
    try:
        q.processAllAvailable()
    finally:
        q.stop()
    rows = sorted(r.v for r in ks.read.parquet(str(out / "*.parquet")).collect())
    assert rows == sorted(f"v{p}-{i}" for p in range(2) for i in range(10, 13))
