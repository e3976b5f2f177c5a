"""Spark tasks' KIP-13 throttling: the client id's quota holds across every task of every job
that uses it, so each task reports its bytes to the coordinator (``coordinator.quota_client``)
and waits what it answers. A Python worker runs many tasks one after another, so the cluster a
task opens for this, and its connection to the coordinator, are kept per process.
"""
from __future__ import annotations

import logging
import threading
from typing import Dict, Mapping, Optional, Tuple

from ..cluster.cluster import Cluster
from ..coordinator.quota_client import Planned, QuotaClient, planned_coordinator

log = logging.getLogger(__name__)

_clusters: Dict[Tuple[str, Tuple[Tuple[str, str], ...]], Cluster] = {}
_lock = threading.Lock()


def task_quota(path: str, storage_options: Mapping[str, str], client_id: Optional[str],
               token_file: Optional[str], cluster: Optional[Cluster] = None,
               coordinator: Optional[dict] = None) -> QuotaClient:
    """A task's throttling for ``client_id`` (None: the default, KIP-13's empty client id).
    ``coordinator``: the lease its planner saw (``ReadSplit.coordinator``)."""
    if cluster is None:
        key = (path, tuple(sorted(storage_options.items())))
        with _lock:
            cluster = _clusters.get(key)
            if cluster is None:
                cluster = _clusters[key] = Cluster(path, create=False, **dict(storage_options))
    return QuotaClient(cluster, client_id, token_file=token_file,
                       planned=Planned(coordinator) if coordinator else None)


def log_throttled(quota: QuotaClient, what: str) -> None:
    """A line in the executor's log when the task waited for its quota."""
    for kind, s in quota.stats.items():
        if s.throttled:
            log.info("%s: client id %r waited %d ms in %d of %d %s requests for its quota "
                     "(max %d ms)", what, quota.client_id, s.total_ms, s.throttled, s.requests,
                     kind, s.max_ms)


def plan_coordinator(splits, cluster, state, client_id: Optional[str]) -> None:
    """On the planner: stamp every split with the coordinator its tasks report their fetches
    to (a task then finds it without listing the metadata log), or say at WARN that the client
    id's quota cannot be enforced."""
    from ..cluster.quotas import FETCH
    lease = planned_coordinator(cluster, state, client_id, FETCH)
    for s in splits:
        s.coordinator = lease
