"""Private memory advised as transparent huge pages: one page fault per 2 MiB instead of per
4 KiB where the OS has them. The sink's buffer pool and the storage's O_DIRECT staging buffers
both want it, and neither layer should import the other for it (nor pyarrow, for storage).
"""
from __future__ import annotations

import ctypes
import mmap
from typing import Tuple

HUGE_PAGE = 2 << 20


def huge_page_mapping(size: int) -> Tuple[mmap.mmap, int]:
    """A private anonymous mapping and the offset in it where ``size`` bytes start, aligned to
    and advised as transparent huge pages where the OS has them (also the storage's O_DIRECT
    staging buffers)."""
    private = getattr(mmap, "MAP_PRIVATE", 0) | getattr(mmap, "MAP_ANONYMOUS", 0)
    total = size + HUGE_PAGE
    buf = mmap.mmap(-1, total, flags=private) if private else mmap.mmap(-1, total)
    view = ctypes.c_char.from_buffer(buf)
    start = -ctypes.addressof(view) % HUGE_PAGE
    del view   # a ctypes view holds an export; the chunk's refcount must not count it
    if hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            buf.madvise(mmap.MADV_HUGEPAGE, start, size)
        except OSError:   # no THP in this kernel: small pages work, only slower
            pass
    return buf, start
