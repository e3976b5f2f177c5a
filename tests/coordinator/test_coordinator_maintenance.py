"""The coordinator runs the scheduled maintenance (issue #16): a real coordinator, in process and
as the `kafkalog coordinator` command, deletes an expired segment by itself and counts the run in
the metrics it serves over HTTP; with maintenance off nothing runs; a standby runs nothing until
it takes over; the scheduler reads the clock its ticks come from; a job that finds the
coordinator fenced fences it instead of being counted as one failed run; one settings file holds
the service's keys and the scheduler's, and a key neither knows is refused by name.

Waits poll with a generous deadline; nothing asserts how long anything took. "Nothing ran" is
asserted only after an event that proves many intervals passed (the service's own tick calls, or
lease renewals), never after a sleep.
"""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from support.cli_support import run_cli
from support.coordinator_support import (  # noqa: F401 (fixtures)
    CONF, DEADLINE_S, LEASE_MS, TOKEN, cluster, coordinators, eventually, metrics_of, services,
    token_file, url)
from pyspark_kafkalog.admin import Admin
from pyspark_kafkalog.cluster import lease as L
from pyspark_kafkalog.cluster.cluster import Cluster
from pyspark_kafkalog.coordinator import scheduler as sched, start
from pyspark_kafkalog.coordinator.config import (CoordinatorConfig, coordinator_options,
                                                  load_coordinator_config)
from pyspark_kafkalog.coordinator.rpc import CoordinatorClient
from pyspark_kafkalog.coordinator.scheduler import (CHECKPOINTS, CLEANUP, FLUSH, LOG_CLEANER,
                                                    RETENTION,
                                                    MaintenanceScheduler, SchedulerConfig)
from pyspark_kafkalog.coordinator.service import Coordinator
from pyspark_kafkalog.errors import FencedCoordinatorError, InvalidConfigError
from pyspark_kafkalog.format.records import Record

FAST = {"log.retention.check.interval.ms": "200"}        # the others keep Kafka's minutes
RUNS = "kafkalog_coordinator_maintenance_runs_total"
FAILURES = "kafkalog_coordinator_maintenance_failures_total"


pytestmark = pytest.mark.slow   # coordinator processes running scheduled maintenance (~14 s)


def runs_of(m: dict, kind: str, name: str = RUNS) -> float:
    return m.get((name, frozenset({("kind", kind)})), 0)


def no_runs(m: dict) -> bool:
    return not any(n.startswith("kafkalog_coordinator_maintenance_") for n, _ in m)


@pytest.fixture
def coordinator_defaults() -> dict:
    return {"tick_interval_ms": 50}


def expired_segments(url: str, topic: str = "t"):
    """Five one-record segments, the first three long past retention.ms (retention judges by
    the cluster's clock, so 'now' is taken from it)."""
    admin = Admin(url)
    if topic not in admin.list_topics():
        admin.create_topic(topic, configs={"retention.ms": 60_000, "segment.bytes": 100})
    now_ms = admin.cluster.now_ms()
    for i in range(5):
        admin.produce(topic, [Record(b"k", b"v" * 40, 10_000 * (i + 1) if i < 3 else now_ms)])
    return admin


def lso(url: str, topic: str = "t") -> int:
    return Admin(url).describe_topic(topic).partitions[0].log_start_offset


def segment_bases(url: str, topic: str = "t"):
    return sorted(int(f.stem) for f in (Path(url) / "logdir-0" / f"{topic}-0").glob("*.log"))


# -- a real coordinator runs it by itself ----------------------------------------------------------

