"""Deleting data and cleaning up: DeleteRecords (KIP-107), retention, and garbage collection.

All of it only raises log start offsets through the metadata log and then deletes files that no
reader may select any more (docs/protocol.md, §6-§7), so any number of these can run at once, be
killed at any point, and be re-run: the next run finishes what the last one started.

Each rule has one implementation here, used by the Admin API, the CLI and the spark-submit jobs.
The per-partition work (planning retention, deleting segment files) goes through a ``fan_out``
the caller picks: ``serial`` here, or one that runs ``PartitionWork`` on Spark executors
(``jobs/_common.py``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from ..errors import (KafkaLogError, KafkaStorageError, OfflineLogDirError,
                      StorageNotFoundError, error_for)
from ..log.file_names import log_file_base, parse_segment_file
from ..log.segment import LogSegment
from ..progress import tracked
from ..cluster import actions as A
from ..cluster.checkpoints import sync_checkpoints
from ..cluster.garbage import SEGMENT_SUFFIXES, is_deleted_topic_dir, is_garbage_segment
from ..cluster.isr import leader_of
from ..cluster.log_dirs import noting_offline
from .compaction import CleanerSettings, PartitionClean, clean_step
from .segment_merges import PartitionMerges, merge_step
from ..cluster.state import ClusterState, split_key, tp_key

TopicPartition = Tuple[str, int]


@dataclass
class DeleteRecordsResult:
    """KIP-107's per-partition answer: the new low watermark, or an error."""

    low_watermark: int = -1
    error: Optional[KafkaLogError] = None


@dataclass
class RetentionPlan:
    topic: str
    partition: int
    log_start_offset: int
    new_log_start_offset: int
    segments: List[int] = field(default_factory=list)     # base offsets to delete
    bytes: int = 0
    reason: str = ""
    topic_id: str = ""      # the incarnation planned against: a recreated topic is left alone


@dataclass(frozen=True)
class Unreachable:
    """A partition whose work was skipped because its leader's log dir could not be reached
    (an offline log dir, KIP-112): it is named in the run's :class:`OfflineLogDirError`."""
    topic: str
    partition: int
    log_dir: str
    error: str


def _unreachable(state: ClusterState, topic: str, partition: int, exc: Exception) -> Unreachable:
    return Unreachable(topic, partition,
                       leader_of(state.partition(topic, partition),
                                 state.topics[topic]["replicas"][partition]), str(exc))


def _split(results: list) -> Tuple[list, List[Unreachable]]:
    return ([r for r in results if not isinstance(r, Unreachable)],
            [r for r in results if isinstance(r, Unreachable)])


def offline_error(what: str, offline: Mapping[str, str], skipped: Sequence[Unreachable],
                  done) -> OfflineLogDirError:
    """The one error of a maintenance run that skipped log dirs: each one named once, with
    why and the partitions it skipped there (the rest of the cluster was done)."""
    offline = dict(offline)
    by_dir: Dict[str, List[str]] = {}
    for u in skipped:
        offline.setdefault(u.log_dir, u.error)
        by_dir.setdefault(u.log_dir, []).append(f"{u.topic}-{u.partition}")
    parts = []
    for name in sorted(offline):
        tps = sorted(by_dir.get(name, []))
        shown = ", ".join(tps[:5]) + (", …" if len(tps) > 5 else "")
        parts.append(f"{name} ({offline[name]})"
                     + (f"; skipped {len(tps)} partition(s) led there: {shown}" if tps else ""))
    return OfflineLogDirError(
        f"{what} skipped log dir(s) it could not reach, and did the rest of the cluster: "
        + "; ".join(parts), offline=offline, skipped=skipped, done=done)


@dataclass
class DeleteRecordsDryRun:
    """Where one partition stands and what ``delete_records`` would answer for it now: the
    ``SetLogStart`` it would submit, replayed on a copy of the state. ``log_start_offset``,
    ``high_watermark`` and ``topic_id`` are None for a partition that does not exist;
    ``topic_id`` passed back to ``delete_records`` makes it leave alone a topic recreated
    since."""

    offset: int
    log_start_offset: Optional[int]
    high_watermark: Optional[int]
    result: DeleteRecordsResult
    topic_id: Optional[str] = None


