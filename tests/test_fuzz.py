"""Fuzzing of damaged bytes: random bit flips, truncations, garbage insertion and overwrites in

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
import shutil
import signal
import stat
import struct
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Dict, List, NamedTuple, Optional, Tuple

import pytest

from conftest import GOLDEN, UNDAMAGED
from pyspark_kafkalog.errors import KafkaLogError
from pyspark_kafkalog.format import codecs
from pyspark_kafkalog.format.batch import iter_headers, read_header
from pyspark_kafkalog.format.columnar import decode_columns, decode_records
from pyspark_kafkalog.format.crc import crc32, crc32c
from pyspark_kafkalog.format.encode import (EncodedBatch, encode_batch_v2, encode_control_batch,
                                            encode_message_set)
from pyspark_kafkalog.format.records import (CONTROL_ABORT, CONTROL_COMMIT, CREATE_TIME,
                                             LOG_APPEND_TIME, Record)
from pyspark_kafkalog.log.config import LogConfig
from pyspark_kafkalog.log.partition import PartitionLog
from pyspark_kafkalog.storage import open_storage

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
                 f"pytest 'tests/test_fuzz.py::{self.test}'); {self.cases} cases run"
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


# -- (a) single batches ----------------------------------------------------------------------------

def test_damaged_single_batches():
    """Raw damage: decode raises KafkaLogError or returns only undamaged records; never crashes or
    hangs. With validate=False, and with damage behind recomputed CRCs (structure-aware), the
    parsers and codecs still only return records or raise KafkaLogError."""
    f = Findings("test_damaged_single_batches")
    originals = {name: decode_records(data) for name, data in CORPUS}
    per_batch = 40 * SCALE
    for ci, (name, data) in enumerate(CORPUS):
        orig = originals[name]
        headers = list(iter_headers(data))
        for i in range(per_batch):
            if f.full:
                break
            rng = case_rng("single", ci * 100_000 + i)
            mut = mutate(data, rng)
            f.cases += 1
            where = f"{name}: {mut.desc}"
            # 1. as stored: the CRC must catch it
            out = attempt(lambda: decode_records(mut.data), f"decode_records ({where})")
            if out.bad:
                f.add(f"decode_records of damaged bytes: {out.kind}",
                      f"{where} -> {out.describe()}")
            elif out.kind == "ok":
                got = out.value
                got_p, orig_p = [payload(r) for r in got], [payload(r) for r in orig]
                bad_types = check_decoded_types(got)
                if bad_types:
                    f.add("decoded fields of wrong type", f"{where}: {bad_types}")
                if is_invisible(mut, headers):
                    if got_p != orig_p:
                        f.add("CRC-invisible flip changed record content", where)
                elif not is_prefix(got_p, orig_p):
                    f.add("damaged batch decoded to records that are not the original ones "
                          "(corruption returned silently)",
                          f"{where}: {first_difference(got_p, orig_p)}")
                elif (mut.kind in ("flip", "overwrite", "truncate")
                      and not touches_invisible(mut, headers)
                      and not is_prefix([full(r) for r in got], [full(r) for r in orig])):
                    f.add("damaged batch decoded with altered offsets outside the CRC-invisible "
                          "fields", where)
                else:
                    # whatever came back must come from entries wholly before the damage
                    first = first_visible(mut, headers)
                    intact = sum(1 for r in orig if any(
                        h.position == r.batch_position and h.end <= first for h in headers))
                    if len(got) > intact:
                        f.add("records returned from a damaged entry",
                              f"{where}: {len(got)} records back, {intact} before the damage")
            # 2. without CRC validation: parsers must still fail cleanly
            out = attempt(lambda: decode_records(mut.data, validate=False),
                          f"decode_records(validate=False) ({where})")
            if out.bad:
                f.add(f"decode_records(validate=False) of damaged bytes: {out.kind}",
                      f"{where} -> {out.describe()}")
            # 3. damage behind valid CRCs
            fixed = bytearray(mut.data)
            fix_crcs(fixed)
            out = attempt(lambda: decode_records(bytes(fixed)),
                          f"decode_records (CRC fixed, {where})")
            if out.bad:
                f.add(f"decode_records of damage behind recomputed CRCs: {out.kind}",
                      f"{where} + CRCs recomputed -> {out.describe()}")
    f.check()


def _rebuild_v2(data: bytes, blob: bytes) -> bytes:
    """Replace a v2 batch's records section with ``blob`` (already compressed), fix size + CRC."""
    buf = bytearray(data[:61] + blob)
    struct.pack_into(">i", buf, 8, len(buf) - 12)
    struct.pack_into(">I", buf, 17, crc32c(bytes(buf[21:])))
    return bytes(buf)


def _legacy_wrapper(data: bytes, inner_compressed: bytes) -> bytes:
    """Rebuild a magic 0/1 compressed wrapper message around new compressed bytes."""
    h = read_header(data, 0)
    head = data[16:18] + (data[18:26] if h.magic == 1 else b"")
    body = head + struct.pack(">i", -1) + struct.pack(">i", len(inner_compressed)) + \
        inner_compressed
    return data[:8] + struct.pack(">i", 4 + len(body)) + struct.pack(">I", crc32(body)) + body


