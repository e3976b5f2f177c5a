"""Segment merges (docs/protocol.md §4.1): runs of small committed segments become one, byte for
byte, published by a gated metadata action; readers that listed the old files finish on them;
the covered files go after file.delete.delay.ms; the policy keeps write amplification and the
segments left bounded."""
from __future__ import annotations

import os
import random
import threading

import pytest
from hypothesis import given, settings, strategies as st

from support.cli_support import run_main
from pyspark_kafkalog.admin import Admin
from pyspark_kafkalog.cluster import actions as A
from pyspark_kafkalog.cluster.features import SEGMENT_MERGE
from pyspark_kafkalog.client.producer import Producer
from pyspark_kafkalog.maintenance.retention import merge_segments
from pyspark_kafkalog.errors import InvalidConfigError, InvalidRequestError
from pyspark_kafkalog.format.encode import (encode_batch_v2, encode_control_batch,
                                            encode_records)
from pyspark_kafkalog.format.index_builder import IndexBuilder
from pyspark_kafkalog.format import index as idx
from pyspark_kafkalog.format.batch import iter_headers
from pyspark_kafkalog.format.records import CONTROL_ABORT, CONTROL_COMMIT, Record
from pyspark_kafkalog.log import segment_merge as SM


def _logs(d):
    return sorted(n for n in os.listdir(d) if n.endswith(".log"))


def _records(admin, topic, p=None):
    return [(r.partition, r.offset, r.key, r.value) for r in admin.consume(topic, p)]


def _produce_singles(admin, topic, n, partitions=1, start=0):
    for i in range(start, start + n):
        admin.produce(topic, [Record(b"k%d" % (i % 7), b"v%d" % i, 1_700_000_000_000 + i)],
                      partition=i % partitions)


@pytest.fixture
def admin(tmp_path):
    a = Admin(str(tmp_path / "c"))
    a.create_topic("t", 2)
    return a


# -- the policy ------------------------------------------------------------------------------

@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 5000), max_size=60), st.integers(100, 20_000),
       st.integers(1, 8))
def test_runs_are_disjoint_adjacent_bounded_and_balanced(sizes, cap, ratio):
    runs = SM.plan_runs(sizes, cap, ratio)
    last = 0
    for i, j in runs:
        assert last <= i < j <= len(sizes) and j - i >= 2
        total, biggest = sum(sizes[i:j]), max(sizes[i:j])
        assert total <= cap and biggest <= ratio * (total - biggest)
        last = j


def _simulate(commits, every, segment_bytes=1 << 30, record=80):
    segs, written = [], 0
    def one_pass():
        nonlocal written
        runs = SM.plan_runs(segs[:-1], segment_bytes)   # the head is never merged
        for i, j in reversed(runs):
            merged = sum(segs[i:j])
            written += merged
            segs[i:j] = [merged]
        return runs
    for c in range(commits):
        segs.append(record)
        if c % every == 0:
            one_pass()
    while one_pass():
        pass
    return len(segs), written / (commits * record)


def test_the_policy_bounds_write_amplification_and_what_it_leaves():
    # a pass after every commit is the worst case; a pass a minute is the coordinator's
    for every in (1, 60, 1000):
        left, amplification = _simulate(25_000, every)
        assert left <= 1 + 8, (every, left)
        assert amplification <= 13, (every, amplification)
    left, _ = _simulate(200_000, 100, segment_bytes=1 << 20)
    assert left <= 16 + 8 + 1   # ceil(bytes / segment.bytes) + 8, and the head


# -- a merge end to end ----------------------------------------------------------------------

