"""Memory for the sink's record batches that stays with the process from one task to the next.

Why not Arrow's pool. A Spark task encodes its rows into batch buffers (``accumulate``) that
live until its segments are written, about as many bytes as the task writes, and then frees
them all. The allocator gives freed pages back to the OS within milliseconds (mimalloc's purge
delay), so the next task faults every page in again. On a VM that is a trip to the hypervisor
per 4 KiB page, which doubled the accumulator's time in the Spark write benchmark
(docs/performance.md). An :class:`Arena` hands out slices of large private mappings, advised as
transparent huge pages (one fault per 2 MiB where the OS has them), and a task gives it back
whole when its segments are written; the next task in the same worker reuses the pages.

Safety. A slice is a ``memoryview`` of one chunk; while any view (or a view of a view) of a
chunk lives, the chunk's reference count says so. :meth:`Arena.reset` keeps for reuse only the
chunks nobody views any more; a chunk still viewed leaves the arena, and its memory is freed
with its last view. So a batch that outlives its task is never overwritten.

What is kept: idle arenas are pooled (:func:`take`, :func:`give`) up to ``RETAIN_BYTES`` in
all, and freed after ``IDLE_SECONDS`` unused, so an idle Spark worker gives its memory back.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from typing import List, Optional

import pyarrow as pa

from ..huge_pages import HUGE_PAGE, huge_page_mapping

#: One mapping; a multiple of the huge page. Batch buffers are about ``batch.size`` (512 KiB),
#: so a chunk's unused tail is a few percent of it.
CHUNK = 8 << 20
_ALIGN = 64
#: Idle arenas keep at most this many bytes of chunks in a process.
RETAIN_BYTES = 256 << 20
#: ... and only for this long after their last use.
IDLE_SECONDS = 30.0


class _Chunk:
    """One mapping, and its reference count when nothing views it (the baseline of reset)."""

    __slots__ = ("buf", "start", "idle_refs")

    def __init__(self, size: int):
        self.buf, self.start = huge_page_mapping(size)
        self.idle_refs = self.refs()

    def refs(self) -> int:
        return sys.getrefcount(self.buf)


class Arena:
    """Bump allocation in huge-page chunks, given back all at once with :meth:`reset`.

    ``allocate(n)`` has the signature of ``pyarrow.allocate_buffer`` (what the C extensions
    call for their output buffers). Requests larger than a chunk come from Arrow's pool.
    """

    def __init__(self, chunk: int = CHUNK):
        if chunk <= 0 or chunk % HUGE_PAGE:
            raise ValueError(f"chunk must be a positive multiple of {HUGE_PAGE}, got {chunk}")
        self.chunk = chunk
        self._chunks: List[_Chunk] = []
        self._i = 0        # the chunk being filled
        self._at = 0       # the next free byte in it
        self.last_used = time.monotonic()

    @property
    def nbytes(self) -> int:
        """The bytes of chunks this arena holds."""
        return len(self._chunks) * self.chunk

    def allocate(self, n: int):
        n = int(n)
        if n < 0:
            raise ValueError(f"cannot allocate {n} bytes")
        if n > self.chunk:
            return pa.allocate_buffer(n)
        if self._i < len(self._chunks) and self._at + n > self.chunk:
            self._i, self._at = self._i + 1, 0
        if self._i == len(self._chunks):
            self._chunks.append(_Chunk(self.chunk))
        c = self._chunks[self._i]
        at = c.start + self._at
        self._at += n + (-n % _ALIGN)
        return memoryview(c.buf)[at:at + n]

    def reset(self, retain: Optional[int] = None) -> None:
        """Everything allocated so far is free again: keep the chunks no view refers to (at most
        ``retain`` bytes of them), drop the others."""
        keep = [c for c in self._chunks if c.refs() == c.idle_refs]
        if retain is not None:
            keep = keep[:max(retain, 0) // self.chunk]
        self._chunks = keep
        self._i = self._at = 0
        self.last_used = time.monotonic()


# -- the process's idle arenas ------------------------------------------------------------------

_lock = threading.Lock()
_idle: List[Arena] = []
_timer: Optional[threading.Timer] = None


def take() -> Arena:
    """An idle arena of this process (its pages already faulted in), or a new one."""
    with _lock:
        return _idle.pop() if _idle else Arena()


def give(arena: Arena) -> None:
    """``arena``, whose allocations nobody uses any more, back to the process's idle arenas."""
    global _timer
    with _lock:
        room = RETAIN_BYTES - sum(a.nbytes for a in _idle)
        arena.reset(retain=room)
        if arena.nbytes:
            _idle.append(arena)
        if _idle and _timer is None:
            _timer = threading.Timer(IDLE_SECONDS, _trim)
            _timer.daemon = True
            _timer.start()


def _trim() -> None:
    """Free the arenas idle for ``IDLE_SECONDS``; check again later while any are left."""
    global _timer
    with _lock:
        now = time.monotonic()
        _idle[:] = [a for a in _idle if now - a.last_used < IDLE_SECONDS]
        _timer = None
        if _idle:
            _timer = threading.Timer(IDLE_SECONDS, _trim)
            _timer.daemon = True
            _timer.start()


def _after_fork() -> None:
    """A forked child has no timer thread (and may share the parent's pages): start afresh."""
    global _lock, _idle, _timer
    _lock, _idle, _timer = threading.Lock(), [], None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def idle_bytes() -> int:
    """The bytes held by idle arenas (for tests and diagnostics)."""
    with _lock:
        return sum(a.nbytes for a in _idle)
