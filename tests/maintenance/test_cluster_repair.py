"""`kafkalog --cluster URL repair`: a damaged committed segment is replaced by its intact batches
(never in place: a reader mapping the old file keeps it), lost offsets become a gap readers step
over, indexes are rebuilt as Kafka would, and the report names what was lost. Before it, reads
fail with a CRC error naming the file and this command."""
from __future__ import annotations

import base64
import hashlib
import json
import mmap
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pyspark_kafkalog.admin import Admin
from pyspark_kafkalog.client.producer import Producer
from pyspark_kafkalog.errors import (CorruptRecordError, OffsetOutOfRangeError,
                                     UnsupportedVersionError)
from pyspark_kafkalog.format.batch import iter_headers
from pyspark_kafkalog.format.records import Record

REPO = Path(__file__).resolve().parents[2]
COMMITS, PER_COMMIT, PER_BATCH = 4, 12, 3       # each commit: one segment of four batches


def run_cli(*argv, stdin: str = ""):
    proc = subprocess.run([sys.executable, "-m", "pyspark_kafkalog.cli.main", *map(str, argv)],
                          input=stdin, capture_output=True, text=True, timeout=180,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    return proc.returncode, proc.stdout, proc.stderr


def value(offset: int) -> bytes:
    return b"record-%03d-" % offset * 8


def tree(root: Path) -> dict:
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for f in files:
            p = os.path.join(dirpath, f)
            st = os.stat(p)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, root)] = (st.st_size, st.st_ino,
                                                 hashlib.sha256(fh.read()).hexdigest())
    return out


def make_cluster(root: Path, magic: int = 2) -> Admin:
    """Topic t, partition 0: COMMITS commits, each its own segment of several batches."""
    admin = Admin(str(root))
    admin.create_topic("t", 2, configs={"segment.bytes": "1000000", "index.interval.bytes": "200",
                                        "message.format.version": str(magic)})
    for c in range(COMMITS):
        base = c * PER_COMMIT
        Producer(admin.cluster).produce(
            "t", [Record(None, value(base + i), 1_700_000_000_000 + base + i)
                  for i in range(PER_COMMIT)], partition=0, batch_records=PER_BATCH)
    return admin


def segments(root: Path):
    return sorted((root / "logdir-0" / "t-0").glob("*.log"))


def flip(path: Path, position: int, mask: int = 0x01) -> None:
    """Bit rot, simulated in place (as a disk would do it)."""
    with open(path, "r+b") as f:
        f.seek(position)
        b = f.read(1)[0]
        f.seek(position)
        f.write(bytes([b ^ mask]))


def batches(path: Path):
    return list(iter_headers(path.read_bytes()))


def consumed_offsets(out: str):
    return [json.loads(line)["offset"] for line in out.splitlines()]


def spark_less_read(root: Path):
    """The Spark source's executor half, without Spark: plan the topic, read every range."""
    from pyspark_kafkalog.connector.range_reader import read_range
    from pyspark_kafkalog.connector.read_plan import plan
    from pyspark_kafkalog.connector.sources import open_source
    from pyspark_kafkalog.spark.read_options import ReadOptions
    opts = ReadOptions.parse({"path": str(root), "assign": '{"t": [0]}'})
    return [(o, v) for task in plan(open_source(str(root)), opts)
            for b in read_range(task, include_headers=False)
            for o, v in zip(b.column("offset").to_pylist(), b.column("value").to_pylist())]


