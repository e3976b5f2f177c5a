"""DeleteRecords (KIP-107) and retention have one implementation (maintenance/retention.py): its dry
runs change nothing and predict the real run, its per-partition work goes through the fan-out the
caller passes (and survives pickling, as on Spark executors), and a topic recreated between
planning and applying is left alone."""
from __future__ import annotations

import pickle
import sys
from pathlib import Path

import pytest

from pyspark_kafkalog.admin import Admin
from pyspark_kafkalog.maintenance import retention as M
from pyspark_kafkalog.format.records import Record

JOBS = Path(__file__).resolve().parents[2] / "jobs"


def files(root: Path) -> dict:
    """Every file and its bytes (derived metadata snapshots aside: reading may write one)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and not p.name.endswith(".snapshot.json")}


def data_files(root: Path) -> dict:
    """The partitions' files (the metadata log records even a refused request)."""
    return {k: v for k, v in files(root).items() if not k.startswith("_kafkalog/")}


def segments(root: Path, topic: str, partition: int) -> list:
    return sorted(int(f.stem) for f in (root / "logdir-0" / f"{topic}-{partition}").glob("*.log"))


def fill(admin, topic="t", partitions=3, writes=4, **configs):
    """``writes`` one-record segments per partition, with timestamps 10s, 20s, ..."""
    admin.create_topic(topic, partitions, configs={"segment.bytes": 100, **configs})
    for i in range(writes):
        for p in range(partitions):
            admin.produce(topic, [Record(b"k", b"v" * 40, 10_000 * (i + 1))], partition=p)


class Recording:
    """A fan-out that records what it is given and runs the work as an executor would: the
    work pickled, and unpickled into a fresh cluster and state."""

    def __init__(self):
        self.calls = []

    def __call__(self, items, fn):
        items = list(items)
        self.calls.append((items, fn))
        return pickle.loads(pickle.dumps(fn))(items)


def answer(r):
    return (r.low_watermark, r.error.error_name, str(r.error)) if r.error else (r.low_watermark,)


# -- dry runs -----------------------------------------------------------------------------------

def test_delete_records_dry_run_changes_nothing_and_predicts_the_run(tmp_path):
    root = tmp_path / "c"
    admin = Admin(str(root))
    fill(admin)
    request = {("t", 0): 3, ("t", 1): -1, ("t", 2): 9, ("t", 7): 0, ("nope", 0): 1,
               ("x", 0): -4}                              # -4: refused before the request
    seq = admin.cluster.state().seq
    before = files(root)
    dry = M.delete_records_dry_run(admin.cluster, request)
    assert files(root) == before and admin.cluster.state().seq == seq
    assert list(dry) == list(request)
    assert [(d.log_start_offset, d.high_watermark) for d in dry.values()] == [
        (0, 4), (0, 4), (0, 4), (None, None), (None, None), (None, None)]
    assert dry[("t", 0)].topic_id == admin.cluster.state().topics["t"]["topic_id"]
    assert dry[("nope", 0)].topic_id is None
    assert [answer(d.result)[:2] for d in dry.values()] == [
        (3,), (4,), (-1, "OFFSET_OUT_OF_RANGE"), (-1, "UNKNOWN_TOPIC_OR_PARTITION"),
        (-1, "UNKNOWN_TOPIC_OR_PARTITION"), (-1, "OFFSET_OUT_OF_RANGE")]

    real = M.delete_records(admin.cluster, request)
    assert {tp: answer(r) for tp, r in real.items()} == {
        tp: answer(d.result) for tp, d in dry.items()}
    state = admin.cluster.state()
    assert state.seq == seq + 1
    assert [state.partition("t", p).log_start_offset for p in range(3)] == [3, 4, 0]
    assert [segments(root, "t", p) for p in range(3)] == [[3], [], [0, 1, 2, 3]]


