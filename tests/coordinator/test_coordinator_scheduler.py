"""The coordinator's scheduled maintenance (issue #16) on a real cluster in tmp_path, with a fake
clock: when each job runs, that it does what the CLI's rule does, and that failures stay local."""
from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from pyspark_kafkalog.admin import Admin, TopicPartition as TP
from pyspark_kafkalog.coordinator import scheduler as sched
from pyspark_kafkalog.coordinator.scheduler import (CHECKPOINTS, CLEANUP, FLUSH, LOG_CLEANER,
                                                    DELETE_AFTER_CONSUMPTION, RETENTION,
                                                    MaintenanceScheduler, SchedulerConfig,
                                                    load_scheduler_config)
from pyspark_kafkalog.errors import InvalidConfigError, KafkaStorageError
from pyspark_kafkalog.format import checkpoint as ckpt
from pyspark_kafkalog.format.records import Record

CONF = Path(__file__).resolve().parents[2] / "conf"
T0 = 1_000_000.0


class Clock:
    def __init__(self, t=T0):
        self.t = t

    def __call__(self):
        return self.t


@pytest.fixture
def admin(tmp_path):
    return Admin(str(tmp_path / "c"))


def _recs(n, ts=1_000):
    return [Record(b"k%d" % i, b"v%d" % i, ts + i) for i in range(n)]


def _lso(admin, topic, p=0):
    return admin.describe_topic(topic).partitions[p].log_start_offset


def _kinds(runs):
    return [r.kind for r in runs]


def test_nothing_runs_before_its_interval_and_then_once_per_interval(admin):
    admin.create_topic("t", configs={"retention.ms": 1000, "segment.bytes": 100})
    for i in range(3):
        admin.produce("t", [Record(b"k", b"v" * 40, 10_000 * (i + 1))])   # long expired
    s = MaintenanceScheduler(admin.cluster, {}, clock=Clock())
    assert s.next_due() == {RETENTION: T0 + 300, CLEANUP: T0 + 300, CHECKPOINTS: T0 + 60,
                            FLUSH: T0 + 1, LOG_CLEANER: T0 + 15}
    assert s.tick(T0) == [] and s.tick(T0 + 59.999) == []
    assert _lso(admin, "t") == 0                       # expired, but retention is not due
    assert _kinds(s.tick(T0 + 60)) == [CHECKPOINTS]
    assert s.tick(T0 + 100) == []                      # checkpoints again only at +120
    assert _lso(admin, "t") == 0
    assert _kinds(s.tick(T0 + 299.9)) == [CHECKPOINTS]
    runs = s.tick(T0 + 300)
    assert _kinds(runs) == [RETENTION, CLEANUP] and all(r.ok for r in runs)
    assert _lso(admin, "t") == 3
    assert s.tick(T0 + 300.5) == []
    # ticks rarer than the interval: one run each, no catching up on missed ones
    assert _kinds(s.tick(T0 + 5000)) == [RETENTION, CLEANUP, CHECKPOINTS]
    assert s.tick(T0 + 5001) == []


def test_tick_without_now_reads_the_clock(admin):
    clock = Clock()
    s = MaintenanceScheduler(admin.cluster, {"log.flush.offset.checkpoint.interval.ms": "1000"},
                             clock=clock)
    assert s.tick() == []
    clock.t += 1
    assert _kinds(s.tick()) == [CHECKPOINTS]


