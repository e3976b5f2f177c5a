"""KIP-227 incremental fetch sessions: the cache (FetchSessionCache), its request handling and
the client (FetchSessionClient), against a fake PositionSource and a fake clock. No Spark."""
from __future__ import annotations

import logging
import threading
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from pyspark_kafkalog.coordinator.fetch_session import (
    DEFAULT_CACHE_SLOTS, FINAL_EPOCH, INITIAL_EPOCH, INVALID_SESSION_ID, MAX_EPOCH,
    MIN_EVICTION_MS, FetchRequest, FetchSessionCache, FetchSessionClient, PartitionPosition,
    next_epoch)
from pyspark_kafkalog.errors import (FetchSessionIdNotFoundError, InvalidFetchSessionEpochError,
                                     error_for)

UNKNOWN = PartitionPosition(-1, -1, -1, error="UNKNOWN_TOPIC_OR_PARTITION")


class FakeClock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t

    def advance(self, seconds):
        self.t += seconds


class FakeSource:
    """Changes are staged and become visible at the next refresh, as a new version; the change
    log keeps only the last ``history`` versions, older asks get None."""

    def __init__(self, history=10 ** 9):
        self.lock = threading.Lock()
        self.truth = {}
        self.pending = {}
        self.version = 0
        self.log = []
        self.history = history
        self.asked = 0
        self.changed_asks = []

    def set(self, tp, pos):
        with self.lock:
            self.pending[tp] = pos

    def bump(self, tp, by=1):
        with self.lock:
            cur = self.pending.get(tp) or self.truth.get(tp) or PartitionPosition(0, 0, 0)
            self.pending[tp] = replace(cur, high_watermark=cur.high_watermark + by,
                                       last_stable_offset=cur.last_stable_offset + by)

    def true(self, tp):
        return self.truth.get(tp) or UNKNOWN

    def refresh(self):
        with self.lock:
            if self.pending:
                self.version += 1
                for tp, pos in self.pending.items():
                    self.truth[tp] = pos
                    self.log.append((self.version, tp))
                self.pending.clear()
            return self.version

    def positions(self, tps):
        tps = list(tps)
        with self.lock:
            self.asked += len(tps)
            return {tp: self.true(tp) for tp in tps}

    def changed_since(self, version):
        with self.lock:
            self.changed_asks.append(version)
            if version < self.version - self.history:
                return None
            return {tp for v, tp in self.log if v > version}


class Recorder:
    """A server that records what went over the wire."""

    def __init__(self, cache):
        self.cache = cache
        self.requests, self.responses = [], []

    def fetch(self, request, source):
        self.requests.append(request)
        resp = self.cache.fetch(request, source)
        self.responses.append(resp)
        return resp


def tps_of(topic, n):
    return [(topic, p) for p in range(n)]


def seeded(source, tps):
    for i, tp in enumerate(tps):
        source.set(tp, PartitionPosition(100 + i, 0, 100 + i, topic_id="id-" + tp[0]))
    source.refresh()


def open_session(cache, source, tps, privileged=False):
    resp = cache.fetch(FetchRequest(INVALID_SESSION_ID, INITIAL_EPOCH, dict.fromkeys(tps),
                                    privileged=privileged), source)
    assert resp.error is None and resp.full
    return resp.session_id


def use(cache, source, sid, epoch):
    """An empty incremental fetch: the session is used now."""
    resp = cache.fetch(FetchRequest(sid, epoch, {}), source)
    assert resp.error is None, resp
    return resp.next_epoch


# -- epochs ------------------------------------------------------------------------------------

def test_epochs_wrap_from_max_int_to_one_never_zero():
    assert next_epoch(INITIAL_EPOCH) == 1
    assert next_epoch(41) == 42
    assert next_epoch(MAX_EPOCH) == 1 and MAX_EPOCH == 2 ** 31 - 1
    assert next_epoch(FINAL_EPOCH) == FINAL_EPOCH


