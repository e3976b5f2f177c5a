"""The cluster commands of `kafkalog`: topics, produce, consume, offsets, delete-records,
retention, groups, log-dirs and cleanup, as real processes where exit codes and streams matter and
in-process (`main([...])`) for the rest."""
from __future__ import annotations

import base64
import io
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
from kafka.partitioner.default import murmur2 as kafka_python_murmur2

from pyspark_kafkalog.admin import Admin
from pyspark_kafkalog.cli import cluster_maint
from pyspark_kafkalog.cli.main import main
from pyspark_kafkalog.cli.progress import Progress
from pyspark_kafkalog.client.producer import Producer
from pyspark_kafkalog.format.records import Record

COMMANDS = ["topics", "produce", "consume", "offsets", "delete-records", "retention", "groups",
            "log-dirs", "cleanup"]
RECORD_FIELDS = ["topic", "partition", "offset", "timestamp", "timestampType", "magic", "control",
                 "transactional", "producerId", "key", "value", "headers"]
NOW = int(time.time() * 1000)


def run_cli(*argv, stdin: str = ""):
    proc = subprocess.run([sys.executable, "-m", "pyspark_kafkalog.cli.main", *map(str, argv)],
                          input=stdin, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.getcwd()})
    return proc.returncode, proc.stdout, proc.stderr


@pytest.fixture
def kl(capsys, monkeypatch):
    """`kafkalog ARGV` in this process: (exit status, stdout, stderr)."""
    def run(*argv, stdin: str = ""):
        monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
        try:
            rc = main([str(a) for a in argv])
        except SystemExit as exc:          # argparse: --help, usage errors
            rc = exc.code
        out, err = capsys.readouterr()
        return rc, out, err
    return run


@pytest.fixture
def root(tmp_path) -> Path:
    return tmp_path / "kl"


@pytest.fixture
def url(root, kl) -> str:
    """A cluster holding topic `t` with 3 partitions."""
    rc, out, err = kl("--cluster", root, "topics", "--create", "--topic", "t", "--partitions", 3)
    assert (rc, out) == (0, "Created topic t.\n"), err
    return str(root)


def lines(out: str):
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def b64(b):
    return None if b is None else base64.b64encode(b).decode()


def jsonl(records) -> str:
    return "".join(json.dumps(r) + "\n" for r in records)


def state_files(root: Path) -> dict:
    """Everything a command could change (derived metadata snapshots aside)."""
    if not root.exists():
        return {}
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and not p.name.endswith(".snapshot.json")}


def user_error(rc, out, err, needle):
    assert rc == 2, (out, err)
    assert needle in err, err
    assert "Traceback" not in err
    assert out == ""
    assert err.startswith("kafkalog: error: ") or "usage:" in err


def produce(kl, url, records, *args):
    rc, out, err = kl("--cluster", url, "--json", "produce", "--topic", "t", *args,
                      stdin=jsonl(records))
    assert rc == 0, err
    return lines(out)


def keyed(n, seed=1, ts=None):
    rng = random.Random(seed)
    return [{"key": b64(b"user-%d" % rng.randrange(1000)), "value": b64(b"v%d" % i),
             "timestamp": NOW if ts is None else ts} for i in range(n)]


# -- the command line shape ------------------------------------------------------------------

def test_help_names_every_command_and_output_convention(kl):
    rc, out, err = run_cli("--help")
    assert rc == 0
    for cmd in COMMANDS + ["dump", "recover"]:
        assert cmd in out
    assert "--cluster URL" in out and "--principal P" in out and "--json" in out
    assert "one JSON object per" in out
    for cmd in COMMANDS:
        rc, out, _ = kl(cmd, "--help")
        assert rc == 0 and "usage: kafkalog " + cmd in out


def test_global_options_before_or_after_the_subcommand(kl, url):
    assert kl("--cluster", url, "topics", "--list") == (0, "t\n", "")
    assert kl("topics", "--cluster", url, "--list") == (0, "t\n", "")
    assert kl("--json", "--cluster", url, "topics", "--list") == (0, '{"topic": "t"}\n', "")
    assert kl("--cluster", url, "topics", "--list", "--json") == (0, '{"topic": "t"}\n', "")
    rc, out, _ = kl("--cluster", "/nonexistent", "topics", "--cluster", url, "--list")
    assert (rc, out) == (0, "t\n")                     # the later one wins, as argparse does
    # the global --json reaches the #2 commands too
    seg = next(Path(url).glob("logdir-0/t-0/*.log"), None)
    assert seg is None                                  # nothing produced yet
    produce(kl, url, keyed(3), "--partition", "0")
    seg = next(Path(url).glob("logdir-0/t-0/*.log"))
    rc, out, _ = kl("--json", "dump", "--files", seg, "--deep-iteration")
    assert rc == 0 and len(lines(out)) == 3


def test_cluster_commands_need_an_existing_cluster(kl, root):
    for cmd in (["topics", "--list"], ["consume", "--topic", "t"], ["cleanup"],
                ["groups", "--list"], ["log-dirs", "--describe"]):
        user_error(*kl(*cmd), "needs --cluster URL")
        user_error(*kl("--cluster", root, *cmd), "is not a kafkalog cluster")
    assert not root.exists()                            # a mistyped URL creates nothing


# -- topics ----------------------------------------------------------------------------------