@pytest.mark.slow
def test_repair_replaces_a_corrupt_segment_without_touching_the_old_file(tmp_path):
    root = tmp_path / "kl"
    make_cluster(root)
    segs = segments(root)
    assert len(segs) == COMMITS
    damaged = segs[1]                       # offsets 12..23, batches of 3
    hs = batches(damaged)
    assert [(h.base_offset, h.last_offset) for h in hs] == [(12, 14), (15, 17), (18, 20),
                                                            (21, 23)]
    flip(damaged, hs[1].position + hs[1].size // 2)          # inside batch 15..17's records
    total = COMMITS * PER_COMMIT
    lost = [15, 16, 17]

    # consume fails, naming the file and the repair command; so does the Spark reader
    rc, out, err = run_cli("--cluster", root, "consume", "--topic", "t", "--partition", 0)
    assert rc == 1 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert "CorruptRecordError" in err and "CRC" in err
    assert f"{damaged.relative_to(root)}: record batch at position {hs[1].position}" in err
    assert "repair --topic t --partition 0" in err
    with pytest.raises(CorruptRecordError, match=damaged.name + ".*repair --topic t"):
        spark_less_read(root)

    # --dry-run reports and changes nothing
    before = tree(root)
    rc, out, err = run_cli("--cluster", root, "repair", "--topic", "t", "--dry-run")
    assert rc == 0, err
    assert "t-0: 3 record(s) would be lost, offsets 15 to 17." in out
    assert "Would repair 1 of" in out
    assert tree(root) == before

    # a reader holding the old file (a mapping of it) while the repair runs
    old_bytes = damaged.read_bytes()
    fd = os.open(damaged, os.O_RDONLY)
    try:
        mapped = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
        old_stat = os.fstat(fd)
        rc, out, err = run_cli("--json", "--cluster", root, "repair", "--topic", "t")
        assert rc == 0, err
        (row,) = [json.loads(line) for line in out.splitlines()]
        assert row == {"topic": "t", "partition": 0, "segment": str(damaged.relative_to(root)),
                       "action": "replace", "lost_offsets": [[15, 17]], "records_lost": 3,
                       "error": row["error"]}
        assert "CRC" in row["error"]
        # the old inode was neither truncated nor rewritten: the mapping reads what it read
        assert os.fstat(fd).st_ino == old_stat.st_ino
        assert os.fstat(fd).st_size == old_stat.st_size == len(old_bytes)
        assert mapped[:] == old_bytes
        assert os.stat(damaged).st_ino != old_stat.st_ino        # the name is a new file
        mapped.close()
    finally:
        os.close(fd)
    after = tree(root)
    for seg in segs:
        if seg != damaged:   # the other segments are the very same files
            for suffix in (".log", ".index", ".timeindex"):
                key = str(seg.with_suffix(suffix).relative_to(root))
                assert after[key] == before[key], key

    # everything outside the lost range reads back, by consume, Admin.consume and Spark's reader
    expected = [o for o in range(total) if o not in lost]
    rc, out, err = run_cli("--cluster", root, "consume", "--topic", "t", "--partition", 0)
    assert rc == 0, err
    assert consumed_offsets(out) == expected
    assert [base64.b64decode(json.loads(line)["value"]) for line in out.splitlines()] == \
        [value(o) for o in expected]
    admin = Admin(str(root), create=False)
    assert [(r.offset, r.value) for r in admin.consume("t", 0)] == [(o, value(o)) for o in expected]
    assert spark_less_read(root) == [(o, value(o)) for o in expected]
    rc, out, err = run_cli("--cluster", root, "consume", "--topic", "t", "--partition", 0,
                           "--from", 16)
    assert rc == 0 and consumed_offsets(out) == list(range(18, total)), err
    # the metadata is as it was: same high watermark, same log start offset
    assert admin.describe_topic("t").partitions[0].high_watermark == total
    assert admin.describe_topic("t").partitions[0].log_start_offset == 0

    # the new files pass Kafka's checks, and a second repair finds nothing to do
    files = [str(damaged.with_suffix(s)) for s in (".log", ".index", ".timeindex")]
    rc, out, err = run_cli("dump", "--index-sanity-check", "--files", ",".join(files))
    assert rc == 0 and out.count("passed sanity check") == 3, (out, err)
    rc, out, err = run_cli("dump", "--verify-index-only", "--files", ",".join(files))
    assert rc == 0, (out, err)
    rc, out, err = run_cli("dump", "--deep-iteration", "--json", "--files", files[0])
    assert rc == 0, err
    assert [json.loads(line)["offset"] for line in out.splitlines()] == [12, 13, 14] + list(
        range(18, 24))
    before = tree(root)
    rc, out, err = run_cli("--cluster", root, "repair", "--topic", "t")
    assert rc == 0 and out.startswith("No damage found: 4 segment(s) of 2 partition(s)"), out
    assert tree(root) == before


def _damage_length_field(seg: Path):
    h = batches(seg)[1]
    flip(seg, h.position + 9, 0x40)          # the batch's size field: no way to the next one
    return list(range(15, 24)), True


def _truncate_tail(seg: Path):
    data = seg.read_bytes()
    h = batches(seg)[2]
    os.unlink(seg)                           # a damaged copy: a shorter file under the name
    seg.write_bytes(data[:h.position + 30])
    return list(range(18, 24)), True


def _cut_at_a_batch_boundary(seg: Path):
    data = seg.read_bytes()
    h = batches(seg)[3]
    os.unlink(seg)
    seg.write_bytes(data[:h.position])       # every batch intact, but offsets 21..23 missing
    return [21, 22, 23], True


def _damage_base_offset(seg: Path):
    h = batches(seg)[2]
    flip(seg, h.position + 7)                # outside the CRC: only the offset checks see it
    return [18, 19, 20], True                # 19..21, then 21..23: offsets stop increasing


@pytest.mark.parametrize("damage", [_damage_length_field, _truncate_tail,
                                    _cut_at_a_batch_boundary, _damage_base_offset])
def test_repair_loses_only_what_cannot_be_read(tmp_path, damage):
    root = tmp_path / "kl"
    admin = make_cluster(root)
    seg = segments(root)[1]
    lost, reads_fail = damage(seg)
    if reads_fail:   # a CRC or size error; offsets missing from an intact file read as lost
        with pytest.raises((CorruptRecordError, OffsetOutOfRangeError)):
            list(admin.consume("t", 0))
    (report, _) = admin.repair_partition("t", dry_run=False)
    assert [(r.first_offset, r.last_offset) for r in report.lost] == [(lost[0], lost[-1])]
    assert report.records_lost == len(lost)
    expected = [o for o in range(COMMITS * PER_COMMIT) if o not in lost]
    assert [(r.offset, r.value) for r in admin.consume("t", 0)] == [(o, value(o)) for o in expected]
    assert [o for o, _ in spark_less_read(root)] == expected
    files = [str(seg.with_suffix(s)) for s in (".log", ".index", ".timeindex")]
    rc, out, err = run_cli("dump", "--index-sanity-check", "--files", ",".join(files))
    assert rc == 0, (out, err)
    assert not any(r.changed for r in admin.repair_partition("t"))


def test_repair_rebuilds_damaged_indexes_and_loses_nothing(tmp_path):
    root = tmp_path / "kl"
    admin = make_cluster(root)
    segs = segments(root)
    index = segs[0].with_suffix(".index")
    assert index.stat().st_size >= 16
    flip(index, 9, 0x7f)                     # the second entry's relative offset
    segs[2].with_suffix(".timeindex").unlink()
    logs_before = {s: (s.stat().st_ino, s.read_bytes()) for s in segs}
    (report, _) = admin.repair_partition("t", dry_run=True)
    assert [(s.path.rsplit("/", 1)[-1], s.action) for s in report.changed] == [
        (segs[0].name, "indexes"), (segs[2].name, "indexes")]
    assert not segs[2].with_suffix(".timeindex").exists()
    (report, _) = admin.repair_partition("t")
    assert report.records_lost == 0 and len(report.changed) == 2
    assert {s: (s.stat().st_ino, s.read_bytes()) for s in segs} == logs_before
    for seg in segs:
        files = [str(seg.with_suffix(s)) for s in (".log", ".index", ".timeindex")]
        rc, out, err = run_cli("dump", "--index-sanity-check", "--files", ",".join(files))
        assert rc == 0, (out, err)
    assert len(list(admin.consume("t", 0))) == COMMITS * PER_COMMIT


def test_magic_1_loses_a_gap_but_refuses_a_loss_at_a_segment_end(tmp_path):
    """Magic 0/1 has no empty entry to mark lost offsets: a gap between kept messages is fine
    (readers step over it), a loss at the end of a segment is refused with nothing changed."""
    root = tmp_path / "kl"
    admin = make_cluster(root, magic=1)
    segs = segments(root)
    hs = batches(segs[1])                    # one entry per message: offsets 12..23
    assert [h.last_offset for h in hs] == list(range(12, 24))
    flip(segs[1], hs[3].position + 30)       # offset 15
    intact = segs[2].read_bytes()
    flip(segs[2], batches(segs[2])[-1].position + 30)      # offset 35, the last of its segment
    before = tree(root)
    rc, out, err = run_cli("--cluster", root, "repair", "--topic", "t")
    assert rc == 1 and "UnsupportedVersionError" in err and "offsets 35..35" in err, err
    assert tree(root) == before
    with pytest.raises(UnsupportedVersionError):
        admin.repair_partition("t", 0, dry_run=True)
    # restore the last segment; now only the gap at 15 is lost
    segs[2].unlink()
    segs[2].write_bytes(intact)
    (report,) = admin.repair_partition("t", 0)
    assert [(r.first_offset, r.last_offset) for r in report.lost] == [(15, 15)]
    assert [r.offset for r in admin.consume("t", 0)] == [o for o in range(48) if o != 15]


@pytest.mark.parametrize("magic", [2, 1])
def test_committed_offsets_no_file_holds_get_a_segment_of_one_empty_batch(tmp_path, magic):
    """A machine crash can take a whole unflushed write's files (docs/protocol.md §3,
    "Durability"): the first segment (its indexes left behind) and a later one, here. Reads
    fail naming the offset and the repair; the repair creates a segment of one empty batch for
    each run (indexes replaced first, a dry run changes nothing), and readers step over it. Magic
    0/1 has no empty batch: refused, nothing changed."""
    root = tmp_path / "kl"
    admin = make_cluster(root, magic=magic)
    segs = segments(root)
    segs[0].unlink()                                   # its .index and .timeindex stay
    for suffix in (".log", ".index", ".timeindex"):
        segs[2].with_suffix(suffix).unlink()
    with pytest.raises(OffsetOutOfRangeError, match=r"offset 0 .*repair --topic t --partition 0"):
        list(admin.consume("t", 0))
    before = tree(root)
    if magic < 2:
        rc, out, err = run_cli("--cluster", root, "repair", "--topic", "t")
        assert rc == 1 and "UnsupportedVersionError" in err and "nothing was changed" in err, err
        assert tree(root) == before
        return
    rc, out, err = run_cli("--cluster", root, "repair", "--topic", "t", "--dry-run")
    assert rc == 0, err
    assert tree(root) == before
    (report, other) = admin.repair_partition("t")
    # one writer's commits make one committed range: the segment before the second loss grows
    assert [(s.action, s.base_offset) for s in report.changed] == [("create", 0), ("replace", 12)]
    assert [(r.first_offset, r.last_offset) for r in report.lost] == [(0, 11), (24, 35)]
    assert not other.changed
    kept = [o for o in range(48) if not (o < 12 or 24 <= o < 36)]
    assert [r.offset for r in admin.consume("t", 0)] == kept
    assert [o for o, _ in spark_less_read(root)] == kept
    assert [h.record_count for h in batches(segs[0])] == [0]
    (again, _) = admin.repair_partition("t")
    assert not again.changed                            # the indexes it wrote agree


def test_repair_command_line_errors(tmp_path):
    root = tmp_path / "kl"
    make_cluster(root)
    for argv, needle in ((["--topic", "nope"], "UnknownTopicOrPartitionError"),
                         (["--topic", "t", "--partition", 5], "UnknownTopicOrPartitionError"),
                         (["--topic", "t", "--partition", -1], "--partition")):
        rc, out, err = run_cli("--cluster", root, "repair", *argv)
        assert rc == 2 and needle in err and len(err.splitlines()) == 1, err
    rc, out, err = run_cli("--cluster", tmp_path / "none", "repair", "--topic", "t")
    assert rc == 2 and "not a kafkalog cluster" in err and not (tmp_path / "none").exists()


def test_a_damaged_segment_names_the_read_only_check_first(tmp_path):
    """Issue #36: the message a reader gets names `dump --index-sanity-check` (which only
    reads), then the repair's --dry-run, then the repair; for a Kafka log dir (a copy), the
    recovery's warning that it rewrites the directory."""
    root = tmp_path / "kl"
    make_cluster(root)
    damaged = segments(root)[1]
    hs = batches(damaged)
    flip(damaged, hs[1].position + hs[1].size // 2)
    with pytest.raises(CorruptRecordError) as info:
        spark_less_read(root)
    msg = str(info.value)
    check = msg.index("dump --index-sanity-check --files")
    dry = msg.index("repair --topic t --partition 0 --dry-run")
    assert check < dry < msg.rindex("replaces it with its intact batches")
    assert "never on a broker's" not in msg
    # the same damage in a plain Kafka log dir (a copy of the partition)
    import shutil
    from pyspark_kafkalog.connector.range_reader import read_range
    from pyspark_kafkalog.connector.read_plan import plan
    from pyspark_kafkalog.connector.sources import open_source
    from pyspark_kafkalog.spark.read_options import ReadOptions
    copy = tmp_path / "copy"
    shutil.copytree(damaged.parent, copy / "t-0")
    opts = ReadOptions.parse({"path": str(copy), "subscribe": "t"})
    with pytest.raises(CorruptRecordError) as info:
        for task in plan(open_source(str(copy)), opts):
            list(read_range(task, include_headers=False))
    msg = str(info.value)
    assert msg.index("dump --index-sanity-check") < msg.index("recover ")
    assert "--dry-run" in msg and "never on a broker's" in msg
