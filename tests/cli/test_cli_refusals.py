"""Refused requests change nothing, and the exit status says whose problem it is (issue: CLI
refusals; README "Exit status", docs/protocol.md §1.1, §2.3).

* a log dir on storage that lives in one process (``memory://``) is refused, nothing written;
  a registered log dir that holds no replica can be removed (``Admin.remove_log_dir``,
  ``log-dirs --remove``), behind the reader feature ``logDirRemoval``; one that holds a replica
  or a reassignment's target, a root log dir and an unknown name are refused; replay keeps the
  removed name taken and refuses replicas on it;
* ``reassign-partitions`` with targets that are empty, name a log dir twice or one the cluster
  lacks, or a partition that does not exist: exit 2, no new metadata entry (the feature
  ``replication`` is not turned on);
* ``log-dirs --describe`` lists a log dir it cannot read as such, describes the others, then
  exits 1 naming it;
* ``coordinator --bind`` with a port outside 0..65535 is a user error (exit 2);
* ``MissingCommittedDataError`` exits 1; ``features --enable`` of an unknown or empty name
  exits 2 and writes nothing; enabling a feature that is on appends nothing and says so.
"""
from __future__ import annotations

import json
import os
import random
import uuid
from pathlib import Path

import pytest

from support.cli_support import digests, run_cli, run_main
from pyspark_kafkalog.admin import Admin
from pyspark_kafkalog.cluster import actions as A
from pyspark_kafkalog.cluster import features
from pyspark_kafkalog.cluster.cluster import Cluster
from pyspark_kafkalog.errors import (InvalidConfigError, InvalidReplicaAssignmentError,
                                     InvalidRequestError, MissingCommittedDataError,
                                     OfflineLogDirError, UnknownTopicOrPartitionError,
                                     UnsupportedVersionError)
from pyspark_kafkalog.format.records import Record
from support.log_dir_support import Unmounted   # the second root away, a mount point left


def entries(root: Path):
    """The metadata log's entry files (snapshots and parts aside)."""
    return sorted(p.name for p in (root / "_kafkalog" / "log").glob("*[0-9].json"))


def seed_with_start(n: int, start: int) -> int:
    """A seed whose first draw from ``range(n)`` (Kafka's start index) is ``start``."""
    return next(s for s in range(1000) if random.Random(s).randrange(n) == start)


def one_line_error(rc, err, status, *needles):
    assert rc == status, err
    assert err.startswith("kafkalog: error: ") and len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in err, err


@pytest.fixture
def two_roots(tmp_path):
    """A cluster at ``root`` with a second log dir at ``second`` (logdir-1)."""
    admin = Admin(str(tmp_path / "root"), fsync=False)
    admin.create_topic("t", 2)
    admin.produce("t", [Record(b"k", b"v")], partition=0)
    admin.add_log_dir(str(tmp_path / "second"))
    return admin, tmp_path / "root"


# -- 1. process-local log dirs; removing a log dir ------------------------------------------------

def test_a_log_dir_in_process_memory_is_refused_and_nothing_is_written(tmp_path):
    root = tmp_path / "root"
    admin = Admin(str(root), fsync=False)
    admin.create_topic("t")
    before, logged = digests(tmp_path), entries(root)
    url = f"memory://logdir-{uuid.uuid4().hex}"
    with pytest.raises(InvalidRequestError, match="lives in this process only") as info:
        admin.add_log_dir(url)
    assert info.value.error_name == "INVALID_REQUEST"
    rc, out, err = run_main("--cluster", root, "log-dirs", "--add", url)
    one_line_error(rc, err, 2, "InvalidRequestError", "this process only")
    assert out == ""
    assert digests(tmp_path) == before and entries(root) == logged
    assert [d.log_dir for d in admin.list_log_dirs()] == ["logdir-0"]
    assert not admin.features()["logDirRegistry"]["enabled"]


