"""Replication between storage roots (docs/protocol.md §1.3), driven in process: the
coordinator's replicator copies committed segments to followers byte for byte, records them with
``replica_progress``, and moves followers through ``joining`` into the ISR; the high watermark
waits for the ISR, freezes below ``min.insync.replicas``, and a follower whose root is gone
leaves the ISR after ``replica.lag.time.max.ms``.

The replicator's clock is a test variable, so "after the lag time" needs no sleeping."""
from __future__ import annotations

import shutil

import pytest

from pyspark_kafkalog.cluster.features import REPLICATION
from pyspark_kafkalog.cluster.lease import acquire

from support.replication_support import (LAG_MS, Background, digests, in_sync, produce,
                                         rep_state, seen, setup)


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
    # the case: min.insync.replicas=2 and one replica down. acks=all fails with
    # NOT_ENOUGH_REPLICAS and nothing is reserved or shows; acks=1 succeeds (and waits to show)
    from pyspark_kafkalog.errors import NotEnoughReplicasError
    with pytest.raises(NotEnoughReplicasError) as refused:      # no retries: the rule itself
        produce(admin, 1, 90, acks="all", delivery_timeout_ms=0)
    assert refused.value.error_code == 19
    assert admin.cluster.state().partition("t", 0).next_offset == 9
    assert [m.offset for m in produce(admin, 1, 9, acks="1")] == [9]
    assert len(seen(admin)) == 6

    moved.rename(second)                                  # the root comes back
    rep.tick()
    assert rep_state(admin)["joining"] == ["logdir-1"]
    rep.tick()
    r = rep_state(admin)
    assert r["isr"] == ["logdir-0", "logdir-1"] and r["high_watermark"] == 10
    assert seen(admin) == [b"v%d" % i for i in range(10)]


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


# -- acks ---------------------------------------------------------------------------------------

def test_acks_all_commits_once_the_isr_holds_the_data_and_shows_at_once(tmp_path):
    admin, rep, clock = setup(tmp_path, partitions=1, configs={"min.insync.replicas": "2"})
    produce(admin, 2)
    in_sync(admin, rep)
    with Background(rep):
        placed = produce(admin, 5, 2, acks="all")
    assert [m.offset for m in placed] == [2, 3, 4, 5, 6]
    state = admin.cluster.state()
    ps = state.partition("t", 0)
    assert ps.high_watermark == ps.last_stable_offset == 7   # visible at its commit
    assert [r.value for r in admin.consume("t")] == [b"v%d" % i for i in range(7)]
    assert ps.replication["held"]["logdir-1"] == [[0, 7]]
    # the reservation carried acks=all, as the metadata log says
    entries = sorted((tmp_path / "root" / "_kafkalog" / "log").glob("*.json"))
    import json
    reserves = [a for e in entries for a in json.loads(e.read_text()).get("actions", [])
                if a.get("op") == "reserve"]
    assert [a.get("acks", "1") for a in reserves] == ["1", "all"]


def test_acks_all_below_min_isr_is_refused_before_anything_is_written(tmp_path):
    from pyspark_kafkalog.errors import NotEnoughReplicasError
    admin, rep, clock = setup(tmp_path, partitions=1, configs={"min.insync.replicas": "2"})
    produce(admin, 2)
    rep.tick()                                           # the feature is on; ISR = [leader]
    before = admin.cluster.state().partition("t", 0).next_offset
    try:
        produce(admin, 3, 2, acks="all", delivery_timeout_ms=0)   # no retries: the rule itself
    except NotEnoughReplicasError as exc:
        assert exc.error_code == 19 and "min.insync.replicas" in str(exc)
    else:
        raise AssertionError("acks=all below min ISR was accepted")
    assert admin.cluster.state().partition("t", 0).next_offset == before
    assert not list((tmp_path / "root" / "logdir-0" / "t-0").glob("*.tmp-*"))
    produce(admin, 3, 2, acks="1")                       # acks=1 is taken, and waits to show
    assert len(seen(admin)) == 2