def test_retention_deletes_expired_segments_at_its_tick(admin, tmp_path):
    admin.create_topic("t", configs={"retention.ms": 60_000, "segment.bytes": 100})
    now_ms = int(time.time() * 1000)       # retention judges by the storage's clock
    for i in range(5):                     # one segment per write; the first three are old
        ts = 10_000 * (i + 1) if i < 3 else now_ms
        admin.produce("t", [Record(b"k", b"v" * 40, ts)])
    d = tmp_path / "c" / "logdir-0" / "t-0"
    assert len(list(d.glob("*.log"))) == 5
    s = MaintenanceScheduler(admin.cluster, {"log.retention.check.interval.ms": "1000"},
                             clock=Clock())
    assert s.tick(T0 + 0.5) == [] and _lso(admin, "t") == 0
    [run] = s.tick(T0 + 1)
    assert (run.kind, run.ok, run.error) == (RETENTION, True, None)
    assert run.changed["partitions"] == 1 and run.changed["segments"] == 3
    assert run.changed["bytes"] > 0 and run.duration_s >= 0 and run.started == T0 + 1
    assert _lso(admin, "t") == 3
    assert sorted(int(f.stem) for f in d.glob("*.log")) == [3, 4]
    assert [r.offset for r in admin.consume("t")] == [3, 4]
    [again] = s.tick(T0 + 2)
    assert again.ok and again.changed["segments"] == 0          # nothing more is past retention


def test_checkpoint_rewrite_restores_deleted_and_stale_files(admin, tmp_path):
    admin.create_topic("t", 2, configs={"flush.messages": "1"})   # commits move recovery points
    admin.produce("t", _recs(5), partition=0)
    admin.produce("t", _recs(3), partition=1)
    Admin(admin.cluster.url).produce("t", _recs(2), partition=0)     # epoch 1 begins at 5
    admin.delete_records_before({TP("t", 0): 2})
    root = tmp_path / "c" / "logdir-0"
    read = lambda name: ckpt.parse_offset_checkpoint((root / name).read_text())
    expected = {"replication-offset-checkpoint": {("t", 0): 7, ("t", 1): 3},
                "recovery-point-offset-checkpoint": {("t", 0): 7, ("t", 1): 3},
                "log-start-offset-checkpoint": {("t", 0): 2, ("t", 1): 0}}
    assert {n: read(n) for n in expected} == expected
    epochs = ckpt.parse_leader_epoch_checkpoint((root / "t-0" / "leader-epoch-checkpoint")
                                                .read_text())
    # what a crash between a commit and its checkpoint rewrite, or an operator, leaves
    (root / "replication-offset-checkpoint").unlink()
    (root / "t-0" / "leader-epoch-checkpoint").unlink()
    (root / "log-start-offset-checkpoint").write_text(
        ckpt.format_offset_checkpoint({("t", 0): 0}))
    s = MaintenanceScheduler(admin.cluster, {"log.flush.offset.checkpoint.interval.ms": "60000"},
                             clock=Clock())
    assert s.tick(T0 + 59) == []
    assert not (root / "replication-offset-checkpoint").exists()
    [run] = s.tick(T0 + 60)
    assert (run.kind, run.ok, run.changed) == (CHECKPOINTS, True, {"partitions": 2})
    assert {n: read(n) for n in expected} == expected
    assert ckpt.parse_leader_epoch_checkpoint(
        (root / "t-0" / "leader-epoch-checkpoint").read_text()) == epochs == [(0, 2), (1, 5)]


POLICY = {"kafkalog.delete.after.consumption": "a:g1,g2; b:g3",
          "kafkalog.delete.after.consumption.interval.ms": "1000"}


def _consumption_setup(admin):
    admin.create_topic("a", 2, configs={"segment.bytes": 100})
    admin.create_topic("b", configs={"segment.bytes": 100})
    admin.create_topic("c")
    for i in range(8):                     # a segment per write, so whole files can go too
        admin.produce("a", [Record(b"k", b"v" * 40, 1000 + i)], partition=0)
    admin.produce("a", _recs(6), partition=1)
    admin.produce("b", _recs(4))
    admin.produce("c", _recs(7))
    admin.commit_group_offsets("g1", {TP("a", 0): 5, TP("a", 1): 4, TP("c", 0): 6})
    admin.commit_group_offsets("g2", {TP("a", 0): 3})          # nothing of a-1
    admin.commit_group_offsets("g3", {TP("b", 0): 2})


