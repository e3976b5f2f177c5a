"""Contract tests for pyspark_kafkalog.storage, run over every backend.

The S3 backend runs against a real moto server subprocess. Moto 5.2's PutObject honours
``If-None-Match: *`` (412 PreconditionFailed, Condition=If-None-Match), which is what
``S3Storage.create_if_absent`` relies on; the multi-process race test below checks it end to end.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import pickle
import random
import signal
import struct
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from pyspark_kafkalog.errors import (
    AlreadyExistsError,
    InvalidConfigError,
    KafkaStorageError,
    StorageNotFoundError,
    UnsupportedOperationError,
)
from pyspark_kafkalog.storage import FileInfo, LocalStorage, Storage, open_storage

from support.moto_support import BUCKET, REPO, _child_env, moto_options  # noqa: F401  (fixture)


@dataclass
class Backend:
    name: str
    url: str
    options: dict
    storage: Storage


@pytest.fixture(params=["local", "memory", "s3"])
def backend(request, tmp_path):
    if request.param == "local":
        url, options = str(tmp_path / "root"), {}
    elif request.param == "memory":
        url, options = f"memory://test-{uuid.uuid4().hex}", {}
    else:
        url, options = f"s3://{BUCKET}/t-{uuid.uuid4().hex}", request.getfixturevalue("moto_options")
    b = Backend(request.param, url, options, open_storage(url, **options))
    yield b
    if request.param != "local":  # the memory store is process-global, the bucket session-wide
        for d in b.storage.list_dirs(""):
            b.storage.delete_tree(d)
        b.storage.delete_many(f.name for f in b.storage.list(""))


@pytest.fixture
def storage(backend) -> Storage:
    return backend.storage


# -- reads and listings -------------------------------------------------------------------------

def test_ranged_reads(storage):
    data = random.Random(1).randbytes(1000)
    storage.replace("seg/file", data)
    cases = [(0, None), (0, 1000), (0, 1), (10, 20), (999, None), (999, 1000), (1000, None),
             (1000, 1001), (1200, None), (1200, 1300), (500, 2000), (5, 5), (0, 0), (1000, 1000)]
    rng = random.Random(2)
    cases += [(s, rng.choice([None, rng.randint(s, 1100)])) for s in (rng.randint(0, 1100) for _ in range(20))]
    for start, end in cases:
        assert storage.read("seg/file", start, end) == data[start:end], (start, end)
    assert storage.size("seg/file") == 1000
    storage.replace("empty", b"")
    assert storage.read("empty") == b"" and storage.size("empty") == 0


def test_read_into_and_map(backend, storage):
    data = random.Random(3).randbytes(5000)
    storage.replace("seg/file", data)
    for start, size in [(0, 5000), (0, 10), (4990, 100), (5000, 10), (7000, 5), (123, 0)]:
        out = bytearray(size)
        n = storage.read_into("seg/file", start, out)
        assert n == len(data[start:start + size]) and bytes(out[:n]) == data[start:start + size]
    with pytest.raises(StorageNotFoundError):
        storage.read_into("missing", 0, bytearray(4))
    view = storage.map("seg/file")
    if backend.name != "local":
        assert view is None   # object stores and memory: callers read instead
        return
    from pyspark_kafkalog.storage.local import _can_map
    if not _can_map(storage.root):   # this test's tmp dir is on a network/FUSE filesystem
        assert view is None
        return
    assert bytes(view) == data and view.readonly
    storage.replace("empty", b"")
    assert storage.map("empty") is None
    with pytest.raises(StorageNotFoundError):
        storage.map("missing")
    storage.delete("seg/file")   # unlinking a mapped file is safe: the mapping keeps the pages
    assert bytes(view[100:200]) == data[100:200]


def test_local_storage_maps_only_on_local_filesystems(tmp_path, monkeypatch):
    from pyspark_kafkalog.storage import local as local_mod
    table = ("/dev/vda / ext4 rw 0 0\n"
             "server:/export /mnt/nfs nfs4 rw 0 0\n"
             "tmpfs /dev/shm tmpfs rw 0 0\n"
             "fuse /mnt/nfs/inner fuse.s3fs rw 0 0\n"
             "/dev/vdb /mnt/with\\040space xfs rw 0 0\n")
    cases = {"/data/x": "ext4", "/mnt/nfs": "nfs4", "/mnt/nfs/a/b": "nfs4",
             "/mnt/nfsother/a": "ext4", "/mnt/nfs/inner/k": "fuse.s3fs", "/dev/shm/k": "tmpfs",
             "/mnt/with space/seg": "xfs"}
    for path, want in cases.items():
        assert local_mod._mount_fs_type(path, table) == want, path
    data = b"0123456789" * 10
    st = local_mod.LocalStorage(str(tmp_path))
    st.replace("f", data)
    monkeypatch.setattr(local_mod, "_can_map", lambda path: False)   # e.g. an NFS mount
    assert local_mod.LocalStorage(str(tmp_path)).map("f") is None
    monkeypatch.setattr(local_mod, "_can_map", lambda path: True)
    assert bytes(local_mod.LocalStorage(str(tmp_path)).map("f")) == data


def test_create_if_absent_pieces(backend, storage, monkeypatch):
    rng = random.Random(4)
    pieces = [rng.randbytes(rng.randrange(0, 3000)) for _ in range(2500)]   # > IOV_MAX
    pieces[5] = bytearray(pieces[5])
    pieces[6] = memoryview(pieces[6])
    storage.create_if_absent_pieces("seg/log", pieces)
    assert storage.read("seg/log") == b"".join(bytes(p) for p in pieces)
    with pytest.raises(AlreadyExistsError):
        storage.create_if_absent_pieces("seg/log", [b"x"])
    assert storage.read("seg/log") == b"".join(bytes(p) for p in pieces)
    if backend.name == "local":   # a writev may stop anywhere: the rest must still be written
        import pyspark_kafkalog.storage.local as local_mod
        real = os.writev
        monkeypatch.setattr(local_mod.os, "writev",
                            lambda fd, bufs: real(fd, [bytes(bufs[0])[:max(1, len(bufs[0]) // 3)]])
                            if bufs and len(bufs[0]) else real(fd, bufs))
        storage.create_if_absent_pieces("seg/log2", pieces[:300])
        assert storage.read("seg/log2") == b"".join(bytes(p) for p in pieces[:300])


def test_read_bad_ranges_and_missing_files(storage):
    storage.replace("f", b"abc")
    for start, end in [(-1, None), (2, 1), (1.5, None)]:
        with pytest.raises(InvalidConfigError):
            storage.read("f", start, end)
    for call in (lambda: storage.read("missing"), lambda: storage.read("missing", 1, 1),
                 lambda: storage.read("missing", 5, 9), lambda: storage.size("missing"),
                 lambda: storage.mtime("missing"), lambda: storage.size("d/missing")):
        with pytest.raises(StorageNotFoundError) as info:
            call()
        assert "missing" in str(info.value)
        assert isinstance(info.value, FileNotFoundError) and isinstance(info.value, KafkaStorageError)


def test_listing(storage):
    for path, data in [("t-0/00000000000000000000.log", b"x" * 10), ("t-0/00000000000000000000.index", b""),
                       ("t-0/leader-epoch-checkpoint", b"ab"), ("t-0/sub/deeper", b"1"),
                       ("t-1/a", b"1"), ("top", b"123")]:
        storage.replace(path, data)
    listed = storage.list("t-0")
    assert [f[:2] for f in listed] == [FileInfo("00000000000000000000.index", 0)[:2],
                                       FileInfo("00000000000000000000.log", 10)[:2],
                                       FileInfo("leader-epoch-checkpoint", 2)[:2]]
    # the modification time where the listing tells it: the storage's own clock
    for f in listed:
        assert f.mtime is None or abs(f.mtime - storage.mtime(f"t-0/{f.name}")) < 1.0
    assert storage.list("t-0/") == storage.list("t-0")
    assert storage.list_dirs("t-0") == ["sub"]
    assert storage.list_dirs("") == ["t-0", "t-1"]
    assert [f[:2] for f in storage.list("")] == [("top", 3)]
    assert storage.list("nope") == [] and storage.list_dirs("nope") == []
    assert storage.list("t-0/sub/deeper/x") == []
    assert storage.exists("top") and storage.exists("t-0/sub/deeper")
    assert not storage.exists("t-0") and not storage.exists("t-0/sub") and not storage.exists("zzz")


def test_mtime(storage):
    before = time.time()
    storage.replace("f", b"1")
    assert before - 60 < storage.mtime("f") < time.time() + 60  # S3 has 1 s resolution, own clock


# -- writes ---------------------------------------------------------------------------------------

def test_replace_overwrites_whole_file(backend, storage):
    storage.replace("d/f", b"first version, quite long")
    storage.replace("d/f", b"second")
    assert storage.read("d/f") == b"second"
    assert [f[:2] for f in storage.list("d")] == [("f", 6)]
    if backend.name == "local":
        assert os.listdir(Path(backend.storage.root) / "d") == ["f"]  # no temp file left


def test_create_if_absent_conflict_keeps_original(storage):
    storage.create_if_absent("p/epoch", b"writer-1")
    with pytest.raises(AlreadyExistsError) as info:
        storage.create_if_absent("p/epoch", b"writer-2")
    assert isinstance(info.value, FileExistsError) and "p/epoch" in str(info.value)
    assert storage.read("p/epoch") == b"writer-1"
    assert storage.list("p") == [FileInfo("epoch", 8)]
    storage.replace("p/epoch", b"w3")
    assert storage.read("p/epoch") == b"w3"
    storage.create_if_absent("p/empty", b"")
    with pytest.raises(AlreadyExistsError):
        storage.create_if_absent("p/empty", b"x")


def test_create_in_place_is_exclusive_on_every_backend(backend, storage):
    """A segment's indexes (docs/protocol.md §3): created only if absent, in a new directory
    too, and a conflict keeps the original; local disk writes them without a temp file."""
    storage.create_in_place("d/sub/0.index", b"abc")
    assert storage.read("d/sub/0.index") == b"abc"
    with pytest.raises(AlreadyExistsError) as info:
        storage.create_in_place("d/sub/0.index", b"other")
    assert "d/sub/0.index" in str(info.value)
    assert storage.read("d/sub/0.index") == b"abc"
    storage.create_in_place("d/sub/1.index", b"")
    assert storage.list("d/sub") == [FileInfo("0.index", 3), FileInfo("1.index", 0)]
    if backend.name == "local":
        batch = storage.sync_batch()
        batch.wrap(lambda: storage.create_in_place("d/2.index", b"xy"))()
        assert [os.path.basename(f) for f in batch.files] == ["2.index"]   # synced with it
        batch.sync()
        assert not [n for n in os.listdir(os.path.join(backend.url, "d")) if "tmp" in n]


def test_create_segment_makes_all_its_files_or_none_on_every_backend(backend, storage):
    """A segment's three files in one call (docs/protocol.md §3): in a new directory, the
    ``.log`` from its pieces; a name already taken fails the call and removes what it made."""
    files = [("0.timeindex", b"t"), ("0.index", b"ix"), ("0.log", [b"ab", b"", b"cd"])]
    storage.create_segment("d/seg", files)
    assert storage.list("d/seg") == [FileInfo("0.index", 2), FileInfo("0.log", 4),
                                     FileInfo("0.timeindex", 1)]
    assert storage.read("d/seg/0.log") == b"abcd"
    storage.create_if_absent("d/seg/9.log", b"someone else's")
    with pytest.raises(AlreadyExistsError) as info:
        storage.create_segment("d/seg", [("9.timeindex", b"t"), ("9.index", b"i"),
                                         ("9.log", [b"new"])])
    assert "d/seg/9.log" in str(info.value)
    assert storage.read("d/seg/9.log") == b"someone else's"
    assert {f.name for f in storage.list("d/seg")} == {"0.index", "0.log", "0.timeindex",
                                                       "9.log"}
    if backend.name == "local":
        assert not [n for n in os.listdir(os.path.join(backend.url, "d", "seg")) if "tmp" in n]
        batch = storage.sync_batch()   # inside a SyncBatch job: synced with the batch
        batch.wrap(lambda: storage.create_segment("d/seg", [("5.index", b"i"),
                                                            ("5.log", [b"x"])]))()
        assert [os.path.basename(f) for f in batch.files] == ["5.index", "5.log"]
        batch.sync()


def test_create_segment_fails_whole_when_a_write_fails(tmp_path, monkeypatch):
    """A failure after the indexes (the disk full while the ``.log`` is written) leaves no file
    and no temp file behind, and the error is the storage's, naming the directory."""
    st = open_storage(str(tmp_path / "root"))
    real = os.link

    def no_space(*args, **kw):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(os, "link", no_space)
    with pytest.raises(KafkaStorageError, match="No space left.*d/seg|d/seg.*No space left"):
        st.create_segment("d/seg", [("0.index", b"i"), ("0.log", [b"abc"])])
    monkeypatch.setattr(os, "link", real)
    assert os.listdir(tmp_path / "root" / "d" / "seg") == []


