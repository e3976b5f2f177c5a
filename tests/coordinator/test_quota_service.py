"""The coordinator's ``RecordUsage`` RPC (KIP-13's enforcement point, docs/protocol.md §12):
over real gRPC with the shared token, a client over its quota is told to wait (never refused),
one without a quota never is, a quota changed in the metadata log counts within one window,
KIP-13's coordinator defaults apply when no entity is set, bad requests are typed errors, a
standby refuses, and the metrics count bytes and throttle time per client id."""
from __future__ import annotations

import time

import pytest

from support.coordinator_support import TOKEN, cluster, coordinators, url  # noqa: F401  (fixtures)
from pyspark_kafkalog.admin import Admin
from pyspark_kafkalog.coordinator.discovery import connect
from pyspark_kafkalog.errors import InvalidRequestError, NotControllerError


@pytest.fixture
def coordinator_defaults() -> dict:
    return {"maintenance": False, "replication": False, "metrics_port": None,
            "quota_window_num": 3, "quota_window_size_s": 1}


def test_record_usage_throttles_by_quota_and_counts(url, cluster, coordinators):  # noqa: F811
    c = coordinators(cluster, quota_consumer_default=1000.0)
    admin = Admin(url, create=False)
    admin.alter_client_quotas("etl", {"producer_byte_rate": 1000})
    with connect(cluster, TOKEN) as client:
        def use(client_id, kind, n):
            return client.call("RecordUsage", {"client_id": client_id, "kind": kind, "bytes": n})
        first = use("etl", "produce", 1000)
        assert first == {"throttle_ms": 0, "quota": 1000.0}      # within 2 windows x 1000 B/s
        over = use("etl", "produce", 5000)     # 6000 B: 4000 too many, but a wait is at most
        assert over["throttle_ms"] == 3000     # the whole window, 3 x 1 s (boundedThrottleTime)
        assert use("free", "produce", 10**9) == {"throttle_ms": 0, "quota": None}
        assert use("free", "fetch", 10_000)["throttle_ms"] > 0    # quota.consumer.default
        # a changed quota counts within one window, without a restart
        admin.alter_client_quotas("etl", {"producer_byte_rate": 10**9})
        time.sleep(1.1)
        assert use("etl", "produce", 1)["quota"] == 1e9
        assert use("etl", "produce", 10**6)["throttle_ms"] == 0
        for bad in ({"client_id": "a", "kind": "write", "bytes": 1},
                    {"client_id": "a", "kind": "fetch", "bytes": -1}, {}):
            with pytest.raises(InvalidRequestError, match="RecordUsage"):
                client.call("RecordUsage", bad)
    reg = c.metrics.registry
    assert reg.get_sample_value("kafkalog_coordinator_client_bytes_total",
                                {"client_id": "etl", "kind": "produce"}) == 6001 + 10**6
    assert reg.get_sample_value("kafkalog_coordinator_client_throttle_seconds_total",
                                {"client_id": "etl", "kind": "produce"}) == 3.0


def test_a_standby_refuses(url, cluster, coordinators):  # noqa: F811
    active = coordinators(cluster)
    standby = coordinators(cluster)
    assert active.active and not standby.active
    from pyspark_kafkalog.coordinator.rpc import CoordinatorClient
    with CoordinatorClient(standby.address, TOKEN) as client:
        with pytest.raises(NotControllerError):
            client.call("RecordUsage", {"client_id": "a", "kind": "produce", "bytes": 1})
