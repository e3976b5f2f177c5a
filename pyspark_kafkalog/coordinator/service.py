"""The coordinator service: one active process per cluster, by a lease in the metadata log.

Why a lease and not a lock file: the metadata log is the one place every process already agrees
on, and an epoch written there fences a deposed coordinator for good (replay rejects what an old
epoch writes, docs/protocol.md), where a lock only says who should act. The process that holds
the lease renews it every ``lease_ms / 3``; a standby retries taking it and gets it once it
lapses (kill -9 of the active one) or is released (a clean stop), with the next epoch.

A coordinator that learns it was fenced (``FencedCoordinatorError`` from a renewal or a
maintenance hook), or whose own lease lapsed before a renewal got through, stops acting at once:
mutating RPCs are refused and hooks are no longer called; then it stands by or ends
(``on_fenced``). Maintenance hooks (``ticks``) run on their own thread, so a long run never
delays a renewal.

Scheduled maintenance (retention, cleanup, checkpoint rewrites, deletion after consumption) is
on by default: the service builds a ``MaintenanceScheduler`` and makes its ``tick`` the first
hook. The scheduler reads the same clock the hooks are called with (the cluster's, in seconds),
so "an interval after the last run" means one thing; it asks the service before each job whether
it still acts, and lets a job's ``FencedCoordinatorError`` through so that the service fences
itself. ``maintenance=False`` leaves it out (another process runs the jobs, or nobody does).

Replication (``replicator.py``: copying to followers, the ISR) runs on a thread of its own,
every ``replica.fetch.wait.max.ms``, so that a long retention run never holds back the high
watermark of replicated partitions, and a long copy never delays maintenance.

KIP-227 fetch sessions (``fetch_service.py``: one cache for every client of the cluster, and
the replicator's privileged session in it) are served by the active coordinator only, like
Kafka's by the leader: a standby's cache would rank sessions no active process sees.
"""
from __future__ import annotations

import logging
import socket
import threading
import time
from typing import Callable, List, Optional, Sequence

from ..cluster.cluster import replication_summary
from ..cluster.quotas import FETCH, PRODUCE
from ..cluster.lease import (CoordinatorLease, acquire, current_lease, new_holder_id, release,
                             renew)
from ..errors import (CoordinatorLeaseHeldError, FencedCoordinatorError, InvalidConfigError,
                      KafkaLogError)
from .auth import resolve_token
from .config import COORDINATOR_SETTINGS, CoordinatorConfig, split_bind as _split
from .fetch_service import FetchSessionService
from .metrics import CoordinatorMetrics, metrics_url
from .quota_service import QuotaService
from .replicator import Replicator
from .rpc import MAX_WORKERS, RpcServer
from .scheduler import KINDS, MaintenanceScheduler
from .serving import ServingWatch

log = logging.getLogger(__name__)

#: defaults of the settings (``config.COORDINATOR_SETTINGS``), under their old names
DEFAULT_BIND = COORDINATOR_SETTINGS["coordinator.bind"].default
DEFAULT_LEASE_MS = COORDINATOR_SETTINGS["coordinator.lease.ms"].default
#: a standby retries no sooner than this after the holder's lease expiry, by its own clock
TAKEOVER_SLACK_S = 0.01

#: a maintenance hook (``MaintenanceScheduler.tick``): called every ``tick_interval_ms`` while
#: this process is active, with now (seconds since the epoch, the cluster's clock); returns what
#: it ran (runs with .kind and .ok, kind names, or {kind: count}) or None
Tick = Callable[[int], object]


class ClusterLeases:
    """The lease of ``cluster/lease.py``, bound to one cluster. A constructor parameter of
    :class:`Coordinator` so that a test can put a fake in its place."""

    def __init__(self, cluster):
        self.cluster = cluster

    def now_ms(self) -> int:
        return self.cluster.now_ms()

    def current(self) -> Optional[CoordinatorLease]:
        return current_lease(self.cluster.state())

    def acquire(self, holder: str, address: str, lease_ms: int) -> CoordinatorLease:
        return acquire(self.cluster, holder, address, lease_ms)

    def renew(self, lease: CoordinatorLease) -> CoordinatorLease:
        return renew(self.cluster, lease)

    def release(self, lease: CoordinatorLease) -> None:
        release(self.cluster, lease)


