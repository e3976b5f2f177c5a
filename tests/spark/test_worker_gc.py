"""``spark.worker_gc``: a worker's long-lived objects are frozen once, before its first task.

PySpark's daemon runs a full ``gc.collect()`` after every task of a reused worker; frozen
objects are skipped, so that collection no longer walks every module of the process. Each case
runs in a fresh interpreter: freezing is process-wide and happens once.
"""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest


pytestmark = pytest.mark.slow   # Spark worker processes (~3 s)


def _run(code: str, **env) -> str:
    import os
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                         text=True, env={**os.environ, **env}, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


FREEZE_THEN_COLLECT = """
    import gc, time
    import pyarrow, pyspark.sql, pyspark_kafkalog.spark.writer
    from pyspark_kafkalog.spark import worker_gc
    garbage = []
    garbage.append(garbage)            # a cycle: must be collected first, not frozen
    del garbage
    before = gc.get_freeze_count()
    did = worker_gc.freeze_once()
    again = worker_gc.freeze_once()
    n = len(gc.get_objects())
    print(did, again, before, gc.get_freeze_count(), n, gc.collect())
"""


def test_freeze_once_collects_then_freezes_everything_alive():
    did, again, before, frozen, tracked, collected = _run(FREEZE_THEN_COLLECT).split()
    assert (did, again, before) == ("True", "False", "0")
    assert int(frozen) > 20_000                 # PySpark, pyarrow and ours: all frozen
    assert int(tracked) < 2_000                 # what a full collection still walks
    assert collected == "0"                     # the cycle went before the freeze


@pytest.mark.parametrize("value", ["false", "0", "OFF", " no "])
def test_the_environment_turns_it_off(value):
    did, again, before, frozen, tracked, _ = _run(FREEZE_THEN_COLLECT,
                                                  KAFKALOG_GC_FREEZE=value).split()
    assert (did, again, frozen) == ("False", "False", "0") and int(tracked) > 20_000


def test_the_reader_and_writer_freeze_before_their_task(monkeypatch):
    from pyspark_kafkalog.spark import reader, worker_gc, writer
    calls = []
    monkeypatch.setattr(worker_gc, "freeze_once", lambda: calls.append(1) or False)

    class Stop(Exception):
        pass

    def stop(*a, **k):
        raise Stop
    monkeypatch.setattr(writer, "TaskWriter", stop)
    w = writer.KafkaLogWriter.__new__(writer.KafkaLogWriter)
    w.options = w.producer = None
    monkeypatch.setattr(writer, "sink_cluster", lambda options, shared_state=False: None)
    with pytest.raises(Stop):
        w.write(iter(()))
    assert calls == [1]
    r = reader.KafkaLogReader.__new__(reader.KafkaLogReader)

    class Part:
        value = None
    assert list(r.read(Part())) == [] and calls == [1, 1]
    from pyspark_kafkalog.spark import stream_reader
    sr = stream_reader.KafkaLogStreamReader.__new__(stream_reader.KafkaLogStreamReader)
    assert list(sr.read(Part())) == [] and calls == [1, 1, 1]
