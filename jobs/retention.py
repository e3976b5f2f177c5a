"""Retention for a whole kafkalog cluster, spread over partitions with Spark.

    spark-submit jobs/retention.py --cluster URL [--dry-run] [--now-ms MS] [--min-partitions-for-spark N]

Planning (reading each segment's largest timestamp and size) runs on the executors, one task per
group of partitions; the driver then raises every log start offset in ONE metadata entry, and the
file deletions fan out again. A run killed at any point is finished by the next one.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict

from _common import fan_out, spark_session
from pyspark_kafkalog.cluster.cluster import Cluster
from pyspark_kafkalog.cluster.maintenance import delete_below_log_start, plan_retention
from pyspark_kafkalog.cluster.checkpoints import sync_checkpoints
from pyspark_kafkalog.cluster.state import ClusterState, tp_key
from pyspark_kafkalog.log.segment import LogSegment


def run(url: str, *, dry_run: bool = False, now_ms=None, spark=None,
        min_partitions_for_spark: int = 64) -> list:
    cluster = Cluster(url, create=False)
    state = cluster.state()
    now = cluster.storage_now_ms() if now_ms is None else now_ms
    snap = state.to_snapshot()

    def plan(parts):
        c = Cluster(url, create=False)
        return [asdict(p) for p in plan_retention(c, ClusterState.from_snapshot(snap), now, parts)]

    plans = fan_out(spark, cluster.partitions(state), plan, min_partitions_for_spark)
    if dry_run or not plans:
        return plans
    _, state, results = cluster.submit([{
        "op": "set_log_start", "principal": None, "reason": "retention",
        "topic_ids": {p["topic"]: p["topic_id"] for p in plans if p["topic_id"]},
        "partitions": {tp_key(p["topic"], p["partition"]): p["new_log_start_offset"]
                       for p in plans}}])
    outcome = results[0].get("partitions", {})
    snap = state.to_snapshot()
    # a partition whose topic was deleted or recreated since planning is left alone
    by_tp = {(p["topic"], p["partition"]): p["segments"] for p in plans
             if outcome.get(tp_key(p["topic"], p["partition"]), {}).get("error") == "NONE"}

    def delete(parts):
        c = Cluster(url, create=False)
        st = ClusterState.from_snapshot(snap)
        done = []
        for topic, partition in parts:
            if st.partition(topic, partition) is None:
                continue
            d = c.partition_dir(topic, partition, state=st)
            for base in by_tp[(topic, partition)]:
                LogSegment(c.storage, d, base).delete()
            delete_below_log_start(c, st, topic, partition)
            done.append((topic, partition))
        return done

    done = fan_out(spark, sorted(by_tp), delete, min_partitions_for_spark)
    sync_checkpoints(cluster, state, done)
    return plans


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cluster", required=True)
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--now-ms", type=int, default=None)
    parser.add_argument("--min-partitions-for-spark", type=int, default=64)
    args = parser.parse_args(argv)
    spark = spark_session("kafkalog-retention")
    plans = run(args.cluster, dry_run=args.dry_run, now_ms=args.now_ms, spark=spark,
                min_partitions_for_spark=args.min_partitions_for_spark)
    for p in plans:
        print(json.dumps(p))
    print(f"retention: {len(plans)} partitions trimmed, {sum(len(p['segments']) for p in plans)} "
          f"segments, {sum(p['bytes'] for p in plans)} bytes{' (dry run)' if args.dry_run else ''}",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
