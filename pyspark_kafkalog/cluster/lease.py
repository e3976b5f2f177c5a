"""The coordinator's lease (docs/protocol.md §11): at most one coordinator acts at a time.

The lease is state in the metadata log, not a lock file beside it. Acquiring is appending an
``acquire`` for the next epoch; the log's order decides a race, since replay accepts only the
first valid acquire of an epoch and answers every other NOT_COORDINATOR. Every action a
coordinator issues carries its epoch, and replay rejects one whose epoch is no longer the
current one (STALE_CONTROLLER_EPOCH). So a deposed coordinator cannot act, whatever its clock
says or however long it was paused. Clocks only decide *when* a standby may take over.
"""
from __future__ import annotations

import dataclasses
import os
import socket
import uuid
from dataclasses import dataclass
from typing import Optional

from ..errors import (CoordinatorLeaseHeldError, FencedCoordinatorError, InvalidRequestError,
                      error_for)
from . import actions as A
from .features import COORDINATOR_LEASE


@dataclass(frozen=True)
class CoordinatorLease:
    epoch: int          # coordinator epoch, starts at 1, +1 on every takeover
    holder: str         # unique id of the holding process ("" once released)
    address: str        # "host:port" of its RPC endpoint ("" when it serves none)
    lease_ms: int       # how long the lease lasts after its last renewal
    renewed_ms: int     # the renewal's timestamp (the writer's clock, ms since the epoch)

    @property
    def expires_ms(self) -> int:
        return self.renewed_ms + self.lease_ms


def new_holder_id() -> str:
    """Unique per process *and* per start: a restarted coordinator must not pass for the one
    that died (it would renew a lease it does not know the state of)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def current_lease(state) -> Optional[CoordinatorLease]:
    """The lease in a replayed ClusterState; None when no coordinator has ever held one. A
    released lease keeps its epoch (the next acquire takes the one after it), with holder and
    address "" and lease_ms 0."""
    c = state.coordinator
    if c is None:
        return None
    return CoordinatorLease(epoch=c["epoch"], holder=c["holder"], address=c["address"],
                            lease_ms=c["lease_ms"], renewed_ms=c["renewed_ms"])


def acquire(cluster, holder: str, address: str, lease_ms: int) -> CoordinatorLease:
    """Take the lease with a new epoch: when there is none, it was released, it has expired
    by our clock (``cluster.now_ms()``), or it is already ours (a new epoch then too, which
    fences our own older lease object). Raises CoordinatorLeaseHeldError naming the holder,
    address and expiry when another's lease is live, or another process won this epoch.

    The first acquire on a cluster enables ``coordinatorLease`` in its own entry before its
    ``coordinator_lease`` (§2.3): from then on older clients refuse to read the cluster."""
    if not holder:
        raise InvalidRequestError("a coordinator lease needs a non-empty holder id")
    if lease_ms <= 0:
        raise InvalidRequestError(f"lease_ms must be positive, got {lease_ms}")
    state = cluster.state()
    if COORDINATOR_LEASE not in state.reader_features:
        cluster.enable_feature(COORDINATOR_LEASE)   # a concurrent enabler's entry is harmless
        state = cluster.state()
    current = current_lease(state)
    now = cluster.now_ms()
    if current is not None and current.holder and current.holder != holder \
            and now < current.expires_ms:
        raise _held(current, now)
    lease = CoordinatorLease(epoch=(current.epoch if current else 0) + 1, holder=holder,
                             address=address, lease_ms=lease_ms, renewed_ms=now)
    _, after, results = cluster.submit([_action("acquire", lease)])
    result = results[0]
    if result.ok:
        return lease
    if result.error == "NOT_COORDINATOR":   # lost the race for this epoch, or it was renewed
        raise _held(current_lease(after), now, result.message)
    raise error_for(result.error, result.message)


def renew(cluster, lease: CoordinatorLease) -> CoordinatorLease:
    """Extend the lease from now (our clock). Raises FencedCoordinatorError when the epoch is
    no longer ours (another took over, or we released it): the caller must stop acting at once,
    since nothing it writes under that epoch takes effect. A renewal after expiry that nobody
    took over in the meantime still succeeds: fencing is by epoch, not by time."""
    current = current_lease(cluster.state())
    if not _is_ours(current, lease):
        raise _fenced(lease, current)      # known deposed: no entry that replay would refuse
    renewed = dataclasses.replace(lease, renewed_ms=cluster.now_ms())
    _, after, results = cluster.submit([_action("renew", renewed)])
    result = results[0]
    if result.ok:
        return renewed
    if result.error == "STALE_CONTROLLER_EPOCH":   # taken over between our look and our entry
        raise _fenced(lease, current_lease(after), result.message)
    raise error_for(result.error, result.message)


def release(cluster, lease: CoordinatorLease) -> None:
    """Give the lease up on a clean shutdown, so a standby takes over at once instead of after
    ``lease_ms``. Quiet when the lease is no longer ours: there is nothing left to give up."""
    if not _is_ours(current_lease(cluster.state()), lease):
        return
    gone = dataclasses.replace(lease, lease_ms=0, renewed_ms=cluster.now_ms())
    _, _, results = cluster.submit([_action("release", gone)])
    result = results[0]
    if not result.ok and result.error != "STALE_CONTROLLER_EPOCH":
        raise error_for(result.error, result.message)


# -- helpers ------------------------------------------------------------------------------------

def _action(op: str, lease: CoordinatorLease) -> A.CoordinatorLeaseChange:
    return A.CoordinatorLeaseChange(lease_op=op, epoch=lease.epoch, holder=lease.holder,
                                    address=lease.address, lease_ms=lease.lease_ms,
                                    renewed_ms=lease.renewed_ms)


def _is_ours(current: Optional[CoordinatorLease], lease: CoordinatorLease) -> bool:
    return (current is not None and bool(current.holder) and current.holder == lease.holder
            and current.epoch == lease.epoch)


def _held(current: Optional[CoordinatorLease], now: int,
          detail: str = "") -> CoordinatorLeaseHeldError:
    if current is None or not current.holder:
        return CoordinatorLeaseHeldError(
            f"another process took the coordinator lease first ({detail or 'no detail'})",
            epoch=current.epoch if current else None)
    return CoordinatorLeaseHeldError(
        f"the coordinator lease (epoch {current.epoch}) is held by {current.holder} at "
        f"{current.address or 'no address'} until {current.expires_ms} "
        f"({current.expires_ms - now} ms from now by this process's clock)",
        holder=current.holder, address=current.address, epoch=current.epoch,
        expires_ms=current.expires_ms)


def _fenced(lease: CoordinatorLease, current: Optional[CoordinatorLease],
            detail: str = "") -> FencedCoordinatorError:
    if current is None:
        now_held = "no coordinator holds the lease"
    elif not current.holder:
        now_held = f"epoch {current.epoch} was released"
    else:
        now_held = f"epoch {current.epoch} is held by {current.holder}"
    return FencedCoordinatorError(
        f"coordinator {lease.holder} is fenced: its epoch {lease.epoch} is stale ({now_held}); "
        "it must stop acting" + (f" [{detail}]" if detail else ""),
        epoch=lease.epoch, current_epoch=current.epoch if current else None,
        holder=current.holder if current else None)
