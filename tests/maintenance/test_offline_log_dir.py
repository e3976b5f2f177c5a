"""A log dir that cannot be reached stops no maintenance of the others (KIP-112: a failed log dir
goes offline and the broker goes on with the rest; docs/protocol.md §6-§8).

A cluster with its second log dir on another root, the partitions' leaders on both; then the
second root "is not mounted" (moved away, an empty mount point left), as a fresh client sees it:

* retention trims every partition on the first log dir, leaves the second's metadata and files
  alone, and raises ``OfflineLogDirError`` naming that log dir and the partitions it skipped,
  with the plans it applied; once the root is back the next run trims the rest;
* delete-records answers for every partition (the entry is the deletion); the offline log dir's
  segments stay until a cleanup there, which, while it is offline, cleans the first log dir and
  raises the same error; once it is back, cleanup deletes them;
* the CLI prints what it did, then one error line naming the log dir, exit status 1;
* the coordinator's scheduled runs count what they did and report the log dir as their problem;
* ``jobs/retention.py`` prints the plans and the error, exit status 1.
"""
from __future__ import annotations

import random
import sys
import time
from pathlib import Path

import pytest

from support.cli_support import digests as files, run_cli
from support.log_dir_support import Unmounted
from pyspark_kafkalog.admin import Admin
from pyspark_kafkalog.coordinator import scheduler as sched
from pyspark_kafkalog.coordinator.scheduler import MaintenanceScheduler
from pyspark_kafkalog.errors import OfflineLogDirError
from pyspark_kafkalog.format.records import Record

JOBS = Path(__file__).resolve().parents[2] / "jobs"
sys.path.insert(0, str(JOBS))

import retention as retention_job  # noqa: E402

PARTITIONS = 4
FUTURE_MS = int(time.time() * 1000) + 30 * 24 * 3600 * 1000   # past every retention.ms


@pytest.fixture
def cluster(tmp_path):
    """Two roots, leaders alternating (RF 1), three segments per partition."""
    admin = Admin(str(tmp_path / "root"), fsync=False)
    admin.add_log_dir(str(tmp_path / "second"))
    admin.cluster.placement_random = random.Random(0)
    admin.create_topic("t", PARTITIONS)
    for round_ in range(3):
        for p in range(PARTITIONS):
            admin.produce("t", [Record(b"k", b"v%d" % round_)], partition=p)
    leaders = {p: admin.describe_topic("t").partitions[p].leader for p in range(PARTITIONS)}
    assert sorted(set(leaders.values())) == ["logdir-0", "logdir-1"], leaders
    return tmp_path, leaders


def fresh(tmp_path) -> Admin:
    return Admin(str(tmp_path / "root"), create=False, fsync=False)


def log_start(admin: Admin) -> dict:
    return {p.partition: p.log_start_offset for p in admin.describe_topic("t").partitions}


def test_retention_skips_an_offline_log_dir_and_does_the_rest(cluster):
    tmp_path, leaders = cluster
    on0 = sorted(p for p, d in leaders.items() if d == "logdir-0")
    on1 = sorted(p for p, d in leaders.items() if d == "logdir-1")
    with Unmounted(tmp_path) as second:
        before = files(second.moved)
        admin = fresh(tmp_path)
        with pytest.raises(OfflineLogDirError) as err:
            admin.retention(now_ms=FUTURE_MS)
        assert set(err.value.offline) == {"logdir-1"}
        assert "directory.id None" in err.value.offline["logdir-1"]
        message = str(err.value)
        assert "retention skipped" in message and "logdir-1" in message
        assert f"skipped {len(on1)} partition(s) led there: " \
            + ", ".join(f"t-{p}" for p in on1) in message
        assert err.value.error_code == 56 and err.value.error_name == "KAFKA_STORAGE_ERROR"
        assert sorted(p.partition for p in err.value.done) == on0
        lso = log_start(fresh(tmp_path))
        assert all(lso[p] == 3 for p in on0) and all(lso[p] == 0 for p in on1), lso
        for p in on0:   # their segments are gone (the newest stays as Kafka's rule keeps it)
            assert len(list((tmp_path / "root" / "logdir-0" / f"t-{p}").glob("*.log"))) <= 1
        assert files(second.moved) == before                  # nothing there changed
    plans = fresh(tmp_path).retention(now_ms=FUTURE_MS)        # back: the rest, no error
    assert sorted(p.partition for p in plans) == on1
    assert set(log_start(fresh(tmp_path)).values()) == {3}


