"""The replay rules of the reader feature ``replication`` (docs/protocol.md §1.3, §2.2
``replica_progress`` / ``alter_isr``), as properties over random action sequences (hypothesis)
and as the worked examples of §1.3. Replay only: ``ClusterState.apply``, no cluster on storage
(the parted snapshots are written to a LocalStorage in a temporary directory).

A random sequence runs over two replicated topics (RF 2 or 3, ``min.insync.replicas`` 1..3, so
also above the replication factor) and one topic with a single replica, with reservations of
several producers, commits, aborts, ``set_log_start`` (in range and not), ``alter_configs`` of
``min.insync.replicas``, ``replica_progress`` (ranges from what was committed, arbitrary ones
below ``next_offset``, and bogus ones: a log dir that is no follower, the leader, ranges past
``next_offset``, a wrong topic id, a partition that does not exist, one that is not
replicated), ``alter_isr`` (valid moves, a stale partition epoch, a replica skipping
``joining``, one below the high watermark, a malformed ISR), a second coordinator taking over
(the first one's actions are then fenced), and the feature turned on midway. Every result is
predicted from an independent model (brute-force offset sets for ``held``, joined across wholly
aborted gaps, and for ``end(r)``), and after every step:

* the high watermark never decreases, never passes the last stable offset, and is exactly
  ``max(HW, candidate)`` when the ISR is at least the effective min ISR, unchanged otherwise;
* invariant J: every ISR member holds every offset below the high watermark (``end(r) >= HW``);
* a rejected action changes nothing (the whole snapshot), a partition's error leaves that
  partition as it was; ``partition_epoch`` moves by one exactly when an ``alter_isr`` applies;
* a copy taken before the step (copy-on-write) did not change;
* ``from_snapshot(to_snapshot())`` and the parted snapshot (``snapshots.write``/``load``) give
  the same state;
* partitions with one replica, or before the feature, have no replication state and
  HW == LSO.

Size knob: ``KAFKALOG_FUZZ_SCALE`` (default 1, a few seconds) multiplies ``max_examples``.
"""
from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from typing import Dict, List, Optional, Set

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyspark_kafkalog.cluster import actions as A
from pyspark_kafkalog.cluster import features
from pyspark_kafkalog.cluster import isr as R
from pyspark_kafkalog.cluster import snapshots
from pyspark_kafkalog.cluster.state import ClusterState, tp_key
from pyspark_kafkalog.storage.local import LocalStorage

SCALE = max(1, int(float(os.environ.get("KAFKALOG_FUZZ_SCALE", "1"))))
DIRS = ["logdir-0", "logdir-1", "logdir-2"]
REPL = features.REPLICATION
LEASE_MS = 1_000


def examples(n: int) -> settings:
    return settings(max_examples=n * SCALE, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much])


def frozen(s: ClusterState) -> str:
    d = s.to_snapshot()
    d.pop("seq"), d.pop("timestamp")
    return json.dumps(d, sort_keys=True)


def pjson(s: ClusterState, key: str) -> Optional[str]:
    ps = s.partitions.get(key)
    return None if ps is None else json.dumps(ps.to_json(), sort_keys=True)


def core(rep: dict) -> dict:
    """The fields of §1.3's table (later stages add more)."""
    return {k: rep[k] for k in ("isr", "joining", "partition_epoch", "held", "high_watermark")}


def offsets(ranges) -> Set[int]:
    return {o for r in ranges for o in range(r[0], r[1])}


def as_ranges(points: Set[int]) -> List[list]:
    out: List[list] = []
    for o in sorted(points):
        if out and out[-1][1] == o:
            out[-1][1] = o + 1
        else:
            out.append([o, o + 1])
    return out


def brute_end(ps, held: Set[int]) -> int:
    """end(r) of §1.3 by enumeration: the least committed offset at or above the log start
    offset that r does not hold, capped at the LSO."""
    lso = ps.last_stable_offset
    committed = {o for s, e, _ in ps.committed for o in range(max(s, ps.log_start_offset), e)}
    missing = sorted(committed - held)
    return min(missing[0], lso) if missing else lso


