"""Failover with real processes (docs/protocol.md §1.3, "Elections"; docs/operations.md,
"Replication"): the issue's criterion

    A topic with RF=2 over two local roots, with writers producing all the time. Midway, the
    leader's root is made unavailable (renamed, or its permissions removed), and later
    restored. No acknowledged record is lost or duplicated, and writes continue within seconds
    of the failover. The returning replica rejoins the ISR, and its segments are
    byte-identical to the leader's.

Layout: the cluster root (metadata log, ``logdir-0``, which holds no replica here) and two
more local roots registered as log dirs: ``logdir-1`` (root A) leads every partition of the
topic, ``logdir-2`` (root B) follows. So root A goes away without the metadata log.

Processes (all real, tests/procs/failover_child.py and replication_child.py): an active
coordinator and a standby (``broker.session.timeout.ms`` 1500, ``replica.lag.time.max.ms``
2000, ``replica.fetch.wait.max.ms`` 50, lease 2000); two producers writing acks=all units all
the time, each unit's outcome and times logged, a failed unit followed by a new one after a
short backoff; a reader that consumes everything again and again and reports any offset that
shows two values or disappears.

Parametrized: root A renamed away and back; the same with the active coordinator SIGKILLed as
root A goes (the standby takes the lease and elects); root A's permissions removed and restored
(skipped as root, whom permissions do not stop). A second reader follows the topic
(``consume --follow``) and starts again from its group's offsets whenever it raises.

Checked: one clean (``offline``) ``elect_leader`` per partition in the metadata log, moving
the leader to root B with a leader epoch bump of one; producers were acknowledged
again within a generous bound after root A went away (the measured gap is printed: -s); root A
rejoins every ISR and its committed segment files (and ``partition.metadata``) are byte-identical
to the new leader's, with no file of a truncated range left; every acknowledged record is read
exactly once at its acknowledged offset, and nothing else (no failed unit's record); the reader
never saw an offset with two values, nor one vanish, and saw exactly the acknowledged records;
the follower read each acknowledged record (at least once), never two at one offset, nothing
else; the metadata log verifies. Readers' errors during the outage are counted, not failed on
(before the election the leader's files are not there to read).

``KAFKALOG_TORTURE_SCALE`` (default 1: each case about 20 s) multiplies the partitions and the
time spent in each phase; ``KAFKALOG_SEED`` fixes the producers' random choices.
"""
from __future__ import annotations

import functools
import hashlib
import os
import random
import re
import stat
import time
from collections import Counter
from pathlib import Path

import pytest

from support.polling import eventually as poll_until
from support.processes import ChildProcess

from procs.torture_common import value_for
from pyspark_kafkalog.admin import Admin
from pyspark_kafkalog.maintenance.metadata_check import verify
from pyspark_kafkalog.cluster.metalog import LOG_DIR, entry_name, parse_json
from pyspark_kafkalog.cluster.state import ClusterState

SCALE = max(1, int(os.environ.get("KAFKALOG_TORTURE_SCALE", "1")))
SEED = int(os.environ.get("KAFKALOG_SEED", "0")) or random.randrange(1 << 30)
HERE = Path(__file__).resolve().parents[1]          # tests/
FAILOVER_CHILD = HERE / "procs" / "failover_child.py"
REPLICATION_CHILD = HERE / "procs" / "replication_child.py"
TOKEN = "0123456789abcdef" * 4
LEASE_MS = 2000
FETCH_WAIT_MS = 50            # replica.fetch.wait.max.ms
LAG_MS = 2000                 # replica.lag.time.max.ms
SESSION_MS = 1500             # broker.session.timeout.ms
PARTITIONS = 4 * SCALE
TOPIC = "f"
TOPIC_CONFIG = {"segment.bytes": "4096", "index.interval.bytes": "512"}
A, B = "logdir-1", "logdir-2"
PHASE_S = 2.0 * SCALE         # writing before the outage, during it, after it
FAILOVER_BOUND_S = 30.0       # generous: only the measured gap is meant to be read
DEADLINE_S = 120              # against hangs only
SEGMENT = re.compile(r"^(\d{20})\.(log|index|timeindex)$")


# -- processes --------------------------------------------------------------------------------

pytestmark = pytest.mark.slow   # coordinators and producers killed while a root goes away (~25 s)


class Child(ChildProcess):
    """A failover or replication child (tests/procs/failover_child.py, replication_child.py)."""

    def __init__(self, tmp: Path, name: str, script: Path, *args):
        super().__init__(tmp, name, script, *args, deadline_s=DEADLINE_S)


