"""KIP-227 fetch sessions served by the coordinator (issue #17): the ``Fetch`` RPC's JSON, one
session cache for every client of a cluster with KIP-227's slots, eviction rules and metrics
(a real in-process coordinator, real gRPC, clients with their own cluster objects as other
processes would have), the replicator's privileged session, clients that fall back to their
process's cache when no coordinator answers, and the token.

The minimum eviction time is shortened where a rule needs a session to be "old"; waits are
sleeps just past it, and everything else is asserted on what the cache and the clients say."""
from __future__ import annotations

import json
import logging
import pickle
import time

import grpc
import pytest

from support.coordinator_support import (  # noqa: F401 (fixtures)
    TOKEN, cluster, coordinators, coordinator_defaults, eventually, metrics_of, token_file, url)
from pyspark_kafkalog.admin import Admin
from pyspark_kafkalog.cluster.cluster import Cluster
from pyspark_kafkalog.coordinator.cluster_positions import ClusterPositions
from pyspark_kafkalog.coordinator.config import CoordinatorConfig, coordinator_options
from pyspark_kafkalog.coordinator.fetch_client import SessionServer
from pyspark_kafkalog.coordinator.fetch_session import (
    FINAL_EPOCH, INITIAL_EPOCH, INVALID_SESSION_ID, FetchRequest, FetchResponse,
    FetchSessionCache, FetchSessionClient, PartitionPosition)
from pyspark_kafkalog.coordinator.fetch_wire import (request_from_json, request_to_json,
                                                     response_from_json, response_to_json)
from pyspark_kafkalog.coordinator.follow import Follower
from pyspark_kafkalog.coordinator.rpc import CoordinatorClient, decode, encode, method_path
from pyspark_kafkalog.coordinator.service import Coordinator
from pyspark_kafkalog.errors import (CoordinatorAuthenticationError, InvalidConfigError,
                                     InvalidRequestError, NotControllerError,
                                     UnsupportedVersionError)
from pyspark_kafkalog.format.records import Record
from pyspark_kafkalog.spark.read_options import ReadOptions
from pyspark_kafkalog.spark.stream_reader import KafkaLogStreamReader

#: KIP-227's minimum eviction time, shortened: long enough that a few RPCs in a row are "young"
MIN_EVICTION_MS = 1000
PAST_MIN_S = MIN_EVICTION_MS / 1000 + 0.2


@pytest.fixture
def coordinator_defaults():
    return {"maintenance": False}


class Stop(Exception):
    pass


def produce(url, topic, partition, n=1):
    Admin(url).produce(topic, [Record(None, b"v%d" % i, 1) for i in range(n)],
                       partition=partition, acks="1")


def truth(url, tps):
    state = Cluster(url, create=False).state()
    return {tp: state.partition(*tp).high_watermark for tp in tps}


def hws(positions):
    return {tp: p.high_watermark for tp, p in positions.items()}


def remote_client(url, **server_options):
    """A session client as another process would have one: its own cluster object and view,
    its own process cache to fall back to."""
    c = Cluster(url, create=False)
    server = SessionServer(c, token=server_options.pop("token", TOKEN),
                           local=FetchSessionCache(), **server_options)
    return FetchSessionClient(server, ClusterPositions(c))


def fetch_metrics(c):
    m = metrics_of(c.metrics_url)
    return {k: m[(f"kafkalog_coordinator_{k}", frozenset())] for k in (
        "incremental_fetch_sessions", "incremental_fetch_partitions_cached",
        "incremental_fetch_session_evictions_total",
        "incremental_fetch_session_evictions_per_sec")}


# -- the messages --------------------------------------------------------------------------------

def test_fetch_requests_and_responses_round_trip_as_json():
    pos = PartitionPosition(42, 3, 40, topic_id="AAAAAAAAAAAAAAAAAAAAAA")
    gone = PartitionPosition(-1, -1, -1, error="UNKNOWN_TOPIC_OR_PARTITION")
    requests = [
        FetchRequest(0, INITIAL_EPOCH, {("t", 0): None, ("t", 1): pos},
                     full_partitions=(("t", 0), ("t", 1))),
        FetchRequest(123456789, 7, {("u", 3): gone}, (("t", 0), ("t", 1)), privileged=True),
        FetchRequest(5, FINAL_EPOCH, {}),
    ]
    for request in requests:
        wire = json.loads(json.dumps(request_to_json(request)))
        assert request_from_json(wire) == request
        back = request_from_json(wire)
        assert list(back.to_add) == list(request.to_add)        # order kept
    response = FetchResponse(None, 0, 99, 8, {("t", 0): pos, ("u", 3): gone}, full=False)
    wire = json.loads(json.dumps(response_to_json(response, metadata_seq=17)))
    assert wire["metadata_seq"] == 17 and wire["session_id"] == 99
    assert response_from_json(wire) == (response, 17)
    error = FetchResponse("FETCH_SESSION_ID_NOT_FOUND", 70, INVALID_SESSION_ID, INITIAL_EPOCH,
                          {}, full=False)
    assert response_from_json(json.loads(json.dumps(response_to_json(error)))) == (error, None)