class Model:
    """The state under test plus what an independent reading of §1.3 expects of it."""

    def __init__(self, tmp: str):
        self.s = ClusterState()
        self.ts = 1_000
        self.topics: Dict[str, dict] = {}          # name -> topic_id, rf, replicas, min_isr
        self.epoch = 0                             # current coordinator epoch
        self.renewed = 0
        self.txn_n = 0
        # per partition key: follower -> held offsets; and the partition epoch
        self.held: Dict[str, Dict[str, Set[int]]] = {}
        self.pepoch: Dict[str, int] = {}
        self.storage = LocalStorage(tmp, fsync=False, direct_io=False)

    # -- plumbing ---------------------------------------------------------------------------

    def apply(self, action: A.Action) -> A.Result:
        self.ts += 7
        raw = action.to_json()
        self.s.apply(self.s.seq + 1, {"version": 1, "writer": "w", "timestamp": self.ts,
                                      "actions": [raw]})
        return self.s.results[self.s.seq][0]

    @property
    def feature_on(self) -> bool:
        return REPL in self.s.reader_features

    def keys(self) -> List[str]:
        return [tp_key(t, p) for t, info in self.topics.items()
                for p in range(len(info["replicas"]))]

    def replicas(self, key: str) -> List[str]:
        t, p = key.rsplit(":", 1)
        return self.topics[t]["replicas"][int(p)]

    def replicated(self, key: str) -> bool:
        return self.feature_on and len(self.replicas(key)) > 1

    def end(self, key: str, r: str) -> int:
        ps = self.s.partitions[key]
        if r == self.replicas(key)[0]:
            return ps.last_stable_offset
        return brute_end(ps, self.held[key].get(r, set()))

    def candidate(self, key: str) -> int:
        ps = self.s.partitions[key]
        rep = ps.replication
        leader = self.replicas(key)[0]
        return min([ps.last_stable_offset] + [self.end(key, r) for r in rep["isr"] + rep["joining"]
                                              if r != leader])

    def lagging(self, key: str) -> List[str]:
        rep = self.s.partitions[key].replication
        return [r for r in rep["isr"] + rep["joining"]
                if r != self.replicas(key)[0] and self.end(key, r) < rep["high_watermark"]]

    def eff_min(self, key: str) -> int:
        t = key.rsplit(":", 1)[0]
        return min(self.topics[t]["min_isr"], len(self.replicas(key)))

    # -- set-up -----------------------------------------------------------------------------

    def setup(self, topics: List[tuple], replication_first: bool) -> None:
        feats = [features.COORDINATOR_LEASE] + ([REPL] if replication_first else [])
        assert self.apply(A.EnableFeatures(reader_features=feats)).ok
        self.acquire("c1")
        for name, rf, n, min_isr in topics:
            replicas = [[DIRS[(p + i) % len(DIRS)] for i in range(rf)] for p in range(n)]
            r = self.apply(A.CreateTopic(topic=name, topic_id=f"id-{name}", partitions=n,
                                         replicas=replicas,
                                         configs={"min.insync.replicas": str(min_isr)}))
            assert r.ok, r
            self.topics[name] = {"topic_id": f"id-{name}", "replicas": replicas,
                                 "min_isr": min_isr}
            for p in range(n):
                self.held[tp_key(name, p)] = {}
                self.pepoch[tp_key(name, p)] = 0

    def acquire(self, holder: str) -> None:
        self.renewed += 10 * LEASE_MS          # the previous lease has expired by then
        r = self.apply(A.CoordinatorLeaseChange(lease_op="acquire", epoch=self.epoch + 1,
                                                holder=holder, address="h:1",
                                                lease_ms=LEASE_MS, renewed_ms=self.renewed))
        assert r.ok, r
        self.epoch += 1


# -- expected validity, from the text of §2.2 (not from isr.py) ---------------------------------

def expect_progress(m: Model, key: str, ranges: Dict[str, list], topic_ids: Dict[str, str]) -> str:
    t = key.rsplit(":", 1)[0]
    if key not in m.s.partitions or topic_ids.get(t) != m.topics[t]["topic_id"]:
        return "UNKNOWN_TOPIC_OR_PARTITION"
    if not m.replicated(key):
        return "INVALID_REQUEST"
    nxt = m.s.partitions[key].next_offset
    for d, rs in ranges.items():
        if d not in m.replicas(key)[1:]:
            return "INVALID_REQUEST"
        if any(not 0 <= a < b <= nxt for a, b in rs):
            return "INVALID_REQUEST"
    return A.OK