eventually = functools.partial(poll_until, deadline_s=DEADLINE_S)


def coordinator(tmp: Path, name: str, url: str) -> Child:
    c = Child(tmp, name, FAILOVER_CHILD, "coordinator", url, TOKEN, LEASE_MS, FETCH_WAIT_MS,
              LAG_MS, SESSION_MS)
    eventually(lambda: any("serving" in line for line in c.lines()) or not c.alive(),
               f"{name} runs", describe=c.stderr_tail)
    assert c.alive(), c.stderr_tail()
    return c


# -- taking root A away and back --------------------------------------------------------------

class Outage:
    """Root A unavailable: renamed away, or its permissions removed."""

    def __init__(self, how: str, root: Path):
        self.how, self.root = how, root
        self.away_path = root.with_name(root.name + "-away")
        self.is_away = False
        self.moved_aside = []        # directories recreated at root A's path while it was away

    def away(self) -> None:
        if self.how == "rename":
            self.root.rename(self.away_path)
        else:
            os.chmod(self.root, 0)
        self.is_away = True

    def back(self) -> None:
        if self.how == "chmod":
            os.chmod(self.root, stat.S_IRWXU | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH
                     | stat.S_IXOTH)
            self.is_away = False
            return
        # A process that opened root A's path while it was away (a local path is created
        # again by a write) leaves a directory there. Files written to the mount point of an
        # unmounted disk are hidden when it is mounted again: such a directory is moved
        # aside, and nothing may count on what is in it. rename(2) replaces an empty one.
        for attempt in range(50):
            if self.root.exists():
                if any(self.root.iterdir()):
                    aside = self.root.with_name(f"{self.root.name}-hidden-{len(self.moved_aside)}")
                    self.root.rename(aside)
                    self.moved_aside.append(sorted(str(p.relative_to(aside))
                                                   for p in aside.rglob("*")))
            try:
                self.away_path.rename(self.root)
                break
            except OSError:          # recreated again in between: once more
                time.sleep(0.01)
        else:
            pytest.fail(f"could not put {self.root} back")
        self.is_away = False


# -- state ------------------------------------------------------------------------------------

def reps(admin: Admin):
    state = admin.cluster.state()
    return state, {p: state.partition(TOPIC, p) for p in range(PARTITIONS)}


def summary(admin: Admin) -> str:
    _state, parts = reps(admin)
    out = []
    for p, ps in parts.items():
        r = ps.replication or {}
        out.append(f"{TOPIC}-{p}: leader={r.get('leader')} epoch={ps.leader_epoch} "
                   f"isr={r.get('isr')} joining={r.get('joining')} hw={r.get('high_watermark')} "
                   f"lso={ps.last_stable_offset}")
    return "; ".join(out)


def all_partitions(admin: Admin, test) -> bool:
    _state, parts = reps(admin)
    return all(ps.replication is not None and test(ps.replication, ps) for ps in parts.values())


def committed_base(ps, base: int) -> bool:
    """The segment at ``base`` holds committed data at or above the log start offset."""
    return base >= ps.log_start_offset and any(s <= base < e for s, e, _ep in ps.committed)


def elections(url: str):
    """Replays the metadata log from entry 0: ``[(seq, election, {tp key: (result error or
    "NONE", leader epoch before, leader epoch after)})]`` of every ``elect_leader``, and the
    final state."""
    storage = Admin(url, create=False).cluster.storage
    seqs = sorted(int(f.name[:20]) for f in storage.list(LOG_DIR)
                  if re.fullmatch(r"\d{20}\.json", f.name))
    assert seqs == list(range(len(seqs))), "the metadata log must be whole from entry 0"
    state, out = ClusterState(), []
    for seq in seqs:
        entry = parse_json(entry_name(seq), storage.read(entry_name(seq)))
        ops = [raw.get("op") for raw in entry["actions"]]
        before = {k: ps.leader_epoch for k, ps in state.partitions.items()}
        state.apply(seq, entry)
        for raw, res in zip(entry["actions"], state.results[seq]):
            if raw.get("op") == "elect_leader":
                assert ops == ["elect_leader"], f"entry {seq}: {ops}"
                out.append((seq, raw["election"], {
                    k: (r.error or "NONE", before.get(k), state.partitions[k].leader_epoch)
                    for k, r in res.partitions.items()}))
    return out, state


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def segment_files(d: Path):
    return {f: int(m.group(1)) for f in (os.listdir(d) if d.is_dir() else [])
            if (m := SEGMENT.match(f))}


# -- the test ---------------------------------------------------------------------------------

