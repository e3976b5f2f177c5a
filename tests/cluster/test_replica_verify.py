"""A follower's ``held`` is verified against its files, not trusted (docs/protocol.md §1.3,
"Verification"): files deleted, cut short or zeroed on a follower take it out of the ISR at the
next check and it is copied to again; an election never picks a candidate whose files do not
prove it holds everything committed; a returning replica rejoins only once its files do.

Driven in process with the replicator's clock as a test variable (as tests/cluster/test_replication.py).
Each case is a tester's repro that lost acknowledged records before the check existed."""
from __future__ import annotations

import os

import pytest

from pyspark_kafkalog.admin import Admin
from pyspark_kafkalog.cluster import actions as A
from pyspark_kafkalog.cluster.features import REPLICA_CHECK
from pyspark_kafkalog.errors import KafkaStorageError
from support.replication_support import LAG_MS, digests, in_sync, produce, rep_state, seen, setup

TEN = [b"v%d" % i for i in range(10)]


def ten_in_sync(tmp_path):
    """An RF=2 partition led on logdir-0, ten records produced one at a time, both replicas
    in the ISR and the high watermark at 10."""
    admin, rep, clock = setup(tmp_path, partitions=1)
    rep.broker_session_timeout_ms = 500
    for i in range(10):
        produce(admin, 1, i)
    in_sync(admin, rep)
    assert admin.cluster.state().partition("t", 0).high_watermark == 10
    return admin, rep, clock


def follower_logs(tmp_path):
    return sorted((tmp_path / "second" / "t-0").glob("*.log"))


def leader_away(tmp_path):
    root0, away = tmp_path / "root" / "logdir-0", tmp_path / "logdir-0-away"
    root0.rename(away)
    return lambda: away.rename(root0)


def test_a_follower_that_lost_files_leaves_the_isr_at_once_and_is_copied_to_again(tmp_path):
    admin, rep, clock = ten_in_sync(tmp_path)
    for f in follower_logs(tmp_path)[-3:]:                   # offsets 7, 8, 9
        f.unlink()
    clock.ms += 1_000                                        # replica.verify.interval.ms
    result = rep.tick()
    assert result.lost == {"t:0": {"logdir-1": [[7, 10]]}}, result.lost
    assert result.isr_shrinks == 1
    state = admin.cluster.state()
    assert REPLICA_CHECK in state.reader_features           # enabled with the first loss
    assert result.segments == 3                              # the same pass copies them again
    r = rep_state(admin)
    assert r["held"]["logdir-1"] == [[0, 10]] and r["isr"] == ["logdir-0"]
    rep.tick()
    assert rep_state(admin)["isr"] == ["logdir-0", "logdir-1"]
    assert digests(tmp_path / "second" / "t-0") == digests(tmp_path / "root" / "logdir-0" / "t-0")
    # the tester's failover, now: every acknowledged record survives it
    leader_away(tmp_path)
    clock.ms += 600
    rep.tick()
    clock.ms += 600
    assert rep.tick().elections == {"offline": 1}
    assert seen(admin) == TEN


def test_an_election_never_picks_a_candidate_whose_files_do_not_prove_it_holds_all(tmp_path):
    """The tester's repro exactly: three follower files deleted, then the leader's root moved
    away before any copy could replace them. The partition waits for its leader (unclean
    election is off) instead of electing the follower and losing offsets 7-9."""
    admin, rep, clock = ten_in_sync(tmp_path)
    for f in follower_logs(tmp_path)[-3:]:
        f.unlink()
    back = leader_away(tmp_path)
    for _ in range(3):
        clock.ms += 400
        result = rep.tick()
        assert result.elections == {}, result.elections
    r = rep_state(admin)
    assert (r["leader"], r["isr"]) == ("logdir-0", ["logdir-0"])
    assert r["held"]["logdir-1"] == [[0, 7]]
    with pytest.raises(KafkaStorageError):                  # retriable: not data loss
        seen(admin)
    back()
    for _ in range(3):
        clock.ms += 400
        rep.tick()
    assert seen(admin) == TEN
    assert rep_state(admin)["isr"] == ["logdir-0", "logdir-1"]