def test_a_batch_past_the_syncfs_threshold_writes_back_early_and_stops(tmp_path, monkeypatch):
    """Past SYNCFS_FILES files a SyncBatch flushes on a thread of its own while files are still
    added (``_flush_early``); ``sync`` stops it and still ends with its own barrier; a batch
    nobody syncs (a write that failed) lets the thread end by itself; few files start none."""
    import pyspark_kafkalog.storage.local as local
    import pyspark_kafkalog.storage.local_sync as local_sync
    calls = []
    real = local_sync.syncfs

    def counting(path):
        calls.append(threading.current_thread().name)
        time.sleep(0.01)
        return real(path)
    monkeypatch.setattr(local_sync, "syncfs", counting)
    monkeypatch.setattr(local.SyncBatch, "EARLY_FLUSH", True)
    st = open_storage(str(tmp_path / "root"))

    def segments(batch, first, n):
        for i in range(first, first + n):
            batch.wrap(lambda: st.create_segment(f"t-{i}", [("0.index", b"i"),
                                                            ("0.log", [b"x" * 100])]))()
            time.sleep(0.002)
    batch = st.sync_batch()
    segments(batch, 0, 20)
    assert batch._flusher is None and not calls          # 40 files: a fsync each, later
    segments(batch, 20, 60)
    assert batch._flusher is not None
    batch.sync()
    assert not batch._flusher.is_alive()
    assert "kafkalog-early-flush" in calls and calls[-1] == threading.current_thread().name
    abandoned = st.sync_batch()
    segments(abandoned, 100, 40)
    abandoned._flusher.join(timeout=10)                  # nothing more is added: it ends
    assert not abandoned._flusher.is_alive()
    monkeypatch.setattr(local.SyncBatch, "EARLY_FLUSH", False)
    off = st.sync_batch()
    segments(off, 200, 40)
    assert off._flusher is None
    off.sync()


