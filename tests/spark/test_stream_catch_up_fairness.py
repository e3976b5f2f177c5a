"""Fast catch-up (KIP-333) is fair to fresh records: a query restarted far behind reads the
records produced while it catches up in the very next micro-batch, with at most the one batch
that was in flight when they arrived writing backlog before them, and the gap moves by
``fastCatchUpRecordsPerTrigger`` per batch whatever ``maxOffsetsPerTrigger`` says (and without
it). Also after a crash *during* catch-up, when the restart finds both an open gap and a new
backlog (the gap then gets a second range, read after the first).

The first tests drive the source in-process the way Spark drives it (latestOffset -> partitions
-> read -> commit, tests/spark/test_stream_source.py) and model the sink as the batch's rows in the
order of its input partitions; the last one runs real streaming queries, kafkalog -> kafkalog,
and judges by the order of the records in the output topic. Between them: lost data is named
by its kind (a committed segment missing from storage, with the repair command, or offsets
that retention or delete-records removed after planning), and failOnDataLoss=false warns on
the driver."""
import json
import random
import time

import pytest

from pyspark_kafkalog.admin import Admin
from pyspark_kafkalog.connector.stream_plan import (SourceOffset, advance_gaps, batch_ranges,
                                                   open_gaps)
from pyspark_kafkalog.spark.read_options import ReadOptions
from pyspark_kafkalog.spark.stream_reader import KafkaLogStreamReader

PARTITIONS = 4
THRESHOLD = 1000
BUDGET = 400          # fastCatchUpRecordsPerTrigger


pytestmark = pytest.mark.slow   # long streaming catch-ups (~12 s)


def reader(root, **opts):
    o = ReadOptions.parse({"path": str(root), **{k: str(v) for k, v in opts.items()}},
                          streaming=True)
    return KafkaLogStreamReader(o, None)


def produce(admin, values, partition=None):
    admin.produce("t", [(v.encode(), v.encode()) for v in values], partition=partition)


# -- the planner's rules on their own --------------------------------------------------------

def test_a_gap_of_several_ranges_round_trips_and_the_group_holds_its_first_position():
    off = SourceOffset.of_ranges({("t", 0): 9000, ("t", 1): 50},
                                 {("t", 0): [(200, 1000), (1500, 8000)], ("t", 1): [(7, 7)]})
    j = off.to_json()
    assert j["$catchUp"] == {"t": {"0": [[200, 1000], [1500, 8000]], "1": [7, 7]}}
    assert j["$catchUpRecordsLeft"] == 800 + 6500
    back = SourceOffset.from_json(j)
    assert back == off and back.gaps == {("t", 0): (200, 1000), ("t", 1): (7, 7)}
    assert back.committed_positions() == {("t", 0): 200, ("t", 1): 50}
    # one range keeps the one-pair form every earlier version wrote and reads
    assert SourceOffset.of_ranges({}, {("t", 0): [(1, 5)]}).to_json()["$catchUp"] == \
        {"t": {"0": [1, 5]}}
    from pyspark_kafkalog.errors import InvalidConfigError
    for bad in ([[5, 9], [1, 3]], [], [[1, 2, 3]], [1]):
        with pytest.raises(InvalidConfigError, match="bad catch-up gap"):
            SourceOffset.from_json({"t": {"0": 10}, "$catchUp": {"t": {"0": bad}}})