def test_a_returning_replica_rejoins_only_once_its_files_hold_what_it_is_recorded_to(tmp_path):
    """The variant: a follower's root away past the lag time, half its files deleted while
    away, then back. Before the check it rejoined the ISR at once, 242 segments short."""
    admin, rep, clock = setup(tmp_path, partitions=1)
    for i in range(20):
        produce(admin, 1, i)
    in_sync(admin, rep)
    second, away = tmp_path / "second", tmp_path / "second-away"
    second.rename(away)
    clock.ms += LAG_MS + 1
    rep.tick()
    assert rep_state(admin)["isr"] == ["logdir-0"]
    logs = sorted((away / "t-0").glob("*.log"))
    for f in logs[::2]:                                      # half of them, spread out
        f.unlink()
    away.rename(second)
    result = rep.tick()
    assert sorted(result.lost["t:0"]["logdir-1"])[0] == [0, 1]
    assert "logdir-1" not in rep_state(admin)["isr"]
    in_sync(admin, rep)
    assert digests(second / "t-0") == digests(tmp_path / "root" / "logdir-0" / "t-0")


@pytest.mark.parametrize("damage", ["cut short", "zeroed"])
def test_a_damaged_follower_file_counts_as_not_held(tmp_path, damage):
    admin, rep, clock = ten_in_sync(tmp_path)
    clock.ms += 1_000                                        # the check is due again
    f = follower_logs(tmp_path)[4]                           # offset 4
    data = f.read_bytes()
    if damage == "cut short":
        f.write_bytes(data[:-5])
    else:
        f.write_bytes(bytes(len(data) - 8) + data[-8:])
        os.utime(f, ns=(f.stat().st_atime_ns, f.stat().st_mtime_ns + 1_000_000))
    result = rep.tick()
    assert result.lost == {"t:0": {"logdir-1": [[4, 5]]}}, result.lost
    rep.tick()
    assert digests(tmp_path / "second" / "t-0") == digests(tmp_path / "root" / "logdir-0" / "t-0")


def test_a_check_that_finds_everything_changes_nothing(tmp_path):
    admin, rep, clock = ten_in_sync(tmp_path)
    seq = admin.cluster.state().seq
    for _ in range(3):
        clock.ms += 1_000
        assert rep.tick().lost == {}
    assert admin.cluster.state().seq == seq
    assert REPLICA_CHECK not in admin.cluster.state().reader_features


def test_replica_lost_replay_rules(tmp_path):
    """The action's rules (§2.2): refused before its feature; ranges only shrink ``held``;
    ranges below the log start offset (retention ran meanwhile) change nothing; the leader is
    not a follower; a deposed coordinator's is fenced."""
    admin, rep, clock = ten_in_sync(tmp_path)
    cluster = admin.cluster
    tid = cluster.state().topics["t"]["topic_id"]
    epoch = rep.epoch()

    def lost(ranges, log_dir="logdir-1", coordinator_epoch=epoch):
        _, after, [res] = cluster.submit([A.ReplicaLost(
            coordinator_epoch=coordinator_epoch, topic_ids={"t": tid},
            partitions={"t:0": {log_dir: ranges}})])
        return res, after.partition("t", 0).replication

    res, _ = lost([[7, 10]])
    assert res.error == "INVALID_REQUEST" and REPLICA_CHECK in res.message
    cluster.enable_feature(REPLICA_CHECK)
    admin.delete_records_before({("t", 0): 3})
    res, r = lost([[0, 3]])                                 # all below the log start offset
    assert res.partitions["t:0"].ok and r["isr"] == ["logdir-0", "logdir-1"]
    assert r["held"]["logdir-1"] == [[3, 10]]
    res, r = lost([[0, 10]], log_dir="logdir-0")
    assert res.partitions["t:0"].error == "INVALID_REQUEST"
    res, r = lost([[5, 6]], coordinator_epoch=epoch + 1)
    assert res.error == "STALE_CONTROLLER_EPOCH"
    hw = cluster.state().partition("t", 0).high_watermark
    res, r = lost([[5, 6]])
    assert res.partitions["t:0"].ok
    assert r["held"]["logdir-1"] == [[3, 5], [6, 10]] and r["isr"] == ["logdir-0"]
    assert cluster.state().partition("t", 0).high_watermark == hw   # never back


