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

Kafka's followers fetch through privileged fetch sessions (KIP-227), which outrank every
consumer's in the leader's session cache. This fetcher holds one in the coordinator's cache
over the replicated partitions, used once a pass so that it is never idle: the cache's slots,
eviction order and metrics then count replication as Kafka's do. Each pass still decides from
its own replayed state, so nothing here depends on what the session answers.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

from ..cluster import actions as A
from ..cluster.features import REPLICA_CHECK, REPLICATION
from ..cluster.isr import replica_end
from ..cluster.partition_state import tp_key
from ..errors import FencedCoordinatorError, KafkaLogError, StorageNotFoundError
from ..cluster.checkpoints import epoch_file, sync_checkpoints, write_log_dir_files
from ..log.logdir import META_PROPERTIES
from ..log.partition import PartitionLog
from ..format.checkpoint import parse_meta_properties
from ..log.file_names import log_file_base, parse_segment_file
from ..log.segment import LOG_SUFFIX, segment_name
from .copier import check_fetchers, copy_partition_metadata, copy_segments
from .fetch_session import FetchSessionClient
from .replica_check import ReplicaCheck, describe, lacking

log = logging.getLogger(__name__)

DEFAULT_REPLICA_LAG_TIME_MAX_MS = 30_000
DEFAULT_BROKER_SESSION_TIMEOUT_MS = 9_000
#: how often an in-sync follower's files are checked against ``held`` (§1.3, "Verification")
DEFAULT_REPLICA_VERIFY_INTERVAL_MS = 1_000
DEFAULT_NUM_REPLICA_FETCHERS = 4

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
    elections: Dict[str, int] = field(default_factory=dict)  # kind -> partitions
    #: (tp key, log dir) -> [(segment base, .log bytes)] copied in this pass
    copied: Dict[Tuple[str, str], List[Tuple[int, int]]] = field(default_factory=dict)
    truncated_files: int = 0
    reassigned: List[str] = field(default_factory=list)      # reassignments completed
    isr_shrinks: int = 0
    isr_expands: int = 0
    #: tp key -> {log dir: ranges} that ``held`` named and the follower's files did not hold
    lost: Dict[str, Dict[str, List[List[int]]]] = field(default_factory=dict)

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
                 broker_session_timeout_ms: int = DEFAULT_BROKER_SESSION_TIMEOUT_MS,
                 enable: bool = True, clock_ms: Optional[Callable[[], int]] = None,
                 num_replica_fetchers: int = DEFAULT_NUM_REPLICA_FETCHERS,
                 fetch_session: Optional[FetchSessionClient] = None,
                 replica_verify_interval_ms: int = DEFAULT_REPLICA_VERIFY_INTERVAL_MS):
        """``fetch_session``: the privileged ``FetchSessionClient`` to hold (None: none)."""
        self.cluster = cluster
        self.fetch_session = fetch_session
        #: segments of one follower copied at once (Kafka's ``num.replica.fetchers``)
        self.num_replica_fetchers = check_fetchers(num_replica_fetchers)
        self.check = ReplicaCheck(cluster.storage)
        self.replica_verify_interval_ms = replica_verify_interval_ms
        self._verified_at: Dict[Tuple[str, str], int] = {}   # (tp key, log dir) -> ms
        self.epoch = epoch
        self.replica_lag_time_max_ms = replica_lag_time_max_ms
        self.broker_session_timeout_ms = broker_session_timeout_ms
        self._failing_since: Dict[str, int] = {}   # log dir -> first failed probe, ms
        self._offline: set = set()
        self._stuck: set = set()                   # partitions without an eligible leader
        #: (tp key, log dir) -> what its derived files last said (end, log start, epochs)
        self._written: Dict[Tuple[str, str], tuple] = {}
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
        if self.fetch_session is not None:
            self._hold_session(state)
        self.last = self.run_pass(epoch, state)
        return self.last

    def _hold_session(self, state) -> None:
        """Use the fetch session over the replicated partitions (or give its slot back when
        there are none). A failure here costs the session, never the pass."""
        tps = [(topic, p) for topic, _, p, _, _, _ in _replicated(state)]
        try:
            if tps:
                self.fetch_session.fetch(tps)
            else:
                self.fetch_session.close()
        except KafkaLogError as exc:
            log.warning("replication: its fetch session failed: %s", exc)

    # -- one pass -----------------------------------------------------------------------------

    def run_pass(self, epoch: int, state) -> PassResult:
        """Elect where a leader's log dir is offline, copy what followers lack, record it,
        then decide the ISR. ``state`` must be replayed *before* the leaders are listed: every
        segment of a range committed in it was written before its commit, hence is listed."""
        now = self.clock_ms()
        if self._clock_epoch != epoch:
            self._start_clocks(state, now)
            self._clock_epoch = epoch
        result = PassResult()
        offline = self._probe(state, now)
        state = self._verify(epoch, state, now, offline, result)
        state = self._elect(epoch, state, offline, result)
        lso_seen: Dict[str, int] = {}
        topic_ids: Dict[str, str] = {}
        for topic, info, p, replicas, key, ps in _replicated(state):
            lso_seen[key] = ps.last_stable_offset
            leader = ps.replication["leader"]
            if leader in offline:
                continue
            urgent = _open_acks_all(state, key)
            members = ps.replication["isr"] + ps.replication["joining"]
            behind = [r for r in replicas if r != leader and r not in offline
                      and (replica_end(ps, r) < ps.last_stable_offset
                           or (urgent and r in members))]
            if behind:
                topic_ids[topic] = info["topic_id"]
                self._copy_partition(state, topic, p, leader, behind, urgent, result)
        after = state
        if result.progress:
            self._confirm(state, result)
        if result.progress:
            after = self._submit(A.ReplicaProgress(coordinator_epoch=epoch, topic_ids=topic_ids,
                                                   partitions=result.progress), result)
        for key, lso in lso_seen.items():
            ps = after.partitions.get(key)
            if ps is None or ps.replication is None:
                continue
            topic, p = key.rsplit(":", 1)
            for r in after.topics[topic]["replicas"][int(p)]:
                if r != ps.replication["leader"] and r not in offline \
                        and f"{key} {r}" not in result.failures and replica_end(ps, r) >= lso:
                    self._caught_up[(key, r)] = now
        after = self._decide_isr(epoch, after, now, offline, result)
        after = self._reassign(epoch, after, result)
        self._write_derived(after, offline)
        return result

    def _verify(self, epoch: int, state, now: int, unreadable: set, result: PassResult):
        """Check what ``held`` says each readable follower holds against its files (§1.3,
        "Verification"): an ISR or joining member every ``replica.verify.interval.ms``, and
        every pass a follower outside them (before it may join) and every follower of a
        partition whose leader is offline (before an election may pick it). What is found
        missing goes into one ``replica_lost``: it leaves ``held``, the follower leaves the ISR,
        and this pass copies it again."""
        lost: Dict[str, Dict[str, List[List[int]]]] = {}
        topic_ids: Dict[str, str] = {}
        followed = []
        was_in_isr = 0
        for topic, info, p, replicas, key, ps in _replicated(state):
            rep = ps.replication
            leaderless = rep["leader"] in self._offline
            members = rep["isr"] + rep["joining"]
            for r, held in rep["held"].items():
                if r == rep["leader"] or r in unreadable or not held:
                    continue
                d = self.cluster.partition_dir(topic, p, r, state)
                followed.append(d)
                due = now - self._verified_at.get((key, r), -(1 << 62)) \
                    >= self.replica_verify_interval_ms
                if not (due or leaderless or r not in members):
                    continue
                try:
                    coverage = self.check.coverage(d, info["topic_id"])
                except KafkaLogError as exc:    # not listed: nothing is concluded
                    result.failures[f"{key} {r}"] = f"checking its files: {exc}"
                    continue
                self._verified_at[(key, r)] = now
                short = lacking(ps, held, coverage)
                if short:
                    log.warning("replication: %s on %s lacks %s that it was recorded to hold "
                                "(files gone, cut short or damaged); it leaves the ISR and is "
                                "copied to again", key, r, describe(short))
                    lost.setdefault(key, {})[r] = short
                    topic_ids[topic] = info["topic_id"]
                    was_in_isr += r in members
        self.check.forget_except(followed)
        if not lost:
            return state
        if REPLICA_CHECK not in state.reader_features:
            self.cluster.enable_feature(REPLICA_CHECK)
        after = self._submit(A.ReplicaLost(coordinator_epoch=epoch, topic_ids=topic_ids,
                                           partitions=lost), result)
        result.lost = lost
        result.isr_shrinks += was_in_isr
        for key, by in lost.items():
            for r in by:
                self._caught_up.pop((key, r), None)    # caught up again only by a copy
        return after

    def _reassign(self, epoch: int, state, result: PassResult):
        """Reassignments whose targets are all in sync: move the leader to a target that holds
        everything committed (``elect_leader`` of kind ``reassign``), then complete them and
        delete the removed replicas' directories (§1.3)."""
        moves: Dict[str, dict] = {}
        done: Dict[str, dict] = {}
        topic_ids: Dict[str, str] = {}
        for topic, info, p, replicas, key, ps in _replicated(state):
            rep = ps.replication
            if "target" not in rep:
                continue
            if any(t not in rep["isr"] for t in rep["target"]):
                continue
            topic_ids[topic] = info["topic_id"]
            if rep["leader"] in rep["target"]:
                done[key] = {"partition_epoch": rep["partition_epoch"]}
                continue
            ready = [t for t in rep["target"] if replica_end(ps, t) >= ps.last_stable_offset]
            if ready:   # one that holds it all, so that the move truncates nothing
                moves[key] = {"partition_epoch": rep["partition_epoch"], "leader": ready[0]}
        if moves:
            if REPLICA_CHECK not in state.reader_features:
                # its rule makes the move atomic: replay refuses a target that lacks a commit
                # made after this pass's check, instead of truncating it (§1.3)
                self.cluster.enable_feature(REPLICA_CHECK)
            state = self._submit(A.ElectLeader(coordinator_epoch=epoch, topic_ids=topic_ids,
                                               election="reassign", partitions=moves), result)
            result.elections["reassign"] = result.elections.get("reassign", 0) + len(moves)
        if done:
            before = {k: state.topics[k.rsplit(":", 1)[0]]["replicas"][int(k.rsplit(":", 1)[1])]
                      for k in done}
            state = self._submit(A.CompleteReassignment(coordinator_epoch=epoch,
                                                        topic_ids=topic_ids, partitions=done),
                                 result)
            for key, old in before.items():
                topic, p = key.rsplit(":", 1)
                info = state.topics.get(topic)
                if info is None or info["topic_id"] != topic_ids[topic]:
                    continue
                now = info["replicas"][int(p)]
                if now == old:
                    continue   # refused: the next pass tries again
                result.reassigned.append(key)
                for gone in [d for d in old if d not in now]:
                    d = self.cluster.partition_dir(topic, int(p), gone, state)
                    try:
                        self.cluster.storage.delete_tree(d)
                    except KafkaLogError as exc:   # cleanup removes it later (§7)
                        log.warning("replication: %s stays for cleanup: %s", d, exc)
        return state

    def _probe(self, state, now: int) -> set:
        """Log dirs holding replicas that are offline: unreadable (``meta.properties`` gone: a
        root renamed, unmounted, a bucket deleted) on every probe for
        ``broker.session.timeout.ms``. One request per log dir per pass. A follower that cannot
        be read is also not caught up, so it leaves the ISR after ``replica.lag.time.max.ms``,
        as a dead Kafka broker's replicas do, whichever comes first."""
        dirs = {r for info in state.topics.values() for reps in info["replicas"] for r in reps}
        down = set()
        for r in sorted(dirs):
            if self._identity_ok(state, r):
                self._failing_since.pop(r, None)
            else:
                since = self._failing_since.setdefault(r, now)
                down.add(r)
                if now - since >= self.broker_session_timeout_ms and r not in self._offline:
                    log.warning("replication: log dir %s is offline (unreadable for %d ms)", r,
                                now - since)
        was = self._offline
        self._offline = {r for r in down if now - self._failing_since[r]
                         >= self.broker_session_timeout_ms}
        for r in sorted(was - self._offline):
            log.info("replication: log dir %s is online again", r)
        # unreadable followers are skipped for copying at once; leaders only once offline
        return down

    def _identity_ok(self, state, log_dir: str) -> bool:
        """The log dir's root is there and is the one registered: its ``meta.properties``
        reads, and names the registered ``directory.id`` (docs/protocol.md §1.1)."""
        try:
            props = parse_meta_properties(
                self.cluster.storage.read(f"{log_dir}/{META_PROPERTIES}").decode("latin-1"))
        except (KafkaLogError, OSError, ValueError):
            return False
        info = state.log_dirs.get(log_dir)
        return info is None or props.get("directory.id") == info["directory_id"]

    def _confirm(self, state, result: PassResult) -> None:
        """Before a progress entry names copies, make sure they are on the follower's root:
        a root renamed away or unmounted after the probe still takes writes (a local path
        is created again), and those files are not where the log dir is. So: the log dir's
        identity again, then every copied ``.log`` listed with its size. A root that moves
        after this check moves with the copies on it."""
        storage = self.cluster.storage
        for r in sorted({r for by in result.progress.values() for r in by}):
            if self._identity_ok(state, r):
                continue
            for key in list(result.progress):
                if result.progress[key].pop(r, None) is not None:
                    result.failures[f"{key} {r}"] = f"log dir {r} changed during the copy"
        for key, by in list(result.progress.items()):
            topic, p = key.rsplit(":", 1)
            for r in list(by):
                d = self.cluster.partition_dir(topic, int(p), r, state)
                try:
                    sizes = {f.name: f.size for f in storage.list(d)}
                except KafkaLogError:
                    sizes = {}
                missing = [b for b, n in result.copied.get((key, r), ())
                           if sizes.get(segment_name(b, LOG_SUFFIX)) != n]
                if missing:
                    del by[r]
                    result.failures[f"{key} {r}"] = (f"copies not found on {r} after the copy "
                                                     f"(segment {missing[0]})")
            if not by:
                del result.progress[key]

    @property
    def offline_log_dirs(self) -> set:
        return set(self._offline)

    def _elect(self, epoch: int, state, unreadable: set, result: PassResult):
        """Kafka's offline election for every partition whose leader's log dir is offline:
        the first ISR member in replica order that is online; else, where the topic allows
        it, the online replica that holds most (unclean)."""
        by_kind: Dict[str, Dict[str, dict]] = {"offline": {}, "unclean": {}}
        topic_ids: Dict[str, str] = {}
        for topic, info, p, replicas, key, ps in _replicated(state):
            rep = ps.replication
            if rep["leader"] not in self._offline:
                continue
            live = [r for r in replicas if r not in unreadable]
            clean = [r for r in live if r in rep["isr"]]
            if clean:
                kind, leader = "offline", clean[0]
            elif live and state.topic_config(topic).unclean_leader_election:
                kind, leader = "unclean", max(live, key=lambda r: replica_end(ps, r))
            else:
                if key not in self._stuck:
                    log.error("replication: %s has no eligible leader (leader %s offline, "
                              "ISR %s); it waits for its log dir", key, rep["leader"],
                              rep["isr"])
                    self._stuck.add(key)
                continue
            self._stuck.discard(key)
            by_kind[kind][key] = {"partition_epoch": rep["partition_epoch"], "leader": leader}
            topic_ids[topic] = info["topic_id"]
        for kind, parts in by_kind.items():
            if parts:
                log.warning("replication: %s leader election for %s", kind, parts)
                before = {k: len(state.partitions[k].replication["isr"]) for k in parts}
                state = self._submit(A.ElectLeader(coordinator_epoch=epoch, topic_ids=topic_ids,
                                                   election=kind, partitions=parts), result)
                result.elections[kind] = result.elections.get(kind, 0) + len(parts)
                # the offline leader leaves the ISR with its election (more with an unclean
                # one): Kafka counts those as shrinks too
                result.isr_shrinks += sum(
                    max(0, n - len(state.partitions[k].replication["isr"]))
                    for k, n in before.items() if state.partitions.get(k) is not None
                    and state.partitions[k].replication is not None)
        return state

    def _start_clocks(self, state, now: int) -> None:
        self._caught_up = {}
        for key, ps in state.partitions.items():
            if ps.replication is not None:
                for r in ps.replication["isr"][1:] + ps.replication["joining"]:
                    self._caught_up[(key, r)] = now

    def _copy_partition(self, state, topic: str, p: int, leader: str, behind: List[str],
                        urgent: List[list], result: PassResult) -> None:
        key = tp_key(topic, p)
        ps = state.partitions[key]
        storage = self.cluster.storage
        src_dir = self.cluster.partition_dir(topic, p, leader, state)
        try:
            bases = sorted(b for b in map(log_file_base, (f.name for f in storage.list(src_dir)))
                           if b is not None)
        except KafkaLogError as exc:
            for r in behind:
                result.failures[f"{key} {r}"] = f"listing the leader {leader}: {exc}"
            return
        members = ps.replication["isr"] + ps.replication["joining"]
        for r in behind:
            held = ps.replication["held"].get(r, [])
            dst_dir = self.cluster.partition_dir(topic, p, r, state)
            todo = []   # (base, span, is_open) of the segments r lacks, lowest first
            for i, base in enumerate(bases):
                nxt = bases[i + 1] if i + 1 < len(bases) else None
                span = _segment_span(ps, base, nxt)
                is_open = False
                if span is None and r in members:
                    # an open acks=all range: its writer waits for this copy to commit
                    span, is_open = _open_span(urgent, base), True
                if span is not None and not (_held(held, span[0]) if is_open
                                             else _held_whole(held, span)):
                    # a merged leader segment (protocol §4.1) may hold more than the follower's
                    # file of the same name: copied again, it replaces that file
                    todo.append((base, span, is_open))
            copied: List[List[int]] = []
            try:
                if todo:
                    self._copy_partition_metadata(state, topic, src_dir, dst_dir)
                done, error = copy_segments(
                    storage, src_dir, storage, dst_dir,
                    [(base, span[1], not is_open) for base, span, is_open in todo],
                    fetchers=self.num_replica_fetchers if storage.concurrent_writes else 1)
                for (base, span, is_open), copy in zip(todo, done):
                    # an open range's later segments may still be on their way: only what
                    # this file holds counts
                    copied.append([span[0], copy.end_offset] if is_open else list(span))
                    result.copied.setdefault((key, r), []).append((base, copy.bytes))
                    result.segments += 1
                    result.bytes += copy.bytes
                    result.by_mode[copy.mode] = result.by_mode.get(copy.mode, 0) + 1
                if error is not None:
                    raise error
            except KafkaLogError as exc:
                result.failures[f"{key} {r}"] = str(exc)
                log.warning("replication: copying %s to %s stopped: %s", key, r, exc)
            copied = [c for c in copied if c[0] < c[1]]
            if copied:
                result.progress.setdefault(key, {})[r] = copied

    def _copy_partition_metadata(self, state, topic: str, src_dir: str, dst_dir: str) -> None:
        """The follower's ``partition.metadata`` from the leader's. A leader elected while its
        partition held no data never got one (followers get it with their first copy): it is
        written from the state's topic id first, so the partition replicates again."""
        storage = self.cluster.storage
        try:
            copy_partition_metadata(storage, src_dir, storage, dst_dir)
        except StorageNotFoundError:
            log.info("replication: %s has no partition.metadata; writing it", src_dir)
            PartitionLog(storage, src_dir).write_partition_metadata(
                state.topics[topic]["topic_id"])
            copy_partition_metadata(storage, src_dir, storage, dst_dir)

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

    def _decide_isr(self, epoch: int, state, now: int, unreadable: set,
                    result: PassResult) -> None:
        changes: Dict[str, dict] = {}
        topic_ids: Dict[str, str] = {}
        lag = self.replica_lag_time_max_ms
        for topic, info, p, replicas, key, ps in _replicated(state):
            rep = ps.replication
            leader = rep["leader"]
            isr, joining = list(rep["isr"]), list(rep["joining"])
            for r in replicas:
                if r == leader:
                    continue
                # a log dir known offline is not waited for (Kafka shrinks the ISR as soon as
                # a broker is fenced); one merely unreadable for now still gets the lag time
                fresh = now - self._caught_up.get((key, r), -(1 << 62)) <= lag \
                    and r not in self._offline
                if r in isr or r in joining:
                    if not fresh:
                        (isr if r in isr else joining).remove(r)
                elif fresh and r not in unreadable and self._clean_returning(state, topic,
                                                                             p, r, result):
                    joining.append(r)
            for r in list(joining):
                if r in rep["joining"] and replica_end(ps, r) >= rep["high_watermark"]:
                    joining.remove(r)
                    isr.append(r)
            if isr != rep["isr"] or joining != rep["joining"]:
                result.isr_shrinks += len(set(rep["isr"]) - set(isr))
                result.isr_expands += len(set(isr) - set(rep["isr"]))
                order = {r: i for i, r in enumerate(replicas)}
                order[leader] = -1
                changes[key] = {"partition_epoch": rep["partition_epoch"],
                                "isr": sorted(isr, key=order.get),
                                "joining": sorted(joining, key=order.get)}
                topic_ids[topic] = info["topic_id"]
        if changes:
            state = self._submit(A.AlterIsr(coordinator_epoch=epoch, topic_ids=topic_ids,
                                            partitions=changes), result)
            result.isr_changes = changes
            log.info("replication: ISR changes %s", changes)
        return state

    def _clean_returning(self, state, topic: str, p: int, r: str, result: PassResult) -> bool:
        """Before a replica joins: delete its segments that are not committed data (truncated
        by an election, aborted, below the log start offset), ``.log`` first, so that its log
        is a prefix of the leader's (KIP-101's truncation, at segment granularity: offsets
        are never reused, so no kept file can name other records)."""
        ps = state.partition(topic, p)
        d = self.cluster.partition_dir(topic, p, r, state)
        storage = self.cluster.storage
        try:
            names = [f.name for f in storage.list(d)]
        except KafkaLogError as exc:
            result.failures[f"{tp_key(topic, p)} {r}"] = f"listing before joining: {exc}"
            return False
        doomed = []
        for name in names:
            parsed = parse_segment_file(name)
            if parsed is None:
                continue
            base = parsed[0]
            if _segment_span(ps, base, None) is None \
                    and not _open_span(_open_acks_all(state, tp_key(topic, p)), base):
                doomed.append(name)
        if doomed:
            doomed.sort(key=lambda n: (not n.endswith(".log"), n))
            log.info("replication: %s-%d on %s: deleting %d file(s) of truncated or aborted "
                     "ranges before it joins", topic, p, r, len(doomed))
            try:
                storage.delete_many(f"{d}/{n}" for n in doomed)
            except KafkaLogError as exc:
                result.failures[f"{tp_key(topic, p)} {r}"] = f"truncating: {exc}"
                return False
            result.truncated_files += len(doomed)
        return True

    def _write_derived(self, state, offline: set) -> None:
        """Kafka's derived files (§8) of every replica whose view changed: the leader's when the
        high watermark moved (a commit wrote them while the ISR still held it back), and each
        follower's for what it holds (``leader-epoch-checkpoint`` up to its end, the offset
        checkpoints at ``min(high watermark, end)``), so Kafka reading any replica's log dir
        sees a consistent prefix of the leader's log. What was written is remembered, so a
        quiet pass writes nothing."""
        epochs: Dict[str, bytes] = {}
        offsets: Dict[str, Dict[Tuple[str, int], Tuple[int, int]]] = {}
        leaders: List[Tuple[str, int]] = []
        for topic, info, p, replicas, key, ps in _replicated(state):
            for r in replicas:
                if r in offline:
                    continue
                is_leader = r == ps.replication["leader"]
                end = ps.high_watermark if is_leader else min(ps.high_watermark,
                                                              replica_end(ps, r))
                if not is_leader and not ps.replication["held"].get(r):
                    continue   # nothing copied there yet: no files to describe
                entries = tuple((epoch, s) for epoch, s in ps.leader_epoch_entries()
                                if s < end)
                mark = (end, ps.log_start_offset, entries)
                if self._written.get((key, r)) == mark:
                    continue
                self._written[(key, r)] = mark
                if is_leader:
                    leaders.append((topic, p))
                    continue
                path, data = epoch_file(self.cluster, state, topic, p, r, entries)
                epochs[path] = data
                offsets.setdefault(r, {})[(topic, p)] = (end, ps.log_start_offset)
        try:
            if leaders:
                # no flush per pass: the leader's recovery point moves at maintenance (§8)
                sync_checkpoints(self.cluster, state, leaders, recovery_point=False)
            self.cluster.storage.replace_many(epochs)
            for r, parts in offsets.items():
                write_log_dir_files(self.cluster, r, {tp: e for tp, (e, _) in parts.items()},
                                    {tp: lo for tp, (_, lo) in parts.items()},
                                    recovery_point=True, flush=False)
        except KafkaLogError as exc:   # derived files: the next change (or maintenance) redoes
            self._written.clear()
            log.warning("replication: derived files not written: %s", exc)