def test_a_restart_during_catch_up_queues_the_new_backlog_behind_the_open_gap():
    tp = ("t", 0)
    begin, latest, lso = {tp: 5000}, {tp: 9000}, {tp: 0}
    assert open_gaps(begin, {tp: 5900}, lso, {tp: [(200, 1000)]}, 1000) is None   # not far
    fresh_from, ranges = open_gaps(begin, latest, lso, {tp: [(200, 1000)]}, 1000)
    assert fresh_from == {tp: 9000} and ranges == {tp: [(200, 1000), (5000, 9000)]}
    # the fresh stream had not moved since the gap opened: one range
    _, ranges = open_gaps({tp: 1000}, latest, lso, {tp: [(200, 1000)]}, 1000)
    assert ranges == {tp: [(200, 9000)]}
    # the budget is taken from the ranges in order, across partitions by what each has left
    two = {tp: [(200, 1000), (5000, 9000)], ("t", 1): [(0, 1200)]}
    assert advance_gaps(two, 1000, {}) == {tp: [(5000, 9000)], ("t", 1): [(200, 1200)]}
    assert advance_gaps({tp: [(900, 1000), (5000, 5050)]}, 400, {}) == {tp: [(5050, 5050)]}
    assert advance_gaps({tp: [(5050, 5050)]}, 400, {}) == {}
    lost = []
    assert advance_gaps({tp: [(0, 100), (300, 400)]}, 10, {tp: 350},
                        lambda *a: lost.append(a)) == {tp: [(360, 400)]}
    assert lost == [(tp, 0, 99), (tp, 300, 349)]


def test_batch_ranges_of_a_gap_of_two_ranges_follow_from_the_two_offsets():
    tp = ("t", 0)
    early = {tp: 0}.get
    a = SourceOffset.of_ranges({tp: 9000}, {tp: [(900, 1000), (5000, 9000)]})
    b = SourceOffset.of_ranges({tp: 9003}, {tp: [(5300, 9000)]})
    # the rest of the first range and the start of the second, then the fresh records
    assert batch_ranges(a, b, early) == [(tp, 900, 1000, "gap"), (tp, 5000, 5300, "gap"),
                                         (tp, 9000, 9003, "fresh")]
    # a restart that opens a gap: what the fresh stream skipped is the gap's, not fresh
    c = SourceOffset({tp: 120}, {})
    d = SourceOffset.of_ranges({tp: 9000}, {tp: [(520, 9000)]})
    assert batch_ranges(c, d, early) == [(tp, 120, 520, "gap")]


# -- a restart with a 20,000-record backlog, driven as Spark drives the source ---------------

class Run:
    """The source driven in-process; ``sink`` is every row's value in the order a sink writing
    each batch in input-partition order writes them."""

    def __init__(self, root, **opts):
        self.root = root
        self.admin = Admin(str(root))
        self.opts = dict(subscribe="t", fastCatchUp="true", fastCatchUpThreshold=THRESHOLD,
                         fastCatchUpRecordsPerTrigger=BUDGET, **opts)
        self.sink = []
        self.rng = random.Random(333)

    def restart(self, checkpoint, batches, produce_during=()):
        """A new source process from ``checkpoint`` (what a crash leaves); runs ``batches``
        micro-batches (None: until nothing is new). ``produce_during``: batch numbers while
        which (after it was planned, before it is read) fresh records are produced. Returns
        the last end offset and, per batch, (rows, backlog rows, the fresh values it was owed,
        sink length when they were produced)."""
        r = reader(self.root, **self.opts)
        start, n, log = checkpoint, 0, []
        owed, owed_at = [], None
        while batches is None or n < batches:
            end = r.latestOffset(start, r.getDefaultReadLimit())
            if end == start:
                assert not owed, "fresh records were never read"
                break
            n += 1
            due, due_at = owed, owed_at        # produced before this batch was planned
            owed, owed_at = [], None
            if n in produce_during:            # ... while this one runs
                owed = [f"fresh-{self.rng.getrandbits(40):x}" for _ in
                        range(self.rng.choice([1, 3, 50]))]
                owed_at = len(self.sink)
                for v in owed:
                    produce(self.admin, [v], partition=self.rng.randrange(PARTITIONS))
            rows = [v.decode() for part in r.partitions(start, end) for batch in r.read(part)
                    for v in batch.column("value").to_pylist()]
            r.commit(end)
            log.append((rows, [v for v in rows if v.startswith("old-")], due, due_at))
            self.sink += rows
            start = end
        return start, log


