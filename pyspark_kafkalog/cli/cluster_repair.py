"""``kafkalog --cluster URL repair --topic T [--partition P] [--dry-run]``: check every batch of
a topic's committed segments and replace damaged ones, never in place (docs/protocol.md §7.1).

This is what a CRC error from ``consume`` points to. The raw ``recover`` refuses a cluster's
partitions: Kafka's recovery truncates the file readers map and drops the good segments after it.
"""
from __future__ import annotations

import sys

from .cluster_common import OUTPUT_HELP, columns, emit_rows, non_negative, open_admin

REPAIR_COLUMNS = columns("topic", "partition", "segment", "action", "lost_offsets",
                         "records_lost", "error")


def add_parser(sub, parents) -> None:
    p = sub.add_parser(
        "repair", parents=parents, help="replace damaged committed segments (never in place)",
        description="Validate every batch (CRC, size, offsets) of the committed segments of a "
                    "topic's partitions. A damaged segment is replaced, under the same name and "
                    "by an atomic replace (a new file: readers of the old one are safe), by its "
                    "intact batches, each run of lost offsets becoming one empty batch that "
                    "readers step over; indexes that disagree with their log are rebuilt; "
                    "committed offsets no file holds (a machine crash took an unflushed write's "
                    "files) get a new segment of one such empty batch. "
                    "Nothing is truncated or rewritten in place. Reports the offsets lost, as "
                    "Spark's failOnDataLoss would (docs/protocol.md, section 7.1).",
        epilog=OUTPUT_HELP + " One row per segment replaced (action replace), created for "
               "offsets no file held (action create) or whose indexes are rebuilt (action "
               "indexes), or that would be, with --dry-run: topic, "
               "partition, segment (the .log file under the cluster root), lost_offsets "
               "(FIRST-LAST ranges; JSON: [[first, last], ...], inclusive), records_lost, error "
               "(what was wrong). The table ends with a one-line summary per partition that "
               "lost records.")
    p.add_argument("--topic", required=True, metavar="T")
    p.add_argument("--partition", type=int, metavar="P", help="one partition (default: all)")
    p.add_argument("--dry-run", action="store_true", help="report only, change nothing")
    p.set_defaults(run=run_repair)


def run_repair(args) -> int:
    from ..format.checkpoint import validate_topic_name
    validate_topic_name(args.topic)
    non_negative(args.partition, "--partition")
    admin = open_admin(args, "repair")
    results = admin.repair_partition(args.topic, args.partition, dry_run=args.dry_run)
    rows = []
    for r in results:
        for s in r.changed:
            lost = [[x.first_offset, x.last_offset] for x in s.lost]
            rows.append({"topic": r.topic, "partition": r.partition, "segment": s.path,
                         "action": s.action, "records_lost": s.records_lost, "error": s.error,
                         "lost_offsets": lost if args.json else
                         ",".join(f"{a}-{b}" for a, b in lost)})
    emit_rows(args, REPAIR_COLUMNS, rows)
    if args.json:
        return 0
    scanned = sum(len(r.segments) for r in results)
    if not rows:
        sys.stdout.write(f"No damage found: {scanned} segment(s) of {len(results)} "
                         "partition(s) checked.\n")
        return 0
    would = "would be" if args.dry_run else "were"
    for r in results:
        if r.lost:
            ranges = ", ".join(f"{x.first_offset} to {x.last_offset}" for x in r.lost)
            sys.stdout.write(f"{r.topic}-{r.partition}: {r.records_lost} record(s) {would} "
                             f"lost, offsets {ranges}.\n")
    changed = sum(len(r.changed) for r in results)
    verb = "Would repair" if args.dry_run else "Repaired"
    sys.stdout.write(f"{verb} {changed} of {scanned} segment(s) checked.\n")
    return 0