def test_session_epoch_wraps_across_max_int():
    cache, src = FetchSessionCache(clock=FakeClock()), FakeSource()
    tps = tps_of("t", 3)
    seeded(src, tps)
    client = FetchSessionClient(cache, src)
    client.fetch(tps)
    cache._sessions[client.session_id].epoch = MAX_EPOCH     # as if 2**31 requests had passed
    client.next_epoch = MAX_EPOCH
    src.bump(tps[0])
    assert client.fetch(tps) == {tp: src.true(tp) for tp in tps}
    assert client.next_epoch == 1 and client.fallbacks == 0
    assert client.fetch(tps)[tps[0]] == src.true(tps[0]) and client.next_epoch == 2


# -- full, then incremental ---------------------------------------------------------------------

def test_full_then_incremental_returns_only_changed_partitions_at_o_changed_cost():
    cache, src = FetchSessionCache(clock=FakeClock()), FakeSource()
    tps = tps_of("big", 1000)
    seeded(src, tps)
    server = Recorder(cache)
    client = FetchSessionClient(server, src)

    assert client.fetch(tps) == {tp: src.true(tp) for tp in tps}
    first = server.responses[-1]
    assert first.full and first.session_id != INVALID_SESSION_ID and first.next_epoch == 1
    assert len(first.positions) == 1000 and src.asked == 1000
    session_version = src.version

    changed = [tps[3], tps[500], tps[999]]
    src.bump(changed[0])
    src.set(changed[1], replace(src.true(changed[1]), log_start_offset=7))
    src.set(changed[2], replace(src.true(changed[2]), last_stable_offset=90))
    asked = src.asked
    got = client.fetch(tps)
    assert got == {tp: src.true(tp) for tp in tps}
    resp = server.responses[-1]
    assert not resp.full and resp.error is None
    assert set(resp.positions) == set(changed)
    assert src.asked - asked == 3                    # not 1000
    assert src.changed_asks[-1] == session_version
    assert server.requests[-1].to_add == {} and list(server.requests[-1].to_forget) == []

    asked = src.asked
    client.fetch(tps)                                # nothing changed: nothing sent, nothing read
    assert server.responses[-1].positions == {} and src.asked == asked
    assert client.full_fetches == 1 and client.incremental_fetches == 2


def test_incremental_reports_errors_and_new_topic_ids_and_tracks_added_and_forgotten():
    cache, src = FetchSessionCache(clock=FakeClock()), FakeSource()
    a, b = tps_of("a", 2), tps_of("b", 2)
    seeded(src, a + b)
    server = Recorder(cache)
    client = FetchSessionClient(server, src)
    client.fetch(a)

    src.set(a[0], UNKNOWN)                                         # topic deleted
    src.set(a[1], replace(src.true(a[1]), topic_id="id-a-new"))    # recreated: same offsets
    assert client.fetch(a + b) == {tp: src.true(tp) for tp in a + b}
    req, resp = server.requests[-1], server.responses[-1]
    assert set(req.to_add) == set(b) and not resp.full
    assert set(resp.positions) == set(a + b)
    assert resp.positions[a[0]].error == "UNKNOWN_TOPIC_OR_PARTITION"

    assert client.fetch(b) == {tp: src.true(tp) for tp in b}
    assert set(server.requests[-1].to_forget) == set(a)
    assert cache.num_incremental_fetch_partitions_cached == 2
    assert client.fetch([]) == {}                    # an emptied session is closed by the server
    assert cache.num_incremental_fetch_sessions == 0 and client.session_id == INVALID_SESSION_ID


def test_short_change_history_falls_back_to_comparing_the_whole_session():
    cache, src = FetchSessionCache(clock=FakeClock()), FakeSource(history=0)
    tps = tps_of("t", 50)
    seeded(src, tps)
    server = Recorder(cache)
    client = FetchSessionClient(server, src)
    client.fetch(tps)
    src.bump(tps[1])
    src.refresh()                                    # another version: the session's is too old
    src.bump(tps[2])
    asked = src.asked
    assert client.fetch(tps) == {tp: src.true(tp) for tp in tps}
    assert set(server.responses[-1].positions) == {tps[1], tps[2]}
    assert src.asked - asked == 50
    src.bump(tps[3])
    src.refresh()
    src.bump(tps[4])
    assert client.fetch(tps) == {tp: src.true(tp) for tp in tps}
    assert set(server.responses[-1].positions) == {tps[3], tps[4]}     # 1 and 2 are not news


