"""A client's half of KIP-13 quotas (docs/protocol.md §12): report the bytes produced or
fetched to the active coordinator and wait the throttle time it answers.

Why every client asks the coordinator instead of counting locally: a client id's quota holds
across every task of every job that uses it, wherever they run, and only the coordinator sees
them all. Why the client sleeps rather than the coordinator: storage is shared, there is no
broker in the data path to hold a response back, so the client delays itself the way a Kafka
client is muted by its broker: a producer after its data is written, before it counts it as
acknowledged; a consumer after a fetch, before it hands the records out.

Without an active coordinator (none runs, no token here, it stopped answering) nothing is
throttled; a client id with a quota in the metadata log says so once, at WARN. The connection
is cached per process and cluster, and looked for again at most every ``REDISCOVER_S``, so a
client pays one RPC per fetch or produce when a coordinator runs, and almost nothing when none
does.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable, Dict, Optional, Tuple

from ..cluster.lease import current_lease
from ..cluster.quotas import FETCH, MAX_CLIENT_ID, PRODUCE, quota_for
from ..errors import InvalidConfigError, KafkaLogError

log = logging.getLogger(__name__)

#: how long a process waits before it looks for a coordinator again after finding none
REDISCOVER_S = 5.0
#: RecordUsage is on the data path: a coordinator that does not answer quickly is skipped
USAGE_TIMEOUT_S = 2.0
#: the client id of a client that sets none: KIP-13's empty client id, which shares the
#: default quota
DEFAULT_CLIENT_ID = ""

#: whatever goes wrong asking the coordinator (none active, refused token, no token here, a
#: standby or fenced one, a failed call) leaves the client unthrottled, never failed
_UNAVAILABLE = KafkaLogError


@dataclass
class ThrottleStats:
    """Kafka's client metrics ``<kind>-throttle-time-max`` and ``-avg`` (ms, over every
    request, unthrottled ones counting 0), and the bytes reported."""

    requests: int = 0
    throttled: int = 0
    total_ms: int = 0
    max_ms: int = 0
    bytes: int = 0

    def record(self, throttle_ms: int, nbytes: int) -> None:
        self.requests += 1
        self.bytes += nbytes
        self.total_ms += throttle_ms
        self.max_ms = max(self.max_ms, throttle_ms)
        self.throttled += throttle_ms > 0

    @property
    def avg_ms(self) -> float:
        return self.total_ms / self.requests if self.requests else 0.0

    def merge(self, other: "ThrottleStats") -> None:
        self.requests += other.requests
        self.throttled += other.throttled
        self.total_ms += other.total_ms
        self.max_ms = max(self.max_ms, other.max_ms)
        self.bytes += other.bytes

    def to_json(self) -> dict:
        return {"requests": self.requests, "throttled": self.throttled,
                "total_ms": self.total_ms, "max_ms": self.max_ms, "bytes": self.bytes}

    @classmethod
    def from_json(cls, d: Optional[dict]) -> "ThrottleStats":
        return cls(**{k: int(v) for k, v in (d or {}).items() if k in cls.__annotations__})

    def metrics(self, kind: str) -> dict:
        return {f"{kind}-throttle-time-max": self.max_ms,
                f"{kind}-throttle-time-avg": round(self.avg_ms, 1)}


def _no_coordinator(cluster, state=None) -> str:
    """Why no coordinator can be asked, from the lease in the metadata log ("" when one may).
    ``state``: a replayed state (or anything with its ``coordinator``) the caller already
    has, to look at instead of the log."""
    lease = current_lease(state if state is not None else cluster.state())
    if lease is None or not lease.holder or not lease.address:
        return "none is active"
    if cluster.now_ms() >= lease.expires_ms:
        return f"the lease of epoch {lease.epoch} has expired"
    return ""


class _Connections:
    """The process's coordinator connection per cluster: (client or None, when looked for)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._by_cluster: Dict[Tuple[str, Optional[str]], Tuple[object, float, str]] = {}

    def get(self, cluster, token_file: Optional[str], state=None):
        """A connected client, or (None, why) when there is no coordinator to ask now.
        ``state``: as for :func:`_no_coordinator`."""
        key = (cluster.url, token_file)
        now = time.monotonic()
        with self._lock:
            client, at, why = self._by_cluster.get(key, (None, -REDISCOVER_S, ""))
            if client is not None or now - at < REDISCOVER_S:
                return client, why
            try:
                why = _no_coordinator(cluster, state)
                if why and state is not None:   # a planner's lease may have been renewed since
                    state = None
                    why = _no_coordinator(cluster)
                client = None
                if not why:     # only now gRPC: a cluster without a coordinator never loads it
                    from .discovery import connect
                    client = connect(cluster, token_file=token_file, timeout_s=USAGE_TIMEOUT_S,
                                     state=state)
            except _UNAVAILABLE as exc:
                client, why = None, str(exc)
            self._by_cluster[key] = (client, now, why)
            return client, why

    def lost(self, cluster, token_file: Optional[str], client, why: str) -> None:
        """``client`` failed: forget it, and look again at the next call (a failover names a
        new coordinator at once)."""
        key = (cluster.url, token_file)
        with self._lock:
            current = self._by_cluster.get(key)
            if current is not None and current[0] is client:
                self._by_cluster[key] = (None, time.monotonic() - REDISCOVER_S, why)
        try:
            client.close()
        except Exception:
            pass

    def clear(self) -> None:
        with self._lock:
            clients = [c for c, _, _ in self._by_cluster.values() if c is not None]
            self._by_cluster.clear()
        for c in clients:
            c.close()