def test_create_if_absent_threads_one_winner(storage):
    results = {}
    barrier = threading.Barrier(8)

    def attempt(i):
        barrier.wait()
        try:
            storage.create_if_absent("race", f"t{i}".encode())
            results[i] = "won"
        except AlreadyExistsError:
            results[i] = "lost"

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [i for i, r in results.items() if r == "won"]
    assert len(results) == 8 and len(winners) == 1
    assert storage.read("race") == f"t{winners[0]}".encode()


_CREATE_CHILD = r"""
import json, sys
from pyspark_kafkalog.errors import AlreadyExistsError
from pyspark_kafkalog.storage import open_storage
storage = open_storage(sys.argv[1], **json.loads(sys.argv[2]))
ident = sys.argv[3].encode()
storage.exists("warm-up")  # connect before the race, not during it
print("ready", flush=True)
for line in sys.stdin:
    try:
        storage.create_if_absent(line.strip(), ident * 1000)
        print("won", flush=True)
    except AlreadyExistsError:
        print("lost", flush=True)
    except Exception as e:
        print("error", type(e).__name__, str(e).replace("\n", " "), flush=True)
"""


@pytest.mark.slow
def test_create_if_absent_processes_one_winner(backend, storage):
    """8 real processes race on each of 10 paths: exactly one wins, its content is what is stored."""
    if not storage.guarantees.multi_process:
        pytest.skip(f"{backend.name} storage is not shared between processes")
    procs = [subprocess.Popen([sys.executable, "-c", _CREATE_CHILD, backend.url, json.dumps(backend.options),
                               f"w{i}"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              env=_child_env(), cwd=REPO) for i in range(8)]
    try:
        for p in procs:
            assert p.stdout.readline().strip() == "ready"
        for r in range(10):
            path = f"race/{r}/marker"
            for p in procs:  # all children are blocked on stdin: this releases them together
                p.stdin.write(path + "\n")
                p.stdin.flush()
            results = [p.stdout.readline().strip() for p in procs]
            assert sorted(results) == ["lost"] * 7 + ["won"], results
            assert storage.read(path) == f"w{results.index('won')}".encode() * 1000
    finally:
        for p in procs:
            p.stdin.close()
        for p in procs:
            p.wait(10)


def test_replace_many_replaces_each_file_whole(backend, storage):
    """Every backend: each file gets its new content; on local disk past the one-barrier
    threshold too, and without a temp file left behind."""
    n = 70 if backend.name == "local" else 5
    storage.replace_many({f"d{i}/f": b"old" for i in range(n)})
    storage.replace_many({f"d{i}/f": b"new %d" % i for i in range(n)})
    assert [storage.read(f"d{i}/f") for i in range(n)] == [b"new %d" % i for i in range(n)]
    assert all([x.name for x in storage.list(f"d{i}")] == ["f"] for i in range(n))
    if backend.name == "local":
        assert not [f for _, _, fs in os.walk(storage.root) for f in fs if ".tmp-" in f]


def test_replace_many_on_local_disk_renames_only_after_every_temp_was_written(tmp_path,
                                                                            monkeypatch):
    """A failure while writing the temp files renames nothing: every target keeps its old
    content, and no temp file is left."""
    storage = LocalStorage(str(tmp_path / "r"))
    storage.replace_many({f"d{i}/f": b"old" for i in range(80)})
    real, calls = storage._write_temp, []

    def failing(full, data, sync=True):
        calls.append(full)
        if len(calls) == 50:
            raise OSError(28, "No space left on device")
        return real(full, data, sync)
    monkeypatch.setattr(storage, "_write_temp", failing)
    with pytest.raises(Exception, match="No space left"):
        storage.replace_many({f"d{i}/f": b"new" for i in range(80)})
    assert {storage.read(f"d{i}/f") for i in range(80)} == {b"old"}
    assert not [f for _, _, fs in os.walk(tmp_path / "r") for f in fs if ".tmp-" in f]


def test_concurrent_readers_never_see_partial_replace(storage):
    versions = [bytes([i]) * (50_000 + i * 7_000) for i in range(4)]
    storage.replace("f", versions[0])
    stop = threading.Event()
    bad = []

    def reader():
        while not stop.is_set():
            data = storage.read("f")
            if data not in versions:
                bad.append(len(data))

    readers = [threading.Thread(target=reader) for _ in range(2)]
    for t in readers:
        t.start()
    deadline = time.monotonic() + 0.7
    i = 0
    while time.monotonic() < deadline:
        i += 1
        storage.replace("f", versions[i % 4])
    stop.set()
    for t in readers:
        t.join()
    assert not bad


def test_append(storage):
    if not storage.guarantees.append:
        storage.replace("log", b"abc")
        with pytest.raises(UnsupportedOperationError):
            storage.append("log", b"def")
        assert storage.read("log") == b"abc"
        return
    storage.append("d/log", b"abc")  # creates
    storage.append("d/log", b"def")
    storage.append("d/log", b"")
    assert storage.read("d/log") == b"abcdef" and storage.list("d") == [FileInfo("log", 6)]


def test_truncate(storage):
    data = bytes(range(100))
    storage.replace("seg", data)
    storage.truncate("seg", 40)
    assert storage.read("seg") == data[:40] and storage.size("seg") == 40
    storage.truncate("seg", 40)
    assert storage.read("seg") == data[:40]
    with pytest.raises(InvalidConfigError):
        storage.truncate("seg", 41)
    with pytest.raises(InvalidConfigError):
        storage.truncate("seg", -1)
    with pytest.raises(StorageNotFoundError):
        storage.truncate("missing", 0)
    storage.truncate("seg", 0)
    assert storage.read("seg") == b""
    if storage.guarantees.append:  # appends continue at the new end
        storage.append("seg", b"xy")
        assert storage.read("seg") == b"xy"


def test_delete(storage):
    for p in ("a/1", "a/2", "a/b/3", "c"):
        storage.replace(p, p.encode())
    storage.delete("c")
    storage.delete("c")  # missing is fine by default
    with pytest.raises(StorageNotFoundError):
        storage.delete("c", missing_ok=False)
    storage.delete_many(["a/1", "a/missing"])
    assert storage.list("a") == [FileInfo("2", 3)]
    storage.delete_many([])
    storage.replace("ab", b"not under a/")
    storage.delete_tree("a")
    storage.delete_tree("a")
    assert storage.list("a") == [] and storage.list_dirs("a") == [] and not storage.exists("a/b/3")
    assert storage.read("ab") == b"not under a/"
    with pytest.raises(InvalidConfigError):
        storage.delete_tree("")


def test_makedirs(storage):
    storage.makedirs("x/y")
    storage.makedirs("x/y")
    storage.replace("x/y/f", b"1")
    assert storage.list_dirs("x") == ["y"]


BAD_PATHS = ["/etc/passwd", "../escape", "a/../../escape", "a/..", "a//b", ".", "a/./b", "a\\b",
             "*", "a/[x]", "nul\x00"]


def test_paths_cannot_escape_root(backend, storage, tmp_path):
    ops = [lambda p: storage.read(p), lambda p: storage.size(p), lambda p: storage.exists(p),
           lambda p: storage.mtime(p), lambda p: storage.create_if_absent(p, b"x"),
           lambda p: storage.replace(p, b"x"), lambda p: storage.append(p, b"x"),
           lambda p: storage.truncate(p, 0), lambda p: storage.delete(p), lambda p: storage.list(p),
           lambda p: storage.list_dirs(p), lambda p: storage.delete_tree(p), lambda p: storage.makedirs(p),
           lambda p: storage.delete_many([p]), lambda p: storage.cleanup_temp_files(p, 0)]
    for path in BAD_PATHS + [""]:
        for i, op in enumerate(ops):
            if path == "" and i in (9, 10, 12, 14):  # "" is the root directory, fine to list
                continue
            with pytest.raises(InvalidConfigError):
                op(path)
    for bad in (None, 3, b"bytes"):
        with pytest.raises(InvalidConfigError):
            storage.read(bad)
    if backend.name == "local":
        assert sorted(os.listdir(tmp_path)) == ["root"] and not os.listdir(tmp_path / "root")
    assert storage.list("") == [] and storage.list_dirs("") == []


# -- temp files -----------------------------------------------------------------------------------

def test_temp_files_hidden_and_cleaned(backend, storage):
    assert Storage.is_temp_name(".00000000000000000000.log.tmp-0123456789abcdef")
    assert Storage.is_temp_name("dir/.x.tmp-0123456789abcdef")
    for name in ("x.tmp-0123456789abcdef", ".x.tmp-0123", ".x.tmp-0123456789ABCDEF", "x", ".x"):
        assert not Storage.is_temp_name(name), name
    storage.replace("p/real", b"1")
    leftover = ".real.tmp-00112233445566ff"
    if backend.name == "local":  # what a writer killed before publishing leaves behind
        (Path(storage.root) / "p" / leftover).write_bytes(b"partial")
    else:
        storage.replace(f"p/{leftover}", b"partial")
    assert storage.list("p") == [FileInfo("real", 1)]
    assert storage.cleanup_temp_files("p", older_than_s=3600) == []  # may be a live writer's
    assert storage.cleanup_temp_files("p", older_than_s=0) == [leftover]
    assert storage.cleanup_temp_files("p", older_than_s=0) == []
    assert storage.list("p") == [FileInfo("real", 1)]
    assert storage.cleanup_temp_files("missing", 0) == []
    with pytest.raises(InvalidConfigError):
        storage.cleanup_temp_files("p", -1)
    if backend.name == "local":
        assert os.listdir(Path(storage.root) / "p") == ["real"]


def test_storage_pickles(backend, storage):
    storage.replace("f", b"shared")
    clone = pickle.loads(pickle.dumps(storage))
    assert clone.url == storage.url and clone.guarantees == storage.guarantees
    assert clone.read("f") == b"shared"


# -- local specifics: kill -9 ---------------------------------------------------------------------

_KILL_CHILD = r"""
import hashlib, random, struct, sys
from pyspark_kafkalog.storage import open_storage
storage = open_storage(sys.argv[1])
seed = int(sys.argv[2])
rng = random.Random(seed)
def version(i):
    n = rng.randint(0, 400_000)
    body = struct.pack(">QI", i, n) + rng.randbytes(n)
    return body + hashlib.sha256(body).digest()
i = 0
while True:
    storage.replace("state", version(i))
    if i == 0:
        print("ready", flush=True)
    storage.create_if_absent(f"created/{seed}-{i}", version(i))
    i += 1
"""


def _check_version(data: bytes) -> None:
    assert len(data) >= 12 + 32, len(data)
    _, n = struct.unpack(">QI", data[:12])
    assert len(data) == 12 + n + 32, (len(data), n)
    assert hashlib.sha256(data[:-32]).digest() == data[-32:]


def test_kill9_during_writes_never_leaves_partial_file(tmp_path):
    """A writer SIGKILLed at random moments: 'state' and every created file is always whole."""
    root = tmp_path / "root"
    storage = open_storage(str(root))  # fsync on, as in production: slower writes, wider windows
    rng = random.Random(7)
    leftovers = 0
    for seed in range(12):
        child = subprocess.Popen([sys.executable, "-c", _KILL_CHILD, str(root), str(seed)],
                                 stdout=subprocess.PIPE, text=True, env=_child_env(), cwd=REPO)
        assert child.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.0, 0.12))
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
        child.stdout.close()
        _check_version(storage.read("state"))
        for f in storage.list("created"):
            _check_version(storage.read(f"created/{f.name}"))
        leftovers += sum(Storage.is_temp_name(n) for d in (root, root / "created") if d.exists()
                         for n in os.listdir(d))
    assert storage.list("") == [FileInfo("state", storage.size("state"))]
    storage.cleanup_temp_files("", 0)
    storage.cleanup_temp_files("created", 0)
    raw = os.listdir(root) + os.listdir(root / "created")
    assert not [n for n in raw if n.startswith(".")], raw
    print(f"temp files left by killed writers (then cleaned): {leftovers}")


