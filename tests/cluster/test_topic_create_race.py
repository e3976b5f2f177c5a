"""Two processes create the same topic at the same instant: exactly one wins, the loser never
removes the winner's files, and the topic is usable. Half of the rounds recreate a topic whose
deletion was cut short, so both creators see leftovers of the old incarnation.
KAFKALOG_CREATE_RACE_ROUNDS scales the test (default 50)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pyspark_kafkalog.admin import Admin
from pyspark_kafkalog.format.checkpoint import parse_partition_metadata
from pyspark_kafkalog.format.records import Record

HERE = Path(__file__).resolve().parents[1]          # tests/
ROUNDS = int(os.environ.get("KAFKALOG_CREATE_RACE_ROUNDS", "50"))
PARTITIONS = 3


@pytest.mark.slow
def test_one_winner_and_a_usable_topic(tmp_path):
    root = tmp_path / "kl"
    admin = Admin(str(root))
    admin.create_topic("seed")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parent), str(HERE)])}
    procs = [subprocess.Popen([sys.executable, str(HERE / "procs" / "create_child.py"),
                               str(root), str(PARTITIONS)], env=env, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
             for _ in range(2)]
    try:
        for i in range(ROUNDS):
            _round(root, admin, procs, i, tmp_path / f"go-{i}")
    finally:
        for p in procs:
            p.stdin.close()
            p.wait(timeout=120)
    assert all(p.returncode == 0 for p in procs)


def _round(root, admin, procs, i, go):
    topic = f"race-{i % 5}" if i % 2 else f"fresh-{i}"
    if i % 2 and topic in admin.list_topics():
        meta = {p: (root / "logdir-0" / f"{topic}-{p}" / "partition.metadata").read_bytes()
                for p in range(PARTITIONS)}
        admin.delete_topic(topic)
        for p, data in meta.items():   # what a deleter killed half-way leaves behind
            d = root / "logdir-0" / f"{topic}-{p}"
            d.mkdir()
            (d / "partition.metadata").write_bytes(data)
            (d / f"{0:020d}.log").write_bytes(b"")
    for p in procs:
        p.stdin.write(f"{topic} {go}\n")
        p.stdin.flush()
    for p in procs:                     # both replayed the cluster and wait for the same cue
        assert p.stdout.readline().strip() == "ready", (i, p.poll())
    go.touch()
    outs = [json.loads(p.stdout.readline()) for p in procs]
    winners = [o["won"] for o in outs if "won" in o]
    assert len(winners) == 1 and sum("lost" in o for o in outs) == 1, (i, outs)
    desc = admin.describe_topic(topic)
    assert desc.topic_id == winners[0]
    for p in range(PARTITIONS):
        d = root / "logdir-0" / f"{topic}-{p}"
        assert parse_partition_metadata((d / "partition.metadata").read_text()) == winners[0]
        assert not (d / f"{0:020d}.log").exists() or (d / f"{0:020d}.log").stat().st_size
    acks = admin.produce(topic, [Record(b"k%d" % p, b"v", 1) for p in range(6)])
    got = sorted((r.partition, r.offset) for r in admin.consume(topic))
    assert got == sorted((a.partition, a.offset) for a in acks)
