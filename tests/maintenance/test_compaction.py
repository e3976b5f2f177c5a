"""Log compaction under the cluster protocol (docs/protocol.md §4.2): a compacted partition is
cleaned by a gated ``clean_segments`` entry; what a reader gets afterwards is the latest record
of every key at its original offset (and every record of the head, never cleaned); the cleaner
checkpoint moves; the group's covered files go after file.delete.delay.ms; and a partition
that is not due is left alone."""
from __future__ import annotations

import json
import os
import time

import pytest

from pyspark_kafkalog.admin import Admin
from pyspark_kafkalog.cluster.features import LOG_COMPACTION
from pyspark_kafkalog.cluster.state import tp_key
from pyspark_kafkalog.format.records import Record
from pyspark_kafkalog.maintenance.compaction import CleanerSettings, clean_partition

T0 = 1_700_000_000_000


def _logs(root, topic="t", p=0):
    (d,) = [d for d in root.glob(f"logdir-*/{topic}-{p}")]
    return sorted(n for n in os.listdir(d) if n.endswith(".log"))


def _records(admin, topic="t"):
    return [(r.offset, r.key, r.value) for r in admin.consume(topic, 0)]


def _produce(admin, items, topic="t"):
    """One commit (one segment) per (key, value)."""
    for i, (k, v) in enumerate(items):
        admin.produce(topic, [Record(k, v, T0 + i)], partition=0)


def _latest(items, head_from):
    """The model: the latest (offset, key, value) of every key below ``head_from``, and
    everything from it on, in offset order."""
    latest = {}
    for off, (k, v) in enumerate(items):
        if off < head_from:
            latest[k] = (off, k, v)
    kept = sorted(latest.values()) + [(off, k, v) for off, (k, v) in enumerate(items)
                                      if off >= head_from]
    return kept


@pytest.fixture
def root(tmp_path):
    root = tmp_path / "c"
    Admin(str(root)).create_topic("t", 1, configs={"cleanup.policy": "compact",
                                                   "file.delete.delay.ms": "0"})
    return root


def test_a_clean_keeps_the_latest_record_of_every_key_at_its_offset(root):
    admin = Admin(str(root))
    items = [(b"k%d" % (i % 5), b"v%d" % i) for i in range(40)]
    _produce(admin, items)
    state = admin.cluster.state()
    out = clean_partition(admin.cluster, state, "t", 0, force=True, delay_ms=0)
    assert out.skipped is None and out.cleaned, out
    # the head (the newest segment, offset 39) is never cleaned
    assert _records(admin) == _latest(items, head_from=39)
    state = admin.cluster.state()
    assert LOG_COMPACTION in state.reader_features
    assert state.cleaner_checkpoints[tp_key("t", 0)] == out.cleaned_to == 39
    # one group of 39 segments became one file, the covered ones deleted (delay 0), plus head
    assert len(_logs(root)) == 2
    assert out.bytes_read > out.bytes_written > 0 and out.records_kept < out.records_read
    # the high watermark and log start offset do not move; offsets are those of the writes
    ps = state.partition("t", 0)
    assert (ps.log_start_offset, ps.high_watermark) == (0, 40)


def test_a_second_clean_after_more_writes_agrees_with_the_model(root):
    admin = Admin(str(root))
    items = [(b"k%d" % (i % 4), b"a%d" % i) for i in range(12)]
    _produce(admin, items)
    clean_partition(admin.cluster, admin.cluster.state(), "t", 0, force=True, delay_ms=0)
    more = [(b"k%d" % (i % 6), b"b%d" % i) for i in range(12)]
    _produce(admin, more)
    out = clean_partition(admin.cluster, admin.cluster.state(), "t", 0, force=True, delay_ms=0)
    assert out.cleaned and out.cleaned_to == 23
    assert _records(admin) == _latest(items + more, head_from=23)


def test_a_map_too_small_for_the_dirty_keys_cleans_in_passes(root):
    admin = Admin(str(root))
    items = [(b"key-%03d" % (i % 30), b"v%d" % i) for i in range(90)]
    _produce(admin, items)
    small = CleanerSettings(dedupe_buffer_size=24 * 11)   # about 10 keys per pass
    passes = 0
    while True:
        out = clean_partition(admin.cluster, admin.cluster.state(), "t", 0, force=True,
                              delay_ms=0, settings=small)
        if out.cleaned_to is None:
            break
        passes += 1
        assert passes < 20
    assert passes >= 3
    assert _records(admin) == _latest(items, head_from=89)