def test_topics_create_describe_alter_increase_delete(kl, url):
    c = ["--cluster", url]
    rc, out, err = kl(*c, "--json", "topics", "--create", "--topic", "orders", "--partitions", 2,
                      "--replication-factor", 1, "--config", "retention.ms=1000",
                      "--config", "segment.bytes=5000")
    assert rc == 0, err
    [desc] = lines(out)
    assert list(desc) == ["topic", "topic_id", "partition_count", "replication_factor", "configs",
                          "partitions"]
    assert desc["configs"] == {"retention.ms": "1000", "segment.bytes": "5000"}
    assert desc["partitions"] == [{"partition": p, "leader": "logdir-0", "replicas": ["logdir-0"],
                                   "isr": ["logdir-0"], "leader_epoch": -1,
                                   "log_start_offset": 0, "high_watermark": 0} for p in (0, 1)]
    assert kl(*c, "topics", "--list")[1] == "orders\nt\n"
    rc, out, _ = kl(*c, "topics", "--describe", "--topic", "orders")
    text = out.splitlines()
    assert text[0].startswith("Topic: orders  TopicId: " + desc["topic_id"])
    assert ("PartitionCount: 2  ReplicationFactor: 1  Configs: "
            "retention.ms=1000,segment.bytes=5000") in text[0]
    assert text[1].split() == ["PARTITION", "LEADER", "REPLICAS", "ISR", "LEADER-EPOCH",
                               "LOG-START-OFFSET", "HIGH-WATERMARK"]
    assert text[2].split() == ["0", "logdir-0", "logdir-0", "logdir-0", "-1", "0", "0"]
    assert text[2].index("logdir-0") == text[1].index("LEADER")         # aligned columns
    assert text[3].rindex("0") == text[1].index("HIGH-WATERMARK")
    rc, out, _ = kl(*c, "--json", "topics", "--describe")
    assert [d["topic"] for d in lines(out)] == ["orders", "t"]

    rc, out, _ = kl(*c, "topics", "--alter", "--topic", "orders", "--config", "retention.ms=5",
                    "--delete-config", "segment.bytes")
    assert rc == 0 and out == "Updated configs of topic orders: retention.ms=5.\n"
    rc, out, _ = kl(*c, "--json", "topics", "--increase-partitions", "--topic", "orders",
                    "--partitions", 4)
    assert rc == 0 and lines(out)[0]["partition_count"] == 4
    rc, out, _ = kl(*c, "topics", "--alter", "--topic", "orders", "--partitions", 5)
    assert (rc, out) == (0, "Topic orders now has 5 partitions.\n")
    assert (Path(url) / "logdir-0" / "orders-4" / "partition.metadata").exists()
    assert kl(*c, "--json", "topics", "--delete", "--topic", "orders")[1] == \
        '{"topic": "orders", "deleted": true}\n'
    assert kl(*c, "topics", "--list")[1] == "t\n"
    assert not (Path(url) / "logdir-0" / "orders-0").exists()


@pytest.mark.parametrize("argv,needle", [
    (["--create", "--topic", "t"], "TopicAlreadyExistsError: topic 't' already exists"),
    (["--create", "--topic", "bad/name"], "InvalidTopicError"),
    (["--create", "--topic", "u", "--partitions", "0"], "--partitions must be >= 1"),
    (["--create", "--topic", "u", "--replication-factor", "2"], "InvalidReplicationFactorError"),
    (["--create", "--topic", "u", "--config", "retention.mss=1"], "unknown topic config"),
    (["--create", "--topic", "u", "--config", "retention.ms"], "expected NAME=VALUE"),
    (["--create", "--topic", "u", "--config", "retention.ms=x"], "invalid value 'x'"),
    (["--create", "--topic", "u", "--delete-config", "a"], "--delete-config does not apply"),
    (["--create"], "--create needs --topic T"),
    (["--delete", "--topic", "nope"], "UnknownTopicOrPartitionError"),
    (["--describe", "--topic", "nope"], "UnknownTopicOrPartitionError"),
    (["--list", "--topic", "t"], "--topic does not apply to --list"),
    (["--list", "--replication-factor", "1"], "--replication-factor does not apply"),
    (["--describe", "--partitions", "0"], "--partitions does not apply to --describe"),
    (["--alter", "--topic", "t"], "--alter needs --config"),
    (["--alter", "--topic", "t", "--delete-config", "retention.ms"], "not set on topic 't'"),
    (["--alter", "--topic", "t", "--config", "a=1", "--delete-config", "a"], "both --config"),
    (["--alter", "--topic", "t", "--config", "segment.bytes=1"], "must be >= 14"),
    (["--alter", "--topic", "t", "--partitions", "5", "--config", "retention.ms=1"], "not both"),
    (["--alter", "--topic", "nope", "--config", "retention.ms=1"], "UnknownTopicOrPartition"),
    (["--increase-partitions", "--topic", "t", "--partitions", "3"], "must be larger, got 3"),
    (["--increase-partitions", "--topic", "t"], "needs --partitions N"),
    ([], "one of the arguments --create --delete --list --describe --alter"),
    (["--list", "--describe"], "not allowed with argument"),
    (["--list", "--partitions", "x"], "invalid int value"),
])
def test_topics_user_errors_change_nothing(kl, url, argv, needle):
    before = state_files(Path(url))
    user_error(*kl("--cluster", url, "topics", *argv), needle)
    assert state_files(Path(url)) == before


def test_topics_create_on_a_new_url_makes_the_cluster_only_when_valid(kl, root):
    user_error(*kl("--cluster", root, "topics", "--create", "--topic", "x",
                   "--replication-factor", "2"), "a new cluster has one log dir")
    user_error(*kl("--cluster", root, "topics", "--create", "--topic", ".."), "InvalidTopicError")
    assert not root.exists()
    assert kl("--cluster", root, "topics", "--create", "--topic", "x")[0] == 0
    assert (root / "_kafkalog" / "cluster.json").exists()


# -- produce and consume ---------------------------------------------------------------------