def test_a_coordinator_deletes_an_expired_segment_by_itself_and_counts_the_run(url, token_file):
    expired_segments(url)
    assert segment_bases(url) == [0, 1, 2, 3, 4] and lso(url) == 0
    handle = start(url, config=FAST, token_file=token_file, lease_ms=LEASE_MS,
                   tick_interval_ms=50)
    try:
        assert handle.scheduler is not None and handle.ticks[0] == handle.scheduler.tick
        eventually(lambda: lso(url) == 3, "retention moved the log start offset")
        eventually(lambda: segment_bases(url) == [3, 4], "the expired segment files deleted")
        m = eventually(lambda: (lambda m: m if runs_of(m, RETENTION) >= 1 else None)(
            metrics_of(handle.metrics_url)), "the retention run counted")
        assert runs_of(m, RETENTION, FAILURES) == 0
        assert runs_of(m, CLEANUP) == runs_of(m, CHECKPOINTS) == 0    # minutes away
        with CoordinatorClient(handle.address, TOKEN) as client:
            status = client.status()
        assert status["maintenance"] == {RETENTION: 200, CLEANUP: 300_000, CHECKPOINTS: 60_000,
                                         FLUSH: 1000, LOG_CLEANER: 15_000}
        assert status["metrics"]["maintenance_runs"][RETENTION] >= 1
        assert [r.offset for r in Admin(url).consume("t")] == [3, 4]
    finally:
        handle.stop()


def test_with_maintenance_off_nothing_runs(url, cluster, coordinators):
    expired_segments(url)
    seen = []
    c = coordinators(cluster, maintenance=False, maintenance_config=FAST, ticks=[seen.append],
                     tick_interval_ms=20)
    assert c.scheduler is None and c.ticks == [seen.append]
    # the service ticks on: by the cluster's clock, ten retention intervals pass
    eventually(lambda: seen and seen[-1] >= seen[0] + 2.0, "ticks over two seconds")
    assert lso(url) == 0 and segment_bases(url) == [0, 1, 2, 3, 4]
    assert no_runs(metrics_of(c.metrics_url))
    with CoordinatorClient(c.address, TOKEN) as client:
        assert client.status()["maintenance"] is None


def test_a_standby_runs_nothing_until_it_takes_over(url, coordinators):
    expired_segments(url)
    Admin(url).create_topic("u", configs={"retention.ms": 60_000, "segment.bytes": 100})
    a = coordinators(Cluster(url, create=False), maintenance_config=FAST)
    b = coordinators(Cluster(url, create=False), maintenance_config=FAST)
    assert a.active and not b.active
    eventually(lambda: lso(url) == 3, "the active one ran retention")
    eventually(lambda: runs_of(metrics_of(a.metrics_url), RETENTION) >= 3,
               "three retention runs on the active one")
    assert no_runs(metrics_of(b.metrics_url)) and b.metrics.summary()["maintenance_runs"] == {}
    a.stop()
    expired_segments(url, "u")        # after a stopped: only b can delete these
    eventually(lambda: b.active, "the standby took over")
    eventually(lambda: lso(url, "u") == 3, "the new active one ran retention")
    assert runs_of(metrics_of(b.metrics_url), RETENTION) >= 1
    assert b.epoch == 2


def test_the_scheduler_reads_the_clock_its_ticks_come_from(tmp_path, coordinators):
    """A cluster whose clock is a year behind this host's: were the scheduler on time.time(),
    its first run would be a year after every tick it is given, and retention would never run."""
    year_s = 365 * 86400
    url = str(tmp_path / "behind")
    behind = Cluster(url, clock=lambda: time.time() - year_s)
    expired_segments(url)
    c = Coordinator(behind, CoordinatorConfig.of(maintenance_config=FAST), token=TOKEN)
    before = behind.now_ms() / 1000
    clock_s = c.scheduler.clock()
    after = behind.now_ms() / 1000
    assert before <= clock_s <= after
    c = coordinators(behind, maintenance_config=FAST)
    eventually(lambda: lso(url) == 3, "retention ran on the cluster's clock")


# -- fencing ------------------------------------------------------------------------------------