def test_delete_after_consumption_deletes_below_the_named_groups_minimum_only(admin, tmp_path):
    _consumption_setup(admin)
    s = MaintenanceScheduler(admin.cluster, POLICY, clock=Clock())
    assert s.tick(T0 + 0.9) == [] and _lso(admin, "a") == 0
    [run] = s.tick(T0 + 1)
    assert (run.kind, run.ok) == (DELETE_AFTER_CONSUMPTION, True)
    assert run.changed == {"partitions": 2, "errors": 0, "offsets": 3 + 2}
    assert _lso(admin, "a", 0) == 3                 # min(g1=5, g2=3): not g1's 5
    assert _lso(admin, "a", 1) == 0                 # g2 has consumed nothing of a-1
    assert _lso(admin, "b") == 2
    assert _lso(admin, "c") == 0                    # g1 consumed it, but c is not in the policy
    assert [r.offset for r in admin.consume("a", 0)] == [3, 4, 5, 6, 7]
    d = tmp_path / "c" / "logdir-0" / "a-0"
    assert sorted(int(f.stem) for f in d.glob("*.log")) == [3, 4, 5, 6, 7]
    # nothing moved since: no request, so no metadata entry either
    seq = admin.cluster.state().seq
    [idle] = s.tick(T0 + 2)
    assert idle.ok and idle.changed == {"partitions": 0, "errors": 0, "offsets": 0}
    assert admin.cluster.state().seq == seq
    admin.commit_group_offsets("g2", {TP("a", 0): 6, TP("a", 1): 1})
    [run] = s.tick(T0 + 3)
    assert run.changed == {"partitions": 2, "errors": 0, "offsets": 2 + 1}
    assert (_lso(admin, "a", 0), _lso(admin, "a", 1)) == (5, 1)


def test_delete_after_consumption_ignores_offsets_of_a_deleted_topic(admin):
    admin.create_topic("b")
    admin.produce("b", _recs(4))
    admin.commit_group_offsets("g3", {TP("b", 0): 3})
    admin.delete_topic("b")
    admin.create_topic("b")                          # same name, new id: nobody consumed it
    admin.produce("b", _recs(5))
    s = MaintenanceScheduler(admin.cluster, POLICY, clock=Clock())
    [run] = s.tick(T0 + 1)
    assert run.ok and run.changed["partitions"] == 0 and _lso(admin, "b") == 0


def test_a_failing_job_does_not_stop_the_others_nor_the_scheduler(admin, monkeypatch, caplog,
                                                                  tmp_path):
    _consumption_setup(admin)
    calls = []

    def broken_retention(cluster, **kw):
        calls.append(cluster)
        raise KafkaStorageError("the log dir is unreachable")

    monkeypatch.setattr(sched, "retention", broken_retention)
    every_second = {k: "1000" for k in sched.INTERVAL_KEYS}
    s = MaintenanceScheduler(admin.cluster, {**POLICY, **every_second}, clock=Clock())
    (tmp_path / "c" / "logdir-0" / "replication-offset-checkpoint").unlink()
    with caplog.at_level(logging.WARNING, logger=sched.__name__):
        runs = s.tick(T0 + 1)
    assert _kinds(runs) == [RETENTION, DELETE_AFTER_CONSUMPTION, CLEANUP, CHECKPOINTS]
    assert [r.ok for r in runs] == [False, True, True, True]
    assert runs[0].error == "KAFKA_STORAGE_ERROR: the log dir is unreachable"
    assert runs[0].changed == {} and len(calls) == 1
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.WARNING, "scheduled retention failed: KAFKA_STORAGE_ERROR: "
                          "the log dir is unreachable")]
    assert _lso(admin, "a") == 3                                        # the others did run
    assert (tmp_path / "c" / "logdir-0" / "replication-offset-checkpoint").exists()
    # an unexpected exception too, with its traceback in the log; retried an interval later
    monkeypatch.setattr(sched, "retention", lambda cluster, **kw: 1 / 0)
    assert s.tick(T0 + 1.5) == []
    runs = s.tick(T0 + 2)
    assert runs[0].kind == RETENTION and not runs[0].ok
    assert runs[0].error.startswith("ZeroDivisionError: ")
    assert [r.ok for r in runs[1:]] == [True, True, True]
    assert caplog.records[-1].exc_info is not None


