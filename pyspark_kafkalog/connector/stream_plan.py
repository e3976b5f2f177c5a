"""Planning a streaming micro-batch: source offsets, admission control and fast catch-up.

Kept free of Spark (the DataSource shell is ``spark/stream_reader.py``) so that every rule can be
tested on its own. The meaning follows Spark's Kafka source (KafkaMicroBatchStream) wherever it
applies.

**Offsets** have the JSON shape of Spark's connector, ``{"topic": {"0": 42}}``: the next offset
to read per partition, so a user can read a checkpoint. Fast catch-up (KIP-333) adds one key that
can never be a topic name (Kafka's topic names are ``[a-zA-Z0-9._-]``)::

    {"events": {"0": 1500}, "$catchUp": {"events": {"0": [200, 1000]}},
     "$catchUpRecordsLeft": 800}

``[position, end]``: the gap ``[position, end)`` is still to be read; the fresh stream began at
``end``. A restart during catch-up that finds the fresh stream far behind again opens a second
range behind the first: ``[[200, 1000], [1500, 21500]]``, read in that order (a one-range gap
keeps the one-pair form that every earlier version wrote). ``$catchUpRecordsLeft`` is derived
(for the query progress) and ignored when read. A gap that closes in a batch is kept as
``[end, end]`` in that batch's end offset and dropped in the next.

**What a batch reads** follows from its two offsets alone (:func:`batch_ranges`), which is what
lets Spark replay a batch after a crash and read exactly the same records: an offset is *unread*
while it is in a gap range or at or past the fresh position, and a batch reads what is unread at
its start and no longer unread at its end.

**Fast catch-up** (KIP-333; :func:`open_gaps`, :func:`advance_gaps`): at a restart more than
``fastCatchUpThreshold`` records behind, the fresh stream jumps to the latest offsets and what
it skipped becomes the gap. From then on the two move independently in every batch: the fresh
stream by Spark's read limit (``maxOffsetsPerTrigger``, ``maxBytesPerTrigger``,
``minOffsetsPerTrigger``: :func:`admit`, exactly as without a gap), the gap by
``fastCatchUpRecordsPerTrigger``, whatever the read limit (also without any). So a fresh record
waits for no backlog: only for fresh records before it, as it would without fast catch-up.

**Admission control** (:func:`admit`): ``maxOffsetsPerTrigger`` and ``maxBytesPerTrigger`` are
split across partitions in proportion to their backlog by the largest remainder, so the total is
never above the limit (Spark's ``rateLimit`` rounds shares below one record up, which over
thousands of partitions can pass the limit many times over); ``minOffsetsPerTrigger`` with
``maxTriggerDelay`` skips a trigger while the backlog is small and the delay has not passed.
A byte budget smaller than one record still admits one record, so a query always progresses.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Tuple

from ..errors import InvalidConfigError

TopicPartition = Tuple[str, int]
Positions = Dict[TopicPartition, int]
Gaps = Dict[TopicPartition, Tuple[int, int]]
Range = Tuple[int, int]
#: a partition's gap as ranges in offset order (all below its fresh position)
GapRanges = Dict[TopicPartition, List[Range]]
CATCH_UP = "$catchUp"
#: above any offset: the fresh stream's unread range is ``[position, _END)``
_END = 1 << 63
#: records left in the gaps: derived, written for the query progress, ignored when read
GAP_RECORDS = "$catchUpRecordsLeft"


# -- the offset JSON -----------------------------------------------------------------------------

@dataclass
class SourceOffset:
    """A parsed source offset: the fresh stream's next offsets and the open catch-up gaps.

    ``gaps[tp]`` is the gap range being read; ``queued[tp]``, the ranges after it (opened by a
    later restart during catch-up), read once it closes. :meth:`gap_ranges` gives both as one
    list per partition; :meth:`of_ranges` builds an offset from such lists."""

    positions: Positions
    gaps: Gaps
    queued: Dict[TopicPartition, Tuple[Range, ...]] = field(default_factory=dict)

    @classmethod
    def of_ranges(cls, positions: Positions, ranges: Mapping[TopicPartition, List[Range]]
                  ) -> "SourceOffset":
        gaps: Gaps = {}
        queued: Dict[TopicPartition, Tuple[Range, ...]] = {}
        for tp, rs in ranges.items():
            if rs:
                gaps[tp] = tuple(rs[0])
                if len(rs) > 1:
                    queued[tp] = tuple(tuple(r) for r in rs[1:])
        return cls(positions, gaps, queued)

    def gap_ranges(self) -> GapRanges:
        return {tp: [g, *self.queued.get(tp, ())] for tp, g in self.gaps.items()}

    def to_json(self) -> dict:
        out: dict = {}
        for (topic, p), offset in sorted(self.positions.items()):
            out.setdefault(topic, {})[str(p)] = offset
        if self.gaps:
            gaps: dict = {}
            for (topic, p), rs in sorted(self.gap_ranges().items()):
                gaps.setdefault(topic, {})[str(p)] = (
                    [rs[0][0], rs[0][1]] if len(rs) == 1 else [[pos, end] for pos, end in rs])
            out[CATCH_UP] = gaps
            out[GAP_RECORDS] = self.remaining_gap()   # shown in the query progress
        return out

    @classmethod
    def from_json(cls, d) -> "SourceOffset":
        """Also reads what Spark's Kafka connector writes (no ``$catchUp``)."""
        if not isinstance(d, dict):
            raise InvalidConfigError(f"not a kafkalog source offset: {d!r:.200}")
        positions: Positions = {}
        ranges: GapRanges = {}
        for topic, parts in d.items():
            if topic == GAP_RECORDS:
                continue
            if not isinstance(parts, dict):
                raise InvalidConfigError(f"not a kafkalog source offset: {d!r:.200}")
            if topic == CATCH_UP:
                for t, ps in parts.items():
                    for p, pair in ps.items():
                        ranges[(t, int(p))] = _parse_gap(t, p, pair)
                continue
            for p, offset in parts.items():
                if isinstance(offset, bool) or not isinstance(offset, int):
                    raise InvalidConfigError(f"bad offset {topic}-{p}: {offset!r}")
                positions[(topic, int(p))] = offset
        return cls.of_ranges(positions, ranges)

    def committed_positions(self) -> Positions:
        """What a consumer group should hold: while a gap is open, its position (KIP-333: the
        records before it are not all read yet, so a restart must not skip them)."""
        out = dict(self.positions)
        for tp, rs in self.gap_ranges().items():
            first_open = next((pos for pos, end in rs if pos < end), None)
            if first_open is not None:
                out[tp] = first_open
        return out

    def remaining_gap(self) -> int:
        return sum(max(0, end - pos) for rs in self.gap_ranges().values() for pos, end in rs)


