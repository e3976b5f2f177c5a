"""Log dirs on other roots and Kafka's replica placement (issue #16, replication, first stage;
docs/protocol.md §1.1, §1.2).

What is checked, and how:

* placement is Kafka's: against the expected assignment of Kafka's own AdminUtils test, and with
  a seeded start index over two real roots (leaders alternate from the drawn start; the follower
  is the other root); create_partitions continues the round from partition 0's leader;
* a topic with RF 2 over two local roots: each leader's segments land under the leader's root
  and nowhere else (followers hold nothing yet, and no checkpoint claims they do), a Spark-free
  read (``Admin.consume``, a fresh client) returns every record, ``describe`` shows ISR = leader;
* the same with the second root on a moto S3 server (storage options without credentials,
  which come from the environment);
* a real Spark write and read of a topic whose leader is on the second root;
* refusals, each with nothing written: RF > log dirs (code 38), a bad ``min.insync.replicas``,
  an unreachable URL, another cluster's log dir, a non-empty directory, the root itself, a URL
  registered already, credentials among the options;
* a log dir whose URL no longer holds it (directory id) is refused for writing;
* replay: the feature gate, a name taken, duplicate replicas; snapshots carry the registry; a
  client without the feature refuses (in process and as a real process);
* the CLI as real processes: ``log-dirs --add`` / ``--describe``, three concurrent ``--add``.
"""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from support.cli_support import REPO, digests, run_cli
from pyspark_kafkalog.admin import Admin
from pyspark_kafkalog.cluster import actions as A
from pyspark_kafkalog.cluster import features
from pyspark_kafkalog.cluster.cluster import Cluster
from pyspark_kafkalog.cluster.log_dirs import assign_replicas_to_log_dirs
from pyspark_kafkalog.maintenance.metadata_check import verify
from pyspark_kafkalog.errors import (InconsistentClusterIdError, InvalidConfigError,
                                     InvalidReplicationFactorError, InvalidRequestError,
                                     KafkaStorageError, LogDirNotEmptyError,
                                     UnsupportedVersionError)
from pyspark_kafkalog.format.checkpoint import parse_meta_properties
from pyspark_kafkalog.format.records import Record
from support.moto_support import BUCKET, moto_options  # noqa: F401  (a session fixture: a moto server)

ENV = {**os.environ, "PYTHONPATH": str(REPO)}


pytestmark = pytest.mark.slow   # log dirs on S3 and Spark across roots (~22 s)


def seed_with_start(n: int, start: int) -> int:
    """A seed whose first draw from ``range(n)`` (Kafka's start index) is ``start``."""
    return next(s for s in range(1000) if random.Random(s).randrange(n) == start)


def two_roots(tmp_path, **options):
    admin = Admin(str(tmp_path / "root"), fsync=False, **options)
    info = admin.add_log_dir(str(tmp_path / "second"))
    return admin, info


def log_files(d: Path):
    return sorted(p.name for p in d.glob("*.log")) if d.is_dir() else []


def values(records):
    return sorted((r.partition, r.offset, r.value) for r in records)


# -- placement -------------------------------------------------------------------------------

def test_placement_is_kafkas_assignment():
    dirs = [f"logdir-{i}" for i in range(5)]
    # Kafka's AdminUtilsTest.testReplicaAssignment: brokers 0..4, 10 partitions, RF 3, start 0
    expected = {0: [0, 1, 2], 1: [1, 2, 3], 2: [2, 3, 4], 3: [3, 4, 0], 4: [4, 0, 1],
                5: [0, 2, 3], 6: [1, 3, 4], 7: [2, 4, 0], 8: [3, 0, 1], 9: [4, 1, 2]}
    got = assign_replicas_to_log_dirs(dirs, 10, 3, fixed_start_index=0)
    assert got == [[dirs[i] for i in expected[p]] for p in range(10)]
    for bad in (0, 6):
        with pytest.raises(InvalidReplicationFactorError) as info:
            assign_replicas_to_log_dirs(dirs, 10, bad)
        assert info.value.error_code == 38
    # random start index and shift, drawn in Kafka's order from the given generator
    r = random.Random(11)
    start, shift = r.randrange(5), r.randrange(5)
    got = assign_replicas_to_log_dirs(dirs, 7, 2, rng=random.Random(11))
    for p, replicas in enumerate(got):
        s = shift + (1 if p >= 5 else 0)
        first = (p + start) % 5
        assert replicas == [dirs[first], dirs[(first + 1 + s % 4) % 5]]


