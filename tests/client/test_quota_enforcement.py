"""KIP-13 enforcement by the package's own clients (docs/protocol.md §12): the admin API and
the CLI report their bytes to the active coordinator and wait what it answers. A producer's
data is written and committed first, its acknowledgement delayed; a consumer waits after a
fetch, before it hands the records out. Nothing is refused; a client without a quota never
waits; a changed quota counts within one window; without a coordinator a client id with a
quota says so once, at WARN. The Spark tasks' side is tests/spark/test_quota_spark.py."""
from __future__ import annotations

import base64
import json
import logging
import os
import subprocess
import threading
import time

import pytest

from support.coordinator_support import CLI, TOKEN, cluster, coordinators, url  # noqa: F401  (fixtures)
from pyspark_kafkalog.admin import Admin
from pyspark_kafkalog.coordinator import quota_client
from pyspark_kafkalog.coordinator.quota_client import QuotaClient, ThrottleStats
from pyspark_kafkalog.errors import InvalidConfigError

VALUE = b"v" * 10_000


pytestmark = pytest.mark.slow   # clients slowed to their quotas in real time (~20 s)


@pytest.fixture
def coordinator_defaults() -> dict:
    return {"maintenance": False, "replication": False, "metrics_port": None,
            "quota_window_num": 2, "quota_window_size_s": 1}


@pytest.fixture(autouse=True)
def token(monkeypatch):
    monkeypatch.setenv("KAFKALOG_COORDINATOR_TOKEN", TOKEN)
    yield
    quota_client.CONNECTIONS.clear()


def _produce_for(admin: Admin, topic: str, seconds: float) -> tuple:
    """(log bytes acknowledged, seconds taken) producing 10 kB records until ``seconds``."""
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        admin.produce(topic, [(None, VALUE)] * 5)
    return admin.quota.stats["produce"].bytes, time.monotonic() - start


def test_a_producer_over_its_quota_is_slowed_to_it_and_another_is_not(url, cluster,
                                                                      coordinators):  # noqa: F811
    c = coordinators(cluster)
    setup = Admin(url, create=False)
    setup.create_topic("t", 2)
    quota = 200_000.0
    setup.alter_client_quotas("slow", {"producer_byte_rate": quota})
    slow = Admin(url, create=False, client_id="slow")
    fast = Admin(url, create=False, client_id="fast")
    nbytes, took = _produce_for(slow, "t", 6.0)
    # one window (1 s) of burst over 6 s at most; the rate the coordinator allows, not less
    assert quota * 0.9 <= nbytes / took <= quota * (1 + 1.0 / 6) * 1.1
    stats = slow.throttle_stats()
    assert stats["client_id"] == "slow"
    assert 0 < stats["produce-throttle-time-avg"] < stats["produce-throttle-time-max"]
    fast_bytes, fast_took = _produce_for(fast, "t", 1.0)
    assert fast.throttle_stats()["produce-throttle-time-max"] == 0
    assert fast_bytes / fast_took > 2 * quota
    # everything acknowledged is there: slowed, never refused
    total = sum(o.offset for o in setup.list_offsets(
        {(t, p): "latest" for t, p in [("t", 0), ("t", 1)]}).values())
    assert total == (slow.quota.stats["produce"].requests
                     + fast.quota.stats["produce"].requests) * 5
    reg = c.metrics.registry
    assert reg.get_sample_value("kafkalog_coordinator_client_throttle_seconds_total",
                                {"client_id": "slow", "kind": "produce"}) > 3.0
    assert reg.get_sample_value("kafkalog_coordinator_client_throttle_seconds_total",
                                {"client_id": "fast", "kind": "produce"}) is None
    usage = slow.quota.usage()
    assert usage["produce"]["quota"] == quota and usage["produce"]["requests"] > 10
    # Kafka's per-client byte-rate and throttle-time, as gauges
    rate = reg.get_sample_value("kafkalog_coordinator_client_byte_rate",
                                {"client_id": "slow", "kind": "produce"})
    assert 0 < rate <= quota * 2
    top = reg.get_sample_value("kafkalog_coordinator_client_throttle_time_max_ms",
                               {"client_id": "slow", "kind": "produce"})
    avg = reg.get_sample_value("kafkalog_coordinator_client_throttle_time_avg_ms",
                               {"client_id": "slow", "kind": "produce"})
    assert 0 < avg < top == pytest.approx(stats["produce-throttle-time-max"], abs=5)
    assert reg.get_sample_value("kafkalog_coordinator_client_throttle_time_max_ms",
                                {"client_id": "fast", "kind": "produce"}) == 0
    assert c.metrics.summary()["client_byte_rate"]["slow"]["produce"] > 0


