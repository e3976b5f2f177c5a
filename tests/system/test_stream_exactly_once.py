"""kafkalog -> transform -> kafkalog is exactly once end to end, with real processes: producers
write all the time while the query's driver is killed with SIGKILL at random points and
restarted from its checkpoint (``KAFKALOG_STREAM_KILLS`` times, default 3); then a restart with
a backlog and fast catch-up (KIP-333), where records produced after the restart reach the sink
before the gap closes. When the query has caught up, the sink holds every source record exactly
once and the consumer group's lag is 0."""
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.spark,
              pytest.mark.slow]   # streaming queries in child processes killed and restarted (~70 s)

from pyspark_kafkalog.admin import Admin

CHILD = Path(__file__).resolve().parents[1] / "procs" / "stream_child.py"
KILLS = int(os.environ.get("KAFKALOG_STREAM_KILLS", "3"))
START_DEADLINE_S = 300
BACKLOG = 1500
PER_TRIGGER = 100     # the gap closes in 15 batches


def spark_home_without_zips(where: Path) -> str:
    """The installed SPARK_HOME but for ``python/lib``'s zips, for the drivers. Why: Spark starts
    a Python daemon for each kind of worker (seven before a streaming query's first batch here)
    and puts ``$SPARK_HOME/python/lib/pyspark.zip`` first on each one's path. A zip holds no
    bytecode, so every daemon compiled PySpark from source: 2.0 s against 0.5 s from
    site-packages on this suite's machine, for the same PySpark (the same files of the same
    install). Four drivers each reach their first batch about 7 s sooner. The quickstart tests
    keep the install exactly as users have it."""
    import pyspark
    real = Path(pyspark.__file__).parent
    home = where / "spark-home"
    (home / "python" / "lib").mkdir(parents=True)
    for entry in real.iterdir():
        if entry.name != "python":
            (home / entry.name).symlink_to(entry)
    return str(home)


def spawn(*args, spark_home=None, **kw):
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    if spark_home:
        env["SPARK_HOME"] = spark_home
    return subprocess.Popen([sys.executable, str(CHILD), *map(str, args)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env=env, **kw)


def wait_for(proc, predicate, deadline_s=START_DEADLINE_S):
    """Read the child's lines until one satisfies ``predicate``; fail if it dies first."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        line = proc.stdout.readline()
        if not line:
            raise AssertionError(f"the child ended (status {proc.wait()}) before it was ready")
        if predicate(line.strip()):
            return line.strip()
    raise AssertionError("the child did not get ready in time")


def values(admin, topic):
    return [r.value.decode() for r in admin.consume(topic)]


def sink_has(admin, wanted, deadline_s=START_DEADLINE_S):
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        sink = set(values(admin, "out"))
        if wanted(sink):
            return sink
        time.sleep(0.3)
    raise AssertionError("the sink did not get there in time")


def test_killed_drivers_and_a_fast_catch_up_restart_are_exactly_once(tmp_path):
    """One pipeline, four driver processes (a JVM each, the expensive part): three are killed
    with SIGKILL at random points while two producers write; then, with a backlog of
    ``BACKLOG`` records built while no driver ran, a fourth restarts with fast catch-up
    (KIP-333) and is killed too once it has caught up."""
    root = str(tmp_path / "cluster")
    admin = Admin(root)
    admin.create_topic("in", 3)
    admin.create_topic("out", 2)
    stop = tmp_path / "stop"
    producers = [spawn("producer", root, name, stop) for name in ("a", "b")]
    ck = tmp_path / "checkpoint"
    home = spark_home_without_zips(tmp_path)
    rng = random.Random(int(os.environ.get("KAFKALOG_SEED", "0")) or None)
    try:
        for _ in range(KILLS):
            d = spawn("driver", root, ck, spark_home=home)
            wait_for(d, lambda line: line.startswith("batch "))
            time.sleep(rng.uniform(0.0, 2.0))        # somewhere inside a later batch
            d.kill()
            d.wait()
    finally:
        stop.touch()
        acked = []
        for p in producers:
            out, _ = p.communicate(timeout=120)
            acked += out.split()
    assert len(os.listdir(ck / "commits")) >= KILLS          # batches committed meanwhile
    # the backlog, then a restart with fast catch-up while a producer goes on writing
    for i in range(0, BACKLOG, 500):
        admin.produce("in", [(f"old-{j}".encode(), f"old-{j}".encode())
                             for j in range(i, i + 500)])
    opts = {"fastCatchUp": "true", "fastCatchUpThreshold": BACKLOG // 2,
            "fastCatchUpRecordsPerTrigger": PER_TRIGGER}
    d = spawn("driver", root, ck, json.dumps(opts), spark_home=home)
    try:
        wait_for(d, lambda line: line.startswith("batch "))
        admin.produce("in", [(b"fresh-0", b"fresh-0"), (b"fresh-1", b"fresh-1")])
        sink_has(admin, lambda s: {"FRESH-0", "FRESH-1"} <= s)
        source = values(admin, "in")
        sink_has(admin, lambda s: len(s) == len(source))     # caught up
        end = time.monotonic() + START_DEADLINE_S
        while time.monotonic() < end:                       # the group follows the query
            lag = admin.describe_group("etl")
            if lag and all(row.lag == 0 for row in lag):
                break
            time.sleep(0.3)
    finally:
        d.kill()
        d.wait()
    # fresh records first: the gap was still open when they were written. Read from the sink's
    # order, not from when this process happened to look: a batch moves the gap by at most
    # PER_TRIGGER records, so more than that many OLD records after FRESH-0 in its partition
    # means a later batch went on filling the gap.
    out = list(admin.consume("out"))
    fresh = next(r for r in out if r.value == b"FRESH-0")
    later_old = [r for r in out if r.partition == fresh.partition and r.offset > fresh.offset
                 and r.value.startswith(b"OLD-")]
    assert len(later_old) > PER_TRIGGER, f"the gap had closed ({len(later_old)} OLD after FRESH)"
    sink = [r.value.decode() for r in out]
    assert len(source) == len(set(source)) and set(acked) <= set(source)
    assert sorted(sink) == sorted(v.upper() for v in source)      # each exactly once
    assert all(row.lag == 0 for row in lag), lag
