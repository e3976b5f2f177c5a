"""``arrow.buffer_pool``: batch buffers kept from one task to the next, never overwritten while used.

An arena hands out slices of huge-page chunks and takes them all back at once (``reset``); a
chunk is reused only when no view of it is left, so a buffer someone still holds keeps its
bytes whatever is allocated after. The process pool (``take``/``give``) keeps idle arenas up to
``RETAIN_BYTES`` and frees them after ``IDLE_SECONDS``. ``TaskWriter`` uses one for uncompressed
batches and gives it back when its segments are written.
"""
from __future__ import annotations

import ctypes
import os

import pyarrow as pa
import pytest
from hypothesis import given, settings, strategies as st

from pyspark_kafkalog.admin import Admin
from pyspark_kafkalog.connector.arrow_writer import TaskWriter
from pyspark_kafkalog.cluster.cluster import Cluster
from pyspark_kafkalog.arrow import buffer_pool as arena
from pyspark_kafkalog.arrow.accumulate import _Accumulator
from pyspark_kafkalog.spark.write_options import WriteOptions

MiB = 1 << 20


def _addr(view) -> int:
    return ctypes.addressof(ctypes.c_char.from_buffer(view))


@pytest.fixture
def pool(monkeypatch):
    """An empty process pool for the test (the real one may hold other tests' arenas)."""
    monkeypatch.setattr(arena, "_idle", [])
    monkeypatch.setattr(arena, "_timer", None)
    return arena


def test_allocations_are_distinct_writable_and_sized():
    a = arena.Arena(chunk=2 * MiB)
    sizes = [1, 63, 64, 65, 4096, 700_000, 700_000, 700_000, 2 * MiB, 10]
    views = [a.allocate(n) for n in sizes]
    assert [len(v) for v in views] == sizes
    for i, v in enumerate(views):
        v[:] = bytes([i]) * len(v)
    for i, v in enumerate(views):
        assert bytes(v) == bytes([i]) * len(v)
    assert all(_addr(v) % 64 == 0 for v in views)
    assert a.nbytes == 4 * 2 * MiB     # new chunks: the third 700 kB, the 2 MiB, the last 10
    assert len(a.allocate(0)) == 0


def test_more_than_a_chunk_comes_from_arrow():
    a = arena.Arena(chunk=2 * MiB)
    big = a.allocate(2 * MiB + 1)
    assert isinstance(big, pa.Buffer) and big.size == 2 * MiB + 1 and a.nbytes == 0
    with pytest.raises(ValueError):
        a.allocate(-1)
    with pytest.raises(ValueError, match="multiple"):
        arena.Arena(chunk=3 * MiB)


def test_reset_reuses_chunks_nobody_views():
    a = arena.Arena(chunk=2 * MiB)
    first = [_addr(a.allocate(MiB)) for _ in range(4)]        # views dropped at once
    a.reset()
    assert a.nbytes == 4 * MiB
    assert [_addr(a.allocate(MiB)) for _ in range(4)] == first


def test_a_chunk_still_viewed_is_not_reused():
    a = arena.Arena(chunk=2 * MiB)
    kept = a.allocate(1000)
    kept[:] = b"k" * 1000
    held = memoryview(kept).cast("B")[10:20]     # a view of a view keeps the chunk too
    del kept
    other = a.allocate(MiB)                      # the same chunk, dropped
    del other
    a.allocate(3 * MiB // 2)                     # a second chunk, dropped
    a.reset()
    assert a.nbytes == 2 * MiB                   # only the second chunk is left
    for _ in range(3):
        v = a.allocate(MiB)
        v[:] = b"x" * MiB
    assert bytes(held) == b"k" * 10
    assert a.nbytes == 4 * MiB                   # the three took the kept chunk and a new one
    del held, v
    a.reset()
    assert a.nbytes == 4 * MiB


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3 * MiB), st.booleans(), st.booleans()),
                min_size=1, max_size=30))
