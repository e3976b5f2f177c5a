"""The spark-submit maintenance jobs, with a real local SparkSession doing the fan-out."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pyspark_kafkalog.admin import Admin, TopicPartition as TP
from pyspark_kafkalog.format.records import Record

JOBS = Path(__file__).resolve().parents[2] / "jobs"
sys.path.insert(0, str(JOBS))

import delete_records as delete_job  # noqa: E402
import compact as compact_job  # noqa: E402
import merge_segments as merge_job  # noqa: E402
import retention as retention_job  # noqa: E402


pytestmark = pytest.mark.slow   # the spark-submit jobs (~13 s)


def _fill(admin, topics=("a", "b"), partitions=3, writes=4):
    for t in topics:
        admin.create_topic(t, partitions, configs={"segment.bytes": 100, "retention.ms": 1000})
        for i in range(writes):
            for p in range(partitions):
                admin.produce(t, [Record(b"k", b"v" * 40, 10_000 * (i + 1))], partition=p)


def test_retention_job_fans_out_with_spark(spark, tmp_path):
    url = str(tmp_path / "c")
    admin = Admin(url)
    _fill(admin)
    dry = retention_job.run(url, dry_run=True, now_ms=30_500, spark=spark,
                            min_partitions_for_spark=1)
    assert len(dry) == 6 and all(p["segments"] == [0, 1] for p in dry)
    assert all(p.log_start_offset == 0 for p in admin.describe_topic("a").partitions)
    plans = retention_job.run(url, now_ms=30_500, spark=spark, min_partitions_for_spark=1)
    assert sorted((p["topic"], p["partition"]) for p in plans) == [
        (t, p) for t in "ab" for p in range(3)]
    for t in "ab":
        assert all(p.log_start_offset == 2 for p in admin.describe_topic(t).partitions)
        assert sorted(f.name for f in (tmp_path / "c" / "logdir-0" / f"{t}-1").glob("*.log")) == [
            "00000000000000000002.log", "00000000000000000003.log"]
    assert retention_job.run(url, now_ms=30_500, spark=spark, min_partitions_for_spark=1) == []


def test_delete_records_job_from_kafka_json_and_after_consumption(spark, tmp_path):
    url = str(tmp_path / "c")
    admin = Admin(url)
    _fill(admin, topics=("a",))
    offsets = delete_job.read_offset_json(json.dumps({"version": 1, "partitions": [
        {"topic": "a", "partition": 0, "offset": 3}, {"topic": "a", "partition": 1, "offset": -1},
        {"topic": "a", "partition": 9, "offset": 1}]}))
    res = delete_job.run(url, offsets, spark=spark, min_partitions_for_spark=1)
    assert res[("a", 0)] == {"error": "NONE", "low_watermark": 3}
    assert res[("a", 1)] == {"error": "NONE", "low_watermark": 4}
    assert res[("a", 9)]["error"] == "UNKNOWN_TOPIC_OR_PARTITION"
    assert [f.name for f in (tmp_path / "c" / "logdir-0" / "a-0").glob("*.log")] == [
        "00000000000000000003.log"]
    # downstream consumption: trim partition 2 to what group g has consumed
    list(admin.consume("a", 2, group="g", max_records=2))
    consumed = delete_job.offsets_consumed_by(admin.cluster, "g")
    assert consumed == {("a", 2): 2}
    res = delete_job.run(url, consumed, spark=spark, min_partitions_for_spark=1)
    assert admin.describe_topic("a").partitions[2].log_start_offset == 2


@pytest.mark.parametrize("text,needle", [
    ("nope", "not valid JSON"), ('{"x": 1}', 'unknown field'), ('{}', 'missing the "partitions"'),
    ('{"partitions": [{"topic": "a", "partition": "0", "offset": 1}]}', "partitions[0]"),
    ('{"partitions": [{"topic": "a", "partition": 0, "offset": 1},'
     ' {"topic": "a", "partition": 0, "offset": 2}]}', "listed twice"),
])
def test_offset_json_file_errors(text, needle):
    with pytest.raises(Exception, match=needle.replace("[", r"\[").replace('"', '"')):
        delete_job.read_offset_json(text)


def test_jobs_run_under_spark_submit(tmp_path):
    """The real entry point, as users run it (a small cluster: no fan-out needed)."""
    url = str(tmp_path / "c")
    admin = Admin(url)
    _fill(admin, topics=("a",), partitions=1)
    spec = tmp_path / "offsets.json"
    spec.write_text(json.dumps({"version": 1, "partitions": [
        {"topic": "a", "partition": 0, "offset": 2}]}))
    spark_submit = Path(sys.executable).parent / "spark-submit"
    env = {"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
           "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"}
    import os
    env = {**os.environ, **env}
    proc = subprocess.run([str(spark_submit), "--master", "local[1]", str(JOBS / "delete_records.py"),
                           "--cluster", url, "--offset-json-file", str(spec)],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {
        "topic": "a", "partition": 0, "error": "NONE", "low_watermark": 2}
    assert admin.list_offsets({TP("a", 0): "earliest"})[TP("a", 0)].offset == 2


def test_merge_segments_job_fans_out_with_spark(spark, tmp_path):
    url = str(tmp_path / "c")
    admin = Admin(url)
    for t in ("a", "b"):
        admin.create_topic(t, 3)
        for i in range(12):
            admin.produce(t, [Record(b"k", b"v%d" % i, 1000 + i)], partition=i % 3)
    before = {t: [(r.partition, r.offset, r.value) for r in admin.consume(t)] for t in "ab"}
    done = merge_job.run(url, topics=["a"], lag_ms=0, delay_ms=0, spark=spark,
                         min_partitions_for_spark=1)
    assert sorted(d["partition"] for d in done if d["merged"]) == [0, 1, 2]
    assert all(d["topic"] == "a" and d["merged"] == [[0, 3, 3, d["merged"][0][3]]]
               for d in done)
    for p in range(3):
        assert sorted(f.name for f in (tmp_path / "c" / "logdir-0" / f"a-{p}").glob("*.log")) \
            == ["00000000000000000000.log", "00000000000000000003.log"]
        assert len(list((tmp_path / "c" / "logdir-0" / f"b-{p}").glob("*.log"))) == 4
    assert {t: [(r.partition, r.offset, r.value) for r in admin.consume(t)] for t in "ab"} \
        == before
    assert merge_job.run(url, topics=["a"], lag_ms=0, delay_ms=0, spark=spark,
                         min_partitions_for_spark=1) == []


def test_compact_job_cleans_the_compacted_partitions_with_spark(spark, tmp_path):
    url = str(tmp_path / "c")
    admin = Admin(url)
    admin.create_topic("a", 3, configs={"cleanup.policy": "compact"})
    admin.create_topic("b", 3)
    for t in ("a", "b"):
        for i in range(12):
            admin.produce(t, [Record(b"k%d" % (i % 2), b"v%d" % i, 1000 + i)], partition=i % 3)
    before_b = [(r.partition, r.offset, r.value) for r in admin.consume("b")]
    done = compact_job.run(url, now=True, delay_ms=0, spark=spark, min_partitions_for_spark=1)
    assert sorted((d["topic"], d["partition"]) for d in done if d["cleaned"]) == \
        [("a", 0), ("a", 1), ("a", 2)]
    for p in range(3):
        # offsets 0-3 per partition, keys alternating by the write's number: the latest of
        # each key below the head (offset 3), and the head
        got = [(r.offset, r.key) for r in admin.consume("a", p)]
        assert got == [(o, b"k%d" % ((p + 3 * o) % 2)) for o in (1, 2, 3)]
    assert [(r.partition, r.offset, r.value) for r in admin.consume("b")] == before_b
    assert all(not d["cleaned"] for d in compact_job.run(url, now=True, delay_ms=0, spark=spark,
                                                         min_partitions_for_spark=1))