def expect_isr(m: Model, key: str, change: dict, topic_ids: Dict[str, str]) -> str:
    t = key.rsplit(":", 1)[0]
    if key not in m.s.partitions or topic_ids.get(t) != m.topics[t]["topic_id"]:
        return "UNKNOWN_TOPIC_OR_PARTITION"
    if not m.replicated(key):
        return "INVALID_REQUEST"
    rep = m.s.partitions[key].replication
    if change["partition_epoch"] != m.pepoch[key]:
        return "INVALID_UPDATE_VERSION"
    replicas = m.replicas(key)
    isr, joining = change["isr"], change["joining"]
    both = isr + joining
    if not isr or isr[0] != replicas[0] or len(set(both)) != len(both) \
            or any(r not in replicas for r in both):
        return "INVALID_REQUEST"
    for r in isr:
        if r not in rep["isr"]:
            if r not in rep["joining"] or m.end(key, r) < rep["high_watermark"]:
                return "INELIGIBLE_REPLICA"
    return A.OK


# -- action generators ----------------------------------------------------------------------------

def gen_reserve(m: Model, draw):
    keys = draw(st.lists(st.sampled_from(m.keys()), min_size=1, max_size=3, unique=True))
    m.txn_n += 1
    return A.Reserve(txn=f"t{m.txn_n}", producer=draw(st.sampled_from(["p1", "p2", "p3"])),
                     timeout_ms=10**9, partitions={k: draw(st.integers(1, 5)) for k in keys})


def pick_keys(m: Model, draw) -> List[str]:
    """Mostly replicated partitions; sometimes any, or one that does not exist."""
    replicated = [k for k in m.keys() if len(m.replicas(k)) > 1]
    pool = replicated if draw(st.integers(0, 5)) else m.keys() + ["a:9"]
    return draw(st.lists(st.sampled_from(pool), min_size=1, max_size=3, unique=True))


def gen_progress_ranges(m: Model, key: str, follower: str, draw) -> List[list]:
    ps = m.s.partitions[key]
    nxt = ps.next_offset
    out = []
    for _ in range(draw(st.integers(1, 2))):
        kind = draw(st.sampled_from(["full", "gap", "catch_up", "catch_up", "segment", "any"]))
        if kind == "full" and ps.committed:
            # a whole copy pass: every committed range up to some point
            upto = ps.committed[-1][1] if draw(st.booleans()) else \
                draw(st.integers(ps.committed[0][0], ps.committed[-1][1]))
            out += [[a, min(b, upto)] for a, b, _ in ps.committed if a < upto]
        elif kind == "gap" and ps.committed:
            # a pass that missed one segment: everything committed above end(r) + k
            e = m.end(key, follower) if follower in m.replicas(key) else 0
            a = e + draw(st.integers(1, 3))
            out += [[max(a, s0), e0] for s0, e0, _ in ps.committed if e0 > a]
        elif kind == "catch_up" and ps.committed:
            # what a coordinator copies next: from end(r) to the end of its committed range
            e = m.end(key, follower) if follower in m.replicas(key) else 0
            for s0, e0, _ in ps.committed:
                if e0 > e:
                    a = max(s0, e)
                    out.append([a, draw(st.integers(a + 1, e0))])
                    break
        elif kind == "segment" and ps.committed:
            s0, e0, _ = draw(st.sampled_from(ps.committed))
            a = draw(st.integers(s0, e0 - 1))
            out.append([a, draw(st.integers(a + 1, e0))])
        elif nxt > 0:
            a = draw(st.integers(0, nxt - 1))
            out.append([a, draw(st.integers(a + 1, nxt))])
    return out


def gen_progress(m: Model, draw):
    keys = pick_keys(m, draw)
    parts = {}
    for key in keys:
        if key not in m.s.partitions:
            parts[key] = {DIRS[1]: [[0, 1]]}
            continue
        replicas = m.replicas(key)
        followers = replicas[1:] or [DIRS[1]]
        bogus = draw(st.sampled_from([None] * 12 + ["leader", "stranger", "past_end", "empty"]))
        ranges: Dict[str, list] = {}
        for f in draw(st.lists(st.sampled_from(followers), min_size=1, unique=True)):
            ranges[f] = gen_progress_ranges(m, key, f, draw)
        nxt = m.s.partitions[key].next_offset
        if bogus == "leader":
            ranges[replicas[0]] = [[0, max(1, nxt)]]
        elif bogus == "stranger":
            ranges["logdir-9"] = [[0, 1]]
        elif bogus == "past_end":
            ranges[followers[0]] = ranges.get(followers[0], []) + [[nxt, nxt + 1]]
        elif bogus == "empty":
            ranges[followers[0]] = [[nxt, nxt]]
        parts[key] = ranges
    topic_ids = {t: info["topic_id"] for t, info in m.topics.items()}
    if draw(st.integers(0, 11)) == 0:
        topic_ids[draw(st.sampled_from(sorted(m.topics)))] = "id-of-a-deleted-topic"
    return A.ReplicaProgress(coordinator_epoch=m.epoch, topic_ids=topic_ids, partitions=parts)