def test_a_merge_is_the_runs_bytes_back_to_back_with_kafkas_indexes(admin, tmp_path):
    admin.alter_configs("t", {"index.interval.bytes": "200"})
    _produce_singles(admin, "t", 120, partitions=2)
    before = _records(admin, "t")
    d = tmp_path / "c" / "logdir-0" / "t-0"
    originals = {n: (d / n).read_bytes() for n in _logs(d)}
    head = max(originals)
    admin.cleanup()   # the default lag: nothing is a minute old yet
    assert set(_logs(d)) == set(originals)
    merged = merge_segments(admin.cluster, lag_ms=0, delay_ms=0)
    assert {(m.topic, m.partition) for m in merged} == {("t", 0), ("t", 1)}
    assert _logs(d) == ["00000000000000000000.log", head]
    data = (d / "00000000000000000000.log").read_bytes()
    assert data == b"".join(originals[n] for n in sorted(originals) if n != head)
    builder = IndexBuilder(0, 200)
    for h in iter_headers(data):
        builder.add(h.size, h.last_offset, h.max_timestamp)
    assert (d / "00000000000000000000.index").read_bytes() == idx.encode_offset_index(
        builder.offset_entries, 0)
    assert (d / "00000000000000000000.timeindex").read_bytes() == idx.encode_time_index(
        builder.final_time_entries(), 0)
    assert _records(admin, "t") == before
    rc, out, err = run_main("dump", "--index-sanity-check", "--files",
                            ",".join(str(d / n) for n in ("00000000000000000000.log",
                                                          "00000000000000000000.index",
                                                          "00000000000000000000.timeindex")))
    assert rc == 0, err
    # the log start offset, high watermark and epochs are what they were
    desc = admin.describe_topic("t").partitions[0]
    assert (desc.log_start_offset, desc.high_watermark) == (0, 60)


def test_the_first_merge_enables_its_feature_and_the_action_is_checked(admin):
    assert not admin.features()[SEGMENT_MERGE]["enabled"]
    _produce_singles(admin, "t", 10)
    tid = admin.describe_topic("t").topic_id
    run = A.MergeSegments(topic="t", topic_id=tid, partition=0, after=-1, runs=[[0, 3, 3, 10]],
                          log_dirs=["logdir-0"])
    assert admin.cluster.submit([run])[2][0].error == "INVALID_REQUEST"   # no feature yet
    merge_segments(admin.cluster, lag_ms=0, delay_ms=0)
    assert admin.features()[SEGMENT_MERGE]["enabled"]
    state = admin.cluster.state()
    last = state.segment_merges["t:0"]
    # planned on an older merge: refused, so two mergers of a partition never both publish
    assert admin.cluster.submit([run])[2][0].error == "INVALID_UPDATE_VERSION"
    for runs, error in [([[0, 3, 1, 10]], "INVALID_REQUEST"),        # one segment is no run
                        ([[0, 99, 3, 10]], "OFFSET_OUT_OF_RANGE"),   # past the high watermark
                        ([[3, 2, 2, 10]], "INVALID_REQUEST")]:
        bad = A.MergeSegments(topic="t", topic_id=tid, partition=0, after=last, runs=runs,
                              log_dirs=["logdir-0"])
        assert admin.cluster.submit([bad])[2][0].error == error
    other = A.MergeSegments(topic="t", topic_id="x" * 22, partition=0, after=last,
                            runs=[[0, 3, 3, 10]], log_dirs=["logdir-0"])
    assert admin.cluster.submit([other])[2][0].error == "UNKNOWN_TOPIC_OR_PARTITION"


def test_segment_merge_lag_ms_is_a_gated_topic_config(tmp_path):
    admin = Admin(str(tmp_path / "c"))
    admin.create_topic("t", 1, configs={"segment.merge.lag.ms": "0"})
    assert admin.features()[SEGMENT_MERGE]["enabled"]
    with pytest.raises(InvalidConfigError):
        admin.alter_configs("t", {"segment.merge.lag.ms": "-1"})
    _produce_singles(admin, "t", 6)
    removed = admin.cleanup()   # the topic's own lag of 0: merged at once
    assert removed["merged"] == ["logdir-0/t-0/00000000000000000000"]
    assert len(_logs(tmp_path / "c" / "logdir-0" / "t-0")) == 6   # covered, for a minute
    # an entry that sets it before the feature is on is refused on replay
    raw = Admin(str(tmp_path / "d"))
    raw.create_topic("u", 1)
    result = raw.cluster.submit([A.AlterConfigs(topic="u", set={"segment.merge.lag.ms": "0"})])
    assert result[2][0].error == "INVALID_REQUEST"
    with pytest.raises(InvalidRequestError):
        raw.cluster.submit_one(A.AlterConfigs(topic="u", set={"segment.merge.lag.ms": "0"}))