@pytest.fixture
def topic(tmp_path):
    a = Admin(str(tmp_path))
    a.create_topic("t", num_partitions=PARTITIONS)
    produce(a, [f"seed-{i}" for i in range(40)])
    r = reader(tmp_path, subscribe="t", startingOffsets="earliest")
    start = r.initialOffset()
    end = r.latestOffset(start, r.getDefaultReadLimit())
    r.commit(end)
    return tmp_path, end                       # the checkpoint of a query that caught up


def backlog(admin, name, n):
    for i in range(0, n, 5000):
        produce(admin, [f"old-{name}-{j}" for j in range(i, min(n, i + 5000))])


def check_fair(run, log, gap_left_at_start):
    """Every batch read all the fresh records produced while the batch before it ran, with at
    most that one batch's backlog written before them; each batch moved the gap by the budget
    (or what was left of it)."""
    left = gap_left_at_start
    for i, (rows, old, due, due_at) in enumerate(log):
        assert len(old) == min(BUDGET, left), (i, len(old), left)
        left -= len(old)
        assert set(due) <= set(rows), f"batch {i} left fresh records behind"
        for v in due:
            ahead = [x for x in run.sink[due_at:run.sink.index(v)] if x.startswith("old-")]
            assert len(ahead) <= BUDGET, f"{len(ahead)} backlog records went before {v}"


@pytest.mark.parametrize("max_offsets", [BUDGET, None], ids=["maxOffsetsPerTrigger", "none"])
def test_fresh_records_during_catch_up_wait_for_at_most_one_batch(topic, max_offsets):
    root, checkpoint = topic
    opts = {} if max_offsets is None else {"maxOffsetsPerTrigger": max_offsets}
    run = Run(root, **opts)
    admin = run.admin
    # 1. a restart 20,000 records behind; fresh records while batches 3, 4, 7 and 9 run, and a
    # crash after batch 10
    backlog(admin, "a", 20_000)
    end, log = run.restart(checkpoint, 10, produce_during=(3, 4, 7, 9))
    check_fair(run, log, 20_000)
    assert SourceOffset.from_json(end).remaining_gap() == 20_000 - 10 * BUDGET
    # 2. the crash came during catch-up, and 4,000 more records came while it was down: the
    # restart reads fresh records at once again, the new backlog behind the open gap
    backlog(admin, "b", 4000)
    end, log = run.restart(end, 8, produce_during=(2, 5))
    check_fair(run, log, 16_000 + 4000)
    ranges = SourceOffset.from_json(end).gap_ranges()
    assert all(len(rs) == 2 for rs in ranges.values()), ranges
    # 3. and once more, then to the end: every record exactly once, the gap closed
    backlog(admin, "c", 4000)
    end, log = run.restart(end, None, produce_during=(1, 6, 30))
    check_fair(run, log, 16_800 + 4000)
    assert SourceOffset.from_json(end).gaps == {}
    source = [r.value.decode() for r in admin.consume("t")]
    assert sorted(run.sink) == sorted(v for v in source if not v.startswith("seed-"))


def test_a_restart_that_replays_batch_0_is_a_restart(topic):
    """Spark calls initialOffset in a restarted query too, when its batch 0 was planned but not
    committed (for that batch's start), then replays the batch and asks for the next from the
    batch's end: that first trigger is a restart's, and a backlog opens a gap."""
    root, end0 = topic                          # batch 0's end, its commit lost in the crash
    backlog(Admin(str(root)), "a", 5000)
    r = reader(root, subscribe="t", startingOffsets="earliest", fastCatchUp="true",
               fastCatchUpThreshold=THRESHOLD, fastCatchUpRecordsPerTrigger=BUDGET,
               maxOffsetsPerTrigger=BUDGET)
    initial = r.initialOffset()
    replayed = [v for part in r.partitions(initial, end0) for batch in r.read(part)
                for v in batch.column("value").to_pylist()]
    assert len(replayed) == 40
    end = r.latestOffset(end0, r.getDefaultReadLimit())
    assert SourceOffset.from_json(end).remaining_gap() == 5000 - BUDGET
    # a new query's first trigger starts from what initialOffset returned: no gap
    r = reader(root, subscribe="t", startingOffsets="earliest", fastCatchUp="true",
               fastCatchUpThreshold=THRESHOLD, fastCatchUpRecordsPerTrigger=BUDGET)
    assert SourceOffset.from_json(r.latestOffset(r.initialOffset(), None)).gaps == {}



