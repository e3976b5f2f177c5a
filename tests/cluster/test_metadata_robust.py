"""The metadata log against bad entries and snapshots (docs/protocol.md §2, §2.1): a malformed
entry stops every command with one line naming it (no traceback, nothing written), an action
with a wrong field applies whole or not at all, a snapshot is never trusted on its own word, and
`kafkalog metadata --verify | --repair` find and get past what is wrong."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from support.cli_support import digests as listing, run_cli as kafkalog, run_main
from pyspark_kafkalog.admin import Admin
from pyspark_kafkalog.cluster.metalog import MetadataLog, entry_name, snapshot_name
from pyspark_kafkalog.cluster.state import ClusterState
from pyspark_kafkalog.errors import CorruptRecordError
from pyspark_kafkalog.format.records import Record

COMMANDS = [["topics", "--list"], ["consume", "--topic", "t"], ["offsets", "--topic", "t"],
            ["produce", "--topic", "t"], ["cleanup"], ["retention"],
            ["delete-records", "--offset-json-file", "-"], ["log-dirs", "--describe"]]




@pytest.fixture
def cluster(tmp_path) -> Path:
    root = tmp_path / "kl"
    a = Admin(str(root))
    a.create_topic("t", 2)
    for i in range(3):
        a.produce("t", [Record(b"k%d" % i, b"v", 1)], partition=i % 2)
    return root


def next_seq(root: Path) -> int:
    return len(list((root / "_kafkalog" / "log").glob("*[0-9].json")))


def write_entry(root: Path, body) -> int:
    seq = next_seq(root)
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    (root / entry_name(seq)).write_bytes(data)
    return seq


BAD_ENTRIES = {
    "a list": [{"op": "delete_topic", "topic": "t"}],
    "timestamp soon": {"version": 1, "writer": "w", "timestamp": "soon", "actions": []},
    "not json": b"{\"version\": 1, \"actions\": [",
    "no actions": {"version": 1, "writer": "w", "timestamp": 5},
}


@pytest.mark.slow
@pytest.mark.parametrize("what", sorted(BAD_ENTRIES))
def test_malformed_entry_stops_every_command_with_one_line(cluster, what):
    seq = write_entry(cluster, BAD_ENTRIES[what])
    before = listing(cluster)
    for argv in COMMANDS:
        stdin = '{"value": null}\n' if argv[0] == "produce" else (
            '{"partitions": [{"topic": "t", "partition": 0, "offset": 1}], "version": 1}'
            if argv[0] == "delete-records" else "")
        rc, out, err = run_main("--cluster", cluster, *argv, stdin=stdin)
        assert rc == 1, (argv, out, err)
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1, (argv, err)
        assert f"{seq:020d}.json" in err, (argv, err)
    assert listing(cluster) == before            # nothing written, nothing deleted
    rc, out, err = kafkalog("--cluster", cluster, "--json", "metadata", "--verify")
    assert rc == 1
    problems = [json.loads(x) for x in out.splitlines()]
    assert [(p["kind"], p["path"]) for p in problems] == [("malformed-entry", entry_name(seq))]
    assert listing(cluster) == before
    rc, out, err = kafkalog("--cluster", cluster, "--json", "metadata", "--repair")
    assert rc == 0, err
    (fixed,) = [json.loads(x) for x in out.splitlines()]
    assert fixed["action"] == "replaced" and fixed["path"] == entry_name(seq)
    assert (cluster / fixed["quarantined"]).read_bytes() == (
        BAD_ENTRIES[what] if isinstance(BAD_ENTRIES[what], bytes)
        else json.dumps(BAD_ENTRIES[what]).encode())
    assert kafkalog("--cluster", cluster, "metadata", "--verify")[0] == 0
    rc, out, err = kafkalog("--cluster", cluster, "consume", "--topic", "t")
    assert rc == 0 and len(out.splitlines()) == 3, err


def test_unknown_entry_version_is_refused(cluster):
    seq = write_entry(cluster, {"version": 2, "writer": "w", "timestamp": 5, "actions": []})
    rc, _, err = kafkalog("--cluster", cluster, "topics", "--list")
    assert rc == 1 and "UnsupportedVersionError" in err and f"{seq:020d}.json" in err


def test_timestamp_out_of_range_entry_is_refused(cluster):
    write_entry(cluster, {"version": 1, "writer": "w", "timestamp": 1 << 63, "actions": []})
    rc, _, err = kafkalog("--cluster", cluster, "topics", "--list")
    assert rc == 1 and "64-bit" in err


@pytest.mark.parametrize("field,value", [("timeout_ms", "abc"), ("partitions", {"t:x": 1}),
                                         ("partitions", {"t:0": "2"}), ("txn", 7)])
def test_malformed_reserve_applies_whole_or_not_at_all(cluster, field, value):
    """A reserve whose timeout_ms is "abc" used to be half applied: the high watermark pinned
    for ever, the next produce acknowledged and never visible, then deleted by cleanup."""
    a = Admin(str(cluster), create=False)
    before = a.cluster.state().copy()
    action = {"op": "reserve", "txn": "bad", "producer": "p", "timeout_ms": 1000,
              "partitions": {"t:0": 2}, field: value}
    seq, state = a.cluster.metalog.append([action])     # raw JSON: malformed on purpose
    results = state.results[seq]
    assert results[0].error == "INVALID_REQUEST" and field in results[0].message
    assert state.partitions["t:0"].to_json() == before.partitions["t:0"].to_json()
    assert state.txns == before.txns
    ack = a.produce("t", [Record(b"after", b"v", 1)], partition=0)[0]
    a.cleanup()
    got = [r.key for r in a.consume("t", 0)]
    assert b"after" in got and ack.offset == before.partitions["t:0"].next_offset


@pytest.mark.parametrize("action", [
    {"op": "create_topic", "topic": "u", "topic_id": "x", "partitions": "2", "replicas": []},
    {"op": "set_log_start", "partitions": {"t:0": "1"}, "principal": None},
    {"op": "commit", "txns": "abc"},
    {"op": "acl", "add": [{"principal": "User:a", "topic": "t"}]},
    {"op": "alter_configs", "topic": "t", "set": {"retention.ms": 5}},
])
def test_malformed_actions_are_rejected_and_change_nothing(cluster, action):
    a = Admin(str(cluster), create=False)
    before = a.cluster.state().to_snapshot()
    seq, state = a.cluster.metalog.append([action])     # raw JSON: malformed on purpose
    assert state.results[seq][0].error == "INVALID_REQUEST"
    after = state.to_snapshot()
    assert {k: v for k, v in after.items() if k not in ("seq", "timestamp")} == \
        {k: v for k, v in before.items() if k not in ("seq", "timestamp")}


def snapshot_at(root: Path, seq: int, body) -> Path:
    p = root / snapshot_name(seq)
    p.write_text(json.dumps(body))
    return p


@pytest.mark.parametrize("body", [
    {"version": 1, "seq": 0, "timestamp": 0, "topics": [], "partitions": {}, "txns": {},
     "decided": {}, "acls": []},
    {"version": 2, "seq": 0, "timestamp": 0, "topics": {}, "partitions": {}, "txns": {},
     "decided": {}, "acls": [], "checksum": "0" * 64},
    [1, 2, 3],
    {"version": 1, "seq": 0, "timestamp": 0, "topics": {}, "partitions": {}, "txns": {},
     "decided": {}, "acls": []},   # well formed, claims an empty cluster: contradicts the log
])
def test_snapshots_that_do_not_prove_themselves_are_ignored(cluster, body):
    seq = next_seq(cluster) - 1
    body = body if not isinstance(body, dict) else dict(body, seq=seq)
    snapshot_at(cluster, seq, body)
    before = {k: v for k, v in listing(cluster).items() if "snapshot" not in k}
    for argv in (["topics", "--list"], ["consume", "--topic", "t"], ["cleanup"]):
        rc, out, err = run_main("--cluster", cluster, *argv)
        assert rc == 0 and "Traceback" not in err, (argv, err)
    rc, out, _ = run_main("--cluster", cluster, "consume", "--topic", "t")
    assert len(out.splitlines()) == 3
    assert {k: v for k, v in listing(cluster).items() if "snapshot" not in k
            and "checkpoint" not in k} == \
        {k: v for k, v in before.items() if "checkpoint" not in k}
    rc, out, _ = run_main("--cluster", cluster, "--json", "metadata", "--verify")
    assert rc == 1 and json.loads(out.splitlines()[0])["path"] == snapshot_name(seq)
    assert run_main("--cluster", cluster, "metadata", "--repair")[0] == 0
    assert not (cluster / snapshot_name(seq)).exists()
    assert run_main("--cluster", cluster, "metadata", "--verify")[0] == 0


def test_old_snapshot_saying_empty_never_deletes_data(cluster):
    """When the entries before a version-1 snapshot are gone, that snapshot is the only way to
    the past and is used, but cleanup deletes no directory on its word alone."""
    a = Admin(str(cluster), create=False)
    seq = a.cluster.state().seq
    snapshot_at(cluster, seq, {"version": 1, "seq": seq, "timestamp": 0, "topics": {},
                               "partitions": {}, "txns": {}, "decided": {}, "acls": []})
    for s in range(seq):
        (cluster / entry_name(s)).unlink()
    dirs = sorted(p.name for p in (cluster / "logdir-0").iterdir() if p.is_dir())
    rc, out, err = kafkalog("--cluster", cluster, "--json", "cleanup")
    assert rc == 0, err
    rows = [json.loads(x) for x in out.splitlines()]
    assert {r["kind"] for r in rows} == {"kept-unknown"}
    assert sorted(p.name for p in (cluster / "logdir-0").iterdir() if p.is_dir()) == dirs


@pytest.mark.slow
def test_good_snapshots_are_used_and_verified(tmp_path):
    root = tmp_path / "kl"
    a = Admin(str(root), snapshot_interval=5)
    a.create_topic("t", 2)
    a.create_topic("u", 3000)                 # three partition parts of 1,024
    for i in range(12):
        a.produce("t", [Record(b"k%d" % i, b"v", 1)], partition=i % 2)
    snap = json.loads((root / snapshot_name(10)).read_text())
    assert snap["version"] == 3 and len(snap["checksum"]) == 64
    assert sorted(snap["parts"]) == ["p/t/0", "p/u/0", "p/u/1", "p/u/2", "t/t", "t/u"]
    older = json.loads((root / snapshot_name(5)).read_text())
    # only what changed since the last snapshot is written again: t's partitions
    assert {k for k in snap["parts"] if snap["parts"][k] != older["parts"][k]} == {"p/t/0"}
    fresh = MetadataLog(Admin(str(root), create=False).cluster.storage)
    assert fresh.state().to_snapshot() == a.cluster.state().to_snapshot()
    rc, out, err = kafkalog("--cluster", root, "metadata", "--verify")
    assert rc == 0 and "sound" in out, err
    # a part that does not match its hash makes its snapshot unusable: found, not trusted
    part = root / "_kafkalog" / "log" / "parts" / f"{snap['parts']['p/t/0']}.json"
    part.write_text(part.read_text().replace('"rows":', '"rows": ', 1))
    fresh = MetadataLog(Admin(str(root), create=False).cluster.storage)
    assert fresh.state().to_snapshot() == a.cluster.state().to_snapshot()
    rc, out, _ = kafkalog("--cluster", root, "--json", "metadata", "--verify")
    assert rc == 1 and json.loads(out.splitlines()[0])["path"] == snapshot_name(10)


def test_missing_entry_is_named_and_repaired(cluster):
    seq = next_seq(cluster)
    a = Admin(str(cluster), create=False)
    a.produce("t", [Record(b"x", b"v", 1)], partition=0)
    a.produce("t", [Record(b"y", b"v", 1)], partition=0)
    (cluster / entry_name(seq + 1)).unlink()      # lose the commit of x... or its reserve
    rc, _, err = kafkalog("--cluster", cluster, "topics", "--list")
    assert rc == 1 and "gap" in err and "Traceback" not in err
    rc, out, _ = kafkalog("--cluster", cluster, "--json", "metadata", "--verify")
    assert rc == 1 and json.loads(out.splitlines()[0])["kind"] == "missing-entry"
    rc, out, _ = kafkalog("--cluster", cluster, "--json", "metadata", "--repair")
    assert rc == 0 and json.loads(out.splitlines()[0])["action"] == "created"
    assert kafkalog("--cluster", cluster, "metadata", "--verify")[0] == 0
    assert kafkalog("--cluster", cluster, "consume", "--topic", "t")[0] == 0


def test_apply_refuses_malformed_entries_in_process():
    s = ClusterState()
    with pytest.raises(CorruptRecordError, match="00000000000000000000.json"):
        s.apply(0, ["not", "an", "object"])
    assert s.seq == -1
