"""The streaming planner's rules on their own (connector/stream_plan.py): offsets JSON, admission
control never above its limits, and batch ranges that follow from two offsets alone."""
from hypothesis import given, settings, strategies as st

from pyspark_kafkalog.connector.stream_plan import (Limits, SourceOffset, admit, batch_ranges,
                                                   limit_bytes, limit_rows)

TP = [("a", 0), ("a", 1), ("b", 0), ("b", 1), ("b", 2)]


def test_offsets_read_what_sparks_kafka_connector_writes():
    spark_json = {"events": {"0": 42, "1": 7}, "other": {"0": 0}}
    off = SourceOffset.from_json(spark_json)
    assert off.positions == {("events", 0): 42, ("events", 1): 7, ("other", 0): 0}
    assert off.gaps == {}
    assert off.to_json() == spark_json


def test_catch_up_gaps_round_trip_and_the_group_holds_the_gap_position():
    off = SourceOffset({("t", 0): 1500, ("t", 1): 30}, {("t", 0): (200, 1000)})
    j = off.to_json()
    assert j == {"t": {"0": 1500, "1": 30}, "$catchUp": {"t": {"0": [200, 1000]}},
                 "$catchUpRecordsLeft": 800}
    back = SourceOffset.from_json(j)
    assert back == off
    assert back.committed_positions() == {("t", 0): 200, ("t", 1): 30}
    assert back.remaining_gap() == 800


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 5000), min_size=5, max_size=5),
       st.lists(st.integers(0, 5000), min_size=5, max_size=5), st.integers(1, 3000))
def test_max_offsets_per_trigger_is_never_passed(starts, backlogs, limit):
    start = dict(zip(TP, starts))
    latest = {tp: start[tp] + b for tp, b in zip(TP, backlogs)}
    end = limit_rows(start, latest, limit)
    taken = sum(end[tp] - start[tp] for tp in TP)
    assert taken == min(limit, sum(backlogs))
    assert all(start[tp] <= end[tp] <= latest[tp] for tp in TP)


def test_many_small_partitions_do_not_blow_the_limit():
    """Spark's rateLimit rounds shares below one record up: 10,000 partitions with one record
    each and a limit of 10 would read 10,000. Ours reads 10."""
    tps = [("t", p) for p in range(10_000)]
    start = {tp: 0 for tp in tps}
    latest = {tp: 1 for tp in tps}
    end = limit_rows(start, latest, 10)
    assert sum(end.values()) == 10


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 2000), min_size=5, max_size=5),
       st.lists(st.floats(1, 5000), min_size=5, max_size=5), st.integers(1, 10_000_000))
def test_max_bytes_per_trigger_is_split_by_backlog_and_progresses(backlogs, sizes, budget):
    start = {tp: 0 for tp in TP}
    latest = {tp: b for tp, b in zip(TP, backlogs)}
    size = dict(zip(TP, sizes))
    end = limit_bytes(start, latest, budget, size.get)
    used = sum((end[tp] - start[tp]) * size[tp] for tp in TP)
    taken = sum(end[tp] - start[tp] for tp in TP)
    assert all(0 <= end[tp] <= latest[tp] for tp in TP)
    if sum(backlogs):
        assert taken >= 1                                   # always progresses
        assert used <= budget or taken == 1                 # one record may pass a tiny budget


def test_min_offsets_waits_until_max_trigger_delay():
    start = {("t", 0): 0}
    latest = {("t", 0): 5}
    limits = Limits(min_rows=10, max_trigger_delay_ms=60_000)
    assert admit(start, latest, limits, now_ms=10_000, last_trigger_ms=0) is None
    assert admit(start, latest, limits, now_ms=60_000, last_trigger_ms=0) == latest
    assert admit(start, {("t", 0): 10}, limits, now_ms=1, last_trigger_ms=0) == {("t", 0): 10}
    assert admit(start, latest, None, now_ms=0, last_trigger_ms=0) == latest


def test_batch_ranges_follow_from_the_two_offsets():
    earliest = {("t", 0): 0, ("t", 1): 3}.get
    # plain: fresh ranges, a new partition from its log start offset
    a = SourceOffset({("t", 0): 10}, {})
    b = SourceOffset({("t", 0): 20, ("t", 1): 8}, {})
    assert sorted(batch_ranges(a, b, earliest)) == [(("t", 0), 10, 20, "fresh"),
                                                     (("t", 1), 3, 8, "fresh")]
    # catch-up begins: the gap [10, 100) opens, fresh from 100 on
    c = SourceOffset({("t", 0): 120}, {("t", 0): (40, 100)})
    assert sorted(batch_ranges(a, c, earliest)) == [(("t", 0), 10, 40, "gap"),
                                                     (("t", 0), 100, 120, "fresh")]
    # the gap moves on, fresh too
    d = SourceOffset({("t", 0): 130}, {("t", 0): (100, 100)})
    assert sorted(batch_ranges(c, d, earliest)) == [(("t", 0), 40, 100, "gap"),
                                                     (("t", 0), 120, 130, "fresh")]
    # closed gap dropped: fresh only
    e = SourceOffset({("t", 0): 131}, {})
    assert batch_ranges(d, e, earliest) == [(("t", 0), 130, 131, "fresh")]
