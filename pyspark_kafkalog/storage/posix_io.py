"""POSIX write helpers shared by ``LocalStorage`` (``local.py``) and its spools
(``local_spool.py``): vectored writes that survive short writes, O_DIRECT's aligned staging
buffer, and the few errno rules both follow. One home, so that the storage and the spools write
and publish files by the same rules.
"""
from __future__ import annotations

import errno
import os
import stat
import threading
from typing import Optional

from ..huge_pages import huge_page_mapping

# errno values meaning "this filesystem cannot hard-link" (FAT, some FUSE/SMB mounts), as opposed
# to "the target exists" (EEXIST) or a real I/O failure.
NO_LINK_ERRNOS = frozenset(
    getattr(errno, name) for name in ("EPERM", "ENOTSUP", "EOPNOTSUPP", "EXDEV", "EMLINK", "ENOSYS")
    if hasattr(errno, name))


IOV_MAX = 1024   # POSIX's minimum IOV_MAX is 16, Linux and macOS allow 1024

#: O_DIRECT needs buffer addresses, lengths and file offsets aligned to the device's logical
#: block: 4096 covers 512-byte and 4K-native devices alike.
DIRECT_ALIGN = 4096
#: The size of the staging buffer, so of one O_DIRECT write.
DIRECT_CHUNK = 4 << 20
_staging = threading.local()


def staging_buffer() -> memoryview:
    """This thread's staging buffer for O_DIRECT writes: private memory, aligned to and advised
    as transparent huge pages where the OS has them, and kept, so later writes do not fault its
    pages in again. Huge pages because the kernel pins every page of an O_DIRECT write's buffer
    and hands the device one piece per page: fewer, larger pieces take less time and CPU
    (docs/performance.md)."""
    view = getattr(_staging, "view", None)
    if view is None:
        buf, start = huge_page_mapping(DIRECT_CHUNK)
        _staging.buf = buf
        view = _staging.view = memoryview(buf)[start:start + DIRECT_CHUNK]
    return view


def write_direct(fd: int, views: list, total: int) -> bool:
    """Write ``views`` back to back to the O_DIRECT ``fd`` through the staging buffer, the last
    block zero-padded and then cut off with ``ftruncate``; False on a short write (nothing is
    promised about the file then: the caller writes it again without O_DIRECT)."""
    out = staging_buffer()
    fill = 0

    def flush(n: int) -> bool:
        return os.write(fd, out[:n]) == n

    for v in views:
        pos = 0
        while pos < len(v):
            k = min(len(v) - pos, DIRECT_CHUNK - fill)
            out[fill:fill + k] = v[pos:pos + k]
            fill += k
            pos += k
            if fill == DIRECT_CHUNK:
                if not flush(fill):
                    return False
                fill = 0
    if fill:
        padded = -(-fill // DIRECT_ALIGN) * DIRECT_ALIGN
        out[fill:padded] = bytes(padded - fill)
        if not flush(padded):
            return False
    os.ftruncate(fd, total)
    return True


def writev_all(fd: int, views: list, at: Optional[int] = None) -> None:
    """``os.writev`` (``os.pwritev`` from position ``at``) until every byte of ``views`` is
    written (a write may stop anywhere)."""
    i = 0
    while i < len(views):
        if at is None:
            written = os.writev(fd, views[i:i + IOV_MAX])
        else:
            written = os.pwritev(fd, views[i:i + IOV_MAX], at)
            at += written
        while i < len(views) and written >= len(views[i]):
            written -= len(views[i])
            i += 1
        if written:
            views[i] = views[i][written:]


def ensure_dir(directory: str) -> None:
    try:   # the common case, one stat: makedirs alone costs a stat, a failing mkdir and a stat
        if stat.S_ISDIR(os.stat(directory).st_mode):
            return
    except FileNotFoundError:
        pass
    try:
        os.makedirs(directory, exist_ok=True)
    except FileExistsError as e:  # a file is in the way: an error, never a lost create race
        raise NotADirectoryError(errno.ENOTDIR, "a file is where a directory should be", directory) from e


def unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
