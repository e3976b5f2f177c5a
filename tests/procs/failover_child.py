"""Child processes for tests/system/test_replication_failover.py: a coordinator with a short
``broker.session.timeout.ms`` and a producer that logs each write unit's outcome with its times.
The tailing reader is ``replication_child.py tailer``, run as is.

    python failover_child.py coordinator ROOT TOKEN LEASE_MS FETCH_WAIT_MS LAG_MS SESSION_MS
        ``Coordinator(Cluster(ROOT), maintenance=False, ...)`` with
        ``replica_fetch_wait_max_ms``, ``replica_lag_time_max_ms`` and
        ``broker_session_timeout_ms`` as given, until SIGTERM (then a clean stop: the lease is
        released). Prints {"serving": holder, ...} once it runs (active or standby); logs at
        INFO on stderr (elections, ISR changes).
    python failover_child.py producer ROOT WID SEED STOP TOPIC
        ``Admin.produce(..., acks="all")`` of 1 to 6 records to a random partition, until the
        file STOP exists. One line per write unit, printed once the call returned:
        {"ack": [[topic, partition, offset, key], ...], "p": partition, "t0": start, "t1": end}
        or, when the call raised, {"failed": [key, ...], "p": partition, "error": type,
        "msg": ..., "t0": ..., "t1": ...} (times: ``time.time()``). After a failure it waits
        a short backoff and writes a *new* unit (new keys): a failed unit is never retried,
        so none of its records may ever be read.
    python failover_child.py follower ROOT STOP TOPIC
        ``Admin.consume(TOPIC, follow=True, group=...)`` (``kafkalog consume --follow``), polling
        every 50 ms, until it is caught up after the file STOP exists. Prints each record as
        {"r": [topic, partition, offset, key], "ok": value matches key}. When the iteration
        raises, prints {"error": type, "msg": ..., "t": time.time()} and follows again with the
        same group, from its committed offsets (records may come again: at least once).
"""
from __future__ import annotations

import os
import random
import sys
import time

from procs.replication_child import _error
from procs.torture_common import (emit, log_to_stderr, make_key, now_ms, serve_coordinator,
                                  value_for)

#: after a failed unit (Kafka's retry.backoff.ms is 100)
BACKOFF_S = 0.1


def coordinator(root, token, lease_ms, fetch_wait_ms, lag_ms, session_ms):
    log_to_stderr()
    serve_coordinator(root, token, lease_ms, replica_fetch_wait_max_ms=int(fetch_wait_ms),
                      replica_lag_time_max_ms=int(lag_ms),
                      broker_session_timeout_ms=int(session_ms))


def producer(root, wid, seed, stop, topic):
    from pyspark_kafkalog.admin import Admin
    from pyspark_kafkalog.format.records import Record

    admin = Admin(root, create=False, fsync=False)
    n = admin.cluster.partition_count(topic)
    rng = random.Random(int(seed))
    call = 0
    while not os.path.exists(stop):
        call += 1
        p = rng.randrange(n)
        keys = [make_key(wid, call, j) for j in range(rng.randint(1, 6))]
        t0 = time.time()
        try:
            # retried as Kafka's producer retries, but briefly: a failure is still reported,
            # and the parent's stop file is seen soon
            md = admin.produce(topic, [Record(k, value_for(k), now_ms()) for k in keys],
                               partition=p, acks="all", delivery_timeout_ms=3000)
        except Exception as exc:   # noqa: BLE001 - reported, the parent decides
            emit({"failed": [k.decode() for k in keys], "p": p, "error": type(exc).__name__,
                  "msg": str(exc)[:300], "t0": t0, "t1": time.time()})
            time.sleep(BACKOFF_S)
            continue
        emit({"ack": [[m.topic, m.partition, m.offset, k.decode()] for m, k in zip(md, keys)],
              "p": p, "t0": t0, "t1": time.time()})
        time.sleep(rng.uniform(0, 0.01))


class _Done(Exception):
    pass


def follower(root, stop, topic):
    from pyspark_kafkalog.admin import Admin

    admin = Admin(root, create=False, fsync=False)
    group = f"follower-{os.getpid()}"

    def caught_up():
        if os.path.exists(stop):
            raise _Done()

    while True:
        try:
            with admin.consume(topic, group=group, follow=True, poll_interval_ms=50,
                               auto_commit_interval_ms=100, on_caught_up=caught_up) as records:
                for r in records:
                    emit({"r": [topic, r.partition, r.offset, r.key.decode()],
                          "ok": r.value == value_for(r.key)})
        except _Done:
            emit({"done": True, "t": time.time()})
            return
        except Exception as exc:   # noqa: BLE001 - reported, the parent decides
            emit({"error": type(exc).__name__, "msg": str(exc)[:300], "t": time.time()})
            time.sleep(BACKOFF_S)


if __name__ == "__main__":
    mode, args = sys.argv[1], sys.argv[2:]
    try:
        {"coordinator": coordinator, "producer": producer, "follower": follower}[mode](*args)
    except BaseException as exc:
        if not isinstance(exc, (KeyboardInterrupt, SystemExit)):
            _error(exc, mode)
        raise
