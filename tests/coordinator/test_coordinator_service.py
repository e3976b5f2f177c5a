"""The coordinator service (issue #16, "The service"): the lease in the metadata log, gRPC with a
token, discovery through the metadata log, Prometheus metrics, the standalone command (real
processes: SIGTERM, kill -9 and a standby's takeover) and ``coordinator.start`` beside a driver.

Waits poll with a generous deadline; nothing asserts how long anything took.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

import grpc
import pytest

from support.cli_support import REPO, run_cli
from support.coordinator_support import (  # noqa: F401 (fixtures)
    CONF, DEADLINE_S, LEASE_MS, TOKEN, cluster, coordinators, coordinator_defaults, eventually,
    metrics_of, services, token_file, url)
from pyspark_kafkalog.cluster import lease as L
from pyspark_kafkalog.cluster.cluster import Cluster
from pyspark_kafkalog.coordinator import connect, start
from pyspark_kafkalog.coordinator.config import (CoordinatorConfig, coordinator_options,
                                                  load_coordinator_config)
from pyspark_kafkalog.coordinator.embedded import session_stopped
from pyspark_kafkalog.coordinator.rpc import CoordinatorClient, encode, decode, method_path
from pyspark_kafkalog.coordinator.scheduler import SchedulerConfig
from pyspark_kafkalog.coordinator.service import Coordinator
from pyspark_kafkalog.errors import (CoordinatorAuthenticationError,
                                     CoordinatorLeaseHeldError, CoordinatorNotAvailableError,
                                     FencedCoordinatorError, InvalidConfigError,
                                     KafkaStorageError, NotControllerError)

# -- RPC and its token ---------------------------------------------------------------------------

pytestmark = pytest.mark.slow   # coordinator processes started, killed and taken over (~25 s)


def test_status_and_ping_answer_a_caller_with_the_token(cluster, coordinators):
    c = coordinators(cluster)
    assert c.epoch == 1 and c.active
    with CoordinatorClient(c.address, TOKEN) as client:
        status = client.status()
        pong = client.ping()
    lease = L.current_lease(cluster.state())
    assert (status["epoch"], status["holder"], status["address"]) == \
        (lease.epoch, lease.holder, lease.address) == (1, c.holder, c.address)
    assert status["active"] is True and status["lease_ms"] == LEASE_MS
    assert status["lease_expires_ms"] >= lease.expires_ms   # renewals only move it later
    assert status["uptime_s"] >= 0 and status["cluster_id"] == cluster.cluster_id
    assert status["metrics_url"] == c.metrics_url
    assert status["metrics"]["epoch"] == 1 and status["metrics"]["active"] == 1
    assert pong["holder"] == c.holder and pong["epoch"] == 1 and pong["active"] is True


def test_a_missing_or_wrong_token_is_refused_with_unauthenticated_and_logged(
        cluster, coordinators, caplog):
    caplog.set_level(logging.WARNING, logger="pyspark_kafkalog.coordinator.auth")
    c = coordinators(cluster)
    channel = grpc.insecure_channel(c.address)
    status = channel.unary_unary(method_path("Status"), request_serializer=encode,
                                 response_deserializer=decode)
    with pytest.raises(grpc.RpcError) as missing:
        status({}, timeout=30)
    assert missing.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(grpc.RpcError) as wrong:
        status({}, timeout=30, metadata=(("authorization", "Bearer " + "f" * 64),))
    assert wrong.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(grpc.RpcError) as not_bearer:       # the token, but not as a bearer
        status({}, timeout=30, metadata=(("authorization", TOKEN),))
    assert not_bearer.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(CoordinatorAuthenticationError):    # the client's typed error
        CoordinatorClient(c.address, "x" * 32).status()
    assert status({}, timeout=30, metadata=(("authorization", "Bearer " + TOKEN),))["epoch"] == 1
    channel.close()

    refusals = [r for r in caplog.records if r.name == "pyspark_kafkalog.coordinator.auth"]
    assert [r.levelno for r in refusals] == [logging.WARNING] * 4
    messages = [r.getMessage() for r in refusals]
    assert "no token" in messages[0] and "wrong token" in messages[1]
    for m in messages:
        assert "/kafkalog.coordinator.Coordinator/Status" in m
        assert "127.0.0.1" in m                               # the peer
        assert TOKEN not in m
    assert c.metrics.summary()["rpc_authentication_failures"] == 4


def test_a_coordinator_refuses_to_start_without_a_usable_token(cluster, monkeypatch, tmp_path):
    monkeypatch.delenv("KAFKALOG_COORDINATOR_TOKEN", raising=False)
    with pytest.raises(InvalidConfigError, match="KAFKALOG_COORDINATOR_TOKEN"):
        Coordinator(cluster)
    with pytest.raises(InvalidConfigError, match="at least 16"):
        Coordinator(cluster, token="short")
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(InvalidConfigError, match="empty"):
        Coordinator(cluster, CoordinatorConfig.of(token_file=str(empty)))
    with pytest.raises(InvalidConfigError, match="cannot read"):
        Coordinator(cluster, CoordinatorConfig.of(token_file=str(tmp_path / "absent")))
    assert L.current_lease(cluster.state()) is None          # nothing was started
    monkeypatch.setenv("KAFKALOG_COORDINATOR_TOKEN", TOKEN)
    c = Coordinator(cluster, CoordinatorConfig.of(lease_ms=LEASE_MS)).start()
    try:
        assert CoordinatorClient(c.address, TOKEN).ping()["epoch"] == 1
    finally:
        c.stop()


# -- metrics -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Run:                      # the shape of the scheduler's MaintenanceRun that is counted
    kind: str
    ok: bool


def test_the_metrics_endpoint_serves_prometheus_text_of_this_coordinator_only(
        cluster, coordinators):
    calls = []

    def tick(now):
        calls.append(now)
        return [Run("retention", True), Run("cleanup", False)]
    c = coordinators(cluster, ticks=[tick], tick_interval_ms=50)
    other = coordinators(Cluster(cluster.url, create=False))       # a standby beside it
    eventually(lambda: c.metrics.summary()["lease_renewals"] >= 2 and len(calls) >= 2,
               "two renewals and two maintenance ticks")
    m = metrics_of(c.metrics_url)
    assert m[("kafkalog_coordinator_epoch", frozenset())] == 1
    assert m[("kafkalog_coordinator_active", frozenset())] == 1
    assert m[("kafkalog_coordinator_lease_acquisitions_total", frozenset())] == 1
    assert m[("kafkalog_coordinator_lease_renewals_total", frozenset())] >= 2
    assert m[("kafkalog_coordinator_leader_elections_total", frozenset())] == 0
    runs = m[("kafkalog_coordinator_maintenance_runs_total",
              frozenset({("kind", "retention")}))]
    assert runs >= 2
    assert m[("kafkalog_coordinator_maintenance_failures_total",
              frozenset({("kind", "cleanup")}))] >= 2
    assert ("kafkalog_coordinator_maintenance_failures_total",
            frozenset({("kind", "retention")})) not in m
    assert all(now > 1e9 for now in calls)          # seconds since the epoch, like time.time()
    # only what is measured: the replication lag (no replicated partition: 0), nothing from
    # the global registry
    names = {name for name, _ in m}
    assert m[("kafkalog_coordinator_replication_max_lag_offsets", frozenset())] == 0
    assert not any(n.startswith(("python_", "process_")) for n in names)
    # the standby's own registry
    s = metrics_of(other.metrics_url)
    assert s[("kafkalog_coordinator_active", frozenset())] == 0
    assert s[("kafkalog_coordinator_epoch", frozenset())] == 0
    assert not any(n.startswith("kafkalog_coordinator_maintenance_runs") for n, _ in s)


def test_the_replication_gauges_count_what_the_metadata_says(tmp_path, coordinators):
    """Without the feature replication (this coordinator does not copy, so it does not turn it
    on) followers are not copied to, so every partition with two replicas is under-replicated,
    and under min.insync.replicas=2; the gauges follow the metadata at each scrape, and the
    Status answer carries them (the real ISR: tests/cli/test_isr_describe.py)."""
    from pyspark_kafkalog.admin import Admin
    admin = Admin(str(tmp_path / "c"))
    admin.create_topic("single", 2)
    c = coordinators(Cluster(admin.cluster.url, create=False), replication=False)
    gauges = lambda: {n[len("kafkalog_coordinator_"):]: v
                      for (n, labels), v in metrics_of(c.metrics_url).items()
                      if n.endswith(("partitions", "_partitions_count"))}
    assert gauges() == {"partitions": 2, "under_replicated_partitions": 0,
                        "under_min_isr_partitions": 0, "at_min_isr_partitions": 2}
    admin.add_log_dir(str(tmp_path / "second"))
    admin.create_topic("pair", 4, replication_factor=2, configs={"min.insync.replicas": "2"})
    admin.create_topic("loose", 3, replication_factor=2)
    assert gauges() == {"partitions": 9, "under_replicated_partitions": 7,
                        "under_min_isr_partitions": 4, "at_min_isr_partitions": 5}
    with CoordinatorClient(c.address, TOKEN) as client:
        assert client.status()["metrics"]["under_replicated_partitions"] == 7


# -- discovery -----------------------------------------------------------------------------------

def test_clients_find_the_active_coordinator_through_the_metadata_log(url, cluster, coordinators):
    with pytest.raises(CoordinatorNotAvailableError, match="no coordinator has ever run"):
        connect(cluster, TOKEN)
    c = coordinators(cluster)
    with connect(url, TOKEN) as client:              # a URL or a Cluster
        assert client.address == c.address
        assert client.lease.epoch == 1 and client.lease.holder == c.holder
        assert client.status()["holder"] == c.holder
    with pytest.raises(CoordinatorAuthenticationError):
        connect(cluster, "y" * 32)
    # by a clock past its expiry, the same lease names no active coordinator
    later = Cluster(url, create=False, clock=lambda: time.time() + 3600)
    with pytest.raises(CoordinatorNotAvailableError, match="expired"):
        connect(later, TOKEN)
    c.stop()
    with pytest.raises(CoordinatorNotAvailableError, match="released"):
        connect(cluster, TOKEN)


def test_a_live_lease_whose_address_does_not_answer_is_not_available(cluster):
    L.acquire(cluster, "ghost", "127.0.0.1:1", 600_000)
    with pytest.raises(CoordinatorNotAvailableError, match="does not answer"):
        connect(cluster, TOKEN, timeout_s=30)


def test_an_address_that_answers_as_another_process_is_not_the_coordinator(cluster,
                                                                          coordinators):
    standby_side = coordinators(Cluster(cluster.url, create=False))
    other = Cluster(cluster.url, create=False, clock=lambda: time.time() + 3600)
    L.acquire(other, "impostor", standby_side.address, 600_000)   # names someone else's port
    eventually(lambda: not standby_side.active, "the first coordinator fenced")
    with pytest.raises(CoordinatorNotAvailableError, match="answers as"):
        connect(other, TOKEN)


# -- the lease: standby, fencing -----------------------------------------------------------------

def test_a_standby_takes_over_when_the_active_one_stops(url, coordinators):
    a = coordinators(Cluster(url, create=False))
    b = coordinators(Cluster(url, create=False))
    assert (a.epoch, b.epoch) == (1, None) and not b.active
    assert CoordinatorClient(b.address, TOKEN).status()["active"] is False
    a.stop()
    eventually(lambda: b.active, "the standby took over")
    assert b.epoch == 2
    assert L.current_lease(Cluster(url, create=False).state()).holder == b.holder


def test_a_fenced_coordinator_stops_acting_at_once(cluster, coordinators):
    ticks = []
    c = coordinators(cluster, ticks=[ticks.append], tick_interval_ms=20)
    c.add_method("Touch", lambda request: {"touched": True}, mutating=True)
    with CoordinatorClient(c.address, TOKEN) as client:
        assert client.call("Touch") == {"touched": True}
        eventually(lambda: ticks, "a maintenance tick")
        intruder = Cluster(cluster.url, create=False, clock=lambda: time.time() + 3600)
        taken = L.acquire(intruder, "intruder", "", 600_000)      # lapsed by its clock
        assert taken.epoch == 2
        eventually(lambda: not c.active, "the coordinator noticed it was fenced")
        with pytest.raises(NotControllerError):
            client.call("Touch")
        status = client.status()                  # reading still works, and says so
        assert status["active"] is False and status["epoch"] is None
        assert status["metrics"]["fenced"] == 1 and status["metrics"]["active"] == 0
        # no more maintenance: at most the one tick that may have been under way
        n = len(ticks)
        time.sleep(0.5)                           # 25 tick intervals
        assert len(ticks) <= n + 1
    assert not c.wait(0)                          # on_fenced="standby": it keeps serving
    assert L.current_lease(cluster.state()).holder == "intruder"


def test_on_fenced_exit_ends_the_service(cluster, coordinators):
    def tick(now):
        raise FencedCoordinatorError("replay refused our epoch")
    c = coordinators(cluster, ticks=[tick], tick_interval_ms=20, on_fenced="exit")
    assert c.wait(DEADLINE_S)
    assert c.exit_reason == "fenced" and not c.active


class BrokenRenewals:
    """The real lease, except that renewals fail as unavailable storage does."""

    def __init__(self, cluster):
        self.cluster = cluster
        self.failing = False

    def now_ms(self):
        return self.cluster.now_ms()

    def acquire(self, holder, address, lease_ms):
        return L.acquire(self.cluster, holder, address, lease_ms)

    def renew(self, lease):
        if self.failing:
            raise KafkaStorageError("storage unavailable")
        return L.renew(self.cluster, lease)

    def release(self, lease):
        L.release(self.cluster, lease)


def test_a_coordinator_whose_renewals_fail_stops_acting_once_its_lease_lapses(
        cluster, coordinators):
    leases = BrokenRenewals(cluster)
    c = coordinators(cluster, leases=leases)
    eventually(lambda: c.metrics.summary()["lease_renewals"] >= 1, "a renewal")
    held = c.lease
    leases.failing = True
    eventually(lambda: not c.active, "the coordinator stepped down")
    assert cluster.now_ms() >= held.expires_ms       # not before its lease lapsed
    summary = c.metrics.summary()
    assert summary["lease_renewal_failures"] >= 1 and summary["fenced"] == 1


class PausedLeases(BrokenRenewals):
    """The real lease, with the process's clock jumped ahead as after a SIGSTOP and SIGCONT
    (``skew_ms``), and its renewals held back (``renewals`` cleared) as if the lease thread had
    not run yet since."""

    def __init__(self, cluster):
        super().__init__(cluster)
        self.skew_ms = 0
        import threading
        self.renewals = threading.Event()
        self.renewals.set()

    def now_ms(self):
        return self.cluster.now_ms() + self.skew_ms

    def renew(self, lease):
        self.renewals.wait(DEADLINE_S)
        return super().renew(lease)


def test_a_coordinator_resumed_past_its_lease_acts_no_more_until_it_renews(cluster,
                                                                           coordinators):
    """A tester's SIGSTOP: the resumed coordinator ran retention and cleanup before it noticed
    it had been fenced (3 of 3 episodes). Acting now needs an unexpired lease by the clock."""
    leases = PausedLeases(cluster)
    runs = []
    c = coordinators(cluster, leases=leases, ticks=[lambda now: runs.append(now)],
                     tick_interval_ms=20)
    eventually(lambda: len(runs) >= 2, "maintenance ticks")
    leases.renewals.clear()
    leases.skew_ms = 10 * LEASE_MS                     # resumed long after its lease expired
    time.sleep(0.1)
    n = len(runs)
    time.sleep(0.3)
    assert len(runs) == n, "a coordinator whose lease had expired ran maintenance"
    assert c.replicator is None or c.replicator.epoch() is None
    leases.skew_ms = 0
    leases.renewals.set()                              # its lease loop runs again and renews
    eventually(lambda: len(runs) > n, "maintenance again once renewed")


def test_a_coordinator_stopped_mid_acquire_hands_the_lease_back(cluster):
    c = Coordinator(cluster, CoordinatorConfig.of(lease_ms=LEASE_MS), token=TOKEN).start()
    c.stop()
    c.stop()                                         # idempotent
    after = L.current_lease(cluster.state())
    assert after.epoch == 1 and after.holder == ""   # released: the next one need not wait
    assert L.acquire(cluster, "next", "", 600_000).epoch == 2


# -- the standalone command: real processes ------------------------------------------------------



def status_of(url: str, token_file: str):
    rc, out, err = run_cli("--cluster", url, "--json", "coordinator", "--status",
                           "--token-file", token_file)
    return rc, (json.loads(out) if rc == 0 else None), err


def test_the_command_serves_answers_status_from_another_process_and_releases_on_sigterm(
        url, cluster, token_file, services, tmp_path):
    s = services(url, "--token-file", token_file, "--lease-ms", LEASE_MS)
    assert s.announced["epoch"] == 1 and s.announced["address"]
    rc, status, err = status_of(url, token_file)
    assert rc == 0, err
    assert (status["epoch"], status["holder"], status["address"]) == \
        (1, s.announced["holder"], s.announced["address"])
    assert status["active"] is True and status["metrics_url"] == s.announced["metrics_url"]
    assert status["status"]["metrics"]["epoch"] == 1
    rc, out, err = run_cli("--cluster", url, "coordinator", "--status", "--token-file",
                           token_file)                      # the table, for people
    assert rc == 0 and out.splitlines()[0].split()[:3] == ["EPOCH", "HOLDER", "ADDRESS"]
    assert s.announced["holder"] in out.splitlines()[1]

    wrong = tmp_path / "wrong"
    wrong.write_text("w" * 40)
    wrong.chmod(0o600)
    rc, out, err = run_cli("--cluster", url, "coordinator", "--status", "--token-file", wrong)
    assert rc == 2 and "CoordinatorAuthenticationError" in err and out == ""
    assert len(err.strip().splitlines()) == 1

    assert s.terminate() == 0, s.stderr()
    assert "released epoch 1" in s.stderr()
    assert "refused /kafkalog.coordinator.Coordinator/Ping" in s.stderr()
    taken = L.acquire(cluster, "next", "", 600_000)   # at once: no CoordinatorLeaseHeldError
    assert taken.epoch == 2
    L.release(cluster, taken)
    rc, out, err = run_cli("--cluster", url, "coordinator", "--status", "--token-file",
                           token_file)
    assert rc == 1 and "CoordinatorNotAvailableError" in err and "released" in err


def test_sigint_releases_too_and_a_config_file_sets_the_service(url, cluster, token_file,
                                                                  services, tmp_path):
    conf = tmp_path / "coordinator.properties"
    conf.write_text((CONF / "coordinator.properties").read_text()
                    + f"coordinator.token.file={token_file}\ncoordinator.lease.ms=2500\n")
    s = services(url, "--coordinator-config", conf)
    assert s.announced["epoch"] == 1
    assert L.current_lease(cluster.state()).lease_ms == 2500
    s.proc.send_signal(signal.SIGINT)
    assert s.proc.wait(timeout=DEADLINE_S) == 0, s.stderr()
    assert L.current_lease(cluster.state()).holder == ""


def test_the_example_coordinator_config_is_what_the_service_takes(cluster, tmp_path):
    opts = load_coordinator_config(str(CONF / "coordinator.properties"))
    assert opts == {"bind": "127.0.0.1:0", "metrics_port": 0, "lease_ms": 10_000,
                    "on_fenced": "standby", "maintenance": True,
                    "maintenance_config": SchedulerConfig(), "replication": True,
                    "replica_lag_time_max_ms": 30_000, "replica_fetch_wait_max_ms": 500,
                    "broker_session_timeout_ms": 9_000, "num_replica_fetchers": 4,
                    "replica_verify_interval_ms": 1_000,
                    "quota_window_num": 11, "quota_window_size_s": 1,
                    "max_incremental_fetch_session_cache_slots": 1000}
    c = Coordinator(cluster, CoordinatorConfig.of(**opts), token=TOKEN)
    assert (c.bind, c.lease_ms, c.on_fenced) == ("127.0.0.1:0", 10_000, "standby")
    assert c.replicator.replica_lag_time_max_ms == 30_000
    assert c.replicator.broker_session_timeout_ms == 9_000
    with pytest.raises(InvalidConfigError, match="coordinator.lease"):
        coordinator_options({"coordinator.lease": "5"})
    with pytest.raises(InvalidConfigError, match="integer"):
        coordinator_options({"coordinator.lease.ms": "soon"})
    assert coordinator_options({"quota.producer.default": "1e6"}) == {
        "quota_producer_default": 1e6}
    with pytest.raises(InvalidConfigError, match="number"):
        coordinator_options({"quota.consumer.default": "fast"})
    with pytest.raises(InvalidConfigError, match="quota.producer.default"):
        Coordinator(cluster, CoordinatorConfig.of(quota_producer_default=0.0), token=TOKEN)


def test_kill_9_of_the_active_coordinator_lets_the_standby_take_over(url, cluster, token_file,
                                                                    services):
    a = services(url, "--token-file", token_file, "--lease-ms", LEASE_MS)
    b = services(url, "--token-file", token_file, "--lease-ms", LEASE_MS)
    assert a.announced["epoch"] == 1 and b.announced["epoch"] is None
    with pytest.raises(CoordinatorLeaseHeldError):
        L.acquire(cluster, "third", "", 600_000)
    a.kill()                                         # SIGKILL: no release
    assert a.proc.returncode == -signal.SIGKILL
    lease = eventually(lambda: (lambda l: l if l.epoch == 2 else None)(
        L.current_lease(cluster.state())), "the standby took the next epoch")
    assert lease.holder == b.announced["holder"] and lease.address == b.announced["address"]
    rc, status, err = eventually(   # the lease is written a moment before b says it holds it
        lambda: (lambda r: r if r[0] == 0 else None)(status_of(url, token_file)),
        "status answered by the new coordinator")
    assert (status["epoch"], status["holder"], status["active"]) == (2, b.announced["holder"],
                                                                     True)
    assert b.terminate() == 0, b.stderr()


def test_the_command_checks_its_options_and_token(url, tmp_path, monkeypatch):
    monkeypatch.delenv("KAFKALOG_COORDINATOR_TOKEN", raising=False)
    env = {k: v for k, v in os.environ.items() if k != "KAFKALOG_COORDINATOR_TOKEN"}
    rc, out, err = run_cli("--cluster", url, "coordinator", env=env)
    assert rc == 2 and "KAFKALOG_COORDINATOR_TOKEN" in err and out == ""
    rc, out, err = run_cli("--cluster", url, "coordinator", "--status", "--bind", "0:0", env=env)
    assert rc == 2 and "--bind does not apply to --status" in err
    rc, out, err = run_cli("--cluster", url, "coordinator", "--status", env=env)
    assert rc == 2 and "KAFKALOG_COORDINATOR_TOKEN" in err
    rc, out, err = run_cli("--cluster", url, "coordinator", "--status",
                           env={**env, "KAFKALOG_COORDINATOR_TOKEN": TOKEN})
    assert rc == 1 and "CoordinatorNotAvailableError" in err and "ever run" in err
    rc, out, err = run_cli("--cluster", str(tmp_path / "nothing"), "coordinator",
                           env={**env, "KAFKALOG_COORDINATOR_TOKEN": TOKEN})
    assert rc == 2 and "not a kafkalog cluster" in err


# -- beside a driver ------------------------------------------------------------------------------

class FakeSpark:
    """The shape ``start(spark)`` watches: ``spark._sc._jsc.sc().isStopped()``."""

    def __init__(self):
        self.stopped = False
        spark = self

        class SC:
            def isStopped(self):
                return spark.stopped

        class JSC:
            def sc(self):
                return SC()

        class Context:
            _jsc = JSC()
        self._sc = Context()


def test_start_beside_a_session_stops_when_the_session_stops(url, cluster):
    spark = FakeSpark()
    handle = start(spark, cluster=url, token=TOKEN, lease_ms=LEASE_MS)
    try:
        assert handle.epoch == 1 and handle.address and handle.metrics_url
        with connect(cluster, TOKEN) as client:
            assert client.status()["holder"] == handle.holder
        spark.stopped = True
        assert handle.wait(DEADLINE_S)
        eventually(lambda: L.current_lease(cluster.state()).holder == "",
                   "the lease released after the session stopped")
        assert handle.exit_reason == "stopped" and not handle.active
    finally:
        handle.stop()


def test_start_stops_when_the_context_is_gone(url, cluster):
    spark = FakeSpark()
    handle = start(spark, cluster=url, token=TOKEN, lease_ms=LEASE_MS)
    try:
        spark._sc._jsc = None                     # what SparkContext.stop() leaves
        assert handle.wait(DEADLINE_S)
        eventually(lambda: L.current_lease(cluster.state()).holder == "", "the lease released")
    finally:
        handle.stop()


def test_start_with_a_cluster_url_runs_until_stopped(url, cluster, token_file):
    handle = start(url, token_file=token_file, lease_ms=LEASE_MS)
    try:
        with connect(url, TOKEN) as client:
            assert client.status()["epoch"] == handle.epoch == 1
            assert client.address == handle.address
        assert metrics_of(handle.metrics_url)[("kafkalog_coordinator_active", frozenset())] == 1
    finally:
        handle.stop()
    assert L.current_lease(cluster.state()).holder == ""
    with pytest.raises(InvalidConfigError, match="cluster="):
        start(FakeSpark(), token=TOKEN)


def test_a_live_spark_session_is_not_taken_for_stopped(spark, url, cluster):
    """The watcher's question, asked of the suite's real session (which must stay up)."""
    assert session_stopped(spark) is False
    handle = start(spark, cluster=url, token=TOKEN, lease_ms=LEASE_MS)
    try:
        assert not handle.wait(2.5)               # the watcher looked, and it runs on
        assert handle.active
    finally:
        handle.stop()
    assert not spark.sparkContext._jsc.sc().isStopped()


# -- without a coordinator -------------------------------------------------------------------------

def test_nothing_else_imports_grpc_or_prometheus_client():
    code = ("import sys, pyspark_kafkalog, pyspark_kafkalog.admin, pyspark_kafkalog.cli.main, "
            "pyspark_kafkalog.coordinator, pyspark_kafkalog.coordinator.follow, "
            "pyspark_kafkalog.spark; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('grpc', 'prometheus_client')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={**os.environ, "PYTHONPATH": str(REPO)}).stdout
    assert out.strip() == "[]"
