"""Real processes against one kafkalog cluster: the guarantees of docs/protocol.md under SIGKILL,
SIGSTOP, expiry, concurrent deletion and retention.

Children (tests/procs/cluster_child.py) print an acknowledgement only after the library call
returned. The parent then checks what any reader sees against those acknowledgements.

* torture: writers, a staller (reserve+write, sleep past its deadline, commit), delete-records,
  retention and a tailing reader run at once while the parent SIGKILLs and restarts them; each
  round ends with a consistent read checked against every ack, the end with cleanup, a full read,
  the tailing reader's view, Kafka's checkpoint files and ``kafkalog dump --index-sanity-check``.
* zombie: a writer frozen with SIGSTOP mid-write outlives its deadline; its commit is fenced.
* atomic: a reader taking one state per poll never sees part of a 6-partition commit.
* deterministic replays of the races the torture run found (they need no processes).

``KAFKALOG_TORTURE_SCALE`` (default 1: about 40 s for the torture test, 6 rounds of 5 s; 5 is a
long run) multiplies the rounds. ``KAFKALOG_SEED`` fixes the parent's random choices (the seed
is printed with ``pytest -s``).
"""
from __future__ import annotations

import json
import os
import queue
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from procs.torture_common import (ALL_TPS, TOPIC_CONFIGS, TOPICS, PARTITIONS, child_cmd, child_env,
                                  complete_json_lines, value_for)
from pyspark_kafkalog.admin import Admin
from pyspark_kafkalog.cluster.cluster import Cluster
from pyspark_kafkalog.client.consumer import iter_records
from pyspark_kafkalog.errors import OffsetOutOfRangeError

SCALE = int(os.environ.get("KAFKALOG_TORTURE_SCALE", "1"))
SEED = int(os.environ.get("KAFKALOG_SEED", "0")) or random.randrange(1 << 30)
TIMEOUT_MS = 3000                      # transaction.timeout.ms of every torture child
ROUNDS = 6 * SCALE
ROUND_S = 5.0
_SEGMENT = re.compile(r"^(\d{20})\.(log|index|timeindex)$")
_SCRIPT = Path(sys.executable).parent / "kafkalog"
KAFKALOG = ([str(_SCRIPT)] if _SCRIPT.exists()          # the installed `kafkalog` command
            else [sys.executable, "-m", "pyspark_kafkalog.cli.main"])


# -- helpers ----------------------------------------------------------------------------------

pytestmark = pytest.mark.slow   # real processes under SIGKILL for a fixed time (~60 s)


class LineReader:
    """JSON lines of a child's stdout, read by a thread so the parent can wait with a deadline."""

    def __init__(self, proc):
        self.proc, self.lines = proc, queue.Queue()
        self.seen = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self):
        for line in self.proc.stdout:
            try:
                self.lines.put(json.loads(line))
            except ValueError:
                self.lines.put({"garbage": line})
        self.lines.put(None)

    def expect(self, key: str, timeout: float = 30.0) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            try:
                msg = self.lines.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no {key!r} line from the child within {timeout}s; "
                                     f"got {self.seen}") from None
            if msg is None:
                err = self.proc.stderr.read() if self.proc.stderr else ""
                raise AssertionError(f"child exited without a {key!r} line; got {self.seen}; "
                                     f"stderr: {err[-3000:]}")
            self.seen.append(msg)
            if key in msg:
                return msg