def _parse_gap(topic, p, value) -> List[Range]:
    """``[pos, end]`` or ``[[pos, end], ...]`` (ranges in offset order, not overlapping)."""
    def pair(v) -> bool:
        return (isinstance(v, list) and len(v) == 2
                and all(isinstance(x, int) and not isinstance(x, bool) for x in v))
    if pair(value):
        return [(value[0], value[1])]
    if isinstance(value, list) and value and all(pair(v) for v in value):
        rs = [(v[0], v[1]) for v in value]
        if all(a[1] <= b[0] for a, b in zip(rs, rs[1:])):
            return rs
    raise InvalidConfigError(f"bad catch-up gap {topic}-{p}: {value!r:.200}")


# -- what one batch reads ------------------------------------------------------------------------

def _minus(a: List[Range], b: List[Range]) -> List[Range]:
    """The offsets of ranges ``a`` not in ranges ``b`` (each sorted, not overlapping)."""
    out = []
    for lo, hi in a:
        for blo, bhi in b:
            if bhi <= lo or blo >= hi:
                continue
            if blo > lo:
                out.append((lo, blo))
            lo = max(lo, bhi)
            if lo >= hi:
                break
        if lo < hi:
            out.append((lo, hi))
    return out


def _unread(ranges: GapRanges, tp: TopicPartition, head: int) -> List[Range]:
    rs = [(pos, end) for pos, end in ranges.get(tp, ()) if pos < end]
    return rs + [(head, _END)]