def test_a_consumer_waits_before_it_reads_and_a_quota_change_counts_within_a_window(
        url, cluster, coordinators):  # noqa: F811
    coordinators(cluster)
    setup = Admin(url, create=False)
    setup.create_topic("t", 1)
    for _ in range(40):
        setup.produce("t", [(None, VALUE)] * 10)          # about 4 MB
    setup.alter_client_quotas("reader", {"consumer_byte_rate": 1_000_000})
    time.sleep(1.1)                 # the producer's requests had the coordinator read quotas
    reader = Admin(url, create=False, client_id="reader")
    start = time.monotonic()
    n = sum(1 for _ in reader.consume("t"))
    took = time.monotonic() - start
    assert n == 400
    assert took >= 2.5          # ~4 MB at 1 MB/s, less the 1 s window's burst
    fetched = reader.quota.stats["fetch"]
    assert fetched.throttled and fetched.bytes >= 4_000_000
    # raised at run time: the next window's reads run free
    setup.alter_client_quotas("reader", {"consumer_byte_rate": 10**9})
    time.sleep(1.2)
    before = reader.quota.stats["fetch"].total_ms
    start = time.monotonic()
    assert sum(1 for _ in reader.consume("t")) == 400
    assert time.monotonic() - start < 2.0
    assert reader.quota.stats["fetch"].total_ms == before


def test_without_a_coordinator_a_quota_is_named_once_at_warn(url, caplog):  # noqa: F811
    setup = Admin(url, create=False)
    setup.create_topic("t", 1)
    setup.alter_client_quotas("etl", {"producer_byte_rate": 1000})
    etl = Admin(url, create=False, client_id="etl")
    free = Admin(url, create=False, client_id="free")
    with caplog.at_level(logging.WARNING, logger=quota_client.__name__):
        for _ in range(3):
            etl.produce("t", [(None, VALUE)])            # 10 kB at 1 kB/s: not throttled
            free.produce("t", [(None, VALUE)])
    warnings = [r.getMessage() for r in caplog.records if r.name == quota_client.__name__]
    assert len(warnings) == 1
    assert "'etl'" in warnings[0] and "not enforced" in warnings[0]
    assert "no coordinator" in warnings[0]
    assert etl.throttle_stats() == {"client_id": "etl"}


