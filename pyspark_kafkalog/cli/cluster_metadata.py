"""``kafkalog --cluster URL metadata --verify | --repair [--dry-run]``: check the metadata log,
and the operator's explicit way past a bad entry (docs/protocol.md §2.1)."""
from __future__ import annotations

from .cluster_common import OUTPUT_HELP, columns, emit_rows, open_admin, say

PROBLEM_COLUMNS = columns("kind", "path", "message")
REPAIR_COLUMNS = columns("action", "path", "reason", "quarantined")
EXIT_PROBLEMS = 1


def add_parser(sub, parents) -> None:
    p = sub.add_parser(
        "metadata", parents=parents, help="verify or repair the metadata log",
        description="--verify reads every metadata entry and snapshot and reports malformed or "
                    "missing entries, snapshots that do not prove themselves, and snapshots "
                    "that differ from a replay of the entries; it changes nothing. --repair "
                    "quarantines each malformed entry under _kafkalog/quarantine/ and replaces "
                    "it with an empty entry, fills gaps with empty entries and deletes bad "
                    "snapshots: the actions of a replaced entry are lost (see "
                    "docs/protocol.md §2.1).",
        epilog=OUTPUT_HELP + " --verify columns: kind (malformed-entry, missing-entry, "
               "bad-snapshot, snapshot-mismatch), path, message; exit status 1 if any problem "
               "was found. --repair columns: action (replaced, created, deleted-snapshot), path, "
               "reason, quarantined.")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--verify", action="store_true", help="report problems, change nothing")
    g.add_argument("--repair", action="store_true", help="replace bad entries (see above)")
    p.add_argument("--dry-run", action="store_true", help="with --repair: show, change nothing")
    p.set_defaults(run=run_metadata)


def run_metadata(args) -> int:
    from ..maintenance.metadata_check import repair, verify
    from ..errors import InvalidConfigError
    if args.dry_run and not args.repair:
        raise InvalidConfigError("--dry-run goes with --repair")
    admin = open_admin(args, "metadata")
    metalog = admin.cluster.metalog
    if args.verify:
        report = verify(metalog)
        emit_rows(args, PROBLEM_COLUMNS, [{"kind": p.kind, "path": p.path, "message": p.message}
                                          for p in report.problems])
        if report.ok:
            say(args, f"The metadata log is sound: {report.entries} entries "
                      f"({report.first_entry}..{report.last_entry}), {report.snapshots} "
                      "snapshots.")
        return 0 if report.ok else EXIT_PROBLEMS
    done = repair(metalog, dry_run=args.dry_run)
    emit_rows(args, REPAIR_COLUMNS, [{"action": r.action, "path": r.path, "reason": r.reason,
                                      "quarantined": r.quarantined} for r in done])
    if not done:
        say(args, "Nothing to repair.")
    return 0


# -- features ----------------------------------------------------------------------------------

FEATURE_COLUMNS = columns("feature", "kind", "enabled", "supported", "description")


def add_features_parser(sub, parents) -> None:
    p = sub.add_parser(
        "features", parents=parents, help="list or enable protocol features",
        description="Protocol features (docs/protocol.md §2.3): a reader feature changes what "
                    "readers compute, and clients that lack it refuse to read; a writer feature "
                    "binds only writers, and clients that lack it refuse to write. --enable is "
                    "an explicit step, one metadata entry (none if the feature is on already); "
                    "features are never turned off.",
        epilog=OUTPUT_HELP + " Columns: feature, kind (reader or writer), enabled (in this "
               "cluster), supported (by this client), description. --enable with --json: "
               "those and changed (false when it was on already). A name this client does not "
               "implement is a user error (exit status 2).")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--list", action="store_true", help="the cluster's and this client's features")
    g.add_argument("--enable", metavar="NAME", help="turn a feature on for every client")
    p.set_defaults(run=run_features)


def run_features(args) -> int:
    from ..errors import InvalidConfigError
    if args.enable is not None and not args.enable.strip():
        raise InvalidConfigError("--enable needs a feature name (features --list shows them)")
    admin = open_admin(args, "features")
    if args.enable is not None:
        info = admin.enable_feature(args.enable)
        say(args, f"Enabled {info['kind']} feature {args.enable}." if info["changed"] else
            f"The {info['kind']} feature {args.enable} is enabled already; nothing was written.",
            {"feature": args.enable, **info})
        return 0
    rows = [{"feature": name, **info} for name, info in admin.features().items()]
    emit_rows(args, FEATURE_COLUMNS, rows)
    if not rows:
        say(args, "The cluster uses no protocol features, and this client knows none.")
    return 0
