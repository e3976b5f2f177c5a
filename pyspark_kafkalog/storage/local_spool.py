"""A file written while its content is still being produced, and published whole at the end.

Why: a write task used to encode everything first and write its segments afterwards, so the
kernel's copy into the page cache (most of a buffered write's cost) came after the encoding, in
the task's own thread. A spool takes each piece as soon as it is final and writes it (on the
caller's writer thread, alongside the encoding), leaving only a few patches for the end.

The file is a temp file (named like any other, so listings hide it and
``cleanup_temp_files`` removes it when a killed writer leaves it behind) until :meth:`publish`
writes the patches (bytes only known at the end: a record batch's base offset and leader epoch,
assigned when the offsets are reserved), fsyncs it and links it to its final name: the same
create-if-absent rule as ``LocalStorage.create_if_absent``, so a published file is complete, and
an unpublished one is invisible. No file descriptor stays open between calls: a task may spool
hundreds of segments at once.

With O_DIRECT (``LocalStorage``'s default) :class:`LocalDirectSpool` writes each append to the
device in whole aligned blocks, provisional bytes and all, and keeps in memory a copy of the
few blocks that hold the bytes to be patched (a record batch's header: the caller says how many
bytes at the head of each appended piece, ``head``). :meth:`LocalDirectSpool.publish` writes
the last partial block and the patched blocks, whole, through the page cache (a few pages that
the fsync writes together; one O_DIRECT write per block cost a device round trip each). An earlier
O_DIRECT spool that held the patched blocks back instead, and so cut its writes at every batch
header, cost more CPU than it saved (each write is a VM exit here); this one writes a 4 MiB run
in one or two calls and leaves about one 4 KiB block per batch for the end
(docs/spark-write.md).
"""
from __future__ import annotations

import errno
import os
from typing import Sequence, Tuple

from ..errors import AlreadyExistsError
from .base import storage_errors, temp_name_for
from .posix_io import (DIRECT_ALIGN as _ALIGN, DIRECT_CHUNK, NO_LINK_ERRNOS, staging_buffer,
                       unlink_quietly, writev_all)


