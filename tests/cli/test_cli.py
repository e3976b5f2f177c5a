"""The kafkalog command: dump, recover and produce, run as real processes where it matters."""
from __future__ import annotations

import base64
import json
import os
import random
import subprocess
import sys

import pytest

from support.golden import DAMAGED, GOLDEN, UNDAMAGED, expected_records
from pyspark_kafkalog.cli.main import main
from pyspark_kafkalog.format.columnar import decode_records
from pyspark_kafkalog.log.logdir import LogDir
from pyspark_kafkalog.log.partition import PartitionLog
from pyspark_kafkalog.storage import open_storage


def run_cli(*argv, stdin: str = ""):
    """The installed console entry point in a real process (exit codes, stdout, stderr)."""
    proc = subprocess.run([sys.executable, "-m", "pyspark_kafkalog.cli.main", *argv],
                          input=stdin, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.getcwd()})
    return proc.returncode, proc.stdout, proc.stderr


def _lines(out):
    return [json.loads(line) for line in out.splitlines() if line.strip()]


@pytest.mark.parametrize("case", UNDAMAGED)
def test_dump_json_matches_expected(case, capsys):
    files = ",".join(str(p) for p in sorted((GOLDEN / case).glob("*.log")))
    rc = main(["dump", "--files", files, "--json", "--deep-iteration", "--print-data-log"])
    out = capsys.readouterr().out
    assert rc == 0
    assert _lines(out) == expected_records(case)


