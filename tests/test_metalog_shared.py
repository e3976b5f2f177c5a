"""Issue #18: write tasks in one reused Python worker start from the metadata state the process
replayed before (``Cluster(shared_state=True)``, ``metalog._SHARED``) instead of replaying every
entry since the newest snapshot. Only a cache: it must never change what a replay computes."""
from __future__ import annotations

import shutil

import pytest

from pyspark_kafkalog.cluster import metalog
from pyspark_kafkalog.cluster.cluster import Cluster
from pyspark_kafkalog.cluster.producer import Producer
from pyspark_kafkalog.cluster.state import ClusterState
from pyspark_kafkalog.format.records import Record


@pytest.fixture
def applied(monkeypatch):
    """The entries replayed from storage (by number), in this process."""
    seen = []
    original = metalog.MetadataLog._apply_entry

    def counting(self, state, seq):
        seen.append(seq)
        return original(self, state, seq)
    monkeypatch.setattr(metalog.MetadataLog, "_apply_entry", counting)
    monkeypatch.setattr(metalog, "_SHARED", {})
    return seen


def produce(url, n=3):
    cluster = Cluster(url, create=False)
    for i in range(n):
        Producer(cluster).produce("t", [Record(b"k", f"v{i}".encode(), 0)], partition=i % 2)


def test_a_second_open_replays_only_the_entries_written_since(tmp_path, applied):
    url = str(tmp_path / "c")
    Cluster(url).create_topic("t", 2)
    produce(url)
    first = Cluster(url, create=False, shared_state=True).state()
    # everything once, after the snapshot every new cluster has (entry 0's)
    assert applied == list(range(1, first.seq + 1))
    applied.clear()
    assert Cluster(url, create=False, shared_state=True).state().seq == first.seq
    assert applied == []
    produce(url, 1)   # another writer (not sharing) appends two entries: reserve, commit
    applied.clear()
    again = Cluster(url, create=False, shared_state=True).state()
    assert applied == [first.seq + 1, first.seq + 2] and again.seq == first.seq + 2
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


def test_results_of_a_shared_start_are_a_clean_state(tmp_path, applied):
    url = str(tmp_path / "c")
    Cluster(url).create_topic("t", 2)
    produce(url)
    shared = Cluster(url, create=False, shared_state=True).state()
    assert isinstance(shared, ClusterState)
    assert Cluster(url, create=False, shared_state=True).state() is shared