def test_a_fenced_error_from_a_job_is_not_swallowed_and_stops_the_tick(tmp_path, monkeypatch):
    admin = Admin(str(tmp_path / "c"))
    cleaned = []

    def fenced_retention(cluster, **kw):
        raise FencedCoordinatorError("replay refused epoch 1: epoch 2 is current")

    monkeypatch.setattr(sched, "retention", fenced_retention)
    monkeypatch.setattr(sched, "collect_garbage", lambda cluster: cleaned.append(1) or {})
    every_second = {k: "1000" for k in sched.INTERVAL_KEYS}
    s = MaintenanceScheduler(admin.cluster, every_second, clock=lambda: 0.0)
    with pytest.raises(FencedCoordinatorError, match="epoch 2 is current"):
        s.tick(1.0)
    assert cleaned == []                      # nothing after the fenced job ran


def test_no_job_starts_once_the_service_no_longer_acts(tmp_path, monkeypatch):
    admin = Admin(str(tmp_path / "c"))
    acting = [True]
    ran = []

    def deposing_retention(cluster, **kw):   # the lease is lost while retention runs
        ran.append(RETENTION)
        acting[0] = False
        return []

    monkeypatch.setattr(sched, "retention", deposing_retention)
    monkeypatch.setattr(sched, "collect_garbage", lambda cluster: ran.append(CLEANUP) or {})
    every_second = {k: "1000" for k in sched.INTERVAL_KEYS}
    s = MaintenanceScheduler(admin.cluster, every_second, clock=lambda: 0.0,
                             active=lambda: acting[0])
    assert [r.kind for r in s.tick(1.0)] == [RETENTION] and ran == [RETENTION]
    assert s.tick(1.5) == []                  # still not acting: nothing, whatever is due
    acting[0] = True                          # acting again: what was left is still due
    assert [r.kind for r in s.tick(1.5)] == [CLEANUP, CHECKPOINTS]


def test_a_job_that_finds_the_coordinator_fenced_fences_the_service(url, cluster, coordinators,
                                                                   monkeypatch):
    calls = []

    def fenced_retention(cluster, **kw):
        calls.append(1)
        raise FencedCoordinatorError("replay refused epoch 1")

    monkeypatch.setattr(sched, "retention", fenced_retention)
    c = coordinators(cluster, maintenance_config=FAST, on_fenced="exit")
    assert c.wait(DEADLINE_S)
    assert c.exit_reason == "fenced" and not c.active and len(calls) == 1
    summary = c.metrics.summary()
    assert summary["fenced"] == 1
    assert summary["maintenance_runs"] == {} and summary["maintenance_failures"] == {}


# -- one settings file --------------------------------------------------------------------------

def test_one_file_holds_the_service_and_the_scheduler_and_refuses_unknown_keys(url, cluster,
                                                                              tmp_path):
    conf = tmp_path / "coordinator.properties"
    conf.write_text("coordinator.lease.ms=2500\nlog.retention.check.interval.ms=200\n"
                    "kafkalog.delete.after.consumption=t:g1,g2\n")
    opts = load_coordinator_config(str(conf))
    assert opts == {"lease_ms": 2500, "maintenance_config": SchedulerConfig(
        retention_check_interval_ms=200, delete_after_consumption={"t": ("g1", "g2")})}
    c = Coordinator(cluster, CoordinatorConfig.of(**opts), token=TOKEN)
    assert c.lease_ms == 2500 and c.scheduler.config == opts["maintenance_config"]
    assert coordinator_options({"coordinator.maintenance.enable": "FALSE"}) == \
        {"maintenance": False}
    for props, needle in [({"log.retention.check.interval": "200"},
                           "unknown coordinator setting 'log.retention.check.interval'"),
                          ({"coordinator.leas.ms": "5"}, "'coordinator.leas.ms'"),
                          ({"log.retention.check.interval.ms": "soon"},
                           "log.retention.check.interval.ms must be an integer"),
                          ({"coordinator.maintenance.enable": "yes"},
                           "coordinator.maintenance.enable must be true or false")]:
        with pytest.raises(InvalidConfigError, match=needle.replace(".", r"\.")):
            coordinator_options(props)
    # start(config=FILE): the file's keys, and keyword arguments win over them
    handle = start(url, config=conf, token=TOKEN, maintenance=False)
    try:
        assert handle.lease_ms == 2500 and handle.scheduler is None
    finally:
        handle.stop()
    handle = start(url, config=str(conf), token=TOKEN)
    try:
        assert handle.scheduler.config.retention_check_interval_ms == 200
    finally:
        handle.stop()


