"""Child processes for tests/maintenance/test_cleanup_safety.py: writers, holders and cleaners of one cluster,
each with its own (possibly skewed) clock.

    python safety_child.py MODE ROOT ARGS...

  producer ROOT WID SKEW_MS TIMEOUT_MS STOP    Admin.produce of 1-3 records until STOP exists
  holder   ROOT WID SKEW_MS TIMEOUT_MS GO      reserve and write, print "reserved", wait for GO
                                               to exist, commit
  dier     ROOT WID SKEW_MS TIMEOUT_MS         reserve and write, print "reserved", then hang
                                               (the parent kills it with SIGKILL)
  cleaner  ROOT SKEW_MS STOP                   cleanup + retention in a loop until STOP exists

A writer prints one JSON line per acknowledged record ({"ack": [partition, offset, key]}) only
after the library call returned; an error is printed as {"error": type, "msg": ...} and the loop
goes on (the parent decides which errors are acceptable).
"""
from __future__ import annotations

import json
import os
import random
import sys
import time
import traceback

from pyspark_kafkalog.admin import Admin
from pyspark_kafkalog.client.producer import Producer
from pyspark_kafkalog.errors import KafkaLogError
from pyspark_kafkalog.format.records import Record

TOPIC = "s"


def emit(obj) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def admin(root: str, skew_ms: int, timeout_ms: int = 60_000) -> Admin:
    skew = skew_ms / 1000.0
    return Admin(root, create=False, clock=lambda: time.time() + skew,
                 transaction_timeout_ms=timeout_ms)


def error(exc: BaseException) -> None:
    emit({"error": type(exc).__name__, "msg": str(exc)[:300],
          "typed": isinstance(exc, KafkaLogError),
          "tb": "" if isinstance(exc, KafkaLogError) else traceback.format_exc()[-1500:]})


def records(wid: str, call: int, n: int, now_ms: int):
    return [Record(f"{wid}-{call}-{j}".encode(), f"v-{wid}-{call}-{j}".encode(), now_ms)
            for j in range(n)]


def producer(root, wid, skew_ms, timeout_ms, stop) -> None:
    a = admin(root, int(skew_ms), int(timeout_ms))
    rnd = random.Random(wid)
    call = 0
    while not os.path.exists(stop):
        call += 1
        recs = records(wid, call, rnd.randint(1, 3), a.cluster.now_ms())
        try:
            acks = a.produce(TOPIC, recs, partition=rnd.randrange(2))
        except KafkaLogError as exc:
            error(exc)
            continue
        for r, ack in zip(recs, acks):
            emit({"ack": [ack.partition, ack.offset, r.key.decode()]})


def _reserve(root, wid, skew_ms, timeout_ms):
    a = admin(root, int(skew_ms), int(timeout_ms))
    prod = Producer(a.cluster, transaction_timeout_ms=int(timeout_ms))
    recs = records(wid, 0, 3, a.cluster.now_ms())
    pending = prod.write({(TOPIC, 0): prod.encode(TOPIC, recs)})
    emit({"reserved": pending.ranges})
    return prod, pending, recs


def holder(root, wid, skew_ms, timeout_ms, go) -> None:
    prod, pending, recs = _reserve(root, wid, skew_ms, timeout_ms)
    while not os.path.exists(go):
        time.sleep(0.01)
    try:
        prod.commit([pending])
    except KafkaLogError as exc:
        error(exc)
        return
    start = list(pending.ranges.values())[0][0]
    for i, r in enumerate(recs):
        emit({"ack": [0, start + i, r.key.decode()]})


def dier(root, wid, skew_ms, timeout_ms) -> None:
    _reserve(root, wid, skew_ms, timeout_ms)
    while True:
        time.sleep(1)


def cleaner(root, skew_ms, stop) -> None:
    a = admin(root, int(skew_ms))
    runs = 0
    while not os.path.exists(stop):
        try:
            removed = a.cleanup()
            a.retention()
            runs += 1
            if removed["segments"] or removed["dirs"]:
                emit({"removed": removed["segments"] + removed["dirs"]})
        except KafkaLogError as exc:
            error(exc)
    emit({"runs": runs})


if __name__ == "__main__":
    mode, args = sys.argv[1], sys.argv[2:]
    try:
        {"producer": producer, "holder": holder, "dier": dier, "cleaner": cleaner}[mode](*args)
    except BaseException as exc:   # report, never hide: the parent fails on untyped errors
        error(exc)
        raise
