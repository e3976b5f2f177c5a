"""``benchmark.py compact``: what cleaning a compacted partition costs (issue #35, "Speed").

A cluster on local disk (``--dir`` or a temp dir) with one compacted partition written through
the Spark-free producer: ``--records`` records over ``--keys`` distinct keys (every key at
least once, the rest drawn uniformly, so each key is overwritten about records/keys - 1 times),
``--key-bytes``-byte keys, values of ``--value-min``..``--value-max`` bytes (1% tombstones),
in segments of ``--segment-mb`` MiB. Then, interleaved and best of ``--repeat``, each on a
fresh copy of that cluster (the copy is not timed; every file is in the page cache):

- **consume**: every record of the partition through ``Admin.consume`` (what ``kafkalog
  consume`` iterates, without printing): the issue's baseline;
- **columnar read**: every segment read and decoded by ``decode_columns`` with CRC checks (what
  the Spark reader does per chunk): a stricter baseline, reported alongside;
- **clean**: ``maintenance.compaction.clean_partition(force=True, delay_ms=0)`` end to end: the
  offset map, the cleaning of every group, writing and publishing the cleaned segments, and
  deleting the covered ones.

MB/s of the clean are the bytes of the segments it cleaned (every segment below the head, each
counted once, however many times the cleaner reads it) over its time; of the reads, the bytes of
the whole partition. The ratio is clean MB/s over consume MB/s (target >= 0.5). The result of
every clean is checked: the latest value of each key, read back.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

MiB = 1 << 20
MB = 1e6
T0 = 1_700_000_000_000


def add_arguments(p) -> None:
    p.add_argument("--records", type=int, default=3_000_000, help="records written")
    p.add_argument("--keys", type=int, default=1_000_000, help="distinct keys")
    p.add_argument("--key-bytes", type=int, default=30)
    p.add_argument("--value-min", type=int, default=20)
    p.add_argument("--value-max", type=int, default=60)
    p.add_argument("--segment-mb", type=int, default=16, help="segment.bytes in MiB")
    p.add_argument("--dedupe-mb", type=int, default=128,
                   help="log.cleaner.dedupe.buffer.size in MiB (the offset map)")
    p.add_argument("--repeat", type=int, default=3, help="interleaved runs, best kept")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--profile", action="store_true", help="cProfile one extra clean")
    p.add_argument("--dir", default=None, help="where to make the clusters (default: temp)")


def make_keys(ids: np.ndarray, key_bytes: int):
    """Keys ``b"key-000...<id>"`` of ``key_bytes`` bytes, as an Arrow binary array."""
    import pyarrow as pa
    digits = key_bytes - 4
    text = np.char.add(b"key-", np.char.zfill(ids.astype(f"S{digits}"), digits))
    flat = np.frombuffer(text.tobytes(), dtype=np.uint8)
    offsets = np.arange(len(ids) + 1, dtype=np.int32) * key_bytes
    return pa.Array.from_buffers(pa.binary(), len(ids), [None, pa.py_buffer(offsets),
                                                         pa.py_buffer(flat)])


def make_values(rng, n: int, vmin: int, vmax: int, tombstones: float = 0.01):
    """Values of vmin..vmax bytes (printable, random), ``tombstones`` of them null."""
    import pyarrow as pa
    sizes = rng.integers(vmin, vmax + 1, n).astype(np.int32)
    null = rng.random(n) < tombstones
    sizes[null] = 0
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(sizes, out=offsets[1:])
    data = rng.integers(97, 123, int(offsets[-1]), dtype=np.uint8)
    valid = np.packbits(~null, bitorder="little")
    return pa.Array.from_buffers(pa.binary(), n, [pa.py_buffer(valid), pa.py_buffer(offsets),
                                                  pa.py_buffer(data)], null_count=int(null.sum()))


def write_keys(admin, topic: str, ids: np.ndarray, rng, key_bytes: int, vmin: int, vmax: int,
               unit: int = 250_000, batch_records: int = 1000, t0: int = T0,
               model=None) -> int:
    """Write ``ids``' keys (in order) to ``topic``-0 through the producer, ``unit`` records per
    commit, encoded a column at a time. ``model(ids, values, first_offset)``: called per unit.
    Returns the bytes of the encoded batches."""
    from pyspark_kafkalog.arrow.arrow_encode import encode_v2_chunks
    from pyspark_kafkalog.client.producer import Producer
    producer = Producer(admin.cluster)
    written = 0
    for a in range(0, len(ids), unit):
        chunk = ids[a:a + unit]
        n = len(chunk)
        keys = make_keys(chunk, key_bytes)
        values = make_values(rng, n, vmin, vmax)
        ts = t0 + a + np.arange(n, dtype=np.int64)
        bounds = list(range(0, n, batch_records)) + [n]
        batches = encode_v2_chunks(keys, values, ts, None, bounds, 0)
        written += sum(len(b.data) for b in batches)
        first, _ = producer.send({(topic, 0): batches})[(topic, 0)]
        if model is not None:
            model(chunk, values, first)
    return written


def _build(base: Path, args) -> dict:
    from pyspark_kafkalog.admin import Admin
    root = base / "template"
    admin = Admin(str(root))
    admin.create_topic("t", 1, configs={"cleanup.policy": "compact",
                                        "segment.bytes": str(args.segment_mb * MiB),
                                        "file.delete.delay.ms": "0"})
    rng = np.random.default_rng(args.seed)
    ids = np.concatenate([rng.permutation(args.keys),
                          rng.integers(0, args.keys, max(0, args.records - args.keys))])
    rng.shuffle(ids[args.keys // 2:])   # the first half of the keys first, the rest mixed in
    t = time.perf_counter()
    written = write_keys(admin, "t", ids, rng, args.key_bytes, args.value_min, args.value_max)
    return {"root": root, "written": written, "write_s": time.perf_counter() - t, "ids": ids}


def _segments(root: Path):
    (d,) = list(root.glob("logdir-*/t-0"))
    return sorted((int(n[:-4]), os.path.getsize(d / n)) for n in os.listdir(d)
                  if n.endswith(".log"))


def _consume(root: Path) -> tuple:
    from pyspark_kafkalog.admin import Admin
    admin = Admin(str(root))
    t = time.perf_counter()
    n = 0
    for _ in admin.consume("t", 0):
        n += 1
    return time.perf_counter() - t, n


def _columnar(root: Path) -> tuple:
    from pyspark_kafkalog.format.columnar import decode_columns
    (d,) = list(root.glob("logdir-*/t-0"))
    t = time.perf_counter()
    n = 0
    for base, _ in _segments(root):
        with open(d / f"{base:020d}.log", "rb") as fh:
            data = fh.read()
        n += len(decode_columns(data, validate=True).offset)
    return time.perf_counter() - t, n


def _clean(root: Path, args, profile=None) -> tuple:
    from pyspark_kafkalog.admin import Admin
    from pyspark_kafkalog.maintenance.compaction import CleanerSettings, clean_partition
    admin = Admin(str(root))
    state = admin.cluster.state()
    settings = CleanerSettings(dedupe_buffer_size=args.dedupe_mb * MiB)
    t = time.perf_counter()
    if profile is not None:
        profile.enable()
    out = clean_partition(admin.cluster, state, "t", 0, force=True, delay_ms=0,
                          settings=settings)
    if profile is not None:
        profile.disable()
    return time.perf_counter() - t, out


def _check(root: Path, ids: np.ndarray, cleaned_to: int) -> bool:
    """Below ``cleaned_to`` exactly the latest record of each key there (tombstones inside
    ``delete.retention.ms`` stay); from it on, every record."""
    from pyspark_kafkalog.admin import Admin
    admin = Admin(str(root))
    below = ids[:cleaned_to]
    _, last_rev = np.unique(below[::-1], return_index=True)
    want = np.sort(cleaned_to - 1 - last_rev)
    got = []
    above = 0
    for r in admin.consume("t", 0):
        if r.offset < cleaned_to:
            got.append(r.offset)
        else:
            above += 1
    return (np.array_equal(np.array(got, dtype=np.int64), want)
            and above == len(ids) - cleaned_to)


def run(args) -> dict:
    import cProfile
    import pstats
    import io
    base = Path(args.dir or tempfile.mkdtemp(prefix="kl-bench-compact-"))
    base.mkdir(parents=True, exist_ok=True)
    try:
        built = _build(base, args)
        segs = _segments(built["root"])
        total = sum(s for _, s in segs)
        times = {"consume": [], "columnar": [], "clean": []}
        cleaned_bytes = None
        ok = True
        out = None
        for i in range(args.repeat):
            copy = base / f"run{i}"
            shutil.copytree(built["root"], copy)
            dt, n = _consume(copy)
            times["consume"].append(dt)
            dt, _ = _columnar(copy)
            times["columnar"].append(dt)
            dt, out = _clean(copy, args)
            times["clean"].append(dt)
            cleaned_bytes = sum(s for b, s in segs if b < out.cleaned_to)
            if i == 0:
                ok = _check(copy, built["ids"], out.cleaned_to)
            shutil.rmtree(copy)
        result = {
            "records": args.records, "keys": args.keys, "segments": len(segs),
            "partition_bytes": total, "write_s": built["write_s"],
            "cleaned_bytes": cleaned_bytes, "cleaned_to": out.cleaned_to,
            "bytes_written": out.bytes_written, "records_kept": out.records_kept,
            "consume_s": min(times["consume"]), "columnar_s": min(times["columnar"]),
            "clean_s": min(times["clean"]), "times": times, "correct": ok,
            "loadavg": os.getloadavg(),
        }
        result["consume_mb_s"] = total / MB / result["consume_s"]
        result["columnar_mb_s"] = total / MB / result["columnar_s"]
        result["clean_mb_s"] = cleaned_bytes / MB / result["clean_s"]
        result["ratio"] = result["clean_mb_s"] / result["consume_mb_s"]
        result["ratio_columnar"] = result["clean_mb_s"] / result["columnar_mb_s"]
        if args.profile:
            copy = base / "profile"
            shutil.copytree(built["root"], copy)
            prof = cProfile.Profile()
            _clean(copy, args, prof)
            s = io.StringIO()
            pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(20)
            result["profile"] = s.getvalue()
        return result
    finally:
        if not args.dir:
            shutil.rmtree(base, ignore_errors=True)


def render(r: dict) -> str:
    lines = [f"compacted partition: {r['records']:,} records, {r['keys']:,} keys, "
             f"{r['segments']} segments, {r['partition_bytes'] / MB:.0f} MB "
             f"(written in {r['write_s']:.1f} s)",
             f"consume        {r['consume_s']:.3f} s  {r['consume_mb_s']:.0f} MB/s "
             f"(every record of the partition, Admin.consume)",
             f"columnar read  {r['columnar_s']:.3f} s  {r['columnar_mb_s']:.0f} MB/s "
             f"(decode_columns of every segment, CRC checked)",
             f"clean          {r['clean_s']:.3f} s  {r['clean_mb_s']:.0f} MB/s "
             f"({r['cleaned_bytes'] / MB:.0f} MB below the head cleaned to "
             f"{r['bytes_written'] / MB:.0f} MB, {r['records_kept']:,} records kept)",
             f"ratio clean/consume {r['ratio']:.2f} (target >= 0.5); clean/columnar read "
             f"{r['ratio_columnar']:.2f}; result {'correct' if r['correct'] else 'WRONG'}; "
             f"best of {len(r['times']['clean'])}, load {r['loadavg'][0]:.1f}"]
    if "profile" in r:
        lines.append(r["profile"])
    return "\n".join(lines)
