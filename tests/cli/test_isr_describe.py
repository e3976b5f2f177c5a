"""The ISR where users look (docs/protocol.md §1.3): ``topics --describe`` (table and
``--json``), ``Admin.describe_topic``, the filters ``--under-replicated-partitions``,
``--under-min-isr-partitions`` and ``--at-min-isr-partitions``, and the coordinator's
replication gauges (``cluster.replication_summary`` at each scrape).

The state is built through the real API: a cluster under tmp_path with a second log dir
(``Admin.add_log_dir``), topics with two replicas, writes as ``reserve``/``commit`` entries,
then the coordinator's ``replica_progress`` and ``alter_isr`` under a lease (``lease.acquire``),
as the replicator appends them.
"""
from __future__ import annotations

import io
import json
import sys
from itertools import count

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from pyspark_kafkalog.admin import Admin
from pyspark_kafkalog.cli.main import main
from pyspark_kafkalog.cluster import actions as A
from pyspark_kafkalog.cluster import lease as L
from pyspark_kafkalog.cluster.cluster import replication_summary
from pyspark_kafkalog.cluster.features import REPLICATION
from pyspark_kafkalog.coordinator.metrics import CoordinatorMetrics

BASE_KEYS = ["partition", "leader", "replicas", "isr", "leader_epoch", "log_start_offset",
             "high_watermark"]
BASE_HEADER = ["PARTITION", "LEADER", "REPLICAS", "ISR", "LEADER-EPOCH", "LOG-START-OFFSET",
               "HIGH-WATERMARK"]


class World:
    """A two-log-dir cluster; topics ``r`` (RF 2, 2 partitions, min ISR 1), ``m`` (RF 2,
    min.insync.replicas 2) and ``s`` (one replica); a coordinator's lease for its actions."""

    def __init__(self, tmp_path):
        self.admin = Admin(str(tmp_path / "root"), fsync=False)
        self.admin.add_log_dir(str(tmp_path / "second"))
        self.cluster = self.admin.cluster
        self.url = self.cluster.url
        self.admin.create_topic("r", 2, replication_factor=2)
        self.admin.create_topic("m", 1, replication_factor=2, configs={"min.insync.replicas": "2"})
        self.admin.create_topic("s", 1)
        self.lease = L.acquire(self.cluster, "test-coordinator", "h:1", 600_000)
        self._txn = count()

    def replicas(self, topic: str, p: int = 0):
        return self.cluster.state().topics[topic]["replicas"][p]

    def topic_ids(self):
        return {t: info["topic_id"] for t, info in self.cluster.state().topics.items()}

    def write(self, topic: str, p: int, n: int, commit: bool = True) -> str:
        txn = f"txn-{next(self._txn)}"
        self.cluster.submit_one(A.Reserve(txn=txn, producer="producer-1", timeout_ms=600_000,
                                          partitions={f"{topic}:{p}": n}))
        if commit:
            self.cluster.submit_one(A.Commit(txns=[txn]))
        return txn

    def progress(self, topic: str, p: int, follower: str, *ranges) -> A.Result:
        _, _, [r] = self.cluster.submit([A.ReplicaProgress(
            coordinator_epoch=self.lease.epoch, topic_ids=self.topic_ids(),
            partitions={f"{topic}:{p}": {follower: [list(x) for x in ranges]}})])
        assert r.ok, r
        return r.partitions[f"{topic}:{p}"]

    def alter_isr(self, topic: str, p: int, isr, joining=()) -> A.Result:
        rep = self.cluster.state().partition(topic, p).replication
        _, _, [r] = self.cluster.submit([A.AlterIsr(
            coordinator_epoch=self.lease.epoch, topic_ids=self.topic_ids(),
            partitions={f"{topic}:{p}": {"partition_epoch": rep["partition_epoch"],
                                         "isr": list(isr), "joining": list(joining)}})])
        assert r.ok, r
        return r.partitions[f"{topic}:{p}"]

    def join(self, topic: str, p: int = 0) -> None:
        """The follower copies everything committed, joins, then enters the ISR."""
        leader, follower = self.replicas(topic, p)
        ps = self.cluster.state().partition(topic, p)
        if ps.next_offset:
            assert self.progress(topic, p, follower, (0, ps.next_offset)).ok
        assert self.alter_isr(topic, p, [leader], [follower]).ok
        assert self.alter_isr(topic, p, [leader, follower]).ok


@pytest.fixture
def world(tmp_path):
    return World(tmp_path)


