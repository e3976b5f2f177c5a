"""A replicated partition's ISR and high watermark, as replay computes them (docs/protocol.md
§1.3, reader feature ``replication``).

Offsets are allocated once by the metadata log and every copy is a byte copy, so replication
never decides what an offset means: only which log dirs hold which committed ranges (``held``,
what the coordinator's ``replica_progress`` says it copied and checked) and when that is enough
to show a record (the stored high watermark). Kept apart from ``partition_state`` because these
rules need the topic's replicas and ``min.insync.replicas``, which a partition does not know.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence

from .partition_state import PartitionState


def merge_ranges(ranges: List[list]) -> List[list]:
    """Sorted ``[start, end)`` ranges with touching or overlapping ones joined."""
    out: List[list] = []
    for s, e in sorted([int(r[0]), int(r[1])] for r in ranges):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def subtract_ranges(ranges: List[list], minus: List[list]) -> List[list]:
    """``[start, end)`` pieces of ``ranges`` outside every range of ``minus`` (both sorted)."""
    out: List[list] = []
    for s, e in ranges:
        pos = s
        for ms, me in minus:
            if me <= pos or ms >= e:
                continue
            if ms > pos:
                out.append([pos, ms])
            pos = max(pos, me)
            if pos >= e:
                break
        if pos < e:
            out.append([pos, e])
    return out


def committed_missing(ps, within: List[list], coverage: List[list]) -> List[list]:
    """``[start, end)`` ranges the metadata holds as committed, at or above the log start offset
    and inside ``within``, that ``coverage`` (what files were found to hold) does not: data a
    replica or a reader should find and does not. Aborted and truncated ranges need no bytes,
    so only committed ones count. The one rule of both the replica check (a follower short of
    what ``held`` says) and the readers (committed data lost on storage)."""
    lo = ps.log_start_offset
    committed = merge_ranges([[max(s, lo), e] for s, e, _ in ps.committed if e > lo])
    claimed = subtract_ranges(committed, subtract_ranges(committed, merge_ranges(within)))
    return subtract_ranges(claimed, merge_ranges(coverage))


def holds(held: List[list], start: int, end: int) -> bool:
    """Whether merged ranges ``held`` cover all of ``[start, end)``."""
    return start >= end or any(s <= start and end <= e for s, e in held)


def new_replication(ps: PartitionState, leader: str) -> dict:
    """A partition's replication state when it starts to be replicated: the leader alone in
    sync, nothing held elsewhere, and the high watermark where readers already see it, so
    turning replication on hides nothing that was visible."""
    return {"leader": leader, "isr": [leader], "joining": [], "partition_epoch": 0, "held": {},
            "high_watermark": ps.last_stable_offset, "acked_above_hw": []}


def leader_of(ps: Optional[PartitionState], replicas: Sequence[str]) -> str:
    """The log dir writers write and readers read: the elected one, else the preferred one."""
    if ps is not None and ps.replication is not None:
        return ps.replication["leader"]
    return replicas[0]


def replica_end(ps: PartitionState, log_dir: str, leader: Optional[str] = None) -> int:
    """``end(r)``: the first committed offset at or above the log start offset that ``r`` does
    not hold, capped at the last stable offset. The leader holds every committed range by the
    write rule (§3); aborted ranges are gaps and need no bytes, so only committed ranges count."""
    lso = ps.last_stable_offset
    if ps.replication is None or log_dir == (leader or ps.replication["leader"]):
        return lso
    held = ps.replication["held"].get(log_dir, [])
    i = 0
    for start, end, _epoch in ps.committed:
        pos = max(start, ps.log_start_offset)
        while pos < end:
            while i < len(held) and held[i][1] <= pos:
                i += 1
            if i < len(held) and held[i][0] <= pos:
                pos = held[i][1]
            else:
                return min(pos, lso)
    return lso


def effective_min_isr(min_insync_replicas: int, replication_factor: int) -> int:
    """Kafka's: a ``min.insync.replicas`` above the replication factor counts as the factor."""
    return min(min_insync_replicas, replication_factor)


def recompute_high_watermark(ps: PartitionState, replicas: Sequence[str],
                             min_insync_replicas: int) -> None:
    """The high watermark rises to the least end of the ISR and the joining replicas, never
    past the last stable offset, never back, and not at all while the ISR is below the effective
    ``min.insync.replicas`` (Kafka 3.7's rule, KAFKA-15583): "visible" means "on at least
    min.insync.replicas roots"."""
    rep = ps.replication
    if rep is None:
        return
    leader = rep["leader"]
    candidate = ps.last_stable_offset
    for r in rep["isr"] + rep["joining"]:
        if r != leader:
            candidate = min(candidate, replica_end(ps, r, leader))
    if len(rep["isr"]) >= effective_min_isr(min_insync_replicas, len(replicas)):
        rep["high_watermark"] = max(rep["high_watermark"], candidate)
    if rep["acked_above_hw"]:
        rep["acked_above_hw"] = [r for r in rep["acked_above_hw"] if r[1] > rep["high_watermark"]]