def test_a_log_dir_that_holds_a_replica_or_a_target_is_not_removed(two_roots):
    admin, root = two_roots
    admin.cluster.placement_random = random.Random(seed_with_start(2, 1))
    admin.create_topic("r", 1, 2)                          # a replica on logdir-1
    before, logged = digests(root.parent), entries(root)
    for name in ("logdir-1", 1, "1"):
        with pytest.raises(InvalidRequestError, match="r-0"):
            admin.remove_log_dir(name)
    for name, needle in (("logdir-0", "under the cluster's root"),
                         ("logdir-7", "not a log dir of this cluster"),
                         ("nope", "not a log dir of this cluster")):
        with pytest.raises(InvalidRequestError, match=needle):
            admin.remove_log_dir(name)
    rc, out, err = run_cli("--cluster", root, "log-dirs", "--remove", "logdir-1")
    one_line_error(rc, err, 2, "InvalidRequestError", "r-0", "reassign-partitions")
    rc, _, err = run_main("--cluster", root, "log-dirs", "--remove", "")
    one_line_error(rc, err, 2, "--remove needs a log dir name")
    assert digests(root.parent) == before and entries(root) == logged

    # a reassignment's target: t-0 (on logdir-0 alone) moving to logdir-1
    admin.delete_topic("r")
    assert admin.reassign_partitions({("t", 0): ["logdir-1"]}) == {("t", 0): "NONE"}
    assert ("t", 0) in admin.list_partition_reassignments()
    logged = entries(root)
    with pytest.raises(InvalidRequestError, match="reassignment targets\\) of 1 partition"):
        admin.remove_log_dir("logdir-1")
    assert entries(root) == logged


def test_an_unused_log_dir_is_removed_behind_its_feature_and_its_name_is_never_reused(
        two_roots, tmp_path):
    admin, root = two_roots
    assert not admin.features()["logDirRemoval"]["enabled"]
    logged = entries(root)
    rc, out, err = run_cli("--cluster", root, "--json", "log-dirs", "--remove", "1")
    assert rc == 0, err
    assert json.loads(out) == {"log_dir": "logdir-1", "url": str(tmp_path / "second"),
                               "removed": True}
    new = [json.loads((root / "_kafkalog" / "log" / e).read_text())["actions"]
           for e in entries(root) if e not in logged]
    assert new == [[{"op": "protocol", "reader_features": ["logDirRemoval"]}],
                   [{"op": "remove_log_dir", "log_dir": "logdir-1"}]]
    fresh = Admin(str(root), create=False)
    assert [d.log_dir for d in fresh.list_log_dirs()] == ["logdir-0"]
    assert set(fresh.describe_log_dirs()) == {"logdir-0"}
    assert fresh.features()["logDirRemoval"]["enabled"]
    assert (tmp_path / "second" / "meta.properties").exists()     # its files are left alone
    with pytest.raises(InvalidRequestError, match="it was removed"):
        fresh.remove_log_dir("logdir-1")
    # RF 2 has only one log dir now; the next log dir gets a new name
    with pytest.raises(Exception, match="replication factor 2"):
        fresh.create_topic("u", 1, 2)
    assert fresh.add_log_dir(str(tmp_path / "third")).log_dir == "logdir-2"
    # the removed log dir's URL may be registered again (it holds only its meta.properties,
    # which is taken up), under a new name
    assert sorted(f.name for f in (tmp_path / "second").iterdir()) == ["meta.properties"]
    assert fresh.add_log_dir(str(tmp_path / "second")).log_dir == "logdir-3"
    assert [d.log_dir for d in Admin(str(root), create=False).list_log_dirs()] == [
        "logdir-0", "logdir-2", "logdir-3"]


