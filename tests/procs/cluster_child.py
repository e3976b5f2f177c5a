"""Child processes for tests/system/test_torture.py: real processes writing, deleting, reading a cluster.

    python cluster_child.py MODE ROOT ARGS...

Writers print an ack (one JSON line, flushed) only after the library call returned successfully.
Every error is printed as ``{"error": <type>, ...}`` and the loop goes on: the parent decides which
errors are acceptable. Modes:

  writer   ROOT WID SEED TIMEOUT_MS        Admin.produce / Producer.send forever
  staller  ROOT WID SEED TIMEOUT_MS        Producer.write, sleep (often past the deadline), commit
  deleter  ROOT WID SEED                   Admin.delete_records_before at random offsets
  retainer ROOT WID SEED                   Admin.retention() (topic B has a tiny retention.bytes)
  tailer   ROOT OUT STOP                   reads every partition from where it stopped
  zombie   ROOT TIMEOUT_MS TOPIC N GO COMMIT_GO   write, pause mid-write, write more, commit
  once     ROOT WID TOPIC PARTITION N      one Admin.produce
  multi    ROOT TIMEOUT_MS TOPIC WID GO     Producer.write to every partition, wait for GO, commit
  poller   ROOT TOPIC STOP                 one state per poll: visible records per partition
"""
from __future__ import annotations

import os
import random
import sys
import time
import traceback

from procs.torture_common import ALL_TPS, TOPICS, emit, make_key, now_ms, value_for
from pyspark_kafkalog.admin import Admin
from pyspark_kafkalog.cluster.cluster import Cluster
from pyspark_kafkalog.client.consumer import iter_records, resolve_offset
from pyspark_kafkalog.client.producer import Producer
from pyspark_kafkalog.errors import FencedLeaderEpochError, KafkaLogError, OffsetOutOfRangeError
from pyspark_kafkalog.format.records import Record


def _records(wid: str, call: int, n: int, first: int = 0):
    keys = [make_key(wid, call, j) for j in range(first, first + n)]
    ts = now_ms()
    return [Record(k, value_for(k), ts) for k in keys]


def _error(exc: BaseException, where: str) -> None:
    emit({"error": type(exc).__name__, "where": where, "msg": str(exc)[:300],
          "typed": isinstance(exc, KafkaLogError),
          "tb": "" if isinstance(exc, KafkaLogError) else traceback.format_exc()[-1500:]})


def _wait_for(path: str) -> None:
    while not os.path.exists(path):
        time.sleep(0.01)


# -- torture children -------------------------------------------------------------------------

def writer(root, wid, seed, timeout_ms):
    cluster = Cluster(root, transaction_timeout_ms=int(timeout_ms))
    admin, producer = Admin(cluster), Producer(cluster)
    rng = random.Random(int(seed))
    call = 0
    while True:
        call += 1
        kind = rng.random()
        try:
            if kind < 0.3:          # keyed records spread by Kafka's partitioner: one atomic unit
                topic = rng.choice(TOPICS)
                recs = _records(wid, call, rng.randint(1, 8))
                md = admin.produce(topic, recs)
                acks = [[m.topic, m.partition, m.offset, r.key.decode()] for m, r in zip(md, recs)]
            elif kind < 0.5:        # one explicit partition
                topic, p = rng.choice(ALL_TPS)
                recs = _records(wid, call, rng.randint(1, 8))
                md = admin.produce(topic, recs, partition=p)
                acks = [[m.topic, m.partition, m.offset, r.key.decode()] for m, r in zip(md, recs)]
            else:                   # several partitions of both topics, several batches each
                tps = rng.sample(ALL_TPS, rng.randint(2, 4))
                plan, batches, j = {}, {}, 0
                for tp in tps:
                    recs = _records(wid, call, rng.randint(1, 8), first=j)
                    j += len(recs)
                    plan[tp] = recs
                    batches[tp] = producer.encode(tp[0], recs, batch_records=rng.randint(1, 3))
                offsets = producer.send(batches)
                acks = [[t, p, offsets[(t, p)][0] + i, r.key.decode()]
                        for (t, p), recs in plan.items() for i, r in enumerate(recs)]
        except Exception as exc:     # noqa: BLE001 - reported to the parent, which judges it
            _error(exc, "produce")
            continue
        emit({"ack": acks})
        time.sleep(rng.uniform(0, 0.03))