# -- the command: real processes ------------------------------------------------------------------



def combined_config(tmp_path, token_file, *extra) -> str:
    """The sample conf/coordinator.properties with a token, a short lease and a fast retention
    check: the service's keys and the scheduler's in one file."""
    conf = tmp_path / "combined.properties"
    conf.write_text((CONF / "coordinator.properties").read_text()
                    + f"coordinator.token.file={token_file}\ncoordinator.lease.ms={LEASE_MS}\n"
                    + "log.retention.check.interval.ms=200\n" + "".join(extra))
    return str(conf)


def test_the_command_runs_retention_from_its_one_settings_file(url, token_file, tmp_path,
                                                               services):
    expired_segments(url)
    s = services(url, "--coordinator-config", combined_config(tmp_path, token_file))
    assert s.announced["epoch"] == 1
    assert s.announced["maintenance"][RETENTION] == 200
    eventually(lambda: lso(url) == 3 and segment_bases(url) == [3, 4],
               "the command's coordinator ran retention")
    m = eventually(lambda: (lambda m: m if runs_of(m, RETENTION) >= 1 else None)(
        metrics_of(s.announced["metrics_url"])), "the retention run counted")
    assert runs_of(m, RETENTION, FAILURES) == 0
    assert s.terminate() == 0, s.stderr()
    assert "scheduled maintenance retention every 200 ms" in s.stderr()
    assert "scheduled retention: {'partitions': 1, 'segments': 3" in s.stderr()


def test_the_command_with_no_maintenance_runs_none(url, token_file, tmp_path, services):
    expired_segments(url)
    s = services(url, "--coordinator-config", combined_config(tmp_path, token_file),
                 "--no-maintenance")
    assert s.announced["epoch"] == 1 and s.announced["maintenance"] is None
    # six renewals: three lease lengths, fifteen retention intervals (and three ticks) passed
    m = eventually(lambda: (lambda m: m if m[("kafkalog_coordinator_lease_renewals_total",
                                                frozenset())] >= 6 else None)(
        metrics_of(s.announced["metrics_url"])), "six lease renewals")
    assert no_runs(m)
    assert lso(url) == 0 and segment_bases(url) == [0, 1, 2, 3, 4]
    assert s.terminate() == 0, s.stderr()
    assert "scheduled maintenance off" in s.stderr()
    # the file can say it too
    s = services(url, "--coordinator-config",
                 combined_config(tmp_path, token_file, "coordinator.maintenance.enable=false\n"))
    assert s.announced["maintenance"] is None
    assert s.terminate() == 0, s.stderr()


def test_the_command_refuses_a_key_neither_part_knows(url, token_file, tmp_path):
    conf = combined_config(tmp_path, token_file, "log.retention.check.intervall.ms=1000\n")
    rc, out, err = run_cli("--cluster", url, "coordinator", "--coordinator-config", conf)
    assert rc == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and "InvalidConfigError" in err
    assert "'log.retention.check.intervall.ms'" in err
    rc, out, err = run_cli("--cluster", url, "coordinator", "--status", "--no-maintenance",
                           "--token-file", token_file)
    assert rc == 2 and "--no-maintenance does not apply to --status" in err
    assert L.current_lease(Cluster(url, create=False).state()) is None   # nothing ran
