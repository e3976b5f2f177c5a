"""The storage contract every backend implements, and the helpers they share.

Everything above this package (segments, indexes, checkpoints, leader-epoch claims) is written
against :class:`Storage` and is only as correct as the primitives below it. Many processes write
the same storage at once and any of them may die at any instant, so each primitive states exactly
what a reader or a competing writer can observe, and :class:`StorageGuarantees` tells callers which
of those promises the backend in hand really keeps, so a caller that needs one can refuse to run
without it instead of silently corrupting data.
"""
from __future__ import annotations

import abc
import contextlib
import re
import secrets
from dataclasses import dataclass
from typing import Iterable, Iterator, Mapping, NamedTuple, Optional

from ..errors import (
    AlreadyExistsError,
    InvalidConfigError,
    KafkaLogError,
    KafkaStorageError,
    StorageNotFoundError,
    UnsupportedOperationError,
)


@dataclass(frozen=True)
class StorageGuarantees:
    """What a backend promises; each backend's class docstring says why it can.

    ``atomic_create_if_absent``: concurrent ``create_if_absent`` calls on one path, from any
    processes that share the storage, have exactly one winner, and readers see either nothing or the
    winner's whole content (never a prefix, even if the writer dies mid-way).
    ``atomic_replace``: a reader sees the old or the new content whole, never a mix or a prefix.
    ``append``: ``append`` is supported at all. It is never atomic: a writer killed mid-append can
    leave a prefix of its data, and a concurrent reader can see one; the log layer must recover by
    validating batches (as Kafka does) and truncating the torn tail.
    ``truncate_in_place``: ``truncate`` cuts the file without rewriting it (else it is a read of the
    prefix plus a ``replace``, which costs a copy and races with concurrent writers).
    ``read_after_write`` / ``list_after_write``: once a write returns, every process (that the
    backend serves, see ``multi_process``) reads the new content / lists the new name.
    ``durable_on_return``: a returned write survives a machine crash, not just a process crash.
    ``multi_process``: other processes (other executors, CLIs) see the same data at all.
    """

    atomic_create_if_absent: bool
    atomic_replace: bool
    append: bool
    truncate_in_place: bool
    read_after_write: bool
    list_after_write: bool
    durable_on_return: bool
    multi_process: bool


class FileInfo(NamedTuple):
    name: str
    size: int
    #: modification time on the storage's clock, where the listing told it at no extra cost
    #: (a local stat, an object store's LastModified); None where it did not. Not a field:
    #: two listings of the same files compare equal whenever they were made
    mtime = None


class _TimedFileInfo(FileInfo):
    pass


def listed_file(name: str, size: int, mtime: Optional[float]) -> FileInfo:
    """A :class:`FileInfo` that also carries its ``mtime``."""
    info = _TimedFileInfo(name, size)
    info.mtime = mtime
    return info


# A writer that is killed between writing its temp file and publishing it leaves the temp file
# behind; the name must say so unambiguously, so listings can hide it and cleanup can remove it.
_TEMP_RE = re.compile(r"^\..+\.tmp-[0-9a-f]{16}$")
# '*?[' would be glob patterns to several fsspec calls; '\\' is a separator on Windows.
_FORBIDDEN_CHARS = frozenset("\x00\\*?[")


def temp_name_for(name: str) -> str:
    return f".{name}.tmp-{secrets.token_hex(8)}"


def split_path(path: str, *, allow_root: bool = False) -> list[str]:
    """Validated components of a root-relative path.

    The checks are what keeps a caller-supplied topic or file name from reaching outside the
    storage root: no absolute paths, no '..' or '.', no empty components (which '//' would be, and
    which object stores would turn into distinct keys).
    """
    if not isinstance(path, str):
        raise InvalidConfigError(f"storage path must be a str, got {type(path).__name__}: {path!r}")
    if path == "":
        if allow_root:
            return []
        raise InvalidConfigError("storage path must not be empty")
    if path.startswith("/"):
        raise InvalidConfigError(f"storage path must be relative to the storage root: {path!r}")
    parts = path.split("/")
    if allow_root and parts[-1] == "":
        parts.pop()  # a directory may be written with a trailing slash
    for part in parts:
        if part in ("", ".", ".."):
            raise InvalidConfigError(f"storage path has an empty, '.' or '..' component: {path!r}")
        if _FORBIDDEN_CHARS.intersection(part):
            raise InvalidConfigError(f"storage path has a forbidden character (NUL, \\, *, ?, [): {path!r}")
    return parts


def check_range(start: int, end: int | None) -> None:
    if not isinstance(start, int) or start < 0:
        raise InvalidConfigError(f"read start must be an int >= 0, got {start!r}")
    if end is not None and (not isinstance(end, int) or end < start):
        raise InvalidConfigError(f"read end must be None or an int >= start ({start}), got {end!r}")