def test_local_create_falls_back_without_hard_links(tmp_path, monkeypatch):
    storage = open_storage(f"file://{tmp_path}/root", fsync=False)
    assert isinstance(storage, LocalStorage) and storage.guarantees.atomic_create_if_absent

    def no_link(src, dst):
        raise OSError(1, "Operation not permitted")  # EPERM, as FAT or some FUSE mounts answer

    monkeypatch.setattr(os, "link", no_link)
    storage.create_if_absent("a/f", b"data")
    with pytest.raises(AlreadyExistsError):
        storage.create_if_absent("a/f", b"other")
    assert storage.read("a/f") == b"data" and os.listdir(tmp_path / "root" / "a") == ["f"]
    assert not storage.guarantees.atomic_create_if_absent


def test_local_errors_are_wrapped_with_path(tmp_path):
    storage = open_storage(str(tmp_path))
    storage.makedirs("dir")
    with pytest.raises(KafkaStorageError, match="dir"):
        storage.read("dir")
    storage.replace("file", b"1")
    for op in (storage.replace, storage.append, storage.create_if_absent):
        with pytest.raises(KafkaStorageError, match="file/x") as info:
            op("file/x", b"1")  # a file where a directory should be
        assert not isinstance(info.value, AlreadyExistsError)  # not a lost race
    assert storage.read("file") == b"1"