def clip_held(ps: PartitionState) -> None:
    """Below the log start offset nothing is held: the data is gone everywhere."""
    rep = ps.replication
    if rep is None:
        return
    lo = ps.log_start_offset
    rep["held"] = {d: [[max(s, lo), e] for s, e in rs if e > lo]
                   for d, rs in rep["held"].items()}
    rep["held"] = {d: rs for d, rs in rep["held"].items() if rs}
    rep["high_watermark"] = max(rep["high_watermark"], lo)


def check_progress(ps: PartitionState, replicas: Sequence[str],
                   ranges: Dict[str, list]) -> Optional[str]:
    """Why a ``replica_progress`` for one partition is invalid, or None."""
    leader = ps.replication["leader"]
    for log_dir, rs in ranges.items():
        if log_dir not in replicas or log_dir == leader:
            return (f"log dir {log_dir!r} is not a follower of this partition (replicas "
                    f"{', '.join(replicas)}, leader {leader})")
        for r in rs:
            if len(r) != 2 or not 0 <= r[0] < r[1] <= ps.next_offset:
                return f"range {r!r:.60} is not within [0, next offset {ps.next_offset}]"
    return None


def apply_lost(ps: PartitionState, ranges: Dict[str, list]) -> None:
    """``replica_lost``: the ranges leave ``held[log dir]``, and a log dir that held any of them
    at or above the log start offset leaves ``isr`` and ``joining`` (partition epoch + 1).
    Ranges below the log start offset are gone everywhere (retention ran meanwhile): they
    change nothing, so a check that raced a deletion never shrinks the ISR. The caller has
    checked the ranges with :func:`check_progress`."""
    rep = ps.replication
    lo = ps.log_start_offset
    held = dict(rep["held"])
    isr, joining = list(rep["isr"]), list(rep["joining"])
    changed = False
    for log_dir, rs in ranges.items():
        have = held.get(log_dir, [])
        lost = [[max(s, lo), e] for s, e in merge_ranges(rs) if e > lo]
        remaining = subtract_ranges(have, lost)
        if remaining == have:
            continue
        held[log_dir] = remaining
        if not remaining:
            del held[log_dir]
        if log_dir in isr or log_dir in joining:
            isr = [r for r in isr if r != log_dir]
            joining = [r for r in joining if r != log_dir]
            changed = True
    ps.replication = dict(rep, held=held, isr=isr, joining=joining,
                          partition_epoch=rep["partition_epoch"] + (1 if changed else 0))


def apply_progress(ps: PartitionState, ranges: Dict[str, list]) -> None:
    held = dict(ps.replication["held"])
    for log_dir, rs in ranges.items():
        merged = merge_ranges(held.get(log_dir, []) + [list(r) for r in rs])
        held[log_dir] = _bridge_gaps(ps, merged)
    ps.replication = dict(ps.replication, held=held)
    clip_held(ps)


def _bridge_gaps(ps: PartitionState, held: List[list]) -> List[list]:
    """Join held ranges separated only by aborted offsets (aborted and truncated ranges are
    gaps for good: they need no bytes and are never reserved again), so that a caught-up
    replica holds one range however many writes were aborted. Never across an open
    reservation: it may still commit."""
    out: List[list] = []
    for r in held:
        if out and holds(ps.aborted, out[-1][1], r[0]):
            out[-1][1] = r[1]
        else:
            out.append(list(r))
    return out


def check_isr_change(ps: PartitionState, replicas: Sequence[str], partition_epoch: int,
                     isr: List[str], joining: List[str]) -> Optional[tuple]:
    """(error name, message) when an ``alter_isr`` for one partition is invalid, else None."""
    rep = ps.replication
    if partition_epoch != rep["partition_epoch"]:
        return ("INVALID_UPDATE_VERSION", f"partition epoch {partition_epoch} is not the "
                f"current one, {rep['partition_epoch']}")
    leader = rep["leader"]
    if not isr or isr[0] != leader:
        return ("INVALID_REQUEST", f"the ISR must start with the leader {leader!r}")
    both = isr + joining
    if len(set(both)) != len(both) or any(r not in replicas for r in both):
        return ("INVALID_REQUEST", "isr and joining must be distinct replicas of the partition, "
                "and disjoint")
    hw = rep["high_watermark"]
    for r in isr:
        if r not in rep["isr"]:
            if r not in rep["joining"]:
                return ("INELIGIBLE_REPLICA", f"{r!r} joins the ISR without having been joining")
            end = replica_end(ps, r, leader)
            if end < hw:
                return ("INELIGIBLE_REPLICA", f"{r!r} holds data up to {end}, below the high "
                        f"watermark {hw}")
            held = rep["held"].get(r, [])
            lacking = [a for a in rep["acked_above_hw"]
                       if not holds(held, max(a[0], ps.log_start_offset), a[1])]
            if lacking:
                return ("INELIGIBLE_REPLICA", f"{r!r} lacks acks=all data above the high "
                        f"watermark: {lacking[0]}")
    return None


