"""``benchmark.py replication``: what copying to followers costs (docs/protocol.md §1.3).

- **catch-up:** a leader log dir with ``--segments`` sealed segments of ``--segment-mb`` MiB and
  an empty follower log dir on the same filesystem. One replication pass (copy with every batch
  checked, ``--fetchers`` segments at once, the ``replica_progress`` entry, follower
  checkpoints) against the baseline of plain
  ``shutil.copyfile`` plus fsync of the same files to the same place; interleaved, best of
  ``--repeat``. The ratio is baseline time / ours (target >= 0.8: checking costs little).
- **server-side copy** (``--s3``, needs moto): the same segments between two buckets of one
  moto server, copied by the store and verified by checksum, against the same copy streamed
  through this process (the copier's path for stores on different endpoints).
- **produce latency:** 1 KiB write units to one partition, RF=1 against RF=2 with ``acks=all``
  and ``acks=1``, with a replicator stepping every ``--fetch-wait-ms`` on a thread (what the
  coordinator does); p50 and p99 of the call, and the metadata entries per unit.
"""
from __future__ import annotations

import os
import random
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path

MiB = 1 << 20


def add_arguments(p) -> None:
    p.add_argument("--segments", type=int, default=8, help="sealed segments to catch up")
    p.add_argument("--segment-mb", type=int, default=64, help="MiB per segment")
    p.add_argument("--repeat", type=int, default=3, help="interleaved runs, best kept")
    p.add_argument("--units", type=int, default=200, help="timed produce calls per case")
    p.add_argument("--fetch-wait-ms", type=int, default=20,
                   help="pause between replication passes in the latency cases")
    p.add_argument("--fetchers", type=int, default=None,
                   help="the replicator's num_replica_fetchers (default: its own, 4)")
    p.add_argument("--s3", action="store_true", help="also server-side vs streamed on moto")
    p.add_argument("--dir", default=None, help="where to make the clusters (default: temp)")


def _admin(root: Path, second: Path, rf: int, configs=None):
    from pyspark_kafkalog.admin import Admin
    admin = Admin(str(root), fsync=True)
    if rf > 1:
        admin.add_log_dir(str(second))
    admin.cluster.placement_random = random.Random(0)
    admin.create_topic("t", 1, rf, dict(configs or {}))
    return admin


def _replicator(admin, fetchers=None):
    from pyspark_kafkalog.cluster.lease import acquire, new_holder_id
    from pyspark_kafkalog.coordinator.replicator import Replicator
    lease = acquire(admin.cluster, new_holder_id(), "bench", 600_000)
    kw = {} if fetchers is None else {"num_replica_fetchers": fetchers}
    return Replicator(admin.cluster, lambda: lease.epoch, **kw)


def _fill(admin, segments: int, segment_mb: int) -> None:
    from pyspark_kafkalog.format.records import Record
    value = os.urandom(MiB - 100)
    for s in range(segments):   # one unit per segment: segments never span reservations
        admin.produce("t", [Record(b"k%d" % i, value) for i in range(segment_mb)], partition=0,
                      acks="1")


def _leader_path(admin, root: Path, second: Path) -> Path:
    name = admin.cluster.state().topics["t"]["replicas"][0][0]
    return (root / name if name == "logdir-0" else second) / "t-0"