# -- open_storage -----------------------------------------------------------------------------------

def test_open_storage_urls(tmp_path, monkeypatch):
    a = open_storage(f"file://{tmp_path}/a")
    assert isinstance(a, LocalStorage) and a.url == f"file://{tmp_path}/a" and (tmp_path / "a").is_dir()
    monkeypatch.chdir(tmp_path)
    b = open_storage("rel/dir", fsync=False)
    assert b.url == f"file://{tmp_path}/rel/dir" and (tmp_path / "rel" / "dir").is_dir()
    assert not b.guarantees.durable_on_return and a.guarantees.durable_on_return
    name = f"m-{uuid.uuid4().hex}"
    m1, m2 = open_storage(f"memory://{name}"), open_storage(f"memory://{name}", fsync=False)
    m1.replace("f", b"1")
    assert m2.read("f") == b"1" and not open_storage(f"memory://{name}-other").exists("f")
    m1.delete("f")
    for url, opts in [("memory://", {}), ("s3://", {}), ("file://otherhost/x", {}), ("", {}),
                      ("nosuchproto://x", {}), (str(tmp_path), {"bogus": 1}), ("memory://x", {"bogus": 1})]:
        with pytest.raises(InvalidConfigError):
            open_storage(url, **opts)


def test_generic_fsspec_backend_claims_nothing_and_refuses_create():
    from pyspark_kafkalog.storage.fsspec_backends import FsspecStorage
    fs = open_storage(f"memory://g-{uuid.uuid4().hex}").fs
    generic = FsspecStorage(fs, f"/generic-{uuid.uuid4().hex}", "memory://generic")
    assert not any(v for k, v in vars(generic.guarantees).items() if k != "multi_process")
    with pytest.raises(UnsupportedOperationError):
        generic.create_if_absent("f", b"1")
    with pytest.raises(UnsupportedOperationError):
        generic.append("f", b"1")
    generic.replace("d/f", b"12345")
    generic.truncate("d/f", 2)
    assert generic.read("d/f") == b"12" and generic.list("d") == [FileInfo("f", 2)]
    generic.delete_tree("d")
    assert generic.list("d") == []


