"""Replication end to end (docs/protocol.md §1.3, §11): across storage backends, read by Kafka's
own classes, and with a real Spark session beside a running coordinator.

What is checked, and how:

* a follower on S3 (a moto server) of a local leader: the replicator streams the leader's
  segments into the bucket, byte for byte, and the follower joins the ISR; then the leader's
  root goes away and, after ``broker.session.timeout.ms`` on the replicator's fake clock, an
  offline election makes the S3 replica the leader, which serves exactly what was visible;
* both replicas on S3, in two buckets of one endpoint: the catch-up is a server-side copy,
  and the result is byte-identical;
* Kafka's own classes (the Java oracle of test_kafka_java.py) read a caught-up follower's
  partition directory on a second local root: the leader's records below the high watermark,
  no problem in any segment or index, and its ``leader-epoch-checkpoint`` loads and equals the
  leader's; after a failover, a returning old leader (now a follower, truncated) reads as the
  new leader's log with both epochs;
* derived files (§1.3 "Derived files", §8) after each pass: a follower's log dir gets its own
  offset checkpoints and a ``leader-epoch-checkpoint`` that covers acks=all data (copied while
  its range was still open), and the leader's files follow a high watermark the coordinator,
  not a commit, moved (acks=1 with followers in the ISR);
* a real SparkSession writes (acks=all, the default, and acks=1) to an RF=2 topic with
  ``min.insync.replicas=2`` while ``pyspark_kafkalog.coordinator.start`` runs in this process:
  empty partitions join the ISR on their own, the write is acknowledged, read back equal, and
  both replicas hold byte-identical segments.
"""
from __future__ import annotations

import hashlib
import random
import time
import uuid
from pathlib import Path

import pytest

from pyspark_kafkalog.admin import Admin
from pyspark_kafkalog.cluster.lease import acquire, new_holder_id
from pyspark_kafkalog.coordinator.replicator import Replicator
from pyspark_kafkalog.format.records import Record
from pyspark_kafkalog.storage import open_storage
from support.replication_support import Background
from support.moto_support import BUCKET, moto_options  # noqa: F401  (a session fixture: a moto server)

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.slow]   # replication across backends with Kafka's classes (~3 s and a build)

LAG_MS = 1_000
SESSION_MS = 500
SEGMENT_SUFFIXES = (".log", ".index", ".timeindex")


class Clock:
    def __init__(self):
        self.ms = 1_000_000

    def __call__(self) -> int:
        return self.ms


def seed_for(n: int, start: int, shift_ok=lambda k: True) -> int:
    """A seed whose placement draws (Kafka's start index, then its shift) fit."""
    for s in range(10_000):
        rng = random.Random(s)
        if rng.randrange(n) == start and shift_ok(rng.randrange(n)):
            return s
    raise AssertionError("no seed")


def replicator(admin, clock, **kw) -> Replicator:
    lease = acquire(admin.cluster, new_holder_id(), "127.0.0.1:1", 60_000)
    return Replicator(admin.cluster, lambda: lease.epoch, replica_lag_time_max_ms=LAG_MS,
                      broker_session_timeout_ms=SESSION_MS, clock_ms=clock, **kw)


def produce(admin, n, start=0, partition=0, acks="1"):
    return admin.produce("t", [Record(b"k%d" % i, b"v%d" % i) for i in range(start, start + n)],
                         partition=partition, acks=acks)


def rep_state(admin, p=0):
    return admin.cluster.state().partition("t", p).replication


def until_in_sync(admin, rep, partitions=(0,), passes=4):
    """Step the replicator until every partition's ISR has both replicas; the passes' results."""
    results = []
    for _ in range(passes):
        results.append(rep.tick())
        if all(len(rep_state(admin, p)["isr"]) == 2 for p in partitions):
            return results
    raise AssertionError(f"not in sync after {passes} passes: "
                         f"{[rep_state(admin, p) for p in partitions]} {results}")


def modes(results) -> dict:
    out: dict = {}
    for r in results:
        assert r.ok, r.failures
        for k, v in r.by_mode.items():
            out[k] = out.get(k, 0) + v
    return out


def seen(admin, partition=0):
    return [(r.offset, r.key, r.value) for r in admin.consume("t") if r.partition == partition]


def local_segments(d: Path) -> dict:
    return {f.name: f.read_bytes() for f in sorted(d.iterdir()) if f.suffix in SEGMENT_SUFFIXES}


def store_segments(st, d: str) -> dict:
    return {f.name: st.read(f"{d}/{f.name}") for f in sorted(st.list(d), key=lambda f: f.name)
            if f.name.endswith(SEGMENT_SUFFIXES)}


