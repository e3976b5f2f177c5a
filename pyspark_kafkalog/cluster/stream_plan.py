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
``end``. ``$catchUpRecordsLeft`` is derived (for the query progress) and ignored when read. A gap that closes in a batch is kept as ``[end, end]`` in that batch's end offset, so
that the batch's ranges follow from its two offsets alone (:func:`batch_ranges`), which is what
lets Spark replay a batch after a crash and read exactly the same records.

**Admission control** (:func:`admit`): ``maxOffsetsPerTrigger`` and ``maxBytesPerTrigger`` are
split across partitions in proportion to their backlog by the largest remainder, so the total is
never above the limit (Spark's ``rateLimit`` rounds shares below one record up, which over
thousands of partitions can pass the limit many times over); ``minOffsetsPerTrigger`` with
``maxTriggerDelay`` skips a trigger while the backlog is small and the delay has not passed.
A byte budget smaller than one record still admits one record, so a query always progresses.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Tuple

from ..errors import InvalidConfigError

TopicPartition = Tuple[str, int]
Positions = Dict[TopicPartition, int]
Gaps = Dict[TopicPartition, Tuple[int, int]]
CATCH_UP = "$catchUp"
#: records left in the gaps: derived, written for the query progress, ignored when read
GAP_RECORDS = "$catchUpRecordsLeft"


# -- the offset JSON -----------------------------------------------------------------------------

@dataclass
class SourceOffset:
    """A parsed source offset: the fresh stream's next offsets and the open catch-up gaps."""

    positions: Positions
    gaps: Gaps

    def to_json(self) -> dict:
        out: dict = {}
        for (topic, p), offset in sorted(self.positions.items()):
            out.setdefault(topic, {})[str(p)] = offset
        if self.gaps:
            gaps: dict = {}
            for (topic, p), (pos, end) in sorted(self.gaps.items()):
                gaps.setdefault(topic, {})[str(p)] = [pos, end]
            out[CATCH_UP] = gaps
            out[GAP_RECORDS] = self.remaining_gap()   # shown in the query progress
        return out

    @classmethod
    def from_json(cls, d) -> "SourceOffset":
        """Also reads what Spark's Kafka connector writes (no ``$catchUp``)."""
        if not isinstance(d, dict):
            raise InvalidConfigError(f"not a kafkalog source offset: {d!r:.200}")
        positions: Positions = {}
        gaps: Gaps = {}
        for topic, parts in d.items():
            if topic == GAP_RECORDS:
                continue
            if not isinstance(parts, dict):
                raise InvalidConfigError(f"not a kafkalog source offset: {d!r:.200}")
            if topic == CATCH_UP:
                for t, ps in parts.items():
                    for p, pair in ps.items():
                        if (not isinstance(pair, list) or len(pair) != 2
                                or not all(isinstance(x, int) for x in pair)):
                            raise InvalidConfigError(f"bad catch-up gap {t}-{p}: {pair!r}")
                        gaps[(t, int(p))] = (pair[0], pair[1])
                continue
            for p, offset in parts.items():
                if isinstance(offset, bool) or not isinstance(offset, int):
                    raise InvalidConfigError(f"bad offset {topic}-{p}: {offset!r}")
                positions[(topic, int(p))] = offset
        return cls(positions, gaps)

    def committed_positions(self) -> Positions:
        """What a consumer group should hold: while a gap is open, its position (KIP-333: the
        records before it are not all read yet, so a restart must not skip them)."""
        out = dict(self.positions)
        for tp, (pos, end) in self.gaps.items():
            if pos < end:
                out[tp] = pos
        return out

    def remaining_gap(self) -> int:
        return sum(max(0, end - pos) for pos, end in self.gaps.values())


# -- what one batch reads ------------------------------------------------------------------------

def batch_ranges(start: SourceOffset, end: SourceOffset,
                 earliest: Callable[[TopicPartition], int],
                 tps: Optional[Iterable[TopicPartition]] = None
                 ) -> List[Tuple[TopicPartition, int, int, str]]:
    """``(tp, from, until, kind)`` of the batch between two offsets; ``kind`` is ``fresh`` or
    ``gap``. A partition new in ``end`` starts at ``earliest(tp)`` (its log start offset), as
    Spark's connector starts new partitions. ``tps``: only these partitions (the caller knows
    the others did not move)."""
    out = []
    items = (end.positions.items() if tps is None else
             ((tp, end.positions[tp]) for tp in sorted(tps) if tp in end.positions))
    for tp, until in items:
        gap_end = end.gaps.get(tp)
        if gap_end is not None:
            pos, gap_stop = gap_end
            if tp in start.gaps:
                gap_from, fresh_from = start.gaps[tp][0], start.positions.get(tp, gap_stop)
            else:
                gap_from = start.positions.get(tp, earliest(tp))
                fresh_from = gap_stop
            if pos > gap_from:
                out.append((tp, gap_from, pos, "gap"))
        else:
            fresh_from = start.positions.get(tp)
            if fresh_from is None:
                fresh_from = earliest(tp)
        if until > fresh_from:
            out.append((tp, fresh_from, until, "fresh"))
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