def test_tombstones_stay_for_delete_retention_ms_after_their_first_clean(root):
    admin = Admin(str(root))
    admin.alter_configs("t", {"delete.retention.ms": "0"})
    items = [(b"a", b"1"), (b"b", b"2"), (b"a", None), (b"c", b"3"), (b"c", b"4")]
    _produce(admin, items)
    clean_partition(admin.cluster, admin.cluster.state(), "t", 0, force=True, delay_ms=0)
    # first clean: the tombstone of a stays (its delete horizon is set: now + 0)
    assert (2, b"a", None) in _records(admin)
    _produce(admin, [(b"d", b"5")])
    clean_partition(admin.cluster, admin.cluster.state(), "t", 0, force=True, delay_ms=0)
    got = _records(admin)
    assert not any(k == b"a" for _, k, _ in got), got
    assert [(o, k) for o, k, _ in got] == [(1, b"b"), (4, b"c"), (5, b"d")]


def test_a_partition_that_is_not_due_is_left_alone(root):
    admin = Admin(str(root))
    admin.alter_configs("t", {"min.cleanable.dirty.ratio": "1.0"})
    _produce(admin, [(b"k", b"%d" % i) for i in range(6)])
    clean_partition(admin.cluster, admin.cluster.state(), "t", 0, force=True, delay_ms=0)
    _produce(admin, [(b"k", b"x%d" % i) for i in range(3)])
    before = _logs(root)
    out = clean_partition(admin.cluster, admin.cluster.state(), "t", 0, delay_ms=0)
    assert out.cleaned == [] and 0 < out.dirty_ratio < 1.0
    assert _logs(root) == before


def test_min_compaction_lag_keeps_young_segments_dirty(root):
    admin = Admin(str(root))
    admin.alter_configs("t", {"min.compaction.lag.ms": str(10 ** 12)})
    _produce(admin, [(b"k", b"%d" % i) for i in range(6)])
    out = clean_partition(admin.cluster, admin.cluster.state(), "t", 0, force=True, delay_ms=0)
    assert out.cleaned == [] and len(_records(admin)) == 6


def test_a_topic_that_is_not_compacted_is_never_cleaned(tmp_path):
    admin = Admin(str(tmp_path / "c"))
    admin.create_topic("t", 1)
    _produce(admin, [(b"k", b"%d" % i) for i in range(6)])
    out = clean_partition(admin.cluster, admin.cluster.state(), "t", 0, force=True, delay_ms=0)
    assert out.cleaned == [] and len(_records(admin)) == 6


def test_compaction_configs_need_the_feature_and_turn_it_on(root):
    admin = Admin(str(root))
    assert LOG_COMPACTION not in admin.cluster.state().reader_features
    admin.alter_configs("t", {"delete.retention.ms": "1000"})
    assert LOG_COMPACTION in admin.cluster.state().reader_features


def test_a_clean_entry_for_a_topic_that_is_not_compacted_is_refused(tmp_path):
    from pyspark_kafkalog.cluster import actions as A
    admin = Admin(str(tmp_path / "c"))
    admin.create_topic("t", 1)
    _produce(admin, [(b"k", b"%d" % i) for i in range(3)])
    admin.cluster.enable_feature(LOG_COMPACTION)
    state = admin.cluster.state()
    action = A.CleanSegments(topic="t", topic_id=state.topics["t"]["topic_id"], partition=0,
                             after=-1, runs=[[0, 2, 2, 100]], cleaned_to=2,
                             log_dirs=["logdir-0"])
    _, _, results = admin.cluster.submit([action])
    assert not results[0].ok and results[0].error == "INVALID_REQUEST"
    assert "not compacted" in results[0].message


