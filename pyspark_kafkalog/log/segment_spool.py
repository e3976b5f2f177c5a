"""Segments written while a task still encodes, published once their offsets are reserved.

``segment_writer.write_segments`` needs the batches' offsets, which a writer only has after it
reserved them (docs/protocol.md §3), so a task used to encode everything, reserve, and only then
write: all of the kernel's copying came after the encoding. A :class:`SegmentSpool` writes each
magic 2 batch of a partition to a temp file as soon as the batch is closed (on a background
thread, :class:`SpoolWriter`), splitting files where ``plan_segments`` will split the segments.
After the reservation :meth:`SegmentSpool.publish` patches each batch's first 61 bytes (base
offset, leader epoch, and LogAppendTime's fields: the only bytes a reservation changes, all
outside the records) and publishes the segment files in the usual order (indexes, then the
``.log``) and under the usual names, so the result is byte-identical to ``write_segments``.
Where the storage can (``Storage.can_spool``: local disk, with O_DIRECT or through the page
cache; see ``storage/local_spool.py`` for how each writes the patches).

Nothing here is visible before ``publish``: the temp files are the storage's ordinary ones
(hidden from listings, removed by ``cleanup_temp_files`` when a killed task leaves them). The
caller keeps the batches in memory anyway (it needs them for the indexes and, when the spool
cannot be used after all, for ``write_segments``), so every failure here can fall back to it.
"""
from __future__ import annotations

from concurrent.futures import Future
from typing import List, Sequence

from ..format.batch import V2_HEADER_SIZE
from ..format.encode import EncodedBatch
from .config import LogConfig
from .segment import LOG_SUFFIX, segment_name
from .segment_writer import create_segment_file, delete_quietly, plan_segments, segment_files
from .write_pool import SharedPool

SPOOL_HINT = "spool.log"


class SegmentSpool:
    """One partition's closed magic 2 batches, in temp segment files."""

    def __init__(self, storage, dir_path: str, segment_bytes: int):
        self.storage, self.dir_path, self.segment_bytes = storage, dir_path, segment_bytes
        self.files: list = []        # [(spool, [batch sizes])], one per planned segment
        self._size = 0
        self.queue: list = []        # batches handed over but not yet given to the writer
        self.queued = 0
        self.submitted = False       # a run was given to the writer thread

    def append(self, batches: Sequence) -> None:
        """Write batches' bytes, back to back (on the writer thread)."""
        run: list = []
        for data in batches:
            n = len(data)
            if not self.files or self._size + n > self.segment_bytes:   # plan_segments' rule
                self._write(run)
                run = []
                self.files.append((self.storage.open_spool(self.dir_path, SPOOL_HINT,
                                                             V2_HEADER_SIZE), []))
                self._size = 0
            run.append(data)
            self.files[-1][1].append(n)
            self._size += n
        self._write(run)

    def _write(self, run: list) -> None:
        if run:
            self.files[-1][0].append(run)

    def matches(self, batches: Sequence[EncodedBatch], segment_bytes: int) -> bool:
        """Whether the spooled files hold exactly ``batches``, split as ``segment_bytes`` now
        splits them (the topic's config may have changed since the task started)."""
        return ([[len(b.data) for b in g] for g in plan_segments(batches, segment_bytes)]
                == [sizes for _, sizes in self.files])

    def publish(self, batches: Sequence[EncodedBatch], config: LogConfig, *,
                replace_garbage: bool = True) -> List[int]:
        """Publish the spooled files as the segments of ``batches`` (the same batches, now with
        their offsets; check :meth:`matches` first); returns their base offsets."""
        bases, created = [], []
        try:
            for group, (spool, _) in zip(plan_segments(batches, config.segment_bytes),
                                         self.files):
                base = group[0].base_offset
                patches, pos = [], 0
                for b in group:
                    patches.append((pos, bytes(memoryview(b.data)[:V2_HEADER_SIZE])))
                    pos += len(b.data)
                files = segment_files(base, group, config)
                del files[LOG_SUFFIX]
                for suffix, content in files.items():
                    path = f"{self.dir_path}/{segment_name(base, suffix)}"
                    create_segment_file(self.storage, path, content, replace_garbage)
                    created.append(path)
                path = f"{self.dir_path}/{segment_name(base, LOG_SUFFIX)}"
                spool.publish(path, patches, replace=replace_garbage)
                created.append(path)
                bases.append(base)
        except BaseException:
            delete_quietly(self.storage, created)
            raise
        finally:
            self.discard()
        return bases

    def discard(self) -> None:
        """Delete the temp files not published."""
        for spool, _ in self.files:
            spool.discard()
        self.files = []


class SpoolWriter:
    """Runs spool appends on one background thread, in order, so that writing overlaps
    encoding. Batches are handed over in runs of :data:`RUN_BYTES` per partition: each run is
    one thread hand-off and one write to the device, and every write costs a context switch
    and, in a VM, an exit to the hypervisor. :meth:`wait` writes what is left of the partitions
    already spooling (one that never filled a run is left to the plain write), returns when all
    is written and raises the first error."""

    RUN_BYTES = 4 << 20
    _executor = SharedPool(1, "kafkalog-spool")   # one thread per process

    def __init__(self):
        self._pending: List[Future] = []
        self._prune_at = 64          # finished runs are dropped from _pending past this many
        self._queued: dict = {}      # id -> spool with a queue

    def add(self, spool: SegmentSpool, data) -> None:
        spool.queue.append(data)
        spool.queued += len(data)
        self._queued[id(spool)] = spool
        if spool.queued >= self.RUN_BYTES:
            self._submit(spool)

    def _submit(self, spool: SegmentSpool) -> None:
        run, spool.queue, spool.queued = spool.queue, [], 0
        spool.submitted = True
        self._queued.pop(id(spool), None)
        self._pending.append(self._executor.get().submit(spool.append, run))
        if len(self._pending) > self._prune_at:
            # the limit doubles with what is still running: ``wait`` hands over one run per
            # partition at once, and pruning after each of a thousand partitions' runs was
            # quadratic (seconds at 1,000 partitions)
            self._pending = [f for f in self._pending if not f.done() or f.exception()]
            self._prune_at = max(64, 2 * len(self._pending))

    def wait(self) -> None:
        for spool in list(self._queued.values()):
            if spool.files or spool.submitted:
                self._submit(spool)
            else:
                # never a whole run: nothing was overlapped, so a temp file and its patching
                # would be pure overhead. Left unspooled, the partition is written from memory
                # at publish time (``write_segments``): at 1,000 partitions of 250 rows a task,
                # that was ~0.3 s of a 1.5 s task (docs/spark-write.md)
                spool.queue, spool.queued = [], 0
                del self._queued[id(spool)]
        pending, self._pending = self._pending, []
        error = None
        for f in pending:
            exc = f.exception()
            if exc is not None and error is None:
                error = exc
        if error is not None:
            raise error

    def forget(self) -> None:
        """Drop the queued runs (the spools are being discarded); wait for those running."""
        for spool in self._queued.values():
            spool.queue, spool.queued = [], 0
        self._queued = {}
        try:
            self.wait()
        except Exception:
            pass
