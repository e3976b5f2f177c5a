"""acks for writers (docs/protocol.md §1.3): which acks a reservation carries, and the wait of
an acks=all writer for the ISR to hold its data before it commits.

Why the writer waits and not the commit: a ``commit`` is Kafka's transaction marker, written
only once the data is replicated. The rule itself (what the ISR must hold) is the replay rule in
``isr.acks_all_problem``; this module only polls the log until that rule holds, the ISR fell
below min.insync.replicas, or the time is up.
"""
from __future__ import annotations

import time
from typing import Iterable, List, Optional

from ..errors import (InvalidConfigError, NotEnoughReplicasAfterAppendError,
                      RequestTimedOutError)
from ..cluster.features import REPLICATION
from ..cluster.isr import acks_all_problem
from ..cluster.lease import current_lease

DEFAULT_ACKS = "all"
#: Kafka's producer default
DEFAULT_REQUEST_TIMEOUT_MS = 30_000
#: the wait polls the log from this often, backing off to the max: a copy usually lands within a
#: replication pass (replica.fetch.wait.max.ms, 500), and a poll of a local log costs little
POLL_MS, POLL_MAX_MS = 10, 1_000


def parse_acks(value) -> str:
    """Kafka's producer ``acks``: ``all`` or ``-1``, or ``1``. ``0`` (fire and forget) is
    refused: every write here is acknowledged by its commit."""
    text = DEFAULT_ACKS if value is None else str(value).strip().lower()
    if text in ("all", "-1"):
        return "all"
    if text == "1":
        return "1"
    raise InvalidConfigError(f"acks must be all, -1 or 1, got {value!r}"
                             + (" (acks=0 is not supported: a write here is acknowledged by "
                                "its commit)" if text == "0" else ""))


def reserve_acks(state, acks: str) -> str:
    """What a reservation carries: ``all`` only once the cluster replicates (before that the
    leader is the whole ISR, and the field would be refused)."""
    return "all" if acks == "all" and REPLICATION in state.reader_features else "1"


def problems(state, txns: Iterable[str]) -> List[tuple]:
    """(error name, message) per acks=all range the ISR does not hold yet, by replay's rule."""
    out = []
    for txn in txns:
        info = state.txns.get(txn)
        if info is None or info.get("acks") != "all":
            continue
        for key, (start, end, _epoch) in info["ranges"].items():
            ps = state.partitions.get(key)
            if ps is None or ps.replication is None:
                continue
            topic, _, p = key.rpartition(":")
            bad = acks_all_problem(ps, state.topics[topic]["replicas"][int(p)],
                                   state.topic_config(topic).min_insync_replicas, start, end,
                                   appended=True)
            if bad:
                out.append((bad[0], f"{key}: {bad[1]}"))
    return out


def submit_commit(cluster, actions: list, txns: Iterable[str], timeout_ms: Optional[int] = None):
    """Append ``actions`` (a commit first, then any others) once the ISR holds ``txns``'
    acks=all ranges; ``(seq, state, results)`` as ``Cluster.submit``. A commit refused with
    NOT_ENOUGH_REPLICAS_AFTER_APPEND while the txns are still open means a replica started
    joining between the wait and the commit (it must hold them too): wait again and commit
    again, within the same ``timeout_ms``. The other actions are appended once only."""
    txns = list(txns)
    timeout_ms = DEFAULT_REQUEST_TIMEOUT_MS if timeout_ms is None else timeout_ms
    deadline = time.monotonic() + timeout_ms / 1000
    wait_for_replicas(cluster, txns, timeout_ms)
    seq, state, results = cluster.submit(actions)
    first = list(results)
    while (not results[0].ok and results[0].error == "NOT_ENOUGH_REPLICAS_AFTER_APPEND"
           and time.monotonic() < deadline):
        wait_for_replicas(cluster, txns, max(1, int((deadline - time.monotonic()) * 1000)))
        seq, state, results = cluster.submit(actions[:1])
    return seq, state, [results[0]] + first[1:]


def wait_for_replicas(cluster, txns: Iterable[str],
                      timeout_ms: Optional[int] = None) -> None:
    """Return once every acks=all range of ``txns`` is held by its partition's ISR (and joining
    replicas); raise NotEnoughReplicasAfterAppendError once an ISR is below its
    min.insync.replicas, RequestTimedOutError after ``timeout_ms``. The caller then aborts."""
    txns = list(txns)
    timeout_ms = DEFAULT_REQUEST_TIMEOUT_MS if timeout_ms is None else timeout_ms
    deadline = time.monotonic() + timeout_ms / 1000
    backoff = POLL_MS / 1000
    # the writer's own entries are in the state it holds: without followers to wait for, the
    # wait costs no request at all; otherwise the log is read before anything is judged
    state, fresh = cluster.state(refresh=False), False
    while True:
        found = problems(state, txns)
        if not found:
            return
        if not fresh:
            state, fresh = cluster.state(), True
            continue
        small = [m for name, m in found if "smaller than min.insync.replicas" in m]
        if small:
            raise NotEnoughReplicasAfterAppendError(
                f"acks=all: {small[0]}; the write was aborted, nothing of it is visible")
        if time.monotonic() >= deadline:
            lease = current_lease(state)
            active = (lease is not None and lease.holder
                      and cluster.now_ms() < lease.expires_ms)
            raise RequestTimedOutError(
                f"acks=all: the ISR did not hold the write within request.timeout.ms "
                f"({timeout_ms} ms): {found[0][1]}"
                + ("" if active else "; no coordinator is active, so nothing copies to "
                   "followers (start one: kafkalog --cluster URL coordinator)")
                + "; the write was aborted, nothing of it is visible")
        time.sleep(min(backoff, max(0.0, deadline - time.monotonic())))
        backoff = min(backoff * 2, POLL_MAX_MS / 1000)
        state = cluster.state()
