"""A cluster root's storage with log dirs that live at other URLs mounted at their names.

A kafkalog cluster names its log dirs (``logdir-0``, ``logdir-1``, ...) and every layer above
storage builds paths from those names: ``<log dir>/<topic>-<partition>/<segment>``. A log dir
registered at another URL (another bucket, another disk: docs/protocol.md §1.1) must be reached
at that URL instead. Doing that here, once, means no caller can forget it: a writer, a reader,
retention and cleanup that use the cluster's storage with a replica's path land on the replica's
own root. Paths of the root's own log dirs and of ``_kafkalog/`` go to the root's storage
unchanged (one dictionary lookup per call), so a cluster without such log dirs behaves as before.
"""
from __future__ import annotations

import threading
from typing import Callable, Dict, Iterable, Mapping, Optional, Sequence, Tuple

from ..errors import AlreadyExistsError, InvalidConfigError
from .base import Storage, StorageGuarantees

Resolver = Callable[[str], Optional[Storage]]


class MountedStorage(Storage):
    """``base`` with other storages at some first path components.

    ``resolve(name)`` is asked, once per name, for a first path component that is neither one
    of ``local`` (the root's own directories) nor mounted yet; it returns the storage of the log
    dir of that name, or None for a name that is the root's (then asked again next time, since
    a log dir may be registered meanwhile; only names ``may_mount`` accepts are asked at all).
    """

    def __init__(self, base: Storage, resolve: Resolver, *, local: Iterable[str] = (),
                 may_mount: Callable[[str], bool] = lambda name: True):
        self.base = base
        self._resolve = resolve
        self._may_mount = may_mount
        self._local = set(local)
        self._mounts: Dict[str, Storage] = {}
        self._lock = threading.Lock()

    # -- routing --------------------------------------------------------------------------------

    def set_local(self, names: Iterable[str]) -> None:
        self._local = set(names)

    def keep_roots(self, names: Iterable[str]) -> None:
        self.base.keep_roots(names)

    def mounted(self, name: str) -> Optional[Storage]:
        """The storage of the log dir ``name`` if it lives elsewhere (resolving it), else None."""
        m = self._mounts.get(name)
        if m is not None or name in self._local or not self._may_mount(name):
            return m
        with self._lock:
            m = self._mounts.get(name)
            if m is None:
                m = self._resolve(name)
                if m is not None:
                    self._mounts[name] = m
        return m

    def _route(self, path: str) -> Tuple[Storage, str]:
        if not isinstance(path, str):
            return self.base, path
        head, _, rest = path.partition("/")
        m = self._mounts.get(head)
        if m is None:
            if head in self._local or not self._may_mount(head):
                return self.base, path
            m = self.mounted(head)
            if m is None:
                return self.base, path
        return m, rest

    def _group(self, paths: Iterable[str]) -> Dict[int, Tuple[Storage, list]]:
        groups: Dict[int, Tuple[Storage, list]] = {}
        for path in paths:
            st, sub = self._route(path)
            groups.setdefault(id(st), (st, []))[1].append((path, sub))
        return groups

    # -- what the root's storage says -------------------------------------------------------------

    @property
    def url(self) -> str:   # type: ignore[override]
        return self.base.url

    @property
    def guarantees(self) -> StorageGuarantees:
        return self.base.guarantees

    @property
    def concurrent_writes(self) -> bool:   # type: ignore[override]
        return self.base.concurrent_writes

    @property
    def remote(self) -> bool:   # type: ignore[override]
        return self.base.remote

    @property
    def can_spool(self) -> bool:   # type: ignore[override]
        return self.base.can_spool

    def flush(self, dir_path: str = "") -> None:
        if not dir_path:   # the root and every log dir mounted on it
            self.base.flush("")
            for m in list(self._mounts.values()):
                m.flush("")
            return
        st, sub = self._route(dir_path)
        st.flush(sub)

    def sync_batch(self, durable: bool = True):
        """The root's: files a wrapped job creates on a mounted log dir are synced as they are
        created, by their own storage (durable either way, even where ``durable`` is False)."""
        return self.base.sync_batch(durable)

    def _where(self, path: str) -> str:
        st, sub = self._route(path)
        return st._where(sub)

    def __getattr__(self, name):
        # backend specifics (``_direct``, ``root``, ...) are the root's; only reached for names
        # this class does not define
        if name == "base":
            raise AttributeError(name)
        return getattr(self.base, name)

    # -- reads ----------------------------------------------------------------------------------

    def read(self, path: str, start: int = 0, end: Optional[int] = None) -> bytes:
        st, sub = self._route(path)
        return st.read(sub, start, end)

    def read_into(self, path: str, start: int, out) -> int:
        st, sub = self._route(path)
        return st.read_into(sub, start, out)

    def map(self, path: str):
        st, sub = self._route(path)
        return st.map(sub)

    def size(self, path: str) -> int:
        st, sub = self._route(path)
        return st.size(sub)

    def exists(self, path: str) -> bool:
        st, sub = self._route(path)
        return st.exists(sub)

    def checksum(self, path: str) -> Optional[str]:
        st, sub = self._route(path)
        return st.checksum(sub)

    def list(self, dir_path: str = ""):
        st, sub = self._route(dir_path)
        return st.list(sub)

    def list_names(self, dir_path: str = ""):
        st, sub = self._route(dir_path)
        return st.list_names(sub)

    def list_dirs(self, dir_path: str = ""):
        st, sub = self._route(dir_path)
        return st.list_dirs(sub)

    def mtime(self, path: str) -> float:
        st, sub = self._route(path)
        return st.mtime(sub)

    # -- writes ---------------------------------------------------------------------------------

    def create_if_absent(self, path: str, data: bytes) -> None:
        st, sub = self._route(path)
        st.create_if_absent(sub, data)

    def create_if_absent_pieces(self, path: str, pieces) -> None:
        st, sub = self._route(path)
        st.create_if_absent_pieces(sub, pieces)

    def create_in_place(self, path: str, data: bytes) -> None:
        st, sub = self._route(path)
        st.create_in_place(sub, data)

    def create_segment(self, dir_path: str, files) -> None:
        st, sub = self._route(dir_path)
        st.create_segment(sub, files)

    def open_spool(self, dir_path: str, hint: str, head: int = 0):
        st, sub = self._route(dir_path)
        if st is self.base:
            return self.base.open_spool(dir_path, hint, head)
        spool = st.open_spool(sub, hint, head) if st.can_spool else None
        if spool is None:
            # the caller spools because the root can; this log dir's storage cannot
            return BufferSpool(self) if self.can_spool else None
        return _MountedSpool(spool, dir_path.partition("/")[0] + "/")

    def replace(self, path: str, data: bytes) -> None:
        st, sub = self._route(path)
        st.replace(sub, data)

    def publish_stream(self, path: str, chunks, *, replace: bool = False) -> None:
        st, sub = self._route(path)
        st.publish_stream(sub, chunks, replace=replace)

    def copy_from(self, src: Storage, src_path: str, dst_path: str, *,
                  replace: bool = False) -> bool:
        st, sub = self._route(dst_path)
        if isinstance(src, MountedStorage):
            src, src_path = src._route(src_path)
        return st.copy_from(src, src_path, sub, replace=replace)

    def replace_many(self, contents: Mapping[str, bytes]) -> None:
        for st, items in self._group(contents).values():
            st.replace_many({sub: contents[path] for path, sub in items})

    def append(self, path: str, data: bytes) -> None:
        st, sub = self._route(path)
        st.append(sub, data)

    def truncate(self, path: str, size: int) -> None:
        st, sub = self._route(path)
        st.truncate(sub, size)

    def delete(self, path: str, missing_ok: bool = True) -> None:
        st, sub = self._route(path)
        st.delete(sub, missing_ok=missing_ok)

    def delete_many(self, paths: Iterable[str]) -> None:
        for st, items in self._group(paths).values():
            st.delete_many([sub for _, sub in items])

    def delete_tree(self, dir_path: str) -> None:
        st, sub = self._route(dir_path)
        if st is not self.base and not sub:
            raise InvalidConfigError(f"delete_tree {dir_path!r}: a mounted log dir is not "
                                     "removed as a whole")
        st.delete_tree(sub)

    def makedirs(self, dir_path: str) -> None:
        st, sub = self._route(dir_path)
        st.makedirs(sub)

    # -- maintenance ----------------------------------------------------------------------------

    def clock(self, dir_path: str = "") -> float:
        st, sub = self._route(dir_path)
        return st.clock(sub)

    def _list_temp_files(self, dir_path: str):
        st, sub = self._route(dir_path)
        return st._list_temp_files(sub)

    def cleanup_temp_files(self, dir_path: str, older_than_s: float):
        st, sub = self._route(dir_path)   # judged by that storage's own clock
        return st.cleanup_temp_files(sub, older_than_s)

    def __repr__(self) -> str:
        return f"MountedStorage({self.base!r}, mounts={sorted(self._mounts)})"