def _popen_pipe(*args):
    return subprocess.Popen(child_cmd(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=child_env())


def read_all(cluster: Cluster, state, isolation_level="read_committed"):
    """{(topic, p): [(offset, key, value)]} of every partition, from ONE state."""
    out = {}
    for t, p in cluster.partitions(state):
        view = cluster.partition_view(t, p, state, isolation_level=isolation_level)
        out[(t, p)] = [(r.offset, r.key, r.value)
                       for r in iter_records(view, view.log_start_offset)]
    return out


def read_all_retrying(cluster: Cluster, attempts: int = 20):
    """A consistent full read while deleters run: a segment deleted under us is a typed
    OffsetOutOfRangeError (never a shorter answer), so retry from a newer state."""
    for _ in range(attempts):
        state = cluster.state()
        try:
            return state, read_all(cluster, state)
        except OffsetOutOfRangeError:
            continue
    raise AssertionError(f"{attempts} full reads in a row raced a deletion")


def segment_files(root: Path, topic: str, p: int):
    d = root / "logdir-0" / f"{topic}-{p}"
    out = defaultdict(set)
    for f in (os.listdir(d) if d.is_dir() else []):
        m = _SEGMENT.match(f)
        if m:
            out[int(m.group(1))].add(m.group(2))
    return dict(out)


def dump_sanity_check(logdir: Path) -> int:
    """Run the real CLI's ``dump --index-sanity-check`` over every segment file of a log dir."""
    files = sorted(f"{d}/{f}" for d in os.listdir(logdir) if (logdir / d).is_dir()
                   for f in os.listdir(logdir / d) if _SEGMENT.match(f))
    for i in range(0, len(files), 800):      # one argument must stay below 128 KiB
        chunk = files[i:i + 800]
        proc = subprocess.run([*KAFKALOG, "dump", "--index-sanity-check",
                               "--files", ",".join(chunk)],
                              cwd=logdir, capture_output=True, text=True, env=child_env())
        assert proc.returncode == 0 and not proc.stderr, \
            f"kafkalog dump --index-sanity-check failed in {logdir}:\n{proc.stderr[-4000:]}"
        passed = proc.stdout.count("passed sanity check.") + proc.stdout.count(".index is empty.")
        assert passed == len(chunk), \
            f"{passed} of {len(chunk)} files passed:\n{proc.stdout[-3000:]}"
    return len(files)


def diagnose(root: Path, cluster: Cluster, state, problems) -> str:
    """What storage and the metadata log say about the partitions named in ``problems``, read
    again once every child is dead (so that nothing moves any more)."""
    out = []
    tps = {(t, int(p)) for t, p in re.findall(r"(torture-[ab])-(\d)@", " ".join(problems))}
    later = cluster.state()
    for t, p in sorted(tps):
        for label, st in (("at the check", state), ("now", later)):
            ps = st.partition(t, p)
            out.append(f"{t}-{p} {label} (seq {st.seq}): log start {ps.log_start_offset}, HW "
                       f"{ps.high_watermark}, open {ps.open}, committed {ps.committed[:12]}")
        files = segment_files(root, t, p)
        out.append(f"{t}-{p} segment files now: " + ", ".join(
            f"{b}{'' if k == {'log', 'index', 'timeindex'} else sorted(k)}"
            for b, k in sorted(files.items())[:40]))
        try:
            view = cluster.partition_view(t, p, later)
            recs = [r.offset for r in iter_records(view, view.log_start_offset)]
            out.append(f"{t}-{p} read again now: {recs[:60]}")
        except Exception as exc:     # noqa: BLE001
            out.append(f"{t}-{p} read again now: {type(exc).__name__}: {exc}")
    return "\n--- diagnosis ---\n" + "\n".join(out)


def check_record(problems, where, t, p, offset, key: bytes, value: bytes, writers):
    """A record read must have been produced by some writer, acknowledged or not."""
    k = key.decode(errors="replace") if key is not None else None
    if k is None or value != value_for(key) or k.split(".")[0] not in writers:
        problems.append(f"{where}: {t}-{p}@{offset} holds a record no writer produced: "
                        f"key={key!r} value={value[:40]!r}")


# -- 1 + 2: torture with a tailing reader -----------------------------------------------------

class Children:
    """The killable children, their incarnations and output files."""

    def __init__(self, root: Path, out: Path, rng: random.Random):
        self.root, self.out, self.rng = root, out, rng
        self.procs = {}
        self.incarnation = Counter()
        self.files = defaultdict(list)        # name -> stdout files of every incarnation
        self.kills = Counter()
        self.crashes = []
        self.exited = set()

    def start(self, name: str, mode: str, *extra):
        inc = self.incarnation[name]
        self.incarnation[name] += 1
        wid = f"{name}.{inc}"
        stdout, stderr = self.out / f"{wid}.out", self.out / f"{wid}.err"
        seed = self.rng.randrange(1 << 30)
        with open(stdout, "w") as so, open(stderr, "w") as se:
            proc = subprocess.Popen(child_cmd(mode, self.root, wid, seed, *extra), stdout=so,
                                    stderr=se, env=child_env())
        self.procs[name] = (proc, mode, extra, stderr)
        self.files[name].append(stdout)

    def kill(self, name: str) -> None:
        proc = self.procs[name][0]
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            self.kills[name] += 1
        proc.wait()

    def stop_all(self) -> None:
        for name in list(self.procs):
            self.kill(name)

    def restart_crashed(self) -> None:
        for name, (proc, mode, extra, stderr) in list(self.procs.items()):
            if proc.poll() is not None and name not in self.exited:
                self.crashes.append(f"{name} exited with {proc.returncode}: "
                                    f"{Path(stderr).read_text()[-2000:]}")
                if name == "tailer":
                    self.exited.add(name)
                else:
                    self.start(name, mode, *extra)

    def outputs(self, prefix: str = ""):
        for name, files in self.files.items():
            if name.startswith(prefix):
                for f in files:
                    for msg in complete_json_lines(f):
                        yield name, msg


def collect_acks(children: Children):
    """{(topic, p, offset): key} of every acknowledged record; two acks for one offset fail."""
    acked, problems = {}, []
    for name, msg in children.outputs():
        for t, p, o, key in msg.get("ack", ()):
            if acked.setdefault((t, p, o), key) != key:
                problems.append(f"offset {t}-{p}@{o} acknowledged twice: {acked[(t, p, o)]} "
                                f"and {key}")
    return acked, problems


def check_against_acks(state, got, acked, problems, where, writers):
    """Visible = committed in [log start, high watermark); every ack in that window is visible."""
    keys_seen = {}
    for (t, p), recs in got.items():
        ps = state.partition(t, p)
        prev = -1
        for o, k, v in recs:
            if o <= prev:
                problems.append(f"{where}: {t}-{p} offsets not increasing: {o} after {prev} "
                                f"(an offset appears twice)")
            prev = o
            if not ps.log_start_offset <= o < ps.high_watermark:
                problems.append(f"{where}: {t}-{p}@{o} visible outside [log start "
                                f"{ps.log_start_offset}, high watermark {ps.high_watermark})")
            check_record(problems, where, t, p, o, k, v, writers)
            if k in keys_seen:
                problems.append(f"{where}: record {k!r} appears twice: {keys_seen[k]} and "
                                f"{(t, p, o)}")
            keys_seen[k] = (t, p, o)
    by_tp = {tp: {o: k.decode() for o, k, _ in recs} for tp, recs in got.items()}
    checked = 0
    for (t, p, o), key in acked.items():
        ps = state.partition(t, p)
        if ps.log_start_offset <= o < ps.high_watermark:
            checked += 1
            found = by_tp[(t, p)].get(o)
            if found != key:
                problems.append(f"{where}: acknowledged {key} at {t}-{p}@{o} (log start "
                                f"{ps.log_start_offset}, high watermark {ps.high_watermark}) "
                                f"reads as {found!r} in a read that raised no "
                                f"OffsetOutOfRangeError")
    return checked


def check_tailer(lines, acked, final_state, final, problems):
    seen = defaultdict(dict)          # tp -> offset -> key
    jumps = defaultdict(list)         # tp -> [(from, to)]
    stats = Counter()
    for line in lines:
        kind = line[0]
        stats[kind] += 1
        if kind == "S":
            jumps[(line[1], line[2])].append((0, line[3]))
        elif kind == "J":
            jumps[(line[1], line[2])].append((line[3], line[4]))
        elif kind == "R":
            _, t, p, start, end, recs = line
            for o, k, ok in recs:
                if not start <= o < end:
                    problems.append(f"tailer: {t}-{p}@{o} outside the read [{start}, {end})")
                if o in seen[(t, p)]:
                    problems.append(f"tailer: {t}-{p}@{o} read twice")
                if not ok:
                    problems.append(f"tailer: {t}-{p}@{o} {k!r} has a value no writer wrote")
                seen[(t, p)][o] = k
                stats["records"] += 1
        elif kind == "X":
            problems.append(f"tailer: OffsetOutOfRangeError at {line[1]}-{line[2]}@{line[3]} "
                            f"although the log start offset is {line[4]}: {line[5]}")
        elif kind == "V":
            problems.append(f"tailer: {line[1]}-{line[2]}@{line[3]} visible outside [log start "
                            f"{line[4]}, high watermark {line[5]}) of its snapshot")
        elif kind == "E":
            problems.append(f"tailer: unexpected {line[3]} at {line[1]}-{line[2]}: {line[4]}\n"
                            f"{line[5]}")
    if not lines or lines[-1] != ["DONE"]:
        problems.append("tailer did not finish its final catch-up")

    def jumped(tp, o):
        return any(a <= o < b for a, b in jumps[tp])

    # no acknowledged record skipped silently: seen, or inside a range it jumped over
    for (t, p, o), key in acked.items():
        got = seen[(t, p)].get(o)
        if got is None and not jumped((t, p), o):
            problems.append(f"tailer: acknowledged {key} at {t}-{p}@{o} was neither read nor "
                            f"jumped over (final log start "
                            f"{final_state.partition(t, p).log_start_offset})")
        elif got is not None and got != key:
            problems.append(f"tailer: read {got} at {t}-{p}@{o} where {key} was acknowledged")
    # at or above the final log start offset: exactly what a full read returns
    for tp, recs in final.items():
        lso = final_state.partition(*tp).log_start_offset
        full = {o: k.decode() for o, k, _ in recs}
        mine = {o: k for o, k in seen[tp].items() if o >= lso}
        for o in sorted(set(full) - set(mine)):
            problems.append(f"tailer: missed {tp[0]}-{tp[1]}@{o} {full[o]}"
                            + (" (inside a jump)" if jumped(tp, o) else ""))
        for o in sorted(set(mine) - set(full)):
            problems.append(f"tailer: saw {tp[0]}-{tp[1]}@{o} {mine[o]}, which a full read "
                            f"does not return")
        for o in sorted(set(mine) & set(full)):
            if mine[o] != full[o]:
                problems.append(f"tailer: {tp[0]}-{tp[1]}@{o} is {mine[o]} to the tailer and "
                                f"{full[o]} to a full read")
    stats["jumps"] = sum(len(j) for j in jumps.values()) - len(jumps)   # minus the S lines
    return stats


def check_derived_files(cluster: Cluster, state):
    """After maintenance, Kafka's checkpoint files say what the metadata log says (§8)."""
    from pyspark_kafkalog.format.checkpoint import EpochEntry
    from pyspark_kafkalog.log.logdir import (LOG_START_CHECKPOINT, RECOVERY_POINT_CHECKPOINT,
                                             REPLICATION_CHECKPOINT, LogDir)
    from pyspark_kafkalog.log.partition import PartitionLog
    ld = LogDir(cluster.storage, "logdir-0")
    files = {name: ld.read_checkpoint(name) for name in (REPLICATION_CHECKPOINT,
             RECOVERY_POINT_CHECKPOINT, LOG_START_CHECKPOINT)}
    problems = []
    for t, p in ALL_TPS:
        ps = state.partition(t, p)
        want = {REPLICATION_CHECKPOINT: ps.high_watermark,
                RECOVERY_POINT_CHECKPOINT: ps.high_watermark,
                LOG_START_CHECKPOINT: ps.log_start_offset}
        for name, value in want.items():
            if files[name].get((t, p)) != value:
                problems.append(f"{name} has {files[name].get((t, p))} for {t}-{p}, the "
                                f"metadata log {value}")
        epochs = PartitionLog(cluster.storage, cluster.partition_dir(t, p, state=state)
                              ).leader_epochs()
        if epochs != [EpochEntry(e, o) for e, o in ps.leader_epoch_entries()]:
            problems.append(f"{t}-{p}: leader-epoch-checkpoint {epochs[:5]}... differs from the "
                            f"metadata's {ps.leader_epoch_entries()[:5]}...")
    return problems


def metadata_stats(root: Path):
    ops, expired_aborts = Counter(), 0
    for f in (root / "_kafkalog" / "log").iterdir():
        if re.match(r"^\d{20}\.json$", f.name):
            for a in json.loads(f.read_text())["actions"]:
                ops[a["op"]] += 1
                if a["op"] == "abort" and a.get("reason") == "expired":
                    expired_aborts += len(a["txns"])
    return ops, expired_aborts


def test_torture_concurrent_writers_deleters_retention_and_kills(tmp_path):
    rng = random.Random(SEED)
    t0 = time.monotonic()
    root, out = tmp_path / "cluster", tmp_path / "out"
    out.mkdir()
    admin = Admin(str(root))
    cluster = admin.cluster
    for topic in TOPICS:
        admin.create_topic(topic, PARTITIONS, configs=TOPIC_CONFIGS[topic])

    children = Children(root, out, rng)
    try:
        _torture(root, out, rng, admin, children, t0)
    finally:            # whatever happened, no child outlives the test
        children.stop_all()


def _torture(root, out, rng, admin, children, t0):
    cluster = admin.cluster
    killable = {"writer0": ("writer", TIMEOUT_MS), "writer1": ("writer", TIMEOUT_MS),
                "writer2": ("writer", TIMEOUT_MS), "staller": ("staller", TIMEOUT_MS),
                "deleter": ("deleter",), "retainer": ("retainer",), "merger": ("merger",)}
    writers = set(killable)
    for name, (mode, *extra) in killable.items():
        children.start(name, mode, *extra)
    tail_out, stop = out / "tailer.jsonl", out / "stop"
    with open(out / "tailer.err", "w") as err:
        tailer = subprocess.Popen(child_cmd("tailer", root, tail_out, stop), env=child_env(),
                                  stdout=subprocess.DEVNULL, stderr=err)
    children.procs["tailer"] = (tailer, "tailer", (), out / "tailer.err")

    problems, checked = [], 0
    for round_ in range(ROUNDS):
        round_end = time.monotonic() + ROUND_S
        while time.monotonic() < round_end:
            time.sleep(rng.uniform(0.2, 1.2))
            children.restart_crashed()
            victim = rng.choice(sorted(killable))
            children.kill(victim)
            children.start(victim, *killable[victim])
        # a consistent read in the middle of the storm: every ack inside [log start, HW) visible
        acked, _ = collect_acks(children)           # acks first: their commits precede the read
        state, got = read_all_retrying(cluster)
        checked += check_against_acks(state, got, acked, problems, f"round {round_}", writers)
        if problems:
            children.stop_all()
            raise AssertionError("\n".join(problems[:30])
                                 + diagnose(root, cluster, state, problems))

    # the end: kill everyone mid-flight; reservations left open hold back the high watermark
    for name in killable:
        children.kill(name)
    killed_at = time.monotonic()
    acked, ack_problems = collect_acks(children)
    problems += ack_problems
    state, got = read_all_retrying(cluster)
    open_at_end = len(state.txns)
    held_back_acks = sum(1 for (t, p, o) in acked if o >= state.partition(t, p).high_watermark)
    held_back = sum(1 for tp in ALL_TPS if state.partition(*tp).open)
    check_against_acks(state, got, acked, problems, "before cleanup", writers)
    for (t, p), recs in got.items():
        ps = state.partition(t, p)
        assert all(o < ps.high_watermark for o, _, _ in recs)
        if ps.open:
            assert ps.high_watermark == min(r[0] for r in ps.open.values()) < ps.next_offset

    # dead writers' reservations expire; cleanup aborts them and removes what they left
    time.sleep(max(0.0, TIMEOUT_MS / 1000 + 0.3 - (time.monotonic() - killed_at)))
    removed = admin.cleanup()
    final_state = cluster.state()
    assert not final_state.txns, f"open transactions after cleanup: {final_state.txns}"
    stop.touch()
    try:
        tailer.wait(timeout=90)
    except subprocess.TimeoutExpired:
        tailer.kill()
        raise AssertionError("the tailing reader did not catch up within 90 s")

    # the final full read
    final_state, final = read_all_retrying(cluster, attempts=1)
    checked_final = check_against_acks(final_state, final, acked, problems, "final", writers)
    for (t, p), recs in final.items():
        ps = final_state.partition(t, p)
        assert ps.high_watermark == ps.next_offset
        # after cleanup only visible segments are left, each complete
        for base, kinds in segment_files(root, t, p).items():
            if not ps.segment_visible(base) or kinds != {"log", "index", "timeindex"}:
                problems.append(f"{t}-{p}: segment {base} ({sorted(kinds)}) left after cleanup "
                                f"(log start {ps.log_start_offset}, committed {ps.committed})")
    problems += check_derived_files(cluster, final_state)
    tail_lines = [json.loads(line) for line in tail_out.read_text().splitlines()]
    tail_stats = check_tailer(tail_lines, acked, final_state, final, problems)
    dumped = dump_sanity_check(root / "logdir-0")

    # errors the children reported: only fencing (a commit past its deadline) is expected
    errors = Counter()
    for name, msg in children.outputs():
        if "error" in msg:
            errors[(name.rstrip("0123456789"), msg["where"], msg["error"])] += 1
            if msg["error"] != "FencedLeaderEpochError":
                problems.append(f"{name}: {msg['error']} in {msg['where']}: {msg['msg']}\n"
                                f"{msg.get('tb', '')}")
    fenced = sum(1 for _, msg in children.outputs("staller") if "fenced" in msg)
    reserved = sum(1 for _, msg in children.outputs("staller") if "reserved" in msg)
    deletes = Counter(m["deleted"][4] or "ok" for _, m in children.outputs("deleter")
                      if "deleted" in m)
    trims = sum(len(m["retention"]) for _, m in children.outputs("retainer") if "retention" in m)
    merges = sum(len(runs) for _, m in children.outputs("merger") for _, _, runs, _ in
                 m.get("merged", []))
    covered = sum(n for _, m in children.outputs("merger") for *_, n in m.get("merged", []))
    ops, expired_aborts = metadata_stats(root)
    visible = sum(len(r) for r in final.values())
    print(f"\n[torture] seed {SEED}, scale {SCALE}: {ROUNDS} rounds in "
          f"{time.monotonic() - t0:.1f} s, {sum(children.kills.values())} SIGKILLs "
          f"({dict(children.kills)}), {len(acked)} acknowledged records "
          f"({checked} ack checks in the rounds, {checked_final} at the end), {visible} "
          f"visible at the end; log start offsets "
          f"{[final_state.partition(*tp).log_start_offset for tp in ALL_TPS]}, high watermarks "
          f"{[final_state.partition(*tp).high_watermark for tp in ALL_TPS]}")
    print(f"[torture] metadata log: {dict(ops)}; {expired_aborts} reservations aborted after "
          f"expiry; staller: {reserved} reservations, {fenced} commits fenced; {open_at_end} txns "
          f"open at the end holding back {held_back} partitions ({held_back_acks} acknowledged "
          f"records above their high watermark until cleanup); delete-records {dict(deletes)}; "
          f"{trims} retention trims; {merges} segment merges, {covered} covered segments "
          f"deleted; cleanup removed {len(removed['segments'])} segments; "
          f"{dumped} files passed dump --index-sanity-check")
    print(f"[torture] tailer: {tail_stats['records']} records in {tail_stats['R']} reads, "
          f"{tail_stats['jumps']} jumps after OffsetOutOfRangeError; child errors {dict(errors)}")
    problems += children.crashes
    assert not problems, f"{len(problems)} problems:\n" + "\n".join(problems[:40])
    assert len(acked) > 200 * SCALE, "the writers barely ran: the test would prove nothing"
    assert expired_aborts > 0, "no reservation expired: the expiry path was not exercised"
    assert merges > 0, "no segment merge published: the merge path was not exercised"
    assert sum(children.kills.values()) >= 10 * SCALE


# -- 3: a zombie writer ---------------------------------------------------------------------

def test_zombie_writer_is_fenced(tmp_path):
    root = tmp_path / "cluster"
    timeout_ms = 3000      # long enough for the other writer to start and commit before it
    topic = "zombie"
    admin = Admin(str(root), transaction_timeout_ms=timeout_ms)
    cluster = admin.cluster
    admin.create_topic(topic, 1, configs={"segment.bytes": "700", "index.interval.bytes": "100"})
    go, commit_go = tmp_path / "go", tmp_path / "commit-go"
    zproc = _popen_pipe("zombie", root, timeout_ms, topic, 12, go, commit_go)
    zombie = LineReader(zproc)
    try:
        paused = zombie.expect("paused")
        os.kill(zproc.pid, signal.SIGSTOP)              # frozen mid-write, reservation held
        state = cluster.state()
        (txn, info), = state.txns.items()
        zstart, zend, zepoch = info["ranges"][f"{topic}:0"]
        assert paused["segments"] >= 2 and paused["paused"] == [zstart]
        assert segment_files(root, topic, 0) == {zstart: {"log", "index", "timeindex"}}

        # another process writes to the same partition and commits while the zombie is frozen
        other = subprocess.run(child_cmd("once", root, "other.0", topic, 0, 10), text=True,
                               capture_output=True, env=child_env(), timeout=60)
        assert other.returncode == 0, other.stderr
        acks = json.loads(other.stdout.splitlines()[-1])["ack"]
        assert [a[2] for a in acks] == list(range(zend, zend + 10))
        ps = cluster.state().partition(topic, 0)
        assert ps.high_watermark == zstart, "the zombie's open reservation must hold the HW"
        assert list(admin.consume(topic)) == []
        other_epoch = [r for r in ps.committed if r[0] == zend][0][2]
        assert other_epoch > zepoch, "a new producer must bump the leader epoch"

        # its deadline passes: any process may abort it (here the test process)
        time.sleep(max(0.0, info["deadline"] / 1000 - time.time()) + 0.1)
        assert cluster.abort_expired() == [txn]
        ps = cluster.state().partition(topic, 0)
        assert ps.high_watermark == ps.next_offset == zend + 10 > zend, \
            "the high watermark must move past the aborted range"

        def visible_keys():
            return [(r.offset, r.key.decode()) for r in admin.consume(topic)]

        expected = [(a[2], a[3]) for a in acks]
        assert visible_keys() == expected
        removed = admin.cleanup()
        assert f"logdir-0/{topic}-0/{zstart:020d}" in removed["segments"]
        assert zstart not in segment_files(root, topic, 0)

        # the zombie wakes up: it writes the rest of its segments into its aborted range...
        go.touch()
        os.kill(zproc.pid, signal.SIGCONT)
        more = zombie.expect("wrote_more")["wrote_more"]
        assert more and all(zstart < b < zend for b in more)
        assert all(segment_files(root, topic, 0).get(b) == {"log", "index", "timeindex"}
                   for b in more), "the zombie's late segments should be on storage now"
        assert visible_keys() == expected, "a zombie's late segments must stay invisible"
        # ...which cleanup removes (before the zombie's own commit fails)
        removed = admin.cleanup()
        assert {f"logdir-0/{topic}-0/{b:020d}" for b in more} <= set(removed["segments"])
        # ...and its commit is fenced, typed, and not acknowledged
        commit_go.touch()
        fenced = zombie.expect("fenced")
        assert fenced["type"] == "FencedLeaderEpochError" and fenced["fenced"] == txn
        assert zproc.wait(timeout=30) == 0
        assert not any("ack" in m for m in zombie.seen)
    finally:
        if zproc.poll() is None:
            zproc.send_signal(signal.SIGCONT)
            zproc.kill()
            zproc.wait()

    state = cluster.state()
    assert state.decided[txn] == "aborted" and not state.txns
    assert visible_keys() == expected
    admin.cleanup()
    files = segment_files(root, topic, 0)
    assert not [b for b in files if zstart <= b < zend], f"zombie files left: {files}"
    assert files and all(zend <= b for b in files)
    assert dump_sanity_check(root / "logdir-0") == 3 * len(files)


# -- 4: multi-partition commits are atomic --------------------------------------------------

def test_atomic_multi_partition_commit(tmp_path):
    root = tmp_path / "cluster"
    topic, n = "multi", 6
    timeout_ms = 2500
    admin = Admin(str(root), transaction_timeout_ms=timeout_ms)
    cluster = admin.cluster
    admin.create_topic(topic, n, configs={"segment.bytes": "400", "index.interval.bytes": "100"})
    stop = tmp_path / "stop"
    poll_out = tmp_path / "poller.out"
    with open(poll_out, "w") as f:
        poller = subprocess.Popen(child_cmd("poller", root, topic, stop), stdout=f,
                                  stderr=subprocess.PIPE, text=True, env=child_env())

    def nothing_visible():
        return all(list(admin.consume(topic, p)) == [] for p in range(n))

    committed_keys, held_back = [], 0
    try:
        for round_ in range(3):
            # a writer killed between write and commit leaves nothing visible anywhere
            kproc = _popen_pipe("multi", root, timeout_ms, topic, f"killed.{round_}",
                                tmp_path / "never")
            written = LineReader(kproc).expect("written")["written"]
            kproc.kill()
            kproc.wait()
            assert len(written["ranges"]) == n
            assert all(written["segments"][f"{topic}:{p}"] for p in range(n))
            visible_before = [len(list(admin.consume(topic, p))) for p in range(n)]
            assert visible_before == [5 * round_] * n
            ktxn = written["txn"]
            deadline = cluster.state().txns[ktxn]["deadline"]

            # a writer that commits: visible everywhere at once, but only once the dead
            # writer's reservation (below it in every partition) is aborted
            go = tmp_path / f"go.{round_}"
            cproc = _popen_pipe("multi", root, 60_000, topic, f"committer.{round_}", go)
            creader = LineReader(cproc)
            creader.expect("written")
            time.sleep(0.2)
            go.touch()
            ack = creader.expect("ack")["ack"]
            assert cproc.wait(timeout=30) == 0
            state = cluster.state()
            if ktxn in state.txns:     # (on a very slow machine the committer aborted it first)
                held_back += 1
                assert [len(list(admin.consume(topic, p))) for p in range(n)] == visible_before, \
                    "the dead writer's open reservation must hold back the high watermark"
            time.sleep(max(0.0, deadline / 1000 - time.time()) + 0.1)
            assert cluster.abort_expired() in ([ktxn], [])
            assert cluster.state().decided[ktxn] == "aborted"
            got = {(r.partition, r.offset): r.key.decode() for r in admin.consume(topic)}
            committed_keys += [((t, p, o), k) for t, p, o, k in ack]
            assert got == {(p, o): k for (t, p, o), k in committed_keys}
            assert not any(k.startswith("killed") for k in got.values())
            removed = admin.cleanup()["segments"]
            for p in range(n):
                for b in written["segments"][f"{topic}:{p}"]:
                    assert f"logdir-0/{topic}-{p}/{b:020d}" in removed
            time.sleep(0.3)
    finally:
        stop.touch()
        try:
            poller.wait(timeout=30)
        finally:
            if poller.poll() is None:
                poller.kill()
    assert poller.returncode == 0, poller.stderr.read()
    polls = list(complete_json_lines(poll_out))
    counts = Counter(tuple(m["counts"]) for m in polls)
    subsets = [m for m in polls if len(set(m["counts"])) != 1]
    assert not subsets, f"a reader saw a multi-partition commit partially: {subsets[:5]}"
    assert all(not any(w.startswith("killed") for ws in m["writers"] for w in ws) for m in polls)
    assert {c[0] for c in counts} == {0, 5, 10, 15}, f"the poller saw only {counts}"
    assert held_back, "no committed write was ever held back by the dead writer's reservation"
    print(f"\n[atomic] {len(polls)} polls, one state each: {dict(counts)}; the dead writer's "
          f"reservation held back a committed write in {held_back} of 3 rounds")


# -- a deterministic replay of a race the torture run can hit ----------------------------------

def test_writer_reads_its_own_outcome_past_a_newer_snapshot(tmp_path):
    """Between a writer's create-if-absent of entry N and its replay, another process appends up
    to a snapshot boundary and writes the snapshot. Snapshots carry no per-action results, so the
    writer must replay its own entry rather than jump to the snapshot (it used to raise KeyError
    in ``Cluster.submit``: a committed write reported as failed, a reservation left dangling)."""
    from pyspark_kafkalog.cluster.metalog import MetadataLog, entry_name
    from pyspark_kafkalog.storage import open_storage

    storage = open_storage(str(tmp_path))
    mine, other = (MetadataLog(storage, snapshot_interval=5),
                   MetadataLog(open_storage(str(tmp_path)), snapshot_interval=5))
    for _ in range(3):
        mine.append([{"op": "acl", "add": []}])
    other.state()
    create = storage.create_if_absent

    def create_then_race(path, data):
        create(path, data)
        if path == entry_name(3):                  # our entry 3 exists; the other process
            for _ in range(2):                     # appends 4 and 5, and snapshots 5
                other.append([{"op": "acl", "add": []}])

    storage.create_if_absent = create_then_race
    seq, state = mine.append([{"op": "acl", "add": [{"principal": "User:x", "topic": "t",
                                                      "operation": "READ",
                                                      "permission": "MAYBE"}]}])
    assert (tmp_path / "_kafkalog" / "log" / f"{5:020d}.snapshot.json").exists()
    assert seq == 3 and state.seq == 3       # the state right after our own entry
    assert state.results[seq][0].error == "INVALID_REQUEST"   # our own action's fate
    assert mine.state().seq == 5             # and the next replay goes on past the snapshot


def test_retention_plans_again_when_delete_records_removes_a_segment_under_it(tmp_path):
    """The torture run's retention process once died of StorageNotFoundError: delete-records
    removed a segment between retention's listing and its reading of that segment. Both only
    raise the log start offset, so retention must plan that partition again, not fail."""
    from pyspark_kafkalog.format.records import Record

    admin = Admin(str(tmp_path))
    admin.create_topic("r", 1, configs={"segment.bytes": "300", "retention.bytes": "700",
                                        "retention.ms": str(9 * 86_400_000)})
    for i in range(12):
        admin.produce("r", [Record(b"k%d" % i, b"v" * 120, 1_000 + 86_400_000 * i)],
                      partition=0)
    storage = admin.cluster.storage
    raced = []

    def after_a_concurrent_delete(real):
        def call(path, *args, **kwargs):
            if path.endswith((".log", ".index", ".timeindex")) and not raced:
                raced.append(path)                 # another process deletes records meanwhile
                admin.delete_records_before({("r", 0): 3})
            return real(path, *args, **kwargs)
        return call

    # whichever of a segment's files retention reads first (segment sizes may come from the
    # directory listing, so the race is on the first read of the segment, whatever it is)
    real = {name: getattr(storage, name) for name in ("size", "read", "read_into", "map")}
    for name, fn in real.items():
        setattr(storage, name, after_a_concurrent_delete(fn))
    try:
        plans = admin.retention(now_ms=1_000 + 10 * 86_400_000)
    finally:
        for name in real:
            delattr(storage, name)
    assert raced and len(plans) == 1
    ps = admin.cluster.state().partition("r", 0)
    assert ps.log_start_offset == plans[0].new_log_start_offset > 3
    assert [r.offset for r in admin.consume("r")] == list(range(ps.log_start_offset, 12))


def test_reader_whose_state_predates_a_deletion_gets_offset_out_of_range(tmp_path):
    """The race the torture run's readers hit: a reader replays the metadata log, then
    delete-records (or retention) raises the log start offset and deletes segments, then the
    reader lists the partition. Its state still promises the deleted offsets: they must come back
    as OffsetOutOfRangeError (docs/protocol.md §4), not silently as fewer records."""
    import pytest
    from pyspark_kafkalog.format.records import Record

    admin = Admin(str(tmp_path))
    cluster = admin.cluster
    admin.create_topic("d", 1, configs={"segment.bytes": "100"})
    for i in range(4):
        admin.produce("d", [Record(b"k%d" % i, b"v" * 50)], partition=0)
    old = cluster.state()
    admin.delete_records_before({("d", 0): 3})        # deletes the segments of offsets 0..2
    view = cluster.partition_view("d", 0, old)        # lists after the deletion
    assert view.log_start_offset == 0
    with pytest.raises(OffsetOutOfRangeError):
        list(iter_records(view, 0))
    with pytest.raises(OffsetOutOfRangeError):
        list(iter_records(view, 2))
    assert [r.offset for r in iter_records(view, 3)] == [3]
    # an aborted range is a gap, not a deletion: reading across it is no error
    from pyspark_kafkalog.client.producer import Producer
    producer = Producer(cluster)
    producer.abort([producer.write({("d", 0): producer.encode("d", [Record(b"x", b"y")])})])
    admin.produce("d", [Record(b"k5", b"v")], partition=0)
    view = cluster.partition_view("d", 0)
    assert [r.offset for r in iter_records(view, 4)] == [5]
    assert [r.offset for r in admin.consume("d")] == [3, 5]


def test_a_listing_that_misses_an_entry_created_meanwhile_is_no_gap(tmp_path):
    """Seen at KAFKALOG_TORTURE_SCALE=5: readdir is no snapshot, so a reader listed entry N+1 but
    not entry N, created a moment earlier by another process, and failed with "metadata log has
    a gap". The entry exists: it must be read, not reported as corruption."""
    import pytest
    from pyspark_kafkalog.cluster.metalog import MetadataLog, entry_name
    from pyspark_kafkalog.errors import CorruptRecordError
    from pyspark_kafkalog.storage import open_storage

    writer = MetadataLog(open_storage(str(tmp_path)))
    for _ in range(4):
        writer.append([{"op": "acl", "add": []}])
    storage = open_storage(str(tmp_path))
    reader = MetadataLog(storage)
    assert reader.state().seq == 3
    for _ in range(3):
        writer.append([{"op": "acl", "add": []}])
    listing = storage.list
    storage.list = lambda d: [i for i in listing(d) if i.name != entry_name(4).rsplit("/")[-1]]
    assert reader.state().seq == 6                   # entry 4 read although not listed
    # a real gap (an entry that does not exist) is still corruption
    (tmp_path / entry_name(5)).unlink()
    with pytest.raises(CorruptRecordError, match="gap"):
        MetadataLog(storage).state()