def test_replay_keeps_a_removed_name_taken(tmp_path):
    c = Cluster(str(tmp_path / "root"), fsync=False, snapshot_interval=3)
    c.enable_feature("logDirRegistry")
    _, _, [r] = c.submit([A.AddLogDir(log_dir="logdir-1", url="/x", directory_id="d1")])
    assert r.ok
    remove = A.RemoveLogDir(log_dir="logdir-1")
    _, _, [r] = c.submit([remove])
    assert r.error == "INVALID_REQUEST" and "logDirRemoval" in r.message
    c.enable_feature("logDirRemoval")
    _, state, results = c.submit([
        A.CreateTopic(topic="t", topic_id="i", partitions=1, replicas=[["logdir-1"]]),
        remove,                                           # a replica is on it
        A.DeleteTopic(topic="t"),
        A.RemoveLogDir(log_dir="logdir-0"),               # the root's: not registered
        remove,
        remove,                                           # twice
        A.CreateTopic(topic="u", topic_id="j", partitions=1, replicas=[["logdir-1"]]),
        A.CreateTopic(topic="v", topic_id="k", partitions=1, replicas=[["logdir-0"]]),
        A.CreatePartitions(topic="v", total=2, replicas=[["logdir-1"]]),
        A.AddLogDir(log_dir="logdir-1", url="/y", directory_id="d2"),
        A.AddLogDir(log_dir="logdir-2", url="/x", directory_id="d1"),
    ])
    assert [r.error for r in results] == [
        "NONE", "INVALID_REQUEST", "NONE", "INVALID_REQUEST", "NONE", "INVALID_REQUEST",
        "INVALID_REPLICA_ASSIGNMENT", "NONE", "INVALID_REPLICA_ASSIGNMENT", "INVALID_REQUEST",
        "NONE"]
    assert "t-0" in results[1].message and "was removed" in results[6].message
    assert state.log_dirs["logdir-1"]["removed"] == state.timestamp
    assert c.log_dir_names(state) == ["logdir-0", "logdir-2"]
    c.enable_feature("replication")
    _, state, [r] = c.submit([A.ReassignPartitions(topic_ids={"v": "k"},
                                                   partitions={"v:0": ["logdir-1"]})])
    assert r.partitions["v:0"].error == "INVALID_REPLICA_ASSIGNMENT"
    # snapshots carry the removal: a cold open from one alone sees the same
    log = tmp_path / "root" / "_kafkalog" / "log"
    newest = int(max(log.glob("*.snapshot.json")).name.split(".")[0])
    for p in log.glob("*[0-9].json"):
        if int(p.stem) <= newest:
            p.unlink()
    fresh = Cluster(str(tmp_path / "root"), create=False)
    assert fresh.state().log_dirs == c.state().log_dirs
    assert "removed" in fresh.state().log_dirs["logdir-1"]


def test_a_client_without_log_dir_removal_refuses_the_cluster(two_roots, monkeypatch):
    admin, root = two_roots
    admin.remove_log_dir("logdir-1")
    monkeypatch.delitem(features.READER_FEATURES, features.LOG_DIR_REMOVAL)
    with pytest.raises(UnsupportedVersionError, match="logDirRemoval"):
        Cluster(str(root), create=False).state()


# -- 2. reassign-partitions: validate first, then enable ------------------------------------------

BAD_PLANS = [
    ([{"topic": "t", "partition": 0, "replicas": []}], "InvalidReplicaAssignmentError",
     "non-empty"),
    ([{"topic": "t", "partition": 0, "replicas": [1, 1]}], "InvalidReplicaAssignmentError",
     "more than once"),
    ([{"topic": "t", "partition": 0, "replicas": [0, "logdir-0"]}],
     "InvalidReplicaAssignmentError", "more than once"),
    ([{"topic": "t", "partition": 0, "replicas": [1, 7]}], "InvalidReplicaAssignmentError",
     "logdir-7"),
    ([{"topic": "t", "partition": 0, "replicas": [-1]}], "InvalidReplicaAssignmentError",
     "-1"),
    ([{"topic": "t", "partition": 9, "replicas": [1]}], "UnknownTopicOrPartitionError", "t-9"),
    ([{"topic": "nope", "partition": 0, "replicas": [1]}], "UnknownTopicOrPartitionError",
     "nope-0"),
    # a good partition first: the bad one after it still stops everything
    ([{"topic": "t", "partition": 1, "replicas": [1]},
      {"topic": "t", "partition": 0, "replicas": []}], "InvalidReplicaAssignmentError", "t-0"),
]


@pytest.mark.parametrize("plan,error,needle", BAD_PLANS,
                         ids=["empty", "twice", "twice-spelt", "unknown-dir", "negative",
                              "no-partition", "no-topic", "good-then-bad"])
def test_a_refused_reassignment_writes_nothing_and_is_a_user_error(two_roots, tmp_path, plan,
                                                                   error, needle):
    admin, root = two_roots
    f = tmp_path / "plan.json"
    f.write_text(json.dumps({"version": 1, "partitions": plan}))
    before, logged = digests(root), entries(root)
    rc, out, err = run_main("--cluster", root, "reassign-partitions",
                            "--reassignment-json-file", f, "--execute")
    one_line_error(rc, err, 2, error, needle)
    assert out == ""
    assert entries(root) == logged and digests(root) == before      # no new entry at all
    assert not admin.features()["replication"]["enabled"]
    wanted = {(e["topic"], e["partition"]): e["replicas"] for e in plan}
    with pytest.raises((InvalidReplicaAssignmentError, UnknownTopicOrPartitionError)):
        admin.reassign_partitions(wanted)
    assert entries(root) == logged