# -- fanning per-partition work out ------------------------------------------------------------

#: ``fan_out(items, fn) -> list``: call ``fn`` on groups of ``items`` (partitions), anywhere,
#: and return the concatenation of what the calls return.
FanOut = Callable[[Sequence[TopicPartition], Callable[[List[TopicPartition]], list]], list]


def serial(items: Sequence[TopicPartition], fn: Callable[[List[TopicPartition]], list]) -> list:
    """The default fan-out: everything in this process, one call."""
    return fn(list(items))


class PartitionWork:
    """One step of a rule bound to the cluster and to the exact state the step must act on
    (the state a plan was made against, or the one the ``SetLogStart`` produced): what a
    fan-out calls with a group of partitions.

    Pickled, it travels as the cluster URL and a snapshot of that state, so a Spark executor
    reopens the cluster and rebuilds the state instead of replaying the metadata log: every task
    acts on the metadata the driver decided on, not on a newer one. (Storage options given to
    the driver's ``Cluster`` do not travel; executors open the URL as it is.)"""

    def __init__(self, step, cluster, state: ClusterState, arg=None):
        self.step, self.arg = step, arg
        self.cluster, self.state = cluster, state

    def __call__(self, items) -> list:
        items = [tuple(tp) for tp in items]
        return self.step(self.cluster, self.state, items, self.arg) if items else []

    def __getstate__(self) -> dict:
        return {"step": self.step, "arg": self.arg, "url": self.cluster.url,
                "snapshot": self.state.to_snapshot()}

    def __setstate__(self, d: dict) -> None:
        from ..cluster.cluster import Cluster      # cluster.py imports this module
        self.step, self.arg = d["step"], d["arg"]
        self.cluster = Cluster(d["url"], create=False)
        self.state = ClusterState.from_snapshot(d["snapshot"])


def _delete_step(cluster, state: ClusterState, items: List[TopicPartition],
                 planned: Optional[Dict[TopicPartition, List[int]]]) -> list:
    """The file half of both rules, for partitions whose ``SetLogStart`` applied: the segments
    a retention plan named, then whatever Kafka's rule puts below the log start offset."""
    out = []
    for topic, partition in items:
        if state.partition(topic, partition) is None:
            continue
        deleted, offline = set(), {}
        leader = leader_of(state.partition(topic, partition),
                           state.topics[topic]["replicas"][partition])
        with noting_offline(offline, leader):
            if planned:
                d = cluster.partition_dir(topic, partition, state=state)
                lso = state.partition(topic, partition).log_start_offset
                for base in planned.get((topic, partition), ()):
                    seg = LogSegment(cluster.storage, d, base)
                    if not _below(seg, lso):
                        continue   # a merged segment reaching past it: Kafka's rule keeps it
                    seg.delete()
                    deleted.add(base)
            deleted.update(delete_below_log_start(cluster, state, topic, partition))
        if offline:
            # the log start offset is raised already, so no reader selects these segments;
            # cleanup deletes them once the log dir is back (Kafka's rule, §7)
            out.append(Unreachable(topic, partition, leader, offline[leader]))
            continue
        for follower in _followers(state, topic, partition):
            try:   # a follower's root may be away: cleanup deletes there later (§7)
                delete_below_log_start(cluster, state, topic, partition, follower)
            except KafkaLogError:
                pass
        out.append(((topic, partition), sorted(deleted)))
    return out


def _followers(state: ClusterState, topic: str, partition: int) -> List[str]:
    replicas = state.topics[topic]["replicas"][partition]
    return [d for d in replicas if d != leader_of(state.partition(topic, partition), replicas)]


def _segments(cluster, state: ClusterState, topic: str, partition: int,
              logdir: Optional[str] = None) -> List[LogSegment]:
    return cluster.partition_view(topic, partition, state, logdir=logdir).log.segments