def gen_isr_change(m: Model, key: str, draw) -> dict:
    replicas = m.replicas(key)
    ps = m.s.partitions[key]
    rep = ps.replication or {"isr": replicas[:1], "joining": []}
    isr, joining = list(rep["isr"]), list(rep["joining"])
    leader, followers = replicas[0], replicas[1:]
    out = [r for r in followers if r not in isr + joining]
    move = draw(st.sampled_from(["join"] * 4 + ["promote"] * 4 + ["drop", "demote", "same"]
                                + ["stale_epoch", "skip_joining", "leader_not_first", "dup",
                                   "stranger"]))
    epoch = m.pepoch[key]
    if move == "join" and out:
        joining.append(draw(st.sampled_from(out)))
    elif move == "promote" and joining:
        j = draw(st.sampled_from(joining))
        joining.remove(j)
        isr.append(j)
    elif move == "drop" and len(isr + joining) > 1:
        r = draw(st.sampled_from([r for r in isr + joining if r != leader]))
        (isr if r in isr else joining).remove(r)
    elif move == "demote" and len(isr) > 1:
        r = draw(st.sampled_from(isr[1:]))
        isr.remove(r)
        joining.append(r)
    elif move == "stale_epoch":
        epoch += draw(st.sampled_from([-1, 1, 5]))
    elif move == "skip_joining" and out:
        isr.append(draw(st.sampled_from(out)))
    elif move == "leader_not_first":
        isr = isr[1:] + isr[:1] if len(isr) > 1 else []
    elif move == "dup":
        joining.append(isr[-1])                  # in both sets
    elif move == "stranger":
        joining.append("logdir-9")
    return {"partition_epoch": epoch, "isr": isr, "joining": joining}


def gen_alter_isr(m: Model, draw):
    keys = pick_keys(m, draw)
    parts = {k: (gen_isr_change(m, k, draw) if k in m.s.partitions else
                 {"partition_epoch": 0, "isr": [DIRS[0]], "joining": []}) for k in keys}
    topic_ids = {t: info["topic_id"] for t, info in m.topics.items()}
    if draw(st.integers(0, 11)) == 0:
        topic_ids.pop(draw(st.sampled_from(sorted(m.topics))))
    return A.AlterIsr(coordinator_epoch=m.epoch, topic_ids=topic_ids, partitions=parts,
                      reason="caught_up")


# -- the property ---------------------------------------------------------------------------------

def check_state(m: Model, before: Dict[str, tuple]) -> None:
    """What must hold after every step; ``before`` is each partition's (json, replication)."""
    s = m.s
    for key in m.keys():
        ps = s.partitions[key]
        lso = ps.last_stable_offset
        if not m.replicated(key):
            assert ps.replication is None, key
            assert ps.high_watermark == lso, key
            continue
        rep = ps.replication
        assert rep is not None, key
        hw = rep["high_watermark"]
        assert ps.high_watermark == hw
        assert ps.log_start_offset <= hw <= lso, (key, ps.log_start_offset, hw, lso)
        replicas = m.replicas(key)
        assert rep["isr"][0] == replicas[0]
        assert rep["partition_epoch"] == m.pepoch[key], key
        # held is what the model says was copied, clipped at the log start offset
        assert {d: rs for d, rs in rep["held"].items()} == \
            {d: as_ranges(pts) for d, pts in m.held[key].items() if pts}, key
        for r in replicas:                        # isr.replica_end against brute force
            assert R.replica_end(ps, r, replicas[0]) == m.end(key, r), (key, r)
        for r in rep["isr"][1:]:                  # invariant J
            assert m.end(key, r) >= hw, (key, r, m.end(key, r), hw)
        old = before.get(key)
        if old is None or old[1] is None:
            continue
        old_hw = old[1]["high_watermark"]
        assert hw >= old_hw, (key, old_hw, hw)
        if len(rep["isr"]) < m.eff_min(key):
            assert hw == old_hw, (key, "frozen below min ISR", old_hw, hw)
        else:
            assert hw == max(old_hw, m.candidate(key)), \
                (key, "HW is not max(HW, candidate)", old_hw, hw, m.candidate(key), rep)


