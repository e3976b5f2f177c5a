"""Streaming queries share the coordinator's KIP-227 session cache (docs/protocol.md §11.4): with
more queries than cache slots, a newer query with more partitions evicts the session with the
fewest once it is older than the minimum eviction time, the evicted query goes on with
sessionless full fetches, every query still reads every record once, and the coordinator's
metrics count the sessions and the eviction. Each query's source lives in its own Python
process, so these are separate clients of the coordinator."""
from __future__ import annotations

import time

import pytest

from support.coordinator_support import (cluster, coordinators, eventually,  # noqa: F401
                                 token_file, url)
from pyspark_kafkalog.admin import Admin

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.slow]   # streaming queries against a coordinator (~9 s)

MIN_EVICTION_MS = 3000


@pytest.fixture
def coordinator_defaults() -> dict:
    return {"maintenance": False, "replication": False, "metrics_port": None,
            "max_incremental_fetch_session_cache_slots": 2,
            "fetch_session_min_eviction_ms": MIN_EVICTION_MS}


def test_more_streaming_queries_than_slots_evict_by_kip_227s_rules(
        ks, url, cluster, coordinators, token_file, tmp_path):  # noqa: F811
    c = coordinators(cluster)
    cache = c.fetch_sessions.cache
    admin = Admin(url, create=False)
    admin.create_topic("t", 3)
    for p in range(3):
        admin.produce("t", [(None, b"a%d" % p)] * 5, partition=p)

    def start(name: str, partitions):
        return (ks.readStream.format("kafkalog")
                .option("assign", '{"t": %s}' % list(partitions))
                .option("startingOffsets", "earliest")
                .option("coordinator.tokenFile", token_file).load(url)
                .selectExpr("partition").writeStream.format("memory").queryName(name)
                .option("checkpointLocation", str(tmp_path / name))
                .trigger(processingTime="300 milliseconds").start())

    queries = [start("one", [0]), start("two", [0, 1])]
    try:
        eventually(lambda: cache.num_incremental_fetch_sessions == 2,
                   "the first two queries hold sessions")
        time.sleep(MIN_EVICTION_MS / 1000 + 0.5)     # both older than the minimum, in use
        queries.append(start("three", [0, 1, 2]))
        eventually(lambda: cache.incremental_fetch_session_evictions >= 1,
                   "the query with three partitions evicts the one with one")
        for p in range(3):                            # all three go on reading
            admin.produce("t", [(None, b"b%d" % p)] * 5, partition=p)
        expected = {"one": 10, "two": 20, "three": 30}
        eventually(lambda: all(ks.sql(f"SELECT count(*) FROM {q}").collect()[0][0] == n
                               for q, n in expected.items()),
                   "every query reads every record once")
        # the evicted query (fewest partitions) gets no new session: two sessions, 2 + 3
        # partitions cached, one eviction, as Prometheus shows them
        reg = c.metrics.registry
        assert reg.get_sample_value("kafkalog_coordinator_incremental_fetch_sessions") == 2
        assert reg.get_sample_value(
            "kafkalog_coordinator_incremental_fetch_partitions_cached") == 5
        assert reg.get_sample_value(
            "kafkalog_coordinator_incremental_fetch_session_evictions_total") == 1
        assert cache.incremental_fetch_session_evictions == 1
    finally:
        for q in queries:
            q.stop()
    assert all(q.exception() is None for q in queries)
