"""Replication between storage roots (docs/protocol.md §1.3, §11) with real processes killed at
random points: coordinators SIGKILLed (and one frozen with SIGSTOP, then let go as a zombie)
during a follower's catch-up, a producer appending all along, the follower's root renamed away
and back under a tailing reader.

Children are tests/procs/replication_child.py. Coordinators there copy slowly (512-byte chunks with a
short sleep after each), so that a kill lands inside a pass (mid-file, between a copy and its
``replica_progress``, between progress and ``alter_isr``) rather than between passes; some also
SIGKILL themselves right before or after one of their metadata appends, the windows a random
kill from outside rarely hits.

* ``test_coordinators_killed_during_catch_up``: two roots, a topic of 3 partitions with RF 2
  (leaders on both roots), a backlog of many sealed segments and empty followers; coordinators
  are killed, frozen and replaced again and again while a producer appends. Then one coordinator
  runs until every ISR is full and HW == LSO everywhere. Checked: every ``held`` range's segment
  files are on the follower, byte-identical to the leader's; every segment file the follower has
  under a final name is byte-identical to the leader's (no partial copy was ever published);
  every acknowledged record is read exactly once, at its acknowledged offset; the metadata log
  verifies (snapshots == replay), replaying it from scratch gives the state every client sees,
  and along that replay every ``replica_progress`` / ``alter_isr`` was rejected with
  ``STALE_CONTROLLER_EPOCH`` exactly when its epoch was not the current lease's, the high
  watermark never went back nor past the LSO, and every ISR member held everything below it.
* ``test_tailing_reader_sees_each_offset_once_while_the_follower_comes_and_goes``: the same
  under a reader that consumes everything again and again, while coordinators are killed and the
  follower's root is renamed away (it leaves the ISR after ``replica.lag.time.max.ms``) and back
  (it rejoins): no offset ever shows two values or disappears, and the last read is exactly
  the acknowledged records.

``KAFKALOG_TORTURE_SCALE`` (default 1: the file runs in well under a minute) multiplies the
rounds and the backlog; ``KAFKALOG_SEED`` fixes the parent's random choices (printed with -s).
Timeouts are generous and only guard against hangs: nothing here asserts on timing.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import random
import re
import signal
import time
from collections import Counter
from pathlib import Path

import pytest

from support.polling import eventually as poll_until
from support.processes import ChildProcess
from procs.torture_common import make_key, value_for
from pyspark_kafkalog.admin import Admin
from pyspark_kafkalog.cluster.cluster import Cluster
from pyspark_kafkalog.cluster.isr import replica_end
from pyspark_kafkalog.maintenance.metadata_check import verify
from pyspark_kafkalog.cluster.metalog import LOG_DIR, entry_name, parse_json
from pyspark_kafkalog.cluster.state import ClusterState
from pyspark_kafkalog.format.records import Record

SCALE = max(1, int(os.environ.get("KAFKALOG_TORTURE_SCALE", "1")))
SEED = int(os.environ.get("KAFKALOG_SEED", "0")) or random.randrange(1 << 30)
HERE = Path(__file__).resolve().parents[1]          # tests/
CHILD = HERE / "procs" / "replication_child.py"
TOKEN = "0123456789abcdef" * 4
LEASE_MS = 1000
FETCH_WAIT_MS = 50          # replica.fetch.wait.max.ms: a pass right after the last
LAG_MS = 1500               # replica.lag.time.max.ms
CATCH_UP_SLOW_MS = 2        # sleep after each 512 bytes a coordinator copies (test 1) ...
TAIL_SLOW_MS = 1            # ... and in test 2
DEADLINE_S = 180            # only against hangs; the machine may be shared


eventually = functools.partial(poll_until, deadline_s=DEADLINE_S, interval_s=0.1)
SEGMENT = re.compile(r"^(\d{20})\.(log|index|timeindex)$")
SEGMENT_CONFIG = {"segment.bytes": "4096", "index.interval.bytes": "512"}


pytestmark = pytest.mark.slow   # coordinators killed at random points while they copy (~20 s)


# -- processes --------------------------------------------------------------------------------

class Child(ChildProcess):
    """A replication child (tests/procs/replication_child.py)."""

    def __init__(self, tmp: Path, name: str, *args):
        super().__init__(tmp, name, CHILD, *args, deadline_s=DEADLINE_S)

    def stop(self) -> int:
        """SIGTERM: a coordinator stops cleanly and releases its lease (once it serves: its
        handler is set by then)."""
        eventually(lambda: serving_holder(self) or not self.alive(), f"{self.name} serves",
                   describe=self.stderr_tail)
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=DEADLINE_S)


class Coordinators:
    """Starts coordinator children, numbered; kills every one still running at the end."""

    def __init__(self, tmp: Path, url: str, rng: random.Random, slow_ms: int):
        self.tmp, self.url, self.rng, self.slow_ms = tmp, url, rng, slow_ms
        self.started = []

    def start(self, self_kill: bool = True) -> Child:
        """A new coordinator; with ``self_kill``, half of them may also kill themselves."""
        seed = self.rng.randrange(1, 1 << 30) if self_kill and self.rng.random() < 0.5 else 0
        c = Child(self.tmp, f"coordinator-{len(self.started)}", "coordinator", self.url, TOKEN,
                  LEASE_MS, FETCH_WAIT_MS, LAG_MS, self.slow_ms, seed)
        self.started.append(c)
        return c

    def kill_all(self) -> None:
        for c in self.started:
            if c.alive():
                try:
                    os.kill(c.pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
                c.kill()

    def self_kills(self) -> int:
        return sum("kills itself" in c.stderr_tail(1 << 20) for c in self.started)


def serving_holder(c: Child):
    for line in c.lines():
        if "serving" in line:
            return line["serving"]
    return None


def started(c: Child) -> Child:
    """Wait until a coordinator child serves (its imports take a second or two), or died (it
    may kill itself at its first metadata append): random kill times count from there."""
    eventually(lambda: serving_holder(c) or not c.alive(), f"{c.name} serves",
               describe=c.stderr_tail)
    return c


# -- the cluster ------------------------------------------------------------------------------

def new_cluster(tmp: Path):
    """A root (logdir-0) and a second root registered as logdir-1."""
    url, second = str(tmp / "root"), tmp / "second"
    admin = Admin(url, fsync=False)
    admin.add_log_dir(str(second))
    paths = {"logdir-0": tmp / "root" / "logdir-0", "logdir-1": second}
    return admin, url, paths


def seed_with_leader(n: int, start: int) -> int:
    """A placement seed whose start index (the first partition's leader) is ``start``."""
    return next(s for s in range(1000) if random.Random(s).randrange(n) == start)


def backlog(admin: Admin, topic: str, batches: int):
    """Many small produce calls per partition (each writes its own segments): acked records."""
    acks, wid = [], f"backlog-{topic}"
    n = admin.cluster.partition_count(topic)
    for call in range(batches):
        for p in range(n):
            keys = [make_key(wid, call * n + p, j) for j in range(12)]
            md = admin.produce(topic, [Record(k, value_for(k)) for k in keys], partition=p)
            acks += [(m.topic, m.partition, m.offset, k.decode()) for m, k in zip(md, keys)]
    return acks


def producer_acks(child: Child):
    """(acked records, keys of refused writes, refusals by error, other errors)."""
    acks, refused, why, errors = [], set(), Counter(), []
    for line in child.lines():
        if "ack" in line:
            acks += [tuple(a) for a in line["ack"]]
        elif "refused" in line:
            refused.update(line["refused"])
            why[line["error_type"]] += 1
        elif "error" in line:
            errors.append(line)
    return acks, refused, dict(why), errors


def leader_of(ps, replicas) -> str:
    """The partition's leader: ``replication.leader`` where the state has it (elections),
    else the preferred one."""
    rep = ps.replication or {}
    return rep.get("leader") or replicas[0]


def replicated(state):
    for topic, info in state.topics.items():
        for p, replicas in enumerate(info["replicas"]):
            yield topic, p, replicas, state.partition(topic, p)


def converged(cluster: Cluster):
    """Every ISR is all replicas, nothing joining, HW == LSO: the state, or None."""
    state = cluster.state()
    for _t, _p, replicas, ps in replicated(state):
        rep = ps.replication
        if rep is None or rep["isr"] != replicas or rep["joining"] or \
                rep["high_watermark"] != ps.last_stable_offset:
            return None
    return state


def summary(cluster: Cluster) -> str:
    state = cluster.state()
    out = []
    for t, p, _replicas, ps in replicated(state):
        rep = ps.replication or {}
        out.append(f"{t}-{p}: isr={rep.get('isr')} joining={rep.get('joining')} "
                   f"hw={rep.get('high_watermark')} lso={ps.last_stable_offset} "
                   f"held={rep.get('held')}")
    return f"lease {state.coordinator}; " + "; ".join(out)


# -- checks -----------------------------------------------------------------------------------

def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def segment_files(d: Path):
    """{name: base offset} of the segment files in ``d`` under final names."""
    out = {}
    for f in (os.listdir(d) if d.is_dir() else []):
        m = SEGMENT.match(f)
        if m:
            out[f] = int(m.group(1))
    return out


def follower_leftovers(state, paths) -> dict:
    """What kills left on followers: temp files, and .log files not (yet) named by ``held``."""
    temps = orphans = 0
    for topic, p, replicas, ps in replicated(state):
        held = (ps.replication or {}).get("held", {})
        for r in replicas:
            if r == leader_of(ps, replicas):
                continue
            d = paths[r] / f"{topic}-{p}"
            if not d.is_dir():
                continue
            temps += sum(".tmp-" in f for f in os.listdir(d))
            for name, base in segment_files(d).items():
                if name.endswith(".log") and not any(s <= base < e for s, e in held.get(r, [])):
                    orphans += 1
    return {"temp_files": temps, "unrecorded_logs": orphans}


def check_follower_files(state, paths, hint: str = "") -> int:
    """Every held range's segments are on the follower, byte for byte the leader's; every
    segment file a follower has under a final name is the leader's (never a partial copy),
    but garbage by the protocol's rule (§7): an acks=all write is copied before its commit, and
    when it is refused and aborted the leader's writer deletes its files while the follower's
    copy waits for cleanup, which this test does not run. Returns how many segments the
    followers hold."""
    from pyspark_kafkalog.cluster.garbage import is_garbage_segment
    held_segments = 0
    for topic, p, replicas, ps in replicated(state):
        leader = leader_of(ps, replicas)
        assert leader == replicas[0], f"{topic}-{p}: no election was expected here"
        leader_dir = paths[leader] / f"{topic}-{p}"
        leader_files = segment_files(leader_dir)
        bases = sorted({b for n, b in leader_files.items() if n.endswith(".log")})
        for r in replicas:
            if r == leader:
                continue
            d = paths[r] / f"{topic}-{p}"
            follower_files = segment_files(d)
            for name, base in follower_files.items():
                if is_garbage_segment(ps, base, f"{base:020d}.log" in follower_files):
                    continue
                assert name in leader_files, f"{d / name}: the leader has no such file"
                assert sha(d / name) == sha(leader_dir / name), \
                    f"{d / name} differs from the leader's (a partial or foreign copy)"
            for s, e in ps.replication["held"].get(r, []):
                # the leader's segments whose offsets meet [s, e)
                for i, base in enumerate(bases):
                    nxt = bases[i + 1] if i + 1 < len(bases) else None
                    if base >= e or (nxt is not None and nxt <= s):
                        continue
                    held_segments += 1
                    for suffix in (".log", ".index", ".timeindex"):
                        name = f"{base:020d}{suffix}"
                        assert (d / name).is_file(), \
                            f"{topic}-{p}: {r} holds [{s}, {e}) but lacks {name}{hint}"
                        assert sha(d / name) == sha(leader_dir / name), f"{d / name} differs"
            if ps.replication["held"].get(r):
                assert (d / "partition.metadata").read_bytes() == \
                    (leader_dir / "partition.metadata").read_bytes()
    return held_segments


def check_exactly_once(admin: Admin, topics, acks) -> Counter:
    """Every acknowledged record is read exactly once, at its acknowledged place, and nothing
    else is read (every write's outcome is known: refused ones were aborted)."""
    seen = Counter()
    at = {}
    for topic in topics:
        for r in admin.consume(topic):
            key = r.key.decode()
            seen[key] += 1
            at[key] = (topic, r.partition, r.offset)
            assert r.value == value_for(r.key), f"{topic}-{r.partition}@{r.offset}: foreign value"
    twice = [k for k, n in seen.items() if n > 1]
    assert not twice, f"records read more than once: {twice[:10]}"
    missing = [a for a in acks if a[3] not in seen]
    assert not missing, f"{len(missing)} acknowledged records not read, e.g. {missing[:5]}"
    moved = [a for a in acks if at[a[3]] != tuple(a[:3])]
    assert not moved, f"records read elsewhere than acknowledged: {moved[:5]}"
    extra = set(seen) - {a[3] for a in acks}
    assert not extra, f"{len(extra)} records read that no call acknowledged: {sorted(extra)[:5]}"
    return seen


def _frozen(state: ClusterState) -> str:
    snap = state.to_snapshot()
    snap.pop("version", None)
    return json.dumps(snap, sort_keys=True)


def check_metadata(url: str) -> dict:
    """The metadata log verifies; a replay from entry 0 gives what a fresh client sees; along
    it the fencing rule and the high watermark's rules hold. Returns counts for the report."""
    cluster = Cluster(url, create=False)
    report = verify(cluster.metalog)
    assert not report.problems, report.problems
    storage = cluster.storage
    seqs = sorted(int(f.name[:20]) for f in storage.list(LOG_DIR)
                  if re.fullmatch(r"\d{20}\.json", f.name))
    assert seqs and seqs[0] == 0 and seqs == list(range(len(seqs))), \
        "the metadata log must be whole from entry 0 (no cleanup ran)"
    state = ClusterState()
    counts = Counter()
    hw = {}
    for seq in seqs:
        entry = parse_json(entry_name(seq), storage.read(entry_name(seq)))
        ops = [a.get("op") for a in entry["actions"]]
        lease_before = dict(state.coordinator) if state.coordinator else None
        state.apply(seq, entry)
        results = state.results[seq]
        for raw, res in zip(entry["actions"], results):
            op = raw.get("op")
            if op == "coordinator_lease" or "coordinator_epoch" not in raw:
                continue       # a fenced coordinator action: replica_progress, alter_isr, ...
            assert "coordinator_lease" not in ops, f"entry {seq} mixes a lease change with {op}"
            current = (lease_before is not None and lease_before["holder"]
                       and raw["coordinator_epoch"] == lease_before["epoch"])
            if current:
                assert res.error != "STALE_CONTROLLER_EPOCH", (seq, raw, res)
                counts[f"{op} applied" if res.ok else f"{op} {res.error}"] += 1
                if op == "replica_progress":
                    for key, r in getattr(res, "partitions", {}).items():
                        assert r.ok, (seq, key, r)       # a live coordinator's copies are valid
            else:
                assert res.error == "STALE_CONTROLLER_EPOCH", (seq, raw, res)
                counts[f"{op} fenced"] += 1
        for topic, p, replicas, ps in replicated(state):
            rep = ps.replication
            if rep is None:
                continue
            key = (topic, p)
            assert rep["high_watermark"] >= hw.get(key, 0), f"entry {seq}: {key} HW went back"
            assert rep["high_watermark"] <= ps.last_stable_offset, f"entry {seq}: HW > LSO"
            hw[key] = rep["high_watermark"]
            for r in rep["isr"]:
                assert replica_end(ps, r, leader_of(ps, replicas)) >= rep["high_watermark"], \
                    f"entry {seq}: ISR member {r} of {key} lacks data below the HW"
    fresh = Admin(url, create=False).cluster.state()
    assert fresh.seq == state.seq
    assert _frozen(fresh) == _frozen(state), "replay from scratch differs from a client's state"
    counts["entries"] = len(seqs)
    counts["epochs"] = state.coordinator["epoch"] if state.coordinator else 0
    return dict(counts)


# -- 1. coordinators killed during catch-up ---------------------------------------------------

def test_coordinators_killed_during_catch_up(tmp_path):
    rng = random.Random(SEED)
    print(f"seed {SEED} (KAFKALOG_SEED={SEED} KAFKALOG_TORTURE_SCALE={SCALE})")
    admin, url, paths = new_cluster(tmp_path)
    admin.create_topic("rep", 3, 2, SEGMENT_CONFIG)
    acks = backlog(admin, "rep", 40 * SCALE)
    state = admin.cluster.state()
    print(f"backlog: {len(acks)} records, "
          f"{sum(len(segment_files(paths[r[0]] / f'rep-{p}')) for _, p, r, _ in replicated(state)) // 3}"
          " leader segments; followers empty")
    stop = tmp_path / "stop-producer"
    producer = Child(tmp_path, "producer", "producer", url, "w1", rng.randrange(1 << 30),
                     "default", stop, "rep")
    coords = Coordinators(tmp_path, url, rng, CATCH_UP_SLOW_MS)
    try:
        current = started(coords.start())
        zombies = 0
        for round_ in range(5 * SCALE):
            time.sleep(rng.uniform(0.1, 3.5))
            holder = serving_holder(current)
            if rng.random() < 0.25 and holder and current.alive():
                # freeze it (mid-pass, most likely), let a successor take over, then let it go
                os.kill(current.pid, signal.SIGSTOP)
                successor = started(coords.start())
                eventually(lambda: (admin.cluster.state().coordinator or {}).get("holder")
                           not in (None, "", holder), "a successor takes the lease",
                           describe=lambda: summary(admin.cluster))
                os.kill(current.pid, signal.SIGCONT)
                time.sleep(rng.uniform(0.3, 1.5))
                what = "froze, replaced, resumed and killed"
                zombies += 1
                current.kill()
                current = successor
            else:
                what = "killed" if current.alive() else "found dead (it killed itself)"
                current.kill()
                current = started(coords.start())
            print(f"round {round_}: coordinator {what}; "
                  f"{follower_leftovers(admin.cluster.state(), paths)}")
        current.kill()
        leftovers = follower_leftovers(admin.cluster.state(), paths)

        # the last coordinator runs while the producer ends (an acks=all write waits for it)
        final = coords.start(self_kill=False)
        stop.touch()
        assert producer.proc.wait(timeout=DEADLINE_S) == 0, producer.stderr_tail()
        produced, refused, why, errors = producer_acks(producer)
        assert not errors, errors[:3]
        acks += produced
        state = eventually(lambda: converged(admin.cluster),
                           "every ISR full and HW == LSO after the last coordinator started",
                           describe=lambda: summary(admin.cluster) + final.stderr_tail())
        assert final.stop() == 0, final.stderr_tail()
    finally:
        stop.touch()
        producer.kill()
        coords.kill_all()

    state = admin.cluster.state()
    held = check_follower_files(state, paths)
    check_exactly_once(Admin(url, create=False), ["rep"], acks)
    counts = check_metadata(url)
    print(f"{len(coords.started)} coordinators ({coords.self_kills()} killed themselves, "
          f"{zombies} frozen and resumed); {len(acks)} acked records, {len(refused)} refused "
          f"{why}; followers hold {held} "
          f"segments; before the last coordinator: {leftovers}; metadata: {counts}")


# -- 2. a tailing reader while the follower comes and goes ------------------------------------

#: what processes left where a root was while it was away
RECREATED = Counter()


def _rename(src: Path, dst: Path) -> None:
    """Rename a root away or back. ``dst`` may exist empty (opening a log dir on a local root
    creates its directory, so a process that opens the log dir while its root is away leaves
    an empty one behind; rename(2) replaces an empty directory). If a process wrote files
    there while the root was away, they are moved aside, as files written to the mount point
    of an unmounted disk are hidden when it is mounted again: nothing may count on them (the
    final checks find any ``held`` range whose files are not on the returned root)."""
    if dst.exists():
        listing = sorted(str(p.relative_to(dst)) for p in dst.rglob("*"))
        if listing:
            RECREATED["with files"] += 1
            hidden = dst.with_name(f"{dst.name}-hidden-{RECREATED['with files']}")
            print(f"{dst} was recreated while its root was away, holding {listing[:8]}... "
                  f"({len(listing)} entries): moved to {hidden.name}")
            dst.rename(hidden)
        else:
            RECREATED["empty"] += 1
    src.rename(dst)


def test_tailing_reader_sees_each_offset_once_while_the_follower_comes_and_goes(tmp_path):
    rng = random.Random(SEED + 1)
    print(f"seed {SEED} (KAFKALOG_SEED={SEED} KAFKALOG_TORTURE_SCALE={SCALE})")
    admin, url, paths = new_cluster(tmp_path)
    topics = ["a", "b"]
    # leaders on the root (logdir-0) so that renaming the second root away takes followers
    # only; b needs both replicas in sync to show anything new
    for topic, extra in (("a", {}), ("b", {"min.insync.replicas": "2"})):
        admin.cluster.placement_random = random.Random(seed_with_leader(2, 0))
        admin.create_topic(topic, 1, 2, {**SEGMENT_CONFIG, **extra})
        assert admin.cluster.state().topics[topic]["replicas"] == [["logdir-0", "logdir-1"]]
    acks = []
    for topic in topics:
        acks += backlog(admin, topic, 10 * SCALE)
    second, away = paths["logdir-1"], tmp_path / "second-away"
    stop_producer, stop_tailer = tmp_path / "stop-producer", tmp_path / "stop-tailer"
    producer = Child(tmp_path, "producer", "producer", url, "w1", rng.randrange(1 << 30),
                     "mixed", stop_producer, *topics)
    tailer = Child(tmp_path, "tailer", "tailer", url, stop_tailer, *topics)
    coords = Coordinators(tmp_path, url, rng, TAIL_SLOW_MS)
    isr_sizes = Counter()

    def isr_of(topic):
        rep = admin.cluster.state().partition(topic, 0).replication
        return rep and rep["isr"]

    def sample():
        s = admin.cluster.state()
        for topic in topics:
            rep = s.partition(topic, 0).replication
            if rep is not None:
                isr_sizes[len(rep["isr"])] += 1

    try:
        current = started(coords.start())
        is_away = False          # (an empty `second` may exist while the root is away)
        for round_ in range(5 * SCALE):
            events = []
            if not is_away and rng.random() < 0.5:
                _rename(second, away)
                is_away = True
                events.append("root away")
            for _ in range(int(rng.uniform(2, 30))):
                time.sleep(0.1)
                sample()
            if rng.random() < 0.6 or not current.alive():
                events.append("coordinator killed" if current.alive() else
                              "coordinator found dead (it killed itself)")
                current.kill()
                current = started(coords.start())
            if is_away and rng.random() < 0.5:
                _rename(away, second)
                is_away = False
                events.append("root back")
            print(f"round {round_}: {', '.join(events) or 'nothing'}; {summary(admin.cluster)}")
        # once for sure: the follower is in every ISR, its root goes away until it leaves them,
        # and comes back (then it rejoins, below)
        if is_away:
            _rename(away, second)
            is_away = False
        current.kill()
        current = started(coords.start(self_kill=False))
        eventually(lambda: all(isr_of(t) == ["logdir-0", "logdir-1"] for t in topics),
                   "the follower joins every ISR",
                   describe=lambda: summary(admin.cluster) + current.stderr_tail())
        sample()
        _rename(second, away)
        is_away = True
        eventually(lambda: all(isr_of(t) == ["logdir-0"] for t in topics),
                   "the follower whose root is away leaves the ISR",
                   describe=lambda: summary(admin.cluster) + current.stderr_tail())
        sample()
        _rename(away, second)
        is_away = False
        current.kill()
        final = coords.start(self_kill=False)
        stop_producer.touch()
        assert producer.proc.wait(timeout=DEADLINE_S) == 0, producer.stderr_tail()
        produced, refused, why, errors = producer_acks(producer)
        assert not errors, errors[:3]
        acks += produced
        eventually(lambda: converged(admin.cluster), "the follower rejoins every ISR, HW == LSO",
                   describe=lambda: summary(admin.cluster) + final.stderr_tail())
        stop_tailer.touch()
        assert tailer.proc.wait(timeout=DEADLINE_S) == 0, tailer.stderr_tail()
        assert final.stop() == 0, final.stderr_tail()
    finally:
        stop_producer.touch()
        stop_tailer.touch()
        producer.kill()
        tailer.kill()
        coords.kill_all()
        if is_away:
            _rename(away, second)

    lines = tailer.lines()
    bad = [line for line in lines if {"two_values", "vanished", "foreign", "error"} & set(line)]
    assert not bad, f"the tailing reader saw: {bad[:5]}"
    seen = {}
    for line in lines:
        if "r" in line:
            t, p, o, key = line["r"]
            assert (t, p, o) not in seen
            seen[(t, p, o)] = key
    final_counts = [line["final"] for line in lines if "final" in line]
    assert final_counts, "the tailer never made its last read"
    expected = {(t, p, o): key for t, p, o, key in acks}
    assert seen == expected, (f"{len(set(expected) - set(seen))} acked records never seen, "
                              f"{len(set(seen) - set(expected))} seen but not acked")
    assert sum(final_counts[-1].values()) == len(acks)
    state = admin.cluster.state()
    check_follower_files(state, paths, hint="" if not RECREATED["with files"] else (
        f" (files a coordinator wrote where the root was while it was away were moved aside "
        f"{RECREATED['with files']} time(s), as a remount hides them: a replica_progress "
        f"recorded copies that never reached the log dir)"))
    check_exactly_once(Admin(url, create=False), topics, acks)
    counts = check_metadata(url)
    reads = final_counts[-1] and [line["reads"] for line in lines if "final" in line][-1]
    print(f"{len(coords.started)} coordinators ({coords.self_kills()} killed themselves); "
          f"{len(acks)} acked records, {len(refused)} refused {why}, {reads} full reads by the "
          f"tailer; ISR sizes sampled {dict(isr_sizes)}; empty root dirs left by opening a "
          f"missing log dir: {dict(RECREATED)}; metadata: {counts}")