def test_held_buffers_never_change(steps):
    """Any sequence of allocations (some held, as a batch that outlives its task) and resets:
    every held buffer keeps the bytes written into it."""
    a = arena.Arena(chunk=2 * MiB)
    held = []
    for i, (n, hold, reset) in enumerate(steps):
        v = memoryview(a.allocate(n)).cast("B")   # more than a chunk: an Arrow buffer
        fill = bytes([i % 251 + 1]) * min(n, 64)
        v[:len(fill)] = fill
        v[len(v) - len(fill):] = fill
        if hold:
            held.append((v, fill))
        del v
        if reset:
            a.reset(retain=4 * MiB)
            assert a.nbytes <= 4 * MiB
        for v, fill in held:
            assert bytes(v[:len(fill)]) == fill and bytes(v[len(v) - len(fill):]) == fill


def test_the_pool_keeps_arenas_up_to_retain_bytes(pool, monkeypatch):
    monkeypatch.setattr(pool, "RETAIN_BYTES", 3 * pool.CHUNK)
    a, b = pool.take(), pool.take()
    assert a is not b and pool.idle_bytes() == 0
    for _ in range(2):
        a.allocate(pool.CHUNK)
        b.allocate(pool.CHUNK)
    pool.give(a)
    assert pool.idle_bytes() == 2 * pool.CHUNK
    pool.give(b)                                  # room for one more chunk only
    assert pool.idle_bytes() == 3 * pool.CHUNK and b.nbytes == pool.CHUNK
    assert pool.take() is b and pool.take() is a and pool.idle_bytes() == 0
    pool.give(pool.Arena())                       # an arena with nothing is not kept
    assert pool._idle == []


def test_idle_arenas_are_freed_after_idle_seconds(pool, monkeypatch):
    a = pool.take()
    a.allocate(10)
    pool.give(a)
    assert pool._timer is not None and pool._timer.daemon
    pool._timer.cancel()
    pool._trim()                                  # not idle long enough yet: kept
    assert pool._idle == [a] and pool._timer is not None
    pool._timer.cancel()
    monkeypatch.setattr(pool, "IDLE_SECONDS", 0.0)
    pool._trim()
    assert pool._idle == [] and pool._timer is None and pool.idle_bytes() == 0


@pytest.mark.skipif(_Accumulator is None, reason="the C accumulator is not built")
def test_task_writer_takes_and_gives_back_an_arena(tmp_path, pool):
    """An uncompressed task's batches come from a pooled arena, which goes back to the pool
    when its segments are written; the next task gets the same pages. A compressed topic's
    tasks use no arena (their raw buffers are garbage as soon as they are compressed)."""
    url = str(tmp_path / "c")
    admin = Admin(url)
    admin.create_topic("plain", 2)
    admin.create_topic("lz4", 2, configs={"compression.type": "lz4"})
    rows = pa.record_batch({"key": pa.array([b"k%d" % i for i in range(5000)]),
                            "value": pa.array([os.urandom(100) for _ in range(5000)])})
    seen = []
    for topic in ("plain", "plain", "lz4"):
        opts = WriteOptions.parse({"path": url, "topic": topic})
        tw = TaskWriter(Cluster(url), opts, producer="p")
        tw.add(rows)
        seen.append(tw.arena)
        if topic == "plain":
            assert tw.arena is not None and tw.arena.nbytes > 0
            assert pool.idle_bytes() == 0         # taken from the pool
        tw.finish()
        assert tw.arena is None
        assert pool.idle_bytes() == seen[0].nbytes > 0   # back in the pool
    assert seen[0] is seen[1] and seen[2] is None
    assert admin.describe_topic("plain").partitions[0].high_watermark == 0   # uncommitted
    tw = TaskWriter(Cluster(url), WriteOptions.parse({"path": url, "topic": "plain"}),
                    producer="p")
    tw.add(rows)
    tw.abort()                                    # abort gives it back as well
    assert tw.arena is None and pool.idle_bytes() > 0


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_starts_with_no_idle_arenas(pool):
    a = pool.take()
    a.allocate(10)
    pool.give(a)
    assert pool._idle and pool._timer is not None
    pid = os.fork()
    if pid == 0:   # the child: exit code 0 only if the pool started afresh
        ok = arena._idle == [] and arena._timer is None and arena.idle_bytes() == 0
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert pool._idle == [a]                      # the parent keeps its own
    pool._timer.cancel()