def delete_below_log_start(cluster, state: ClusterState, topic: str, partition: int,
                           logdir: Optional[str] = None) -> List[int]:
    """Kafka's rule over the visible segments: a segment goes when the next one's base offset
    is <= the log start offset; the newest one never goes this way. ``logdir``: in that
    replica's directory (default: the leader's).

    A merged segment whose covered segments are still listed (docs/protocol.md §4.1) may
    reach past the next one's base: it goes only if its data ends at or below the log start
    offset too, else a merge pass could delete its covered segments (their data being in it)
    just as this deletes it, and take offsets at or above the log start offset with them."""
    ps = state.partition(topic, partition)
    segs = _segments(cluster, state, topic, partition, logdir)
    deleted = []
    for seg, nxt in zip(segs, segs[1:]):
        if nxt.base_offset > ps.log_start_offset:
            break
        if _below(seg, ps.log_start_offset):
            seg.delete()
            deleted.append(seg.base_offset)
    # segments no longer visible at all (their committed range now lies wholly below the log
    # start offset) go too; nothing at or above the log start offset is touched
    d = cluster.partition_dir(topic, partition, logdir, state=state)
    visible = {s.base_offset for s in segs}
    for info in cluster.storage.list(d):
        base = log_file_base(info.name)
        if base is not None:
            if base < ps.log_start_offset and base not in visible and base not in deleted:
                seg = LogSegment(cluster.storage, d, base)
                if not ps.is_aborted(base) and not _below(seg, ps.log_start_offset):
                    continue   # never judged garbage by its base alone if it holds live data
                seg.delete()
                deleted.append(base)
    return sorted(deleted)


def _below(seg: LogSegment, log_start_offset: int) -> bool:
    """Whether every offset of ``seg`` is below ``log_start_offset``: the next listed base
    says so for a segment as written; a merged one may reach further (its ``.log`` is larger
    than its successors' starts imply), so its end is read when it could. A segment that
    cannot be read is kept."""
    try:
        return seg.next_offset() <= log_start_offset
    except KafkaLogError:
        return False


def _check_offsets(offsets: Mapping[TopicPartition, int]
                   ) -> Tuple[Dict[str, int], Dict[TopicPartition, DeleteRecordsResult]]:
    """The request, and the answers of offsets refused before it (Kafka refuses them in the
    client too, so they never reach the metadata log)."""
    request, refused = {}, {}
    for (topic, partition), offset in offsets.items():
        if not isinstance(offset, int) or isinstance(offset, bool) or offset < -1:
            refused[(topic, partition)] = DeleteRecordsResult(
                error=error_for("OFFSET_OUT_OF_RANGE", f"invalid offset {offset!r} for "
                                f"{topic}-{partition}: must be >= 0, or -1 for the high watermark"))
            continue
        request[tp_key(topic, partition)] = offset
    return request, refused


def _delete_records_action(cluster, state: ClusterState, request: Dict[str, int],
                           topic_ids: Optional[Mapping[str, str]]) -> A.SetLogStart:
    """The action both the run and the dry run use. It names the topic incarnations the offsets
    were meant for (the caller's, else those of ``state``), so replay refuses a partition of a
    topic deleted and recreated since, instead of deleting the new topic's records."""
    topics = {split_key(k)[0] for k in request}
    if topic_ids is None:
        topic_ids = {t: info["topic_id"] for t, info in state.topics.items()}
    return A.SetLogStart(partitions=request, principal=cluster.principal,
                         topic_ids={t: i for t, i in topic_ids.items() if t in topics and i})


def _answers(result: A.Result, request: Dict[str, int]) -> Dict[TopicPartition, DeleteRecordsResult]:
    # an action refused whole (not per partition) is every partition's answer
    per = getattr(result, "partitions", None) or {k: result for k in request}
    return {split_key(k): (DeleteRecordsResult(low_watermark=r.low_watermark) if r.ok else
                           DeleteRecordsResult(error=error_for(r.error, r.message)))
            for k, r in per.items()}