def test_the_cli_takes_a_client_id_and_reports_throttle_time(url, cluster,
                                                             coordinators):  # noqa: F811
    coordinators(cluster)
    setup = Admin(url, create=False)
    setup.create_topic("t", 1)
    setup.alter_client_quotas("cli", {"producer_byte_rate": 40_000,
                                      "consumer_byte_rate": 40_000})
    value = base64.b64encode(b"x" * 30_000).decode()
    lines = "".join(json.dumps({"value": value}) + "\n" for _ in range(8))      # 240 kB
    env = {**os.environ, "KAFKALOG_COORDINATOR_TOKEN": TOKEN}
    start = time.monotonic()
    out = subprocess.run([*CLI, "--cluster", url, "produce", "--topic", "t", "--client-id",
                          "cli", "--verbose"], input=lines, capture_output=True, text=True,
                         env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    # ~240 kB at 40 kB/s, less the 1 s burst, is 5 s; but the one request (a produce commits
    # as one unit) waits at most the whole quota window, 2 x 1 s (boundedThrottleTime)
    assert time.monotonic() - start > 2
    report = json.loads(out.stderr.strip().splitlines()[-1].split("kafkalog: ", 1)[1])
    assert report["client_id"] == "cli" and report["produce-throttle-time-max"] == 2000
    assert len(out.stdout.splitlines()) == 1 + 8          # the header, then the acks
    out = subprocess.run([*CLI, "--cluster", url, "consume", "--topic", "t", "--client-id",
                          "cli", "--verbose"], capture_output=True, text=True, env=env,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert len(out.stdout.splitlines()) == 8
    report = json.loads(out.stderr.strip().splitlines()[-1].split("kafkalog: ", 1)[1])
    assert report["fetch-throttle-time-max"] > 0
    bad = subprocess.run([*CLI, "--cluster", url, "consume", "--topic", "t", "--client-id",
                          "x" * 256], capture_output=True, text=True, env=env, timeout=120)
    assert bad.returncode != 0 and "at most 255" in bad.stderr


def test_a_bad_client_id_is_a_typed_error(url):  # noqa: F811
    with pytest.raises(InvalidConfigError, match="at most 255"):
        Admin(url, create=False, client_id="x" * 256)


def test_throttle_stats_follow_kafkas_client_metrics():
    s = ThrottleStats()
    for ms in (0, 0, 30, 90):
        s.record(ms, 100)
    assert s.metrics("fetch") == {"fetch-throttle-time-max": 90, "fetch-throttle-time-avg": 30.0}
    other = ThrottleStats.from_json(s.to_json())
    other.merge(s)
    assert (other.requests, other.throttled, other.bytes, other.max_ms) == (8, 4, 800, 90)


def test_a_coordinator_that_stops_leaves_clients_unthrottled(url, cluster,
                                                             coordinators):  # noqa: F811
    c = coordinators(cluster)
    setup = Admin(url, create=False)
    setup.create_topic("t", 1)
    setup.alter_client_quotas("q", {"producer_byte_rate": 1000})
    q = QuotaClient(cluster, "q", sleep=lambda s: None)
    assert q.produced(5000) > 0
    c.stop()
    assert q.produced(5000) == 0          # not failed: unthrottled, and said once at WARN
    assert q.stats["produce"].requests == 1


def test_a_planner_hands_its_tasks_the_coordinator_and_warns_without_one(
        url, cluster, coordinators, caplog, monkeypatch):  # noqa: F811
    """Spark's planner looks for the coordinator once; its tasks report to the lease it saw
    without listing the metadata log, and with none active the planner says once at WARN that
    the client id's quota is not enforced."""
    from pyspark_kafkalog.cluster.cluster import Cluster
    from pyspark_kafkalog.storage.local import LocalStorage
    setup = Admin(url, create=False)
    setup.alter_client_quotas("etl", {"consumer_byte_rate": 1000})
    with caplog.at_level(logging.WARNING, logger=quota_client.__name__):
        assert quota_client.planned_coordinator(cluster, cluster.state(), "etl", "fetch") is None
        assert quota_client.planned_coordinator(cluster, cluster.state(), "etl", "fetch") is None
    assert len([r for r in caplog.records if "not enforced" in r.getMessage()]) == 1
    coordinators(cluster)
    lease = quota_client.planned_coordinator(cluster, cluster.state(), "etl", "fetch")
    assert lease["holder"] and lease["address"]
    task_cluster = Cluster(url, create=False)        # what a task opens
    listed = []                                      # by this thread (the coordinator
    real = LocalStorage.list                         # reads the log in its own threads)
    main = threading.current_thread()

    def counting(self, path, *a, **k):
        if threading.current_thread() is main:
            listed.append(path)
        return real(self, path, *a, **k)
    monkeypatch.setattr(LocalStorage, "list", counting)
    q = QuotaClient(task_cluster, "etl", planned=quota_client.Planned(lease),
                    sleep=lambda s: None)
    assert q.fetched(5000) > 0                       # over 1000 B/s: throttled
    assert listed == []
