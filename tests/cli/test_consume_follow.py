"""`consume --follow` (issue #15): a real follower process prints records other processes
produce after it started, per partition in offset order and each once; it ends at
--max-messages, on Ctrl-C (exit 0, the group's offsets exactly what it printed) and when its topic
is deleted (exit 1, one line); it reads partitions added meanwhile and skips, with a warning,
records deleted before it read them. In-process, with a counting storage: an idle poll costs the
same few requests however many partitions the topic has, and a poll after one partition changed
reads only that partition. Waits for output have a generous deadline; assertions are on content.
"""
from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from support.cli_support import REPO, fill_big_topic, peak_rss_kb, run_cli, run_main
from pyspark_kafkalog.admin import Admin, TopicPartition
from pyspark_kafkalog.client.producer import Producer
from pyspark_kafkalog.errors import InvalidConfigError, UnknownTopicIdError
from pyspark_kafkalog.format.records import Record

CLI = [sys.executable, "-m", "pyspark_kafkalog.cli.main"]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}
DEADLINE_S = 240          # for output that should come within a second: only a hang hits it


pytestmark = pytest.mark.slow   # follower processes fed by other processes (~10 s)


class FollowerProcess:
    """``kafkalog --cluster URL consume ARGS`` with its stdout and stderr read as they come."""

    def __init__(self, url: str, *argv):
        self.proc = subprocess.Popen([*CLI, "--cluster", url, "consume", *map(str, argv)],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV)
        self.lines, self.err = [], []
        self._cv = threading.Condition()
        self._threads = [threading.Thread(target=self._pump, args=(s, b), daemon=True)
                         for s, b in ((self.proc.stdout, self.lines),
                                      (self.proc.stderr, self.err))]
        for t in self._threads:
            t.start()

    def _pump(self, stream, into):
        for line in stream:
            with self._cv:
                into.append(line.decode())
                self._cv.notify_all()

    def records(self):
        with self._cv:
            return [json.loads(line) for line in self.lines]

    def wait_for(self, n: int, what=None):
        """Until ``n`` records are out (or ``what(stderr lines)`` holds); fails on a hang."""
        done = (lambda: len(self.lines) >= n) if what is None else (lambda: what(self.err))
        with self._cv:
            ok = self._cv.wait_for(lambda: done() or self.proc.poll() is not None, DEADLINE_S)
            assert ok and done(), (self.lines, self.err, self.proc.poll())
        return self.records()

    def finish(self) -> int:
        """Its exit status, once it exited by itself; all of its output read."""
        rc = self.proc.wait(timeout=DEADLINE_S)
        for t in self._threads:
            t.join(DEADLINE_S)
        return rc

    def interrupt(self) -> int:
        self.proc.send_signal(signal.SIGINT)
        return self.finish()

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def followers():
    started = []

    def start(*argv):
        started.append(FollowerProcess(*argv))
        return started[-1]
    yield start
    for f in started:
        f.kill()


@pytest.fixture
def url(tmp_path) -> str:
    return str(tmp_path / "kl")


def produce(url: str, topic: str, values, partition=None):
    """``kafkalog produce`` in its own process."""
    lines = "".join(json.dumps({"value": base64.b64encode(v.encode()).decode()}) + "\n"
                    for v in values)
    argv = ["--cluster", url, "produce", "--topic", topic]
    if partition is not None:
        argv += ["--partition", partition]
    rc, out, err = run_cli(*argv, stdin=lines)
    assert rc == 0, err


def by_partition(records):
    out = {}
    for r in records:
        out.setdefault(r["partition"], []).append(r["offset"])
    return out


def wait_committed(url: str, group: str, expected, topic: str = "t"):
    """Until the group's offsets are ``expected`` (a follower commits them by itself)."""
    deadline = time.monotonic() + DEADLINE_S
    while committed(url, group, topic) != expected:
        assert time.monotonic() < deadline, committed(url, group, topic)
        time.sleep(0.05)


def value(r) -> str:
    return base64.b64decode(r["value"]).decode()


