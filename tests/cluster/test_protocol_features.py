"""Protocol evolution (docs/protocol.md §2.3): a client never replays what it does not know as a
no-op. A future entry version, an unknown action or field, or a reader feature it lacks makes
every command, the admin API and the Spark reader and writer refuse with UNSUPPORTED_VERSION,
writing nothing; a writer feature it lacks still lets it read but not write."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from support.cli_support import digests as listing, run_cli, run_main
from pyspark_kafkalog.admin import Admin
from pyspark_kafkalog.cluster import features
from pyspark_kafkalog.cluster.metalog import entry_name
from pyspark_kafkalog.errors import UnsupportedVersionError
from pyspark_kafkalog.format.records import Record

READS = [["topics", "--list"], ["topics", "--describe"], ["consume", "--topic", "t"],
         ["offsets", "--topic", "t"], ["log-dirs", "--describe"], ["features", "--list"],
         ["retention", "--dry-run"]]
WRITES = [["produce", "--topic", "t"], ["topics", "--create", "--topic", "v"],
          ["topics", "--alter", "--topic", "t", "--config", "retention.ms=5"],
          ["delete-records", "--offset-json-file", "-"], ["retention"], ["cleanup"],
          ["topics", "--delete", "--topic", "t"],
          ["consume", "--topic", "t", "--group", "g"],
          ["groups", "--reset-offsets", "--group", "g", "--topic", "t", "--to-earliest"]]
STDIN = {"produce": '{"value": null}\n',
         "delete-records": '{"partitions": [{"topic": "t", "partition": 0, "offset": 1}], '
                           '"version": 1}'}


def kafkalog(*argv):
    """In this process: the loops below run dozens of commands (one real process per test
    checks the same through a fresh interpreter)."""
    return run_main(*argv, stdin=STDIN.get(argv[2] if len(argv) > 2 else "", ""))


def kafkalog_process(*argv):
    return run_cli(*argv, stdin=STDIN.get(argv[2] if len(argv) > 2 else "", ""))



@pytest.fixture
def cluster(tmp_path) -> Path:
    root = tmp_path / "kl"
    a = Admin(str(root))
    a.create_topic("t", 2)
    a.produce("t", [Record(b"k", b"v", 1)], partition=0)
    return root


def add_entry(root: Path, entry: dict) -> None:
    seq = len(list((root / "_kafkalog" / "log").glob("*[0-9].json")))
    (root / entry_name(seq)).write_text(json.dumps(entry))


FUTURE = {
    "entry version 2": {"version": 2, "writer": "w", "timestamp": 1, "actions": []},
    "unknown action": {"version": 1, "writer": "w", "timestamp": 1,
                       "actions": [{"op": "elect_leader", "partition": "t:0", "leader": 1}]},
    "unknown field": {"version": 1, "writer": "w", "timestamp": 1,
                      "actions": [{"op": "commit", "txns": [], "isr": ["logdir-1"]}]},
    "reader feature": {"version": 1, "writer": "w", "timestamp": 1,
                       "actions": [{"op": "protocol", "reader_features": ["someFutureFeature"]}]},
}


def assert_refused(rc, err, argv):
    assert rc == 1, (argv, rc, err)      # trouble with the data, not the user's input
    assert "UnsupportedVersionError" in err and "Traceback" not in err, (argv, err)
    assert len(err.strip().splitlines()) == 1, (argv, err)


@pytest.mark.parametrize("what", sorted(FUTURE))
def test_future_entries_are_refused_by_every_command(cluster, what):
    add_entry(cluster, FUTURE[what])
    before = listing(cluster)
    for argv in READS + WRITES:
        rc, out, err = kafkalog("--cluster", cluster, *argv)
        assert_refused(rc, err, argv)
    rc, out, err = kafkalog_process("--cluster", cluster, "consume", "--topic", "t")
    assert_refused(rc, err, ["consume", "(a real process)"])
    with pytest.raises(UnsupportedVersionError):
        Admin(str(cluster), create=False).list_topics()
    with pytest.raises(UnsupportedVersionError):
        Admin(str(cluster), create=False).produce("t", [Record(b"k", b"v", 1)])
    assert listing(cluster) == before


def test_unknown_writer_feature_allows_reading_but_not_writing(cluster):
    add_entry(cluster, {"version": 1, "writer": "w", "timestamp": 1, "actions": [
        {"op": "protocol", "writer_features": ["quotas"]},
        {"op": "set_quota", "feature": "quotas", "client": "a", "producer_byte_rate": 5}]})
    before = listing(cluster)
    for argv in READS:
        rc, out, err = kafkalog("--cluster", cluster, *argv)
        assert rc == 0, (argv, err)
    rc, out, _ = kafkalog("--cluster", cluster, "--json", "features", "--list")
    assert {"feature": "quotas", "kind": "writer", "enabled": True, "supported": False,
            "description": "unknown to this client"} in [json.loads(x) for x in out.splitlines()]
    for argv in WRITES:
        rc, out, err = kafkalog("--cluster", cluster, *argv)
        assert_refused(rc, err, argv)
        assert "quotas" in err
    rc, out, err = kafkalog_process("--cluster", cluster, "produce", "--topic", "t")
    assert_refused(rc, err, ["produce", "(a real process)"])
    assert listing(cluster) == before


def test_an_action_of_an_unknown_feature_is_refused_unless_a_writer_feature(cluster):
    """The tag "feature" lets readers skip an action only when the cluster declared that
    feature as writer-only; otherwise the action is unknown and refused."""
    add_entry(cluster, {"version": 1, "writer": "w", "timestamp": 1, "actions": [
        {"op": "set_quota", "feature": "quotas", "client": "a"}]})
    rc, _, err = kafkalog("--cluster", cluster, "topics", "--list")
    assert_refused(rc, err, ["topics"])


def test_enabling_a_feature_is_an_explicit_step_older_clients_then_refuse(cluster, monkeypatch):
    """A newer client (here: this process, which knows one more feature) enables it; a client
    without it (a real process) then refuses to read."""
    rc, _, err = kafkalog("--cluster", cluster, "features", "--enable", "nope")
    assert rc != 0 and "not one this client implements" in err
    monkeypatch.setitem(features.READER_FEATURES, "futureFormat", "a test feature")
    a = Admin(str(cluster), create=False)
    assert a.features()["futureFormat"] == {"kind": "reader", "enabled": False,
                                            "supported": True,
                                            "description": "a test feature"}
    info = a.enable_feature("futureFormat")
    assert info["enabled"] and info["kind"] == "reader"
    assert [r.key for r in a.consume("t", 0)] == [b"k"]       # this client still reads
    a.produce("t", [Record(b"k2", b"v", 1)], partition=0)     # and writes
    before = listing(cluster)
    rc, _, err = kafkalog_process("--cluster", cluster, "consume", "--topic", "t")
    assert_refused(rc, err, ["consume"])
    assert "futureFormat" in err
    assert listing(cluster) == before


def test_cluster_identity_of_a_newer_version_is_refused(cluster):
    meta = json.loads((cluster / "_kafkalog" / "cluster.json").read_text())
    (cluster / "_kafkalog" / "cluster.json").write_text(json.dumps(dict(meta, version=2)))
    rc, _, err = kafkalog("--cluster", cluster, "topics", "--list")
    assert_refused(rc, err, ["topics"])


@pytest.mark.slow
def test_spark_reader_and_writer_refuse_a_future_cluster(cluster, ks):
    add_entry(cluster, FUTURE["unknown action"])
    before = listing(cluster)
    with pytest.raises(Exception, match="UnsupportedVersion|not one this client knows"):
        ks.read.format("kafkalog").option("subscribe", "t").load(str(cluster)).collect()
    df = ks.createDataFrame([("k", "v")], "key string, value string")
    with pytest.raises(Exception, match="UnsupportedVersion|not one this client knows"):
        df.write.format("kafkalog").mode("append").option("topic", "t").save(str(cluster))
    assert listing(cluster) == before


# -- flushConfigs: the topic configs flush.messages and flush.ms (§3, "Durability") ------------

def _entries(root: Path):
    return [json.loads(p.read_text()) for p in
            sorted((root / "_kafkalog" / "log").glob("*[0-9].json"))]


@pytest.mark.parametrize("how", ["create", "alter"])
def test_the_first_flush_config_enables_its_feature_in_an_entry_of_its_own(cluster, monkeypatch,
                                                                          how):
    """Before the entry that first stores flush.messages or flush.ms, the writer enables
    flushConfigs on its own; from then on a client without it refuses to read (a real one,
    here: this process with the feature taken out), and bad input enables nothing."""
    a = Admin(str(cluster), create=False)
    before = listing(cluster)
    with pytest.raises(Exception, match="flush.messages"):
        a.create_topic("bad", 1, configs={"flush.messages": "0"})
    with pytest.raises(Exception, match="flush.ms"):
        a.alter_configs("t", {"flush.ms": "soon"})
    assert listing(cluster) == before and not a.features()["flushConfigs"]["enabled"]
    if how == "create":
        a.create_topic("f", 1, configs={"flush.messages": "10"})
    else:
        a.alter_configs("t", {"flush.ms": "1000"})
    *_, enable, action = _entries(cluster)
    assert enable["actions"] == [{"op": "protocol", "reader_features": ["flushConfigs"]}]
    assert action["actions"][0]["op"] == ("create_topic" if how == "create" else "alter_configs")
    assert a.features()["flushConfigs"]["enabled"]
    n = len(_entries(cluster))
    a.alter_configs("t", {"flush.messages": "5"})              # enabled once only
    assert len(_entries(cluster)) == n + 1
    monkeypatch.delitem(features.READER_FEATURES, "flushConfigs")
    rc, _, err = kafkalog("--cluster", cluster, "consume", "--topic", "t")
    assert_refused(rc, err, ["consume"])
    assert "flushConfigs" in err


def test_a_flush_config_without_its_feature_is_rejected_on_replay(cluster):
    """An entry that stores a flush config before the feature is on (a writer that broke the
    rule) is rejected like any invalid action: the topic is not created, the configs stay."""
    for action in ({"op": "create_topic", "topic": "f", "topic_id": "AAAAAAAAAAAAAAAAAAAAAA",
                    "partitions": 1, "replicas": [["logdir-0"]],
                    "configs": {"flush.messages": "1"}},
                   {"op": "alter_configs", "topic": "t", "set": {"flush.ms": "0"}}):
        add_entry(cluster, {"version": 1, "writer": "w", "timestamp": 1, "actions": [action]})
    a = Admin(str(cluster), create=False)
    assert a.list_topics() == ["t"] and a.describe_topic("t").configs == {}