def delete_records(cluster, offsets: Mapping[TopicPartition, int], *,
                   topic_ids: Optional[Mapping[str, str]] = None,
                   fan_out: FanOut = serial) -> Dict[TopicPartition, DeleteRecordsResult]:
    """``deleteRecordsBefore``: one metadata entry for every partition, then file deletion in
    the partitions whose log start offset that entry set, and only there. ``topic_ids``
    (topic -> id): the incarnations the offsets were chosen against (e.g. a consumer group's
    offsets, or a dry run's ``topic_id``); by default the topics as they are now."""
    request, results = _check_offsets(offsets)
    if not request:
        return results
    state = cluster.state()
    cluster.check_writable(state)
    _, state, res = cluster.submit([_delete_records_action(cluster, state, request, topic_ids)])
    answers = _answers(res[0], request)
    results.update(answers)
    done = [tp for tp, r in answers.items() if r.error is None]
    # the entry is the deletion: a partition whose log dir is offline keeps its files until a
    # cleanup there (below the log start offset, §7), and its answer stands
    fan_out(done, PartitionWork(_delete_step, cluster, state))
    sync_checkpoints(cluster, state, done, log_dir_files=True, skip_offline=True)
    return results


def delete_records_dry_run(cluster, offsets: Mapping[TopicPartition, int], *,
                           topic_ids: Optional[Mapping[str, str]] = None
                           ) -> Dict[TopicPartition, DeleteRecordsDryRun]:
    """What ``delete_records`` would answer now, per partition in ``offsets`` order: its
    ``SetLogStart`` replayed on a copy of the current state (the rule of docs/protocol.md §6
    itself, not a second version of it); nothing is appended or deleted. A cluster this
    client may not write to raises here as the run would."""
    before = cluster.state()
    cluster.check_writable(before)
    request, answers = _check_offsets(offsets)
    if request:
        action = _delete_records_action(cluster, before, request, topic_ids)
        state = before.copy()
        seq = state.seq + 1
        state.apply(seq, {"version": A.ENTRY_VERSION, "timestamp": cluster.now_ms(),
                          "actions": [action.to_json()]})
        answers.update(_answers(state.results[seq][0], request))
    out = {}
    for tp, offset in offsets.items():
        ps = before.partition(*tp)
        info = before.topics.get(tp[0]) if ps is not None else None
        out[tp] = DeleteRecordsDryRun(offset, ps.log_start_offset if ps else None,
                                      ps.high_watermark if ps else None, answers[tuple(tp)],
                                      info["topic_id"] if info else None)
    return out


def _largest_timestamp(seg: LogSegment) -> float:
    """Kafka's ``LogSegment.largestTimestamp``: the largest record timestamp, or for a segment
    without timestamps (magic 0, or records written with timestamp -1) its file's mtime."""
    ts = seg.largest_timestamp()
    return ts if ts >= 0 else seg.created_ms()


def retention(cluster, *, dry_run: bool = False, now_ms: Optional[int] = None,
              partitions: Optional[Sequence[TopicPartition]] = None,
              fan_out: FanOut = serial) -> List[RetentionPlan]:
    """Plan retention for ``partitions`` (default: all) and, unless ``dry_run``, apply the plans.
    The dry run's plans are exactly what a run at the same ``now_ms`` applies. ``now_ms``
    defaults to the storage's clock: segment files' times are judged by it, not by ours.

    A partition whose leader's log dir cannot be reached is skipped, and the rest is done
    (KIP-112: a failed log dir goes offline, the others go on); the run then raises
    :class:`OfflineLogDirError` naming those log dirs, with the plans it did apply as ``done``."""
    state = cluster.state()
    now = cluster.storage_now_ms() if now_ms is None else now_ms
    plans, skipped = _split(plan_retention(cluster, state, now, partitions, fan_out=fan_out))
    offline: Dict[str, str] = {}
    if not dry_run:
        _, late, offline = _apply(cluster, plans, fan_out)
        skipped += late
    if skipped or offline:
        raise offline_error("retention", offline, skipped, plans)
    return plans


def plan_retention(cluster, state: ClusterState, now_ms: int,
                   partitions: Optional[Sequence[TopicPartition]] = None, *,
                   fan_out: FanOut = serial) -> list:
    """Which whole segments ``retention.ms`` (by each segment's largest timestamp, KIP-32) and
    ``retention.bytes`` (per partition) remove, and the log start offset that follows.
    Reading segments is the slow part, so it goes through ``fan_out``. A partition whose
    leader's log dir cannot be read comes back as :class:`Unreachable` instead of a plan."""
    items = cluster.partitions(state) if partitions is None else [tuple(tp) for tp in partitions]
    return fan_out(items, PartitionWork(_plan_step, cluster, state, now_ms))