def test_runs_never_cross_an_aborted_range_or_the_log_start_offset(admin, tmp_path):
    _produce_singles(admin, "t", 8)
    prod = Producer(admin.cluster)
    pending = prod.write({("t", 0): prod.encode("t", [Record(b"a", b"aborted", 1)])})
    prod.abort([pending])
    _produce_singles(admin, "t", 8, start=100)
    admin.delete_records_before({("t", 0): 2})
    merge_segments(admin.cluster, lag_ms=0, delay_ms=0)
    state = admin.cluster.state()
    aborted = pending.ranges["t:0"][0]
    d = tmp_path / "c" / "logdir-0" / "t-0"
    from pyspark_kafkalog.log.segment import LogSegment
    from pyspark_kafkalog.storage import open_storage
    st = open_storage(str(d.parent))
    for n in _logs(d):
        base = int(n[:20])
        end = LogSegment(st, "t-0", base).next_offset()
        assert not (base < aborted < end), (n, end)           # no run spans the gap
    assert state.partition("t", 0).log_start_offset == 2
    assert [v for _, _, _, v in _records(admin, "t", 0)] == (
        [b"v%d" % i for i in range(2, 8)] + [b"v%d" % i for i in range(100, 108)])


def test_transactions_markers_and_old_formats_survive_a_merge_byte_for_byte(tmp_path,
                                                                          kafka_check):
    admin = Admin(str(tmp_path / "c"))
    admin.create_topic("x", 1, configs={"index.interval.bytes": "300"})
    prod = Producer(admin.cluster)
    rng = random.Random(7)
    want, pid = [], 500
    for call in range(40):
        recs = [Record(b"k%d" % rng.randrange(9), rng.randbytes(rng.randrange(1, 200)),
                       1_700_000_000_000 + call) for _ in range(1 + rng.randrange(4))]
        if call % 5 == 2:   # a Kafka transaction and its marker in one write
            batches = [encode_batch_v2(recs, producer_id=pid, producer_epoch=1,
                                       base_sequence=0, transactional=True),
                       encode_control_batch(CONTROL_ABORT if call % 10 == 2 else CONTROL_COMMIT,
                                            producer_id=pid, producer_epoch=1,
                                            timestamp=1_700_000_000_000 + call)]
            pid += 1
        else:
            batches = [encode_records(recs, magic=(2, 1, 0)[call % 3], compression=call % 4)]
        prod.send({("x", 0): batches})
        want += [b.data if isinstance(b.data, bytes) else bytes(b.data) for b in batches]
    d = tmp_path / "c" / "logdir-0" / "x-0"
    before = b"".join((d / n).read_bytes() for n in _logs(d))
    merge_segments(admin.cluster, lag_ms=0, delay_ms=0)
    assert len(_logs(d)) == 2
    after = b"".join((d / n).read_bytes() for n in _logs(d))
    assert after == before            # the same batches, offsets, CRCs, epochs, markers
    found = kafka_check(tmp_path / "c" / "logdir-0", "x-0")
    assert found.errors() == [] and found.problems() == []
    offsets = [b["lastOffset"] for b in found.batches("x-0")]
    assert offsets == sorted(offsets) and found.segments("x-0")[0]["batches"] > 30


