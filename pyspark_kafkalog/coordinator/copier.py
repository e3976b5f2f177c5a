"""Copy a sealed segment from a leader replica's log dir to a follower's, byte for byte, checked.

A follower's copy only counts once a later metadata action names it, and the coordinator that
copies may die at any instant; so every file is published whole or not at all (create-if-absent
through the storage layer), the ``.log`` last (its presence says the segment is complete), and
the ``.log``'s batches are checked as they pass, so that a damaged leader file is never
published as a follower's. A destination that already exists was left by an earlier,
crashed copy: it counts if it equals the source and is replaced if not.
"""
from __future__ import annotations

import logging
import struct
import threading
from concurrent.futures import wait
from dataclasses import dataclass
from typing import Callable, Dict, Iterator, List, Optional

from ..errors import (AlreadyExistsError, CorruptRecordError, InvalidConfigError, KafkaLogError,
                      KafkaStorageError)
from ..format.batch import (LENGTH_OFFSET, LOG_OVERHEAD, MAGIC_V2, scan_entries,
                            torn_error)
from ..format.checkpoint import parse_partition_metadata
from ..log.partition import PARTITION_METADATA_FILE
from ..log.write_pool import SharedPool
from ..log.segment import INDEX_SUFFIX, LOG_SUFFIX, TIMEINDEX_SUFFIX, TXNINDEX_SUFFIX, segment_name
from ..storage.base import Storage

_log = logging.getLogger(__name__)
_LENGTH = struct.Struct(">i").unpack_from


@dataclass(frozen=True)
class SegmentCopy:
    base_offset: int
    end_offset: int     # last offset of the last batch + 1 (base_offset for an empty segment)
    bytes: int          # size of the .log
    mode: str           # "streamed" | "server_side" | "existing"


class _LogCheck:
    """The batch walk of one ``.log`` fed in arbitrary chunks: whole entries are checked
    (size, magic, CRC: the format layer's rules) plus what a replica copy adds (the first
    offset, contiguity, the end offset, the leader epoch). Holds at most one partial entry
    between chunks, so memory is a chunk plus the largest batch."""

    def __init__(self, file: str, size: int, base_offset: int, end_offset: Optional[int],
                 leader_epoch: Optional[int]):
        self.file, self.size, self.end, self.epoch = file, size, end_offset, leader_epoch
        self.next = base_offset          # the offset the next batch must start at
        self.last: Optional[int] = None
        self.pos = 0                     # file position of carry[0]
        self.carry = bytearray()         # the start of an entry that continues in later chunks
        self.need = 0                    # bytes the carried entry declares (0: not known yet)

    def feed(self, chunk) -> None:
        if self.carry:
            # a batch bigger than the chunks arrives in pieces: walk it once, when whole
            self.carry += chunk
            buf = self.carry
            if len(buf) < self.need:
                return
        else:
            buf = chunk
        done = 0
        for h in scan_entries(buf, validate_crc=True, previous_last_offset=self.last,
                              file=self.file, base_position=self.pos):
            self._check(h)
            done = h.end - self.pos
        self.carry = bytearray(memoryview(buf)[done:])   # a new object: buf may be exported
        self.pos += done
        self.need = (_LENGTH(self.carry, LENGTH_OFFSET)[0] + LOG_OVERHEAD
                     if len(self.carry) >= LOG_OVERHEAD else 0)
        if self.need > self.size - self.pos:   # say so now, not after buffering the rest
            raise torn_error(self.pos, self.size - self.pos, self.need, self.file)

    def finish(self) -> int:
        """The end offset, after checking nothing is left over (a torn last entry)."""
        if self.carry:
            list(scan_entries(bytes(self.carry), strict=True, previous_last_offset=self.last,
                              file=self.file, base_position=self.pos))
        return self.next

    def _check(self, h) -> None:
        # a compressed magic 0/1 wrapper tells only its last offset (its first needs a
        # decompression), so contiguity is checked where the format says the first offset
        first = h.base_offset if h.base_offset >= 0 else None
        if (first if first is not None else h.last_offset) < self.next or (
                first is not None and first != self.next):
            what = "the segment's base offset" if self.last is None else "contiguous after"
            raise CorruptRecordError(
                f"{self.file}: entry at position {h.position} holds offsets "
                f"{first if first is not None else '?'}..{h.last_offset}, expected to start at "
                f"{self.next} ({what})", h.position)
        if self.end is not None and h.last_offset >= self.end:
            raise CorruptRecordError(
                f"{self.file}: entry at position {h.position} holds offset {h.last_offset}, "
                f"at or past the expected end offset {self.end}", h.position)
        if self.epoch is not None and h.magic == MAGIC_V2 and h.partition_leader_epoch != self.epoch:
            raise CorruptRecordError(
                f"{self.file}: record batch at position {h.position} has leader epoch "
                f"{h.partition_leader_epoch}, expected {self.epoch}", h.position)
        self.last, self.next = h.last_offset, h.last_offset + 1