def test_a_partition_that_failed_over_while_empty_replicates_again(tmp_path):
    """Followers get ``partition.metadata`` with their first copy, so a leader elected while
    its partition held no data had none, and every later pass failed to copy from it."""
    admin, rep, clock = setup(tmp_path, partitions=2)
    rep.broker_session_timeout_ms = 500
    replicas = admin.cluster.state().topics["t"]["replicas"]
    p = next(i for i, r in enumerate(replicas) if r[0] == "logdir-1")   # led on "second"
    in_sync(admin, rep, p)
    second, away = tmp_path / "second", tmp_path / "second-away"
    second.rename(away)
    for _ in range(3):
        clock.ms += 400
        rep.tick()
    assert rep_state(admin, p)["leader"] == "logdir-0"
    assert not (tmp_path / "root" / "logdir-0" / f"t-{p}" / "partition.metadata").exists()
    away.rename(second)
    produce(admin, 3, partition=p)
    for _ in range(3):
        clock.ms += 400
        result = rep.tick()
        assert not [k for k in result.failures if k.startswith(f"t:{p}")], result.failures
    assert rep_state(admin, p)["isr"] == ["logdir-0", "logdir-1"]
    new_leader, follower = tmp_path / "root" / "logdir-0" / f"t-{p}", second / f"t-{p}"
    assert digests(follower) == digests(new_leader)
    assert (follower / "partition.metadata").read_bytes() == \
        (new_leader / "partition.metadata").read_bytes()


def test_a_follower_on_an_offline_log_dir_leaves_the_isr_without_waiting_for_the_lag(tmp_path):
    """Kafka shrinks the ISR as soon as a broker is fenced; acks=all writes stalled for
    replica.lag.time.max.ms here before."""
    admin, rep, clock = setup(tmp_path, partitions=1)
    rep.broker_session_timeout_ms = 200                      # LAG_MS is 1000
    produce(admin, 3)
    in_sync(admin, rep)
    (tmp_path / "second").rename(tmp_path / "second-away")
    rep.tick()
    assert rep_state(admin)["isr"] == ["logdir-0", "logdir-1"]   # unreadable, not offline yet
    clock.ms += 300
    result = rep.tick()
    assert rep_state(admin)["isr"] == ["logdir-0"] and result.isr_shrinks == 1


def test_a_commit_between_the_move_check_and_the_election_is_not_cut_off(tmp_path):
    """A reassignment with acks=1 producers running lost the records committed between the
    coordinator's "the target holds everything" check and its election entry: the election
    truncated them. Replay now checks it again, atomically with the election."""
    admin, rep, clock = setup(tmp_path, partitions=1)
    produce(admin, 4)
    in_sync(admin, rep)
    ids = {"t": admin.cluster.state().topics["t"]["topic_id"]}
    _, _, [res] = admin.cluster.submit([A.ReassignPartitions(
        topic_ids=ids, partitions={"t:0": ["logdir-1"]})])   # the leader moves to logdir-1
    assert res.partitions["t:0"].ok
    submit = rep._submit
    raced = []

    def commit_first(action, result):
        if isinstance(action, A.ElectLeader) and action.election == "reassign" and not raced:
            raced.append(produce(admin, 1, 4))              # lands after the check
        return submit(action, result)

    rep._submit = commit_first
    for _ in range(6):
        rep.tick()
    assert raced
    state = admin.cluster.state()
    ps = state.partition("t", 0)
    assert ps.replication["leader"] == "logdir-1" and state.topics["t"]["replicas"][0] == \
        ["logdir-1"]
    assert not ps.is_aborted(4)
    assert seen(admin) == [b"v%d" % i for i in range(5)]