def test_produce_consume_round_trip_in_murmur2_partitions(tmp_path):
    url = tmp_path / "kl"
    rc, _, err = run_cli("--cluster", url, "topics", "--create", "--topic", "t", "--partitions", 5)
    assert rc == 0, err
    rng = random.Random(7)
    records = []
    for i in range(120):
        rec = {"key": None if i % 9 == 0 else b64(rng.randbytes(rng.randrange(1, 12))),
               "value": None if i % 13 == 0 else b64(rng.randbytes(rng.randrange(0, 300))),
               "timestamp": 1_700_000_000_000 + i}
        if i % 4 == 0:
            rec["headers"] = [{"key": "h%d" % i, "value": b64(b"x")}, {"key": "n", "value": None}]
        records.append(rec)
    rc, out, err = run_cli("--cluster", url, "--json", "produce", "--topic", "t",
                           stdin=jsonl(records))
    assert rc == 0, err
    acks = lines(out)
    assert len(acks) == len(records)
    for rec, ack in zip(records, acks):
        assert list(ack) == ["topic", "partition", "offset"] and ack["topic"] == "t"
        if rec["key"] is not None:   # Kafka's default partitioner, checked against kafka-python
            key = base64.b64decode(rec["key"])
            assert ack["partition"] == (kafka_python_murmur2(key) & 0x7FFFFFFF) % 5
    for p in range(5):               # offsets dense per partition, in input order
        offs = [a["offset"] for a in acks if a["partition"] == p]
        assert offs == list(range(len(offs)))
    rc, out, err = run_cli("--cluster", url, "consume", "--topic", "t")
    assert rc == 0, err
    got = lines(out)
    assert all(list(r) == RECORD_FIELDS for r in got)
    by_place = {(r["partition"], r["offset"]): r for r in got}
    assert len(by_place) == len(records) == len(got)
    for rec, ack in zip(records, acks):
        r = by_place[(ack["partition"], ack["offset"])]
        assert (r["key"], r["value"]) == (rec["key"], rec["value"])
        assert r["timestamp"] == rec["timestamp"]
        assert r["headers"] == rec.get("headers", [])
        assert (r["topic"], r["magic"], r["control"], r["transactional"], r["timestampType"]) == \
            ("t", 2, False, False, 0)


def test_produce_table_partition_compression_and_dump_agree(kl, url):
    rc, out, err = kl("--cluster", url, "produce", "--topic", "t", "--partition", "1",
                      "--compression", "gzip", stdin=jsonl(keyed(3)) + "\n")
    assert rc == 0, err
    assert out.splitlines() == ["TOPIC  PARTITION  OFFSET", "t      1          0",
                                "t      1          1", "t      1          2"]
    rc, out, _ = kl("--cluster", url, "consume", "--topic", "t", "--partition", 1)
    consumed = lines(out)
    seg = sorted((Path(url) / "logdir-0" / "t-1").glob("*.log"))
    rc, out, _ = kl("dump", "--json", "--deep-iteration", "--print-data-log",
                    "--files", ",".join(map(str, seg)))
    dumped = lines(out)
    assert [{"topic": "t", "partition": 1, **{k: v for k, v in d.items() if k != "segment"}}
            for d in dumped] == consumed
    rc, out, _ = kl("dump", "--json", "--files", seg[0])
    assert {b["compresscodec"] for b in lines(out)} == {"gzip"}
    # no timestamp: the time of produce; empty input: nothing written, nothing printed
    produce(kl, url, [{"value": None}], "--partition", "2")
    [r] = lines(kl("--cluster", url, "consume", "--topic", "t", "--partition", "2")[1])
    assert abs(r["timestamp"] - time.time() * 1000) < 60_000
    assert kl("--cluster", url, "produce", "--topic", "t", stdin="\n") == (0, "", "")


@pytest.mark.parametrize("argv,stdin,needle", [
    ([], '{"value": "AA=="}\n{"value": "%%%"}\n', "line 2: value is not valid base64"),
    ([], '{"value": null}\nnot json\n', "line 2: not valid JSON"),
    ([], '{"valeu": null}\n', "unknown fields ['valeu']"),
    ([], '{"timestamp": "now"}\n', "timestamp must be an integer"),
    ([], '{"headers": [{"value": null}]}\n', "each header needs a string 'key'"),
    ([], '[1]\n', "expected a JSON object"),
    (["--partition", "3"], '{"value": null}\n', "no partition t-3: topic 't' has 3 partitions"),
    (["--partition", "-1"], '{"value": null}\n', "--partition must be >= 0"),
    (["--compression", "brotli"], '{"value": null}\n', "unknown compression codec 'brotli'"),
    (["--message-format-version", "1"], "", "--message-format-version applies to --log-dir only"),
    (["--segment-bytes", "1000"], "", "--segment-bytes applies to --log-dir only"),
    (["--batch-records", "5"], "", "--batch-records applies to --log-dir only"),
    (["--log-dir", "LOGDIR"], "", "not both"),
])
def test_produce_rejects_bad_input_and_writes_nothing(kl, url, tmp_path, argv, stdin, needle):
    argv = [str(tmp_path / "ld") if a == "LOGDIR" else a for a in argv]
    before = state_files(Path(url))
    user_error(*kl("--cluster", url, "produce", "--topic", "t", *argv, stdin=stdin), needle)
    assert state_files(Path(url)) == before
    assert not (tmp_path / "ld").exists()