def _plan_step(cluster, state: ClusterState, items: List[TopicPartition],
               now_ms: int) -> list:
    plans = []
    for topic, partition in items:
        for _attempt in range(3):
            try:
                plan = _plan_partition(cluster, state, topic, partition, now_ms)
                break
            except StorageNotFoundError:
                # delete-records or another retention run deleted a segment under us; they only
                # raise the log start offset, so plan again from a newer state
                state = cluster.state()
            except KafkaStorageError as exc:   # its log dir is offline: the others go on
                plan = _unreachable(state, topic, partition, exc)
                break
        else:
            continue   # still racing: the next run plans this partition
        if plan is not None:
            plans.append(plan)
    return plans


def _plan_partition(cluster, state: ClusterState, topic: str, partition: int,
                    now_ms: int) -> Optional[RetentionPlan]:
    ps = state.partition(topic, partition)
    if ps is None:
        return None
    config = state.topic_config(topic)
    if "delete" not in config.cleanup_policy:
        return None
    segs = _segments(cluster, state, topic, partition)
    sizes = [s.size() for s in segs]
    total = sum(sizes)
    cut, reasons = 0, set()
    while cut < len(segs):
        seg = segs[cut]
        by_time = (config.retention_ms >= 0
                   and now_ms - _largest_timestamp(seg) > config.retention_ms)
        by_size = config.retention_bytes >= 0 and total - sizes[cut] >= config.retention_bytes
        if not (by_time or by_size):
            break
        reasons.add("retention.ms" if by_time else "retention.bytes")
        total -= sizes[cut]
        cut += 1
    if cut == 0:
        return None
    new_lso = segs[cut].base_offset if cut < len(segs) else ps.high_watermark
    return RetentionPlan(topic, partition, ps.log_start_offset,
                         max(new_lso, ps.log_start_offset),
                         [s.base_offset for s in segs[:cut]], sum(sizes[:cut]),
                         ",".join(sorted(reasons)), state.topics[topic]["topic_id"])


def apply_retention(cluster, plans: List[RetentionPlan], *,
                    fan_out: FanOut = serial) -> ClusterState:
    """One ``set_log_start`` entry for every partition trimmed, then the file deletions (through
    ``fan_out``) in the partitions where it applied; returns the state after the entry. Raises
    :class:`OfflineLogDirError` after all that when a log dir could not be reached for the
    deletions (its files go at a later run, below the log start offset)."""
    state, skipped, offline = _apply(cluster, plans, fan_out)
    if skipped or offline:
        raise offline_error("retention", offline, skipped, plans)
    return state


def _apply(cluster, plans: List[RetentionPlan], fan_out: FanOut
           ) -> Tuple[ClusterState, List[Unreachable], Dict[str, str]]:
    state = cluster.state()
    cluster.check_writable(state)
    if not plans:
        return state, [], {}
    # retention is the cluster's own policy, not a user's request: no principal, no ACL check
    _, state, results = cluster.submit([A.SetLogStart(
        principal=None, reason="retention",
        topic_ids={p.topic: p.topic_id for p in plans if p.topic_id},
        partitions={tp_key(p.topic, p.partition): p.new_log_start_offset for p in plans})])
    outcome = getattr(results[0], "partitions", {})
    # a partition deleted, recreated or otherwise changed since planning is left alone
    applied = {(p.topic, p.partition): list(p.segments) for p in plans
               if getattr(outcome.get(tp_key(p.topic, p.partition)), "ok", False)}
    done = sorted(applied)
    _, skipped = _split(fan_out(done, PartitionWork(_delete_step, cluster, state, applied)))
    offline = sync_checkpoints(cluster, state, done, log_dir_files=True, skip_offline=True)
    return state, skipped, offline


