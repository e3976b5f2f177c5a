"""Replication between storage roots (docs/protocol.md §1.3), driven in process: the
coordinator's replicator copies committed segments to followers byte for byte, records them with
``replica_progress``, and moves followers through ``joining`` into the ISR; the high watermark
waits for the ISR, freezes below ``min.insync.replicas``, and a follower whose root is gone
leaves the ISR after ``replica.lag.time.max.ms``.

The replicator's clock is a test variable, so "after the lag time" needs no sleeping."""
from __future__ import annotations

import hashlib
import random
import shutil
from pathlib import Path

from pyspark_kafkalog.admin import Admin
from pyspark_kafkalog.cluster.features import REPLICATION
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


def produce(admin, n, start=0, partition=0):
    admin.produce("t", [Record(b"k%d" % i, b"v%d" % i) for i in range(start, start + n)],
                  partition=partition)


def seen(admin, partition=0):
    return [r.value for r in admin.consume("t") if r.partition == partition]


def rep_state(admin, p=0):
    return admin.cluster.state().partition("t", p).replication


def digests(d: Path):
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(d.iterdir())
            if f.suffix in (".log", ".index", ".timeindex")}


def test_followers_catch_up_join_the_isr_and_hold_the_leaders_bytes(tmp_path):
    admin, rep, clock = setup(tmp_path)
    produce(admin, 10)
    produce(admin, 5, 10)
    produce(admin, 7, partition=1)
    state = admin.cluster.state()
    assert REPLICATION not in state.reader_features
    before = state.partition("t", 0).high_watermark

    first = rep.tick()
    state = admin.cluster.state()
    assert REPLICATION in state.reader_features       # enabled by the coordinator
    assert first.ok and first.segments == 3 and first.by_mode == {"streamed": 3}
    r0 = rep_state(admin, 0)
    assert r0["held"] == {"logdir-1": [[0, 15]]}
    assert (r0["isr"], r0["joining"]) == (["logdir-0"], ["logdir-1"])
    assert r0["high_watermark"] == before == 15       # turning replication on hides nothing

    rep.tick()
    for p in (0, 1):
        r = rep_state(admin, p)
        replicas = admin.cluster.state().topics["t"]["replicas"][p]
        assert (r["isr"], r["joining"]) == (replicas, []), r
        assert r["partition_epoch"] == 2
    leader, follower = tmp_path / "root" / "logdir-0" / "t-0", tmp_path / "second" / "t-0"
    assert digests(follower) == digests(leader) and len(digests(leader)) == 6
    assert (follower / "partition.metadata").read_bytes() == \
        (leader / "partition.metadata").read_bytes()
    assert (follower / "leader-epoch-checkpoint").read_text() == \
        (leader / "leader-epoch-checkpoint").read_text()

    # new data shows only once the in-sync follower holds it
    produce(admin, 3, 15)
    ps = admin.cluster.state().partition("t", 0)
    assert (ps.last_stable_offset, ps.high_watermark) == (18, 15)
    assert len(seen(admin)) == 15
    rep.tick()
    assert admin.cluster.state().partition("t", 0).high_watermark == 18
    assert seen(admin) == [b"v%d" % i for i in range(18)]
    assert digests(follower) == digests(leader)

    # a pass with nothing to copy appends nothing
    seq = admin.cluster.state().seq
    assert rep.tick().segments == 0 and admin.cluster.state().seq == seq


def test_a_lost_follower_leaves_the_isr_and_min_isr_freezes_the_high_watermark(tmp_path):
    admin, rep, clock = setup(tmp_path, partitions=1, configs={"min.insync.replicas": "2"})
    produce(admin, 4)
    rep.tick()
    # min ISR 2 and ISR = [leader] while the follower is only joining: nothing new shows
    assert rep_state(admin)["high_watermark"] == 4        # as visible before the feature
    produce(admin, 2, 4)
    assert admin.cluster.state().partition("t", 0).high_watermark == 4
    rep.tick()                                            # joins: min ISR met, HW moves
    assert rep_state(admin)["isr"] == ["logdir-0", "logdir-1"]
    assert rep_state(admin)["high_watermark"] == 6

    second = tmp_path / "second"
    moved = tmp_path / "second-away"
    second.rename(moved)                                  # the follower's root is gone
    produce(admin, 3, 6)
    clock.ms += LAG_MS // 2
    result = rep.tick()
    assert rep_state(admin)["isr"] == ["logdir-0", "logdir-1"]   # within the lag time
    assert result.segments == 0
    clock.ms += LAG_MS
    rep.tick()
    r = rep_state(admin)
    assert (r["isr"], r["joining"]) == (["logdir-0"], [])         # shrunk
    ps = admin.cluster.state().partition("t", 0)
    assert ps.high_watermark == 6 < ps.last_stable_offset == 9   # below min ISR: frozen
    assert len(seen(admin)) == 6

    moved.rename(second)                                  # the root comes back
    rep.tick()
    assert rep_state(admin)["joining"] == ["logdir-1"]
    rep.tick()
    r = rep_state(admin)
    assert r["isr"] == ["logdir-0", "logdir-1"] and r["high_watermark"] == 9
    assert seen(admin) == [b"v%d" % i for i in range(9)]


def test_with_min_isr_1_a_lost_follower_stops_holding_back_the_high_watermark(tmp_path):
    admin, rep, clock = setup(tmp_path, partitions=1)
    produce(admin, 2)
    rep.tick()
    rep.tick()
    assert rep_state(admin)["isr"] == ["logdir-0", "logdir-1"]
    shutil.rmtree(tmp_path / "second")                    # the follower's root is lost for good
    produce(admin, 3, 2)
    assert len(seen(admin)) == 2                          # the ISR must hold it first
    clock.ms += LAG_MS + 1
    rep.tick()
    assert rep_state(admin)["isr"] == ["logdir-0"]
    assert seen(admin) == [b"v%d" % i for i in range(5)]  # the leader alone meets min ISR 1


def test_a_deposed_coordinators_pass_changes_nothing(tmp_path):
    admin, rep, clock = setup(tmp_path, partitions=1)
    produce(admin, 2)
    rep.tick()
    # another coordinator takes over (the lease is ours, so re-acquire under a new holder
    # after it lapses by the acquirer's clock: simplest is our own holder id, new epoch)
    state = admin.cluster.state()
    lease = state.coordinator
    acquire(admin.cluster, lease["holder"], "127.0.0.1:2", 60_000)   # epoch + 1
    produce(admin, 2, 2)
    before = rep_state(admin)
    try:
        rep.tick()
    except Exception as exc:     # FencedCoordinatorError: the service then stops acting
        assert type(exc).__name__ == "FencedCoordinatorError"
    else:
        raise AssertionError("a deposed coordinator's pass was not fenced")
    assert rep_state(admin)["held"] == before["held"]
