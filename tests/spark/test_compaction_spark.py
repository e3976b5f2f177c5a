"""A compacted topic end to end with Spark (docs/protocol.md §4.2): a streaming query writes
keyed upserts to it while the coordinator's log cleaner cleans it, and a batch read then gives
exactly the latest value of every key; a streaming query that reads the topic while it is
cleaned never reports a compaction gap as data loss."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from pyspark_kafkalog.admin import Admin
from pyspark_kafkalog.coordinator.embedded import start as start_coordinator
from pyspark_kafkalog.format.records import Record

pytestmark = [pytest.mark.slow, pytest.mark.spark,
              pytest.mark.filterwarnings("ignore::DeprecationWarning")]

UPSERTS = "id INT, key STRING, value STRING"
CLEANER = {"log.cleaner.backoff.ms": "100", "coordinator.replication.enable": "false"}


def add_upserts(src: Path, name: str, rows) -> None:
    tmp = src / f".{name}.tmp"
    with open(tmp, "w") as f:
        for i, key, value in rows:
            f.write(json.dumps({"id": i, "key": key, "value": value}) + "\n")
    os.rename(tmp, src / f"{name}.json")


def latest_per_key(ks, root: Path, topic: str) -> dict:
    rows = (ks.read.format("kafkalog").option("subscribe", topic).load(str(root))
            .select("key", "value", "offset", "partition").collect())
    out = {}
    for r in sorted(rows, key=lambda r: (r.partition, r.offset)):
        out[bytes(r.key).decode()] = bytes(r.value).decode()
    return out, len(rows)


def test_a_stream_of_upserts_cleaned_while_it_runs_reads_back_as_the_latest_per_key(
        ks, tmp_path):
    root, src, ckpt = tmp_path / "c", tmp_path / "in", tmp_path / "ckpt"
    src.mkdir()
    Admin(str(root)).create_topic("users", 2, configs={
        "cleanup.policy": "compact", "file.delete.delay.ms": "0",
        "min.cleanable.dirty.ratio": "0.01"})
    coordinator = start_coordinator(str(root), config=CLEANER, bind="127.0.0.1:0",
                                    metrics_port=None, token="a-test-token-0123456789")
    model = {}
    q = (ks.readStream.schema(UPSERTS).json(str(src))
         .selectExpr("CAST(key AS BINARY) AS key", "CAST(value AS BINARY) AS value")
         .writeStream.format("kafkalog").option("checkpointLocation", str(ckpt))
         .option("topic", "users").start(str(root)))
    try:
        for batch in range(8):
            rows = [(batch * 100 + i, f"user{i % 17}", f"v{batch}.{i}") for i in range(60)]
            for _, key, value in rows:
                model[key] = value
            add_upserts(src, f"b{batch}", rows)
            q.processAllAvailable()
            time.sleep(0.3)          # the cleaner looks every 100 ms
        deadline = time.monotonic() + 60
        state = Admin(str(root)).cluster.state()
        while not state.cleaner_checkpoints and time.monotonic() < deadline:
            time.sleep(0.2)
            state = Admin(str(root)).cluster.state()
        assert state.cleaner_checkpoints, "the coordinator's cleaner never cleaned"
    finally:
        q.stop()
        coordinator.stop()
    assert q.exception() is None
    got, n = latest_per_key(ks, root, "users")
    assert got == model
    assert n < 8 * 60           # cleaned: older versions are gone (the heads stay)


def test_a_stream_reading_a_topic_cleaned_under_it_reports_no_data_loss(ks, tmp_path):
    root, ckpt, out = tmp_path / "c", tmp_path / "ckpt", tmp_path / "out"
    admin = Admin(str(root))
    admin.create_topic("u", 1, configs={"cleanup.policy": "compact", "file.delete.delay.ms": "0"})
    written = []
    for i in range(40):
        admin.produce("u", [Record(b"k%d" % (i % 5), b"v%d" % i, 1_700_000_000_000 + i)],
                      partition=0)
        written.append((b"k%d" % (i % 5), b"v%d" % i))
    q = (ks.readStream.format("kafkalog").option("subscribe", "u")
         .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "7")
         .option("failOnDataLoss", "true").load(str(root))
         .selectExpr("offset", "CAST(key AS STRING) AS key", "CAST(value AS STRING) AS value")
         .writeStream.format("json").option("path", str(out))
         .option("checkpointLocation", str(ckpt)).trigger(availableNow=True).start())
    try:
        admin.cleanup(compact_now=True)             # cleaned (and covered files gone) meanwhile
        q.awaitTermination(120)
    finally:
        q.stop()
    assert q.exception() is None
    rows = ks.read.json(str(out)).collect()
    offsets = sorted(r.offset for r in rows)
    assert offsets == sorted(set(offsets)) and offsets[-1] == 39
    assert all(written[r.offset] == (r.key.encode(), r.value.encode()) for r in rows)
    # every key's latest value was delivered
    latest = {k: (o, v) for o, (k, v) in enumerate(written)}
    assert {o for o, _ in latest.values()} <= set(offsets)