@pytest.mark.parametrize("message,needle", [
    ([], "JSON object"),
    ({"epoch": 0}, "session_id"),
    ({"session_id": 0, "epoch": -2}, "epoch"),
    ({"session_id": True, "epoch": 0}, "session_id"),
    ({"session_id": 0, "epoch": 0, "to_add": [["t", 0]]}, "to_add"),
    ({"session_id": 0, "epoch": 0, "to_add": [["t", -1, None]]}, "partition"),
    ({"session_id": 0, "epoch": 0, "to_add": [["t", 0, {"high_watermark": "1"}]]},
     "high_watermark"),
    ({"session_id": 0, "epoch": 0, "to_forget": "t"}, "to_forget"),
    ({"session_id": 0, "epoch": 0, "privileged": "yes"}, "privileged"),
])
def test_a_malformed_fetch_request_is_refused_naming_the_field(message, needle):
    with pytest.raises(InvalidRequestError, match=needle):
        request_from_json(message)


def test_the_cache_slots_are_a_coordinator_setting(cluster):
    assert coordinator_options({"max.incremental.fetch.session.cache.slots": "2"}) == {
        "max_incremental_fetch_session_cache_slots": 2}
    c = Coordinator(cluster, CoordinatorConfig.of(max_incremental_fetch_session_cache_slots=7,
                                                  fetch_session_min_eviction_ms=5), token=TOKEN)
    assert (c.fetch_sessions.cache.max_slots, c.fetch_sessions.cache.min_eviction_ms) == (7, 5)
    assert Coordinator(cluster, token=TOKEN).fetch_sessions.cache.max_slots == 1000
    with pytest.raises(InvalidConfigError, match="max.incremental.fetch.session.cache.slots"):
        Coordinator(cluster, CoordinatorConfig.of(max_incremental_fetch_session_cache_slots=-1),
                    token=TOKEN)


# -- one cache for every client: KIP-227's rules -------------------------------------------------

@pytest.mark.slow
def test_more_clients_than_slots_evict_by_kip_227s_rules_and_the_metrics_count_it(
        url, cluster, coordinators):
    Admin(url).create_topic("t", 4)
    for p in range(4):
        produce(url, "t", p, 2)
    tps = [("t", p) for p in range(4)]
    c = coordinators(cluster, max_incremental_fetch_session_cache_slots=2,
                     fetch_session_min_eviction_ms=MIN_EVICTION_MS)
    cache = c.fetch_sessions.cache
    small, big = remote_client(url), remote_client(url)
    assert hws(small.fetch(tps[:1])) == truth(url, tps[:1])
    assert hws(big.fetch(tps[:2])) == truth(url, tps[:2])
    assert small.session_id and big.session_id
    assert small._server.remote_fetches == 1 and small._server.local_fetches == 0

    # the cache is full of young sessions: a newcomer gets no session, but a complete answer
    third = remote_client(url)
    assert hws(third.fetch(tps[:1])) == truth(url, tps[:1])
    assert third.session_id == INVALID_SESSION_ID
    assert cache.incremental_fetch_session_evictions == 0

    # both older than the minimum, both in use: one with more partitions evicts the one with
    # the fewest
    time.sleep(PAST_MIN_S)
    small.fetch(tps[:1])
    big.fetch(tps[:2])
    bigger = remote_client(url)
    bigger.fetch(tps[:3])
    assert bigger.session_id != INVALID_SESSION_ID
    assert cache.incremental_fetch_session_evictions == 1
    assert big.incremental_fetches == 1 and big.fallbacks == 0

    # the evicted one recovers with a full fetch; with fewer partitions than any session left
    # it gets none, and its answers stay true
    produce(url, "t", 0)
    assert hws(small.fetch(tps[:1])) == truth(url, tps[:1])
    assert small.fallbacks == 1 and small.session_id == INVALID_SESSION_ID
    assert big.fetch(tps[:2]) and big.fallbacks == 0 and big.session_id != INVALID_SESSION_ID

    # an inactive session goes first, whoever asks: `big` idles past the minimum while
    # `bigger` keeps fetching, and a one-partition newcomer evicts `big` (two partitions)
    time.sleep(PAST_MIN_S)
    bigger.fetch(tps[:3])
    tiny = remote_client(url)
    tiny.fetch(tps[3:])
    assert tiny.session_id != INVALID_SESSION_ID
    assert cache.incremental_fetch_session_evictions == 2
    assert hws(big.fetch(tps[:2])) == truth(url, tps[:2])
    assert big.fallbacks == 1 and big.session_id == INVALID_SESSION_ID     # no room again

    m = fetch_metrics(c)
    assert m == {"incremental_fetch_sessions": 2,                        # bigger, tiny
                 "incremental_fetch_partitions_cached": 3 + 1,
                 "incremental_fetch_session_evictions_total": 2,
                 "incremental_fetch_session_evictions_per_sec": pytest.approx(2 / 30)}
    with CoordinatorClient(c.address, TOKEN) as client:
        status = client.status()
    assert status["fetch_session_cache_slots"] == 2
    assert status["metrics"]["incremental_fetch_sessions"] == 2
    assert status["metrics"]["incremental_fetch_session_evictions"] == 2

    # a client that closes its session gives the slot back; that is not an eviction
    tiny.close()
    assert fetch_metrics(c)["incremental_fetch_sessions"] == 1
    assert cache.incremental_fetch_session_evictions == 2


