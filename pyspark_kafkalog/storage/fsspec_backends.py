"""Backends over an fsspec filesystem: a generic one for any protocol, and the in-memory one.

fsspec hides what each filesystem really promises (a PUT to S3 is atomic, a write over SFTP is
not), so the generic backend claims nothing it cannot know and refuses ``create_if_absent``
outright; backends whose semantics are known (memory here, S3 in :mod:`.s3`) subclass it and
say exactly what they keep.
"""
from __future__ import annotations

import datetime as _dt
import functools
import threading

from ..errors import AlreadyExistsError, InvalidConfigError, StorageNotFoundError, UnsupportedOperationError
from .base import FileInfo, Storage, listed_file, StorageGuarantees, check_range, split_path, storage_errors


class FsspecStorage(Storage):
    """Any fsspec filesystem whose semantics we have not verified.

    Guarantees are all False except ``multi_process``: whether a write is atomic, visible at once,
    or durable depends on the protocol and sometimes the server. ``create_if_absent`` raises
    :class:`UnsupportedOperationError` because a non-atomic version (check, then write) would let
    two writers both believe they won an epoch claim, which silently corrupts a log; ``replace``
    works but is only as atomic as the protocol's whole-file write. ``append`` is unsupported.
    """

    remote = True   # a generic fsspec backend is a remote store (GCS, Azure, ...)

    _GUARANTEES = StorageGuarantees(
        atomic_create_if_absent=False, atomic_replace=False, append=False, truncate_in_place=False,
        read_after_write=False, list_after_write=False, durable_on_return=False, multi_process=True)

    def __init__(self, fs, root: str, url: str):
        self._fs = fs
        self._root = root.rstrip("/")
        self.url = url

    @property
    def guarantees(self) -> StorageGuarantees:
        return self._GUARANTEES

    @property
    def fs(self):
        """The fsspec filesystem, for code inside this package only (it alone may use fsspec)."""
        return self._fs

    def _full(self, path: str, *, allow_root: bool = False) -> str:
        parts = split_path(path, allow_root=allow_root)
        return "/".join([self._root, *parts]) if self._root else "/".join(parts)

    # -- reads ----------------------------------------------------------------------------------

    def _file_info(self, path: str, op: str) -> dict:
        full = self._full(path)
        where = self._where(path)
        with storage_errors(op, where):
            info = self._fs.info(full)
        if info.get("type") != "file":
            raise StorageNotFoundError(f"{op} {where}: not found (it is a {info.get('type')})")
        return info

    def read(self, path: str, start: int = 0, end: int | None = None) -> bytes:
        check_range(start, end)
        if end is not None and end == start:
            self._file_info(path, "read")  # still report a missing file
            return b""
        full = self._full(path)
        with storage_errors("read", self._where(path)):
            return self._fs.cat_file(full, start=start or None, end=end)

    def size(self, path: str) -> int:
        return int(self._file_info(path, "size")["size"])

    def exists(self, path: str) -> bool:
        try:
            self._file_info(path, "exists")
        except StorageNotFoundError:
            return False
        return True

    def mtime(self, path: str) -> float:
        info = self._file_info(path, "mtime")
        value = _info_mtime(info)
        if value is None:
            with storage_errors("mtime", self._where(path)):
                value = _as_timestamp(self._fs.modified(self._full(path)))
        return value

    def _ls(self, dir_path: str) -> list[dict]:
        full = self._full(dir_path, allow_root=True)
        with storage_errors("list", self._where(dir_path)):
            try:
                entries = self._fs.ls(full, detail=True)
            except (FileNotFoundError, NotADirectoryError):
                return []
        own = full.strip("/")
        return [e for e in entries if e["name"].strip("/") != own]  # some ls() return a file itself

    def list(self, dir_path: str = "") -> list[FileInfo]:
        return sorted(listed_file(_basename(e["name"]), int(e.get("size") or 0), _info_mtime(e))
                      for e in self._ls(dir_path)
                      if e.get("type") == "file" and not self.is_temp_name(_basename(e["name"])))

    def list_dirs(self, dir_path: str = "") -> list[str]:
        return sorted({_basename(e["name"]) for e in self._ls(dir_path) if e.get("type") == "directory"})

    def _list_temp_files(self, dir_path: str) -> list[tuple[str, float]]:
        out = []
        for e in self._ls(dir_path):
            name = _basename(e["name"])
            if e.get("type") == "file" and self.is_temp_name(name):
                mtime = _info_mtime(e)
                out.append((name, mtime if mtime is not None else 0.0))
        return out

    # -- writes ---------------------------------------------------------------------------------

    def create_if_absent(self, path: str, data: bytes) -> None:
        raise UnsupportedOperationError(
            f"create {self._where(path)}: atomic create-if-absent is not known to hold for the "
            f"{self._fs.protocol!r} protocol, so it is refused rather than faked with check-then-write")

    def replace(self, path: str, data: bytes) -> None:
        full = self._full(path)
        with storage_errors("replace", self._where(path)):
            self._fs.pipe_file(full, bytes(data))

    def truncate(self, path: str, size: int) -> None:
        """Read the prefix and ``replace`` it: object stores cannot cut an object in place.

        Not safe against a concurrent writer of the same path (its write can be undone), which the
        log layer excludes anyway: a partition has one writer at a time.
        """
        if not isinstance(size, int) or size < 0:
            raise InvalidConfigError(f"truncate size must be an int >= 0, got {size!r}")
        current = self.size(path)
        if size > current:
            raise InvalidConfigError(f"truncate {self._where(path)}: size {size} is beyond the end ({current})")
        if size < current:
            self.replace(path, self.read(path, 0, size))

    def delete(self, path: str, missing_ok: bool = True) -> None:
        full = self._full(path)
        where = self._where(path)
        if not missing_ok and not self.exists(path):
            raise StorageNotFoundError(f"delete {where}: not found")
        with storage_errors("delete", where):
            try:
                self._fs.rm_file(full)
            except FileNotFoundError:
                if not missing_ok:
                    raise StorageNotFoundError(f"delete {where}: not found") from None

    def delete_tree(self, dir_path: str) -> None:
        full = self._full(dir_path)  # not the root: wiping the whole store is not a tree delete
        with storage_errors("delete_tree", self._where(dir_path)):
            try:
                self._fs.rm(full, recursive=True)
            except FileNotFoundError:
                pass

    def makedirs(self, dir_path: str) -> None:
        with storage_errors("makedirs", self._where(dir_path)):
            self._fs.makedirs(self._full(dir_path, allow_root=True), exist_ok=True)