class _NoCheck:
    def __init__(self, size: int = 0):
        pass

    def feed(self, chunk) -> None:
        pass

    def finish(self) -> None:
        return None


def _chunks(st: Storage, path: str, size: int, chunk_bytes: int, check) -> Iterator[bytes]:
    """``path``'s first ``size`` bytes in chunks, each checked before it is handed on, and the
    walk finished before the last one returns: a failed check ends the iteration with its
    error, so a publish fed by this never completes."""
    pos = 0
    while pos < size:
        data = st.read(path, pos, min(size, pos + chunk_bytes))
        if not data:
            raise KafkaStorageError(f"read {st._where(path)}: ended at {pos} of {size} bytes "
                                    "(changed during the copy)")
        check.feed(data)
        yield data
        pos += len(data)
    check.finish()


def _walk(src: Storage, sp: str, dst: Storage, dp: str, size: int, chunk_bytes: int,
          check) -> None:
    """Feed the bytes a store copied from ``sp`` to ``dp`` (``size`` of them) to ``check`` and
    finish it. Where the source maps its files (local disk) they are walked in the source's
    mapping: the pages the kernel's copy just read (or, after a reflink, the only copy of
    them), with no copy into this process and no carry between chunks. Segments are never
    rewritten in place, so those are the bytes the kernel copied (and ``Storage.map``'s
    condition holds). Elsewhere the copy is read back in chunks."""
    view = src.map(sp) if size else None
    if view is None or len(view) < size:
        for _ in _chunks(dst, dp, size, chunk_bytes, check):
            pass
        return
    check.feed(view[:size])
    check.finish()


def _join(dir_path: str, name: str) -> str:
    return f"{dir_path.rstrip('/')}/{name}" if dir_path else name


class _Verified:
    """What a copy the store made and verified by checksum stands for, without a walk: the
    source's size and the end offset the metadata gave."""

    def __init__(self, size: int, end_offset: int):
        self.pos, self.next = size, end_offset


