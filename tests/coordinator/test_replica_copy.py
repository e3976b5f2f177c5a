"""Copying a sealed segment from a leader replica to a follower (coordinator/copier.py).

Real files, the Kafka-written golden corpus, a real moto S3 server (the session fixture of
test_storage) and a real SIGKILL: a copy is published whole and checked, or not at all.
"""
from __future__ import annotations

import errno
import logging
import os
import signal
import subprocess
import sys
import time
import uuid

import boto3
import pytest

from support.golden import GOLDEN, expected_records
from pyspark_kafkalog.coordinator.copier import (SegmentCopy, copy_partition_metadata, copy_segment,
                                                 copy_segments)
from pyspark_kafkalog.errors import (AlreadyExistsError, CorruptRecordError, InvalidConfigError,
                                     KafkaStorageError, StorageNotFoundError)
from pyspark_kafkalog.format.batch import scan_entries
from pyspark_kafkalog.format.encode import encode_batch_v2
from pyspark_kafkalog.format.records import Record
from pyspark_kafkalog.storage import LocalStorage, open_storage
from pyspark_kafkalog.storage import local as local_mod
from pyspark_kafkalog.storage.mounts import MountedStorage
from support.shared_paths import needs_golden
from support.moto_support import BUCKET, REPO, _child_env, moto_options  # noqa: F401  (session fixture)

TOPIC = "t-0"
LOG = f"{0:020d}.log"


def _segment(n_batches: int, *, records: int = 4, value_bytes: int = 100, epoch: int = 5,
             base: int = 0) -> bytes:
    out, offset = [], base
    for i in range(n_batches):
        recs = [Record(b"k%d" % j, os.urandom(value_bytes), 1_700_000_000_000 + j)
                for j in range(records)]
        b = encode_batch_v2(recs, base_offset=offset, partition_leader_epoch=epoch)
        out.append(b.data)
        offset = b.last_offset + 1
    return b"".join(out)


def _write_src(st, data: bytes, base: int = 0, index: bytes = b"\0" * 8) -> None:
    st.replace(f"{TOPIC}/{base:020d}.log", data)
    st.replace(f"{TOPIC}/{base:020d}.index", index)
    st.replace(f"{TOPIC}/{base:020d}.timeindex", b"")


def _positions(data: bytes) -> list:
    return [h.position for h in scan_entries(data)]


@pytest.fixture
def local(tmp_path):
    return LocalStorage(str(tmp_path / "leader"), fsync=False), LocalStorage(str(tmp_path / "follower"), fsync=False)


def _no_temp_files(st, dir_path=TOPIC) -> bool:
    return st._list_temp_files(dir_path) == []


# -- local to local -------------------------------------------------------------------------------

@needs_golden
@pytest.mark.parametrize("case", ["m0-gzip-notime-0", "m0-none-notime-0", "m1-lz4-create-0",
                                  "m1-none-logappend-0", "m2-zstd-create-0", "txn-v2-none-0",
                                  "mixed-v1-to-v2-lz4-0"])
def test_golden_segments_copy_byte_identical(case, tmp_path):
    src, dst = open_storage(str(GOLDEN)), LocalStorage(str(tmp_path / "f"), fsync=False)
    bases = sorted(int(p.name[:20]) for p in (GOLDEN / case).glob("*.log"))
    ends = bases[1:] + [expected_records(case)[-1]["offset"] + 1]
    for base, end in zip(bases, ends):
        got = copy_segment(src, case, dst, "copy", base, end_offset=end, chunk_bytes=4096)
        size = (GOLDEN / case / f"{base:020d}.log").stat().st_size
        assert got == SegmentCopy(base, end, size, "streamed")
        for suffix in (".log", ".index", ".timeindex"):
            name = f"{base:020d}{suffix}"
            assert (tmp_path / "f" / "copy" / name).read_bytes() == (GOLDEN / case / name).read_bytes()
    copy_partition_metadata(src, case, dst, "copy")
    assert (tmp_path / "f/copy/partition.metadata").read_bytes() == (GOLDEN / case / "partition.metadata").read_bytes()
    assert _no_temp_files(dst, "copy")