def test_a_refused_partition_makes_the_deletion_run_not_ok_and_the_rest_is_done(tmp_path,
                                                                               caplog):
    url = str(tmp_path / "c")
    owner = Admin(url, principal="User:owner")
    _consumption_setup(owner)
    owner.add_acl("User:owner", "*", "ALL", "ALLOW")
    owner.add_acl("User:coordinator", "b", "DELETE", "ALLOW")         # not a
    coordinator = Admin(url, principal="User:coordinator")
    s = MaintenanceScheduler(coordinator.cluster, POLICY, clock=Clock())
    with caplog.at_level(logging.WARNING, logger=sched.__name__):
        [run] = s.tick(T0 + 1)
    assert not run.ok and run.changed == {"partitions": 1, "errors": 1, "offsets": 2}
    assert run.error.startswith("a-0: TOPIC_AUTHORIZATION_FAILED: ")
    assert "TOPIC_AUTHORIZATION_FAILED" in caplog.text
    assert (_lso(owner, "a"), _lso(owner, "b")) == (0, 2)


@pytest.mark.parametrize("props,needle", [
    ({"log.retention.check.interval": "1000"}, "'log.retention.check.interval'"),
    ({"log.retention.check.interval.ms": "soon"}, "log.retention.check.interval.ms must be an "
                                                  "integer"),
    ({"log.retention.check.interval.ms": "0"}, "log.retention.check.interval.ms must be >= 1"),
    ({"kafkalog.cleanup.interval.ms": "-5"}, "kafkalog.cleanup.interval.ms must be >= 1"),
    ({"log.flush.offset.checkpoint.interval.ms": "1.5"}, "log.flush.offset.checkpoint"),
    ({"kafkalog.delete.after.consumption": "a"}, "kafkalog.delete.after.consumption: 'a' names "
                                                 "no group"),
    ({"kafkalog.delete.after.consumption": "a:  ,"}, "names no group"),
    ({"kafkalog.delete.after.consumption": "bad topic:g"}, "kafkalog.delete.after.consumption: "
                                                           "topic name 'bad topic'"),
    ({"kafkalog.delete.after.consumption": "a:g/1"}, "kafkalog.delete.after.consumption: "
                                                     "invalid group id 'g/1'"),
    ({"kafkalog.delete.after.consumption": "a:g;a:h"}, "'a' is listed twice"),
])
def test_bad_config_is_refused_with_a_typed_error_naming_the_key(admin, props, needle):
    with pytest.raises(InvalidConfigError, match=needle.replace(".", r"\.")):
        SchedulerConfig.from_properties(props)
    with pytest.raises(InvalidConfigError):
        MaintenanceScheduler(admin.cluster, props, clock=Clock())


def test_policy_parsing_and_defaults():
    cfg = SchedulerConfig.from_properties({"kafkalog.delete.after.consumption":
                                           " a : g1 , g2 ,g1; b:g3 ;"})
    assert cfg.delete_after_consumption == {"a": ("g1", "g2"), "b": ("g3",)}
    assert (cfg.retention_check_interval_ms, cfg.cleanup_interval_ms,
            cfg.checkpoint_interval_ms) == (300_000, 300_000, 60_000)
    assert SchedulerConfig.from_properties({"kafkalog.delete.after.consumption": ""}
                                           ).interval_ms(DELETE_AFTER_CONSUMPTION) is None