def test_a_consumer_that_listed_the_old_files_goes_on_after_a_clean(root):
    """A consumer part-way through the partition when a clean replaces the group's first file
    (the covered ones stay for file.delete.delay.ms): it goes on in offset order, with no
    offset twice and no error, and every record it returns was written at that offset."""
    admin = Admin(str(root))
    admin.alter_configs("t", {"file.delete.delay.ms": "600000"})
    items = [(b"k%d" % (i % 3), b"v%d" % i * 50) for i in range(30)]
    _produce(admin, items)
    it = admin.consume("t", 0)
    first = [next(it) for _ in range(3)]
    out = clean_partition(admin.cluster, admin.cluster.state(), "t", 0, force=True)
    assert out.cleaned
    rest = list(it)
    offsets = [r.offset for r in first + rest]
    assert offsets == sorted(set(offsets))
    written = dict(enumerate(items))
    assert all((r.key, r.value) == written[r.offset] for r in first + rest)
    assert offsets[-1] == 29
    # a consumer that starts now reads the cleaned file: the latest of each key, and the head
    assert _records(admin) == _latest(items, head_from=29)


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_a_spark_read_after_a_clean_gives_the_latest_per_key_and_no_data_loss(ks, root):
    admin = Admin(str(root))
    items = [(b"k%d" % (i % 4), b"v%d" % i) for i in range(20)]
    _produce(admin, items)
    clean_partition(admin.cluster, admin.cluster.state(), "t", 0, force=True, delay_ms=0)
    rows = (ks.read.format("kafkalog").option("subscribe", "t").load(str(root))
            .select("offset", "key", "value").orderBy("offset").collect())
    assert [(r.offset, bytes(r.key), bytes(r.value)) for r in rows] == \
        _latest(items, head_from=19)


def test_a_consumer_inside_the_replaced_file_goes_on_in_the_cleaned_one(root, caplog):
    """The consumer is part-way through the group's first file, a small fetch at a time (its
    index and the file's size read), when the clean replaces it: its next fetch finds the file
    changed and goes on from its next offset in the new one (as a Kafka consumer after the
    cleaner's swap): offsets only go up, and every record is the one written at its offset."""
    from pyspark_kafkalog.format.columnar import decode_records
    admin = Admin(str(root))
    admin.alter_configs("t", {"file.delete.delay.ms": "600000", "index.interval.bytes": "1",
                              "max.message.bytes": "2200"})   # a batch a record
    items = [(b"k%d" % (i % 3), bytes([65 + i]) * 2_000) for i in range(30)]
    admin.produce("t", [Record(k, v, T0 + i) for i, (k, v) in enumerate(items)], partition=0)
    _produce(admin, [(b"z", b"head")])
    items.append((b"z", b"head"))
    log = admin.cluster.partition_view("t", 0).log
    got, offset = [], 0

    def fetch():
        nonlocal offset
        data, _ = log.read(offset, 64)   # one batch a fetch
        recs = [r for r in decode_records(data) if r.offset >= offset]
        got.extend(recs)
        offset = recs[-1].offset + 1
    for _ in range(7):
        fetch()
    out = clean_partition(admin.cluster, admin.cluster.state(), "t", 0, force=True)
    assert out.cleaned and out.cleaned[0][:3] == [0, 30, 1]
    while offset < 31:
        fetch()
    offsets = [r.offset for r in got]
    assert offsets == sorted(set(offsets)) and offsets[-1] == 30
    written = dict(enumerate(items))
    assert all((r.key, r.value) == written[r.offset] for r in got)
    assert len(got) < 31                      # it did read on in the cleaned file
    # ... knowing the file was replaced: not taking the new file for a bad index of the old
    assert "ignoring its indexes" not in caplog.text
    assert _records(admin) == _latest(items, head_from=30)


def test_a_spark_range_planned_before_a_clean_reads_on_in_the_cleaned_file(root):
    """Planned on the driver's listing (old sizes), read after the clean replaced the file:
    the task finds it changed and reads on from its next offset; no offset twice, every record
    the one written at its offset, and the latest of every key among them."""
    from pyspark_kafkalog.connector.range_reader import read_range
    from pyspark_kafkalog.connector.read_plan import plan
    from pyspark_kafkalog.connector.sources import open_source
    from pyspark_kafkalog.spark.read_options import ReadOptions
    admin = Admin(str(root))
    admin.alter_configs("t", {"file.delete.delay.ms": "600000"})
    big = [(b"k%d" % (i % 3), bytes([65 + i]) * 200_000) for i in range(30)]
    admin.produce("t", [Record(k, v, T0 + i) for i, (k, v) in enumerate(big)], partition=0)
    _produce(admin, [(b"z", b"head")])
    items = dict(enumerate(big + [(b"z", b"head")]))
    url = admin.cluster.url
    tasks = plan(open_source(url), ReadOptions.parse({"path": url, "subscribe": "t"}))
    assert clean_partition(admin.cluster, admin.cluster.state(), "t", 0, force=True).cleaned
    rows = []
    for task in tasks:
        for batch in read_range(task, include_headers=False):
            rows += list(zip(batch.column("offset").to_pylist(), batch.column("key").to_pylist(),
                             batch.column("value").to_pylist()))
    offsets = [o for o, _, _ in rows]
    assert offsets == sorted(set(offsets))
    assert all((k, v) == items[o] for o, k, v in rows)
    assert {o for o, _, _ in _latest(list(items.values()), head_from=30)} <= set(offsets)