def _join(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _reachable_host(host: str) -> str:
    """The name clients use for a wildcard bind."""
    return socket.getfqdn() if host in ("", "0.0.0.0", "::", "*") else host


class Coordinator:
    """The service; :meth:`start` it, :meth:`stop` it (releasing the lease). ``epoch`` is the
    epoch it holds (None while it stands by). See the module docstring for the lease rules."""

    def __init__(self, cluster, config: Optional[CoordinatorConfig] = None, *,
                 token: Optional[str] = None, ticks: Sequence[Tick] = (),
                 holder: Optional[str] = None, leases=None):
        """``config``: every setting (a :class:`CoordinatorConfig`, checked when it was made;
        default: the defaults): ``CoordinatorConfig.of(lease_ms=2500)``,
        ``CoordinatorConfig.load("conf/coordinator.properties")``. The rest are this process's
        objects: ``token`` (else the config's token file, else $KAFKALOG_COORDINATOR_TOKEN),
        maintenance hooks ``ticks`` after the scheduler's, the lease ``holder`` id (default a
        new one) and ``leases`` (a test's fake of :class:`ClusterLeases`)."""
        if config is None:
            config = CoordinatorConfig()
        elif not isinstance(config, CoordinatorConfig):
            raise InvalidConfigError(f"config must be a CoordinatorConfig, got {config!r}: "
                                     "CoordinatorConfig.of(**settings)")
        self.config = config
        self.cluster = cluster
        self._token = resolve_token(token, config.token_file)
        self._bind_host, _ = _split(config.bind)
        self.bind = config.bind
        self.advertised_address = config.advertised_address
        self.metrics_port = config.metrics_port
        self.lease_ms = config.lease_ms
        self.on_fenced = config.on_fenced
        self.tick_interval_ms = config.tick_interval_ms
        self.holder = holder or new_holder_id()
        self.leases = leases if leases is not None else ClusterLeases(cluster)
        #: the scheduled maintenance (None when off); its tick is the first hook
        self.scheduler: Optional[MaintenanceScheduler] = None
        if config.maintenance:
            self.scheduler = MaintenanceScheduler(cluster, config.maintenance_config,
                                                  clock=self._now_s, active=self._may_act)
        #: maintenance hooks; may be appended to before start()
        self.ticks: List[Tick] = ([self.scheduler.tick] if self.scheduler else []) + list(ticks)
        #: KIP-227 fetch sessions for every client of the cluster (the ``Fetch`` method)
        self.fetch_sessions = FetchSessionService(
            cluster, max_slots=config.max_incremental_fetch_session_cache_slots,
            min_eviction_ms=config.fetch_session_min_eviction_ms)
        #: copies to followers and keeps the ISR (None when off)
        self.replicator: Optional[Replicator] = None
        if config.replication:
            self.replicator = Replicator(
                cluster, lambda: self.epoch if self._may_act() else None,
                replica_lag_time_max_ms=config.replica_lag_time_max_ms,
                broker_session_timeout_ms=config.broker_session_timeout_ms,
                num_replica_fetchers=config.num_replica_fetchers,
                fetch_session=self.fetch_sessions.replica_session(),
                replica_verify_interval_ms=config.replica_verify_interval_ms)
        self.replica_fetch_wait_max_ms = config.replica_fetch_wait_max_ms
        self.metrics = CoordinatorMetrics()
        self.metrics.watch_replication(lambda: replication_summary(cluster.state()))
        self.metrics.watch_fetch_sessions(self.fetch_sessions.cache)
        #: why the service ended: None while it runs, "stopped" or "fenced" (on_fenced="exit")
        self.exit_reason: Optional[str] = None
        self.address: Optional[str] = None
        self.metrics_url: Optional[str] = None
        self._lock = threading.Lock()
        self._lease: Optional[CoordinatorLease] = None
        self._held_until_ms: Optional[int] = None     # the other holder's expiry, while standby
        self._stop = threading.Event()
        self._threads: List[threading.Thread] = []
        self._rpc: Optional[RpcServer] = None
        #: whether an RPC worker is free: a coordinator that cannot serve gives the lease up
        self.serving = ServingWatch(MAX_WORKERS)
        #: client quotas (KIP-13): the RecordUsage method's arithmetic and settings
        self.quotas = QuotaService(
            cluster, defaults={k: v for k, v in ((PRODUCE, config.quota_producer_default),
                                                 (FETCH, config.quota_consumer_default))
                               if v is not None},
            window_num=config.quota_window_num, window_size_s=config.quota_window_size_s,
            on_usage=self.metrics.count_usage)
        self.metrics.watch_client_quotas(self.quotas.usage)
        self._methods = {"Status": (self._status, False), "Ping": (self._ping, False),
                         "RecordUsage": (self.quotas.record_usage, True),
                         "ClientUsage": (self.quotas.client_usage, True)}
        self._methods["Fetch"] = (self.fetch_sessions.fetch, True)
        self._started_at: Optional[float] = None
        self._closed = False

    # -- state ----------------------------------------------------------------------------------

    @property
    def lease(self) -> Optional[CoordinatorLease]:
        """The lease this process holds (a maintenance hook reads its epoch for its actions)."""
        return self._lease

    @property
    def active(self) -> bool:
        return self._lease is not None

    @property
    def epoch(self) -> Optional[int]:
        lease = self._lease
        return lease.epoch if lease else None

    def add_method(self, name: str, handler: Callable[[dict], dict], *,
                   mutating: bool = False) -> None:
        """Serve one more RPC method (after start() too). ``mutating``: it acts on the
        cluster, so it is refused with NOT_CONTROLLER whenever this process is not active."""
        self._methods[name] = (handler, mutating)
        if self._rpc is not None:
            self._rpc.add_method(name, self.serving.wrap(handler), mutating=mutating)

    # -- life cycle -----------------------------------------------------------------------------

    def start(self) -> "Coordinator":
        """Serve RPC and metrics, try the lease once (so a free lease is held on return), then
        keep renewing or retrying it in the background."""
        self._started_at = time.monotonic()
        self._rpc = RpcServer(self.bind, self._token, is_active=lambda: self.active,
                              on_refusal=self.metrics.auth_failures.inc)
        for name, (handler, mutating) in self._methods.items():
            self._rpc.add_method(name, self.serving.wrap(handler), mutating=mutating)
        self._rpc.start()
        self.address = self.advertised_address or _join(_reachable_host(self._bind_host),
                                                        self._rpc.port)
        try:
            if self.metrics_port is not None:
                port = self.metrics.serve(self._bind_host or "0.0.0.0", self.metrics_port)
                self.metrics_url = metrics_url(self.address.rpartition(":")[0].strip("[]"),
                                               port)
            log.info("coordinator %s: RPC on %s, metrics at %s", self.holder, self.address,
                     self.metrics_url or "(off)")
            log.info("coordinator %s: scheduled maintenance %s", self.holder,
                     ", ".join(f"{k} every {ms} ms" for k, ms in self.maintenance_intervals()
                               .items()) if self.scheduler else "off")
            self._try_acquire()
        except BaseException:
            self._rpc.stop(None)
            self.metrics.stop()
            raise
        self._spawn("kl-coordinator-lease", self._run_lease)
        if self.ticks:
            self._spawn("kl-coordinator-ticks", self._run_ticks)
        if self.replicator is not None:
            self._spawn("kl-coordinator-replication", self._run_replication)
        return self

    def _spawn(self, name: str, target) -> None:
        t = threading.Thread(target=target, name=name, daemon=True)
        t.start()
        self._threads.append(t)

    def wait(self, timeout_s: Optional[float] = None) -> bool:
        """Block until the service is asked to end (stop(), or fenced with on_fenced="exit")."""
        return self._stop.wait(timeout_s)

    def request_stop(self) -> None:
        """Make :meth:`wait` return (safe in a signal handler); the waiter then calls stop()."""
        self._stop.set()

    def stop(self) -> None:
        """Stop acting, release the lease (a standby takes over at its next try, without waiting
        for the lease to lapse), and close the endpoints. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self.exit_reason is None:
            self.exit_reason = "stopped"
        self._stop.set()
        for t in self._threads:
            if t is not threading.current_thread():
                t.join()
        with self._lock:
            lease, self._lease = self._lease, None
        self.metrics.active.set(0)
        if lease is not None:
            try:
                self.leases.release(lease)
                log.info("coordinator %s released epoch %d", self.holder, lease.epoch)
            except FencedCoordinatorError as exc:
                log.warning("coordinator %s: epoch %d was already superseded: %s", self.holder,
                            lease.epoch, exc)
            except Exception as exc:   # noqa: BLE001 - it lapses by itself within lease_ms
                log.warning("coordinator %s could not release epoch %d (it lapses within "
                            "%d ms): %s", self.holder, lease.epoch, self.lease_ms, exc)
        if self._rpc is not None:
            self._rpc.stop()
        self.metrics.stop()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- the lease ------------------------------------------------------------------------------

    def _run_lease(self) -> None:
        interval_s = self.lease_ms / 3000
        while not self._stop.wait(self._next_wait_s(interval_s)):
            try:
                if self._cannot_serve():
                    continue
                if self._lease is None:
                    self._try_acquire()
                else:
                    self._renew()
            except Exception:   # noqa: BLE001 - the loop must outlive any one failure
                log.exception("coordinator %s: lease step failed", self.holder)
                self._step_down_if_lapsed()

    def _next_wait_s(self, interval_s: float) -> float:
        until = self._held_until_ms
        if self._lease is not None or until is None:
            return interval_s
        return min(interval_s, max(0.0, (until - self.leases.now_ms()) / 1000) + TAKEOVER_SLACK_S)

    def _try_acquire(self) -> None:
        try:
            lease = self.leases.acquire(self.holder, self.address, self.lease_ms)
        except CoordinatorLeaseHeldError as exc:
            if self._held_until_ms is None:
                log.info("coordinator %s stands by: %s", self.holder, exc)
            self._held_until_ms = exc.expires_ms if exc.expires_ms is not None else 0
            return
        except KafkaLogError as exc:
            log.warning("coordinator %s could not take the lease: %s", self.holder, exc)
            return
        with self._lock:
            if self._closed:                 # stop() ran meanwhile: hand it straight back
                self.leases.release(lease)
                return
            self._lease = lease
        self._held_until_ms = None
        self.metrics.lease_acquisitions.inc()
        self.metrics.epoch.set(lease.epoch)
        self.metrics.active.set(1)
        log.info("coordinator %s is active with epoch %d (lease %d ms)", self.holder,
                 lease.epoch, lease.lease_ms)

    def _renew(self) -> None:
        held = self._lease
        try:
            renewed = self.leases.renew(held)
        except FencedCoordinatorError as exc:
            self.fence(f"epoch {held.epoch} was superseded: {exc}")
            return
        except Exception as exc:   # noqa: BLE001 - storage trouble: retry until the lease lapses
            self.metrics.lease_renewal_failures.inc()
            log.warning("coordinator %s could not renew epoch %d: %s", self.holder, held.epoch,
                        exc)
            self._step_down_if_lapsed()
            return
        with self._lock:
            if self._lease is held:          # not fenced meanwhile by a maintenance hook
                self._lease = renewed
                self.metrics.lease_renewals.inc()

    def _cannot_serve(self) -> bool:
        """Whether no RPC worker has been free for a whole lease (``serving.py``): then an
        active coordinator stops acting and releases the lease, so that a standby takes over
        at its next try, and none takes the lease while that lasts."""
        stalled_s = self.serving.stalled_s()
        if stalled_s * 1000 < self.lease_ms:
            return False
        held = self._lease
        if held is not None:
            self.fence(f"it cannot serve: all {self.serving.workers} RPC workers have been busy "
                       f"for {stalled_s:.1f} s, more than its lease ({self.lease_ms} ms); it "
                       "gives the lease up")
            try:
                self.leases.release(held)
            except Exception as exc:   # noqa: BLE001 - it lapses by itself within lease_ms
                log.warning("coordinator %s could not release epoch %d (it lapses within %d "
                            "ms): %s", self.holder, held.epoch, self.lease_ms, exc)
        return True

    def _step_down_if_lapsed(self) -> None:
        held = self._lease
        if held is not None and self.leases.now_ms() >= held.expires_ms:
            self.fence(f"its lease (epoch {held.epoch}) lapsed before a renewal got through")

    def fence(self, reason: str) -> None:
        """Stop acting at once: from here on mutating RPCs are refused and hooks are not
        called. Then stand by, or end the service (``on_fenced="exit"``)."""
        with self._lock:
            if self._lease is None:
                return
            self._lease = None
        self.metrics.active.set(0)
        self.metrics.epoch.set(0)
        self.metrics.fenced.inc()
        log.error("coordinator %s stopped acting: %s", self.holder, reason)
        if self.on_fenced == "exit":
            self.exit_reason = "fenced"
            self._stop.set()
        else:
            log.info("coordinator %s stands by", self.holder)

    # -- maintenance hooks ----------------------------------------------------------------------

    def _now_s(self) -> float:
        """The cluster's clock in seconds: what hooks are called with and the scheduler reads."""
        return self.leases.now_ms() / 1000

    def _may_act(self) -> bool:
        """Whether this process may act now: it holds a lease that has not expired by the
        storage's clock. The expiry matters, not only the epoch: a process paused past its
        lease (SIGSTOP, a stalled VM, a long GC) may have been replaced without knowing it yet,
        and must not run retention or cleanup, or copy, before its lease loop renews (or finds
        itself fenced). Checked before every job and every pass."""
        lease = self._lease
        if lease is None or self._stop.is_set():
            return False
        try:
            return self.leases.now_ms() < lease.expires_ms
        except KafkaLogError:    # no clock to judge by: do not act
            return False

    def maintenance_intervals(self) -> Optional[dict]:
        """{kind: interval_ms} of the scheduled jobs that run; None when maintenance is off."""
        if self.scheduler is None:
            return None
        config = self.scheduler.config
        return {k: config.interval_ms(k) for k in KINDS if config.interval_ms(k) is not None}

    def _run_ticks(self) -> None:
        while not self._stop.wait(self.tick_interval_ms / 1000):
            for tick in list(self.ticks):
                if not self._may_act():
                    break
                try:
                    self.metrics.count_runs(tick(self._now_s()))
                except FencedCoordinatorError as exc:
                    self.fence(f"maintenance hook {tick!r} was fenced: {exc}")
                except Exception:   # noqa: BLE001 - one failing hook must not stop the others
                    log.exception("coordinator %s: maintenance hook %r failed", self.holder, tick)

    def _run_replication(self) -> None:
        while not self._stop.wait(self.replica_fetch_wait_max_ms / 1000):
            if not self._may_act():
                continue
            try:
                done = self.replicator.tick(self._now_s())
                if done is not None:
                    self.metrics.count_runs([done])
                    self.metrics.count_replication(done)
            except FencedCoordinatorError as exc:
                self.fence(f"replication was fenced: {exc}")
            except Exception:   # noqa: BLE001 - the next pass starts again from the log
                log.exception("coordinator %s: replication pass failed", self.holder)
                self.metrics.maintenance_failures.labels(kind="replication").inc()

    # -- RPC methods ----------------------------------------------------------------------------

    def _status(self, request: dict) -> dict:
        lease = self._lease
        return {"holder": self.holder, "address": self.address, "active": lease is not None,
                "epoch": lease.epoch if lease else None,
                "lease_ms": self.lease_ms,
                "lease_expires_ms": lease.expires_ms if lease else None,
                "uptime_s": round(time.monotonic() - self._started_at, 3),
                "cluster_id": getattr(self.cluster, "cluster_id", None),
                "metrics_url": self.metrics_url, "metrics": self.metrics.summary(),
                "maintenance": self.maintenance_intervals(),
                "fetch_session_cache_slots": self.fetch_sessions.cache.max_slots}

    def _ping(self, request: dict) -> dict:
        lease = self._lease
        return {"holder": self.holder, "active": lease is not None,
                "epoch": lease.epoch if lease else None, "time_ms": self.leases.now_ms()}
