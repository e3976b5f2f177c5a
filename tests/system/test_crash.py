"""kill -9 at random points while appending: acknowledged records survive, and the next writer
or ``recover`` repairs whatever the dead process left, by itself."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from procs.appender import CONFIG, batch, batch_records
from pyspark_kafkalog.format.columnar import decode_records
from pyspark_kafkalog.log.partition import PartitionLog
from pyspark_kafkalog.storage import open_storage

SCALE = int(os.environ.get("KAFKALOG_FUZZ_SCALE", "1"))
HERE = Path(__file__).resolve().parents[1]          # tests/


pytestmark = pytest.mark.slow   # kill -9 at random points while appending (~6 s)


def _run_and_kill(root: Path, start_batch: int, rng: random.Random):
    proc = subprocess.Popen([sys.executable, str(HERE / "procs" / "appender.py"), str(root),
                             str(start_batch)], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(
                                [str(HERE.parent), str(HERE)])})
    time.sleep(rng.uniform(0.3, 1.2))
    proc.send_signal(signal.SIGKILL)
    out, _ = proc.communicate()
    acks = []
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3:         # a line cut by the kill is not an ack
            acks.append(tuple(map(int, parts)))
    return acks


def _check(root: Path, acked: dict):
    storage = open_storage(str(root))
    log = PartitionLog(storage, "crash-0", CONFIG)
    by_offset = {}
    for seg in log.segments:
        for r in decode_records(storage.read(seg.log_path)):
            assert r.offset not in by_offset, f"offset {r.offset} appears twice"
            by_offset[r.offset] = r
    for i, (first, last) in acked.items():
        expected = batch_records(i)
        got = [by_offset.get(o) for o in range(first, last + 1)]
        assert all(g is not None for g in got), f"acked batch {i} ({first}..{last}) lost"
        assert [(g.key, g.value) for g in got] == [(e.key, e.value) for e in expected]
    for seg in log.segments:
        assert (storage.read(seg.path(".index")), storage.read(seg.path(".timeindex"))) == \
            seg.rebuilt_indexes(), f"{seg} indexes differ from a rebuild"
    offsets = sorted(by_offset)
    assert offsets == list(range(offsets[0], offsets[-1] + 1)) if offsets else True


def test_kill_9_during_appends_loses_no_acknowledged_record(tmp_path):
    rng = random.Random(int(os.environ.get("KAFKALOG_SEED", "0")) or None)
    acked: dict = {}
    next_batch = 0
    kills = 0
    for round_ in range(8 * SCALE):
        acks = _run_and_kill(tmp_path, next_batch, rng)
        kills += 1
        for i, first, last in acks:
            acked[i] = (first, last)
        next_batch = max([next_batch] + [i + 1 for i, _, _ in acks]) + 1000
        if round_ % 2 == 0:
            PartitionLog(open_storage(str(tmp_path)), "crash-0", CONFIG).recover()
        # on odd rounds nobody helps: the next appender's first append must repair the tail
    assert len(acked) > 20, "the appender barely ran: the test would prove nothing"
    # one last writer: its append repairs whatever the last kill left
    r = PartitionLog(open_storage(str(tmp_path)), "crash-0", CONFIG).append([batch(next_batch)])
    acked[next_batch] = (r.first_offset, r.last_offset)
    _check(tmp_path, acked)
    print(f"{kills} kills, {len(acked)} acknowledged batches")