def test_the_example_config_in_conf_is_valid(admin, tmp_path):
    from pyspark_kafkalog.coordinator.config import load_coordinator_config
    # the scheduler's keys live in the coordinator's one settings file, spelling out the defaults
    cfg = load_coordinator_config(str(CONF / "coordinator.properties"))["maintenance_config"]
    assert cfg == SchedulerConfig()
    only = tmp_path / "maintenance.properties"
    only.write_text("".join(line for line in (CONF / "coordinator.properties").open()
                            if line.split("=")[0].strip() in sched.KEYS))
    assert load_scheduler_config(str(only)) == cfg
    assert MaintenanceScheduler(admin.cluster, cfg, clock=Clock()).tick(T0) == []
    with pytest.raises(InvalidConfigError, match="cannot read maintenance config"):
        load_scheduler_config(str(CONF / "missing.properties"))


# -- flush.ms (protocol §3, "Durability") ------------------------------------------------------

def test_the_flush_check_flushes_log_dirs_of_topics_with_flush_ms_once_it_has_passed(
        admin, tmp_path, monkeypatch):
    """Kafka's log flusher: every log.flush.scheduler.interval.ms, each log dir holding a
    topic whose flush.ms has passed since this process last flushed it is flushed (one
    ``Storage.flush``); a check that flushes nothing is not reported."""
    from pyspark_kafkalog.storage.local import LocalStorage
    flushes = []
    monkeypatch.setattr(LocalStorage, "flush",
                        lambda self, d="": flushes.append(self._abs(d, allow_root=True)))
    second = tmp_path / "second"
    second.mkdir()
    admin.add_log_dir(str(second))
    admin.create_topic("plain", 2)                                    # Kafka's defaults
    clock = Clock()
    s = MaintenanceScheduler(admin.cluster, {"log.flush.scheduler.interval.ms": "500"},
                             clock=clock)

    def tick(t):
        clock.t = t
        return s.tick()
    assert tick(T0 + 0.5) == [] and flushes == []                     # no topic asks
    admin.create_topic("timed", 2, configs={"flush.ms": "2000"})       # one replica per dir
    admin.create_topic("each", 1, configs={"flush.ms": "0"})           # flushes every write
    [run] = tick(T0 + 1)
    assert (run.kind, run.ok, run.changed) == (FLUSH, True, {"log_dirs": 2})
    assert sorted(flushes) == sorted([str(tmp_path / "c" / "logdir-0"), str(second)])
    assert tick(T0 + 1.5) == [] and tick(T0 + 2.5) == [] and len(flushes) == 2
    [run] = tick(T0 + 3)                                              # 2,000 ms later
    assert run.changed == {"log_dirs": 2} and len(flushes) == 4
    admin.alter_configs("timed", delete=["flush.ms"])
    assert tick(T0 + 10) == [] and len(flushes) == 4


def test_a_flush_past_an_offline_log_dir_flushes_the_others(admin, tmp_path, monkeypatch):
    from pyspark_kafkalog.errors import KafkaStorageError
    from pyspark_kafkalog.storage.local import LocalStorage
    flushes = []

    def flush(self, d=""):
        if str(second) in self.root:
            raise KafkaStorageError("flush: Input/output error")
        flushes.append(d)
    second = tmp_path / "second"
    second.mkdir()
    admin.add_log_dir(str(second))
    admin.create_topic("timed", 2, configs={"flush.ms": "100"})
    monkeypatch.setattr(LocalStorage, "flush", flush)
    clock = Clock()
    s = MaintenanceScheduler(admin.cluster, {"log.flush.scheduler.interval.ms": "100"},
                             clock=clock)
    [run] = s.tick(T0 + 1)
    assert not run.ok and run.changed == {"log_dirs": 1} and flushes == ["logdir-0"]
    assert "logdir-1" in run.error and "Input/output error" in run.error
