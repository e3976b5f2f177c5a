"""Smoke test for jobs/benchmark.py: the ``format`` section runs end to end on a tiny workload.

It proves the script works (CLI, every case, cross-checks, table, JSON, profile mode); it never
asserts on speed. Performance is measured on demand by running the script itself.
"""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "jobs" / "benchmark.py"
CASES = ["v2-none", "v2-gzip", "v2-snappy", "v2-lz4", "v2-zstd", "v1-none", "v1-gzip"]


pytestmark = pytest.mark.slow   # the benchmark's sections end to end (~40 s)


def _positive(x) -> bool:
    return isinstance(x, float) and math.isfinite(x) and x > 0


def test_format_section_runs_on_a_tiny_workload(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "format", "--records", "120", "--value-bytes", "40",
         "--key-bytes", "8", "--batch-records", "25", "--repeat", "1", "--profile",
         "--json", str(out)],
        capture_output=True, text=True, timeout=600, cwd=str(SCRIPT.parents[1]))
    assert proc.returncode == 0, f"benchmark failed:\n{proc.stdout}\n{proc.stderr}"
    text = proc.stdout
    assert "DECODE" in text and "ENCODE" in text and "PROFILE our decode, v2-lz4" in text
    for case in CASES:
        assert case in text

    res = json.loads(out.read_text())
    assert res["section"] == "format"
    assert res["params"]["records"] == 120 and res["params"]["batches"] == 5
    assert res["checks"] == {case: "ok" for case in CASES}, res["checks"]
    assert [d["case"] for d in res["decode"]] == CASES
    assert [e["case"] for e in res["encode"]] == CASES
    for row in res["decode"] + res["encode"]:
        assert row["records"] == 120
        assert _positive(row["ours_s"]) and _positive(row["ours_records_per_s"])
        assert _positive(row["ours_payload_MB_per_s"])
        assert _positive(row["kp_s"]), f"kafka-python side missing for {row['case']}"
        assert _positive(row["ratio_ours_over_kp"])
    for row in res["decode"]:
        if row["case"] == "v1-none":  # no compressed payloads to decompress
            assert row["ours_decompress_s"] is None
        else:
            assert _positive(row["ours_decompress_s"])
    assert set(res["profile"]) == {"v2-none", "v2-lz4"}
    for prof in res["profile"].values():
        assert prof["top"] and prof["breakdown"]