@pytest.mark.parametrize("how,kill_active", [("rename", False), ("rename", True),
                                              ("chmod", False)],
                         ids=["rename", "rename-and-kill-the-active-coordinator", "chmod"])
def test_leaders_root_goes_away_and_returns_under_producers(tmp_path, how, kill_active):
    """``kill_active``: the active coordinator is SIGKILLed as root A goes away, so the standby
    takes the lease (after ``lease_ms``), sees root A unreadable for
    ``broker.session.timeout.ms`` by its own clock, and elects."""
    if how == "chmod" and os.geteuid() == 0:
        pytest.skip("root ignores file permissions: removing them does not make a root "
                    "unavailable to this process")
    print(f"seed {SEED} (KAFKALOG_SEED={SEED} KAFKALOG_TORTURE_SCALE={SCALE}), outage by {how}")
    url, root_a, root_b = str(tmp_path / "root"), tmp_path / "rootA", tmp_path / "rootB"
    admin = Admin(url, fsync=False)
    assert admin.add_log_dir(str(root_a)).log_dir == A
    assert admin.add_log_dir(str(root_b)).log_dir == B
    # every partition led by root A, followed on root B (placement would spread the leaders)
    admin.cluster.assign_replicas = lambda n, rf, *args, **kw: [[A, B] for _ in range(n)]
    admin.create_topic(TOPIC, PARTITIONS, 2, TOPIC_CONFIG)
    assert admin.cluster.state().topics[TOPIC]["replicas"] == [[A, B]] * PARTITIONS
    paths = {A: root_a, B: root_b}

    outage = Outage(how, root_a)
    stop_producers, stop_tailer = tmp_path / "stop-producers", tmp_path / "stop-tailer"
    children = []
    try:
        active = coordinator(tmp_path, "coordinator-0", url)
        children.append(active)
        eventually(lambda: all_partitions(admin, lambda r, ps: r["isr"] == [A, B]),
                   "root B joins every ISR", describe=lambda: summary(admin)
                   + active.stderr_tail())
        standby = coordinator(tmp_path, "coordinator-1", url)
        children.append(standby)
        lease = admin.cluster.state().coordinator
        _state, before = reps(admin)
        epochs_before = {p: ps.leader_epoch for p, ps in before.items()}

        producers = [Child(tmp_path, f"producer-{i}", FAILOVER_CHILD, "producer", url,
                           f"w{i}", SEED + i, stop_producers, TOPIC) for i in range(2)]
        children += producers
        tailer = Child(tmp_path, "tailer", REPLICATION_CHILD, "tailer", url, stop_tailer, TOPIC)
        follower = Child(tmp_path, "follower", FAILOVER_CHILD, "follower", url, stop_tailer,
                         TOPIC)
        children += [tailer, follower]
        eventually(lambda: all(sum("ack" in line for line in pr.lines()) >= 5
                               for pr in producers), "both producers are acknowledged",
                   describe=lambda: producers[0].stderr_tail() + producers[1].stderr_tail())
        time.sleep(PHASE_S)

        # -- root A goes away -------------------------------------------------------------
        t_away = time.time()
        outage.away()
        if kill_active:
            active.kill()
        print(f"{time.time() - t_away:.3f}: root A {how} away"
              f"{' and the active coordinator killed' if kill_active else ''}; {summary(admin)}")
        eventually(lambda: all_partitions(admin, lambda r, ps: r["leader"] == B),
                   "every partition elects root B", describe=lambda: summary(admin)
                   + active.stderr_tail() + standby.stderr_tail())
        t_elected = time.time()
        print(f"{t_elected - t_away:.3f}: every partition led by root B; {summary(admin)}")

        def acked_after_away():
            """Partitions with an acknowledged unit that started after root A went away."""
            return {line["p"] for pr in producers for line in pr.lines()
                    if "ack" in line and line["t0"] > t_away}
        eventually(lambda: acked_after_away() == set(range(PARTITIONS)),
                   "producers are acknowledged on every partition after the failover",
                   describe=lambda: f"{sorted(acked_after_away())}; {summary(admin)}")
        time.sleep(PHASE_S)

        # -- root A comes back ------------------------------------------------------------
        t_back = time.time()
        outage.back()
        print(f"{time.time() - t_away:.3f}: root A back (moved aside: "
              f"{[len(m) for m in outage.moved_aside]} entries); {summary(admin)}")
        eventually(lambda: all_partitions(admin, lambda r, ps: r["isr"] == [B, A]),
                   "root A rejoins every ISR", describe=lambda: summary(admin)
                   + active.stderr_tail() + standby.stderr_tail())
        t_rejoined = time.time()
        print(f"{t_rejoined - t_away:.3f}: root A in every ISR again; {summary(admin)}")
        time.sleep(PHASE_S)

        stop_producers.touch()
        for pr in producers:
            assert pr.proc.wait(timeout=DEADLINE_S) == 0, pr.stderr_tail()
        eventually(lambda: all_partitions(
            admin, lambda r, ps: r["isr"] == [B, A] and not r["joining"]
            and r["high_watermark"] == ps.last_stable_offset),
            "every ISR full and HW == LSO", describe=lambda: summary(admin))
        stop_tailer.touch()
        assert tailer.proc.wait(timeout=DEADLINE_S) == 0, tailer.stderr_tail()
        assert follower.proc.wait(timeout=DEADLINE_S) == 0, follower.stderr_tail()
        lease_after = admin.cluster.state().coordinator
        assert standby.terminate() == 0, standby.stderr_tail()
        if not kill_active:
            assert active.terminate() == 0, active.stderr_tail()
    finally:
        stop_producers.touch()
        stop_tailer.touch()
        for c in children:
            c.kill()
        if outage.is_away:
            outage.back()

    # -- the units: acknowledged and failed ---------------------------------------------------
    acks, failed, errors, units = [], set(), Counter(), []
    for pr in producers:
        for line in pr.lines():
            if "ack" in line:
                acks += [tuple(a) for a in line["ack"]]
                units.append((line["t0"], line["t1"], line["p"], True))
            elif "failed" in line:
                failed.update(line["failed"])
                errors[line["error"]] += 1
                units.append((line["t0"], line["t1"], line["p"], False))
            else:
                pytest.fail(f"{pr.name}: {line}")
    assert len(acks) == len({a[3] for a in acks})
    assert len({a[:3] for a in acks}) == len(acks), "two acknowledged records at one offset"

    # -- the failover: an election with an epoch bump, writes acknowledged again soon -------
    elected, replayed = elections(url)
    assert elected, "no elect_leader in the metadata log"
    applied = Counter(k for _seq, kind, parts in elected for k, (e, _b, _a) in parts.items()
                      if e == "NONE" and kind == "offline")
    assert applied == {f"{TOPIC}:{p}": 1 for p in range(PARTITIONS)}, elected
    for _seq, _kind, parts in elected:
        for k, (e, epoch_before, epoch_after) in parts.items():
            if e == "NONE":
                assert epoch_after == epoch_before + 1, (k, epoch_before, epoch_after)
    state = admin.cluster.state()
    assert state.seq == replayed.seq
    for p in range(PARTITIONS):
        ps = state.partition(TOPIC, p)
        assert ps.replication["leader"] == B
        assert ps.leader_epoch > epochs_before[p], (p, epochs_before[p], ps.leader_epoch)
    # per partition: from root A going away to the first ack of a unit that began after it
    gap = {p: min(t1 for t0, t1, q, ok in units if ok and q == p and t0 > t_away) - t_away
           for p in range(PARTITIONS)}
    # the longest stretch without any acknowledgement, around the outage
    ack_times = sorted(t1 for t0, t1, _p, ok in units if ok)
    stall = max(b - a for a, b in zip(ack_times, ack_times[1:]) if b > t_away - 1)
    failed_during = [u for u in units if not u[3]]
    assert max(gap.values()) < FAILOVER_BOUND_S, gap
    if kill_active:
        assert lease_after["epoch"] > lease["epoch"], "the standby never took over"

    # -- the returning replica: in every ISR, byte-identical to the leader -------------------
    identical = 0
    for p in range(PARTITIONS):
        ps = state.partition(TOPIC, p)
        leader_dir, back_dir = paths[B] / f"{TOPIC}-{p}", paths[A] / f"{TOPIC}-{p}"
        lead, ret = segment_files(leader_dir), segment_files(back_dir)
        committed = sorted(b for n, b in lead.items() if n.endswith(".log")
                           and committed_base(ps, b))
        for base in committed:
            for suffix in (".log", ".index", ".timeindex"):
                name = f"{base:020d}{suffix}"
                assert name in ret, f"{TOPIC}-{p}: root A lacks {name} after rejoining"
                assert sha(back_dir / name) == sha(leader_dir / name), \
                    f"{TOPIC}-{p}: {name} on root A differs from the leader's"
                identical += 1
        stale = sorted(n for n, b in ret.items() if not committed_base(ps, b))
        assert not stale, f"{TOPIC}-{p}: root A keeps files of truncated or aborted ranges: " \
                          f"{stale[:6]}"
        foreign = sorted(n for n in ret if n not in lead)
        assert not foreign, f"{TOPIC}-{p}: root A has segment files the leader lacks: {foreign}"
        assert (back_dir / "partition.metadata").read_bytes() == \
            (leader_dir / "partition.metadata").read_bytes()

    # -- every acknowledged record exactly once, at its offset; nothing else ----------------
    seen, at = Counter(), {}
    for r in Admin(url, create=False).consume(TOPIC):
        key = r.key.decode()
        seen[key] += 1
        at[key] = (TOPIC, r.partition, r.offset)
        assert r.value == value_for(r.key), f"{TOPIC}-{r.partition}@{r.offset}: foreign value"
    twice = [k for k, n in seen.items() if n > 1]
    assert not twice, f"records read more than once: {twice[:10]}"
    missing = [a for a in acks if a[3] not in seen]
    assert not missing, f"{len(missing)} acknowledged records lost, e.g. {missing[:5]}"
    moved = [a for a in acks if at[a[3]] != a[:3]]
    assert not moved, f"records read elsewhere than acknowledged: {moved[:5]}"
    of_failed = sorted(failed & set(seen))
    assert not of_failed, f"{len(of_failed)} records of failed units read: {of_failed[:5]}"
    extra = set(seen) - {a[3] for a in acks}
    assert not extra, f"{len(extra)} records read that no call acknowledged: {sorted(extra)[:5]}"

    # -- the tailing reader: no offset with two values, none vanished -----------------------
    lines = tailer.lines()
    bad = [line for line in lines if {"two_values", "vanished", "foreign"} & set(line)]
    assert not bad, f"the tailing reader saw: {bad[:5]}"
    tail_seen = {}
    for line in lines:
        if "r" in line:
            t, p, o, key = line["r"]
            assert (t, p, o) not in tail_seen
            tail_seen[(t, p, o)] = key
    assert tail_seen == {a[:3]: a[3] for a in acks}
    read_errors = Counter(line["error"] for line in lines if "error" in line)

    # -- the follower (consume --follow): the same, at least once --------------------------
    followed, follow_errors = {}, []
    for line in follower.lines():
        if "r" in line:
            t, p, o, key = line["r"]
            assert line["ok"], f"the follower read a foreign value at {t}-{p}@{o}"
            assert followed.setdefault((t, p, o), key) == key, \
                f"the follower read two records at {t}-{p}@{o}: {followed[(t, p, o)]}, {key}"
        elif "error" in line:
            follow_errors.append(line)
    assert followed == {a[:3]: a[3] for a in acks}, \
        (f"the follower missed {len(set(a[:3] for a in acks) - set(followed))} acknowledged "
         f"records, read {len(set(followed) - set(a[:3] for a in acks))} others")

    report = verify(Admin(url, create=False).cluster.metalog)
    assert not report.problems, report.problems

    print(f"{len(acks)} acknowledged records in {sum(u[3] for u in units)} units, "
          f"{len(failed_during)} units failed {dict(errors)} (their records: {len(failed)}, "
          f"none read); coordinator lease {lease['holder'][:8]}.. epoch {lease['epoch']} "
          f"-> {lease_after['holder'][:8]}.. epoch {lease_after['epoch']}")
    print(f"failover: elected {t_elected - t_away:.2f} s after root A went away "
          f"(broker.session.timeout.ms {SESSION_MS}); first ack of a unit begun after it, per "
          f"partition: {', '.join(f'{p}: {g:.2f} s' for p, g in sorted(gap.items()))}; "
          f"longest stretch without any ack: {stall:.2f} s; failed units began "
          f"{', '.join(f'{u[0] - t_away:+.2f}' for u in failed_during[:8])} s from it")
    print(f"root A back after {t_back - t_away:.2f} s, in every ISR {t_rejoined - t_back:.2f} s "
          f"later; {identical} committed segment files byte-identical on both roots; "
          f"directories recreated at root A's path while away: "
          f"{[m[:4] for m in outage.moved_aside]}; tailer read errors {dict(read_errors)}, "
          f"{sum(1 for line in lines if 'r' in line)} offsets seen")
    print(f"elections {[(seq, kind, sorted(parts)) for seq, kind, parts in elected]}; "
          f"the follower (consume --follow) failed {len(follow_errors)} time(s) and resumed: "
          f"{[(round(e['t'] - t_away, 2), e['error'], e['msg'][:90]) for e in follow_errors[:3]]}")