def test_acks_all_without_a_coordinator_times_out_and_shows_nothing(tmp_path):
    from pyspark_kafkalog.errors import RequestTimedOutError
    admin, rep, clock = setup(tmp_path, partitions=1)
    produce(admin, 2)
    in_sync(admin, rep)
    # the lease is held but nobody copies (as after the coordinator died)
    try:
        produce(admin, 3, 2, acks="all", request_timeout_ms=300, delivery_timeout_ms=0)
    except RequestTimedOutError as exc:
        assert exc.error_code == 7 and "nothing of it is visible" in str(exc)
    else:
        raise AssertionError("acks=all without copies was acknowledged")
    state = admin.cluster.state()
    ps = state.partition("t", 0)
    assert not state.txns and ps.is_aborted(2) and ps.is_aborted(4)   # aborted: gaps
    rep.tick()
    assert seen(admin) == [b"v0", b"v1"]


# -- failover -----------------------------------------------------------------------------------

def test_an_offline_leader_is_replaced_by_an_isr_member_and_rejoins_truncated(tmp_path):
    from pyspark_kafkalog.errors import KafkaLogError
    admin, rep, clock = setup(tmp_path, partitions=1)
    rep.broker_session_timeout_ms = 500
    produce(admin, 4)
    in_sync(admin, rep)
    produce(admin, 2, 4)                                 # acks=1, not copied yet: HW stays 4
    epoch_before = admin.cluster.state().partition("t", 0).leader_epoch
    root0 = tmp_path / "root" / "logdir-0"
    away = tmp_path / "logdir-0-away"
    root0.rename(away)                                   # the leader's log dir is gone
    rep.tick()
    assert rep_state(admin)["leader"] == "logdir-0"      # not offline yet: one failed probe
    clock.ms += 600
    result = rep.tick()
    assert result.elections == {"offline": 1}
    state = admin.cluster.state()
    ps = state.partition("t", 0)
    r = ps.replication
    assert (r["leader"], r["isr"]) == ("logdir-1", ["logdir-1"])
    assert ps.leader_epoch == epoch_before + 1
    assert ps.is_aborted(4) and ps.is_aborted(5)         # acks=1 data the new leader lacked
    assert ps.high_watermark == 6                        # over the gaps, never back
    assert seen(admin) == [b"v%d" % i for i in range(4)]  # read from the new leader

    produce(admin, 2, 6)                                 # writes follow the new leader
    assert seen(admin) == [b"v0", b"v1", b"v2", b"v3", b"v6", b"v7"]
    assert sorted(p.name for p in (tmp_path / "second" / "t-0").glob("*.log"))[-1] == \
        "00000000000000000006.log"

    away.rename(root0)                                   # the old leader's root comes back
    rep.tick()
    assert rep_state(admin)["joining"] == ["logdir-0"]
    old = tmp_path / "root" / "logdir-0" / "t-0"
    assert not (old / "00000000000000000004.log").exists()   # truncated before joining
    rep.tick()
    r = rep_state(admin)
    assert (r["leader"], r["isr"]) == ("logdir-1", ["logdir-1", "logdir-0"])
    new = tmp_path / "second" / "t-0"
    assert digests(old) == digests(new)
    # no offset names two records: 4 and 5 are gaps everywhere
    assert [(m.offset, m.value) for m in admin.consume("t")] == \
        [(0, b"v0"), (1, b"v1"), (2, b"v2"), (3, b"v3"), (6, b"v6"), (7, b"v7")]


def test_unclean_election_only_when_the_topic_allows_it(tmp_path):
    admin, rep, clock = setup(tmp_path, partitions=1)
    rep.broker_session_timeout_ms = 100
    produce(admin, 3)
    in_sync(admin, rep)
    second, second_away = tmp_path / "second", tmp_path / "second-away"
    second.rename(second_away)                           # the follower goes ...
    clock.ms += LAG_MS + 1
    rep.tick()
    assert rep_state(admin)["isr"] == ["logdir-0"]       # ... and is shrunk out
    produce(admin, 2, 3)
    assert len(seen(admin)) == 5                         # the leader alone meets min ISR 1
    root0, away = tmp_path / "root" / "logdir-0", tmp_path / "away"
    root0.rename(away)                                   # now the leader goes too,
    second_away.rename(second)                           # and the stale follower is back
    for _ in range(3):
        clock.ms += 100
        result = rep.tick()
        assert result.elections == {}                    # no ISR member left: it waits
    assert rep_state(admin)["leader"] == "logdir-0"
    epoch = admin.cluster.state().partition("t", 0).leader_epoch

    admin.alter_configs("t", {"unclean.leader.election.enable": "true"})
    result = rep.tick()
    assert result.elections == {"unclean": 1}
    ps = admin.cluster.state().partition("t", 0)
    assert (ps.replication["leader"], ps.replication["isr"]) == ("logdir-1", ["logdir-1"])
    assert ps.leader_epoch == epoch + 1
    assert ps.is_aborted(3) and ps.is_aborted(4)         # Kafka's unclean loss: gaps, ...
    assert ps.high_watermark == 5                        # ... and the high watermark stays
    assert seen(admin) == [b"v0", b"v1", b"v2"]
    produce(admin, 1, 5)                                 # the new leader takes writes
    assert seen(admin) == [b"v0", b"v1", b"v2", b"v5"]