# -- session errors and recovery ----------------------------------------------------------------

def test_unknown_session_is_error_70_and_the_client_recovers_with_a_full_fetch(caplog):
    cache, src = FetchSessionCache(clock=FakeClock()), FakeSource()
    tps = tps_of("t", 4)
    seeded(src, tps)
    resp = cache.fetch(FetchRequest(12345, 1, {}), src)
    assert (resp.error, resp.error_code) == ("FETCH_SESSION_ID_NOT_FOUND", 70)
    assert resp.session_id == INVALID_SESSION_ID and resp.positions == {}

    client = FetchSessionClient(cache, src)
    client.fetch(tps)
    old = client.session_id
    assert cache.remove(old)                         # gone, as if evicted
    src.bump(tps[2])
    with caplog.at_level(logging.INFO, logger="pyspark_kafkalog.coordinator.fetch_session"):
        assert client.fetch(tps) == {tp: src.true(tp) for tp in tps}
    assert "FETCH_SESSION_ID_NOT_FOUND" in caplog.text
    assert (client.full_fetches, client.incremental_fetches, client.fallbacks) == (2, 1, 1)
    assert client.session_id not in (old, INVALID_SESSION_ID)
    assert cache.num_incremental_fetch_sessions == 1


def test_wrong_epoch_is_error_71_keeps_the_session_and_the_client_recovers():
    cache, src = FetchSessionCache(clock=FakeClock()), FakeSource()
    tps = tps_of("t", 4)
    seeded(src, tps)
    sid = open_session(cache, src, tps)
    resp = cache.fetch(FetchRequest(sid, 5, {}), src)
    assert (resp.error, resp.error_code) == ("INVALID_FETCH_SESSION_EPOCH", 71)
    assert cache.num_incremental_fetch_sessions == 1
    assert use(cache, src, sid, 1) == 2              # the session is intact

    client = FetchSessionClient(cache, src)
    client.fetch(tps)
    old = client.session_id
    client.next_epoch += 1                           # a lost request: the epochs disagree
    src.bump(tps[0])
    assert client.fetch(tps) == {tp: src.true(tp) for tp in tps}
    assert client.fallbacks == 1 and client.full_fetches == 2
    # the full fetch closed the old session rather than leaving it to be evicted
    assert client.session_id != old and cache.num_incremental_fetch_sessions == 2
    assert cache.fetch(FetchRequest(old, 1, {}), src).error_code == 70


def test_a_request_overtaken_by_the_next_one_of_its_session_gets_71():
    cache, src = FetchSessionCache(clock=FakeClock()), FakeSource()
    tps = tps_of("t", 3)
    seeded(src, tps)
    sid = open_session(cache, src, tps)
    locked, overtaking = [], []

    class Overtaken:
        """While the request at epoch 1 reads the source, the one at epoch 2 comes and goes."""

        def refresh(self):
            locked.append(cache._lock.locked())      # the source is read without the lock
            if not locked[-1]:
                overtaking.append(cache.fetch(FetchRequest(sid, 2, {}), src))
            return src.refresh()

        def positions(self, tps):
            return src.positions(tps)

        def changed_since(self, version):
            return src.changed_since(version)

    resp = cache.fetch(FetchRequest(sid, 1, {}), Overtaken())
    assert locked == [False] and overtaking[0].error is None
    assert resp.error_code == 71
    assert use(cache, src, sid, 3) == 4


def test_errors_are_typed_and_found_by_name():
    for name, cls, code in (("FETCH_SESSION_ID_NOT_FOUND", FetchSessionIdNotFoundError, 70),
                            ("INVALID_FETCH_SESSION_EPOCH", InvalidFetchSessionEpochError, 71)):
        err = error_for(name, "x")
        assert type(err) is cls and err.error_code == code
        assert err.retriable and not err.user_error