def test_delete_records_answers_and_cleanup_catches_up_when_the_log_dir_is_back(cluster):
    tmp_path, leaders = cluster
    on1 = sorted(p for p, d in leaders.items() if d == "logdir-1")
    with Unmounted(tmp_path) as second:
        before = files(second.moved)
        admin = fresh(tmp_path)
        answers = admin.delete_records_before({("t", p): 2 for p in range(PARTITIONS)})
        assert {tp: (r.error, r.low_watermark) for tp, r in answers.items()} == {
            ("t", p): (None, 2) for p in range(PARTITIONS)}
        assert files(second.moved) == before     # its segments wait for a cleanup there
        with pytest.raises(OfflineLogDirError, match="cleanup skipped .*logdir-1") as err:
            fresh(tmp_path).cleanup()
        assert set(err.value.offline) == {"logdir-1"}
        assert isinstance(err.value.done, dict) and all(
            not path.startswith("logdir-1") for paths in err.value.done.values()
            for path in paths)
    removed = fresh(tmp_path).cleanup()
    assert sorted(removed["segments"]) == sorted(
        f"logdir-1/t-{p}/{b:020d}" for p in on1 for b in (0, 1))
    got = fresh(tmp_path).consume("t")
    assert sorted((r.partition, r.offset) for r in got) == [(p, 2) for p in range(PARTITIONS)]


def test_the_cli_prints_what_it_did_then_names_the_log_dir(cluster):
    tmp_path, leaders = cluster
    on0 = sorted(p for p, d in leaders.items() if d == "logdir-0")
    root = str(tmp_path / "root")
    # segments past retention everywhere: retention.ms=1 and records written long before now
    rc, _, err = run_cli("--cluster", root, "topics", "--alter", "--topic", "t", "--config",
                         "retention.ms=1")
    assert rc == 0, err
    time.sleep(0.01)
    with Unmounted(tmp_path):
        rc, out, err = run_cli("--cluster", root, "retention")
        assert rc == 1, (out, err)
        rows = [line.split() for line in out.splitlines()[1:] if line.startswith("t ")]
        assert sorted(int(r[1]) for r in rows) == on0
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
        assert err.startswith("kafkalog: error: OfflineLogDirError: retention skipped") \
            and "logdir-1" in err, err
        rc, out, err = run_cli("--cluster", root, "cleanup")
        assert rc == 1 and "cleanup skipped" in err and "logdir-1" in err, (out, err)
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    rc, out, err = run_cli("--cluster", root, "retention")
    assert rc == 0 and err == "", err


def test_scheduled_runs_count_what_they_did_and_report_the_log_dir(cluster):
    tmp_path, leaders = cluster
    every_second = {k: "1000" for k in sched.INTERVAL_KEYS}
    with Unmounted(tmp_path):
        admin = fresh(tmp_path)
        admin.alter_configs("t", {"retention.ms": "1"})
        time.sleep(0.01)
        runs = {r.kind: r for r in MaintenanceScheduler(
            admin.cluster, every_second, clock=lambda: 0.0).tick(1.0)}
        assert set(runs) == {sched.RETENTION, sched.CLEANUP, sched.CHECKPOINTS}
        for run in runs.values():
            assert not run.ok and "KAFKA_STORAGE_ERROR" in run.error \
                and "logdir-1" in run.error, run
        assert runs[sched.RETENTION].changed["partitions"] == sum(
            d == "logdir-0" for d in leaders.values())
        assert runs[sched.CHECKPOINTS].changed["partitions"] == PARTITIONS
    runs = MaintenanceScheduler(fresh(tmp_path).cluster, every_second,
                                clock=lambda: 0.0).tick(1.0)
    assert all(r.ok for r in runs), runs


def test_the_retention_job_prints_the_plans_and_the_error(cluster, capsys, monkeypatch):
    tmp_path, leaders = cluster
    # few partitions: the job runs them in-process, no session needed
    monkeypatch.setattr(retention_job, "spark_session", lambda name: None)
    with Unmounted(tmp_path):
        assert retention_job.main(["--cluster", str(tmp_path / "root"),
                                   "--now-ms", str(FUTURE_MS)]) == 1
    out, err = capsys.readouterr()
    assert len(out.splitlines()) == sum(d == "logdir-0" for d in leaders.values())
    assert "retention: error: KAFKA_STORAGE_ERROR: retention skipped" in err and "logdir-1" in err
