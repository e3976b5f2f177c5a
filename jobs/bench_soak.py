"""``benchmark.py soak``: a cluster after many commits, not only a fresh one.

Full speed (the default): one warm producer makes ``--commits`` single-record commits to
``--partitions`` partitions of a fresh local cluster, round robin, while maintenance runs
beside it as the coordinator's schedule would, compressed in time: a ``cleanup`` (segment
merges, covered segments, metadata cleanup) every ``--maintenance-every`` commits, with
``segment.merge.lag.ms``/``file.delete.delay.ms``/``metadata.max.retention.ms`` at
``--lag-ms``/``--delay-ms``/``--metadata-retention-ms`` (0: a day of commits in minutes). Per
window of ``--window`` commits it reports the commit latency p50/p99, segments per partition,
metadata entries on storage, bytes written by merges per byte produced (write amplification)
and the maintenance time. At the end one more cleanup, then the files on storage against the
bounds of issue #32 (⌈bytes/segment.bytes⌉ + 8 segments per partition; entries within the
snapshot interval plus a few), and every record is read back once, in order, by ``consume``.

``--s3``: the HTTP requests of a warm single-record produce on S3 (a moto server), on a fresh
cluster and after ``--s3-history`` commits (target: at most 6).

``--stream SECONDS``: a streaming query (kafkalog -> kafkalog, 1 s trigger) for that long with a
producer beside it and merges every few seconds; per window the planner's ``latestOffset``
time, segments per partition and the records the sink wrote, then a check that the sink holds
every produced record exactly once.
"""
from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def add_arguments(p) -> None:
    p.add_argument("--commits", type=int, default=100_000)
    p.add_argument("--partitions", type=int, default=4)
    p.add_argument("--window", type=int, default=10_000, help="commits per reported window")
    p.add_argument("--maintenance-every", type=int, default=2_000,
                   help="commits between two cleanups (the coordinator's schedule, compressed)")
    p.add_argument("--lag-ms", type=int, default=0, help="segment.merge.lag.ms of the passes")
    p.add_argument("--delay-ms", type=int, default=0, help="file.delete.delay.ms of the passes")
    p.add_argument("--metadata-retention-ms", type=int, default=0,
                   help="metadata.max.retention.ms of the maintenance process")
    p.add_argument("--segment-bytes", type=int, default=1 << 30)
    p.add_argument("--s3", action="store_true", help="also S3 requests per produce (moto)")
    p.add_argument("--s3-history", type=int, default=2_000)
    p.add_argument("--stream", type=int, default=0, metavar="SECONDS",
                   help="also a streaming query for this long")
    p.add_argument("--dir", default=None)
    import bench_soak_stream
    bench_soak_stream.add_arguments(p)


def _pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else None


def _count_files(root: Path, topic: str, partitions: int):
    segs = [len(list((root / "logdir-0" / f"{topic}-{p}").glob("*.log")))
            for p in range(partitions)]
    log = [n for n in os.listdir(root / "_kafkalog" / "log") if n.endswith(".json")]
    entries = sum(1 for n in log if "snapshot" not in n)
    return segs, entries, len(log) - entries


