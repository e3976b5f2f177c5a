"""Every file of a write is durable before the write is handed to its commit (docs/protocol.md
§3, "Durability"): before the ``commit`` entry of a produce, and before a Spark task returns its
write to the driver.

What a machine crash may take away is modelled from the real system calls of the real storage
code (``os.fsync``, the storage's ``syncfs`` and every write, create, link, rename and mkdir made
through ``os``), by inode: a write or a new inode makes the inode dirty, a new name makes its
directory dirty, and a ``fsync`` (or a ``syncfs``) cleans what was dirty when it began. At the
moment that counts, no segment file and no partition directory of the write may be dirty. A run
with the barrier taken out shows that the model sees what an unsynced write leaves.
"""
from __future__ import annotations

import json
import os
import threading

import pyarrow as pa
import pytest

from pyspark_kafkalog.admin import Admin
from pyspark_kafkalog.cluster.spark_job import job_producer_id
from pyspark_kafkalog.spark.write_options import WriteOptions
from pyspark_kafkalog.spark.writer import write_task
from pyspark_kafkalog.storage import local

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
    real_syncfs = local._syncfs

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
    monkeypatch.setattr(local, "_syncfs", syncfs)
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


# 2 partitions: a fsync per file and directory; 100 partitions: 300 files, past SyncBatch's
# threshold, one syncfs (with the early write-back's passes before it)
@pytest.mark.parametrize("partitions", [2, 100])
def test_a_produce_is_durable_before_its_commit_entry(tmp_path, model, partitions):
    root = str(tmp_path / "c")
    admin = Admin(root)
    admin.create_topic("t", partitions)
    model.at_commit = None
    admin.produce("t", _records(20 * partitions))
    assert model.at_commit is not None, "no commit entry was seen"
    assert not_durable(root, "t", model.at_commit) == []
    assert len(list(admin.consume("t"))) == 20 * partitions


@pytest.mark.parametrize("partitions, rows, value_bytes", [
    (100, 3000, 50),         # small partitions: through the page cache, one syncfs
    (2, 24, 1 << 19),        # 6 MiB per partition: spooled in 4 MiB runs, O_DIRECT where it can
])
def test_a_spark_task_is_durable_when_it_returns(tmp_path, model, partitions, rows, value_bytes):
    root = str(tmp_path / "c")
    Admin(root).create_topic("t", partitions)
    opts = WriteOptions.parse({"path": root, "topic": "t"})
    keys = [b"key-%d" % i for i in range(rows)]
    batch = pa.RecordBatch.from_arrays([pa.array(keys), pa.array([b"x" * value_bytes] * rows)],
                                       names=["key", "value"])
    message = write_task(opts, job_producer_id("durable"), iter([batch]))
    dirty = model.snapshot()
    assert message.pending_writes()
    assert not_durable(root, "t", dirty) == []


def test_the_model_sees_a_write_left_unsynced(tmp_path, model, monkeypatch):
    """The same produce as above with the barrier taken out: its files are reported."""
    root = str(tmp_path / "c")
    admin = Admin(root)
    admin.create_topic("t", 100)
    monkeypatch.setattr(local.SyncBatch, "sync", lambda self: None)
    monkeypatch.setattr(local.SyncBatch, "EARLY_FLUSH", False)
    model.at_commit = None
    admin.produce("t", _records(2000))
    missing = not_durable(root, "t", model.at_commit)
    written = sum(n.endswith(".log") for _, _, names in os.walk(root) for n in names)
    assert written > 90 and len([f for f in missing if f.endswith(".log")]) == written
