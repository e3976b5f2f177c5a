"""Spark sections of jobs/benchmark.py: format("kafkalog") against baselines, in one run.

spark-read: the same rows read (and fully materialised with the ``noop`` sink) from
  - a kafkalog cluster topic (``spark.read.format("kafkalog")``),
  - a no-op Python Arrow data source that only hands Spark pre-built Arrow batches of the same
    rows (the ceiling for any Python data source: no I/O, no decoding),
  - Parquet files holding the same columns.
spark-write: the same DataFrame written to
  - a kafkalog topic (``df.write.format("kafkalog")``, one atomic job commit),
  - a no-op Python Arrow sink (consumes the Arrow batches, keeps nothing),
  - a "bytes" Python Arrow sink that only writes the rows' key and value bytes to one fsynced
    file per task in the same directory, through the same storage layer and settings (O_DIRECT
    or the page cache) as kafkalog's segments: the storage floor, which shows what the
    kernel's share of any write costs on this machine,
  - Parquet.
Ratios are taken within the run: kafkalog / no-op, kafkalog / Parquet and, for writes,
kafkalog / bytes (throughput).

With ``--topic-partitions 4,100,1000`` both sections instead compare kafkalog with itself: the
same rows in topics of each partition count (one topic each, in one cluster), read or written
in the same session, taking turns; each count's time is reported with its ratio to the first
count's (time / first time: 1.5x means 50% slower). This is what issue #18 is judged on: the
cost of a job should follow its bytes, not the topic's partition count.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from typing import Callable, Dict, Iterator

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

import pyarrow as pa  # noqa: E402
from pyspark.sql.datasource import (DataSource, DataSourceArrowWriter, DataSourceReader,  # noqa: E402
                                    InputPartition, WriterCommitMessage)

ROWS_PER_BATCH = 10_000

try:   # Python workers cannot import jobs/: ship this module's classes by value
    from pyspark import cloudpickle
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
except Exception:   # pragma: no cover
    pass


def _rows(n: int, value_bytes: int, partition: int, start: int = 0) -> pa.RecordBatch:
    """The benchmark's rows for one partition, as the kafkalog reader returns them."""
    import numpy as np
    rng = np.random.default_rng(partition * 1_000_003 + start)
    values = rng.integers(0, 256, size=n * value_bytes, dtype=np.uint8).tobytes()
    keys = [b"key-%08d" % (i % 10_000) for i in range(start, start + n)]
    val_offsets = np.arange(0, (n + 1) * value_bytes, value_bytes, dtype=np.int32)
    value_arr = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(val_offsets.tobytes()),
                                                       pa.py_buffer(values)])
    ts = pa.array(1_700_000_000_000_000 + np.arange(start, start + n, dtype=np.int64) * 1000,
                  pa.timestamp("us", tz="UTC"))
    return pa.RecordBatch.from_arrays(
        [pa.array(keys, pa.binary()), value_arr, pa.array(["bench"] * n, pa.string()),
         pa.array([partition] * n, pa.int32()), pa.array(range(start, start + n), pa.int64()),
         ts, pa.array([0] * n, pa.int32())],
        names=["key", "value", "topic", "partition", "offset", "timestamp", "timestampType"])


class NoopSource(DataSource):
    """Hands Spark Arrow batches it builds in memory: what a Python source costs with no I/O."""

    @classmethod
    def name(cls):
        return "bench_noop"

    def schema(self):
        return ("key binary, value binary, topic string, partition int, offset long, "
                "timestamp timestamp, timestampType int")

    def reader(self, schema):
        return NoopReader(int(self.options["rows"]), int(self.options["partitions"]),
                          int(self.options["value_bytes"]))

    def writer(self, schema, overwrite):
        target = self.options.get("dir")
        return (BytesWriter(target, self.options.get("direct_io", "true")) if target
                else NoopWriter())


class NoopReader(DataSourceReader):
    def __init__(self, rows: int, partitions: int, value_bytes: int):
        self.rows, self.n, self.value_bytes = rows, partitions, value_bytes

    def partitions(self):
        return [InputPartition(p) for p in range(self.n)]

    def read(self, partition) -> Iterator[pa.RecordBatch]:
        per = self.rows // self.n
        batch = _rows(min(per, ROWS_PER_BATCH), self.value_bytes, partition.value)
        done = 0
        while done < per:   # the batch is reused: only handing over to Spark is measured
            k = min(ROWS_PER_BATCH, per - done)
            yield batch if k == batch.num_rows else batch.slice(0, k)
            done += k


