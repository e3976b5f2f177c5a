"""Child processes for tests/system/test_replication_crash.py: a coordinator that replicates, a producer
and a tailing reader, each a real process the parent kills with SIGKILL (or freezes with
SIGSTOP) at random moments.

    python replication_child.py coordinator ROOT TOKEN LEASE_MS FETCH_WAIT_MS LAG_MS SLOW_MS SEED
        ``Coordinator(Cluster(ROOT), maintenance=False, ...)`` until SIGTERM (then a clean stop:
        the lease is released). Prints {"serving": holder} once it serves. To make the parent's
        random kills land inside a replication pass, not between passes, copies are slowed
        down: files are copied in 512-byte chunks with SLOW_MS ms of sleep after each (a slow
        storage). With SEED != 0 the process also SIGKILLs *itself*, with a small probability,
        right before or right after appending a ``replica_progress`` / ``alter_isr``, or before
        writing the followers' derived files: the windows a random external kill rarely hits.
        Nothing of the library is changed; only the test's own process is slowed or killed.
    python replication_child.py producer ROOT WID SEED ACKS STOP TOPIC...
        ``Admin.produce`` of a few records to a random partition of a random topic, until the
        file STOP exists; one ack line per call, printed only after the call returned:
        {"ack": [[topic, partition, offset, key], ...]}. Every record's value is
        ``value_for(key)``. ACKS: ``default`` (the library's), ``all``, ``1``, or ``mixed`` (a
        random one per call). A call refused with an error that says the write was aborted
        (acks=all: NotEnoughReplicas*, RequestTimedOut) prints {"refused": [key, ...], ...}:
        none of those records may ever be read. Any other error prints {"error": ...}.
    python replication_child.py tailer ROOT STOP TOPIC...
        Reads every topic from the earliest offset again and again (``Admin.consume``, a new
        consumer each time) until STOP exists, then once more. Prints each (topic, partition,
        offset) the first time it is seen: {"r": [topic, p, offset, key]}; and {"two_values":
        ...} if a later read shows another key or value at an offset seen before,
        {"vanished": ...} if an offset seen before is not visible any more, {"foreign": ...}
        for a value no writer wrote; after the last read {"final": {"topic p": count}}.

Errors are printed as {"error": type, "msg": ...}; the parent decides.
"""
from __future__ import annotations

import os
import random
import signal
import sys
import time
import traceback

from procs.torture_common import (emit, log_to_stderr, make_key, now_ms, serve_coordinator,
                                  value_for)


def _error(exc: BaseException, where: str) -> None:
    emit({"error": type(exc).__name__, "where": where, "msg": str(exc)[:300],
          "tb": traceback.format_exc()[-1500:]})


def coordinator(root, token, lease_ms, fetch_wait_ms, lag_ms, slow_ms, seed):
    from pyspark_kafkalog.coordinator import copier, replicator

    log_to_stderr()
    slow_s, seed = int(slow_ms) / 1000, int(seed)
    if slow_s > 0:
        chunks = copier._chunks

        def slow_chunks(st, path, size, chunk_bytes, check):
            for c in chunks(st, path, size, min(chunk_bytes, 512), check):
                time.sleep(slow_s)
                yield c
        copier._chunks = slow_chunks
    if seed:
        rng = random.Random(seed)

        def maybe_die(where: str) -> None:
            if rng.random() < 0.01:
                sys.stderr.write(f"{os.getpid()} kills itself {where}\n")
                sys.stderr.flush()
                os.kill(os.getpid(), signal.SIGKILL)

        submit, derived = replicator.Replicator._submit, replicator.Replicator._write_derived

        def _submit(self, action, result):
            maybe_die(f"before {action.OP}")
            after = submit(self, action, result)
            maybe_die(f"after {action.OP}")
            return after

        def _write_derived(self, state, progress):
            maybe_die("before the derived files")
            return derived(self, state, progress)
        replicator.Replicator._submit = _submit
        replicator.Replicator._write_derived = _write_derived

    serve_coordinator(root, token, lease_ms, replica_fetch_wait_max_ms=int(fetch_wait_ms),
                      replica_lag_time_max_ms=int(lag_ms))


#: errors after which a write is aborted (docs/protocol.md §1.3, acks=all): never visible
REFUSED = ("NotEnoughReplicasError", "NotEnoughReplicasAfterAppendError", "RequestTimedOutError")


def producer(root, wid, seed, acks, stop, *topics):
    from pyspark_kafkalog.admin import Admin
    from pyspark_kafkalog.format.records import Record

    admin = Admin(root, create=False, fsync=False)
    counts = {t: admin.cluster.partition_count(t) for t in topics}
    rng = random.Random(int(seed))
    call = 0
    while not os.path.exists(stop):
        call += 1
        topic = rng.choice(topics)
        p = rng.randrange(counts[topic])
        keys = [make_key(wid, call, j) for j in range(rng.randint(1, 6))]
        ts = now_ms()
        options = {} if acks == "default" else {
            "acks": rng.choice(["all", "1"]) if acks == "mixed" else acks}
        # retried as Kafka's producer retries, but briefly: a refusal is still reported, and
        # the parent's stop file is seen soon
        options["delivery_timeout_ms"] = 3000
        try:
            md = admin.produce(topic, [Record(k, value_for(k), ts) for k in keys], partition=p,
                               **options)
        except Exception as exc:   # noqa: BLE001 - reported, the parent decides
            if type(exc).__name__ in REFUSED:
                emit({"refused": [k.decode() for k in keys], "error_type": type(exc).__name__,
                      "msg": str(exc)[:300], **options})
            else:
                _error(exc, "produce")
            time.sleep(0.05)
            continue
        emit({"ack": [[m.topic, m.partition, m.offset, k.decode()] for m, k in zip(md, keys)]})
        time.sleep(rng.uniform(0, 0.01))


def tailer(root, stop, *topics):
    from pyspark_kafkalog.admin import Admin

    admin = Admin(root, create=False, fsync=False)
    seen = {}    # (topic, p, offset) -> (key, value)
    last = False
    reads = 0
    while True:
        last = os.path.exists(stop)
        now = {}
        try:
            for topic in topics:
                for r in admin.consume(topic):
                    now[(topic, r.partition, r.offset)] = (r.key, r.value)
        except Exception as exc:   # noqa: BLE001
            _error(exc, "consume")
            time.sleep(0.05)
            continue
        reads += 1
        for tpo, kv in sorted(now.items()):
            old = seen.get(tpo)
            if old is None:
                seen[tpo] = kv
                emit({"r": [*tpo, kv[0].decode()]})
                if kv[1] != value_for(kv[0]):
                    emit({"foreign": [*tpo, kv[0].decode()]})
            elif old != kv:
                emit({"two_values": [*tpo, old[0].decode(), kv[0].decode()]})
        gone = [tpo for tpo in seen if tpo not in now]
        if gone:
            emit({"vanished": sorted(gone)[:20], "n": len(gone)})
        if last:
            counts = {}
            for t, p, _o in now:
                counts[f"{t} {p}"] = counts.get(f"{t} {p}", 0) + 1
            emit({"final": counts, "reads": reads})
            return
        time.sleep(0.02)


if __name__ == "__main__":
    mode, args = sys.argv[1], sys.argv[2:]
    try:
        {"coordinator": coordinator, "producer": producer, "tailer": tailer}[mode](*args)
    except BaseException as exc:
        if not isinstance(exc, (KeyboardInterrupt, SystemExit)):
            _error(exc, mode)
        raise
