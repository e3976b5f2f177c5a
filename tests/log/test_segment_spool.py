"""Spooled segments: ``log.segment_spool`` and its use by ``Producer.write`` / ``TaskWriter``.

A spooled partition must publish exactly the segments ``write_segments`` writes (every file,
byte for byte), a spooled task exactly what an unspooled one writes; nothing is left behind (no
temp file, no segment) when a spool is discarded, fails or no longer matches; and a spool that
fails on the writer thread makes the task write its batches the plain way. A task spools on
local storage, through the page cache (``storage.direct_io=false``) and with O_DIRECT (the
default) alike, unless told not to.
"""
from __future__ import annotations

import errno
import os
import random

import numpy as np
import pyarrow as pa
import pytest

from pyspark_kafkalog.admin import Admin
from pyspark_kafkalog.connector.arrow_writer import TaskWriter
from pyspark_kafkalog.cluster.cluster import Cluster
from pyspark_kafkalog.client.producer import Producer
from pyspark_kafkalog.connector.spark_job import commit_job, job_producer_id
from pyspark_kafkalog.errors import AlreadyExistsError
from pyspark_kafkalog.format.encode import assign_log_append_time, assign_offsets, encode_records
from pyspark_kafkalog.format.records import CREATE_TIME, LOG_APPEND_TIME, Record
from pyspark_kafkalog.log.config import LogConfig
from pyspark_kafkalog.log.segment_spool import SegmentSpool
from pyspark_kafkalog.log.segment_writer import plan_segments, write_segments
from pyspark_kafkalog.spark.write_options import WriteOptions
from pyspark_kafkalog.storage.local import LocalStorage
from pyspark_kafkalog.storage.local_spool import LocalDirectSpool, LocalSpool
from support.spool_support import HAS_DIRECT, needs_direct, temp_files, segment_files

# -- SegmentSpool -------------------------------------------------------------------------------

def _v2_batches(rng, n, *, big_every=0):
    """``n`` unstamped magic 2 batches (writable data) of varied sizes."""
    out = []
    for i in range(n):
        count = rng.randrange(1, 40)
        size = 9000 if big_every and i % big_every == big_every - 1 else 300
        recs = [Record(None if j % 3 == 0 else b"k%d" % j, rng.randbytes(rng.randrange(size)),
                       1_700_000_000_000 + i * 100 + j) for j in range(count)]
        b = encode_records(recs, compression=(0 if i % 4 else 3))   # some lz4
        out.append(b._replace(data=bytearray(b.data)))
    return out


def _stamp(batches, base, epoch, log_append_ms=None):
    out, nxt = [], base
    for b in batches:
        b = assign_offsets(b, nxt, epoch, in_place=True)
        if log_append_ms is not None:
            b = assign_log_append_time(b, log_append_ms)
        out.append(b)
        nxt = b.last_offset + 1
    return out


@pytest.mark.parametrize("direct", [False, pytest.param(True, marks=needs_direct)])
@pytest.mark.parametrize("log_append", [False, True])
def test_segment_spool_writes_what_write_segments_writes(tmp_path, log_append, direct):
    rng = random.Random(11 + 2 * log_append)
    st = LocalStorage(str(tmp_path), fsync=False, direct_io=direct)
    config = LogConfig(segment_bytes=40_000, index_interval_bytes=1500,
                       message_timestamp_type=LOG_APPEND_TIME if log_append else CREATE_TIME)
    batches = _v2_batches(rng, 120, big_every=7)
    assert any(len(b.data) > config.segment_bytes for b in batches)   # a segment of its own
    spool = SegmentSpool(st, "A/t-0", config.segment_bytes)
    i = 0
    while i < len(batches):                        # handed over in runs, as the writer does
        k = rng.randrange(1, 12)
        spool.append([b.data for b in batches[i:i + k]])
        i += k
    assert temp_files(tmp_path) and not st.list("A/t-0")
    assert [s.size for s, _ in spool.files] == [sum(sizes) for _, sizes in spool.files]
    assert {type(s) for s, _ in spool.files} == {LocalDirectSpool if direct else LocalSpool}
    stamped = _stamp(batches, 1234, 7, 1_800_000_000_000 if log_append else None)
    assert len(plan_segments(stamped, config.segment_bytes)) > 3
    assert spool.matches(stamped, config.segment_bytes)
    assert not spool.matches(stamped, config.segment_bytes * 2)
    assert not spool.matches(stamped[:-1], config.segment_bytes)
    bases_a = spool.publish(stamped, config)
    bases_b = write_segments(st, "B/t-0", stamped, config)
    assert bases_a == bases_b and bases_a[0] == 1234 and len(bases_a) > 3
    a, b = segment_files(tmp_path / "A"), segment_files(tmp_path / "B")
    assert sorted(a) == sorted(b) and len(a) == 3 * len(bases_a)
    for name in a:
        assert a[name] == b[name], name
    assert any(len(v) > 0 for k, v in a.items() if k.endswith(".index"))
    assert not temp_files(tmp_path) and spool.files == []
    # the bytes really were patched: base offset and epoch of the first batch
    first = a["t-0/00000000000000001234.log"]
    assert int.from_bytes(first[:8], "big") == 1234
    assert int.from_bytes(first[12:16], "big") == 7


