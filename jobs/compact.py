"""Log compaction for a whole kafkalog cluster, many partitions cleaned in parallel with Spark.

    spark-submit jobs/compact.py --cluster URL [--topic T ...] [--now] [--delay-ms MS]
        [--dedupe-buffer-size BYTES] [--min-partitions-for-spark N]

Each task takes a group of compacted partitions and, for each that is due (its dirty ratio at
min.cleanable.dirty.ratio, or its oldest dirty record past max.compaction.lag.ms; every one with
dirty records with --now), builds the offset map of its dirty section in the dedupe buffer,
cleans its segments into groups of up to segment.bytes and publishes them with one
clean_segments entry (docs/protocol.md §4.2). A run killed at any point is finished by the next
one. The rule itself is ``pyspark_kafkalog.maintenance.retention.compact``, the same the
coordinator's log cleaner and ``kafkalog cleanup`` run; this job is for clusters too large for
one process.
"""
from __future__ import annotations

import argparse
import sys

from _common import partition_pass, run_and_report, spark_session
from pyspark_kafkalog.maintenance.compaction import DEFAULT_DEDUPE_BUFFER_SIZE, CleanerSettings
from pyspark_kafkalog.maintenance.retention import compact


def run(url: str, *, topics=None, now: bool = False, delay_ms=None,
        dedupe_buffer_size: int = DEFAULT_DEDUPE_BUFFER_SIZE, spark=None,
        min_partitions_for_spark: int = 64) -> list:
    """What each compacted partition's pass did, as dicts. A log dir that could not be reached
    raises ``OfflineLogDirError`` once the rest is done; its ``done`` holds those dicts then.
    Each task's offset map takes ``dedupe_buffer_size`` bytes."""
    return partition_pass("compact", compact, url, topics=topics, spark=spark,
                          min_partitions_for_spark=min_partitions_for_spark, force=now,
                          delay_ms=delay_ms, settings=CleanerSettings(dedupe_buffer_size))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cluster", required=True)
    parser.add_argument("--topic", action="append", help="only these topics (repeatable)")
    parser.add_argument("--now", action="store_true",
                        help="clean every partition with dirty records, due or not")
    parser.add_argument("--delay-ms", type=int, default=None,
                        help="instead of each topic's file.delete.delay.ms")
    parser.add_argument("--dedupe-buffer-size", type=int, default=DEFAULT_DEDUPE_BUFFER_SIZE,
                        help="the offset map's bytes per task (log.cleaner.dedupe.buffer.size)")
    parser.add_argument("--min-partitions-for-spark", type=int, default=64)
    args = parser.parse_args(argv)
    spark = spark_session("kafkalog-compact")

    def summary(done):
        cleaned = [d for d in done if d["cleaned"]]
        return (f"{len(cleaned)} of {len(done)} compacted partitions cleaned, "
                f"{sum(d['bytes_read'] for d in cleaned)} bytes read, "
                f"{sum(d['bytes_written'] for d in cleaned)} bytes written, "
                f"{sum(len(d['deleted']) for d in done)} covered segments deleted")
    return run_and_report("compact", lambda: run(
        args.cluster, topics=args.topic, now=args.now, delay_ms=args.delay_ms,
        dedupe_buffer_size=args.dedupe_buffer_size, spark=spark,
        min_partitions_for_spark=args.min_partitions_for_spark), summary)


if __name__ == "__main__":
    sys.exit(main())