def catch_up(base: Path, args) -> dict:
    from pyspark_kafkalog.cluster.features import REPLICATION
    ours, plain, size = [], [], 0
    for r in range(args.repeat):
        run_dir = base / f"run{r}"
        root, second = run_dir / "root", run_dir / "second"
        admin = _admin(root, second, 2)
        _fill(admin, args.segments, args.segment_mb)
        rep = _replicator(admin, getattr(args, "fetchers", None))
        admin.cluster.enable_feature(REPLICATION)
        leader = _leader_path(admin, root, second)
        files = sorted(p for p in leader.iterdir() if p.suffix in (".log", ".index", ".timeindex"))
        size = sum(p.stat().st_size for p in files)
        t = time.perf_counter()
        result = rep.tick()
        ours.append(time.perf_counter() - t)
        assert result.ok and result.segments == args.segments, result
        modes = result.by_mode
        # the baseline: the same files copied and fsynced, to the same filesystem
        dst = run_dir / "plain"
        dst.mkdir()
        t = time.perf_counter()
        for p in files:
            shutil.copyfile(p, dst / p.name)
            fd = os.open(dst / p.name, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
        fd = os.open(dst, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
        plain.append(time.perf_counter() - t)
        shutil.rmtree(run_dir, ignore_errors=True)
    best, base_best = min(ours), min(plain)
    return {"bytes": size, "segments": args.segments, "ours_s": best,
            "fetchers": rep.num_replica_fetchers, "modes": modes,
            "copyfile_fsync_s": base_best, "ours_mb_s": size / best / 1e6,
            "copyfile_mb_s": size / base_best / 1e6, "ratio": base_best / best,
            "runs_ours_s": ours, "runs_copyfile_s": plain}


def latency(base: Path, args) -> dict:
    from pyspark_kafkalog.format.records import Record
    out = {}
    for name, rf, acks in (("rf1", 1, "1"), ("rf2_acks_all", 2, "all"), ("rf2_acks_1", 2, "1")):
        d = base / name
        admin = _admin(d / "root", d / "second", rf)
        stop = threading.Event()
        thread = None
        if rf > 1:
            rep = _replicator(admin, getattr(args, "fetchers", None))
            for _ in range(3):
                rep.tick()

            def loop():
                while not stop.wait(args.fetch_wait_ms / 1000):
                    rep.tick()
            thread = threading.Thread(target=loop, daemon=True)
            thread.start()
        value = os.urandom(1000)
        times = []
        seq0 = admin.cluster.state().seq
        try:
            for i in range(args.units + 10):
                t = time.perf_counter()
                admin.produce("t", [Record(b"k", value)], partition=0, acks=acks)
                if i >= 10:
                    times.append(time.perf_counter() - t)
        finally:
            stop.set()
            if thread is not None:
                thread.join()
        entries = admin.cluster.state().seq - seq0
        times.sort()
        out[name] = {"p50_ms": 1000 * statistics.median(times),
                     "p99_ms": 1000 * times[int(0.99 * (len(times) - 1))],
                     "entries_per_unit": entries / (args.units + 10)}
    return out


def server_side(base: Path, args) -> dict:
    from moto.server import ThreadedMotoServer
    from pyspark_kafkalog.coordinator.copier import copy_segment
    from pyspark_kafkalog.storage import open_storage
    import boto3
    import logging
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
        os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(
            Bucket="bench")
        opts = {"endpoint_url": endpoint, "key": "testing", "secret": "testing"}
        src = open_storage("s3://bench/src", **opts)
        local = base / "s3src"
        admin = _admin(local / "root", local / "second", 1)
        _fill(admin, args.segments, min(args.segment_mb, 4))   # single-part objects (< 8 MiB)
        leader = _leader_path(admin, local / "root", local / "second")
        bases = sorted(int(p.stem) for p in leader.glob("*.log"))
        for p in leader.iterdir():
            if p.suffix in (".log", ".index", ".timeindex"):
                src.replace(f"t-0/{p.name}", p.read_bytes())
        size = sum(src.size(f"t-0/{b:020d}.log") for b in bases)
        state = admin.cluster.state().partition("t", 0)
        ends = {b: e for b, e in zip(bases, bases[1:] + [state.next_offset])}
        server_s, streamed_s = [], []
        for r in range(args.repeat):
            for mode, out in (("server", server_s), ("stream", streamed_s)):
                dst = open_storage(f"s3://bench/dst-{mode}-{r}", **opts)
                copier_src = src if mode == "server" else _NoServerSide(src)
                t = time.perf_counter()
                for b in bases:
                    copy_segment(copier_src, "t-0", dst, "t-0", b, end_offset=ends[b])
                out.append(time.perf_counter() - t)
        return {"bytes": size, "server_side_s": min(server_s), "streamed_s": min(streamed_s),
                "speedup": min(streamed_s) / min(server_s)}
    finally:
        server.stop()


class _NoServerSide:
    """The source as a store on another endpoint would look: no server-side copy."""

    def __init__(self, st):
        self._st = st

    def __getattr__(self, name):
        return getattr(self._st, name)


def run(args) -> dict:
    base = Path(args.dir or tempfile.mkdtemp(prefix="kl-bench-repl-"))
    base.mkdir(parents=True, exist_ok=True)
    try:
        result = {"catch_up": catch_up(base / "catch-up", args),
                  "latency": latency(base / "latency", args)}
        if args.s3:
            result["server_side"] = server_side(base / "s3", args)
        return result
    finally:
        if not args.dir:
            shutil.rmtree(base, ignore_errors=True)


def render(r: dict) -> str:
    c = r["catch_up"]
    lines = [f"catch-up of {c['segments']} segments, {c['bytes'] / 1e6:.0f} MB: "
             f"replicator {c['ours_s']:.3f} s ({c['ours_mb_s']:.0f} MB/s), copyfile+fsync "
             f"{c['copyfile_fsync_s']:.3f} s ({c['copyfile_mb_s']:.0f} MB/s): ratio "
             f"{c['ratio']:.2f} (target >= 0.8; {c['fetchers']} fetchers, "
             f"{', '.join(f'{n} {m}' for m, n in sorted(c['modes'].items()))})"]
    for name, v in r["latency"].items():
        lines.append(f"produce 1 KiB, {name}: p50 {v['p50_ms']:.1f} ms, p99 {v['p99_ms']:.1f} ms, "
                     f"{v['entries_per_unit']:.2f} metadata entries per unit")
    if "server_side" in r:
        s = r["server_side"]
        lines.append(f"S3 -> S3 ({s['bytes'] / 1e6:.0f} MB, moto): server-side "
                     f"{s['server_side_s']:.3f} s, streamed {s['streamed_s']:.3f} s: "
                     f"{s['speedup']:.1f}x")
    return "\n".join(lines)