def sha(files: dict) -> dict:
    return {k: hashlib.sha256(v).hexdigest() for k, v in files.items()}


# -- S3 -------------------------------------------------------------------------------------------

@pytest.fixture
def s3_env(moto_options, monkeypatch):  # noqa: F811
    """Credentials from the environment (never in the metadata log); wipes what it made."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", moto_options["key"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", moto_options["secret"])
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    made = []

    def new_url(bucket=BUCKET):
        url = f"s3://{bucket}/e2e-{uuid.uuid4().hex}"
        made.append(url)
        return url
    yield new_url
    for url in made:
        st = open_storage(url, **moto_options)
        for d in st.list_dirs(""):
            st.delete_tree(d)
        st.delete_many(f.name for f in st.list(""))


def new_bucket(moto_options) -> str:  # noqa: F811
    import boto3
    name = f"kafkalog-e2e-{uuid.uuid4().hex[:12]}"
    client = boto3.client("s3", endpoint_url=moto_options["endpoint_url"],
                          aws_access_key_id="testing", aws_secret_access_key="testing",
                          region_name="us-east-1")
    client.create_bucket(Bucket=name)   # the bucket is set up outside the code under test
    return name


def test_a_follower_on_s3_catches_up_streamed_and_takes_over_when_the_leader_is_lost(
        tmp_path, moto_options, s3_env):  # noqa: F811
    url = s3_env()
    admin = Admin(str(tmp_path / "root"), fsync=False)
    admin.add_log_dir(url, {"endpoint_url": moto_options["endpoint_url"]})
    admin.cluster.placement_random = random.Random(seed_for(2, 0))
    desc = admin.create_topic("t", 1, 2)
    assert desc.partitions[0].replicas == ["logdir-0", "logdir-1"]   # leader local, follower S3
    clock = Clock()
    rep = replicator(admin, clock)
    produce(admin, 10)
    produce(admin, 5, 10)

    results = until_in_sync(admin, rep)
    assert modes(results) == {"streamed": 2}                  # local -> S3: through this process
    r = rep_state(admin)
    assert (r["leader"], r["isr"], r["held"]) == ("logdir-0", ["logdir-0", "logdir-1"],
                                                  {"logdir-1": [[0, 15]]})
    leader_dir = tmp_path / "root" / "logdir-0" / "t-0"
    s3 = open_storage(url, **moto_options)
    leader_files = local_segments(leader_dir)
    assert len(leader_files) == 6
    assert sha(store_segments(s3, "t-0")) == sha(leader_files)
    assert store_segments(s3, "t-0") == leader_files          # byte for byte
    assert s3.read("t-0/partition.metadata") == (leader_dir / "partition.metadata").read_bytes()
    assert not [f.name for f in s3.list("t-0") if ".tmp-" in f.name]
    assert s3.read("t-0/leader-epoch-checkpoint") == \
        (leader_dir / "leader-epoch-checkpoint").read_bytes()   # the follower's own, equal
    visible = seen(admin)
    assert visible == [(i, b"k%d" % i, b"v%d" % i) for i in range(15)]

    # the leader's root goes away: one failed probe is not enough, the session timeout is
    epoch = admin.cluster.state().partition("t", 0).leader_epoch
    root0 = tmp_path / "root" / "logdir-0"
    away = tmp_path / "logdir-0-away"
    root0.rename(away)
    assert rep.tick().elections == {}
    clock.ms += SESSION_MS + 100
    result = rep.tick()
    assert result.elections == {"offline": 1}
    ps = admin.cluster.state().partition("t", 0)
    assert (ps.replication["leader"], ps.replication["isr"]) == ("logdir-1", ["logdir-1"])
    assert ps.leader_epoch == epoch + 1 and ps.high_watermark == 15
    fresh = Admin(str(tmp_path / "root"), create=False)       # a new client reads the S3 leader
    assert seen(fresh) == visible
    produce(fresh, 2, 15)                                     # writes follow it to S3
    assert seen(fresh) == visible + [(15, b"k15", b"v15"), (16, b"k16", b"v16")]
    assert "00000000000000000015.log" in {f.name for f in s3.list("t-0")}
    away.rename(root0)


def test_both_replicas_on_s3_copy_server_side(tmp_path, moto_options, s3_env):  # noqa: F811
    url_a, url_b = s3_env(), s3_env(new_bucket(moto_options))
    admin = Admin(str(tmp_path / "root"), fsync=False)
    opts = {"endpoint_url": moto_options["endpoint_url"]}
    assert admin.add_log_dir(url_a, opts).log_dir == "logdir-1"
    assert admin.add_log_dir(url_b, opts).log_dir == "logdir-2"
    # leader logdir-1 (start 1), its follower one place on: logdir-2 (an even shift)
    admin.cluster.placement_random = random.Random(seed_for(3, 1, lambda k: k % 2 == 0))
    desc = admin.create_topic("t", 1, 2)
    assert desc.partitions[0].replicas == ["logdir-1", "logdir-2"]
    rep = replicator(admin, Clock())
    produce(admin, 20)
    produce(admin, 3, 20)

    results = until_in_sync(admin, rep)
    assert modes(results) == {"server_side": 2}               # one endpoint: CopyObject
    a, b = open_storage(url_a, **moto_options), open_storage(url_b, **moto_options)
    src = store_segments(a, "t-0")
    assert len(src) == 6 and store_segments(b, "t-0") == src
    assert not [f.name for f in b.list("t-0") if ".tmp-" in f.name]
    assert rep_state(admin)["held"] == {"logdir-2": [[0, 23]]}
    assert [v for _, _, v in seen(admin)] == [b"v%d" % i for i in range(23)]


# -- Kafka's classes read a follower ---------------------------------------------------------------

def kafka_records(found, part="t-0"):
    return [(r["offset"], r["key"], r["value"]) for r in found.records(part)]


def test_kafka_reads_a_followers_log_dir_as_the_leaders(tmp_path, kafka_check):
    admin = Admin(str(tmp_path / "root"), fsync=False)
    admin.add_log_dir(str(tmp_path / "second"))
    admin.cluster.placement_random = random.Random(seed_for(2, 0))
    admin.create_topic("t", 1, 2)
    clock = Clock()
    rep = replicator(admin, clock)
    produce(admin, 10)
    produce(admin, 7, 10)
    produce(admin, 4, 17)
    until_in_sync(admin, rep)
    produce(admin, 3, 21)            # acks=1, not copied yet: on the leader, above the HW
    ps = admin.cluster.state().partition("t", 0)
    assert (ps.high_watermark, ps.last_stable_offset) == (21, 24)

    leader, follower = tmp_path / "root" / "logdir-0", tmp_path / "second"
    on_leader = kafka_check(leader, "t-0")
    on_follower = kafka_check(follower, "t-0")
    for found in (on_leader, on_follower):
        assert found.errors() == [] and found.problems("t-0") == []
    assert kafka_records(on_follower) == [r for r in kafka_records(on_leader) if r[0] < 21]
    assert kafka_records(on_follower) == seen(admin)           # exactly what readers see
    assert [b["partitionLeaderEpoch"] for b in on_follower.batches("t-0")] == \
        [ps.leader_epoch] * 3
    epochs = {d["partition"]: d["entries"] for d in on_follower.kind("leader-epochs")}
    assert epochs == {"t-0": [[ps.leader_epoch, 0]]}
    assert epochs == {d["partition"]: d["entries"] for d in on_leader.kind("leader-epochs")}
    [meta] = on_follower.kind("partition-metadata")
    assert meta["topicId"] == admin.describe_topic("t").topic_id

    # failover: the leader is lost, the follower leads (epoch + 1) and takes writes; the old
    # leader comes back, is truncated (its acks=1 batch at 21 was never in sync) and catches up
    root0, away = tmp_path / "root" / "logdir-0", tmp_path / "away"
    root0.rename(away)
    rep.tick()
    clock.ms += SESSION_MS + 100
    assert rep.tick().elections == {"offline": 1}
    fresh = Admin(str(tmp_path / "root"), create=False)
    produce(fresh, 5, 24)
    away.rename(root0)
    until_in_sync(admin, rep)
    ps = admin.cluster.state().partition("t", 0)
    assert ps.replication["leader"] == "logdir-1" and ps.high_watermark == 29
    on_old = kafka_check(leader, "t-0")
    on_new = kafka_check(follower, "t-0")
    assert on_old.errors() == [] and on_old.problems("t-0") == []
    want = [(i, b"k%d" % i, b"v%d" % i) for i in list(range(21)) + list(range(24, 29))]
    assert kafka_records(on_old) == kafka_records(on_new) == seen(admin) == want
    old_epochs = {d["partition"]: d["entries"] for d in on_old.kind("leader-epochs")}
    # epoch 0's data from 0; the election's epoch has none; the new writer's from 24 (§5)
    assert old_epochs == {"t-0": [list(e) for e in ps.leader_epoch_entries()]}
    assert [s for _, s in old_epochs["t-0"]] == [0, 24] and old_epochs["t-0"][1][0] > 1
    assert old_epochs == {d["partition"]: d["entries"] for d in on_new.kind("leader-epochs")}


# -- derived files (§1.3 "Derived files", §8) --------------------------------------------------

def in_sync_pair(tmp_path, produce_first=True):
    admin = Admin(str(tmp_path / "root"), fsync=False)
    admin.add_log_dir(str(tmp_path / "second"))
    admin.cluster.placement_random = random.Random(seed_for(2, 0))
    admin.create_topic("t", 1, 2)
    rep = replicator(admin, Clock())
    if produce_first:
        produce(admin, 10)
    until_in_sync(admin, rep)
    return admin, rep


def test_a_followers_log_dir_gets_its_own_offset_checkpoints(tmp_path):
    from pyspark_kafkalog.log.logdir import (LOG_START_CHECKPOINT, RECOVERY_POINT_CHECKPOINT,
                                             REPLICATION_CHECKPOINT, LogDir)
    in_sync_pair(tmp_path)
    follower = LogDir(open_storage(str(tmp_path / "second")))
    tp = ("t", 0)
    assert follower.read_checkpoint(REPLICATION_CHECKPOINT) == {tp: 10}
    assert follower.read_checkpoint(RECOVERY_POINT_CHECKPOINT) == {tp: 10}
    assert follower.read_checkpoint(LOG_START_CHECKPOINT) == {tp: 0}


def test_replication_passes_leave_the_leaders_recovery_point_to_maintenance(tmp_path,
                                                                             monkeypatch):
    """The leader's data may be unflushed (docs/protocol.md §3, "Durability"), and replication
    passes come every few hundred ms: they flush nothing and leave the leader's recovery point
    where it is, while a follower's follows its copies (durable when copied); the next
    maintenance flushes the leader's log dir and moves it."""
    from pyspark_kafkalog.log.logdir import RECOVERY_POINT_CHECKPOINT, LogDir
    from pyspark_kafkalog.storage.local import LocalStorage
    flushes = []
    real = LocalStorage.flush
    monkeypatch.setattr(LocalStorage, "flush",
                        lambda self, d="": (flushes.append(d), real(self, d))[1])
    admin, rep = in_sync_pair(tmp_path)
    for _ in range(3):
        rep.tick()
    assert flushes == []
    ps = admin.cluster.state().partition("t", 0)
    leader = ps.replication["leader"]
    follower = next(r for r in admin.cluster.state().topics["t"]["replicas"][0] if r != leader)
    point = lambda r: LogDir(admin.cluster.storage, r).read_checkpoint(
        RECOVERY_POINT_CHECKPOINT).get(("t", 0))
    assert point(follower) == 10 and point(leader) is None
    admin.cleanup()
    assert flushes and point(leader) == 10