def check_snapshots(m: Model, parted: bool) -> None:
    s = m.s
    flat = s.to_snapshot()
    again = ClusterState.from_snapshot(json.loads(json.dumps(flat)))
    assert again.to_snapshot() == flat
    if parted:
        path = f"log/{s.seq:020d}.snapshot.json"
        snapshots.write(m.storage, "log", path, s, b"entry")
        loaded = snapshots.load(m.storage, "log", json.loads(m.storage.read(path)))
        assert json.dumps(loaded.to_snapshot(), sort_keys=True) == \
            json.dumps(flat, sort_keys=True)


OPS = (["reserve"] * 4 + ["commit"] * 5 + ["abort"] + ["set_log_start"] * 2 + ["min_isr"]
       + ["progress"] * 5 + ["alter_isr"] * 5 + ["stale"] + ["takeover"] + ["enable"])


def run_step(m: Model, op: str, draw) -> None:
    s = m.s
    before = {k: (pjson(s, k), s.partitions[k].replication) for k in m.keys()}
    whole = frozen(s)
    shadow = s.copy()
    shadow_json = frozen(shadow)
    open_txns = sorted(s.txns)

    if op == "reserve":
        r = m.apply(gen_reserve(m, draw))
        assert r.ok, r
    elif op in ("commit", "abort") and open_txns:
        txns = draw(st.lists(st.sampled_from(open_txns), min_size=1, max_size=2, unique=True))
        r = m.apply(A.Commit(txns=txns) if op == "commit" else A.Abort(txns=txns))
        assert r.ok, r
        assert not set(txns) & set(s.txns)
    elif op == "set_log_start":
        # mostly where a member of the ISR or joining lags behind the HW: there the log start
        # offset can change end(r), and with it the candidate
        lagging = [k for k in m.keys() if m.replicated(k) and m.lagging(k)]
        key = draw(st.sampled_from(lagging if lagging and draw(st.booleans()) else m.keys()))
        ps = s.partitions[key]
        hw, lo = ps.high_watermark, ps.log_start_offset
        ends = []
        for r in (m.lagging(key) or m.replicas(key)[1:]) if ps.replication else []:
            e = m.end(key, r)
            above = [o for o in m.held[key].get(r, ()) if o > e]
            ends.append(min(above) if above else e)    # past r's first gap, if it has more
        offset = draw(st.sampled_from(["in", "in", "latest", "past", "end"]))
        offset = {"in": draw(st.integers(0, hw)), "latest": -1,
                  "past": hw + draw(st.integers(1, 3)),
                  "end": min(hw, draw(st.sampled_from(ends)) + draw(st.integers(0, 3)))
                  if ends else hw}[offset]
        r = m.apply(A.SetLogStart(partitions={key: offset}))
        res = r.partitions[key]
        if offset > hw:
            assert res.error == "OFFSET_OUT_OF_RANGE", res
            assert pjson(s, key) == before[key][0]
        else:
            assert res.ok, res
            new_lo = max(lo, hw if offset == -1 else offset)
            assert res.low_watermark == new_lo == s.partitions[key].log_start_offset
            for d, pts in m.held[key].items():
                m.held[key][d] = {o for o in pts if o >= new_lo}
    elif op == "min_isr":
        t = draw(st.sampled_from(sorted(m.topics)))
        v = draw(st.integers(0, 3))
        r = m.apply(A.AlterConfigs(topic=t, set={"min.insync.replicas": str(v)}))
        if v == 0:
            assert r.error == "INVALID_CONFIG"
            assert frozen(s) == whole
        else:
            assert r.ok, r
            m.topics[t]["min_isr"] = v
    elif op in ("progress", "alter_isr", "stale"):
        kind = op if op != "stale" else draw(st.sampled_from(["progress", "alter_isr"]))
        action = gen_progress(m, draw) if kind == "progress" else gen_alter_isr(m, draw)
        if op == "stale":
            bad = draw(st.sampled_from([m.epoch - 1, m.epoch + 1])) if m.epoch > 1 \
                else m.epoch + 1
            action = dataclasses.replace(action, coordinator_epoch=bad)
        if kind == "progress":
            expected = {k: expect_progress(m, k, rs, action.topic_ids)
                        for k, rs in action.partitions.items()}
        else:
            expected = {k: expect_isr(m, k, ch, action.topic_ids)
                        for k, ch in action.partitions.items()}
        r = m.apply(action)
        if op == "stale":
            assert r.error == "STALE_CONTROLLER_EPOCH", r
            assert frozen(s) == whole
        elif not m.feature_on:
            assert r.error == "INVALID_REQUEST", r
            assert frozen(s) == whole
        else:
            assert r.ok, r
            got = {k: res.error for k, res in r.partitions.items()}
            assert got == expected, (got, expected, action)
            for key in m.keys():
                if got.get(key, "absent") != A.OK:
                    assert pjson(s, key) == before[key][0], key   # errors change nothing
            for key, err in got.items():
                if err != A.OK:
                    continue
                if kind == "progress":
                    lo = s.partitions[key].log_start_offset
                    aborted = offsets(s.partitions[key].aborted)
                    for d, rs in action.partitions[key].items():
                        pts = m.held[key].setdefault(d, set())
                        pts |= offsets(rs)
                        # held ranges join across gaps that are wholly aborted (gaps for good)
                        runs = as_ranges(pts)
                        for (_, a), (b, _) in zip(runs, runs[1:]):
                            if set(range(a, b)) <= aborted:
                                pts |= set(range(a, b))
                        m.held[key][d] = {o for o in pts if o >= lo}
                else:
                    m.pepoch[key] += 1
                    ch = action.partitions[key]
                    rep = s.partitions[key].replication
                    assert rep["isr"] == ch["isr"] and rep["joining"] == ch["joining"]
    elif op == "takeover":
        m.acquire(f"c{m.epoch + 1}")
    elif op == "enable":
        was = m.feature_on
        r = m.apply(A.EnableFeatures(reader_features=[REPL]))
        assert r.ok, r
        if not was:
            for key in m.keys():
                ps = s.partitions[key]
                if len(m.replicas(key)) > 1:
                    assert core(ps.replication) == {
                        "isr": m.replicas(key)[:1], "joining": [], "partition_epoch": 0,
                        "held": {}, "high_watermark": ps.last_stable_offset}
    else:
        return
    assert frozen(shadow) == shadow_json, "a copy taken before the step changed"
    check_state(m, before)