CONNECTIONS = _Connections()
_warned: set = set()
_warned_lock = threading.Lock()


def warn_unenforced(cluster_url: str, client_id: str, quotas, kind: str, why: str) -> None:
    """Say once per process, cluster and client id, when a quota applies but nothing can
    enforce it."""
    key = (cluster_url, client_id)
    if key in _warned:
        return
    quota = quota_for(quotas, client_id, kind)
    if quota is None:
        return
    with _warned_lock:
        if key in _warned:
            return
        _warned.add(key)
    log.warning("client id %r has a %s quota of %g bytes/s, but it is not enforced: no "
                "coordinator can be asked (%s)", client_id, kind, quota, why or "none is active")


def planned_coordinator(cluster, state, client_id: Optional[str], kind: str) -> Optional[dict]:
    """For a planner: the lease of the coordinator its tasks report to (the state's
    ``coordinator``, small enough to ship with every task, which then need not list the
    metadata log to find it), or None when none is active, said at WARN if the client id has
    a quota."""
    why = _no_coordinator(cluster, state)
    if why:
        warn_unenforced(cluster.url, client_id or DEFAULT_CLIENT_ID, state.client_quotas, kind,
                        why)
        return None
    return dict(state.coordinator)


class Planned:
    """What :class:`QuotaClient` needs of a planner's state: its ``coordinator``."""

    def __init__(self, coordinator: dict):
        self.coordinator = coordinator


class QuotaClient:
    """One client id's throttling against one cluster. ``produced(n)`` after ``n`` bytes were
    written (before the write is reported acknowledged); ``fetched(n)`` after ``n`` bytes were
    read (before the records are handed out). Both block for the throttle time; ``stats`` holds
    what they waited, per kind.

    ``token_file``: the coordinator's token (else ``$KAFKALOG_COORDINATOR_TOKEN``).
    ``planned``: the state a planner read (anything with its ``coordinator``), so that a task
    finds the coordinator it planned with without listing the metadata log; after a failure
    the client looks in the log itself."""

    def __init__(self, cluster, client_id: Optional[str] = None, *,
                 token_file: Optional[str] = None, planned=None,
                 sleep: Callable[[float], None] = time.sleep):
        if client_id is not None and (not isinstance(client_id, str)
                                      or len(client_id) > MAX_CLIENT_ID):
            raise InvalidConfigError(f"a client id is a string of at most {MAX_CLIENT_ID} "
                                     f"characters, got {client_id!r}")
        self.cluster = cluster
        self.client_id = DEFAULT_CLIENT_ID if client_id is None else client_id
        self.token_file = token_file
        self._planned = planned
        self._sleep = sleep
        self.stats: Dict[str, ThrottleStats] = {PRODUCE: ThrottleStats(), FETCH: ThrottleStats()}

    def produced(self, nbytes: int) -> int:
        return self._use(PRODUCE, nbytes)

    def fetched(self, nbytes: int) -> int:
        return self._use(FETCH, nbytes)

    def _use(self, kind: str, nbytes: int) -> int:
        """Report, then wait; the throttle time in ms."""
        if nbytes <= 0:
            return 0
        client, why = CONNECTIONS.get(self.cluster, self.token_file, self._planned)
        if client is None:
            self._unenforced(kind, why)
            return 0
        try:
            answer = client.call("RecordUsage", {"client_id": self.client_id, "kind": kind,
                                                 "bytes": int(nbytes)})
        except _UNAVAILABLE as exc:
            self._planned = None
            CONNECTIONS.lost(self.cluster, self.token_file, client, str(exc))
            self._unenforced(kind, str(exc))
            return 0
        throttle_ms = max(0, int(answer.get("throttle_ms") or 0))
        self.stats[kind].record(throttle_ms, nbytes)
        if throttle_ms:
            log.debug("client id %r over its %s quota: waiting %d ms", self.client_id, kind,
                      throttle_ms)
            self._sleep(throttle_ms / 1000.0)
        return throttle_ms

    def _unenforced(self, kind: str, why: str) -> None:
        if (self.cluster.url, self.client_id) in _warned:
            return
        try:
            quotas = self.cluster.state(refresh=False).client_quotas
        except Exception:      # the warning must never fail a read or a write
            return
        warn_unenforced(self.cluster.url, self.client_id, quotas, kind, why)

    def usage(self) -> Optional[dict]:
        """The coordinator's view of this client id (``ClientUsage``: every process's requests,
        not only this one's), or None without a coordinator."""
        client, _ = CONNECTIONS.get(self.cluster, self.token_file)
        if client is None:
            return None
        try:
            return client.call("ClientUsage", {"client_id": self.client_id})
        except _UNAVAILABLE as exc:
            CONNECTIONS.lost(self.cluster, self.token_file, client, str(exc))
            return None

    def summary(self) -> dict:
        """This process's throttling, with Kafka's client metric names."""
        out = {"client_id": self.client_id}
        for kind, s in self.stats.items():
            if s.requests:
                out.update(s.metrics(kind))
                out[f"{kind}-bytes"] = s.bytes
        return out
