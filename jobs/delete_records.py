"""DeleteRecords (KIP-107) for a kafkalog cluster, under spark-submit.

    spark-submit jobs/delete_records.py --cluster URL --offset-json-file F [--dry-run]
    spark-submit jobs/delete_records.py --cluster URL --consumed-by GROUP [--topic T] [--dry-run]

The first form takes kafka-delete-records.sh's JSON file. The second deletes what a downstream
consumer group has already consumed (KIP-107's motivation): every partition of the group's topics
is trimmed to the group's committed offset. All log start offsets move in one metadata entry; the
file deletions fan out over partitions with Spark when there are many.
"""
from __future__ import annotations

import argparse
import json
import sys

from _common import fan_out, spark_session
from pyspark_kafkalog.cluster.checkpoints import sync_checkpoints
from pyspark_kafkalog.cluster.cluster import Cluster
from pyspark_kafkalog.cluster.groups import GroupStore, topic_ids
from pyspark_kafkalog.cluster.maintenance import delete_below_log_start
from pyspark_kafkalog.cluster.state import ClusterState, split_key, tp_key
from pyspark_kafkalog.cli.cluster_maint import parse_offset_json


def read_offset_json(text: str) -> dict:
    """kafka-delete-records.sh's file, checked exactly as ``kafkalog delete-records`` checks it."""
    return dict(parse_offset_json(text))


def offsets_consumed_by(cluster: Cluster, group: str, topic=None) -> dict:
    """The group's offsets, without those of a topic deleted (or re-created) since: deleting
    below one of those would delete a new topic's records that nobody consumed."""
    committed = GroupStore(cluster.storage).fetch(group, topic_ids(cluster.state()))
    return {tp: om.offset for tp, om in committed.items() if topic is None or tp[0] == topic}


def run(url: str, offsets: dict, *, dry_run: bool = False, spark=None,
        min_partitions_for_spark: int = 64) -> dict:
    cluster = Cluster(url, create=False)
    if dry_run:
        state = cluster.state()
        out = {}
        for tp, off in offsets.items():
            ps = state.partition(*tp)
            out[tp] = ({"error": "UNKNOWN_TOPIC_OR_PARTITION"} if ps is None else
                       {"requested": off, "log_start_offset": ps.log_start_offset,
                        "high_watermark": ps.high_watermark})
        return out
    _, state, results = cluster.submit([{"op": "set_log_start", "principal": cluster.principal,
                                         "partitions": {tp_key(*tp): o for tp, o in offsets.items()}}])
    per = results[0].get("partitions", {})
    done = [split_key(k) for k, r in per.items() if r.get("error") == "NONE"]
    snap = state.to_snapshot()

    def delete(parts):
        c = Cluster(url, create=False)
        st = ClusterState.from_snapshot(snap)
        return [(tp, delete_below_log_start(c, st, *tp)) for tp in parts]

    fan_out(spark, done, delete, min_partitions_for_spark)
    sync_checkpoints(cluster, state, done)
    return {split_key(k): r for k, r in per.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cluster", required=True)
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--offset-json-file")
    src.add_argument("--consumed-by", metavar="GROUP")
    parser.add_argument("--topic", help="with --consumed-by: only this topic")
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--min-partitions-for-spark", type=int, default=64)
    args = parser.parse_args(argv)
    cluster = Cluster(args.cluster, create=False)
    if args.offset_json_file:
        with open(args.offset_json_file) as f:
            offsets = read_offset_json(f.read())
    else:
        offsets = offsets_consumed_by(cluster, args.consumed_by, args.topic)
    spark = spark_session("kafkalog-delete-records")
    results = run(args.cluster, offsets, dry_run=args.dry_run, spark=spark,
                  min_partitions_for_spark=args.min_partitions_for_spark)
    failed = 0
    for (topic, partition), r in sorted(results.items()):
        print(json.dumps({"topic": topic, "partition": partition, **r}))
        failed += r.get("error", "NONE") != "NONE"
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