def test_dump_text_follows_kafka_dump_log(capsys):
    seg = GOLDEN / "txn-v2-none-0" / "00000000000000000000.log"
    assert main(["dump", "--files", str(seg), "--deep-iteration"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"Dumping {seg}"
    assert out[1] == "Log starting offset: 0"
    assert out[2].startswith("baseOffset: 0 lastOffset: ")
    assert " isvalid: true" in out[2] and " magic: 2 compresscodec: none" in out[2]
    assert any("endTxnMarker: COMMIT coordinatorEpoch:" in line for line in out)
    assert out[3].startswith("| offset: 0 CreateTime: ")


def test_dump_shows_abort_markers(capsys):
    files = ",".join(str(p) for p in sorted((GOLDEN / "txn-v2-none-0").glob("*.log")))
    assert main(["dump", "--files", files, "--deep-iteration"]) == 0
    assert "endTxnMarker: ABORT" in capsys.readouterr().out


def test_dump_indexes_and_sanity_check(capsys):
    d = GOLDEN / "m2-none-create-0"
    index, timeindex = sorted(d.glob("*.index"))[0], sorted(d.glob("*.timeindex"))[0]
    assert main(["dump", "--files", f"{index},{timeindex}", "--json"]) == 0
    rows = _lines(capsys.readouterr().out)
    assert rows and all(set(r) in ({"offset", "position"}, {"timestamp", "offset"}) for r in rows)
    files = ",".join(str(p) for p in sorted(d.iterdir()) if p.suffix in (".index", ".timeindex", ".log"))
    assert main(["dump", "--files", files, "--index-sanity-check"]) == 0
    out = capsys.readouterr().out
    assert out.count("passed sanity check.") == 9


def test_dump_reports_corruption_with_exit_status(capsys):
    case = "corrupt-v2-none-0"
    seg = GOLDEN / case / json.loads((GOLDEN / case / "expected-recovery.json").read_text())["segment"]
    assert main(["dump", "--files", str(seg), "--deep-iteration"]) == 1
    captured = capsys.readouterr()
    assert "isvalid: false" in captured.out
    assert "CRC" in captured.err


def test_dump_detects_a_wrong_index(tmp_path, capsys):
    src = GOLDEN / "m2-none-create-0"
    for p in src.iterdir():
        (tmp_path / p.name).write_bytes(p.read_bytes())
    index = sorted(tmp_path.glob("*.index"))[0]
    raw = bytearray(index.read_bytes())
    raw[7] ^= 0x10                        # move the first entry's position
    index.write_bytes(bytes(raw))
    assert main(["dump", "--files", str(index), "--verify-index-only"]) == 1
    assert "Mismatches in" in capsys.readouterr().err


@pytest.mark.parametrize("case", DAMAGED)
def test_recover_prints_what_was_cut(case, golden_copy):
    expected = json.loads((GOLDEN / case / "expected-recovery.json").read_text())
    rc, out, err = run_cli("recover", str(golden_copy / case))
    assert rc == 0, err
    report = json.loads(out)
    cut = [s for s in report["segments"] if s["truncated_bytes"]]
    assert [(s["segment"], s["valid_bytes"], s["first_dropped_offset"]) for s in cut] == [
        (expected["segment"], expected["valid_bytes"], expected["first_dropped_offset"])]
    assert report["log_end_offset"] == expected_records(case)[-1]["offset"] + 1
    rc, out, _ = run_cli("recover", str(golden_copy / case))
    assert rc == 0 and json.loads(out)["truncated_bytes"] == 0


def test_recover_dry_run_changes_nothing(golden_copy):
    case = "torn-v2-lz4-0"
    before = {p.name: p.read_bytes() for p in (golden_copy / case).iterdir()}
    rc, out, _ = run_cli("recover", "--dry-run", str(golden_copy / case))
    assert rc == 0 and json.loads(out)["truncated_bytes"] > 0
    assert {p.name: p.read_bytes() for p in (golden_copy / case).iterdir()} == before


def _jsonl(records):
    return "".join(json.dumps(r) + "\n" for r in records)


def _sample_records(n=50, headers=True):
    rng = random.Random(n)
    out = []
    for i in range(n):
        rec = {"key": None if i % 7 == 0 else base64.b64encode(b"key-%d" % i).decode(),
               "value": None if i % 11 == 0 else base64.b64encode(rng.randbytes(i * 37 % 500)).decode(),
               "timestamp": 1_700_000_000_000 + (i * 7919) % 10_000}
        if headers and i % 3 == 0:
            rec["headers"] = [{"key": "h", "value": base64.b64encode(b"x").decode()},
                              {"key": "n", "value": None}]
        out.append(rec)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("magic,codec", [(0, "none"), (0, "gzip"), (0, "snappy"), (0, "lz4"),
                                         (1, "none"), (1, "gzip"), (1, "snappy"), (1, "lz4"),
                                         (2, "none"), (2, "gzip"), (2, "snappy"), (2, "lz4"),
                                         (2, "zstd")])
def test_produce_then_dump_round_trip(tmp_path, magic, codec):
    records = _sample_records(headers=magic == 2)
    rc, out, err = run_cli("produce", "--log-dir", str(tmp_path), "--topic", "orders",
                           "--partition", "3", "--compression", codec,
                           "--message-format-version", str(magic), "--segment-bytes", "4000",
                           "--batch-records", "7", stdin=_jsonl(records))
    assert rc == 0, err
    acks = _lines(out)
    assert acks == [{"topic": "orders", "partition": 3, "offset": i} for i in range(50)]
    # a second producer continues where the first stopped
    rc, out, err = run_cli("produce", "--log-dir", str(tmp_path), "--topic", "orders",
                           "--partition", "3", "--compression", codec,
                           "--message-format-version", str(magic), "--segment-bytes", "4000",
                           stdin=_jsonl(records[:5]))
    assert rc == 0, err and _lines(out)[0]["offset"] == 50
    pdir = tmp_path / "orders-3"
    logs = sorted(pdir.glob("*.log"))
    assert len(logs) > 1
    rc, out, err = run_cli("dump", "--json", "--deep-iteration", "--print-data-log",
                           "--files", ",".join(map(str, logs)))
    assert rc == 0, err
    dumped = _lines(out)
    assert [d["offset"] for d in dumped] == list(range(55))
    for d, r in zip(dumped, records + records[:5]):
        assert d["key"] == r["key"] and d["value"] == r["value"]
        assert d["magic"] == magic
        assert d["timestamp"] == (r["timestamp"] if magic else -1)
        assert d["headers"] == (r.get("headers", []) if magic == 2 else [])
    # a valid Kafka log dir: sanity checks pass, indexes are what Kafka rebuilds, checkpoints agree
    files = ",".join(str(p) for p in sorted(pdir.iterdir()) if p.suffix in (".log", ".index", ".timeindex"))
    rc, out, err = run_cli("dump", "--index-sanity-check", "--files", files)
    assert rc == 0, err
    storage = open_storage(str(tmp_path))
    log = PartitionLog(storage, "orders-3")
    for seg in log.segments:
        assert (storage.read(seg.path(".index")), storage.read(seg.path(".timeindex"))) == seg.rebuilt_indexes()
    logdir = LogDir(storage)
    assert logdir.read_meta()["version"] == "1"
    assert logdir.read_checkpoint("replication-offset-checkpoint") == {("orders", 3): 55}
    assert logdir.read_checkpoint("log-start-offset-checkpoint") == {("orders", 3): 0}
    assert logdir.read_checkpoint("recovery-point-offset-checkpoint") == {("orders", 3): 55}
    assert log.leader_epochs()[0].start_offset == 0
    assert (pdir / "partition.metadata").read_text().startswith("version: 0\ntopic_id: ")


def test_produce_log_append_time(tmp_path):
    rc, out, err = run_cli("produce", "--log-dir", str(tmp_path), "--topic", "t", "--partition",
                           "0", "--timestamp-type", "LogAppendTime", "--compression", "gzip",
                           stdin=_jsonl(_sample_records(5)))
    assert rc == 0, err
    recs = decode_records((tmp_path / "t-0" / "00000000000000000000.log").read_bytes())
    assert {r.timestamp_type for r in recs} == {1} and len({r.timestamp for r in recs}) == 1


@pytest.mark.parametrize("argv,stdin,needle", [
    (["--topic", "bad/name", "--partition", "0"], '{"value": null}\n', "InvalidTopicError"),
    (["--topic", "..", "--partition", "0"], '{"value": null}\n', "InvalidTopicError"),
    (["--topic", "t", "--partition", "-1"], '{"value": null}\n', "--partition"),
    (["--topic", "t", "--partition", "0", "--compression", "brotli"], "", "brotli"),
    (["--topic", "t", "--partition", "0", "--compression", "zstd", "--message-format-version", "1"],
     "", "zstd"),
    (["--topic", "t", "--partition", "0"], '{"value": "%%%"}\n', "line 1: value is not valid base64"),
    (["--topic", "t", "--partition", "0"], '{"value": null}\nnot json\n', "line 2: not valid JSON"),
    (["--topic", "t", "--partition", "0"], '{"valeu": null}\n', "unknown fields ['valeu']"),
    (["--topic", "t", "--partition", "0"], '{"timestamp": "now"}\n', "timestamp must be an integer"),
    (["--topic", "t", "--partition", "0", "--timestamp-type", "Wallclock"], "", "Wallclock"),
    (["--topic", "t", "--partition", "0", "--segment-bytes", "3"], "", "segment.bytes"),
])
def test_produce_rejects_bad_input_and_changes_nothing(tmp_path, argv, stdin, needle):
    log_dir = tmp_path / "ld"
    rc, out, err = run_cli("produce", "--log-dir", str(log_dir), *argv, stdin=stdin)
    assert rc == 2
    assert needle in err
    assert "Traceback" not in err
    assert out == ""
    assert not log_dir.exists() or not any(p.is_dir() for p in log_dir.iterdir())


def test_user_errors_have_no_traceback(tmp_path):
    for argv in (["dump", "--files", str(tmp_path / "missing.log")],
                 ["recover", str(tmp_path / "nope-0")],
                 ["recover", str(tmp_path / "not_a_partition")],
                 ["dump"], ["frobnicate"]):
        rc, out, err = run_cli(*argv)
        assert rc == 2, argv
        assert "Traceback" not in err and err.strip(), argv
