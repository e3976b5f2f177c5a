"""`consume` streams: bounded memory however long the partition, and a consumer group's offsets
are committed only for records that were delivered (written out and flushed by the CLI, consumed
by the caller of `Admin.consume`) — through `| head`, Ctrl-C, and a topic deleted and created
again under the same name. Also the one rule for group ids."""
from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from support.cli_support import fill_big_topic, peak_rss_kb
from pyspark_kafkalog.admin import Admin, TopicPartition
from pyspark_kafkalog.cli.main import main
from pyspark_kafkalog.client.groups import MAX_GROUP_ID_LENGTH, GroupStore, validate_group_id
from pyspark_kafkalog.client.producer import Producer
from pyspark_kafkalog.errors import (InvalidConfigError, InvalidGroupIdError, KafkaLogError,
                                     UnknownTopicOrPartitionError)
from pyspark_kafkalog.format.records import Record

BIG = 250_000                       # records in topic `m`, 100-byte values
CLI = [sys.executable, "-m", "pyspark_kafkalog.cli.main"]
ENV = {**os.environ, "PYTHONPATH": os.getcwd()}
PIPE_AND_HEAD_BYTES = 1 << 17       # a pipe's 64 KiB plus what `head` may have read, with room


@pytest.fixture(scope="module")
def big(tmp_path_factory) -> str:
    """A cluster with topic `m`: one partition of 250,000 records (one encoded batch of 1,000
    records written 250 times, which takes well under a second), and an empty topic `e`."""
    url = str(tmp_path_factory.mktemp("stream") / "kl")
    fill_big_topic(url, BIG)
    return url


def cli(*argv, **kw):
    return subprocess.run([*CLI, *map(str, argv)], capture_output=True, text=True, timeout=300,
                          env=ENV, **kw)


def committed(url: str, group: str, topic: str = "m", partition: int = 0):
    got = Admin(url).list_group_offsets(group).get(TopicPartition(topic, partition))
    return None if got is None else got.offset


def offsets(out: str):
    return [json.loads(line)["offset"] for line in out.splitlines()]




# -- bounded memory ----------------------------------------------------------------------------

@pytest.mark.slow
def test_consuming_a_long_partition_keeps_memory_bounded(big):
    baseline = peak_rss_kb(["--cluster", big, "consume", "--topic", "e", "--group", "rss"])
    peak = peak_rss_kb(["--cluster", big, "consume", "--topic", "m", "--group", "rss"])
    # holding all 250,000 records at once took ~70 MB over the baseline; a fetch at a time ~0
    assert peak - baseline < 24 * 1024, (peak, baseline)
    assert committed(big, "rss") == BIG


# -- the CLI commits what reached the output, no more ------------------------------------------

@pytest.mark.parametrize("interval", [0, None])
def test_consume_into_head_commits_at_most_what_reached_the_pipe(big, interval):
    group = f"head-{interval}"
    extra = "" if interval is None else f" --commit-interval-ms {interval}"
    cmd = (" ".join(CLI) + f" --cluster {big} consume --topic m --group {group}{extra}"
           " | head -2")
    proc = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], capture_output=True, text=True,
                          timeout=300, env=ENV)
    assert (proc.returncode, proc.stderr) == (0, ""), proc.stderr
    assert offsets(proc.stdout) == [0, 1]
    line = len(proc.stdout.splitlines()[0]) + 1
    got = committed(big, group)
    # what reached the pipe is at most what `head` read plus what the pipe held when it closed
    assert got is None or got <= PIPE_AND_HEAD_BYTES // line, got
    if interval == 0:             # a commit after every flushed line: both lines head printed
        assert got >= 2
    resume = 0 if got is None else got          # no record lost: on right after the last
    out = cli("--cluster", big, "consume", "--topic", "m", "--group", group, "--max-records", 3)
    assert offsets(out.stdout) == [resume, resume + 1, resume + 2]
    described = cli("--cluster", big, "--json", "groups", "--describe", "--group", group)
    assert [json.loads(r)["current_offset"] for r in described.stdout.splitlines()] == [
        resume + 3]


