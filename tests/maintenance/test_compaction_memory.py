"""Issue #35, "Bounded memory": 5,000,000 distinct keys cleaned with the dedupe buffer at 16 MB,
peak RSS reported.

A compacted partition gets ``KAFKALOG_MEMORY_TEST_KEYS`` (default 5,000,000) distinct keys and
10% overwrites, written a column at a time through the Spark-free producer, in segments of
``segment.bytes`` = 32 MiB. A child process (so that its peak RSS is the cleaning's alone) then
runs ``clean_partition`` with ``CleanerSettings(dedupe_buffer_size=16 MiB)`` until the cleaner
checkpoint stops moving: the map holds ~629,000 keys, so that takes a pass per ~629,000 keys,
each over the whole log below the dirty section's end (Kafka's rounds). The result must be
exactly the latest record of every key, read back a chunk at a time against a model of offsets.

The bound: the cleaner holds the offset map (16 MiB), one group (at most ``segment.bytes`` of
source, its decoded columns (~1.5x the source for small records), its digests and its cleaned
output) and one segment of the map's walk (source and columns), about 6.5 x ``segment.bytes``
with what the allocator keeps between them, so its peak is bounded by the interpreter's
baseline + 16 MiB + 10 x ``segment.bytes``, whatever the number of keys. Holding 5,000,000
keys in Python (a dict of 16-byte ``bytes`` to ``int``) would take over 600 MB by itself.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pyarrow as pa
import pytest

from pyspark_kafkalog.admin import Admin
from pyspark_kafkalog.arrow.arrow_encode import encode_v2_chunks
from pyspark_kafkalog.client.producer import Producer

pytestmark = pytest.mark.slow

KEYS = int(os.environ.get("KAFKALOG_MEMORY_TEST_KEYS", "5000000"))
MiB = 1 << 20
SEGMENT_BYTES = 32 * MiB
DEDUPE = 16 * MiB
KEY_WIDTH = 16          # b"k" + 15 digits
VALUE_WIDTH = 12        # the record's offset, 12 digits: the value names its record
T0 = 1_700_000_000_000

CHILD = textwrap.dedent("""
    import json, sys, time
    from pyspark_kafkalog.admin import Admin
    from pyspark_kafkalog.maintenance.compaction import CleanerSettings, clean_partition

    def vm(field):   # VmHWM: reset by exec, unlike ru_maxrss (which counts the forked parent)
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    admin = Admin(sys.argv[1])
    admin.cluster.state()
    baseline = vm("VmRSS")
    settings = CleanerSettings(dedupe_buffer_size=int(sys.argv[2]))
    checkpoints, t = [], time.monotonic()
    while True:
        out = clean_partition(admin.cluster, admin.cluster.state(), "t", 0, force=True,
                              delay_ms=0, settings=settings)
        assert out.skipped is None, out.skipped
        if out.cleaned_to is None or (checkpoints and out.cleaned_to <= checkpoints[-1]):
            break
        checkpoints.append(out.cleaned_to)
    print(json.dumps({"baseline_rss": baseline, "peak_rss": vm("VmHWM"),
                      "checkpoints": checkpoints, "elapsed_s": time.monotonic() - t}))