# fsspec's memory filesystem is one dict per process, shared by every instance; one lock for it
# makes each of our operations indivisible against the others in this process.
_MEMORY_LOCK = threading.RLock()


def _locked(method):
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        with _MEMORY_LOCK:
            return method(self, *args, **kwargs)
    return wrapper


class MemoryStorage(FsspecStorage):
    """fsspec's ``memory://`` store: for tests and single-process (Spark local mode) runs.

    Every operation holds one process-wide lock, so ``create_if_absent`` has exactly one winner
    among threads and every read sees a whole write. The data lives in this process only
    (``multi_process`` False: an executor in another process sees its own, empty store) and
    nothing is durable. ``append`` and ``truncate`` work in place; mtimes have the local clock.
    """

    remote = False

    _GUARANTEES = StorageGuarantees(
        atomic_create_if_absent=True, atomic_replace=True, append=True, truncate_in_place=True,
        read_after_write=True, list_after_write=True, durable_on_return=False, multi_process=False)

    def __init__(self, name: str):
        import fsspec
        super().__init__(fsspec.filesystem("memory"), "/" + name.strip("/"), f"memory://{name.strip('/')}")

    def __reduce__(self):
        return (MemoryStorage, (self._root.lstrip("/"),))

    read = _locked(FsspecStorage.read)
    size = _locked(FsspecStorage.size)
    exists = _locked(FsspecStorage.exists)
    _ls = _locked(FsspecStorage._ls)
    replace = _locked(FsspecStorage.replace)
    delete = _locked(FsspecStorage.delete)
    delete_tree = _locked(FsspecStorage.delete_tree)
    makedirs = _locked(FsspecStorage.makedirs)

    @_locked
    def mtime(self, path: str) -> float:
        self._file_info(path, "mtime")
        with storage_errors("mtime", self._where(path)):  # info() has only the creation time
            return _as_timestamp(self._fs.modified(self._full(path)))

    @_locked
    def create_if_absent(self, path: str, data: bytes) -> None:
        full = self._full(path)
        if self._fs.isfile(full):
            raise AlreadyExistsError(f"create {self._where(path)}: already exists")
        with storage_errors("create", self._where(path)):
            try:
                self._fs.pipe_file(full, bytes(data))
            except FileExistsError as e:  # a parent is a file (the target itself was absent)
                raise NotADirectoryError(f"a parent of {full} is a file") from e

    @_locked
    def append(self, path: str, data: bytes) -> None:
        full = self._full(path)
        with storage_errors("append", self._where(path)):
            if not self._fs.isfile(full):
                self._fs.pipe_file(full, bytes(data))
                return
            f = self._fs.open(full, "ab")  # the stored BytesIO itself, positioned at its end
            f.write(data)
            f.modified = _dt.datetime.now(tz=_dt.timezone.utc)

    @_locked
    def truncate(self, path: str, size: int) -> None:
        if not isinstance(size, int) or size < 0:
            raise InvalidConfigError(f"truncate size must be an int >= 0, got {size!r}")
        full = self._full(path)
        where = self._where(path)
        with storage_errors("truncate", where):
            f = self._fs.open(full, "r+b")  # the stored BytesIO itself
            current = f.getbuffer().nbytes
            if size > current:
                raise InvalidConfigError(f"truncate {where}: size {size} is beyond the end ({current})")
            f.truncate(size)
            f.modified = _dt.datetime.now(tz=_dt.timezone.utc)


def _basename(name: str) -> str:
    return name.rstrip("/").rsplit("/", 1)[-1]


def _as_timestamp(value) -> float | None:
    if isinstance(value, _dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=_dt.timezone.utc)
        return value.timestamp()
    if isinstance(value, (int, float)):
        return float(value)
    return None


def _info_mtime(info: dict) -> float | None:
    for key in ("mtime", "LastModified", "last_modified", "modified", "updated", "created"):
        value = _as_timestamp(info.get(key))
        if value is not None:
            return value
    return None
