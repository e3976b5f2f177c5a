#!/usr/bin/env python3
"""On-demand performance benchmarks for pyspark-kafkalog.

Performance is measured with this script, never by timed tests. Each section is a subcommand::

    python jobs/benchmark.py format [--records N] [--value-bytes N] [--key-bytes N]
                                    [--batch-records N] [--repeat N] [--seed N] [--cases A,B]
                                    [--no-crc] [--gc-off] [--profile] [--json OUT]

``format`` compares, in one run and on the same bytes, our codec-level encoders/decoders
(``format.encode`` / ``format.columnar``) with kafka-python's ``kafka.record`` reader and builders,
plus "decompress only" times so one can tell when the codec is the bottleneck. Later sections
(``spark-read``, ``spark-write``: the Spark data source against a no-op source and Parquet) are
added by registering another section with :func:`section`.

Units: MB = 10**6 bytes. "payload" = uncompressed key + value bytes of the records (headers and
framing excluded); "encoded" = bytes of the log as stored. Ratios are throughputs ours / kafka-python
(> 1 means ours is faster). Every figure is the best of ``--repeat`` runs timed with
``time.perf_counter``; the runs of all contenders of one case are interleaved so a change of
machine load hits them alike. The Spark sections report the median as well as the best: on a
shared machine one Spark run can take twice as long as the next.
"""
from __future__ import annotations

import argparse
import contextlib
import cProfile
import gc
import io
import json
import math
import os
import platform
import pstats
import random
import struct
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

try:
    import pyspark_kafkalog  # noqa: F401
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pyspark_kafkalog.format import codecs  # noqa: E402
from pyspark_kafkalog.format.batch import (V2_HEADER_SIZE, iter_headers,  # noqa: E402
                                           validate as validate_batch)
from pyspark_kafkalog.format import accel  # noqa: E402
from pyspark_kafkalog.format.columnar import decode_columns, to_arrow  # noqa: E402
from pyspark_kafkalog.format.encode import encode_batch_v2, encode_message_set  # noqa: E402
from pyspark_kafkalog.format.records import Record  # noqa: E402

try:
    import kafka
    import kafka.codec as kafka_codec
    from kafka.record import MemoryRecords, MemoryRecordsBuilder
except ImportError:  # the comparison is optional: our side still runs
    kafka = kafka_codec = MemoryRecords = MemoryRecordsBuilder = None

MB = 1e6

# -- section registry -----------------------------------------------------------------------------

#: name -> (help, add_arguments(parser), run(args) -> (result dict, exit code))
SECTIONS: Dict[str, tuple] = {}


def section(name: str, help: str, add_arguments: Callable[[argparse.ArgumentParser], None]):
    """Register ``run(args) -> (result, exit_code)`` as the subcommand ``name``."""
    def register(run):
        SECTIONS[name] = (help, add_arguments, run)
        return run
    return register


