"""Planning a batch read: which partitions, which offset range of each, split into how many tasks.

This is the driver half of ``spark.read.format("kafkalog")``, kept free of Spark so it can be
tested and reused on its own. The meaning follows Spark's Kafka source (KafkaOffsetReader,
KafkaOffsetRangeCalculator) wherever it applies:

1. **partitions**: ``assign`` / ``subscribe`` / ``subscribePattern`` (full-match regex; Kafka's
   internal topics are left out of patterns), narrowed by pushed-down ``topic`` and ``partition``
   predicates. JSON offsets or timestamps must name exactly these partitions, as in Spark.
2. **start and end** per partition, from ``startingOffsets``/``endingOffsets`` (``earliest`` =
   log start offset, ``latest`` = high watermark, or Kafka's last stable offset under
   read_committed), or by timestamp through the time index (Kafka's ``offsetsForTimes``: the
   earliest offset whose timestamp is >= T; no match: ``startingOffsetsByTimestampStrategy``
   for starts, ``latest`` for ends).
3. **data loss**: an offset below the log start offset (deleted by retention or delete-records)
   or past the high watermark is an :class:`OffsetOutOfRangeError` with ``failOnDataLoss=true``;
   with ``false`` the range shrinks to what exists.
4. **pushed filters** only ever shrink the range: ``offset`` bounds directly, a ``timestamp``
   lower bound T through the time index (no record before ``offsetsForTimes(T)`` can have a
   timestamp >= T). Upper bounds on ``timestamp`` do not narrow: CreateTime timestamps are not
   ordered by offset, so a record after ``offsetsForTimes(T')`` may still be older than T'.
5. **transactions** (Kafka log dirs under read_committed): one walk over batch headers finds the
   aborted ranges and the last stable offset (log/transactions.py); the end is capped there.
6. **splitting**: Spark's KafkaOffsetRangeCalculator, ``maxRecordsPerPartition`` first, then
   ``minPartitions`` proportionally to range sizes.
7. **packing** (:func:`pack`): the ranges of many partitions share one Spark task, as Spark's
   file sources pack small files (``FilePartition.getFilePartitions``): each range is charged
   its bytes plus ``openCostInBytes``, ranges larger than the budget are split by offsets, and
   the ranges, largest first, fill one task until the next would pass ``maxPartitionBytes``.
   Why: every task of a Python data source pays a fixed cost (tens of milliseconds for the
   Python worker round trip), which over 1,000 small partitions dwarfs reading them.
   ``minPartitions`` and ``maxRecordsPerPartition`` still hold for the packed tasks.

A range's bytes are estimated from the sizes of its segment files (the directory listing that
opening the partition does anyway, so planning costs no extra request): a segment holding
offsets ``[base, next base)`` (the last one up to the high watermark) is charged in proportion
to the part of that span the range covers. A range of whole segments (the default
earliest..latest) is exact; a partial one assumes records of even size across the segment.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Dict, FrozenSet, Iterable, List, Optional, Tuple

from ..errors import InvalidConfigError, OffsetOutOfRangeError, UnknownTopicOrPartitionError
from ..log.segment import ReadStats
from ..log.transactions import AbortedRange, scan_transactions
from .sources import INTERNAL_TOPICS, PartitionHandle, ReadSource

EARLIEST = -2
LATEST = -1
TopicPartition = Tuple[str, int]


# -- what to read (built by the option parser) -----------------------------------------------

@dataclass(frozen=True)
class Subscription:
    kind: str                                   # "assign" | "subscribe" | "subscribePattern"
    value: str                                  # the option's text, for messages
    assign: Tuple[TopicPartition, ...] = ()
    topics: Tuple[str, ...] = ()
    pattern: Optional[str] = None


@dataclass(frozen=True)
class OffsetLimit:
    """A starting or ending position after Spark's precedence (``*Timestamp`` over
    ``*OffsetsByTimestamp`` over ``*Offsets``)."""

    option: str                                 # the option it came from
    value: str
    kind: str              # earliest | latest | offsets | timestamps | timestamp
    per_partition: Tuple[Tuple[TopicPartition, int], ...] = ()
    timestamp: Optional[int] = None

    def lookup(self) -> Dict[TopicPartition, int]:
        return dict(self.per_partition)


@dataclass
class Bounds:
    """What pushed-down filters allow; everything starts unrestricted."""

    topics: Optional[FrozenSet[str]] = None
    partitions: Optional[FrozenSet[int]] = None
    partition_lo: int = 0
    partition_hi: Optional[int] = None          # exclusive
    offset_lo: int = 0
    offset_hi: Optional[int] = None             # exclusive
    timestamp_lo: Optional[int] = None          # ms, inclusive

    def only_topics(self, names) -> None:
        names = frozenset(names)
        self.topics = names if self.topics is None else self.topics & names

    def only_partitions(self, values) -> None:
        values = frozenset(values)
        self.partitions = values if self.partitions is None else self.partitions & values

    def partitions_from(self, lo: int) -> None:
        self.partition_lo = max(self.partition_lo, lo)

    def partitions_below(self, hi: int) -> None:
        self.partition_hi = hi if self.partition_hi is None else min(self.partition_hi, hi)

    def offsets_from(self, lo: int) -> None:
        self.offset_lo = max(self.offset_lo, lo)

    def offsets_below(self, hi: int) -> None:
        self.offset_hi = hi if self.offset_hi is None else min(self.offset_hi, hi)

    def timestamps_from(self, lo_ms: int) -> None:
        self.timestamp_lo = lo_ms if self.timestamp_lo is None else max(self.timestamp_lo, lo_ms)

    def allows(self, topic: str, partition: int) -> bool:
        return ((self.topics is None or topic in self.topics)
                and (self.partitions is None or partition in self.partitions)
                and partition >= self.partition_lo
                and (self.partition_hi is None or partition < self.partition_hi))


@dataclass
class ReadTask:
    """One task's offset range ``[start, end)`` of one partition (picklable)."""

    handle: PartitionHandle
    start: int
    end: int
    aborted: List[AbortedRange] = field(default_factory=list)
    #: estimated bytes of the log the range covers (see the module docstring), for packing
    bytes: int = 0

    @property
    def topic(self) -> str:
        return self.handle.topic

    @property
    def partition(self) -> int:
        return self.handle.partition

    @property
    def size(self) -> int:
        return self.end - self.start

    def slice(self, start: int, end: int) -> "ReadTask":
        share = (end - start) / self.size if self.size else 0
        return ReadTask(self.handle, start, end,
                        [r for r in self.aborted if r[1] < end and r[2] > start],
                        int(round(self.bytes * share)))


