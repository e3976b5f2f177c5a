"""Local (or network-mounted POSIX) disk, through ``os`` directly.

fsspec's local filesystem has no hard links, no O_EXCL and no fsync, and those three are exactly
what the guarantees below are built from, so this backend talks to the OS itself.
"""
from __future__ import annotations

import errno
import logging
import os
import shutil
import stat
import threading
from typing import List, Optional

from ..errors import (AlreadyExistsError, InvalidConfigError, KafkaStorageError,
                      StorageNotFoundError)
from .base import (listed_file, 
    FileInfo,
    Storage,
    StorageGuarantees,
    check_range,
    split_path,
    storage_errors,
    temp_name_for,
)
from . import local_sync
from .local_spool import LocalDirectSpool, LocalSpool
from .local_sync import SyncBatch
from .posix_io import NO_LINK_ERRNOS, ensure_dir, unlink_quietly, write_direct, writev_all

log = logging.getLogger(__name__)

#: Smaller files are written through the page cache: for them the copy into the aligned staging
#: buffer and the extra calls cost more than the page cache does.
_DIRECT_MIN = 1 << 20
#: whether files can be created relative to an open directory (``create_segment``)
_DIR_FD = {os.open, os.link, os.unlink} <= os.supports_dir_fd

#: ``copy_from`` leaves smaller files to the caller, which streams them: one read and one write
#: through the process cost less there than a copy in the kernel plus the read back that checks it.
KERNEL_COPY_MIN = 1 << 20

#: Filesystems whose ``copy_file_range`` moves no data through the page cache: a reflink
#: (btrfs, xfs with reflink, bcachefs, ocfs2, zfs block cloning) or a copy on the server (NFS
#: 4.2, SMB). Elsewhere (ext4, tmpfs, ...) the kernel copies page by page into the page cache,
#: which measured slower than the copier's own O_DIRECT stream (docs/performance.md
#: "Replication"), so ``copy_from`` declines there unless ``kernel_copy=True``.
_OFFLOAD_COPY_FS = frozenset({"btrfs", "xfs", "bcachefs", "ocfs2", "zfs", "nfs", "nfs4",
                              "cifs", "smb3"})


#: Filesystems whose files only this machine's kernel changes: a file mapped here cannot vanish
#: under the mapping. On network and FUSE filesystems another host may delete a mapped file,
#: and touching its pages then kills the reader with SIGBUS instead of raising an error.
_MAPPABLE_FS = frozenset({"ext2", "ext3", "ext4", "xfs", "btrfs", "tmpfs", "zfs", "f2fs",
                          "overlay", "ramfs", "jfs", "reiserfs", "bcachefs"})


def _mount_fs_type(path: str, mounts: str) -> Optional[str]:
    """The filesystem type of the mount holding ``path`` in a ``/proc/self/mounts`` table (the
    longest mount point that is a prefix of it), or None."""
    best, fs_type = "", None
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        if (path == point or path.startswith(point.rstrip("/") + "/")) and len(point) >= len(best):
            best, fs_type = point, fields[2]
    return fs_type


def _can_map(path: str) -> bool:
    """Whether files under ``path`` are safe to map: Linux, on a known local filesystem."""
    try:
        with open("/proc/self/mounts", encoding="utf-8", errors="replace") as f:
            mounts = f.read()
    except OSError:   # not Linux: no cheap way to tell NFS apart, so do not map
        return False
    return _mount_fs_type(os.path.realpath(path), mounts) in _MAPPABLE_FS


def _copy_offloads(path: str) -> bool:
    """Whether ``copy_file_range`` under ``path`` reflinks or copies on a server (Linux)."""
    try:
        with open("/proc/self/mounts", encoding="utf-8", errors="replace") as f:
            mounts = f.read()
    except OSError:
        return False
    return _mount_fs_type(os.path.realpath(path), mounts) in _OFFLOAD_COPY_FS