def staller(root, wid, seed, timeout_ms):
    """Reserve and write, then sleep, often past the deadline (and often killed while asleep)."""
    timeout_s = int(timeout_ms) / 1000
    cluster = Cluster(root, transaction_timeout_ms=int(timeout_ms))
    producer = Producer(cluster)
    rng = random.Random(int(seed))
    call = 0
    while True:
        call += 1
        tps = rng.sample(ALL_TPS, rng.randint(1, 3))
        plan, batches, j = {}, {}, 0
        for tp in tps:
            recs = _records(wid, call, rng.randint(1, 6), first=j)
            j += len(recs)
            plan[tp] = recs
            batches[tp] = producer.encode(tp[0], recs, batch_records=2)
        try:
            pending = producer.write(batches)
        except Exception as exc:     # noqa: BLE001
            _error(exc, "write")
            continue
        emit({"reserved": pending.txn, "ranges": pending.ranges})
        time.sleep(rng.choice([0.05, 0.3, 1.0, timeout_s * 1.5, timeout_s * 2.5]))
        try:
            producer.commit([pending])
        except FencedLeaderEpochError as exc:
            emit({"fenced": pending.txn, "type": type(exc).__name__})
            continue
        except Exception as exc:     # noqa: BLE001
            _error(exc, "commit")
            continue
        emit({"ack": [[t, p, pending.ranges[f"{t}:{p}"][0] + i, r.key.decode()]
                      for (t, p), recs in plan.items() for i, r in enumerate(recs)]})


def deleter(root, wid, seed):
    cluster = Cluster(root)
    admin = Admin(cluster)
    rng = random.Random(int(seed))
    while True:
        time.sleep(rng.uniform(0.15, 0.5))
        try:
            state = cluster.state()
            t, p = rng.choice(ALL_TPS)
            ps = state.partition(t, p)
            lo, hw = ps.log_start_offset, ps.high_watermark
            offset = -1 if rng.random() < 0.03 else lo + int((hw - lo) * rng.uniform(0, 0.35))
            res = admin.delete_records_before({(t, p): offset})[(t, p)]
        except Exception as exc:     # noqa: BLE001
            _error(exc, "delete_records")
            continue
        emit({"deleted": [t, p, offset, res.low_watermark,
                          None if res.error is None else type(res.error).__name__]})


def retainer(root, wid, seed):
    admin = Admin(Cluster(root))
    rng = random.Random(int(seed))
    while True:
        time.sleep(rng.uniform(0.15, 0.5))
        try:
            plans = admin.retention()
        except Exception as exc:     # noqa: BLE001
            _error(exc, "retention")
            continue
        emit({"retention": [[pl.topic, pl.partition, pl.new_log_start_offset, len(pl.segments)]
                            for pl in plans]})


def merger(root, wid, seed):
    """Segment merges (docs/protocol.md §4.1) in a loop, killed at random points like the rest:
    with no lag, and covered segments deleted after a delay of a second or two. (A delay of 0
    is for a partition nothing else deletes from: a retention that judged a merged segment's
    first file before the merge replaced it could delete the merged one just as its covered
    segments go; the delay is what outlasts such a stale judgement, as in Kafka.)"""
    from pyspark_kafkalog.maintenance.retention import merge_segments
    cluster = Cluster(root)
    rng = random.Random(int(seed))
    while True:
        time.sleep(rng.uniform(0.05, 0.4))
        try:
            done = merge_segments(cluster, lag_ms=0, delay_ms=rng.choice([1000, 2000]))
        except Exception as exc:     # noqa: BLE001
            _error(exc, "merge_segments")
            continue
        emit({"merged": [[m.topic, m.partition, m.merged, len(m.deleted)] for m in done
                         if m.merged or m.deleted]})


def tailer(root, out_path, stop_path):
    """Reads each partition from the offset after the last record it saw. Output lines:
    ``S`` start position, ``R`` a read covering [pos, end) and its records, ``J`` a jump after a
    typed OffsetOutOfRangeError, ``X`` an OffsetOutOfRangeError that was not explained by the log
    start offset, ``V`` a record outside [log start, high watermark) of its snapshot."""
    import json
    cluster = Cluster(root)
    out = open(out_path, "a")

    def line(obj):
        out.write(json.dumps(obj, separators=(",", ":")) + "\n")
        out.flush()

    pos = {}
    final_passes = 0
    rng = random.Random()
    while True:
        stopping = os.path.exists(stop_path)
        if not stopping and rng.random() < 0.05:
            time.sleep(rng.uniform(0.5, 3.0))     # fall behind: deletion may overtake us
        progress = False
        for t, p in ALL_TPS:
            try:
                state = cluster.state()
                view = cluster.partition_view(t, p, state)
                if (t, p) not in pos:
                    pos[(t, p)] = view.log_start_offset
                    line(["S", t, p, view.log_start_offset])
                start = pos[(t, p)]
                try:
                    offset, _ = resolve_offset(view, start)
                    recs = list(iter_records(view, offset, max_records=200))
                except OffsetOutOfRangeError as exc:
                    earliest = cluster.state().partition(t, p).log_start_offset
                    if earliest > start:
                        line(["J", t, p, start, earliest, str(exc)[:200]])
                        pos[(t, p)] = earliest
                        progress = True
                    else:
                        line(["X", t, p, start, earliest, str(exc)[:300]])
                        time.sleep(0.05)
                    continue
                for r in recs:
                    if not view.log_start_offset <= r.offset < view.high_watermark:
                        line(["V", t, p, r.offset, view.log_start_offset, view.high_watermark])
                if recs:
                    end = recs[-1].offset + 1
                    line(["R", t, p, start, end,
                          [[r.offset, r.key.decode(errors="replace"), value_for(r.key) == r.value]
                           for r in recs]])
                    pos[(t, p)] = end
                    progress = True
            except Exception as exc:     # noqa: BLE001
                line(["E", t, p, type(exc).__name__, str(exc)[:300],
                      traceback.format_exc()[-1500:]])
                time.sleep(0.05)
        if stopping:
            final_passes = 0 if progress else final_passes + 1
            if final_passes >= 2:
                line(["DONE"])
                return
        elif not progress:
            time.sleep(0.02)