def test_rf2_over_two_roots_writes_and_reads_the_leader(tmp_path):
    admin, second = two_roots(tmp_path)
    assert (second.log_dir, second.url, second.root) == ("logdir-1", str(tmp_path / "second"),
                                                         False)
    meta = parse_meta_properties((tmp_path / "second" / "meta.properties").read_text())
    assert meta["cluster.id"] == admin.cluster.cluster_id
    assert meta["directory.id"] == second.directory_id
    assert [(d.log_dir, d.url, d.root) for d in admin.list_log_dirs()] == [
        ("logdir-0", str(tmp_path / "root" / "logdir-0"), True),
        ("logdir-1", str(tmp_path / "second"), False)]

    admin.cluster.placement_random = random.Random(seed_with_start(2, 1))
    desc = admin.create_topic("t", 4, 2, {"min.insync.replicas": "2"})
    dirs = ["logdir-0", "logdir-1"]
    for p in desc.partitions:   # n = 2: leaders alternate from the start; the follower is the other
        assert p.replicas == [dirs[(p.partition + 1) % 2], dirs[p.partition % 2]]
        assert (p.leader, p.isr) == (p.replicas[0], [p.replicas[0]])
    assert desc.configs == {"min.insync.replicas": "2"}

    sent = [(b"k%d" % i, b"v%d" % i) for i in range(40)]
    for p in range(4):
        admin.produce("t", [Record(k, v) for k, v in sent[p::4]], partition=p)
    place = {"logdir-0": tmp_path / "root" / "logdir-0", "logdir-1": tmp_path / "second"}
    for p in desc.partitions:
        leader, follower = (place[d] / f"t-{p.partition}" for d in p.replicas)
        assert log_files(leader) == ["00000000000000000000.log"]
        assert log_files(follower) == [] and not follower.exists()   # not copied to yet
        assert (leader / "leader-epoch-checkpoint").exists()
    for d, root in place.items():   # each log dir's checkpoints list only the partitions it leads
        text = (root / "replication-offset-checkpoint").read_text().splitlines()
        assert sorted(text[2:]) == sorted(f"t {p.partition} 10" for p in desc.partitions
                                          if p.leader == d)

    expected = sorted((p, i // 4, v) for i, (_, v) in enumerate(sent) for p in [i % 4])
    assert values(admin.consume("t")) == expected
    fresh = Admin(str(tmp_path / "root"), create=False)   # learns the log dir from the log
    assert values(fresh.consume("t")) == expected
    sizes = fresh.describe_log_dirs()
    for p in desc.partitions:
        tp = ("t", p.partition)
        assert sizes[p.leader][tp] > 0 and sizes[p.replicas[1]][tp] == 0

    # more partitions continue the round from partition 0's leader (Kafka's AddPartitions)
    more = fresh.create_partitions("t", 6)
    assert [p.replicas for p in more.partitions[4:]] == [["logdir-1", "logdir-0"],
                                                         ["logdir-0", "logdir-1"]]
    assert (tmp_path / "second" / "t-4" / "partition.metadata").exists()


def test_replication_factor_and_min_insync_replicas_are_checked(tmp_path):
    admin, _ = two_roots(tmp_path)
    before = digests(tmp_path)
    with pytest.raises(InvalidReplicationFactorError) as info:
        admin.create_topic("t", 1, 3)
    assert info.value.error_code == 38 and "number of log dirs (2)" in str(info.value)
    for bad in ("3", "0"):
        with pytest.raises(InvalidConfigError, match="min.insync.replicas"):
            admin.create_topic("t", 1, 2, {"min.insync.replicas": bad})
    assert digests(tmp_path) == before                   # nothing written
    admin.create_topic("t", 1, 2, {"min.insync.replicas": "2"})
    with pytest.raises(InvalidConfigError, match="replication factor \\(2\\)"):
        admin.alter_configs("t", {"min.insync.replicas": "3"})
    assert admin.describe_topic("t").configs == {"min.insync.replicas": "2"}


def test_mounted_storage_routes_paths_and_spools(tmp_path):
    """The routing under every layer: paths of a mounted log dir go to its storage (stripped of
    its name), others to the root's; a spool opened there publishes under the mounted path, and
    where the mounted storage cannot spool (an object store) an in-memory one stands in."""
    from pyspark_kafkalog.errors import AlreadyExistsError
    from pyspark_kafkalog.storage import open_storage
    from pyspark_kafkalog.storage.mounts import BufferSpool, MountedStorage
    base = open_storage(str(tmp_path / "root"))
    local2 = open_storage(str(tmp_path / "two"))
    mem = open_storage(f"memory://mounts-{uuid.uuid4().hex}")
    asked = []
    mounts = {"logdir-1": local2, "logdir-2": mem}
    st = MountedStorage(base, lambda n: asked.append(n) or mounts.get(n), local=["logdir-0"],
                        may_mount=lambda n: n.startswith("logdir-"))
    st.create_if_absent("logdir-0/t-0/a", b"root")
    st.create_if_absent("logdir-1/t-0/a", b"two")
    st.replace_many({"logdir-1/t-0/b": b"B", "logdir-2/t-0/b": b"M", "_kafkalog/x": b"X"})
    assert (tmp_path / "root" / "logdir-0" / "t-0" / "a").read_bytes() == b"root"
    assert (tmp_path / "two" / "t-0" / "a").read_bytes() == b"two"
    assert mem.read("t-0/b") == b"M" and base.read("_kafkalog/x") == b"X"
    assert st.list_dirs("logdir-1") == ["t-0"] and st.read("logdir-2/t-0/b") == b"M"
    assert sorted(asked) == ["logdir-1", "logdir-2"]     # each resolved once; logdir-0 never
    st.delete_many(["logdir-1/t-0/b", "logdir-2/t-0/b"])
    assert not local2.exists("t-0/b") and not mem.exists("t-0/b")

    spool = st.open_spool("logdir-1/t-0", "spool.log")   # the local storage's, translated
    spool.append([b"0123456789"])
    spool.publish("logdir-1/t-0/s.log", [(0, b"ab")])
    assert local2.read("t-0/s.log") == b"ab23456789"
    spool = st.open_spool("logdir-2/t-0", "spool.log")   # memory cannot spool
    assert isinstance(spool, BufferSpool)
    buf = bytearray(b"abcdef")
    spool.append([memoryview(buf)])
    buf[:] = b"zzzzzz"                                    # the caller reuses its buffer
    spool.publish("logdir-2/t-0/s.log", [(4, b"EF")])
    assert mem.read("t-0/s.log") == b"abcdEF"
    spool = st.open_spool("logdir-2/t-0", "spool.log")
    spool.append([b"x"])
    with pytest.raises(AlreadyExistsError):
        spool.publish("logdir-2/t-0/s.log")
    spool = st.open_spool("logdir-2/t-0", "spool.log")
    spool.append([b"y"])
    spool.publish("logdir-2/t-0/s.log", replace=True)
    assert mem.read("t-0/s.log") == b"y"


# -- refusals ----------------------------------------------------------------------------------

def test_refused_urls_change_nothing(tmp_path):
    admin, _ = two_roots(tmp_path)
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "notes.txt").write_text("mine")
    other = Admin(str(tmp_path / "other"))                # another cluster's log dir
    before = digests(tmp_path)
    cases = [
        (str(tmp_path / "a-file" / "sub"), {}, KafkaStorageError, "unreachable"),
        (str(tmp_path / "other" / "logdir-0"), {}, InconsistentClusterIdError,
         other.cluster.cluster_id),
        (str(tmp_path / "junk"), {}, LogDirNotEmptyError, "notes.txt"),
        (str(tmp_path / "root"), {}, InvalidRequestError, "root"),
        (str(tmp_path / "root" / "logdir-9"), {}, InvalidRequestError, "root"),
        (str(tmp_path / "second"), {}, InvalidRequestError, "is log dir logdir-1 already"),
        (str(tmp_path / "second" / "inner"), {}, InvalidRequestError, "overlaps log dir logdir-1"),
        (str(tmp_path / "new"), {"secret": "s"}, InvalidConfigError, "credential"),
        (str(tmp_path / "new"), {"aws_access_key_id": "AK"}, InvalidConfigError, "credential"),
        (str(tmp_path / "new"), {"fsync": "false"}, InvalidConfigError, "client setting"),
    ]
    for url, options, error, needle in cases:
        with pytest.raises(error, match=needle):
            admin.add_log_dir(url, options)
        assert digests(tmp_path) == before, url
    assert [d.log_dir for d in admin.list_log_dirs()] == ["logdir-0", "logdir-1"]


def test_a_registration_that_died_before_its_entry_is_taken_up(tmp_path):
    from pyspark_kafkalog.log.logdir import LogDir
    from pyspark_kafkalog.storage import open_storage
    admin = Admin(str(tmp_path / "root"), fsync=False)
    meta = LogDir(open_storage(str(tmp_path / "d"))).ensure_meta(admin.cluster.cluster_id)
    info = admin.add_log_dir(str(tmp_path / "d"))
    assert info.directory_id == meta["directory.id"]


def test_a_url_that_no_longer_holds_the_log_dir_is_not_written(tmp_path):
    admin, _ = two_roots(tmp_path)
    admin.cluster.placement_random = random.Random(seed_with_start(2, 1))
    admin.create_topic("t", 1, 2)                        # leader: logdir-1
    admin.produce("t", [Record(b"k", b"before")])
    (tmp_path / "second").rename(tmp_path / "second.moved")   # the disk is not mounted ...
    (tmp_path / "second").mkdir()                             # ... an empty mount point is
    fresh = Admin(str(tmp_path / "root"), create=False)
    with pytest.raises(KafkaStorageError, match="directory.id None"):
        fresh.produce("t", [Record(b"k", b"lost")], delivery_timeout_ms=0)   # not retried
    assert list((tmp_path / "second").iterdir()) == []
    (tmp_path / "second").rmdir()
    (tmp_path / "second.moved").rename(tmp_path / "second")
    assert [r.value for r in Admin(str(tmp_path / "root"), create=False).consume("t")] == \
        [b"before"]


# -- replay, snapshots, the feature ------------------------------------------------------------

def test_replay_rules(tmp_path):
    c = Cluster(str(tmp_path / "root"), fsync=False)
    add = A.AddLogDir(log_dir="logdir-1", url="/x", directory_id="d1")
    _, _, [r] = c.submit([add])
    assert r.error == "INVALID_REQUEST" and "logDirRegistry" in r.message
    assert c.state().log_dirs == {}
    c.enable_feature("logDirRegistry")
    _, state, results = c.submit([
        add, A.AddLogDir(log_dir="logdir-1", url="/y", directory_id="d2"),
        A.AddLogDir(log_dir="logdir-2", url="/x", directory_id="d3"),
        A.AddLogDir(log_dir="nope", url="/z", directory_id="d4"),
        A.CreateTopic(topic="t", topic_id="i", partitions=1, replicas=[["logdir-1", "logdir-1"]]),
    ])
    assert [r.error for r in results] == ["NONE", "INVALID_REQUEST", "INVALID_REQUEST",
                                          "INVALID_REQUEST", "INVALID_REPLICA_ASSIGNMENT"]
    assert "taken" in results[1].message and "registered already" in results[2].message
    assert state.log_dirs == {"logdir-1": {"url": "/x", "directory_id": "d1",
                                           "storage_options": {}, "added": state.timestamp}}


def test_snapshots_carry_the_registry(tmp_path):
    root = tmp_path / "root"
    admin = Admin(str(root), fsync=False, snapshot_interval=2)
    admin.add_log_dir(str(tmp_path / "second"))
    admin.create_topic("t", 2, 2)
    admin.produce("t", [Record(b"k", b"v")], partition=1)
    log = root / "_kafkalog" / "log"
    newest = max(log.glob("*.snapshot.json"))
    seq = int(newest.name.split(".")[0])
    assert json.loads(newest.read_text())["log_dirs"]["logdir-1"]["url"] == \
        str(tmp_path / "second")
    for p in log.glob("*[0-9].json"):                  # only the snapshot knows the past now
        if int(p.stem) <= seq:
            p.unlink()
    fresh = Cluster(str(root), create=False)
    assert fresh.state().log_dirs == admin.cluster.state().log_dirs
    assert [r.value for r in Admin(fresh).consume("t")] == [b"v"]
    assert not verify(fresh.metalog).problems


def test_a_client_without_the_feature_refuses(tmp_path, monkeypatch):
    admin, _ = two_roots(tmp_path)
    admin.create_topic("t", 2, 2)
    root = tmp_path / "root"
    older = ("import sys; from pyspark_kafkalog.cluster import features; "
             "del features.READER_FEATURES['logDirRegistry']; "
             "from pyspark_kafkalog.cli.main import main; "
             f"sys.exit(main(['--cluster', {str(root)!r}, 'consume', '--topic', 't']))")
    before = digests(tmp_path)
    proc = subprocess.run([sys.executable, "-c", older], env=ENV, capture_output=True,
                          text=True, timeout=180)
    assert proc.returncode == 1, proc.stderr
    assert "logDirRegistry" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert digests(tmp_path) == before
    monkeypatch.delitem(features.READER_FEATURES, features.LOG_DIR_REGISTRY)
    with pytest.raises(UnsupportedVersionError, match="logDirRegistry"):
        Cluster(str(root), create=False).state()


# -- S3 (moto) ---------------------------------------------------------------------------------

def test_a_log_dir_on_s3(tmp_path, moto_options, monkeypatch):  # noqa: F811
    from pyspark_kafkalog.storage import open_storage
    # credentials never go into the metadata log: the process has them in its environment
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", moto_options["key"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", moto_options["secret"])
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    url = f"s3://{BUCKET}/logdirs-{uuid.uuid4().hex}"
    admin = Admin(str(tmp_path / "root"), fsync=False)
    info = admin.add_log_dir(url, {"endpoint_url": moto_options["endpoint_url"]})
    assert (info.log_dir, info.url) == ("logdir-1", url)
    admin.cluster.placement_random = random.Random(seed_with_start(2, 1))
    desc = admin.create_topic("t", 2, 2)
    assert [p.leader for p in desc.partitions] == ["logdir-1", "logdir-0"]
    admin.produce("t", [Record(b"a", b"on-s3")], partition=0)
    admin.produce("t", [Record(b"b", b"on-disk")], partition=1)
    s3 = open_storage(url, **moto_options)
    assert [f.name for f in s3.list("t-0") if f.name.endswith(".log")] == \
        ["00000000000000000000.log"]
    assert s3.list("t-1") == []                          # the follower: nothing copied yet
    assert log_files(tmp_path / "root" / "logdir-0" / "t-0") == []
    fresh = Admin(str(tmp_path / "root"), create=False)
    assert values(fresh.consume("t")) == [(0, 0, b"on-s3"), (1, 0, b"on-disk")]
    with pytest.raises(InvalidConfigError, match="credential"):
        admin.add_log_dir(f"s3://{BUCKET}/other-{uuid.uuid4().hex}", {"key": "k"})


