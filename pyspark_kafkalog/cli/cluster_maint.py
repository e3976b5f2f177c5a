"""Deleting data and looking at storage: ``delete-records`` (KIP-107, kafka-delete-records.sh's
JSON file), ``retention``, ``log-dirs --describe`` and ``cleanup``."""
from __future__ import annotations

import json
import sys
from typing import List, Tuple

from ..errors import InvalidConfigError
from .cluster_common import OUTPUT_HELP, columns, emit_rows, open_admin
from .progress import Progress

DELETE_COLUMNS = columns("topic", "partition", "low_watermark", "error", "message")
DRY_DELETE_COLUMNS = columns("topic", "partition", "offset", "log_start_offset", "high_watermark",
                             "low_watermark", "error", "message")
RETENTION_COLUMNS = columns("topic", "partition", "log_start_offset", "new_log_start_offset",
                            "segments", "bytes", "reason")
LOG_DIR_COLUMNS = columns("log_dir", "topic", "partition", "size")
CLEANUP_COLUMNS = columns("kind", "path")
RETENTION_CHUNK = 25          # partitions per retention step (one metadata entry each)
OFFSET_FILE_EXAMPLE = '{"partitions": [{"topic": "t", "partition": 0, "offset": 3}], "version": 1}'


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
        "log-dirs", parents=parents, help="bytes per partition per log dir",
        description="kafka-log-dirs.sh --describe: the size of each partition replica.",
        epilog=OUTPUT_HELP + " Columns: log_dir, topic, partition, size (bytes of readable "
               "segments).")
    p.add_argument("--describe", action="store_true", required=True, help="(required)")
    p.set_defaults(run=run_log_dirs)

    p = sub.add_parser(
        "cleanup", parents=parents, help="remove what dead or aborted writers left behind",
        description="Abort expired transactions, then delete aborted and orphaned segments, "
                    "segments below log start offsets, deleted topics' directories and old "
                    "temporary files (docs/protocol.md, section 7). Safe to run at any time.",
        epilog=OUTPUT_HELP + " Columns: kind (segment, dir or temp), path.")
    p.set_defaults(run=run_cleanup)


# -- delete-records --------------------------------------------------------------------------