@pytest.mark.slow
def test_an_evicted_client_recovers_with_a_full_fetch_and_keeps_true_positions(
        url, cluster, coordinators, caplog):
    caplog.set_level(logging.INFO, logger="pyspark_kafkalog.coordinator.fetch_session")
    Admin(url).create_topic("t", 2)
    produce(url, "t", 0, 3)
    tps = [("t", 0), ("t", 1)]
    c = coordinators(cluster, max_incremental_fetch_session_cache_slots=1,
                     fetch_session_min_eviction_ms=MIN_EVICTION_MS)
    a = remote_client(url)
    assert hws(a.fetch(tps[:1])) == {("t", 0): 3}
    produce(url, "t", 0, 2)
    assert hws(a.fetch(tps[:1])) == {("t", 0): 5} and a.changed == {("t", 0)}
    assert a.incremental_fetches == 1 and a.session_id != INVALID_SESSION_ID

    time.sleep(PAST_MIN_S)
    b = remote_client(url)
    b.fetch(tps)                                   # takes the only slot
    assert c.fetch_sessions.cache.incremental_fetch_session_evictions == 1
    produce(url, "t", 0, 4)
    assert hws(a.fetch(tps[:1])) == {("t", 0): 9}
    assert a.fallbacks == 1 and a.full_fetches == 2
    assert any("FETCH_SESSION_ID_NOT_FOUND" in r.getMessage() for r in caplog.records)
    # its own view caught up with the coordinator's answer: it can read what it was told of
    assert a._source.state.partition("t", 0).high_watermark == 9
    for n in (1, 5):                               # sessionless from now on, still true
        produce(url, "t", 0, n)
        assert hws(a.fetch(tps[:1])) == truth(url, tps[:1])
    assert a.session_id == INVALID_SESSION_ID and b.session_id != INVALID_SESSION_ID


def test_the_clients_view_catches_up_with_the_coordinators_answer(url, cluster, coordinators):
    Admin(url).create_topic("t")
    c = coordinators(cluster)
    client = remote_client(url)
    source = client._source
    client.fetch([("t", 0)])
    source.prefetch()                        # this process's view, before another one writes
    produce(url, "t", 0, 3)
    assert hws(client.fetch([("t", 0)])) == {("t", 0): 3}     # the coordinator's view
    assert source.state.partition("t", 0).high_watermark == 3
    source.prefetch()
    assert hws(client.fetch([("t", 0)])) == {("t", 0): 3} and client.changed == set()
    produce(url, "t", 0, 2)
    source.prefetch()               # each fetch, idle ones too, ended its prefetch: this polls
    assert source.state.partition("t", 0).high_watermark == 5
    assert hws(client.fetch([("t", 0)])) == {("t", 0): 5}
    assert client._server.remote_fetches == 4 and client.incremental_fetches == 3
    assert c.fetch_sessions.cache.metrics()["NumIncrementalFetchSessions"] == 1