def committed(url: str, group: str, topic: str = "t"):
    return {tp.partition: om.offset for tp, om in Admin(url).list_group_offsets(group).items()
            if tp.topic == topic}


# -- real processes --------------------------------------------------------------------------

def test_a_follower_prints_what_is_produced_after_it_started_in_order_and_once(url, followers):
    Admin(url).create_topic("t", 2)
    produce(url, "t", ["old0", "old1"], partition=0)
    f = followers(url, "--topic", "t", "--follow", "--poll-interval-ms", 50)
    assert [value(r) for r in f.wait_for(2)] == ["old0", "old1"]
    produce(url, "t", ["a0", "a1", "a2"], partition=1)
    f.wait_for(5)
    produce(url, "t", ["b0"], partition=0)
    produce(url, "t", ["c0", "c1"], partition=1)
    records = f.wait_for(8)
    assert f.interrupt() == 0                      # Ctrl-C is how a follower ends
    assert f.err == []
    records = f.records()
    assert by_partition(records) == {0: [0, 1, 2], 1: [0, 1, 2, 3, 4]}
    assert [value(r) for r in records if r["partition"] == 1] == ["a0", "a1", "a2", "c0", "c1"]
    assert {r["topic"] for r in records} == {"t"}
    assert set(records[0]) == {"topic", "partition", "offset", "timestamp", "timestampType",
                               "magic", "control", "transactional", "producerId", "key",
                               "value", "headers"}     # consume's output, unchanged


def test_max_messages_stops_a_follower_and_commits_what_it_printed(url, followers):
    Admin(url).create_topic("t")
    produce(url, "t", ["x0", "x1"])
    f = followers(url, "--topic", "t", "--follow", "--max-messages", 5, "--group", "g",
                  "--poll-interval-ms", 20)
    f.wait_for(2)
    produce(url, "t", [f"y{i}" for i in range(6)])
    assert f.finish() == 0                          # by itself, at the fifth record
    assert [r["offset"] for r in f.records()] == [0, 1, 2, 3, 4]
    assert f.err == []
    assert committed(url, "g") == {0: 5}
    rc, out, _ = run_cli("--cluster", url, "consume", "--topic", "t", "--group", "g")
    assert [json.loads(line)["offset"] for line in out.splitlines()] == [5, 6, 7]


@pytest.mark.parametrize("interval", [None, 0])
def test_ctrl_c_commits_what_a_follower_printed(url, followers, interval):
    """Offsets are committed from a snapshot taken when the follower has flushed everything
    it read. With --commit-interval-ms 0 it commits each time it has caught up, so once the
    group's offsets show every printed record, Ctrl-C must leave them exactly there. With the
    default interval Ctrl-C commits the last snapshot: all printed, or (if the signal came
    between the last flush and its snapshot) all but that flush's records."""
    Admin(url).create_topic("t", 3)
    produce(url, "t", ["p0"], partition=0)
    extra = [] if interval is None else ["--commit-interval-ms", interval]
    f = followers(url, "--topic", "t", "--follow", "--group", "g", "--poll-interval-ms", 50,
                  *extra)
    f.wait_for(1)
    produce(url, "t", ["q0", "q1"], partition=2)
    f.wait_for(3)
    produce(url, "t", ["r0"], partition=0)
    f.wait_for(4)
    everything = {0: 2, 1: 0, 2: 2}     # also the partition with no record: it was reached
    if interval == 0:
        wait_committed(url, "g", everything)
    assert f.interrupt() == 0 and f.err == []
    assert by_partition(f.records()) == {0: [0, 1], 2: [0, 1]}
    got = committed(url, "g")
    if interval == 0:
        assert got == everything
    else:
        assert got in (everything, {0: 1, 1: 0, 2: 2}), got
    produce(url, "t", ["s0"], partition=1)
    rc, out, _ = run_cli("--cluster", url, "consume", "--topic", "t", "--group", "g")
    assert rc == 0 and [(r["partition"], r["offset"]) for r in map(json.loads,
                                                                   out.splitlines())] == [(1, 0)]


