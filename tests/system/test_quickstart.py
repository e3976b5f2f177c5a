"""The README's first command: the quickstart Spark job runs on a fresh directory, twice, and
tells the same story both times (it starts afresh unless --keep); and the streaming quickstart
runs. What it prints on stdout is its own, from the first line."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.spark,
              pytest.mark.slow]   # the quickstart Spark jobs, three times (~90 s)

QUICKSTART = Path(__file__).resolve().parents[2] / "jobs" / "quickstart.py"
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
    if first:   # with --keep, later runs see what the first run's DeleteRecords left
        assert "(pushed down to the time index): 60 of 600" in out
    assert "low watermark now" in out and "(error: None)" in out
    assert "isvalid: true" in out and "isvalid: false" not in out


def test_quickstart_runs_end_to_end(tmp_path, ks, capsys):
    """The README's command in a process of its own; then a second run on the same cluster
    in the suite's session, a JVM start less: the same story again; then one with --keep,
    which appends to what is there."""
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    proc = subprocess.run([sys.executable, str(QUICKSTART), "--cluster", str(tmp_path / "c")],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    _check(proc.stdout, first=True)
    assert proc.stdout.startswith("== created topic"), proc.stdout[:300]
    import pyspark_kafkalog
    key = "spark.sql.python.filterPushdown.enabled"
    before = ks.conf.get(key, None)
    try:
        job = _load(QUICKSTART)
        assert job.main(["--cluster", str(tmp_path / "c")], spark=ks) == 0
        again = capsys.readouterr().out
        assert job.main(["--cluster", str(tmp_path / "c"), "--keep"], spark=ks) == 0
        kept = capsys.readouterr().out
    finally:   # the quickstart turned filter pushdown on: the session is shared
        ks.conf.unset(key) if before is None else ks.conf.set(key, before)
        pyspark_kafkalog.register(ks)
    _check(again, first=True)
    # the same counts as the first run's, line for line (not the name of the segment it dumps:
    # the session's parallelism decides how the write splits into segments)
    def story(out):
        return [line for line in out.splitlines()
                if line.startswith("== ") and "kafkalog dump" not in line]
    assert story(again) == story(proc.stdout) and len(story(again)) >= 5
    _check(kept, first=False)
    assert "created topic" not in kept


def test_quickstart_never_deletes_a_directory_it_did_not_make(tmp_path):
    job = _load(QUICKSTART)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "precious").write_text("x")
    import pytest
    with pytest.raises(SystemExit, match="was not made by a quickstart"):
        job.main(["--cluster", str(mine)])
    assert (mine / "precious").read_text() == "x"


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
