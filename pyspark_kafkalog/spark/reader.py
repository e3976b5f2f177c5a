"""``spark.read.format("kafkalog")``: the DataSourceReader, a thin shell over the layers below.

* ``pushFilters`` turns Spark's filters on ``topic``, ``partition``, ``offset`` and
  ``timestamp`` into :class:`~pyspark_kafkalog.connector.read_plan.Bounds`;
* ``partitions`` (driver side, in a planning worker) plans offset ranges with
  :func:`~pyspark_kafkalog.connector.read_plan.plan` and packs them into input partitions with
  :func:`~pyspark_kafkalog.connector.read_plan.pack` (``maxPartitionBytes``, ``openCostInBytes``):
  a Python task's fixed cost is paid per input partition, not per Kafka partition;
* ``read`` (executors) re-opens storage from the URL and yields Arrow record batches through
  :func:`~pyspark_kafkalog.connector.range_reader.read_range`, one packed range after another.

Which filters go back to Spark: exact narrowing (``topic`` =/IN, ``partition`` =/IN/comparisons,
``offset`` =/comparisons, IS NOT NULL on never-null columns) is fully handled here. ``offset IN``
only narrows to its min..max, and ``timestamp`` predicates only move the start (a lower bound, via
the time index), so both are returned for Spark to apply to the rows.
"""
from __future__ import annotations

import datetime as _dt
import json
import math
import os
from numbers import Real
from typing import Iterator, List

from pyspark.sql.datasource import (DataSourceReader, EqualNullSafe, EqualTo, GreaterThan,
                                    GreaterThanOrEqual, In, InputPartition, IsNotNull, LessThan,
                                    LessThanOrEqual)

from ..connector.read_plan import Bounds, ReadSplit, ReadTask, pack, plan
from ..connector.range_reader import read_range
from ..connector.sources import CLUSTER, ClusterSource, normalize_url, open_source
from ..errors import InvalidConfigError, OffsetOutOfRangeError
from ..log.segment import ReadStats
from . import worker_gc
from .quota import log_throttled, plan_coordinator, task_quota
from .read_options import ReadOptions
from .schema import kafka_schema
from .surface import surfaces_errors

_NEVER_NULL = {"topic", "partition", "offset", "timestamp", "timestampType"}
_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc)


_COALESCE_BYTES = 1 << 20


def _concat(batches):
    if len(batches) == 1:
        return batches[0]
    import pyarrow as pa
    return pa.concat_batches(batches)


class KafkaLogInputPartition(InputPartition):
    """One :class:`ReadSplit`: offset ranges of one or more Kafka partitions."""

    def __init__(self, split: ReadSplit):
        super().__init__(split)


def _number(value):
    if isinstance(value, bool) or not isinstance(value, Real):
        return None
    return value


def _epoch_us(value):
    """A pushed timestamp literal (datetime; naive means UTC) -> microseconds since the epoch."""
    if not isinstance(value, _dt.datetime):
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=_dt.timezone.utc)
    return (value - _EPOCH) // _dt.timedelta(microseconds=1)


def _lower_bound(f):
    """``(lo, exact)`` integer lower bound of a comparison/equality filter, or None."""
    v = _number(f.value) if not isinstance(f, In) else None
    if isinstance(f, (GreaterThanOrEqual, EqualTo, EqualNullSafe)) and v is not None:
        return math.ceil(v)
    if isinstance(f, GreaterThan) and v is not None:
        return math.floor(v) + 1
    return None


def _upper_bound(f):
    """Exclusive integer upper bound of a comparison/equality filter, or None."""
    v = _number(f.value) if not isinstance(f, In) else None
    if isinstance(f, (LessThanOrEqual, EqualTo, EqualNullSafe)) and v is not None:
        return math.floor(v) + 1
    if isinstance(f, LessThan) and v is not None:
        return math.ceil(v)
    return None


