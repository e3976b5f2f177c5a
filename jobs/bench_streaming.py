"""``benchmark.py streaming``: the Structured Streaming source and sink (issue #15).

Four parts, each selectable with ``--parts``:

planning
    A cluster with one topic of ``--partitions`` partitions (KIP-227's target: 10,000), one
    record in each. In this process and without Spark, ``KafkaLogStreamReader`` is driven as
    Spark's planner process drives it: ``initialOffset()``, then per trigger ``--changed``
    single-record produces to distinct random partitions (each its own ``Admin.produce``, so
    its own metadata entries: the worst case for a poll that reads entries one by one),
    ``latestOffset(start, ReadAllAvailable())``, ``reportLatestOffset()``,
    ``partitions(start, end)`` and ``commit(end)``, with the offsets passed through JSON as
    the runner passes them. Storage requests are counted by a proxy around the storage
    objects the reader's cluster uses (the benchmark swaps them in; the library is not
    changed). Target: ``latestOffset`` makes at most 2 x changed partitions + a constant
    requests per trigger, and takes under 50 ms (median). The first trigger, which follows
    the fetch session's full fetch, is reported apart.
spark-planning
    The same topic under a real query (``readStream.format("kafkalog")`` to the ``noop``
    sink, ``processingTime='0 seconds'``): ``--changed`` records per trigger, written in one
    atomic produce so that one micro-batch sees them all; ``durationMs.latestOffset`` of each
    data batch from ``query.recentProgress``. This adds the runner's round trip and the JVM's
    handling of a 10,000-partition offset to what ``planning`` measures.
throughput
    ``--rows`` rows in a topic of ``--throughput-partitions`` partitions, copied by a streaming
    query (kafkalog -> kafkalog, ``Trigger.AvailableNow``, a fresh checkpoint each time) and by
    a batch job (``spark.read.format("kafkalog")`` -> ``write.format("kafkalog")``), taking
    turns in one session after one untimed run of each. The target (stream >= 0.8x batch) is
    judged on the query's throughput as Spark reports it: rows over the time of its
    micro-batches (``triggerExecution``, what ``processedRowsPerSecond`` divides by). The
    ratio from wall time (a query's ``start()`` to its termination, medians) is reported
    beside it: the difference is the per-query start-up (Spark's Python streaming runner
    and planner processes, offsets, the checkpoint), about 2.5 s here, which a running query
    pays once, not per row (docs/performance.md, "Streaming").
latency
    A query kafkalog -> kafkalog at ``processingTime='0 seconds'`` (one partition in, one
    out); ``--latency-records`` records produced one at a time (``Admin.produce``), every
    ``--latency-interval-ms``, each carrying its wall-clock time at produce; this process
    polls the sink topic and notes when each record appears. p50/p95 of produce -> visible in
    the sink, and of the produce call alone.
"""
from __future__ import annotations

import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Callable, Dict, List, Optional

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

PARTS = ("planning", "spark-planning", "throughput", "latency")
#: the "constant" of the request target: requests a trigger may make beyond 2 per changed
#: partition (the poll's read that finds no new entry, and a little slack)
REQUEST_CONSTANT = 4
LATEST_OFFSET_TARGET_MS = 50.0
THROUGHPUT_TARGET = 0.8
#: storage calls that reach the store (everything a Storage does on a caller's behalf)
COUNTED = frozenset({
    "read", "read_into", "map", "size", "exists", "list", "list_dirs", "mtime", "clock",
    "create_if_absent", "create_if_absent_pieces", "replace", "append", "truncate", "delete",
    "delete_many", "delete_tree", "makedirs", "open_spool", "cleanup_temp_files"})
PLANNING_TOPIC = "plan"


