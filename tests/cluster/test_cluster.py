"""The cluster protocol in one process: metadata log, visibility, KIP-107, retention, groups."""
from __future__ import annotations

import json
import os

import pytest

from pyspark_kafkalog.cluster import actions as A
from pyspark_kafkalog.admin import Admin, TopicPartition as TP
from pyspark_kafkalog.cluster.cluster import Cluster
from pyspark_kafkalog.cluster.metalog import MetadataLog
from pyspark_kafkalog.client.producer import Producer
from pyspark_kafkalog.errors import (FencedLeaderEpochError, InvalidConfigError, InvalidTopicError,
                                     OffsetOutOfRangeError, TopicAlreadyExistsError,
                                     TopicAuthorizationFailedError, UnknownTopicOrPartitionError)
from pyspark_kafkalog.format import checkpoint as ckpt
from pyspark_kafkalog.format.columnar import decode_records
from pyspark_kafkalog.format.records import Record


class Clock:
    def __init__(self, t=1_700_000_000.0):
        self.t = t

    def __call__(self):
        return self.t


def _recs(n, start=0, ts=1_000):
    return [Record(b"k%d" % (start + i), b"v%d" % (start + i), ts + i) for i in range(n)]


@pytest.fixture
def admin(tmp_path):
    return Admin(str(tmp_path / "c"))


def _visible(admin, topic, p=None):
    return [(r.partition, r.offset, r.value) for r in admin.consume(topic, p)]


def test_topics_create_describe_alter_delete(admin):
    d = admin.create_topic("orders", 3, configs={"retention.ms": 1000})
    assert [p.partition for p in d.partitions] == [0, 1, 2]
    assert d.configs == {"retention.ms": "1000"}
    with pytest.raises(TopicAlreadyExistsError):
        admin.create_topic("orders")
    for bad in ("", ".", "..", "a/b", "x" * 250, "sp ace"):
        with pytest.raises(InvalidTopicError):
            admin.create_topic(bad)
    with pytest.raises(InvalidConfigError, match="retention.mss"):
        admin.create_topic("t2", configs={"retention.mss": 1})
    with pytest.raises(InvalidConfigError):
        admin.alter_configs("orders", {"segment.bytes": "nope"})
    assert admin.alter_configs("orders", {"segment.bytes": 5000}, ["retention.ms"]).configs == {
        "segment.bytes": "5000"}
    assert admin.create_partitions("orders", 5).partitions[-1].partition == 4
    assert admin.list_topics() == ["orders"]
    admin.produce("orders", _recs(10))
    admin.delete_topic("orders")
    assert admin.list_topics() == []
    with pytest.raises(UnknownTopicOrPartitionError):
        admin.describe_topic("orders")
    # a new incarnation starts empty: nothing of the old one comes back
    admin.create_topic("orders", 1)
    assert _visible(admin, "orders") == []


def test_state_is_the_same_for_every_reader_and_survives_snapshots(tmp_path):
    url = str(tmp_path / "c")
    a = Admin(Cluster(url, snapshot_interval=3))
    a.create_topic("t", 2)
    for i in range(10):
        a.produce("t", _recs(3, 3 * i), partition=i % 2)
    fresh = MetadataLog(a.cluster.storage)
    s1, s2 = a.cluster.state(), fresh.state()
    assert s1.to_snapshot() == s2.to_snapshot()
    snaps = [n for n in os.listdir(tmp_path / "c" / "_kafkalog" / "log") if "snapshot" in n]
    assert len(snaps) >= 3
    # entries below the second-newest snapshot may go; a new reader still gets the same state
    removed = a.cluster.metalog.cleanup(min_age_ms=0)
    assert removed
    assert MetadataLog(a.cluster.storage).state().to_snapshot() == s1.to_snapshot()