# -- Spark -------------------------------------------------------------------------------------

def test_spark_writes_and_reads_leaders_on_the_second_root(tmp_path, ks):
    admin, _ = two_roots(tmp_path)
    admin.cluster.placement_random = random.Random(seed_with_start(2, 1))
    admin.create_topic("far", 1, 2)                      # its leader: logdir-1
    admin.cluster.placement_random = random.Random(seed_with_start(2, 0))
    admin.create_topic("both", 2, 2)                     # leaders: logdir-0, logdir-1
    assert admin.describe_topic("far").partitions[0].leader == "logdir-1"
    admin.produce("both", [Record(b"k", b"b0")], partition=0)
    admin.produce("both", [Record(b"k", b"b1")], partition=1)
    root = str(tmp_path / "root")
    rows = [(f"k{i}", f"v{i}") for i in range(50)]
    (ks.createDataFrame(rows, "key string, value string").repartition(3)
     .write.format("kafkalog").option("topic", "far").mode("append").save(root))
    assert log_files(tmp_path / "second" / "far-0") != []
    assert log_files(tmp_path / "root" / "logdir-0" / "far-0") == []

    got = ks.read.format("kafkalog").option("subscribe", "far").load(root).collect()
    assert sorted((bytes(r.key).decode(), bytes(r.value).decode()) for r in got) == sorted(rows)
    assert sorted(r.offset for r in got) == list(range(50))
    got = ks.read.format("kafkalog").option("subscribe", "both").load(root).collect()
    assert sorted((r.partition, bytes(r.value)) for r in got) == [(0, b"b0"), (1, b"b1")]