@pytest.mark.parametrize("chunk", [1, 17, 61, 1000, 1 << 20])
def test_chunk_boundaries(local, chunk):
    src, dst = local
    data = _segment(6 if chunk == 1 else 60, records=3, base=100)
    _write_src(src, data, base=100)
    got = copy_segment(src, TOPIC, dst, TOPIC, 100, chunk_bytes=chunk, leader_epoch=5)
    assert got == SegmentCopy(100, 100 + 3 * (6 if chunk == 1 else 60), len(data), "streamed")
    assert dst.read(f"{TOPIC}/{100:020d}.log") == data


def test_batches_bigger_than_chunks_are_checked_whole(local):
    src, dst = local
    data = _segment(3, records=2, value_bytes=50_000)
    _write_src(src, data)
    bad = bytearray(data)
    bad[_positions(data)[2] + 2000] ^= 1
    src.replace(f"{TOPIC}/{LOG}", bytes(bad))
    with pytest.raises(CorruptRecordError) as e:
        copy_segment(src, TOPIC, dst, TOPIC, 0, chunk_bytes=4096)
    assert e.value.position == _positions(data)[2]


# -- checks ---------------------------------------------------------------------------------------

def _assert_nothing_published(dst):
    assert not dst.exists(f"{TOPIC}/{LOG}")
    assert all(not f.name.endswith(".log") for f in dst.list(TOPIC))
    assert _no_temp_files(dst)


def test_corrupt_batch_publishes_no_log(local, tmp_path):
    src, dst = local
    data = _segment(40)
    _write_src(src, data)
    at = _positions(data)[23]
    bad = bytearray(data)
    bad[at + 100] ^= 0x40          # inside the records: only the CRC sees it
    src.replace(f"{TOPIC}/{LOG}", bytes(bad))
    with pytest.raises(CorruptRecordError) as e:
        copy_segment(src, TOPIC, dst, TOPIC, 0, chunk_bytes=999)
    assert e.value.position == at
    assert src._where(f"{TOPIC}/{LOG}") in str(e.value) and f"position {at}" in str(e.value)
    _assert_nothing_published(dst)
    assert not any(n.endswith(".log") or ".log.tmp-" in n for n in os.listdir(tmp_path / "follower" / TOPIC))


@pytest.mark.parametrize("kwargs, base, what", [
    ({}, 1, "expected to start at 1"),
    ({"leader_epoch": 6}, 0, "leader epoch 5, expected 6"),
    ({"end_offset": 50}, 0, "expected end offset 50"),
])
def test_metadata_mismatch_is_refused(local, kwargs, base, what):
    src, dst = local
    data = _segment(20)          # offsets 0..79, epoch 5
    src.replace(f"{TOPIC}/{base:020d}.log", data)
    with pytest.raises(CorruptRecordError, match=what):
        copy_segment(src, TOPIC, dst, TOPIC, base, **kwargs)
    assert dst.list(TOPIC) == [] and _no_temp_files(dst)


def test_gap_and_torn_tail_are_refused(local):
    src, dst = local
    gap = _segment(2) + _segment(2, base=9)          # 0..7, then 9..16
    src.replace(f"{TOPIC}/{LOG}", gap)
    with pytest.raises(CorruptRecordError, match="expected to start at 8"):
        copy_segment(src, TOPIC, dst, TOPIC, 0, chunk_bytes=100)
    torn = _segment(5)
    src.replace(f"{TOPIC}/{LOG}", torn[:-10])
    with pytest.raises(CorruptRecordError, match="torn entry"):
        copy_segment(src, TOPIC, dst, TOPIC, 0, chunk_bytes=100)
    # a length field that claims more than the file holds is refused at once, not buffered
    huge = bytearray(torn)
    huge[_positions(torn)[1] + 8:_positions(torn)[1] + 12] = (1 << 30).to_bytes(4, "big")
    src.replace(f"{TOPIC}/{LOG}", bytes(huge))
    with pytest.raises(CorruptRecordError, match="torn entry") as e:
        copy_segment(src, TOPIC, dst, TOPIC, 0, chunk_bytes=100)
    assert e.value.position == _positions(torn)[1]
    assert dst.list(TOPIC) == [] and _no_temp_files(dst)


# -- an earlier copy at the destination --------------------------------------------------------------