class LocalStorage(Storage):
    """A directory tree on a POSIX filesystem.

    * ``create_if_absent``: the content goes to a temp file in the target's directory, is fsynced,
      then published with ``link(tmp, target)``, which the kernel performs atomically and refuses if
      the target exists. So exactly one of any number of concurrent creators (in any processes on
      any hosts sharing a POSIX-correct mount) wins, and the target, once visible, is complete.
      If the filesystem cannot hard-link, it falls back to ``O_CREAT|O_EXCL`` on the target: still
      exactly one winner, but a reader may see a partially written file, and a writer killed
      mid-write leaves one; ``guarantees.atomic_create_if_absent`` then turns False.
    * ``replace``: temp file + fsync + ``rename`` (atomic replace on POSIX) + fsync of the directory.
    * ``append``: ``O_APPEND`` writes (+ fsync); concurrent appenders do not interleave within one
      ``write`` call on a local filesystem, but a killed writer can leave a torn tail.
    * ``truncate`` is in place; reads and listings see writes at once (one kernel page cache).
    * ``copy_from`` another ``LocalStorage``: ``copy_file_range`` into a temp file, fsync, then
      published like ``create_if_absent`` (or ``replace``); only where the filesystem reflinks
      or copies on the server, or with ``kernel_copy=True`` (see :meth:`copy_from`).
    * ``durable_on_return`` holds only with ``fsync=True`` (the default); tests switch it off for
      speed, which keeps every guarantee against process crashes, only not against power loss.
    * ``direct_io`` (default True; Linux): files of 1 MiB and more written whole by
      ``create_if_absent_pieces`` (segments) bypass the page cache (``O_DIRECT``, through an
      aligned staging buffer); the fsync and the link stay. Segments are written once and read
      later, often by another process or host, so caching them in the writer's memory buys
      little, evicts other data, and is expensive where filling the page cache is (some VMs:
      docs/spark-write.md). The price: the first read of new data comes from the device. A
      filesystem that refuses ``O_DIRECT`` (EINVAL) gets buffered writes, silently, and so does
      every write with ``direct_io=False``. Spools (``open_spool``) follow the same choice:
      ``local_spool.LocalDirectSpool`` or ``LocalSpool``.

    Temp files are named ``.<target>.tmp-<16 hex>`` (see :meth:`Storage.is_temp_name`): a writer
    killed between writing and publishing leaves one, which listings hide and
    :meth:`cleanup_temp_files` removes.
    """

    def __init__(self, root: str, *, fsync: bool = True, direct_io: bool = True,
                 kernel_copy: Optional[bool] = None, create_root: bool = True):
        """``create_root``: make the root if it is missing (False for a registered log dir,
        whose root must be there already: see :meth:`ensure_dir`)."""
        self._root = os.path.abspath(os.path.expanduser(root))
        self._fsync = bool(fsync)
        self._direct = bool(direct_io) and hasattr(os, "O_DIRECT")
        #: ``copy_from`` copies in the kernel: None decides by the filesystem (on first use)
        self._kernel_copy = None if kernel_copy is None else bool(kernel_copy)
        self._link_ok = True
        self._mappable: Optional[bool] = None   # map(): decided on first use
        self._batch = threading.local()          # .current: the SyncBatch of this thread
        self.url = "file://" + self._root
        self._kept: List[str] = []              # keep_roots, as absolute paths
        if create_root:
            with storage_errors("create root", self.url):
                os.makedirs(self._root, exist_ok=True)

    @property
    def root(self) -> str:
        return self._root

    @property
    def guarantees(self) -> StorageGuarantees:
        return StorageGuarantees(
            atomic_create_if_absent=self._link_ok, atomic_replace=True, append=True,
            truncate_in_place=True, read_after_write=True, list_after_write=True,
            durable_on_return=self._fsync, multi_process=True)

    def __getstate__(self):
        return {"root": self._root, "fsync": self._fsync, "direct_io": self._direct,
                "kernel_copy": self._kernel_copy}

    def __setstate__(self, state):
        self.__init__(state["root"], fsync=state["fsync"],
                      direct_io=state.get("direct_io", True),
                      kernel_copy=state.get("kernel_copy"))

    def _abs(self, path: str, *, allow_root: bool = False) -> str:
        return os.path.join(self._root, *split_path(path, allow_root=allow_root))

    # -- reads ----------------------------------------------------------------------------------

    def read(self, path: str, start: int = 0, end: int | None = None) -> bytes:
        check_range(start, end)
        full = self._abs(path)
        with storage_errors("read", self._where(path)), open(full, "rb") as f:
            if start:
                f.seek(start)
            return f.read() if end is None else f.read(end - start)

    def map(self, path: str):
        if self._mappable is None:
            self._mappable = _can_map(self._root)
        if not self._mappable:
            return None
        import mmap
        full = self._abs(path)
        with storage_errors("map", self._where(path)), open(full, "rb") as f:
            if os.fstat(f.fileno()).st_size == 0:
                return None
            return memoryview(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))

    def read_into(self, path: str, start: int, out) -> int:
        check_range(start, None)
        view = memoryview(out).cast("B")
        full = self._abs(path)
        with storage_errors("read", self._where(path)), open(full, "rb", buffering=0) as f:
            f.seek(start)
            got = 0
            while got < len(view):
                n = f.readinto(view[got:])
                if not n:
                    break
                got += n
            return got

    def size(self, path: str) -> int:
        full = self._abs(path)
        with storage_errors("size", self._where(path)):
            return os.stat(full).st_size

    def exists(self, path: str) -> bool:
        return os.path.isfile(self._abs(path))

    def mtime(self, path: str) -> float:
        full = self._abs(path)
        with storage_errors("mtime", self._where(path)):
            return os.stat(full).st_mtime

    def _scan(self, dir_path: str) -> list[os.DirEntry]:
        full = self._abs(dir_path, allow_root=True)
        with storage_errors("list", self._where(dir_path)):
            try:
                with os.scandir(full) as it:
                    return list(it)
            except (FileNotFoundError, NotADirectoryError):
                return []

    def list(self, dir_path: str = "") -> list[FileInfo]:
        out = []
        for entry in self._scan(dir_path):
            if self.is_temp_name(entry.name):
                continue
            try:
                if entry.is_file():
                    st = entry.stat()
                    out.append(listed_file(entry.name, st.st_size, st.st_mtime))
            except FileNotFoundError:  # deleted while we listed: it is not there any more
                continue
        return sorted(out)

    def list_names(self, dir_path: str = "") -> list[str]:
        out = []
        for entry in self._scan(dir_path):
            try:   # the directory entry's type: no stat where the file system tells it
                if entry.is_file() and not self.is_temp_name(entry.name):
                    out.append(entry.name)
            except FileNotFoundError:
                continue
        return sorted(out)

    def list_dirs(self, dir_path: str = "") -> list[str]:
        out = []
        for entry in self._scan(dir_path):
            try:
                if entry.is_dir():
                    out.append(entry.name)
            except FileNotFoundError:
                continue
        return sorted(out)

    def _list_temp_files(self, dir_path: str) -> list[tuple[str, float]]:
        out = []
        for entry in self._scan(dir_path):
            if self.is_temp_name(entry.name):
                try:
                    out.append((entry.name, entry.stat().st_mtime))
                except FileNotFoundError:
                    continue
        return out

    # -- writes ---------------------------------------------------------------------------------

    def _write_fd(self, fd: int, data, sync: bool = True) -> None:
        """Write ``data`` (a buffer, or a list of buffers written back to back) and sync."""
        if isinstance(data, list) and hasattr(os, "writev"):
            writev_all(fd, [memoryview(p).cast("B") for p in data if len(p)])
        else:
            view = memoryview(b"".join(data) if isinstance(data, list) else data)
            while view:
                view = view[os.write(fd, view):]
        if self._fsync and sync:
            os.fsync(fd)

    # -- durability barriers ---------------------------------------------------------------------

    def flush(self, dir_path: str = "") -> None:
        """One ``syncfs`` of the filesystem holding ``dir_path`` (whatever else on it is dirty
        goes too, and costs what it would cost the kernel's write-back anyway); where there is
        none, a fsync of every file and directory under it."""
        if not self._fsync:
            return
        full = self._abs(dir_path, allow_root=True)
        with storage_errors("flush", self._where(dir_path)):
            if not os.path.isdir(full) or local_sync.syncfs(full):
                return
            for directory, _, names in os.walk(full):
                for name in names:
                    _fsync_file(os.path.join(directory, name), missing_ok=True)
                self._sync_dir(directory)

    def sync_batch(self, durable: bool = True) -> Optional["SyncBatch"]:
        return SyncBatch(self, durable=durable) if self._fsync else None

    def _sync_now(self) -> bool:
        """Whether a create syncs as it goes: not inside a :class:`SyncBatch` job."""
        return self._fsync and getattr(self._batch, "current", None) is None

    def _synced_later(self, full: str) -> bool:
        """Inside a SyncBatch job: leave the created ``full`` and its directory entry to the
        batch's ``sync`` (True); else False, and the caller syncs the directory now."""
        batch = getattr(self._batch, "current", None)
        if batch is None or not self._fsync:
            return False
        batch.add(full)
        return True

    def _link_unsupported(self, e: OSError) -> None:
        """A link failed: re-raise unless the file system has no hard links, in which case
        atomic creation falls back to O_EXCL from now on."""
        if e.errno not in NO_LINK_ERRNOS:
            raise e
        log.warning("%s: hard links unsupported (%s); create_if_absent falls back to O_EXCL "
                    "and is no longer all-or-nothing", self.url, e)
        self._link_ok = False

    def _sync_dir(self, directory: str) -> None:
        """Make a create/rename/unlink in ``directory`` itself durable (POSIX needs this)."""
        if not self._fsync or not hasattr(os, "O_DIRECTORY"):
            return
        try:
            fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        except FileNotFoundError:  # removed meanwhile (delete_tree): nothing left to sync
            return
        try:
            os.fsync(fd)
        except OSError as e:
            if e.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
                raise
        finally:
            os.close(fd)

    def _write_temp(self, target: str, data: bytes, sync: bool = True) -> str:
        """A new, complete, synced temp file beside ``target``; returns its path."""
        directory, name = os.path.split(target)
        self.ensure_dir(directory)
        if self._direct and isinstance(data, list):
            tmp = self._write_temp_direct(directory, name, data, sync)
            if tmp is not None:
                return tmp
        tmp = os.path.join(directory, temp_name_for(name))
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            self._write_fd(fd, data, sync)
        except BaseException:
            os.close(fd)
            unlink_quietly(tmp)
            raise
        os.close(fd)
        return tmp

    def _write_temp_direct(self, directory: str, name: str, pieces: list,
                           sync: bool = True) -> Optional[str]:
        """The temp file written with O_DIRECT, or None when the pieces are too small or the
        filesystem refuses (then nothing is left behind, and the caller writes it buffered)."""
        views = [memoryview(p).cast("B") for p in pieces if len(p)]
        total = sum(len(v) for v in views)
        if total < _DIRECT_MIN:
            return None
        tmp = os.path.join(directory, temp_name_for(name))
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_DIRECT, 0o644)
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise
            self._direct = False
            unlink_quietly(tmp)   # some kernels create the file before refusing O_DIRECT
            log.info("%s: O_DIRECT refused (%s); writing through the page cache", self.url, e)
            return None
        done = False
        try:
            done = write_direct(fd, views, total)
            if done and self._fsync and sync:
                os.fsync(fd)
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise
            self._direct = False   # an alignment this filesystem wants that we do not give
            log.info("%s: O_DIRECT write refused (%s); writing through the page cache",
                     self.url, e)
        finally:
            os.close(fd)
            if not done:
                unlink_quietly(tmp)
        return tmp if done else None

    def create_if_absent_pieces(self, path: str, pieces) -> None:
        self.create_if_absent(path, list(pieces))   # _write_fd takes the list: one writev

    concurrent_writes = True

    can_spool = True     # through the page cache, and with O_DIRECT (see local_spool)

    def open_spool(self, dir_path: str, hint: str, head: int = 0):
        directory = self._abs(dir_path, allow_root=True)
        with storage_errors("create", self._where(f"{dir_path}/{hint}")):
            if self._direct:
                spool = LocalDirectSpool.open(self, directory, hint, head)
                if spool is not None:
                    return spool
                self._direct = False
                log.info("%s: O_DIRECT refused; spooling through the page cache", self.url)
            return LocalSpool(self, directory, hint)

    def create_if_absent(self, path: str, data: bytes) -> None:
        full = self._abs(path)
        where = self._where(path)
        with storage_errors("create", where):
            if os.path.lexists(full):  # cheap early out; the link below is what decides
                raise AlreadyExistsError(f"create {where}: already exists")
            if self._link_ok:
                deferred = not self._sync_now()   # inside a SyncBatch job
                tmp = self._write_temp(full, data, sync=not deferred)
                try:
                    os.link(tmp, full)
                except FileExistsError:
                    raise AlreadyExistsError(f"create {where}: already exists") from None
                except OSError as e:
                    self._link_unsupported(e)
                else:
                    if not (deferred and self._synced_later(full)):
                        self._sync_dir(os.path.dirname(full))
                    return
                finally:
                    unlink_quietly(tmp)
            self._create_exclusive(full, data)

    def create_in_place(self, path: str, data: bytes) -> None:
        """O_EXCL on the name itself: one create instead of a temp file, a link and an unlink
        (a task writing to 1,000 partitions creates 2,000 index files)."""
        with storage_errors("create", self._where(path)):
            self._create_exclusive(self._abs(path), data)

    def create_segment(self, dir_path: str, files) -> None:
        """The directory resolved and opened once, every file created relative to it
        (``dir_fd``), with no existence checks before the creates that decide: per file this
        leaves the kernel's work (measured, a task writing 1,000 partitions: docs/spark-write.md).
        The same files, names and durability as one call per file; a ``.log`` too large for
        the page cache (O_DIRECT) or a filesystem without hard links takes the per-file path."""
        if not _DIR_FD:
            return super().create_segment(dir_path, files)
        directory = self._abs(dir_path, allow_root=True)
        done: List[str] = []
        own: List[str] = []   # created here, not by create_if_absent (which syncs its own)
        with storage_errors("create", self._where(dir_path)):
            self.ensure_dir(directory)
            dfd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
            try:
                deferred = not self._sync_now()   # inside a SyncBatch job
                for name, content in files:
                    whole = isinstance(content, list)
                    if whole and done and not deferred:
                        os.fsync(dfd)   # the indexes' entries before the .log's (§3)
                    if whole and (not self._link_ok or (
                            self._direct and sum(len(p) for p in content) >= _DIRECT_MIN)):
                        self.create_if_absent(f"{dir_path}/{name}", content)
                    else:
                        self._create_at(dfd, dir_path, name, content, whole, deferred)
                        own.append(name)
                    done.append(name)
                if deferred and self._synced_later_many(directory, own):
                    return
                if self._fsync:
                    os.fsync(dfd)
            except BaseException:
                for name in done:
                    try:
                        os.unlink(name, dir_fd=dfd)
                    except OSError:
                        pass
                raise
            finally:
                os.close(dfd)

    def _create_at(self, dfd: int, dir_path: str, name: str, content, whole: bool,
                   deferred: bool) -> None:
        """One file of :meth:`create_segment`: in place with O_EXCL, or (``whole``) a temp
        file linked to its name; synced now unless ``deferred``. A taken name is
        :class:`AlreadyExistsError` naming the file."""
        target = temp_name_for(name) if whole else name
        try:
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644, dir_fd=dfd)
        except FileExistsError:
            raise self._taken(dir_path, name) from None
        try:
            try:
                self._write_fd(fd, content, sync=not deferred)
            finally:
                os.close(fd)
            if not whole:
                return
            try:
                os.link(target, name, src_dir_fd=dfd, dst_dir_fd=dfd)
            except FileExistsError:
                raise self._taken(dir_path, name) from None
            except OSError as e:
                if e.errno not in NO_LINK_ERRNOS:
                    raise
                self._link_unsupported(e)   # from now on the per-file path, with O_EXCL
                self._create_exclusive(os.path.join(self._abs(dir_path, allow_root=True),
                                                    name), b"".join(content))
        except BaseException:
            if not whole:
                os.unlink(name, dir_fd=dfd)   # ours: O_EXCL created it
            raise
        finally:
            if whole:
                try:
                    os.unlink(target, dir_fd=dfd)
                except FileNotFoundError:
                    pass

    def _taken(self, dir_path: str, name: str) -> AlreadyExistsError:
        return AlreadyExistsError(f"create {self._where(f'{dir_path}/{name}')}: already exists")

    def _synced_later_many(self, directory: str, names: List[str]) -> bool:
        """:meth:`_synced_later` for files of one directory."""
        batch = getattr(self._batch, "current", None)
        if batch is None or not self._fsync:
            return False
        batch.add_many(directory, names)
        return True

    def _create_exclusive(self, full: str, data: bytes) -> None:
        """Create ``full`` with O_EXCL and write it; inside a SyncBatch job it is synced with
        the batch, else now."""
        self.ensure_dir(os.path.dirname(full))
        fd = os.open(full, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        deferred = not self._sync_now()
        try:
            self._write_fd(fd, data, sync=not deferred)
        except BaseException:
            os.close(fd)
            unlink_quietly(full)  # we own it: nobody else could have created it
            raise
        os.close(fd)
        if not (deferred and self._synced_later(full)):
            self._sync_dir(os.path.dirname(full))

    def replace(self, path: str, data: bytes) -> None:
        full = self._abs(path)
        with storage_errors("replace", self._where(path)):
            tmp = self._write_temp(full, data)
            try:
                os.replace(tmp, full)
            except BaseException:
                unlink_quietly(tmp)
                raise
            self._sync_dir(os.path.dirname(full))

    def copy_from(self, src: Storage, src_path: str, dst_path: str, *,
                  replace: bool = False) -> bool:
        """A copy in the kernel when ``src`` is local disk too (``copy_file_range``, else
        ``sendfile``, else read and write), published as :meth:`create_if_absent` publishes: a
        temp file in the target's directory, fsynced, then linked (or, with ``replace``,
        renamed) to its name, so nothing partial is ever under the name. False, with nothing
        done, for another kind of storage, for files under ``KERNEL_COPY_MIN`` bytes, and
        (unless the storage was made with ``kernel_copy=True``) on a filesystem where the
        kernel's copy would move every page through the page cache (see ``_OFFLOAD_COPY_FS``).

        Why: where the filesystem reflinks or copies on the server, a replica copy between two
        log dirs need not read every byte into this process and write it out again. As with
        any ``copy_from`` the copy is whole, not proven sound: the replica copier walks the
        batches of the source the kernel copied (through :meth:`map`) or of the copy, and
        deletes the copy if a check fails.
        """
        if not isinstance(src, LocalStorage):
            return False
        if self._kernel_copy is None:
            self._kernel_copy = _copy_offloads(self._root)
        if not self._kernel_copy:
            return False
        full, where = self._abs(dst_path), self._where(dst_path)
        source = src._abs(src_path)
        with storage_errors("create", where):
            try:
                sfd = os.open(source, os.O_RDONLY)
            except FileNotFoundError:
                raise StorageNotFoundError(f"copy {src._where(src_path)}: not found") from None
            try:
                size = os.fstat(sfd).st_size
                if size < KERNEL_COPY_MIN:
                    return False
                if not replace and os.path.lexists(full):  # early out; the link decides
                    raise AlreadyExistsError(f"create {where}: already exists")
                directory, name = os.path.split(full)
                self.ensure_dir(directory)
                tmp = os.path.join(directory, temp_name_for(name))
                deferred = not self._sync_now()   # inside a SyncBatch job
                self._copy_into(sfd, tmp, size, src._where(src_path), not deferred)
            finally:
                os.close(sfd)
            try:
                self._link_temp(tmp, full, where, replace)
            finally:
                unlink_quietly(tmp)
            if not (deferred and self._synced_later(full)):
                self._sync_dir(directory)
        return True

    def _copy_into(self, sfd: int, tmp: str, size: int, where: str, sync: bool) -> None:
        """Create ``tmp`` as a copy of ``sfd``'s first ``size`` bytes, synced with ``sync``;
        nothing is left on failure."""
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            _kernel_copy(sfd, fd, 0, size, where)
            if self._fsync and sync:
                os.fsync(fd)
        except BaseException:
            os.close(fd)
            unlink_quietly(tmp)
            raise
        os.close(fd)

    def _link_temp(self, tmp: str, full: str, where: str, replace: bool) -> None:
        """Give the complete temp file ``tmp`` the name ``full``: a link (refused when the
        name is taken: ``AlreadyExistsError``) or with ``replace`` an atomic rename over it.
        Without hard links: an existence check, then a rename (not atomic against a
        concurrent creator; ``guarantees`` says so)."""
        if self._link_ok:
            try:
                os.link(tmp, full)
                return
            except FileExistsError:
                if not replace:
                    raise AlreadyExistsError(f"create {where}: already exists") from None
                os.replace(tmp, full)
                return
            except OSError as e:
                self._link_unsupported(e)
        if not replace and os.path.lexists(full):
            raise AlreadyExistsError(f"create {where}: already exists")
        os.replace(tmp, full)

    def replace_many(self, contents) -> None:
        """Many small files replaced with two barriers in all instead of two fsyncs each: every
        temp file is written, then made durable (one ``syncfs`` past ``SyncBatch.SYNCFS_FILES``
        files), and only then renamed over its target, so a crash never leaves a torn file
        under the name; the renames are made durable by the second barrier. Rewriting 1,000
        partitions' ``leader-epoch-checkpoint`` after a commit took about 1 s file by file."""
        if not self._fsync or len(contents) <= SyncBatch.SYNCFS_FILES:
            for path, data in contents.items():
                self.replace(path, data)
            return
        temps = []
        dirs = sorted({os.path.dirname(self._abs(path)) for path in contents})
        try:
            with storage_errors("replace", self.url):
                for path, data in contents.items():
                    full = self._abs(path)
                    temps.append((self._write_temp(full, data, sync=False), full))
                self._barrier([t for t, _ in temps], ())
                while temps:
                    tmp, full = temps[-1]
                    os.replace(tmp, full)
                    temps.pop()
                self._barrier((), dirs)
        finally:
            for tmp, _ in temps:
                unlink_quietly(tmp)

    def _barrier(self, files, dirs) -> None:
        """``files`` and the entries of ``dirs`` durable: one ``syncfs`` when there are many."""
        if max(len(files), len(dirs)) > SyncBatch.SYNCFS_FILES and local_sync.syncfs(self.root):
            return
        for full in files:
            _fsync_file(full)
        for directory in dirs:
            self._sync_dir(directory)

    def append(self, path: str, data: bytes) -> None:
        full = self._abs(path)
        with storage_errors("append", self._where(path)):
            directory = os.path.dirname(full)
            self.ensure_dir(directory)
            created = not os.path.exists(full)
            fd = os.open(full, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                self._write_fd(fd, data)
            finally:
                os.close(fd)
            if created:
                self._sync_dir(directory)

    def truncate(self, path: str, size: int) -> None:
        if not isinstance(size, int) or size < 0:
            raise InvalidConfigError(f"truncate size must be an int >= 0, got {size!r}")
        full = self._abs(path)
        where = self._where(path)
        with storage_errors("truncate", where):
            fd = os.open(full, os.O_WRONLY)
            try:
                current = os.fstat(fd).st_size
                if size > current:
                    raise InvalidConfigError(
                        f"truncate {where}: size {size} is beyond the end ({current})")
                if size < current:
                    os.ftruncate(fd, size)
                    if self._fsync:
                        os.fsync(fd)
            finally:
                os.close(fd)

    def _unlink(self, path: str, missing_ok: bool) -> str | None:
        """Unlink without syncing; returns the directory to sync, None if nothing was there."""
        full = self._abs(path)
        where = self._where(path)
        with storage_errors("delete", where):
            try:
                os.unlink(full)
            except FileNotFoundError:
                if not missing_ok:
                    raise StorageNotFoundError(f"delete {where}: not found") from None
                return None
        return os.path.dirname(full)

    def delete(self, path: str, missing_ok: bool = True) -> None:
        directory = self._unlink(path, missing_ok)
        if directory is not None:
            with storage_errors("delete", self._where(path)):
                self._sync_dir(directory)

    def delete_many(self, paths) -> None:
        dirs = {self._unlink(path, True) for path in paths}  # then one sync per directory
        dirs.discard(None)
        with storage_errors("delete_many", self.url):
            for directory in sorted(dirs):
                self._sync_dir(directory)

    def delete_tree(self, dir_path: str) -> None:
        full = self._abs(dir_path)  # not the root: wiping the whole store is not a tree delete
        with storage_errors("delete_tree", self._where(dir_path)):
            try:
                shutil.rmtree(full)
            except FileNotFoundError:
                return
            self._sync_dir(os.path.dirname(full))

    def makedirs(self, dir_path: str) -> None:
        with storage_errors("makedirs", self._where(dir_path)):
            self.ensure_dir(self._abs(dir_path, allow_root=True))

    def ensure_dir(self, directory: str) -> None:
        """``directory`` (an absolute path below the root) exists, created if need be, but
        never the root itself: the root is made once, when this storage is opened. A root moved
        away, unmounted or deleted since must not come back empty at the same path and take
        writes that no other process sees there (docs/protocol.md §1.1): that is an offline
        log dir, and an error here."""
        try:
            if stat.S_ISDIR(os.stat(directory).st_mode):
                return
        except FileNotFoundError:
            pass
        if not os.path.isdir(self._root):
            raise KafkaStorageError(f"{self.url}: the storage root is gone (moved, unmounted or "
                                    "deleted); nothing is written there, and it is not created "
                                    "again")
        for kept in self._kept:
            if (directory == kept or directory.startswith(kept + os.sep)) \
                    and not os.path.isdir(kept):
                raise KafkaStorageError(f"file://{kept}: the log dir's root is gone (moved, "
                                        "unmounted or deleted); nothing is written there, and "
                                        "it is not created again")
        ensure_dir(directory)

    def keep_roots(self, names) -> None:
        self._kept = [os.path.join(self._root, n) for n in names]



def _fsync_file(full: str, missing_ok: bool = False) -> None:
    try:
        fd = os.open(full, os.O_RDONLY)
    except FileNotFoundError:
        if missing_ok:   # deleted meanwhile: nothing left to sync
            return
        raise
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _kernel_copy(sfd: int, dfd: int, start: int, end: int, where: str, *,
                 fallback: bool = True) -> int:
    """Copy bytes ``[start, end)`` of ``sfd`` to the same place in ``dfd`` without passing
    them through this process: ``copy_file_range`` (which also reflinks where the filesystem
    can); where the kernel refuses it (across filesystems before Linux 5.3, some network and
    FUSE filesystems, an O_DIRECT target it cannot write) ``sendfile``, then a read and write
    loop, or with ``fallback=False`` nothing (``start`` is returned). Returns ``end``; raises
    when the source ends early (it changed meanwhile). The GIL is released throughout."""
    pos = start
    how = "copy_file_range" if hasattr(os, "copy_file_range") else "sendfile"
    if how != "copy_file_range" and not fallback:
        return start
    while pos < end:
        n = min(end - pos, 1 << 30)
        try:
            if how == "copy_file_range":
                k = os.copy_file_range(sfd, dfd, n, pos, pos)
            elif how == "sendfile":
                os.lseek(dfd, pos, os.SEEK_SET)
                k = os.sendfile(dfd, sfd, pos, n)
            else:
                data = os.pread(sfd, min(n, 8 << 20), pos)
                k = os.pwrite(dfd, data, pos) if data else 0
        except OSError as e:
            if pos != start or how == "read" or e.errno not in _NO_KERNEL_COPY_ERRNOS:
                raise
            if not fallback:
                return start
            how = "sendfile" if how == "copy_file_range" and hasattr(os, "sendfile") else "read"
            continue
        if k == 0:
            raise KafkaStorageError(f"copy {where}: ended at {pos} of {end} bytes "
                                    "(changed during the copy)")
        pos += k
    return pos


_NO_KERNEL_COPY_ERRNOS = frozenset(
    getattr(errno, name) for name in ("EXDEV", "ENOSYS", "EINVAL", "EOPNOTSUPP", "ENOTSUP",
                                      "EPERM", "EBADF", "ETXTBSY") if hasattr(errno, name))
