"""Shared machinery of the fuzz tests (test_fuzz_batches.py, test_fuzz_logs.py), and their
contract. Fuzzing of damaged bytes: random bit flips, truncations, garbage insertion and
overwrites in

(a) single encoded batches of every magic and codec (and real Kafka-written ones),
(b) segment ``.log`` files of copies of the golden cases and of freshly written logs,
(c) ``.index``/``.timeindex`` files of the same.

Contract checked (the project's rule: corrupt bytes are detected, then reported or recovered,
never returned silently, and never crash or hang the process):

* decoding returns records or raises a :class:`KafkaLogError` subclass; anything else
  (IndexError, struct.error, zlib.error, MemoryError, RecursionError, ...) is a failure, and so is
  running past a per-call time limit (SIGALRM);
* records that do come back are the original ones (a prefix, never altered content);
* ``PartitionLog.recover()`` never raises, leaves every segment decodable, keeps exactly what
  Kafka's recovery rule keeps (every entry before the first damaged one, as a prefix of the
  original records), and leaves the indexes byte-identical to rebuilt ones; it is idempotent and
  the log takes appends afterwards;
* indexes are derived data: damaged index files never change what a read or an
  ``offset_for_timestamp`` returns, and ``recover()`` restores them.

Bytes a CRC cannot see: a magic 2 batch's base offset (bytes 0-7) and partition leader epoch
(bytes 12-15), and a magic 0/1 entry's offset (bytes 0-7), lie outside the checksum. What the
library does, and ``test_crc_invisible_offset_and_epoch_flips`` pins:

* decoding returns the entry with the altered offsets (v2: every offset shifted with the base;
  magic 1 wrapper: every inner offset shifted with the wrapper's; magic 0 wrapper: unchanged, its
  inner offsets are absolute) or epoch; nothing can tell. It raises CorruptRecordError where the
  result is impossible: a magic 1 wrapper offset below its last inner offset (as Kafka does) and,
  as it should, offsets beyond int64 (the latter is a bug today: OverflowError);
* ``recover()`` cuts the segment where offsets stop increasing: an entry whose offsets went
  *down* (or below the segment's base offset, or out of its 32-bit relative range) is cut with
  everything after it; an entry whose offsets went *up* is kept with the shifted offsets, and the
  *next* entry, whose offsets now go down, is where the cut happens; so an increase in the very
  last entry of a log is undetectable. ``model_recovery`` below is that rule, written
  independently of the library.

Other findings pinned by deterministic tests at the end of the sections (each fails with a
``BUG file: ...`` message while the library has the bug): struct.error/OverflowError from
malformed inner messages; ``read_columns`` looping forever on offsets that go backwards; index
entries trusted without checking them against the log (wrong log end offset, skipped records,
wrong ``offset_for_timestamp``, appends at a reused offset); a missing ``.timeindex`` failing
appends; ``recover()`` keeping an undecodable magic 1 wrapper.

Knobs (environment):
  KAFKALOG_FUZZ_SCALE   multiplies the number of cases (1: CI run < 60 s; 10: long run)
  KAFKALOG_FUZZ_SEED    integer seed, or "random" (default: a fixed seed, so CI is repeatable)
  KAFKALOG_FUZZ_TIMEOUT per-call time limit in seconds (default 5; normal calls take < 0.1 s)
  KAFKALOG_FUZZ_SHOW    reproductions shown per failure category (default 4)
Every failure message starts with the seed and a command line that replays it; every
reproduction names the file, the case number and the exact bytes changed.
"""
from __future__ import annotations

import os
import random
import signal
import struct
from contextlib import contextmanager
from typing import Callable, Dict, List, NamedTuple, Optional, Tuple

import pytest

from support.golden import GOLDEN, UNDAMAGED
from pyspark_kafkalog.errors import KafkaLogError
from pyspark_kafkalog.format import codecs
from pyspark_kafkalog.format.batch import iter_headers
from pyspark_kafkalog.format.crc import crc32, crc32c
from pyspark_kafkalog.format.encode import (encode_batch_v2, encode_control_batch,
                                            encode_message_set)
from pyspark_kafkalog.format.records import (CONTROL_ABORT, CONTROL_COMMIT, CREATE_TIME,
                                             LOG_APPEND_TIME, Record)

