"""Cleanup, retention and expiry never delete or hide acknowledged data (issue: cleanup deleted a
committed segment above a high watermark held back by an older open reservation).

Garbage is only what the metadata names as garbage (docs/protocol.md §7), and expiry is judged on
the storage's clock (§3), so writers with skewed clocks, writers stopped between reserve and
commit, and cleaners running in loops leave every acknowledged record readable. Real processes
(tests/procs/safety_child.py); KAFKALOG_SAFETY_ROUNDS scales the process test.
"""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pyspark_kafkalog.admin import Admin
from pyspark_kafkalog.cluster.actions import Abort
from pyspark_kafkalog.client.consumer import iter_records
from pyspark_kafkalog.client.producer import Producer
from pyspark_kafkalog.format.records import Record

HERE = Path(__file__).resolve().parents[1]          # tests/
CHILD = HERE / "procs" / "safety_child.py"
ROUNDS = int(os.environ.get("KAFKALOG_SAFETY_ROUNDS", "5"))
DAY_MS = 86_400_000


pytestmark = pytest.mark.slow   # cleaners, stoppers and skewed clocks as processes (~13 s)


def env() -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parent), str(HERE)])}


def spawn(*args) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(CHILD), *map(str, args)], env=env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def read_line(proc: subprocess.Popen) -> dict:
    line = proc.stdout.readline()
    assert line, proc.stderr.read()
    return json.loads(line)


def lines(text: str):
    return [json.loads(x) for x in text.splitlines() if x.strip()]


def all_records(a: Admin):
    state = a.cluster.state()
    out = {}
    for p in range(a.cluster.state().topics["s"]["partitions"]):
        view = a.cluster.partition_view("s", p, state)
        for r in iter_records(view, view.log_start_offset):
            out[(p, r.offset)] = r.key.decode()
    return out


def new_cluster(tmp_path, partitions=2, configs=None) -> str:
    root = str(tmp_path / "kl")
    Admin(root).create_topic("s", partitions, configs=configs or {"segment.bytes": "4096"})
    return root


def test_cleanup_keeps_committed_data_above_a_held_high_watermark(tmp_path):
    """The reported steps: A reserves 0-2 and writes, B produces 3-4 and commits, cleanup runs,
    A commits: all five records are there."""
    root = new_cluster(tmp_path, partitions=1)
    a = Admin(root, create=False)
    prod_a = Producer(a.cluster)
    recs_a = [Record(b"a%d" % i, b"x", 1) for i in range(3)]
    pending = prod_a.write({("s", 0): prod_a.encode("s", recs_a)})
    b = Admin(root, create=False)
    assert [m.offset for m in b.produce("s", [Record(b"b0", b"y", 1), Record(b"b1", b"y", 1)],
                                        partition=0)] == [3, 4]
    removed = Admin(root, create=False).cleanup()
    assert removed["segments"] == [] and removed["dirs"] == []
    assert (Path(root) / "logdir-0" / "s-0" / f"{3:020d}.log").exists()
    prod_a.commit([pending])
    got = all_records(Admin(root, create=False))
    assert got == {(0, 0): "a0", (0, 1): "a1", (0, 2): "a2", (0, 3): "b0", (0, 4): "b1"}


def test_cleanup_still_removes_aborted_segments(tmp_path):
    root = new_cluster(tmp_path, partitions=1)
    a = Admin(root, create=False)
    prod = Producer(a.cluster)
    pending = prod.write({("s", 0): prod.encode("s", [Record(b"k", b"v", 1)])})
    a.cluster.submit([Abort(txns=[pending.txn], reason="test")])
    a.produce("s", [Record(b"k2", b"v", 1)], partition=0)
    seg = Path(root) / "logdir-0" / "s-0" / f"{0:020d}.log"
    assert seg.exists()
    removed = a.cleanup()
    assert removed["segments"] == ["logdir-0/s-0/00000000000000000000"] and not seg.exists()
    assert all_records(a) == {(0, 1): "k2"}