@dataclass
class ReadSplit:
    """One Spark input partition: ranges of one or more partitions, read one after another in
    this order (picklable)."""

    ranges: List[ReadTask]
    #: the lease of the coordinator that was active when the split was planned (the state's
    #: ``coordinator``): the task reports its fetches to it for the client id's quota (KIP-13,
    #: docs/protocol.md §12.1); None: none was, and the task is not throttled
    coordinator: Optional[dict] = None

    @property
    def bytes(self) -> int:
        return sum(r.bytes for r in self.ranges)

    @property
    def records(self) -> int:
        return sum(r.size for r in self.ranges)


# -- 1. partitions -----------------------------------------------------------------------------

def subscribed_partitions(source: ReadSource, sub: Subscription) -> List[TopicPartition]:
    if sub.kind == "assign":
        known = set()
        for topic, p in sub.assign:
            if topic not in known and not source.partitions(topic):
                raise UnknownTopicOrPartitionError(
                    f"option assign={sub.value}: topic {topic!r} does not exist in {source.url}")
            known.add(topic)
            if p not in source.partitions(topic):
                raise UnknownTopicOrPartitionError(
                    f"option assign={sub.value}: partition {topic}-{p} does not exist in "
                    f"{source.url}")
        return sorted(set(sub.assign))
    topics = subscribed_topics(sub, None if sub.kind == "subscribe" else source.topics())
    return [(t, p) for t in topics for p in source.partitions(t)]