def test_existing_identical_copy_counts(local):
    src, dst = local
    data = _segment(30)
    _write_src(src, data)
    first = copy_segment(src, TOPIC, dst, TOPIC, 0, chunk_bytes=1000)
    again = copy_segment(src, TOPIC, dst, TOPIC, 0, chunk_bytes=1000)
    assert first.mode == "streamed" and again == SegmentCopy(0, 120, len(data), "existing")


@pytest.mark.parametrize("damage", ["flip", "prefix", "longer"])
def test_existing_different_copy_is_replaced(local, damage, caplog):
    src, dst = local
    data = _segment(30)
    _write_src(src, data)
    stale = {"flip": data[:500] + bytes([data[500] ^ 1]) + data[501:], "prefix": data[:777],
             "longer": data + b"xx"}[damage]
    dst.replace(f"{TOPIC}/{LOG}", stale)
    dst.replace(f"{TOPIC}/{0:020d}.index", b"\1" * 8)
    with caplog.at_level(logging.WARNING, logger="pyspark_kafkalog.coordinator.copier"):
        got = copy_segment(src, TOPIC, dst, TOPIC, 0, chunk_bytes=1000)
    assert got == SegmentCopy(0, 120, len(data), "streamed")
    assert dst.read(f"{TOPIC}/{LOG}") == data and dst.read(f"{TOPIC}/{0:020d}.index") == b"\0" * 8
    assert "replacing" in caplog.text
    assert _no_temp_files(dst)


def test_corrupt_source_never_replaces_an_existing_copy(local):
    src, dst = local
    data = _segment(10)
    _write_src(src, data)
    bad = bytearray(data)
    bad[_positions(data)[4] + 90] ^= 1
    src.replace(f"{TOPIC}/{LOG}", bytes(bad))
    dst.replace(f"{TOPIC}/{LOG}", data)
    with pytest.raises(CorruptRecordError):
        copy_segment(src, TOPIC, dst, TOPIC, 0, chunk_bytes=256)
    assert dst.read(f"{TOPIC}/{LOG}") == data


def test_partition_metadata(local):
    src, dst = local
    meta = b"version: 0\ntopic_id: 7cuph2amucMP7cuph2VDIQ\n"
    src.replace(f"{TOPIC}/partition.metadata", meta)
    assert copy_partition_metadata(src, TOPIC, dst, TOPIC) == "created"
    assert copy_partition_metadata(src, TOPIC, dst, TOPIC) == "existing"
    dst.replace(f"{TOPIC}/partition.metadata", b"version: 0\ntopic_id: AAAAAAAAAAAAAAAAAAAAAA\n")
    assert copy_partition_metadata(src, TOPIC, dst, TOPIC) == "replaced"
    assert dst.read(f"{TOPIC}/partition.metadata") == meta


# -- local to local in the kernel (LocalStorage.copy_from) -----------------------------------------

def _big_segment(base: int = 0) -> bytes:
    """Over ``KERNEL_COPY_MIN``, with an unaligned size (a tail past the last whole page)."""
    return _segment(6, records=2, value_bytes=150_000, base=base)


@pytest.fixture
def kernel(tmp_path):
    """A leader and a follower root whose ``copy_from`` copies in the kernel whatever the
    filesystem (on ext4 or tmpfs the default would stream)."""
    return (LocalStorage(str(tmp_path / "leader"), fsync=True),
            LocalStorage(str(tmp_path / "follower"), fsync=True, kernel_copy=True))


def test_kernel_copy_is_byte_identical_and_checked(kernel, monkeypatch):
    src, dst = kernel
    data = _big_segment(base=100)
    assert len(data) > local_mod.KERNEL_COPY_MIN and len(data) % 4096
    _write_src(src, data, base=100)
    got = copy_segment(src, TOPIC, dst, TOPIC, 100, end_offset=112, leader_epoch=5)
    assert got == SegmentCopy(100, 112, len(data), "server_side")
    assert dst.read(f"{TOPIC}/{100:020d}.log") == data
    assert dst.read(f"{TOPIC}/{100:020d}.index") == b"\0" * 8    # small: streamed
    assert _no_temp_files(dst)
    # the same again is an existing copy; a different one at the name is replaced, checked
    assert copy_segment(src, TOPIC, dst, TOPIC, 100, end_offset=112).mode == "existing"
    dst.replace(f"{TOPIC}/{100:020d}.log", data[:-1] + bytes([data[-1] ^ 1]))
    assert copy_segment(src, TOPIC, dst, TOPIC, 100, end_offset=112).mode == "server_side"
    assert dst.read(f"{TOPIC}/{100:020d}.log") == data and _no_temp_files(dst)


