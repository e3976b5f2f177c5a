"""``kafkalog --cluster URL groups``: kafka-consumer-groups.sh for offsets committed on storage."""
from __future__ import annotations

from ..client.groups import validate_group_id
from ..errors import InvalidConfigError
from ..format.checkpoint import validate_topic_name
from .cluster_common import (OUTPUT_HELP, chosen_action, columns, emit_rows, open_admin, require,
                             say)

RESETS = {"to_earliest": "--to-earliest", "to_latest": "--to-latest",
          "to_datetime": "--to-datetime", "shift_by": "--shift-by"}
OPTIONS = {"group": "--group", "topic": "--topic", "dry_run": "--dry-run", "execute": "--execute",
           **RESETS}
DESCRIBE_COLUMNS = columns("group", "topic", "partition", "current_offset", "log_end_offset",
                           "lag")
RESET_COLUMNS = columns("group", "topic", "partition", "current_offset", "new_offset")


def add_parser(sub, parents) -> None:
    p = sub.add_parser(
        "groups", parents=parents, help="list, describe, reset and delete consumer groups",
        description="Consumer groups' committed offsets (kafka-consumer-groups.sh's options).",
        epilog=OUTPUT_HELP + " --list: one group per line ({\"group\"}). --describe: group, "
               "topic, partition, current_offset, log_end_offset (the high watermark), lag. "
               "--reset-offsets: group, topic, partition, current_offset (before), new_offset; "
               "it commits unless --dry-run. --delete: {\"group\", \"deleted\"}.")
    act = p.add_mutually_exclusive_group(required=True)
    act.add_argument("--list", action="store_true", help="list groups")
    act.add_argument("--describe", action="store_true", help="offsets and lag of --group")
    act.add_argument("--reset-offsets", action="store_true",
                     help="set --group's offsets for --topic (one --to-*/--shift-by)")
    act.add_argument("--delete", action="store_true", help="delete --group's offsets")
    p.add_argument("--group", metavar="G")
    p.add_argument("--topic", metavar="T", help="--reset-offsets: every partition of T")
    to = p.add_mutually_exclusive_group()
    to.add_argument("--to-earliest", action="store_true", help="the log start offsets")
    to.add_argument("--to-latest", action="store_true", help="the high watermarks")
    to.add_argument("--to-datetime", type=int, metavar="MS",
                    help="the first offsets with a timestamp >= MS (epoch milliseconds)")
    to.add_argument("--shift-by", type=int, metavar="N",
                    help="current offsets + N (may be negative), kept within the log")
    run_mode = p.add_mutually_exclusive_group()
    run_mode.add_argument("--dry-run", action="store_true", help="show the new offsets only")
    run_mode.add_argument("--execute", action="store_true",
                          help="commit the new offsets (the default; for kafka-consumer-groups "
                               "habits)")
    p.set_defaults(run=run)


def run(args) -> int:
    action, flag = chosen_action(
        args, {"list": (), "describe": ("group",), "reset_offsets": (
            "group", "topic", "dry_run", "execute", *RESETS), "delete": ("group",)}, OPTIONS)
    if action != "list":
        require(args, flag, ("group", "--group G"))
        validate_group_id(args.group)
    return globals()[f"_{action}"](args)


def _list(args) -> int:
    admin = open_admin(args, "groups --list")
    groups = admin.list_groups()
    for g in groups:
        say(args, g, {"group": g})
    if not groups and not args.json:   # rather than nothing at all
        say(args, "No consumer groups.")
    return 0


def _describe(args) -> int:
    admin = open_admin(args, "groups --describe")
    rows = [{"group": args.group, "topic": r.topic, "partition": r.partition,
             "current_offset": r.committed_offset, "log_end_offset": r.log_end_offset,
             "lag": r.lag} for r in admin.describe_group(args.group)]
    emit_rows(args, DESCRIBE_COLUMNS, rows)
    if not rows and not args.json:
        say(args, f"Group {args.group} has no offsets for existing topics.")
    return 0


def _reset_offsets(args) -> int:
    require(args, "--reset-offsets", ("topic", "--topic T"))
    validate_topic_name(args.topic)
    if args.to_earliest:
        kwargs = {"to": "earliest"}
    elif args.to_latest:
        kwargs = {"to": "latest"}
    elif args.to_datetime is not None:
        if args.to_datetime < 0:
            raise InvalidConfigError(f"--to-datetime must be >= 0 (epoch ms), got "
                                     f"{args.to_datetime}")
        kwargs = {"to": "timestamp", "timestamp_ms": args.to_datetime}
    elif args.shift_by is not None:
        kwargs = {"to": "shift", "shift": args.shift_by}
    else:
        raise InvalidConfigError("--reset-offsets needs one of --to-earliest, --to-latest, "
                                 "--to-datetime MS, --shift-by N")
    admin = open_admin(args, "groups --reset-offsets")
    before = admin.list_group_offsets(args.group)
    new = admin.reset_group_offsets(args.group, args.topic, dry_run=args.dry_run, **kwargs)
    rows = [{"group": args.group, "topic": tp.topic, "partition": tp.partition,
             "current_offset": before[tp].offset if tp in before else None, "new_offset": off}
            for tp, off in sorted(new.items())]
    emit_rows(args, RESET_COLUMNS, rows)
    return 0


def _delete(args) -> int:
    admin = open_admin(args, "groups --delete")
    admin.delete_group(args.group)
    say(args, f"Deleted group {args.group}.", {"group": args.group, "deleted": True})
    return 0
