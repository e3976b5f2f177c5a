"""The active coordinator's replica fetcher: it copies committed segments from each replicated
partition's leader to its followers and keeps the ISR (docs/protocol.md §1.3).

Kafka's followers fetch from the leader and the leader decides the ISR. Here storage roots do
not run code, so one process does both jobs for every follower: it copies, says what it copied
in one ``replica_progress`` per pass (a copy counts only from then on), and moves followers in
and out of the ISR with ``alter_isr``, under its coordinator epoch so that nothing a deposed
coordinator appends takes effect. Every decision is made from a replayed state, so a pass that
dies at any instant leaves nothing the next pass (or the next coordinator) cannot redo.

What it remembers between passes, in memory only, is Kafka's "last caught-up time" per
follower; a new coordinator starts the clocks of the ISR and joining members at its takeover,
as a new Kafka leader does, so a takeover shrinks nothing at once.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

from ..cluster import actions as A
from ..cluster.features import REPLICATION
from ..cluster.isr import replica_end
from ..cluster.partition_state import tp_key
from ..errors import FencedCoordinatorError, KafkaLogError
from ..format import checkpoint as ckpt
from ..log.logdir import META_PROPERTIES
from ..log.partition import LEADER_EPOCH_FILE
from ..log.segment import LOG_SUFFIX
from .copier import copy_partition_metadata, copy_segment

log = logging.getLogger(__name__)

DEFAULT_REPLICA_LAG_TIME_MAX_MS = 30_000

TP = Tuple[str, int]


@dataclass
class PassResult:
    """What one pass did: for the service's metrics and for tests."""
    segments: int = 0
    bytes: int = 0
    by_mode: Dict[str, int] = field(default_factory=dict)
    progress: Dict[str, Dict[str, List[List[int]]]] = field(default_factory=dict)
    isr_changes: Dict[str, dict] = field(default_factory=dict)
    failures: Dict[str, str] = field(default_factory=dict)   # "tp log dir" -> why

    @property
    def kind(self) -> str:
        return "replication"

    @property
    def ok(self) -> bool:
        return not self.failures


