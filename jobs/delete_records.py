"""DeleteRecords (KIP-107) for a kafkalog cluster, under spark-submit.

    spark-submit jobs/delete_records.py --cluster URL --offset-json-file F [--dry-run]
    spark-submit jobs/delete_records.py --cluster URL --consumed-by GROUP [--topic T] [--dry-run]

The first form takes kafka-delete-records.sh's JSON file. The second deletes what a downstream
consumer group has already consumed (KIP-107's motivation): every partition of the group's topics
is trimmed to the group's committed offset, and a topic recreated since is left alone. All log
start offsets move in one metadata entry; the file deletions fan out over partitions with Spark
when there are many. --dry-run prints per partition the log start offset, the high watermark and
the answer the request would get, and changes nothing. The rule itself is
``pyspark_kafkalog.maintenance.retention.delete_records``, the same as ``kafkalog delete-records``.
"""
from __future__ import annotations

import argparse
import json
import sys

from _common import spark_fan_out, spark_session
from pyspark_kafkalog.cluster.cluster import Cluster
from pyspark_kafkalog.client.groups import consumed_offsets
from pyspark_kafkalog.maintenance.retention import delete_records, delete_records_dry_run
from pyspark_kafkalog.client.offset_json import load_offset_json, parse_offset_json
from pyspark_kafkalog.errors import InvalidConfigError


def read_offset_json(text: str) -> dict:
    """kafka-delete-records.sh's file, checked exactly as ``kafkalog delete-records`` checks it."""
    return dict(parse_offset_json(text))


def consumed_by(cluster: Cluster, group: str, topic=None):
    """The group's offsets, and the ids of the topics they belong to: deleting records is
    refused for a topic recreated after this (its records were never consumed)."""
    return consumed_offsets(cluster, [group], None if topic is None else [topic])


def offsets_consumed_by(cluster: Cluster, group: str, topic=None) -> dict:
    """The group's offsets, without those of a topic deleted (or re-created) since: deleting
    below one of those would delete a new topic's records that nobody consumed."""
    return consumed_by(cluster, group, topic)[0]


def _answer(r) -> dict:
    return ({"error": "NONE", "low_watermark": r.low_watermark} if r.error is None
            else {"error": r.error.error_name, "message": str(r.error)})


def run(url: str, offsets: dict, *, dry_run: bool = False, spark=None,
        min_partitions_for_spark: int = 64, topic_ids=None) -> dict:
    cluster = Cluster(url, create=False)
    if dry_run:
        out = {}
        for tp, d in delete_records_dry_run(cluster, offsets, topic_ids=topic_ids).items():
            where = ({} if d.log_start_offset is None else
                     {"log_start_offset": d.log_start_offset, "high_watermark": d.high_watermark})
            out[tp] = {"requested": d.offset, **where, **_answer(d.result)}
        return out
    results = delete_records(cluster, offsets, topic_ids=topic_ids,
                             fan_out=spark_fan_out(spark, min_partitions_for_spark))
    return {tp: _answer(r) for tp, r in results.items()}


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
    ids = None
    if args.offset_json_file:
        try:
            offsets = dict(load_offset_json(args.offset_json_file))
        except InvalidConfigError as exc:
            print(f"delete_records.py: {exc}", file=sys.stderr)
            return 2
    else:
        offsets, ids = consumed_by(cluster, args.consumed_by, args.topic)
    spark = spark_session("kafkalog-delete-records")
    results = run(args.cluster, offsets, dry_run=args.dry_run, spark=spark,
                  min_partitions_for_spark=args.min_partitions_for_spark, topic_ids=ids)
    failed = 0
    for (topic, partition), r in sorted(results.items()):
        print(json.dumps({"topic": topic, "partition": partition, **r}))
        failed += r.get("error", "NONE") != "NONE"
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