def subscribed_topics(sub: Subscription, existing: Optional[Iterable[str]]) -> List[str]:
    """The topics a subscription names, sorted; the one matching rule of batch reads and
    streams. ``assign``: every topic it names. ``subscribe``: its topics, only those in
    ``existing`` when that is given (None: not listed, a missing topic has no partitions).
    ``subscribePattern``: the topics of ``existing`` the pattern matches as a whole (Java's
    ``matcher().matches()``), Kafka's internal topics left out."""
    if sub.kind == "assign":
        return sorted({t for t, _ in sub.assign})
    if sub.kind == "subscribe":
        names = set(sub.topics)
        return sorted(names if existing is None else names.intersection(existing))
    rx = re.compile(sub.pattern)
    return sorted(t for t in (existing or ()) if t not in INTERNAL_TOPICS and rx.fullmatch(t))


def _check_covers(limit: Optional[OffsetLimit], tps: List[TopicPartition]) -> None:
    """Spark: JSON offsets or timestamps must name exactly the subscribed partitions."""
    if limit is None or limit.kind not in ("offsets", "timestamps"):
        return
    named = set(limit.lookup())
    if named != set(tps):
        fmt = lambda s: ", ".join(f"{t}-{p}" for t, p in sorted(s)) or "none"  # noqa: E731
        raise InvalidConfigError(
            f"option {limit.option}={limit.value}: if it names specific partitions it must name "
            f"all of them (-2 earliest, -1 latest). Named: {fmt(named)}; subscribed: {fmt(tps)}")


# -- 2-5. one partition's range ----------------------------------------------------------------

def _offset_for_timestamp(log, timestamp: int, high: int) -> Optional[int]:
    found = log.offset_for_timestamp(timestamp)
    return found[0] if found is not None and found[0] < high else None


def _resolve(limit: OffsetLimit, tp: TopicPartition, log, low: int, high: int,
             starting: bool, strategy: str) -> int:
    if limit.kind == "earliest":
        return low
    if limit.kind == "latest":
        return high
    if limit.kind == "offsets":
        offset = limit.lookup()[tp]
        return low if offset == EARLIEST else high if offset == LATEST else offset
    ts = limit.lookup()[tp] if limit.kind == "timestamps" else limit.timestamp
    offset = _offset_for_timestamp(log, ts, high)
    if offset is not None:
        return offset
    if starting and strategy == "error":
        raise OffsetOutOfRangeError(
            f"option {limit.option}: no offset of {tp[0]}-{tp[1]} has a timestamp >= {ts}; set "
            "startingOffsetsByTimestampStrategy=latest to start at the latest offset instead")
    return high


def starting_offset(handle: PartitionHandle, log, opts) -> int:
    """Where ``startingOffsets`` (or its timestamp variants) put a partition's start; a
    streaming query's initial offset."""
    tp = (handle.topic, handle.partition)
    return _resolve(opts.starting, tp, log, handle.log_start_offset, handle.high_watermark, True,
                    opts.starting_strategy)


def _data_loss(message: str) -> OffsetOutOfRangeError:
    return OffsetOutOfRangeError(
        f"{message}. Some data may have been lost because it is not available any more (deleted "
        "by retention or delete-records) or not there yet. If you want the query to read what "
        "exists instead of failing, set the option failOnDataLoss to false")


