"""A compacted topic (``cleanup.policy`` ``compact`` or ``compact,delete``) refuses a record without
a key, as Kafka's broker does (``LogValidator.validateKey``: INVALID_RECORD, error code 87), on
every write path, and nothing of the write is visible: the Admin API, the CLI (a real process),
a Spark write and the local log's append."""
from __future__ import annotations

import json

import pytest

from support.cli_support import run_cli
from support.spark_support import write
from pyspark_kafkalog.admin import Admin
from pyspark_kafkalog.errors import InvalidRecordError
from pyspark_kafkalog.format.encode import encode_records
from pyspark_kafkalog.format.records import Record
from pyspark_kafkalog.log.config import LogConfig
from pyspark_kafkalog.log.partition import PartitionLog
from pyspark_kafkalog.storage import open_storage

MESSAGE = "Compacted topic cannot accept message without key in topic partition t-0."


def ops(root) -> list:
    out = []
    for p in sorted((root / "_kafkalog" / "log").glob("*.json")):
        if not p.name.endswith(".snapshot.json"):
            out += [a["op"] for a in json.loads(p.read_text())["actions"]]
    return out


@pytest.fixture(params=["compact", "compact,delete"])
def root(tmp_path, request):
    root = tmp_path / "c"
    Admin(str(root)).create_topic("t", 1, configs={"cleanup.policy": request.param})
    return root


def test_admin_produce_refuses_a_keyless_record_and_writes_nothing(root):
    admin = Admin(str(root))
    seq = admin.cluster.state().seq
    with pytest.raises(InvalidRecordError) as info:
        admin.produce("t", [(b"k", b"v"), (None, b"no key")], partition=0)
    assert str(info.value) == MESSAGE and info.value.error_code == 87
    assert admin.cluster.state().seq == seq and "reserve" not in ops(root)
    assert list(admin.consume("t")) == []
    admin.produce("t", [(b"k", b"v"), (b"k2", None)], partition=0)   # a tombstone has a key
    assert [(r.key, r.value) for r in admin.consume("t")] == [(b"k", b"v"), (b"k2", None)]


def test_a_delete_topic_takes_keyless_records(tmp_path):
    admin = Admin(str(tmp_path / "c"))
    admin.create_topic("t", 1)
    admin.produce("t", [(None, b"v")], partition=0)
    assert [r.value for r in admin.consume("t")] == [b"v"]


def test_cli_produce_refuses_a_keyless_record(root):
    rc, out, err = run_cli("--cluster", root, "produce", "--topic", "t", "--format", "text",
                           stdin="no key here\n")
    assert rc == 2, (out, err)
    assert err.strip() == f"kafkalog: error: InvalidRecordError: {MESSAGE}", err
    assert "reserve" not in ops(root)


def test_the_local_log_refuses_a_keyless_batch(tmp_path):
    log = PartitionLog(open_storage(str(tmp_path)), "t-0",
                       LogConfig.from_properties({"cleanup.policy": "compact"}))
    batch = encode_records([Record(b"k", b"v", 1), Record(None, b"v", 2)])
    with pytest.raises(InvalidRecordError, match="without key"):
        log.append([batch])
    assert log.log_end_offset == 0


@pytest.mark.spark
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_spark_write_with_a_null_key_fails_and_makes_nothing_visible(ks, root):
    df = ks.createDataFrame([(b"k%d" % i, b"v") for i in range(10)] + [(None, b"v")],
                            "key binary, value binary").coalesce(1)
    with pytest.raises(Exception) as info:
        write(df, root, topic="t")
    assert "InvalidRecordError" in str(info.value) and MESSAGE in str(info.value)
    assert list(Admin(str(root)).consume("t")) == []
    assert "reserve" not in ops(root)
