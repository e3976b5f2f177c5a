"""Rows as Arrow batches to committed Kafka records: the sink's work below the Spark layer.

A Spark write job is one *write unit* of the protocol (docs/protocol.md §3): every task encodes its
rows per target partition (one accumulator per topic, ``arrow/accumulate.py``: each record goes
into its partition's open batch as its input batch comes) and reserves + writes final segments
(``TaskWriter``), returning the ``PendingWrite``\\ s; the driver commits all of them in one
metadata entry (``commit_job``) or aborts them (``abort_job``), so the job's records appear all
at once or not at all.

The driver side (deciding the job, lost and late task attempts) is ``spark_job``. A task that
finds its job already decided after it reserved (a late attempt) aborts its own write.

Partitioning is Kafka's Java producer's: a keyed row goes to ``toPositive(murmur2(key)) % n``; an
unkeyed row follows the sticky partitioner (KIP-480): rows stick to one partition until a batch
is full, then move on, starting at a random partition per task, so unkeyed data spreads evenly
while each task touches few partitions. An explicit ``partition`` column wins.
"""
from __future__ import annotations

import random
import time
import uuid
from dataclasses import dataclass
from typing import Dict, List, NamedTuple, Optional, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import (InvalidConfigError, InvalidRecordError, InvalidTxnStateError,
                      UnknownTopicOrPartitionError, UnsupportedCodecError)
from ..arrow import buffer_pool
from ..format import codecs
from ..arrow.accumulate import new_accumulator
from ..arrow.arrow_encode import HEADER_TYPE, EncodeInput, estimated_sizes, partitions_for_keys
from ..format.batch import MAGIC_V2
from ..format.encode import EncodedBatch
from ..log.segment_spool import SegmentSpool, SpoolWriter
from ..cluster.cluster import Cluster
from ..client.producer import PendingWrite, Producer
from .spark_job import abort_writes, job_decided

TopicPartition = Tuple[str, int]

# -- columns ------------------------------------------------------------------------------------

#: columns of Spark's Kafka source schema that a sink ignores (so read -> write round trips work)
IGNORED_COLUMNS = ("offset", "timestampType")
COLUMNS = ("key", "value", "topic", "partition", "timestamp", "headers")


def _is_bytes(t: pa.DataType) -> bool:
    return (pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_string(t)
            or pa.types.is_large_string(t))


def _is_headers(t: pa.DataType) -> bool:
    if not (pa.types.is_list(t) or pa.types.is_large_list(t)):
        return False
    s = t.value_type
    if not pa.types.is_struct(s) or s.num_fields != 2:
        return False
    names = [s.field(i).name for i in range(2)]
    return names == ["key", "value"] and all(_is_bytes(s.field(i).type) for i in range(2))


_TYPE_RULES = {
    "key": (_is_bytes, "string or binary"),
    "value": (_is_bytes, "string or binary"),
    "topic": (lambda t: pa.types.is_string(t) or pa.types.is_large_string(t), "string"),
    "partition": (pa.types.is_integer, "int"),
    "timestamp": (pa.types.is_timestamp, "timestamp"),
    "headers": (_is_headers, "array<struct<key: string, value: binary>>"),
}


def check_schema(schema: pa.Schema, topic_option: Optional[str]) -> None:
    """The sink's column rules; raises InvalidConfigError naming the offending column."""
    names = schema.names
    unknown = [n for n in names if n not in COLUMNS and n not in IGNORED_COLUMNS]
    if unknown:
        hint = ""
        near = [n for n in unknown if n.lower() in COLUMNS]
        if near:
            hint = f" (column names are case-sensitive: {near[0]!r} is not {near[0].lower()!r})"
        raise InvalidConfigError(
            f"unknown column(s) {unknown}{hint}: the kafkalog sink writes the columns "
            f"{', '.join(COLUMNS)} ({', '.join(IGNORED_COLUMNS)} are ignored); select or "
            "rename columns first, e.g. to_json(struct(...)) AS value")
    if "value" not in names:
        raise InvalidConfigError("the kafkalog sink needs a 'value' column (string or binary)")
    for name in names:
        if name in _TYPE_RULES:
            ok, want = _TYPE_RULES[name]
            if not ok(schema.field(name).type):
                raise InvalidConfigError(f"column {name!r} must be {want}, not "
                                         f"{schema.field(name).type}")
    if topic_option is None and "topic" not in names:
        raise InvalidConfigError("no topic: set the option topic or add a 'topic' column")


