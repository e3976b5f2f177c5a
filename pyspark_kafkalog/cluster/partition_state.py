"""One partition's offsets in the replayed state: ranges reserved, committed and aborted, the
log start offset, the leader epoch and, for a replicated partition, its ISR and stored high
watermark (docs/protocol.md §1.3, §3-§5; the replication rules are in ``isr.py``).

Partition states are shared between successive cluster states (copy-on-write, see
``state.ClusterState``): a handler that changes one first takes a private copy with
:meth:`PartitionState.clone`, so a state someone still holds never changes under them. A
range (``[start, end, ...]``) is never changed in place, only replaced in its list, so a clone
copies the lists and dicts and shares the ranges.
"""
from __future__ import annotations

import bisect
from operator import itemgetter
from typing import Dict, List, Optional, Tuple

#: a range's start: the key its lookups bisect on, without building a list of starts per
#: lookup (a read asks once per segment, and a partition keeps a range per job)
_start = itemgetter(0)
_end = itemgetter(1)


def tp_key(topic: str, partition: int) -> str:
    return f"{topic}:{partition}"


def split_key(key: str) -> Tuple[str, int]:
    topic, _, part = key.rpartition(":")
    return topic, int(part)


class PartitionState:
    """Offsets of one partition. Ranges are ``[start, end, leader_epoch]``, end exclusive."""

    __slots__ = ("next_offset", "log_start_offset", "leader_epoch", "last_producer", "open",
                 "committed", "aborted", "replication")

    def __init__(self, next_offset: int = 0, log_start_offset: int = 0, leader_epoch: int = -1,
                 last_producer: Optional[str] = None, open_: Optional[dict] = None,
                 committed: Optional[list] = None, aborted: Optional[list] = None,
                 replication: Optional[dict] = None):
        self.next_offset = next_offset
        self.log_start_offset = log_start_offset
        self.leader_epoch = leader_epoch
        self.last_producer = last_producer
        self.open: Dict[str, list] = open_ or {}          # txn -> [start, end, epoch]
        self.committed: List[list] = committed or []      # sorted, merged
        # [start, end) of aborted reservations at or above the log start offset, sorted and
        # merged: cleanup deletes a segment only on this positive evidence (or the log start
        # offset), never because a range is merely absent from ``committed``
        self.aborted: List[list] = [] if aborted is None else aborted
        #: None unless the partition is replicated under the feature ``replication`` (§1.3):
        #: leader, isr, joining, partition_epoch, held {log dir: [[start, end]...]},
        #: high_watermark, acked_above_hw.
        #: Replaced, or its top-level keys set, never changed deeper (clones share the rest).
        self.replication: Optional[dict] = replication

    @property
    def last_stable_offset(self) -> int:
        """Start of the lowest open reservation: it moves only over resolved writes."""
        if self.open:
            return min(r[0] for r in self.open.values())
        return self.next_offset

    @property
    def high_watermark(self) -> int:
        """Where visible data ends: the last stable offset, or for a replicated partition the
        stored high watermark, which also waits for the ISR to hold the data (§1.3)."""
        if self.replication is not None:
            return self.replication["high_watermark"]
        return self.last_stable_offset

    def visible_ranges(self) -> List[Tuple[int, int, int]]:
        """Committed ``(start, end, epoch)`` clipped to ``[log start offset, high watermark)``."""
        lo, hi = self.log_start_offset, self.high_watermark
        out = []
        for start, end, epoch in self.committed:
            s, e = max(start, lo), min(end, hi)
            if s < e:
                out.append((s, e, epoch))
        return out

    def is_visible(self, offset: int) -> bool:
        if not (self.log_start_offset <= offset < self.high_watermark):
            return False
        i = bisect.bisect_right(self.committed, offset, key=_start) - 1
        return i >= 0 and offset < self.committed[i][1]

    def next_visible_offset(self, offset: int) -> Optional[int]:
        """The first offset >= ``offset`` holding a visible record, or None if none is left."""
        offset = max(offset, self.log_start_offset)
        for start, end, _ in self.committed:
            if end > offset:
                first = max(start, offset)
                return first if first < self.high_watermark else None
        return None

    def segment_visible(self, base_offset: int) -> bool:
        """Readers may open a segment iff it starts in a committed range below the high
        watermark. Segments never span reservations, so the base decides the whole file; one
        that starts below the log start offset but reaches past it stays readable."""
        if base_offset >= self.high_watermark:
            return False
        i = bisect.bisect_right(self.committed, base_offset, key=_start) - 1
        return i >= 0 and base_offset < self.committed[i][1]

    def is_committed(self, offset: int) -> bool:
        """Committed data, whether or not an older open reservation still holds the high
        watermark below it: committed is not the same as visible (docs/protocol.md §7)."""
        i = bisect.bisect_right(self.committed, offset, key=_start) - 1
        return i >= 0 and offset < self.committed[i][1]

    def committed_from(self, offset: int, keep_stretch: bool) -> List[list]:
        """The committed ranges a log start offset of ``offset`` leaves: those that end past
        it. ``keep_stretch`` (feature ``segmentMerge``, docs/protocol.md §4.1): the first of
        them starts where its gapless stretch of committed data starts, so that a merged
        segment whose base lies in a range now below the log start offset, and whose data
        reaches past it, stays visible by its base (§4). Offsets below the log start offset
        are not visible either way, and epochs start at it (``visible_ranges``); one range is
        kept, so the state does not grow with the stretch."""
        c = self.committed
        i = bisect.bisect_right(c, offset, key=_end)
        kept = c[i:]
        if not keep_stretch or not kept or i == 0 or c[i - 1][1] != kept[0][0]:
            return list(kept)
        j = i - 1
        while j > 0 and c[j - 1][1] == c[j][0]:
            j -= 1
        return [[c[j][0], kept[0][1], kept[0][2]]] + kept[1:]

    def contiguous_committed_end(self, offset: int, upto: Optional[int] = None) -> int:
        """Where the committed data from ``offset`` on stops without a gap: the end of the
        committed range holding it, carried on through the ranges that begin where the one
        before ends (writes of other epochs); ``offset`` itself if it is not committed.
        ``upto``: the caller needs no more than this (the walk stops once it is reached)."""
        i = bisect.bisect_right(self.committed, offset, key=_start) - 1
        if i < 0 or offset >= self.committed[i][1]:
            return offset
        end = self.committed[i][1]
        for start, e, _epoch in self.committed[i + 1:]:
            if start != end or upto is not None and end >= upto:
                break
            end = e
        return end

    def in_open_range(self, offset: int) -> bool:
        return any(r[0] <= offset < r[1] for r in self.open.values())

    def is_aborted(self, offset: int) -> bool:
        i = bisect.bisect_right(self.aborted, offset, key=_start) - 1
        return i >= 0 and offset < self.aborted[i][1]

    def add_aborted(self, start: int, end: int) -> None:
        if end <= self.log_start_offset:
            return
        ranges = sorted(self.aborted + [[max(start, self.log_start_offset), end]])
        merged: List[list] = []
        for r in ranges:
            if merged and merged[-1][1] >= r[0]:
                merged[-1][1] = max(merged[-1][1], r[1])
            else:
                merged.append(list(r))
        self.aborted = merged

    def segment_visible_uncommitted(self, base_offset: int) -> bool:
        """read_uncommitted also shows the data of open (undecided) writes."""
        return (self.segment_visible(base_offset)
                or any(r[0] <= base_offset < r[1] for r in self.open.values()))

    def add_committed(self, start: int, end: int, epoch: int) -> None:
        """Never changes a range in place, only the list: clones share the ranges (clone)."""
        c = self.committed
        if c and start > c[-1][0]:   # the usual case, a write after every range so far
            last = c[-1]
            if last[1] == start and last[2] == epoch:
                c[-1] = [last[0], end, epoch]
            else:
                c.append([start, end, epoch])
            return
        i = bisect.bisect_left(c, start, key=_start)
        merged: List[list] = []
        for r in c[:i] + [[start, end, epoch]] + c[i:]:
            if merged and merged[-1][1] == r[0] and merged[-1][2] == r[2]:
                merged[-1] = [merged[-1][0], r[1], r[2]]
            else:
                merged.append(r)
        self.committed = merged

    def leader_epoch_entries(self) -> List[Tuple[int, int]]:
        """``(epoch, start offset)`` for committed data, as ``leader-epoch-checkpoint`` has them."""
        out: List[Tuple[int, int]] = []
        for start, end, epoch in self.visible_ranges():
            if not out or epoch > out[-1][0]:
                out.append((epoch, start))
        return out

    def clone(self) -> "PartitionState":
        """Copies the containers, shares the ranges in them: no code changes a range in place,
        only replaces it. A deep copy cost a commit per partition as many lists as the
        partition has ranges, one per job since its retention last ran."""
        return PartitionState(self.next_offset, self.log_start_offset, self.leader_epoch,
                              self.last_producer, dict(self.open), list(self.committed),
                              list(self.aborted),
                              None if self.replication is None else dict(self.replication))

    def to_json(self) -> dict:
        out = {"next_offset": self.next_offset, "log_start_offset": self.log_start_offset,
               "leader_epoch": self.leader_epoch, "last_producer": self.last_producer,
               "open": self.open, "committed": self.committed, "aborted": self.aborted}
        if self.replication is not None:
            out["replication"] = self.replication
        return out

    def to_row(self) -> list:
        """The compact form of a snapshot part (docs/protocol.md §2): positions, not keys; a
        replicated partition's row has an eighth element, its replication state."""
        row = [self.next_offset, self.log_start_offset, self.leader_epoch, self.last_producer,
               self.open, self.committed, self.aborted]
        if self.replication is not None:
            row.append(self.replication)
        return row

    @classmethod
    def from_row(cls, row: list) -> "PartitionState":
        """From a freshly decoded part (its lists are this state's own); the part's hash has
        been checked, and a row of the wrong shape raises TypeError or ValueError."""
        n, lso, epoch, producer, open_, committed, aborted, *rest = row
        replication = rest[0] if len(rest) == 1 else None
        if not (type(n) is int and type(lso) is int and type(epoch) is int
                and type(open_) is dict and type(committed) is list and type(aborted) is list
                and len(rest) <= 1 and (not rest or check_replication(replication))):
            raise ValueError(f"partition row of the wrong shape: {row!r:.80}")
        return cls(n, lso, epoch, producer, open_, committed, aborted, replication)

    @classmethod
    def from_json(cls, d: dict) -> "PartitionState":
        return cls(d["next_offset"], d["log_start_offset"], d["leader_epoch"],
                   d.get("last_producer"), {k: list(r) for k, r in (d.get("open") or {}).items()},
                   [list(r) for r in d.get("committed") or []],
                   [list(r) for r in d.get("aborted") or []],
                   dict(d["replication"]) if d.get("replication") else None)


def check_replication(rep) -> bool:
    """A snapshot's replication state has its shape (snapshots are derived data: a wrong one
    is refused, and the reader falls back to an older snapshot or to replay)."""
    def strs(v):
        return type(v) is list and all(type(x) is str for x in v)

    def ranges(v):
        return type(v) is list and all(type(r) is list and len(r) == 2
                                       and all(type(x) is int for x in r) for r in v)
    return (type(rep) is dict and type(rep.get("leader")) is str and strs(rep.get("isr"))
            and strs(rep.get("joining")) and ranges(rep.get("acked_above_hw"))
            and type(rep.get("partition_epoch")) is int and type(rep.get("high_watermark")) is int
            and type(rep.get("held")) is dict
            and all(type(k) is str and ranges(v) for k, v in rep["held"].items())
            and ("target" not in rep or strs(rep["target"])))