def test_produce_modes_and_topic_checks(kl, url, tmp_path):
    user_error(*kl("produce", "--topic", "t", stdin="{}\n"), "needs --log-dir DIR")
    user_error(*kl("produce", "--log-dir", tmp_path / "ld", "--topic", "t", stdin="{}\n"),
               "produce --log-dir needs --partition P")
    user_error(*kl("--cluster", url, "produce", "--topic", "nope", stdin="{}\n"),
               "UnknownTopicOrPartitionError: topic 'nope' does not exist")
    # the raw mode is unchanged: JSON lines, --partition, its own options
    rc, out, err = kl("produce", "--log-dir", tmp_path / "ld", "--topic", "t", "--partition", 0,
                      "--message-format-version", 1, stdin='{"value": null}\n')
    assert (rc, lines(out)) == (0, [{"topic": "t", "partition": 0, "offset": 0}]), err
    # a topic on message format 1 takes no headers; the line is named and nothing is written
    kl("--cluster", url, "topics", "--create", "--topic", "old", "--config",
       "message.format.version=0.10.2")
    before = state_files(Path(url))
    user_error(*kl("--cluster", url, "produce", "--topic", "old",
                   stdin='{"value": null}\n\n{"headers": [{"key": "h", "value": null}]}\n'),
               "line 3: topic 'old' uses message format 1, which has no record headers")
    assert state_files(Path(url)) == before
    rc, out, err = kl("--cluster", url, "--json", "produce", "--topic", "old",
                      stdin='{"value": "AA==", "timestamp": 5}\n')
    assert rc == 0, err
    [r] = lines(kl("--cluster", url, "consume", "--topic", "old")[1])
    assert (r["magic"], r["timestamp"], r["value"]) == (1, 5, "AA==")


def test_consume_start_positions_limits_and_errors(kl, url):
    recs = [{"value": b64(b"%d" % i), "timestamp": 1000 * (i + 1)} for i in range(10)]
    produce(kl, url, recs[:5], "--partition", "0")
    produce(kl, url, recs[5:], "--partition", "0")
    c = ["--cluster", url, "consume", "--topic", "t"]

    def offsets(*extra):
        rc, out, err = kl(*c, *extra)
        assert rc == 0, err
        return [(r["partition"], r["offset"]) for r in lines(out)]
    assert offsets() == [(0, i) for i in range(10)]
    assert offsets("--from", "latest") == []
    assert offsets("--partition", 0, "--from", 7) == [(0, 7), (0, 8), (0, 9)]
    assert offsets("--partition", 0, "--from", 10) == []
    assert offsets("--from", "@4500") == [(0, i) for i in range(4, 10)]
    assert offsets("--from", "@99999") == []
    assert offsets("--max-records", 3) == [(0, 0), (0, 1), (0, 2)]
    assert offsets("--partition", 1) == []
    user_error(*kl(*c, "--from", 3), "an offset needs --partition")
    user_error(*kl(*c, "--partition", 0, "--from", 11), "OffsetOutOfRangeError: offset 11 is out")
    user_error(*kl(*c, "--from", "soon"), "invalid start 'soon'")
    user_error(*kl(*c, "--from", "@x"), "invalid timestamp in '@x'")
    user_error(*kl(*c, "--max-records", 0), "--max-records must be >= 1")
    user_error(*kl(*c, "--partition", 3), "no partition t-3")
    user_error(*kl(*c, "--isolation-level", "dirty"), "invalid choice: 'dirty'")
    user_error(*kl("--cluster", url, "consume", "--topic", "nope"), "UnknownTopicOrPartition")
    user_error(*kl("--cluster", url, "consume"), "the following arguments are required: --topic")


def test_consume_isolation_levels_see_open_writes_or_not(kl, url):
    produce(kl, url, keyed(2), "--partition", "2")
    admin = Admin(url)
    producer = Producer(admin.cluster)
    pending = producer.write({("t", 2): producer.encode("t", [Record(b"k", b"open")])})
    base = ["--cluster", url, "consume", "--topic", "t", "--partition", 2]
    assert len(lines(kl(*base)[1])) == 2
    rc, out, _ = kl(*base, "--isolation-level", "read_uncommitted")
    assert [r["value"] for r in lines(out)][-1] == b64(b"open")
    producer.abort([pending])
    assert len(lines(kl(*base, "--isolation-level", "read_uncommitted")[1])) == 2


def test_consume_with_a_group_commits_and_resumes(kl, url):
    produce(kl, url, keyed(6), "--partition", "0")
    c = ["--cluster", url, "consume", "--topic", "t", "--group", "g"]
    assert [r["offset"] for r in lines(kl(*c, "--max-records", 4)[1])] == [0, 1, 2, 3]
    assert [r["offset"] for r in lines(kl(*c)[1])] == [4, 5]
    assert lines(kl(*c)[1]) == []
    produce(kl, url, keyed(1), "--partition", "0")
    assert [r["offset"] for r in lines(kl(*c)[1])] == [6]
    assert [r["offset"] for r in lines(kl(*c, "--partition", 0, "--from", 5)[1])] == [5, 6]


# -- offsets ---------------------------------------------------------------------------------

def test_offsets(kl, url):
    produce(kl, url, [{"value": None, "timestamp": t} for t in (100, 200, 300)], "--partition", 1)
    kl("--cluster", url, "delete-records", "--offset-json-file", "-",
       stdin='{"partitions": [{"topic": "t", "partition": 1, "offset": 1}]}')
    c = ["--cluster", url, "offsets", "--topic", "t"]
    rc, out, _ = kl(*c)
    assert out.splitlines() == ["TOPIC  PARTITION  OFFSET  TIMESTAMP",
                                "t      0          0       -1",
                                "t      1          3       -1",
                                "t      2          0       -1"]
    for when, expect in (("earliest", 1), ("-2", 1), ("latest", 3), ("-1", 3), ("250", 2),
                         ("0", 1), ("301", 3)):
        rc, out, err = kl(*c, "--partition", 1, "--time", when, "--json")
        assert rc == 0, err
        [row] = lines(out)
        assert list(row) == ["topic", "partition", "offset", "timestamp"]
        assert row["offset"] == expect, when
    assert lines(kl(*c, "--partition", 1, "--time", 150, "--json")[1])[0]["timestamp"] == 200
    user_error(*kl(*c, "--time", "yesterday"), "--time 'yesterday': expected earliest")
    user_error(*kl(*c, "--time", "-5"), "--time '-5'")
    user_error(*kl(*c, "--partition", 9), "no partition t-9")