def _spooled(tmp_path, seed):
    """30 batches spooled into ``A/t-0`` (segments of 20 kB), and the same batches stamped
    with base offset 50 and epoch 3: (storage, config, spool, stamped)."""
    st = LocalStorage(str(tmp_path), fsync=False, direct_io=False)
    config = LogConfig(segment_bytes=20_000)
    batches = _v2_batches(random.Random(seed), 30)
    spool = SegmentSpool(st, "A/t-0", config.segment_bytes)
    spool.append([b.data for b in batches])
    return st, config, spool, _stamp(batches, 50, 3)


def test_segment_spool_replaces_garbage_like_write_segments(tmp_path):
    """A file of a dead writer where a segment goes is replaced (``replace_garbage``), in one
    ``LocalSpool.publish(replace=True)``."""
    st, config, spool, stamped = _spooled(tmp_path, 8)
    for d in ("A", "B"):
        st.create_if_absent(f"{d}/t-0/00000000000000000050.log", b"garbage")
        st.create_if_absent(f"{d}/t-0/00000000000000000050.index", b"garbage")
    assert spool.publish(stamped, config) == write_segments(st, "B/t-0", stamped, config)
    a, b = segment_files(tmp_path / "A"), segment_files(tmp_path / "B")
    assert sorted(a) == sorted(b) and all(a[k] == b[k] for k in a)
    assert a["t-0/00000000000000000050.log"] != b"garbage"
    assert len(a) == 3 * len(plan_segments(stamped, config.segment_bytes)) > 3
    assert not temp_files(tmp_path) and spool.files == []


@pytest.mark.parametrize("where", [0, 1])
def test_segment_spool_keeps_garbage_without_replace_garbage(tmp_path, where):
    """``replace_garbage=False``: AlreadyExistsError, as from write_segments, the file there
    untouched, every file the failed write had created deleted (the segments before it and the
    failed segment's indexes), the same files left as write_segments leaves, and no temp file."""
    st, config, spool, stamped = _spooled(tmp_path, 9)
    groups = plan_segments(stamped, config.segment_bytes)
    bad = groups[where][0].base_offset
    for d in ("A", "B"):
        st.create_if_absent(f"{d}/t-0/{bad:020d}.log", b"garbage")
    with pytest.raises(AlreadyExistsError):
        spool.publish(stamped, config, replace_garbage=False)
    with pytest.raises(AlreadyExistsError):
        write_segments(st, "B/t-0", stamped, config, replace_garbage=False)
    a, b = segment_files(tmp_path / "A"), segment_files(tmp_path / "B")
    assert a == b and a[f"t-0/{bad:020d}.log"] == b"garbage"
    assert set(a) == {f"t-0/{bad:020d}.log"}    # only the file that was there before
    assert not temp_files(tmp_path) and spool.files == []


def test_segment_spool_discard_and_mismatch(tmp_path):
    st = LocalStorage(str(tmp_path), fsync=False)
    batches = _v2_batches(random.Random(5), 40)
    spool = SegmentSpool(st, "d/t-0", 5000)
    spool.append([b.data for b in batches])
    assert len(spool.files) == len(plan_segments(batches, 5000)) > 1
    assert len(temp_files(tmp_path)) == len(spool.files)
    assert spool.matches(batches, 5000) and not spool.matches(batches, 5001 + 5000)
    spool.discard()
    assert not temp_files(tmp_path) and os.listdir(tmp_path / "d" / "t-0") == []
    assert spool.files == []