class LocalSpool:
    """One temp file in ``directory``, written through the page cache; use from one thread at
    a time."""

    def __init__(self, storage, directory: str, hint: str):
        self._storage = storage
        self._dir = directory
        storage.ensure_dir(directory)
        self._tmp = os.path.join(directory, temp_name_for(hint))
        os.close(os.open(self._tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        self.size = 0               # bytes appended
        self._done = False

    def _tmp_checked(self) -> str:
        if self._done:
            raise ValueError(f"spool {self._tmp} was already published or discarded")
        return self._tmp

    def _open(self) -> int:
        return os.open(self._tmp_checked(), os.O_WRONLY)

    def append(self, pieces: Sequence) -> None:
        """Append ``pieces`` back to back."""
        views = [memoryview(p).cast("B") for p in pieces if len(p)]
        with storage_errors("write", self._tmp):
            fd = self._open()
            try:
                os.lseek(fd, self.size, os.SEEK_SET)
                writev_all(fd, views)
            except BaseException:
                self._done = True    # part of it may be written: only discard() is left
                raise
            finally:
                os.close(fd)
        self.size += sum(len(v) for v in views)

    def publish(self, path: str, patches: Sequence[Tuple[int, bytes]] = (), *,
                replace: bool = False) -> None:
        """Write ``patches`` ((position, bytes) inside what was appended), make the file
        durable and give it the name ``path`` (relative to the storage root): create-if-absent
        (``AlreadyExistsError`` if taken), or with ``replace`` an atomic replace of what is
        there. The spool is gone afterwards, published or not."""
        st = self._storage
        full, where = st._abs(path), st._where(path)
        try:
            with storage_errors("create", where):
                if os.path.dirname(full) != self._dir:
                    raise ValueError(f"spool in {self._dir} cannot be published as {full}")
                tmp = self._tmp_checked()
                for pos, data in patches:    # all checked before any is written
                    if pos < 0 or pos + len(data) > self.size:
                        raise ValueError(f"patch at {pos} outside the spool's {self.size} bytes")
                fd = os.open(tmp, os.O_WRONLY)   # patches go through the page cache
                try:
                    self._write_patches(fd, patches)
                    if st._sync_now():
                        os.fsync(fd)
                finally:
                    os.close(fd)
                try:
                    os.link(self._tmp, full)
                except FileExistsError:
                    if not replace:
                        raise AlreadyExistsError(f"create {where}: already exists") from None
                    os.replace(self._tmp, full)
                except OSError as e:
                    if e.errno not in NO_LINK_ERRNOS:
                        raise
                    self._publish_without_link(full, where, replace)
                if not st._synced_later(full):
                    st._sync_dir(self._dir)
        finally:
            self.discard()

    def _write_patches(self, fd: int, patches: Sequence[Tuple[int, bytes]]) -> None:
        for pos, data in patches:
            os.pwrite(fd, data, pos)

    def _publish_without_link(self, full: str, where: str, replace: bool) -> None:
        """A filesystem without hard links: rename, after an existence check (not atomic
        against a concurrent creator; ``LocalStorage`` reports that in its guarantees)."""
        self._storage._link_ok = False
        if os.path.lexists(full) and not replace:
            raise AlreadyExistsError(f"create {where}: already exists")
        os.replace(self._tmp, full)

    def discard(self) -> None:
        """Delete the temp file (nothing if it was published); the spool is unusable after."""
        self._done = True
        unlink_quietly(self._tmp)


class LocalDirectSpool(LocalSpool):
    """A :class:`LocalSpool` written with O_DIRECT: appends go to the device at once, in
    aligned blocks, through the thread's staging buffer; the unaligned rest waits for the next
    append. The blocks holding the first ``head`` bytes of every appended piece are copied as
    they are written, so that :meth:`publish` can rewrite them patched without reading the file
    (a patch anywhere else reads its block back)."""

    def __init__(self, storage, directory: str, hint: str, head: int):
        super().__init__(storage, directory, hint)
        self._head = head
        self._tail = b""               # bytes appended after the last whole block written
        self._want: set = set()        # blocks holding a piece's head, not yet written
        self._kept: dict = {}          # block index -> bytes of that block as written

    @classmethod
    def open(cls, storage, directory: str, hint: str, head: int):
        """The spool, or None where the filesystem refuses O_DIRECT (nothing is left then)."""
        spool = cls(storage, directory, hint, head)
        try:
            os.close(os.open(spool._tmp, os.O_WRONLY | os.O_DIRECT))
        except OSError as e:
            spool.discard()
            if e.errno != errno.EINVAL:
                raise
            return None
        return spool

    def _open(self) -> int:
        return os.open(self._tmp_checked(), os.O_WRONLY | os.O_DIRECT)

    def _write_blocks(self, fd: int, buf, n: int, at: int) -> None:
        """``buf[:n]`` (whole blocks, aligned memory) at file position ``at``; keeps the
        wanted blocks among them."""
        view = memoryview(buf)[:n]
        while view:
            k = os.pwrite(fd, view, at)
            if k <= 0 or k % _ALIGN:
                raise OSError(errno.EIO, f"short O_DIRECT write ({k} of {len(view)} bytes)",
                              self._tmp)
            view, at = view[k:], at + k
        first, end = (at - n) // _ALIGN, at // _ALIGN
        for b in [b for b in self._want if first <= b < end]:
            off = (b - first) * _ALIGN
            self._kept[b] = bytes(buf[off:off + _ALIGN])
            self._want.discard(b)

    def append(self, pieces: Sequence) -> None:
        self._tmp_checked()
        views = [memoryview(p).cast("B") for p in pieces if len(p)]
        if not views:
            return
        pos = self.size
        for v in views:
            self._want.update(range(pos // _ALIGN, (pos + min(self._head, len(v)) - 1) // _ALIGN
                                    + 1) if self._head else ())
            pos += len(v)
        out = staging_buffer()
        fill = len(self._tail)
        at = self.size - fill          # a block boundary
        out[:fill] = self._tail
        with storage_errors("write", self._tmp):
            fd = self._open()
            try:
                for v in views:
                    i = 0
                    while i < len(v):
                        k = min(len(v) - i, DIRECT_CHUNK - fill)
                        out[fill:fill + k] = v[i:i + k]
                        fill, i = fill + k, i + k
                        if fill == DIRECT_CHUNK:
                            self._write_blocks(fd, out, fill, at)
                            at, fill = at + fill, 0
                whole = fill - fill % _ALIGN
                if whole:
                    self._write_blocks(fd, out, whole, at)
                    at += whole
                self._tail = bytes(out[whole:fill])
            except BaseException:
                self._done = True    # part of it may be written: only discard() is left
                raise
            finally:
                os.close(fd)
        self.size = pos

    def _block(self, b: int, blocks: dict) -> bytearray:
        """Block ``b`` as it is to be written: patched already, kept, or read back."""
        got = blocks.get(b)
        if got is None:
            kept = self._kept.pop(b, None)
            got = blocks[b] = bytearray(kept if kept is not None else self._read_block(b))
        return got

    def _read_block(self, b: int) -> bytes:
        out = staging_buffer()
        fd = os.open(self._tmp, os.O_RDONLY | os.O_DIRECT)
        try:
            n = os.preadv(fd, [out[:_ALIGN]], b * _ALIGN)
        finally:
            os.close(fd)
        return bytes(out[:n]) + bytes(_ALIGN - n)

    def _write_patches(self, fd: int, patches: Sequence[Tuple[int, bytes]]) -> None:
        """The last partial block and the patched blocks, whole (so that the kernel need not
        read the rest of a page first), through the page cache on ``fd``: a few pages, which
        the fsync then writes together, where one O_DIRECT write per block would cost a round
        trip to the device each (docs/performance.md)."""
        blocks: dict = {}
        last = self.size // _ALIGN
        if self._tail:
            blocks[last] = bytearray(self._tail)
        for pos, data in patches:
            data = memoryview(data).cast("B")
            while data:
                b, off = divmod(pos, _ALIGN)
                k = min(len(data), _ALIGN - off)
                self._block(b, blocks)[off:off + k] = data[:k]
                data, pos = data[k:], pos + k
        run: list = []                  # consecutive blocks, written in one call
        for b in sorted(blocks) + [None]:
            if run and (b is None or b != run[-1] + 1):
                writev_all(fd, [memoryview(blocks[r]) for r in run], run[0] * _ALIGN)
                run = []
            if b is not None:
                run.append(b)
        os.ftruncate(fd, self.size)