def merge_segments(cluster, *, partitions: Optional[Sequence[TopicPartition]] = None,
                   lag_ms: Optional[int] = None, delay_ms: Optional[int] = None,
                   offline: Optional[Dict[str, str]] = None,
                   fan_out: FanOut = serial) -> List[PartitionMerges]:
    """A pass of segment merges (docs/protocol.md §4.1) over every partition, or
    ``partitions``, fanned out as ``fan_out`` does (a Spark task per group of partitions in
    ``jobs/merge_segments.py``). ``lag_ms``/``delay_ms`` override the topics'
    ``segment.merge.lag.ms``/``file.delete.delay.ms``. ``offline``: log dirs known to be away
    (skipped), to which those found away now are added."""
    cluster.check_writable()
    state = cluster.state()
    tps = list(partitions) if partitions is not None else cluster.partitions(state)
    offline = {} if offline is None else offline
    results = fan_out(tps, PartitionWork(merge_step, cluster, state,
                                         (lag_ms, delay_ms, sorted(offline))))
    for m in results:
        if m.offline is not None:
            offline.setdefault(*m.offline)
    return [m for m in results if m.offline is None]


def compact(cluster, *, partitions: Optional[Sequence[TopicPartition]] = None,
            force: bool = False, delay_ms: Optional[int] = None,
            offline: Optional[Dict[str, str]] = None, fan_out: FanOut = serial,
            settings: Optional[CleanerSettings] = None) -> List[PartitionClean]:
    """A pass of the log cleaner (docs/protocol.md §4.2) over every compacted partition, or
    those among ``partitions``, fanned out as ``fan_out`` does (a Spark task per group of
    partitions in ``jobs/compact.py``, a thread per ``log.cleaner.threads`` in the
    coordinator). A partition is cleaned when it is due (``min.cleanable.dirty.ratio``,
    ``max.compaction.lag.ms``), or whenever it is dirty with ``force``. ``delay_ms``
    overrides the topics' ``file.delete.delay.ms``; ``offline`` as for merges."""
    cluster.check_writable()
    state = cluster.state()
    tps = list(partitions) if partitions is not None else cluster.partitions(state)
    tps = [tp for tp in tps if tp[0] in state.topics and state.topic_config(tp[0]).compact]
    offline = {} if offline is None else offline
    results = fan_out(tps, PartitionWork(clean_step, cluster, state,
                                         (force, delay_ms, sorted(offline), settings)))
    for c in results:
        if c.offline is not None:
            offline.setdefault(*c.offline)
    return [c for c in results if c.offline is None]