def test_a_refused_reassignment_as_a_real_process(two_roots, tmp_path):
    admin, root = two_roots
    f = tmp_path / "plan.json"
    f.write_text(json.dumps({"version": 1, "partitions": [
        {"topic": "t", "partition": 0, "replicas": []}]}))
    logged = entries(root)
    rc, out, err = run_cli("--cluster", root, "reassign-partitions", "--reassignment-json-file",
                           f, "--execute")
    one_line_error(rc, err, 2, "InvalidReplicaAssignmentError")
    assert entries(root) == logged


def test_a_reassignment_in_progress_is_refused_without_an_entry(two_roots, tmp_path):
    admin, root = two_roots
    assert admin.reassign_partitions({("t", 0): [1]}) == {("t", 0): "NONE"}
    f = tmp_path / "plan.json"
    f.write_text(json.dumps({"version": 1, "partitions": [
        {"topic": "t", "partition": 0, "replicas": [0]}]}))
    logged = entries(root)
    rc, out, err = run_main("--cluster", root, "--json", "reassign-partitions",
                            "--reassignment-json-file", f, "--execute")
    assert rc == 1, err
    assert json.loads(out)["status"] == "refused: REASSIGNMENT_IN_PROGRESS"
    assert entries(root) == logged


# -- 3. log-dirs --describe with a log dir offline ------------------------------------------------

def test_describe_lists_an_offline_log_dir_and_the_others(two_roots, tmp_path):
    admin, root = two_roots
    admin.cluster.placement_random = random.Random(seed_with_start(2, 1))
    admin.create_topic("r", 2)                         # leaders on logdir-1, logdir-0
    admin.produce("r", [Record(b"k", b"far")], partition=0)
    admin.produce("r", [Record(b"k", b"near")], partition=1)
    leaders = {p.partition: p.leader for p in admin.describe_topic("r").partitions}
    assert leaders == {0: "logdir-1", 1: "logdir-0"}
    with Unmounted(tmp_path) as second:
        before = digests(second.moved)
        rc, out, err = run_cli("--cluster", root, "--json", "log-dirs", "--describe")
        one_line_error(rc, err, 1, "OfflineLogDirError", "logdir-1", "directory.id")
        rows = [json.loads(line) for line in out.splitlines()]
        assert [(r["log_dir"], r["topic"], r["partition"], r["error"]) for r in rows] == [
            ("logdir-0", "r", 1, None), ("logdir-0", "t", 0, None), ("logdir-0", "t", 1, None),
            ("logdir-1", "r", 0, "KAFKA_STORAGE_ERROR")]
        assert rows[0]["size"] > 0 and rows[1]["size"] > 0 and rows[3]["size"] is None
        assert rows[3]["offset_lag"] == 0                  # from the metadata: still known
        rc, out, err = run_main("--cluster", root, "log-dirs", "--describe")
        assert rc == 1 and "KAFKA_STORAGE_ERROR" in out.splitlines()[-1], (out, err)
        with pytest.raises(OfflineLogDirError) as info:
            Admin(str(root), create=False).describe_log_dirs()
        assert set(info.value.offline) == {"logdir-1"}
        assert info.value.done["logdir-1"] == {("r", 0): None}
        assert info.value.done["logdir-0"][("r", 1)] > 0
        assert digests(second.moved) == before
    rc, out, err = run_main("--cluster", root, "--json", "log-dirs", "--describe")
    assert rc == 0, err
    assert all(json.loads(line)["error"] is None for line in out.splitlines())


def test_describe_lists_an_offline_log_dir_without_replicas(two_roots, tmp_path):
    admin, root = two_roots
    with Unmounted(tmp_path):
        rc, out, err = run_main("--cluster", root, "--json", "log-dirs", "--describe")
        assert rc == 1 and "logdir-1" in err and "OfflineLogDirError" in err
        rows = [json.loads(line) for line in out.splitlines()]
        assert rows[-1] == {"log_dir": "logdir-1", "url": str(tmp_path / "second"),
                            "topic": None, "partition": None, "size": None,
                            "offset_lag": None, "error": "KAFKA_STORAGE_ERROR"}


# -- 4. coordinator --bind ----------------------------------------------------------------------

@pytest.fixture
def token_file(tmp_path) -> Path:
    f = tmp_path / "token"
    f.write_text(uuid.uuid4().hex + "\n")
    os.chmod(f, 0o600)
    return f