def apply_isr_change(ps: PartitionState, isr: List[str], joining: List[str]) -> None:
    ps.replication = dict(ps.replication, isr=list(isr), joining=list(joining),
                          partition_epoch=ps.replication["partition_epoch"] + 1)


# -- acks -----------------------------------------------------------------------------------------

def acks_all_problem(ps: PartitionState, replicas: Sequence[str], min_insync_replicas: int,
                     start: int, end: int, *, appended: bool) -> Optional[tuple]:
    """(error name, message) when an acks=all range ``[start, end)`` of a replicated partition
    may not be reserved (``appended`` False: only the ISR size counts) or committed yet (every
    ISR and joining member holds it), else None. The one rule for replay and for waiting
    writers."""
    rep = ps.replication
    if rep is None:
        return None
    need = effective_min_isr(min_insync_replicas, len(replicas))
    if len(rep["isr"]) < need:
        name = "NOT_ENOUGH_REPLICAS_AFTER_APPEND" if appended else "NOT_ENOUGH_REPLICAS"
        return (name, f"the ISR {rep['isr']} is smaller than min.insync.replicas "
                f"{min_insync_replicas} (effective {need})")
    if appended:
        for r in rep["isr"] + rep["joining"]:
            if r != rep["leader"] and not holds(rep["held"].get(r, []), start, end):
                return ("NOT_ENOUGH_REPLICAS_AFTER_APPEND", f"{r} does not hold offsets "
                        f"{start} to {end - 1} yet")
    return None


def add_acked(ps: PartitionState, start: int, end: int) -> None:
    rep = ps.replication
    if rep is not None and end > rep["high_watermark"]:
        ps.replication = dict(rep, acked_above_hw=merge_ranges(rep["acked_above_hw"]
                                                               + [[start, end]]))


# -- elections ------------------------------------------------------------------------------------

ELECTIONS = ("offline", "unclean", "reassign")


def check_election(ps: PartitionState, replicas: Sequence[str], partition_epoch: int,
                   leader: str, election: str, unclean_enabled: bool,
                   whole_reassign: bool = False) -> Optional[tuple]:
    """Why an ``elect_leader`` may not apply to a partition, or None. ``whole_reassign`` (the
    feature ``replicaCheck``): a ``"reassign"`` election's new leader must hold every committed
    range when the entry is replayed, so that a commit landing between the coordinator's check
    and its entry is never truncated by a move that no fault forced."""
    rep = ps.replication
    if partition_epoch != rep["partition_epoch"]:
        return ("INVALID_UPDATE_VERSION", f"partition epoch {partition_epoch} is not the "
                f"current one, {rep['partition_epoch']}")
    if leader not in replicas:
        return ("INVALID_REQUEST", f"{leader!r} is not a replica ({', '.join(replicas)})")
    if leader == rep["leader"]:
        return ("ELECTION_NOT_NEEDED", f"{leader} leads already")
    if election == "offline" and leader not in rep["isr"]:
        return ("ELIGIBLE_LEADERS_NOT_AVAILABLE", f"{leader} is not in the ISR {rep['isr']}")
    if election == "unclean" and not unclean_enabled:
        return ("ELIGIBLE_LEADERS_NOT_AVAILABLE", "unclean.leader.election.enable is false")
    if election == "reassign" and (leader not in rep.get("target", ())
                                   or leader not in rep["isr"]):
        return ("ELIGIBLE_LEADERS_NOT_AVAILABLE", f"{leader} is not an in-sync target of a "
                "reassignment in progress")
    if election == "reassign" and whole_reassign:
        lo = ps.log_start_offset
        lacking = subtract_ranges(merge_ranges([[max(s, lo), e] for s, e, _ in ps.committed
                                                if e > lo]), rep["held"].get(leader, []))
        if lacking:
            return ("ELIGIBLE_LEADERS_NOT_AVAILABLE", f"{leader} does not hold offsets "
                    f"{lacking[0][0]} to {lacking[0][1] - 1} yet: the move waits for its copy")
    return None


