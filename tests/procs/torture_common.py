"""Shared by the cluster torture tests and their child processes (tests/procs/cluster_child.py).

Every record a child writes has a unique key (writer incarnation, call number, index) and a value
derived from the key alone, so the parent can tell for any record it reads whether some writer
produced it, acknowledged or not.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Iterator, List, Tuple

TOPIC_A, TOPIC_B = "torture-a", "torture-b"        # B has a tiny retention.bytes
TOPICS = (TOPIC_A, TOPIC_B)
PARTITIONS = 3
ALL_TPS: List[Tuple[str, int]] = [(t, p) for t in TOPICS for p in range(PARTITIONS)]
TOPIC_CONFIGS = {
    TOPIC_A: {"segment.bytes": "2048", "index.interval.bytes": "256"},
    TOPIC_B: {"segment.bytes": "2048", "index.interval.bytes": "256", "retention.bytes": "6000"},
}

HERE = Path(__file__).resolve().parent          # tests/procs
TESTS = HERE.parent
CHILD = HERE / "cluster_child.py"


def child_env() -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS.parent), str(TESTS)])}


def child_cmd(*args) -> list:
    return [sys.executable, str(CHILD), *map(str, args)]


def value_for(key: bytes) -> bytes:
    h = hashlib.blake2b(key, digest_size=16)
    return h.hexdigest().encode() * (1 + h.digest()[0] % 6)


def make_key(wid: str, call: int, j: int) -> bytes:
    return f"{wid}/{call}/{j}".encode()


def now_ms() -> int:
    return int(time.time() * 1000)


def emit(obj) -> None:
    """One JSON line on stdout, flushed: for writers an ack, printed only after success."""
    sys.stdout.write(json.dumps(obj, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def complete_json_lines(path) -> Iterator[dict]:
    """The lines of a child's output that were written whole (a kill can cut the last one)."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return
    for line in text.split("\n")[:-1]:           # the part after the last newline is cut
        try:
            yield json.loads(line)
        except ValueError:
            continue


def log_to_stderr() -> None:
    """The child's log lines on stderr, with its pid (the parent shows them when a check fails)."""
    import logging
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format=f"%(asctime)s {os.getpid()} %(levelname)s %(name)s: %(message)s")


def serve_coordinator(root, token, lease_ms, **options) -> None:
    """A coordinator child's main loop: serve (no scheduled maintenance, no metrics port) until
    SIGTERM, printing {"serving": holder, ...} once it runs and {"stopped": holder, ...} after a
    clean stop; ``options`` go to ``Coordinator``."""
    import signal
    from pyspark_kafkalog.cluster.cluster import Cluster
    from pyspark_kafkalog.coordinator.config import CoordinatorConfig
    from pyspark_kafkalog.coordinator.service import Coordinator

    c = Coordinator(Cluster(root, create=False, fsync=False), CoordinatorConfig.of(
        lease_ms=int(lease_ms), maintenance=False, metrics_port=None, **options), token=token)
    signal.signal(signal.SIGTERM, lambda *_: c.request_stop())
    c.start()
    emit({"serving": c.holder, "pid": os.getpid(), "epoch": c.epoch})
    try:
        while not c.wait(0.5):
            pass
    finally:
        c.stop()
    emit({"stopped": c.holder, "reason": c.exit_reason})
