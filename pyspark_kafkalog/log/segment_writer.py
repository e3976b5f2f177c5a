"""Write whole, immutable segments: the shared-storage way to add data to a partition.

On shared storage there is no safe append (object stores have none, and two processes appending
to one file corrupt it), so a writer that owns an offset range writes it as new segments named by
their first offset, each file with create-if-absent: the indexes first (created in place: until
the ``.log`` exists they belong to no segment), the ``.log`` last and published whole, so a
``.log`` that exists is complete, indexes included (docs/protocol.md, §3). The indexes are
exactly what Kafka's recovery would rebuild.
"""
from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Callable, List, Optional, Sequence

from ..errors import AlreadyExistsError
from ..format import index as idx
from ..format.batch import iter_headers
from ..format.encode import EncodedBatch
from ..format.index_builder import IndexBuilder
from .config import LogConfig
from .segment import INDEX_SUFFIX, LOG_SUFFIX, TIMEINDEX_SUFFIX, segment_name


def plan_segments(batches: Sequence[EncodedBatch], segment_bytes: int) -> List[List[EncodedBatch]]:
    """Split batches (in offset order) into segments of at most ``segment_bytes`` (one batch
    always fits: a batch larger than a segment gets a segment of its own)."""
    groups: List[List[EncodedBatch]] = []
    size = 0
    for b in batches:
        if not groups or size + len(b.data) > segment_bytes:
            groups.append([])
            size = 0
        groups[-1].append(b)
        size += len(b.data)
    return groups


def segment_files(base_offset: int, batches: Sequence[EncodedBatch], config: LogConfig):
    """``{suffix: content}`` for one segment holding ``batches``: bytes for the indexes, the
    list of the batches' bytes for the ``.log`` (written back to back, never joined here: a
    segment can be hundreds of megabytes)."""
    builder = IndexBuilder(base_offset, config.index_interval_bytes)
    for b in batches:
        for h in iter_headers(b.data):
            builder.add(h.size, h.last_offset, h.max_timestamp)
    return {TIMEINDEX_SUFFIX: idx.encode_time_index(builder.final_time_entries(), base_offset),
            INDEX_SUFFIX: idx.encode_offset_index(builder.offset_entries, base_offset),
            LOG_SUFFIX: [b.data for b in batches]}


def write_segments(storage, dir_path: str, batches: Sequence[EncodedBatch], config: LogConfig,
                   *, replace_garbage: bool = True) -> List[int]:
    """Write offset-assigned ``batches`` as new segments; returns their base offsets.

    ``replace_garbage``: the caller owns this offset range exclusively, so a file already there
    was left by a dead or fenced writer and is replaced.
    """
    bases = []   # no makedirs: creating a segment makes its directory (Storage.create_segment)
    created: List[str] = []
    try:
        for group in plan_segments(batches, config.segment_bytes):
            base = group[0].base_offset
            files = [(segment_name(base, suffix), content)
                     for suffix, content in segment_files(base, group, config).items()]
            try:   # all three at once; it leaves nothing behind when it fails
                storage.create_segment(dir_path, files)
            except AlreadyExistsError:
                if not replace_garbage:
                    raise
                for name, content in files:   # garbage of a dead writer in the way
                    create_segment_file(storage, f"{dir_path}/{name}", content, True)
                    created.append(f"{dir_path}/{name}")
            else:
                created += [f"{dir_path}/{name}" for name, _ in files]
            bases.append(base)
    except BaseException:
        delete_quietly(storage, created)
        raise
    return bases


def delete_quietly(storage, paths: Sequence[str]) -> None:
    """Remove the files of a write that failed part-way (whole segments, and indexes without
    their ``.log``): the caller's abort only knows the partitions that were written whole."""
    for path in paths:
        try:
            storage.delete(path)
        except Exception:
            pass   # best effort: cleanup removes index files without a .log later


def create_segment_file(storage, path: str, content, replace_garbage: bool) -> None:
    """Create one file of a segment (``content``: bytes for an index, created in place; a list
    of buffers written back to back for the ``.log``, published whole); with
    ``replace_garbage`` a file already there is replaced (see write_segments)."""
    try:
        if isinstance(content, list):
            storage.create_if_absent_pieces(path, content)
        else:   # an index means nothing until its .log exists (docs/protocol.md §3)
            storage.create_in_place(path, content)
    except AlreadyExistsError:
        if not replace_garbage:
            raise
        storage.replace(path, b"".join(content) if isinstance(content, list) else content)


class SharedPool:
    """A thread pool for the whole process, made on first use and kept (Spark reuses its Python
    workers between tasks), and made again in a forked child: the parent's threads do not
    exist there, and a job handed to its pool would wait forever."""

    def __init__(self, workers: int, name: str):
        self.workers, self.name = workers, name
        self._lock = threading.Lock()
        self._pool: Optional[ThreadPoolExecutor] = None
        self._pid = 0

    def get(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None or self._pid != os.getpid():
                self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix=self.name)
                self._pid = os.getpid()
            return self._pool


#: The threads :func:`run_all` writes partitions with: enough to overlap a local disk's
#: latency and share its journal commits (docs/spark-write.md).
WRITE_THREADS = 4
_writers = SharedPool(WRITE_THREADS, "kafkalog-write")
#: Below this many bytes per partition on average, a write's partitions are written one after
#: another: their files go through the page cache (O_DIRECT starts at 1 MiB) and are synced
#: together afterwards, so there is no device wait to overlap, only Python work contending for
#: the GIL. Measured in-process, a task writing 1,000 partitions of 25 KB: 0.76-0.99 s in this
#: thread against 0.89-1.06 s on the pool (docs/spark-write.md).
CONCURRENT_MIN_BYTES = 1 << 20


def worth_concurrent(total_bytes: int, partitions: int) -> bool:
    """Whether :func:`run_all` should use the pool for a write of ``partitions`` partitions."""
    return partitions > 1 and total_bytes >= partitions * CONCURRENT_MIN_BYTES


def run_all(jobs: Sequence[Callable[[], None]], concurrent: bool) -> None:
    """Run every job: in this thread one after the other, or, with ``concurrent`` (the
    storage's ``concurrent_writes``), on the shared pool. Either way all of them have ended
    when this returns or raises (the first job's error, in order): a caller that cleans up
    after a failure must not race a job that is still creating files."""
    if not concurrent or len(jobs) < 2:
        for job in jobs:
            job()
        return
    pool = _writers.get()
    futures = [pool.submit(job) for job in jobs]
    wait(futures)
    for f in futures:
        f.result()