def test_a_followers_epoch_checkpoint_covers_acks_all_data(tmp_path):
    from pyspark_kafkalog.format.checkpoint import format_leader_epoch_checkpoint
    admin, rep = in_sync_pair(tmp_path, produce_first=False)   # empty, both in the ISR
    with Background(rep):
        produce(admin, 4, acks="all")
    rep.tick()                                 # the pass after the commit writes them
    ps = admin.cluster.state().partition("t", 0)
    assert ps.high_watermark == 4 and ps.replication["held"] == {"logdir-1": [[0, 4]]}
    want = format_leader_epoch_checkpoint(ps.leader_epoch_entries())
    leader = tmp_path / "root" / "logdir-0" / "t-0" / "leader-epoch-checkpoint"
    assert leader.read_text() == want                           # the committer's: right
    follower = tmp_path / "second" / "t-0" / "leader-epoch-checkpoint"
    assert follower.read_text() == want


def test_the_leaders_files_follow_a_high_watermark_the_coordinator_moved(tmp_path):
    """acks=1 with the follower in the ISR: the commit writes the leader's files while the ISR
    still holds the high watermark back; the pass that moves it rewrites them."""
    from pyspark_kafkalog.format.checkpoint import format_leader_epoch_checkpoint
    from pyspark_kafkalog.log.logdir import REPLICATION_CHECKPOINT, LogDir
    admin, rep = in_sync_pair(tmp_path)                         # 10 records, in sync
    other = Admin(str(tmp_path / "root"), create=False, fsync=False)   # a new producer: epoch 1
    produce(other, 2, acks="1")
    leader_dir = LogDir(open_storage(str(tmp_path / "root" / "logdir-0")))
    assert leader_dir.read_checkpoint(REPLICATION_CHECKPOINT)[("t", 0)] == 10   # held back
    rep.tick()
    ps = admin.cluster.state().partition("t", 0)
    assert ps.high_watermark == 12 and len(ps.leader_epoch_entries()) == 2
    assert leader_dir.read_checkpoint(REPLICATION_CHECKPOINT)[("t", 0)] == 12
    want = format_leader_epoch_checkpoint(ps.leader_epoch_entries())
    for d in (tmp_path / "root" / "logdir-0" / "t-0", tmp_path / "second" / "t-0"):
        assert (d / "leader-epoch-checkpoint").read_text() == want
    assert LogDir(open_storage(str(tmp_path / "second"))).read_checkpoint(
        REPLICATION_CHECKPOINT)[("t", 0)] == 12