topic_specs = st.tuples(st.integers(2, 3), st.integers(1, 2), st.integers(1, 3),
                        st.booleans(), st.integers(2, 3), st.integers(1, 3))


@examples(60)
@given(spec=topic_specs, replication_first=st.booleans(), data=st.data())
def test_replication_replay_properties(spec, replication_first, data):
    rf_a, n_a, min_a, with_b, rf_b, min_b = spec
    topics = [("a", rf_a, n_a, min_a), ("solo", 1, 1, 1)]
    if with_b:
        topics.append(("b", rf_b, 1, min_b))
    with tempfile.TemporaryDirectory() as tmp:
        m = Model(tmp)
        m.setup(topics, replication_first)
        check_state(m, {})
        steps = data.draw(st.lists(st.sampled_from(OPS), min_size=15, max_size=60), label="ops")
        for i, op in enumerate(steps):
            run_step(m, op, data.draw)
            check_snapshots(m, parted=(i % 6 == 5 or i == len(steps) - 1))


# -- the examples of §1.3 ---------------------------------------------------------------------------

class Cl:
    """A replay-only cluster with one coordinator and topic ``t`` (replicas d0, d1[, d2])."""

    def __init__(self, rf: int = 2, min_isr: int = 1, replication: bool = True):
        self.m = Model(tempfile.mkdtemp(prefix="repl-examples-"))
        self.m.setup([("t", rf, 1, min_isr)], replication)
        self.key = "t:0"
        self.replicas = self.m.replicas(self.key)
        self.n = 0

    @property
    def ps(self):
        return self.m.s.partitions[self.key]

    @property
    def rep(self):
        return self.ps.replication

    def write(self, count: int, commit: bool = True) -> str:
        self.n += 1
        txn = f"w{self.n}"
        assert self.m.apply(A.Reserve(txn=txn, producer="p", timeout_ms=10**9,
                                      partitions={self.key: count})).ok
        if commit:
            assert self.m.apply(A.Commit(txns=[txn])).ok
        return txn

    def progress(self, follower: str, *ranges, epoch: Optional[int] = None) -> A.Result:
        r = self.m.apply(A.ReplicaProgress(
            coordinator_epoch=self.m.epoch if epoch is None else epoch,
            topic_ids={"t": "id-t"}, partitions={self.key: {follower: [list(x) for x in ranges]}}))
        return r if not r.ok else r.partitions[self.key]

    def alter(self, isr, joining=(), epoch: Optional[int] = None) -> A.Result:
        r = self.m.apply(A.AlterIsr(
            coordinator_epoch=self.m.epoch, topic_ids={"t": "id-t"},
            partitions={self.key: {"partition_epoch": self.rep["partition_epoch"]
                                   if epoch is None else epoch,
                                   "isr": list(isr), "joining": list(joining)}}))
        return r if not r.ok else r.partitions[self.key]