def test_cleanup_compact_now_from_the_cli_cleans_and_says_so(root):
    from support.cli_support import run_cli
    admin = Admin(str(root))
    items = [(b"k%d" % (i % 2), b"v%d" % i) for i in range(8)]
    _produce(admin, items)
    rc, out, err = run_cli("--cluster", root, "--json", "cleanup", "--compact-now")
    assert rc == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    assert {"kind": "cleaned", "path": f"logdir-0/t-0/{0:020d}"} in rows
    assert _records(admin) == _latest(items, head_from=7)


def test_the_coordinators_log_cleaner_cleans_a_due_partition_and_sets_its_metrics(root):
    from pyspark_kafkalog.coordinator.metrics import CoordinatorMetrics
    from pyspark_kafkalog.coordinator.scheduler import LOG_CLEANER, MaintenanceScheduler
    admin = Admin(str(root))
    items = [(b"k%d" % (i % 2), b"v%d" % i) for i in range(10)]
    _produce(admin, items)
    clock = [1000.0]
    s = MaintenanceScheduler(admin.cluster, {"log.cleaner.backoff.ms": "1000",
                                             "log.cleaner.threads": "2"}, clock=lambda: clock[0])
    runs = s.tick(1001.0)
    assert [r.kind for r in runs] == [LOG_CLEANER] and runs[0].ok
    assert runs[0].changed["partitions"] == 1 and runs[0].changed["max_dirty_percent"] == 100
    assert 0 < runs[0].changed["recopy_percent"] < 100
    assert _records(admin) == _latest(items, head_from=9)
    metrics = CoordinatorMetrics()
    metrics.count_runs(runs)
    assert metrics.cleaner["max_dirty_percent"]._value.get() == 100
    assert s.tick(1002.0) == []     # nothing dirty left: a quiet run, not reported


def test_a_clean_leaves_every_isr_member_byte_identical(tmp_path):
    from support.replication_support import digests, rep_state, setup
    admin, rep, clock = setup(tmp_path, partitions=1,
                              configs={"cleanup.policy": "compact", "file.delete.delay.ms": "0"})
    items = [(b"k%d" % (i % 4), b"v%d" % i) for i in range(16)]
    for i, (k, v) in enumerate(items):
        admin.produce("t", [Record(k, v, T0 + i)], partition=0, acks="1")
    rep.tick()
    rep.tick()
    assert rep_state(admin)["isr"] == ["logdir-0", "logdir-1"]
    out = clean_partition(admin.cluster, admin.cluster.state(), "t", 0, force=True, delay_ms=0)
    assert out.cleaned
    leader_dir, follower_dir = tmp_path / "root" / "logdir-0" / "t-0", tmp_path / "second" / "t-0"
    assert digests(leader_dir) == digests(follower_dir)
    assert len(list(leader_dir.glob("*.log"))) == 2
    assert _records(admin) == _latest(items, head_from=15)
    rep.tick()
    assert rep_state(admin)["isr"] == ["logdir-0", "logdir-1"]   # and it stays in sync