@pytest.mark.parametrize("skew_ms", [DAY_MS, -DAY_MS])
def test_skewed_writer_holds_the_high_watermark_no_longer_than_its_timeout(tmp_path, skew_ms):
    """A writer whose clock is a day off reserves and is killed: a process with a right clock
    aborts its reservation once it is older than its timeout on the storage's clock, not a day
    later (ahead), and not at once (behind)."""
    root = new_cluster(tmp_path, partitions=1)
    timeout_ms = 1500
    dier = spawn("dier", root, "w-skewed", skew_ms, timeout_ms)
    try:
        assert "reserved" in read_line(dier)
    finally:
        dier.kill()
        dier.wait()
    a = Admin(root, create=False)
    reserved_at = time.monotonic()
    acks = a.produce("s", [Record(b"after", b"v", 1)], partition=0)
    assert acks[0].offset == 3
    assert a.cluster.state().partition("s", 0).high_watermark == 0   # held back, for now
    if time.monotonic() - reserved_at < timeout_ms / 1000 * 0.5:
        assert a.cluster.expired_txns() == []       # not aborted early by a -1 day deadline
    while not a.cluster.expired_txns():
        assert time.monotonic() - reserved_at < 60, "the reservation never expired"
        time.sleep(0.05)
    a.cleanup()
    assert a.cluster.state().partition("s", 0).high_watermark == 4
    assert all_records(a) == {(0, 3): "after"}


def test_skewed_writer_commits_and_is_not_aborted_early(tmp_path):
    """A writer whose clock is a day behind is inside its timeout by the storage's clock:
    other writers and cleaners running meanwhile do not abort it, and its commit applies."""
    root = new_cluster(tmp_path, partitions=1)
    go = tmp_path / "go"
    holder = spawn("holder", root, "w-behind", -DAY_MS, 60_000, go)
    assert "reserved" in read_line(holder)
    a = Admin(root, create=False)
    a.produce("s", [Record(b"x", b"v", 1)], partition=0)
    a.cleanup()
    a.retention()
    go.touch()
    out, err = holder.communicate(timeout=60)
    assert holder.returncode == 0, err
    assert [r["ack"][2] for r in lines(out)] == ["w-behind-0-0", "w-behind-0-1", "w-behind-0-2"]
    assert set(all_records(a).values()) == {"w-behind-0-0", "w-behind-0-1", "w-behind-0-2", "x"}


def test_acknowledged_records_survive_cleaners_stoppers_and_skewed_clocks(tmp_path):
    """Real processes, several rounds: producers (one clock a day ahead, one a day behind, one
    right) commit all the time; holders reserve and are stopped with SIGSTOP (some past their
    timeout, some not) and resumed to commit; cleaners (one with a clock a day ahead) run
    cleanup and retention in loops. At the end, every acknowledged record is readable, once."""
    rnd = random.Random(13)
    root = new_cluster(tmp_path, configs={"segment.bytes": "2048",
                                          "retention.ms": str(7 * DAY_MS)})
    stop = tmp_path / "stop"
    procs = [spawn("producer", root, f"p{i}", skew, 3000, stop)
             for i, skew in enumerate([0, DAY_MS, -DAY_MS])]
    procs += [spawn("cleaner", root, skew, stop) for skew in (0, DAY_MS)]
    holder_out = []
    try:
        for rnd_i in range(ROUNDS):
            go = tmp_path / f"go-{rnd_i}"
            skew = rnd.choice([0, DAY_MS, -DAY_MS])
            holder = spawn("holder", root, f"h{rnd_i}", skew, 2000, go)
            assert "reserved" in read_line(holder)
            holder.send_signal(signal.SIGSTOP)
            time.sleep(rnd.choice([0.2, 2.5]))       # sometimes past its timeout
            holder.send_signal(signal.SIGCONT)
            go.touch()
            out, err = holder.communicate(timeout=120)
            assert holder.returncode == 0, err
            holder_out += lines(out)
            time.sleep(0.3)
    finally:
        stop.touch()
        outs = []
        for p in procs:
            try:
                out, err = p.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                p.kill()
                out, err = p.communicate()
            outs.append((p.returncode, out, err))
    acked = {}
    for rc, out, err in outs:
        assert rc == 0, err
        for msg in lines(out):
            assert "tb" not in msg or msg["typed"], msg
            if "ack" in msg:
                part, off, key = msg["ack"]
                acked[(part, off)] = key
    for msg in holder_out:
        assert "tb" not in msg or msg["typed"], msg
        if "ack" in msg:
            part, off, key = msg["ack"]
            acked[(part, off)] = key
    assert len(acked) > 20
    a = Admin(root, create=False)
    a.cleanup()
    got = all_records(a)
    missing = {k: v for k, v in acked.items() if got.get(k) != v}
    assert not missing, f"{len(missing)} acknowledged records lost, e.g. {list(missing.items())[:5]}"
    assert len(set(got.values())) == len(got)       # no record twice