def test_turning_replication_on_hides_nothing_visible():
    c = Cl(replication=False)
    c.write(5)
    open_txn = c.write(3, commit=False)
    c.write(2)
    assert c.ps.replication is None and c.ps.high_watermark == 5
    assert c.m.apply(A.EnableFeatures(reader_features=[REPL])).ok
    assert core(c.rep) == {"isr": [c.replicas[0]], "joining": [], "partition_epoch": 0,
                           "held": {}, "high_watermark": 5}
    # with ISR = [leader] and min ISR 1 the HW is the LSO, as without the feature
    assert c.m.apply(A.Commit(txns=[open_txn])).ok
    assert c.ps.high_watermark == c.ps.last_stable_offset == 10


def test_joining_replica_holds_the_high_watermark_at_its_end():
    c = Cl(rf=2, min_isr=1)
    d1 = c.replicas[1]
    c.write(10)
    assert c.ps.high_watermark == 10                       # leader alone, min ISR 1
    assert c.progress(d1, (0, 10)).ok
    assert c.alter([c.replicas[0]], [d1]).ok               # d1 joins, holding 0..10
    assert c.rep["partition_epoch"] == 1
    c.write(5)
    assert c.ps.last_stable_offset == 15
    assert c.ps.high_watermark == 10                       # held at end(d1) = 10
    assert c.progress(d1, (10, 12)).ok
    assert c.ps.high_watermark == 12                       # = end(d1)
    assert c.alter([c.replicas[0], d1]).ok                 # end(d1) = 12 >= HW: it joins
    assert c.rep["partition_epoch"] == 2
    c.write(3)
    assert c.ps.high_watermark == 12                       # the new data waits for d1
    assert c.progress(d1, (12, 18)).ok
    assert c.ps.high_watermark == 18


def test_a_replica_below_the_high_watermark_cannot_join_the_isr():
    c = Cl(rf=2, min_isr=1)
    d0, d1 = c.replicas
    c.write(10)
    assert c.alter([d0], [d1]).ok
    assert c.progress(d1, (0, 4)).ok
    assert c.ps.high_watermark == 10                       # the HW does not go back
    before = frozen(c.m.s)
    r = c.alter([d0, d1])
    assert r.error == "INELIGIBLE_REPLICA", r
    after = json.loads(frozen(c.m.s))
    assert after["partitions"]["t:0"] == json.loads(before)["partitions"]["t:0"]
    r = c.alter([d0, d1], epoch=0)                        # and a stale partition epoch
    assert r.error == "INVALID_UPDATE_VERSION", r
    # skipping joining
    c2 = Cl(rf=3, min_isr=1)
    assert c2.alter([c2.replicas[0], c2.replicas[2]]).error == "INELIGIBLE_REPLICA"
    assert c2.rep["partition_epoch"] == 0


def test_min_isr_two_freezes_the_high_watermark_until_the_follower_joins():
    c = Cl(rf=2, min_isr=2)
    d0, d1 = c.replicas
    c.write(4)
    assert c.rep["isr"] == [d0] and c.ps.high_watermark == 0   # frozen from the start
    c.write(6)
    assert c.ps.committed == [[0, 10, 0]]                      # commits still apply
    assert c.ps.last_stable_offset == 10 and c.ps.high_watermark == 0
    assert c.progress(d1, (0, 10)).ok
    assert c.ps.high_watermark == 0                            # d1 holds it, not in the ISR
    assert c.alter([d0], [d1]).ok
    assert c.ps.high_watermark == 0                            # joining does not count for M
    assert c.alter([d0, d1]).ok
    assert c.ps.high_watermark == 10                           # jumps once the ISR is 2
    # lowering min.insync.replicas unfreezes too; raising it above RF counts as RF
    assert c.alter([d0]).ok                                    # d1 leaves: frozen again
    c.write(5)
    assert c.ps.high_watermark == 10
    assert c.m.apply(A.AlterConfigs(topic="t", set={"min.insync.replicas": "3"})).ok
    assert c.ps.high_watermark == 10
    assert c.m.apply(A.AlterConfigs(topic="t", set={"min.insync.replicas": "1"})).ok
    assert c.ps.high_watermark == 15


def test_set_log_start_clips_held():
    c = Cl(rf=3, min_isr=1)
    d0, d1, d2 = c.replicas
    c.write(10)
    assert c.progress(d1, (0, 4), (6, 10)).ok
    assert c.progress(d2, (2, 3)).ok
    assert c.rep["held"] == {d1: [[0, 4], [6, 10]], d2: [[2, 3]]}
    r = c.m.apply(A.SetLogStart(partitions={"t:0": 7}))
    assert r.partitions["t:0"].low_watermark == 7
    assert c.rep["held"] == {d1: [[7, 10]]}                    # d2's range is gone entirely
    assert c.progress(d2, (0, 8)).ok                           # below the log start: clipped
    assert c.rep["held"] == {d1: [[7, 10]], d2: [[7, 8]]}


