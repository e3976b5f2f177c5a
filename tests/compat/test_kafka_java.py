"""Apache Kafka's own Java classes read the logs we write (tests/support/kafka_java_support.py).

``KafkaLogCheck`` walks a log dir with Kafka's ``FileRecords`` (every batch's ``ensureValid``:
CRC32 for magic 0/1, CRC32C for magic 2; decompression through Kafka's codec wrappers and the
codec libraries Kafka uses), opens each segment's ``OffsetIndex`` and ``TimeIndex`` read-only, runs
their ``sanityCheck`` and the lookups a broker makes for a fetch and for ListOffsets by timestamp,
and reads the checkpoint files with ``OffsetCheckpointFile``, ``LeaderEpochCheckpointFile`` and
``PartitionMetadataFile``.

1. The check itself is held to the golden log dir, which Kafka wrote: it must return exactly each
   case's ``expected.jsonl``, find no index problem in undamaged cases, and report the damage in
   the damaged ones (so it can fail).
2. The damaged cases, after *our* recovery, read cleanly in Kafka and hold the surviving records.
3. The Spark sink's segments, for every codec and message format version it writes, and with
   LogAppendTime, are read by Kafka's classes as exactly the rows written.
4. A cluster's checkpoint files, leader epochs and partition metadata parse in Kafka's classes
   and say what our metadata says, also after delete-records moved a log start offset.
5. ``PartitionLog.append`` (the broker-side append: rolls, mixed message formats, LogAppendTime,
   transactional batches and their COMMIT/ABORT markers) leaves segments Kafka reads whole.
6. Partitioner parity with Kafka's Java producer (``BuiltInPartitioner.partitionForKey``, that is
   ``toPositive(Utils.murmur2(key)) % n``): every keyed row the sink writes lands there, and the
   vectorised partitioner agrees for many partition counts.
"""
from __future__ import annotations

import json
import random
from datetime import datetime, timezone

import pyarrow as pa
import pytest

from support.golden import DAMAGED, GOLDEN, UNDAMAGED, expected_records
from support.spark_support import write
from pyspark_kafkalog.admin import Admin
from pyspark_kafkalog.format import checkpoint as ckpt
from pyspark_kafkalog.arrow.arrow_encode import partitions_for_keys
from pyspark_kafkalog.format.encode import encode_batch_v2, encode_control_batch, encode_records
from pyspark_kafkalog.format.records import CONTROL_ABORT, CONTROL_COMMIT, Record
from pyspark_kafkalog.log.config import LogConfig
from pyspark_kafkalog.log.partition import PartitionLog
from pyspark_kafkalog.storage import open_storage

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

TS_TYPE = {"CreateTime": 0, "LogAppendTime": 1, "NoTimestampType": -1}
FORMATS = [(m, c) for m in (0, 1, 2) for c in ("none", "gzip", "snappy", "lz4", "zstd")
           if not (c == "zstd" and m < 2)]


def golden_shape(batch: dict, rec: dict) -> dict:
    """A record as KafkaLogCheck printed it, in the golden expected.jsonl shape."""
    return {"segment": int(batch["segment"][:-4]), "offset": rec["offset"],
            "timestamp": rec["timestamp"], "timestampType": TS_TYPE[batch["timestampType"]],
            "magic": batch["magic"], "control": batch["control"],
            "transactional": batch["transactional"], "producerId": batch["producerId"],
            "key": rec["key"], "value": rec["value"],
            "headers": [{"key": k, "value": v} for k, v in rec["headers"]]}


def golden_records(found, case):
    return [golden_shape(b, r) for b in found.batches(case) for r in b["records"]]


# -- 1. the check against ground truth ------------------------------------------------------------

def test_kafka_reads_the_golden_dir_exactly(kafka_check, golden_copy):
    found = kafka_check(golden_copy)
    for case in UNDAMAGED:
        assert golden_records(found, case) == expected_records(case), case
        assert found.problems(case) == [], case
        lookups = found.segments(case)
        assert len(lookups) == 3 and all(d["offsetLookups"] > 0 for d in lookups), case
        if not case.startswith("m0-"):
            assert all(d["timeLookups"] > 0 for d in lookups), case
    assert not [e for e in found.errors() if e["partition"] not in DAMAGED]
    # the root checkpoints, as Kafka reads them, cover every undamaged case
    hw = found.checkpoint("replication-offset-checkpoint")
    for case in UNDAMAGED:
        assert hw[case] == expected_records(case)[-1]["offset"] + 1
    assert found.kind("leader-epochs") and found.kind("partition-metadata")