# -- lost data: which kind, and a warning on the driver --------------------------------------

def _three_segments(root):
    a = Admin(str(root))
    a.create_topic("d", num_partitions=1)
    for i in range(3):                   # one segment per commit: [0, 10), [10, 20), [20, 30)
        a.produce("d", [(b"k", f"v{j}".encode()) for j in range(10 * i, 10 * i + 10)],
                  partition=0)
    (seg,) = root.glob("**/d-0/00000000000000000010.log")
    return a, seg


def _read_batch(r, start):
    end = r.latestOffset(start, r.getDefaultReadLimit())
    return [o for part in r.partitions(start, end) for b in r.read(part)
            for o in b.column("offset").to_pylist()]


def test_a_lost_committed_segment_is_named_as_such_with_the_repair_command(tmp_path, caplog):
    """A committed segment missing from storage is not retention's doing: the read fails with
    MissingCommittedDataError naming `repair ... --dry-run`; with failOnDataLoss=false the
    planner, on the driver, warns per lost range with the same command and reads the rest."""
    import logging
    from pyspark_kafkalog.errors import MissingCommittedDataError
    _, seg = _three_segments(tmp_path)
    seg.unlink()
    fix = f"kafkalog --cluster {tmp_path} repair --topic d --partition 0"
    r = reader(tmp_path, subscribe="d", startingOffsets="earliest")
    with pytest.raises(MissingCommittedDataError) as err:
        _read_batch(r, r.initialOffset())
    message = str(err.value)
    assert "d-0: offset 10 was deleted from storage" in message
    assert f"`{fix} --dry-run`" in message and "retention or delete-records ran" not in message
    assert "(the planned range: d-0 offsets 0 to 29)" in message
    r = reader(tmp_path, subscribe="d", startingOffsets="earliest", failOnDataLoss="false")
    with caplog.at_level(logging.WARNING, logger="pyspark_kafkalog"):
        offsets = _read_batch(r, r.initialOffset())
    assert offsets == list(range(10)) + list(range(20, 30))
    driver = [rec.getMessage() for rec in caplog.records
              if rec.name == "pyspark_kafkalog.spark.stream_reader"]
    assert len(driver) == 1, driver
    assert driver[0].startswith("d-0: offsets 10 to 19 are in no segment file")
    assert f"`{fix} --dry-run`" in driver[0] and "skipping them" in driver[0]


def test_data_deleted_by_retention_after_planning_is_not_called_lost_on_storage(tmp_path,
                                                                               caplog):
    import logging
    from pyspark_kafkalog.errors import MissingCommittedDataError, OffsetOutOfRangeError
    a, _ = _three_segments(tmp_path)
    r = reader(tmp_path, subscribe="d", startingOffsets="earliest")
    start = r.initialOffset()
    end = r.latestOffset(start, r.getDefaultReadLimit())
    (part,) = r.partitions(start, end)               # planned, then delete-records runs
    a.delete_records_before({("d", 0): 20})
    with pytest.raises(OffsetOutOfRangeError) as err:
        [b for b in r.read(part)]
    assert not isinstance(err.value, MissingCommittedDataError)
    assert "retention or delete-records ran: the log start offset is now 20" in str(err.value)
    lenient = reader(tmp_path, subscribe="d", failOnDataLoss="false")
    with caplog.at_level(logging.WARNING, logger="pyspark_kafkalog"):
        got = [o for b in lenient.read(part) for o in b.column("offset").to_pylist()]
    assert got == list(range(20, 30))
    assert "failOnDataLoss=false: skipping it" in caplog.text