def test_damaged_compressed_contents_behind_valid_crcs():
    """Damage *inside* compressed payloads, re-compressed and re-checksummed, so the record and
    message parsers behind the codecs see it (a buggy or hostile writer, not bit rot)."""
    f = Findings("test_damaged_compressed_contents_behind_valid_crcs")
    compressed = []
    for name, data in CORPUS:
        h = next(iter_headers(data))
        if h.compression and h.end == len(data):
            compressed.append((name, data, h))
    assert len(compressed) >= 13
    for ci, (name, data, h) in enumerate(compressed):
        if h.magic == 2:
            inner = codecs.decompress(h.compression, data[61:], 2)
        else:
            (wrapper_value,) = [m for m in _values_of_legacy_wrapper(data)]
            inner = codecs.decompress(h.compression, wrapper_value, h.magic)
        for i in range(40 * SCALE):
            if f.full:
                break
            rng = case_rng("inner", ci * 100_000 + i)
            mut = mutate(inner, rng)
            if h.magic == 2 and rng.random() < 0.3:   # also the record count
                buf = bytearray(data[:61])
                struct.pack_into(">i", buf, 57, rng.choice([0, -1, 2**31 - 1,
                                                            h.record_count + rng.randrange(-3, 4)]))
                data_h = bytes(buf) + data[61:]
                extra = "; record count " + str(struct.unpack_from(">i", buf, 57)[0])
            else:
                data_h, extra = data, ""
            try:
                blob = codecs.compress(h.compression, mut.data, h.magic)
            except KafkaLogError:
                continue
            if h.magic == 2:
                damaged = _rebuild_v2(data_h, blob)
            else:
                damaged = _legacy_wrapper(data, blob)
            f.cases += 1
            where = f"{name}: decompressed contents {mut.desc}{extra}, recompressed, CRC fixed"
            out = attempt(lambda: decode_records(damaged), f"decode_records ({where})")
            if out.bad:
                f.add(f"decode_records: {out.kind}", f"{where} -> {out.describe()}")
            elif out.kind == "ok":
                bad_types = check_decoded_types(out.value)
                if bad_types:
                    f.add("decoded fields of wrong type", f"{where}: {bad_types}")
            out = attempt(lambda: decode_columns(damaged, with_headers=False),
                          f"decode_columns ({where})")
            if out.bad:
                f.add(f"decode_columns(with_headers=False): {out.kind}",
                      f"{where} -> {out.describe()}")
    f.check()


def _values_of_legacy_wrapper(data: bytes):
    h = read_header(data, 0)
    p = 26 if h.magic == 1 else 18
    klen = struct.unpack_from(">i", data, p)[0]
    p += 4 + max(klen, 0)
    vlen = struct.unpack_from(">i", data, p)[0]
    yield data[p + 4:p + 4 + vlen]


def test_inner_legacy_message_shorter_than_its_header_is_a_kafkalog_error():
    """Regression found by the fuzzer: a magic 1 message inside a compressed wrapper whose size
    field (14..17) is too small for a magic 1 header, as the last inner message."""
    inner = struct.pack(">qiIbbq", 0, 14, 0, 1, 0, T0)          # 26 bytes: size 14, magic 1
    wrapper = _legacy_wrapper(
        encode_message_set([Record(b"k", b"v", T0)], magic=1, compression=codecs.GZIP).data,
        codecs.compress(codecs.GZIP, inner, 1))
    out = attempt(lambda: decode_records(wrapper), "decode_records")
    assert not out.bad, (
        "BUG pyspark_kafkalog/format/columnar.py _legacy_messages: an inner magic 1 message with "
        "size 14 (below the 22-byte magic 1 minimum) at the end of the decompressed wrapper "
        "makes the key-length read run off the buffer; expected CorruptRecordError, got "
        f"{out.describe()}. Bytes (hex): {wrapper.hex()}")


@pytest.mark.parametrize("where", ["v2 base offset", "magic 1 inner offset"])
def test_offsets_beyond_int64_are_a_kafkalog_error(where):
    """Regression found by the fuzzer: offsets that do not fit an int64 must be reported as
    corrupt, not crash the decoder. The v2 base offset is outside the CRC, so a damaged one on
    storage gets here; the inner offsets of a magic 1 wrapper need a bad writer."""
    if where == "v2 base offset":
        buf = bytearray(encode_batch_v2([Record(b"a", b"1", T0), Record(b"b", b"2", T0)]).data)
        struct.pack_into(">q", buf, 0, 2**63 - 1)     # last offset = 2**63: not an int64
        data = bytes(buf)
    else:
        b = encode_message_set([Record(b"a", b"1", T0), Record(b"b", b"2", T0)], magic=1,
                               compression=codecs.GZIP, base_offset=10)
        (value,) = _values_of_legacy_wrapper(b.data)
        inner = bytearray(codecs.decompress(codecs.GZIP, value, 1))
        last = list(iter_headers(inner))[-1]
        struct.pack_into(">q", inner, last.position, -2**63 + 1)   # base = 11 - that > int64
        data = _legacy_wrapper(b.data, codecs.compress(codecs.GZIP, bytes(inner), 1))
    out = attempt(lambda: decode_records(data), "decode_records")
    assert out.kind == "error", (
        "BUG pyspark_kafkalog/format/columnar.py (_scan_v2 / _decode_legacy): an absolute "
        f"offset beyond int64 ({where}) makes array('q').append raise; expected "
        f"CorruptRecordError, got {out.describe()}. Bytes (hex): {data.hex()}")


# -- partition sources: golden copies and fresh logs -----------------------------------------------

class Source(NamedTuple):
    name: str
    path: Path            # the pristine partition dir (never modified)
    config: LogConfig


FRESH_CONFIGS = {
    "fresh-v2-0": LogConfig.from_properties({"segment.bytes": 3500, "index.interval.bytes": 300}),
    "fresh-legacy-0": LogConfig.from_properties({"segment.bytes": 3500,
                                                 "index.interval.bytes": 200}),
    "fresh-mixed-0": LogConfig.from_properties({"segment.bytes": 4000, "index.interval.bytes": 0,
                                                "segment.ms": 3000}),
}