SCALE = max(1, int(float(os.environ.get("KAFKALOG_FUZZ_SCALE", "1"))))
_SEED_ENV = os.environ.get("KAFKALOG_FUZZ_SEED", "").strip()
SEED = (random.SystemRandom().randrange(2**32) if _SEED_ENV.lower() == "random"
        else int(_SEED_ENV) if _SEED_ENV else 1_729)
CASE_TIMEOUT = float(os.environ.get("KAFKALOG_FUZZ_TIMEOUT", "5"))
INT32_MAX = 2**31 - 1
T0 = 1_700_000_000_000


# -- time limit and outcomes -----------------------------------------------------------------------

class CaseTimeout(BaseException):
    """Raised by SIGALRM. A BaseException, so no ``except Exception`` in the library eats it."""


@contextmanager
def time_limit(seconds: float, what: str):
    def on_alarm(signum, frame):
        raise CaseTimeout(f"{what} did not finish within {seconds:g} s (hang?)")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


class Outcome(NamedTuple):
    kind: str          # "ok" | "error" (a KafkaLogError) | "crash" (anything else) | "hang"
    value: object
    exc: Optional[BaseException]

    @property
    def bad(self) -> bool:
        return self.kind in ("crash", "hang")

    def describe(self) -> str:
        if self.exc is None:
            return self.kind
        return f"{self.kind}: {type(self.exc).__module__}.{type(self.exc).__name__}: {self.exc}"


def attempt(fn: Callable, what: str, timeout: float = CASE_TIMEOUT) -> Outcome:
    try:
        with time_limit(timeout, what):
            return Outcome("ok", fn(), None)
    except KafkaLogError as exc:
        return Outcome("error", None, exc)
    except CaseTimeout as exc:
        return Outcome("hang", None, exc)
    except Exception as exc:   # IndexError, struct.error, zlib.error, MemoryError, RecursionError
        return Outcome("crash", None, exc)


# -- failure collection ----------------------------------------------------------------------------

class Findings:
    """Collects contract violations of one fuzz test; fails once, with a grouped report."""

    MAX = 60
    MAX_HANGS = 3      # each costs a whole time limit: stop early rather than run for minutes

    def __init__(self, test: str):
        self.test = test
        self.items: Dict[str, List[str]] = {}
        self.cases = 0
        self.hangs = 0

    def add(self, category: str, repro: str) -> None:
        self.items.setdefault(category, []).append(repro)
        if category.endswith(": hang") or " -> hang: " in repro:
            self.hangs += 1

    @property
    def full(self) -> bool:
        return sum(map(len, self.items.values())) >= self.MAX or self.hangs >= self.MAX_HANGS

    def check(self) -> None:
        print(f"{self.test}: {self.cases} cases, seed {SEED}, scale {SCALE}")
        if not self.items:
            return
        lines = [f"seed {SEED} (replay: KAFKALOG_FUZZ_SEED={SEED} KAFKALOG_FUZZ_SCALE={SCALE} "
                 f"pytest tests/format/test_fuzz_batches.py tests/log/test_fuzz_logs.py -k {self.test}); "
                 f"{self.cases} cases run"
                 + ("; stopped early" if self.full else "")]
        for category, repros in self.items.items():
            lines.append(f"\n[{len(repros)}x] {category}")
            for r in repros[:int(os.environ.get("KAFKALOG_FUZZ_SHOW", "4"))]:
                lines.append(f"    - {r}")
        pytest.fail("\n".join(lines), pytrace=False)


def case_rng(test: str, i: int) -> random.Random:
    return random.Random(f"{SEED}:{test}:{i}")


# -- mutations -------------------------------------------------------------------------------------

class Mutation(NamedTuple):
    kind: str                 # flip | overwrite | truncate | insert
    desc: str
    data: bytes
    first: int                # first byte position whose content differs from the original
    changed: Tuple[int, ...]  # in-place kinds: the positions whose byte changed


