"""The README's first command: the quickstart Spark job runs on a fresh directory, twice; and
the streaming quickstart runs."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

QUICKSTART = Path(__file__).resolve().parents[1] / "jobs" / "quickstart.py"
STREAMING = QUICKSTART.with_name("quickstart_streaming.py")


def _load(path):
    import importlib.util
    spec = importlib.util.spec_from_file_location(path.stem, path)
    job = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(job)
    return job


def _check(out, first):
    assert "wrote 600 records in one job" in out
    assert "(pushed down to the time index): " in out
    if first:   # later runs see what the first run's DeleteRecords left
        assert "(pushed down to the time index): 60 of 600" in out
    assert "low watermark now" in out and "(error: None)" in out
    assert "isvalid: true" in out and "isvalid: false" not in out


def test_quickstart_runs_end_to_end(tmp_path, ks, capsys):
    """The README's command in a process of its own; then a second run on the same cluster
    (it appends to the existing topic) in the suite's session, a JVM start less."""
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    proc = subprocess.run([sys.executable, str(QUICKSTART), "--cluster", str(tmp_path / "c")],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    _check(proc.stdout, first=True)
    import pyspark_kafkalog
    key = "spark.sql.python.filterPushdown.enabled"
    before = ks.conf.get(key, None)
    try:
        assert _load(QUICKSTART).main(["--cluster", str(tmp_path / "c")], spark=ks) == 0
    finally:   # the quickstart turned filter pushdown on: the session is shared
        ks.conf.unset(key) if before is None else ks.conf.set(key, before)
        pyspark_kafkalog.register(ks)
    _check(capsys.readouterr().out, first=False)


def test_streaming_quickstart_runs_end_to_end(ks, tmp_path, capsys):
    """In the tests' shared session (the subprocess above already proves a fresh start): the
    job's own code path, without a second JVM start."""
    job = _load(STREAMING)
    assert job.main(["--cluster", str(tmp_path / "c")], spark=ks) == 0
    out = capsys.readouterr().out
    assert "micro-batch sizes (at most 150): [150, 50" in out
    assert "events: 500, events-upper: 500, distinct: 500 (every event exactly once: True)" in out
    lag = [line.split() for line in out.splitlines() if line.startswith("quickstart ")]
    assert lag and all(row[-1] == "0" for row in lag), out
