"""kill -9 at random points of log cleaning (issue #35, "How it is judged": faults): no latest
value is lost and no partial result is ever seen.

A compacted partition is written by this process (every acknowledged write is the model) while
a child process (tests/procs/compaction_child.py) cleans it in a loop and is killed with SIGKILL:
at a random moment, or right after a chosen step of a clean (its entry applied, the marker, part
of the ``.log`` written, the ``.log`` replaced, one index, both, a covered segment's ``.log``
deleted). Meanwhile this process reads the partition again and again, and after every kill:

1. before anyone repairs anything: a read gives only records written at their offsets, in
   increasing order, and the latest acknowledged value of every key;
2. a fresh process runs a clean pass as the next cleaner would (its clock past the dead one's
   publish window and margin, so the marker it left is mended, ``finish_dir``);
3. then: no marker left, every segment's batches pass their CRC and its indexes are Kafka's
   rebuild, the high watermark holds every acknowledged write, everything at or above the
   cleaner checkpoint is still there, and the same checks as in 1.

At the end, Kafka's own classes (where they can be built) read the partition as ours do.

``KAFKALOG_COMPACTION_KILLS`` (default 10) kills, ``KAFKALOG_COMPACTION_SEED`` the seed (printed
on failure).
"""
from __future__ import annotations

import os
import random
import time
from pathlib import Path

import pytest

from support.processes import ChildProcess
from pyspark_kafkalog.admin import Admin
from pyspark_kafkalog.cluster.state import tp_key
from pyspark_kafkalog.format.batch import scan_entries
from pyspark_kafkalog.format.records import Record
from pyspark_kafkalog.log.partition import PartitionLog
from pyspark_kafkalog.log.segment_merge import MERGING_SUFFIX
from pyspark_kafkalog.maintenance.segment_merges import MARKER_MARGIN_MS, MIN_PUBLISH_WINDOW_S

pytestmark = pytest.mark.slow   # child processes killed again and again (~1-3 s a kill)

CHILD = Path(__file__).resolve().parents[1] / "procs" / "compaction_child.py"
POINTS = ("entry", "marker", "log-part", "log", "timeindex", "index", "delete")
TOPIC = "c"
T0 = 1_700_000_000_000
#: the repairing pass's clock, ahead of the storage's: past any dead cleaner's publish window
AHEAD_S = MIN_PUBLISH_WINDOW_S + MARKER_MARGIN_MS / 1000 + 5


class Model:
    """Every acknowledged write, by offset."""

    def __init__(self):
        self.at = {}

    def produce(self, admin, rng, keys=24):
        recs = [Record(b"k%02d" % rng.randrange(keys),
                       None if rng.random() < 0.1 else b"v%d-" % len(self.at) + rng.randbytes(
                           rng.randrange(0, 300)), T0 + len(self.at))
                for _ in range(rng.randrange(1, 5))]
        placed = admin.produce(TOPIC, recs, partition=0)
        for md, r in zip(placed, recs):
            self.at[md.offset] = (r.key, r.value)

    def latest(self, below=None):
        out = {}
        for off in sorted(self.at):
            if below is None or off < below:
                out[self.at[off][0]] = (off, self.at[off][1])
        return out


def _read_and_check(url, model: Model, why: str):
    """A fresh reader's view of the partition, held to the model: only written records at
    their offsets, increasing, and the latest acknowledged value of every key acknowledged
    before the read began."""
    latest = model.latest()
    got = [(r.offset, r.key, r.value) for r in Admin(url, create=False).consume(TOPIC, 0)]
    offsets = [o for o, _, _ in got]
    assert offsets == sorted(set(offsets)), f"{why}: offsets go back or repeat"
    for o, k, v in got:
        assert model.at.get(o) == (k, v), f"{why}: offset {o} holds {k!r}={v!r}, not the write"
    have = {o for o in offsets}
    for k, (o, v) in latest.items():
        if v is not None:
            assert o in have, f"{why}: the latest value of {k!r} (offset {o}) is gone"
    return got


def _check_files(url, root: Path, model: Model, why: str):
    admin = Admin(url, create=False)
    state = admin.cluster.state()
    d = root / admin.cluster.partition_dir(TOPIC, 0, state=state)
    assert not list(d.glob(f"*{MERGING_SUFFIX}")), f"{why}: a marker is left after the repair"
    logs = {p.stem for p in d.glob("*.log")}
    strays = [p.name for p in d.iterdir() if p.suffix in (".index", ".timeindex")
              and p.stem not in logs]
    assert not strays, f"{why}: indexes without their .log after the repair: {strays}"
    config = state.topic_config(TOPIC)
    log = PartitionLog(admin.cluster.storage, admin.cluster.partition_dir(TOPIC, 0, state=state),
                       config)
    for seg in log.segments:
        data = (d / Path(seg.log_path).name).read_bytes()
        for _ in scan_entries(data, validate_crc=True, check_offsets=False, strict=True,
                              file=seg.log_path):
            pass
        assert ((d / Path(seg.path(".index")).name).read_bytes(),
                (d / Path(seg.path(".timeindex")).name).read_bytes()) == seg.rebuilt_indexes(), \
            f"{why}: {seg}: its indexes are not those of its .log"
    ps = state.partition(TOPIC, 0)
    assert ps.high_watermark == max(model.at) + 1, f"{why}: acknowledged writes lost"
    got = _read_and_check(url, model, why)
    have = {o for o, _, _ in got}
    checkpoint = state.cleaner_checkpoints.get(tp_key(TOPIC, 0), 0)
    missing = [o for o in model.at if o >= checkpoint and o not in have]
    assert not missing, f"{why}: uncleaned offsets {missing[:10]} (checkpoint {checkpoint}) gone"
    return checkpoint