def test_a_partition_added_while_following_is_read_from_its_start(url, followers):
    Admin(url).create_topic("t")
    f = followers(url, "--topic", "t", "--follow", "--poll-interval-ms", 50)
    produce(url, "t", ["first"])
    f.wait_for(1)
    rc, _, err = run_cli("--cluster", url, "topics", "--alter", "--topic", "t",
                         "--partitions", 2)
    assert rc == 0, err
    produce(url, "t", ["n0", "n1"], partition=1)
    produce(url, "t", ["second"], partition=0)
    f.wait_for(4)
    assert f.interrupt() == 0 and f.err == []
    records = f.records()
    assert by_partition(records) == {0: [0, 1], 1: [0, 1]}
    assert [value(r) for r in records if r["partition"] == 1] == ["n0", "n1"]


def test_records_deleted_before_they_were_read_are_skipped_with_a_warning(url, followers):
    admin = Admin(url)
    admin.create_topic("t")
    produce(url, "t", ["k0", "k1", "k2"])
    f = followers(url, "--topic", "t", "--follow", "--group", "g", "--poll-interval-ms", 50,
                  "--commit-interval-ms", 0)
    f.wait_for(3)
    wait_committed(url, "g", {0: 3})                # it is idle, at offset 3
    f.proc.send_signal(signal.SIGSTOP)              # behind, wherever it was: at offset 3
    try:
        produce(url, "t", [f"m{i}" for i in range(3, 10)])
        res = admin.delete_records_before({TopicPartition("t", 0): 7})
        assert res[TopicPartition("t", 0)].low_watermark == 7
    finally:
        f.proc.send_signal(signal.SIGCONT)
    records = f.wait_for(6)
    wait_committed(url, "g", {0: 10})
    assert f.interrupt() == 0
    assert [r["offset"] for r in records] == [0, 1, 2, 7, 8, 9]
    assert f.err == ["kafkalog: warning: t-0: offsets 3..6 were deleted before they were read "
                     "(4 records lost); skipping to 7\n"]
    assert committed(url, "g") == {0: 10}


def test_a_deleted_topic_ends_a_follower_with_one_line_and_exit_1(url, followers):
    Admin(url).create_topic("t")
    produce(url, "t", ["z"])
    f = followers(url, "--topic", "t", "--follow", "--group", "g", "--poll-interval-ms", 50)
    f.wait_for(1)
    rc, _, err = run_cli("--cluster", url, "topics", "--delete", "--topic", "t")
    assert rc == 0, err
    assert f.finish() == 1
    assert f.err == ["kafkalog: error: UnknownTopicIdError: topic 't' was deleted while being "
                     "followed\n"]
    assert [r["offset"] for r in f.records()] == [0]


def test_follow_options_are_checked(url):
    Admin(url).create_topic("t")
    rc, out, err = run_main("--cluster", url, "consume", "--topic", "t",
                            "--poll-interval-ms", 10)
    assert (rc, out) == (2, "") and err == ("kafkalog: error: InvalidConfigError: "
                                            "--poll-interval-ms needs --follow\n")
    rc, out, err = run_main("--cluster", url, "consume", "--topic", "t", "--follow",
                            "--poll-interval-ms", -1)
    assert (rc, out) == (2, "") and "--poll-interval-ms" in err and len(err.splitlines()) == 1


# -- in-process: the admin API and what a poll costs --------------------------------------------

class Stop(Exception):
    pass


def counting(storage):
    """Record every storage call (name, path) from now on, by wrapping the instance's methods."""
    calls = []
    for name in ("read", "read_into", "map", "size", "exists", "list", "list_dirs", "mtime",
                 "create_if_absent", "replace", "append", "delete"):
        real = getattr(storage, name)

        def wrapper(path="", *args, _real=real, _name=name, **kw):
            calls.append((_name, str(path)))
            return _real(path, *args, **kw)
        setattr(storage, name, wrapper)
    return calls


