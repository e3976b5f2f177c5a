"""``kafkalog``: the command line. Each subcommand lives in its own module; this one parses
arguments and turns typed errors into one line on stderr and a non-zero exit (no tracebacks for
user errors).

Global options come before the subcommand: ``--cluster URL`` (the kafkalog cluster the cluster
commands work on), ``--cluster-config FILE``, ``--principal P`` and ``--json``. The cluster
commands also accept them after the subcommand.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import List, Optional

from .. import __version__
from ..errors import KafkaLogError
from ..progress import observed
from . import (cluster_data, cluster_groups, cluster_maint, cluster_metadata, cluster_topics,
               dump, produce, recover)
from . import cluster_configs, cluster_reassign, cluster_repair, coordinator
from .cluster_common import common_parent
from .progress import Bars

EXIT_USER_ERROR = 2
EXIT_DATA_ERROR = 1

EPILOG = """\
Log-dir commands: dump, recover, produce --log-dir DIR.
Cluster commands (need --cluster URL): topics, configs, produce, consume, offsets,
delete-records, retention, groups, log-dirs, reassign-partitions, cleanup, repair, metadata,
features, coordinator.

Output of the cluster commands: an aligned table for people; with --json one JSON object per
line (one per table row; topics --describe: one per topic). consume always prints JSON lines.
Exit status: 0 on success; 2 for a user error (a bad option or bad input: one line on stderr,
nothing changed); 1 for trouble with the data or the storage (corruption found, a cluster that
needs a newer client, a write that lost to another, storage unavailable; also delete-records
when a partition failed, dump when it found a problem, metadata --verify when the log is not
sound, coordinator --status when no coordinator is active or it does not answer, retention,
cleanup and log-dirs --describe when a log dir cannot be read, after doing the others).
`kafkalog COMMAND --help` describes each command's columns.
"""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's own errors: same shape as ours
        self.print_usage(sys.stderr)
        print(f"kafkalog: error: {message}", file=sys.stderr)
        sys.exit(EXIT_USER_ERROR)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="kafkalog", description="Kafka log dirs on shared storage, no brokers.",
                     epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"kafkalog {__version__}")
    parser.add_argument("--cluster", metavar="URL", default=None,
                        help="the kafkalog cluster: a storage URL (path, file://, s3://, ...)")
    parser.add_argument("--cluster-config", metavar="FILE", default=None,
                        help="client settings for the cluster: transaction.timeout.ms, "
                             "kafkalog.principal, storage.* (see conf/cluster.properties)")
    parser.add_argument("--principal", metavar="P", default=None,
                        help="principal for ACL checks (default $KAFKALOG_PRINCIPAL, else "
                             "User:<login>)")
    parser.add_argument("--json", dest="global_json", action="store_true",
                        help="JSON lines instead of tables")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    common = [common_parent()]
    for module in (dump, recover):
        module.add_parser(sub)
    produce.add_parser(sub, common)
    cluster_topics.add_parser(sub, common)
    cluster_data.add_consume_parser(sub, common)
    cluster_data.add_offsets_parser(sub, common)
    cluster_maint.add_parsers(sub, common)
    cluster_groups.add_parser(sub, common)
    cluster_repair.add_parser(sub, common)
    cluster_metadata.add_parser(sub, common)
    cluster_metadata.add_features_parser(sub, common)
    coordinator.add_parser(sub, common)
    cluster_reassign.add_parser(sub, common)
    cluster_configs.add_parser(sub, common)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "run", None):
        parser.print_help(sys.stderr)
        return EXIT_USER_ERROR
    args.json = bool(getattr(args, "json", False) or args.global_json)
    bars = Bars(sys.stderr) if not args.json else None   # drawn only on a terminal
    try:
        with observed(bars):
            try:
                return args.run(args) or 0
            finally:
                if bars is not None:
                    bars.close()      # erased before anything else is printed
    except KafkaLogError as exc:
        print(f"kafkalog: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR if exc.user_error else EXIT_DATA_ERROR
    except BrokenPipeError:  # `kafkalog dump … | head`
        _discard_stdout()
        return 0
    except KeyboardInterrupt:  # Ctrl-C: quiet, with the shell's status for SIGINT, unless it
        _discard_stdout()      # is the command's normal end (consume --follow sets 0)
        return getattr(args, "sigint_status", 130)


def _discard_stdout() -> None:
    """Output still buffered cannot be delivered any more (or must not block the exit): point
    stdout at /dev/null so the interpreter's final flush neither fails nor waits for a reader."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # no real stdout (tests, embedding)
        pass


if __name__ == "__main__":
    sys.exit(main())