def test_a_state_copy_is_equal_and_independent(admin):
    admin.create_topic("t", 2, configs={"retention.ms": 1000})
    admin.produce("t", _recs(3), partition=0)
    prod = Producer(admin.cluster)
    prod.write({("t", 1): prod.encode("t", _recs(2))})     # an open write: txns, open ranges
    state = admin.cluster.state()
    before = json.dumps(state.to_snapshot(), sort_keys=True)
    c = state.copy()
    assert json.dumps(c.to_snapshot(), sort_keys=True) == before
    # the copy shares what neither changed (copy-on-write): replaying into it takes private
    # copies of what each action changes, and the original stays as it was
    txn = next(iter(c.txns))
    for i, action in enumerate([
            A.AlterConfigs(topic="t", set={"retention.ms": "1"}),
            A.SetLogStart(partitions={"t:0": 2}),
            A.Commit(txns=[txn]),
            A.Reserve(txn="r2", producer="p2", timeout_ms=5, partitions={"t:0": 1, "t:1": 1}),
            A.Abort(txns=["r2"]),
            A.AclChange(add=[{"principal": "x", "topic": "t", "operation": "READ",
                              "permission": "DENY"}]),
            A.DeleteTopic(topic="t")]):
        c.apply(c.seq + 1, {"version": 1, "timestamp": 1, "actions": [action.to_json()]})
        assert c.results[c.seq][0].ok, (action, c.results[c.seq][0])
    assert "t" not in c.topics and c.decided[txn] == "committed"
    assert json.dumps(state.to_snapshot(), sort_keys=True) == before


def test_an_open_write_holds_back_the_high_watermark(admin):
    admin.create_topic("t")
    prod = Producer(admin.cluster)
    admin.produce("t", _recs(3))
    pending = prod.write({("t", 0): prod.encode("t", _recs(4, 100))})
    admin.produce("t", _recs(2, 200))                 # committed, but after the open write
    assert admin.describe_topic("t").partitions[0].high_watermark == 3
    assert [o for _, o, _ in _visible(admin, "t")] == [0, 1, 2]
    prod.commit([pending])
    assert [o for _, o, _ in _visible(admin, "t")] == list(range(9))


def test_an_aborted_write_leaves_a_gap_and_no_files(admin, tmp_path):
    admin.create_topic("t")
    prod = Producer(admin.cluster)
    admin.produce("t", _recs(3))
    pending = prod.write({("t", 0): prod.encode("t", _recs(4, 100))})
    prod.abort([pending])
    admin.produce("t", _recs(2, 200))
    assert [o for _, o, _ in _visible(admin, "t")] == [0, 1, 2, 7, 8]
    logs = sorted(p.name for p in (tmp_path / "c" / "logdir-0" / "t-0").glob("*.log"))
    assert logs == ["00000000000000000000.log", "00000000000000000007.log"]


def test_expired_writes_are_aborted_and_a_late_commit_is_fenced(tmp_path):
    clock = Clock()
    cluster = Cluster(str(tmp_path / "c"), clock=clock, transaction_timeout_ms=5_000)
    admin = Admin(cluster)
    admin.create_topic("t", 2)
    zombie = Producer(Cluster(str(tmp_path / "c"), clock=clock, transaction_timeout_ms=5_000))
    pending = zombie.write({("t", 0): zombie.encode("t", _recs(5)),
                            ("t", 1): zombie.encode("t", _recs(5))})
    clock.t += 10
    admin.produce("t", _recs(2, 50), partition=0)     # a writer aborts expired writes first
    with pytest.raises(FencedLeaderEpochError):
        zombie.commit([pending])
    assert [o for _, o, _ in _visible(admin, "t")] == [5, 6]
    assert admin.describe_topic("t").partitions[1].high_watermark == 5


def test_commit_after_the_deadline_is_rejected_even_without_an_abort(tmp_path):
    clock = Clock()
    cluster = Cluster(str(tmp_path / "c"), clock=clock, transaction_timeout_ms=1_000)
    Admin(cluster).create_topic("t")
    prod = Producer(cluster)
    pending = prod.write({("t", 0): prod.encode("t", _recs(2))})
    clock.t += 2
    with pytest.raises(FencedLeaderEpochError, match="deadline"):
        prod.commit([pending])
    assert list(Admin(cluster).consume("t")) == []