class NoopWriter(DataSourceArrowWriter):
    def write(self, iterator) -> WriterCommitMessage:
        rows = 0
        for batch in iterator:
            rows += batch.num_rows
        return WriterCommitMessage()

    def commit(self, messages):
        pass

    def abort(self, messages):
        pass


class BytesWriter(DataSourceArrowWriter):
    """The storage floor: keeps each row's key and value bytes, as they come, and writes them to
    one file per task through the storage layer kafkalog uses (``create_if_absent_pieces``: the
    same O_DIRECT or page-cache path, fsync and link as a segment), and does nothing else. The
    kernel's share of a write is in here and in kafkalog alike, and absent from the no-op sink."""

    def __init__(self, target: str, direct_io: str):
        self.target, self.direct_io = target, direct_io

    def write(self, iterator) -> WriterCommitMessage:
        import uuid
        from pyspark_kafkalog.storage import open_storage
        views = []
        for batch in iterator:
            for name in ("key", "value"):
                arr = batch.column(name)
                offs = arr.buffers()[1]
                lo, hi = (int.from_bytes(offs[4 * i:4 * i + 4], "little", signed=True)
                          for i in (arr.offset, arr.offset + len(arr)))
                views.append(memoryview(arr.buffers()[2])[lo:hi])
        open_storage(self.target, direct_io=self.direct_io).create_if_absent_pieces(
            uuid.uuid4().hex, views)
        return WriterCommitMessage()

    def commit(self, messages):
        pass

    def abort(self, messages):
        pass


def round_robin(repeat: int, fns: Dict[str, Callable[[], object]]) -> Dict[str, list]:
    """Every contender ``repeat`` times, taking turns, so that drift in a shared machine's load
    falls on all of them alike; returns the sorted wall times per contender. The order rotates
    from one round to the next, so that each contender follows each other one equally often
    (with ``repeat`` a multiple of their number): what one leaves behind (Parquet's dirty page
    cache, written back during whatever runs next; a JVM garbage collection) falls on all of
    them alike, not always on the one after it."""
    times: Dict[str, list] = {name: [] for name in fns}
    order = list(fns.items())
    for r in range(repeat):
        for name, fn in order[r % len(order):] + order[:r % len(order)]:
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: sorted(v) for name, v in times.items()}