def push_filter(bounds: Bounds, f) -> bool:
    """Apply one filter to ``bounds``; True if it is handled exactly (Spark may drop it)."""
    attr = getattr(f, "attribute", None)
    if not isinstance(attr, tuple) or len(attr) != 1:
        return False
    column = attr[0]
    if isinstance(f, IsNotNull):
        return column in _NEVER_NULL
    if column == "topic":
        if isinstance(f, (EqualTo, EqualNullSafe)) and isinstance(f.value, str):
            bounds.only_topics([f.value])
            return True
        if isinstance(f, In) and all(isinstance(v, str) for v in f.value):
            bounds.only_topics(f.value)
            return True
        return False
    if column in ("partition", "offset"):
        if isinstance(f, In):
            values = [_number(v) for v in f.value]
            if not values or any(v is None for v in values):
                return False
            if column == "partition":
                bounds.only_partitions(int(v) for v in values if v == int(v))
                return True
            ints = [int(v) for v in values if v == int(v)]
            if not ints:
                bounds.offsets_below(0)
            else:
                bounds.offsets_from(min(ints))
                bounds.offsets_below(max(ints) + 1)
            return False   # only min..max is read: Spark keeps the filter
        lo, hi = _lower_bound(f), _upper_bound(f)
        if lo is None and hi is None:
            return False
        if column == "partition":
            if lo is not None:
                bounds.partitions_from(lo)
            if hi is not None:
                bounds.partitions_below(hi)
        else:
            if lo is not None:
                bounds.offsets_from(lo)
            if hi is not None:
                bounds.offsets_below(hi)
        return True
    if column == "timestamp":
        values = list(f.value) if isinstance(f, In) else [getattr(f, "value", None)]
        us = [_epoch_us(v) for v in values]
        if not us or any(u is None for u in us):
            return False
        if isinstance(f, (GreaterThanOrEqual, EqualTo, EqualNullSafe, In)):
            bounds.timestamps_from(-(-min(us) // 1000))       # ms * 1000 >= us
        elif isinstance(f, GreaterThan):
            bounds.timestamps_from(us[0] // 1000 + 1)         # ms * 1000 > us
        return False   # the time index only moves the start: Spark filters the rows
    return False


def _append_stats(path: str, record: dict) -> None:
    """Test-only (option ``kafkalog.test.statsFile``): one JSON line per task, appended with a
    single write so concurrent tasks do not interleave."""
    line = (json.dumps(record, sort_keys=True) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def _quota(split: ReadSplit, opts):
    """The task's fetch throttling (KIP-13): by the coordinator its planner saw active; none
    for a plain Kafka log dir, or when none was."""
    coordinator = getattr(split, "coordinator", None)
    if coordinator is None or not split.ranges or split.ranges[0].handle.kind != CLUSTER:
        return None
    return task_quota(opts.path, opts.storage_options, opts.client_id,
                      opts.coordinator_token_file, coordinator=coordinator)


def read_split(split: ReadSplit, opts) -> Iterator:
    """The ranges of one input partition (batch or streaming), one after another. Small record batches (a small partition's whole
    range) are joined up to about ``_COALESCE_BYTES`` before Spark gets them: each batch
    handed to Spark costs a fixed amount of Arrow messaging, which over a thousand ranges
    of a few hundred rows each costs more than copying them once."""
    quota = _quota(split, opts)
    try:
        yield from _read_split(split, opts, quota)
    finally:
        if quota is not None:
            log_throttled(quota, f"read task of {len(split.ranges)} range(s)")


def _read_split(split: ReadSplit, opts, quota) -> Iterator:
    if len(split.ranges) == 1:
        yield from _read_named(split.ranges[0], opts, quota)
        return
    pending, size = [], 0
    for task in split.ranges:
        for batch in _read_named(task, opts, quota):
            if not pending and batch.nbytes >= _COALESCE_BYTES:
                yield batch
                continue
            pending.append(batch)
            size += batch.nbytes
            if size >= _COALESCE_BYTES:
                yield _concat(pending)
                pending, size = [], 0
    if pending:
        yield _concat(pending)


def _read_named(task: ReadTask, opts, quota=None) -> Iterator:
    """``_read``, with lost data named by the planned range as well: in a packed task the
    partition alone does not say which of its ranges failed."""
    try:
        yield from _read(task, opts, quota)
    except OffsetOutOfRangeError as exc:
        # the same class: a MissingCommittedDataError (data lost on storage) stays one
        raise type(exc)(
            f"{exc} (the planned range: {task.topic}-{task.partition} offsets {task.start} "
            f"to {task.end - 1})") from None


def _read(task: ReadTask, opts, quota=None) -> Iterator:
    stats = ReadStats()
    rows = 0
    try:
        for batch in read_range(task, include_headers=opts.include_headers,
                                fail_on_data_loss=opts.fail_on_data_loss, stats=stats,
                                on_fetch=quota.fetched if quota is not None else None):
            rows += batch.num_rows
            yield batch
    finally:
        if opts.stats_file:
            _append_stats(opts.stats_file, {
                "phase": "read", "topic": task.topic, "partition": task.partition,
                "start": task.start, "end": task.end, "rows": rows,
                "log_bytes": stats.log_bytes, "index_bytes": stats.index_bytes,
                "requests": stats.requests})


def checked_options(options: ReadOptions, schema) -> ReadOptions:
    """The options of a batch or stream reader, after the one check both make: the schema is
    fixed (Spark's Kafka source schema). The path becomes absolute for the executors."""
    expected = kafka_schema(options.include_headers)
    if schema is not None and schema != expected:
        raise InvalidConfigError(
            "format('kafkalog') has a fixed schema (Spark's Kafka source schema) and cannot "
            f"be read with a custom one: expected {expected.simpleString()}, got "
            f"{schema.simpleString()}")
    options.path = normalize_url(options.path)
    return options


@surfaces_errors
class KafkaLogReader(DataSourceReader):
    def __init__(self, options: ReadOptions, schema):
        self.options = checked_options(options, schema)
        self.bounds = Bounds()

    def partitions(self) -> List[InputPartition]:
        opts = self.options
        stats = ReadStats()
        source = open_source(opts.path, opts.storage_options, read_to_log_end=opts.read_to_log_end)
        ranges = plan(source, opts, self.bounds, stats)
        splits = pack(ranges, opts.max_partition_bytes, opts.open_cost_in_bytes,
                      opts.min_partitions, opts.max_records_per_partition,
                      opts.min_partition_num)
        if isinstance(source, ClusterSource):
            plan_coordinator(splits, source.cluster, source.state, opts.client_id)
        if opts.stats_file:
            _append_stats(opts.stats_file, {"phase": "plan", "tasks": len(splits),
                                            "ranges": len(ranges),
                                            "log_bytes": stats.log_bytes,
                                            "index_bytes": stats.index_bytes,
                                            "requests": stats.requests})
        return [KafkaLogInputPartition(s) for s in splits]

    def read(self, partition: InputPartition) -> Iterator:
        worker_gc.freeze_once()
        split = partition.value
        if not isinstance(split, ReadSplit):   # nothing planned: Spark's single empty partition
            return iter(())
        return read_split(split, self.options)


@surfaces_errors
class KafkaLogPushdownReader(KafkaLogReader):
    """The reader with ``pushFilters``; used only when ``register(spark, filter_pushdown=True)``.

    Why opt-in: PySpark 4.3 keeps the read plan made during filter pushdown on the data source
    object that every scan of one DataFrame shares, and reuses it for a later scan of the *same*
    DataFrame that pushes no filter (``df.filter(...).count(); df.count()`` then returns the
    filtered rows, silently). Newer Spark scopes that plan to its own scan. With pushdown on,
    build a new DataFrame (``spark.read...load()``) for each query.
    """

    def pushFilters(self, filters) -> List:
        return [f for f in filters if not push_filter(self.bounds, f)]
