"""``kafkalog recover PARTITION_DIR``: Kafka's log recovery, on demand, reported as JSON."""
from __future__ import annotations

import json
import sys
from dataclasses import asdict

from ..errors import UnknownTopicOrPartitionError
from ..log.logdir import (LOG_START_CHECKPOINT, RECOVERY_POINT_CHECKPOINT,
                          REPLICATION_CHECKPOINT, LogDir, split_url)
from ..log.partition import PartitionLog, parse_partition_dir
from ..storage import open_storage
from .cluster_common import add_storage_config, refuse_cluster_dir, storage_options


def add_parser(sub) -> None:
    p = sub.add_parser("recover", help="validate a partition's segments, cut damage, rebuild indexes",
                       description="Validate every batch of a <topic>-<partition> directory, "
                                   "truncate at the first torn or corrupt batch (dropping later "
                                   "segments), rebuild .index/.timeindex as Kafka does, and print "
                                   "a JSON report.")
    p.add_argument("partition_dir", metavar="PARTITION_DIR", help="path or URL of <topic>-<partition>")
    p.add_argument("--dry-run", action="store_true", help="report only, change nothing")
    add_storage_config(p)
    p.set_defaults(run=run)


def run(args) -> int:
    parent, name = split_url(args.partition_dir)
    topic, partition = parse_partition_dir(name)
    if not args.dry_run:   # Kafka's recovery truncates in place: never on a cluster's segments
        refuse_cluster_dir(args.partition_dir, args, "recover",
                           f"kafkalog --cluster {{root}} repair --topic {topic} "
                           f"--partition {partition} (with --dry-run first; recover --dry-run "
                           "and dump only read and stay allowed)")
    storage = open_storage(parent, **storage_options(args))
    if name not in storage.list_dirs(""):
        raise UnknownTopicOrPartitionError(f"no partition directory {args.partition_dir!r}")
    log = PartitionLog(storage, name)
    report = log.recover(apply=not args.dry_run)
    if not args.dry_run:
        _clamp_checkpoints(LogDir(storage), (topic, partition), report.log_end_offset)
    out = {
        "partition_dir": args.partition_dir,
        "dry_run": bool(args.dry_run),
        "log_end_offset": report.log_end_offset,
        "truncated_bytes": report.truncated_bytes,
        "deleted_segments": [p.rsplit("/", 1)[-1] for p in report.deleted_segments],
        "segments": [{k: v for k, v in asdict(s).items() if k not in ("extra", "index_rebuilt")}
                     | {"segment": s.segment.rsplit("/", 1)[-1]} for s in report.segments],
    }
    json.dump(out, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


def _clamp_checkpoints(logdir: LogDir, tp, log_end_offset: int) -> None:
    """After a cut, no checkpoint may claim offsets that no longer exist."""
    for name in (REPLICATION_CHECKPOINT, RECOVERY_POINT_CHECKPOINT, LOG_START_CHECKPOINT):
        value = logdir.read_checkpoint(name).get(tp)
        if value is not None and value > log_end_offset:
            logdir.update_checkpoint(name, {tp: log_end_offset})