def test_retention_and_delete_records_reach_the_followers(tmp_path):
    admin, rep, clock = setup(tmp_path, partitions=1)
    for i in range(4):                                   # four units: four segments
        produce(admin, 2, 2 * i)
    in_sync(admin, rep)
    follower = tmp_path / "second" / "t-0"
    assert len(list(follower.glob("*.log"))) == 4
    admin.delete_records_before({("t", 0): 5})
    names = sorted(p.name for p in follower.glob("*.log"))
    assert names == ["00000000000000000004.log", "00000000000000000006.log"]
    assert names == sorted(p.name for p in (tmp_path / "root" / "logdir-0" / "t-0").glob("*.log"))
    r = rep_state(admin)
    assert r["held"] == {"logdir-1": [[5, 8]]} and r["high_watermark"] == 8


def test_copies_made_after_the_root_moved_away_are_not_recorded(tmp_path, monkeypatch):
    """The root is renamed away right after the pass probed it: the copies land in a directory
    created again at its path, not on the root. The pass must not record them, or the follower
    would join the ISR holding nothing (found by tests/system/test_replication_crash.py)."""
    from pyspark_kafkalog.coordinator import replicator as R
    admin, rep, clock = setup(tmp_path, partitions=1)
    produce(admin, 5)
    second, away = tmp_path / "second", tmp_path / "away"
    probe = R.Replicator._probe

    def probe_then_rename(self, *a):
        out = probe(self, *a)
        second.rename(away)
        return out
    monkeypatch.setattr(R.Replicator, "_probe", probe_then_rename)
    result = rep.tick()
    monkeypatch.setattr(R.Replicator, "_probe", probe)
    # the copy finds the root gone and makes nothing: a root is never created again (§1.1)
    assert result.segments == 0 and not result.progress and result.failures
    assert rep_state(admin)["held"] == {} and not second.exists()
    away.rename(second)
    rep.tick()
    rep.tick()
    r = rep_state(admin)
    assert r["isr"] == ["logdir-0", "logdir-1"] and r["held"] == {"logdir-1": [[0, 5]]}
    assert digests(second / "t-0") == digests(tmp_path / "root" / "logdir-0" / "t-0")


# -- reassignment -------------------------------------------------------------------------------

def test_reassignment_moves_a_partition_to_other_log_dirs(tmp_path):
    from pyspark_kafkalog.cluster import actions as A
    admin, rep, clock = setup(tmp_path, partitions=1)
    third = admin.add_log_dir(str(tmp_path / "third"))
    assert third.log_dir == "logdir-2"
    produce(admin, 4)
    in_sync(admin, rep)
    state = admin.cluster.state()
    ids = {"t": state.topics["t"]["topic_id"]}
    # from [logdir-0, logdir-1] to [logdir-2, logdir-1]: the leader moves, logdir-0 goes
    _, _, res = admin.cluster.submit([A.ReassignPartitions(
        topic_ids=ids, partitions={"t:0": ["logdir-2", "logdir-1"]})])
    assert res[0].partitions["t:0"].ok
    assert admin.cluster.state().topics["t"]["replicas"][0] == ["logdir-0", "logdir-1",
                                                                  "logdir-2"]
    _, _, res = admin.cluster.submit([A.ReassignPartitions(
        topic_ids=ids, partitions={"t:0": ["logdir-0"]})])
    assert res[0].partitions["t:0"].error == "REASSIGNMENT_IN_PROGRESS"
    produce(admin, 2, 4)                                 # writes go on meanwhile
    for _ in range(6):
        rep.tick()
    state = admin.cluster.state()
    ps = state.partition("t", 0)
    assert state.topics["t"]["replicas"][0] == ["logdir-2", "logdir-1"]
    assert ps.replication["leader"] == "logdir-2" and "target" not in ps.replication
    assert sorted(ps.replication["isr"]) == ["logdir-1", "logdir-2"]
    assert not (tmp_path / "root" / "logdir-0" / "t-0").exists()    # the removed replica
    assert digests(tmp_path / "third" / "t-0") == digests(tmp_path / "second" / "t-0")
    assert seen(admin) == [b"v%d" % i for i in range(6)]
    produce(admin, 1, 6)                                 # the new leader takes writes
    assert (tmp_path / "third" / "t-0" / "00000000000000000006.log").exists()
    rep.tick()                                           # acks=1: shows once the ISR has it
    assert seen(admin) == [b"v%d" % i for i in range(7)]