def test_groups_offsets_and_timestamps_step_over_compaction_gaps(root):
    """A group whose committed offset a clean removed goes on from the next record; offsets
    for a timestamp find the first record left at or after it; earliest and latest do not
    move (Kafka's semantics over a compacted log)."""
    from pyspark_kafkalog.admin import TopicPartition as TP
    admin = Admin(str(root))
    items = [(b"k%d" % (i % 3), b"v%d" % i) for i in range(12)]
    _produce(admin, items)
    admin.commit_group_offsets("g", {TP("t", 0): 4})
    clean_partition(admin.cluster, admin.cluster.state(), "t", 0, force=True, delay_ms=0)
    kept = [o for o, _, _ in _latest(items, head_from=11)]
    assert 4 not in kept                                   # the committed offset was removed
    got = [r.offset for r in admin.consume("t", group="g")]
    assert got == [o for o in kept if o >= 4]
    assert admin.describe_group("g")[0].lag == 0
    tp = TP("t", 0)
    offsets = admin.list_offsets({tp: "earliest"})[tp].offset, \
        admin.list_offsets({tp: "latest"})[tp].offset
    assert offsets == (0, 12)
    assert admin.list_offsets({tp: T0 + 1})[tp].offset == min(o for o in kept if o >= 1)


def test_a_partition_is_not_cleaned_again_while_covered_segments_wait(root):
    """Each clean publishes the group's first file again: while the segments it covers wait
    for file.delete.delay.ms, a new clean would restart their wait, so none happens; once
    they are gone, cleaning goes on."""
    admin = Admin(str(root))
    admin.alter_configs("t", {"file.delete.delay.ms": "600000",
                              "min.cleanable.dirty.ratio": "0.01"})
    _produce(admin, [(b"k%d" % (i % 3), b"v%d" % i) for i in range(10)])
    assert clean_partition(admin.cluster, admin.cluster.state(), "t", 0).cleaned
    _produce(admin, [(b"k%d" % (i % 3), b"w%d" % i) for i in range(10)])
    waiting = clean_partition(admin.cluster, admin.cluster.state(), "t", 0)
    assert not waiting.cleaned and "wait for file.delete.delay.ms" in waiting.skipped
    later = time.time() + 700      # the storage's clock, past the delay
    done = clean_partition(admin.cluster, admin.cluster.state(), "t", 0, now_s=later)
    assert len(done.deleted) == 8 and done.cleaned


def test_max_compaction_lag_makes_a_partition_due_whatever_its_dirty_ratio(root):
    admin = Admin(str(root))
    admin.alter_configs("t", {"min.cleanable.dirty.ratio": "1.0"})
    items = [(b"k%d" % (i % 2), b"v%d" % i) for i in range(6)]
    _produce(admin, items)            # record timestamps T0 + i: long ago
    clean_partition(admin.cluster, admin.cluster.state(), "t", 0, force=True, delay_ms=0)
    more = [(b"k%d" % (i % 2), b"w%d" % i) for i in range(4)]
    _produce(admin, more)
    assert not clean_partition(admin.cluster, admin.cluster.state(), "t", 0,
                               delay_ms=0).cleaned                  # dirty ratio < 1.0
    admin.alter_configs("t", {"max.compaction.lag.ms": "1000"})
    out = clean_partition(admin.cluster, admin.cluster.state(), "t", 0, delay_ms=0)
    assert out.cleaned and out.compaction_delay_ms > 0
    assert _records(admin) == _latest(items + more, head_from=9)


def test_a_group_fits_segment_bytes_and_its_indexes_relative_offsets():
    """Kafka's groupSegmentsBySize: a cleaned log may hold few records over many offsets, and a
    segment's offsets relative to its base must fit an int32 in its indexes."""
    from pyspark_kafkalog.maintenance.compaction import _groups
    logs = {0: (10, 0), 10: (10, 0), 2**31: (10, 0), 2**31 + 5: (10, 0), 2**31 + 9: (995, 0)}
    bases = sorted(logs)
    assert _groups(bases, logs, 1000, 2**31 + 20) == [[0, 10], [2**31, 2**31 + 5],
                                                       [2**31 + 9]]


def test_the_io_throttle_holds_all_threads_to_the_rate():
    """log.cleaner.io.max.bytes.per.second (Kafka's Throttler): bytes counted from every call,
    and a caller ahead of the rate sleeps until it is not."""
    from pyspark_kafkalog.maintenance.compaction import Throttle
    now, slept = [0.0], []

    def sleep(s):
        slept.append(s)
        now[0] += s
    t = Throttle(1000.0, clock=lambda: now[0], sleep=sleep)
    t(500)                      # half a second's worth at t=0: sleeps 0.5 s
    assert slept == [0.5]
    now[0] += 2.0               # idle: credit for the time that passed
    t(1000)
    assert slept == [0.5]
    t(2000)                     # 3,500 bytes by t=2.5: 1 s ahead
    assert slept == [0.5, 1.0]
