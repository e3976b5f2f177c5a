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

Page cache only. With O_DIRECT (``LocalStorage``'s default) segments are written whole once the
offsets are known: measured in Spark, spooling there cost more CPU than the overlap saved (its
writes are split by the blocks a patch touches, and every write is a VM exit here), while
through the page cache spooling cut a write job's time by about a fifth
(docs/spark-write.md). ``LocalStorage.can_spool`` says which applies.
"""
from __future__ import annotations

import os
from typing import Sequence, Tuple

from ..errors import AlreadyExistsError
from .base import storage_errors, temp_name_for


class LocalSpool:
    """One temp file in ``directory``, written through the page cache; use from one thread at
    a time."""

    def __init__(self, storage, directory: str, hint: str):
        from .local import _ensure_dir
        self._storage = storage
        self._dir = directory
        _ensure_dir(directory)
        self._tmp = os.path.join(directory, temp_name_for(hint))
        os.close(os.open(self._tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        self.size = 0               # bytes appended
        self._done = False

    def _open(self) -> int:
        if self._done:
            raise ValueError(f"spool {self._tmp} was already published or discarded")
        return os.open(self._tmp, os.O_WRONLY)

    def append(self, pieces: Sequence) -> None:
        """Append ``pieces`` back to back."""
        from .local import _writev_all
        views = [memoryview(p).cast("B") for p in pieces if len(p)]
        with storage_errors("write", self._tmp):
            fd = self._open()
            try:
                os.lseek(fd, self.size, os.SEEK_SET)
                _writev_all(fd, views)
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
                fd = self._open()
                try:
                    for pos, data in patches:
                        if pos < 0 or pos + len(data) > self.size:
                            raise ValueError(f"patch at {pos} outside the spool's "
                                             f"{self.size} bytes")
                        os.pwrite(fd, data, pos)
                    if st._fsync:
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
                    if e.errno not in _no_link_errnos():
                        raise
                    self._publish_without_link(full, where, replace)
                st._sync_dir(self._dir)
        finally:
            self.discard()

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
        _unlink_quietly(self._tmp)


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _no_link_errnos():
    from .local import _NO_LINK_ERRNOS
    return _NO_LINK_ERRNOS
