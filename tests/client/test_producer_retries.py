"""The producer retries a failed unit as Kafka's does (``delivery.timeout.ms``,
``retry.backoff.ms``): only retriable errors, only while nothing of the unit is visible, never
duplicating it, and a commit whose answer failed after it landed is a success."""
from __future__ import annotations

import threading

import pytest

from pyspark_kafkalog.admin import Admin
from pyspark_kafkalog.cluster import actions as A
from pyspark_kafkalog.client.producer import Producer
from pyspark_kafkalog.errors import (FencedLeaderEpochError, KafkaStorageError,
                                     NotEnoughReplicasError, RecordTooLargeError)
from pyspark_kafkalog.format.records import Record
from support.replication_support import in_sync, setup

RECORDS = [Record(b"k%d" % i, b"v%d" % i) for i in range(3)]


@pytest.fixture
def admin(tmp_path):
    a = Admin(str(tmp_path / "c"), fsync=False)
    a.create_topic("t", 1)
    return a


def values(admin):
    return [r.value for r in admin.consume("t")]


def test_a_unit_aborted_under_it_is_written_again_once(admin, monkeypatch):
    """An election aborts every open txn of the partition; the writer's commit then fails with
    FENCED_LEADER_EPOCH. Nothing of it shows, so the retry is the only copy."""
    producer = Producer(admin.cluster, retry_backoff_ms=1)
    real = Producer.commit
    calls = []

    def aborted_first(self, pending):
        pending = list(pending)
        if not calls:
            admin.cluster.submit([A.Abort(txns=[p.txn for p in pending],
                                          reason="leader_election")])
        calls.append(1)
        return real(self, pending)

    monkeypatch.setattr(Producer, "commit", aborted_first)
    placed = producer.produce("t", RECORDS, partition=0)
    assert len(calls) == 2
    assert values(admin) == [b"v0", b"v1", b"v2"]
    assert [o for _, o in placed] == [3, 4, 5]          # the aborted unit's offsets are gaps


def test_a_commit_that_landed_before_its_answer_failed_is_not_written_again(admin, monkeypatch):
    producer = Producer(admin.cluster, retry_backoff_ms=1)
    real = Producer.commit

    def lost_answer(self, pending):
        real(self, pending)
        raise KafkaStorageError("the answer was lost")   # retriable, but it committed

    monkeypatch.setattr(Producer, "commit", lost_answer)
    producer.produce("t", RECORDS, partition=0)
    assert values(admin) == [b"v0", b"v1", b"v2"]


def test_errors_that_are_not_retriable_and_a_zero_delivery_timeout_raise_at_once(admin,
                                                                                 monkeypatch):
    with pytest.raises(RecordTooLargeError):
        Producer(admin.cluster).produce("t", [Record(b"k", b"x" * 2_000_000)], partition=0)
    real = Producer.commit

    def always_aborted(self, pending):
        pending = list(pending)
        admin.cluster.submit([A.Abort(txns=[p.txn for p in pending], reason="test")])
        return real(self, pending)

    monkeypatch.setattr(Producer, "commit", always_aborted)
    with pytest.raises(FencedLeaderEpochError):
        Producer(admin.cluster, delivery_timeout_ms=0).produce("t", RECORDS, partition=0)
    with pytest.raises(FencedLeaderEpochError):               # retried, then out of time
        Producer(admin.cluster, delivery_timeout_ms=300, retry_backoff_ms=50).produce(
            "t", RECORDS, partition=0)
    assert values(admin) == []


def test_acks_all_below_min_isr_waits_for_the_isr_to_come_back(tmp_path):
    """NOT_ENOUGH_REPLICAS while a follower is out of the ISR: Kafka's producer retries until
    the ISR is back or delivery.timeout.ms; so does ours."""
    admin, rep, clock = setup(tmp_path, partitions=1, configs={"min.insync.replicas": "2"})
    admin.produce("t", RECORDS, partition=0, acks="1")
    in_sync(admin, rep)
    second, away = tmp_path / "second", tmp_path / "second-away"
    second.rename(away)
    clock.ms += 2_000
    rep.tick()
    assert rep.cluster.state().partition("t", 0).replication["isr"] == ["logdir-0"]
    with pytest.raises(NotEnoughReplicasError):
        Producer(admin.cluster, delivery_timeout_ms=0).produce("t", RECORDS, partition=0)
    stop = threading.Event()

    def coordinator():
        away.rename(second)
        while not stop.wait(0.05):
            clock.ms += 50
            rep.tick()

    t = threading.Timer(0.3, coordinator)
    t.start()
    try:
        Producer(admin.cluster, retry_backoff_ms=50).produce("t", RECORDS, partition=0)
    finally:
        stop.set()
        t.join()
    assert [r.value for r in admin.consume("t")] == [b"v0", b"v1", b"v2"] * 2


def test_a_spark_tasks_write_is_retried_and_its_options_parse(admin, monkeypatch):
    """A Spark task reserves and writes; its job commits. The task's part is retried (Spark's
    Kafka sink's producer retries too); the options are Kafka's names."""
    from pyspark_kafkalog.errors import InvalidConfigError
    from pyspark_kafkalog.spark.write_options import WriteOptions
    opts = WriteOptions.parse({"topic": "t", "path": "x", "kafka.delivery.timeout.ms": "5000",
                               "retry.backoff.ms": "7"})
    assert (opts.delivery_timeout_ms, opts.retry_backoff_ms) == (5000, 7)
    assert WriteOptions.parse({"topic": "t", "path": "x"}).delivery_timeout_ms == 120_000
    with pytest.raises(InvalidConfigError, match="delivery.timeout.ms"):
        WriteOptions.parse({"topic": "t", "path": "x", "delivery.timeout.ms": "-1"})
    producer = Producer(admin.cluster, retry_backoff_ms=1)
    real = Producer.write
    fails = [KafkaStorageError("the root was away for a moment")]

    def flaky(self, batches, spools=None, **kw):
        if fails:
            raise fails.pop()
        return real(self, batches, spools, **kw)

    monkeypatch.setattr(Producer, "write", flaky)
    batches = {("t", 0): producer.encode("t", RECORDS)}
    pending = producer.write_retrying(batches)
    producer.commit([pending])
    assert values(admin) == [b"v0", b"v1", b"v2"]
    fails.append(RecordTooLargeError("not retriable"))
    with pytest.raises(RecordTooLargeError):
        producer.write_retrying(batches)