def test_one_commit_makes_many_writes_visible_together(admin):
    admin.create_topic("a", 3)
    admin.create_topic("b", 2)
    prod = Producer(admin.cluster)
    pendings = [prod.write({(t, p): prod.encode(t, _recs(2, 10 * p))})
                for t, n in (("a", 3), ("b", 2)) for p in range(n)]
    assert _visible(admin, "a") == [] and _visible(admin, "b") == []
    prod.commit(pendings)
    assert len(_visible(admin, "a")) == 6 and len(_visible(admin, "b")) == 4


def test_leader_epoch_changes_with_the_writer(tmp_path):
    url = str(tmp_path / "c")
    a = Admin(url)
    a.create_topic("t")
    a.produce("t", _recs(2))
    a.produce("t", _recs(2))
    Admin(url).produce("t", _recs(3))        # another process: the right to write changed hands
    assert a.describe_topic("t").partitions[0].leader_epoch == 1
    text = (tmp_path / "c" / "logdir-0" / "t-0" / "leader-epoch-checkpoint").read_text()
    assert ckpt.parse_leader_epoch_checkpoint(text) == [(0, 0), (1, 4)]
    epochs = set()
    for f in sorted((tmp_path / "c" / "logdir-0" / "t-0").glob("*.log")):
        epochs |= {(r.offset >= 4, r.partition_leader_epoch) for r in decode_records(f.read_bytes())}
    assert epochs == {(False, 0), (True, 1)}


def test_a_commit_rewrites_leader_epoch_checkpoint_only_where_an_epoch_begins(tmp_path):
    """Same epoch: the file's content cannot change, so it is left alone (one file and two
    fsyncs per partition were most of a 1,000-partition commit); a new epoch rewrites it."""
    url = str(tmp_path / "c")
    a = Admin(url)
    a.create_topic("t", 2)
    a.produce("t", _recs(2), partition=0)
    a.produce("t", _recs(2), partition=1)
    d = tmp_path / "c" / "logdir-0"
    inode = lambda p: os.stat(d / f"t-{p}" / "leader-epoch-checkpoint").st_ino
    before = inode(0), inode(1)
    a.produce("t", _recs(2), partition=0)                  # same writer, same epoch
    assert (inode(0), inode(1)) == before
    Admin(url).produce("t", _recs(3), partition=0)         # another writer: epoch 1 begins
    assert inode(0) != before[0] and inode(1) == before[1]
    text = (d / "t-0" / "leader-epoch-checkpoint").read_text()
    assert ckpt.parse_leader_epoch_checkpoint(text) == [(0, 0), (1, 4)]


def _kafka_recovered_epochs(part_dir, recovery_point):
    """The leader epochs Kafka's broker holds after loading ``part_dir`` without a clean-shutdown
    marker: its ``leader-epoch-checkpoint``, then every batch of the segments from the one
    holding the recovery point on, assigned when its epoch is newer than the latest
    (LogLoader.recoverLog and LogSegment.recover in Kafka's storage module)."""
    from pyspark_kafkalog.format.batch import iter_headers
    path = part_dir / "leader-epoch-checkpoint"
    cache = ckpt.parse_leader_epoch_checkpoint(path.read_text()) if path.exists() else []
    cache = [tuple(e) for e in cache]
    bases = sorted(int(f.name[:-4]) for f in part_dir.glob("*.log"))
    first = max([b for b in bases if b <= recovery_point] or [bases[0]])
    for base in (b for b in bases if b >= first):
        for h in iter_headers((part_dir / f"{base:020d}.log").read_bytes()):
            if h.partition_leader_epoch > (cache[-1][0] if cache else -1):
                cache.append((h.partition_leader_epoch, h.base_offset))
    return cache


#: a topic whose every write is flushed, so that each commit moves the recovery point (§3, §8)
FLUSHED = {"flush.messages": "1"}


