"""Spooled files: ``storage.local_spool.LocalSpool`` and ``LocalDirectSpool``.

A spool is a temp file written while its content is produced, patched at the end
(``publish``'s patches: (absolute position, bytes)) and published whole. The published bytes
must be exactly the appended bytes with the patches applied, no file descriptor stays open
between calls, nothing is visible before ``publish`` and nothing is left behind (no temp file)
after ``publish`` or ``discard``, whatever happened. Through the page cache the patches are
written with ``pwrite``; with O_DIRECT (``LocalStorage``'s default) every write is of whole aligned
blocks, and ``publish`` rewrites only the blocks its patches and the last partial block touch,
from copies kept of the blocks holding each piece's head.
"""
from __future__ import annotations

import errno
import os
import random

import pytest

from pyspark_kafkalog.errors import AlreadyExistsError, KafkaLogError
from pyspark_kafkalog.storage import posix_io
from pyspark_kafkalog.storage.local import LocalStorage
from pyspark_kafkalog.storage.local_spool import LocalDirectSpool, LocalSpool
from support.spool_support import ALIGN, HAS_DIRECT, needs_direct, temp_files, segment_files, spy_os

#: both kinds of spool where this OS has O_DIRECT
DIRECT = [False, pytest.param(True, marks=needs_direct)]


def _storage(tmp_path, direct, **kw):
    st = LocalStorage(str(tmp_path), direct_io=direct, **kw)
    assert st._direct is (direct and HAS_DIRECT)
    return st

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


@pytest.mark.parametrize("direct", DIRECT)
@pytest.mark.parametrize("total", [1, 61, ALIGN - 1, ALIGN, ALIGN + 1, 5 * ALIGN + 17,
                                   (1 << 20) + ALIGN + 1, (3 << 20) - 5, (9 << 20) + 3])
