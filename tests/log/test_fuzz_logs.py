"""Fuzzing of damaged logs: segment ``.log`` files and ``.index``/``.timeindex`` files of copies
of the golden cases and of freshly written logs, against an independent model of Kafka's
recovery rule.

The contract, the knobs (``KAFKALOG_FUZZ_SCALE``, ``KAFKALOG_FUZZ_SEED``, ...) and the shared
machinery are in ``fuzz_support.py``.
"""
from __future__ import annotations

import os
import random
import shutil
import stat
import struct
from pathlib import Path
from typing import Dict, List, NamedTuple, Optional, Tuple

import pytest

from support.golden import GOLDEN, UNDAMAGED
from support.fuzz_support import (Findings, INT32_MAX, Mutation, SCALE, SEED, T0, _garbage, attempt,
                          case_rng, first_difference, full, is_invisible, is_prefix, mutate,
                          payload, random_records, touches_invisible)
from pyspark_kafkalog.errors import KafkaLogError
from pyspark_kafkalog.format import codecs
from pyspark_kafkalog.format.batch import iter_headers, read_header
from pyspark_kafkalog.format.columnar import decode_records
from pyspark_kafkalog.format.encode import (EncodedBatch, encode_batch_v2, encode_control_batch,
                                            encode_message_set)
from pyspark_kafkalog.format.records import CONTROL_ABORT, CONTROL_COMMIT, Record
from pyspark_kafkalog.log.config import LogConfig
from pyspark_kafkalog.log.partition import PartitionLog
from pyspark_kafkalog.storage import open_storage



# -- partition sources: golden copies and fresh logs -----------------------------------------------

pytestmark = pytest.mark.slow   # fuzzing of damaged copies of the golden logs (~15 s)


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


@pytest.mark.slow
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


@pytest.mark.slow
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