def full_speed(args, base: Path) -> dict:
    from pyspark_kafkalog.admin import Admin
    from pyspark_kafkalog.cluster.cluster import Cluster
    from pyspark_kafkalog.maintenance.retention import collect_garbage
    from pyspark_kafkalog.format.records import Record
    root = base / "soak"
    # write amplification: bytes the merges wrote per byte the producer wrote to the log
    url = str(root)
    admin = Admin(url)
    admin.create_topic("t", args.partitions, configs={"segment.bytes": str(args.segment_bytes)})
    maint = Cluster(url, metadata_max_retention_ms=args.metadata_retention_ms)
    windows, lat, written, maint_s = [], [], 0, 0.0
    record_bytes = None   # one record's batch as stored: what a commit adds to the log
    first, last = [], []
    for i in range(args.commits):
        value = b"v%09d" % i
        t = time.perf_counter()
        admin.produce("t", [Record(b"k%d" % (i % 97), value, 1_700_000_000_000 + i)],
                      partition=i % args.partitions)
        dt = time.perf_counter() - t
        lat.append(dt)
        if record_bytes is None:
            record_bytes = (root / "logdir-0" / "t-0" / f"{0:020d}.log").stat().st_size
        if i < 1000:
            first.append(dt)
        if i >= args.commits - 1000:
            last.append(dt)
        if (i + 1) % args.maintenance_every == 0:
            t = time.perf_counter()
            removed = collect_garbage(maint, merge_lag_ms=args.lag_ms,
                                      file_delete_delay_ms=args.delay_ms)
            maint_s += time.perf_counter() - t
            written += sum(os.path.getsize(root / f"{p}.log") for p in removed["merged"]
                           if (root / f"{p}.log").exists())
        if (i + 1) % args.window == 0:
            segs, entries, snaps = _count_files(root, "t", args.partitions)
            windows.append({"commits": i + 1, "p50_ms": 1000 * statistics.median(lat),
                            "p99_ms": 1000 * _pct(lat, 0.99), "segments": segs,
                            "entries": entries, "snapshots": snaps,
                            "amplification": written / (record_bytes * (i + 1)),
                            "maintenance_s": maint_s})
            print(_window_line(windows[-1]), flush=True)
            lat, maint_s = [], 0.0
    t = time.perf_counter()
    collect_garbage(maint, merge_lag_ms=0, file_delete_delay_ms=0)
    final_cleanup_s = time.perf_counter() - t
    segs, entries, snaps = _count_files(root, "t", args.partitions)
    data_bytes = [sum(f.stat().st_size for f in (root / "logdir-0" / f"t-{p}").glob("*.log"))
                  for p in range(args.partitions)]
    bound = [-(-b // args.segment_bytes) + 8 for b in data_bytes]
    t = time.perf_counter()
    got = {}
    for r in Admin(url).consume("t"):
        got.setdefault(r.partition, []).append((r.offset, r.value))
    read_s = time.perf_counter() - t
    exact = all([o for o, _ in got.get(p, [])] == list(range(len(got.get(p, []))))
                for p in range(args.partitions)) and sum(map(len, got.values())) == args.commits
    values = sorted(v for rows in got.values() for _, v in rows)
    exact = exact and values == sorted(b"v%09d" % i for i in range(args.commits))
    return {"windows": windows,
            "first_1000_p50_ms": 1000 * statistics.median(first),
            "last_1000_p50_ms": 1000 * statistics.median(last),
            "ratio_last_first": statistics.median(last) / statistics.median(first),
            "final_cleanup_s": final_cleanup_s, "segments_after_cleanup": segs,
            "segment_bound": bound, "entries_after_cleanup": entries,
            "snapshots_after_cleanup": snaps,
            "write_amplification": written / max(1, sum(data_bytes)),
            "read_back_s": read_s, "every_record_once_in_order": exact}


def _window_line(w: dict) -> str:
    return (f"  {w['commits']:>8} commits  p50 {w['p50_ms']:6.2f} ms  p99 {w['p99_ms']:6.2f} ms"
            f"  segments/partition {max(w['segments']):>6}  entries {w['entries']:>6}"
            f"  amplification {w['amplification']:5.2f}  maintenance {w['maintenance_s']:5.1f} s")


def s3_requests(args, base: Path) -> dict:
    """Warm single-record produces on a moto S3 server: the requests each sends."""
    import socket
    import subprocess
    import urllib.request
    import uuid
    from pyspark_kafkalog.admin import Admin
    from pyspark_kafkalog.format.records import Record
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    launcher = ("import sys, moto.server\n_r = moto.server.run_simple\n"
                "moto.server.run_simple = lambda *a, **k: _r(*a, **{**k, 'threaded': False})\n"
                "moto.server.main(sys.argv[1:])")
    proc = subprocess.Popen([sys.executable, "-c", launcher, "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        for _ in range(200):
            try:
                opener.open(endpoint + "/moto-api/", timeout=1).close()
                break
            except Exception:
                time.sleep(0.1)
        import boto3
        boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="testing",
                     aws_secret_access_key="testing",
                     region_name="us-east-1").create_bucket(Bucket="soak")
        opts = {"endpoint_url": endpoint, "key": "testing", "secret": "testing",
                "client_kwargs": {"region_name": "us-east-1"}}
        admin = Admin(f"s3://soak/c-{uuid.uuid4().hex[:8]}", **opts)
        admin.create_topic("t", 4)
        admin.produce("t", [Record(b"k", b"v", 1)], partition=0)
        sent = []
        fs = admin.cluster.storage.base._fs
        fs.s3.meta.events.register("before-send", lambda request, **kw: sent.append(1))

        def per_produce(n):
            counts = []
            for i in range(n):
                before = len(sent)
                admin.produce("t", [Record(b"k", b"v", 1)], partition=i % 4)
                counts.append(len(sent) - before)
            return counts
        fresh = per_produce(100)
        for i in range(args.s3_history):
            admin.produce("t", [Record(b"k", b"v", 1)], partition=i % 4)
        late = per_produce(100)
        return {"fresh_median": statistics.median(fresh), "fresh_max": max(fresh),
                "fresh_mean": statistics.mean(fresh),
                "after_history_median": statistics.median(late), "after_history_max": max(late),
                "after_history_mean": statistics.mean(late), "history": args.s3_history}
    finally:
        proc.terminate()


def run(args) -> dict:
    base = Path(args.dir or tempfile.mkdtemp(prefix="kafkalog-soak-"))
    base.mkdir(parents=True, exist_ok=True)
    try:
        out = {"full_speed": full_speed(args, base)} if args.commits else {}
        if args.s3:
            out["s3"] = s3_requests(args, base)
        if args.stream:
            import bench_soak_stream
            out["stream"] = bench_soak_stream.run(args, base)
        return out
    finally:
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)


def render(res: dict) -> str:
    lines = []
    f = res.get("full_speed")
    if f:
        lines += ["soak, full speed:",
                  f"  commit p50: first 1,000 {f['first_1000_p50_ms']:.2f} ms, last 1,000 "
                  f"{f['last_1000_p50_ms']:.2f} ms (x{f['ratio_last_first']:.2f}; target <= 1.5)",
                  f"  after a final cleanup ({f['final_cleanup_s']:.1f} s): segments per "
                  f"partition {f['segments_after_cleanup']} (bound {f['segment_bound']}), "
                  f"metadata entries {f['entries_after_cleanup']}, snapshots "
                  f"{f['snapshots_after_cleanup']}",
                  f"  write amplification of merges {f['write_amplification']:.2f}; read back in "
                  f"{f['read_back_s']:.1f} s, every record once in order: "
                  f"{f['every_record_once_in_order']}"]
    if "s3" in res:
        s = res["s3"]
        lines.append(f"  S3 requests per warm produce: fresh median {s['fresh_median']} (max "
                     f"{s['fresh_max']}, mean {s['fresh_mean']:.2f}); after {s['history']} "
                     f"commits median {s['after_history_median']} (max "
                     f"{s['after_history_max']}, mean {s['after_history_mean']:.2f})")
    if "stream" in res:
        import bench_soak_stream
        lines += bench_soak_stream.render(res["stream"])
    return "\n".join(lines)
