"""Issue #18: write tasks in one reused Python worker start from the metadata state the process
replayed before (``Cluster(shared_state=True)``, ``metalog._SHARED``) instead of replaying every
entry since the newest snapshot. Only a cache: it must never change what a replay computes."""
from __future__ import annotations

import shutil

import pytest

from pyspark_kafkalog.cluster import metalog
from pyspark_kafkalog.cluster.cluster import Cluster
from pyspark_kafkalog.client.producer import Producer
from pyspark_kafkalog.cluster.state import ClusterState
from pyspark_kafkalog.format.records import Record


@pytest.fixture
def applied(monkeypatch):
    """The entries replayed (by number) in this process, a writer's own appends included,
    whether found by a listing or read by number; ``applied.listings`` counts the listings."""
    seen = Seen()
    original = ClusterState.apply
    listing = metalog.MetadataLog._listing

    def counting(self, seq, entry):
        seen.append(seq)
        return original(self, seq, entry)

    def listed(self):
        seen.listings += 1
        return listing(self)
    monkeypatch.setattr(ClusterState, "apply", counting)
    monkeypatch.setattr(metalog.MetadataLog, "_listing", listed)
    monkeypatch.setattr(metalog, "_SHARED", {})
    return seen


class Seen(list):
    listings = 0


def produce(url, n=3):
    cluster = Cluster(url, create=False)
    for i in range(n):
        Producer(cluster).produce("t", [Record(b"k", f"v{i}".encode(), 0)], partition=i % 2)


def test_a_second_open_replays_only_the_entries_written_since(tmp_path, applied):
    url = str(tmp_path / "c")
    Cluster(url).create_topic("t", 2)
    produce(url)
    applied.clear()
    first = Cluster(url, create=False, shared_state=True).state()
    # everything once, after the snapshot every new cluster has (entry 0's)
    assert applied == list(range(1, first.seq + 1))
    applied.clear()
    assert Cluster(url, create=False, shared_state=True).state().seq == first.seq
    assert applied == []
    produce(url, 1)   # another writer (not sharing) appends two entries: reserve, commit
    applied.clear()
    listings = applied.listings
    again = Cluster(url, create=False, shared_state=True).state()
    assert applied == [first.seq + 1, first.seq + 2] and again.seq == first.seq + 2
    # read by number from the shared state: the process listed the log moments ago
    assert applied.listings == listings
    # and the state is the one a fresh replay computes
    applied.clear()
    fresh = Cluster(url, create=False).state()
    assert fresh.to_snapshot() == again.to_snapshot()
    assert applied == list(range(1, again.seq + 1))
    # a cluster that does not opt in neither reads nor feeds the shared state
    assert metalog._SHARED[(url, Cluster(url, create=False).cluster_id)][1] is again


def test_the_shared_state_is_never_changed_by_those_that_start_from_it(tmp_path, applied):
    url = str(tmp_path / "c")
    Cluster(url).create_topic("t", 2)
    a = Cluster(url, create=False, shared_state=True)
    before = a.state()
    snap = before.to_snapshot()
    b = Cluster(url, create=False, shared_state=True)
    Producer(b).produce("t", [Record(b"k", b"v", 0)], partition=0)
    assert before.to_snapshot() == snap            # a's state is as it was
    assert b.state().partition("t", 0).high_watermark == 1
    assert before.partition("t", 0).high_watermark == 0


def test_a_cluster_made_again_at_the_same_url_is_replayed_from_scratch(tmp_path, applied):
    url = str(tmp_path / "c")
    Cluster(url).create_topic("old", 1)
    produce_url = Cluster(url, create=False, shared_state=True)
    old = produce_url.state()
    shutil.rmtree(url)
    c = Cluster(url)
    c.create_topic("new", 3)
    c.create_topic("other", 1)
    for _ in range(old.seq + 2 - c.state().seq):
        c.create_topic(f"pad{_}", 1)   # the new log reaches past the old state's seq
    applied.clear()
    state = Cluster(url, create=False, shared_state=True).state()
    assert "old" not in state.topics and "new" in state.topics
    # replayed from entry 0's snapshot: the old state was not used
    assert applied == list(range(1, state.seq + 1))


def test_a_rewritten_entry_is_not_trusted(tmp_path, applied):
    """The shared state is used only while its entry holds the bytes it was replayed from."""
    url = str(tmp_path / "c")
    Cluster(url).create_topic("t", 2)
    produce(url)
    held = Cluster(url, create=False, shared_state=True).state()
    path = tmp_path / "c" / metalog.entry_name(held.seq)
    path.write_bytes(path.read_bytes().replace(b'"actions"', b'"actions" '))
    applied.clear()
    state = Cluster(url, create=False, shared_state=True).state()
    assert held.seq in applied and state.seq == held.seq   # replayed again, not taken


def test_an_open_with_nothing_new_returns_the_shared_state_itself(tmp_path, applied):
    url = str(tmp_path / "c")
    Cluster(url).create_topic("t", 2)
    produce(url)
    shared = Cluster(url, create=False, shared_state=True).state()
    assert isinstance(shared, ClusterState)
    assert Cluster(url, create=False, shared_state=True).state() is shared


def test_a_snapshot_follows_the_entry_that_leaves_too_much_to_replay(tmp_path, monkeypatch,
                                                                     applied):
    """Besides every 50th entry, a writer snapshots after an entry that leaves
    SNAPSHOT_REPLAY_CHANGES partition changes to replay (docs/protocol.md §2): a log of
    1,000-partition jobs stays cheap to open. Scaled down: 10 partitions, a limit of 45."""
    from pyspark_kafkalog.cluster.metalog import SNAPSHOT_REPLAY_CHANGES
    from pyspark_kafkalog.maintenance.metadata_check import verify
    assert SNAPSHOT_REPLAY_CHANGES == 20_000
    monkeypatch.setattr(metalog, "SNAPSHOT_REPLAY_CHANGES", 45)
    url = str(tmp_path / "c")
    cluster = Cluster(url)
    cluster.create_topic("t", 10)
    producer = Producer(cluster)
    for i in range(3):   # each send: a reserve and a commit of 10 partitions, 20 changes
        producer.send({("t", p): producer.encode("t", [Record(b"k", b"v", 0)])
                       for p in range(10)})
    snaps = sorted(p.name for p in (tmp_path / "c" / metalog.LOG_DIR).glob("*.snapshot.json"))
    seqs = [int(name.split(".")[0]) for name in snaps]
    newest = cluster.state().seq
    # entry 0's, then one where the changes since it passed 45, though 50 entries did not pass
    assert len(seqs) == 2 and seqs[0] == 0 and 0 < seqs[1] <= newest < 50
    applied.clear()
    fresh = Cluster(url, create=False).state()
    assert applied == list(range(seqs[1] + 1, newest + 1))   # opened from the new snapshot
    assert fresh.seq == newest
    assert fresh.partition("t", 3).high_watermark == 3
    report = verify(Cluster(url, create=False).metalog)
    assert report.snapshots == 2 and report.ok