def test_set_log_start_recomputes_the_high_watermark():
    """§1.3 lists set_log_start among the actions after which the HW is recomputed: a joining
    replica that lacked only offsets below the new log start offset no longer holds it back."""
    c = Cl(rf=3, min_isr=1)
    d0, d1, d2 = c.replicas
    c.write(5)
    assert c.progress(d1, (0, 5)).ok
    assert c.alter([d0], [d1]).ok
    assert c.alter([d0, d1]).ok                     # ISR d0, d1 at HW 5
    c.write(5)                                      # 5..10, d2 joins holding only 5..10
    assert c.alter([d0, d1], [d2]).ok
    assert c.progress(d2, (5, 10)).ok
    assert c.progress(d1, (5, 10)).ok
    assert c.ps.high_watermark == 5                 # end(d2) = 0
    assert c.m.apply(A.SetLogStart(partitions={"t:0": 5})).partitions["t:0"].ok
    assert c.ps.high_watermark == 10                # end(d2) = 10 now


def test_replica_progress_of_a_deposed_coordinator_is_fenced():
    c = Cl(rf=2, min_isr=1)
    d0, d1 = c.replicas
    c.write(10)
    old = c.m.epoch
    c.m.acquire("c2")
    before = frozen(c.m.s)
    r = c.progress(d1, (0, 10), epoch=old)
    assert r.error == "STALE_CONTROLLER_EPOCH", r
    r = c.m.apply(A.AlterIsr(coordinator_epoch=old, topic_ids={"t": "id-t"},
                             partitions={"t:0": {"partition_epoch": 0, "isr": [d0],
                                                 "joining": [d1]}}))
    assert r.error == "STALE_CONTROLLER_EPOCH", r
    assert frozen(c.m.s) == before
    assert c.progress(d1, (0, 10)).ok                # the new epoch's applies


def test_replication_actions_need_the_feature():
    c = Cl(replication=False)
    c.write(3)
    before = frozen(c.m.s)
    assert c.progress(c.replicas[1], (0, 3)).error == "INVALID_REQUEST"
    r = c.m.apply(A.AlterIsr(coordinator_epoch=c.m.epoch, topic_ids={"t": "id-t"},
                             partitions={"t:0": {"partition_epoch": 0, "isr": [c.replicas[0]],
                                                 "joining": []}}))
    assert r.error == "INVALID_REQUEST"
    assert frozen(c.m.s) == before


@pytest.mark.parametrize("bogus, error", [
    ({"logdir-0": [[0, 1]]}, "INVALID_REQUEST"),          # the leader
    ({"logdir-9": [[0, 1]]}, "INVALID_REQUEST"),          # no replica
    ({"logdir-1": [[0, 4]]}, "INVALID_REQUEST"),          # past next_offset 3
    ({"logdir-1": [[2, 2]]}, "INVALID_REQUEST"),          # empty
])
def test_bogus_progress_is_refused_per_partition(bogus, error):
    m = Model(tempfile.mkdtemp(prefix="repl-bogus-"))
    m.setup([("t", 2, 2, 1)], True)                        # t:0 led by logdir-0
    for key in ("t:0", "t:1"):
        assert m.apply(A.Reserve(txn=key, producer="p", timeout_ms=10**9,
                                 partitions={key: 3})).ok
        assert m.apply(A.Commit(txns=[key])).ok
    before = pjson(m.s, "t:0")
    r = m.apply(A.ReplicaProgress(coordinator_epoch=m.epoch, topic_ids={"t": "id-t"},
                                  partitions={"t:0": bogus, "t:1": {"logdir-2": [[0, 3]]}}))
    assert r.partitions["t:0"].error == error
    assert r.partitions["t:1"].ok                           # the valid partition applies
    assert pjson(m.s, "t:0") == before
    assert m.s.partitions["t:1"].replication["held"] == {"logdir-2": [[0, 3]]}
    r = m.apply(A.ReplicaProgress(coordinator_epoch=m.epoch, topic_ids={"t": "id-old"},
                                  partitions={"t:0": {"logdir-1": [[0, 1]]}}))
    assert r.partitions["t:0"].error == "UNKNOWN_TOPIC_OR_PARTITION"