def batch_ranges(start: SourceOffset, end: SourceOffset,
                 earliest: Callable[[TopicPartition], int],
                 tps: Optional[Iterable[TopicPartition]] = None
                 ) -> List[Tuple[TopicPartition, int, int, str]]:
    """``(tp, from, until, kind)`` of the batch between two offsets; ``kind`` is ``fresh`` or
    ``gap``. What is read is what was unread at ``start`` (its gap ranges and everything from
    its fresh position on) and is not unread at ``end``; ``gap`` marks what lies below the end of
    ``end``'s last gap range (the backlog the gap was opened for), ``fresh`` the rest. A
    partition new in ``end`` starts at ``earliest(tp)`` (its log start offset), as Spark's
    connector starts new partitions. ``tps``: only these partitions (the caller knows the
    others did not move). Per partition the ranges come in offset order."""
    out = []
    items = (end.positions.items() if tps is None else
             ((tp, end.positions[tp]) for tp in sorted(tps) if tp in end.positions))
    start_ranges, end_ranges = start.gap_ranges(), end.gap_ranges()
    for tp, until in items:
        head = start.positions.get(tp)
        if head is None:
            head = earliest(tp)
        read = _minus(_unread(start_ranges, tp, head), _unread(end_ranges, tp, until))
        gap_top = max((e for _, e in end_ranges.get(tp, ())), default=None)
        for lo, hi in read:
            if gap_top is not None and lo < gap_top:
                out.append((tp, lo, min(hi, gap_top), "gap"))
                lo = min(hi, gap_top)
            if lo < hi:
                out.append((tp, lo, hi, "fresh"))
    return out


# -- fast catch-up (KIP-333) ---------------------------------------------------------------------

def open_gaps(begin: Positions, latest: Positions, log_start: Mapping[TopicPartition, int],
              ranges: GapRanges, threshold: int
              ) -> Optional[Tuple[Positions, GapRanges]]:
    """At a restart: if the fresh stream is more than ``threshold`` records behind (the records
    from ``begin``, or the log start offset, to ``latest``), the fresh stream's new start (the
    latest offsets) and the gap ranges with what it skipped added behind any gap still open
    from an earlier restart (joined to its last range when they touch); else None."""
    backlog = sum(max(0, latest[tp] - max(begin[tp], log_start.get(tp, 0))) for tp in latest)
    if backlog <= threshold:
        return None
    out: GapRanges = {tp: [r for r in rs if r[0] < r[1]] for tp, rs in ranges.items()}
    for tp in latest:
        if latest[tp] <= begin[tp]:
            continue
        rs = out.setdefault(tp, [])
        if rs and rs[-1][1] == begin[tp]:
            rs[-1] = (rs[-1][0], latest[tp])
        else:
            rs.append((begin[tp], latest[tp]))
    out = {tp: rs for tp, rs in out.items() if rs}
    return {tp: max(begin[tp], latest[tp]) for tp in latest}, out


def advance_gaps(ranges: GapRanges, budget: int, log_start: Mapping[TopicPartition, int],
                 lost: Optional[Callable[[TopicPartition, int, int], None]] = None
                 ) -> GapRanges:
    """The gap ranges after one batch: ``budget`` (``fastCatchUpRecordsPerTrigger``) records
    split across partitions by what each has left (largest remainder), each partition's share
    taken from its ranges in order. Offsets below the log start offset were deleted before they
    were read: ``lost(tp, first, last)`` is told and they are stepped over. A partition whose
    gap had closed in the previous batch is dropped; one closing now keeps ``[end, end]``."""
    clamped: GapRanges = {}
    for tp, rs in ranges.items():
        open_rs = [(pos, end) for pos, end in rs if pos < end]
        if not open_rs:
            continue                         # closed in the previous batch: dropped
        lso = log_start.get(tp, 0)
        kept = []
        for pos, end in open_rs:
            if pos < lso:
                if lost is not None:
                    lost(tp, pos, min(lso, end) - 1)
                pos = min(lso, end)
            kept.append((pos, end))
        clamped[tp] = kept
    left = {tp: sum(end - pos for pos, end in rs) for tp, rs in clamped.items()}
    if sum(left.values()) > budget:
        shares = split_budget({tp: float(n) for tp, n in left.items() if n > 0}, budget)
    else:
        shares = left
    out: GapRanges = {}
    for tp, rs in clamped.items():
        take = shares.get(tp, 0)
        moved = []
        for pos, end in rs:
            step = min(take, end - pos)
            take -= step
            moved.append((pos + step, end))
        still = [r for r in moved if r[0] < r[1]]
        out[tp] = still or [(moved[-1][1], moved[-1][1])]
    return out