def _garbage(rng: random.Random, n: int) -> bytes:
    flavour = rng.randrange(5)
    if flavour == 4:   # an extreme int64 (offsets are int64 fields outside the CRC)
        big = rng.choice([b"\x7f" + b"\xff" * 6, b"\x80" + bytes(6), b"\xff" * 7])
        return (big + rng.randbytes(max(0, n - 7)))[:n]
    if flavour == 0:
        return bytes(n)
    if flavour == 1:
        return b"\xff" * n
    if flavour == 2:   # a plausible-looking entry header: small offset, some length, magic 2
        head = struct.pack(">qiib", rng.randrange(1000), rng.randrange(-5, 4000),
                           rng.randrange(-1, 5), 2)
        return (head + rng.randbytes(max(0, n - len(head))))[:n]
    return rng.randbytes(n)


def mutate(data: bytes, rng: random.Random, kinds=("flip", "flip", "overwrite", "truncate",
                                                   "insert")) -> Mutation:
    kind = rng.choice(kinds)
    if not data:
        kind = "insert"
    buf = bytearray(data)
    if kind == "flip":
        spots = sorted({rng.randrange(len(buf)) for _ in range(rng.choice((1, 1, 1, 2, 3)))})
        bits = []
        for p in spots:
            bit = rng.randrange(8)
            buf[p] ^= 1 << bit
            bits.append(f"bit {bit} of byte {p}")
        return Mutation(kind, "flip " + ", ".join(bits), bytes(buf), spots[0], tuple(spots))
    if kind == "overwrite":
        start = rng.randrange(len(buf))
        n = min(rng.randrange(1, 33), len(buf) - start)
        new = _garbage(rng, n)
        buf[start:start + n] = new
        changed = tuple(start + i for i in range(n) if data[start + i] != new[i])
        if not changed:
            return mutate(data, rng, kinds)
        return Mutation(kind, f"overwrite bytes {start}..{start + n - 1} with {new.hex()}",
                        bytes(buf), changed[0], changed)
    if kind == "truncate":
        n = rng.randrange(len(buf))
        return Mutation(kind, f"truncate to {n} bytes (from {len(buf)})", bytes(buf[:n]), n, ())
    pos = rng.randrange(len(buf) + 1)
    new = _garbage(rng, rng.randrange(1, 65))
    buf[pos:pos] = new
    first = pos   # garbage equal to the bytes it pushes along changes nothing there
    while first < len(data) and buf[first] == data[first]:
        first += 1
    return Mutation("insert", f"insert {len(new)} bytes {new.hex()} at {pos}", bytes(buf), first,
                    ())


def invisible_ranges(headers) -> List[Tuple[int, int]]:
    """Byte ranges no CRC covers: v2 base offset and leader epoch, legacy offset."""
    out = []
    for h in headers:
        out.append((h.position, h.position + 8))
        if h.magic == 2:
            out.append((h.position + 12, h.position + 16))
    return out


def is_invisible(mut: Mutation, headers) -> bool:
    """All of the damage is in bytes no CRC covers."""
    if mut.kind not in ("flip", "overwrite"):
        return False
    ranges = invisible_ranges(headers)
    return all(any(a <= p < b for a, b in ranges) for p in mut.changed)


def first_visible(mut: Mutation, headers) -> int:
    """The first damaged byte a CRC (or the entry structure) can see."""
    if mut.kind not in ("flip", "overwrite"):
        return mut.first
    ranges = invisible_ranges(headers)
    return min((p for p in mut.changed if not any(a <= p < b for a, b in ranges)),
               default=len(mut.data))


def touches_invisible(mut: Mutation, headers) -> bool:
    """Some of the damage is in bytes no CRC covers (offsets may legitimately differ)."""
    ranges = invisible_ranges(headers)
    return any(a <= p < b for a, b in ranges for p in mut.changed)


def fix_crcs(buf: bytearray) -> None:
    """Recompute the CRC of every whole entry the shallow walk can find (structure-aware fuzzing:
    the parsers behind the CRC then see the damage)."""
    pos = 0
    while pos + 17 < len(buf):
        length = struct.unpack_from(">i", buf, pos + 8)[0]
        end = pos + 12 + length
        if length < 14 or end > len(buf):
            return
        if buf[pos + 16] == 2 and length >= 49:
            struct.pack_into(">I", buf, pos + 17, crc32c(bytes(buf[pos + 21:end])))
        elif buf[pos + 16] in (0, 1):
            struct.pack_into(">I", buf, pos + 12, crc32(bytes(buf[pos + 16:end])))
        pos = end


# -- record views ----------------------------------------------------------------------------------