def test_spool_publishes_the_appended_bytes_with_the_patches(tmp_path, total, direct,
                                                             monkeypatch):
    rng = random.Random(total)
    live, pwrites, fsyncs, reads = set(), [], [], []

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

    def spy_preadv(fd, bufs, pos):
        reads.append(pos)
        return os.preadv(fd, bufs, pos)

    def spy_pwritev(fd, bufs, pos):
        pwritevs.append((pos, sum(len(b) for b in bufs)))
        return os.pwritev(fd, bufs, pos)
    pwritevs = []
    spy_os(monkeypatch, open=spy_open, close=spy_close, pwrite=spy_pwrite, fsync=spy_fsync,
           preadv=spy_preadv)
    spy_os(monkeypatch, posix_io, pwritev=spy_pwritev)   # posix_io.writev_all
    st = _storage(tmp_path, direct, fsync=total % 2 == 0)
    spool = st.open_spool("t-0", "x.log", 61)
    assert type(spool) is (LocalDirectSpool if direct else LocalSpool)
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
    if direct:   # the appends wrote every whole block, each once, in order
        assert all(p % ALIGN == 0 and n % ALIGN == 0 for p, n in pwrites)
        assert sum(n for _, n in pwrites) == total // ALIGN * ALIGN
        assert [p for p, _ in pwrites] == sorted(p for p, _ in pwrites)
    del pwrites[:]
    spool.publish("t-0/00000000000000000000.log", patches)
    assert not live
    if direct:   # whole blocks, those the patches touch and the last partial one, buffered
        touched = {b for a, e in ranges for b in range(a // ALIGN, (e - 1) // ALIGN + 1)}
        if total % ALIGN:
            touched.add(total // ALIGN)
        written = [b for p, n in pwritevs for b in range(p // ALIGN, -(-(p + n) // ALIGN))]
        assert not pwrites and all(p % ALIGN == 0 for p, _ in pwritevs)
        assert all(n % ALIGN == 0 or p + n == total for p, n in pwritevs)
        assert sorted(written) == sorted(touched)
        # a piece's first 61 bytes were kept; only other blocks are read back, once each
        assert len(reads) == len(set(reads)) and all(r // ALIGN in touched for r in reads)
    else:
        assert sorted(pwrites) == sorted((p, len(d)) for p, d in patches)
        assert not reads and not pwritevs
    assert len(fsyncs) == (1 if st._fsync else 0)  # the file; st._sync_dir does the directory
    got = (tmp_path / "t-0" / "00000000000000000000.log").read_bytes()
    assert len(got) == total
    assert got == bytes(final)
    assert not temp_files(tmp_path)
    assert [f.name for f in st.list("t-0")] == ["00000000000000000000.log"]


@needs_direct
def test_direct_spool_rewrites_only_the_blocks_of_piece_heads(tmp_path, monkeypatch):
    """Pieces (batches) of 100 KiB-ish; the patches are their first 61 bytes: publish reads
    nothing back and writes one run per group of adjacent head blocks, plus the last block."""
    rng = random.Random(9)
    pwrites, reads = [], []
    spy_os(monkeypatch, posix_io, pwritev=lambda fd, d, p: pwrites.append(
        (p, sum(map(len, d)))) or os.pwritev(fd, d, p))
    spy_os(monkeypatch, preadv=lambda *a: reads.append(a) or os.preadv(*a))
    st = _storage(tmp_path, True, fsync=True)
    spool = st.open_spool("d", "x.log", 61)
    pieces = [rng.randbytes(rng.randrange(90_000, 110_000)) for _ in range(40)]
    pieces[7] = rng.randbytes(30)          # a piece shorter than its head
    for i in range(0, 40, 6):
        spool.append(pieces[i:i + 6])
    appended = pieces and b"".join(pieces)
    starts = [sum(map(len, pieces[:i])) for i in range(40)]
    heads = [(a, bytes(reversed(appended[a:a + min(61, len(p))]))) for a, p in zip(starts, pieces)]
    spool.publish("d/f.log", heads)
    assert not reads
    blocks = {b for a, h in heads for b in range(a // ALIGN, (a + len(h) - 1) // ALIGN + 1)}
    blocks.add(len(appended) // ALIGN)
    assert sorted(b for p, n in pwrites for b in range(p // ALIGN, -(-(p + n) // ALIGN))) == \
        sorted(blocks)
    want = bytearray(appended)
    for a, h in heads:
        want[a:a + len(h)] = h
    assert (tmp_path / "d" / "f.log").read_bytes() == bytes(want)


@pytest.mark.parametrize("direct", DIRECT)
def test_spool_without_patches_and_with_empty_appends(tmp_path, direct):
    st = _storage(tmp_path, direct, fsync=False)
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

@pytest.mark.parametrize("direct", DIRECT)
def test_publish_is_create_if_absent_unless_replace(tmp_path, direct):
    st = _storage(tmp_path, direct, fsync=False)
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


@pytest.mark.parametrize("direct", DIRECT)
def test_discard_and_cleanup_leave_nothing(tmp_path, direct):
    st = _storage(tmp_path, direct, fsync=False)
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


@pytest.mark.parametrize("direct", DIRECT)
def test_a_patch_outside_the_file_is_refused(tmp_path, direct):
    """A patch must lie in [0, size): publish raises ValueError (a caller's bug, not the
    storage's), and neither the target nor the temp file is left."""
    st = _storage(tmp_path, direct, fsync=False)
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


@pytest.mark.parametrize("direct", DIRECT)
def test_a_spool_is_unusable_after_discard_or_publish(tmp_path, direct):
    """A plain ValueError (a caller's bug: ``storage_errors`` lets it through unwrapped),
    before touching any file."""
    st = _storage(tmp_path, direct, fsync=False)
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
@pytest.mark.parametrize("direct", DIRECT)
def test_many_open_spools_hold_no_file_descriptors(tmp_path, direct):
    st = _storage(tmp_path, direct, fsync=False)
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


# -- which spool -------------------------------------------------------------------------------

def test_open_spool_follows_direct_io(tmp_path):
    assert LocalStorage(str(tmp_path / "b"), direct_io=False).can_spool is True
    assert type(LocalStorage(str(tmp_path / "b"), direct_io=False).open_spool("d", "x")) \
        is LocalSpool
    st = LocalStorage(str(tmp_path / "d"), direct_io=True)
    assert st.can_spool is True
    assert type(st.open_spool("d", "x")) is (LocalDirectSpool if HAS_DIRECT else LocalSpool)


@needs_direct
def test_a_buffered_spool_once_o_direct_is_refused(tmp_path, monkeypatch):
    """A filesystem that refuses O_DIRECT (EINVAL, e.g. tmpfs on old kernels): the spool goes
    through the page cache, no temp file is left from the refused attempt, and the storage
    stops trying."""
    tried = []

    def no_direct(path, flags, *a):
        if flags & os.O_DIRECT:
            tried.append(path)
            raise OSError(errno.EINVAL, "Invalid argument")
        return os.open(path, flags, *a)
    spy_os(monkeypatch, open=no_direct)
    st = LocalStorage(str(tmp_path), fsync=False, direct_io=True)
    spool = st.open_spool("d", "x.log", 61)
    assert type(spool) is LocalSpool and st._direct is False and len(tried) == 1
    assert len(temp_files(tmp_path)) == 1
    spool.append([b"abc" * 2000])
    spool.publish("d/f.log", [(0, b"XY")])
    assert (tmp_path / "d" / "f.log").read_bytes() == b"XY" + (b"abc" * 2000)[2:]
    assert type(st.open_spool("d", "y.log")) is LocalSpool and len(tried) == 1
