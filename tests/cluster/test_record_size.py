"""``max.message.bytes`` in cluster mode: Kafka's broker check, on each batch as stored (after
compression), refuses a record too big for a batch of its own with RECORD_TOO_LARGE (error code
10, ``RecordTooLargeError``), and nothing of the write happens: no segment file, no ``reserve``
entry in the metadata log. Checked through the CLI (a real process), the Admin API and a Spark
write; many small records that together pass the limit are split into batches, not refused."""
from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import pytest

from support.spark_support import write
from support.cli_support import run_cli
from pyspark_kafkalog.admin import Admin
from pyspark_kafkalog.errors import RecordTooLargeError
from pyspark_kafkalog.format.batch import iter_headers
from pyspark_kafkalog.format.encode import encode_records
from pyspark_kafkalog.format.records import Record

NOW = 1_700_000_000_000


def files(root: Path) -> dict:
    """Every file of the cluster and its bytes: segments, metadata entries, snapshots."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


def ops(root: Path) -> list:
    """The ops of every metadata log entry, in order."""
    out = []
    for p in sorted((root / "_kafkalog" / "log").glob("*.json")):
        if not p.name.endswith(".snapshot.json"):
            out += [a["op"] for a in json.loads(p.read_text())["actions"]]
    return out


def segments(root: Path) -> list:
    return sorted(p.name for p in root.glob("logdir-*/*/*") if p.suffix in (".log", ".index",
                                                                           ".timeindex"))


def line(value: bytes, **extra) -> str:
    return json.dumps({"value": base64.b64encode(value).decode(), "timestamp": NOW,
                       **extra}) + "\n"


def batch_size(value: bytes) -> int:
    return len(encode_records([Record(None, value, NOW)]).data)


@pytest.fixture
def root(tmp_path) -> Path:
    root = tmp_path / "c"
    Admin(str(root)).create_topic("t", 1, configs={"max.message.bytes": "100"})
    return root


def assert_refused(rc, out, err, size, limit):
    assert rc == 2, (out, err)
    assert out == ""
    assert "Traceback" not in err
    assert err.count("\n") == 1, err
    assert err.startswith("kafkalog: error: RecordTooLargeError: "), err
    assert f"append to t-0 is {size} bytes" in err, err
    assert f"max.message.bytes ({limit})" in err, err


# -- the CLI ----------------------------------------------------------------------------------

def test_cli_refuses_a_record_over_the_topics_limit_and_writes_nothing(root):
    before = files(root)
    rc, out, err = run_cli("--cluster", root, "produce", "--topic", "t",
                           stdin=line(b"x" * 500))
    assert_refused(rc, out, err, batch_size(b"x" * 500), 100)
    assert files(root) == before
    assert "reserve" not in ops(root) and segments(root) == []


def test_cli_refuses_a_3_mib_record_with_the_default_limit(tmp_path):
    root = tmp_path / "c"
    Admin(str(root)).create_topic("t", 1)
    before = files(root)
    value = os.urandom(3 << 20)
    rc, out, err = run_cli("--cluster", root, "produce", "--topic", "t", stdin=line(value))
    assert_refused(rc, out, err, batch_size(value), 1048588)
    assert files(root) == before


def test_cli_checks_the_size_after_compression(root):
    """2000 zero bytes gzip to a batch of about 100 bytes: Kafka takes them, as it checks the
    batch as stored; uncompressed they are refused."""
    Admin(str(root)).alter_configs("t", {"max.message.bytes": "150"})
    rc, out, err = run_cli("--cluster", root, "produce", "--topic", "t", stdin=line(bytes(2000)))
    assert rc == 2 and "RecordTooLargeError" in err, err
    rc, out, err = run_cli("--cluster", root, "produce", "--topic", "t", "--compression", "gzip",
                           stdin=line(bytes(2000)))
    assert rc == 0, err
    assert [r.value for r in Admin(str(root)).consume("t")] == [bytes(2000)]


def test_cli_splits_many_small_records_into_batches_that_fit(root):
    """Together far over the limit, each alone under it: written, in batches of <= 100 bytes."""
    rc, out, err = run_cli("--cluster", root, "--json", "produce", "--topic", "t",
                           stdin="".join(line(b"v%02d" % i) for i in range(40)))
    assert rc == 0, err
    assert len(out.splitlines()) == 40
    assert [r.value for r in Admin(str(root)).consume("t")] == [b"v%02d" % i for i in range(40)]
    (log,) = root.glob("logdir-*/t-0/*.log")
    headers = list(iter_headers(log.read_bytes()))
    assert len(headers) > 1 and all(h.size <= 100 for h in headers), [h.size for h in headers]


# -- the Admin API ----------------------------------------------------------------------------

def test_admin_produce_refuses_and_writes_nothing(root):
    admin = Admin(str(root))
    before, seq = files(root), admin.cluster.state().seq
    with pytest.raises(RecordTooLargeError, match=r"append to t-0 is \d+ bytes") as info:
        admin.produce("t", [(b"small", b"ok"), (None, b"x" * 500)], partition=0)
    assert info.value.error_code == 10
    assert files(root) == before
    assert admin.cluster.state().seq == seq
    assert list(admin.consume("t")) == []
    # the limit is the topic's: raised, the same record goes in
    admin.alter_configs("t", {"max.message.bytes": "1000"})
    admin.produce("t", [(None, b"x" * 500)], partition=0)
    assert [r.value for r in admin.consume("t")] == [b"x" * 500]


# -- a Spark write ----------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_spark_write_of_a_row_over_the_limit_fails_and_makes_nothing_visible(ks, root):
    rows = [(b"small-%d" % i,) for i in range(20)] + [(b"x" * 500,)]
    df = ks.createDataFrame(rows, "value binary").coalesce(1)
    with pytest.raises(Exception) as info:
        write(df, root, topic="t")
    message = str(info.value)
    assert "RecordTooLargeError" in message, message[-2000:]
    assert f"append to t-0 is {batch_size(b'x' * 500)} bytes" in message, message[-2000:]
    assert "max.message.bytes (100)" in message
    assert list(Admin(str(root)).consume("t")) == []
    assert "reserve" not in ops(root)
    assert segments(root) == []