def full(r) -> tuple:
    """Everything a record carries except its batch position and partition leader epoch."""
    return (r.offset, r.timestamp, r.timestamp_type, r.key, r.value, r.headers, r.magic,
            r.is_control, r.is_transactional, r.producer_id, r.producer_epoch)


def payload(r) -> tuple:
    return full(r)[1:]


def is_prefix(short: list, long: list) -> bool:
    return len(short) <= len(long) and long[:len(short)] == short


def first_difference(got: list, want: list) -> str:
    for i, (g, w) in enumerate(zip(got, want)):
        if g != w:
            return f"first difference at #{i}: got {str(g)[:160]} want {str(w)[:160]}"
    return f"got {len(got)} records, want {len(want)}"


def check_decoded_types(recs) -> Optional[str]:
    for r in recs:
        if not (isinstance(r.offset, int) and isinstance(r.timestamp, int)
                and (r.key is None or isinstance(r.key, bytes))
                and (r.value is None or isinstance(r.value, bytes))
                and all(isinstance(k, str) and (v is None or isinstance(v, bytes))
                        for k, v in r.headers)):
            return f"decoded record has wrong field types: {str(r)[:200]}"
    return None


# -- corpus of single batches ----------------------------------------------------------------------

def random_records(rng: random.Random, n: int, headers: bool) -> List[Record]:
    out = []
    for i in range(n):
        key = rng.choice([None, b"", b"key-%d" % rng.randrange(10**6), rng.randbytes(12)])
        value = rng.choice([None, b"", rng.randbytes(rng.randrange(1, 80)),
                            (b"value-%d " % i) * rng.randrange(1, 40)])
        hdrs = ()
        if headers and rng.random() < 0.6:
            hdrs = tuple((rng.choice(["h", "trace-id", "\u00e9t\u00e9", ""]),
                          rng.choice([None, b"", rng.randbytes(6)]))
                         for _ in range(rng.randrange(1, 4)))
        out.append(Record(key, value, T0 + rng.randrange(-5000, 5000), hdrs))
    return out


def batch_corpus(rng: random.Random) -> List[Tuple[str, bytes]]:
    corpus = []
    for codec in codecs.CODEC_NAMES:
        for variant in ("create", "logappend", "txn-gaps", "horizon"):
            n = rng.randrange(1, 9)
            kw = {}
            if variant == "logappend":
                kw = dict(timestamp_type=LOG_APPEND_TIME, log_append_time=T0 + 7)
            elif variant == "txn-gaps":
                deltas = sorted(rng.sample(range(3 * n + 3), n))
                kw = dict(transactional=True, producer_id=4242, producer_epoch=3,
                          base_sequence=17, offset_deltas=deltas)
            elif variant == "horizon":
                kw = dict(delete_horizon_ms=T0 + 99)
            b = encode_batch_v2(random_records(rng, n, True), base_offset=rng.randrange(10**6),
                                compression=codec, partition_leader_epoch=5, **kw)
            corpus.append((f"v2-{codecs.CODEC_NAMES[codec]}-{variant}", b.data))
    for magic in (0, 1):
        for codec in (codecs.NONE, codecs.GZIP, codecs.SNAPPY, codecs.LZ4):
            for ts_type in ((CREATE_TIME,) if magic == 0 else (CREATE_TIME, LOG_APPEND_TIME)):
                b = encode_message_set(random_records(rng, rng.randrange(1, 7), False), magic=magic,
                                       base_offset=rng.randrange(10**6), compression=codec,
                                       timestamp_type=ts_type, log_append_time=T0 + 3)
                corpus.append((f"m{magic}-{codecs.CODEC_NAMES[codec]}-t{ts_type}", b.data))
    for ctype in (CONTROL_ABORT, CONTROL_COMMIT):
        b = encode_control_batch(ctype, producer_id=7, producer_epoch=1, timestamp=T0)
        corpus.append((f"control-{ctype}", b.data))
    # real Kafka-written entries: the first two of every undamaged golden case
    for case in UNDAMAGED:
        first = sorted((GOLDEN / case).glob("*.log"))[0]
        data = first.read_bytes()
        hs = list(iter_headers(data))[:2]
        corpus.append((f"golden {case}/{first.name}[0:{hs[-1].end}]", data[:hs[-1].end]))
    return corpus


CORPUS = batch_corpus(random.Random(f"{SEED}:corpus"))