def test_the_replicators_privileged_session_evicts_a_consumers_and_is_never_evicted_by_one(
        url, cluster, coordinators, tmp_path):
    admin = Admin(url)
    admin.add_log_dir(str(tmp_path / "second"))
    admin.create_topic("c", 3)
    c = coordinators(cluster, max_incremental_fetch_session_cache_slots=2,
                     replica_fetch_wait_max_ms=20)            # the default minimum: 120 s
    replica = c.replicator.fetch_session
    a, b = remote_client(url), remote_client(url)
    a.fetch([("c", 0)])
    b.fetch([("c", 0), ("c", 1)])
    assert a.session_id and b.session_id and replica.session_id == INVALID_SESSION_ID

    admin.create_topic("r", 1, 2)
    eventually(lambda: replica.session_id != INVALID_SESSION_ID,
               "the replicator holds a fetch session")
    assert replica.privileged
    cache = c.fetch_sessions.cache
    assert cache.incremental_fetch_session_evictions == 1
    # the consumer with the fewest partitions made room, although its session was young
    produce(url, "c", 0)
    assert hws(a.fetch([("c", 0)])) == truth(url, [("c", 0)])
    assert a.fallbacks == 1 and a.session_id == INVALID_SESSION_ID
    b.fetch([("c", 0), ("c", 1)])
    assert b.fallbacks == 0 and b.incremental_fetches == 1

    # however many partitions a consumer asks for, it cannot displace the replicator
    d = remote_client(url)
    d.fetch([("c", 0), ("c", 1), ("c", 2), ("r", 0)])
    assert d.session_id == INVALID_SESSION_ID
    assert cache.incremental_fetch_session_evictions == 1
    used = replica.incremental_fetches
    eventually(lambda: replica.incremental_fetches > used, "the replicator uses its session")
    assert replica.fallbacks == 0 and replica.full_fetches == 1
    assert fetch_metrics(c)["incremental_fetch_sessions"] == 2
    assert fetch_metrics(c)["incremental_fetch_partitions_cached"] == 2 + 1


# -- the RPC's guard -----------------------------------------------------------------------------

def test_fetch_needs_the_token_the_active_coordinator_and_no_claim_of_privilege(
        url, cluster, coordinators):
    c = coordinators(cluster)
    standby = coordinators(Cluster(url, create=False))
    assert c.active and not standby.active
    request = request_to_json(FetchRequest(0, INITIAL_EPOCH, {("t", 0): None}))
    channel = grpc.insecure_channel(c.address)
    fetch = channel.unary_unary(method_path("Fetch"), request_serializer=encode,
                                response_deserializer=decode)
    with pytest.raises(grpc.RpcError) as refused:
        fetch(request, timeout=30)
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    channel.close()
    with pytest.raises(CoordinatorAuthenticationError):
        CoordinatorClient(c.address, "f" * 64).call("Fetch", request)
    with CoordinatorClient(c.address, TOKEN) as client:
        with pytest.raises(InvalidRequestError, match="privileged"):
            client.call("Fetch", {**request, "privileged": True})
        with pytest.raises(InvalidRequestError, match="epoch"):
            client.call("Fetch", {**request, "epoch": "0"})
    with CoordinatorClient(standby.address, TOKEN) as client:
        with pytest.raises(NotControllerError):
            client.call("Fetch", request)
        with pytest.raises(UnsupportedVersionError, match="does not serve NoSuchMethod"):
            client.call("NoSuchMethod", {})
    assert c.fetch_sessions.cache.metrics()["NumIncrementalFetchSessions"] == 0
    assert c.metrics.summary()["rpc_authentication_failures"] == 2
    with CoordinatorClient(c.address, TOKEN) as client:      # and with all of it, it serves
        reply = client.call("Fetch", request)
    assert reply["session_id"] != INVALID_SESSION_ID and reply["positions"] == [
        ["t", 0, {"high_watermark": -1, "log_start_offset": -1, "last_stable_offset": -1,
                  "error": "UNKNOWN_TOPIC_OR_PARTITION", "topic_id": None}]]


def test_a_refused_token_falls_back_to_the_local_cache_and_is_not_retried_every_call(
        url, cluster, coordinators, caplog):
    Admin(url).create_topic("t")
    c = coordinators(cluster)
    caplog.set_level(logging.WARNING, logger="pyspark_kafkalog.coordinator.fetch_client")
    client = remote_client(url, token="y" * 32, rediscover_s=60)
    for n in range(4):
        produce(url, "t", 0)
        assert hws(client.fetch([("t", 0)])) == {("t", 0): n + 1}
    # looked for once (its Ping refused), then not before rediscover_s
    assert c.metrics.summary()["rpc_authentication_failures"] == 1
    assert client._server.local_fetches == 4 and client._server.remote_fetches == 0
    assert client.incremental_fetches == 3 and client.fallbacks == 0    # a local session
    assert any("refused the token" in r.getMessage() for r in caplog.records)


