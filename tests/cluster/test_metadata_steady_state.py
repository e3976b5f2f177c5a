"""The metadata log under sustained load (docs/protocol.md §2): a warm process follows the log by
number and never lists it, so a commit costs the same after thousands of entries as after ten;
cleanup keeps the log to what its newest verified snapshot and `metadata.max.retention.ms`
need."""
from __future__ import annotations

import json
import os
import time
from collections import Counter

import pytest

from pyspark_kafkalog.admin import Admin
from pyspark_kafkalog.cluster import metalog as M
from pyspark_kafkalog.cluster.cluster import Cluster
from pyspark_kafkalog.cluster.config import cluster_options
from pyspark_kafkalog.cluster.metalog import LOG_DIR, MetadataLog
from pyspark_kafkalog.errors import InvalidConfigError
from pyspark_kafkalog.format.records import Record

from support.cli_support import run_main
from support.moto_support import BUCKET, moto_options  # noqa: F401  (a session fixture: a moto server)


pytestmark = pytest.mark.slow   # sustained metadata load, on S3 too (~9 s)


class CountingStorage:
    """Counts every storage call by name and by the directory it names (a real storage behind)."""

    def __init__(self, inner):
        self._inner = inner
        self.calls = Counter()
        self.calls_ever = Counter()   # never cleared: the cold open listed

    def __getattr__(self, name):
        attr = getattr(self._inner, name)
        if not callable(attr):
            return attr

        def counted(*args, **kwargs):
            where = args[0] if args and isinstance(args[0], str) else ""
            listing = name in ("list", "list_names")
            key = (name, where if listing else where.rsplit("/", 1)[0])
            self.calls[key] += 1
            self.calls_ever[key] += 1
            return attr(*args, **kwargs)
        return counted


def _produce(admin, n, start=0):
    for i in range(start, start + n):
        admin.produce("t", [Record(b"k", b"v%d" % i, 1000 + i)], partition=i % 4)


def _calls_per_produce(admin, counting, n=5):
    counting.calls.clear()
    _produce(admin, n, 10_000)
    return {k: v / n for k, v in counting.calls.items()}


def test_a_warm_producer_never_lists_the_metadata_log_and_its_cost_does_not_grow(tmp_path):
    Cluster(str(tmp_path / "c"))
    cluster = Cluster(str(tmp_path / "c"), create=False)
    counting = CountingStorage(cluster.metalog.storage)
    cluster.metalog.storage = counting   # before its first replay: the cold open lists
    admin = Admin(cluster)
    admin.create_topic("t", 4)
    _produce(admin, 3)
    early = _calls_per_produce(admin, counting)
    _produce(admin, 400)   # 800 more entries, 16 snapshots
    assert len(os.listdir(tmp_path / "c" / "_kafkalog" / "log")) > 800
    late = _calls_per_produce(admin, counting)
    assert not any(name in ("list", "list_names") and where == LOG_DIR
                   for name, where in late), late
    assert any(name == "list_names" and where == LOG_DIR for name, where in counting.calls_ever)
    # the same requests, whatever the log's length: reads by number, creates, nothing listed
    assert late == early
    # every record is there, in order
    got = [(r.partition, r.offset, r.value) for r in admin.consume("t")]
    assert len(got) == 3 + 400 + 10
    for p in range(4):
        offsets = [o for q, o, _ in got if q == p]
        assert offsets == list(range(len(offsets)))


def test_another_process_entries_are_seen_by_number(tmp_path):
    url = str(tmp_path / "c")
    a, b = Admin(url), Admin(url)
    a.create_topic("t", 4)
    b.list_topics()                      # b is warm now
    _produce(a, 7)                       # entries b has not seen
    assert sum(1 for _ in b.consume("t")) == 7
    b.create_topic("u", 1)               # b appends after a's entries: no lost race left over
    assert a.list_topics() == ["t", "u"]


def test_a_process_that_has_not_listed_for_its_window_lists_again(tmp_path, monkeypatch):
    cluster = Cluster(str(tmp_path / "c"), metadata_max_retention_ms=60_000)
    admin = Admin(cluster)
    admin.create_topic("t", 4)
    log = cluster.metalog
    assert log.follow_window_s == 10.0   # a sixth of the retention
    assert MetadataLog(cluster.storage).follow_window_s == M.MAX_FOLLOW_WITHOUT_LISTING_S
    listed = []
    real = log._listing
    monkeypatch.setattr(log, "_listing", lambda: listed.append(1) or real())
    _produce(admin, 2)
    assert listed == []
    now = time.monotonic()
    monkeypatch.setattr(M.time, "monotonic", lambda: now + 11)
    _produce(admin, 1)
    assert listed == [1]


def _fill(tmp_path, produces, interval=10, **kw):
    cluster = Cluster(str(tmp_path / "c"), snapshot_interval=interval, **kw)
    admin = Admin(cluster)
    admin.create_topic("t", 4)
    _produce(admin, produces)
    return admin


def _on_storage(tmp_path):
    names = os.listdir(tmp_path / "c" / "_kafkalog" / "log")
    entries = sorted(int(n[:20]) for n in names if n.endswith(".json") and "snapshot" not in n)
    snaps = sorted(int(n[:20]) for n in names if n.endswith(".snapshot.json"))
    return entries, snaps