def test_above_the_inline_limit_a_commit_leaves_epochs_with_the_recovery_point(tmp_path,
                                                                                 monkeypatch):
    """Past INLINE_CHECKPOINT_MAX_PARTITIONS a commit rewrites no derived file (docs/protocol.md
    §8): the epochs it begins lie past the recovery point it also leaves behind, where Kafka's
    load rebuilds them from the batches; maintenance then writes both."""
    from pyspark_kafkalog.cluster import checkpoints
    url = str(tmp_path / "c")
    Admin(url).create_topic("t", 3, configs=FLUSHED)
    Admin(url).produce("t", _recs(4), partition=0)           # small cluster: written inline
    d = tmp_path / "c" / "logdir-0"
    read_rp = lambda: ckpt.parse_offset_checkpoint(
        (d / "recovery-point-offset-checkpoint").read_text())
    assert ckpt.parse_leader_epoch_checkpoint((d / "t-0" / "leader-epoch-checkpoint")
                                              .read_text()) == [(0, 0)]
    monkeypatch.setattr(checkpoints, "INLINE_CHECKPOINT_MAX_PARTITIONS", 2)
    for n in (3, 2):                                         # two new writers: epochs 1, 2
        Admin(url).produce("t", _recs(n), partition=0)
    a = Admin(url)
    entries = [tuple(e) for e in a.cluster.state().partition("t", 0).leader_epoch_entries()]
    assert entries == [(0, 0), (1, 4), (2, 7)]
    assert ckpt.parse_leader_epoch_checkpoint((d / "t-0" / "leader-epoch-checkpoint")
                                              .read_text()) == [(0, 0)]   # left behind ...
    assert read_rp()[("t", 0)] == 4                          # ... with the recovery point
    assert _kafka_recovered_epochs(d / "t-0", read_rp()[("t", 0)]) == entries
    a.cleanup()                                              # maintenance writes both
    assert ckpt.parse_leader_epoch_checkpoint((d / "t-0" / "leader-epoch-checkpoint")
                                              .read_text()) == entries
    assert read_rp()[("t", 0)] == 9
    assert _kafka_recovered_epochs(d / "t-0", 9) == entries


def test_a_commit_over_many_partitions_leaves_epochs_with_the_recovery_point(tmp_path,
                                                                             monkeypatch):
    """A commit that made more than INLINE_CHECKPOINT_MAX_WRITTEN partitions visible rewrites no
    derived file, however small the cluster (docs/protocol.md §8): every partition's epoch
    stays behind together with its recovery point, where Kafka's load rebuilds it."""
    from pyspark_kafkalog.cluster import checkpoints
    url = str(tmp_path / "c")
    Admin(url).create_topic("t", 3, configs=FLUSHED)
    Admin(url).produce("t", _recs(4), partition=0)           # one partition: written inline
    d = tmp_path / "c" / "logdir-0"
    read = lambda name: ckpt.parse_offset_checkpoint((d / name).read_text())
    epochs = lambda p: ckpt.parse_leader_epoch_checkpoint(
        (d / f"t-{p}" / "leader-epoch-checkpoint").read_text())
    assert read("recovery-point-offset-checkpoint")[("t", 0)] == 4 and epochs(0) == [(0, 0)]
    monkeypatch.setattr(checkpoints, "INLINE_CHECKPOINT_MAX_WRITTEN", 2)
    a = Admin(url)                                           # a new writer: epochs begin
    placed = a.produce("t", _recs(30, start=100))            # one commit over 3 partitions
    assert {m.partition for m in placed} == {0, 1, 2}
    state = a.cluster.state()
    entries = {p: [tuple(e) for e in state.partition("t", p).leader_epoch_entries()]
               for p in range(3)}
    assert entries[0] == [(0, 0), (1, 4)]
    rp = read("recovery-point-offset-checkpoint")
    assert epochs(0) == [(0, 0)] and rp[("t", 0)] == 4       # left behind together
    assert read("replication-offset-checkpoint")[("t", 0)] == 4
    for p in range(3):
        assert _kafka_recovered_epochs(d / f"t-{p}", rp.get(("t", p), 0)) == entries[p]
    a.produce("t", _recs(2), partition=1)                    # 1 partition: inline again
    assert epochs(1) == entries[1]                           # the epoch it passes, first
    assert read("recovery-point-offset-checkpoint")[("t", 1)] == \
        state.partition("t", 1).high_watermark + 2
    a.cleanup()                                              # maintenance writes the rest
    for p in range(3):
        assert epochs(p) == entries[p]
    assert read("recovery-point-offset-checkpoint")[("t", 0)] == \
        state.partition("t", 0).high_watermark


