"""``benchmark.py soak --stream SECONDS``: a streaming query kafkalog -> kafkalog (1 s trigger)
with a producer beside it and cleanup (segment merges, covered segments, metadata) every
``--stream-maintenance-s`` seconds, for SECONDS. Per window of ``--stream-window-s``: the
planner's ``latestOffset`` (p50/p99 of ``durationMs.latestOffset``), the micro-batch time,
segments per partition of the source and sink topics, and metadata entries on storage. At the
end the sink holds every produced record exactly once."""
from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


def add_arguments(p) -> None:
    p.add_argument("--stream-rate", type=float, default=20.0, help="produces per second")
    p.add_argument("--stream-window-s", type=float, default=30.0)
    p.add_argument("--stream-maintenance-s", type=float, default=10.0)
    p.add_argument("--stream-metadata-retention-ms", type=int, default=3_600_000,
                   help="metadata.max.retention.ms of the maintenance process (below the "
                        "query's follow window only to see that it copes)")


def _pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else None


def _segments(root: Path, topic: str):
    d = root / "logdir-0"
    return [len(list(p.glob("*.log"))) for p in sorted(d.glob(f"{topic}-*"))]


def run(args, base: Path) -> dict:
    from pyspark.sql import SparkSession
    from pyspark_kafkalog import register
    from pyspark_kafkalog.admin import Admin
    from pyspark_kafkalog.cluster.cluster import Cluster
    from pyspark_kafkalog.maintenance.retention import collect_garbage
    from pyspark_kafkalog.format.records import Record
    root = base / "stream"
    url = str(root)
    admin = Admin(url)
    admin.create_topic("in", 4)
    admin.create_topic("out", 4)
    spark = (SparkSession.builder.master("local[2]").appName("kafkalog-soak-stream")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "4").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    query = (spark.readStream.format("kafkalog").option("subscribe", "in")
             .option("startingOffsets", "earliest").load(url)
             .selectExpr("key", "value").writeStream.format("kafkalog")
             .option("topic", "out").option("checkpointLocation", str(base / "ck"))
             .trigger(processingTime="1 second").start(url))
    stop = threading.Event()
    produced = []
    maint = Cluster(url, metadata_max_retention_ms=args.stream_metadata_retention_ms)

    def producer():
        i = 0
        while not stop.is_set():
            value = b"s%09d" % i
            admin.produce("in", [Record(b"k%d" % (i % 13), value, int(time.time() * 1000))],
                          partition=i % 4)
            produced.append(value)
            i += 1
            time.sleep(1 / args.stream_rate)

    def maintenance():
        while not stop.wait(args.stream_maintenance_s):
            collect_garbage(maint, merge_lag_ms=args.lag_ms, file_delete_delay_ms=args.delay_ms)
    threads = [threading.Thread(target=producer), threading.Thread(target=maintenance)]
    for t in threads:
        t.start()
    windows, t0, seen_batches = [], time.monotonic(), 0
    try:
        while time.monotonic() - t0 < args.stream:
            time.sleep(args.stream_window_s)
            progress = [p for p in query.recentProgress if p["batchId"] >= seen_batches]
            if progress:
                seen_batches = progress[-1]["batchId"] + 1
            lo = [p["durationMs"].get("latestOffset", 0) for p in progress]
            trig = [p["durationMs"].get("triggerExecution", 0) for p in progress]
            log = [n for n in os.listdir(root / "_kafkalog" / "log") if n.endswith(".json")]
            windows.append({
                "t_s": round(time.monotonic() - t0), "batches": len(progress),
                "latest_offset_p50_ms": _pct(lo, 0.5), "latest_offset_p99_ms": _pct(lo, 0.99),
                "trigger_p50_ms": _pct(trig, 0.5), "segments_in": _segments(root, "in"),
                "segments_out": _segments(root, "out"),
                "entries": sum(1 for n in log if "snapshot" not in n), "produced": len(produced)})
            print("  " + json.dumps(windows[-1]), flush=True)
    finally:
        stop.set()
        for t in threads:
            t.join()
    deadline = time.monotonic() + 120
    want = sorted(produced)
    got = []
    while time.monotonic() < deadline:
        got = sorted(r.value for r in admin.consume("out"))
        if len(got) >= len(want):
            break
        time.sleep(1)
    query.stop()
    spark.stop()
    return {"windows": windows, "produced": len(want), "sink_records": len(got),
            "exactly_once": got == want,
            "latest_offset_p50_ms_first_last": [windows[0]["latest_offset_p50_ms"],
                                                windows[-1]["latest_offset_p50_ms"]]
            if windows else None}


def render(r: dict) -> list:
    lines = [f"  streaming soak: {len(r['windows'])} windows, {r['produced']} records produced, "
             f"{r['sink_records']} in the sink, exactly once: {r['exactly_once']}"]
    for w in r["windows"]:
        lines.append(f"    t={w['t_s']:>5} s  latestOffset p50 {w['latest_offset_p50_ms']} ms "
                     f"p99 {w['latest_offset_p99_ms']} ms  trigger p50 {w['trigger_p50_ms']} ms"
                     f"  segments in {w['segments_in']} out {w['segments_out']}  entries "
                     f"{w['entries']}")
    return lines