@pytest.fixture
def kl(capsys, monkeypatch):
    """`kafkalog ARGV` in this process: (exit status, stdout, stderr)."""
    def run(*argv):
        monkeypatch.setattr(sys, "stdin", io.StringIO(""))
        try:
            rc = main([str(a) for a in argv])
        except SystemExit as exc:
            rc = exc.code
        out, err = capsys.readouterr()
        return rc, out, err
    return run


def described(kl, url, *args):
    rc, out, err = kl("--cluster", url, "--json", "topics", "--describe", *args)
    assert rc == 0, err
    return {d["topic"]: d for d in map(json.loads, out.splitlines())}


def table(kl, url, *args):
    rc, out, err = kl("--cluster", url, "topics", "--describe", *args)
    assert rc == 0, err
    return out


# -- describe ------------------------------------------------------------------------------------

def test_describe_shows_the_real_isr_joining_and_both_watermarks(world, kl):
    leader, follower = world.replicas("r")
    world.write("r", 0, 5)
    # before the feature: the leader alone, HW = LSO, and the columns of before
    [p0, _] = world.admin.describe_topic("r").partitions
    assert (p0.leader, p0.isr, p0.joining, p0.partition_epoch) == (leader, [leader], [], None)
    assert p0.high_watermark == p0.last_stable_offset == 5
    r = described(kl, world.url, "--topic", "r")["r"]
    assert [list(p) for p in r["partitions"]] == [BASE_KEYS, BASE_KEYS]
    assert r["partitions"][0]["isr"] == [leader] and r["partitions"][0]["high_watermark"] == 5
    assert table(kl, world.url, "--topic", "r").splitlines()[1].split() == BASE_HEADER

    world.admin.enable_feature(REPLICATION)
    [p0, _] = world.admin.describe_topic("r").partitions
    assert (p0.isr, p0.joining, p0.partition_epoch) == ([leader], [], 0)
    assert p0.high_watermark == p0.last_stable_offset == 5    # turning it on hides nothing
    d = described(kl, world.url)
    assert list(d["r"]["partitions"][0]) == BASE_KEYS + ["joining", "last_stable_offset",
                                                         "partition_epoch"]
    assert [list(p) for p in d["s"]["partitions"]] == [BASE_KEYS]   # one replica: as before
    assert table(kl, world.url, "--topic", "r").splitlines()[1].split() == \
        BASE_HEADER + ["JOINING", "LAST-STABLE-OFFSET"]
    assert table(kl, world.url, "--topic", "s").splitlines()[1].split() == BASE_HEADER

    # the follower joins holding nothing: it holds the HW where it is while data commits
    world.alter_isr("r", 0, [leader], [follower])
    world.write("r", 0, 3)
    world.write("r", 0, 2, commit=False)                      # an open write: LSO 8
    p = described(kl, world.url, "--topic", "r")["r"]["partitions"][0]
    assert {k: p[k] for k in ("isr", "joining", "high_watermark", "last_stable_offset",
                              "partition_epoch")} == \
        {"isr": [leader], "joining": [follower], "high_watermark": 5, "last_stable_offset": 8,
         "partition_epoch": 1}
    # it copies what is committed, enters the ISR: the HW reaches the LSO
    world.progress("r", 0, follower, (0, 8))
    world.alter_isr("r", 0, [leader, follower])
    [p0, p1] = world.admin.describe_topic("r").partitions
    assert (p0.isr, p0.joining, p0.partition_epoch) == ([leader, follower], [], 2)
    assert p0.high_watermark == p0.last_stable_offset == 8
    assert p1.isr == [world.replicas("r", 1)[0]]
    lines = table(kl, world.url, "--topic", "r").splitlines()
    header = lines[1].split()
    row = dict(zip(header, lines[2].split()))
    assert row == {"PARTITION": "0", "LEADER": leader, "REPLICAS": ",".join(world.replicas("r")),
                   "ISR": f"{leader},{follower}", "LEADER-EPOCH": "0", "LOG-START-OFFSET": "0",
                   "HIGH-WATERMARK": "8", "JOINING": "-", "LAST-STABLE-OFFSET": "8"}