def _replicated(state):
    """``(topic, info, partition, replicas, key, partition state)`` of every replicated
    partition, in the state's order."""
    for topic, info in state.topics.items():
        for p, replicas in enumerate(info["replicas"]):
            key = tp_key(topic, p)
            ps = state.partitions.get(key)
            if ps is not None and ps.replication is not None:
                yield topic, info, p, replicas, key, ps


def _has_replicated_topic(state) -> bool:
    return any(len(r) > 1 for info in state.topics.values() for r in info["replicas"])


def _segment_span(ps, base: int, nxt: Optional[int]) -> Optional[Tuple[int, int]]:
    """The offsets a follower holds once it has the leader's segment at ``base``: from the base
    (or the log start offset) to the next segment's base, within the gapless stretch of
    committed ranges the segment begins in (a segment as written lies in one reservation; a
    merged one, protocol §4.1, in committed ranges that follow each other). None when the
    segment is not committed data at or above the log start offset (open, aborted, or
    deleted)."""
    end = ps.contiguous_committed_end(base, nxt)
    if end == base:
        return None
    lo, hi = max(base, ps.log_start_offset), end if nxt is None else min(end, nxt)
    return (lo, hi) if lo < hi else None


def _open_acks_all(state, key: str) -> List[list]:
    """``[start, end)`` of the partition's open acks=all reservations, lowest first."""
    ps = state.partitions.get(key)
    if ps is None or not ps.open:
        return []
    return sorted([r[0], r[1]] for txn, r in ps.open.items()
                  if state.txns.get(txn, {}).get("acks") == "all")


def _open_span(ranges: List[list], base: int) -> Optional[Tuple[int, int]]:
    for s, e in ranges:
        if s <= base < e:
            return base, e
    return None


def _held(held: List[List[int]], offset: int) -> bool:
    return any(s <= offset < e for s, e in held)


def _held_whole(held: List[List[int]], span: Tuple[int, int]) -> bool:
    return any(s <= span[0] and span[1] <= e for s, e in held)