# -- one durability barrier for a flush's files (issue #18) ------------------------------------

def _count_fsyncs(monkeypatch):
    """Every fsync as the path it synced (via /proc/self/fd)."""
    synced = []
    real = os.fsync

    def fsync(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        return real(fd)
    monkeypatch.setattr(os, "fsync", fsync)
    return synced


@pytest.mark.parametrize("syncfs_past", [1000, 0])
def test_sync_batch_makes_a_flushes_files_durable_together(tmp_path, monkeypatch, syncfs_past):
    """Inside a SyncBatch job, creates and spool publishes skip their own fsyncs; sync() then
    fsyncs every file and each directory once (or one syncfs past SYNCFS_FILES files). Outside
    a wrapped job, and on other threads, every create still syncs on its own."""
    import threading
    from pyspark_kafkalog.storage.local import LocalStorage, SyncBatch
    monkeypatch.setattr(SyncBatch, "SYNCFS_FILES", syncfs_past)
    st = LocalStorage(str(tmp_path / "root"), direct_io=False)
    for d in ("a", "b"):
        os.makedirs(tmp_path / "root" / d)
    synced = _count_fsyncs(monkeypatch)
    batch = st.sync_batch()
    outside = []

    def job(d):
        def run():
            st.create_if_absent(f"{d}/0.index", b"i" * 10)
            spool = st.open_spool(d, "spool.log", 4)
            spool.append([b"hdr!", b"body"])
            spool.publish(f"{d}/0.log", [(0, b"HDR!")])
            # another thread meanwhile is not part of the batch: it syncs as ever
            t = threading.Thread(target=lambda: outside.append(
                st.create_if_absent(f"{d}/other", b"x")))
            t.start()
            t.join()
        return run
    for d in ("a", "b"):
        batch.wrap(job(d))()
    # nothing of the batch's files was synced; the other thread's file (its temp, then its
    # directory) was, as ever
    assert [p for p in synced if "other" not in p and not p.endswith(("/a", "/b"))] == []
    assert sum("other" in p for p in synced) == 2
    del synced[:]
    batch.sync()
    root = str(tmp_path / "root")
    if syncfs_past:
        assert sorted(synced) == sorted([f"{root}/a/0.index", f"{root}/a/0.log",
                                         f"{root}/b/0.index", f"{root}/b/0.log",
                                         f"{root}/a", f"{root}/b"])
    else:
        assert synced == []   # one syncfs instead
    assert st.read("a/0.log") == b"HDR!body" and st.read("b/0.index") == b"i" * 10
    assert LocalStorage(root, fsync=False).sync_batch() is None
