"""The entry walk of docs/format.md §2 has one home (``format.batch``: the header layout,
``EntryScan``/``scan_entries`` and their errors): its C mirror agrees with it, one corruption
reads the same in every reader (the scan, the columnar decoder, ``kafkalog dump``, the Spark
range reader, ``consume``), and a flipped bit in a magic 2 base offset (outside the CRC) is
caught instead of returning wrong and duplicate offsets."""
from __future__ import annotations

import json
import os
import re
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from pyspark_kafkalog.admin import Admin
from pyspark_kafkalog.client.producer import Producer
from pyspark_kafkalog.errors import CorruptRecordError
from pyspark_kafkalog.format import batch
from pyspark_kafkalog.format.batch import EntryScan, iter_headers, scan_entries, scan_offsets
from pyspark_kafkalog.format.columnar import decode_columns
from pyspark_kafkalog.format.encode import encode_batch_v2, encode_message_set
from pyspark_kafkalog.format.records import Record

REPO = Path(__file__).resolve().parents[2]
FORMAT_DIR = REPO / "pyspark_kafkalog" / "format"
COMMITS, PER_COMMIT, PER_BATCH = 4, 12, 3       # each commit: one segment of four batches


# -- one layout, mirrored in C ------------------------------------------------------------------

def c_defines(path: Path) -> dict:
    return {m.group(1): int(m.group(2)) for m in re.finditer(
        r"^#define\s+([A-Z0-9_]+)\s+(-?\d+)\s*$", path.read_text(), re.MULTILINE)}


def test_layout_is_kafkas():
    """The named positions are where ``V2_HEADER``'s fields fall, and the legacy ones line up
    with the entry (a message starts LOG_OVERHEAD bytes in)."""
    names = ["BASE_OFFSET_OFFSET", "LENGTH_OFFSET", "PARTITION_LEADER_EPOCH_OFFSET",
             "MAGIC_OFFSET", "CRC_OFFSET", "ATTRIBUTES_OFFSET", "LAST_OFFSET_DELTA_OFFSET",
             "BASE_TIMESTAMP_OFFSET", "MAX_TIMESTAMP_OFFSET", "PRODUCER_ID_OFFSET",
             "PRODUCER_EPOCH_OFFSET", "BASE_SEQUENCE_OFFSET", "RECORDS_COUNT_OFFSET"]
    pos, starts = 0, []
    for code in batch.V2_HEADER.format.lstrip(">"):
        starts.append(pos)
        pos += struct.calcsize(">" + code)
    assert [getattr(batch, n) for n in names] == starts
    assert batch.RECORD_BATCH_OVERHEAD == batch.RECORDS_OFFSET == batch.V2_HEADER.size == 61
    assert batch.LOG_OVERHEAD == 12 == batch.PARTITION_LEADER_EPOCH_OFFSET
    assert batch.LOG_OVERHEAD + batch.LEGACY_CRC_OFFSET == batch.PARTITION_LEADER_EPOCH_OFFSET
    assert batch.LOG_OVERHEAD + batch.LEGACY_MAGIC_OFFSET == batch.MAGIC_OFFSET
    assert batch.LEGACY_HEADER.unpack(bytes(range(18)))[3:] == (
        16, batch.LOG_OVERHEAD + batch.LEGACY_ATTRIBUTES_OFFSET)
    assert batch.RECORD_OVERHEAD_V0 == batch.LEGACY_HEADER_SIZE_V0 + 8
    assert batch.RECORD_OVERHEAD_V1 == batch.LEGACY_HEADER_SIZE_V1 + 8


def test_c_header_mirrors_the_python_layout():
    defines = c_defines(FORMAT_DIR / "_batch_layout.h")
    assert len(defines) >= 25
    for name, value in defines.items():
        assert getattr(batch, name) == value, name
    # and no C file keeps a layout constant of its own
    for src in sorted(FORMAT_DIR.glob("*.[ch]")):
        if src.name != "_batch_layout.h":
            own = set(c_defines(src)) & set(defines)
            assert not own, f"{src.name} redefines {own}: include _batch_layout.h instead"
    assert '#include "_batch_layout.h"' in (FORMAT_DIR / "_columnar_arrow.c").read_text()


# -- the scan -----------------------------------------------------------------------------------

def v2(base: int, n: int = 3) -> bytes:
    return encode_batch_v2([Record(None, b"v%d" % i, 1000 + i) for i in range(n)],
                           base_offset=base).data