def test_a_coordinator_without_fetch_leaves_the_session_local(url, cluster, coordinators):
    Admin(url).create_topic("t")
    c = coordinators(cluster)
    del c._rpc.methods["Fetch"]                   # as an older coordinator serves
    client = remote_client(url)
    produce(url, "t", 0, 2)
    assert hws(client.fetch([("t", 0)])) == {("t", 0): 2}
    assert client._server.remote_fetches == 0 and client._server.local_fetches == 1
    assert client._server.address is None


# -- real clients: consume --follow's Follower, the streaming source -----------------------------

def follow(url, token_file, steps, **options):
    """A Follower of topic t (partitions 0, 1); ``steps(follower, values)`` is called whenever
    it caught up, until it raises Stop; the values it handed out."""
    got = []
    deadline = time.monotonic() + 60           # for a hang only: each step takes a poll or two

    def caught_up():
        assert time.monotonic() < deadline, f"the follower is stuck after {got}"
        steps(f, got)
    f = Follower(Cluster(url, create=False), "t", [0, 1], poll_interval_ms=10,
                 coordinator_token_file=token_file, wrap=lambda p, r: r.value,
                 on_caught_up=caught_up, **options)
    with pytest.raises(Stop):
        for value in f:
            got.append(value)
    return f, got


def test_a_follower_is_served_by_the_coordinator_and_keeps_following_after_it_stops(
        url, cluster, coordinators, token_file):
    Admin(url).create_topic("t", 2)
    produce(url, "t", 0)
    c = coordinators(cluster)
    seen = {}

    def steps(f, got):
        if got == [b"v0"] and "remote" not in seen:
            seen["remote"] = (f._server.address, f._server.remote_fetches,
                              fetch_metrics(c)["incremental_fetch_sessions"])
            produce(url, "t", 1)
        elif len(got) == 2 and "stopped" not in seen:
            c.stop()                                # lease released, RPC closed
            seen["stopped"] = f._server.remote_fetches
            produce(url, "t", 0, 2)
        elif len(got) == 4:
            raise Stop
    f, got = follow(url, token_file, steps)
    assert got == [b"v0", b"v0", b"v0", b"v1"]
    address, remote, sessions = seen["remote"]
    assert address == c.address and remote >= 1 and sessions == 1
    assert f._server.remote_fetches == seen["stopped"]   # nothing remote after the stop
    assert f._server.local_fetches >= 1 and f._server.address is None


def test_a_follower_without_an_active_coordinator_uses_its_process_cache(url, token_file):
    Admin(url).create_topic("t", 2)
    produce(url, "t", 1, 2)

    def steps(f, got):
        if len(got) == 2 and f.polls == 1:
            produce(url, "t", 0)
        elif len(got) == 3:
            raise Stop
    f, got = follow(url, token_file, steps)
    assert sorted(got) == [b"v0", b"v0", b"v1"]
    assert f._server.remote_fetches == 0 and f._server.local_fetches >= 2


def test_a_streaming_source_shares_the_coordinators_cache_pickles_and_falls_back(
        url, cluster, coordinators, monkeypatch):
    monkeypatch.setenv("KAFKALOG_COORDINATOR_TOKEN", TOKEN)
    Admin(url).create_topic("t", 2)
    produce(url, "t", 0, 3)
    c = coordinators(cluster)
    options = ReadOptions.parse({"path": url, "subscribe": "t",
                                 "startingOffsets": "earliest"}, streaming=True)
    r = KafkaLogStreamReader(options, None)
    start = r.initialOffset()
    end = r.latestOffset(start, r.getDefaultReadLimit())
    assert end == {"t": {"0": 3, "1": 0}}
    assert r._session_server.address == c.address and r._session_server.remote_fetches >= 1
    assert c.fetch_sessions.cache.metrics()["NumIncrementalFetchSessions"] == 1
    copy = pickle.loads(pickle.dumps(r))          # what executors get: the options only
    assert copy._session is None and copy._session_server is None
    assert copy.options.subscription == r.options.subscription

    c.stop()
    produce(url, "t", 1, 2)
    end2 = r.latestOffset(end, r.getDefaultReadLimit())
    assert end2 == {"t": {"0": 3, "1": 2}}
    assert r._session_server.local_fetches >= 1 and r._session_server.address is None
    rows = [row for part in r.partitions(end, end2) for row in r.read(part)]
    assert sum(batch.num_rows for batch in rows) == 2
    r.stop()