# -- Producer.write with spools -----------------------------------------------------------------

def _recs(n, start=0, size=200):
    return [Record(b"k%d" % i, b"%06d" % i + b"v" * size, 1_700_000_000_000 + i)
            for i in range(start, start + n)]


def test_a_spool_that_no_longer_fits_is_discarded_and_the_write_goes_on(tmp_path):
    url = str(tmp_path / "c")
    admin = Admin(Cluster(url, fsync=False))
    admin.create_topic("t", 2, configs={"segment.bytes": "3000"})
    cluster = Cluster(url, create=False, fsync=False)
    prod = Producer(cluster)
    b0 = prod.encode("t", _recs(60), batch_records=5)
    b1 = prod.encode("t", _recs(60, 1000), batch_records=5)
    st = cluster.storage
    wrong_dir = SegmentSpool(st, "logdir-0/elsewhere-0", 3000)
    wrong_dir.append([b.data for b in b0])
    wrong_size = SegmentSpool(st, cluster.partition_dir("t", 1), 6000)
    wrong_size.append([b.data for b in b1])
    unused = SegmentSpool(st, cluster.partition_dir("t", 0), 3000)   # no batches for it
    unused.append([b.data for b in b0[:2]])
    assert len(temp_files(url)) > 3
    pending = prod.write({("t", 0): b0, ("t", 1): b1},
                         spools={("t", 0): wrong_dir, ("t", 1): wrong_size, ("t", 5): unused})
    assert not temp_files(url)
    assert os.listdir(os.path.join(url, "logdir-0", "elsewhere-0")) == []
    assert all(len(pending.segments[k]) > 1 for k in ("t:0", "t:1"))
    prod.commit([pending])
    got = list(admin.consume("t"))
    assert sorted(r.value[:6] for r in got) == sorted(
        b"%06d" % i for i in list(range(60)) + list(range(1000, 1060)))


# -- TaskWriter end to end ----------------------------------------------------------------------

FIXED_NOW = 1_750_000_000.0


def _arrow_batches(seed, nbatches, rows):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(nbatches):
        sizes = rng.integers(0, 400, size=rows)
        values = [rng.integers(0, 256, size=int(s), dtype=np.uint8).tobytes() for s in sizes]
        keys = [None if (i + j) % 5 == 0 else b"key-%d" % rng.integers(0, 5000)
                for j in range(rows)]
        ts = pa.array(1_700_000_000_000 + np.arange(i * rows, (i + 1) * rows) * 7,
                      pa.timestamp("ms"))
        out.append(pa.RecordBatch.from_arrays(
            [pa.array(keys, pa.binary()), pa.array(values, pa.binary()), ts],
            names=["key", "value", "timestamp"]))
    return out


def _make_cluster(url, topic_configs):
    admin = Admin(Cluster(url, fsync=False, clock=lambda: FIXED_NOW))
    admin.create_topic("t", 3, configs=topic_configs)
    return admin


def _task(url, *, direct_io=False, spool=None, extra=None, run_bytes=None):
    """A TaskWriter; ``direct_io`` None: the storage's default (O_DIRECT on Linux)."""
    raw = {"path": url, "topic": "t", "batch.records": "300", "buffer.memory": str(3 << 20)}
    if direct_io is not None:
        raw["storage.direct_io"] = str(direct_io).lower()
    opts = WriteOptions.parse({**raw, **(extra or {})})
    prod = job_producer_id("job-" + os.path.basename(url))
    cluster = Cluster(url, create=False, fsync=False, clock=lambda: FIXED_NOW,
                      **opts.cluster_kwargs())
    tw = TaskWriter(cluster, opts, producer=prod, clock=lambda: FIXED_NOW, seed=1, spool=spool)
    if run_bytes is not None:
        tw.spool_writer.RUN_BYTES = run_bytes
    return tw, prod


def _commit(url, pending, prod):
    commit_job(Cluster(url, create=False, fsync=False, clock=lambda: FIXED_NOW), pending, prod)