def test_sessionless_and_closing_requests():
    cache, src = FetchSessionCache(clock=FakeClock()), FakeSource()
    tps = tps_of("t", 2)
    seeded(src, tps)
    resp = cache.fetch(FetchRequest(INVALID_SESSION_ID, FINAL_EPOCH, dict.fromkeys(tps)), src)
    assert resp.full and resp.session_id == INVALID_SESSION_ID and len(resp.positions) == 2
    assert cache.num_incremental_fetch_sessions == 0
    sid = open_session(cache, src, tps)
    resp = cache.fetch(FetchRequest(sid, FINAL_EPOCH, {}, full_partitions=tps[:1]), src)
    assert resp.session_id == INVALID_SESSION_ID and set(resp.positions) == {tps[0]}
    assert cache.num_incremental_fetch_sessions == 0
    with FetchSessionClient(cache, src) as client:
        client.fetch(tps)
        assert cache.num_incremental_fetch_sessions == 1
    assert cache.num_incremental_fetch_sessions == 0
    assert cache.incremental_fetch_session_evictions == 0     # closing is not evicting


# -- eviction -----------------------------------------------------------------------------------

def test_privileged_session_evicts_a_young_unprivileged_one_but_not_the_reverse():
    clock = FakeClock()
    cache, src = FetchSessionCache(max_slots=1, clock=clock), FakeSource()
    consumer = open_session(cache, src, tps_of("c", 5))
    clock.advance(1)
    follower = open_session(cache, src, tps_of("f", 1), privileged=True)
    assert follower != INVALID_SESSION_ID
    assert cache.fetch(FetchRequest(consumer, 1, {}), src).error_code == 70
    clock.advance(1)
    assert open_session(cache, src, tps_of("c", 50)) == INVALID_SESSION_ID
    assert open_session(cache, src, tps_of("f2", 50), privileged=True) == INVALID_SESSION_ID
    assert cache.incremental_fetch_session_evictions == 1


def test_a_session_inactive_past_the_minimum_eviction_time_is_evicted_by_anyone():
    clock = FakeClock()
    cache, src = FetchSessionCache(max_slots=1, clock=clock), FakeSource()
    follower = open_session(cache, src, tps_of("f", 9), privileged=True)
    clock.advance(MIN_EVICTION_MS / 1000)            # exactly the minimum: not yet
    assert open_session(cache, src, tps_of("c", 1)) == INVALID_SESSION_ID
    clock.advance(0.001)
    small = open_session(cache, src, tps_of("c", 1))
    assert small != INVALID_SESSION_ID
    assert cache.fetch(FetchRequest(follower, 1, {}), src).error_code == 70


def test_the_least_recently_used_session_is_the_stale_one_evicted():
    clock = FakeClock()
    cache, src = FetchSessionCache(max_slots=2, clock=clock), FakeSource()
    idle = open_session(cache, src, tps_of("i", 9), privileged=True)
    clock.advance(100)
    busy = open_session(cache, src, tps_of("b", 9), privileged=True)
    clock.advance(21)
    use(cache, src, busy, 1)
    assert open_session(cache, src, tps_of("c", 1)) != INVALID_SESSION_ID
    assert cache.fetch(FetchRequest(idle, 1, {}), src).error_code == 70
    assert cache.fetch(FetchRequest(busy, 2, {}), src).error is None


def test_a_bigger_session_evicts_a_smaller_one_only_once_it_is_older_than_the_minimum():
    clock = FakeClock()
    cache, src = FetchSessionCache(max_slots=1, clock=clock), FakeSource()
    old = open_session(cache, src, tps_of("o", 2))
    clock.advance(10)
    assert open_session(cache, src, tps_of("n", 5)) == INVALID_SESSION_ID    # too young
    clock.advance(100)
    epoch = use(cache, src, old, 1)                  # used at 110 s: still young when used
    clock.advance(90)                                # 200 s old, used 90 s ago
    # Kafka judges a session's age when it is used, so it is still not evictable by size
    assert open_session(cache, src, tps_of("n", 5)) == INVALID_SESSION_ID
    epoch = use(cache, src, old, epoch)              # used at 200 s: now older than 120 s
    clock.advance(10)
    assert open_session(cache, src, tps_of("n", 2)) == INVALID_SESSION_ID    # equal size: no
    assert open_session(cache, src, tps_of("n", 3), privileged=False) != INVALID_SESSION_ID
    assert cache.fetch(FetchRequest(old, epoch, {}), src).error_code == 70
    assert cache.incremental_fetch_session_evictions == 1


