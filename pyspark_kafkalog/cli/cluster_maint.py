"""Deleting data and looking at storage: ``delete-records`` (KIP-107, kafka-delete-records.sh's
JSON file), ``retention``, ``log-dirs --describe|--add|--remove`` and ``cleanup``."""
from __future__ import annotations

import sys
from typing import List

from ..maintenance.retention import offline_error
from ..client.offset_json import OFFSET_FILE_EXAMPLE, load_offset_json
from ..errors import InvalidConfigError, OfflineLogDirError
from .cluster_common import OUTPUT_HELP, columns, emit_rows, open_admin, parse_configs, say
from .progress import Progress

DELETE_COLUMNS = columns("topic", "partition", "low_watermark", "error", "message")
DRY_DELETE_COLUMNS = columns("topic", "partition", "offset", "log_start_offset", "high_watermark",
                             "low_watermark", "error", "message")
RETENTION_COLUMNS = columns("topic", "partition", "log_start_offset", "new_log_start_offset",
                            "segments", "bytes", "reason")
LOG_DIR_COLUMNS = columns("log_dir", "url", "topic", "partition", "size", "offset_lag",
                          "error")
CLEANUP_COLUMNS = columns("kind", "path")
RETENTION_CHUNK = 25          # partitions per retention step (one metadata entry each)


def add_parsers(sub, parents) -> None:
    p = sub.add_parser(
        "delete-records", parents=parents, help="delete records below offsets (KIP-107)",
        description="Raise partitions' log start offsets (kafka-delete-records.sh): records "
                    "below them become unreadable and whole segments below them are deleted.",
        epilog=OUTPUT_HELP + " Columns: topic, partition, low_watermark (the new log start "
               "offset), error (a Kafka error name, e.g. OFFSET_OUT_OF_RANGE or "
               "UNKNOWN_TOPIC_OR_PARTITION), message. --dry-run adds offset, log_start_offset and "
               "high_watermark and shows what would happen. Exit status 1 if any partition "
               "failed (or would fail).")
    p.add_argument("--offset-json-file", required=True, metavar="F",
                   help=f"JSON file ('-' for stdin): {OFFSET_FILE_EXAMPLE}; offset -1 means "
                        "the high watermark")
    p.add_argument("--dry-run", action="store_true", help="show what would be requested only")
    p.set_defaults(run=run_delete_records)

    p = sub.add_parser(
        "retention", parents=parents, help="delete segments past retention.ms / retention.bytes",
        description="Apply every topic's retention.ms (by each segment's largest timestamp) and "
                    "retention.bytes (per partition): whole segments only, the log start offset "
                    "moves to the first segment kept.",
        epilog=OUTPUT_HELP + " One row per partition trimmed (or to trim, with --dry-run): "
               "topic, partition, log_start_offset, new_log_start_offset, segments (base offsets; "
               "the count in the table), bytes, reason; the table ends with a one-line summary. A "
               "progress bar goes to stderr when it is a terminal and there are many partitions.")
    p.add_argument("--dry-run", action="store_true", help="plan only, delete nothing")
    p.set_defaults(run=run_retention)

    p = sub.add_parser(
        "log-dirs", parents=parents,
        help="describe log dirs, add one on another root, or remove one",
        description="--describe: each log dir's URL and the size of each partition replica in "
                    "it (kafka-log-dirs.sh --describe). --add: register a log dir at another "
                    "URL (another bucket, another disk) that topics' replicas are placed on "
                    "(docs/protocol.md, section 1.1); a URL whose storage lives in one process "
                    "only (memory://) is refused. --remove: unregister such a log dir once it "
                    "holds no replica.",
        epilog=OUTPUT_HELP + " --describe columns: log_dir, url, topic, partition, size (bytes "
               "of readable segments), offset_lag (how far the replica is behind the last "
               "stable offset, Kafka's offsetLag; 0 for the leader), error (KAFKA_STORAGE_ERROR "
               "for a log dir that cannot be read: its size is empty); a log dir without "
               "replicas has one row with topic, partition and size empty. A log dir that "
               "cannot be read is listed so, after the others, and then named on stderr with "
               "exit status 1. --add prints the new log dir (log_dir, url, directory_id with "
               "--json); --remove the removed one (log_dir, url, removed with --json).")
    act = p.add_mutually_exclusive_group(required=True)
    act.add_argument("--describe", action="store_true", help="each log dir and its replicas")
    act.add_argument("--add", metavar="URL",
                     help="register a log dir at URL: an empty directory, bucket or prefix "
                          "(or a log dir of this cluster never registered)")
    act.add_argument("--remove", metavar="NAME",
                     help="unregister the log dir NAME (logdir-<n>, or n) registered with --add, "
                          "which must hold no replica (move them with reassign-partitions "
                          "first); its files stay where they are")
    p.add_argument("--storage-option", action="append", default=[], metavar="K=V",
                   help="--add: an option for URL's storage (repeatable), e.g. "
                        "endpoint_url=http://host:9000. Recorded in the metadata log for every "
                        "client, so credentials are refused: give them to each process's "
                        "environment (for S3: AWS_* variables or ~/.aws)")
    p.set_defaults(run=run_log_dirs)

    p = sub.add_parser(
        "cleanup", parents=parents, help="remove what dead or aborted writers left behind",
        description="Abort expired transactions, then delete aborted and orphaned segments, "
                    "segments below log start offsets, deleted topics' directories and old "
                    "temporary files (docs/protocol.md, section 7); clean the compacted topics' "
                    "partitions that are due (section 4.2) and merge small segments (4.1). Safe "
                    "to run at any time.",
        epilog=OUTPUT_HELP + " Columns: kind (segment, dir, temp, kept-unknown, cleaned, merged, "
               "covered, metadata), path.")
    p.add_argument("--compact-now", action="store_true",
                   help="clean every compacted partition that has dirty records, whether or not "
                        "its min.cleanable.dirty.ratio or max.compaction.lag.ms says it is due")
    p.set_defaults(run=run_cleanup)