def _fresh_batches(kind: str, rng: random.Random) -> List[EncodedBatch]:
    out = []
    for i in range(60):
        n = rng.randrange(1, 7)
        if kind == "fresh-legacy-0" or (kind == "fresh-mixed-0" and rng.random() < 0.5):
            magic = rng.choice((0, 1))
            out.append(encode_message_set(random_records(rng, n, False), magic=magic,
                                          compression=rng.choice((0, 1, 2, 3))))
        elif rng.random() < 0.1:
            out.append(encode_control_batch(rng.choice((CONTROL_ABORT, CONTROL_COMMIT)),
                                            producer_id=9, producer_epoch=0, timestamp=T0 + i))
        else:
            deltas = sorted(rng.sample(range(2 * n), n)) if rng.random() < 0.3 else None
            out.append(encode_batch_v2(random_records(rng, n, True),
                                       compression=rng.choice(list(codecs.CODEC_NAMES)),
                                       transactional=rng.random() < 0.2, producer_id=9,
                                       offset_deltas=deltas))
    return out


def _writable_copy(src: Path, dst_root: Path) -> Path:
    dst = dst_root / src.name
    shutil.copytree(src, dst)
    for p in dst.iterdir():
        os.chmod(p, os.stat(p).st_mode | stat.S_IWUSR)
    return dst


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> List[Source]:
    out = [Source(case, GOLDEN / case, LogConfig()) for case in UNDAMAGED]
    root = tmp_path_factory.mktemp("fresh-sources")
    for name, config in FRESH_CONFIGS.items():
        log = PartitionLog(open_storage(str(root), fsync=False), name, config)
        rng = random.Random(f"{SEED}:{name}")
        batches = _fresh_batches(name, rng)
        for i in range(0, len(batches), 3):
            log.append(batches[i:i + 3], now_ms=T0)
        assert len(log.segments) >= 3, name
        out.append(Source(name, root / name, config))
    assert len(out) >= 20, "golden cases missing?"
    return out


class SegInfo(NamedTuple):
    name: str
    base: int
    data: bytes
    headers: list
    records: list                 # DecodedRecord


class Pristine(NamedTuple):
    segments: List[SegInfo]
    records: list                 # all, in log order


_PRISTINE: Dict[str, Pristine] = {}


def pristine(src: Source) -> Pristine:
    if src.name not in _PRISTINE:
        segs = []
        for p in sorted(src.path.glob("*.log")):
            data = p.read_bytes()
            segs.append(SegInfo(p.name, int(p.name[:20]), data, list(iter_headers(data)),
                                decode_records(data)))
        _PRISTINE[src.name] = Pristine(segs, [r for s in segs for r in s.records])
    return _PRISTINE[src.name]


def open_log(root: Path, src: Source) -> PartitionLog:
    return PartitionLog(open_storage(str(root), fsync=False), src.name, src.config)


def segment_rows(log: PartitionLog) -> list:
    return [r for seg in log.segments for r in decode_records(log.storage.read(seg.log_path))]


def index_mismatches(log: PartitionLog) -> List[str]:
    out = []
    for seg in log.segments:
        index, timeindex = seg.rebuilt_indexes()
        if log.storage.read(seg.path(".index")) != index:
            out.append(f"{seg.log_path}: .index differs from rebuilt")
        if log.storage.read(seg.path(".timeindex")) != timeindex:
            out.append(f"{seg.log_path}: .timeindex differs from rebuilt")
    return out


# -- the recovery rule, as an independent model ---------------------------------------------------

def _entry_offsets(buf: bytes, h) -> Tuple[int, int]:
    """(base, last) offsets recovery sees for the entry at ``h.position`` in (damaged) ``buf``."""
    m = read_header(buf, h.position)
    return (m.base_offset if m.base_offset >= 0 else m.last_offset), m.last_offset


def expected_entry(h, ents: list, buf: bytes) -> Optional[list]:
    """The records (``full`` rows) the entry at ``h.position`` of ``buf`` decodes to once its offset
    field (outside the CRC) may have changed; None where decoding must raise a KafkaLogError."""
    m = read_header(buf, h.position)
    if h.magic == 2:
        offs = [r.offset + m.base_offset - h.base_offset for r in ents]
    elif not h.compression:
        offs = [m.last_offset]
    elif h.magic == 0:                     # inner offsets are absolute: the wrapper's is unused
        offs = [r.offset for r in ents]
    else:                                  # magic 1: inner offsets relative to the wrapper's
        rel_last = len(ents) - 1           # (Kafka and our encoder write them as 0..n-1)
        rel = [r.offset - h.last_offset + rel_last for r in ents]
        if m.last_offset == 0:             # like Kafka: a 0 wrapper means absolute inner offsets
            offs = rel
        elif m.last_offset < rel_last:     # "wrapper offset below its last inner offset"
            return None
        else:
            offs = [m.last_offset - rel_last + x for x in rel]
    if any(not -2**63 <= o < 2**63 for o in offs):
        return None                        # does not fit an int64: must be reported, not wrapped
    return [(o,) + full(r)[1:] for o, r in zip(offs, ents)]


def model_recovery(p: Pristine, seg_i: int, mut: Mutation) -> Tuple[list, str]:
    """What recover() must keep: Kafka's rule (cut at the first torn or CRC-failing entry, drop
    every later segment) plus the library's offset rule (cut where offsets stop increasing)."""
    kept: list = []
    prev_last = None
    for si, seg in enumerate(p.segments):
        buf = mut.data if si == seg_i else seg.data
        prev = seg.base - 1 if prev_last is None else prev_last
        for h in seg.headers:
            damaged = si == seg_i and (
                h.end > len(buf) if mut.kind == "truncate" else
                h.end > mut.first if mut.kind == "insert" else
                any(h.position + 8 <= c < h.end and not (
                    h.magic == 2 and h.position + 12 <= c < h.position + 16)
                    for c in mut.changed))
            if damaged:
                if mut.kind == "truncate" and h.position == len(buf):
                    break          # cut exactly between entries: nothing to detect
                return kept, f"cut at {seg.name} position {h.position} (damaged entry)"
            base, last = _entry_offsets(buf, h)
            if (last <= prev or base <= prev or base > last or last - seg.base > INT32_MAX
                    or base < seg.base):
                return kept, f"cut at {seg.name} position {h.position} (offsets {base}..{last} " \
                             f"after {prev})"
            rows = expected_entry(h, [r for r in seg.records if r.batch_position == h.position],
                                  buf)
            if rows is None:
                return kept, f"cut at {seg.name} position {h.position} (offsets {base}..{last} " \
                             "make the entry undecodable: recovery must not keep it)"
            kept.extend(rows)
            prev = last
        else:
            if si == seg_i and mut.kind == "insert" and mut.first == len(seg.data):
                return kept, f"cut at {seg.name} position {mut.first} (trailing garbage)"
        prev_last = prev
    return kept, "nothing cut"