def test_privileged_sessions_yield_to_a_bigger_privileged_one_only_when_old():
    clock = FakeClock()
    cache, src = FetchSessionCache(max_slots=1, clock=clock), FakeSource()
    first = open_session(cache, src, tps_of("a", 2), privileged=True)
    assert open_session(cache, src, tps_of("b", 9), privileged=True) == INVALID_SESSION_ID
    clock.advance(121)
    use(cache, src, first, 1)
    assert open_session(cache, src, tps_of("c", 99)) == INVALID_SESSION_ID   # unprivileged
    assert open_session(cache, src, tps_of("b", 9), privileged=True) != INVALID_SESSION_ID


def test_full_cache_without_evictable_session_gives_no_session_and_correct_full_fetches():
    clock = FakeClock()
    cache, src = FetchSessionCache(max_slots=1, clock=clock), FakeSource()
    tps = tps_of("t", 6)
    seeded(src, tps)
    follower = FetchSessionClient(cache, src, privileged=True)
    follower.fetch(tps_of("f", 1))
    server = Recorder(cache)
    client = FetchSessionClient(server, src)
    for i in range(5):
        src.bump(tps[i])
        assert client.fetch(tps) == {tp: src.true(tp) for tp in tps}
        assert server.responses[-1].session_id == INVALID_SESSION_ID
        assert server.responses[-1].next_epoch == INITIAL_EPOCH     # ask again for a session
        assert server.responses[-1].full and server.requests[-1].epoch == INITIAL_EPOCH
        clock.advance(10)
        follower.fetch(tps_of("f", 1))               # keeps its slot in use
    assert (client.full_fetches, client.incremental_fetches, client.fallbacks) == (5, 0, 0)
    assert cache.incremental_fetch_session_evictions == 0


# -- metrics ------------------------------------------------------------------------------------

def test_metrics_count_sessions_partitions_and_evictions():
    clock = FakeClock()
    cache, src = FetchSessionCache(max_slots=2, clock=clock), FakeSource()
    assert cache.max_slots == 2 and FetchSessionCache().max_slots == DEFAULT_CACHE_SLOTS
    a = FetchSessionClient(cache, src)
    a.fetch(tps_of("a", 3))
    clock.advance(1)
    open_session(cache, src, tps_of("b", 2))
    assert cache.metrics() == {"NumIncrementalFetchSessions": 2,
                               "NumIncrementalFetchPartitionsCached": 5,
                               "IncrementalFetchSessionEvictionsPerSec": 0.0}
    clock.advance(1)
    open_session(cache, src, tps_of("c", 4), privileged=True)    # evicts b, the smaller one
    a.fetch(tps_of("a", 3))
    assert a.fallbacks == 0
    assert cache.num_incremental_fetch_sessions == 2
    assert cache.num_incremental_fetch_partitions_cached == 7
    assert cache.incremental_fetch_session_evictions == 1
    assert cache.evictions_per_sec() == pytest.approx(1 / 30)
    a.fetch(tps_of("a", 1))                          # forgetting two shrinks the count
    assert cache.num_incremental_fetch_partitions_cached == 5
    clock.advance(31)
    a.close()
    assert cache.metrics() == {"NumIncrementalFetchSessions": 1,
                               "NumIncrementalFetchPartitionsCached": 4,
                               "IncrementalFetchSessionEvictionsPerSec": 0.0}
    assert cache.incremental_fetch_session_evictions == 1


# -- many clients at once -----------------------------------------------------------------------

def test_concurrent_clients_each_see_their_own_true_positions():
    cache, src = FetchSessionCache(max_slots=4, clock=FakeClock()), FakeSource()
    failures = []

    def run(i):
        tps = tps_of(f"t{i}", 5)
        client = FetchSessionClient(cache, src)
        for step in range(60):
            src.bump(tps[step % 5])
            got = client.fetch(tps)
            want = {tp: src.true(tp) for tp in tps}
            if got != want:
                failures.append((i, step, got, want))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    assert cache.num_incremental_fetch_sessions == 4


# -- the property -------------------------------------------------------------------------------

UNIVERSE = [(t, p) for t in ("a", "b", "c") for p in range(3)]


