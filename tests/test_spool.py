"""Spooled files: ``storage.local_spool.LocalSpool`` and ``LocalStorage.can_spool``.

A spool is a temp file written (through the page cache) while its content is produced, patched
at the end (``publish``'s patches: (absolute position, bytes), written with ``pwrite``) and
published whole. The published bytes must be exactly the appended bytes with the patches
applied, no file descriptor stays open between calls, nothing is visible before ``publish``
and nothing is left behind (no temp file) after ``publish`` or ``discard``, whatever happened.
``LocalStorage`` lets writers spool only where segments go through the page cache anyway.
"""
from __future__ import annotations

import errno
import os
import random

import pytest

from pyspark_kafkalog.errors import AlreadyExistsError, KafkaLogError
from pyspark_kafkalog.storage import local as local_mod
from pyspark_kafkalog.storage.local import LocalStorage
from spool_support import ALIGN, needs_direct, temp_files, segment_files, spy_os

# -- LocalSpool: byte for byte ------------------------------------------------------------------

PIECE_SIZES = [1, 7, 61, ALIGN - 1, ALIGN, ALIGN + 1, 10_000, 100_000, 1 << 20]


def _layout(rng, total):
    """Calls of pieces: [[piece sizes] per append call], covering ``total`` bytes."""
    calls, left = [], total
    while left:
        call = []
        for _ in range(rng.randrange(1, 5)):
            if not left:
                break
            n = min(left, rng.choice(PIECE_SIZES))
            call.append(n)
            left -= n
        calls.append(call)
    return calls