def add_arguments(p) -> None:
    p.add_argument("--parts", default=",".join(PARTS),
                   help=f"comma-separated parts to run (default all: {','.join(PARTS)})")
    p.add_argument("--partitions", type=int, default=10_000,
                   help="planning: partitions of the topic (default 10,000)")
    p.add_argument("--triggers", type=int, default=30, help="planning: triggers (default 30)")
    p.add_argument("--changed", type=int, default=10,
                   help="planning: partitions produced to before each trigger (default 10)")
    p.add_argument("--spark-triggers", type=int, default=5,
                   help="spark-planning: data micro-batches to wait for (default 5)")
    p.add_argument("--rows", type=int, default=2_000_000, help="throughput: rows (default 2M)")
    p.add_argument("--throughput-partitions", type=int, default=4,
                   help="throughput: partitions of the source and sink topics (default 4)")
    p.add_argument("--value-bytes", type=int, default=100)
    p.add_argument("--repeat", type=int, default=3,
                   help="throughput: timed runs of each contender, taking turns (default 3)")
    p.add_argument("--latency-records", type=int, default=50)
    p.add_argument("--latency-interval-ms", type=int, default=200)
    p.add_argument("--dir", default=None, help="where the clusters go (default: a temp dir)")
    p.add_argument("--seed", type=int, default=15)


# -- counting storage requests -------------------------------------------------------------------

class Tally:
    """Storage calls (and the time in them) since the last :meth:`take`."""

    def __init__(self):
        self.counts: Counter = Counter()
        self.seconds = 0.0

    def take(self) -> dict:
        out = {"requests": sum(self.counts.values()), "by_call": dict(self.counts),
               "storage_ms": self.seconds * 1000}
        self.counts, self.seconds = Counter(), 0.0
        return out


class CountingStorage:
    """A proxy that counts the calls a caller makes on a Storage (calls the storage makes on
    itself are not requests of the caller's, and are not seen)."""

    def __init__(self, inner, tally: Tally):
        self._inner, self._tally = inner, tally

    def __getattr__(self, name):
        attr = getattr(self._inner, name)
        if name not in COUNTED or not callable(attr):
            return attr
        tally = self._tally

        def counted(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return attr(*args, **kwargs)
            finally:
                tally.seconds += time.perf_counter() - t0
                tally.counts[name] += 1
        return counted


class Timers:
    """Wall time spent in named functions, swapped in on classes or instances for the run."""

    def __init__(self):
        self.ms: Counter = Counter()
        self._undo: List[Callable[[], None]] = []

    def wrap(self, owner, attr: str, name: str, classmethod_: bool = False) -> None:
        orig = owner.__dict__[attr] if classmethod_ else getattr(owner, attr)
        fn = orig.__func__ if classmethod_ else orig
        ms = self.ms

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                ms[name] += (time.perf_counter() - t0) * 1000
        setattr(owner, attr, classmethod(timed) if classmethod_ else timed)
        self._undo.append(lambda: setattr(owner, attr, orig))

    def take(self) -> Dict[str, float]:
        out = dict(self.ms)
        self.ms.clear()
        return out

    def undo(self) -> None:
        while self._undo:
            self._undo.pop()()


def _pct(values: List[float], q: float) -> Optional[float]:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, max(0, int(round(q * (len(s) - 1)))))]


def _stats(values: List[float]) -> dict:
    return {"median": statistics.median(values) if values else None, "p95": _pct(values, 0.95),
            "max": max(values) if values else None}


# -- planning, in process --------------------------------------------------------------------------

def _planning_cluster(root: str, n: int) -> dict:
    """One topic of ``n`` partitions with one record in each (one atomic send)."""
    from pyspark_kafkalog.admin import Admin
    from pyspark_kafkalog.client.producer import Producer
    from pyspark_kafkalog.format.records import Record
    t0 = time.perf_counter()
    admin = Admin(root)
    admin.create_topic(PLANNING_TOPIC, n)
    t1 = time.perf_counter()
    prod = Producer(admin.cluster)
    prod.send({(PLANNING_TOPIC, p): prod.encode(PLANNING_TOPIC, [Record(b"k", b"v", 1)])
               for p in range(n)})
    return {"create_s": t1 - t0, "fill_s": time.perf_counter() - t1}