def test_cleanup_keeps_the_newest_verified_snapshot_and_what_follows(tmp_path):
    admin = _fill(tmp_path, 60, metadata_max_retention_ms=0)
    before = admin.cluster.state().to_snapshot()
    entries, snaps = _on_storage(tmp_path)
    newest = snaps[-1]
    removed = admin.cluster.metalog.cleanup()
    assert removed
    entries, snaps = _on_storage(tmp_path)
    assert snaps == [newest] and entries[0] == newest
    assert len(entries) <= 10 + 1            # the snapshot interval plus its own entry
    parts = os.listdir(tmp_path / "c" / "_kafkalog" / "log" / "parts")
    manifest = json.loads((tmp_path / "c" / "_kafkalog" / "log"
                           / f"{newest:020d}.snapshot.json").read_text())
    assert sorted(p[:-5] for p in parts) == sorted(set(manifest["parts"].values()))
    # a cold open and the warm process agree with the state before cleanup
    assert MetadataLog(admin.cluster.storage).state().to_snapshot() == before
    _produce(admin, 3)
    assert sum(1 for _ in Admin(str(tmp_path / "c")).consume("t")) == 63


def test_cleanup_skips_a_newest_snapshot_that_does_not_prove_itself(tmp_path):
    admin = _fill(tmp_path, 30, metadata_max_retention_ms=0)
    entries, snaps = _on_storage(tmp_path)
    bad = tmp_path / "c" / "_kafkalog" / "log" / f"{snaps[-1]:020d}.snapshot.json"
    bad.write_bytes(bad.read_bytes().replace(b'"version":3', b'"version":3,"x":1'))
    admin.cluster.metalog.cleanup()
    entries_after, snaps_after = _on_storage(tmp_path)
    assert snaps_after[0] == snaps[-2] and entries_after[0] == snaps[-2]
    assert MetadataLog(admin.cluster.storage).state().seq == entries[-1]


def test_cleanup_keeps_entries_younger_than_the_grace(tmp_path):
    admin = _fill(tmp_path, 30)   # default: an hour
    before = _on_storage(tmp_path)
    assert admin.cluster.metalog.cleanup() == []
    assert _on_storage(tmp_path) == before


def test_the_cleanup_command_cleans_the_metadata_log(tmp_path):
    _fill(tmp_path, 30)
    conf = tmp_path / "cluster.properties"
    conf.write_text("metadata.max.retention.ms=0\n")
    rc, out, err = run_main("--cluster", tmp_path / "c", "--cluster-config", conf, "cleanup",
                            "--json")
    assert rc == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    assert any(r["kind"] == "metadata" for r in rows)
    entries, snaps = _on_storage(tmp_path)
    assert len(snaps) == 1 and len(entries) <= 11


def test_metadata_max_retention_ms_is_a_client_setting():
    assert cluster_options({"metadata.max.retention.ms": "0"}) == {"metadata_max_retention_ms": 0}
    with pytest.raises(InvalidConfigError, match="metadata.max.retention.ms must be >= 0"):
        cluster_options({"metadata.max.retention.ms": "-1"})
    with pytest.raises(InvalidConfigError, match="must be an integer"):
        cluster_options({"metadata.max.retention.ms": "1h"})


def _s3_requests_per_produce(admin, n=6):
    """The HTTP requests each of ``n`` warm single-record produces sends, as the S3 client
    sends them (botocore's own event, so every retry and 404 counts)."""
    import uuid as _uuid
    fs = admin.cluster.storage.base._fs
    sent = []
    handler = lambda request, **kw: sent.append((request.method, request.url))  # noqa: E731
    fs.s3.meta.events.register("before-send", handler, unique_id=_uuid.uuid4().hex)
    counts = []
    try:
        for i in range(n):
            before = len(sent)
            admin.produce("t", [Record(b"k", b"v", 1)], partition=i % 4)
            counts.append(len(sent) - before)
    finally:
        fs.s3.meta.events.unregister("before-send", handler)
    return counts, sent


@pytest.mark.slow
def test_a_warm_produce_on_s3_costs_six_requests_fresh_and_after_many_commits(moto_options):
    import uuid as _uuid
    admin = Admin(f"s3://{BUCKET}/steady-{_uuid.uuid4().hex}", **moto_options)
    admin.create_topic("t", 4)
    admin.produce("t", [Record(b"k", b"v", 1)], partition=0)    # warm: connected, listed
    fresh, sent = _s3_requests_per_produce(admin)
    _produce(admin, 300)                                         # 600 more entries
    late, sent_late = _s3_requests_per_produce(admin)
    # the produce that follows a snapshot writes it too (every kafkalog.snapshot.interval
    # entries): the others are reserve, three segment files, commit and one read of the head
    assert sorted(fresh)[len(fresh) // 2] <= 6 and sorted(late)[len(late) // 2] <= 6, \
        (fresh, late)
    assert max(fresh + late) <= 6 + 3, (fresh, late, sent_late)
    assert not [u for m, u in sent + sent_late if "list-type" in u or "prefix=" in u]


def test_a_follower_behind_a_cleanup_with_a_shorter_retention_lists_again(tmp_path, monkeypatch):
    """A cleaner whose metadata.max.retention.ms is 0 deletes the entries a warm follower
    (retention 1 h: it follows by number for 10 minutes) has not read yet. Its newest entry is
    gone with them (ascending deletion): the next poll that finds nothing sees that and lists."""
    monkeypatch.setattr(M, "CONFIRM_INTERVAL_S", 0.0)
    url = str(tmp_path / "c")
    writer = Admin(Cluster(url, snapshot_interval=10))
    writer.create_topic("t", 4)
    follower = Admin(url)
    assert follower.list_topics() == ["t"]            # warm, at the writer's head
    _produce(writer, 40)
    assert Cluster(url, metadata_max_retention_ms=0).metalog.cleanup()
    _, snaps = _on_storage(tmp_path)
    assert snaps and follower.cluster.metalog._state.seq < snaps[-1]   # cleaned past it
    assert sum(1 for _ in follower.consume("t")) == 40
    follower.create_topic("u", 1)                     # and it appends at the real head
    assert writer.list_topics() == ["t", "u"]
