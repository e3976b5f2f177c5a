"""A flush writes its partitions' segments at once (``Storage.concurrent_writes``).

``write_pool.run_all`` must really run the jobs together, and must not return or raise
before every one of them has ended: ``Producer.write`` aborts after a failure by deleting the
files that the partitions' jobs recorded, so a job still running would leave its files behind.
With one partition failing while another is still writing, nothing may be left on storage and
nothing may become visible; the same writes with the storage's concurrency off give the same
segments, byte for byte.
"""
from __future__ import annotations

import errno
import os
import signal
import threading
import time
import warnings

import pytest

from pyspark_kafkalog.admin import Admin
from pyspark_kafkalog.cluster.cluster import Cluster
from pyspark_kafkalog.client.producer import Producer
from pyspark_kafkalog.format.records import Record
from pyspark_kafkalog.log.write_pool import WRITE_THREADS, run_all
from pyspark_kafkalog.storage.base import Storage
from pyspark_kafkalog.storage.local import LocalStorage
from support.spool_support import segment_files, temp_files

PARTITIONS = 4


@pytest.fixture(autouse=True)
def small_partitions_concurrent_too(monkeypatch):
    """These tests are about the concurrent path, with partitions of tens of KB, which a
    write now runs one by one (``CONCURRENT_MIN_BYTES``): lower the bar for them."""
    from pyspark_kafkalog.log import write_pool
    monkeypatch.setattr(write_pool, "CONCURRENT_MIN_BYTES", 0)


def test_run_all_runs_the_jobs_together_and_waits_for_every_one_before_raising():
    together = threading.Barrier(3, timeout=20)   # passes only when three jobs run at once
    ended, threads = [], set()

    def job(i):
        def run():
            threads.add(threading.get_ident())
            together.wait()
            if i == 0:
                raise OSError(errno.ENOSPC, "job 0 failed")
            time.sleep(0.2 * i)                    # still running when job 0 has failed
            ended.append(i)
        return run
    with pytest.raises(OSError, match="job 0 failed"):
        run_all([job(0), job(1), job(2)], concurrent=True)
    assert sorted(ended) == [1, 2]
    assert len(threads) == 3 and threading.get_ident() not in threads


def test_run_all_without_concurrency_runs_in_order_in_this_thread_and_stops_at_an_error():
    seen = []

    def job(i):
        def run():
            seen.append((i, threading.get_ident()))
            if i == 1:
                raise ValueError("job 1 failed")
        return run
    run_all([job(0)], concurrent=True)             # one job: no pool needed
    with pytest.raises(ValueError, match="job 1 failed"):
        run_all([job(1), job(2)], concurrent=False)
    assert seen == [(0, threading.get_ident()), (1, threading.get_ident())]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork: POSIX only")
def test_a_forked_child_makes_its_own_pool():
    """The parent's pool threads do not exist in a forked child: its jobs would wait forever."""
    together = threading.Barrier(WRITE_THREADS, timeout=20)  # every thread of the parent's
    run_all([together.wait] * WRITE_THREADS, concurrent=True)  # pool started, and now idle
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)   # 3.12+: fork with threads
        pid = os.fork()
    if pid == 0:   # pragma: no cover - the child reports through its exit status
        code = 2
        try:
            signal.alarm(20)
            out = []
            run_all([lambda: out.append(1), lambda: out.append(2)], concurrent=True)
            code = 0 if sorted(out) == [1, 2] else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status


def test_only_local_storage_declares_concurrent_writes():
    assert LocalStorage.concurrent_writes is True
    assert Storage.concurrent_writes is False


def _records(p, n=500):
    return [Record(b"k%d" % i, bytes([p]) * (50 + i % 200), 1_700_000_000_000 + i)
            for i in range(n)]


def _batches(prod):
    return {("t", p): prod.encode("t", _records(p), batch_records=100) for p in range(PARTITIONS)}


def _cluster(url):
    return Cluster(url, fsync=False)


@pytest.fixture
def admin(tmp_path):
    admin = Admin(_cluster(str(tmp_path / "c")))
    admin.create_topic("t", PARTITIONS, configs={"segment.bytes": "20000"})
    return admin


def test_a_partition_that_fails_while_another_still_writes_leaves_nothing(admin, monkeypatch):
    url = admin.cluster.url
    real = LocalStorage.create_segment
    calls = []

    def slow_or_failing(self, dir_path, files):
        calls.append(dir_path + "/")
        if "/t-1/" in calls[-1]:
            raise OSError(errno.ENOSPC, "No space left on device")
        if "/t-3/" in calls[-1]:
            time.sleep(0.05)                       # partition 3 goes on after 1 has failed
        return real(self, dir_path, files)
    monkeypatch.setattr(LocalStorage, "create_segment", slow_or_failing)
    prod = Producer(_cluster(url))
    with pytest.raises(OSError, match="No space left"):
        prod.write(_batches(prod))
    assert sum("/t-3/" in c for c in calls) > 1    # several of its segments were written
    assert not segment_files(url)
    assert not temp_files(url)
    assert list(admin.consume("t")) == []
    monkeypatch.undo()                             # the range was given up: the next write lands
    prod = Producer(_cluster(url))
    prod.commit([prod.write(_batches(prod))])
    assert len(list(admin.consume("t"))) == PARTITIONS * 500


def test_concurrent_and_one_by_one_writes_give_the_same_segments(tmp_path, monkeypatch):
    written = {}
    for concurrent in (True, False):
        monkeypatch.setattr(LocalStorage, "concurrent_writes", concurrent)
        url = str(tmp_path / f"c{concurrent}")
        Admin(_cluster(url)).create_topic("t", PARTITIONS, configs={"segment.bytes": "20000"})
        prod = Producer(_cluster(url))
        prod.commit([prod.write(_batches(prod))])
        written[concurrent] = segment_files(url)
    assert len(written[True]) > 3 * PARTITIONS     # several segments per partition
    assert written[True] == written[False]


def test_small_partitions_are_written_in_the_calling_thread_large_ones_on_the_pool(
        tmp_path, monkeypatch):
    """Page-cache writes of small partitions have no device wait to overlap (their files are
    synced together afterwards), only Python work contending for the GIL; from 1 MiB per
    partition on average (O_DIRECT segments) the pool overlaps the waits."""
    from pyspark_kafkalog.client import producer as producer_module
    from pyspark_kafkalog.log import write_pool
    monkeypatch.setattr(write_pool, "CONCURRENT_MIN_BYTES", 1 << 20)
    assert not write_pool.worth_concurrent(4 * (1 << 20) - 1, 4)
    assert write_pool.worth_concurrent(4 * (1 << 20), 4)
    assert not write_pool.worth_concurrent(8 << 20, 1)
    seen = []
    real = producer_module.run_all
    monkeypatch.setattr(producer_module, "run_all",
                        lambda jobs, concurrent: seen.append(concurrent) or real(jobs, concurrent))
    url = str(tmp_path / "c")
    Admin(_cluster(url)).create_topic("t", PARTITIONS)
    prod = Producer(_cluster(url))
    prod.commit([prod.write(_batches(prod))])              # ~75 KB per partition
    big = {("t", p): prod.encode("t", [Record(b"k", bytes(300_000), 0)] * 4, batch_records=1)
           for p in range(PARTITIONS)}                     # 1.2 MB per partition
    prod.commit([prod.write(big)])
    assert seen == [False, True]
    assert len(list(Admin(_cluster(url)).consume("t"))) == PARTITIONS * 504