class FaultyServer:
    """Injects one fault into the next request: lost before or after the server, a wrong epoch,
    an unknown session id."""

    def __init__(self, cache):
        self.cache = cache
        self.fault = None

    def fetch(self, request, source):
        fault, self.fault = self.fault, None
        if fault == "lost_request":
            raise ConnectionError("lost request")
        if fault == "bad_epoch" and not request.is_full:
            request = replace(request, epoch=next_epoch(request.epoch))
        if fault == "bad_id" and not request.is_full:
            request = replace(request, session_id=INVALID_SESSION_ID)
        resp = self.cache.fetch(request, source)
        if fault == "lost_response":
            raise ConnectionError("lost response")
        return resp


ops = st.one_of(
    st.tuples(st.just("bump"), st.sampled_from(UNIVERSE), st.integers(1, 3)),
    st.tuples(st.just("delete"), st.sampled_from("abc")),
    st.tuples(st.just("recreate"), st.sampled_from("abc")),
    st.tuples(st.just("want"), st.lists(st.sampled_from(UNIVERSE), max_size=9)),
    st.tuples(st.just("intruder"), st.booleans()),
    st.tuples(st.just("clock"), st.integers(0, 200)),
    st.tuples(st.just("fault"), st.sampled_from(
        ["lost_request", "lost_response", "bad_epoch", "bad_id"])),
    st.tuples(st.just("refresh")),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(ops, max_size=40), slots=st.integers(1, 2), history=st.integers(0, 3))
def test_client_always_returns_the_sources_true_positions(steps, slots, history):
    clock = FakeClock()
    cache, src = FetchSessionCache(max_slots=slots, clock=clock), FakeSource(history=history)
    seeded(src, UNIVERSE)
    server = FaultyServer(cache)
    client = FetchSessionClient(server, src)
    intruder = FetchSessionClient(cache, src, privileged=True)
    wanted = list(UNIVERSE[:4])
    generation = 0
    for op in steps:
        kind = op[0]
        if kind == "bump":
            src.bump(op[1], op[2])
        elif kind in ("delete", "recreate"):
            generation += 1
            for tp in UNIVERSE:
                if tp[0] == op[1]:
                    src.set(tp, UNKNOWN if kind == "delete" else
                            PartitionPosition(0, 0, 0, topic_id=f"{op[1]}-{generation}"))
        elif kind == "want":
            wanted = op[1]
        elif kind == "intruder":
            if op[1]:
                intruder.fetch(UNIVERSE[:1])         # privileged: takes an unprivileged slot
            else:
                intruder.close()
        elif kind == "clock":
            clock.advance(op[1])
        elif kind == "fault":
            server.fault = op[1]
        elif kind == "refresh":
            src.refresh()                            # someone else moved the source on
        try:
            got = client.fetch(wanted)
        except ConnectionError:                      # a full fetch is not retried for us
            got = client.fetch(wanted)
        assert got == {tp: src.true(tp) for tp in wanted}
        sessions = cache._sessions.values()
        assert cache.num_incremental_fetch_partitions_cached == sum(len(s.partitions)
                                                                    for s in sessions)
        assert cache.num_incremental_fetch_sessions <= slots


def test_the_client_says_what_changed_and_asking_again_costs_what_changed():
    """A streaming source asks for the same partitions at every trigger: the client answers
    with its own map and the partitions it learnt something new about."""
    cache = FetchSessionCache(clock=FakeClock())
    source = FakeSource()
    tps = tps_of("t", 500)
    seeded(source, tps)
    client = FetchSessionClient(cache, source)
    first = client.fetch(tps)
    assert client.changed == set(tps) and len(first) == 500
    source.bump(("t", 7))
    source.bump(("t", 9), by=3)
    source.asked = 0
    again = client.fetch(tps)
    assert client.changed == {("t", 7), ("t", 9)} and source.asked == 2
    assert again[("t", 9)].high_watermark == 100 + 9 + 3
    assert all(again[tp] == source.true(tp) for tp in tps)
    client.fetch(tps)
    assert client.changed == set()
    fewer = client.fetch(tps[:10])                       # a different set still works
    assert set(fewer) == set(tps[:10])