def _publish(src: Storage, sp: str, dst: Storage, dp: str, size: int, chunk_bytes: int,
             new_check: Callable, replace: bool, end_offset: Optional[int] = None) -> tuple:
    """Publish ``sp``'s bytes at ``dp``, checked; returns (mode, the finished check).

    Server-side where the storages can (two log dirs on one S3 endpoint): the store copies
    straight to ``dp``, and when both objects carry a comparable checksum the store kept
    (``Storage.checksum``: a full CRC-32C, or a single-part upload's MD5 ETag) and ``end_offset``
    is known, equal checksums prove the copy and no byte passes through this process. The
    source's batches were checked when they were written or streamed into the store, whose
    checksums keep them. Without comparable checksums the copy is read back once and
    batch-checked. A copy that fails is deleted; until an action names it nobody reads it.
    """
    if dst.copy_from(src, sp, dp, replace=replace):
        try:
            if dst.size(dp) != size:
                raise CorruptRecordError(f"{src._where(sp)}: server-side copy {dst._where(dp)} "
                                         f"has {dst.size(dp)} bytes, not {size}", 0)
            mine = src.checksum(sp)
            if end_offset is not None and mine is not None and mine == dst.checksum(dp):
                return "server_side", _Verified(size, end_offset)
            check = new_check(size)
            _walk(src, sp, dst, dp, size, chunk_bytes, check)
        except BaseException:
            dst.delete(dp, missing_ok=True)
            raise
        return "server_side", check
    check = new_check(size)
    dst.publish_stream(dp, _chunks(src, sp, size, chunk_bytes, check), replace=replace)
    if dst.size(dp) != size:
        raise KafkaStorageError(f"copy {src._where(sp)} -> {dst._where(dp)}: published "
                                f"{dst.size(dp)} bytes, not {size}")
    return "streamed", check


def _same(src: Storage, sp: str, dst: Storage, dp: str, size: int, chunk_bytes: int,
          check) -> bool:
    """Whether ``dp`` holds ``sp``'s bytes; the source is walked by ``check`` as it is read."""
    if dst.size(dp) != size:
        return False
    pos = 0
    for data in _chunks(src, sp, size, chunk_bytes, check):
        if dst.read(dp, pos, pos + len(data)) != data:
            return False
        pos += len(data)
    return True


def _copy_file(src: Storage, sp: str, dst: Storage, dp: str, chunk_bytes: int,
               new_check: Callable, end_offset: Optional[int] = None) -> tuple:
    size = src.size(sp)
    if not dst.exists(dp):
        try:
            return _publish(src, sp, dst, dp, size, chunk_bytes, new_check, False, end_offset)
        except AlreadyExistsError:
            pass   # another copier won meanwhile: judged like any existing copy
    mine = src.checksum(sp)
    if end_offset is not None and mine is not None and dst.size(dp) == size \
            and mine == dst.checksum(dp):
        return "existing", _Verified(size, end_offset)
    check = new_check(size)
    if _same(src, sp, dst, dp, size, chunk_bytes, check):
        return "existing", check
    _log.warning("%s differs from the leader's %s (a torn or stale earlier copy?); replacing it",
                 dst._where(dp), src._where(sp))
    return _publish(src, sp, dst, dp, size, chunk_bytes, new_check, True, end_offset)


def copy_segment(src: Storage, src_dir: str, dst: Storage, dst_dir: str, base_offset: int, *,
                 end_offset: Optional[int] = None, leader_epoch: Optional[int] = None,
                 chunk_bytes: int = 8 << 20, trust_end_offset: bool = True) -> SegmentCopy:
    """Copy segment ``base_offset`` from ``src_dir`` on ``src`` to ``dst_dir`` on ``dst``.

    The indexes (those the source has) go first and the ``.log`` last, so a follower never has a
    ``.log`` whose indexes are still to come. ``end_offset`` and ``leader_epoch``, when given,
    are what the metadata says the segment holds; a batch that disagrees, or any damage, raises
    :class:`CorruptRecordError` naming the source file and position, and the ``.log`` is not
    published (its indexes may be: without a ``.log`` they are garbage, not a segment).
    Pass the per-root storages of the two log dirs (``MountedStorage.mounted``) so that two
    log dirs on one object store copy server-side. ``trust_end_offset``: ``end_offset`` is
    where the segment's data ends (a committed range), so a copy the store verified by checksum
    needs no walk to learn it; False for a segment whose range is still being written.
    """
    if not isinstance(chunk_bytes, int) or chunk_bytes < 1:
        raise InvalidConfigError(f"chunk_bytes must be an int >= 1, got {chunk_bytes!r}")
    for suffix in (INDEX_SUFFIX, TIMEINDEX_SUFFIX, TXNINDEX_SUFFIX):
        sp = _join(src_dir, segment_name(base_offset, suffix))
        if src.exists(sp):
            _copy_file(src, sp, dst, _join(dst_dir, segment_name(base_offset, suffix)),
                       chunk_bytes, _NoCheck)
    sp = _join(src_dir, segment_name(base_offset, LOG_SUFFIX))
    where = src._where(sp)
    mode, check = _copy_file(
        src, sp, dst, _join(dst_dir, segment_name(base_offset, LOG_SUFFIX)), chunk_bytes,
        lambda size: _LogCheck(where, size, base_offset, end_offset, leader_epoch),
        end_offset if trust_end_offset else None)
    return SegmentCopy(base_offset, check.next, check.pos, mode)