# -- delete-records --------------------------------------------------------------------------

def _dry_run_rows(admin, entries) -> List[dict]:
    predicted = admin.delete_records_dry_run(dict(entries))
    rows = []
    for tp, offset in entries:
        d = predicted[tp]
        rows.append({"topic": tp[0], "partition": tp[1], "offset": offset,
                     "log_start_offset": d.log_start_offset, "high_watermark": d.high_watermark,
                     **_answer_columns(d.result)})
    return rows


def _answer_columns(r) -> dict:
    return {"low_watermark": None if r.error else r.low_watermark,
            "error": r.error.error_name if r.error else None,
            "message": str(r.error) if r.error else None}


def run_delete_records(args) -> int:
    entries = load_offset_json(args.offset_json_file)
    admin = open_admin(args, "delete-records")
    if args.dry_run:
        rows = _dry_run_rows(admin, entries)
        emit_rows(args, DRY_DELETE_COLUMNS, rows)
    else:
        result = admin.delete_records_before(dict(entries))
        rows = [{"topic": tp[0], "partition": tp[1], **_answer_columns(result[tp])}
                for tp, _ in entries]
        emit_rows(args, DELETE_COLUMNS, rows)
    return 1 if any(r["error"] for r in rows) else 0


# -- retention -------------------------------------------------------------------------------

def run_retention(args) -> int:
    from ..admin import TopicPartition
    admin = open_admin(args, "retention")
    cluster = admin.cluster
    tps = cluster.partitions(cluster.state())
    now = cluster.storage_now_ms()   # segment times are judged by one clock, not ours
    plans, offline = [], []
    with Progress(len(tps), "retention", enabled=False if args.json else None) as bar:
        for i in range(0, len(tps), RETENTION_CHUNK):
            chunk = [TopicPartition(*tp) for tp in tps[i:i + RETENTION_CHUNK]]
            try:
                plans += admin.retention(dry_run=args.dry_run, now_ms=now, partitions=chunk)
            except OfflineLogDirError as exc:   # the rest was done: shown, then the error
                plans += exc.done
                offline.append(exc)
            bar.advance(len(chunk))
    _report_retention(args, plans, len(tps))
    if offline:   # one error for all the chunks
        raise offline_error("retention", {k: v for e in offline for k, v in e.offline.items()},
                            [u for e in offline for u in e.skipped], plans)
    return 0