# -- the command line, as real processes -------------------------------------------------------

def test_cli_log_dirs_add_and_describe(tmp_path):
    root, second = str(tmp_path / "root"), str(tmp_path / "second")
    rc, out, err = run_cli("--cluster", root, "topics", "--create", "--topic", "t")
    assert rc == 0, err
    rc, out, err = run_cli("--cluster", root, "--json", "log-dirs", "--add", second)
    assert rc == 0, err
    added = json.loads(out)
    assert (added["log_dir"], added["url"]) == ("logdir-1", second)
    rc, out, err = run_cli("--cluster", root, "topics", "--create", "--topic", "r",
                           "--partitions", 2, "--replication-factor", 2)
    assert rc == 0, err
    rc, out, _ = run_cli("--cluster", root, "--json", "log-dirs", "--describe")
    rows = [json.loads(line) for line in out.splitlines()]
    assert [(r["log_dir"], r["url"], r["topic"], r["partition"]) for r in rows] == [
        ("logdir-0", str(Path(root) / "logdir-0"), "r", 0),
        ("logdir-0", str(Path(root) / "logdir-0"), "r", 1),
        ("logdir-0", str(Path(root) / "logdir-0"), "t", 0),
        ("logdir-1", second, "r", 0), ("logdir-1", second, "r", 1)]
    rc, out, _ = run_cli("--cluster", root, "log-dirs", "--describe")
    assert out.splitlines()[0].split() == ["LOG-DIR", "URL", "TOPIC", "PARTITION", "SIZE",
                                           "OFFSET-LAG", "ERROR"]
    rc, out, _ = run_cli("--cluster", root, "--json", "topics", "--describe", "--topic", "r")
    for p in json.loads(out)["partitions"]:
        assert p["leader"] == p["replicas"][0] and p["isr"] == [p["leader"]]
        assert sorted(p["replicas"]) == ["logdir-0", "logdir-1"]

    before = digests(tmp_path)
    for argv, status, needle in [
        (["log-dirs", "--add", str(tmp_path / "x"), "--storage-option", "secret=s"], 2,
         "InvalidConfigError"),
        (["log-dirs", "--add", second], 2, "is log dir logdir-1 already"),
        (["log-dirs", "--describe", "--storage-option", "a=b"], 2, "applies to --add only"),
        (["topics", "--create", "--topic", "u", "--replication-factor", 3], 2,
         "InvalidReplicationFactorError"),
        (["topics", "--create", "--topic", "u", "--replication-factor", 2, "--config",
          "min.insync.replicas=3"], 2, "min.insync.replicas=3"),
    ]:
        rc, out, err = run_cli("--cluster", root, *argv)
        assert rc == status and needle in err and len(err.strip().splitlines()) == 1, err
    (tmp_path / "a-file").write_text("x")
    rc, _, err = run_cli("--cluster", root, "log-dirs", "--add", tmp_path / "a-file" / "d")
    assert rc == 1 and "KafkaStorageError" in err and "unreachable" in err, err
    assert "Traceback" not in err
    assert {k: v for k, v in digests(tmp_path).items() if k != "a-file"} == before


def test_concurrent_adds_get_distinct_names(tmp_path):
    root = str(tmp_path / "root")
    Admin(root)
    procs = [subprocess.Popen([sys.executable, "-m", "pyspark_kafkalog.cli.main", "--cluster",
                               root, "--json", "log-dirs", "--add", str(tmp_path / f"d{i}")],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
             for i in range(3)]
    added = []
    for p in procs:
        out, err = p.communicate(timeout=180)
        assert p.returncode == 0, err
        added.append(json.loads(out))
    assert sorted(a["log_dir"] for a in added) == ["logdir-1", "logdir-2", "logdir-3"]
    listed = Admin(root, create=False).list_log_dirs()
    assert {(d.log_dir, d.url) for d in listed[1:]} == {(a["log_dir"], a["url"]) for a in added}
