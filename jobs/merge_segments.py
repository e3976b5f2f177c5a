"""Segment merges for a whole kafkalog cluster, spread over partitions with Spark.

    spark-submit jobs/merge_segments.py --cluster URL [--topic T ...] [--lag-ms MS] [--delay-ms MS]
        [--min-partitions-for-spark N]

Each task takes a group of partitions and, for each, deletes what earlier merges cover once
file.delete.delay.ms has passed, merges runs of small committed segments into segments of up
to segment.bytes, and publishes each partition's merges with one merge_segments entry
(docs/protocol.md §4.1). A run killed at any point is finished by the next one. The rule itself
is ``pyspark_kafkalog.maintenance.retention.merge_segments``, the same as ``kafkalog cleanup``
runs; this job is for clusters too large for one process.
"""
from __future__ import annotations

import argparse
import sys

from _common import partition_pass, run_and_report, spark_session
from pyspark_kafkalog.maintenance.retention import merge_segments


def run(url: str, *, topics=None, lag_ms=None, delay_ms=None, spark=None,
        min_partitions_for_spark: int = 64) -> list:
    """What each partition's pass did, as dicts. A log dir that could not be reached raises
    ``OfflineLogDirError`` once the rest is done; its ``done`` holds those dicts then."""
    return partition_pass("merge_segments", merge_segments, url, topics=topics, spark=spark,
                          min_partitions_for_spark=min_partitions_for_spark, lag_ms=lag_ms,
                          delay_ms=delay_ms)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cluster", required=True)
    parser.add_argument("--topic", action="append", help="only these topics (repeatable)")
    parser.add_argument("--lag-ms", type=int, default=None,
                        help="instead of each topic's segment.merge.lag.ms")
    parser.add_argument("--delay-ms", type=int, default=None,
                        help="instead of each topic's file.delete.delay.ms")
    parser.add_argument("--min-partitions-for-spark", type=int, default=64)
    args = parser.parse_args(argv)
    spark = spark_session("kafkalog-merge-segments")

    def summary(done):
        runs = sum(len(d["merged"]) for d in done)
        return (f"{runs} runs merged in {sum(1 for d in done if d['merged'])} partitions, "
                f"{sum(sum(r[2] for r in d['merged']) for d in done)} segments into {runs}, "
                f"{sum(d['bytes_written'] for d in done)} bytes written, "
                f"{sum(len(d['deleted']) for d in done)} covered segments deleted")
    return run_and_report("merge_segments", lambda: run(
        args.cluster, topics=args.topic, lag_ms=args.lag_ms, delay_ms=args.delay_ms,
        spark=spark, min_partitions_for_spark=args.min_partitions_for_spark), summary)


if __name__ == "__main__":
    sys.exit(main())
