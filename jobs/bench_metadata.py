"""``benchmark.py metadata``: what one small write costs as the cluster grows.

For each partition count: a fresh cluster on local disk with one topic of that many partitions;
single-record ``Admin.produce`` calls to random partitions, round-robin over the counts (latency
p50 and p99); the metadata bytes written per entry (entries plus snapshots); and the cold open of
a fresh process (open the cluster and replay its state: ``open_s``; ``process_s`` is the whole
process, against ``import_only_process_s`` for one that only imports the package). The
target (issue #14): p50 at the largest count within 2x the p50 at the smallest, and a cold open
at 100,000 partitions under 2 s.
"""
from __future__ import annotations

import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def add_arguments(p) -> None:
    p.add_argument("--partitions", default="10,10000,100000",
                   help="comma-separated partition counts (default 10,10000,100000)")
    p.add_argument("--produces", type=int, default=300, help="timed produce calls per count")
    p.add_argument("--warmup", type=int, default=20, help="untimed produce calls first")
    p.add_argument("--cold-repeat", type=int, default=3, help="cold opens per count (median)")
    p.add_argument("--dir", default=None, help="where to make the clusters (default: a temp dir)")
    p.add_argument("--seed", type=int, default=14)


_COLD = """
import sys, time
t0 = time.perf_counter()
from pyspark_kafkalog.cluster.cluster import Cluster
t1 = time.perf_counter()
if sys.argv[1] != "-":
    c = Cluster(sys.argv[1], create=False)
    s = c.state()
    assert s.topics
t2 = time.perf_counter()
print(t1 - t0, t2 - t1)
"""


def _cold_open(url: str, repeat: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    opens, walls, imports = [], [], []
    for _ in range(repeat):
        for target, out in ((url, opens), ("-", None)):
            t = time.perf_counter()
            res = subprocess.run([sys.executable, "-c", _COLD, target], env=env,
                                 capture_output=True, text=True, check=True)
            wall = time.perf_counter() - t
            imp, work = map(float, res.stdout.split())
            if out is not None:
                out.append(work)
                walls.append(wall)
            else:
                imports.append(wall)
    return {"open_s": statistics.median(opens), "process_s": statistics.median(walls),
            "import_only_process_s": statistics.median(imports)}


def _metadata_bytes(root: Path) -> dict:
    log = root / "_kafkalog" / "log"
    entries = sum(p.stat().st_size for p in log.glob("*[0-9].json"))
    snaps = sum(p.stat().st_size for p in log.rglob("*snapshot*") if p.is_file())
    return {"entries": entries, "snapshots": snaps}


def _make(n: int, args, base: Path):
    from pyspark_kafkalog.admin import Admin
    from pyspark_kafkalog.format.records import Record
    root = base / f"p{n}"
    shutil.rmtree(root, ignore_errors=True)
    t = time.perf_counter()
    admin = Admin(str(root))
    admin.create_topic("m", n)
    created_s = time.perf_counter() - t
    rnd = random.Random(args.seed)
    for _ in range(args.warmup):
        admin.produce("m", [Record(b"k", b"v" * 100, 1)], partition=rnd.randrange(n))
    return {"n": n, "root": root, "admin": admin, "rnd": rnd, "created_s": created_s,
            "lat": [], "bytes0": _metadata_bytes(root), "seq0": admin.cluster.state().seq}


def run(args) -> dict:
    """Every count's cluster is made first; then the timed produce calls (and the cold opens)
    go round-robin over the counts, so that a change of machine load hits them all alike."""
    from pyspark_kafkalog.format.records import Record
    counts = [int(x) for x in str(args.partitions).split(",") if x.strip()]
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="kl-meta-bench-"))
    rows = []
    try:
        runs = [_make(n, args, base) for n in counts]
        for _ in range(args.produces):
            for r in runs:
                t = time.perf_counter()
                r["admin"].produce("m", [Record(b"k", b"v" * 100, 1)],
                                   partition=r["rnd"].randrange(r["n"]))
                r["lat"].append(time.perf_counter() - t)
        colds = {r["n"]: [] for r in runs}
        for _ in range(args.cold_repeat):
            for r in runs:
                colds[r["n"]].append(_cold_open(str(r["root"]), 1))
        for r in runs:
            lat = sorted(r["lat"])
            after, seq1 = _metadata_bytes(r["root"]), r["admin"].cluster.state().seq
            entries = max(seq1 - r["seq0"], 1)
            cold = {k: statistics.median(c[k] for c in colds[r["n"]]) for k in colds[r["n"]][0]}
            rows.append({
                "partitions": r["n"], "create_s": r["created_s"],
                "produce_p50_ms": statistics.median(lat) * 1000,
                "produce_p99_ms": lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000,
                "entry_bytes_per_entry": (after["entries"] - r["bytes0"]["entries"]) / entries,
                "snapshot_bytes_per_entry":
                    (after["snapshots"] - r["bytes0"]["snapshots"]) / entries,
                **cold})
            print(render_row(rows[-1]), flush=True)
    finally:
        if not args.dir:
            shutil.rmtree(base, ignore_errors=True)
    first = rows[0]
    for r in rows:
        r["p50_vs_first"] = r["produce_p50_ms"] / first["produce_p50_ms"]
    return {"section": "metadata", "rows": rows}


def render_row(r: dict) -> str:
    return (f"{r['partitions']:>8} partitions: produce p50 {r['produce_p50_ms']:7.2f} ms  "
            f"p99 {r['produce_p99_ms']:7.2f} ms  entry {r['entry_bytes_per_entry']:8.0f} B/entry  "
            f"snapshot {r['snapshot_bytes_per_entry']:10.0f} B/entry  cold open "
            f"{r['open_s']:.3f} s (process {r['process_s']:.2f} s, import only "
            f"{r['import_only_process_s']:.2f} s)  create {r['create_s']:.1f} s")


def render(result: dict) -> str:
    lines = ["", "metadata: single-record produce latency, metadata bytes, cold open"]
    for r in result["rows"]:
        lines.append(render_row(r) + f"  p50 ratio {r['p50_vs_first']:.2f}x")
    return "\n".join(lines)


if __name__ == "__main__":
    import argparse
    p = argparse.ArgumentParser()
    add_arguments(p)
    print(json.dumps(run(p.parse_args()), indent=1))