def test_back_under_the_inline_limit_a_commit_catches_up_the_epochs_it_passes(tmp_path,
                                                                               monkeypatch):
    """Epochs a large cluster's commits left to maintenance are written by the first commit
    that moves the recovery point past them again (the cluster shrank), even when that commit
    begins no epoch of its own: the recovery point never passes an epoch the file lacks."""
    from pyspark_kafkalog.cluster import checkpoints
    url = str(tmp_path / "c")
    Admin(url).create_topic("t", 1, configs=FLUSHED)
    Admin(url).produce("t", _recs(4), partition=0)            # epoch 0, written inline
    monkeypatch.setattr(checkpoints, "INLINE_CHECKPOINT_MAX_PARTITIONS", 0)
    writer = Admin(url)
    writer.produce("t", _recs(3), partition=0)                # epoch 1 begins: left behind
    d = tmp_path / "c" / "logdir-0"
    epochs = lambda: ckpt.parse_leader_epoch_checkpoint(
        (d / "t-0" / "leader-epoch-checkpoint").read_text())
    assert epochs() == [(0, 0)]
    monkeypatch.setattr(checkpoints, "INLINE_CHECKPOINT_MAX_PARTITIONS", 1000)
    writer.produce("t", _recs(2), partition=0)                # same writer: no epoch begins
    rp = ckpt.parse_offset_checkpoint((d / "recovery-point-offset-checkpoint").read_text())
    assert rp[("t", 0)] == 9 and epochs() == [(0, 0), (1, 4)]
    assert _kafka_recovered_epochs(d / "t-0", 9) == [(0, 0), (1, 4)]


@pytest.mark.parametrize("configs", [FLUSHED, {}])
def test_kafka_checkpoints_follow_the_metadata(admin, tmp_path, monkeypatch, configs):
    """The recovery point says what is on the device: a commit moves it when its write was
    flushed (protocol §3, "Durability"); else the first maintenance that flushes the log dir
    (here delete-records, for the partition it touches; then cleanup, for all)."""
    from pyspark_kafkalog.storage.local import LocalStorage
    flushes = []
    real = LocalStorage.flush
    monkeypatch.setattr(LocalStorage, "flush",
                        lambda self, d="": (flushes.append(d), real(self, d))[1])
    admin.create_topic("t", 2, configs=configs)
    admin.produce("t", _recs(5), partition=0)
    admin.produce("t", _recs(3), partition=1)
    assert flushes == []
    admin.delete_records_before({TP("t", 0): 2})
    assert flushes == ["logdir-0"]
    root = tmp_path / "c" / "logdir-0"
    read = lambda name: ckpt.parse_offset_checkpoint((root / name).read_text())
    assert read("replication-offset-checkpoint") == {("t", 0): 5, ("t", 1): 3}
    assert read("recovery-point-offset-checkpoint") == (
        {("t", 0): 5, ("t", 1): 3} if configs else {("t", 0): 5})
    assert read("log-start-offset-checkpoint") == {("t", 0): 2, ("t", 1): 0}
    admin.cleanup()
    assert read("recovery-point-offset-checkpoint") == {("t", 0): 5, ("t", 1): 3}
    meta = ckpt.parse_meta_properties((root / "meta.properties").read_text("latin-1"))
    assert meta["version"] == "1" and meta["cluster.id"] == admin.cluster.cluster_id


# -- KIP-107 -------------------------------------------------------------------------------------