# Exceptions from the backend's client libraries that are not OSErrors (connection resets, timeouts
# inside botocore/aiohttp) are still storage failures, and callers should see one type for them.
_BACKEND_MODULES = ("botocore", "aiobotocore", "aiohttp", "s3fs", "fsspec", "gcsfs", "adlfs",
                    "urllib3", "requests")


@contextlib.contextmanager
def storage_errors(op: str, where: str) -> Iterator[None]:
    try:
        yield
    except KafkaLogError:
        raise
    except FileNotFoundError as e:
        raise StorageNotFoundError(f"{op} {where}: not found ({e})") from e
    except FileExistsError as e:
        if op == "create":
            raise AlreadyExistsError(f"{op} {where}: already exists") from e
        # e.g. a file where a parent directory should be: not a lost race, so not AlreadyExists
        raise KafkaStorageError(f"{op} {where}: something is in the way ({e})") from e
    except OSError as e:
        raise KafkaStorageError(f"{op} {where}: {e}") from e
    except Exception as e:
        if type(e).__module__.split(".")[0] in _BACKEND_MODULES:
            raise KafkaStorageError(f"{op} {where}: {type(e).__name__}: {e}") from e
        raise


class Storage(abc.ABC):
    """A tree of files under one root, with only the primitives the log format needs.

    Paths are '/'-separated and relative to the root (see :func:`split_path`). Directories are
    implicit on object stores: there a directory exists only while it holds a file, so code must not
    rely on empty directories persisting (they may on local disk) or on ``makedirs`` being visible.
    Every method raises :class:`KafkaStorageError` subclasses only, with the path in the message.
    """

    url: str

    @property
    @abc.abstractmethod
    def guarantees(self) -> StorageGuarantees: ...

    @staticmethod
    def is_temp_name(name: str) -> bool:
        """True for the temp files a writer creates before publishing (see ``cleanup_temp_files``)."""
        return bool(_TEMP_RE.match(name.rsplit("/", 1)[-1]))

    def _where(self, path: str) -> str:
        return f"{self.url.rstrip('/')}/{path}"

    # -- reads ----------------------------------------------------------------------------------

    @abc.abstractmethod
    def read(self, path: str, start: int = 0, end: int | None = None) -> bytes:
        """Bytes ``[start, end)``; a range past the end returns what exists (maybe b"")."""

    def read_into(self, path: str, start: int, out) -> int:
        """Fill the writable buffer ``out`` with the bytes from ``start``; returns how many were
        read (fewer at the end of the file).

        Why: a reader that allocates its own buffers (from Arrow's pool, which keeps its pages)
        avoids the fresh ``bytes`` object, and the page faults, of every large ``read``. This
        default copies a ``read``; backends that can read straight into memory override it.
        """
        view = memoryview(out).cast("B")
        data = self.read(path, start, start + len(view))
        view[:len(data)] = data
        return len(data)

    def map(self, path: str):
        """The whole file as a read-only ``memoryview`` over the OS page cache, or None when
        the backend cannot map files (object stores, memory; local storage on a network or FUSE
        filesystem, where another host could delete a mapped file) or the file is empty.

        Why: a mapped read costs no copy into the process. The catch is POSIX's: touching a
        mapped page past the end of a file that was truncated meanwhile kills the process with
        SIGBUS. Map only files that are never truncated or rewritten in place (a cluster's
        segments, which are published whole and only ever deleted; unlinking a mapped file is
        safe). The mapping lives as long as views of it do.
        """
        return None

    @abc.abstractmethod
    def size(self, path: str) -> int: ...

    @abc.abstractmethod
    def exists(self, path: str) -> bool:
        """Whether a *file* is at ``path``: directories are implicit on object stores."""

    @abc.abstractmethod
    def list(self, dir_path: str = "") -> list[FileInfo]:
        """Direct child files, sorted by name, temp files hidden; [] for a missing directory."""

    def list_names(self, dir_path: str = "") -> list[str]:
        """The names :meth:`list` gives, where a backend can tell them for less (a local
        directory without a stat per file: a metadata log's listing on a cold open)."""
        return [f.name for f in self.list(dir_path)]

    @abc.abstractmethod
    def list_dirs(self, dir_path: str = "") -> list[str]:
        """Names of direct child directories, sorted; [] for a missing directory."""

    @abc.abstractmethod
    def mtime(self, path: str) -> float:
        """Last modification time, seconds since the epoch (the backend's clock, not ours)."""

    # -- writes ---------------------------------------------------------------------------------

    @abc.abstractmethod
    def create_if_absent(self, path: str, data: bytes) -> None:
        """Publish ``data`` at ``path`` only if nothing is there; else :class:`AlreadyExistsError`.

        This is the one mutual-exclusion primitive the project has (epoch claims, commit markers):
        check ``guarantees.atomic_create_if_absent`` before relying on it across processes.
        """

    def create_if_absent_pieces(self, path: str, pieces) -> None:
        """:meth:`create_if_absent` of the concatenation of ``pieces`` (a list of buffers).

        Why: a segment is many batches. A backend that can write them one after another (local
        disk: ``writev``) saves joining them into one more copy of the whole segment; this
        default joins them.
        """
        self.create_if_absent(path, b"".join(pieces))

    def create_in_place(self, path: str, data: bytes) -> None:
        """Create ``path`` holding ``data`` only if nothing is there (else
        :class:`AlreadyExistsError`), without :meth:`create_if_absent`'s promise that it appears
        whole: a crash may leave part of it under its name. Only for files that mean nothing
        until another one exists (a segment's indexes before its ``.log``, docs/protocol.md
        §3). Where creation is all-or-nothing anyway (object stores) this is
        :meth:`create_if_absent`; local disk saves the temp file and the link."""
        self.create_if_absent(path, data)

    def create_segment(self, dir_path: str, files) -> None:
        """Create a segment's files in ``dir_path``, in the order given: ``(name, bytes)`` with
        :meth:`create_in_place` (an index), ``(name, [buffers])`` with
        :meth:`create_if_absent_pieces` (the ``.log``, published whole). On any failure
        (:class:`AlreadyExistsError` when a name is taken) the files this call created are
        removed again and the error is raised. Why one call per segment: local disk resolves
        the directory once for all three files; a task writing to 1,000 partitions creates
        3,000 of them."""
        self.makedirs(dir_path)
        done = []
        try:
            for name, content in files:
                path = f"{dir_path}/{name}"
                if isinstance(content, list):
                    self.create_if_absent_pieces(path, content)
                else:
                    self.create_in_place(path, content)
                done.append(path)
        except BaseException:
            for path in done:
                try:
                    self.delete(path)
                except Exception:
                    pass   # cleanup removes index files without a .log later
            raise

    #: whether a writer may write several files at once from threads (one partition's
    #: segments per thread), because that is safe here and pays: concurrent writes overlap the
    #: device's latency, and their syncs share the filesystem's journal commits
    concurrent_writes = False

    #: whether every call is a request to a remote store, priced and slow (S3, GCS): then a
    #: commit leaves the derived Kafka files to maintenance, as a Kafka broker writes its
    #: checkpoints on a timer (docs/protocol.md §8), and a warm produce costs its data's PUTs,
    #: its two entries and one read of the log's head
    remote = False

    def flush(self, dir_path: str = "") -> None:
        """Make every file already written under ``dir_path`` durable, whoever wrote it: what
        writes their topic did not ask to flush left to the kernel (docs/protocol.md §3,
        "Durability"), before a recovery point says it is on the device. Nothing to do where
        each write is durable when it returns (object stores) or where nothing ever is."""

    def sync_batch(self, durable: bool = True):
        """A :class:`~pyspark_kafkalog.storage.local_sync.SyncBatch` where files created by jobs it
        wraps may be made durable together, at its ``sync()``, instead of one by one (or, with
        ``durable=False``, left to the kernel's write-back); None where each create is durable
        on its own anyway (object stores)."""
        return None

    #: whether writers should spool (:meth:`open_spool`) rather than keep a file's content
    #: and write it whole: where a spool overlaps the kernel's work with theirs
    can_spool = False

    def open_spool(self, dir_path: str, hint: str, head: int = 0):
        """A file in ``dir_path`` that is written as its content is produced and published
        whole at the end (``storage.local_spool.LocalSpool``: ``append``, ``publish`` with
        patches, ``discard``), or None where the backend cannot do that (object stores write
        an object in one request): the caller then keeps the content and uses
        :meth:`create_if_absent_pieces`. ``hint`` goes into the temp file's name. ``head``:
        the patches will mostly fall in the first ``head`` bytes of appended pieces (an
        O_DIRECT spool keeps those blocks so as not to read them back)."""
        return None

    def publish_stream(self, path: str, chunks: Iterable, *, replace: bool = False) -> None:
        """Publish the concatenation of ``chunks`` (buffers, produced as they are consumed) at
        ``path``: create-if-absent (:class:`AlreadyExistsError` if taken), or with ``replace`` an
        atomic replace. If producing a chunk raises, nothing is published and the error goes on.

        Why: copying a segment between stores must not hold the whole file in memory, and a
        producer that checks what it yields (a replica copy) must be able to veto the publish
        after the last byte. This default spools where the backend can and otherwise joins the
        chunks (backends that only write whole objects and have no streaming upload).
        """
        directory, _, name = path.rpartition("/")
        split_path(path)
        spool = self.open_spool(directory, name) if self.can_spool else None
        if spool is None:
            data = b"".join(bytes(c) for c in chunks)
            (self.replace if replace else self.create_if_absent)(path, data)
            return
        try:
            for chunk in chunks:
                spool.append([chunk])
        except BaseException:
            spool.discard()
            raise
        spool.publish(path, replace=replace)

    def checksum(self, path: str) -> Optional[str]:
        """A digest of the whole content that the store computed and keeps (``"crc32c:…"``,
        ``"md5:…"``), or None where it keeps none comparable (the default). Two objects with
        the same token hold the same bytes.

        Why: a server-side copy can then be verified against its source without either passing
        through this process."""
        return None

    def copy_from(self, src: "Storage", src_path: str, dst_path: str, *,
                  replace: bool = False) -> bool:
        """Copy ``src_path`` of ``src`` to ``dst_path`` here without the bytes passing through
        this process, as :meth:`create_if_absent` (or :meth:`replace` with ``replace``) would
        publish them; False, with nothing done, where this backend cannot (the default).

        Why: replicas of a partition on one object store should not pay a download and an
        upload per segment. Callers must still check the result: a backend that copies
        promises the copy is whole, not that the source was sound.
        """
        return False

    @abc.abstractmethod
    def replace(self, path: str, data: bytes) -> None:
        """Set the whole content of ``path`` (creating it); see ``guarantees.atomic_replace``."""

    def replace_many(self, contents: Mapping[str, bytes]) -> None:
        """:meth:`replace` of each ``{path: data}``: each file atomically, not all together.
        Backends may share one durability barrier among them (local disk)."""
        for path, data in contents.items():
            self.replace(path, data)

    def append(self, path: str, data: bytes) -> None:
        """Add ``data`` at the end of ``path`` (creating it); never atomic, see StorageGuarantees."""
        split_path(path)
        raise UnsupportedOperationError(
            f"append {self._where(path)}: {type(self).__name__} cannot append; write whole objects")

    @abc.abstractmethod
    def truncate(self, path: str, size: int) -> None:
        """Cut ``path`` to its first ``size`` bytes (never extends it)."""

    @abc.abstractmethod
    def delete(self, path: str, missing_ok: bool = True) -> None: ...

    def delete_many(self, paths: Iterable[str]) -> None:
        """Delete every path, missing ones included; not atomic as a group."""
        for path in paths:
            self.delete(path, missing_ok=True)

    @abc.abstractmethod
    def delete_tree(self, dir_path: str) -> None:
        """Delete a directory and everything under it (nothing if it is missing); not atomic."""

    @abc.abstractmethod
    def makedirs(self, dir_path: str) -> None:
        """Ensure a directory exists where the backend has directories (a no-op on object stores)."""

    def keep_roots(self, names: Iterable[str]) -> None:
        """The first-level directories ``names`` are roots of their own (log dirs): from now on
        no write creates one of them again. One that is gone (moved away, unmounted) fails the
        write instead of coming back empty. Where there are no directories this does nothing."""

    # -- maintenance ----------------------------------------------------------------------------

    def clock(self, dir_path: str = "") -> float:
        """The storage's own time now, seconds since the epoch: the mtime of a probe file that
        is created in ``dir_path`` and deleted again.

        Why: times that many processes compare (a reservation's age, a temp file's age) must
        come from one clock. Every file's mtime is the backend's (the kernel's, an object
        store's server), while each process's clock may be off either way; comparing a file's
        mtime with this, not with ``time.time()``, keeps a skewed process from judging others.
        """
        split_path(dir_path, allow_root=True)
        probe = temp_name_for("clock")
        path = f"{dir_path.rstrip('/')}/{probe}" if dir_path else probe
        self.create_if_absent(path, b"")
        try:
            return self.mtime(path)
        finally:
            self.delete(path, missing_ok=True)

    @abc.abstractmethod
    def _list_temp_files(self, dir_path: str) -> list[tuple[str, float]]:
        """(name, mtime) of the temp files directly under ``dir_path``."""

    def cleanup_temp_files(self, dir_path: str, older_than_s: float) -> list[str]:
        """Delete temp files left by killed writers; returns the names removed.

        ``older_than_s`` must exceed the longest write a live writer may still be doing, since a
        temp file of a write in progress looks exactly like an abandoned one. Deleting one anyway
        costs that writer its write (it gets an error), not anyone's data.
        """
        if older_than_s < 0:
            raise InvalidConfigError(f"older_than_s must be >= 0, got {older_than_s!r}")
        split_path(dir_path, allow_root=True)
        listed = self._list_temp_files(dir_path)
        if not listed:
            return []
        cutoff = self.clock(dir_path) - older_than_s   # the files' clock, not ours
        removed = []
        for name, mtime in listed:
            if mtime <= cutoff:
                self.delete(f"{dir_path.rstrip('/')}/{name}" if dir_path else name, missing_ok=True)
                removed.append(name)
        return sorted(removed)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"
