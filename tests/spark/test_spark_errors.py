"""What a Spark user reads when a kafkalog read or write fails: the kafkalog error, with Kafka's
error name and code, as the first line of the exception's message (for a task's failure, the
first line after PySpark's fixed "An exception was thrown from the Python worker:"), with no
Python traceback before it. In a real session; the rule itself is in ``spark/surface.py``."""
from __future__ import annotations

import glob
import os

import pytest

from pyspark_kafkalog.admin import Admin
from pyspark_kafkalog.errors import CorruptRecordError, InvalidConfigError
from pyspark_kafkalog.spark import surface

pytestmark = pytest.mark.spark


@pytest.fixture
def cluster(tmp_path):
    root = str(tmp_path / "cluster")
    admin = Admin(root)
    admin.create_topic("t", 1)
    admin.produce("t", [(b"k", b"v")])
    return root


def first_line(exc) -> str:
    return str(exc).splitlines()[0]


def test_a_read_option_of_the_sink_is_named_on_the_first_line(spark, cluster):
    with pytest.raises(Exception) as info:
        spark.read.format("kafkalog").option("topic", "t").load(cluster).collect()
    line = first_line(info.value)
    assert ("pyspark_kafkalog.errors.InvalidConfigError: INVALID_CONFIG (40): option topic='t'"
            in line), line
    assert "Traceback" not in str(info.value)


def test_a_bad_write_option_is_named_on_the_first_line(spark, cluster):
    df = spark.createDataFrame([("k", "v")], "key string, value string")
    with pytest.raises(Exception) as info:
        df.write.format("kafkalog").option("topic", "t").option("acks", "7").mode("append") \
            .save(cluster)
    line = first_line(info.value)
    assert "InvalidConfigError: INVALID_CONFIG (40): acks must be all" in line, line


def test_a_corrupt_segment_read_by_a_task_names_the_damage_and_the_read_only_check(
        spark, cluster):
    seg = sorted(glob.glob(os.path.join(cluster, "logdir-0", "t-0", "*.log")))[0]
    data = bytearray(open(seg, "rb").read())
    data[-3] ^= 0xFF                                      # inside the record: the CRC fails
    with open(seg, "wb") as f:
        f.write(data)
    with pytest.raises(Exception) as info:
        spark.read.format("kafkalog").option("subscribe", "t").load(cluster).collect()
    lines = str(info.value).splitlines()
    assert lines[0] == "An exception was thrown from the Python worker:", lines[:3]
    assert lines[1].startswith("pyspark_kafkalog.errors.CorruptRecordError: CORRUPT_MESSAGE (2): "
                               + "file://" + seg), lines[1]
    assert "dump --index-sanity-check" in lines[1] and "repair" in lines[1]
    assert "Traceback" not in str(info.value)


@pytest.mark.slow
def test_a_bad_option_of_a_stream_fails_the_query_with_it_on_the_first_line(spark, cluster):
    query = (spark.readStream.format("kafkalog").option("topic", "t").load(cluster)
             .writeStream.format("noop").start())
    try:
        with pytest.raises(Exception) as info:
            query.awaitTermination(120)
    finally:
        query.stop()
    line = first_line(info.value)
    assert "InvalidConfigError: INVALID_CONFIG (40): option topic='t'" in line, line


# -- the rule, without Spark ----------------------------------------------------------------------

@pytest.fixture
def worker_env(monkeypatch):
    """Both variables absent, and restored afterwards (a set-then-delete is what makes
    monkeypatch restore a variable the code under test sets)."""
    for name in ("SPARK_HIDE_TRACEBACK", "KAFKALOG_TRACEBACK"):
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    return monkeypatch


def test_a_kafkalog_error_asks_the_worker_for_one_line_and_names_kafkas_error(worker_env):
    @surface.surfaced
    def plan():
        raise InvalidConfigError("option x='y': bad")

    with pytest.raises(InvalidConfigError) as info:
        plan()
    assert str(info.value) == "INVALID_CONFIG (40): option x='y': bad"
    assert os.environ["SPARK_HIDE_TRACEBACK"] == "1"


def test_an_error_raised_while_rows_are_read_is_surfaced_too(worker_env):
    def rows():
        yield 1
        raise CorruptRecordError("batch at 0 is corrupt")

    read = surface.surfaced(lambda: rows())
    it = read()
    assert next(it) == 1
    with pytest.raises(CorruptRecordError, match=r"^CORRUPT_MESSAGE \(2\): batch at 0"):
        next(it)
    assert os.environ["SPARK_HIDE_TRACEBACK"] == "1"


def test_other_errors_and_kafkalog_traceback_keep_the_frames(worker_env):
    with pytest.raises(ZeroDivisionError):
        surface.surfaced(lambda: 1 // 0)()
    assert "SPARK_HIDE_TRACEBACK" not in os.environ
    worker_env.setenv("KAFKALOG_TRACEBACK", "1")
    with pytest.raises(InvalidConfigError):
        surface.surfaced(lambda: (_ for _ in ()).throw(InvalidConfigError("x")))()
    assert "SPARK_HIDE_TRACEBACK" not in os.environ