def boundary_truncation(p: Pristine, seg_i: int, mut: Mutation) -> bool:
    seg = p.segments[seg_i]
    return mut.kind == "truncate" and (mut.first == 0 or any(
        h.end == mut.first for h in seg.headers))


# -- (b) damaged segment .log files ----------------------------------------------------------------

def columns_rows(cols) -> list:
    rows, h = [], 0
    keys, values, hkeys, hvalues = cols.key, cols.value, cols.header_key, cols.header_value
    for i in range(len(cols)):
        n = cols.header_count[i]
        hdrs = tuple(zip(hkeys[h:h + n], hvalues[h:h + n]))
        h += n
        rows.append((cols.offset[i], cols.timestamp[i], cols.timestamp_type[i], keys[i],
                     values[i], hdrs))
    return rows


def invisible_flip(seg: SegInfo, rng: random.Random, last_bias: float = 0.0) -> Mutation:
    """One bit flip in a field no CRC covers (an offset, or a v2 partition leader epoch), or
    (sometimes) an offset field overwritten with an extreme value."""
    h = seg.headers[-1] if rng.random() < last_bias else rng.choice(seg.headers)
    if rng.random() < 0.15:
        value = rng.choice([2**63 - 1, 2**63 - 1 - rng.randrange(1, 100), -1, -2**63,
                            h.last_offset + 2**31, 0])
        buf = bytearray(seg.data)
        struct.pack_into(">q", buf, h.position, value)
        changed = tuple(i for i in range(h.position, h.position + 8) if buf[i] != seg.data[i])
        if changed:
            return Mutation("overwrite", f"set the offset field of the magic {h.magic} entry at "
                                         f"{h.position} to {value}", bytes(buf), changed[0],
                            changed)
    field = rng.choice(["offset", "offset", "epoch"] if h.magic == 2 else ["offset"])
    if field == "offset":   # low bits mostly: small shifts are the realistic, subtle case
        byte = h.position + rng.choice([7, 7, 7, 6, 6, 5, 4, 3, 0])
    else:
        byte = h.position + 12 + rng.randrange(4)
    bit = rng.randrange(8)
    buf = bytearray(seg.data)
    buf[byte] ^= 1 << bit
    return Mutation("flip", f"flip bit {bit} of byte {byte} (the {field} field of the magic "
                            f"{h.magic} entry at {h.position})", bytes(buf), byte, (byte,))


def segment_case(sources, test: str, i: int, invisible: bool = False, last_bias: float = 0.0):
    """The i-th damaged segment of a test: (source, segment index, mutation, description)."""
    rng = case_rng(test, i)
    src = rng.choice(sources)
    p = pristine(src)
    seg_i = rng.randrange(len(p.segments))
    seg = p.segments[seg_i]
    mut = invisible_flip(seg, rng, last_bias) if invisible else mutate(seg.data, rng)
    return src, seg_i, mut, f"case {i}: {src.name}/{seg.name}: {mut.desc}"


def damaged_copy(root: Path, src: Source, seg_i: int, mut: Mutation) -> None:
    _writable_copy(src.path, root)
    (root / src.name / pristine(src).segments[seg_i].name).write_bytes(mut.data)


def check_decode_and_recover(f: Findings, root: Path, src: Source, seg_i: int, mut: Mutation,
                             where: str) -> None:
    p = pristine(src)
    seg = p.segments[seg_i]
    invisible = is_invisible(mut, seg.headers)
    offsets_may_change = touches_invisible(mut, seg.headers)

    # 1. decoding the damaged file: records (only undamaged ones) or KafkaLogError
    out = attempt(lambda: decode_records(mut.data), f"decode_records ({where})")
    if out.bad:
        f.add(f"decode_records of a damaged segment: {out.kind}", f"{where} -> {out.describe()}")
    elif out.kind == "ok":
        got = out.value
        got_p, orig_p = [payload(r) for r in got], [payload(r) for r in seg.records]
        if not is_prefix(got_p, orig_p):
            f.add("damaged segment decoded to records that are not the original ones",
                  f"{where}: {first_difference(got_p, orig_p)}")
        elif not offsets_may_change and not is_prefix([full(r) for r in got],
                                                      [full(r) for r in seg.records]):
            f.add("damaged segment decoded with altered offsets (CRC-visible damage)", where)

    # 2. recovery: never raises, keeps exactly what the rule keeps, indexes rebuilt
    out = attempt(lambda: open_log(root, src).recover(), f"recover ({where})")
    if out.kind != "ok":
        f.add(f"recover() raised: {out.kind}", f"{where} -> {out.describe()}")
        return
    log = open_log(root, src)
    kept = attempt(lambda: segment_rows(log), f"decode after recover ({where})")
    if kept.kind != "ok":
        f.add("a segment is not decodable after recover()", f"{where} -> {kept.describe()}")
        return
    kept_rows = [full(r) for r in kept.value]
    orig = [full(r) for r in p.records]
    expected, why = model_recovery(p, seg_i, mut)
    if kept_rows != expected:
        shape = ("a prefix of the original records" if is_prefix(kept_rows, orig)
                 else "NOT a prefix of the original records")
        f.add("recover() kept other records than Kafka's recovery rule",
              f"{where}: expected {len(expected)} records ({why}), kept {len(kept_rows)}, "
              f"{shape}; {first_difference(kept_rows, expected)}")
    elif not offsets_may_change and not boundary_truncation(p, seg_i, mut) \
            and not is_prefix(kept_rows, orig):
        f.add("recover() kept records that are not a prefix of the original ones", where)
    for problem in index_mismatches(log):
        f.add("indexes differ from rebuilt ones after recover()", f"{where}: {problem}")
    bases = {s.base_offset for s in log.segments}
    orphans = [i.name for i in log.storage.list(src.name)
               if i.name[:20].isdigit() and int(i.name[:20]) not in bases]
    if orphans:
        f.add("files of deleted segments left behind by recover()", f"{where}: {orphans}")
    # idempotent, and the log takes appends at its end
    again = attempt(lambda: open_log(root, src).recover(), f"second recover ({where})")
    if again.kind != "ok" or again.value.truncated_bytes:
        f.add("a second recover() changed the log again", f"{where} -> {again.describe()}")
    log = open_log(root, src)
    leo = log.log_end_offset
    out = attempt(lambda: log.append([encode_batch_v2([Record(b"after", b"recover", T0)])],
                                     now_ms=T0), f"append after recover ({where})")
    if out.kind != "ok" or out.value.first_offset != leo:
        f.add("append after recover() failed or did not continue at the log end offset",
              f"{where}: LEO {leo} -> {out.describe()} "
              f"{getattr(out.value, 'first_offset', None)}")
    else:
        for problem in index_mismatches(open_log(root, src)):
            f.add("indexes differ from rebuilt ones after recover() + append",
                  f"{where}: {problem}")