# -- partitioning -------------------------------------------------------------------------------

class Sticky:
    """Kafka's sticky partitioner (KIP-480) for unkeyed rows: stay on a partition until a batch's
    worth of rows (``batch_records`` rows or ``batch_size`` bytes) went there, then the next."""

    def __init__(self, partitions: int, start: int, batch_records: int, batch_size: int):
        self.n, self.current = partitions, start % partitions
        self.batch_records, self.batch_size = batch_records, batch_size
        self.rows = self.bytes = 0

    def __call__(self, sizes: np.ndarray) -> np.ndarray:
        out = np.empty(len(sizes), dtype=np.int64)
        cum = np.concatenate([[0], np.cumsum(sizes)])
        i = 0
        while i < len(sizes):
            room_rows = self.batch_records - self.rows
            room_bytes = self.batch_size - self.bytes
            fit = int(np.searchsorted(cum, cum[i] + room_bytes, side="right")) - 1 - i
            k = max(1, min(room_rows, fit, len(sizes) - i))
            out[i:i + k] = self.current
            self.rows += k
            self.bytes += int(cum[i + k] - cum[i])
            i += k
            if i < len(sizes) or self.rows >= self.batch_records or self.bytes >= self.batch_size:
                self.current = (self.current + 1) % self.n
                self.rows = self.bytes = 0
        return out


def choose_partitions(topic: str, partitions: int, keys: pa.Array,
                      explicit: Optional[Tuple[np.ndarray, np.ndarray]],
                      sizes: Optional[np.ndarray],
                      sticky: Sticky) -> np.ndarray:
    """The partition of every row: the explicit one (``(values, given mask)``, range-checked),
    else Kafka's murmur2 of the key, else the sticky partitioner."""
    n = len(keys)
    if explicit is None and keys.null_count == 0:     # the usual case: every row has a key
        return partitions_for_keys(keys, partitions)
    part = np.full(n, -1, dtype=np.int64)
    todo = np.ones(n, dtype=bool)
    if explicit is not None:
        values, given = explicit
        bad = given & ((values < 0) | (values >= partitions))
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            raise UnknownTopicOrPartitionError(
                f"a row has partition {int(values[row])} but topic {topic!r} has {partitions} "
                f"partition{'s' * (partitions != 1)} (0..{partitions - 1})")
        part[given] = values[given]
        todo &= ~given
    keyed = todo & ~keys.is_null().to_numpy(zero_copy_only=False)
    if keyed.any():
        part[keyed] = partitions_for_keys(keys, partitions)[keyed]
        todo &= ~keyed
    if todo.any():
        part[todo] = sticky(sizes[todo])
    return part


def explicit_partitions(col: Optional[pa.Array]) -> Optional[Tuple[np.ndarray, np.ndarray]]:
    """(values, given mask) of a partition column, or None when absent or all null."""
    if col is None or col.null_count == len(col):
        return None
    values = pc.fill_null(col.cast(pa.int64()), 0).to_numpy(zero_copy_only=False)
    return values.astype(np.int64), ~col.is_null().to_numpy(zero_copy_only=False)


# -- one task -----------------------------------------------------------------------------------

class TopicTarget(NamedTuple):
    name: str
    partitions: int
    magic: int
    codec: int
    level: Optional[int]
    max_message_bytes: int


@dataclass
class TaskStats:
    records: int = 0
    batches: int = 0
    bytes: int = 0
    segments: int = 0
    flushes: int = 0
    partitions: int = 0