def apply_election(ps: PartitionState, leader: str, election: str) -> List[list]:
    """The new leader's log becomes the partition's: committed ranges it lacks are truncated
    (returned; the caller records them as aborted and aborts the open txns). The caller has
    checked :func:`check_election`."""
    rep = ps.replication
    lo = ps.log_start_offset
    committed = [[max(s, lo), e] for s, e, _ in ps.committed if e > lo]
    lacking = subtract_ranges(committed, rep["held"].get(leader, []))
    if lacking:
        kept: List[list] = []
        for s, e, epoch in ps.committed:
            for piece in subtract_ranges([[s, e]], lacking):
                kept.append([piece[0], piece[1], epoch])
        ps.committed = kept
        for s, e in lacking:
            ps.add_aborted(s, e)
    old = rep["leader"]
    held = {d: rs for d, rs in rep["held"].items() if d != leader}
    now_committed = merge_ranges([[max(s, lo), e] for s, e, _ in ps.committed if e > lo])
    if now_committed:
        held[old] = now_committed
    if election == "unclean":
        # acks=all data the new leader holds keeps its protection: a later clean election must
        # not truncate it either
        isr, joining, acked = [leader], [], subtract_ranges(rep["acked_above_hw"], lacking)
    elif election == "reassign":   # the old leader is online and holds it all: it stays in sync
        isr = [leader] + [r for r in rep["isr"] if r != leader]
        joining, acked = [r for r in rep["joining"] if r != leader], rep["acked_above_hw"]
    else:
        isr = [leader] + [r for r in rep["isr"] if r not in (leader, old)]
        joining, acked = [r for r in rep["joining"] if r != leader], rep["acked_above_hw"]
    ps.replication = dict(rep, leader=leader, isr=isr, joining=joining, held=held,
                          acked_above_hw=acked, partition_epoch=rep["partition_epoch"] + 1)
    ps.leader_epoch += 1
    return lacking


# -- reassignment ---------------------------------------------------------------------------------

def check_reassign(ps: Optional[PartitionState], targets: List[str]) -> Optional[tuple]:
    if ps is not None and ps.replication is not None and "target" in ps.replication:
        return ("REASSIGNMENT_IN_PROGRESS", f"targets {ps.replication['target']} are still "
                "being reached")
    if not targets or len(set(targets)) != len(targets) or not all(_log_dir_name(t)
                                                                    for t in targets):
        return ("INVALID_REPLICA_ASSIGNMENT", f"targets {targets} must be distinct log dir "
                "names logdir-<n>")
    return None


def _log_dir_name(name: str) -> bool:
    prefix, _, n = name.rpartition("-")
    return prefix == "logdir" and n.isdigit() and n.isascii()


def check_complete(ps: PartitionState, partition_epoch: int) -> Optional[tuple]:
    rep = ps.replication
    if rep is None or "target" not in rep:
        return ("INVALID_REQUEST", "no reassignment is in progress")
    if partition_epoch != rep["partition_epoch"]:
        return ("INVALID_UPDATE_VERSION", f"partition epoch {partition_epoch} is not the "
                f"current one, {rep['partition_epoch']}")
    missing = [t for t in rep["target"] if t not in rep["isr"]]
    if missing or rep["leader"] not in rep["target"]:
        return ("INVALID_REQUEST", f"targets not in sync yet: {missing}" if missing else
                f"the leader {rep['leader']} is not a target")
    return None


def apply_complete(ps: PartitionState) -> List[str]:
    """Ends a reassignment; returns the new replicas."""
    rep = ps.replication
    target = list(rep["target"])
    leader = rep["leader"]
    isr = [leader] + [r for r in rep["isr"] if r in target and r != leader]
    joining = [r for r in rep["joining"] if r in target]
    held = {d: rs for d, rs in rep["held"].items() if d in target}
    ps.replication = {k: v for k, v in rep.items() if k != "target"}
    ps.replication.update(isr=isr, joining=joining, held=held,
                          partition_epoch=rep["partition_epoch"] + 1)
    return target


def replica_lag(ps: PartitionState, log_dir: str, replicas: Sequence[str]) -> int:
    """Kafka's DescribeLogDirs ``offsetLag``: how far a replica is behind the last stable
    offset (0 for the leader). A follower of a partition that is not replicated holds nothing."""
    if log_dir == leader_of(ps, replicas):
        return 0
    if ps.replication is None:
        return max(0, ps.last_stable_offset - ps.log_start_offset)
    return max(0, ps.last_stable_offset - replica_end(ps, log_dir))