@pytest.mark.parametrize("case", DAMAGED)
def test_the_check_sees_the_golden_damage(kafka_check, golden_copy, case):
    damage = json.loads((GOLDEN / case / "expected-recovery.json").read_text())
    found = kafka_check(golden_copy, case)
    if damage["damage"] == "corrupt":
        [err] = found.errors()
        assert err["exception"] == "CorruptRecordException"
        assert err["file"] == damage["segment"]
        assert err["position"] == damage["damaged_batch_position"]
    else:
        # a torn tail is where Kafka's reader stops quietly; the check sees the bytes it skipped
        assert not found.errors()
        assert golden_records(found, case) == expected_records(case)
        [torn] = [d for d in found.segments(case) if d["problems"]]
        assert torn["segment"] + ".log" == damage["segment"]
        assert torn["problems"][0] == (f"{torn['sizeInBytes'] - damage['valid_bytes']} bytes at "
                                       "the end are not a whole batch")


# -- 2. our recovery leaves what Kafka reads cleanly -----------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("case", DAMAGED)
def test_kafka_reads_our_recovery_of_the_damaged_cases(kafka_check, golden_copy, case):
    PartitionLog(open_storage(str(golden_copy)), case).recover()
    found = kafka_check(golden_copy, case)
    assert found.errors() == []
    assert found.problems(case) == []
    assert golden_records(found, case) == expected_records(case)


# -- 3. the Spark sink's segments ------------------------------------------------------------------

def sink_rows(n=900, seed=11):
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        key = None if i % 5 == 0 else f"key-{rng.randrange(60)}"
        value = (None if i % 17 == 0 else b"" if i % 13 == 0 else
                 rng.randbytes(rng.randrange(1, 300)) if i % 2 else b"text-%d;" % i * (i % 40))
        ts = datetime.fromtimestamp((1_690_000_000_000 + rng.randrange(-10**6, 10**6)) / 1000,
                                    tz=timezone.utc)
        headers = ([("trace", rng.randbytes(8)), ("null", None), ("ünï", b"")][: i % 4]
                   if i % 3 else [])
        rows.append((key, value, ts, headers))
    return rows


SCHEMA = ("key string, value binary, timestamp timestamp, "
          "headers array<struct<key:string,value:binary>>")
# several segments per partition, and index entries every few batches (not every batch: then the
# final time index entry would never matter)
SMALL_SEGMENTS = {"topic.config.segment.bytes": 12_000, "topic.config.index.interval.bytes": 2500,
                  "batch.records": 23}


def expected_rows(rows, magic):
    return sorted((((None if k is None else k.encode()), v,
                    -1 if magic == 0 else round(ts.timestamp() * 1000),
                    tuple(h) if magic == 2 else ()) for k, v, ts, h in rows), key=repr)


@pytest.mark.slow
def test_every_codec_and_format_the_sink_writes_reads_in_kafka(ks, tmp_path, kafka_check):
    root = tmp_path / "c"
    rows = sink_rows()
    full = ks.createDataFrame(rows, SCHEMA).repartition(2).cache()
    no_headers = full.drop("headers")
    for magic, codec in FORMATS:
        topic = f"f{magic}-{codec}"
        write(full if magic == 2 else no_headers, root, topic=topic, createTopic="true",
              **{"topic.partitions": 3, "message.format.version": magic,
                 "compression.type": codec, **SMALL_SEGMENTS})
        parts = [f"{topic}-{p}" for p in range(3)]
        found = kafka_check(root / "logdir-0", *parts)
        assert found.errors() == [], topic
        assert found.problems() == [], topic
        indexes = found.segments()
        assert len(indexes) >= 3 * 3 and all(d["indexes"] for d in indexes), topic
        assert sum(d["offsetEntries"] for d in indexes) > len(indexes), topic
        if magic > 0:
            assert sum(d["timeLookups"] for d in indexes) > 0, topic
        got = []
        for part in parts:
            batches = found.batches(part)
            for prev, b in zip(batches, batches[1:]):
                assert b["baseOffset"] == prev["lastOffset"] + 1, topic
            recs = found.records(part)
            assert [r["offset"] for r in recs] == list(range(len(recs))), topic
            for r in recs:
                assert r["magic"] == magic and r["compression"] == codec
                assert r["timestampType"] == ("NoTimestampType" if magic == 0 else "CreateTime")
                assert not r["transactional"] and not r["control"] and r["producerId"] == -1
                got.append((r["key"], r["value"], r["timestamp"], tuple(r["headers"])))
        assert sorted(got, key=repr) == expected_rows(rows, magic), topic
    full.unpersist()