def _report_retention(args, plans, partitions: int) -> None:
    rows = [{"topic": p.topic, "partition": p.partition, "log_start_offset": p.log_start_offset,
             "new_log_start_offset": p.new_log_start_offset, "segments": list(p.segments),
             "bytes": p.bytes, "reason": p.reason} for p in plans]
    if args.json:
        emit_rows(args, RETENTION_COLUMNS, rows)
        return
    emit_rows(args, RETENTION_COLUMNS, [dict(r, segments=len(r["segments"])) for r in rows])
    verb = "Would delete" if args.dry_run else "Deleted"
    if rows:
        sys.stdout.write(f"{verb} {sum(len(r['segments']) for r in rows)} segment(s), "
                         f"{sum(r['bytes'] for r in rows)} bytes, from {len(rows)} "
                         f"partition(s).\n")
    else:
        sys.stdout.write(f"Nothing to delete: no segment is past retention in "
                         f"{partitions} partition(s).\n")


# -- log-dirs, cleanup -----------------------------------------------------------------------

def run_log_dirs(args) -> int:
    if args.add is None and args.storage_option:
        raise InvalidConfigError("--storage-option applies to --add only")
    options = parse_configs(args.storage_option, "--storage-option")
    if args.remove is not None and not args.remove.strip():
        raise InvalidConfigError("--remove needs a log dir name (logdir-<n>, or n)")
    admin = open_admin(args, "log-dirs")
    if args.add is not None:
        d = admin.add_log_dir(args.add, options)
        say(args, f"Added log dir {d.log_dir} at {d.url}.",
            {"log_dir": d.log_dir, "url": d.url, "directory_id": d.directory_id})
        return 0
    if args.remove is not None:
        d = admin.remove_log_dir(args.remove)
        say(args, f"Removed log dir {d.log_dir}; its files at {d.url} are left as they are.",
            {"log_dir": d.log_dir, "url": d.url, "removed": True})
        return 0
    try:   # an offline log dir is listed as such, after the others: shown, then the error
        sizes, offline = admin.describe_log_dirs(), None
    except OfflineLogDirError as exc:
        sizes, offline = exc.done, exc
    lags = admin.replica_lags()
    rows = []
    for d in admin.list_log_dirs():
        parts = sorted(sizes.get(d.log_dir, {}).items())
        lag = lags.get(d.log_dir, {})
        error = ("KAFKA_STORAGE_ERROR" if offline is not None and d.log_dir in offline.offline
                 else None)
        rows += [{"log_dir": d.log_dir, "url": d.url, "topic": tp.topic,
                  "partition": tp.partition, "size": size, "offset_lag": lag.get(tp),
                  "error": error} for tp, size in parts] or \
            [{"log_dir": d.log_dir, "url": d.url, "topic": None, "partition": None,
              "size": None, "offset_lag": None, "error": error}]
    emit_rows(args, LOG_DIR_COLUMNS, rows)
    if offline is not None:
        sys.stdout.flush()
        raise offline
    return 0


def run_cleanup(args) -> int:
    admin = open_admin(args, "cleanup")
    try:
        removed, offline = admin.cleanup(compact_now=args.compact_now), None
    except OfflineLogDirError as exc:   # the other log dirs were cleaned: shown, then the error
        removed, offline = exc.done, exc
    # an unknown dir is one cleanup cannot prove is a deleted topic's: it is kept and shown
    kinds = {"segments": "segment", "dirs": "dir", "temp": "temp", "unknown_dirs": "kept-unknown",
             "cleaned": "cleaned", "merged": "merged", "covered": "covered",
             "metadata": "metadata"}
    rows = [{"kind": kinds.get(k, k), "path": path}
            for k, paths in removed.items() for path in paths]
    emit_rows(args, CLEANUP_COLUMNS, rows)
    if not args.json and not rows:
        sys.stdout.write("Nothing to clean up.\n")
    if offline is not None:
        raise offline
    return 0