def test_a_long_lived_producer_never_writes_into_a_root_created_again(tmp_path):
    """A producer kept acknowledging acks=1 writes into a freshly created ``<root>/t-1/`` after
    the log dir's root was moved away (and recreated checkpoint files there): the records were
    on no root any other process reads. A storage root is made once, when it is opened."""
    admin, rep, clock = setup(tmp_path, partitions=2)
    replicas = admin.cluster.state().topics["t"]["replicas"]
    p = next(i for i, r in enumerate(replicas) if r[0] == "logdir-1")   # led on "second"
    produce(admin, 1, partition=p)                       # this process has the root open
    second, away = tmp_path / "second", tmp_path / "second-away"
    second.rename(away)
    with pytest.raises(KafkaStorageError, match="root is gone"):      # (no retries here)
        produce(admin, 1, 1, partition=p, delivery_timeout_ms=0)
    assert not second.exists()
    fresh = Admin(str(tmp_path / "root"), fsync=False)  # a new process: it opens the log dir
    with pytest.raises(KafkaStorageError, match="directory.id"):
        fresh.produce("t", [(b"k", b"v")], partition=p, acks="1", delivery_timeout_ms=0)
    assert not second.exists()
    away.rename(second)
    produce(admin, 1, 2, partition=p)                    # back: writes go on
    assert [r.value for r in admin.consume("t", p, isolation_level="read_uncommitted")] == \
        [b"v0", b"v2"]


def test_a_log_dir_under_the_clusters_root_is_not_created_again_either(tmp_path):
    """Found by tests/system/test_nemesis.py: acks=1 writes to a partition led on logdir-0 were
    acknowledged into a new ``root/logdir-0/`` while the real one was moved away."""
    admin, rep, clock = setup(tmp_path, partitions=2)
    replicas = admin.cluster.state().topics["t"]["replicas"]
    p = next(i for i, r in enumerate(replicas) if r[0] == "logdir-0")
    produce(admin, 1, partition=p)
    logdir0, away = tmp_path / "root" / "logdir-0", tmp_path / "logdir-0-away"
    logdir0.rename(away)
    with pytest.raises(KafkaStorageError, match="log dir's root is gone"):
        produce(admin, 1, 1, partition=p, delivery_timeout_ms=0)
    assert not logdir0.exists()
    away.rename(logdir0)
    produce(admin, 1, 2, partition=p)


def test_a_planner_never_creates_a_registered_root_again(tmp_path):
    """Found by tests/system/test_nemesis.py: planning a read (a batch read, a streaming query's
    micro-batch) of a partition led on another root opened that root as storage
    (``sources.cached_storage``), which made it again, empty, where it had been moved away."""
    from pyspark_kafkalog.connector.sources import ClusterSource
    from pyspark_kafkalog.errors import KafkaLogError
    admin, rep, clock = setup(tmp_path, partitions=2)
    replicas = admin.cluster.state().topics["t"]["replicas"]
    p = next(i for i, r in enumerate(replicas) if r[0] == "logdir-1")   # led on "second"
    produce(admin, 2, partition=p)
    second, away = tmp_path / "second", tmp_path / "second-away"
    second.rename(away)
    try:
        ClusterSource(str(tmp_path / "root"), cluster=admin.cluster).view("t", p)
    except KafkaLogError:
        pass                     # the planner may fail; it must not make the root again
    assert not second.exists()