def run_planning(args, root: str) -> dict:
    from pyspark.sql.streaming.datasource import ReadAllAvailable
    from pyspark_kafkalog.admin import Admin
    from pyspark_kafkalog.connector import sources
    from pyspark_kafkalog.connector.stream_plan import SourceOffset
    from pyspark_kafkalog.format.records import Record
    from pyspark_kafkalog.spark.read_options import ReadOptions
    from pyspark_kafkalog.spark.stream_reader import KafkaLogStreamReader

    n, changed = args.partitions, min(args.changed, args.partitions)
    reader = KafkaLogStreamReader(
        ReadOptions.parse({"path": root, "subscribe": PLANNING_TOPIC}, streaming=True), None)
    tally, timers = Tally(), Timers()
    real_cached = sources.cached_storage
    sources.cached_storage = lambda url, opts=None: CountingStorage(real_cached(url, opts), tally)
    try:
        t0 = time.perf_counter()
        reader._open()
        open_ms = (time.perf_counter() - t0) * 1000
        open_requests = tally.take()
        cluster = reader._cluster
        counting = CountingStorage(cluster.storage, tally)
        cluster.storage = counting
        cluster.metalog.storage = counting
        # where the time goes: the fetch (the metadata log's poll, the subscription's
        # partitions, the fetch session) and the offsets' JSON, against the rest (the reader's
        # own per-partition work)
        timers.wrap(reader, "_fetch", "fetch")
        timers.wrap(reader._positions, "prefetch", "metadata_poll")
        timers.wrap(reader, "_subscribed", "subscribed")
        timers.wrap(reader._session, "fetch", "session_fetch")
        timers.wrap(SourceOffset, "from_json", "offset_json", classmethod_=True)
        timers.wrap(SourceOffset, "to_json", "offset_json")

        t0 = time.perf_counter()
        start = json.loads(json.dumps(reader.initialOffset()))
        initial = {"ms": (time.perf_counter() - t0) * 1000, **tally.take()}
        timers.take()
        admin = Admin(root)
        rnd = random.Random(args.seed)
        triggers = []
        for i in range(args.triggers):
            targets = rnd.sample(range(n), changed)
            t0 = time.perf_counter()
            for p in targets:
                admin.produce(PLANNING_TOPIC, [Record(b"k", b"v%d" % i, 1)], partition=p)
            produce_ms = (time.perf_counter() - t0) * 1000
            tally.take()
            timers.take()
            row = {"trigger": i + 1, "changed": changed, "produce_ms": produce_ms}

            t0 = time.perf_counter()
            end = reader.latestOffset(start, ReadAllAvailable())
            row["latest_offset_ms"] = (time.perf_counter() - t0) * 1000
            lat = tally.take()
            row["latest_offset_requests"] = lat["requests"]
            row["latest_offset_by_call"] = lat["by_call"]
            row["latest_offset_storage_ms"] = lat["storage_ms"]
            row["latest_offset_split_ms"] = _split(timers.take(), row["latest_offset_ms"],
                                                   lat["storage_ms"])

            t0 = time.perf_counter()
            reader.reportLatestOffset()
            end = json.loads(json.dumps(end))   # the runner's round trip, as Spark pays it
            row["report_and_json_ms"] = (time.perf_counter() - t0) * 1000
            tally.take()
            timers.take()

            t0 = time.perf_counter()
            splits = reader.partitions(start, end)
            row["partitions_ms"] = (time.perf_counter() - t0) * 1000
            part = tally.take()
            row["partitions_requests"] = part["requests"]
            row["partitions_by_call"] = part["by_call"]
            row["input_partitions"] = len(splits)
            row["partitions_split_ms"] = _split(timers.take(), row["partitions_ms"],
                                                part["storage_ms"])

            t0 = time.perf_counter()
            reader.commit(end)
            row["commit_ms"] = (time.perf_counter() - t0) * 1000
            row["commit_requests"] = tally.take()["requests"]
            timers.take()

            s, e = SourceOffset.from_json(start).positions, SourceOffset.from_json(end).positions
            row["offsets_advanced"] = sum(e[tp] - s.get(tp, 0) for tp in e)
            row["partitions_advanced"] = sum(1 for tp in e if e[tp] != s.get(tp))
            triggers.append(row)
            start = end
        full_fetches = reader.stats.get("full_fetches")
    finally:
        timers.undo()
        sources.cached_storage = real_cached
        reader.stop()

    steady = triggers[1:] or triggers
    bound = 2 * changed + REQUEST_CONSTANT
    lat_ms = [t["latest_offset_ms"] for t in steady]
    lat_req = [t["latest_offset_requests"] for t in steady]
    part_ms = [t["partitions_ms"] for t in steady]
    part_req = [t["partitions_requests"] for t in steady]
    med = statistics.median(lat_ms)
    return {
        "partitions": n, "changed_per_trigger": changed, "triggers": args.triggers,
        "open_ms": open_ms, "open_requests": open_requests["requests"],
        "initial_offset": initial, "first_trigger": triggers[0] if triggers else None,
        "full_fetches": full_fetches,
        "latest_offset_ms": _stats(lat_ms), "latest_offset_requests": _stats(lat_req),
        "partitions_ms": _stats(part_ms), "partitions_requests": _stats(part_req),
        "report_and_json_ms": _stats([t["report_and_json_ms"] for t in steady]),
        "latest_offset_split_median_ms": {
            k: statistics.median(t["latest_offset_split_ms"][k] for t in steady)
            for k in steady[0]["latest_offset_split_ms"]},
        "partitions_split_median_ms": {
            k: statistics.median(t["partitions_split_ms"][k] for t in steady)
            for k in steady[0]["partitions_split_ms"]},
        "all_offsets_advanced": all(t["offsets_advanced"] == changed
                                    and t["partitions_advanced"] == changed for t in triggers),
        "target": {
            "requests_bound": bound, "requests_formula": f"2 x {changed} + {REQUEST_CONSTANT}",
            "requests_ok": max(lat_req) <= bound,
            "partitions_requests_ok": max(part_req) <= bound,
            "ms_bound": LATEST_OFFSET_TARGET_MS, "ms_ok": med < LATEST_OFFSET_TARGET_MS,
            "p95_ms_ok": _pct(lat_ms, 0.95) < LATEST_OFFSET_TARGET_MS},
        "per_trigger": triggers,
    }