def test_scan_allows_gaps_but_not_offsets_that_do_not_increase():
    compacted = v2(0) + v2(10) + v2(20)          # gaps, as compaction leaves them
    assert [(h.base_offset, h.last_offset) for h in scan_entries(compacted)] == [
        (0, 2), (10, 12), (20, 22)]
    overlapping = v2(0) + v2(3) + v2(5)          # 5 <= 5
    got = []
    with pytest.raises(CorruptRecordError) as err:
        for h in scan_entries(overlapping, file="dir/00.log", base_position=1000):
            got.append(h.position)
    second = len(v2(0))
    assert got == [1000, 1000 + second]
    assert err.value.position == 1000 + 2 * second
    assert str(err.value) == (f"dir/00.log: entry at position {1000 + 2 * second} holds "
                              "offsets 5..7, not after the last offset 5 of the entry before it")
    # the last offset before the buffer counts too, and so does a segment's base offset
    with pytest.raises(CorruptRecordError, match="not after the last offset 2 "):
        list(scan_entries(v2(2), previous_last_offset=2))
    # magic 0/1: a message's offset, and a compressed wrapper's (its last) must increase too
    legacy = encode_message_set([Record(None, b"x", 5)] * 3, magic=1, base_offset=7).data
    assert [h.last_offset for h in scan_entries(legacy, previous_last_offset=6)] == [7, 8, 9]
    with pytest.raises(CorruptRecordError, match="offsets 7..7, not after the last offset 9 "):
        list(scan_entries(legacy + legacy))
    wrapper = encode_message_set([Record(None, b"x", 5)] * 3, magic=1, base_offset=7,
                                 compression=1).data
    assert [(h.base_offset, h.last_offset) for h in scan_entries(wrapper)] == [(-1, 9)]
    with pytest.raises(CorruptRecordError, match="offsets 9..9, not after the last offset 9 "):
        list(scan_entries(wrapper + wrapper))


def test_producer_bytes_walk_without_the_offset_rule():
    """A producer's batches each start at offset 0: ``iter_headers`` (and the decoder, a buffer
    reader) walk them; only the log's readers apply the offset rule."""
    produced = v2(0) + v2(0)
    assert [h.base_offset for h in iter_headers(produced)] == [0, 0]
    assert list(decode_columns(produced).offset) == [0, 1, 2, 0, 1, 2]
    with pytest.raises(CorruptRecordError):
        list(scan_entries(produced))


def test_entry_scan_steps_over_a_large_entry_by_its_header():
    """``EntryScan`` checks an entry from its first bytes alone (``LogSegment.walk`` skips a
    batch larger than its window that way), with the same errors as a buffer walk."""
    data = v2(0, 50) + v2(50)
    scan = EntryScan("f.log", -1)
    size = scan.entry_size(data[:61], 0)
    assert scan.header(data[:61], 0).last_offset == 49 and scan.last_offset == 49
    assert scan.header(data[size:size + 61], 0, size).position == size
    with pytest.raises(CorruptRecordError, match=f"^f.log: entry at position {size} holds "):
        EntryScan("f.log", 50).header(data[size:size + 61], 0, size)


def _outcome(walk):
    """What a walk yields before it stops, and how it stops (the error's message, or None)."""
    got = []
    try:
        for item in walk():
            got.append(item)
    except CorruptRecordError as exc:
        return got, (str(exc), exc.position)
    return got, None


def _reference(buf, previous):
    """The walk step by step through ``EntryScan`` (what ``LogSegment.walk`` does)."""
    scan = EntryScan("f.log", previous)
    pos = 0
    while pos + batch.HEADER_SIZE_UP_TO_MAGIC < len(buf):
        size = scan.entry_size(buf, pos)
        if pos + size > len(buf):
            return
        yield scan.header(buf, pos)
        pos += size