@pytest.mark.parametrize("bind", ["127.0.0.1:99999", "127.0.0.1:65536", "127.0.0.1:-1",
                                  "127.0.0.1:http", "127.0.0.1", "127.0.0.1:\u0661\u0662"])
def test_a_bind_address_outside_the_port_range_is_refused(tmp_path, token_file, bind):
    from pyspark_kafkalog.coordinator.config import CoordinatorConfig
    from pyspark_kafkalog.coordinator.service import Coordinator
    admin = Admin(str(tmp_path / "root"), fsync=False)
    with pytest.raises(InvalidConfigError, match="HOST:PORT|0..65535"):
        Coordinator(admin.cluster, CoordinatorConfig.of(token_file=str(token_file), bind=bind,
                                                        maintenance=False))


def test_coordinator_bind_out_of_range_exits_2_and_writes_nothing(tmp_path, token_file):
    from pyspark_kafkalog.coordinator.config import CoordinatorConfig
    from pyspark_kafkalog.coordinator.service import Coordinator
    root = tmp_path / "root"
    admin = Admin(str(root), fsync=False)
    admin.create_topic("t")
    Coordinator(admin.cluster, CoordinatorConfig.of(token_file=str(token_file),
                                                    bind="127.0.0.1:0",   # 0: any port
                                                    maintenance=False))
    Coordinator(admin.cluster, CoordinatorConfig.of(token_file=str(token_file), bind="[::1]:65535",
                                                    maintenance=False))
    before = digests(root)
    rc, out, err = run_cli("--cluster", root, "coordinator", "--bind", "127.0.0.1:99999",
                           "--token-file", token_file, timeout=60)
    assert rc == 2 and "port 99999 is not 0..65535" in err, (out, err)
    assert "InvalidConfigError" in err and "Traceback" not in err and out == ""
    conf = tmp_path / "coordinator.properties"
    conf.write_text("coordinator.bind=127.0.0.1:70000\n")
    rc, out, err = run_cli("--cluster", root, "coordinator", "--coordinator-config", conf,
                           "--token-file", token_file, timeout=60)
    assert rc == 2 and "port 70000 is not 0..65535" in err, (out, err)
    assert digests(root) == before


# -- 5. exit codes of the features command and of missing committed data --------------------------

def test_missing_committed_data_is_trouble_with_the_data(tmp_path):
    assert MissingCommittedDataError.user_error is False
    root = tmp_path / "root"
    admin = Admin(str(root), fsync=False)
    admin.create_topic("t")
    admin.produce("t", [Record(b"k", b"v")], partition=0)
    (root / "logdir-0" / "t-0" / f"{0:020d}.log").unlink()        # lost
    rc, out, err = run_main("--cluster", root, "consume", "--topic", "t")
    one_line_error(rc, err, 1, "MissingCommittedDataError", "repair")


def test_features_enable_refusals_and_an_enabled_feature(tmp_path):
    root = tmp_path / "root"
    Admin(str(root), fsync=False).create_topic("t")
    before, logged = digests(root), entries(root)
    rc, out, err = run_main("--cluster", root, "features", "--enable", "nope")
    one_line_error(rc, err, 2, "not one this client implements")
    assert out == ""
    for empty in ("", "  "):
        rc, out, err = run_main("--cluster", root, "features", "--enable", empty)
        one_line_error(rc, err, 2, "--enable needs a feature name")
        assert out == ""                                            # no listing
    with pytest.raises(InvalidRequestError):
        Admin(str(root), create=False).enable_feature("nope")
    assert digests(root) == before and entries(root) == logged

    rc, out, err = run_main("--cluster", root, "features", "--enable", "streamingSink")
    assert (rc, out) == (0, "Enabled reader feature streamingSink.\n"), err
    assert len(entries(root)) == len(logged) + 1
    logged = entries(root)
    rc, out, err = run_main("--cluster", root, "features", "--enable", "streamingSink")
    assert rc == 0 and "enabled already; nothing was written" in out, err
    rc, out, err = run_main("--cluster", root, "--json", "features", "--enable", "streamingSink")
    assert rc == 0 and json.loads(out)["changed"] is False
    info = Admin(str(root), create=False).enable_feature("streamingSink")
    assert info["enabled"] and info["changed"] is False
    assert entries(root) == logged