def plan_partition(handle: PartitionHandle, log, opts, bounds: Bounds,
                   kafka_transactions: bool) -> Optional[ReadTask]:
    """The range of one partition, or None when nothing in it can match."""
    tp = (handle.topic, handle.partition)
    low, high = handle.log_start_offset, handle.high_watermark
    start = _resolve(opts.starting, tp, log, low, high, True, opts.starting_strategy)
    end = _resolve(opts.ending, tp, log, low, high, False, opts.starting_strategy)
    name = f"{tp[0]}-{tp[1]}"
    for offset, limit, is_start in ((start, opts.starting, True), (end, opts.ending, False)):
        if low <= offset <= high:
            continue
        where = (f"below the log start offset {low}" if offset < low
                 else f"past the high watermark {high}")
        if opts.fail_on_data_loss:
            raise _data_loss(f"{name}: {limit.option}={limit.value} asks for offset {offset}, "
                             f"{where}")
        clamped = min(max(offset, low), high)
        start, end = (clamped, end) if is_start else (start, clamped)
    if start > end:
        raise InvalidConfigError(
            f"{name}: the starting offset {start} ({opts.starting.option}="
            f"{opts.starting.value}) is after the ending offset {end} ({opts.ending.option}="
            f"{opts.ending.value})")
    # pushed filters
    start = max(start, bounds.offset_lo)
    if bounds.offset_hi is not None:
        end = min(end, bounds.offset_hi)
    if start < end and bounds.timestamp_lo is not None:
        first = _offset_for_timestamp(log, bounds.timestamp_lo, high)
        if first is None:
            return None
        start = max(start, first)
    if start >= end:
        return None
    aborted: List[AbortedRange] = []
    if opts.read_committed and kafka_transactions:
        scan = scan_transactions(log, start, end, high)
        end = min(end, scan.last_stable_offset)
        aborted = scan.aborted_in(start, end)
        if start >= end:
            return None
    return ReadTask(handle, start, end, aborted, range_bytes(log, start, end, high))


def range_bytes(log, start: int, end: int, high: int) -> int:
    """Estimated log bytes of ``[start, end)`` from segment sizes (module docstring, 7)."""
    segments = log.segments
    total = 0.0
    for i, seg in enumerate(segments):
        lo = seg.base_offset
        hi = segments[i + 1].base_offset if i + 1 < len(segments) else max(high, end, lo + 1)
        covered = min(end, hi) - max(start, lo)
        if covered > 0 and hi > lo:
            total += seg.size() * covered / (hi - lo)
    return int(round(total))


def plan(source: ReadSource, opts, bounds: Optional[Bounds] = None,
         stats: Optional[ReadStats] = None) -> List[ReadTask]:
    """All ranges of a read, one task each before packing. ``opts`` carries the fields of
    ``spark.read_options.ReadOptions``: subscription, starting, ending, starting_strategy,
    fail_on_data_loss, read_committed, min_partitions, max_records_per_partition."""
    bounds = bounds or Bounds()
    tps = subscribed_partitions(source, opts.subscription)
    _check_covers(opts.starting, tps)
    _check_covers(opts.ending, tps)
    tasks = []
    for topic, p in tps:
        if not bounds.allows(topic, p):
            continue
        handle, log = source.view(topic, p, stats)
        task = plan_partition(handle, log, opts, bounds, source.kafka_transactions)
        if task is not None:
            tasks.append(task)
    return split(tasks, opts.min_partitions, opts.max_records_per_partition)


# -- 6. splitting (Spark's KafkaOffsetRangeCalculator) ------------------------------------------

def _divide(task: ReadTask, parts: int) -> List[ReadTask]:
    out, remaining, start = [], task.size, task.start
    for part in range(parts):
        this = remaining // (parts - part)
        remaining -= this
        end = min(start + this, task.end)
        if end > start:
            out.append(task.slice(start, end))
        start = end
    return out


def split(tasks: List[ReadTask], min_partitions: Optional[int] = None,
          max_records: Optional[int] = None) -> List[ReadTask]:
    tasks = [t for t in tasks if t.size > 0]
    if (min_partitions is None or len(tasks) >= min_partitions) and max_records is None:
        return tasks
    if max_records is not None:
        tasks = [piece for t in tasks for piece in _divide(t, math.ceil(t.size / max_records))]
    if min_partitions is None or min_partitions <= len(tasks):
        return tasks
    total = sum(t.size for t in tasks)

    def part_count(size: int, total_size: int, parts: int) -> int:
        # Scala's math.round rounds half up
        return max(int(math.floor(size / total_size * parts + 0.5)), 1) if total_size else 1

    unsplit = [t for t in tasks if part_count(t.size, total, min_partitions) == 1]
    split_total = total - sum(t.size for t in unsplit)
    split_parts = max(min_partitions - len(unsplit), 1)
    return [piece for t in tasks
            for piece in _divide(t, part_count(t.size, split_total, split_parts))]


