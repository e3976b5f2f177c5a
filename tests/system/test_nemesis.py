"""A nemesis: random schedules of faults nobody designed a feature around, against replicated
partitions with producers and a tailer running, and the cluster's invariants checked after
every schedule (#33).

Each schedule is drawn from its seed. It runs a cluster with three log dirs, each on a root of
its own, and one RF=2 topic of four partitions, some of which stay empty. In three schedules of
four a coordinator runs its replication passes in a thread (fast, and the pass's own code is
all there is); in the fourth it is a whole coordinator service in a process of its own
(tests/procs/replication_child.py), paused and killed with real signals. The main thread takes
random steps:
- produce at acks=all and acks=1 (retried as Kafka's producer retries, briefly);
- write with a Spark job (the suite's session) at acks=all and acks=1, and, in a quarter of
  the schedules, run a streaming query t -> out throughout (restarted from its checkpoint at the
  end if a fault failed it);
- move a root away and back;
- delete, cut short or zero one of a follower's ``.log`` files;
- restore a follower's partition directory from an older copy of it;
- pause the coordinator past its lease while another takes over, then resume it (SIGSTOP,
  SIGCONT: it must be fenced), or stop it dead and start another (SIGKILL);
- reassign a partition;
- tail every partition.

After the faults end, every root is back, and one coordinator runs, these must hold:
- every acks=all record that was acknowledged is there, at its offset, unchanged (and every
  record of a Spark job at acks=all that succeeded);
- the streaming query's sink holds every visible source record exactly once;
- no write that failed ever shows;
- no offset ever named two records, in any read during the schedule;
- no high watermark ever went back;
- every partition's ISR is all of its replicas again, each holding everything committed,
  within ``HEAL_S`` seconds;
- every replica's committed segments are sha256-identical to the leader's.

``KAFKALOG_NEMESIS_SCHEDULES`` (default 20) sets how many schedules run, and
``KAFKALOG_NEMESIS_SEED`` sets the first seed (default: a new one each run);
``KAFKALOG_NEMESIS_STATS=FILE`` appends what each schedule did, one JSON line each. A failure names
its seed: ``KAFKALOG_NEMESIS_SEED=<seed> KAFKALOG_NEMESIS_SCHEDULES=1`` runs that schedule
alone (the thread's timing still varies from run to run). Streaming drivers killed with
SIGKILL are in tests/system/test_stream_exactly_once.py."""
from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

import pytest

from pyspark_kafkalog.admin import Admin
from pyspark_kafkalog.cluster.isr import replica_end
from pyspark_kafkalog.cluster.lease import acquire, new_holder_id
from pyspark_kafkalog.coordinator.replicator import Replicator
from pyspark_kafkalog.errors import FencedCoordinatorError, KafkaLogError
from pyspark_kafkalog.format.records import Record

SCHEDULES = int(os.environ.get("KAFKALOG_NEMESIS_SCHEDULES", "20"))
FIRST_SEED = int(os.environ.get("KAFKALOG_NEMESIS_SEED", "0")) or random.randrange(1, 1 << 30)
STEPS = 14
PARTITIONS = 4
LAG_MS, SESSION_MS, LEASE_MS = 400, 250, 150
PROCESS_LEASE_MS = 1000  # a coordinator process's lease (it renews every third of it)
HERE = Path(__file__).resolve().parents[1]          # tests/
HEAL_S = 30.0          # the stated bound: every ISR is whole again this long after the faults end

pytestmark = pytest.mark.slow


class Coordinator(threading.Thread):
    """A coordinator's replication loop with a lease of its own, on a ``Cluster`` of its own."""

    def __init__(self, root: str):
        super().__init__(daemon=True)
        cluster = Admin(root, create=False, fsync=False).cluster
        lease = acquire(cluster, new_holder_id(), "127.0.0.1:1", LEASE_MS)
        self.epoch = lease.epoch
        self.rep = Replicator(cluster, lambda: lease.epoch, replica_lag_time_max_ms=LAG_MS,
                              broker_session_timeout_ms=SESSION_MS,
                              replica_verify_interval_ms=100)
        self.running = threading.Event()
        self.running.set()
        self.stopped = threading.Event()
        self.fenced = False
        self.bugs: list = []
        self.start()

    def run(self) -> None:
        while not self.stopped.is_set():
            if not self.running.wait(0.05):
                continue
            try:
                self.rep.tick()
            except FencedCoordinatorError:
                self.fenced = True
                return
            except KafkaLogError:
                pass            # a storage fault: the next pass tries again, as a process would
            except Exception:   # noqa: BLE001 - a bug: the schedule fails with it
                self.bugs.append(traceback.format_exc())
                return
            time.sleep(0.02)

    def stop(self) -> None:
        self.stopped.set()
        self.running.set()
        self.join(30)