def _all_values(batches):
    return sorted(v for b in batches for v in b.column("value").to_pylist())


def _record_publishes(monkeypatch):
    """[number of spool files] per SegmentSpool.publish."""
    published = []
    real_publish = SegmentSpool.publish

    def recording_publish(self, batches, config, **kw):
        published.append(len(self.files))
        return real_publish(self, batches, config, **kw)
    monkeypatch.setattr(SegmentSpool, "publish", recording_publish)
    return published


@needs_direct
def test_task_writer_spools_unless_told_not_to(tmp_path):
    """Local storage spools, with O_DIRECT (the default) as through the page cache
    (``storage.direct_io=false``), unless ``spool=False``; each with its kind of spool."""
    url = str(tmp_path / "c")
    _make_cluster(url, {"segment.bytes": "100000"})
    batches = _arrow_batches(3, 3, 1000)
    for direct_io in (None, True, False):
        for spool in (None, True, False):
            tw, _ = _task(url, direct_io=direct_io, spool=spool,
                          extra={"buffer.memory": str(1 << 30)}, run_bytes=16 << 10)
            assert tw.cluster.storage._direct is (direct_io is not False)
            assert tw.cluster.storage.can_spool is True
            want = spool is not False
            assert tw.spooling is want, (direct_io, spool)
            for b in batches:
                tw.add(b)
            tw.spool_writer.wait()
            assert bool(temp_files(url)) is want and bool(tw.spools) is want
            kinds = {type(f) for s in tw.spools.values() for f, _ in s.files}
            assert kinds == ({LocalSpool if direct_io is False else LocalDirectSpool}
                             if want else set())
            tw.abort()
            assert not temp_files(url) and not segment_files(url)


def test_a_partition_that_never_filled_a_run_is_written_from_memory(tmp_path):
    """Spooling overlaps a partition's segment I/O with the encoding only once a whole run was
    handed over: a partition smaller than that (a topic of many small partitions) gets no temp
    file at all, and its segments are the plain write's, byte for byte."""
    batches = _arrow_batches(5, 3, 1000)
    roots = {}
    for way, run_bytes in (("small", 1 << 30), ("plain", None)):
        url = str(tmp_path / way)
        _make_cluster(url, {"segment.bytes": "100000"})
        tw, prod = _task(url, spool=None if way == "small" else False, run_bytes=run_bytes,
                         extra={"buffer.memory": str(1 << 30)})
        for b in batches:
            tw.add(b)
        tw.spool_writer.wait()
        assert not temp_files(url)
        assert all(not s.files for s in tw.spools.values())
        commit_job(tw.cluster, tw.finish(), prod)
        roots[way] = segment_files(url)
    assert roots["small"] and roots["small"] == roots["plain"]


@pytest.mark.parametrize("case", ["create_time", "log_append_lz4"])
def test_task_writer_spooled_writes_the_same_segments(tmp_path, case, monkeypatch):
    """Tasks spooled with O_DIRECT (the default storage), spooled through the page cache
    (``storage.direct_io=false``) and not spooled (``spool=False``) write the same segment
    files, byte for byte."""
    topic_configs = {"segment.bytes": "250000", "index.interval.bytes": "2048"}
    extra = {}
    if case == "log_append_lz4":
        topic_configs["message.timestamp.type"] = "LogAppendTime"
        extra = {"compression.type": "lz4"}
    published = _record_publishes(monkeypatch)
    batches = _arrow_batches(4, 28, 1000)
    ways = {"buffered": {"direct_io": False}, "plain": {"direct_io": None, "spool": False}}
    if HAS_DIRECT:
        ways = {"direct": {"direct_io": None}, **ways}
    roots, n_published = {}, None
    for way, kw in ways.items():
        spool = way != "plain"
        url = str(tmp_path / way)
        admin = _make_cluster(url, topic_configs)
        tw, prod = _task(url, extra=extra, run_bytes=256 << 10, **kw)
        assert tw.spooling is spool
        saw_spools = False
        for b in batches:
            tw.add(b)
            saw_spools |= any(s.files for s in tw.spools.values())
        assert saw_spools == spool     # the writer thread wrote temp segments before finish
        pending = tw.finish()
        assert len(pending) > 1        # buffer.memory: several flushes, each with its spools
        _commit(url, pending, prod)
        assert not temp_files(url)
        got = list(admin.consume("t"))
        assert len(got) == 28 * 1000
        assert sorted(r.value for r in got) == _all_values(batches)
        if "log_append" in case:
            assert {r.timestamp for r in got} == {int(FIXED_NOW * 1000)}
        roots[way] = segment_files(url)
        if spool:   # every partition of every flush was published from its spool
            n_segments = sum(len(s) for p in pending for s in p.segments.values())
            assert len(published) == sum(len(p.segments) for p in pending) > 3
            assert sum(published) == n_segments
            n_published = len(published)
            del published[:]
        else:
            assert not published
    plain = roots.pop("plain")
    assert len(plain) == 3 * n_segments and n_segments > 6
    for way, files in roots.items():
        assert sorted(files) == sorted(plain), way
        for name in files:
            assert files[name] == plain[name], (way, name)
    assert n_published