def test_kernel_copy_create_if_absent_and_replace(kernel, tmp_path):
    src, dst = kernel
    data = _big_segment()
    src.replace("a.log", data)
    assert dst.copy_from(src, "a.log", "d/b.log")
    assert dst.read("d/b.log") == data
    with pytest.raises(AlreadyExistsError):
        dst.copy_from(src, "a.log", "d/b.log")
    assert dst.read("d/b.log") == data
    other = bytes(reversed(data))
    src.replace("c.log", other)
    assert dst.copy_from(src, "c.log", "d/b.log", replace=True)
    assert dst.read("d/b.log") == other and _no_temp_files(dst, "d")
    # declined, nothing done: a small file, another kind of storage, kernel_copy=False
    src.replace("small.log", b"x" * 1000)
    assert not dst.copy_from(src, "small.log", "d/small.log") and not dst.exists("d/small.log")
    assert not dst.copy_from(open_storage("memory://kc-" + uuid.uuid4().hex), "a.log", "d/m.log")
    streaming = LocalStorage(str(tmp_path / "follower"), fsync=False, kernel_copy=False)
    assert not streaming.copy_from(src, "a.log", "d/n.log") and not dst.exists("d/n.log")
    with pytest.raises(StorageNotFoundError):
        dst.copy_from(src, "missing.log", "d/x.log")


def test_kernel_copy_of_a_corrupt_source_is_refused_and_nothing_stays(kernel, tmp_path):
    src, dst = kernel
    data = _big_segment()
    _write_src(src, data)
    bad = bytearray(data)
    at = _positions(data)[4]
    bad[at + 200_000] ^= 0x10        # inside the records: only the CRC sees it
    src.replace(f"{TOPIC}/{LOG}", bytes(bad))
    with pytest.raises(CorruptRecordError) as e:
        copy_segment(src, TOPIC, dst, TOPIC, 0, end_offset=12, leader_epoch=5)
    assert e.value.position == at and src._where(f"{TOPIC}/{LOG}") in str(e.value)
    _assert_nothing_published(dst)
    assert not any(".log" in n for n in os.listdir(tmp_path / "follower" / TOPIC))