@pytest.mark.slow
@pytest.mark.parametrize("magic", [1, 2])
def test_log_append_time_topics_read_in_kafka(ks, tmp_path, kafka_check, magic):
    root = tmp_path / "c"
    rows = sink_rows(120, seed=magic)
    df = ks.createDataFrame(rows, SCHEMA).drop("headers").coalesce(1)
    write(df, root, topic="lat", createTopic="true",
          **{"message.format.version": magic, "compression.type": "lz4",
             "topic.config.message.timestamp.type": "LogAppendTime", **SMALL_SEGMENTS})
    found = kafka_check(root / "logdir-0", "lat-0")
    assert found.errors() == [] and found.problems() == []
    recs = found.records("lat-0")
    assert len(recs) == len(rows)
    for r in recs:
        assert r["timestampType"] == "LogAppendTime"
        assert r["timestamp"] == r["maxTimestamp"] > 1_700_000_000_000
    assert sorted(((r["key"], r["value"]) for r in recs), key=repr) == sorted(
        (((None if k is None else k.encode()), v) for k, v, _, _ in rows), key=repr)


# -- 4. a cluster's log dir files ------------------------------------------------------------------

@pytest.mark.slow
def test_cluster_checkpoints_read_in_kafka_after_delete_records(ks, tmp_path, kafka_check):
    root = tmp_path / "c"
    rows = sink_rows(300, seed=5)
    write(ks.createDataFrame(rows, SCHEMA).repartition(2), root, topic="ck", createTopic="true",
          **{"topic.partitions": 2, **SMALL_SEGMENTS})
    admin = Admin(str(root))
    counts = {p: len(list(admin.consume("ck", p))) for p in (0, 1)}
    admin.delete_records_before({("ck", 0): 37})
    found = kafka_check(root / "logdir-0")
    assert found.errors() == []
    assert found.checkpoint("replication-offset-checkpoint") == {
        "ck-0": counts[0], "ck-1": counts[1]}
    log_start = found.checkpoint("log-start-offset-checkpoint")
    assert log_start.get("ck-0") == 37 and log_start.get("ck-1", 0) == 0
    # the recovery point says what is on the device (protocol §3, "Durability"): the write was
    # left to the kernel, so only delete-records' flush of the log dir moved it, for ck-0;
    # Kafka recovers ck-1 from 0, and reads it all the same (no errors above)
    assert found.checkpoint("recovery-point-offset-checkpoint") == {"ck-0": counts[0]}
    admin.cleanup()
    assert ckpt.parse_offset_checkpoint(
        (root / "logdir-0" / "recovery-point-offset-checkpoint").read_text()) == {
        ("ck", 0): counts[0], ("ck", 1): counts[1]}
    # the segment holding the new log start offset stays, as in Kafka
    assert any(b["baseOffset"] <= 37 <= b["lastOffset"] for b in found.batches("ck-0"))
    desc = admin.describe_topic("ck")
    metas = {d["partition"]: d["topicId"] for d in found.kind("partition-metadata")}
    assert metas == {"ck-0": desc.topic_id, "ck-1": desc.topic_id}
    # the epoch cache starts at the log start offset, as Kafka truncates it from the start
    epochs = {d["partition"]: d["entries"] for d in found.kind("leader-epochs")}
    assert epochs == {f"ck-{p.partition}": [[p.leader_epoch, p.log_start_offset]]
                      for p in desc.partitions}
    assert epochs["ck-0"] == [[desc.partitions[0].leader_epoch, 37]]


