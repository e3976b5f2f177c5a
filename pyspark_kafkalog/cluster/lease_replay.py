"""Replay of the coordinator's lease and the fencing of coordinator actions (docs/protocol.md §11;
feature ``coordinatorLease``). A part of :class:`state.ClusterState` kept in a module of its
own because it is one concept; acquiring and renewing are ``lease.py``'s.
"""
from __future__ import annotations

from typing import Optional

from . import actions as A
from .features import COORDINATOR_LEASE


class LeaseReplay:
    """Mixed into ``ClusterState``: uses its features and keeps ``coordinator`` (the current
    lease: epoch, holder, address, lease_ms, renewed_ms; None before the first acquire)."""

    def _fenced(self, action: A.Action) -> Optional[A.Result]:
        """The fencing rule (§11): an action carrying ``coordinator_epoch`` applies only under
        the current, unreleased epoch, so a deposed coordinator's actions never take effect,
        however late they land. Checked here, once, so an action that gains the field gains the
        rule without handler code."""
        epoch = getattr(action, "coordinator_epoch", None)
        return None if epoch is None else self._stale(epoch, None)

    def _stale(self, epoch: int, holder: Optional[str]) -> Optional[A.Result]:
        cur = self.coordinator
        if cur is None:
            why = "no coordinator has held the lease yet"
        elif not cur["holder"]:
            why = f"the current epoch {cur['epoch']} was released"
        elif epoch != cur["epoch"] or (holder is not None and holder != cur["holder"]):
            why = f"the current epoch is {cur['epoch']}, held by {cur['holder']}"
        else:
            return None
        return A.error("STALE_CONTROLLER_EPOCH", f"coordinator epoch {epoch} of "
                       f"{holder or 'its sender'} is fenced: {why}")

    def _coordinator_lease(self, a: A.CoordinatorLeaseChange, ts: int) -> A.Result:
        """The coordinator's lease (§11). Whether the current lease has expired is judged by the
        acquirer's clock as written in its action (``renewed_ms``), never by the replaying
        process's: replay stays a function of the log, and the log's order decides a race."""
        if COORDINATOR_LEASE not in self.reader_features:
            return A.error("INVALID_REQUEST", f"coordinator_lease needs the feature "
                           f"{COORDINATOR_LEASE}, which this cluster has not enabled")
        if a.lease_op not in A.LEASE_OPS:
            return A.error("INVALID_REQUEST", f"lease_op {a.lease_op!r:.40} is not one of "
                           f"{', '.join(A.LEASE_OPS)}")
        if a.epoch < 1 or not a.holder:
            return A.error("INVALID_REQUEST", "a lease needs an epoch >= 1 and a holder")
        if a.lease_op != "release" and a.lease_ms <= 0:
            return A.error("INVALID_REQUEST", f"lease_ms {a.lease_ms} is not positive")
        cur = self.coordinator
        if a.lease_op == "acquire":
            current = cur["epoch"] if cur else 0
            if a.epoch > current + 1:
                return A.error("INVALID_REQUEST", f"epoch {a.epoch} skips epochs: the current "
                               f"one is {current}")
            live = (cur is not None and cur["holder"] and cur["holder"] != a.holder
                    and a.renewed_ms < cur["renewed_ms"] + cur["lease_ms"])
            if a.epoch <= current or live:
                until = cur["renewed_ms"] + cur["lease_ms"]
                held = (f"{cur['holder']} (at {cur['address'] or 'no address'}) holds "
                        f"coordinator epoch {cur['epoch']} until {until}"
                        if cur["holder"] else f"coordinator epoch {cur['epoch']} was released")
                return A.error("NOT_COORDINATOR", f"epoch {a.epoch} is taken: {held}"
                               if a.epoch <= current else
                               f"{held}, and this acquire's time is {a.renewed_ms}")
            self.coordinator = {"epoch": a.epoch, "holder": a.holder, "address": a.address,
                                "lease_ms": a.lease_ms, "renewed_ms": a.renewed_ms}
            return A.Result()
        stale = self._stale(a.epoch, a.holder)
        if stale is not None:
            return stale
        if a.lease_op == "renew":
            self.coordinator = dict(cur, address=a.address, lease_ms=a.lease_ms,
                                    renewed_ms=a.renewed_ms)
        else:   # released: the epoch stays (the next acquire takes the one after it)
            self.coordinator = {"epoch": cur["epoch"], "holder": "", "address": "",
                                "lease_ms": 0, "renewed_ms": a.renewed_ms}
        return A.Result()
