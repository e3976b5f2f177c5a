"""``storage.direct_io``: segments written with O_DIRECT through an aligned staging buffer.

Same bytes as the buffered path for every size around the alignment, the 1 MiB threshold and
the staging buffer's size; and whenever O_DIRECT does not work out (refused at open or at a
write, a short write) the file is written buffered instead, with no temp file left behind.
"""
from __future__ import annotations

import errno
import os
import pickle
import random

import pytest

from pyspark_kafkalog.errors import AlreadyExistsError, InvalidConfigError
from pyspark_kafkalog.storage import local as local_mod, open_storage, posix_io

pytestmark = pytest.mark.skipif(not hasattr(os, "O_DIRECT"), reason="O_DIRECT is Linux-only")

MIN, ALIGN, CHUNK = local_mod._DIRECT_MIN, posix_io.DIRECT_ALIGN, posix_io.DIRECT_CHUNK


def _pieces(rng, total):
    out, left = [], total
    while left:
        n = min(left, rng.choice([1, 7, ALIGN, ALIGN + 1, 100_000, CHUNK - 3, 3 << 20]))
        out.append(rng.randbytes(n))
        left -= n
    return out


def _temp_files(root):
    return [n for _, _, files in os.walk(root) for n in files if ".tmp-" in n]


@pytest.mark.parametrize("total", [MIN - 1, MIN, MIN + 1, MIN + ALIGN, CHUNK, CHUNK + 1,
                                   2 * CHUNK + ALIGN - 1, 3 * CHUNK + 12345])
def test_direct_writes_give_the_same_bytes(tmp_path, total, monkeypatch):
    rng = random.Random(total)
    pieces = _pieces(rng, total)
    pieces[0] = bytearray(pieces[0])
    st = open_storage(str(tmp_path), direct_io="true")
    opened = []
    real_open = os.open
    monkeypatch.setattr(local_mod.os, "open", lambda p, flags, *a: (
        opened.append(bool(flags & os.O_DIRECT)), real_open(p, flags, *a))[1])
    st.create_if_absent_pieces("t-0/00000000000000000000.log", pieces)
    assert st.read("t-0/00000000000000000000.log") == b"".join(pieces)
    assert st.size("t-0/00000000000000000000.log") == total
    assert any(opened) == (total >= MIN)       # below 1 MiB: through the page cache
    assert st._direct and not _temp_files(tmp_path)
    with pytest.raises(AlreadyExistsError):
        st.create_if_absent_pieces("t-0/00000000000000000000.log", pieces)


def test_direct_io_false_writes_through_the_page_cache(tmp_path, monkeypatch):
    opened = []
    real_open = os.open
    monkeypatch.setattr(local_mod.os, "open", lambda p, flags, *a: (
        opened.append(bool(flags & os.O_DIRECT)), real_open(p, flags, *a))[1])
    pieces = _pieces(random.Random(5), 2 * MIN)
    open_storage(str(tmp_path / "off"), direct_io="false").create_if_absent_pieces("a.log", pieces)
    assert opened and not any(opened)
    open_storage(str(tmp_path / "on")).create_if_absent_pieces("a.log", pieces)
    assert any(opened)
    assert (tmp_path / "off" / "a.log").read_bytes() == (tmp_path / "on" / "a.log").read_bytes()


def test_a_filesystem_that_refuses_o_direct_gets_buffered_writes(tmp_path, monkeypatch):
    real_open = os.open

    def no_direct(path, flags, *a):
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *a)
    monkeypatch.setattr(local_mod.os, "open", no_direct)
    st = local_mod.LocalStorage(str(tmp_path), direct_io=True)
    pieces = _pieces(random.Random(1), MIN + 5)
    st.create_if_absent_pieces("a.log", pieces)
    assert st.read("a.log") == b"".join(pieces)
    assert not st._direct and not _temp_files(tmp_path)   # decided once, for this storage


@pytest.mark.parametrize("failure", ["einval", "short"])
def test_a_write_that_fails_is_redone_buffered(tmp_path, monkeypatch, failure):
    real_write = os.write
    calls = []

    def flaky(fd, data):
        calls.append(len(data))
        if len(calls) == 2:    # the second O_DIRECT write
            if failure == "einval":
                raise OSError(errno.EINVAL, "Invalid argument")
            return real_write(fd, data[:ALIGN])
        return real_write(fd, data)
    monkeypatch.setattr(local_mod.os, "write", flaky)
    st = local_mod.LocalStorage(str(tmp_path), direct_io=True)
    pieces = _pieces(random.Random(2), 2 * CHUNK + 99)
    st.create_if_absent_pieces("a.log", pieces)
    assert st.read("a.log") == b"".join(pieces)
    assert st._direct == (failure == "short") and not _temp_files(tmp_path)


def test_other_errors_are_raised_and_leave_nothing(tmp_path, monkeypatch):
    def full(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(local_mod.os, "write", full)
    st = local_mod.LocalStorage(str(tmp_path), direct_io=True)
    with pytest.raises(Exception, match="No space left"):
        st.create_if_absent_pieces("a.log", _pieces(random.Random(3), MIN))
    assert not os.path.exists(tmp_path / "a.log") and not _temp_files(tmp_path)


def test_the_option_is_parsed_kept_and_local_only(tmp_path):
    for value, want in (("true", True), ("FALSE", False), (True, True), (False, False)):
        assert open_storage(str(tmp_path), direct_io=value)._direct is want
    assert open_storage(str(tmp_path))._direct is True           # the default on local disk
    assert local_mod.LocalStorage(str(tmp_path))._direct is True
    open_storage("memory://x")      # other backends: no such setting, and no error unless asked
    st = open_storage(str(tmp_path), direct_io="true")
    assert pickle.loads(pickle.dumps(st))._direct is True   # executors get the same setting
    off = open_storage(str(tmp_path), direct_io="false")
    assert pickle.loads(pickle.dumps(off))._direct is False
    with pytest.raises(InvalidConfigError, match="direct_io must be true or false"):
        open_storage(str(tmp_path), direct_io="yes")
    with pytest.raises(InvalidConfigError, match="local storage only"):
        open_storage("memory://x", direct_io="true")


def _thp_mode():
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return f.read().split("[")[1].split("]")[0]
    except (OSError, IndexError):
        return "never"


def _thp_eligible(addr):
    """The ``THPeligible`` flag of the mapping holding ``addr`` in /proc/self/smaps."""
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= addr < hi
            elif inside and head == "THPeligible:":
                return line.split()[1] == "1"
    return False


def test_the_staging_buffer_is_kept_per_thread_aligned_to_a_huge_page_and_advised():
    import ctypes
    import threading
    view = posix_io.staging_buffer()
    assert len(view) == CHUNK and not view.readonly
    addr = ctypes.addressof(ctypes.c_char.from_buffer(view))
    assert addr % (2 << 20) == 0                          # a huge page
    assert posix_io.staging_buffer() is view            # kept: its pages stay mapped
    other = []
    t = threading.Thread(target=lambda: other.append(posix_io.staging_buffer()))
    t.start()
    t.join()
    assert other and other[0] is not view                # one per thread: writers in parallel
    if _thp_mode() in ("always", "madvise"):             # "never": small pages, still correct
        assert _thp_eligible(addr)