""")


def _fixed(numbers: np.ndarray, prefix: bytes, width: int) -> pa.Array:
    """``prefix`` + zero-padded decimal of each number, ``width`` bytes each, as Arrow binary."""
    digits = width - len(prefix)
    text = np.char.zfill(numbers.astype(f"S{digits}"), digits)
    if prefix:
        text = np.char.add(prefix, text)
    offsets = np.arange(len(numbers) + 1, dtype=np.int32) * width
    return pa.Array.from_buffers(pa.binary(), len(numbers),
                                 [None, pa.py_buffer(offsets), pa.py_buffer(text.tobytes())])


def _write(admin, ids: np.ndarray, unit: int = 500_000) -> None:
    producer = Producer(admin.cluster)
    for a in range(0, len(ids), unit):
        chunk = ids[a:a + unit]
        n = len(chunk)
        offsets = a + np.arange(n, dtype=np.int64)
        bounds = list(range(0, n, 2000)) + [n]
        batches = encode_v2_chunks(_fixed(chunk, b"k", KEY_WIDTH),
                                   _fixed(offsets, b"", VALUE_WIDTH), T0 + offsets, None,
                                   bounds, 0)
        first, _ = producer.send({("t", 0): batches})[("t", 0)]
        assert first == a


def _parse(data, count: int, width: int, skip: int = 0) -> np.ndarray:
    raw = np.frombuffer(data, dtype=np.uint8)[:count * width].reshape(count, width)[:, skip:]
    return (raw.astype(np.int64) - 48) @ (10 ** np.arange(width - skip - 1, -1, -1))


def test_5m_keys_clean_with_a_16mb_dedupe_buffer_in_bounded_memory(tmp_path):
    root = tmp_path / "c"
    admin = Admin(str(root))
    admin.create_topic("t", 1, configs={"cleanup.policy": "compact",
                                        "segment.bytes": str(SEGMENT_BYTES),
                                        "file.delete.delay.ms": "0"})
    rng = np.random.default_rng(35)
    ids = np.concatenate([rng.permutation(KEYS), rng.integers(0, KEYS, KEYS // 10)])
    rng.shuffle(ids[KEYS // 2:])
    started = time.monotonic()
    _write(admin, ids)
    written_s = time.monotonic() - started

    child = subprocess.run([sys.executable, "-c", CHILD, str(root), str(DEDUPE)],
                           capture_output=True, text=True, timeout=1800)
    assert child.returncode == 0, child.stderr[-3000:]
    got = json.loads(child.stdout.strip().splitlines()[-1])
    cleaned_to = got["checkpoints"][-1]
    peak, baseline = got["peak_rss"], got["baseline_rss"]
    # the map's ~629k keys a pass: several passes, the last ending at the head
    assert len(got["checkpoints"]) >= KEYS // 700_000
    state = admin.cluster.state()
    view = admin.cluster.partition_view("t", 0, state)
    head = view.high_watermark
    (d,) = list(root.glob("logdir-*/t-0"))
    head_base = max(int(n[:-4]) for n in os.listdir(d) if n.endswith(".log"))
    assert cleaned_to == head_base     # everything below the head (never cleaned) is clean

    # the model: below the checkpoint, the latest record of each key there; then everything
    below = ids[:cleaned_to]
    _, last_rev = np.unique(below[::-1], return_index=True)
    want = np.concatenate([np.sort(cleaned_to - 1 - last_rev),
                           np.arange(cleaned_to, len(ids), dtype=np.int64)])
    del below, last_rev
    pos, start, step = 0, 0, 1_000_000
    while start < head:
        cols = view.log.read_columns(start, min(head, start + step), max_bytes=8 * MiB,
                                     with_headers=False)
        offs = np.frombuffer(cols.offset, dtype=np.int64) if len(cols.offset) else \
            np.zeros(0, dtype=np.int64)
        n = len(offs)
        assert np.array_equal(offs, want[pos:pos + n]), f"offsets from {start}"
        assert np.array_equal(_parse(cols.key_data, n, KEY_WIDTH, 1), ids[offs]), start
        assert np.array_equal(_parse(cols.value_data, n, VALUE_WIDTH), offs), start
        pos += n
        start = min(head, start + step)
    assert pos == len(want)

    mib = lambda b: b / MiB  # noqa: E731
    bound = baseline + DEDUPE + 10 * SEGMENT_BYTES
    print(f"\n{KEYS:,} keys, {len(ids):,} records written in {written_s:.1f} s; cleaned in "
          f"{len(got['checkpoints'])} passes, {got['elapsed_s']:.1f} s; child RSS "
          f"{mib(baseline):.0f} MiB after imports, peak {mib(peak):.0f} MiB (VmHWM): cleaning added {mib(peak - baseline):.0f} MiB "
          f"(bound {mib(bound - baseline):.0f} MiB = map 16 + 10 x segment.bytes 32)")
    assert peak <= bound
