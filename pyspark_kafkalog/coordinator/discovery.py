"""Finding the coordinator: the metadata log names it.

Why not a configured address: the active coordinator changes (failover, a restart on another
host or port), and every client already reads the metadata log. Its lease gives the address and
the epoch; a lease that lapsed means no coordinator is active, whatever still listens there.
"""
from __future__ import annotations

import time
from typing import Optional

from ..cluster.cluster import Cluster
from ..cluster.lease import current_lease
from ..errors import CoordinatorNotAvailableError
from .auth import resolve_token
from .rpc import DEFAULT_TIMEOUT_S, CoordinatorClient


def _utc(ms: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ms / 1000))


def describe(lease, now_ms: int) -> str:
    left = (lease.expires_ms - now_ms) / 1000
    when = _utc(lease.expires_ms)
    timing = f"expires in {left:.1f} s" if left > 0 else f"expired {-left:.1f} s ago"
    return (f"epoch {lease.epoch} held by {lease.holder} at {lease.address or '(no address)'}, "
            f"lease {timing} ({when})")


def live_lease(cluster, state=None):
    """The lease of the active coordinator; :class:`CoordinatorNotAvailableError` when there
    is none (never held, released, lapsed by this process's clock, or serving no address).
    ``state``: a replayed state the caller holds (a fresh one saves listing the metadata log)."""
    lease = current_lease(state if state is not None else cluster.state())
    if lease is None:
        raise CoordinatorNotAvailableError(
            f"no coordinator has ever run for the cluster at {cluster.url}; start one with: "
            f"kafkalog --cluster {cluster.url} coordinator")
    now = cluster.now_ms()
    if not lease.holder:
        raise CoordinatorNotAvailableError(
            f"no coordinator is active: epoch {lease.epoch} was released at "
            f"{_utc(lease.renewed_ms)}")
    if now >= lease.expires_ms:
        raise CoordinatorNotAvailableError(f"no coordinator is active: the last one's "
                                           f"{describe(lease, now)}")
    if not lease.address:
        raise CoordinatorNotAvailableError(f"the active coordinator serves no RPC: "
                                           f"{describe(lease, now)}")
    return lease


def connect(cluster, token: Optional[str] = None, *, token_file: Optional[str] = None,
            timeout_s: float = DEFAULT_TIMEOUT_S, state=None) -> CoordinatorClient:
    """A client of the active coordinator of ``cluster`` (a :class:`Cluster` or its URL),
    checked to answer as the lease's holder. ``token``: as for the coordinator (else
    ``token_file``, else ``$KAFKALOG_COORDINATOR_TOKEN``). ``state``: as for
    :func:`live_lease`."""
    token = resolve_token(token, token_file)
    if not isinstance(cluster, Cluster):
        cluster = Cluster(cluster, create=False)
    lease = live_lease(cluster, state)
    client = CoordinatorClient(lease.address, token, timeout_s=timeout_s, lease=lease)
    try:
        pong = client.ping()
        if (pong.get("holder"), pong.get("epoch"), pong.get("active")) != \
                (lease.holder, lease.epoch, True):
            raise CoordinatorNotAvailableError(
                f"{lease.address} is not the active coordinator the metadata log names "
                f"({describe(lease, cluster.now_ms())}); it answers as {pong.get('holder')}, "
                f"epoch {pong.get('epoch')}, {'active' if pong.get('active') else 'not active'}")
    except BaseException:
        client.close()
        raise
    return client