class Replicator:
    """One per coordinator process; :meth:`tick` runs a pass while the process holds the lease
    (``epoch()`` gives its epoch, None when it does not act)."""

    def __init__(self, cluster, epoch: Callable[[], Optional[int]], *,
                 replica_lag_time_max_ms: int = DEFAULT_REPLICA_LAG_TIME_MAX_MS,
                 enable: bool = True, clock_ms: Optional[Callable[[], int]] = None):
        self.cluster = cluster
        self.epoch = epoch
        self.replica_lag_time_max_ms = replica_lag_time_max_ms
        self.enable = enable
        self.clock_ms = clock_ms or cluster.now_ms
        self._caught_up: Dict[Tuple[str, str], int] = {}   # (tp key, log dir) -> ms
        self._clock_epoch: Optional[int] = None
        #: the last pass's result, for status and tests
        self.last: Optional[PassResult] = None

    def tick(self, now_s: float = 0.0) -> Optional[PassResult]:
        epoch = self.epoch()
        if epoch is None:
            return None
        state = self.cluster.state()
        if REPLICATION not in state.reader_features:
            if not self.enable or not _has_replicated_topic(state):
                return None
            log.info("replication: enabling the feature %s (a topic has more than one "
                     "replica)", REPLICATION)
            self.cluster.enable_feature(REPLICATION)
            state = self.cluster.state()
        self.last = self.run_pass(epoch, state)
        return self.last

    # -- one pass -----------------------------------------------------------------------------

    def run_pass(self, epoch: int, state) -> PassResult:
        """Copy what followers lack, record it, then decide the ISR. ``state`` must be replayed
        *before* the leaders are listed: every segment of a range committed in it was written
        before its commit, hence is in the listing."""
        now = self.clock_ms()
        if self._clock_epoch != epoch:
            self._start_clocks(state, now)
            self._clock_epoch = epoch
        result = PassResult()
        offline = self._offline_log_dirs(state)
        lso_seen: Dict[str, int] = {}
        topic_ids: Dict[str, str] = {}
        for topic, info in state.topics.items():
            for p, replicas in enumerate(info["replicas"]):
                key = tp_key(topic, p)
                ps = state.partitions.get(key)
                if ps is None or ps.replication is None:
                    continue
                lso_seen[key] = ps.last_stable_offset
                behind = [r for r in replicas[1:] if r not in offline
                          and replica_end(ps, r, replicas[0]) < ps.last_stable_offset]
                if behind:
                    topic_ids[topic] = info["topic_id"]
                    self._copy_partition(state, topic, p, replicas[0], behind, result)
        after = state
        if result.progress:
            after = self._submit(A.ReplicaProgress(coordinator_epoch=epoch, topic_ids=topic_ids,
                                                   partitions=result.progress), result)
            self._write_derived(after, result.progress)
        for key, lso in lso_seen.items():
            ps = after.partitions.get(key)
            if ps is None or ps.replication is None:
                continue
            topic, p = key.rsplit(":", 1)
            replicas = after.topics[topic]["replicas"][int(p)]
            for r in replicas[1:]:
                if r not in offline and f"{key} {r}" not in result.failures \
                        and replica_end(ps, r, replicas[0]) >= lso:
                    self._caught_up[(key, r)] = now
        self._decide_isr(epoch, after, now, result)
        return result

    def _offline_log_dirs(self, state) -> set:
        """Follower log dirs that cannot be read now (a root renamed, unmounted, a bucket
        gone): one request per log dir per pass. Their followers are not caught up, so they
        leave the ISR after ``replica.lag.time.max.ms``, as a dead Kafka broker's do."""
        dirs = {r for info in state.topics.values() for reps in info["replicas"]
                for r in reps[1:]}
        offline = set()
        for r in sorted(dirs):
            try:
                if not self.cluster.storage.exists(f"{r}/{META_PROPERTIES}"):
                    offline.add(r)
            except (KafkaLogError, OSError):
                offline.add(r)
        if offline:
            log.warning("replication: log dir(s) %s cannot be read", ", ".join(sorted(offline)))
        return offline

    def _start_clocks(self, state, now: int) -> None:
        self._caught_up = {}
        for key, ps in state.partitions.items():
            if ps.replication is not None:
                for r in ps.replication["isr"][1:] + ps.replication["joining"]:
                    self._caught_up[(key, r)] = now

    def _copy_partition(self, state, topic: str, p: int, leader: str, behind: List[str],
                        result: PassResult) -> None:
        key = tp_key(topic, p)
        ps = state.partitions[key]
        storage = self.cluster.storage
        src_dir = self.cluster.partition_dir(topic, p, leader, state)
        try:
            bases = sorted(int(f.name[:-len(LOG_SUFFIX)]) for f in storage.list(src_dir)
                           if f.name.endswith(LOG_SUFFIX) and f.name[:-len(LOG_SUFFIX)].isdigit())
        except KafkaLogError as exc:
            for r in behind:
                result.failures[f"{key} {r}"] = f"listing the leader {leader}: {exc}"
            return
        lo = ps.log_start_offset
        for r in behind:
            held = ps.replication["held"].get(r, [])
            dst_dir = self.cluster.partition_dir(topic, p, r, state)
            copied: List[List[int]] = []
            try:
                metadata_done = False
                for i, base in enumerate(bases):
                    nxt = bases[i + 1] if i + 1 < len(bases) else None
                    span = _segment_span(ps.committed, base, nxt, lo)
                    if span is None or _held(held, span[0]):
                        continue
                    if not metadata_done:
                        copy_partition_metadata(storage, src_dir, storage, dst_dir)
                        metadata_done = True
                    copy = copy_segment(storage, src_dir, storage, dst_dir, base,
                                        end_offset=span[1])
                    copied.append(list(span))
                    result.segments += 1
                    result.bytes += copy.bytes
                    result.by_mode[copy.mode] = result.by_mode.get(copy.mode, 0) + 1
            except KafkaLogError as exc:
                result.failures[f"{key} {r}"] = str(exc)
                log.warning("replication: copying %s to %s stopped: %s", key, r, exc)
            if copied:
                result.progress.setdefault(key, {})[r] = copied

    def _submit(self, action, result: PassResult):
        _, after, results = self.cluster.submit([action])
        res = results[0]
        if res.error == "STALE_CONTROLLER_EPOCH":
            raise FencedCoordinatorError(res.message)
        if not res.ok:
            result.failures[action.OP] = f"{res.error}: {res.message}"
        for key, r in getattr(res, "partitions", {}).items():
            if not r.ok:
                result.failures[f"{key} {action.OP}"] = f"{r.error}: {r.message}"
                log.warning("replication: %s for %s refused: %s %s", action.OP, key, r.error,
                            r.message)
        return after

    def _decide_isr(self, epoch: int, state, now: int, result: PassResult) -> None:
        changes: Dict[str, dict] = {}
        topic_ids: Dict[str, str] = {}
        lag = self.replica_lag_time_max_ms
        for topic, info in state.topics.items():
            for p, replicas in enumerate(info["replicas"]):
                key = tp_key(topic, p)
                ps = state.partitions.get(key)
                if ps is None or ps.replication is None:
                    continue
                rep = ps.replication
                isr, joining = list(rep["isr"]), list(rep["joining"])
                for r in replicas[1:]:
                    fresh = now - self._caught_up.get((key, r), -(1 << 62)) <= lag
                    if r in isr or r in joining:
                        if not fresh:
                            (isr if r in isr else joining).remove(r)
                    elif fresh:
                        joining.append(r)
                for r in list(joining):
                    if r in rep["joining"] and replica_end(ps, r, replicas[0]) >= \
                            rep["high_watermark"]:
                        joining.remove(r)
                        isr.append(r)
                if isr != rep["isr"] or joining != rep["joining"]:
                    order = {r: i for i, r in enumerate(replicas)}
                    changes[key] = {"partition_epoch": rep["partition_epoch"],
                                    "isr": sorted(isr, key=order.get),
                                    "joining": sorted(joining, key=order.get)}
                    topic_ids[topic] = info["topic_id"]
        if changes:
            self._submit(A.AlterIsr(coordinator_epoch=epoch, topic_ids=topic_ids,
                                    partitions=changes), result)
            result.isr_changes = changes
            log.info("replication: ISR changes %s", changes)

    def _write_derived(self, state, progress: Dict[str, Dict[str, List[List[int]]]]) -> None:
        """Each follower's ``leader-epoch-checkpoint`` for what it holds (§8), so Kafka reading
        that replica sees a consistent prefix of the leader's log."""
        files = {}
        for key, by_dir in progress.items():
            ps = state.partitions.get(key)
            if ps is None or ps.replication is None:
                continue
            topic, p = key.rsplit(":", 1)
            replicas = state.topics[topic]["replicas"][int(p)]
            for r in by_dir:
                end = min(ps.high_watermark, replica_end(ps, r, replicas[0]))
                entries = []
                for s, _e, epoch in ps.visible_ranges():
                    if s < end and (not entries or epoch > entries[-1][0]):
                        entries.append((epoch, s))
                path = f"{self.cluster.partition_dir(topic, int(p), r, state)}/{LEADER_EPOCH_FILE}"
                files[path] = ckpt.format_leader_epoch_checkpoint(entries).encode()
        try:
            self.cluster.storage.replace_many(files)
        except KafkaLogError as exc:   # derived files: the next pass writes them again
            log.warning("replication: follower checkpoints not written: %s", exc)


def _has_replicated_topic(state) -> bool:
    return any(len(r) > 1 for info in state.topics.values() for r in info["replicas"])


def _segment_span(committed: List[list], base: int, nxt: Optional[int],
                  log_start: int) -> Optional[Tuple[int, int]]:
    """The offsets a follower holds once it has the leader's segment at ``base``: from the base
    (or the log start offset) to the next segment's base, within the committed range the
    segment belongs to (segments never span reservations). None when the segment is not
    committed data at or above the log start offset (open, aborted, or deleted)."""
    for s, e, _epoch in committed:
        if s <= base < e:
            lo, hi = max(base, log_start), e if nxt is None else min(e, nxt)
            return (lo, hi) if lo < hi else None
        if s > base:
            break
    return None


def _held(held: List[List[int]], offset: int) -> bool:
    return any(s <= offset < e for s, e in held)