@pytest.mark.slow
def test_reassign_partitions_cli_and_log_dirs_lag(tmp_path):
    import json
    import subprocess
    import sys
    admin, rep, clock = setup(tmp_path, partitions=2)
    admin.add_log_dir(str(tmp_path / "third"))
    produce(admin, 3)
    produce(admin, 2, partition=1)
    in_sync(admin, rep, 0)
    url = str(tmp_path / "root")

    def cli(*argv):
        out = subprocess.run([sys.executable, "-m", "pyspark_kafkalog.cli.main", "--cluster", url,
                              *argv], capture_output=True, text=True, timeout=120)
        return out.returncode, [json.loads(x) for x in out.stdout.splitlines() if x.strip()], \
            out.stderr

    produce(admin, 2, 3)                                 # acks=1: the follower lags by 2
    rc, rows, err = cli("log-dirs", "--describe", "--json")
    assert rc == 0, err
    lag = {(r["log_dir"], r["partition"]): r["offset_lag"] for r in rows if r["topic"] == "t"}
    replicas = admin.cluster.state().topics["t"]["replicas"][0]
    assert lag[(replicas[0], 0)] == 0 and lag[(replicas[1], 0)] == 2

    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"version": 1, "partitions": [
        {"topic": "t", "partition": 0, "replicas": [2, 1], "log_dirs": ["any", "any"]}]}))
    rc, rows, err = cli("reassign-partitions", "--reassignment-json-file", str(plan), "--verify",
                        "--json")
    assert rc == 1 and rows[0]["status"] == "not started or replaced"
    rc, rows, err = cli("reassign-partitions", "--reassignment-json-file", str(plan), "--execute",
                        "--json")
    assert rc == 0, err
    assert rows[0]["status"] == "started" and rows[0]["target"] == "logdir-2,logdir-1"
    rc, rows, err = cli("reassign-partitions", "--reassignment-json-file", str(plan), "--verify",
                        "--json")
    assert rc == 1 and rows[0]["status"] == "in progress"
    for _ in range(6):
        rep.tick()
    rc, rows, err = cli("reassign-partitions", "--reassignment-json-file", str(plan), "--verify",
                        "--json")
    assert rc == 0 and rows[0]["status"] == "complete", rows
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"version": 1, "partitions": [
        {"topic": "t", "partition": 1, "replicas": [7]}]}))
    seq = admin.cluster.state().seq
    rc, rows, err = cli("reassign-partitions", "--reassignment-json-file", str(bad), "--execute")
    assert rc == 2 and "logdir-7" in err
    assert admin.cluster.state().seq == seq                          # nothing written
    assert seen(admin) == [b"v%d" % i for i in range(5)]


def test_a_pass_is_counted_in_the_coordinators_metrics(tmp_path):
    from pyspark_kafkalog.coordinator.metrics import CoordinatorMetrics
    admin, rep, clock = setup(tmp_path, partitions=1)
    rep.broker_session_timeout_ms = 100
    produce(admin, 3)
    m = CoordinatorMetrics()
    for _ in range(2):
        m.count_replication(rep.tick())
    (tmp_path / "root" / "logdir-0").rename(tmp_path / "away")
    rep.tick()
    clock.ms += 200
    m.count_replication(rep.tick())                      # the leader's root is gone: elect

    def value(name, **labels):
        return m.registry.get_sample_value(f"kafkalog_coordinator_{name}", labels or None)
    assert value("replication_segments_total", mode="streamed") == 1
    assert value("replication_bytes_total") > 0
    # the election took the old leader out of the ISR: a shrink, as Kafka counts it (#33)
    assert value("isr_expands_total") == 1 and value("isr_shrinks_total") == 1
    assert value("leader_elections_total") == 1 and value("unclean_leader_elections_total") == 0


