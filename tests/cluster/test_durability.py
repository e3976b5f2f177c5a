"""Which writes are durable before their commit (docs/protocol.md §3, "Durability"): with a topic
config that asks for it (``flush.messages``, ``flush.ms``), every file of a write is durable
before the ``commit`` entry of a produce, and before a Spark task returns its write to the
driver; by default, as with a Kafka broker's defaults, a write is left to the kernel's
write-back, and what a machine crash then takes from committed data is detected and repaired.

What a machine crash may take away is modelled from the real system calls of the real storage
code (``os.fsync``, the storage's ``syncfs`` and every write, create, link, rename and mkdir made
through ``os``), by inode: a write or a new inode makes the inode dirty, a new name makes its
directory dirty, and a ``fsync`` (or a ``syncfs``) cleans what was dirty when it began. At the
moment that counts, no segment file and no partition directory of a flushed write may be dirty.
A run with the barrier taken out shows that the model sees what an unsynced write leaves, and
the crash test takes away exactly what the model says is not durable.
"""
from __future__ import annotations

import glob
import json
import os
import threading

import pyarrow as pa
import pytest

from pyspark_kafkalog.admin import Admin
from pyspark_kafkalog.connector.spark_job import job_producer_id
from pyspark_kafkalog.errors import (CorruptRecordError, InvalidConfigError, KafkaLogError,
                                     OffsetOutOfRangeError)
from pyspark_kafkalog.log.config import LogConfig
from pyspark_kafkalog.spark.write_options import WriteOptions
from pyspark_kafkalog.spark.writer import write_task
from pyspark_kafkalog.storage import local, local_sync

SEGMENT_SUFFIXES = (".log", ".index", ".timeindex")


def _inode(st):
    return st.st_dev, st.st_ino