def check_fetchers(fetchers) -> int:
    """``fetchers`` (how many segments :func:`copy_segments` copies at once), checked."""
    if not isinstance(fetchers, int) or isinstance(fetchers, bool) or fetchers < 1:
        raise InvalidConfigError(f"num_replica_fetchers must be an int >= 1, got {fetchers!r}")
    return fetchers


_pools: Dict[int, SharedPool] = {}
_pools_lock = threading.Lock()


def copy_segments(src: Storage, src_dir: str, dst: Storage, dst_dir: str, segments, *,
                  fetchers: int = 1, chunk_bytes: int = 8 << 20) -> tuple:
    """:func:`copy_segment` of each ``(base_offset, end_offset, trust_end_offset)`` of
    ``segments`` (lowest first), up to ``fetchers`` at once on a shared pool (Kafka's
    ``num.replica.fetchers``; pass 1 where the storage does not take concurrent writes).

    Returns ``(copies, error)``: the :class:`SegmentCopy` of each segment in order up to the
    first that failed, and that failure (a :class:`KafkaLogError`) or None. As when copying one
    after the other, nothing at or past a failure counts: copies not started by then are not
    made, and those already under way are left to be judged again ("existing") next time.
    Every copy has ended when this returns or raises (another error: the first in order).

    Why: a copy spends its time in the kernel's copy, in fsync and in CRC-32C, all outside the
    GIL, so copies overlap one another's waits on the device (docs/performance.md
    "Replication").
    """
    fetchers = check_fetchers(fetchers)

    def one(seg) -> SegmentCopy:
        base, end, trust = seg
        return copy_segment(src, src_dir, dst, dst_dir, base, end_offset=end,
                            trust_end_offset=trust, chunk_bytes=chunk_bytes)

    copies: List[SegmentCopy] = []
    if fetchers == 1 or len(segments) < 2:
        for seg in segments:
            try:
                copies.append(one(seg))
            except KafkaLogError as exc:
                return copies, exc
        return copies, None
    with _pools_lock:
        pool = _pools.setdefault(fetchers, SharedPool(fetchers, "kafkalog-fetch"))
    futures = [pool.get().submit(one, seg) for seg in segments]
    try:
        for f in futures:
            try:
                copies.append(f.result())
            except KafkaLogError as exc:
                return copies, exc
        return copies, None
    finally:
        for f in futures:
            f.cancel()
        wait(futures)


def copy_partition_metadata(src: Storage, src_dir: str, dst: Storage, dst_dir: str) -> str:
    """Make the follower's ``partition.metadata`` the leader's: "created", "existing" or
    "replaced". The leader's is parsed first, so a damaged one is not spread."""
    sp, dp = _join(src_dir, PARTITION_METADATA_FILE), _join(dst_dir, PARTITION_METADATA_FILE)
    data = src.read(sp)
    parse_partition_metadata(data.decode("utf-8", errors="replace"))
    try:
        dst.create_if_absent(dp, data)
        return "created"
    except AlreadyExistsError:
        pass
    if dst.read(dp) == data:
        return "existing"
    _log.warning("%s differs from the leader's %s; replacing it", dst._where(dp), src._where(sp))
    dst.replace(dp, data)
    return "replaced"