def environment() -> dict:
    versions = {"python": platform.python_version()}
    for mod in ("kafka", "lz4", "zstandard", "cramjam", "crc32c", "xxhash"):
        try:
            versions[mod] = getattr(__import__(mod), "__version__", "?")
        except ImportError:
            versions[mod] = None
    try:
        load = os.getloadavg()
    except OSError:
        load = None
    return {"platform": platform.platform(), "machine": platform.machine(),
            "cpus": os.cpu_count(), "loadavg_at_start": load, "versions": versions,
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


# -- workload -------------------------------------------------------------------------------------

_EVENT_TYPES = ["page_view", "click", "add_to_cart", "purchase", "login", "logout", "search",
                "video_play", "heartbeat", "error"]
_COUNTRIES = ["US", "DE", "FR", "GB", "IN", "BR", "JP", "NL", "SE", "ES", "IT", "CA"]
_WORDS = ("the quick brown fox jumps over lazy dog order item price total session device mobile "
          "desktop android ios checkout cart user account premium basic status ok failed retry "
          "timeout region shipping standard express warehouse").split()


def make_workload(n: int, key_bytes: int, value_bytes: int, seed: int) -> List[Record]:
    """A deterministic, realistic mix of records (same seed, same records).

    * keys: 90% present (``key_bytes`` long, drawn from a skewed pool of 10k ids, so keys repeat),
      10% null (round-robin producers);
    * values: JSON-like events truncated/padded to a length uniform in [v/2, 3v/2] (97%),
      large ones of 8v (1%) and tombstones (2%, keyed records only); the text mixes repeated
      field names and words with random ids and digits, so it compresses about as well as real
      event streams;
    * timestamps: increasing by 0-3 ms, with an occasional jump of seconds;
    * headers: 30% of records carry a ``trace-id`` (16 bytes), 5% also a ``content-type``.
    """
    rng = random.Random(seed)
    rand, randint, choice = rng.random, rng.randint, rng.choice
    records = []
    ts = 1_700_000_000_000
    for i in range(n):
        r = rand()
        ts += randint(0, 3) if r > 0.001 else randint(1_000, 30_000)
        if rand() < 0.10:
            key = None
        else:
            kid = int(10_000 * rand() ** 2)  # skewed: low ids are hot
            key = (b"user-%012d" % kid).ljust(key_bytes, b"#")[-key_bytes:] if key_bytes else b""
        r = rand()
        if key is not None and r < 0.02:
            value = None
        else:
            size = 8 * value_bytes if r > 0.99 else randint(value_bytes // 2,
                                                            value_bytes + value_bytes // 2)
            value = _event_value(rng, i, ts, size)
        r = rand()
        if r < 0.30:
            headers = (("trace-id", b"%016x" % rng.getrandbits(64)),)
            if r < 0.05:
                headers += (("content-type", b"application/json"),)
        else:
            headers = ()
        records.append(Record(key, value, ts, headers))
    return records


def _event_value(rng: random.Random, i: int, ts: int, size: int) -> bytes:
    parts = [b'{"id":"%016x","seq":%d,"type":"%s","ts":%d,"user":"u%06d","country":"%s",'
             b'"amount":%d.%02d,"msg":"' % (
                 rng.getrandbits(64), i, _EVENT_TYPES[rng.randrange(10)].encode(), ts,
                 rng.randrange(1_000_000), _COUNTRIES[rng.randrange(12)].encode(),
                 rng.randrange(10_000), rng.randrange(100))]
    length = len(parts[0])
    while length < size:
        w = _WORDS[rng.randrange(len(_WORDS))].encode() + b" "
        if rng.random() < 0.2:
            w = b"%x " % rng.getrandbits(32)
        parts.append(w)
        length += len(w)
    return b"".join(parts)[:size]


def chunked(records: Sequence[Record], size: int) -> List[Sequence[Record]]:
    return [records[i:i + size] for i in range(0, len(records), size)]


def payload_bytes(records: Sequence[Record]) -> int:
    return sum(len(r.key or b"") + len(r.value or b"") for r in records)


# -- contenders -----------------------------------------------------------------------------------

CASES = [  # name, magic, codec
    ("v2-none", 2, codecs.NONE), ("v2-gzip", 2, codecs.GZIP), ("v2-snappy", 2, codecs.SNAPPY),
    ("v2-lz4", 2, codecs.LZ4), ("v2-zstd", 2, codecs.ZSTD),
    ("v1-none", 1, codecs.NONE), ("v1-gzip", 1, codecs.GZIP),
]


def ours_encode(chunks, magic: int, codec: int) -> bytes:
    out, offset = [], 0
    for chunk in chunks:
        if magic == 2:
            batch = encode_batch_v2(chunk, base_offset=offset, compression=codec)
        else:
            batch = encode_message_set(chunk, magic=magic, base_offset=offset, compression=codec)
        out.append(batch.data)
        offset += len(chunk)
    return b"".join(out)


def ours_decode(buf: bytes, crc: bool):
    return decode_columns(buf, validate=crc)


def ours_decode_arrow(buf: bytes, crc: bool):
    """Decode plus the ``pyarrow.Table`` a Spark Arrow source would hand over."""
    return to_arrow(decode_columns(buf, validate=crc))


def implementation() -> str:
    """Which twins run (the C extensions or the pure-Python/numpy ones): ``format.accel``'s
    choice, recorded with the results."""
    return accel.describe()


def kp_encode(chunks, magic: int, codec: int) -> bytes:
    """kafka-python's producer path: one MemoryRecordsBuilder per batch (offsets from 0, as a
    producer writes them)."""
    out = []
    for chunk in chunks:
        builder = MemoryRecordsBuilder(magic, codec, batch_size=1 << 30)
        append = builder.append
        for rec in chunk:
            append(rec.timestamp, rec.key, rec.value, rec.headers)
        builder.close()
        out.append(bytes(builder.buffer()))
    return b"".join(out)


def kp_decode(buf: bytes, crc: bool) -> int:
    """kafka-python's consumer path: every record materialized, every field touched."""
    n = 0
    for batch in MemoryRecords(buf):
        if crc and not batch.validate_crc():
            raise ValueError("kafka-python: CRC mismatch")
        for rec in batch:
            rec.offset, rec.timestamp, rec.key, rec.value, rec.headers  # noqa: B018
            n += 1
    return n


def compressed_payloads(buf: bytes, magic: int) -> List[memoryview]:
    """The compressed payload of every batch/wrapper in ``buf`` (untimed preparation)."""
    mv = memoryview(buf)
    out = []
    for h in iter_headers(buf):
        if magic == 2:
            out.append(mv[h.position + V2_HEADER_SIZE:h.end])
        else:  # magic 0/1 wrapper: ... [timestamp] key(len+bytes) value(len+bytes)
            p = h.position + (26 if h.magic == 1 else 18)
            klen = struct.unpack_from(">i", buf, p)[0]
            p += 4 + max(klen, 0)
            vlen = struct.unpack_from(">i", buf, p)[0]
            out.append(mv[p + 4:p + 4 + vlen])
    return out


def ours_decompress(payloads, magic: int, codec: int) -> int:
    decompress = codecs.decompress
    return sum(len(decompress(codec, p, magic)) for p in payloads)


def kp_decompress(payloads, magic: int, codec: int) -> int:
    """The codec calls kafka-python makes for the same payloads (including its copies)."""
    kc = kafka_codec
    total = 0
    for p in payloads:
        if codec == codecs.GZIP:
            out = kc.gzip_decode(p)
        elif codec == codecs.SNAPPY:
            out = kc.snappy_decode(p.tobytes())
        elif codec == codecs.LZ4:
            out = (kc.lz4_decode_old_kafka if magic == 0 else kc.lz4_decode)(p.tobytes())
        elif codec == codecs.ZSTD:
            out = kc.zstd_decode(p.tobytes())
        else:
            out = bytes(p)
        total += len(out)
    return total


@contextlib.contextmanager
def kafka_snappy_shim(enabled: bool):
    """kafka.codec needs python-snappy for snappy; since 0.7 that package is a thin layer that
    returns ``bytes(cramjam.snappy.compress_raw/decompress_raw(data))``. When it is missing, put
    the same layer in place for the duration of the run (restored afterwards)."""
    if not enabled or kafka_codec is None or kafka_codec.snappy is not None:
        yield False
        return
    import types
    import cramjam
    kafka_codec.snappy = types.SimpleNamespace(
        compress=lambda data: bytes(cramjam.snappy.compress_raw(data)),
        decompress=lambda data: bytes(cramjam.snappy.decompress_raw(data)))
    try:
        yield True
    finally:
        kafka_codec.snappy = None


def kp_supports(codec: int) -> bool:
    if MemoryRecords is None:
        return False
    return {codecs.NONE: True, codecs.GZIP: kafka_codec.has_gzip(),
            codecs.SNAPPY: kafka_codec.has_snappy(), codecs.LZ4: kafka_codec.has_lz4(),
            codecs.ZSTD: kafka_codec.has_zstd()}[codec]


# -- correctness cross-checks (untimed) -----------------------------------------------------------

def _expected(records, magic):
    return [(r.key, r.value, r.timestamp, tuple(r.headers) if magic == 2 else ())
            for r in records]


def _rows_from_columns(cols):
    rows, h = [], 0
    hk, hv, keys, values = cols.header_key, cols.header_value, cols.key, cols.value
    for i in range(len(cols)):
        nh = cols.header_count[i]
        rows.append((keys[i], values[i], cols.timestamp[i],
                     tuple(zip(hk[h:h + nh], hv[h:h + nh]))))
        h += nh
    return rows


def _kp_rows(buf):
    rows, offsets = [], []
    for batch in MemoryRecords(buf):
        for rec in batch:
            rows.append((rec.key, rec.value, rec.timestamp,
                         tuple((k, v) for k, v in rec.headers)))
            offsets.append(rec.offset)
    return rows, offsets


def _diff(name, got, want) -> Optional[str]:
    if len(got) != len(want):
        return f"{name}: {len(got)} records, expected {len(want)}"
    for i, (g, w) in enumerate(zip(got, want)):
        if g != w:
            return f"{name}: record {i} differs: got {g!r:.200}, expected {w!r:.200}"
    return None


def cross_check(records, magic, ours_buf, kp_buf) -> List[str]:
    """Both readers agree on our bytes, and our reader reads kafka-python's bytes."""
    want = _expected(records, magic)
    problems = []
    cols = decode_columns(ours_buf)
    problems.append(_diff("ours(our bytes)", _rows_from_columns(cols), want))
    if list(cols.offset) != list(range(len(records))):
        problems.append("ours(our bytes): offsets are not 0..n-1")
    if kp_buf is not None:
        rows, offsets = _kp_rows(ours_buf)
        problems.append(_diff("kafka-python(our bytes)", rows, want))
        if offsets != list(range(len(records))):
            problems.append("kafka-python(our bytes): offsets are not 0..n-1")
        problems.append(_diff("ours(kafka-python bytes)",
                              _rows_from_columns(decode_columns(kp_buf)), want))
    return [p for p in problems if p]


# -- timing ---------------------------------------------------------------------------------------

def interleaved_best(contenders: Dict[str, Callable[[], object]], repeat: int,
                     gc_off: bool) -> Dict[str, List[float]]:
    """Run every contender ``repeat`` times, round-robin; return all wall times per contender."""
    times: Dict[str, List[float]] = {name: [] for name in contenders}
    for _ in range(repeat):
        for name, fn in contenders.items():
            gc.collect()
            if gc_off:
                gc.disable()
            try:
                t0 = time.perf_counter()
                result = fn()
                elapsed = time.perf_counter() - t0
            finally:
                gc.enable()
            del result
            times[name].append(elapsed)
    return times


def _rate(amount: float, seconds: Optional[float]) -> Optional[float]:
    return amount / seconds if seconds else None


# -- the format section ---------------------------------------------------------------------------

def _format_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--records", type=int, default=200_000, help="records (default 200000)")
    p.add_argument("--value-bytes", type=int, default=100, help="mean value size (default 100)")
    p.add_argument("--key-bytes", type=int, default=16, help="key size (default 16)")
    p.add_argument("--batch-records", type=int, default=500,
                   help="records per batch / compressed wrapper (default 500)")
    p.add_argument("--repeat", type=int, default=3, help="runs per measurement, best kept (3)")
    p.add_argument("--seed", type=int, default=20240601, help="workload seed")
    p.add_argument("--cases", default=",".join(c[0] for c in CASES),
                   help="comma-separated subset of: " + ", ".join(c[0] for c in CASES))
    p.add_argument("--no-crc", action="store_true",
                   help="skip CRC checks on both sides (default: both verify, as Kafka's "
                        "consumer does with check.crcs=true)")
    p.add_argument("--gc-off", action="store_true", help="disable the GC while timing")
    p.add_argument("--no-snappy-shim", action="store_true",
                   help="do not stand in for python-snappy when kafka-python lacks it")
    p.add_argument("--profile", action="store_true",
                   help="also cProfile our decode and break its time down (see --profile-cases)")
    p.add_argument("--profile-cases", default="v2-none,v2-lz4")
    p.add_argument("--profile-top", type=int, default=15)


def _check_format_args(args) -> List[tuple]:
    names = {c[0]: c for c in CASES}
    wanted = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = [c for c in wanted if c not in names]
    if unknown:
        raise SystemExit(f"unknown case(s) {unknown}; known: {list(names)}")
    for opt in ("records", "batch_records", "repeat"):
        if getattr(args, opt) < 1:
            raise SystemExit(f"--{opt.replace('_', '-')} must be >= 1")
    if args.value_bytes < 0 or args.key_bytes < 0:
        raise SystemExit("sizes must be >= 0")
    return [names[c] for c in wanted]


@section("format", "record format encode/decode: ours vs kafka-python, per codec", _format_args)
def run_format(args) -> tuple:
    cases = _check_format_args(args)
    crc = not args.no_crc
    t0 = time.perf_counter()
    records = make_workload(args.records, args.key_bytes, args.value_bytes, args.seed)
    workloads = {2: records, 1: [Record(r.key, r.value, r.timestamp) for r in records]}
    chunks = {m: chunked(w, args.batch_records) for m, w in workloads.items()}
    n = len(records)
    payload = payload_bytes(records)
    result = {
        "section": "format", "env": environment(),
        "params": {"records": n, "value_bytes": args.value_bytes, "key_bytes": args.key_bytes,
                   "batch_records": args.batch_records, "batches": len(chunks[2]),
                   "repeat": args.repeat, "seed": args.seed, "crc_checked": crc,
                   "gc_off": args.gc_off, "payload_bytes": payload,
                   "header_count": sum(len(r.headers) for r in records),
                   "null_keys": sum(r.key is None for r in records),
                   "null_values": sum(r.value is None for r in records),
                   "implementation": implementation()},
        "decode": [], "encode": [], "checks": {}, "profile": {},
    }
    print(f"workload: {n:,} records in {len(chunks[2]):,} batches of {args.batch_records}, "
          f"payload {payload / MB:.2f} MB (key+value), built in {time.perf_counter() - t0:.1f}s; "
          f"loadavg {result['env']['loadavg_at_start']}", flush=True)
    print(f"record loop: {result['params']['implementation']}", flush=True)
    ours_decode_arrow(b"", crc)   # imports pyarrow and numpy outside the timed runs

    exit_code = 0
    with kafka_snappy_shim(not args.no_snappy_shim) as shimmed:
        result["params"]["kafka_python_snappy_shim"] = shimmed
        buffers = {}
        for name, magic, codec in cases:
            print(f"  measuring {name} ...", flush=True)
            dec, enc, problems, buf = _measure_case(name, magic, codec, chunks[magic],
                                                    workloads[magic], payload, crc, args)
            buffers[name] = (buf, magic, codec)
            result["decode"].append(dec)
            result["encode"].append(enc)
            result["checks"][name] = problems or "ok"
            if problems:
                exit_code = 1
        if args.profile:
            wanted = [c.strip() for c in args.profile_cases.split(",") if c.strip()]
            for name in wanted:
                if name not in buffers:
                    print(f"(profile: case {name} was not measured; skipped)")
                    continue
                result["profile"][name] = profile_decode(name, *buffers[name], crc=crc,
                                                         repeat=args.repeat, top=args.profile_top)
    print()
    print(render_format(result))
    if args.profile:
        for name, prof in result["profile"].items():
            print(render_profile(name, prof))
    return result, exit_code


def _measure_case(name, magic, codec, chunks, records, payload, crc, args):
    n = len(records)
    ours_buf = ours_encode(chunks, magic, codec)
    have_kp = kp_supports(codec)
    kp_buf = kp_encode(chunks, magic, codec) if have_kp else None
    problems = cross_check(records, magic, ours_buf, kp_buf)
    for p in problems:
        print(f"  !! {name}: {p}", flush=True)

    payloads = compressed_payloads(ours_buf, magic) if (codec or magic == 2) else None
    decode_fns = {"ours": lambda: ours_decode(ours_buf, crc),
                  "ours+arrow": lambda: ours_decode_arrow(ours_buf, crc)}
    if have_kp:
        decode_fns["kafka-python"] = lambda: kp_decode(ours_buf, crc)
    if payloads is not None:
        decode_fns["ours-decompress"] = lambda: ours_decompress(payloads, magic, codec)
        if have_kp:
            decode_fns["kafka-python-decompress"] = lambda: kp_decompress(payloads, magic, codec)
    dtimes = interleaved_best(decode_fns, args.repeat, args.gc_off)

    encode_fns = {"ours": lambda: ours_encode(chunks, magic, codec)}
    if have_kp:
        encode_fns["kafka-python"] = lambda: kp_encode(chunks, magic, codec)
    etimes = interleaved_best(encode_fns, args.repeat, args.gc_off)

    def best(times, key):
        return min(times[key]) if key in times else None

    enc_size = len(ours_buf)
    d_ours, d_kp = best(dtimes, "ours"), best(dtimes, "kafka-python")
    d_arrow = best(dtimes, "ours+arrow")
    d_dec, d_kpdec = best(dtimes, "ours-decompress"), best(dtimes, "kafka-python-decompress")
    dec = {
        "case": name, "magic": magic, "codec": codecs.CODEC_NAMES[codec], "records": n,
        "payload_bytes": payload, "encoded_bytes": enc_size,
        "compressed_payload_bytes": sum(len(p) for p in payloads) if payloads else None,
        "ours_s": d_ours, "ours_records_per_s": _rate(n, d_ours),
        "ours_payload_MB_per_s": _rate(payload / MB, d_ours),
        "ours_encoded_MB_per_s": _rate(enc_size / MB, d_ours),
        "ours_arrow_s": d_arrow, "ours_arrow_records_per_s": _rate(n, d_arrow),
        "kp_s": d_kp, "kp_records_per_s": _rate(n, d_kp),
        "kp_payload_MB_per_s": _rate(payload / MB, d_kp),
        "kp_encoded_MB_per_s": _rate(enc_size / MB, d_kp),
        "ratio_ours_over_kp": (d_kp / d_ours) if d_kp else None,
        "ours_decompress_s": d_dec,
        "ours_decompress_share": (d_dec / d_ours) if d_dec is not None else None,
        "kp_decompress_s": d_kpdec,
        "kp_decompress_share": (d_kpdec / d_kp) if d_kpdec is not None and d_kp else None,
        "times_s": dtimes,
    }
    e_ours, e_kp = best(etimes, "ours"), best(etimes, "kafka-python")
    enc = {
        "case": name, "magic": magic, "codec": codecs.CODEC_NAMES[codec], "records": n,
        "payload_bytes": payload,
        "ours_encoded_bytes": enc_size, "kp_encoded_bytes": len(kp_buf) if kp_buf else None,
        "ours_s": e_ours, "ours_records_per_s": _rate(n, e_ours),
        "ours_payload_MB_per_s": _rate(payload / MB, e_ours),
        "ours_encoded_MB_per_s": _rate(enc_size / MB, e_ours),
        "kp_s": e_kp, "kp_records_per_s": _rate(n, e_kp),
        "kp_payload_MB_per_s": _rate(payload / MB, e_kp),
        "kp_encoded_MB_per_s": _rate(len(kp_buf) / MB, e_kp) if kp_buf else None,
        "ratio_ours_over_kp": (e_kp / e_ours) if e_kp else None,
        "times_s": etimes,
    }
    return dec, enc, problems, ours_buf


# -- profiling ------------------------------------------------------------------------------------

def profile_decode(name, buf, magic, codec, *, crc, repeat, top) -> dict:
    """cProfile one decode of ``buf``, plus an unprofiled breakdown into its stages.

    cProfile adds a fixed cost to every call it sees, including the C ``append`` calls of the
    record loop, so its shares overstate the loop; the unprofiled breakdown times each stage on
    its own (headers walk, CRC, decompression) and attributes the rest to the record loop.
    """
    prof = cProfile.Profile()
    prof.enable()
    decode_columns(buf, validate=crc)
    prof.disable()
    stats = pstats.Stats(prof)
    total_tt = stats.total_tt
    rows = []
    for (filename, line, func), (cc, nc, tt, ct, _callers) in stats.stats.items():
        rows.append({"function": _func_label(filename, line, func), "ncalls": nc,
                     "tottime_s": tt, "cumtime_s": ct, "tottime_share": tt / total_tt})
    rows.sort(key=lambda r: r["tottime_s"], reverse=True)

    def cum_share(file_part, func):
        return sum(r["cumtime_s"] for r in rows
                   if file_part in r["function"] and r["function"].endswith(f"({func})")) / total_tt

    profiled = {"total_s": total_tt,
                "decompress_cum_share": cum_share("format/codecs.py", "decompress"),
                # the C loop shows as a builtin, the Python one as _columnar_py.py(scan_v2)
                "scan_v2_cum_share": sum(r["cumtime_s"] for r in rows
                                         if "scan_v2" in r["function"]) / total_tt,
                "validate_cum_share": cum_share("format/batch.py", "validate"),
                "iter_headers_cum_share": cum_share("format/batch.py", "iter_headers")}

    headers = list(iter_headers(buf))
    payloads = compressed_payloads(buf, magic) if (codec or magic == 2) else []
    stage_fns = {
        "total": lambda: decode_columns(buf, validate=crc),
        "headers": lambda: list(iter_headers(buf)),
        "crc": lambda: [validate_batch(buf, h) for h in headers],
        "decompress": lambda: ours_decompress(payloads, magic, codec),
    }
    times = {k: min(v) for k, v in interleaved_best(stage_fns, repeat, False).items()}
    if not crc:
        times["crc"] = 0.0
    if not payloads:
        times["decompress"] = 0.0
    loop = times["total"] - times["headers"] - times["crc"] - times["decompress"]
    breakdown = {k: {"s": v, "share": v / times["total"]} for k, v in times.items() if k != "total"}
    breakdown["record loop + batch bookkeeping (rest)"] = {"s": loop, "share": loop / times["total"]}
    return {"case": name, "top": rows[:top], "profiled": profiled,
            "unprofiled_total_s": times["total"], "breakdown": breakdown}


def _func_label(filename: str, line: int, func: str) -> str:
    if filename == "~":
        return func  # a builtin, e.g. "<method 'append' of 'list' objects>"
    parts = Path(filename).parts
    short = "/".join(parts[-2:]) if "pyspark_kafkalog" in parts else "/".join(parts[-3:])
    return f"{short}:{line}({func})"


# -- rendering ------------------------------------------------------------------------------------

def _fmt(v, spec):
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "n/a"
    return format(v, spec)


def _table(headers: List[str], rows: List[List[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    line = "  ".join(h.rjust(w) if i else h.ljust(w) for i, (h, w) in enumerate(zip(headers, widths)))
    out = [line, "-" * len(line)]
    for r in rows:
        out.append("  ".join(c.rjust(w) if i else c.ljust(w)
                             for i, (c, w) in enumerate(zip(r, widths))))
    return "\n".join(out)


def render_format(res: dict) -> str:
    p, env = res["params"], res["env"]
    v = env["versions"]
    out = [
        "=" * 100,
        f"FORMAT benchmark: {p['records']:,} records, {p['batches']:,} batches of "
        f"{p['batch_records']}, key {p['key_bytes']} B, value ~{p['value_bytes']} B "
        f"(payload {p['payload_bytes'] / MB:.2f} MB key+value; {p['null_keys']:,} null keys, "
        f"{p['null_values']:,} tombstones, {p['header_count']:,} headers in v2)",
        f"best of {p['repeat']}, CRC {'checked on both sides' if p['crc_checked'] else 'NOT checked'}"
        f", GC {'off' if p['gc_off'] else 'on'}; MB = 1e6 B; ratio = ours/kafka-python throughput "
        "(>1: ours faster)",
        f"python {v['python']}, kafka-python {v['kafka']}, lz4 {v['lz4']}, zstandard "
        f"{v['zstandard']}, cramjam {v['cramjam']}, crc32c {v['crc32c']}; {env['cpus']} CPUs, "
        f"loadavg at start {env['loadavg_at_start']}",
        f"our magic 2 record loop: {p.get('implementation', '?')}",
    ]
    if p.get("kafka_python_snappy_shim"):
        out.append("kafka-python snappy: python-snappy is not installed; used the equivalent "
                   "cramjam raw-snappy layer python-snappy>=0.7 provides")
    out += ["", "DECODE (the same bytes, written by our encoder; kafka-python = MemoryRecords, "
                "every record's offset/timestamp/key/value/headers touched)"]
    rows = []
    for d in res["decode"]:
        rows.append([d["case"], _fmt(d["encoded_bytes"] / MB, ".2f"),
                     _fmt(d["ours_s"], ".3f"), _fmt(d["ours_records_per_s"], ",.0f"),
                     _fmt(d["ours_payload_MB_per_s"], ".1f"),
                     _fmt(d["ours_encoded_MB_per_s"], ".1f"),
                     _fmt(d.get("ours_arrow_s"), ".3f"),
                     _fmt(d.get("ours_arrow_records_per_s"), ",.0f"),
                     _fmt(d["kp_s"], ".3f"), _fmt(d["kp_records_per_s"], ",.0f"),
                     _fmt(d["kp_payload_MB_per_s"], ".1f"),
                     _fmt(d["kp_encoded_MB_per_s"], ".1f"),
                     _fmt(d["ratio_ours_over_kp"], ".2f") + ("x" if d["kp_s"] else ""),
                     _fmt(d["ours_decompress_s"], ".3f"),
                     _fmt(d["ours_decompress_share"] and 100 * d["ours_decompress_share"], ".0f")
                     + ("%" if d["ours_decompress_share"] is not None else ""),
                     _fmt(d["kp_decompress_s"], ".3f")])
    out.append(_table(["case", "enc MB", "ours s", "ours rec/s", "ours MB/s", "ours encMB/s",
                       "+arrow s", "+arrow rec/s",
                       "kp s", "kp rec/s", "kp MB/s", "kp encMB/s", "ratio",
                       "decomp s", "decomp %", "kp decomp s"], rows))
    out.append("  +arrow = our decode followed by to_arrow (the pyarrow.Table a Spark Arrow source "
               "hands over), timed as one")
    out.append("  decomp s = our codecs.decompress alone over the same batch payloads (v2-none: "
               "the payload copy); decomp % = its share of our decode; kp decomp s = kafka.codec "
               "calls kafka-python makes for them")
    out += ["", "ENCODE (the same Record lists; kafka-python = MemoryRecordsBuilder per batch; "
                "encMB/s over each side's own output)"]
    rows = []
    for e in res["encode"]:
        rows.append([e["case"], _fmt(e["ours_encoded_bytes"] / MB, ".2f"),
                     _fmt(e["kp_encoded_bytes"] and e["kp_encoded_bytes"] / MB, ".2f"),
                     _fmt(e["ours_s"], ".3f"), _fmt(e["ours_records_per_s"], ",.0f"),
                     _fmt(e["ours_payload_MB_per_s"], ".1f"),
                     _fmt(e["ours_encoded_MB_per_s"], ".1f"),
                     _fmt(e["kp_s"], ".3f"), _fmt(e["kp_records_per_s"], ",.0f"),
                     _fmt(e["kp_payload_MB_per_s"], ".1f"),
                     _fmt(e["kp_encoded_MB_per_s"], ".1f"),
                     _fmt(e["ratio_ours_over_kp"], ".2f") + ("x" if e["kp_s"] else "")])
    out.append(_table(["case", "ours MB", "kp MB", "ours s", "ours rec/s", "ours MB/s",
                       "ours encMB/s", "kp s", "kp rec/s", "kp MB/s", "kp encMB/s", "ratio"], rows))
    out.append("  codec settings differ where the libraries differ: kafka-python gzips at level 9 "
               "(Kafka and ours: zlib default 6), its lz4 is lz4.frame (ours: Kafka's 64 KiB "
               "block framing)")
    bad = {k: v for k, v in res["checks"].items() if v != "ok"}
    out += ["", "cross-checks (both readers agree on our bytes; ours reads kafka-python's): "
            + ("all ok" if not bad else f"FAILED: {bad}")]
    return "\n".join(out)


def render_profile(name: str, prof: dict) -> str:
    out = ["", f"PROFILE our decode, {name}: unprofiled total {prof['unprofiled_total_s']:.3f}s; "
               f"under cProfile {prof['profiled']['total_s']:.3f}s"]
    out.append("  unprofiled breakdown (each stage timed alone):")
    for stage, v in prof["breakdown"].items():
        out.append(f"    {stage:<42} {v['s']:8.3f}s  {100 * v['share']:5.1f}%")
    pr = prof["profiled"]
    out.append(f"  under cProfile, cumulative shares: codecs.decompress "
               f"{100 * pr['decompress_cum_share']:.1f}%, scan_v2 (record loop) "
               f"{100 * pr['scan_v2_cum_share']:.1f}%, CRC validate "
               f"{100 * pr['validate_cum_share']:.1f}%, iter_headers "
               f"{100 * pr['iter_headers_cum_share']:.1f}%")
    out.append("  cProfile top functions by own time (cProfile inflates call-heavy code):")
    rows = [[r["function"][:90], f"{r['ncalls']:,}", f"{r['tottime_s']:.3f}",
             f"{100 * r['tottime_share']:.1f}%", f"{r['cumtime_s']:.3f}"] for r in prof["top"]]
    out.append("    " + _table(["function", "ncalls", "tottime", "share", "cumtime"],
                                rows).replace("\n", "\n    "))
    return "\n".join(out)


# -- Spark sections (jobs/bench_spark.py) ---------------------------------------------------------

def _spark_section(name: str, help_text: str, runner_name: str) -> None:
    def run(args):
        import bench_spark
        result = getattr(bench_spark, runner_name)(args)
        print(bench_spark.render(name, result))
        return result, 0

    def add_arguments(p):
        import bench_spark
        bench_spark.add_arguments(p)

    section(name, help_text, add_arguments)(run)


_spark_section("spark-read", "Spark batch read: kafkalog vs a no-op Arrow source vs Parquet",
               "run_spark_read")
_spark_section("spark-write", "Spark batch write: kafkalog vs a no-op Arrow sink vs Parquet",
               "run_spark_write")


# -- metadata (jobs/bench_metadata.py) -------------------------------------------------------------

def _metadata_arguments(p):
    import bench_metadata
    bench_metadata.add_arguments(p)


@section("metadata", "cluster metadata: produce latency, metadata bytes and cold open against "
                     "the partition count", _metadata_arguments)
def run_metadata(args):
    import bench_metadata
    result = bench_metadata.run(args)
    print(bench_metadata.render(result))
    return result, 0


# -- streaming (jobs/bench_streaming.py) -----------------------------------------------------------

def _streaming_arguments(p):
    import bench_streaming
    bench_streaming.add_arguments(p)


@section("streaming", "Structured Streaming: planning at 10,000 partitions (time and storage "
                      "requests per trigger), stream vs batch throughput, end-to-end latency",
         _streaming_arguments)
def run_streaming(args):
    import bench_streaming
    result = bench_streaming.run(args)
    print(bench_streaming.render(result))
    return result, 0


# -- replication (jobs/bench_replication.py) -------------------------------------------------------

def _replication_arguments(p):
    import bench_replication
    bench_replication.add_arguments(p)


@section("replication", "replication: follower catch-up against copyfile+fsync, server-side "
                        "vs streamed copies (--s3), produce latency RF=1 vs RF=2 acks=all/1",
         _replication_arguments)
def run_replication(args):
    import bench_replication
    result = bench_replication.run(args)
    print(bench_replication.render(result))
    return result, 0


# -- soak (jobs/bench_soak.py) ---------------------------------------------------------------------

def _soak_arguments(p):
    import bench_soak
    bench_soak.add_arguments(p)


@section("soak", "a cluster after many commits: commit p50/p99, segments per partition, "
                 "metadata entries and write amplification per window as merges and cleanup "
                 "run; S3 requests per produce (--s3); a streaming query (--stream)",
         _soak_arguments)
def run_soak(args):
    import bench_soak
    result = bench_soak.run(args)
    print(bench_soak.render(result))
    ok = (result.get("full_speed", {}).get("every_record_once_in_order", True)
          and result.get("stream", {}).get("exactly_once", True))
    return result, 0 if ok else 1


# -- compact (jobs/bench_compaction.py) ------------------------------------------------------------

def _compact_arguments(p):
    import bench_compaction
    bench_compaction.add_arguments(p)


@section("compact", "log compaction: MB/s of log cleaned by clean_partition (map, clean, "
                    "publish) against reading the same partition with consume, in one run",
         _compact_arguments)
def run_compact(args):
    import bench_compaction
    result = bench_compaction.run(args)
    print(bench_compaction.render(result))
    return result, 0 if result["correct"] else 1


# -- entry point ----------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="benchmark.py", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="section", metavar="SECTION", required=True)
    for name, (help_text, add_arguments, _run) in SECTIONS.items():
        sp = sub.add_parser(name, help=help_text, description=help_text)
        add_arguments(sp)
        sp.add_argument("--json", metavar="OUT", help="also write machine-readable results here")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    run = SECTIONS[args.section][2]
    result, code = run(args)
    result["argv"] = list(sys.argv[1:] if argv is None else argv)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(result, fh, indent=2, default=str)
        print(f"\nwrote {args.json}")
    return code


if __name__ == "__main__":
    sys.exit(main())