# -- admission control -------------------------------------------------------------------------

@dataclass
class Limits:
    max_rows: Optional[int] = None
    min_rows: Optional[int] = None
    max_trigger_delay_ms: int = 15 * 60 * 1000
    max_bytes: Optional[int] = None


def split_budget(weights: Mapping[TopicPartition, float], budget: int
                 ) -> Dict[TopicPartition, int]:
    """``budget`` split in proportion to ``weights`` by the largest remainder: integer shares
    that sum to exactly ``min(budget, ...)`` and never starve a partition while any is left."""
    total = sum(weights.values())
    if total <= 0 or budget <= 0:
        return {tp: 0 for tp in weights}
    exact = {tp: budget * w / total for tp, w in weights.items()}
    out = {tp: math.floor(x) for tp, x in exact.items()}
    left = budget - sum(out.values())
    for tp in sorted(exact, key=lambda t: (out[t] - exact[t], t))[:max(0, left)]:
        out[tp] += 1
    return out


def limit_rows(start: Positions, latest: Positions, max_rows: int) -> Positions:
    """Spark's ``maxOffsetsPerTrigger``, never above it in total."""
    backlog = {tp: latest[tp] - start[tp] for tp in latest if latest[tp] > start[tp]}
    if sum(backlog.values()) <= max_rows:
        return dict(latest)
    shares = split_budget(backlog, max_rows)
    return {tp: start[tp] + min(backlog[tp], shares[tp]) if tp in backlog else latest[tp]
            for tp in latest}


def limit_bytes(start: Positions, latest: Positions, max_bytes: int,
                bytes_per_offset: Callable[[TopicPartition], float]) -> Positions:
    """``maxBytesPerTrigger``: the budget split in proportion to each partition's backlog in
    bytes (estimated from its segment sizes); at least one record when nothing else fits."""
    backlog = {tp: latest[tp] - start[tp] for tp in latest if latest[tp] > start[tp]}
    if not backlog:
        return dict(latest)
    size = {tp: max(bytes_per_offset(tp), 1e-9) for tp in backlog}
    weights = {tp: backlog[tp] * size[tp] for tp in backlog}
    if sum(weights.values()) <= max_bytes:
        return dict(latest)
    byte_shares = split_budget(weights, max_bytes)
    take = {tp: min(backlog[tp], int(byte_shares[tp] // size[tp])) for tp in backlog}
    if not any(take.values()):
        first = max(backlog, key=lambda t: (weights[t], t))
        take[first] = 1
    return {tp: start[tp] + take[tp] if tp in backlog else latest[tp] for tp in latest}


def admit(start: Positions, latest: Positions, limits: Optional[Limits], *, now_ms: int,
          last_trigger_ms: int,
          bytes_per_offset: Optional[Callable[[TopicPartition], float]] = None
          ) -> Optional[Positions]:
    """The end positions of the next batch, or None to skip this trigger (too little data and
    ``maxTriggerDelay`` not passed). ``limits`` None: read everything (ReadAllAvailable)."""
    start = {tp: start.get(tp, latest[tp]) for tp in latest}
    if limits is None:
        return dict(latest)
    backlog = sum(max(0, latest[tp] - start[tp]) for tp in latest)
    if (limits.min_rows is not None and backlog < limits.min_rows
            and now_ms - last_trigger_ms < limits.max_trigger_delay_ms):
        return None
    end = dict(latest)
    if limits.max_rows is not None:
        end = limit_rows(start, end, limits.max_rows)
    if limits.max_bytes is not None and bytes_per_offset is not None:
        end = limit_bytes(start, end, limits.max_bytes, bytes_per_offset)
    return end