def test_retention_dry_run_changes_nothing_and_predicts_the_run(tmp_path):
    root = tmp_path / "c"
    admin = Admin(str(root))
    fill(admin, **{"retention.ms": 1000})
    fill(admin, "b", partitions=1, **{"retention.bytes": 150})
    seq = admin.cluster.state().seq
    before = files(root)
    dry = M.retention(admin.cluster, dry_run=True, now_ms=30_500)
    assert files(root) == before and admin.cluster.state().seq == seq
    assert [(p.topic, p.partition, p.log_start_offset, p.new_log_start_offset, p.segments,
             p.reason) for p in dry] == [
        ("b", 0, 0, 2, [0, 1], "retention.bytes")] + [
        ("t", p, 0, 2, [0, 1], "retention.ms") for p in range(3)]

    real = M.retention(admin.cluster, now_ms=30_500)
    assert real == dry
    state = admin.cluster.state()
    assert state.seq == seq + 1                            # one entry for every partition
    for p in dry:
        assert state.partition(p.topic, p.partition).log_start_offset == p.new_log_start_offset
        assert segments(root, p.topic, p.partition) == [2, 3]
    assert M.retention(admin.cluster, dry_run=True, now_ms=30_500) == []


# -- the fan-out --------------------------------------------------------------------------------

def test_retention_fans_out_planning_and_deletion(tmp_path):
    root = tmp_path / "c"
    admin = Admin(str(root))
    fill(admin, **{"retention.ms": 1000})
    admin.create_topic("kept", 2, configs={"retention.ms": -1})
    fan_out = Recording()
    plans = M.retention(admin.cluster, now_ms=30_500, fan_out=fan_out)
    assert len(fan_out.calls) == 2
    (planned, plan_work), (deleted, delete_work) = fan_out.calls
    assert planned == [("kept", 0), ("kept", 1), ("t", 0), ("t", 1), ("t", 2)]
    assert isinstance(plan_work, M.PartitionWork) and plan_work.step is M._plan_step
    assert deleted == [("t", 0), ("t", 1), ("t", 2)]       # only partitions trimmed
    assert delete_work.step is M._delete_step
    assert delete_work.state.partition("t", 0).log_start_offset == 2   # the state it made
    assert [p.segments for p in plans] == [[0, 1]] * 3
    assert [segments(root, "t", p) for p in range(3)] == [[2, 3]] * 3


def test_delete_records_fans_out_only_partitions_whose_action_applied(tmp_path):
    root = tmp_path / "c"
    admin = Admin(str(root))
    fill(admin)
    fan_out = Recording()
    res = M.delete_records(admin.cluster, {("t", 2): 3, ("t", 0): 99, ("t", 1): 2, ("z", 0): 1},
                           fan_out=fan_out)
    assert sorted(tp for tp, r in res.items() if r.error is None) == [("t", 1), ("t", 2)]
    [(items, work)] = fan_out.calls
    assert sorted(items) == [("t", 1), ("t", 2)] and work.step is M._delete_step
    assert [segments(root, "t", p) for p in range(3)] == [[0, 1, 2, 3], [2, 3], [3]]
    # nothing to delete anywhere: the fan-out still sees the (empty) work, and nothing breaks
    fan_out = Recording()
    res = M.delete_records(admin.cluster, {("t", 0): 99}, fan_out=fan_out)
    assert res[("t", 0)].error.error_name == "OFFSET_OUT_OF_RANGE"
    assert [items for items, _ in fan_out.calls] == [[]]


# -- a topic recreated between planning and applying --------------------------------------------

def recreate(admin, topic="t", partitions=3):
    admin.delete_topic(topic)
    admin.create_topic(topic, partitions, configs={"segment.bytes": 100, "retention.ms": 1000})
    for i in range(4):
        for p in range(partitions):
            admin.produce(topic, [Record(b"n", b"w" * 40, 10_000 * (i + 1))], partition=p)


