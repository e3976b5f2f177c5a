"""The README's first command: the quickstart Spark job runs on a fresh directory, twice; and
the streaming quickstart runs."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

QUICKSTART = Path(__file__).resolve().parents[1] / "jobs" / "quickstart.py"
STREAMING = QUICKSTART.with_name("quickstart_streaming.py")


def test_quickstart_runs_end_to_end(tmp_path):
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    for run in range(2):   # a second run appends to the existing topic
        proc = subprocess.run([sys.executable, str(QUICKSTART), "--cluster", str(tmp_path / "c")],
                              capture_output=True, text=True, timeout=300, env=env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        out = proc.stdout
        assert "wrote 600 records in one job" in out
        assert "(pushed down to the time index): " in out
        if run == 0:   # later runs see what the first run's DeleteRecords left
            assert "(pushed down to the time index): 60 of 600" in out
        assert "low watermark now" in out and "(error: None)" in out
        assert "isvalid: true" in out and "isvalid: false" not in out


def test_streaming_quickstart_runs_end_to_end(ks, tmp_path, capsys):
    """In the tests' shared session (the subprocess above already proves a fresh start): the
    job's own code path, without a second JVM start."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("quickstart_streaming", STREAMING)
    job = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(job)
    assert job.main(["--cluster", str(tmp_path / "c")], spark=ks) == 0
    out = capsys.readouterr().out
    assert "micro-batch sizes (at most 150): [150, 50" in out
    assert "events: 500, events-upper: 500, distinct: 500 (every event exactly once: True)" in out
    lag = [line.split() for line in out.splitlines() if line.startswith("quickstart ")]
    assert lag and all(row[-1] == "0" for row in lag), out