# -- zombie, atomic-commit children -----------------------------------------------------------

def zombie(root, timeout_ms, topic, n, go, commit_go):
    """Producer.write whose segment writing stalls after the first segment until GO exists (the
    test freezes us there with SIGSTOP), then writes the rest, waits for COMMIT_GO and commits."""
    import pyspark_kafkalog.client.producer as producer_module
    from pyspark_kafkalog.log.segment_writer import plan_segments, write_segments

    def stalling_write_segments(storage, dir_path, batches, config, **kw):
        groups = plan_segments(batches, config.segment_bytes)
        first = write_segments(storage, dir_path, groups[0], config, **kw)
        emit({"paused": first, "segments": len(groups)})
        _wait_for(go)
        rest = write_segments(storage, dir_path, [b for g in groups[1:] for b in g], config, **kw)
        emit({"wrote_more": rest})
        return first + rest

    producer_module.write_segments = stalling_write_segments
    cluster = Cluster(root, transaction_timeout_ms=int(timeout_ms))
    producer = Producer(cluster)
    recs = _records("zombie", 1, int(n))
    pending = producer.write({(topic, 0): producer.encode(topic, recs, batch_records=2)})
    emit({"written": pending.to_json()})
    _wait_for(commit_go)
    try:
        producer.commit([pending])
    except FencedLeaderEpochError as exc:
        emit({"fenced": pending.txn, "type": type(exc).__name__, "msg": str(exc)})
        return
    except Exception as exc:     # noqa: BLE001
        _error(exc, "commit")
        return
    start = pending.ranges[f"{topic}:0"][0]
    emit({"ack": [[topic, 0, start + i, r.key.decode()] for i, r in enumerate(recs)]})


def once(root, wid, topic, partition, n):
    admin = Admin(Cluster(root))
    recs = _records(wid, 1, int(n))
    md = admin.produce(topic, recs, partition=int(partition))
    emit({"ack": [[m.topic, m.partition, m.offset, r.key.decode()] for m, r in zip(md, recs)]})


def multi(root, timeout_ms, topic, wid, go):
    cluster = Cluster(root, transaction_timeout_ms=int(timeout_ms))
    producer = Producer(cluster)
    n = cluster.state().topics[topic]["partitions"]
    plan = {(topic, p): _records(wid, p, 5) for p in range(n)}
    pending = producer.write({tp: producer.encode(topic, recs, batch_records=2)
                              for tp, recs in plan.items()})
    emit({"written": pending.to_json()})
    _wait_for(go)
    producer.commit([pending])
    emit({"ack": [[t, p, pending.ranges[f"{t}:{p}"][0] + i, r.key.decode()]
                  for (t, p), recs in plan.items() for i, r in enumerate(recs)]})


def poller(root, topic, stop):
    """Every poll reads all partitions from ONE state: what a reader can see at one instant."""
    cluster = Cluster(root)
    while not os.path.exists(stop):
        state = cluster.state()
        counts, keys = [], []
        for p in range(state.topics[topic]["partitions"]):
            view = cluster.partition_view(topic, p, state)
            recs = list(iter_records(view, view.log_start_offset))
            counts.append(len(recs))
            keys.append(sorted({r.key.decode().split("/")[0] for r in recs}))
        emit({"seq": state.seq, "counts": counts, "writers": keys})


MODES = {"writer": writer, "staller": staller, "deleter": deleter, "retainer": retainer,
         "merger": merger,
         "tailer": tailer, "zombie": zombie, "once": once, "multi": multi, "poller": poller}

if __name__ == "__main__":
    MODES[sys.argv[1]](*sys.argv[2:])