def _ranges(rng, start, length, total):
    """Ranges (absolute) to patch inside the call [start, start + length): one at its start,
    one random, one across every page boundary inside it (up to 3), and near the end of the
    file one at the very end and one across the last page boundary."""
    end = start + length
    out = {(start, min(end, start + 61))}
    if length > 2:
        a = rng.randrange(start, end - 1)
        out.add((a, min(end, a + rng.randrange(1, 200))))
    first_boundary = -(-(start + 1) // ALIGN) * ALIGN
    for k, boundary in enumerate(range(first_boundary, end, ALIGN)):
        if k == 3:
            break
        a = max(start, boundary - rng.randrange(1, 40))
        out.add((a, min(end, boundary + rng.randrange(1, 40))))
    last_page = total // ALIGN * ALIGN
    for a, b in ((total - 5, total), (last_page - 3, last_page + 3)):
        a, b = max(a, start), min(b, end)
        if a < b:
            out.add((a, b))
    return sorted(out)


@pytest.mark.parametrize("total", [1, 61, ALIGN - 1, ALIGN, ALIGN + 1, 5 * ALIGN + 17,
                                   (1 << 20) + ALIGN + 1, (3 << 20) - 5])
def test_spool_publishes_the_appended_bytes_with_the_patches(tmp_path, total, monkeypatch):
    rng = random.Random(total)
    live, pwrites, fsyncs = set(), [], []

    def spy_open(path, flags, *a):
        fd = os.open(path, flags, *a)
        live.add(fd)
        return fd

    def spy_close(fd):
        live.discard(fd)
        os.close(fd)

    def spy_pwrite(fd, data, pos):
        pwrites.append((pos, len(data)))
        return os.pwrite(fd, data, pos)

    def spy_fsync(fd):
        fsyncs.append(fd)
        os.fsync(fd)
    spy_os(monkeypatch, open=spy_open, close=spy_close, pwrite=spy_pwrite, fsync=spy_fsync)
    # open_spool works whatever direct_io says: a spool is always buffered
    st = LocalStorage(str(tmp_path), fsync=total % 2 == 0, direct_io=total % 3 == 0)
    spool = st.open_spool("t-0", "x.log")
    assert not live
    appended = bytearray()
    ranges = []
    for call in _layout(rng, total):
        pieces = [rng.randbytes(n) for n in call]
        if len(pieces) > 1:
            pieces[1] = bytearray(pieces[1])       # any buffer, not only bytes
        if len(pieces) > 2:
            pieces[2] = memoryview(pieces[2])
        start = len(appended)
        spool.append(pieces)
        appended += b"".join(pieces)
        ranges += _ranges(rng, start, sum(call), total)
        assert spool.size == len(appended)
        assert not live                            # no fd kept between calls
    assert spool.size == total
    assert any(a == 0 for a, _ in ranges) and any(b == total for _, b in ranges)
    assert any(a // ALIGN != (b - 1) // ALIGN for a, b in ranges) or total <= ALIGN
    # the final bytes: every byte of every range differs from what was appended
    final = bytearray(appended)
    for a, b in ranges:
        final[a:b] = bytes(x ^ rng.randrange(1, 256) for x in appended[a:b])
    patches = []
    for a, b in ranges:
        if rng.random() < 0.5 and b - a > 2:       # one range in two patches, any order
            m = rng.randrange(a + 1, b)
            patches += [(m, memoryview(bytes(final[m:b]))), (a, bytes(final[a:m]))]
        else:
            patches.append((a, bytes(final[a:b])))
    assert not st.list("t-0") and len(temp_files(tmp_path)) == 1   # invisible until published
    spool.publish("t-0/00000000000000000000.log", patches)
    assert not live
    assert sorted(pwrites) == sorted((p, len(d)) for p, d in patches)
    assert len(fsyncs) == (1 if st._fsync else 0)  # the file; st._sync_dir does the directory
    got = (tmp_path / "t-0" / "00000000000000000000.log").read_bytes()
    assert len(got) == total
    assert got == bytes(final)
    assert not temp_files(tmp_path)
    assert [f.name for f in st.list("t-0")] == ["00000000000000000000.log"]


def test_spool_without_patches_and_with_empty_appends(tmp_path):
    st = LocalStorage(str(tmp_path), fsync=False)
    spool = st.open_spool("d", "x.log")
    spool.append([])
    spool.append([b"", b"ab", bytearray()])
    spool.append([b"c" * (2 * ALIGN)])
    assert spool.size == 2 + 2 * ALIGN
    spool.publish("d/f.log")
    assert (tmp_path / "d" / "f.log").read_bytes() == b"ab" + b"c" * (2 * ALIGN)
    empty = st.open_spool("d", "y.log")            # nothing appended: an empty file
    empty.publish("d/e.log")
    assert (tmp_path / "d" / "e.log").read_bytes() == b""
    assert not temp_files(tmp_path)


# -- publish, discard, cleanup ------------------------------------------------------------------

def test_publish_is_create_if_absent_unless_replace(tmp_path):
    st = LocalStorage(str(tmp_path), fsync=False, direct_io=False)
    st.create_if_absent("d/f.log", b"old content")
    body = random.Random(1).randbytes(3 * ALIGN + 5)
    final = b"XXXX" + body[4:]
    spool = st.open_spool("d", "f.log")
    spool.append([body])
    with pytest.raises(AlreadyExistsError):
        spool.publish("d/f.log", [(0, b"XXXX")])
    assert (tmp_path / "d" / "f.log").read_bytes() == b"old content"
    assert not temp_files(tmp_path)
    spool.discard()                                # again: nothing, no error
    with pytest.raises(ValueError, match="already published or discarded"):
        spool.publish("d/f.log", [(0, b"XXXX")], replace=True)
    assert (tmp_path / "d" / "f.log").read_bytes() == b"old content"

    spool = st.open_spool("d", "f.log")
    spool.append([body[:ALIGN], body[ALIGN:]])
    spool.publish("d/f.log", [(0, b"XXXX")], replace=True)
    assert (tmp_path / "d" / "f.log").read_bytes() == final
    assert not temp_files(tmp_path)

    spool = st.open_spool("d", "n.log")            # replace=True where nothing is: created
    spool.append([body])
    spool.publish("d/n.log", replace=True)
    assert (tmp_path / "d" / "n.log").read_bytes() == body

    spool = st.open_spool("d", "g.log")            # published nowhere else than its directory
    spool.append([body])
    with pytest.raises(ValueError, match="cannot be published"):
        spool.publish("e/g.log", [])
    assert not temp_files(tmp_path) and not (tmp_path / "e" / "g.log").exists()


def test_discard_and_cleanup_leave_nothing(tmp_path):
    st = LocalStorage(str(tmp_path), fsync=False, direct_io=False)
    body = random.Random(2).randbytes(2 * ALIGN + 100)
    spool = st.open_spool("d", "f.log")
    spool.append([body])
    assert len(temp_files(tmp_path)) == 1
    spool.discard()
    assert not temp_files(tmp_path) and os.listdir(tmp_path / "d") == []
    spool.discard()

    kept = st.open_spool("d", "g.log")             # a writer killed before publish
    kept.append([body])
    (name,) = temp_files(tmp_path)
    assert st.is_temp_name(name) and name.startswith(".g.log.tmp-")
    assert st.list("d") == []                      # hidden from listings
    assert st.cleanup_temp_files("d", older_than_s=3600) == []   # too young
    assert st.cleanup_temp_files("d", older_than_s=0) == [name]
    assert not temp_files(tmp_path)
    kept.discard()                                 # its file is gone already: no error


def test_a_patch_outside_the_file_is_refused(tmp_path):
    """A patch must lie in [0, size): publish raises ValueError (a caller's bug, not the
    storage's), and neither the target nor the temp file is left."""
    st = LocalStorage(str(tmp_path), fsync=False, direct_io=False)
    size = 3 * ALIGN + 100
    for pos, data in ((size - 2, b"xyz"), (-1, b"x"), (size, b"x"), (-5, b"x" * 10),
                      (0, bytes(size + 1))):
        spool = st.open_spool("d", "f.log")
        spool.append([bytes(size)])
        with pytest.raises(ValueError, match="outside") as info:
            spool.publish("d/f.log", [(12, b"mid"), (pos, data)])
        assert not isinstance(info.value, KafkaLogError)
        assert not (tmp_path / "d" / "f.log").exists() and not temp_files(tmp_path)
        with pytest.raises(ValueError, match="already published or discarded"):
            spool.append([b"x"])
    spool = st.open_spool("d", "f.log")                # the very end, 0 and inside are fine
    spool.append([bytes(size)])
    spool.publish("d/f.log", [(size - 3, b"end"), (12, b"mid"), (0, b"st")])
    want = bytearray(size)
    want[size - 3:] = b"end"
    want[12:15] = b"mid"
    want[0:2] = b"st"
    assert (tmp_path / "d" / "f.log").read_bytes() == bytes(want)
    assert not temp_files(tmp_path)


def test_a_spool_is_unusable_after_discard_or_publish(tmp_path):
    """A plain ValueError (a caller's bug: ``storage_errors`` lets it through unwrapped),
    before touching any file."""
    st = LocalStorage(str(tmp_path), fsync=False, direct_io=False)
    body = random.Random(4).randbytes(2 * ALIGN + 7)

    def refused(fn, *a, **kw):
        with pytest.raises(ValueError, match="already published or discarded") as info:
            fn(*a, **kw)
        assert type(info.value) is ValueError

    spool = st.open_spool("d", "f.log")
    spool.append([body])
    spool.discard()
    refused(spool.append, [b"more"])
    refused(spool.append, [])
    refused(spool.publish, "d/f.log", [])
    assert not (tmp_path / "d" / "f.log").exists() and not temp_files(tmp_path)

    spool = st.open_spool("d", "f.log")
    spool.append([body])
    spool.publish("d/f.log", [(0, body[:8])])
    assert spool.size == len(body)
    refused(spool.append, [b"more"])
    assert spool.size == len(body)
    refused(spool.publish, "d/f.log", [], replace=True)
    refused(spool.publish, "d/g.log", [])
    assert (tmp_path / "d" / "f.log").read_bytes() == body
    assert not (tmp_path / "d" / "g.log").exists() and not temp_files(tmp_path)
    spool.discard()                                    # does not touch the published file
    assert (tmp_path / "d" / "f.log").read_bytes() == body


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd")
def test_many_open_spools_hold_no_file_descriptors(tmp_path):
    st = LocalStorage(str(tmp_path), fsync=False, direct_io=False)
    rng = random.Random(6)
    before = len(os.listdir("/proc/self/fd"))
    spools, bodies = [], []
    for i in range(300):
        spool = st.open_spool(f"p-{i % 3}", "x.log")
        body = rng.randbytes(ALIGN + 100 + i)
        spool.append([body[:50], body[50:]])
        spools.append(spool)
        bodies.append(body)
    assert len(os.listdir("/proc/self/fd")) <= before + 2      # not one per spool
    assert len(temp_files(tmp_path)) == 300
    for i, (spool, body) in enumerate(zip(spools, bodies)):
        spool.append([b"tail"])
        if i % 2:
            spool.discard()
        else:
            spool.publish(f"p-{i % 3}/{i:020d}.log", [(0, body[:61][::-1])])
    assert len(os.listdir("/proc/self/fd")) <= before + 2
    assert not temp_files(tmp_path)
    for i in range(0, 300, 2):
        assert (tmp_path / f"p-{i % 3}" / f"{i:020d}.log").read_bytes() == (
            bodies[i][:61][::-1] + bodies[i][61:] + b"tail")
    assert len(segment_files(tmp_path)) == 150


# -- can_spool ----------------------------------------------------------------------------------

def test_can_spool_only_through_the_page_cache(tmp_path):
    assert LocalStorage(str(tmp_path / "b"), direct_io=False).can_spool is True
    st = LocalStorage(str(tmp_path / "d"), direct_io=True)
    assert st.can_spool is (not st._direct) is (not hasattr(os, "O_DIRECT"))


@needs_direct
def test_can_spool_once_o_direct_was_refused(tmp_path, monkeypatch):
    def no_direct(path, flags, *a):
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return os.open(path, flags, *a)
    spy_os(monkeypatch, local_mod, open=no_direct)
    st = LocalStorage(str(tmp_path), fsync=False, direct_io=True)
    assert st.can_spool is False
    st.create_if_absent_pieces("d/a.log", [bytes(local_mod._DIRECT_MIN + 1)])
    assert st._direct is False and st.can_spool is True
