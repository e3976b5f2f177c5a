"""Threads shared by a whole process for writing: the write path's pool (partitions of one
write in parallel) and the class the segment spool and the coordinator's copier make their own
pools with. One pool per purpose per process, because Spark reuses its Python workers between
tasks and a pool per task would start threads on every task.
"""
from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Callable, Optional, Sequence


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