def collect_garbage(cluster, *, temp_file_max_age_s: float = 3600.0,
                    merge_lag_ms: Optional[int] = None,
                    file_delete_delay_ms: Optional[int] = None,
                    compact_now: bool = False) -> Dict[str, List[str]]:
    """Remove what dead, aborted or fenced writers left (docs/protocol.md, §7).

    Garbage is only what the metadata names as such: segments in an aborted range, segments below
    the log start offset (Kafka's rule), the directories of a deleted topic, and the metadata
    log's own entries and snapshots below its newest verified snapshot once older than
    ``metadata.max.retention.ms``. It also runs a pass of segment merges (``segment_merges``):
    ``merge_lag_ms`` and ``file_delete_delay_ms`` override the topics' ``segment.merge.lag.ms``
    and ``file.delete.delay.ms`` for it. Before the merges, the log cleaner cleans the
    compacted partitions that are due (§4.2), all that are dirty with ``compact_now``. Committed data is
    never garbage, whatever the high watermark is: a segment committed above a high watermark that
    an older open reservation holds back is committed, only not visible yet. Nothing is deleted
    because the state merely lacks it (a snapshot, a listing or a replay can be behind).

    The state is replayed *before* listing segment files (a segment written after that replay
    belongs to a reservation the state does not know, and is not in an aborted range of it), and
    again *after* listing partition directories (a topic created meanwhile is live in it).

    A log dir that cannot be reached is skipped and the others are cleaned (KIP-112); the run
    then raises :class:`OfflineLogDirError` naming it, with what it removed as ``done``.
    """
    cluster.check_writable()
    cluster.abort_expired()
    state = cluster.state()
    removed: Dict[str, List[str]] = {"segments": [], "dirs": [], "temp": [], "unknown_dirs": [],
                                     "cleaned": [], "merged": [], "covered": [], "metadata": []}
    listed: Dict[str, List[str]] = {}
    offline: Dict[str, str] = {}
    for logdir in cluster.logdirs:
        with noting_offline(offline, logdir):
            listed[logdir] = cluster.storage.list_dirs(logdir)
    after = cluster.state()
    live_dirs = {}
    for topic, info in after.topics.items():
        for p, replicas in enumerate(info["replicas"]):
            for d in replicas:
                live_dirs[f"{d}/{topic}-{p}"] = (topic, p)
    for logdir in listed:   # one that goes away meanwhile: what it removed stays listed
        with noting_offline(offline, logdir):
            _clean_log_dir(cluster, state, after, logdir, listed[logdir], live_dirs, removed,
                           temp_file_max_age_s)
    # compacted partitions cleaned (§4.2), then runs of small segments merged, and the
    # segments earlier rewrites cover deleted (§4.1)
    for c in compact(cluster, force=compact_now, delay_ms=file_delete_delay_ms,
                     offline=offline):
        removed["cleaned"] += [f"{cluster.partition_dir(c.topic, c.partition, state=after)}/"
                               f"{run[0]:020d}" for run in c.cleaned]
        removed["covered"] += c.deleted
    for m in merge_segments(cluster, lag_ms=merge_lag_ms, delay_ms=file_delete_delay_ms,
                            offline=offline):
        removed["merged"] += [f"{cluster.partition_dir(m.topic, m.partition, state=after)}/"
                              f"{run[0]:020d}" for run in m.merged]
        removed["covered"] += m.deleted
    # the metadata log below its newest verified snapshot, past metadata.max.retention.ms (§2)
    removed["metadata"] += cluster.metalog.cleanup()
    reachable = [tp for tp in cluster.partitions(state)
                 if leader_of(state.partition(*tp), state.topics[tp[0]]["replicas"][tp[1]])
                 not in offline]
    offline.update(sync_checkpoints(cluster, state, reachable, log_dir_files=True,
                                    skip_offline=True))
    if offline:
        raise offline_error("cleanup", offline, [], removed)
    return removed


def _clean_log_dir(cluster, state: ClusterState, after: ClusterState, logdir: str,
                   listed: List[str], live_dirs: Dict[str, TopicPartition],
                   removed: Dict[str, List[str]], temp_file_max_age_s: float) -> None:
    """:func:`collect_garbage` in one log dir, adding what it removes to ``removed``."""
    removed["temp"] += cluster.storage.cleanup_temp_files(logdir, temp_file_max_age_s)
    for name in tracked(f"cleaning {logdir.rsplit('/', 1)[-1]}", listed):
        path = f"{logdir}/{name}"
        if path not in live_dirs:
            if "-" in name and name.rpartition("-")[2].isdigit():
                if is_deleted_topic_dir(cluster, after, path, name.rpartition("-")[0]):
                    cluster.storage.delete_tree(path)
                    removed["dirs"].append(path)
                else:
                    removed["unknown_dirs"].append(path)
            continue
        topic, p = live_dirs[path]
        ps = state.partition(topic, p)
        if ps is None or state.topics[topic]["topic_id"] != after.topics[topic]["topic_id"]:
            continue   # created (or recreated) after our first replay: the next run
        removed["temp"] += cluster.storage.cleanup_temp_files(path, temp_file_max_age_s)
        bases = {}
        for info in cluster.storage.list(path):
            parsed = parse_segment_file(info.name)
            if parsed:
                bases.setdefault(parsed[0], set()).add(parsed[1])
        for base, kinds in sorted(bases.items()):
            if not is_garbage_segment(ps, base, "log" in kinds):
                continue
            for suffix in SEGMENT_SUFFIXES:
                cluster.storage.delete(f"{path}/{base:020d}{suffix}")
            removed["segments"].append(f"{path}/{base:020d}")
        removed["segments"] += [f"{path}/{b:020d}" for b in
                                delete_below_log_start(cluster, state, topic, p,
                                                       path.partition("/")[0])]