# -- delete-records (KIP-107) ----------------------------------------------------------------

def _offsets_file(tmp_path, entries, name="offsets.json"):
    path = tmp_path / name
    path.write_text(json.dumps({"partitions": [{"topic": t, "partition": p, "offset": o}
                                               for t, p, o in entries], "version": 1}))
    return path


def test_delete_records_kip107_cases(kl, url, tmp_path):
    for p in range(3):
        produce(kl, url, keyed(5), "--partition", p)
    f = _offsets_file(tmp_path, [("t", 0, 3), ("t", 1, -1), ("t", 2, 6), ("t", 5, 0),
                                 ("nope", 0, 1)])
    c = ["--cluster", url, "delete-records", "--offset-json-file", f]
    before = state_files(Path(url))
    rc, dry, err = kl(*c, "--dry-run", "--json")
    assert rc == 1, err
    assert state_files(Path(url)) == before                 # a dry run changes nothing
    rows = lines(dry)
    assert [list(r) for r in rows] == [["topic", "partition", "offset", "log_start_offset",
                                        "high_watermark", "low_watermark", "error", "message"]] * 5
    assert [(r["log_start_offset"], r["high_watermark"]) for r in rows] == [
        (0, 5), (0, 5), (0, 5), (None, None), (None, None)]
    rc, out, err = kl(*c, "--json")
    assert rc == 1, err
    real = lines(out)
    expected = [("t", 0, 3, None), ("t", 1, 5, None), ("t", 2, None, "OFFSET_OUT_OF_RANGE"),
                ("t", 5, None, "UNKNOWN_TOPIC_OR_PARTITION"),
                ("nope", 0, None, "UNKNOWN_TOPIC_OR_PARTITION")]
    assert [(r["topic"], r["partition"], r["low_watermark"], r["error"]) for r in real] == expected
    assert [list(r) for r in real] == [["topic", "partition", "low_watermark", "error",
                                        "message"]] * 5
    assert "high watermark 5" in real[2]["message"]
    # the dry run predicted exactly this
    assert [{k: r[k] for k in ("topic", "partition", "low_watermark", "error", "message")}
            for r in rows] == real
    # repeats are idempotent; an offset below the log start offset keeps it
    assert lines(kl(*c, "--json")[1]) == real
    f2 = _offsets_file(tmp_path, [("t", 0, 1), ("t", 1, -1)], "again.json")
    rc, out, err = kl("--cluster", url, "delete-records", "--offset-json-file", f2)
    assert rc == 0, err
    assert out.splitlines() == ["TOPIC  PARTITION  LOW-WATERMARK  ERROR  MESSAGE",
                                "t      0          3              -      -",
                                "t      1          5              -      -"]
    consumed = lines(kl("--cluster", url, "consume", "--topic", "t")[1])
    assert [(r["partition"], r["offset"]) for r in consumed] == [(0, 3), (0, 4)] + [
        (2, i) for i in range(5)]
    user_error(*kl("--cluster", url, "consume", "--topic", "t", "--partition", 0, "--from", 2),
               "OffsetOutOfRangeError")


def test_delete_records_exit_status_and_table_in_a_real_process(tmp_path):
    url = tmp_path / "kl"
    run_cli("--cluster", url, "topics", "--create", "--topic", "t")
    run_cli("--cluster", url, "produce", "--topic", "t", stdin='{"value": null}\n' * 4)
    f = _offsets_file(tmp_path, [("t", 0, 2), ("t", 1, 0)])
    rc, out, err = run_cli("--cluster", url, "delete-records", "--offset-json-file", f)
    assert rc == 1 and err == ""
    assert [line.split()[:4] for line in out.splitlines()] == [
        ["TOPIC", "PARTITION", "LOW-WATERMARK", "ERROR"], ["t", "0", "2", "-"],
        ["t", "1", "-", "UNKNOWN_TOPIC_OR_PARTITION"]]
    f = _offsets_file(tmp_path, [("t", 0, -1)])
    rc, out, err = run_cli("--cluster", url, "--json", "delete-records", "--offset-json-file", f)
    assert (rc, lines(out)) == (0, [{"topic": "t", "partition": 0, "low_watermark": 4,
                                     "error": None, "message": None}]), err


@pytest.mark.parametrize("text,needle", [
    (None, "cannot read --offset-json-file"),
    ("{", "not valid JSON (Expecting property name"),
    ("[]", "expected a JSON object like"),
    ('{"partitions": [], "version": 1}', '"partitions" is empty'),
    ('{"version": 1}', 'missing the "partitions" list'),
    ('{"partitions": [{"topic": "t", "partition": 0, "offset": 1}], "version": 2}',
     "unsupported version 2 (only 1)"),
    ('{"partitions": {"topic": "t"}}', '"partitions" must be a list'),
    ('{"partitions": [], "extra": 1}', "unknown field(s) extra"),
    ('{"partitions": [3]}', "partitions[0]: expected an object"),
    ('{"partitions": [{"topic": "t", "partition": 0}]}', 'partitions[0]: missing "offset"'),
    ('{"partitions": [{"topic": "t", "offset": 0}]}', 'partitions[0]: missing "partition"'),
    ('{"partitions": [{"partition": 0, "offset": 0}]}', 'partitions[0]: missing "topic"'),
    ('{"partitions": [{"topic": "", "partition": 0, "offset": 0}]}', '"topic" must be a non-empty'),
    ('{"partitions": [{"topic": "t", "partition": "0", "offset": 0}]}',
     '"partition" must be an integer'),
    ('{"partitions": [{"topic": "t", "partition": 0, "offset": 1.5}]}',
     '"offset" must be an integer'),
    ('{"partitions": [{"topic": "t", "partition": 0, "offset": true}]}',
     '"offset" must be an integer'),
    ('{"partitions": [{"topic": "t", "partition": 0, "offset": 1, "ofset": 2}]}',
     "partitions[0]: unknown field(s) ofset"),
    ('{"partitions": [{"topic": "t", "partition": 0, "offset": 1}, '
     '{"topic": "t", "partition": 0, "offset": 2}]}',
     "partitions[1]: t-0 is listed twice (first at partitions[0])"),
])
def test_delete_records_file_validation(kl, url, tmp_path, text, needle):
    f = tmp_path / "offsets.json"
    if text is not None:
        f.write_text(text)
    produce(kl, url, keyed(3), "--partition", 0)
    before = state_files(Path(url))
    user_error(*kl("--cluster", url, "delete-records", "--offset-json-file", f), needle)
    assert state_files(Path(url)) == before


