"""Quickstart: a Spark job on an embedded local cluster (./kafkalog-data, local[*]).

    python jobs/quickstart.py [--cluster ./kafkalog-data] [--keep]

It creates a topic, writes records with Spark (one atomic job commit), reads them back with a
timestamp filter (pushed down to the time index), runs DeleteRecords (KIP-107), reads again, and
shows that the files on storage are a real Kafka log dir (``kafkalog dump``).
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import start_afresh  # noqa: E402  (jobs/: run as a script or loaded by path)
from datetime import datetime, timedelta, timezone


def main(argv=None, spark=None) -> int:
    """``spark``: run in this session (tests share one) instead of starting one."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cluster", default="./kafkalog-data", help="cluster root (path or URL)")
    parser.add_argument("--keep", action="store_true",
                        help="keep what an earlier run left (by default a local cluster dir is "
                             "started afresh, so that every run tells the same story)")
    parser.add_argument("--fresh", action="store_true", help=argparse.SUPPRESS)   # the default
    args = parser.parse_args(argv)
    if not args.keep and "://" not in args.cluster:
        start_afresh(args.cluster)

    os.environ["PYSPARK_PYTHON"] = sys.executable          # workers run this interpreter
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession, functions as F

    import pyspark_kafkalog
    from pyspark_kafkalog.admin import Admin, TopicPartition
    from pyspark_kafkalog.cli.main import main as kafkalog

    own = spark is None
    if own:
        spark = (SparkSession.builder.master("local[*]").appName("kafkalog-quickstart")
                 .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
                 .config("spark.log.level", "ERROR")   # from the start, not after it
                 .getOrCreate())
    pyspark_kafkalog.register(spark, filter_pushdown=True)   # see docs/user-guide.md
    url = os.path.abspath(args.cluster) if "://" not in args.cluster else args.cluster
    topic = "clicks"

    admin = Admin(url)
    if topic not in admin.list_topics():
        admin.create_topic(topic, 3, configs={"segment.bytes": 64 * 1024})
        print(f"== created topic {topic!r} with 3 partitions in {url}")

    start = datetime(2026, 1, 1, tzinfo=timezone.utc)
    rows = [(f"user-{i % 7}", f"clicked button {i}", start + timedelta(minutes=i))
            for i in range(600)]
    df = (spark.createDataFrame(rows, "key string, value string, timestamp timestamp"))
    df.write.format("kafkalog").option("topic", topic).mode("append").save(url)
    hw = {p.partition: p.high_watermark for p in admin.describe_topic(topic).partitions}
    print(f"== wrote {len(rows)} records in one job; high watermarks per partition: {hw}")

    def read():   # with filter pushdown on, one new DataFrame per query
        return spark.read.format("kafkalog").option("subscribe", topic).load(url)

    cutoff = start + timedelta(hours=9)
    late = read().where(F.col("timestamp") >= F.lit(cutoff))
    print(f"== records with timestamp >= {cutoff:%Y-%m-%d %H:%M} (pushed down to the time index): "
          f"{late.count()} of {read().count()}")
    late.groupBy("partition").count().orderBy("partition").show()
    late.select(F.col("key").cast("string"), F.col("value").cast("string"), "partition",
                "offset", "timestamp").orderBy("timestamp").show(5, truncate=False)

    busiest = max(hw, key=hw.get)
    p0 = TopicPartition(topic, busiest)
    cut = hw[busiest] // 2
    result = admin.delete_records_before({p0: cut})[p0]
    print(f"== DeleteRecords {topic}-{busiest} before offset {cut}: low watermark now "
          f"{result.low_watermark} (error: {result.error})")
    first = (spark.read.format("kafkalog").option("assign", f'{{"{topic}":[{busiest}]}}')
             .load(url).agg(F.min("offset").alias("first"), F.count("*").alias("records"))
             .first())
    print(f"== {topic}-{busiest} now starts at offset {first['first']} with {first['records']} "
          "records")

    logdir = os.path.join(url, "logdir-0", f"{topic}-{busiest}") if "://" not in url else None
    if logdir:
        segs = sorted(f for f in os.listdir(logdir) if f.endswith(".log"))
        print(f"== a real Kafka log dir: kafkalog dump --files {segs[-1]} (first lines)")
        kafkalog(["dump", "--files", os.path.join(logdir, segs[-1])])
    if own:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