# -- real streaming queries ------------------------------------------------------------------

E2E_BACKLOG = 4000
E2E_DEADLINE_S = 240


def _wait(what, predicate, deadline_s=E2E_DEADLINE_S):
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        got = predicate()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _values(admin, topic):
    return [r.value.decode() for r in admin.consume(topic)]


def test_a_restarted_query_writes_fresh_records_after_at_most_one_batch_of_backlog(ks, tmp_path):
    """kafkalog -> kafkalog over 4 partitions, restarted three times from its checkpoint with
    a backlog of 4,000 records each time, the first while caught up, the next two while still
    catching up (stopped mid-catch-up). Each time, once three batches of backlog reached the
    sink, one record is produced: in the output topic's order, at most one micro-batch of
    backlog (the one in flight then) comes between what the sink held when it was produced
    and it. The query writes each batch through one task (coalesce(1)) into one output
    partition, so the output topic's order is the batches' read order; the second restart
    runs without maxOffsetsPerTrigger. At the end every record is in the sink exactly once."""
    root = str(tmp_path / "cluster")
    admin = Admin(root)
    admin.create_topic("in", PARTITIONS)
    admin.create_topic("out", 1)
    admin.produce("in", [(f"k{i}".encode(), f"seed-{i}".encode()) for i in range(40)])
    checkpoint = str(tmp_path / "checkpoint")

    def start(**extra):
        r = ks.readStream.format("kafkalog")
        opts = {"subscribe": "in", "startingOffsets": "earliest", "fastCatchUp": "true",
                "fastCatchUpThreshold": THRESHOLD, "fastCatchUpRecordsPerTrigger": BUDGET,
                **extra}
        for k, v in opts.items():
            r = r.option(k, str(v))
        return (r.load(root).selectExpr("key", "value").coalesce(1)
                .writeStream.format("kafkalog").option("topic", "out")
                .option("checkpointLocation", checkpoint)
                .trigger(processingTime="0 seconds").start(root))

    def old_in_sink():
        return sum(1 for v in _values(admin, "out") if v.startswith("old-"))

    q = start(maxOffsetsPerTrigger=BUDGET)
    try:
        _wait("the seed records", lambda: len(_values(admin, "out")) >= 40)
    finally:
        q.stop()
    for cycle, max_offsets in enumerate([BUDGET, None, BUDGET]):
        for i in range(0, E2E_BACKLOG, 2000):
            admin.produce("in", [(f"o{j}".encode(), f"old-{cycle}-{j}".encode())
                                 for j in range(i, i + 2000)])
        before = old_in_sink()
        q = start(**({} if max_offsets is None else {"maxOffsetsPerTrigger": max_offsets}))
        try:
            _wait("three batches of backlog", lambda: old_in_sink() >= before + 3 * BUDGET)
            fresh = f"fresh-{cycle}"
            admin.produce("in", [(fresh.encode(), fresh.encode())])
            held = old_in_sink()          # what the sink held once the record existed
            out = _wait(fresh, lambda: (lambda vs: vs if fresh in vs else None)(
                _values(admin, "out")))
            if cycle == 2:
                q.processAllAvailable()
        finally:
            q.stop()
        at = out.index(fresh)
        ahead = sum(1 for v in out[:at] if v.startswith("old-")) - held
        assert ahead <= BUDGET, f"restart {cycle}: {ahead} backlog records went before {fresh}"
    last = json.loads([p for p in q.recentProgress if p["numInputRows"]][-1]["sources"][0]
                      ["endOffset"])
    assert last.get("$catchUpRecordsLeft", 0) == 0                  # caught up
    source = _values(admin, "in")
    sink = _values(admin, "out")
    assert sorted(sink) == sorted(source)             # each exactly once
    for cycle in range(3):                            # each was produced mid-catch-up
        at = sink.index(f"fresh-{cycle}")
        assert sum(1 for v in sink[at:] if v.startswith(f"old-{cycle}-")) > BUDGET