def test_a_reader_that_listed_before_a_merge_finishes_on_the_old_files(admin, tmp_path):
    _produce_singles(admin, "t", 40)
    expected = _records(admin, "t", 0)
    view = admin.cluster.partition_view("t", 0)          # listed now: 40 segments
    consumer_log = view.log
    first, _ = consumer_log.read(0, 1 << 20)
    merge_segments(admin.cluster, lag_ms=0, delay_ms=0)  # merged, covered deleted at once
    assert len(_logs(tmp_path / "c" / "logdir-0" / "t-0")) == 2
    got, offset = [], 0
    from pyspark_kafkalog.format.columnar import decode_records
    while offset < view.high_watermark:
        data, _ = consumer_log.read(offset, 64)   # small reads: one missing file after another
        recs = [r for r in decode_records(data) if r.offset >= offset]
        got += [(0, r.offset, r.key, r.value) for r in recs]
        offset = recs[-1].offset + 1
    assert got == expected


def test_a_spark_range_planned_before_a_merge_reads_every_record_once(admin):
    from pyspark_kafkalog.connector.range_reader import read_range
    from pyspark_kafkalog.connector.read_plan import plan
    from pyspark_kafkalog.connector.sources import open_source
    from pyspark_kafkalog.spark.read_options import ReadOptions
    _produce_singles(admin, "t", 60, partitions=2)
    url = admin.cluster.url
    opts = ReadOptions.parse({"path": url, "subscribe": "t"})
    tasks = plan(open_source(url), opts)   # the driver's listing, handed to the tasks
    merge_segments(admin.cluster, lag_ms=0, delay_ms=0)
    rows = []
    for task in tasks:
        for batch in read_range(task, include_headers=False):
            rows += list(zip(batch.column("partition").to_pylist(),
                             batch.column("offset").to_pylist()))
    assert sorted(rows) == sorted((p, o) for p in (0, 1) for o in range(30))


def test_covered_segments_wait_for_file_delete_delay_ms(admin, tmp_path):
    _produce_singles(admin, "t", 12)
    d = tmp_path / "c" / "logdir-0" / "t-0"
    merge_segments(admin.cluster, lag_ms=0, delay_ms=60_000)
    assert len(_logs(d)) == 12                      # merged, the covered still there
    assert [v for *_, v in _records(admin, "t", 0)] == [b"v%d" % i for i in range(12)]
    again = merge_segments(admin.cluster, lag_ms=0, delay_ms=60_000)
    assert all(not m.deleted and not m.merged for m in again)   # nothing to do for a minute
    assert len(_logs(d)) == 12
    done = merge_segments(admin.cluster, lag_ms=0, delay_ms=0)
    assert len(done[0].deleted) == 10 and len(_logs(d)) == 2
    assert [v for *_, v in _records(admin, "t", 0)] == [b"v%d" % i for i in range(12)]


def test_a_vetoed_publish_changes_nothing_and_leaves_no_marker(admin, tmp_path):
    _produce_singles(admin, "t", 30)
    d = tmp_path / "c" / "logdir-0" / "t-0"
    before = {n: (d / n).read_bytes() for n in os.listdir(d)}
    state = admin.cluster.state()
    storage, rel = admin.cluster.storage, admin.cluster.partition_dir("t", 0, state=state)
    sources = [(int(f.name[:20]), f.size) for f in storage.list(rel) if f.name.endswith(".log")]
    merged = SM.build(storage, rel, sources[:-1], state.topic_config("t"))

    def veto():
        raise RuntimeError("too late")
    with pytest.raises(RuntimeError):
        SM.publish(storage, rel, merged, veto)
    assert {n: (d / n).read_bytes() for n in os.listdir(d)} == before