def _kafka_reads_the_same(root: Path, ours):
    """Where Kafka's classes can be built (tests/support/kafka_java_support.py): they read the
    partition after the last repair with no error or problem, and the records ours read."""
    import support.kafka_java_support as kj
    try:
        check = kj.KafkaCheck(*kj.build())
    except kj.Unavailable as exc:
        print(f"Kafka's classes are unavailable, their read is left out: {exc}")
        return
    found = check(root / "logdir-0", f"{TOPIC}-0")
    assert found.errors() == [] and found.problems() == [], (found.errors(), found.problems())
    assert [(r["offset"], r["key"], r["value"]) for r in found.records()] == ours


def _run_one(tmp: Path, url: str, model: Model, rng: random.Random, n: int, crash_at: str):
    """One cleaner child until it dies, reading and writing meanwhile; (passes it printed,
    whether it reached its crash point, reads made while it cleaned)."""
    admin = Admin(url, create=False)
    # a backoff longer than file.delete.delay.ms lets covered segments go between passes
    backoff = 0.3 if crash_at.startswith("delete") else rng.choice([0, 0.15, 0.3])
    child = ChildProcess(tmp, f"clean-{n}", CHILD, "clean", url, TOPIC, crash_at, backoff)
    reads = 0
    try:
        deadline = time.monotonic() + (rng.uniform(0.5, 2.5) if crash_at == "random" else 60)
        while child.alive() and time.monotonic() < deadline:
            for _ in range(rng.randrange(1, 4)):
                model.produce(admin, rng)
            _read_and_check(url, model, f"kill {n} ({crash_at}): a read while it cleaned")
            reads += 1
        if child.alive() and crash_at != "random":
            raise AssertionError(f"kill {n}: the cleaner never reached {crash_at}: "
                                 f"{child.lines()[-3:]} {child.stderr_tail()}")
    finally:
        child.kill()
    lines = child.lines()
    errors = child.stderr_tail()
    assert "Traceback" not in errors, f"kill {n} ({crash_at}): the cleaner failed:\n{errors}"
    return ([x for x in lines if "pass" in x], any("dying" in x for x in lines), reads)


def test_kill_9_at_random_points_of_cleaning_loses_no_latest_value(tmp_path):
    seed = int(os.environ.get("KAFKALOG_COMPACTION_SEED") or random.randrange(1 << 30))
    kills = int(os.environ.get("KAFKALOG_COMPACTION_KILLS", "10"))
    rng = random.Random(seed)
    root = tmp_path / "cluster"
    url = str(root)
    admin = Admin(url)
    admin.create_topic(TOPIC, 1, configs={"cleanup.policy": "compact",
                                          "file.delete.delay.ms": "100",
                                          "delete.retention.ms": "0",
                                          "index.interval.bytes": "256"})
    model = Model()
    passes = deaths = reads = rebuilt = 0
    checkpoints = []
    try:
        for _ in range(30):
            model.produce(admin, rng)
        for n in range(kills):
            # every deterministic point in turn (the Nth time it is reached, N random), and a
            # random kill every third round
            crash_at = ("random" if n % 3 == 2 else
                        f"{POINTS[(n - n // 3) % len(POINTS)]}:{rng.randrange(1, 3)}")
            done, died, r = _run_one(tmp_path, url, model, rng, n, crash_at)
            passes, deaths, reads = passes + len(done), deaths + died, reads + r
            why = f"after kill {n} ({crash_at})"
            _read_and_check(url, model, why + ", before any repair")
            repair = ChildProcess(tmp_path, f"repair-{n}", CHILD, "repair", url, TOPIC, AHEAD_S)
            assert repair.proc.wait(timeout=120) == 0, repair.stderr_tail()
            [out] = [x["repair"] for x in repair.lines() if "repair" in x]
            assert out["skipped"] is None, f"{why}: the repairing pass: {out}"
            rebuilt += bool(out["rebuilt"])
            print(f"kill {n} at {crash_at}: died at its point {died}, {len(done)} passes, "
                  f"{r} reads meanwhile; the repair rebuilt {out['rebuilt']}, deleted "
                  f"{len(out['deleted'])}, cleaned {out['cleaned']}, garbage "
                  f"{ {k: v for k, v in out['garbage'].items() if v} }")
            checkpoints.append(_check_files(url, root, model, why + " and a repair"))
        assert deaths >= kills - kills // 3 - 1, "the cleaners hardly reached their points"
        assert passes > 0 and reads > kills and checkpoints[-1] > 0, (passes, reads, checkpoints)
        final = _read_and_check(url, model, "at the end")
        assert len(final) < len(model.at)   # it did clean
        _kafka_reads_the_same(root, final)
    except BaseException:
        print(f"KAFKALOG_COMPACTION_SEED={seed} KAFKALOG_COMPACTION_KILLS={kills}")
        raise