def test_kip107_delete_records_table(admin, tmp_path):
    admin.create_topic("t", 2, configs={"segment.bytes": 300})
    for i in range(6):
        admin.produce("t", _recs(5, 5 * i), partition=0)
    admin.produce("t", _recs(4), partition=1)
    seg_dir = tmp_path / "c" / "logdir-0" / "t-0"
    before = sorted(seg_dir.glob("*.log"))
    assert len(before) == 6
    res = admin.delete_records_before({TP("t", 0): 12, TP("t", 1): -1, TP("t", 5): 1,
                                       TP("nope", 0): 1})
    assert res[TP("t", 0)].low_watermark == 12 and res[TP("t", 0)].error is None
    assert res[TP("t", 1)].low_watermark == 4                      # -1 = the high watermark
    assert isinstance(res[TP("t", 5)].error, UnknownTopicOrPartitionError)
    assert isinstance(res[TP("nope", 0)].error, UnknownTopicOrPartitionError)
    # above the high watermark: OffsetOutOfRange, and nothing changes
    res = admin.delete_records_before({TP("t", 0): 31})
    assert isinstance(res[TP("t", 0)].error, OffsetOutOfRangeError)
    assert admin.describe_topic("t").partitions[0].log_start_offset == 12
    # idempotent repeats and lower offsets keep the low watermark
    for off in (12, 3):
        assert admin.delete_records_before({TP("t", 0): off})[TP("t", 0)].low_watermark == 12
    # whole segments below the log start offset are gone; the one holding it stays
    after = sorted(p.name for p in seg_dir.glob("*.log"))
    assert after == [p.name for p in before[2:]]
    # the checkpoint file says the same
    lso = ckpt.parse_offset_checkpoint(
        (tmp_path / "c" / "logdir-0" / "log-start-offset-checkpoint").read_text())
    assert lso[("t", 0)] == 12 and lso[("t", 1)] == 4
    # reads below the log start offset fail; earliest means the log start offset
    with pytest.raises(OffsetOutOfRangeError):
        admin.consume("t", 0, start=11)
    assert list(admin.consume("t", 0))[0].offset == 12
    assert admin.list_offsets({TP("t", 0): "earliest"})[TP("t", 0)].offset == 12


def test_kip107_authorization(tmp_path):
    url = str(tmp_path / "c")
    owner = Admin(url, principal="User:owner")
    owner.create_topic("t")
    owner.produce("t", _recs(5))
    owner.add_acl("User:owner", "t", "ALL", "ALLOW")
    intruder = Admin(url, principal="User:mallory")
    res = intruder.delete_records_before({TP("t", 0): 3})
    assert isinstance(res[TP("t", 0)].error, TopicAuthorizationFailedError)
    assert owner.describe_topic("t").partitions[0].log_start_offset == 0
    with pytest.raises(TopicAuthorizationFailedError):
        intruder.produce("t", _recs(1))
    assert owner.delete_records_before({TP("t", 0): 3})[TP("t", 0)].low_watermark == 3
    owner.add_acl("User:mallory", "t", "DELETE", "ALLOW")
    assert intruder.delete_records_before({TP("t", 0): 4})[TP("t", 0)].low_watermark == 4
    owner.add_acl("User:mallory", "*", "DELETE", "DENY")          # DENY wins
    assert intruder.delete_records_before({TP("t", 0): 5})[TP("t", 0)].error is not None


# -- retention -----------------------------------------------------------------------------------

def test_retention_ms_uses_each_segments_largest_timestamp(admin):
    admin.create_topic("t", configs={"retention.ms": 1000, "segment.bytes": 100})
    for i in range(5):                       # one segment per write, timestamps 10s apart
        admin.produce("t", [Record(b"k", b"v" * 40, 10_000 * (i + 1))])
    plans = admin.retention(now_ms=35_500, dry_run=True)
    assert [p.segments for p in plans] == [[0, 1, 2]]       # largest ts 10k, 20k, 30k < 34.5k
    assert admin.describe_topic("t").partitions[0].log_start_offset == 0
    admin.retention(now_ms=35_500)
    assert admin.describe_topic("t").partitions[0].log_start_offset == 3
    assert [r.offset for r in admin.consume("t")] == [3, 4]
    assert admin.retention(now_ms=35_500) == []             # idempotent


def test_retention_bytes_per_partition_deletes_whole_segments(admin):
    admin.create_topic("t", 2, configs={"retention.bytes": 250, "segment.bytes": 100,
                                        "retention.ms": -1})
    for i in range(6):
        admin.produce("t", [Record(b"k", b"v" * 40, i)], partition=0)
    admin.produce("t", [Record(b"k", b"v" * 40, 0)], partition=1)
    size = admin.describe_log_dirs()["logdir-0"][TP("t", 0)]
    seg = size // 6
    plans = admin.retention()
    # Kafka's rule: delete the oldest segment while what remains is still >= retention.bytes
    assert [(p.partition, len(p.segments)) for p in plans] == [(0, 3)]
    left = admin.describe_log_dirs()["logdir-0"][TP("t", 0)]
    assert left == 3 * seg and left >= 250 > left - seg
    assert [r.offset for r in admin.consume("t", 0)] == [3, 4, 5]


