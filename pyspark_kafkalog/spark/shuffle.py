"""The shuffle that keeps a job from writing T x P segments: one Spark task per Kafka partition.

A Python data source cannot ask Spark to distribute its input (PySpark 4.3's ``PythonWrite`` has
no ``RequiresDistributionAndOrdering``), so the sink writes whatever partitioning the DataFrame
has: every task writes a segment in every Kafka partition its rows map to. This module shuffles
the DataFrame *before* the write so that all rows of a Kafka partition meet in one task.

* The target partition of each row is computed as the sink computes it (explicit ``partition``
  kept, Kafka's murmur2 of the key, sticky runs for unkeyed rows). With PySpark >= 4.1 this is an
  Arrow UDF over the key column only (the murmur2 of ``arrow.arrow_encode``, in C when built;
  no pandas, which ``mapInArrow`` would need); PySpark 4.0 has no Arrow UDF, and there Kafka's
  murmur2 is evaluated by Spark SQL itself (``kafka_partition``: higher-order functions, slower).
  Both are bit-identical to the Java producer (tested against kafka-python).
* Rows are hash-partitioned on a *slot key* chosen so that Spark's own hash (Murmur3, seed 42,
  ``pmod`` by the task count) sends Kafka partition ``p`` to Spark partition ``p`` exactly (or
  ``p % tasks``), instead of letting hash collisions pile partitions into one task.
"""
from __future__ import annotations

from typing import Dict, Iterator, List, Optional, Tuple

import numpy as np
import pyarrow as pa

from pyspark.sql import Column
from pyspark.sql import functions as F

_M = 0x5BD1E995
_MASK = 0xFFFFFFFF
_SEED = 0x9747B28C


def _mul(x: Column) -> Column:
    """``x * m`` in 32-bit unsigned arithmetic, on longs (never overflows: x, m < 2^32)."""
    return (x * F.lit(_M).cast("long")).bitwiseAND(F.lit(_MASK))


def _let(value: Column, fn) -> Column:
    """``fn(value)`` with ``value`` evaluated once (a lambda binding keeps the plan linear)."""
    return F.element_at(F.transform(F.array(value), fn), 1)


def kafka_murmur2(key: Column) -> Column:
    """Kafka's ``Utils.murmur2`` of a binary column as an unsigned 32-bit value (long)."""
    hx = F.hex(key)
    length = F.octet_length(key).cast("long")
    n4 = F.floor(length / 4).cast("int")

    def byte(i: Column) -> Column:   # i: 0-based byte index (int column)
        return F.conv(hx.substr(i * 2 + 1, F.lit(2)), 16, 10).cast("long")

    blocks = F.filter(F.sequence(F.lit(0), n4), lambda j: j < n4)
    ks = F.transform(blocks, lambda j: byte(j * 4)
                     .bitwiseOR(F.shiftleft(byte(j * 4 + 1), 8))
                     .bitwiseOR(F.shiftleft(byte(j * 4 + 2), 16))
                     .bitwiseOR(F.shiftleft(byte(j * 4 + 3), 24)))
    ks = F.transform(ks, _mul)
    ks = F.transform(ks, lambda k: k.bitwiseXOR(F.shiftright(k, 24)))
    ks = F.transform(ks, _mul)
    h0 = F.lit(_SEED).cast("long").bitwiseXOR(length).bitwiseAND(F.lit(_MASK))
    h = F.aggregate(ks, h0, lambda acc, k: _mul(acc).bitwiseXOR(k))
    rest = length % 4
    tail = n4 * 4
    h = _let(h, lambda x: F.when(rest >= 3, x.bitwiseXOR(F.shiftleft(byte(tail + 2), 16)))
             .otherwise(x))
    h = _let(h, lambda x: F.when(rest >= 2, x.bitwiseXOR(F.shiftleft(byte(tail + 1), 8)))
             .otherwise(x))
    h = _let(h, lambda x: F.when(rest >= 1, _mul(x.bitwiseXOR(byte(tail)))).otherwise(x))
    h = _let(h, lambda x: x.bitwiseXOR(F.shiftright(x, 13)))
    h = _let(h, _mul)
    return _let(h, lambda x: x.bitwiseXOR(F.shiftright(x, 15)))


def kafka_partition(key: Column, num_partitions: Column) -> Column:
    """``toPositive(murmur2(key)) % numPartitions`` (null for a null key)."""
    return F.pmod(kafka_murmur2(key).bitwiseAND(F.lit(0x7FFFFFFF)), num_partitions.cast("long"))


# -- Spark's own hash, to aim rows at exact Spark partitions ------------------------------------

def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & 0xFFFFFFFF


def spark_hash_int(value: int, seed: int = 42) -> int:
    """Spark's ``Murmur3_x86_32.hashInt`` (what ``hash()`` and ``repartition(n, col)`` use for
    an int column), as a signed 32-bit int."""
    k = (value & 0xFFFFFFFF) * 0xCC9E2D51 & 0xFFFFFFFF
    k = _rotl(k, 15) * 0x1B873593 & 0xFFFFFFFF
    h = seed ^ k
    h = (_rotl(h, 13) * 5 + 0xE6546B64) & 0xFFFFFFFF
    h ^= 4
    h ^= h >> 16
    h = h * 0x85EBCA6B & 0xFFFFFFFF
    h ^= h >> 13
    h = h * 0xC2B2AE35 & 0xFFFFFFFF
    h ^= h >> 16
    return h - (1 << 32) if h & 0x80000000 else h