@pytest.mark.parametrize("interval", [0, None])
def test_ctrl_c_commits_nothing_past_what_was_delivered(big, interval):
    group = f"sigint-{interval}"
    argv = ["--cluster", big, "consume", "--topic", "m", "--group", group]
    if interval is not None:
        argv += ["--commit-interval-ms", interval]
    proc = subprocess.Popen([*CLI, *map(str, argv)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=ENV)
    first = [proc.stdout.readline() for _ in range(10)]
    proc.send_signal(signal.SIGINT)   # it is printing or blocked on the full pipe: either way
    rest = proc.stdout.read()         # everything that reached the pipe, to the writer's exit
    err = proc.stderr.read()
    assert proc.wait(timeout=300) == 130
    assert err == b""
    data = b"".join(first) + rest
    delivered = data.count(b"\n")     # a torn last line is not a delivered record
    assert offsets(data[:data.rfind(b"\n") + 1].decode()) == list(range(delivered))
    got = committed(big, group)
    assert got is None or got <= delivered
    if interval == 0:                 # the line in flight when the signal came, at most
        assert got is not None and got >= delivered - 1
    resume = 0 if got is None else got
    out = cli("--cluster", big, "consume", "--topic", "m", "--group", group, "--max-records", 2)
    assert offsets(out.stdout) == [resume, resume + 1]


def test_consume_to_the_end_commits_every_partition_reached(tmp_path):
    url = str(tmp_path / "kl")
    admin = Admin(url)
    admin.create_topic("t", 3)
    admin.produce("t", [Record(None, b"v%d" % i, 1) for i in range(5)], partition=1)
    proc = cli("--cluster", url, "consume", "--topic", "t", "--group", "g")
    assert (proc.returncode, offsets(proc.stdout)) == (0, [0, 1, 2, 3, 4])
    assert {tp.partition: om.offset for tp, om in admin.list_group_offsets("g").items()} == {
        0: 0, 1: 5, 2: 0}
    assert cli("--cluster", url, "consume", "--topic", "t", "--group", "g").stdout == ""
    for bad in (["--group", "g", "--commit-interval-ms", -1], ["--commit-interval-ms", 0]):
        proc = cli("--cluster", url, "consume", "--topic", "t", *bad)
        assert (proc.returncode, proc.stdout) == (2, "") and "--commit-interval-ms" in proc.stderr


# -- Admin.consume: commits what the caller consumed --------------------------------------------

@pytest.fixture
def admin(tmp_path) -> Admin:
    a = Admin(str(tmp_path / "kl"))
    a.create_topic("t")
    a.produce("t", [Record(None, b"v%d" % i, 1_000 + i) for i in range(10)])
    return a


def test_admin_consume_is_an_iterator_that_commits_only_consumed_records(admin):
    c = admin.consume("t", group="g", auto_commit_interval_ms=0)
    assert iter(c) is c
    assert [next(c).offset for _ in range(3)] == [0, 1, 2]
    # 0 and 1 are consumed (the next one was asked for); 2 is still in the caller's hands
    assert committed(admin.cluster.url, "g", "t") == 2
    assert c.positions() == {("t", 0): 3}
    c.close()
    assert committed(admin.cluster.url, "g", "t") == 2
    assert list(c) == []

    with admin.consume("t", group="g") as c:       # resumes with the record not consumed
        for r in c:
            if r.offset == 5:
                break
    assert committed(admin.cluster.url, "g", "t") == 5

    c = admin.consume("t", group="g", enable_auto_commit=False)
    assert [next(c).offset for _ in range(2)] == [5, 6]
    c.commit()                                     # Kafka's commitSync(): all handed out
    assert committed(admin.cluster.url, "g", "t") == 7
    next(c)
    del c                                          # abandoned: nothing more is committed
    gc.collect()
    assert committed(admin.cluster.url, "g", "t") == 7

    c = admin.consume("t", group="g", enable_auto_commit=False)
    assert [r.offset for r in c] == [7, 8, 9]
    assert committed(admin.cluster.url, "g", "t") == 7   # no auto-commit: not even at the end
    c.commit({("t", 0): 8})
    assert committed(admin.cluster.url, "g", "t") == 8
    with pytest.raises(InvalidConfigError):
        c.commit({("other", 0): 1})

    assert [r.offset for r in admin.consume("t", group="g")] == [8, 9]   # the end commits
    assert committed(admin.cluster.url, "g", "t") == 10
    assert list(admin.consume("t", group="g")) == []


def test_admin_consume_max_records_and_errors(admin):
    assert [r.offset for r in admin.consume("t", group="g", max_records=4)] == [0, 1, 2, 3]
    assert committed(admin.cluster.url, "g", "t") == 4
    assert [r.offset for r in admin.consume("t", start=8)] == [8, 9]
    with pytest.raises(InvalidConfigError, match="consumer group"):
        admin.consume("t").commit()
    with pytest.raises(UnknownTopicOrPartitionError):
        admin.consume("nope")


def test_a_fetch_is_decoded_a_run_of_batches_at_a_time(admin):
    """A megabyte fetch of small records would be tens of thousands of objects: the consumer
    decodes it in runs of batches of about ``max_records`` records."""
    from pyspark_kafkalog.client import consumer as cons
    admin.create_topic("u")
    Producer(admin.cluster).produce("u", [Record(None, b"w%d" % i, 2_000) for i in range(30)],
                                    batch_records=10)          # one segment, three batches
    view = admin.cluster.partition_view("u", 0)

    def runs(start, max_records):
        chunks = list(cons.fetch_chunks(view, start, max_records=max_records))
        assert [r.offset for rows, _ in chunks for r in rows] == list(range(start, 30))
        return [nxt for _, nxt in chunks]
    assert runs(3, 1) == [10, 20, 30]
    assert runs(3, 15) == [20, 30]
    assert runs(0, 1000) == [30]
    assert runs(29, 1) == [30]


# -- offsets belong to a topic id ---------------------------------------------------------------

def test_an_offset_of_a_deleted_topic_does_not_apply_to_its_successor(admin, tmp_path):
    url = admin.cluster.url
    admin.produce("t", [Record(None, b"x", 2_000)] * 6)                   # 16 records
    assert len(list(admin.consume("t", group="g"))) == 16
    old_id = admin.describe_topic("t").topic_id
    entry = json.loads(max((Path(url) / "_kafkalog" / "groups" / "g").glob("*.json"))
                       .read_text())
    assert entry["offsets"]["t:0"] == {"offset": 16, "metadata": "", "topic_id": old_id}

    admin.delete_topic("t")
    admin.create_topic("t")
    admin.produce("t", [Record(None, b"n%d" % i, 3_000) for i in range(5)])
    assert admin.list_group_offsets("g") == {}
    lag = [(l.partition, l.committed_offset, l.log_end_offset, l.lag)
           for l in admin.describe_group("g")]
    assert lag == [(0, None, 5, None)]
    assert admin.reset_group_offsets("g", "t", to="shift", shift=2, dry_run=True) == {
        TopicPartition("t", 0): 2}                                      # from the log start
    assert [r.value for r in admin.consume("t", group="g")] == [b"n%d" % i for i in range(5)]
    assert committed(url, "g", "t") == 5
    assert admin.list_group_offsets("g")[TopicPartition("t", 0)].topic_id == (
        admin.describe_topic("t").topic_id)


def test_describe_shows_a_stale_offset_as_not_committed_in_the_cli(admin):
    url = admin.cluster.url
    assert len(list(admin.consume("t", group="g"))) == 10
    admin.delete_topic("t")
    admin.create_topic("t")
    admin.produce("t", [Record(None, b"n", 1)] * 3)
    out = cli("--cluster", url, "--json", "groups", "--describe", "--group", "g")
    assert [json.loads(line) for line in out.stdout.splitlines()] == [
        {"group": "g", "topic": "t", "partition": 0, "current_offset": None,
         "log_end_offset": 3, "lag": None}]
    assert offsets(cli("--cluster", url, "consume", "--topic", "t", "--group", "g").stdout) == [
        0, 1, 2]


def test_entries_without_a_topic_id_still_load(admin):
    """Entries written before topic ids were stored: kept, except an offset past the log's end,
    which is out of range and resets (Kafka's auto.offset.reset=earliest)."""
    url = admin.cluster.url
    d = Path(url) / "_kafkalog" / "groups" / "old"
    d.mkdir(parents=True)
    (d / ("0" * 20 + ".json")).write_text(json.dumps(
        {"offsets": {"t:0": {"offset": 7, "metadata": "m"}}, "timestamp": 0}))
    assert admin.list_group_offsets("old") == {TopicPartition("t", 0): _om(7, "m")}
    assert [r.offset for r in admin.consume("t", group="old")] == [7, 8, 9]
    (d / ("0" * 19 + "9.json")).write_text(json.dumps(
        {"offsets": {"t:0": {"offset": 15, "metadata": ""}}, "timestamp": 0}))
    assert [r.offset for r in admin.consume("t", group="old")] == list(range(10))


def _om(offset, metadata=""):
    from pyspark_kafkalog.admin import OffsetAndMetadata
    return OffsetAndMetadata(offset, metadata)


# -- group ids: one rule everywhere ---------------------------------------------------------------

BAD_GROUPS = ["", ".", "..", "a/b", "/", "a\nb", "tab\there", "del\x7f", "x" * 250, "ü" * 50]


@pytest.mark.parametrize("group", BAD_GROUPS)
def test_bad_group_ids_are_rejected_by_the_api(admin, group):
    calls = [lambda: admin.consume("t", group=group),
             lambda: admin.list_group_offsets(group),
             lambda: admin.commit_group_offsets(group, {("t", 0): 1}),
             lambda: admin.describe_group(group),
             lambda: admin.reset_group_offsets(group, "t"),
             lambda: admin.delete_group(group),
             lambda: GroupStore(admin.cluster.storage).fetch(group)]
    for call in calls:
        with pytest.raises(InvalidGroupIdError) as info:
            call()
        assert info.value.error_code == 24 and isinstance(info.value, KafkaLogError)
    assert admin.list_groups() == []


@pytest.mark.parametrize("group", ["", ".", "..", "a/b", "x" * 250])
def test_bad_group_ids_are_one_line_errors_in_the_cli(admin, capsys, group):
    url = admin.cluster.url
    for argv in (["consume", "--topic", "t", "--group", group],
                 ["groups", "--describe", "--group", group],
                 ["groups", "--reset-offsets", "--group", group, "--topic", "t", "--to-latest"]):
        assert main(["--cluster", url, *argv]) == 2
        out, err = capsys.readouterr()
        assert out == "" and len(err.splitlines()) == 1
        assert err.startswith("kafkalog: error: InvalidGroupIdError: invalid group id")
    assert not (Path(url) / "_kafkalog" / "groups").exists()


def test_a_bad_group_id_in_a_real_process(admin):
    proc = cli("--cluster", admin.cluster.url, "consume", "--topic", "t", "--group", ".")
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == ("kafkalog: error: InvalidGroupIdError: invalid group id '.': '.' and "
                           "'..' are not allowed\n")


@pytest.mark.parametrize("group", ["g", "a.b", "..a", "a..", "x" * MAX_GROUP_ID_LENGTH,
                                   "with space", "ü" * 40, "%2F", "colon:ok"])
def test_good_group_ids_round_trip(admin, group):
    assert validate_group_id(group) == group
    assert [r.offset for r in admin.consume("t", group=group, max_records=2)] == [0, 1]
    assert admin.list_groups() == [group]
    assert committed(admin.cluster.url, group, "t") == 2
    admin.delete_group(group)
    assert admin.list_groups() == []