def test_the_inlined_walks_agree(tmp_path):
    """``scan_entries`` and ``scan_offsets`` inline ``EntryScan``'s steps for speed, and
    ``LogSegment.walk`` reads a file in windows (stepping over an entry larger than its window
    by the header alone): on damaged bytes all four stop at the same entry with the same
    error."""
    import random
    from pyspark_kafkalog.log.segment import LogSegment
    from pyspark_kafkalog.storage import open_storage
    rng = random.Random(14)
    entries, offset = [], 0
    for i in range(12):
        n = rng.randrange(1, 4)
        recs = [Record(None, b"x" * rng.randrange(0, 300), 1000 + i)] * n
        kind = i % 4
        if kind == 3:
            entries.append(encode_message_set(recs, magic=rng.choice((0, 1)),
                                              base_offset=offset,
                                              compression=rng.choice((0, 1))).data)
        else:
            entries.append(encode_batch_v2(recs, base_offset=offset).data)
        offset += n + rng.choice((0, 0, 2))
    pristine = b"".join(entries)
    storage = open_storage(str(tmp_path), fsync=False)
    for case in range(300):
        buf = bytearray(pristine)
        for _ in range(rng.randrange(1, 3)):
            h = rng.choice(list(iter_headers(pristine)))
            at = h.position + rng.choice([rng.randrange(0, 18), rng.randrange(0, 61)])
            buf[min(at, len(buf) - 1)] ^= 1 << rng.randrange(8)
        if rng.random() < 0.25:           # a size below a magic's minimum, or just wrong
            h = rng.choice(list(iter_headers(pristine)))
            struct.pack_into(">i", buf, h.position + batch.LENGTH_OFFSET,
                             rng.choice((rng.randrange(10, 22), rng.randrange(22, 70))))
        if rng.random() < 0.2:
            del buf[rng.randrange(len(buf)):]
        buf = bytes(buf)
        previous = rng.choice((None, -1, 3))
        where = f"case {case}: {buf.hex()} after {previous}"

        def as_offsets(h):
            return (h.position, h.size, h.base_offset if h.magic == 2 else -1, h.last_offset)
        ref = _outcome(lambda: _reference(buf, previous))
        got = _outcome(lambda: scan_entries(buf, file="f.log", previous_last_offset=previous))
        assert got == ref, where
        offsets = _outcome(lambda: scan_offsets(buf, file="f.log", previous_last_offset=previous))
        assert offsets == ([as_offsets(h) for h in ref[0]], ref[1]), where
        if previous == -1:                # a walk from a segment head of base offset 0
            (tmp_path / "00000000000000000000.log").write_bytes(buf)
            seg = LogSegment(storage, "", 0)
            walked = _outcome(lambda: (h for h, _ in seg.walk(0, window=rng.choice((64, 4096)),
                                                               strict=False)))
            name = "00000000000000000000.log"
            assert walked == ([h for h in ref[0]],
                              ref[1] and (ref[1][0].replace("f.log", name), ref[1][1])), where


# -- one corruption, one error, in every reader -------------------------------------------------