def test_retention_spares_compacted_topics(admin):
    admin.create_topic("t", configs={"retention.ms": 1, "cleanup.policy": "compact"})
    admin.produce("t", [Record(b"k", b"v", 1)])
    assert admin.retention(now_ms=10**12) == []


# -- consumer groups -----------------------------------------------------------------------------

def test_groups_commit_describe_reset(admin):
    admin.create_topic("t", 2)
    admin.produce("t", _recs(6), partition=0)
    admin.produce("t", _recs(4), partition=1)
    got = list(admin.consume("t", 0, group="g", max_records=4))
    assert [r.offset for r in got] == [0, 1, 2, 3]
    assert [r.offset for r in admin.consume("t", 0, group="g")] == [4, 5]
    lag = {(l.topic, l.partition): (l.committed_offset, l.log_end_offset, l.lag)
           for l in admin.describe_group("g")}
    assert lag == {("t", 0): (6, 6, 0), ("t", 1): (None, 4, None)}
    assert admin.reset_group_offsets("g", "t", to="shift", shift=-2) == {TP("t", 0): 4,
                                                                         TP("t", 1): 0}
    assert admin.reset_group_offsets("g", "t", to="timestamp", timestamp_ms=1_002) == {
        TP("t", 0): 2, TP("t", 1): 2}
    assert admin.reset_group_offsets("g", "t", to="latest", dry_run=True) == {
        TP("t", 0): 6, TP("t", 1): 4}
    assert admin.list_group_offsets("g")[TP("t", 0)].offset == 2
    assert admin.list_groups() == ["g"]
    admin.delete_group("g")
    assert admin.list_groups() == []


def test_retention_planned_before_a_topic_was_recreated_touches_nothing(admin):
    from pyspark_kafkalog.maintenance.retention import apply_retention, plan_retention
    admin.create_topic("t", configs={"retention.ms": 1000, "segment.bytes": 100})
    for i in range(3):
        admin.produce("t", [Record(b"k", b"v" * 40, 10_000 * (i + 1))])
    plans = plan_retention(admin.cluster, admin.cluster.state(), 35_500)
    assert plans and plans[0].segments
    admin.delete_topic("t")
    admin.create_topic("t", configs={"segment.bytes": 100})
    for i in range(3):
        admin.produce("t", [Record(b"k", b"w" * 40, 10_000 * (i + 1))])
    apply_retention(admin.cluster, plans)
    assert [r.offset for r in admin.consume("t")] == [0, 1, 2]
    assert admin.describe_topic("t").partitions[0].log_start_offset == 0


# -- topic names that collide: Kafka's Topic.hasCollision -----------------------------------------

def _cli(*argv):
    import subprocess
    import sys
    proc = subprocess.run([sys.executable, "-m", "pyspark_kafkalog.cli.main", *map(str, argv)],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.getcwd()})
    return proc.returncode, proc.stdout, proc.stderr


@pytest.mark.parametrize("first,second", [("t.1", "t_1"), ("t_1", "t.1"), ("a.b_c", "a_b.c")])
def test_a_topic_whose_name_collides_with_another_is_refused(admin, first, second):
    admin.create_topic(first)
    with pytest.raises(InvalidTopicError, match=rf"topic '{second}' collides with existing "
                                                rf"topic '{first}'") as info:
        admin.create_topic(second, 2)
    assert info.value.error_code == 17
    assert admin.list_topics() == [first]
    admin.create_topic(first.replace(".", "-").replace("_", "-"))   # '-' is not one of them
    admin.delete_topic(first)                  # the name is free again once the other is gone
    admin.create_topic(second)
    assert second in admin.list_topics() and first not in admin.list_topics()