def test_unknown_case_is_rejected():
    proc = subprocess.run([sys.executable, str(SCRIPT), "format", "--cases", "v9-brotli"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "unknown case" in (proc.stdout + proc.stderr)


def test_spark_sections_run_on_a_tiny_workload(spark):
    """spark-read and spark-write end to end (in this test session's SparkSession): every
    contender returns all rows, and the report renders; never a claim about speed."""
    import argparse
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import bench_spark
    finally:
        sys.path.remove(str(SCRIPT.parent))
    args = argparse.Namespace(rows=4000, partitions=2, value_bytes=20, codec="lz4", repeat=2,
                              dir=None, page_cache=False)
    read = bench_spark.run_spark_read(args)
    assert read["counts"] == {"kafkalog": 4000, "noop-source": 4000, "parquet": 4000}
    assert all(_positive(read[k]) for k in ("ratio_vs_noop", "median_ratio_vs_parquet"))
    assert "ratio vs no-op" in bench_spark.render("spark-read", read)
    write = bench_spark.run_spark_write(args)
    assert write["kafkalog_rows_written"] == 4000 * (1 + args.repeat)   # warm-up + repeats
    assert "ratio vs Parquet" in bench_spark.render("spark-write", write)
    assert _positive(write["ratio_vs_bytes"])
    assert "ratio vs bytes" in bench_spark.render("spark-write", write)


def test_spark_sections_sweep_partition_counts(spark):
    """--topic-partitions: the same rows over topics of each partition count, each count's
    time against the first's; every count reads and writes all rows."""
    import argparse
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import bench_spark
    finally:
        sys.path.remove(str(SCRIPT.parent))
    args = argparse.Namespace(rows=2000, partitions=2, value_bytes=20, codec="none", repeat=1,
                              dir=None, page_cache=False, topic_partitions="2,20",
                              read_option=None, write_option=None, shuffle=False)
    read = bench_spark.run_spark_read(args)
    assert read["rows_read"] == {"2": 2000, "20": 2000}
    ratios = read["median_ratio_vs_first"]
    assert ratios["2"] == 1.0 and _positive(ratios["20"])
    assert "20 partitions" in bench_spark.render("spark-read", read)
    args.compare_topic_config = ["flush.messages=1"]   # and flushed topics, taking turns
    write = bench_spark.run_spark_write(args)
    assert write["rows_written"] == {k: 2000 * 2 for k in ("2", "20", "2-alt", "20-alt")}
    assert write["compare"]["topic_configs"] == {"flush.messages": "1"}
    assert write["compare"]["median_ratio_vs_first"]["2"] == 1.0
    assert "ratio" in bench_spark.render("spark-write", write)
    assert "topic configs {'flush.messages': '1'}" in bench_spark.render("spark-write", write)
    probe = write["file_create_us"]
    assert _positive(probe["before"]) and _positive(probe["after"])
    assert "creating a file here" in bench_spark.render("spark-write", write)


def test_streaming_planning_runs_on_a_small_topic(tmp_path):
    """``streaming --parts planning`` end to end at 200 partitions: every trigger moves exactly
    the partitions produced to, the storage requests are counted (the proxy sees the metadata
    log's reads) and stay within 2 x changed + a constant; never a claim about speed."""
    out = tmp_path / "stream.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "streaming", "--parts", "planning", "--partitions", "200",
         "--triggers", "3", "--changed", "5", "--dir", str(tmp_path), "--json", str(out)],
        capture_output=True, text=True, timeout=600, cwd=str(SCRIPT.parents[1]))
    assert proc.returncode == 0, f"benchmark failed:\n{proc.stdout}\n{proc.stderr}"
    assert "PLANNING in process: 200 partitions" in proc.stdout
    assert "target: requests <= 2 x 5 + 4 = 14" in proc.stdout
    res = json.loads(out.read_text())
    assert res["section"] == "streaming" and res["parts"] == ["planning"]
    plan = res["planning"]
    assert plan["partitions"] == 200 and plan["changed_per_trigger"] == 5
    assert len(plan["per_trigger"]) == 3 and plan["all_offsets_advanced"]
    for row in plan["per_trigger"]:
        # each single-record produce writes its metadata entries, each read once by the poll
        assert 5 < row["latest_offset_requests"] <= 2 * 5 + 4, row
        assert row["latest_offset_by_call"].get("read", 0) > 5
        assert "list" not in row["latest_offset_by_call"], row   # the poll never lists the log
        assert 0 < row["partitions_requests"] <= 2 * 5 + 4, row
        assert row["input_partitions"] >= 1
    assert plan["target"]["requests_ok"] is True
    for key in ("latest_offset_ms", "partitions_ms"):
        assert _positive(plan[key]["median"]) and _positive(plan[key]["p95"])
    assert set(plan["latest_offset_split_median_ms"]) >= {"metadata_poll", "session_fetch",
                                                          "offset_json", "rest"}
    assert not list(tmp_path.glob("kl-stream-bench-*")), "the benchmark's clusters were left"


def test_replication_section_runs_on_a_tiny_workload(tmp_path):
    """``replication`` end to end on two 1 MiB segments: the catch-up copies them all (the pass
    asserts its own segment count), the three latency cases run, and nothing is left behind."""
    out = tmp_path / "repl.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "replication", "--segments", "2", "--segment-mb", "1",
         "--repeat", "1", "--units", "5", "--dir", str(tmp_path / "w"), "--json", str(out)],
        capture_output=True, text=True, timeout=600, cwd=str(SCRIPT.parents[1]))
    assert proc.returncode == 0, f"benchmark failed:\n{proc.stdout}\n{proc.stderr}"
    res = json.loads(out.read_text())
    assert res["catch_up"]["segments"] == 2 and _positive(res["catch_up"]["ratio"])
    assert set(res["latency"]) == {"rf1", "rf2_acks_all", "rf2_acks_1"}
    assert res["latency"]["rf2_acks_all"]["entries_per_unit"] >= 3   # reserve, progress, commit
    assert "catch-up of 2 segments" in proc.stdout


def test_soak_section_runs_on_a_tiny_workload(tmp_path):
    out = tmp_path / "soak.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "soak", "--commits", "1200", "--partitions", "2",
         "--window", "400", "--maintenance-every", "300", "--json", str(out)],
        capture_output=True, text=True, timeout=600, cwd=str(SCRIPT.parents[1]))
    assert proc.returncode == 0, f"benchmark failed:\n{proc.stdout}\n{proc.stderr}"
    assert "soak, full speed" in proc.stdout
    res = json.loads(out.read_text())["full_speed"]
    assert len(res["windows"]) == 3 and res["every_record_once_in_order"]
    # the final cleanup leaves what is live: a merged segment and the head per partition
    assert all(n <= b for n, b in zip(res["segments_after_cleanup"], res["segment_bound"]))
    assert res["entries_after_cleanup"] <= 50 + 1
    assert res["write_amplification"] > 0