class CrashModel:
    """What is not yet durable, kept from the system calls as they happen (any thread)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.seq = 0
        self.dirty = {}          # inode -> seq of its last change
        self.at_commit = None    # the dirty inodes when the commit entry got its name

    def touch(self, inode):
        with self.lock:
            self.seq += 1
            self.dirty[inode] = self.seq

    def begin(self):
        with self.lock:
            return self.seq

    def clean(self, begun, inode=None):
        """A sync that began at ``begun`` has returned: what it covered and was dirty then."""
        with self.lock:
            for ino in ([inode] if inode is not None else list(self.dirty)):
                if ino in self.dirty and self.dirty[ino] <= begun:
                    del self.dirty[ino]

    def snapshot(self):
        with self.lock:
            return set(self.dirty)


@pytest.fixture
def model(monkeypatch):
    m = CrashModel()
    real = {name: getattr(os, name) for name in (
        "open", "write", "pwrite", "writev", "pwritev", "fsync", "link", "rename", "replace",
        "mkdir", "copy_file_range", "sendfile") if hasattr(os, name)}
    real_syncfs = local_sync.syncfs

    def parent(path, dir_fd=None):
        if dir_fd is not None and not os.path.isabs(path):
            return _inode(os.fstat(dir_fd))
        return _inode(os.stat(os.path.dirname(os.path.abspath(path)) or "."))

    def opened(path, flags, mode=0o777, *, dir_fd=None):
        fd = real["open"](path, flags, mode, dir_fd=dir_fd)
        if flags & os.O_CREAT:
            m.touch(_inode(os.fstat(fd)))
            m.touch(parent(path, dir_fd))
        return fd

    def writes(name, fd_arg=0):
        def call(*args, **kw):
            m.touch(_inode(os.fstat(args[fd_arg])))
            return real[name](*args, **kw)
        return call

    def fsync(fd):
        begun, ino = m.begin(), _inode(os.fstat(fd))
        real["fsync"](fd)
        m.clean(begun, ino)

    def syncfs(path):
        begun = m.begin()
        done = real_syncfs(path)
        if done:
            m.clean(begun)
        return done

    def linked(src, dst, *, src_dir_fd=None, dst_dir_fd=None, follow_symlinks=True):
        where = os.path.join(os.readlink(f"/proc/self/fd/{dst_dir_fd}"), dst) \
            if dst_dir_fd is not None else os.path.abspath(dst)
        if os.sep + os.path.join("_kafkalog", "log") + os.sep in where \
                and where.endswith(".json") and not where.endswith(".snapshot.json"):
            source = os.path.join(os.readlink(f"/proc/self/fd/{src_dir_fd}"), src) \
                if src_dir_fd is not None else src
            with open(source, "rb") as f:
                entry = json.loads(f.read())
            if any(a.get("op") == "commit" for a in entry.get("actions", [])):
                m.at_commit = m.snapshot()
        real["link"](src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd,
                     follow_symlinks=follow_symlinks)
        m.touch(parent(dst, dst_dir_fd))

    def renamed(name):
        def call(src, dst, *, src_dir_fd=None, dst_dir_fd=None):
            real[name](src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)
            m.touch(parent(dst, dst_dir_fd))
        return call

    def made(path, mode=0o777, *, dir_fd=None):
        real["mkdir"](path, mode, dir_fd=dir_fd)
        m.touch(parent(path, dir_fd))

    monkeypatch.setattr(os, "open", opened)
    for name in ("write", "pwrite", "writev", "pwritev"):
        if name in real:
            monkeypatch.setattr(os, name, writes(name))
    for name in ("copy_file_range", "sendfile"):
        if name in real:
            monkeypatch.setattr(os, name, writes(name, fd_arg=1))
    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(local_sync, "syncfs", syncfs)
    monkeypatch.setattr(os, "link", linked)
    monkeypatch.setattr(os, "rename", renamed("rename"))
    monkeypatch.setattr(os, "replace", renamed("replace"))
    monkeypatch.setattr(os, "mkdir", made)
    return m


def not_durable(root, topic, dirty):
    """The segment files and partition directories of ``topic`` among ``dirty`` inodes (every
    partition directory with a segment; there must be some)."""
    found, segments = [], 0
    for logdir in sorted(os.listdir(root)):
        if not logdir.startswith("logdir-"):
            continue
        for part in sorted(os.listdir(os.path.join(root, logdir))):
            if not part.startswith(topic + "-"):
                continue
            pdir = os.path.join(root, logdir, part)
            names = [n for n in os.listdir(pdir) if n.endswith(SEGMENT_SUFFIXES)]
            if not names:
                continue
            segments += len(names)
            found += [os.path.join(pdir, n) for n in names
                      if _inode(os.stat(os.path.join(pdir, n))) in dirty]
            if _inode(os.stat(pdir)) in dirty:
                found.append(pdir + os.sep)
    assert segments, f"no segment file of {topic} under {root}"
    return found


def _records(n):
    return [(b"key-%d" % i, b"v" * 20) for i in range(n)]


def test_the_flush_configs_are_kafkas():
    """Kafka's names, defaults (Long.MAX_VALUE: never forced) and lower bounds; the rule that
    decides whether a write of n records to a partition is flushed."""
    default = LogConfig()
    assert default.flush_messages == default.flush_ms == 2**63 - 1
    assert not default.flushes(10**9)
    c = LogConfig.from_properties({"flush.messages": "100"})
    assert [c.flushes(n) for n in (1, 99, 100, 5000)] == [False, False, True, True]
    assert LogConfig.from_properties({"flush.ms": "0"}).flushes(1)
    assert not LogConfig.from_properties({"flush.ms": "1000"}).flushes(10**6)
    for bad in ({"flush.messages": "0"}, {"flush.ms": "-1"}, {"flush.ms": str(2**63)},
                {"flush.messages": "often"}):
        with pytest.raises(InvalidConfigError, match=next(iter(bad))):
            LogConfig.from_properties(bad)


#: topic configs that ask every write to be flushed before its commit
FLUSH_EVERY_WRITE = [{"flush.messages": "1"}, {"flush.ms": "0"}]


# 2 partitions: a fsync per file and directory; 100 partitions: 300 files, past SyncBatch's
# threshold, one syncfs (with the early write-back's passes before it)
@pytest.mark.parametrize("configs", FLUSH_EVERY_WRITE)
@pytest.mark.parametrize("partitions", [2, 100])
def test_a_flushed_produce_is_durable_before_its_commit_entry(tmp_path, model, partitions,
                                                              configs):
    root = str(tmp_path / "c")
    admin = Admin(root)
    admin.create_topic("t", partitions, configs=configs)
    model.at_commit = None
    admin.produce("t", _records(20 * partitions))
    assert model.at_commit is not None, "no commit entry was seen"
    assert not_durable(root, "t", model.at_commit) == []
    assert len(list(admin.consume("t"))) == 20 * partitions


@pytest.mark.parametrize("configs", FLUSH_EVERY_WRITE)
@pytest.mark.parametrize("partitions, rows, value_bytes", [
    (100, 3000, 50),         # small partitions: through the page cache, one syncfs
    (2, 24, 1 << 19),        # 6 MiB per partition: spooled in 4 MiB runs, O_DIRECT where it can
])
def test_a_flushed_spark_task_is_durable_when_it_returns(tmp_path, model, partitions, rows,
                                                         value_bytes, configs):
    root = str(tmp_path / "c")
    Admin(root).create_topic("t", partitions, configs=configs)
    message = _task(root, rows, value_bytes)
    assert message.pending_writes()
    assert not_durable(root, "t", model.snapshot()) == []


def _task(root, rows, value_bytes):
    opts = WriteOptions.parse({"path": root, "topic": "t"})
    keys = [b"key-%d" % i for i in range(rows)]
    batch = pa.RecordBatch.from_arrays([pa.array(keys), pa.array([b"x" * value_bytes] * rows)],
                                       names=["key", "value"])
    return write_task(opts, job_producer_id("durable"), iter([batch]))


def _segment_files(root, topic):
    return sorted(f for f in glob.glob(os.path.join(root, "logdir-*", topic + "-*", "*"))
                  if f.endswith(SEGMENT_SUFFIXES))


@pytest.mark.parametrize("partitions", [2, 100])
def test_by_default_a_write_is_left_to_the_kernel(tmp_path, model, partitions):
    """Kafka's defaults (flush.messages and flush.ms at Long.MAX_VALUE): no segment file of the
    write is synced, not even past SyncBatch's threshold, while the commit entry is. (The
    first write to a partition also creates its leader-epoch-checkpoint, whose syncs may take
    the segments along: the second write shows what a write does.)"""
    root = str(tmp_path / "c")
    admin = Admin(root)
    admin.create_topic("t", partitions)
    admin.produce("t", _records(20 * partitions))
    os.sync()                       # the kernel's write-back of the first write
    model.clean(model.begin())
    before = set(_segment_files(root, "t"))
    model.at_commit = None
    admin.produce("t", _records(20 * partitions))
    new = sorted(set(_segment_files(root, "t")) - before)
    assert len(new) == 3 * partitions
    left = not_durable(root, "t", model.at_commit)
    assert sorted(f for f in left if not f.endswith(os.sep)) == new
    commits = [f for f in glob.glob(os.path.join(root, "_kafkalog", "log", "*.json"))
               if '"commit"' in open(f).read()]
    assert len(commits) == 2 and not {_inode(os.stat(f)) for f in commits} & model.snapshot()
    # nothing syncs them afterwards (the checkpoints after the commit may sync directories)
    after = not_durable(root, "t", model.snapshot())
    assert sorted(f for f in after if not f.endswith(os.sep)) == new


def test_by_default_a_spark_task_is_left_to_the_kernel(tmp_path, model):
    root = str(tmp_path / "c")
    Admin(root).create_topic("t", 100)
    assert _task(root, 3000, 50).pending_writes()
    left = not_durable(root, "t", model.snapshot())
    assert sorted(f for f in left if not f.endswith(os.sep)) == _segment_files(root, "t")


def test_flush_messages_counts_the_records_a_write_gives_a_partition(tmp_path, model):
    root = str(tmp_path / "c")
    admin = Admin(root)
    admin.create_topic("t", 2, configs={"flush.messages": "30"})
    admin.produce("t", _records(29), partition=0)          # 29 < 30: left to the kernel
    admin.produce("t", _records(30), partition=1)          # 30: flushed
    left = not_durable(root, "t", model.snapshot())
    assert left and all(os.sep + "t-0" + os.sep in f for f in left)
    admin.alter_configs("t", delete=["flush.messages"])
    admin.produce("t", _records(30), partition=1)
    assert any(os.sep + "t-1" + os.sep in f for f in not_durable(root, "t", model.snapshot()))


def test_the_model_sees_a_flushed_write_left_unsynced(tmp_path, model, monkeypatch):
    """A flushed produce with the barrier taken out: its files are reported."""
    root = str(tmp_path / "c")
    admin = Admin(root)
    admin.create_topic("t", 100, configs={"flush.messages": "1"})
    monkeypatch.setattr(local.SyncBatch, "sync", lambda self: None)
    monkeypatch.setattr(local.SyncBatch, "EARLY_FLUSH", False)
    model.at_commit = None
    admin.produce("t", _records(2000))
    missing = not_durable(root, "t", model.at_commit)
    written = sum(n.endswith(".log") for _, _, names in os.walk(root) for n in names)
    assert written > 90 and len([f for f in missing if f.endswith(".log")]) == written


def _crash(paths, how):
    """Take from each file what a machine crash may: its name, its data, or its tail."""
    for path in paths:
        if how == "name":
            os.unlink(path)
        elif how == "data":
            size = os.path.getsize(path)
            with open(path, "r+b") as f:
                f.write(b"\0" * size)
        elif how == "tail":
            os.truncate(path, os.path.getsize(path) // 2)


@pytest.mark.parametrize("configs, lost", [({}, True), ({"flush.messages": "1"}, False)])
def test_a_machine_crash_takes_only_unflushed_writes_and_is_repaired(tmp_path, model, configs,
                                                                     lost):
    """Two committed writes; a crash then takes from every file the model calls not durable
    (one way per partition). Readers raise typed errors instead of returning what is left,
    ``repair`` reports the second write's offsets lost, and the partitions read the first
    write back and take new writes. With flush.messages=1 the crash takes nothing."""
    root = str(tmp_path / "c")
    admin = Admin(root)
    ways = ["name", "data", "tail", None]
    admin.create_topic("t", len(ways), configs=configs)
    first = {p: [(b"a-%d-%d" % (p, i), b"x" * (20 + i)) for i in range(10)]
             for p in range(len(ways))}
    for p, records in first.items():
        admin.produce("t", records, partition=p)
    os.sync()                       # the kernel's write-back reached them before the crash
    model.clean(model.begin())
    for p in first:
        admin.produce("t", [(b"b-%d" % i, b"y" * 30) for i in range(7)], partition=p)
    dirty = model.snapshot()
    for p, how in enumerate(ways):
        files = [f for f in glob.glob(os.path.join(root, "logdir-*", f"t-{p}", "*"))
                 if f.endswith(SEGMENT_SUFFIXES) and _inode(os.stat(f)) in dirty]
        assert bool(files) == lost
        if how is not None:
            _crash(sorted(files, reverse=True), how)
    for p, how in enumerate(ways):
        if not lost or how is None:
            assert len(list(admin.consume("t", p))) == 17
            continue
        with pytest.raises((CorruptRecordError, OffsetOutOfRangeError)) as err:
            list(admin.consume("t", p))
        assert f"t-{p}" in str(err.value) and isinstance(err.value, KafkaLogError)
    repairs = {r.partition: r for r in admin.repair_partition("t")}
    for p, how in enumerate(ways):
        expect = [(10, 16)] if lost and how is not None else []
        assert [(x.first_offset, x.last_offset) for x in repairs[p].lost] == expect
        got = [(r.offset, r.key, r.value) for r in admin.consume("t", p)]
        assert got[:10] == [(i, k, v) for i, (k, v) in enumerate(first[p])]
        assert len(got) == (10 if expect else 17)
        admin.produce("t", [(b"c", b"z")], partition=p)
        assert [(r.offset, r.key) for r in admin.consume("t", p, start=17)] == [(17, b"c")]


def test_a_crash_that_takes_a_partitions_only_write_is_repaired_too(tmp_path, model):
    """No file left before the lost offsets to extend: the repair creates a segment of one
    empty batch for them (after a dry run that changes nothing), and the partition reads and
    takes writes again from the offset after them."""
    root = str(tmp_path / "c")
    admin = Admin(root)
    ways = ["name", "data", "tail"]
    admin.create_topic("t", len(ways))
    for p in range(len(ways)):
        admin.produce("t", [(b"k%d" % i, b"v" * 40) for i in range(10)], partition=p)
    dirty = model.snapshot()
    for p, how in enumerate(ways):
        files = [f for f in glob.glob(os.path.join(root, "logdir-*", f"t-{p}", "*"))
                 if f.endswith(SEGMENT_SUFFIXES) and _inode(os.stat(f)) in dirty]
        assert len(files) == 3
        _crash(files, how)
    with pytest.raises(OffsetOutOfRangeError, match=r"t-0: .*offset 0 .* repair --topic t "
                                                     r"--partition 0"):
        list(admin.consume("t", 0))
    listing = sorted(glob.glob(os.path.join(root, "logdir-*", "t-*", "*")))
    dry = admin.repair_partition("t", dry_run=True)
    assert sorted(glob.glob(os.path.join(root, "logdir-*", "t-*", "*"))) == listing
    assert [[s.action for s in r.segments] for r in dry] == [["create"], ["replace"],
                                                             ["replace"]]
    for r in admin.repair_partition("t"):
        assert [(x.first_offset, x.last_offset) for x in r.lost] == [(0, 9)]
    for p in range(len(ways)):
        assert list(admin.consume("t", p)) == []
        admin.produce("t", [(b"after", b"crash")], partition=p)
        assert [(r.offset, r.key) for r in admin.consume("t", p)] == [(10, b"after")]
    assert all(not r.changed for r in admin.repair_partition("t"))


@pytest.mark.parametrize("has_syncfs", [True, False])
def test_storage_flush_makes_every_file_under_a_log_dir_durable(tmp_path, model, monkeypatch,
                                                                 has_syncfs):
    """What maintenance calls before it moves a recovery point: one syncfs, or where there is
    none, a fsync of every file and directory under the log dir."""
    root = str(tmp_path / "c")
    admin = Admin(root)
    admin.create_topic("t", 3)
    admin.produce("t", _records(60))
    assert not_durable(root, "t", model.snapshot())
    if not has_syncfs:
        monkeypatch.setattr(local_sync, "syncfs", lambda path: False)
    admin.cluster.storage.flush("logdir-0")
    assert not_durable(root, "t", model.snapshot()) == []