class TaskWriter:
    """Encodes the Arrow batches of one task per target partition and writes them.

    ``options``: any object with the attributes of ``spark.write_options.WriteOptions``
    (topic, compression, compression_levels, magic, batch_size, batch_records, buffer_memory).
    Call :meth:`add` per batch, then :meth:`finish` (the pending writes), or :meth:`abort`.

    ``spool`` (default: where the storage can, ``Storage.can_spool``: local disk):
    magic 2 batches go to temp segment files on a background thread as soon as they close
    (``log.segment_spool``), so that the segment I/O overlaps the encoding instead of
    following it.
    """

    def __init__(self, cluster: Cluster, options, *, producer: str,
                 clock=time.time, seed: Optional[int] = None, spool: Optional[bool] = None):
        self.cluster = cluster
        self.opts = options
        cluster.metalog.writer_id = producer
        self.job = producer
        self.producer = Producer(cluster, transaction_timeout_ms=options.transaction_timeout_ms,
                                 acks=getattr(options, "acks", None),
                                 delivery_timeout_ms=getattr(options, "delivery_timeout_ms",
                                                             120_000),
                                 retry_backoff_ms=getattr(options, "retry_backoff_ms", 100))
        self.clock = clock
        self.rng = random.Random(seed if seed is not None else uuid.uuid4().int)
        self.state = cluster.state()
        self.targets: Dict[str, TopicTarget] = {}
        self.sticky: Dict[str, Sticky] = {}
        self.accumulators: Dict[str, object] = {}   # topic -> arrow.accumulate accumulator
        self.encoded: Dict[TopicPartition, List[EncodedBatch]] = {}
        self.encoded_bytes = 0
        self.pending: List[PendingWrite] = []
        self.stats = TaskStats()
        self.touched: set = set()
        can = cluster.storage.can_spool
        self.spooling = can if spool is None else bool(spool and can)
        self.spools: Dict[TopicPartition, SegmentSpool] = {}
        self.spool_writer = SpoolWriter()
        self.arena: Optional[buffer_pool.Arena] = None   # uncompressed batches' buffers

    # -- targets ----------------------------------------------------------------------------

    def target(self, topic: str) -> TopicTarget:
        t = self.targets.get(topic)
        if t is not None:
            return t
        info = self.state.topics.get(topic)
        if info is None:
            self.state = self.cluster.state()
            info = self.state.topics.get(topic)
        if info is None:
            raise UnknownTopicOrPartitionError(
                f"topic {topic!r} does not exist in {self.cluster.url}; create it first (or "
                "name it in the topic option with createTopic=true)")
        config = self.state.topic_config(topic)
        magic = config.magic if self.opts.magic is None else self.opts.magic
        codec = self.opts.compression
        if codec is None:
            codec = (codecs.NONE if config.compression_type == "producer"
                     else codecs.codec_id(config.compression_type))
        try:
            codecs.check_codec(codec, magic)
        except UnsupportedCodecError as exc:
            raise UnsupportedCodecError(f"topic {topic!r}: {exc}") from None
        t = TopicTarget(topic, info["partitions"], magic, codec,
                        self.opts.compression_levels.get(codec), config.max_message_bytes)
        self.targets[topic] = t
        return t

    # -- rows -------------------------------------------------------------------------------

    def add(self, batch: pa.RecordBatch) -> None:
        n = batch.num_rows
        if n == 0:
            return
        cols = dict(zip(batch.schema.names, batch.columns))
        check_schema(batch.schema, self.opts.topic)
        now = int(self.clock() * 1000)
        value = _binary(cols["value"])
        key = _binary(cols["key"]) if "key" in cols else pa.nulls(n, pa.binary())
        headers = cols.get("headers")
        if headers is not None:
            headers = headers.cast(HEADER_TYPE)
        ts = _timestamps_ms(cols.get("timestamp"), n, now)
        data = EncodeInput(key, value, ts, headers)
        explicit = explicit_partitions(cols.get("partition"))
        # the usual case, every row keyed to murmur2's partition, needs no sizes to partition:
        # the accumulator then estimates them itself, in the pass that encodes the rows
        sizes = (None if explicit is None and key.null_count == 0
                 else estimated_sizes(key, value, headers))
        if self.opts.topic is not None:
            self._add_topic(self.opts.topic, data, sizes, explicit, None)
            return
        topics = cols["topic"]
        if topics.null_count:
            raise InvalidRecordError("a row has a null topic; set the topic option or fill the "
                                     "topic column")
        for t in pc.unique(topics).to_pylist():
            mask = pc.equal(topics, t)
            idx = np.flatnonzero(mask.to_numpy(zero_copy_only=False))
            self._add_topic(t, data, sizes, explicit, idx)

    def _add_topic(self, topic: str, data: EncodeInput, sizes: Optional[np.ndarray],
                   explicit: Optional[Tuple[np.ndarray, np.ndarray]],
                   idx: Optional[np.ndarray]) -> None:
        """Hands the rows ``idx`` (None: all) of ``data`` to ``topic``'s accumulator, with
        their partitions, and keeps the batches that filled up."""
        target = self.target(topic)
        if idx is not None:   # several topics in one input batch: each gets its rows
            take = pa.array(idx)
            hs = None if data.headers is None else data.headers.take(take)
            data = EncodeInput(data.key.take(take), data.value.take(take), data.timestamps[idx],
                               hs)
            sizes = None if sizes is None else sizes[idx]
            explicit = None if explicit is None else (explicit[0][idx], explicit[1][idx])
        if target.magic < 2 and data.headers is not None:
            if pc.max(pc.fill_null(pc.list_value_length(data.headers), 0)).as_py():
                raise InvalidRecordError(
                    f"topic {topic!r} is written with message format v{target.magic}, which "
                    "has no record headers (drop the headers column or use format 2)")
        sticky = self.sticky.get(topic)
        if sticky is None:
            sticky = self.sticky[topic] = Sticky(target.partitions, self.rng.randrange(
                target.partitions), self.opts.batch_records, self.opts.batch_size)
        part = choose_partitions(topic, target.partitions, data.key, explicit, sizes, sticky)
        acc = self.accumulators.get(topic)
        if acc is None:
            acc = self.accumulators[topic] = new_accumulator(
                topic, target.partitions, magic=target.magic, compression=target.codec,
                level=target.level, batch_records=self.opts.batch_records,
                batch_size=self.opts.batch_size, max_message_bytes=target.max_message_bytes,
                allocate=self._allocator(target))
        self.stats.records += len(data)
        self._keep(topic, acc.append(data, part, sizes))

    def _allocator(self, target: TopicTarget):
        """Batch buffers from the process's arena (``arrow.buffer_pool``: pages a previous task
        already faulted in) when the batches are sent as built. Compressed batches are new
        buffers, so their raw ones are garbage at once; those stay with Arrow's pool, which
        reuses freed memory, where an arena would only grow until the flush."""
        if target.codec != codecs.NONE:
            return None
        if self.arena is None:
            self.arena = buffer_pool.take()
        return self.arena.allocate

    # -- batches ----------------------------------------------------------------------------

    def _keep(self, topic: str, closed) -> None:
        self._add_closed(topic, closed)
        if self.encoded_bytes >= self.opts.buffer_memory:
            self.flush()
            if self.arena is not None:   # chunks still viewed (open batches) are not reused
                self.arena.reset()

    def _add_closed(self, topic: str, closed) -> None:
        spool = self.spooling and self.targets[topic].magic == MAGIC_V2
        for p, batch in closed:
            self.encoded.setdefault((topic, p), []).append(batch)
            self.encoded_bytes += len(batch.data)
            if spool:
                self.spool_writer.add(self._spool(topic, p), batch.data)
        self.stats.batches += len(closed)

    def _spool(self, topic: str, partition: int) -> SegmentSpool:
        s = self.spools.get((topic, partition))
        if s is None:
            s = self.spools[(topic, partition)] = SegmentSpool(
                self.cluster.storage, self.cluster.partition_dir(topic, partition,
                                                                 state=self.state),
                self.state.topic_config(topic).segment_bytes)
        return s

    def _drop_spools(self) -> None:
        """Wait for the writer thread (ignoring its errors) and delete the temp files."""
        self.spool_writer.forget()
        for s in self.spools.values():
            s.discard()
        self.spools = {}

    def flush(self) -> None:
        """Reserve and write everything encoded so far (one reservation, one PendingWrite)."""
        batches = {tp: bs for tp, bs in self.encoded.items() if bs}
        if not batches:
            return
        spools = self.spools
        try:
            try:
                self.spool_writer.wait()
            except Exception:
                # a spool failed (e.g. the device): the batches are still in memory, so write
                # them the plain way, which fails on its own if the storage really is at fault
                self._drop_spools()
                spools = {}
            pending = self.producer.write_retrying(batches, spools=spools)
        finally:
            self._drop_spools()
        self.pending.append(pending)
        if job_decided(self.cluster, self.job):
            self.abort()
            raise InvalidTxnStateError(
                f"the Spark job {self.job} was already committed or aborted when this task "
                "attempt reserved its offsets (a killed, failed or speculative attempt): its "
                "write was aborted and its files deleted")
        self.encoded = {}
        self.encoded_bytes = 0
        self.stats.flushes += 1
        self.stats.segments += sum(len(s) for s in pending.segments.values())
        self.stats.bytes += sum(len(b.data) for bs in batches.values() for b in bs)
        self.touched.update(batches)
        self.stats.partitions = len(self.touched)

    def finish(self) -> List[PendingWrite]:
        for topic, acc in self.accumulators.items():
            self._add_closed(topic, acc.drain())
        self.flush()
        self._release()
        return self.pending

    def _release(self) -> None:
        """Give the arena back for the next task: only chunks nothing views any more are
        reused (``arena.Arena.reset``), so this is safe even while batches are still held."""
        self.accumulators = {}
        if self.arena is not None:
            buffer_pool.give(self.arena)
            self.arena = None

    def abort(self) -> None:
        """Abort what this task reserved (best effort: expiry and cleanup are the backstop)."""
        self._drop_spools()
        self.encoded = {}
        self._release()
        if self.pending:
            try:
                abort_writes(self.cluster, self.pending, self.job, "spark task attempt failed")
            except Exception:
                pass
        self.pending = []