def check_unrecovered_reads(f: Findings, root: Path, src: Source, seg_i: int, mut: Mutation,
                            where: str) -> None:
    """Reads of a damaged log nobody has recovered yet: records or KafkaLogError, in time, and
    what comes back is a prefix of the original records (nothing altered, nothing skipped)."""
    p = pristine(src)
    invisible = touches_invisible(mut, p.segments[seg_i].headers)
    log = open_log(root, src)
    lso = log.log_start_offset
    want = [full(r)[:6] for r in p.records if not r.is_control]
    out = attempt(lambda: log.read_columns(lso), f"read_columns ({where})")
    if out.bad:
        f.add(f"read_columns on a damaged, unrecovered log: {out.kind}",
              f"{where} -> {out.describe()}")
    elif out.kind == "ok" and not invisible:
        got = columns_rows(out.value)
        if boundary_truncation(p, seg_i, mut):   # undetectable: a shorter, valid segment
            if not set(got) <= set(want):
                f.add("read_columns returned records that were never written", where)
        elif not is_prefix(got, want):
            if set(got) <= set(want):
                f.add("BUG read_columns on a damaged, unrecovered log silently skips records: an "
                      "entry torn or garbled in a segment that is not the last one is treated "
                      "like the partial end of a fetch and the read jumps to the next segment "
                      "(a rolled segment never ends mid-entry: this is damage and must raise "
                      "CorruptRecordError)", f"{where}: {first_difference(got, want)}")
            else:
                f.add("read_columns on a damaged, unrecovered log returned altered records",
                      f"{where}: {first_difference(got, want)}")
    rng = random.Random(where)
    offs = [r.offset for r in p.records]
    for o in rng.sample(offs, min(3, len(offs))):
        out = attempt(lambda: log.read_columns(o, o + 3, max_bytes=rng.choice([1, 5000])),
                      f"read_columns({o}, {o + 3}) ({where})")
        if out.bad:
            f.add(f"read_columns(o, o + 3) on a damaged, unrecovered log: {out.kind}",
                  f"{where}, o={o} -> {out.describe()}")
    for t in (T0 + rng.randrange(-6000, 6000), -1):
        out = attempt(lambda: log.offset_for_timestamp(t), f"offset_for_timestamp ({where})")
        if out.bad:
            f.add(f"offset_for_timestamp on a damaged, unrecovered log: {out.kind}",
                  f"{where}, target {t} -> {out.describe()}")
        elif out.kind == "ok" and out.value is not None and not invisible:
            if out.value not in {(r.offset, r.timestamp) for r in p.records}:
                f.add("offset_for_timestamp on a damaged log answered a record that was never "
                      "written", f"{where}, target {t} -> {out.value}")


def test_damaged_segment_files(sources, tmp_path):
    """Random damage to one .log file: decoding it and recover() (see the module docstring)."""
    f = Findings("test_damaged_segment_files")
    for i in range(300 * SCALE):
        if f.full:
            break
        src, seg_i, mut, where = segment_case(sources, "segment", i)
        root = tmp_path / f"case{i}"
        damaged_copy(root, src, seg_i, mut)
        f.cases += 1
        check_decode_and_recover(f, root, src, seg_i, mut, where)
        shutil.rmtree(root)
    f.check()


def test_crc_invisible_offset_and_epoch_flips(sources, tmp_path):
    """Flips in bytes no CRC covers: decode returns the records with the altered offsets (or
    epoch) and recover() cuts where offsets stop increasing (see the module docstring)."""
    f = Findings("test_crc_invisible_offset_and_epoch_flips")
    for i in range(120 * SCALE):
        if f.full:
            break
        src, seg_i, mut, where = segment_case(sources, "invisible", i, invisible=True)
        seg = pristine(src).segments[seg_i]
        h = next(h for h in seg.headers if h.position <= mut.first < h.end)
        root = tmp_path / f"case{i}"
        damaged_copy(root, src, seg_i, mut)
        f.cases += 1
        rows = expected_entry(h, [r for r in seg.records if r.batch_position == h.position],
                              mut.data)
        out = attempt(lambda: decode_records(mut.data), f"decode_records ({where})")
        if out.bad:
            f.add(f"decode of a CRC-invisible change: {out.kind}", f"{where} -> {out.describe()}")
        elif rows is None:
            if out.kind != "error":
                f.add("offsets that cannot be decoded (int64 overflow, or a magic 1 wrapper "
                      "below its inner offsets) were returned instead of raising",
                      f"{where}: {first_difference([full(r) for r in out.value], [])}")
        elif out.kind != "ok":
            f.add("decode of a CRC-invisible change did not return the records",
                  f"{where} -> {out.describe()}")
        else:
            got = out.value
            want = [row for e in seg.headers for row in (
                rows if e.position == h.position else
                [full(r) for r in seg.records if r.batch_position == e.position])]
            if [full(r) for r in got] != want:
                f.add("a CRC-invisible change decoded to other records than expected (same "
                      "content, offsets shifted by the change)",
                      f"{where}: {first_difference([full(r) for r in got], want)}")
            if "epoch" in mut.desc:
                old = {r.partition_leader_epoch for r in seg.records
                       if r.batch_position == h.position}
                new = {r.partition_leader_epoch for r in got if r.batch_position == h.position}
                if [full(r) for r in got] != [full(r) for r in seg.records] or new == old:
                    f.add("epoch flip: decode should show the new epoch and nothing else", where)
        check_decode_and_recover(f, root, src, seg_i, mut, where)
        shutil.rmtree(root)
    f.check()


