"""``kafkalog``: the command line. Each subcommand lives in its own module; this one parses
arguments and turns typed errors into one line on stderr and a non-zero exit (no tracebacks for
user errors)."""
from __future__ import annotations

import argparse
import sys
from typing import List, Optional

from .. import __version__
from ..errors import KafkaLogError
from . import dump, produce, recover

EXIT_USER_ERROR = 2


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's own errors: same shape as ours
        self.print_usage(sys.stderr)
        print(f"kafkalog: error: {message}", file=sys.stderr)
        sys.exit(EXIT_USER_ERROR)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="kafkalog", description="Kafka log dirs on shared storage, no brokers.")
    parser.add_argument("--version", action="version", version=f"kafkalog {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for module in (dump, recover, produce):
        module.add_parser(sub)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "run", None):
        parser.print_help(sys.stderr)
        return EXIT_USER_ERROR
    try:
        return args.run(args) or 0
    except KafkaLogError as exc:
        print(f"kafkalog: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR
    except BrokenPipeError:  # `kafkalog dump … | head`
        return 0


if __name__ == "__main__":
    sys.exit(main())
