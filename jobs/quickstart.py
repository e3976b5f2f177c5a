"""Quickstart: produce a few records into a local Kafka log dir, then dump them back.

    python jobs/quickstart.py [--log-dir ./kafkalog-data]

Everything it writes is a real Kafka log dir (``meta.properties``, checkpoints, ``quickstart-0/``
with ``.log``/``.index``/``.timeindex``), readable by Kafka's own ``kafka-dump-log``.
"""
from __future__ import annotations

import argparse
import base64
import io
import json
import sys
import time

from pyspark_kafkalog.cli.main import main as kafkalog


def _produce(log_dir: str, lines: list) -> int:
    stdin, sys.stdin = sys.stdin, io.StringIO("".join(json.dumps(x) + "\n" for x in lines))
    try:
        return kafkalog(["produce", "--log-dir", log_dir, "--topic", "quickstart",
                         "--partition", "0", "--compression", "lz4"])
    finally:
        sys.stdin = stdin


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--log-dir", default="./kafkalog-data")
    args = parser.parse_args(argv)
    now = int(time.time() * 1000)
    records = [{"key": base64.b64encode(f"user-{i % 3}".encode()).decode(),
                "value": base64.b64encode(f"clicked button {i}".encode()).decode(),
                "headers": [{"key": "source", "value": base64.b64encode(b"quickstart").decode()}],
                "timestamp": now + i} for i in range(5)]
    print(f"== producing {len(records)} records to {args.log_dir}/quickstart-0 (offsets assigned):")
    rc = _produce(args.log_dir, records)
    if rc:
        return rc
    seg = f"{args.log_dir.rstrip('/')}/quickstart-0/00000000000000000000.log"
    print(f"\n== kafkalog dump --deep-iteration --print-data-log --files {seg}")
    return kafkalog(["dump", "--deep-iteration", "--print-data-log", "--files", seg])


if __name__ == "__main__":
    sys.exit(main())