def test_the_partition_filters(world, kl):
    world.admin.enable_feature(REPLICATION)
    # every partition with two replicas is under-replicated; m (min ISR 2) is under min ISR;
    # r (min ISR 1) and s (one replica, min ISR 1) are at min ISR
    under = described(kl, world.url, "--under-replicated-partitions")
    assert {t: [p["partition"] for p in d["partitions"]] for t, d in under.items()} == \
        {"m": [0], "r": [0, 1]}
    assert under["r"]["partition_count"] == 2
    assert list(described(kl, world.url, "--under-min-isr-partitions")) == ["m"]
    at_min = described(kl, world.url, "--at-min-isr-partitions")
    assert {t: [p["partition"] for p in d["partitions"]] for t, d in at_min.items()} == \
        {"r": [0, 1], "s": [0]}
    # text: only the matching partitions' rows, topics without any left out
    out = table(kl, world.url, "--under-min-isr-partitions")
    assert out.splitlines()[0].startswith("Topic: m ") and len(out.splitlines()) == 3

    world.write("m", 0, 4)
    world.join("m")
    world.join("r", 1)
    assert described(kl, world.url, "--under-min-isr-partitions") == {}
    assert table(kl, world.url, "--under-min-isr-partitions") == ""
    under = described(kl, world.url, "--under-replicated-partitions")
    assert {t: [p["partition"] for p in d["partitions"]] for t, d in under.items()} == \
        {"r": [0]}
    at_min = described(kl, world.url, "--at-min-isr-partitions")
    assert {t: [p["partition"] for p in d["partitions"]] for t, d in at_min.items()} == \
        {"m": [0], "r": [0], "s": [0]}
    assert described(kl, world.url, "--topic", "m")["m"]["partitions"][0]["high_watermark"] == 4


@pytest.mark.parametrize("argv, needle", [
    (["--describe", "--under-replicated-partitions", "--under-min-isr-partitions"],
     "do not go together"),
    (["--list", "--under-replicated-partitions"],
     "--under-replicated-partitions does not apply to --list"),
    (["--create", "--topic", "x", "--at-min-isr-partitions"],
     "--at-min-isr-partitions does not apply to --create"),
])
def test_filter_misuse_is_refused(world, kl, argv, needle):
    rc, out, err = kl("--cluster", world.url, "topics", *argv)
    assert rc != 0 and needle in err, (rc, out, err)
    assert "x" not in world.admin.list_topics()


# -- metrics -------------------------------------------------------------------------------------

def scrape(cluster) -> dict:
    m = CoordinatorMetrics()
    m.watch_replication(lambda: replication_summary(cluster.state()))
    text = generate_latest(m.registry).decode()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(text) for s in f.samples}
    return {"summary": m.summary(), "samples": samples}


def gauges(cluster) -> dict:
    s = scrape(cluster)["summary"]
    return {k: s[k] for k in ("partitions", "under_replicated_partitions",
                              "under_min_isr_partitions", "at_min_isr_partitions",
                              "replication_max_lag_offsets", "partitions_by_isr_size")}


def test_replication_gauges_count_the_real_isr(world):
    leader, follower = world.replicas("r")
    world.write("r", 0, 5)
    world.write("m", 0, 2)
    # no feature: the leader alone everywhere, and no lag measured (nothing is replicated)
    assert gauges(world.cluster) == {
        "partitions": 4, "under_replicated_partitions": 3, "under_min_isr_partitions": 1,
        "at_min_isr_partitions": 3, "replication_max_lag_offsets": 0,
        "partitions_by_isr_size": {1: 4}}
    world.admin.enable_feature(REPLICATION)
    assert gauges(world.cluster)["replication_max_lag_offsets"] == 5    # r:0's follower: 5 - 0
    world.progress("r", 0, follower, (0, 3))
    world.write("r", 0, 4, commit=False)                     # open: not lag yet
    assert gauges(world.cluster)["replication_max_lag_offsets"] == 2
    world.join("m")
    world.progress("r", 0, follower, (3, 5))
    assert gauges(world.cluster) == {
        "partitions": 4, "under_replicated_partitions": 2, "under_min_isr_partitions": 0,
        "at_min_isr_partitions": 4, "replication_max_lag_offsets": 0,
        "partitions_by_isr_size": {1: 3, 2: 1}}
    samples = scrape(world.cluster)["samples"]
    assert samples[("kafkalog_coordinator_partitions_by_isr_size", (("size", "1"),))] == 3
    assert samples[("kafkalog_coordinator_partitions_by_isr_size", (("size", "2"),))] == 1
    assert samples[("kafkalog_coordinator_at_min_isr_partitions", ())] == 4
    assert samples[("kafkalog_coordinator_replication_max_lag_offsets", ())] == 0
    # a follower dropped from the ISR counts again, and so does a raised min.insync.replicas
    world.alter_isr("m", 0, [world.replicas("m")[0]])
    world.admin.alter_configs("r", {"min.insync.replicas": "2"})
    g = gauges(world.cluster)
    assert (g["under_replicated_partitions"], g["under_min_isr_partitions"],
            g["at_min_isr_partitions"], g["partitions_by_isr_size"]) == (3, 3, 1, {1: 4})