# -- Spark, with a running coordinator -------------------------------------------------------------

def wait_for(what, predicate, timeout_s=20.0, interval_s=0.05):
    deadline = time.monotonic() + timeout_s
    while True:
        got = predicate()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(interval_s)


def test_spark_writes_acks_all_and_acks_1_with_a_running_coordinator(tmp_path, ks):
    from pyspark_kafkalog import coordinator
    from pyspark_kafkalog.format.checkpoint import format_leader_epoch_checkpoint
    root, second = tmp_path / "root", tmp_path / "second"
    admin = Admin(str(root), fsync=False)
    admin.add_log_dir(str(second))
    admin.create_topic("t", 2, 2, {"min.insync.replicas": "2"})
    coord = coordinator.start(str(root), token="e2e-token-" + "x" * 16, metrics_port=None,
                              lease_ms=3_000, replica_fetch_wait_max_ms=50,
                              maintenance=False)
    try:
        assert coord.active and coord.replicator is not None
        # nothing to copy: both replicas of every (empty) partition join once the feature is on
        def in_sync():
            parts = admin.describe_topic("t").partitions
            return all(sorted(p.isr) == ["logdir-0", "logdir-1"] for p in parts)
        wait_for("the ISR of the empty partitions", in_sync, timeout_s=15)

        rows = [(f"k{i}", f"v{i}") for i in range(200)]
        df = ks.createDataFrame(rows, "key string, value string").repartition(3)
        df.write.format("kafkalog").option("topic", "t").mode("append").save(str(root))
        got = ks.read.format("kafkalog").option("subscribe", "t").load(str(root)).collect()
        assert sorted((bytes(r.key).decode(), bytes(r.value).decode()) for r in got) == \
            sorted(rows)
        desc = admin.describe_topic("t")
        assert sum(p.high_watermark for p in desc.partitions) == 200
        for p in desc.partitions:
            assert p.high_watermark == p.last_stable_offset
            assert sorted(p.isr) == ["logdir-0", "logdir-1"]

        def dirs(p):
            d = {"logdir-0": root / "logdir-0" / f"t-{p.partition}",
                 "logdir-1": second / f"t-{p.partition}"}
            return d[p.leader], d[next(r for r in p.replicas if r != p.leader)]
        for p in desc.partitions:
            lead, follow = dirs(p)
            # acks=all: the follower held every segment before the commit
            assert local_segments(follow) == local_segments(lead)
            assert any(n.endswith(".log") for n in local_segments(lead))

        more = [(f"k{i}", f"w{i}") for i in range(200, 260)]
        (ks.createDataFrame(more, "key string, value string").repartition(2)
         .write.format("kafkalog").option("topic", "t").option("acks", "1").mode("append")
         .save(str(root)))

        def all_visible():
            ps = [admin.cluster.state().partition("t", p) for p in (0, 1)]
            return all(s.high_watermark == s.last_stable_offset for s in ps) and \
                sum(s.high_watermark for s in ps) == 260
        wait_for("the acks=1 rows to pass the high watermark", all_visible)
        got = ks.read.format("kafkalog").option("subscribe", "t").load(str(root)).collect()
        assert sorted((bytes(r.key).decode(), bytes(r.value).decode()) for r in got) == \
            sorted(rows + more)
        state = admin.cluster.state()
        for p in admin.describe_topic("t").partitions:
            lead, follow = dirs(p)
            assert local_segments(follow) == local_segments(lead)
            assert (follow / "partition.metadata").read_bytes() == \
                (lead / "partition.metadata").read_bytes()
            # acks=1 data is copied once committed, so the follower's epochs include the new
            # writer's (the leader's own file waits for maintenance: see the module docstring)
            entries = state.partition("t", p.partition).leader_epoch_entries()
            assert len(entries) == 2
            assert (follow / "leader-epoch-checkpoint").read_text() == \
                format_leader_epoch_checkpoint(entries)
    finally:
        coord.stop()
    assert coord.exit_reason == "stopped"
    assert admin.cluster.state().coordinator["holder"] == ""   # released: a standby may take over