def _summary(rows: int, times: Dict[str, list], noop: str) -> Dict[str, object]:
    best = {k: v[0] for k, v in times.items()}
    median = {k: v[len(v) // 2] for k, v in times.items()}
    return {"rows": rows, "seconds": best, "median_seconds": median,
            "rows_per_s": {k: rows / v for k, v in best.items()},
            "ratio_vs_noop": best[noop] / best["kafkalog"],
            "ratio_vs_parquet": best["parquet"] / best["kafkalog"],
            **({"ratio_vs_bytes": best["bytes-sink"] / best["kafkalog"],
                "median_ratio_vs_bytes": median["bytes-sink"] / median["kafkalog"]}
               if "bytes-sink" in times else {}),
            "median_ratio_vs_noop": median[noop] / median["kafkalog"],
            "median_ratio_vs_parquet": median["parquet"] / median["kafkalog"]}


def _session():
    from pyspark.sql import SparkSession
    spark = (SparkSession.builder.master(os.environ.get("KAFKALOG_BENCH_MASTER", "local[2]"))
             .appName("kafkalog-benchmark").config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "4").getOrCreate())
    import pyspark_kafkalog
    pyspark_kafkalog.register(spark)
    spark.dataSource.register(NoopSource)
    return spark


def _fill_cluster(url: str, rows: int, partitions: int, value_bytes: int, codec: str,
                  topic: str = "bench") -> None:
    """Write the benchmark rows straight through the protocol (not through Spark); many
    partitions go in one send (one metadata commit) per ~200,000 rows."""
    from pyspark_kafkalog.admin import Admin
    from pyspark_kafkalog.client.producer import Producer
    from pyspark_kafkalog.format.records import Record
    admin = Admin(url)
    admin.create_topic(topic, partitions, configs={"segment.bytes": 256 << 20,
                                                   "compression.type": codec})
    prod = Producer(admin.cluster)
    per = rows // partitions
    pending, pending_rows = {}, 0
    for p in range(partitions):
        for start in range(0, per, 200_000):
            batch = _rows(min(200_000, per - start), value_bytes, p, start)
            ts = [t // 1000 for t in batch.column(5).cast(pa.int64()).to_pylist()]
            recs = [Record(k, v, t) for k, v, t in zip(batch.column(0).to_pylist(),
                                                       batch.column(1).to_pylist(), ts)]
            if (topic, p) in pending:
                prod.send(pending)
                pending, pending_rows = {}, 0
            pending[(topic, p)] = prod.encode(topic, recs, batch_records=1000)
            pending_rows += len(recs)
            if pending_rows >= 200_000:
                prod.send(pending)
                pending, pending_rows = {}, 0
    if pending:
        prod.send(pending)


def _counts(args):
    text = getattr(args, "topic_partitions", None)
    return [int(x) for x in text.split(",") if x.strip()] if text else None


def _sweep_summary(rows: int, counts, times: Dict[str, list]) -> Dict[str, object]:
    first = str(counts[0])
    median = {k: v[len(v) // 2] for k, v in times.items()}
    return {"rows": rows, "topic_partitions": counts, "times": times,
            "seconds": {k: v[0] for k, v in times.items()}, "median_seconds": median,
            "median_ratio_vs_first": {k: median[k] / median[first] for k in median}}


def run_read_sweep(args, spark, counts) -> Dict[str, object]:
    """kafkalog against itself: the same rows in topics of each partition count."""
    tmp = tempfile.mkdtemp(prefix="kafkalog-bench-", dir=args.dir)
    try:
        url = os.path.join(tmp, "cluster")
        for n in counts:
            _fill_cluster(url, args.rows, n, args.value_bytes, args.codec, f"bench-{n}")
        extra = dict(kv.split("=", 1) for kv in args.read_option or [])

        def mk(n):
            r = spark.read.format("kafkalog").option("subscribe", f"bench-{n}")
            for k, v in extra.items():
                r = r.option(k, v)
            return r.load(url)
        tasks = {str(n): mk(n).rdd.getNumPartitions() for n in counts}
        rows = {str(n): mk(n).count() for n in counts}   # also warms up
        times = round_robin(args.repeat, {
            str(n): (lambda n=n: mk(n).write.format("noop").mode("overwrite").save())
            for n in counts})
        return dict(_sweep_summary(args.rows, counts, times), spark_tasks=tasks,
                    rows_read=rows, read_options=extra)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def file_create_probe(directory: str, dirs: int = 100) -> float:
    """Microseconds per file to create three small files in each of ``dirs`` new directories
    under ``directory`` (kept: they go with the benchmark's temp dir). Printed beside a write
    sweep because a write to many partitions creates thousands of files, and on ext4 without a
    journal each create costs up to 20x more for minutes after large deletions (it skips every
    recently deleted inode: docs/spark-write.md), so the same code gives very different ratios."""
    root = tempfile.mkdtemp(prefix="probe-", dir=directory)
    paths = [os.path.join(root, str(i)) for i in range(dirs)]
    for d in paths:
        os.mkdir(d)
    data = b"\0" * 4096
    t0 = time.perf_counter()
    for d in paths:
        for name in ("p.log", "p.index", "p.timeindex"):
            fd = os.open(os.path.join(d, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
    return (time.perf_counter() - t0) / (3 * dirs) * 1e6


#: the suffix of the topics written with ``--compare-topic-config``
ALT = "-alt"


def run_write_sweep(args, spark, counts) -> Dict[str, object]:
    """The same cached DataFrame appended to topics of each partition count."""
    tmp = tempfile.mkdtemp(prefix="kafkalog-bench-", dir=args.dir)
    try:
        src = (spark.read.format("bench_noop").option("rows", args.rows)
               .option("partitions", args.partitions).option("value_bytes", args.value_bytes)
               .load().select("key", "value", "timestamp").cache())
        src.count()
        from pyspark_kafkalog.admin import Admin
        url = os.path.join(tmp, "cluster")
        admin = Admin(url)
        base = dict(kv.split("=", 1) for kv in getattr(args, "topic_config", None) or [])
        alt = dict(kv.split("=", 1) for kv in getattr(args, "compare_topic_config", None) or [])
        variants = {"": base, **({ALT: {**base, **alt}} if alt else {})}
        for n in counts:
            for suffix, configs in variants.items():
                admin.create_topic(f"bench-{n}{suffix}", n, configs={
                    "segment.bytes": 256 << 20, "compression.type": args.codec, **configs})
        direct_io = "false" if args.page_cache else "true"
        extra = dict(kv.split("=", 1) for kv in args.write_option or [])

        def write(topic):
            df = src
            if args.shuffle:   # each Kafka partition written by one of --partitions tasks
                from pyspark_kafkalog.spark.writer import repartition_by_kafka_partition
                df = repartition_by_kafka_partition(src, url, topic, num_tasks=args.partitions)
            w = (df.write.format("kafkalog").option("topic", topic)
                 .option("storage.direct_io", direct_io).mode("append"))
            for k, v in extra.items():
                w = w.option(k, v)
            w.save(url)
        cases = {f"{n}{suffix}": f"bench-{n}{suffix}" for suffix in variants for n in counts}
        probe = {"before": file_create_probe(tmp)}
        for topic in cases.values():   # warm-up
            write(topic)
        times = round_robin(args.repeat, {k: (lambda t=t: write(t)) for k, t in cases.items()})
        probe["after"] = file_create_probe(tmp)
        written = {k: sum(p.high_watermark for p in Admin(url).describe_topic(t).partitions)
                   for k, t in cases.items()}
        out = dict(_sweep_summary(args.rows, counts, {str(n): times[str(n)] for n in counts}),
                   rows_written=written, write_options=extra, topic_configs=base,
                   shuffle=bool(args.shuffle), file_create_us=probe)
        if alt:   # the same sweep with the other configs, taking turns with the first
            out["compare"] = dict(_sweep_summary(args.rows, counts, {
                str(n): times[f"{n}{ALT}"] for n in counts}), topic_configs={**base, **alt})
        return out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run_spark_read(args) -> Dict[str, object]:
    spark = _session()
    if _counts(args):
        return run_read_sweep(args, spark, _counts(args))
    tmp = tempfile.mkdtemp(prefix="kafkalog-bench-", dir=args.dir)
    try:
        url = os.path.join(tmp, "cluster")
        _fill_cluster(url, args.rows, args.partitions, args.value_bytes, args.codec)
        pq_path = os.path.join(tmp, "parquet")
        os.makedirs(pq_path)
        import pyarrow.parquet as pq
        per = args.rows // args.partitions
        for p in range(args.partitions):
            tables = [pa.Table.from_batches([_rows(min(200_000, per - s), args.value_bytes, p, s)])
                      for s in range(0, per, 200_000)]
            pq.write_table(pa.concat_tables(tables), os.path.join(pq_path, f"part-{p}.parquet"))
        readers = {
            "kafkalog": lambda: spark.read.format("kafkalog").option("subscribe", "bench").load(url),
            "noop-source": lambda: spark.read.format("bench_noop").option("rows", args.rows)
            .option("partitions", args.partitions).option("value_bytes", args.value_bytes).load(),
            "parquet": lambda: spark.read.parquet(pq_path),
        }
        counts = {name: mk().count() for name, mk in readers.items()}   # also warms up
        times = round_robin(args.repeat, {
            name: (lambda mk=mk: mk().write.format("noop").mode("overwrite").save())
            for name, mk in readers.items()})
        return dict(_summary(args.rows, times, "noop-source"), counts=counts)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run_spark_write(args) -> Dict[str, object]:
    spark = _session()
    if _counts(args):
        return run_write_sweep(args, spark, _counts(args))
    tmp = tempfile.mkdtemp(prefix="kafkalog-bench-", dir=args.dir)
    try:
        src = (spark.read.format("bench_noop").option("rows", args.rows)
               .option("partitions", args.partitions).option("value_bytes", args.value_bytes)
               .load().select("key", "value", "timestamp").cache())
        src.count()
        from pyspark_kafkalog.admin import Admin
        url = os.path.join(tmp, "cluster")
        raw = os.path.join(tmp, "raw")
        os.makedirs(raw)
        Admin(url).create_topic("bench", args.partitions,
                                configs={"segment.bytes": 256 << 20, "compression.type": args.codec})
        n = [0]
        direct_io = "false" if args.page_cache else "true"

        def parquet():
            n[0] += 1
            src.write.parquet(os.path.join(tmp, f"pq{n[0]}"))

        writers = {
            "kafkalog": lambda: src.write.format("kafkalog").option("topic", "bench")
            .option("storage.direct_io", direct_io).mode("append").save(url),
            "noop-sink": lambda: src.write.format("bench_noop").mode("append").save(),
            "bytes-sink": lambda: src.write.format("bench_noop").option("dir", raw)
            .option("direct_io", direct_io).mode("append").save(),
            "parquet": parquet,
        }
        for fn in writers.values():   # warm-up: Python workers, imports, JIT
            fn()
        times = round_robin(args.repeat, writers)
        written = Admin(url).describe_topic("bench").partitions
        return dict(_summary(args.rows, times, "noop-sink"),
                    kafkalog_rows_written=sum(p.high_watermark for p in written))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rows", type=int, default=2_000_000)
    p.add_argument("--partitions", type=int, default=4)
    p.add_argument("--value-bytes", type=int, default=100)
    p.add_argument("--codec", default="none",
                   help="the topic's compression.type (default none: Kafka's and the sink's "
                        "default); e.g. lz4 to see what the codec costs")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--dir", default=None,
                   help="where the data goes (default: the system temp dir); e.g. /dev/shm to "
                        "take the disk out of the comparison")
    p.add_argument("--topic-partitions", metavar="N,N,...", default=None,
                   help="compare kafkalog with itself over topics of these partition counts "
                        "(e.g. 4,100,1000): each count's time and its ratio to the first's")
    p.add_argument("--read-option", action="append", metavar="K=V",
                   help="with --topic-partitions: an option for every kafkalog read")
    p.add_argument("--write-option", action="append", metavar="K=V",
                   help="with --topic-partitions: an option for every kafkalog write")
    p.add_argument("--topic-config", action="append", metavar="K=V",
                   help="spark-write with --topic-partitions: a topic config of every topic "
                        "written (e.g. flush.messages=1: every write flushed before its "
                        "commit, docs/protocol.md §3)")
    p.add_argument("--compare-topic-config", action="append", metavar="K=V",
                   help="spark-write with --topic-partitions: also write topics with these "
                        "configs, taking turns with the others in the same session, and report "
                        "their ratios apart (e.g. flush.messages=1)")
    p.add_argument("--shuffle", action="store_true",
                   help="spark-write with --topic-partitions: shuffle the rows by target "
                        "partition first (repartition_by_kafka_partition, --partitions tasks)")
    p.add_argument("--page-cache", action="store_true",
                   help="spark-write: kafkalog and the bytes sink write through the page cache "
                        "(storage.direct_io=false) instead of with O_DIRECT (the default)")


def render(name: str, result: Dict[str, object]) -> str:
    if "topic_partitions" in result:
        return render_sweep(name, result)
    lines = [f"{name.upper()}: {result['rows']:,} rows; contenders take turns; throughput "
             "ratio kafkalog/baseline (>1: kafkalog faster)"]
    for k, s in result["seconds"].items():
        lines.append(f"  {k:<12} best {s:7.3f} s  median {result['median_seconds'][k]:7.3f} s"
                     f"  {result['rows_per_s'][k]:>12,.0f} rows/s (best)")
    lines.append(f"  ratio vs no-op:   best {result['ratio_vs_noop']:.2f}x   "
                 f"median {result['median_ratio_vs_noop']:.2f}x")
    lines.append(f"  ratio vs Parquet: best {result['ratio_vs_parquet']:.2f}x   "
                 f"median {result['median_ratio_vs_parquet']:.2f}x")
    if "ratio_vs_bytes" in result:
        lines.append(f"  ratio vs bytes:   best {result['ratio_vs_bytes']:.2f}x   "
                     f"median {result['median_ratio_vs_bytes']:.2f}x")
    return "\n".join(lines)


def render_sweep(name: str, result: Dict[str, object]) -> str:
    lines = [f"{name.upper()}: {result['rows']:,} rows in topics of "
             f"{', '.join(map(str, result['topic_partitions']))} partitions; counts take turns; "
             "ratio = median time / the first count's median time"]
    tasks = result.get("spark_tasks", {})
    for k in result["median_seconds"]:
        extra = f"  {tasks[k]:>5} Spark tasks" if k in tasks else ""
        lines.append(f"  {k:>6} partitions  best {result['seconds'][k]:7.3f} s  median "
                     f"{result['median_seconds'][k]:7.3f} s  ratio "
                     f"{result['median_ratio_vs_first'][k]:5.2f}x{extra}")
    if "compare" in result:
        other = result["compare"]
        lines.append(f"  topic configs {other['topic_configs']}, taking turns with the above:")
        for k in other["median_seconds"]:
            lines.append(f"  {k:>6} partitions  best {other['seconds'][k]:7.3f} s  median "
                         f"{other['median_seconds'][k]:7.3f} s  ratio "
                         f"{other['median_ratio_vs_first'][k]:5.2f}x")
    probe = result.get("file_create_us")
    if probe:
        lines.append(f"  creating a file here: {probe['before']:.0f} us before the runs, "
                     f"{probe['after']:.0f} us after (3 files in each of 100 new directories; "
                     "tens of us is a quiet filesystem, docs/spark-write.md)")
    return "\n".join(lines)
