"""Streaming quickstart: a Structured Streaming pipeline on an embedded local cluster.

    python jobs/quickstart_streaming.py [--cluster ./kafkalog-data] [--keep]

Events land in topic ``events``; a streaming query upper-cases them into ``events-upper``,
exactly once, committing its progress to the consumer group ``quickstart`` (so ``kafkalog
groups --describe`` shows its lag). The query is stopped and restarted from its checkpoint in
the middle, and at the end every event is in ``events-upper`` once. docs/streaming.md has more.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import start_afresh  # noqa: E402  (jobs/: run as a script or loaded by path)


def main(argv=None, spark=None) -> int:
    """``spark``: run in this session (tests share one) instead of starting one."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cluster", default="./kafkalog-data", help="cluster root (path or URL)")
    parser.add_argument("--checkpoint", default=None,
                        help="the query's checkpoint dir (default: <cluster>-checkpoints)")
    parser.add_argument("--keep", action="store_true",
                        help="keep what an earlier run left (by default a local cluster dir is "
                             "started afresh, so that every run tells the same story)")
    parser.add_argument("--fresh", action="store_true", help=argparse.SUPPRESS)   # the default
    args = parser.parse_args(argv)
    local = "://" not in args.cluster
    checkpoint = args.checkpoint or (args.cluster.rstrip("/") + "-checkpoints")
    if not args.keep and local:
        for d in (args.cluster, checkpoint):
            start_afresh(d)

    os.environ["PYSPARK_PYTHON"] = sys.executable          # workers run this interpreter
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    import pyspark_kafkalog
    from pyspark_kafkalog.admin import Admin
    from pyspark_kafkalog.cli.main import main as kafkalog

    own = spark is None
    if own:
        spark = (SparkSession.builder.master("local[*]").appName("kafkalog-streaming-quickstart")
                 .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
                 .config("spark.sql.shuffle.partitions", "2")
                 .config("spark.log.level", "ERROR")   # from the start, not after it
                 .getOrCreate())
    pyspark_kafkalog.register(spark)
    url = os.path.abspath(args.cluster) if local else args.cluster
    admin = Admin(url)
    for topic in ("events", "events-upper"):
        if topic not in admin.list_topics():
            admin.create_topic(topic, 3)
            print(f"== created topic {topic!r} with 3 partitions in {url}")
    produced = len(list(admin.consume("events")))

    def start():
        events = (spark.readStream.format("kafkalog").option("subscribe", "events")
                  .option("startingOffsets", "earliest")
                  .option("maxOffsetsPerTrigger", 150)          # bounded micro-batches
                  .option("kafka.group.id", "quickstart")       # lag in `kafkalog groups`
                  .load(url))
        return (events.selectExpr("key", "upper(CAST(value AS STRING)) AS value")
                .writeStream.format("kafkalog").option("topic", "events-upper")
                .option("checkpointLocation", checkpoint)
                .trigger(processingTime="0 seconds").start(url))

    def produce(n):
        nonlocal produced
        admin.produce("events", [(f"user-{i % 5}".encode(), f"event {i}".encode())
                                 for i in range(produced, produced + n)])
        produced += n

    query = start()
    print(f"== started a streaming query: events -> upper(value) -> events-upper "
          f"(checkpoint {checkpoint})")
    for _ in range(2):
        produce(200)
        query.processAllAvailable()
        batches = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
        print(f"== produced {produced} events so far; micro-batch sizes (at most 150): "
              f"{batches[-4:]}")
    query.stop()
    produce(100)
    print("== stopped the query, produced 100 more, restarting it from its checkpoint")
    query = start()
    query.processAllAvailable()
    upper = list(admin.consume("events-upper"))
    values = [r.value.decode() for r in upper]
    print(f"== events: {produced}, events-upper: {len(values)}, distinct: {len(set(values))} "
          f"(every event exactly once: {len(values) == len(set(values)) == produced})")
    print("== the query's consumer group (its lag is 0 once caught up):")
    kafkalog(["--cluster", url, "groups", "--describe", "--group", "quickstart"])
    query.stop()
    if own:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
