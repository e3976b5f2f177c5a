"""Retention for a whole kafkalog cluster, spread over partitions with Spark.

    spark-submit jobs/retention.py --cluster URL [--dry-run] [--now-ms MS] [--min-partitions-for-spark N]

Planning (reading each segment's largest timestamp and size) runs on the executors, one task per
group of partitions; the driver then raises every log start offset in ONE metadata entry, and the
file deletions fan out again. A run killed at any point is finished by the next one. The rule
itself is ``pyspark_kafkalog.maintenance.retention.retention``, the same as ``kafkalog retention``.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import asdict

from _common import run_and_report, spark_fan_out, spark_session
from pyspark_kafkalog.cluster.cluster import Cluster
from pyspark_kafkalog.maintenance.retention import retention
from pyspark_kafkalog.errors import OfflineLogDirError


def run(url: str, *, dry_run: bool = False, now_ms=None, spark=None,
        min_partitions_for_spark: int = 64) -> list:
    """The plans applied, as dicts. A log dir that could not be reached raises
    ``OfflineLogDirError`` once the rest is done; its ``done`` holds those dicts then."""
    try:
        plans = retention(Cluster(url, create=False), dry_run=dry_run, now_ms=now_ms,
                          fan_out=spark_fan_out(spark, min_partitions_for_spark))
    except OfflineLogDirError as exc:
        exc.done = [asdict(p) for p in exc.done]
        raise
    return [asdict(p) for p in plans]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cluster", required=True)
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--now-ms", type=int, default=None)
    parser.add_argument("--min-partitions-for-spark", type=int, default=64)
    args = parser.parse_args(argv)
    spark = spark_session("kafkalog-retention")
    return run_and_report("retention", lambda: run(
        args.cluster, dry_run=args.dry_run, now_ms=args.now_ms, spark=spark,
        min_partitions_for_spark=args.min_partitions_for_spark),
        lambda plans: f"{len(plans)} partitions trimmed, "
                      f"{sum(len(p['segments']) for p in plans)} segments, "
                      f"{sum(p['bytes'] for p in plans)} bytes"
                      f"{' (dry run)' if args.dry_run else ''}")


if __name__ == "__main__":
    sys.exit(main())