def _binary(arr: pa.Array) -> pa.Array:
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    return arr if pa.types.is_binary(arr.type) else arr.cast(pa.binary())


_UNIT_DIV = {"us": 1000, "ns": 1_000_000}   # s and ms: see _timestamps_ms


def _timestamps_ms(col: Optional[pa.Array], n: int, now_ms: int) -> np.ndarray:
    """CreateTime in ms per row: the column's value, or the write time where it is null."""
    if col is None:
        return np.full(n, now_ms, dtype=np.int64)
    unit = col.type.unit
    if col.null_count == 0:     # the int64s in place: no cast, no copy
        raw = np.frombuffer(col.buffers()[1], dtype=np.int64, count=n, offset=8 * col.offset)
    else:
        raw = pc.fill_null(col.cast(pa.int64()), 0).to_numpy(zero_copy_only=False)
    ms = raw * 1000 if unit == "s" else raw if unit == "ms" else raw // _UNIT_DIV[unit]
    if col.null_count:
        ms = np.where(col.is_null().to_numpy(zero_copy_only=False), now_ms, ms)
    if n and ms.min() < 0:
        bad = int(ms[ms < 0][0])
        raise InvalidRecordError(f"a row has timestamp {bad} ms (before 1970): Kafka record "
                                 "timestamps must be >= 0")
    return ms