def test_delete_records_negative_offsets_fail_per_partition(kl, url):
    produce(kl, url, keyed(3), "--partition", 0)
    stdin = json.dumps({"partitions": [{"topic": "t", "partition": 0, "offset": -2},
                                       {"topic": "t", "partition": 1, "offset": 0}]})
    rc, out, err = kl("--cluster", url, "--json", "delete-records", "--offset-json-file", "-",
                      stdin=stdin)
    assert rc == 1, err
    assert [(r["error"], r["low_watermark"]) for r in lines(out)] == [
        ("OFFSET_OUT_OF_RANGE", None), (None, 0)]


# -- principals and ACLs ---------------------------------------------------------------------

def test_principal_reaches_acl_checks(kl, url, tmp_path):
    produce(kl, url, keyed(3), "--partition", 0)
    admin = Admin(url)
    admin.add_acl("*", "t", "ALL", "ALLOW")
    admin.add_acl("User:mallory", "t", "WRITE", "DENY")
    admin.add_acl("User:mallory", "t", "DELETE", "DENY")
    before = state_files(Path(url))
    user_error(*kl("--cluster", url, "--principal", "User:mallory", "produce", "--topic", "t",
                   stdin='{"value": null}\n'), "TopicAuthorizationFailedError: User:mallory")
    assert state_files(Path(url)) == before
    f = _offsets_file(tmp_path, [("t", 0, 1)])
    for where in (["--principal", "User:mallory", "delete-records"],
                  ["delete-records", "--principal", "User:mallory"]):
        for dry in (["--dry-run"], []):
            rc, out, _ = kl("--cluster", url, "--json", *where, "--offset-json-file", f, *dry)
            assert rc == 1 and lines(out)[0]["error"] == "TOPIC_AUTHORIZATION_FAILED"
    rc, out, _ = kl("--cluster", url, "--principal", "User:alice", "--json", "delete-records",
                    "--offset-json-file", f)
    assert rc == 0 and lines(out)[0]["low_watermark"] == 1
    [ack] = produce(kl, url, keyed(1), "--principal", "User:alice", "--partition", 0)
    assert ack["offset"] == 3


def test_cluster_config_file(kl, url, tmp_path):
    admin = Admin(url)
    admin.add_acl("*", "t", "ALL", "ALLOW")
    admin.add_acl("User:mallory", "t", "WRITE", "DENY")
    conf = tmp_path / "cluster.properties"
    conf.write_text("transaction.timeout.ms=12345\nkafkalog.principal=User:mallory\n")
    user_error(*kl("--cluster", url, "--cluster-config", conf, "produce", "--topic", "t",
                   stdin='{"value": null}\n'), "User:mallory may not write")
    # --principal wins over the file; the file's transaction timeout reaches the reservation
    rc, out, err = kl("--cluster", url, "produce", "--cluster-config", conf, "--principal",
                      "User:alice", "--topic", "t", stdin='{"value": null}\n')
    assert rc == 0, err
    entries = [json.loads(p.read_text()) for p in (Path(url) / "_kafkalog" / "log").glob("0*.json")
               if not p.name.endswith(".snapshot.json")]
    reserves = [a for e in entries for a in e["actions"] if a["op"] == "reserve"]
    assert [(a["timeout_ms"], a["principal"]) for a in reserves] == [(12345, "User:alice")]
    conf.write_text("transaction.timeout.mss=1\n")
    user_error(*kl("--cluster", url, "--cluster-config", conf, "topics", "--list"),
               "unknown cluster setting 'transaction.timeout.mss'")
    conf.write_text("storage.endpoint_url=http://127.0.0.1:9\n")
    user_error(*kl("--cluster", url, "--cluster-config", conf, "topics", "--list"),
               "unknown options for local storage")
    user_error(*kl("--cluster", url, "--cluster-config", tmp_path / "none", "topics", "--list"),
               "cannot read cluster config")


# -- retention, log-dirs, cleanup ------------------------------------------------------------