def test_a_merger_killed_between_its_log_and_its_indexes_is_mended(admin, tmp_path):
    """The state a SIGKILL between the replaces leaves: the marker, the merged .log, the old
    indexes (a valid index of its prefix). Readers and Kafka's sanity check are fine with it;
    a pass once the marker is old makes the indexes Kafka's again."""
    admin.alter_configs("t", {"index.interval.bytes": "100"})
    _produce_singles(admin, "t", 30)
    expected = _records(admin, "t", 0)
    state = admin.cluster.state()
    storage, rel = admin.cluster.storage, admin.cluster.partition_dir("t", 0, state=state)
    sources = [(int(f.name[:20]), f.size) for f in storage.list(rel) if f.name.endswith(".log")]
    merged = SM.build(storage, rel, sources[:-1], state.topic_config("t"))
    d = tmp_path / "c" / rel
    (d / SM.marker_name(0)).write_bytes(b"")
    (d / "00000000000000000000.log").write_bytes(b"".join(bytes(p) for p in merged.pieces))
    assert _records(admin, "t", 0) == expected
    rc, _, err = run_main("dump", "--index-sanity-check", "--files",
                          f"{d}/00000000000000000000.index,{d}/00000000000000000000.log")
    assert rc == 0, err
    young = merge_segments(admin.cluster, lag_ms=10**12, delay_ms=0)   # a live merger's?
    assert (d / SM.marker_name(0)).exists() and not any(m.rebuilt for m in young)
    old = 2e9
    os.utime(d / SM.marker_name(0), (old - 3600, old - 3600))
    import pyspark_kafkalog.maintenance.segment_merges as M
    passes = [M.merge_partition(admin.cluster, admin.cluster.state(), "t", 0, now_s=old,
                                lag_ms=10**12, delay_ms=0)]
    assert passes[0].rebuilt == [f"{rel}/{0:020d}"]
    assert not (d / SM.marker_name(0)).exists()
    assert (d / "00000000000000000000.index").read_bytes() == merged.index
    assert (d / "00000000000000000000.timeindex").read_bytes() == merged.timeindex
    assert _records(admin, "t", 0) == expected


def test_a_late_merger_does_not_publish_over_a_newer_merge(admin, monkeypatch):
    import pyspark_kafkalog.maintenance.segment_merges as M
    _produce_singles(admin, "t", 20)
    expected = _records(admin, "t", 0)
    clock = [1000.0]
    monkeypatch.setattr(M.time, "monotonic", lambda: clock[0])
    real_submit = admin.cluster.submit

    def slow_submit(actions):
        out = real_submit(actions)
        clock[0] += M.MIN_PUBLISH_WINDOW_S + 1   # paused between its entry and its publish
        return out
    monkeypatch.setattr(admin.cluster, "submit", slow_submit)
    merged = merge_segments(admin.cluster, lag_ms=0, delay_ms=0)
    assert "older than" in merged[0].skipped
    assert _records(admin, "t", 0) == expected


def test_readers_and_merges_running_together_see_every_record_once(tmp_path):
    admin = Admin(str(tmp_path / "c"))
    admin.create_topic("t", 1)
    stop = threading.Event()
    errors = []

    def merger():
        m = Admin(str(tmp_path / "c"))
        while not stop.is_set():
            try:
                merge_segments(m.cluster, lag_ms=0, delay_ms=0)
            except Exception as exc:   # noqa: BLE001 - reported below
                errors.append(exc)
                return
    threads = [threading.Thread(target=merger)]
    for t in threads:
        t.start()
    try:
        reader = Admin(str(tmp_path / "c"))
        for round_ in range(15):
            _produce_singles(admin, "t", 10, start=round_ * 10)
            got = [r.value for r in reader.consume("t", 0)]
            assert got == [b"v%d" % i for i in range((round_ + 1) * 10)]
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert errors == []


def test_with_no_delay_the_covered_go_in_the_same_pass_however_long_it_takes(admin, tmp_path):
    import time as _time
    import pyspark_kafkalog.maintenance.segment_merges as M
    _produce_singles(admin, "t", 20)
    d = tmp_path / "c" / "logdir-0" / "t-0"
    long_ago = _time.time() - 100
    for f in d.iterdir():
        os.utime(f, (long_ago, long_ago))
    # the pass read the storage's clock long before it reached this partition: its merged
    # file is newer than that clock
    done = M.merge_partition(admin.cluster, admin.cluster.state(), "t", 0,
                             now_s=_time.time() - 30, lag_ms=0, delay_ms=0)
    assert done.merged == [[0, 19, 19, done.merged[0][3]]] and len(done.deleted) == 18
    assert len(_logs(tmp_path / "c" / "logdir-0" / "t-0")) == 2