def test_reading_damaged_unrecovered_logs(sources, tmp_path):
    """Reads (read_columns, offset_for_timestamp) of damaged logs before anyone ran recover():
    random damage and CRC-invisible offset flips (the last batch of a segment favoured)."""
    f = Findings("test_reading_damaged_unrecovered_logs")
    for i in range(200 * SCALE):
        if f.full:
            break
        src, seg_i, mut, where = segment_case(sources, "unrecovered", i, invisible=i % 3 == 2,
                                              last_bias=0.5)
        root = tmp_path / f"case{i}"
        damaged_copy(root, src, seg_i, mut)
        f.cases += 1
        check_unrecovered_reads(f, root, src, seg_i, mut, where)
        shutil.rmtree(root)
    f.check()


def test_read_columns_terminates_when_offsets_go_backwards(tmp_path):
    """Regression found by the fuzzer (CRC-invisible damage, no recovery run yet): the last batch
    of a segment has its base offset bit-flipped downwards. A read must finish (raise or return),
    not loop forever."""
    case = "m2-none-create-0"
    src = _writable_copy(GOLDEN / case, tmp_path)
    seg = sorted(src.glob("*.log"))[0]
    buf = bytearray(seg.read_bytes())
    last = list(iter_headers(buf))[-1]
    struct.pack_into(">q", buf, last.position, 0)    # base offset 235 -> 0: outside the CRC
    seg.write_bytes(bytes(buf))
    log = PartitionLog(open_storage(str(tmp_path), fsync=False), case)
    out = attempt(lambda: log.read_columns(0), "read_columns(0)")
    assert not out.bad, (
        "BUG pyspark_kafkalog/log/partition.py PartitionLog.read_columns: when the last entry of "
        "a read chunk has offsets below the requested offset (here the base offset of the last "
        f"batch of {case}/{seg.name}, at byte {last.position}, was set to 0; the field is outside "
        "the CRC), `offset = last.last_offset + 1` moves backwards and the loop re-reads the same "
        f"chunk forever. Got {out.describe()}")


# -- (c) damaged index files -----------------------------------------------------------------------

def index_answers(log: PartitionLog, targets: List[int], probes: List[int]) -> dict:
    out = {"log_end_offset": log.log_end_offset}
    out["read_columns(lso)"] = columns_rows(log.read_columns(log.log_start_offset))
    for o in probes:
        out[f"read_columns({o}, {o + 4}, max_bytes=1)"] = columns_rows(
            log.read_columns(o, o + 4, max_bytes=1))
        data, base = log.read(o, 1)
        out[f"read({o}, 1)"] = (base, [full(r) for r in decode_records(data)])
    for t in targets:
        out[f"offset_for_timestamp({t})"] = log.offset_for_timestamp(t)
    return out


def brute_offset_for_timestamp(records, lso: int, t: int):
    for r in records:
        if r.offset >= lso and r.timestamp >= t:
            return r.offset, r.timestamp
    return None