class _MountedSpool:
    """A mounted storage's spool, published under the cluster-relative path callers use."""

    def __init__(self, spool, prefix: str):
        self._spool, self._prefix = spool, prefix

    def append(self, pieces: Sequence) -> None:
        self._spool.append(pieces)

    def publish(self, path: str, patches=(), *, replace: bool = False) -> None:
        if not path.startswith(self._prefix):
            self._spool.discard()
            raise ValueError(f"spool in {self._prefix!r} cannot be published as {path!r}")
        self._spool.publish(path[len(self._prefix):], patches, replace=replace)

    def discard(self) -> None:
        self._spool.discard()

    def __getattr__(self, name):
        return getattr(self._spool, name)


class BufferSpool:
    """A spool in memory, for a log dir whose storage cannot spool (an object store) written by
    a caller that spools because the root can: published whole, with ``create_if_absent``."""

    def __init__(self, storage: Storage):
        self._storage = storage
        self._pieces: list = []
        self.size = 0

    def append(self, pieces: Sequence) -> None:
        for p in pieces:
            b = bytes(p)          # the caller may reuse its buffers once this returns
            self._pieces.append(b)
            self.size += len(b)

    def publish(self, path: str, patches=(), *, replace: bool = False) -> None:
        try:
            data = bytearray(b"".join(self._pieces))
            for pos, patch in patches:
                if pos < 0 or pos + len(patch) > len(data):
                    raise ValueError(f"patch at {pos} outside the spool's {len(data)} bytes")
                data[pos:pos + len(patch)] = patch
            try:
                self._storage.create_if_absent(path, bytes(data))
            except AlreadyExistsError:
                if not replace:
                    raise
                self._storage.replace(path, bytes(data))
        finally:
            self.discard()

    def discard(self) -> None:
        self._pieces, self.size = [], 0