def test_retention_dry_run_then_apply(kl, url):
    c = ["--cluster", url]
    kl(*c, "topics", "--alter", "--topic", "t", "--config", "retention.ms=3600000")
    produce(kl, url, keyed(4, ts=1000), "--partition", 0)       # ancient
    produce(kl, url, keyed(2, ts=1000), "--partition", 1)       # ancient
    produce(kl, url, keyed(3), "--partition", 0)                # fresh
    produce(kl, url, keyed(2, ts=-1), "--partition", 2)         # no timestamps: ages by mtime
    before = state_files(Path(url))
    rc, out, err = kl(*c, "retention", "--dry-run")
    assert rc == 0, err
    assert out.splitlines()[0].split() == ["TOPIC", "PARTITION", "LOG-START-OFFSET",
                                           "NEW-LOG-START-OFFSET", "SEGMENTS", "BYTES", "REASON"]
    assert [line.split()[:5] for line in out.splitlines()[1:3]] == [
        ["t", "0", "0", "4", "1"], ["t", "1", "0", "2", "1"]]
    assert out.splitlines()[-1].startswith("Would delete 2 segment(s), ")
    assert state_files(Path(url)) == before
    rc, out, err = kl(*c, "--json", "retention")
    assert rc == 0 and err == ""
    rows = lines(out)
    assert [list(r) for r in rows] == [["topic", "partition", "log_start_offset",
                                        "new_log_start_offset", "segments", "bytes",
                                        "reason"]] * 2
    assert [(r["partition"], r["new_log_start_offset"], r["segments"], r["reason"])
            for r in rows] == [(0, 4, [0], "retention.ms"), (1, 2, [0], "retention.ms")]
    assert all(r["bytes"] > 0 for r in rows)
    assert not (Path(url) / "logdir-0" / "t-0" / "00000000000000000000.log").exists()
    consumed = lines(kl(*c, "consume", "--topic", "t")[1])
    assert [(r["partition"], r["offset"]) for r in consumed] == [(0, 4), (0, 5), (0, 6),
                                                                 (2, 0), (2, 1)]
    rc, out, _ = kl(*c, "retention")
    assert out == "Nothing to delete: no segment is past retention in 3 partition(s).\n"
    assert kl(*c, "--json", "retention") == (0, "", "")


class FakeTTY(io.StringIO):
    def isatty(self):
        return True


def test_progress_bar_only_on_a_terminal_with_many_steps():
    tty = FakeTTY()
    with Progress(100, "work", stream=tty) as bar:
        for _ in range(100):
            bar.advance()
    drawn = tty.getvalue()
    assert "\rwork [" in drawn and "100/100 100%" in drawn and drawn.endswith("\r\x1b[K")
    pipe = io.StringIO()
    with Progress(100, "work", stream=pipe) as bar:
        bar.advance(100)
    assert pipe.getvalue() == ""
    small = FakeTTY()
    with Progress(3, "work", stream=small) as bar:
        bar.advance(3)
    assert small.getvalue() == ""


def test_retention_draws_progress_on_a_terminal_stderr(kl, url, monkeypatch):
    kl("--cluster", url, "topics", "--create", "--topic", "many", "--partitions", 60)
    tty = FakeTTY()
    monkeypatch.setattr(sys, "stderr", tty)
    monkeypatch.setattr(cluster_maint, "RETENTION_CHUNK", 7)
    rc, out, _ = kl("--cluster", url, "retention", "--dry-run")
    assert rc == 0 and out.startswith("Nothing to delete") and "[" not in out
    assert "63/63 100%" in tty.getvalue()


def test_log_dirs_describe_sizes(kl, url):
    produce(kl, url, keyed(20), "--partition", 0)
    produce(kl, url, keyed(5), "--partition", 2)
    rc, out, _ = kl("--cluster", url, "--json", "log-dirs", "--describe")
    rows = lines(out)
    assert [list(r) for r in rows] == [["log_dir", "url", "topic", "partition", "size",
                                        "offset_lag", "error"]] * 3
    assert [r["error"] for r in rows] == [None] * 3                   # every log dir online
    assert [r["offset_lag"] for r in rows] == [0, 0, 0]               # leaders only
    assert {r["url"] for r in rows} == {os.path.join(os.path.abspath(url), "logdir-0")}
    for r in rows:
        d = Path(url) / r["log_dir"] / f"{r['topic']}-{r['partition']}"
        assert r["size"] == sum(p.stat().st_size for p in d.glob("*.log"))
    assert [r["size"] > 0 for r in rows] == [True, False, True]
    rc, out, _ = kl("--cluster", url, "log-dirs", "--describe")
    assert out.splitlines()[0].split() == ["LOG-DIR", "URL", "TOPIC", "PARTITION", "SIZE",
                                           "OFFSET-LAG", "ERROR"]
    user_error(*kl("--cluster", url, "log-dirs"), "one of the arguments --describe --add "
                                                  "--remove is required")


def test_cleanup_removes_garbage(kl, url):
    produce(kl, url, keyed(5), "--partition", 0)
    ld = Path(url) / "logdir-0"
    assert kl("--cluster", url, "topics", "--create", "--topic", "gone")[0] == 0
    meta = (ld / "gone-0" / "partition.metadata").read_bytes()
    assert kl("--cluster", url, "topics", "--delete", "--topic", "gone")[0] == 0
    (ld / "gone-0").mkdir()          # what a deleter killed half-way leaves behind
    (ld / "gone-0" / "partition.metadata").write_bytes(meta)
    (ld / "gone-0" / "00000000000000000000.log").write_bytes(b"")
    (ld / "nobody-0").mkdir()        # no evidence that it is a deleted topic's: kept
    (ld / "t-0" / "00000000000000000002.index").write_bytes(b"")     # no .log: not a segment
    rc, out, _ = kl("--cluster", url, "--json", "cleanup")
    assert rc == 0
    assert sorted((r["kind"], r["path"]) for r in lines(out)) == [
        ("dir", "logdir-0/gone-0"), ("kept-unknown", "logdir-0/nobody-0"),
        ("segment", "logdir-0/t-0/00000000000000000002")]
    assert not (ld / "gone-0").exists() and (ld / "nobody-0").exists()
    (ld / "nobody-0").rmdir()
    assert kl("--cluster", url, "cleanup") == (0, "Nothing to clean up.\n", "")
    assert len(lines(kl("--cluster", url, "consume", "--topic", "t")[1])) == 5


# -- groups ----------------------------------------------------------------------------------