def slot_keys(tasks: int) -> List[int]:
    """``keys[r]``: an int that ``repartition(tasks, col)`` sends to Spark partition ``r``."""
    keys: Dict[int, int] = {}
    v = 0
    while len(keys) < tasks:
        keys.setdefault(spark_hash_int(v) % tasks, v)   # Python's % is Spark's pmod here
        v += 1
    return [keys[r] for r in range(tasks)]


def _arrow_assign(counts: Dict[str, int], base: Dict[str, int], tasks: int, keys: List[int],
                  sticky_rows: int):
    """The Arrow UDF ``(key, partition, topic, value length) -> struct<p, s>`` (partition, slot
    key), or None before PySpark 4.1."""
    try:
        from pyspark.sql.pandas.functions import arrow_udf
    except ImportError:
        return None
    salt_of = np.asarray(keys, dtype=np.int64)

    def assign(batches: Iterator[Tuple[pa.Array, pa.Array, pa.Array, pa.Array]]
               ) -> Iterator[pa.Array]:
        from pyspark import TaskContext

        from ..connector.arrow_writer import Sticky, choose_partitions, explicit_partitions
        ctx = TaskContext.get()
        start = spark_hash_int(ctx.partitionId() if ctx else 0) & 0x7FFFFFFF
        sticky: Dict[str, Sticky] = {}
        for key, explicit, topic, vlen in batches:
            n = len(key)
            key = key if pa.types.is_binary(key.type) else key.cast(pa.binary())
            sizes = (np.maximum(pc_len(key), 0) + np.maximum(pc_len(vlen, True), 0) + 12)
            given = explicit_partitions(explicit)
            topics = topic.to_numpy(zero_copy_only=False)
            part = np.zeros(n, np.int64)
            salt = np.zeros(n, np.int64)
            known = np.zeros(n, dtype=bool)
            for t in set(topics.tolist()):
                if t not in counts:
                    continue      # no such topic: left null, the sink reports it
                idx = np.flatnonzero(topics == t)
                if t not in sticky:
                    sticky[t] = Sticky(counts[t], start, sticky_rows, 1 << 62)
                sub = None if given is None else (given[0][idx], given[1][idx])
                p = choose_partitions(t, counts[t], key.take(pa.array(idx)), sub, sizes[idx],
                                      sticky[t])
                part[idx], known[idx] = p, True
                salt[idx] = salt_of[(base[t] + p) % tasks]
            missing = None if known.all() else ~known
            yield pa.StructArray.from_arrays(
                [pa.array(part, pa.int32(), mask=missing),
                 pa.array(salt, pa.int32(), mask=missing)],
                names=["p", "s"])

    return arrow_udf(assign, "struct<p:int,s:int>").asNondeterministic()


def pc_len(arr: pa.Array, is_length: bool = False) -> np.ndarray:
    """Byte lengths (or the values of a length column), -1 for null."""
    import pyarrow.compute as pc
    if not is_length:
        arr = pc.binary_length(arr)
    return pc.fill_null(arr.cast(pa.int64()), -1).to_numpy(zero_copy_only=False)


def shuffle_by_partition(df, counts: Dict[str, int], *, topic: Optional[str],
                         tasks: Optional[int] = None, sticky_rows: int = 10_000,
                         use_arrow: bool = True):
    """``df`` with its ``partition`` column filled and repartitioned: see
    ``spark.writer.repartition_by_kafka_partition`` (which validates and calls this)."""
    names = df.columns
    topics = sorted(counts)
    base, total = {}, 0
    for t in topics:
        base[t], total = total, total + counts[t]
    tasks = int(tasks or total)
    keys = slot_keys(tasks)
    slot = "__kafkalog_slot__"
    key = F.col("key").cast("binary") if "key" in names else F.lit(None).cast("binary")
    explicit = F.col("partition").cast("int") if "partition" in names else F.lit(None)
    tcol = F.lit(topic) if topic is not None else F.col("topic")
    udf = _arrow_assign(counts, base, tasks, keys, sticky_rows) if use_arrow else None
    if udf is not None:
        assigned = udf(key, explicit.cast("int"), tcol.cast("string"),
                       F.octet_length(F.col("value")).cast("int"))
        out = df.withColumn(slot, assigned)
        out = out.withColumn("partition", F.col(f"{slot}.p")).withColumn(slot, F.col(f"{slot}.s"))
        return out.repartition(tasks, F.col(slot)).drop(slot)
    if topic is not None:
        n, first = F.lit(counts[topic]), F.lit(base[topic])
    else:
        n = F.element_at(F.create_map(*[x for t in topics for x in (F.lit(t), F.lit(counts[t]))]),
                         tcol)
        first = F.element_at(F.create_map(*[x for t in topics for x in (F.lit(t),
                                                                        F.lit(base[t]))]), tcol)
    # unkeyed rows: runs of sticky_rows consecutive rows per partition (KIP-480's stickiness)
    unkeyed = F.pmod(F.floor(F.monotonically_increasing_id() / sticky_rows), n.cast("long"))
    part = F.coalesce(explicit, kafka_partition(key, n).cast("int"), unkeyed.cast("int"))
    salt = F.element_at(F.array(*[F.lit(k) for k in keys]),
                        F.pmod(first + F.col("partition"), F.lit(tasks)).cast("int") + 1)
    out = df.withColumn("partition", part)
    return out.withColumn(slot, salt).repartition(tasks, F.col(slot)).drop(slot)