def test_kernel_copy_that_fails_leaves_nothing(kernel, monkeypatch):
    src, dst = kernel
    data = _big_segment()
    src.replace("a.log", data)
    real = local_mod._kernel_copy

    def half_then_fail(sfd, dfd, start, end, where, **kw):
        real(sfd, dfd, start, (start + end) // 2, where, **kw)
        raise OSError(errno.EIO, "injected")
    monkeypatch.setattr(local_mod, "_kernel_copy", half_then_fail)
    with pytest.raises(KafkaStorageError, match="injected"):
        dst.copy_from(src, "a.log", "d/a.log")
    assert not dst.exists("d/a.log") and _no_temp_files(dst, "d")


@pytest.mark.parametrize("refuse", [["copy_file_range"], ["copy_file_range", "sendfile"]])
def test_kernel_copy_falls_back_when_the_kernel_refuses(kernel, monkeypatch, refuse):
    src, dst = kernel
    data = _big_segment()
    src.replace("a.log", data)
    for name in refuse:
        def refused(*a, _name=name):
            raise OSError(errno.EXDEV, f"{_name} refused")
        monkeypatch.setattr(os, name, refused)
    assert dst.copy_from(src, "a.log", "d/a.log")
    assert dst.read("d/a.log") == data and _no_temp_files(dst, "d")


def test_kernel_copy_of_a_source_that_shrank_is_an_error(tmp_path):
    (tmp_path / "s").write_bytes(b"y" * 10_000)
    sfd = os.open(tmp_path / "s", os.O_RDONLY)
    dfd = os.open(tmp_path / "d", os.O_WRONLY | os.O_CREAT)
    try:
        with pytest.raises(KafkaStorageError, match="ended at 10000 of 20000"):
            local_mod._kernel_copy(sfd, dfd, 0, 20_000, "s")
    finally:
        os.close(sfd)
        os.close(dfd)


# -- several segments at once (copy_segments, Kafka's num.replica.fetchers) -------------------------

@pytest.mark.parametrize("fetchers", [1, 4])
def test_copy_segments_in_order_up_to_the_first_failure(local, fetchers):
    src, dst = local
    bases, ends = [0, 20, 40, 60, 80], []
    for b in bases:
        data = _segment(5, base=b)                  # 20 offsets each
        _write_src(src, data, base=b)
        ends.append(b + 20)
    copies, error = copy_segments(src, TOPIC, dst, TOPIC, [(b, e, True) for b, e in zip(bases, ends)],
                                  fetchers=fetchers)
    assert error is None and [c.base_offset for c in copies] == bases
    assert [c.end_offset for c in copies] == ends and {c.mode for c in copies} == {"streamed"}
    # a damaged segment in the middle: the ones before it count, it and those after do not
    dst2 = LocalStorage(str(dst.root) + "-2", fsync=False)
    bad = bytearray(src.read(f"{TOPIC}/{40:020d}.log"))
    bad[150] ^= 1
    src.replace(f"{TOPIC}/{40:020d}.log", bytes(bad))
    copies, error = copy_segments(src, TOPIC, dst2, TOPIC, [(b, e, True) for b, e in zip(bases, ends)],
                                  fetchers=fetchers)
    assert [c.base_offset for c in copies] == [0, 20] and isinstance(error, CorruptRecordError)
    assert not dst2.exists(f"{TOPIC}/{40:020d}.log") and _no_temp_files(dst2)
    if fetchers == 1:                                 # one after the other: nothing past it
        assert not dst2.exists(f"{TOPIC}/{60:020d}.log")
    with pytest.raises(InvalidConfigError):
        copy_segments(src, TOPIC, dst2, TOPIC, [], fetchers=0)


def test_replicator_records_each_segment_copied_concurrently(tmp_path, monkeypatch):
    """num_replica_fetchers=4: every segment copied is recorded with its span, in order; a
    segment whose copy fails is not (nor any after it), and the pass says why."""
    import random

    from pyspark_kafkalog.admin import Admin
    from pyspark_kafkalog.cluster.lease import acquire, new_holder_id
    from pyspark_kafkalog.coordinator import copier
    from pyspark_kafkalog.coordinator.replicator import Replicator

    with pytest.raises(InvalidConfigError):
        Replicator(None, lambda: None, num_replica_fetchers=0)
    runs = {}
    for fail in (None, 2):
        admin = Admin(str(tmp_path / f"root{fail}"), fsync=False)
        admin.add_log_dir(str(tmp_path / f"second{fail}"))
        admin.cluster.placement_random = random.Random(0)
        admin.create_topic("t", 1, 2, {})
        for u in range(6):    # one segment per unit
            admin.produce("t", [Record(b"k", b"v%d" % i) for i in range(3)], partition=0,
                          acks="1")
        lease = acquire(admin.cluster, new_holder_id(), "127.0.0.1:1", 60_000)
        rep = Replicator(admin.cluster, lambda: lease.epoch, num_replica_fetchers=4)
        real = copier.copy_segment

        def copy(src, src_dir, dst, dst_dir, base, **kw):
            if fail is not None and base == 3 * fail:
                raise CorruptRecordError(f"injected at segment {base}", 0)
            return real(src, src_dir, dst, dst_dir, base, **kw)
        monkeypatch.setattr(copier, "copy_segment", copy)
        result = rep.tick()
        monkeypatch.undo()
        state = admin.cluster.state()
        rep_after = state.partition("t", 0).replication
        follower, = [r for r in state.topics["t"]["replicas"][0] if r != rep_after["leader"]]
        runs[fail] = (result, follower, rep_after)
    result, follower, rep_after = runs[None]
    assert result.ok and result.segments == 6
    assert [b for b, _ in result.copied[("t:0", follower)]] == [0, 3, 6, 9, 12, 15]
    assert rep_after["held"] == {follower: [[0, 18]]}
    result, follower, rep_after = runs[2]
    assert "injected at segment 6" in result.failures[f"t:0 {follower}"]
    assert [b for b, _ in result.copied[("t:0", follower)]] == [0, 3]
    assert result.progress["t:0"][follower] == [[0, 3], [3, 6]]
    assert rep_after["held"] == {follower: [[0, 6]]}


# -- S3 -------------------------------------------------------------------------------------------

@pytest.fixture
def s3(moto_options):  # noqa: F811
    made = []

    def new():
        st = open_storage(f"s3://{BUCKET}/r-{uuid.uuid4().hex}", **moto_options)
        made.append(st)
        return st
    yield new
    for st in made:
        st.delete_tree(TOPIC)


def _uploads(moto_options):  # noqa: F811
    client = boto3.client("s3", endpoint_url=moto_options["endpoint_url"], aws_access_key_id="testing",
                          aws_secret_access_key="testing", region_name="us-east-1")
    return client.list_multipart_uploads(Bucket=BUCKET).get("Uploads", [])


def test_local_to_s3_streams_multipart(local, s3, moto_options):  # noqa: F811
    src, _ = local
    dst = s3()
    data = _segment(12, records=2, value_bytes=400_000)       # ~9.6 MiB: two upload parts
    _write_src(src, data)
    got = copy_segment(src, TOPIC, dst, TOPIC, 0, chunk_bytes=1 << 20, leader_epoch=5)
    assert got == SegmentCopy(0, 24, len(data), "streamed")
    assert dst.read(f"{TOPIC}/{LOG}") == data and dst.read(f"{TOPIC}/{0:020d}.index") == b"\0" * 8
    assert copy_segment(src, TOPIC, dst, TOPIC, 0, chunk_bytes=1 << 20).mode == "existing"
    bad = bytearray(data)
    bad[_positions(data)[9] + 5000] ^= 1
    src.replace(f"{TOPIC}/{LOG}", bytes(bad))
    dst2 = s3()
    with pytest.raises(CorruptRecordError):
        copy_segment(src, TOPIC, dst2, TOPIC, 0, chunk_bytes=1 << 20)
    assert not dst2.exists(f"{TOPIC}/{LOG}") and _no_temp_files(dst2)
    assert not [u for u in _uploads(moto_options) if dst2.url.split("/", 3)[3] in u["Key"]]


def test_s3_to_s3_is_server_side_and_checked(s3, tmp_path):
    src, dst = s3(), s3()
    data = _segment(50)
    _write_src(src, data)
    got = copy_segment(src, TOPIC, dst, TOPIC, 0, leader_epoch=5)
    assert got == SegmentCopy(0, 200, len(data), "server_side")
    assert dst.read(f"{TOPIC}/{LOG}") == data and _no_temp_files(dst)
    assert copy_segment(src, TOPIC, dst, TOPIC, 0).mode == "existing"
    with pytest.raises(AlreadyExistsError):
        dst.copy_from(src, f"{TOPIC}/{LOG}", f"{TOPIC}/{LOG}")
    assert not dst.copy_from(LocalStorage(str(tmp_path)), "x", "y")
    dst.replace(f"{TOPIC}/{LOG}", data[:-1] + bytes([data[-1] ^ 1]))
    assert copy_segment(src, TOPIC, dst, TOPIC, 0).mode == "server_side"
    assert dst.read(f"{TOPIC}/{LOG}") == data
    # a damaged source: the server-side copy is checked under its temp name, never published
    bad = bytearray(data)
    bad[_positions(data)[7] + 70] ^= 1
    src.replace(f"{TOPIC}/{LOG}", bytes(bad))
    dst2 = s3()
    with pytest.raises(CorruptRecordError) as e:
        copy_segment(src, TOPIC, dst2, TOPIC, 0)
    assert src._where(f"{TOPIC}/{LOG}") in str(e.value) and e.value.position == _positions(data)[7]
    assert not dst2.exists(f"{TOPIC}/{LOG}") and _no_temp_files(dst2)


def test_s3_to_s3_with_known_end_passes_no_data_through_this_process(s3, monkeypatch):
    """Beyond Kafka: between two S3 log dirs the store copies, and equal store checksums (the
    MD5 ETag of a single-part object) prove the copy; not one byte of the .log is read here."""
    src, dst = s3(), s3()
    data = _segment(50)
    _write_src(src, data)
    reads = []
    for st in (src, dst):
        for name in ("read", "read_into", "map"):
            real = getattr(st, name)
            monkeypatch.setattr(st, name, lambda path, *a, _real=real, **k:
                                (reads.append(path), _real(path, *a, **k))[1])
    got = copy_segment(src, TOPIC, dst, TOPIC, 0, end_offset=200)
    assert got == SegmentCopy(0, 200, len(data), "server_side")
    assert not [p for p in reads if p.endswith(".log")]
    assert src.checksum(f"{TOPIC}/{LOG}") == dst.checksum(f"{TOPIC}/{LOG}") is not None
    assert copy_segment(src, TOPIC, dst, TOPIC, 0, end_offset=200).mode == "existing"
    assert not [p for p in reads if p.endswith(".log")]
    monkeypatch.undo()
    assert dst.read(f"{TOPIC}/{LOG}") == data


def test_mounted_log_dirs_copy_server_side(tmp_path, s3):
    a, b = s3(), s3()
    root = MountedStorage(LocalStorage(str(tmp_path / "root"), fsync=False),
                          {"logdir-1": a, "logdir-2": b}.get, local=["logdir-0"])
    data = _segment(10)
    root.replace(f"logdir-1/{TOPIC}/{LOG}", data)       # lands on a
    assert a.read(f"{TOPIC}/{LOG}") == data
    # through the per-root storages of the two log dirs
    got = copy_segment(root.mounted("logdir-1"), TOPIC, root.mounted("logdir-2"), TOPIC, 0)
    assert got.mode == "server_side" and b.read(f"{TOPIC}/{LOG}") == data
    # through the mounted storage itself, which routes both paths
    got = copy_segment(root, f"logdir-1/{TOPIC}", root, f"logdir-2/{TOPIC}-x", 0)
    assert got.mode == "server_side" and b.read(f"{TOPIC}-x/{LOG}") == data
    b.delete_tree(f"{TOPIC}-x")
    got = copy_segment(root, f"logdir-2/{TOPIC}", root, f"logdir-0/{TOPIC}", 0)
    assert got.mode == "streamed" and (tmp_path / "root/logdir-0" / TOPIC / LOG).read_bytes() == data


# -- a copier killed mid-copy ---------------------------------------------------------------------

_CHILD = """
import sys, time
from pyspark_kafkalog.storage import LocalStorage
from pyspark_kafkalog.coordinator.copier import copy_segment
src = LocalStorage(sys.argv[1], fsync=False)
dst = LocalStorage(sys.argv[2], fsync=False, kernel_copy=False)   # streamed, whatever the fs
read = src.read
def slow_read(path, start=0, end=None):
    time.sleep(0.002)
    return read(path, start, end)
src.read = slow_read
copy_segment(src, "t-0", dst, "t-0", 0, chunk_bytes=64 << 10)
print("done", flush=True)
"""


def test_sigkill_mid_copy_leaves_no_partial_log(tmp_path):
    src = LocalStorage(str(tmp_path / "leader"), fsync=False)
    data = _segment(160, records=2, value_bytes=50_000)       # 16 MiB: 250 slowed chunks
    _write_src(src, data)
    killed_mid = 0
    for round_, delay in enumerate([0.0, 0.1, 0.3]):
        out = tmp_path / f"follower{round_}"
        proc = subprocess.Popen([sys.executable, "-c", _CHILD, str(tmp_path / "leader"), str(out)],
                                env=_child_env(), cwd=str(REPO), stdout=subprocess.PIPE)
        deadline = time.monotonic() + 10
        while not any(".log.tmp-" in n for n in (os.listdir(out / TOPIC) if (out / TOPIC).is_dir() else [])):
            assert proc.poll() is None and time.monotonic() < deadline, "the copy never started"
            time.sleep(0.005)
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait(5)
        assert proc.returncode == -signal.SIGKILL
        dst = LocalStorage(str(out), fsync=False)
        final = out / TOPIC / LOG
        assert not final.exists() or final.read_bytes() == data
        killed_mid += not final.exists()
        assert LOG not in [f.name for f in dst.list(TOPIC)] or final.read_bytes() == data
        # the next coordinator finishes the job; the killed one's temp file is garbage
        assert copy_segment(src, TOPIC, dst, TOPIC, 0, chunk_bytes=1 << 20).bytes == len(data)
        assert final.read_bytes() == data
        dst.cleanup_temp_files(TOPIC, 0)
        assert _no_temp_files(dst)
    assert killed_mid, "no round was killed before the publish: the test proved nothing"