def test_retention_leaves_a_topic_recreated_since_planning_alone(tmp_path):
    root = tmp_path / "c"
    admin = Admin(str(root))
    fill(admin, **{"retention.ms": 1000})
    plans = M.plan_retention(admin.cluster, admin.cluster.state(), 30_500)
    assert len(plans) == 3
    recreate(admin)
    before = files(root)
    fan_out = Recording()
    M.apply_retention(admin.cluster, plans, fan_out=fan_out)
    assert [items for items, _ in fan_out.calls] == [[]]
    state = admin.cluster.state()
    assert all(state.partition("t", p).log_start_offset == 0 for p in range(3))
    assert {k: v for k, v in files(root).items() if "/t-" in k} == {
        k: v for k, v in before.items() if "/t-" in k}


def test_delete_records_leaves_a_topic_recreated_since_the_dry_run_alone(tmp_path):
    root = tmp_path / "c"
    admin = Admin(str(root))
    fill(admin)
    dry = M.delete_records_dry_run(admin.cluster, {("t", 0): 3, ("t", 1): 2})
    ids = {tp[0]: d.topic_id for tp, d in dry.items()}
    recreate(admin)
    before = data_files(root)
    res = M.delete_records(admin.cluster, {("t", 0): 3, ("t", 1): 2}, topic_ids=ids)
    assert {tp: (r.error.error_name, "recreated" in str(r.error)) for tp, r in res.items()} == {
        ("t", 0): ("UNKNOWN_TOPIC_OR_PARTITION", True),
        ("t", 1): ("UNKNOWN_TOPIC_OR_PARTITION", True)}
    assert data_files(root) == before
    assert admin.cluster.state().partition("t", 0).log_start_offset == 0


def test_delete_records_leaves_a_topic_recreated_while_it_submits_alone(tmp_path):
    """Without topic ids from the caller, the request is for the topics as delete_records found
    them: a recreate between its read of the state and its entry does not reach the new topic."""
    root = tmp_path / "c"
    admin = Admin(str(root))
    fill(admin)
    other = Admin(str(root))
    cluster = admin.cluster
    real_submit = cluster.submit

    def submit_after_a_recreate(actions):
        recreate(other)
        return real_submit(actions)

    cluster.submit = submit_after_a_recreate
    res = M.delete_records(cluster, {("t", 0): 3})
    assert res[("t", 0)].error.error_name == "UNKNOWN_TOPIC_OR_PARTITION"
    assert other.cluster.state().partition("t", 0).log_start_offset == 0
    assert segments(root, "t", 0) == [0, 1, 2, 3]


def test_delete_records_job_keeps_the_consumed_topics_incarnation(tmp_path):
    """jobs/delete_records.py --consumed-by: the group consumed the old topic; the new one of
    the same name is not trimmed to the old one's offsets (no Spark: the serial fan-out)."""
    sys.path.insert(0, str(JOBS))
    try:
        import delete_records as job
    finally:
        sys.path.remove(str(JOBS))
    root = tmp_path / "c"
    admin = Admin(str(root))
    fill(admin)
    list(admin.consume("t", 0, group="g", max_records=3))
    offsets, ids = job.consumed_by(admin.cluster, "g")
    assert offsets == {("t", 0): 3} and ids == {"t": admin.cluster.state().topics["t"]["topic_id"]}
    assert job.run(str(root), offsets, dry_run=True, topic_ids=ids) == {
        ("t", 0): {"requested": 3, "log_start_offset": 0, "high_watermark": 4, "error": "NONE",
                   "low_watermark": 3}}
    recreate(admin)
    res = job.run(str(root), offsets, topic_ids=ids)
    assert res[("t", 0)]["error"] == "UNKNOWN_TOPIC_OR_PARTITION"
    assert segments(root, "t", 0) == [0, 1, 2, 3]


@pytest.mark.parametrize("bad", [-2, True, "3"])
def test_delete_records_refuses_bad_offsets_before_the_request(tmp_path, bad):
    admin = Admin(str(tmp_path / "c"))
    fill(admin, partitions=1)
    seq = admin.cluster.state().seq
    for run in (M.delete_records, M.delete_records_dry_run):
        out = run(admin.cluster, {("t", 0): bad})
        r = out[("t", 0)]
        r = getattr(r, "result", r)
        assert r.error.error_name == "OFFSET_OUT_OF_RANGE"
    assert admin.cluster.state().seq == seq