def test_reads_while_the_leaders_root_is_away_are_storage_errors_not_data_loss(tmp_path):
    """Between the leader's root going away and the election, the data is on the in-sync
    follower, not lost: readers get a retriable KafkaStorageError, and a Spark-style read with
    failOnDataLoss=false does not skip it (found by tests/system/test_replication_failover.py)."""
    import pytest
    from pyspark_kafkalog.connector.range_reader import read_range
    from pyspark_kafkalog.connector.read_plan import plan
    from pyspark_kafkalog.connector.sources import open_source
    from pyspark_kafkalog.errors import KafkaStorageError
    from pyspark_kafkalog.spark.read_options import ReadOptions
    admin, rep, clock = setup(tmp_path, partitions=1)
    produce(admin, 4)
    in_sync(admin, rep)
    url = str(tmp_path / "root")
    tasks = plan(open_source(url), ReadOptions.parse({"path": url, "subscribe": "t",
                                                      "failOnDataLoss": "false"}))
    assert [(t.start, t.end) for t in tasks] == [(0, 4)]
    (tmp_path / "root" / "logdir-0").rename(tmp_path / "away")
    with pytest.raises(KafkaStorageError, match="cannot be read"):
        list(admin.consume("t"))
    for lossy in (True, False):
        with pytest.raises(KafkaStorageError):
            list(read_range(tasks[0], include_headers=False, fail_on_data_loss=lossy))
    (tmp_path / "away").rename(tmp_path / "root" / "logdir-0")
    assert seen(admin) == [b"v%d" % i for i in range(4)]


def test_a_merge_leaves_every_isr_member_byte_identical_and_copies_follow_it(tmp_path):
    """Segment merges (protocol §4.1) of a replicated partition replace the same files with the
    same bytes on the leader and every in-sync follower; a follower that was out of the ISR
    meanwhile copies the leader's merged file over its own smaller one when it returns."""
    from pyspark_kafkalog.maintenance.retention import merge_segments
    admin, rep, clock = setup(tmp_path, partitions=1)
    for i in range(12):
        produce(admin, 1, i)
    rep.tick()
    rep.tick()
    assert rep_state(admin)["isr"] == ["logdir-0", "logdir-1"]
    leader_dir, follower_dir = tmp_path / "root" / "logdir-0" / "t-0", tmp_path / "second" / "t-0"
    done = merge_segments(admin.cluster, lag_ms=0, delay_ms=0)
    assert done[0].merged and done[0].merged[0][:3] == [0, 11, 11]
    assert digests(leader_dir) == digests(follower_dir)
    assert len(list(leader_dir.glob("*.log"))) == 2
    assert seen(admin) == [b"v%d" % i for i in range(12)]

    second, moved = tmp_path / "second", tmp_path / "second-away"
    second.rename(moved)                                  # the follower leaves the ISR
    clock.ms += 2 * LAG_MS
    rep.tick()
    assert rep_state(admin)["isr"] == ["logdir-0"]
    for i in range(12, 20):
        produce(admin, 1, i)
    done = merge_segments(admin.cluster, lag_ms=0, delay_ms=0)   # on the leader alone
    assert done[0].merged[0][:2] == [0, 19]
    moved.rename(second)
    for _ in range(3):
        rep.tick()
    assert rep_state(admin)["isr"] == ["logdir-0", "logdir-1"]
    assert digests(leader_dir) == {k: v for k, v in digests(follower_dir).items()
                                   if k[:20] in {n[:20] for n in digests(leader_dir)}}
    assert (follower_dir / "00000000000000000000.log").read_bytes() == \
        (leader_dir / "00000000000000000000.log").read_bytes()
    assert seen(admin) == [b"v%d" % i for i in range(20)]