class ProcessCoordinator:
    """A whole coordinator service in a process of its own (tests/procs/replication_child.py),
    paused and killed with real signals; its lease renewals, fencing and takeover are the
    service's own."""

    def __init__(self, root: str, tmp: Path, n: int):
        out = tmp / f"coordinator-{n}.out"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parent), str(HERE)])}
        with open(out, "w") as f, open(tmp / f"coordinator-{n}.err", "w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, str(HERE / "procs" / "replication_child.py"), "coordinator",
                 root, "0123456789abcdef" * 4, *map(str, (PROCESS_LEASE_MS, 50, LAG_MS, 0, 0))],
                stdout=f, stderr=err, env=env)
        self.out = out
        self.bugs: list = []

    def serving(self) -> bool:
        return '"serving"' in self.out.read_text()

    def signal(self, sig) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def stop(self) -> None:
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGKILL)
        self.proc.wait(30)

    def is_alive(self) -> bool:
        return self.proc.poll() is None


def _copy_if_present(src: str, dst: str) -> None:
    try:
        shutil.copy2(src, dst)
    except FileNotFoundError:
        pass


class Schedule:
    def __init__(self, tmp: Path, seed: int, spark=None):
        self.rng = random.Random(seed)
        self.spark = spark
        #: a quarter of the schedules run the coordinator as a real process (slower to start)
        self.processes = self.rng.random() < 0.25
        self.tmp = tmp
        self.root = str(tmp / "root")
        self.admin = Admin(self.root, fsync=False)
        self.roots = {"logdir-0": tmp / "root" / "logdir-0"}
        for i in (1, 2):
            info = self.admin.add_log_dir(str(tmp / f"r{i}"))
            self.roots[info.log_dir] = tmp / f"r{i}"
        self.min_isr = self.rng.choice([1, 2])
        self.admin.create_topic("t", PARTITIONS, 2, {"min.insync.replicas": str(self.min_isr)})
        self.coords = [self.new_coordinator()]
        #: a quarter of the schedules run a streaming query t -> out beside everything else
        self.query = None
        if spark is not None and self.rng.random() < 0.25:
            self.admin.create_topic("out", 2)
            self.query = self.start_query()
        self.away: dict = {}            # log dir -> where its root is
        self.saved: dict = {}           # (partition, log dir) -> an older copy of its directory
        self.acked_all: dict = {}       # (partition, offset) -> value, acks=all acknowledged
        self.failed: set = set()        # values of writes that failed
        self.spark_acked_all: set = set()   # values of acks=all Spark jobs that succeeded
        self.seen: dict = {}            # (partition, offset) -> value, every read
        self.hw: dict = {}
        self.n = 0
        self.log: list = []

    # -- what the schedule checks all along -------------------------------------------------

    def observe(self) -> None:
        state = self.admin.cluster.state()
        for p in range(PARTITIONS):
            hw = state.partition("t", p).high_watermark
            assert hw >= self.hw.get(p, 0), f"partition {p}: high watermark {self.hw[p]} -> {hw}"
            self.hw[p] = hw

    def tail(self) -> None:
        try:
            records = list(self.admin.consume("t"))
        except KafkaLogError:
            return                      # a root away: retriable, not wrong
        for r in records:
            before = self.seen.setdefault((r.partition, r.offset), r.value)
            assert before == r.value, (f"offset {r.partition}:{r.offset} named {before!r} and "
                                       f"then {r.value!r}")

    # -- steps ------------------------------------------------------------------------------

    def leader(self, p: int) -> str:
        rep = self.admin.cluster.state().partition("t", p).replication
        return rep["leader"] if rep else self.admin.cluster.state().topics["t"]["replicas"][p][0]

    def follower_dir(self, p: int):
        state = self.admin.cluster.state()
        followers = [r for r in state.topics["t"]["replicas"][p]
                     if r != self.leader(p) and r not in self.away]
        if not followers:
            return None, None
        r = self.rng.choice(followers)
        return r, self.roots[r] / f"t-{p}"

    def produce(self) -> None:
        p = self.rng.choice([0, 0, 1, 1, 2])            # partition 3 stays empty
        acks = self.rng.choice(["all", "1"])
        values = [f"v{self.n}-{j}".encode() for j in range(self.rng.randint(1, 4))]
        self.n += 1
        try:
            placed = self.admin.produce("t", [Record(b"k", v) for v in values], partition=p,
                                        acks=acks, request_timeout_ms=1500,
                                        delivery_timeout_ms=2500, retry_backoff_ms=50)
        except KafkaLogError as exc:
            self.failed.update(values)
            self.log.append(f"produce acks={acks} p{p} failed: {type(exc).__name__}")
            return
        if acks == "all":
            for m, v in zip(placed, values):
                self.acked_all[(m.partition, m.offset)] = v
        self.log.append(f"produce acks={acks} p{p} -> {placed[0].offset}")

    def start_query(self):
        src = (self.spark.readStream.format("kafkalog").option("subscribe", "t")
               .option("startingOffsets", "earliest").load(self.root)
               .selectExpr("key", "upper(CAST(value AS STRING)) AS value"))
        return (src.writeStream.format("kafkalog").option("topic", "out")
                .option("checkpointLocation", str(self.tmp / "checkpoint"))
                .option("delivery.timeout.ms", "2500").option("retry.backoff.ms", "50")
                .trigger(processingTime="200 milliseconds").start(self.root))

    def finish_query(self) -> None:
        """The streaming query, restarted from its checkpoint whenever a fault failed it (at
        most 3 times), catches up once the faults end: the sink then holds every visible
        source record exactly once."""
        want = sorted(r.value.upper() for r in self.admin.consume("t"))
        end = time.monotonic() + 90
        got, restarts, why = [], 0, ""
        while time.monotonic() < end:
            if not self.query.isActive:
                why = str(self.query.exception()).splitlines()[0][:300]
                self.log.append(f"streaming query failed: {why}")
                if restarts == 3:
                    break
                restarts += 1
                self.query = self.start_query()
            got = sorted(r.value for r in self.admin.consume("out"))
            if len(got) >= len(want):
                break
            time.sleep(0.2)
        self.query.stop()
        assert got == want, (f"the streaming query's sink is not the source exactly once: "
                             f"{len(got)} records for {len(want)} ({why})")

    def spark_write(self) -> None:
        """A Spark job's write (tasks reserve and write, the driver commits), acks all or 1."""
        if self.spark is None:
            return self.produce()
        p = self.rng.choice([0, 1, 2])
        acks = self.rng.choice(["all", "1"])
        values = [f"s{self.n}-{j}" for j in range(self.rng.randint(1, 6))]
        self.n += 1
        df = self.spark.createDataFrame([("k", v, p) for v in values],
                                        "key string, value string, partition int")
        try:
            (df.write.format("kafkalog").option("topic", "t").option("acks", acks)
             .option("request.timeout.ms", "1500").option("delivery.timeout.ms", "2500")
             .option("retry.backoff.ms", "50").mode("append").save(self.root))
        except Exception as exc:   # noqa: BLE001 - Py4J wraps ours: a failed job shows nothing
            self.failed.update(v.encode() for v in values)
            self.log.append(f"spark write acks={acks} p{p} failed: {str(exc).splitlines()[0][:80]}")
            return
        if acks == "all":
            self.spark_acked_all.update(v.encode() for v in values)
        self.log.append(f"spark write acks={acks} p{p}")

    def root_away(self) -> None:
        if self.away:
            d, where = next(iter(self.away.items()))
            where.rename(self.roots[d])
            del self.away[d]
            self.log.append(f"{d} back")
            return
        d = self.rng.choice(sorted(self.roots))
        where = self.tmp / f"away-{d}"
        self.roots[d].rename(where)
        self.away[d] = where
        self.log.append(f"{d} away")

    def damage(self) -> None:
        p = self.rng.randrange(PARTITIONS)
        r, d = self.follower_dir(p)
        logs = sorted(d.glob("*.log")) if d is not None and d.exists() else []
        if not logs:
            return
        f = self.rng.choice(logs)
        how = self.rng.choice(["delete", "cut", "zero"])
        if how == "delete":
            f.unlink()
        else:
            data = f.read_bytes()
            f.write_bytes(data[:len(data) // 2] if how == "cut" else bytes(len(data)))
        self.log.append(f"{how} {r}/t-{p}/{f.name}")

    def save_or_restore(self) -> None:
        """Restore a follower's partition directory from a copy saved earlier in the schedule
        (a root brought back from an older backup), or save such a copy."""
        older = [(p, r) for (p, r) in self.saved
                 if r not in self.away and r != self.leader(p)
                 and r in self.admin.cluster.state().topics["t"]["replicas"][p]]
        if older and self.rng.random() < 0.7:
            p, r = self.rng.choice(sorted(older))
            d = self.roots[r] / f"t-{p}"
            shutil.rmtree(d, ignore_errors=True)
            shutil.copytree(self.saved.pop((p, r)), d, dirs_exist_ok=True)
            self.log.append(f"restored {r}/t-{p} from an older copy")
            return
        p = self.rng.randrange(PARTITIONS)
        r, d = self.follower_dir(p)
        if d is None or not d.exists():
            return
        copy = self.tmp / f"saved-{p}-{r}-{self.n}"
        shutil.rmtree(copy, ignore_errors=True)
        # The replicator may be writing here: its temporary files are renamed away, and a
        # segment may be deleted, while the copy runs. A backup has what was there to copy.
        shutil.copytree(d, copy, ignore=shutil.ignore_patterns(".*.tmp-*"),
                        copy_function=_copy_if_present)
        self.saved[(p, r)] = copy
        self.log.append(f"saved {r}/t-{p}")

    def new_coordinator(self):
        if not self.processes:
            return Coordinator(self.root)
        c = ProcessCoordinator(self.root, self.tmp, len(getattr(self, "coords", ())))
        end = time.monotonic() + 60
        while not c.serving() and time.monotonic() < end:
            time.sleep(0.05)
        return c

    def coordinator(self) -> None:
        active = self.coords[-1]
        if self.processes:
            if self.rng.random() < 0.5:                  # SIGSTOP, a takeover, SIGCONT
                active.signal(signal.SIGSTOP)
                self.coords.append(self.new_coordinator())   # a standby takes the lease
                time.sleep(PROCESS_LEASE_MS / 1000)
                active.signal(signal.SIGCONT)            # resumed: fenced, it stands by
                self.log.append("coordinator process SIGSTOP, replaced, SIGCONT")
            else:
                active.signal(signal.SIGKILL)
                self.coords.append(self.new_coordinator())
                self.log.append("coordinator process SIGKILL, another started")
            return
        if self.rng.random() < 0.5:                      # SIGSTOP, a takeover, SIGCONT
            active.running.clear()
            time.sleep(LEASE_MS / 1000 + 0.05)
            self.coords.append(Coordinator(self.root))
            time.sleep(0.1)
            active.running.set()                         # resumed: must find itself fenced
            self.log.append("coordinator paused past its lease, replaced, resumed")
        else:                                            # SIGKILL, another starts
            active.stop()
            time.sleep(LEASE_MS / 1000 + 0.05)
            self.coords.append(Coordinator(self.root))
            self.log.append("coordinator killed, another started")

    def reassign(self) -> None:
        p = self.rng.randrange(PARTITIONS)
        online = [d for d in sorted(self.roots) if d not in self.away]
        if len(online) < 2:
            return
        target = self.rng.sample(online, 2)
        try:
            self.admin.reassign_partitions({("t", p): target})
            self.log.append(f"reassign p{p} -> {target}")
        except KafkaLogError as exc:
            self.log.append(f"reassign p{p} refused: {type(exc).__name__}")

    def run(self) -> None:
        steps = [self.produce] * 6 + [self.root_away] * 2 + [self.damage] * 2 + [
            self.save_or_restore] * 2 + [self.coordinator, self.reassign, self.tail,
                                          self.spark_write]
        for _ in range(STEPS):
            self.rng.choice(steps)()
            time.sleep(self.rng.uniform(0, 0.15))
            self.observe()
        self.heal()

    # -- the end ----------------------------------------------------------------------------

    def heal(self) -> None:
        for d, where in list(self.away.items()):
            where.rename(self.roots[d])
        self.away.clear()
        self.log.append("faults end")
        # a file damaged by the last step is found at the next check of its follower: let every
        # follower be checked once (replica.verify.interval.ms: 100 in a thread, the default
        # 1000 in a process) before judging the ISR
        time.sleep(1.5 if self.processes else 0.5)
        end = time.monotonic() + HEAL_S
        while time.monotonic() < end:
            state = self.admin.cluster.state()
            whole = all(
                (ps := state.partition("t", p)).replication is None
                or (sorted(ps.replication["isr"]) == sorted(state.topics["t"]["replicas"][p])
                    and "target" not in ps.replication
                    and all(replica_end(ps, r) >= ps.last_stable_offset
                            for r in ps.replication["isr"]))
                for p in range(PARTITIONS))
            if whole:
                break
            time.sleep(0.1)
        else:
            raise AssertionError(f"the ISR did not heal within {HEAL_S} s: "
                                 f"{[state.partition('t', p).replication for p in range(PARTITIONS)]}")
        if self.query is not None:
            self.finish_query()
        for c in self.coords:
            c.stop()
        for c in self.coords:
            assert not c.bugs, c.bugs[0]
        for c in self.coords[:-1]:
            assert not c.is_alive()

    def check(self) -> None:
        self.observe()
        self.tail()
        records = {(r.partition, r.offset): r.value for r in self.admin.consume("t")}
        for key, value in self.acked_all.items():
            assert records.get(key) == value, f"acks=all record {key} {value!r} lost or changed"
        shown = set(records.values())
        assert not (self.failed & shown), f"failed writes show: {sorted(self.failed & shown)}"
        lost = self.spark_acked_all - shown
        assert not lost, f"records of acks=all Spark jobs lost: {sorted(lost)}"
        state = self.admin.cluster.state()
        for p in range(PARTITIONS):
            ps = state.partition("t", p)
            lo = ps.log_start_offset
            committed = [(s, e) for s, e, _ in ps.committed if e > lo]

            def digests(d: str):
                out = {}
                for f in sorted((self.roots[d] / f"t-{p}").glob("*.log")):
                    base = int(f.stem)
                    if any(s <= base < e for s, e in committed):
                        out[f.name] = hashlib.sha256(f.read_bytes()).hexdigest()
                return out
            replicas = state.topics["t"]["replicas"][p]
            leader = digests(self.leader(p))
            for r in replicas:
                assert digests(r) == leader, f"partition {p}: {r} differs from the leader"


@pytest.mark.parametrize("i", range(SCHEDULES))
def test_nemesis_schedule_keeps_the_invariants(tmp_path, i, spark):
    seed = FIRST_SEED + i
    s = None
    try:
        s = Schedule(tmp_path, seed, spark)
        s.run()
        s.check()
        if os.environ.get("KAFKALOG_NEMESIS_STATS"):   # one JSON line per schedule, for the record
            kinds = [line.split()[0] for line in s.log]
            with open(os.environ["KAFKALOG_NEMESIS_STATS"], "a") as f:
                f.write(json.dumps({"seed": seed, "processes": s.processes,
                                    "streaming_query": s.query is not None,
                                    "steps": {k: kinds.count(k) for k in set(kinds)},
                                    "acked_all": len(s.acked_all), "failed": len(s.failed),
                                    "records": len(s.seen)}) + "\n")
    except BaseException as exc:
        steps = "\n  ".join(s.log) if s is not None else ""
        raise AssertionError(f"nemesis schedule failed; reproduce with KAFKALOG_NEMESIS_SEED="
                             f"{seed} KAFKALOG_NEMESIS_SCHEDULES=1\n  {steps}\n{exc}") from exc
    finally:
        if s is not None:
            if s.query is not None and s.query.isActive:
                s.query.stop()
            for c in s.coords:
                c.stop()