def test_groups_list_describe_reset_delete(kl, url):
    c = ["--cluster", url]
    for p in range(3):
        produce(kl, url, [{"value": None, "timestamp": 1000 * (i + 1)} for i in range(4)],
                "--partition", p)
    kl(*c, "consume", "--topic", "t", "--partition", 0, "--group", "g", "--max-records", 3)
    assert kl(*c, "groups", "--list") == (0, "g\n", "")
    assert kl(*c, "groups", "--list", "--json") == (0, '{"group": "g"}\n', "")
    rc, out, _ = kl(*c, "groups", "--describe", "--group", "g")
    assert [line.split() for line in out.splitlines()] == [
        ["GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG"],
        ["g", "t", "0", "3", "4", "1"], ["g", "t", "1", "-", "4", "-"],
        ["g", "t", "2", "-", "4", "-"]]
    rc, out, _ = kl(*c, "--json", "groups", "--describe", "--group", "g")
    assert lines(out)[0] == {"group": "g", "topic": "t", "partition": 0, "current_offset": 3,
                             "log_end_offset": 4, "lag": 1}

    def reset(*how):
        rc, out, err = kl(*c, "--json", "groups", "--reset-offsets", "--group", "g", "--topic",
                          "t", *how)
        assert rc == 0, err
        return [(r["partition"], r["current_offset"], r["new_offset"]) for r in lines(out)]
    before = state_files(Path(url))
    assert reset("--to-earliest", "--dry-run") == [(0, 3, 0), (1, None, 0), (2, None, 0)]
    assert state_files(Path(url)) == before
    assert reset("--to-latest") == [(0, 3, 4), (1, None, 4), (2, None, 4)]
    assert reset("--to-datetime", 2500, "--execute") == [(0, 4, 2), (1, 4, 2), (2, 4, 2)]
    assert reset("--shift-by", -5) == [(0, 2, 0), (1, 2, 0), (2, 2, 0)]
    assert reset("--shift-by", 3) == [(0, 0, 3), (1, 0, 3), (2, 0, 3)]
    rc, out, _ = kl(*c, "groups", "--reset-offsets", "--group", "g", "--topic", "t",
                    "--to-earliest", "--dry-run")
    assert out.splitlines()[0].split() == ["GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET",
                                           "NEW-OFFSET"]
    assert [r["offset"] for r in lines(kl(*c, "consume", "--topic", "t", "--partition", 1,
                                          "--group", "g")[1])] == [3]
    assert kl(*c, "--json", "groups", "--delete", "--group", "g") == (
        0, '{"group": "g", "deleted": true}\n', "")
    assert kl(*c, "groups", "--list") == (0, "No consumer groups.\n", "")


@pytest.mark.parametrize("argv,needle", [
    (["--describe", "--group", "nope"], "GroupIdNotFoundError"),
    (["--delete", "--group", "nope"], "GroupIdNotFoundError"),
    (["--describe"], "--describe needs --group G"),
    (["--describe", "--group", ""], "invalid group id '': it must not be empty"),
    (["--reset-offsets", "--group", "g", "--topic", "t"], "needs one of --to-earliest"),
    (["--reset-offsets", "--group", "g", "--to-latest"], "--reset-offsets needs --topic T"),
    (["--reset-offsets", "--group", "g", "--topic", "nope", "--to-latest"],
     "UnknownTopicOrPartitionError"),
    (["--reset-offsets", "--group", "g", "--topic", "t", "--to-datetime", "-1"],
     "--to-datetime must be >= 0"),
    (["--reset-offsets", "--group", "g", "--topic", "t", "--to-latest", "--to-earliest"],
     "not allowed with argument"),
    (["--reset-offsets", "--group", "g", "--topic", "t", "--to-latest", "--dry-run",
      "--execute"], "not allowed with argument"),
    (["--describe", "--group", "g", "--to-latest"], "--to-latest does not apply to --describe"),
    (["--list", "--dry-run"], "--dry-run does not apply to --list"),
    (["--describe", "--group", "g", "--topic", "t"], "--topic does not apply to --describe"),
    ([], "one of the arguments --list --describe --reset-offsets --delete is required"),
])
def test_groups_user_errors_change_nothing(kl, url, argv, needle):
    before = state_files(Path(url))
    user_error(*kl("--cluster", url, "groups", *argv), needle)
    assert state_files(Path(url)) == before


# -- user errors in a real process -----------------------------------------------------------

def test_user_errors_in_a_real_process_are_one_line(tmp_path):
    url = tmp_path / "kl"
    run_cli("--cluster", url, "topics", "--create", "--topic", "t")
    for argv, stdin, needle in (
            (["topics", "--list"], "", "topics --list needs --cluster URL"),
            (["--cluster", tmp_path / "typo", "consume", "--topic", "t"], "",
             "is not a kafkalog cluster"),
            (["--cluster", url, "produce", "--topic", "t"], '{"value": "%"}\n',
             "line 1: value is not valid base64"),
            (["--cluster", url, "delete-records", "--offset-json-file", tmp_path / "none.json"],
             "", "cannot read --offset-json-file")):
        rc, out, err = run_cli(*argv, stdin=stdin)
        assert rc == 2 and out == "" and "Traceback" not in err, (argv, err)
        assert len(err.splitlines()) == 1 and needle in err, (argv, err)
    assert not (tmp_path / "typo").exists()


def test_the_help_names_every_cluster_command_and_an_empty_group_list_says_so(tmp_path):
    import argparse
    from support.cli_support import run_main
    from pyspark_kafkalog.cli.main import EPILOG, build_parser
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    listed = set(EPILOG.replace(",", " ").replace(".", " ").split())
    assert set(sub.choices) <= listed, set(sub.choices) - listed
    url = tmp_path / "c"
    rc, out, err = run_main("--cluster", url, "topics", "--create", "--topic", "t")
    assert rc == 0, err
    rc, out, err = run_main("--cluster", url, "groups", "--list")
    assert (rc, out) == (0, "No consumer groups.\n"), err
    rc, out, err = run_main("--cluster", url, "groups", "--list", "--json")
    assert (rc, out) == (0, ""), err