def mutate_index(data: bytes, entry: int, rng: random.Random, other: Path) -> Mutation:
    kinds = ["flip", "flip", "overwrite", "truncate", "insert", "zeros", "delete", "swap",
             "duplicate"]
    kind = rng.choice(kinds)
    if kind == "zeros":      # Kafka's pre-allocated tail after an unclean shutdown
        n = entry * rng.randrange(1, 20)
        return Mutation(kind, f"append {n} zero bytes", data + bytes(n), len(data), ())
    if kind == "delete":
        return Mutation(kind, "delete the file", b"", 0, ())
    if kind == "swap":
        return Mutation(kind, f"replace with a copy of {other.name}", read_or_empty(other), 0,
                        ())
    if kind == "duplicate" and len(data) >= entry:
        i = rng.randrange(len(data) // entry) * entry
        return Mutation(kind, f"duplicate the entry at {i}",
                        data[:i + entry] + data[i:], i, ())
    if not data:
        return Mutation("insert", "write 1 garbage entry into the empty file",
                        _garbage(rng, entry), 0, ())
    return mutate(data, rng, ("flip", "overwrite", "truncate", "insert"))


def read_or_empty(path: Path) -> bytes:
    return path.read_bytes() if path.exists() else b""


def test_damaged_index_files(sources, tmp_path):
    """Indexes are derived: with damaged .index/.timeindex files every read and timestamp lookup
    answers exactly as with good ones (or, at worst, raises a KafkaLogError: counted separately),
    and recover() rewrites them byte-identical to rebuilt ones."""
    f = Findings("test_damaged_index_files")
    reference: Dict[str, tuple] = {}
    for i in range(150 * SCALE):
        if f.full:
            break
        rng = case_rng("index", i)
        src = rng.choice(sources)
        p = pristine(src)
        if src.name not in reference:
            clean = tmp_path / f"clean-{src.name}"
            _writable_copy(src.path, clean)
            log = open_log(clean, src)
            lso = log.log_start_offset
            tss = sorted({r.timestamp for r in p.records})
            targets = sorted({-1, tss[0] - 1, tss[-1] + 1} | {
                t + d for t in random.Random(f"{SEED}:{src.name}").sample(tss, min(12, len(tss)))
                for d in (-1, 0, 1)})
            offs = [r.offset for r in p.records]
            probes = sorted(set(random.Random(f"{SEED}:{src.name}:o").sample(
                offs, min(10, len(offs)))) | {offs[0], offs[-1]})
            good = index_answers(log, targets, probes)
            # sanity: with good indexes the lookup is the brute-force answer
            for t in targets:
                want = brute_offset_for_timestamp(p.records, lso, t)
                if good[f"offset_for_timestamp({t})"] != want:
                    f.add("offset_for_timestamp with pristine indexes != brute force",
                          f"{src.name}: target {t}: got {good[f'offset_for_timestamp({t})']}, "
                          f"want {want}")
            want_all = [full(r)[:6] for r in p.records if not r.is_control and r.offset >= lso]
            if good["read_columns(lso)"] != want_all:
                f.add("read_columns with pristine indexes != all records", src.name)
            reference[src.name] = (targets, probes, good)
        targets, probes, good = reference[src.name]

        root = tmp_path / f"case{i}"
        _writable_copy(src.path, root)
        descs = []
        for _ in range(rng.choice((1, 1, 2))):
            seg = rng.choice(p.segments)
            suffix, entry = rng.choice(((".index", 8), (".timeindex", 12)))
            path = root / src.name / (seg.name[:20] + suffix)
            other = root / src.name / (rng.choice(p.segments).name[:20] + suffix)
            mut = mutate_index(read_or_empty(path), entry, rng, other)
            if mut.kind == "delete":
                path.unlink(missing_ok=True)
            else:
                path.write_bytes(mut.data)
            descs.append(f"{path.name}: {mut.desc}")
        where = f"case {i}: {src.name}: " + "; ".join(descs)
        damaged_kinds = " and ".join(sorted({d.split(":")[0].split(".")[1] for d in descs}))
        damaged_kinds = ".index and .timeindex" if "and" in damaged_kinds else "." + damaged_kinds
        f.cases += 1

        log = open_log(root, src)
        out = attempt(lambda: index_answers(log, targets, probes), f"reads ({where})")
        if out.bad:
            f.add(f"reads with damaged indexes: {out.kind}", f"{where} -> {out.describe()}")
        elif out.kind == "error":
            f.add("reads of an intact log raise because an index is damaged (indexes are "
                  "derived and must not make good data unreadable)",
                  f"{where} -> {out.describe()}")
        else:
            for key, want in good.items():
                got = out.value[key]
                if got != want:
                    if isinstance(want, list):
                        detail = first_difference(got, want)
                    else:
                        detail = f"got {str(got)[:120]}, want {str(want)[:120]}"
                    f.add(f"a damaged {damaged_kinds} silently changed what "
                          f"{key.split('(')[0]} returns", f"{where}: {key}: {detail}")
                    break
        # recover() rewrites the indexes; afterwards everything answers as before
        out = attempt(lambda: open_log(root, src).recover(), f"recover ({where})")
        if out.kind != "ok":
            f.add(f"recover() with damaged indexes: {out.kind}", f"{where} -> {out.describe()}")
            continue
        if out.value.truncated_bytes:
            f.add("recover() truncated an intact log because of a damaged index", where)
        log = open_log(root, src)
        for problem in index_mismatches(log):
            f.add("indexes differ from rebuilt ones after recover()", f"{where}: {problem}")
        out = attempt(lambda: index_answers(open_log(root, src), targets, probes),
                      f"reads after recover ({where})")
        if out.kind != "ok" or out.value != good:
            f.add("reads after recover() differ from the pristine log",
                  f"{where} -> {out.describe()}")
        shutil.rmtree(root)
    f.check()


def test_append_repairs_damaged_active_segment_index(sources, tmp_path):
    """The append path promises "index == what Kafka's recovery rebuilds" for every segment it
    writes: appending to a log whose active-segment index files are damaged must leave them
    byte-identical to rebuilt ones, and the appended records readable at the right offsets."""
    f = Findings("test_append_repairs_damaged_active_segment_index")
    for i in range(60 * SCALE):
        if f.full:
            break
        rng = case_rng("append-index", i)
        src = rng.choice(sources)
        p = pristine(src)
        root = tmp_path / f"case{i}"
        _writable_copy(src.path, root)
        seg = p.segments[-1]
        suffix, entry = rng.choice(((".index", 8), (".timeindex", 12)))
        path = root / src.name / (seg.name[:20] + suffix)
        other = root / src.name / (p.segments[0].name[:20] + suffix)
        mut = mutate_index(path.read_bytes(), entry, rng, other)
        if mut.kind == "delete":
            path.unlink()
        else:
            path.write_bytes(mut.data)
        where = f"case {i}: {src.name}: {path.name}: {mut.desc}"
        f.cases += 1
        log = open_log(root, src)
        leo = p.segments[-1].headers[-1].last_offset + 1
        recs = [Record(b"k%d" % j, b"v%d" % j, T0 + j) for j in range(3)]
        out = attempt(lambda: log.append([encode_batch_v2(recs)], now_ms=T0),
                      f"append ({where})")
        if out.kind != "ok":
            f.add(f"append to a log with a damaged active index: {out.kind}",
                  f"{where} -> {out.describe()}")
            continue
        if out.value.first_offset != leo:
            f.add("append with a damaged index started at the wrong offset",
                  f"{where}: first offset {out.value.first_offset}, log end offset was {leo}")
        log = open_log(root, src)
        for problem in index_mismatches(log):
            f.add("a damaged index survives an append (index != rebuilt)", f"{where}: {problem}")
        rows = attempt(lambda: segment_rows(log), f"decode ({where})")
        if rows.kind != "ok" or [full(r) for r in rows.value[:len(p.records)]] != [
                full(r) for r in p.records]:
            f.add("append with a damaged index changed earlier records",
                  f"{where} -> {rows.describe()}")
        shutil.rmtree(root)
    f.check()


# -- the index bugs above, one deterministic reproduction each -------------------------------------
# m2-none-create-0 (golden, Kafka-written): segments 0, 263 and 481, offsets 0..707.
# Segment 0's .index is [(78, 40477), (80, 62560), (93, 106133), ...] (offset, position), its
# .timeindex [(1700001407101, 50)]; segment 481's last .index entry is (653, 156626).

IDX_CASE = "m2-none-create-0"


def _golden_with(tmp_path: Path, name: str, patch) -> PartitionLog:
    d = _writable_copy(GOLDEN / IDX_CASE, tmp_path)
    path = d / name
    if patch is None:
        path.unlink()
    else:
        buf = bytearray(path.read_bytes())
        patch(buf)
        path.write_bytes(bytes(buf))
    return PartitionLog(open_storage(str(tmp_path), fsync=False), IDX_CASE)


def test_index_entry_pointing_inside_a_batch_keeps_log_end_and_appends_right(tmp_path):
    # last entry of the active segment's .index: (653, 156626) -> (653, 156627), one byte into
    # the batch 652..653 (still ascending, so it passes every sanity check)
    log = _golden_with(tmp_path, "00000000000000000481.index",
                       lambda b: struct.pack_into(">ii", b, 24, 653 - 481, 156627))
    bug = ("BUG pyspark_kafkalog/log/segment.py LogSegment.next_offset: it walks from the last "
           "offset-index entry's position; when that position is inside a batch the walk raises "
           "CorruptRecordError, which next_offset swallows, answering offsets[-1] + 1 = 654. ")
    assert log.log_end_offset == 708, bug + f"log_end_offset is {log.log_end_offset}, not 708"
    n = len(log.read_columns(0))
    assert n == 708, bug + f"read_columns(0) silently returns {n} of 708 records"
    first = log.append([encode_batch_v2([Record(b"k", b"v", T0)])], now_ms=T0).first_offset
    assert first == 708, bug + f"append wrote at offset {first}: offsets 654.. now appear twice"


def test_index_entry_with_a_later_position_does_not_skip_records(tmp_path):
    # .index entry #1 of segment 0: (80, 62560) -> (80, 62672), the position of the NEXT batch
    log = _golden_with(tmp_path, "00000000000000000000.index",
                       lambda b: struct.pack_into(">ii", b, 8, 80, 62672))
    got = list(log.read_columns(80, 81).offset)
    assert got == [80], (
        "BUG pyspark_kafkalog/log/segment.py LogSegment.find_batch/lookup_position: an index "
        "entry is trusted without checking that the entry at its position holds its offset, so "
        f"read_columns(80, 81) silently returns {got} instead of [80] (record 80 skipped)")


def test_timeindex_entry_with_a_wrong_offset_does_not_change_lookups(tmp_path):
    # segment 0's only .timeindex entry: (1700001407101, 50) -> (1700001407101, 262)
    log = _golden_with(tmp_path, "00000000000000000000.timeindex",
                       lambda b: struct.pack_into(">qi", b, 0, 1700001407101, 262))
    got = log.offset_for_timestamp(1700001407101)
    assert got == (39, 1700001407101), (
        "BUG pyspark_kafkalog/log/segment.py LogSegment.find_offset_by_timestamp: the time-index "
        "entry's offset is trusted as the scan start, so offset_for_timestamp(1700001407101) "
        f"silently answers {got} instead of (39, 1700001407101)")


def test_append_with_a_missing_timeindex(tmp_path):
    log = _golden_with(tmp_path, "00000000000000000481.timeindex", None)
    out = attempt(lambda: log.append([encode_batch_v2([Record(b"k", b"v", T0)])], now_ms=T0),
                  "append")
    assert out.kind == "ok", (
        "BUG pyspark_kafkalog/log/segment.py LogSegment._write_indexes: with the active "
        "segment's .timeindex missing (an index is derived data; Kafka rebuilds it), append "
        f"fails: {out.describe()}")
    assert out.value.first_offset == 708
    assert index_mismatches(log) == []


def test_recover_does_not_keep_a_magic1_wrapper_below_its_inner_offsets(tmp_path):
    """Regression found by the fuzzer: m1-gzip-create-0's first entry is a magic 1 gzip wrapper
    with offset 40 holding 41 records (inner offsets 0..40). Flipping bit 3 of its offset field
    (outside the CRC) gives 32: decoding rightly raises ("wrapper offset 32 is below its last
    inner offset 40"), but recover() keeps the entry, since 32 is still above the segment's
    "previous offset" -1, so the log stays unreadable after recovery."""
    case = "m1-gzip-create-0"
    d = _writable_copy(GOLDEN / case, tmp_path)
    seg = d / "00000000000000000000.log"
    buf = bytearray(seg.read_bytes())
    assert struct.unpack_from(">q", buf, 0)[0] == 40
    buf[7] ^= 1 << 3
    seg.write_bytes(bytes(buf))
    log = PartitionLog(open_storage(str(tmp_path), fsync=False), case)
    report = log.recover()
    out = attempt(lambda: decode_records(seg.read_bytes()), "decode after recover")
    assert out.kind == "ok", (
        "BUG pyspark_kafkalog/log/segment.py LogSegment.recover: for a compressed magic 1 "
        "wrapper it checks only the wrapper (last) offset, not that the implied first offset "
        "(wrapper offset - last inner offset) is >= 0 / above the previous entry, so it keeps an "
        f"entry that cannot be decoded (valid_bytes {report.segments[0].valid_bytes}); after "
        f"recover() the segment gives {out.describe()}")