# -- 7. packing (Spark's FilePartition.getFilePartitions) ---------------------------------------

#: Spark's default of ``spark.sql.files.maxPartitionBytes``
DEFAULT_MAX_PARTITION_BYTES = 128 << 20
#: kafkalog's own default open cost, by Spark's definition of the setting (the bytes a task
#: could have scanned in the time it takes to open one more range), measured rather than
#: borrowed: Spark's 4MB prices opening a file on HDFS or an object store, while a task opens
#: a partition's range of a listed, mapped segment in about 0.4 ms and scans about 120MB/s
#: end to end through Spark. 4MB made 1,000 small partitions 32 tasks, whose fixed costs cost
#: more than reading them (docs/performance.md, "Many partitions").
DEFAULT_OPEN_COST_IN_BYTES = 64 << 10


def pack(tasks: List[ReadTask], max_partition_bytes: int = DEFAULT_MAX_PARTITION_BYTES,
         open_cost: int = DEFAULT_OPEN_COST_IN_BYTES, min_partitions: Optional[int] = None,
         max_records: Optional[int] = None, min_partition_num: Optional[int] = None
         ) -> List[ReadSplit]:
    """Ranges (after :func:`split`) -> Spark input partitions.

    As Spark's file sources: the budget is ``min(maxPartitionBytes, max(openCost, total / n))``
    (``total`` charging each range its bytes plus ``openCost``; ``n`` the larger of
    ``minPartitions`` and Spark's ``min_partition_num``, the session's default parallelism, so
    that a small read still spreads over the cores); a range above the budget is split by
    offsets; ranges sorted largest first
    fill a task until the next would pass the budget (next fit). A task also closes before it
    would hold more than ``max_records`` offsets. If that leaves fewer than ``min_partitions``
    tasks, the largest packed task is halved until there are enough (``split`` made at least
    that many ranges, so this ends). Inside a task ranges are ordered by topic, partition and
    offset: rows come partition by partition, each in offset order.
    """
    tasks = [t for t in tasks if t.size > 0]
    if not tasks:
        return []
    total = sum(t.bytes + open_cost for t in tasks)
    budget = max_partition_bytes
    n = max(min_partitions or 1, min_partition_num or 1)
    if n > 1:
        budget = min(budget, max(open_cost, total // n))
    budget = max(budget, 1)
    pieces: List[ReadTask] = []
    for t in tasks:
        n = max(1, min(math.ceil(t.bytes / budget), t.size))
        pieces.extend(_divide(t, n) if n > 1 else [t])
    pieces.sort(key=lambda t: (-t.bytes, t.topic, t.partition, t.start))
    bins: List[List[ReadTask]] = []
    current: List[ReadTask] = []
    size = records = 0
    for t in pieces:
        if current and (size + t.bytes > budget
                        or (max_records is not None and records + t.size > max_records)):
            bins.append(current)
            current, size, records = [], 0, 0
        current.append(t)
        size += t.bytes + open_cost
        records += t.size
    bins.append(current)
    while min_partitions and len(bins) < min_partitions:
        multi = [b for b in bins if len(b) > 1]
        if not multi:
            break
        largest = max(multi, key=lambda b: sum(t.bytes + open_cost for t in b))
        bins.remove(largest)
        half = len(largest) // 2
        bins += [largest[:half], largest[half:]]
    order = lambda t: (t.topic, t.partition, t.start)  # noqa: E731
    splits = [ReadSplit(sorted(b, key=order)) for b in bins]
    splits.sort(key=lambda s: order(s.ranges[0]))
    return splits