@pytest.mark.parametrize("first,second", [("t.1", "t_1"), ("t_1", "t.1")])
def test_cli_refuses_a_colliding_topic_name(tmp_path, first, second):
    url = tmp_path / "c"
    assert _cli("--cluster", url, "topics", "--create", "--topic", first)[0] == 0
    rc, out, err = _cli("--cluster", url, "topics", "--create", "--topic", second)
    assert rc == 2 and out == "" and "Traceback" not in err, (out, err)
    assert err.count("\n") == 1, err
    assert err.startswith(f"kafkalog: error: InvalidTopicError: topic '{second}' collides with "
                          f"existing topic '{first}'"), err
    assert _cli("--cluster", url, "topics", "--list") == (0, f"{first}\n", "")


def _written_before_the_rule(monkeypatch, url, topics):
    """A cluster whose metadata log was written without the collision rule, replayed afresh
    (no snapshot): (the state it was written with, the state a reader replays now)."""
    from pathlib import Path
    from pyspark_kafkalog.cluster import state as state_module
    with monkeypatch.context() as m:
        m.setattr(state_module, "colliding_topics", lambda topic, existing: [])
        a = Admin(url)
        for i, t in enumerate(topics):
            a.create_topic(t)
            a.produce(t, _recs(2, 2 * i))
        old = a.cluster.state()
    for snap in (Path(url) / "_kafkalog" / "log").glob("*.snapshot.json"):
        snap.unlink()
    return old, MetadataLog(Cluster(url).storage).state()


def test_an_existing_cluster_replays_the_same_under_the_rule(tmp_path, monkeypatch):
    url = str(tmp_path / "c")
    old, new = _written_before_the_rule(monkeypatch, url, ["a.b", "a-b", "ab", "a_c", "b.b"])
    assert json.dumps(new.to_snapshot(), sort_keys=True) == \
        json.dumps(old.to_snapshot(), sort_keys=True)
    assert [r.value for r in Admin(url).consume("a.b")] == [b"v0", b"v1"]


def test_a_log_that_already_holds_a_collision_still_replays(tmp_path, monkeypatch):
    """Written before the rule, `x_y` after `x.y`: the replay does not stop; the first keeps its
    data, the later create is now refused like any colliding one (one rule for every entry)."""
    url = str(tmp_path / "c")
    old, new = _written_before_the_rule(monkeypatch, url, ["x.y", "x_y", "z"])
    assert sorted(old.topics) == ["x.y", "x_y", "z"]
    assert sorted(new.topics) == ["x.y", "z"]
    admin = Admin(url)
    assert [r.value for r in admin.consume("x.y")] == [b"v0", b"v1"]
    assert [r.value for r in admin.consume("z")] == [b"v4", b"v5"]


# -- data the metadata promises but no segment holds ----------------------------------------------

def test_missing_data_is_reported_as_what_happened_not_as_a_moved_log_start(admin, tmp_path):
    admin.create_topic("t", 1)
    for i in range(3):              # three writes, three segments: 0-2, 3-5, 6-8
        admin.produce("t", _recs(3, 3 * i), partition=0)
    d = tmp_path / "c" / "logdir-0" / "t-0"
    (d / "00000000000000000003.log").unlink()     # by hand: the log start offset stays 0
    assert admin.describe_topic("t").partitions[0].log_start_offset == 0
    fix = (f". If it was lost, `kafkalog --cluster {admin.cluster.storage.url} repair --topic t "
           "--partition 0` makes the lost offsets a gap that readers step over (add --dry-run to "
           "see them)")
    with pytest.raises(OffsetOutOfRangeError) as info:
        list(admin.consume("t"))
    assert str(info.value) == (
        "t-0: the metadata says offset 3 holds committed data, but it is in a gap between "
        "segment files (00000000000000000000.log ends at offset 2, the next one starts at offset "
        "6): it was deleted after the metadata was read, or lost" + fix)
    (d / "00000000000000000000.log").unlink()
    with pytest.raises(OffsetOutOfRangeError) as info:
        list(admin.consume("t"))
    assert str(info.value) == (
        "t-0: the metadata says offset 0 holds committed data, but no segment file holds it (the "
        "first committed one starts at offset 6): it was deleted after the metadata was read, or "
        "lost" + fix)
    assert "log start offset" not in str(info.value)