def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def load_offset_json(path: str) -> List[Tuple[Tuple[str, int], int]]:
    """Read kafka-delete-records.sh's file (``-``: stdin) and check it (parse_offset_json)."""
    where = "--offset-json-file " + ("(stdin)" if path == "-" else path)
    try:
        if path == "-":
            text = sys.stdin.read()
        else:
            with open(path, encoding="utf-8") as f:
                text = f.read()
    except OSError as exc:
        raise InvalidConfigError(f"cannot read {where}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise InvalidConfigError(f"{where}: not UTF-8 text") from None
    return parse_offset_json(text, where)


def parse_offset_json(text: str, where: str = "offset JSON"
                      ) -> List[Tuple[Tuple[str, int], int]]:
    """kafka-delete-records.sh's format as ``[((topic, partition), offset)]`` in file order.
    ``version`` may be left out (Kafka reads it as 1); anything else wrong is an
    InvalidConfigError naming the field: a missing or misspelt key, a non-integer partition or
    offset, an empty list, a partition listed twice (Kafka's rule too)."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidConfigError(f"{where}: not valid JSON ({exc.msg} at line {exc.lineno} "
                                 f"column {exc.colno}); expected {OFFSET_FILE_EXAMPLE}") from None
    if not isinstance(doc, dict):
        raise InvalidConfigError(f"{where}: expected a JSON object like {OFFSET_FILE_EXAMPLE}")
    unknown = sorted(set(doc) - {"partitions", "version"})
    if unknown:
        raise InvalidConfigError(f"{where}: unknown field(s) {', '.join(unknown)}")
    version = doc.get("version", 1)
    if not _is_int(version) or version != 1:
        raise InvalidConfigError(f"{where}: unsupported version {version!r} (only 1)")
    if "partitions" not in doc:
        raise InvalidConfigError(f"{where}: missing the \"partitions\" list")
    parts = doc["partitions"]
    if not isinstance(parts, list):
        raise InvalidConfigError(f"{where}: \"partitions\" must be a list")
    if not parts:
        raise InvalidConfigError(f"{where}: \"partitions\" is empty: nothing to delete")
    out, seen = [], {}
    for i, e in enumerate(parts):
        at = f"{where}: partitions[{i}]"
        if not isinstance(e, dict):
            raise InvalidConfigError(f"{at}: expected an object {{\"topic\", \"partition\", "
                                     "\"offset\"}")
        unknown = sorted(set(e) - {"topic", "partition", "offset"})
        if unknown:
            raise InvalidConfigError(f"{at}: unknown field(s) {', '.join(unknown)}")
        for name in ("topic", "partition", "offset"):
            if name not in e:
                raise InvalidConfigError(f"{at}: missing \"{name}\"")
        if not isinstance(e["topic"], str) or not e["topic"]:
            raise InvalidConfigError(f"{at}: \"topic\" must be a non-empty string")
        if not _is_int(e["partition"]):
            raise InvalidConfigError(f"{at}: \"partition\" must be an integer")
        if not _is_int(e["offset"]):
            raise InvalidConfigError(f"{at}: \"offset\" must be an integer (-1: the high "
                                     "watermark)")
        tp = (e["topic"], e["partition"])
        if tp in seen:
            raise InvalidConfigError(f"{at}: {tp[0]}-{tp[1]} is listed twice (first at "
                                     f"partitions[{seen[tp]}])")
        seen[tp] = i
        out.append((tp, e["offset"]))
    return out


def _predict(admin, entries) -> List[dict]:
    """What ``delete_records_before`` would answer now: the ``set_log_start`` action replayed on
    a copy of the current state (the rule of docs/protocol.md, section 6), nothing appended."""
    from ..cluster.state import tp_key
    cluster = admin.cluster
    before = cluster.state()
    state = before.copy()
    request = {tp_key(*tp): off for tp, off in entries if off >= -1}
    seq = state.seq + 1
    state.apply(seq, {"version": 1, "timestamp": cluster.now_ms(), "actions": [
        {"op": "set_log_start", "partitions": request, "principal": cluster.principal}]})
    answers = state.results[seq][0].get("partitions", {})
    rows = []
    for (topic, partition), offset in entries:
        ps = before.partition(topic, partition)
        row = {"topic": topic, "partition": partition, "offset": offset,
               "log_start_offset": ps.log_start_offset if ps else None,
               "high_watermark": ps.high_watermark if ps else None,
               "low_watermark": None, "error": None, "message": None}
        answer = answers.get(tp_key(topic, partition))
        if answer is None:       # rejected before the request, as delete_records does
            row.update(error="OFFSET_OUT_OF_RANGE", message=f"invalid offset {offset} for "
                       f"{topic}-{partition}: must be >= 0, or -1 for the high watermark")
        elif answer.get("error", "NONE") != "NONE":
            row.update(error=answer["error"], message=answer.get("message") or None)
        else:
            row["low_watermark"] = answer["low_watermark"]
        rows.append(row)
    return rows


def run_delete_records(args) -> int:
    entries = load_offset_json(args.offset_json_file)
    admin = open_admin(args, "delete-records")
    if args.dry_run:
        rows = _predict(admin, entries)
        emit_rows(args, DRY_DELETE_COLUMNS, rows)
    else:
        result = admin.delete_records_before(dict(entries))
        rows = []
        for tp, _ in entries:
            r = result[tp]
            rows.append({"topic": tp[0], "partition": tp[1],
                         "low_watermark": None if r.error else r.low_watermark,
                         "error": r.error.error_name if r.error else None,
                         "message": str(r.error) if r.error else None})
        emit_rows(args, DELETE_COLUMNS, rows)
    return 1 if any(r["error"] for r in rows) else 0


# -- retention -------------------------------------------------------------------------------

def run_retention(args) -> int:
    from ..admin import TopicPartition
    admin = open_admin(args, "retention")
    cluster = admin.cluster
    tps = cluster.partitions(cluster.state())
    now = cluster.storage_now_ms()   # segment times are judged by one clock, not ours
    plans = []
    with Progress(len(tps), "retention") as bar:
        for i in range(0, len(tps), RETENTION_CHUNK):
            chunk = [TopicPartition(*tp) for tp in tps[i:i + RETENTION_CHUNK]]
            plans += admin.retention(dry_run=args.dry_run, now_ms=now, partitions=chunk)
            bar.advance(len(chunk))
    rows = [{"topic": p.topic, "partition": p.partition, "log_start_offset": p.log_start_offset,
             "new_log_start_offset": p.new_log_start_offset, "segments": list(p.segments),
             "bytes": p.bytes, "reason": p.reason} for p in plans]
    if args.json:
        emit_rows(args, RETENTION_COLUMNS, rows)
        return 0
    emit_rows(args, RETENTION_COLUMNS, [dict(r, segments=len(r["segments"])) for r in rows])
    verb = "Would delete" if args.dry_run else "Deleted"
    if rows:
        sys.stdout.write(f"{verb} {sum(len(r['segments']) for r in rows)} segment(s), "
                         f"{sum(r['bytes'] for r in rows)} bytes, from {len(rows)} "
                         f"partition(s).\n")
    else:
        sys.stdout.write(f"Nothing to delete: no segment is past retention in "
                         f"{len(tps)} partition(s).\n")
    return 0


# -- log-dirs, cleanup -----------------------------------------------------------------------

def run_log_dirs(args) -> int:
    admin = open_admin(args, "log-dirs")
    rows = [{"log_dir": d, "topic": tp.topic, "partition": tp.partition, "size": size}
            for d, parts in sorted(admin.describe_log_dirs().items())
            for tp, size in sorted(parts.items())]
    emit_rows(args, LOG_DIR_COLUMNS, rows)
    return 0


def run_cleanup(args) -> int:
    admin = open_admin(args, "cleanup")
    removed = admin.cleanup()
    # an unknown dir is one cleanup cannot prove is a deleted topic's: it is kept and shown
    kinds = {"segments": "segment", "dirs": "dir", "temp": "temp", "unknown_dirs": "kept-unknown"}
    rows = [{"kind": kinds.get(k, k), "path": path}
            for k, paths in removed.items() for path in paths]
    emit_rows(args, CLEANUP_COLUMNS, rows)
    if not args.json and not rows:
        sys.stdout.write("Nothing to clean up.\n")
    return 0
