"""Spark readers across repeated segment merges (docs/protocol.md §4.1): a streaming query and
batch reads, running while a producer writes and merges replace and delete segment files under
them, read every record exactly once."""
from __future__ import annotations

import threading
import time

import pytest

from pyspark_kafkalog.admin import Admin
from pyspark_kafkalog.maintenance.retention import merge_segments
from pyspark_kafkalog.format.records import Record

pytestmark = [pytest.mark.spark,
              pytest.mark.slow]   # streaming across repeated merges (~5 s)


def test_a_streaming_query_and_batch_reads_across_repeated_merges(ks, tmp_path):
    root = tmp_path / "c"
    admin = Admin(str(root))
    admin.create_topic("t", 2)
    total = 240
    stop, errors, merges = threading.Event(), [], []

    def produce_and_merge():
        try:
            other = Admin(str(root))
            for i in range(total):
                admin.produce("t", [Record(b"k", b"v%d" % i, 1_700_000_000_000 + i)],
                              partition=i % 2)
                if i % 10 == 9:   # merged at once and the covered deleted at once: no grace
                    merges.extend(m for m in merge_segments(other.cluster, lag_ms=0, delay_ms=0)
                                  if m.merged)
                time.sleep(0.01)
        except Exception as exc:   # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            stop.set()

    df = (ks.readStream.format("kafkalog").option("subscribe", "t")
          .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "17")
          .load(str(root)))
    q = (df.selectExpr("CAST(value AS STRING) v", "partition", "offset").writeStream
         .format("memory").queryName("merged_stream")
         .option("checkpointLocation", str(tmp_path / "ck")).trigger(processingTime="200 milliseconds")
         .start())
    writer = threading.Thread(target=produce_and_merge)
    writer.start()
    batch_counts = []
    try:
        while not stop.is_set():
            rows = ks.read.format("kafkalog").option("subscribe", "t").load(str(root)) \
                .select("partition", "offset").collect()
            seen = sorted((r.partition, r.offset) for r in rows)
            assert len(seen) == len(set(seen))      # never a record twice
            for p in (0, 1):                        # and no gap: each a prefix of the log
                offsets = [o for q_, o in seen if q_ == p]
                assert offsets == list(range(len(offsets)))
            batch_counts.append(len(seen))
        writer.join()
        assert errors == []
        q.processAllAvailable()
        rows = ks.sql("select v, partition, offset from merged_stream").collect()
    finally:
        q.stop()
    assert sorted(r.v for r in rows) == sorted(f"v{i}" for i in range(total))
    assert len(rows) == total
    assert len(merges) >= 5 and len(batch_counts) >= 2
    final = ks.read.format("kafkalog").option("subscribe", "t").load(str(root)).count()
    assert final == total
    assert all(len(list((root / "logdir-0" / f"t-{p}").glob("*.log"))) <= 12 for p in (0, 1))
