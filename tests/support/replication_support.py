"""Replication driven in process (tests/cluster/test_replication.py and the tests built on it): a
cluster with two roots, a replicator on a test clock, and the checks they share."""
from __future__ import annotations

import hashlib
import random
from pathlib import Path

from pyspark_kafkalog.admin import Admin
from pyspark_kafkalog.cluster.lease import acquire, new_holder_id
from pyspark_kafkalog.coordinator.replicator import Replicator
from pyspark_kafkalog.format.records import Record

LAG_MS = 1_000


def seed_with_start(n: int, start: int) -> int:
    return next(s for s in range(1000) if random.Random(s).randrange(n) == start)


class Clock:
    def __init__(self):
        self.ms = 1_000_000

    def __call__(self) -> int:
        return self.ms


def setup(tmp_path, partitions=2, configs=None):
    admin = Admin(str(tmp_path / "root"), fsync=False)
    admin.add_log_dir(str(tmp_path / "second"))
    admin.cluster.placement_random = random.Random(seed_with_start(2, 0))
    admin.create_topic("t", partitions, 2, configs or {})
    lease = acquire(admin.cluster, new_holder_id(), "127.0.0.1:1", 60_000)
    clock = Clock()
    rep = Replicator(admin.cluster, lambda: lease.epoch, replica_lag_time_max_ms=LAG_MS,
                     clock_ms=clock)
    return admin, rep, clock


def produce(admin, n, start=0, partition=0, acks="1", **kw):
    """acks=1 by default here: these tests step the replicator by hand, and an acks=all write
    would wait for a copy nobody makes."""
    return admin.produce("t", [Record(b"k%d" % i, b"v%d" % i) for i in range(start, start + n)],
                         partition=partition, acks=acks, **kw)


def seen(admin, partition=0):
    return [r.value for r in admin.consume("t") if r.partition == partition]


def rep_state(admin, p=0):
    return admin.cluster.state().partition("t", p).replication


def digests(d: Path):
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(d.iterdir())
            if f.suffix in (".log", ".index", ".timeindex")}


class Background:
    """The replicator stepped on a thread, as the coordinator's replication thread does."""

    def __init__(self, rep):
        import threading
        self.rep, self.stop, self.errors = rep, threading.Event(), []
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        while not self.stop.wait(0.02):
            try:
                self.rep.tick()
            except Exception as exc:   # noqa: BLE001 - the test asserts none happened
                self.errors.append(exc)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()
        assert not self.errors, self.errors


def in_sync(admin, rep, p=0):
    for _ in range(3):
        rep.tick()
    r = rep_state(admin, p)
    assert len(r["isr"]) == 2, r