# -- 5. the broker-side append ---------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("ts_type", ["CreateTime", "LogAppendTime"])
def test_partition_log_appends_read_in_kafka(tmp_path, kafka_check, ts_type):
    props = {"segment.bytes": 16 * 1024, "index.interval.bytes": 1500,
             "message.timestamp.type": ts_type}
    log = PartitionLog(open_storage(str(tmp_path)), "t-0", LogConfig.from_properties(props))
    rng = random.Random(ts_type)
    want, now, pid = [], 1_750_000_000_000, 900
    for call in range(60):
        batches = []
        for _ in range(1 + call % 3):
            magic = (0, 1, 2, 2)[rng.randrange(4)]
            codec = rng.choice([0, 1, 2, 3] + ([4] if magic == 2 else []))
            recs = [Record(None if i % 4 == 0 else b"k%d" % rng.randrange(99),
                           rng.randbytes(rng.randrange(0, 400)),
                           -1 if magic == 0 else now - rng.randrange(5000),
                           (("h", b"1"),) if magic == 2 and i % 2 else ())
                    for i in range(1 + rng.randrange(30))]
            if magic == 2 and call % 5 == 4:          # a transaction and its marker
                batches.append(encode_batch_v2(recs, compression=codec, producer_id=pid,
                                               producer_epoch=3, base_sequence=0,
                                               transactional=True))
                marker = CONTROL_ABORT if call % 10 == 4 else CONTROL_COMMIT
                batches.append(encode_control_batch(marker, producer_id=pid, producer_epoch=3,
                                                    timestamp=now, coordinator_epoch=call))
                want += [(magic, r.key, r.value) for r in recs] + [("marker", marker, call)]
                pid += 1
            else:
                batches.append(encode_records(recs, magic=magic, compression=codec))
                want += [(magic, r.key, r.value) for r in recs]
        log.append(batches, leader_epoch=2, now_ms=now)
        now += 1000
    found = kafka_check(tmp_path, "t-0")
    assert found.errors() == [] and found.problems() == []
    assert len(found.segments()) >= 4
    recs = found.records("t-0")
    assert [r["offset"] for r in recs] == list(range(len(want)))
    got = []
    for r in recs:
        if r["control"]:
            assert r["transactional"] and r["key"] is not None
            marker = {"COMMIT": CONTROL_COMMIT, "ABORT": CONTROL_ABORT}[r["controlType"]]
            got.append(("marker", marker, r["coordinatorEpoch"]))
        else:
            got.append((r["magic"], r["key"], r["value"]))
            if r["magic"] > 0:
                assert r["timestampType"] == ts_type
            if ts_type == "LogAppendTime" and r["magic"] > 0:
                assert r["timestamp"] == r["maxTimestamp"]
        if r["magic"] == 2:
            assert r["partitionLeaderEpoch"] == 2
    assert got == want


# -- 6. partitioner parity with Kafka's Java producer ----------------------------------------------

def parity_keys(seed=2025):
    rng = random.Random(seed)
    keys = {rng.randbytes(rng.randrange(0, 70)) for _ in range(15_000)}
    keys |= {f"user-{i}".encode() for i in range(4_000)}
    keys |= {f"ünïcødé-{i}".encode() for i in range(1_000)}
    return sorted(keys)


@pytest.mark.slow
def test_vectorised_partitioner_matches_kafkas_java_producer(kafka_check):
    keys = parity_keys()
    arr = pa.array(keys, pa.binary()).slice(5)        # a slice: offsets must be honoured
    for n in (1, 2, 3, 7, 12, 100, 1009, 2**31 - 1):
        assert partitions_for_keys(arr, n).tolist() == kafka_check.partitions(keys[5:], n), n


@pytest.mark.slow
def test_sink_puts_keyed_rows_where_kafkas_java_producer_does(ks, tmp_path, kafka_check):
    root = tmp_path / "c"
    keys = parity_keys(7)
    df = ks.createDataFrame([(k, b"v") for k in keys], "key binary, value binary").repartition(4)
    write(df, root, topic="parity", createTopic="true", **{"topic.partitions": 13})
    landed = [(r["key"], int(r["partition"].rpartition("-")[2]))
              for r in kafka_check(root / "logdir-0").records()]
    assert sorted(k for k, _ in landed) == keys
    assert [p for _, p in landed] == kafka_check.partitions([k for k, _ in landed], 13)


# -- 7. merged segments (docs/protocol.md §4.1) -----------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("magic_version", ["3.0-IV1", "0.10.2", "0.9.0"])
def test_merged_segments_read_in_kafka(tmp_path, kafka_check, magic_version):
    from pyspark_kafkalog.maintenance.retention import merge_segments
    admin = Admin(str(tmp_path / "c"))
    admin.create_topic("m", 2, configs={"message.format.version": magic_version,
                                        "index.interval.bytes": "256",
                                        "compression.type": "lz4"})
    rng = random.Random(magic_version)
    want = {0: [], 1: []}
    for i in range(90):
        recs = [Record(b"k%d" % rng.randrange(50), rng.randbytes(rng.randrange(1, 300)),
                       1_700_000_000_000 + i) for _ in range(1 + rng.randrange(3))]
        admin.produce("m", recs, partition=i % 2)
        want[i % 2] += [r.value for r in recs]
    done = merge_segments(admin.cluster, lag_ms=0, delay_ms=0)
    assert all(m.merged for m in done) and len(done) == 2
    found = kafka_check(tmp_path / "c" / "logdir-0")
    assert found.errors() == [] and found.problems() == []
    for p in (0, 1):
        assert len(found.segments(f"m-{p}")) == 2          # the merged one and the head
        got = found.records(f"m-{p}")
        assert [r["value"] for r in got] == want[p]
        assert [r["offset"] for r in got] == list(range(len(want[p])))