def run_cli(*argv):
    proc = subprocess.run([sys.executable, "-m", "pyspark_kafkalog.cli.main", *map(str, argv)],
                          capture_output=True, text=True, timeout=180,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    return proc.returncode, proc.stdout, proc.stderr


def make_cluster(root: Path) -> Admin:
    admin = Admin(str(root))
    admin.create_topic("t", 1, configs={"segment.bytes": "1000000",
                                        "index.interval.bytes": "200"})
    for c in range(COMMITS):
        base = c * PER_COMMIT
        Producer(admin.cluster).produce(
            "t", [Record(None, b"record-%03d-" % (base + i) * 8, 1_700_000_000_000 + base + i)
                  for i in range(PER_COMMIT)], partition=0, batch_records=PER_BATCH)
    return admin


def spark_less_read(root: Path, **kwargs):
    """The Spark source's executor half, without Spark: plan the topic, read every range."""
    from pyspark_kafkalog.connector.range_reader import read_range
    from pyspark_kafkalog.connector.read_plan import plan
    from pyspark_kafkalog.connector.sources import open_source
    from pyspark_kafkalog.spark.read_options import ReadOptions
    opts = ReadOptions.parse({"path": str(root), "assign": '{"t": [0]}'})
    return [o for task in plan(open_source(str(root)), opts)
            for b in read_range(task, include_headers=False, **kwargs)
            for o in b.column("offset").to_pylist()]


def _patch(seg: Path, position: int, data: bytes) -> None:
    with open(seg, "r+b") as f:
        f.seek(position)
        f.write(data)


def bad_crc(seg, hs):
    h = hs[1]
    _patch(seg, h.end - 5, bytes([seg.read_bytes()[h.end - 5] ^ 0x01]))
    return h.position, "is corrupt: stored CRC"


def bad_length(seg, hs):
    _patch(seg, hs[1].position + batch.LENGTH_OFFSET, struct.pack(">i", 3))
    return hs[1].position, "declares size 3, smaller than the minimum record overhead"


def truncated_tail(seg, hs):
    data = seg.read_bytes()
    seg.unlink()                        # a damaged copy: a shorter file under the name
    seg.write_bytes(data[:hs[2].position + 30])
    return hs[2].position, f"torn entry at position {hs[2].position} (30 of {hs[2].size} bytes)"


def bad_magic(seg, hs):
    _patch(seg, hs[1].position + batch.MAGIC_OFFSET, b"\x03")   # outside the v2 CRC
    return hs[1].position, "has unknown magic 3"


def flipped_base_offset(seg, hs):
    """18 -> 19: batches 12..14, 15..17, 19..21, 21..23. Unchecked, readers return 19, 20, 21,
    21, 22, 23, with the wrong values at 19..21; the batch after the flipped one is where the
    offsets stop increasing."""
    _patch(seg, hs[2].position + batch.BASE_OFFSET_OFFSET + 7, bytes([18 ^ 0x01]))
    return hs[3].position, "holds offsets 21..23, not after the last offset 21"


DAMAGE = [bad_crc, bad_length, truncated_tail, bad_magic, flipped_base_offset]


@pytest.mark.parametrize("damage", DAMAGE, ids=lambda d: d.__name__)
def test_one_corruption_reads_the_same_in_every_reader(tmp_path, damage):
    root = tmp_path / "kl"
    make_cluster(root)
    seg = sorted((root / "logdir-0" / "t-0").glob("*.log"))[1]       # offsets 12..23
    hs = list(iter_headers(seg.read_bytes()))
    assert [(h.base_offset, h.last_offset) for h in hs] == [(12, 14), (15, 17), (18, 20),
                                                            (21, 23)]
    position, what = damage(seg, hs)
    data = seg.read_bytes()

    # the scan's error is the reference: the file, the position, what is wrong
    with pytest.raises(CorruptRecordError) as err:
        list(scan_entries(data, validate_crc=True, strict=True, file=seg.name,
                          previous_last_offset=11))
    reference = str(err.value)
    assert err.value.position == position
    assert reference.startswith(f"{seg.name}: ") and f"at position {position}" in reference
    assert what in reference
    detail = reference[len(seg.name) + 2:]        # the message without the file

    messages = {}
    # the columnar decoder, over the segment's bytes (positions are the file's): a buffer
    # reader cannot tell a torn tail from a read that stopped mid-batch, nor a producer's
    # offsets from a log's, so those two are the file readers' to see
    if damage not in (truncated_tail, flipped_base_offset):
        with pytest.raises(CorruptRecordError) as err:
            decode_columns(data)
        assert err.value.position == position
        messages["decode_columns"] = str(err.value)
    else:
        offsets = list(decode_columns(data).offset)
        assert offsets == ([12, 13, 14, 15, 16, 17] if damage is truncated_tail else
                           [12, 13, 14, 15, 16, 17, 19, 20, 21, 21, 22, 23])
    # the Spark source's range reader: one chunk, and chunks of one batch (the offset rule
    # then spans chunks)
    for max_bytes in (1 << 20, 1):
        with pytest.raises(CorruptRecordError) as err:
            spark_less_read(root, max_bytes=max_bytes)
        messages[f"range reader, max_bytes={max_bytes}"] = str(err.value)
    # kafkalog dump --deep-iteration: the problem on stderr, exit status 1
    rc, out, err_text = run_cli("dump", "--deep-iteration", "--files", seg)
    assert rc == 1, (out, err_text)
    messages["dump"] = err_text.splitlines()[0]
    assert messages["dump"].startswith(f"{seg}: CorruptRecordError: ")
    # kafkalog --cluster URL consume: one line, no traceback
    rc, out, err_text = run_cli("--cluster", root, "consume", "--topic", "t", "--partition", 0)
    assert rc != 0 and len(err_text.splitlines()) == 1 and "Traceback" not in err_text, err_text
    assert "CorruptRecordError" in err_text
    messages["consume"] = err_text

    for reader, message in messages.items():
        assert detail in message, f"{reader}: {message!r} does not say {detail!r}"
        if reader != "decode_columns":
            assert seg.name in message, f"{reader}: {message!r} does not name {seg.name}"
    if damage is flipped_base_offset:
        rc, out, _ = run_cli("dump", "--deep-iteration", "--json", "--files", seg)
        assert [json.loads(line)["offset"] for line in out.splitlines()] == [
            12, 13, 14, 15, 16, 17, 19, 20, 21]     # printed up to the batch the walk refuses


def test_a_flipped_base_offset_is_caught_by_admin_reads_and_repair(tmp_path):
    """The admin API's reads and the log's own fail the same way; repair then replaces the
    segment and every reader agrees again."""
    root = tmp_path / "kl"
    admin = make_cluster(root)
    seg = sorted((root / "logdir-0" / "t-0").glob("*.log"))[1]
    hs = list(iter_headers(seg.read_bytes()))
    position, what = flipped_base_offset(seg, hs)
    with pytest.raises(CorruptRecordError, match=f"{seg.name}: entry at position {position} "
                                                 f"{what}.*repair --topic t"):
        list(admin.consume("t", 0))
    with pytest.raises(CorruptRecordError, match=what):
        admin.cluster.partition_view("t", 0).log.read_columns(12)
    (report,) = admin.repair_partition("t", 0)
    assert [(r.first_offset, r.last_offset) for r in report.lost] == [(18, 20)]
    expected = [o for o in range(COMMITS * PER_COMMIT) if o not in (18, 19, 20)]
    assert [r.offset for r in admin.consume("t", 0)] == expected
    assert spark_less_read(root) == expected
    rc, out, err = run_cli("dump", "--deep-iteration", "--json", "--files", seg)
    assert rc == 0, err