@pytest.mark.parametrize("flushed_first", [False, True])
def test_task_writer_abort_leaves_no_temp_and_no_segment_files(tmp_path, flushed_first):
    url = str(tmp_path / "c")
    admin = _make_cluster(url, {"segment.bytes": "100000"})
    extra = {"buffer.memory": str(1 << 20)} if flushed_first else {"buffer.memory": str(1 << 30)}
    tw, _ = _task(url, extra=extra, run_bytes=64 << 10)
    assert tw.spooling
    for b in _arrow_batches(9, 8, 1000):
        tw.add(b)
    tw.spool_writer.wait()                         # the temp files are there now
    assert temp_files(url)
    assert bool(tw.pending) == flushed_first
    if flushed_first:
        assert segment_files(url)
    tw.abort()
    assert not temp_files(url)
    assert not segment_files(url)
    assert list(admin.consume("t")) == []


def _fail_one_spool_append(monkeypatch, nth=3):
    real_append = LocalSpool.append
    calls = []

    def failing_append(self, pieces):
        calls.append(len(pieces))
        if len(calls) == nth:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_append(self, pieces)
    monkeypatch.setattr(LocalSpool, "append", failing_append)
    return calls


def test_an_error_on_the_writer_thread_falls_back_to_plain_writes(tmp_path, monkeypatch):
    url = str(tmp_path / "c")
    admin = _make_cluster(url, {"segment.bytes": "200000"})
    calls = _fail_one_spool_append(monkeypatch)
    published = _record_publishes(monkeypatch)
    tw, prod = _task(url, extra={"buffer.memory": str(1 << 30)}, run_bytes=64 << 10)
    assert tw.spooling
    batches = _arrow_batches(12, 6, 1000)
    for b in batches:
        tw.add(b)
    pending = tw.finish()                          # the spool's error does not fail the task
    assert len(calls) > 3                          # it failed in the middle, not at the start
    assert len(pending) == 1 and published == []   # written the plain way
    assert not temp_files(url)
    assert tw.spools == {}
    _commit(url, pending, prod)
    assert sorted(r.value for r in admin.consume("t")) == _all_values(batches)
    assert not temp_files(url)


def test_when_the_plain_fallback_fails_too_the_task_fails_and_leaves_nothing(tmp_path,
                                                                             monkeypatch):
    url = str(tmp_path / "c")
    admin = _make_cluster(url, {"segment.bytes": "200000"})
    calls = _fail_one_spool_append(monkeypatch)
    plain_calls = []

    def no_space(self, dir_path, files):
        plain_calls.append(dir_path)
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(LocalStorage, "create_segment", no_space)
    tw, _ = _task(url, extra={"buffer.memory": str(1 << 30)}, run_bytes=64 << 10)
    assert tw.spooling
    for b in _arrow_batches(12, 6, 1000):
        tw.add(b)
    with pytest.raises(OSError, match="No space left"):
        tw.finish()
    assert len(calls) > 3 and plain_calls          # the spool failed, then the plain write
    assert len(set(plain_calls)) == len(plain_calls)   # (partitions at once: each once)
    assert not temp_files(url)
    tw.abort()                                     # what Spark does next: fine, and clean
    assert not temp_files(url)
    assert list(admin.consume("t")) == []
    assert not segment_files(url)