@pytest.mark.parametrize("partitions", [1, 64])
def test_an_idle_poll_costs_the_same_whatever_the_topic_and_a_change_reads_one_partition(
        url, partitions):
    admin = Admin(url)
    admin.create_topic("wide", partitions)
    producer = Producer(admin.cluster)
    for p in range(partitions):
        producer.produce("wide", [Record(None, b"old", 1)] * 3, partition=p)
    other = Admin(url)                            # another client writes while we follow
    follower = Admin(url)
    calls = counting(follower.cluster.storage)
    marks = []                                    # calls so far, at each caught-up point

    def caught_up():
        marks.append(len(calls))
        if len(marks) == 6:                       # five idle polls: now one partition changes
            other.produce("wide", [Record(None, b"new", 2)], partition=partitions - 1)
        if len(marks) == 12:
            raise Stop
    got = []
    with pytest.raises(Stop):
        for r in follower.consume("wide", follow=True, poll_interval_ms=0,
                                  on_caught_up=caught_up):
            got.append((r.partition, r.offset, r.value))
    assert len(got) == 3 * partitions + 1 and got[-1] == (partitions - 1, 3, b"new")
    per_poll = [b - a for a, b in zip(marks, marks[1:])]
    idle = per_poll[:5] + per_poll[6:]
    # one read of the metadata entry that does not exist yet, whatever the partition count
    assert idle == [1] * 10, per_poll
    assert per_poll[5] <= 10, per_poll          # the new entry, and one partition's files
    changed = calls[marks[5]:marks[6]]
    read_dirs = {path.split("/")[1] for _, path in changed if not path.startswith("_kafkalog/")}
    assert read_dirs == {f"wide-{partitions - 1}"}, changed


def test_admin_follow_sees_its_own_process_writes_and_auto_commits_what_was_consumed(url):
    """Writes through the same client, and the writability check of a group commit, replay the
    metadata log in this process before the follower polls it: the fetch session must still
    see what those entries changed."""
    admin = Admin(url)
    admin.create_topic("t")
    admin.produce("t", [Record(None, b"v0", 1)])
    other = Admin(url)
    polls = []

    def caught_up():
        polls.append(1)
        if len(polls) == 1:
            admin.produce("t", [Record(None, b"v1", 1), Record(None, b"v2", 1)])
        elif len(polls) == 2:
            other.produce("t", [Record(None, b"v3", 1)])
            admin.cluster.state()
        elif len(polls) > 1000:
            raise AssertionError("the follower never saw v3")
    follower = admin.consume("t", group="g", follow=True, poll_interval_ms=0,
                             auto_commit_interval_ms=0, on_caught_up=caught_up)
    with follower:
        got = [next(follower).value for _ in range(4)]
    assert got == [b"v0", b"v1", b"v2", b"v3"]
    # v3 was still in the caller's hands when it closed: consumed are v0..v2
    assert committed(url, "g") == {0: 3}


def test_admin_follow_raises_a_typed_error_when_its_topic_is_recreated(url):
    admin = Admin(url)
    admin.create_topic("t")
    admin.produce("t", [Record(None, b"v", 1)])
    other = Admin(url)

    def caught_up():
        other.delete_topic("t")
        other.create_topic("t")
    follower = admin.consume("t", follow=True, poll_interval_ms=0, on_caught_up=caught_up)
    assert next(follower).offset == 0
    with pytest.raises(UnknownTopicIdError, match="deleted while being followed") as info:
        next(follower)
    assert info.value.error_code == 100 and not info.value.user_error
    with pytest.raises(InvalidConfigError, match="follow=True"):
        admin.consume("t", on_caught_up=lambda: None)


def test_following_a_long_partition_keeps_memory_bounded(tmp_path):
    """Catching up on 250,000 records holds one fetch at a time, as consume does."""
    url = str(tmp_path / "kl")
    fill_big_topic(url, 250_000)
    baseline = peak_rss_kb(["--cluster", url, "consume", "--topic", "e", "--group", "rss"])
    peak = peak_rss_kb(["--cluster", url, "consume", "--topic", "m", "--group", "rss",
                        "--follow", "--max-messages", 250_000])
    assert peak - baseline < 24 * 1024, (peak, baseline)
    assert committed(url, "rss", "m") == {0: 250_000}