def _split(spent: Dict[str, float], total_ms: float, storage_ms: float) -> Dict[str, float]:
    """A call's time by where it went: the metadata log's poll (of which storage requests),
    the subscription's partition list, the fetch session (client and server), the rest of the
    fetch, the offsets' JSON, and the rest of the reader. Storage requests outside the poll
    (partitions() opening the changed partitions' logs) are in ``rest``."""
    fetch = spent.get("fetch", 0.0)
    poll = spent.get("metadata_poll", 0.0)
    parts = {"metadata_poll": poll, "of_which_storage": min(storage_ms, poll),
             "subscribed": spent.get("subscribed", 0.0),
             "session_fetch": spent.get("session_fetch", 0.0)}
    parts["fetch_other"] = fetch - poll - parts["subscribed"] - parts["session_fetch"]
    parts["offset_json"] = spent.get("offset_json", 0.0)
    parts["rest"] = total_ms - fetch - parts["offset_json"]
    parts["storage_total"] = storage_ms
    return parts


# -- Spark parts ---------------------------------------------------------------------------------

def _session():
    import bench_spark
    from pyspark.sql import SparkSession
    # bench_spark's session, without the console progress bar between the reports
    (SparkSession.builder.master(os.environ.get("KAFKALOG_BENCH_MASTER", "local[2]"))
     .appName("kafkalog-benchmark").config("spark.ui.enabled", "false")
     .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark = bench_spark._session()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _wait(cond: Callable[[], bool], what: str, timeout_s: float = 300.0, every_s: float = 0.02,
          query=None):
    deadline = time.monotonic() + timeout_s
    while not cond():
        if query is not None and not query.isActive:
            raise RuntimeError(f"the query stopped while waiting for {what}: {query.exception()}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up after {timeout_s:.0f} s waiting for {what}")
        time.sleep(every_s)


def _progress_after(query, batch_id: int) -> List[dict]:
    return [p for p in query.recentProgress if p["batchId"] > batch_id]


def run_spark_planning(args, spark, root: str, tmp: str) -> dict:
    """The planning topic under a real query to the ``noop`` sink."""
    from pyspark_kafkalog.admin import Admin
    from pyspark_kafkalog.client.producer import Producer
    from pyspark_kafkalog.format.records import Record
    n, changed = args.partitions, min(args.changed, args.partitions)
    prod = Producer(Admin(root).cluster)
    rnd = random.Random(args.seed + 1)
    t0 = time.perf_counter()
    q = (spark.readStream.format("kafkalog").option("subscribe", PLANNING_TOPIC).load(root)
         .writeStream.format("noop").option("checkpointLocation", os.path.join(tmp, "ck-plan"))
         .trigger(processingTime="0 seconds").start())
    try:
        _wait(lambda: q.recentProgress, "the query's first micro-batch", query=q)
        started_s = time.perf_counter() - t0
        last = max(p["batchId"] for p in q.recentProgress)
        batches = []
        for _ in range(args.spark_triggers):
            targets = rnd.sample(range(n), changed)
            prod.produce(PLANNING_TOPIC, [Record(b"k", b"s", 1)] * changed, partitions=targets)
            _wait(lambda: sum(p["numInputRows"] for p in _progress_after(q, last)) >= changed,
                  "the records in a micro-batch", query=q)
            for p in _progress_after(q, last):
                d = p["durationMs"]
                batches.append({"batch": p["batchId"], "rows": p["numInputRows"],
                                "latest_offset_ms": d.get("latestOffset"),
                                "query_planning_ms": d.get("queryPlanning"),
                                "add_batch_ms": d.get("addBatch"),
                                "trigger_ms": d.get("triggerExecution")})
            last = max(p["batchId"] for p in q.recentProgress)
    finally:
        q.stop()
    lat = [b["latest_offset_ms"] for b in batches if b["latest_offset_ms"] is not None]
    return {"partitions": n, "changed_per_trigger": changed, "start_to_first_batch_s": started_s,
            "latest_offset_ms": _stats(lat),
            "trigger_ms": _stats([b["trigger_ms"] for b in batches if b["trigger_ms"]]),
            "target": {"ms_bound": LATEST_OFFSET_TARGET_MS,
                       "ms_ok": bool(lat) and statistics.median(lat) < LATEST_OFFSET_TARGET_MS},
            "batches": batches}


def run_throughput(args, spark, root: str, tmp: str) -> dict:
    """Streaming copy against batch copy of the same rows, taking turns."""
    import bench_spark
    from pyspark_kafkalog.admin import Admin
    t0 = time.perf_counter()
    bench_spark._fill_cluster(root, args.rows, args.throughput_partitions, args.value_bytes,
                              "none", topic="src")
    fill_s = time.perf_counter() - t0
    admin = Admin(root)
    for t in ("dst-stream", "dst-batch"):
        admin.create_topic(t, args.throughput_partitions, configs={"segment.bytes": 256 << 20})
    rows = sum(p.high_watermark for p in admin.describe_topic("src").partitions)
    runs = [0]
    progress: List[List[dict]] = []
    phases: List[Dict[str, float]] = []

    def stream():
        runs[0] += 1
        t0 = time.time()
        q = (spark.readStream.format("kafkalog").option("subscribe", "src")
             .option("startingOffsets", "earliest").load(root)
             .select("key", "value", "timestamp")
             .writeStream.format("kafkalog").option("topic", "dst-stream")
             .option("checkpointLocation", os.path.join(tmp, f"ck-tput-{runs[0]}"))
             .trigger(availableNow=True).start(root))
        t1 = time.time()
        q.awaitTermination()
        t2 = time.time()
        if q.exception() is not None:
            raise RuntimeError(f"streaming query failed: {q.exception()}")
        pr = q.recentProgress
        progress.append(pr)
        first = _epoch_s(pr[0]["timestamp"])
        last_end = _epoch_s(pr[-1]["timestamp"]) + pr[-1]["durationMs"]["triggerExecution"] / 1000
        phases.append({"start_call": t1 - t0, "to_first_trigger": first - t1,
                       "triggers": last_end - first, "after_last_trigger": t2 - last_end})

    def batch():
        (spark.read.format("kafkalog").option("subscribe", "src").load(root)
         .select("key", "value", "timestamp")
         .write.format("kafkalog").option("topic", "dst-batch").mode("append").save(root))

    stream()    # warm-up: the planner process, Python workers, JIT
    batch()
    progress.clear()
    phases.clear()
    times = bench_spark.round_robin(args.repeat, {"stream": stream, "batch": batch})
    written = {t: sum(p.high_watermark for p in admin.describe_topic(t).partitions)
               for t in ("dst-stream", "dst-batch")}
    trig = sorted(sum(p["durationMs"].get("triggerExecution", 0) for p in pr) / 1000
                  for pr in progress)
    add_batch = sorted(sum(p["durationMs"].get("addBatch", 0) for p in pr) / 1000
                       for pr in progress)
    med = {k: statistics.median(v) for k, v in times.items()}
    ratio = med["batch"] / med["stream"]
    phase_med = {k: statistics.median(ph[k] for ph in phases) for k in phases[0]}
    trig_med = phase_med["triggers"]
    return {"rows": rows, "partitions": args.throughput_partitions, "fill_s": fill_s,
            "seconds": times, "median_seconds": med,
            "rows_per_s": {k: rows / v for k, v in med.items()},
            "stream_trigger_execution_s": trig, "stream_add_batch_s": add_batch,
            "stream_micro_batches": [len(p) for p in progress],
            "stream_phases_median_s": phase_med,
            "stream_per_query_overhead_s": sum(v for k, v in phase_med.items()
                                               if k != "triggers"),
            "ratio_stream_over_batch": ratio,
            "ratio_trigger_time_over_batch": med["batch"] / trig_med,
            "rows_written": written,
            "rows_written_ok": written == {"dst-stream": rows * (1 + args.repeat),
                                           "dst-batch": rows * (1 + args.repeat)},
            "target": {"ratio_bound": THROUGHPUT_TARGET, "judged_on": "micro-batches",
                       "ok": med["batch"] / trig_med >= THROUGHPUT_TARGET}}


def _epoch_s(timestamp: str) -> float:
    """A progress event's ``timestamp`` (ISO 8601, UTC) in seconds since the epoch."""
    import datetime
    return datetime.datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()


def run_latency(args, spark, root: str, tmp: str) -> dict:
    """Produce -> visible in the sink topic, through a query at processingTime 0."""
    from pyspark_kafkalog.admin import Admin
    from pyspark_kafkalog.format.records import Record
    admin = Admin(root)
    admin.create_topic("lat-src", 1)
    admin.create_topic("lat-dst", 1)
    q = (spark.readStream.format("kafkalog").option("subscribe", "lat-src")
         .option("startingOffsets", "earliest").load(root)   # nothing is missed while it starts
         .select("key", "value")
         .writeStream.format("kafkalog").option("topic", "lat-dst")
         .option("checkpointLocation", os.path.join(tmp, "ck-lat"))
         .trigger(processingTime="0 seconds").start(root))
    poller = Admin(root)
    seen: Dict[bytes, float] = {}
    pos = [0]

    def poll() -> None:
        now = time.time()
        for r in poller.consume("lat-dst", 0, start=pos[0]):
            seen[r.key] = now
            pos[0] = r.offset + 1

    try:
        # the query is ready once a first record made it through (workers started, planned)
        for i in range(3):
            admin.produce("lat-src", [Record(b"warm-%d" % i, b"%f" % time.time(), 1)],
                          partition=0)
            _wait(lambda: (poll(), b"warm-%d" % i in seen)[1], "a warm-up record in the sink",
                  every_s=0.01, query=q)
        sent: Dict[bytes, float] = {}
        produce_ms: List[float] = []

        def produce_all():
            for i in range(args.latency_records):
                key = b"rec-%d" % i
                t = time.time()
                admin.produce("lat-src", [Record(key, b"%.6f" % t, int(t * 1000))], partition=0)
                produce_ms.append((time.time() - t) * 1000)
                sent[key] = t
                time.sleep(args.latency_interval_ms / 1000)

        th = threading.Thread(target=produce_all, daemon=True)
        th.start()
        want = {b"rec-%d" % i for i in range(args.latency_records)}
        _wait(lambda: (poll(), want <= seen.keys())[1], "every record in the sink",
              timeout_s=300 + args.latency_records * args.latency_interval_ms / 1000,
              every_s=0.01, query=q)
        th.join()
        # the value carries the produce time: check it against what the producer noted
        values = {r.key: float(r.value) for r in poller.consume("lat-dst", 0)
                  if r.key in want}
        assert all(abs(values[k] - sent[k]) < 1e-3 for k in want), "values do not match"
        lat = [(seen[k] - values[k]) * 1000 for k in want]
        batches = len(q.recentProgress)
    finally:
        q.stop()
    return {"records": args.latency_records, "interval_ms": args.latency_interval_ms,
            "latency_ms": {"p50": _pct(lat, 0.5), "p95": _pct(lat, 0.95), "max": max(lat),
                           "min": min(lat)},
            "produce_ms": {"p50": _pct(produce_ms, 0.5), "p95": _pct(produce_ms, 0.95)},
            "micro_batches": batches}


# -- entry -------------------------------------------------------------------------------------

def run(args) -> dict:
    parts = [p.strip() for p in str(args.parts).split(",") if p.strip()]
    bad = [p for p in parts if p not in PARTS]
    if bad:
        raise SystemExit(f"unknown part(s) {', '.join(bad)}; choose from {', '.join(PARTS)}")
    base = tempfile.mkdtemp(prefix="kl-stream-bench-", dir=args.dir)
    result: dict = {"section": "streaming", "parts": parts}
    try:
        plan_root = os.path.join(base, "plan")
        if "planning" in parts or "spark-planning" in parts:
            result["planning_cluster"] = _planning_cluster(plan_root, args.partitions)
        if "planning" in parts:
            result["planning"] = run_planning(args, plan_root)
            print(render_planning(result["planning"]), flush=True)
        spark = _session() if set(parts) - {"planning"} else None
        if "spark-planning" in parts:
            result["spark_planning"] = run_spark_planning(args, spark, plan_root, base)
            print(render_spark_planning(result["spark_planning"]), flush=True)
        if "throughput" in parts:
            result["throughput"] = run_throughput(args, spark, os.path.join(base, "tput"), base)
            print(render_throughput(result["throughput"]), flush=True)
        if "latency" in parts:
            result["latency"] = run_latency(args, spark, os.path.join(base, "lat"), base)
            print(render_latency(result["latency"]), flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return result


def _ok(flag) -> str:
    return "met" if flag else "MISSED"


def render_planning(r: dict) -> str:
    lo, lr, po, pr = (r["latest_offset_ms"], r["latest_offset_requests"], r["partitions_ms"],
                      r["partitions_requests"])
    t = r["target"]
    first = r["first_trigger"] or {}
    return "\n".join([
        f"PLANNING in process: {r['partitions']:,} partitions, {r['changed_per_trigger']} "
        f"changed per trigger, {r['triggers']} triggers (trigger 1 apart)",
        f"  initialOffset {r['initial_offset']['ms']:.1f} ms, "
        f"{r['initial_offset']['requests']} requests; trigger 1: latestOffset "
        f"{first.get('latest_offset_ms', 0):.1f} ms, {first.get('latest_offset_requests')} requests",
        f"  latestOffset  median {lo['median']:6.1f} ms  p95 {lo['p95']:6.1f} ms   requests "
        f"median {lr['median']:g}  max {lr['max']:g}",
        f"  partitions()  median {po['median']:6.1f} ms  p95 {po['p95']:6.1f} ms   requests "
        f"median {pr['median']:g}  max {pr['max']:g}",
        "  where the time goes (medians, ms): " + _render_split(r),
        f"  runner JSON round trip + reportLatestOffset (not in latestOffset above): median "
        f"{r['report_and_json_ms']['median']:.1f} ms",
        f"  target: requests <= {t['requests_formula']} = {t['requests_bound']}: "
        f"{_ok(t['requests_ok'])} (partitions(): {_ok(t['partitions_requests_ok'])}); "
        f"median < {t['ms_bound']:g} ms: {_ok(t['ms_ok'])} (p95: {_ok(t['p95_ms_ok'])})",
    ])


def _render_split(r: dict) -> str:
    out = []
    for label, key in (("latestOffset", "latest_offset_split_median_ms"),
                       ("partitions()", "partitions_split_median_ms")):
        b = r[key]
        out.append(f"{label}: metadata poll {b['metadata_poll']:.1f} (storage "
                   f"{b['of_which_storage']:.1f}), subscription {b['subscribed']:.1f}, fetch "
                   f"session {b['session_fetch']:.1f}, other fetch {b['fetch_other']:.1f}, "
                   f"offsets JSON {b['offset_json']:.1f}, rest {b['rest']:.1f}")
    return "\n    ".join([""] + out)


def render_spark_planning(r: dict) -> str:
    lo = r["latest_offset_ms"]
    return (f"SPARK PLANNING: query over {r['partitions']:,} partitions to noop, "
            f"{len(r['batches'])} data micro-batches: durationMs.latestOffset median "
            f"{lo['median']} ms, p95 {lo['p95']} ms; triggerExecution median "
            f"{r['trigger_ms']['median']} ms; target median < {r['target']['ms_bound']:g} ms: "
            f"{_ok(r['target']['ms_ok'])}")


def render_throughput(r: dict) -> str:
    m, rps, ph = r["median_seconds"], r["rows_per_s"], r["stream_phases_median_s"]
    return "\n".join([
        f"THROUGHPUT: {r['rows']:,} rows, {r['partitions']} partitions, kafkalog -> kafkalog, "
        "median of the turns",
        f"  stream (AvailableNow) {m['stream']:7.2f} s  {rps['stream']:>10,.0f} rows/s   "
        f"(micro-batches {ph['triggers']:.2f} s; per query: start() {ph['start_call']:.2f} s, "
        f"to the first trigger {ph['to_first_trigger']:.2f} s, after the last "
        f"{ph['after_last_trigger']:.2f} s)",
        f"  batch                 {m['batch']:7.2f} s  {rps['batch']:>10,.0f} rows/s",
        f"  throughput stream/batch (the query's micro-batches) "
        f"{r['ratio_trigger_time_over_batch']:.2f}x (target >= {r['target']['ratio_bound']}: "
        f"{_ok(r['target']['ok'])}); wall time with the query's start-up "
        f"{r['ratio_stream_over_batch']:.2f}x; rows written "
        f"{'ok' if r['rows_written_ok'] else 'WRONG: ' + str(r['rows_written'])}",
    ])


def render_latency(r: dict) -> str:
    lat, pr = r["latency_ms"], r["produce_ms"]
    return (f"LATENCY: {r['records']} records every {r['interval_ms']} ms through a query at "
            f"processingTime 0: produce -> visible in the sink p50 {lat['p50']:.0f} ms, p95 "
            f"{lat['p95']:.0f} ms (min {lat['min']:.0f}, max {lat['max']:.0f}); the produce call "
            f"alone p50 {pr['p50']:.0f} ms; {r['micro_batches']} micro-batches")


def render(result: dict) -> str:
    out = ["", "streaming: Structured Streaming source and sink"]
    if "planning" in result:
        out.append(render_planning(result["planning"]))
    if "spark_planning" in result:
        out.append(render_spark_planning(result["spark_planning"]))
    if "throughput" in result:
        out.append(render_throughput(result["throughput"]))
    if "latency" in result:
        out.append(render_latency(result["latency"]))
    return "\n".join(out)


if __name__ == "__main__":
    import argparse
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    p = argparse.ArgumentParser()
    add_arguments(p)
    print(json.dumps(run(p.parse_args()), indent=1, default=str))
