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

Elections, acks and reassignment (§1.3 "acks", "Elections", "Reassignment"; §2.2 ``reserve``,
``commit``, ``elect_leader``, ``reassign_partitions``, ``complete_reassignment``): reservations
with ``acks`` "1", "all" (``NOT_ENOUGH_REPLICAS`` below the effective min ISR) and an invalid
one; commits of acks=all txns with and without every ISR and joining member holding their
ranges (``NOT_ENOUGH_REPLICAS_AFTER_APPEND``, nothing changes); ``replica_progress`` of open
ranges; ``elect_leader`` of each kind, valid and not (stale partition epoch, a leader outside
the ISR, unclean with ``unclean.leader.election.enable`` off or on, reassign without a target,
the current leader, no replica, an unknown kind); ``reassign_partitions`` (moves, also to a log
dir no replica was on, reorders, a reassignment in progress, malformed targets) and
``complete_reassignment``; and a "drive" step doing what an active coordinator does next, so
that copies, ISR moves, failovers and reassignments run to their end. The model predicts every
result and effect (truncation, the aborted txns, ``held``, the sets, the epochs, the replicas),
and after every step also:

* committed offset -> (txn, epoch) only loses offsets below the log start offset or by an
  election's truncation; no offset is reserved twice or committed for another txn; epochs never
  decrease with the offset;
* a clean (offline, reassign) election truncates nothing below the high watermark and no
  acks=all offset committed while the partition was replicated (since its last unclean
  election, which empties ``acked_above_hw`` by §2.2);
* ``acked_above_hw`` names exactly the committed acks=all offsets above the HW; invariant J
  also covers them: every ISR member holds them;
* after an election every open txn with a range in the partition is aborted, everywhere;
* the topic's ``replicas[p]`` holds the leader, the ISR, joining and the target; after
  ``complete_reassignment`` it is the target; ``held`` names followers only.

``test_failover_replay_properties`` runs the same steps with the feature on from the start and
the coordinator's actions weighted up.

Size knob: ``KAFKALOG_FUZZ_SCALE`` (default 1, about ten seconds) multiplies ``max_examples``.
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


pytestmark = pytest.mark.slow   # Hypothesis over replay (~3 s)


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
        # elections, acks and reassignment (§1.3, §2.2), per partition key unless said
        self.lead: Dict[str, str] = {}             # the elected leader
        self.forced: Set[str] = set()              # replicated by a reassignment (RF 1 before)
        self.target: Dict[str, List[str]] = {}     # a reassignment in progress
        self.cmap: Dict[str, Dict[int, tuple]] = {}   # committed offset >= LSO -> (txn, epoch)
        self.owner: Dict[str, Dict[int, str]] = {}    # reserved offset -> its txn (once only)
        self.acked: Dict[str, Set[int]] = {}       # acks=all offsets committed while replicated,
        #                                            since the partition's last unclean election
        self.txn_info: Dict[str, dict] = {}        # txn -> {"acks", "ranges"}
        self.unclean: Dict[str, bool] = {}         # topic -> unclean.leader.election.enable
        self.truncations: List[tuple] = []         # (key, kind, offsets) of every election
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
        return self.feature_on and (len(self.replicas(key)) > 1 or key in self.forced)

    def leader(self, key: str) -> str:
        return self.lead[key]

    def followers(self, key: str) -> List[str]:
        return [r for r in self.replicas(key) if r != self.lead[key]]

    def end(self, key: str, r: str) -> int:
        ps = self.s.partitions[key]
        if r == self.lead[key]:
            return ps.last_stable_offset
        return brute_end(ps, self.held[key].get(r, set()))

    def candidate(self, key: str) -> int:
        ps = self.s.partitions[key]
        rep = ps.replication
        leader = self.lead[key]
        return min([ps.last_stable_offset] + [self.end(key, r) for r in rep["isr"] + rep["joining"]
                                              if r != leader])

    def lagging(self, key: str) -> List[str]:
        rep = self.s.partitions[key].replication
        return [r for r in rep["isr"] + rep["joining"]
                if r != self.lead[key] and self.end(key, r) < rep["high_watermark"]]

    def acked_above(self, key: str) -> Set[int]:
        """The offsets ``acked_above_hw`` must name: committed acks=all offsets at or above the
        high watermark (those below it are on every ISR member by invariant J)."""
        hw = self.s.partitions[key].high_watermark
        return {o for o in self.acked[key] if o >= hw}

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
            self.unclean[name] = False
            for p in range(n):
                key = tp_key(name, p)
                self.held[key], self.pepoch[key], self.lead[key] = {}, 0, replicas[p][0]
                self.cmap[key], self.owner[key], self.acked[key] = {}, {}, set()

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
        if d not in m.followers(key):         # §2.2 says replicas[1:]: before any election
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
    if not isr or isr[0] != m.leader(key) or len(set(both)) != len(both) \
            or any(r not in replicas for r in both):
        return "INVALID_REQUEST"
    acked = m.acked_above(key)
    for r in isr:
        if r not in rep["isr"]:
            if r not in rep["joining"] or m.end(key, r) < rep["high_watermark"]:
                return "INELIGIBLE_REPLICA"
            if not acked <= m.held[key].get(r, set()):      # §1.3's expansion rule
                return "INELIGIBLE_REPLICA"
    return A.OK


# -- action generators ----------------------------------------------------------------------------

def gen_reserve(m: Model, draw):
    keys = draw(st.lists(st.sampled_from(m.keys()), min_size=1, max_size=3, unique=True))
    m.txn_n += 1
    acks = draw(st.sampled_from(["1", "1", "all", "all", "all", "all", "2"]))
    return A.Reserve(txn=f"t{m.txn_n}", producer=draw(st.sampled_from(["p1", "p2", "p3"])),
                     timeout_ms=10**9, partitions={k: draw(st.integers(1, 5)) for k in keys},
                     acks=acks)


def expect_reserve(m: Model, a: A.Reserve) -> str:
    if a.acks not in ("1", "all") or (a.acks == "all" and not m.feature_on):
        return "INVALID_REQUEST"
    if a.acks == "all":
        for key in a.partitions:
            if m.replicated(key) and len(m.s.partitions[key].replication["isr"]) < m.eff_min(key):
                return "NOT_ENOUGH_REPLICAS"
    return A.OK


def expect_commit(m: Model, txns: List[str]) -> str:
    """§2.2 commit with the feature: an open acks=all txn needs, in every replicated partition
    it has a range in, an ISR of at least the effective min ISR whose members (and the joining
    ones) other than the leader hold the whole range."""
    for txn in txns:
        info = m.txn_info[txn]
        if info["acks"] != "all":
            continue
        for key, (a, b, _) in info["ranges"].items():
            if not m.replicated(key):
                continue
            rep = m.s.partitions[key].replication
            if len(rep["isr"]) < m.eff_min(key):
                return "NOT_ENOUGH_REPLICAS_AFTER_APPEND"
            for r in rep["isr"] + rep["joining"]:
                if r != m.leader(key) and not set(range(a, b)) <= m.held[key].get(r, set()):
                    return "NOT_ENOUGH_REPLICAS_AFTER_APPEND"
    return A.OK


def open_ranges(m: Model, key: str, acks_all_only: bool = False) -> List[list]:
    return [list(m.txn_info[t]["ranges"][key][:2]) for t in sorted(m.s.txns)
            if key in m.txn_info[t]["ranges"]
            and (not acks_all_only or m.txn_info[t]["acks"] == "all")]


def pick_keys(m: Model, draw) -> List[str]:
    """Mostly replicated partitions; sometimes any, or one that does not exist."""
    replicated = [k for k in m.keys() if len(m.replicas(k)) > 1 or k in m.forced]
    pool = replicated if replicated and draw(st.integers(0, 5)) else m.keys() + ["a:9"]
    return draw(st.lists(st.sampled_from(pool), min_size=1, max_size=3, unique=True))


def gen_progress_ranges(m: Model, key: str, follower: str, draw) -> List[list]:
    ps = m.s.partitions[key]
    nxt = ps.next_offset
    out = []
    for _ in range(draw(st.integers(1, 2))):
        kind = draw(st.sampled_from(["full", "gap", "catch_up", "catch_up", "segment", "any",
                                     "open", "open"]))
        opens = open_ranges(m, key) if kind == "open" else []
        if opens:
            # a copy of an open (acks=all) reservation: the coordinator copies those before the
            # commit; sometimes only part of it
            a, b = draw(st.sampled_from(opens))
            out.append([a, b] if draw(st.integers(0, 3)) else [a, draw(st.integers(a + 1, b))])
            continue
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
        followers = m.followers(key) or [d for d in DIRS if d != m.leader(key)][:1]
        bogus = draw(st.sampled_from([None] * 12 + ["leader", "stranger", "past_end", "empty"]))
        ranges: Dict[str, list] = {}
        for f in draw(st.lists(st.sampled_from(followers), min_size=1, unique=True)):
            ranges[f] = gen_progress_ranges(m, key, f, draw)
        nxt = m.s.partitions[key].next_offset
        if bogus == "leader":
            ranges[m.leader(key)] = [[0, max(1, nxt)]]
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
    ps = m.s.partitions[key]
    rep = ps.replication or {"isr": [m.leader(key)], "joining": []}
    isr, joining = list(rep["isr"]), list(rep["joining"])
    leader, followers = m.leader(key), m.followers(key)
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


def topic_ids_of(m: Model, draw, wrong: str = "replace") -> Dict[str, str]:
    topic_ids = {t: info["topic_id"] for t, info in m.topics.items()}
    if draw(st.integers(0, 11)) == 0:
        t = draw(st.sampled_from(sorted(m.topics)))
        if wrong == "replace":
            topic_ids[t] = "id-of-a-deleted-topic"
        else:
            topic_ids.pop(t)
    return topic_ids


def gen_elect(m: Model, draw, kind: Optional[str] = None):
    kind = kind or draw(st.sampled_from(["offline"] * 3 + ["unclean"] * 2 + ["reassign"] * 2
                                        + ["sideways"]))
    parts = {}
    for key in pick_keys(m, draw):
        if key not in m.s.partitions:
            parts[key] = {"partition_epoch": 0, "leader": DIRS[1]}
            continue
        rep = m.s.partitions[key].replication
        isr = rep["isr"] if rep else [m.leader(key)]
        others = [r for r in isr if r != m.leader(key)]
        targets = m.target.get(key, [])
        pick = draw(st.sampled_from(["isr"] * 4 + ["target"] * 2 + ["any"] * 2
                                    + ["current", "stranger"]))
        pool = {"isr": others, "target": targets, "any": m.replicas(key),
                "current": [m.leader(key)], "stranger": ["logdir-9"]}[pick] or m.replicas(key)
        epoch = m.pepoch[key]
        if draw(st.integers(0, 9)) == 0:
            epoch += draw(st.sampled_from([-1, 1, 3]))
        parts[key] = {"partition_epoch": epoch, "leader": draw(st.sampled_from(pool))}
    return A.ElectLeader(coordinator_epoch=m.epoch, topic_ids=topic_ids_of(m, draw),
                         election=kind, partitions=parts)


def expect_elect(m: Model, key: str, kind: str, change: dict, topic_ids: Dict[str, str]) -> str:
    t = key.rsplit(":", 1)[0]
    if key not in m.s.partitions or topic_ids.get(t) != m.topics[t]["topic_id"]:
        return "UNKNOWN_TOPIC_OR_PARTITION"
    if not m.replicated(key):
        return "INVALID_REQUEST"
    if change["partition_epoch"] != m.pepoch[key]:
        return "INVALID_UPDATE_VERSION"
    new = change["leader"]
    if new not in m.replicas(key):
        return "INVALID_REQUEST"
    if new == m.leader(key):
        return "ELECTION_NOT_NEEDED"
    isr = m.s.partitions[key].replication["isr"]
    if kind == "offline" and new not in isr:
        return "ELIGIBLE_LEADERS_NOT_AVAILABLE"
    if kind == "unclean" and not m.unclean[t]:
        return "ELIGIBLE_LEADERS_NOT_AVAILABLE"
    if kind == "reassign" and (new not in m.target.get(key, ()) or new not in isr):
        return "ELIGIBLE_LEADERS_NOT_AVAILABLE"
    return A.OK


def target_ok(targets: List[str]) -> bool:
    return bool(targets) and len(set(targets)) == len(targets) and all(
        t.startswith("logdir-") and t[7:].isdigit() and t[7:].isascii() for t in targets)


def gen_reassign(m: Model, draw):
    parts = {}
    keys = pick_keys(m, draw)
    if draw(st.integers(0, 2)) == 0:
        keys = list(dict.fromkeys(keys + ["solo:0"]))
    for key in keys:
        cur = m.replicas(key) if key in m.s.partitions else DIRS[:1]
        kind = draw(st.sampled_from(["move"] * 5 + ["reorder"] * 2 + ["empty", "dup", "badname"]))
        if kind == "move":     # a subset of the three log dirs, or a log dir no replica was on
            targets = draw(st.lists(st.sampled_from(DIRS + ["logdir-3"]), min_size=1,
                                    max_size=3, unique=True))
        elif kind == "reorder":
            targets = draw(st.permutations(cur))
        elif kind == "empty":
            targets = []
        elif kind == "dup":
            targets = [cur[0], cur[0]]
        else:
            targets = [draw(st.sampled_from(["dir-1", "logdir-", "logdir-x", "logdir-\u0663",
                                             "logdir-1-2"]))]
        parts[key] = list(targets)
    return A.ReassignPartitions(topic_ids=topic_ids_of(m, draw), partitions=parts)


def expect_reassign(m: Model, key: str, targets: List[str], topic_ids: Dict[str, str]) -> str:
    t = key.rsplit(":", 1)[0]
    if key not in m.s.partitions or topic_ids.get(t) != m.topics[t]["topic_id"]:
        return "UNKNOWN_TOPIC_OR_PARTITION"
    if key in m.target:
        return "REASSIGNMENT_IN_PROGRESS"
    if not target_ok(targets):
        return "INVALID_REPLICA_ASSIGNMENT"
    return A.OK


def gen_complete(m: Model, draw):
    moving = sorted(m.target)
    keys = [draw(st.sampled_from(moving))] if moving and draw(st.integers(0, 3)) \
        else pick_keys(m, draw)
    parts = {}
    for key in keys:
        epoch = m.pepoch.get(key, 0)
        if draw(st.integers(0, 9)) == 0:
            epoch += draw(st.sampled_from([-1, 1]))
        parts[key] = {"partition_epoch": epoch}
    return A.CompleteReassignment(coordinator_epoch=m.epoch, topic_ids=topic_ids_of(m, draw),
                                  partitions=parts)


def expect_complete(m: Model, key: str, change: dict, topic_ids: Dict[str, str]) -> str:
    t = key.rsplit(":", 1)[0]
    if key not in m.s.partitions or topic_ids.get(t) != m.topics[t]["topic_id"]:
        return "UNKNOWN_TOPIC_OR_PARTITION"
    if not m.replicated(key) or key not in m.target:
        return "INVALID_REQUEST"
    if change["partition_epoch"] != m.pepoch[key]:
        return "INVALID_UPDATE_VERSION"
    isr = m.s.partitions[key].replication["isr"]
    if any(r not in isr for r in m.target[key]) or m.leader(key) not in m.target[key]:
        return "INVALID_REQUEST"
    return A.OK


def gen_drive(m: Model, draw):
    """What an active coordinator appends next for one replicated partition (§1.3's duties):
    copy what a follower lacks (committed, and open acks=all ranges), let a follower join, move
    joining ones into the ISR, elect a target (kind reassign) and complete the reassignment; or
    fail over (offline, or unclean where enabled). So that reassignments finish and elections
    have something to truncate, whatever the random actions do."""
    keys = [k for k in m.keys() if m.replicated(k)]
    if not keys:
        return None
    moving = [k for k in keys if k in m.target]
    key = draw(st.sampled_from(moving if moving and draw(st.integers(0, 2)) else keys))
    rep = m.s.partitions[key].replication
    leader = m.leader(key)
    tids = {t: info["topic_id"] for t, info in m.topics.items()}
    want = set(m.cmap[key]) | offsets(open_ranges(m, key, acks_all_only=True))
    lacking = {r: want - m.held[key].get(r, set()) for r in m.followers(key)}
    lacking = {r: pts for r, pts in lacking.items() if pts}
    step = draw(st.sampled_from(["copy", "copy", "isr", "isr", "move", "failover"]))
    if step == "copy" and lacking:
        r = draw(st.sampled_from(sorted(lacking)))
        pts = lacking[r]
        if draw(st.integers(0, 2)) == 0:
            # a pass that got the follower to the HW only: end(r) >= HW, yet it may lack the
            # acks=all ranges above it (the ISR expansion rule then bars it)
            pts = {o for o in pts if o < rep["high_watermark"]} or pts
        return A.ReplicaProgress(coordinator_epoch=m.epoch, topic_ids=tids,
                                 partitions={key: {r: as_ranges(pts)}})
    out = [r for r in m.followers(key) if r not in rep["isr"] + rep["joining"]]
    if step in ("isr", "copy") and (out or rep["joining"]):
        isr, joining = list(rep["isr"]), list(rep["joining"])
        if out:
            joining.append(draw(st.sampled_from(out)))
        else:
            isr += joining
            joining = []
        return A.AlterIsr(coordinator_epoch=m.epoch, topic_ids=tids, reason="caught_up",
                          partitions={key: {"partition_epoch": m.pepoch[key], "isr": isr,
                                            "joining": joining}})
    if step in ("move", "isr", "copy") and key in m.target:
        target = m.target[key]
        if leader not in target:
            ready = [t for t in target if t in rep["isr"]] or target
            return A.ElectLeader(coordinator_epoch=m.epoch, topic_ids=tids, election="reassign",
                                 partitions={key: {"partition_epoch": m.pepoch[key],
                                                   "leader": ready[0]}})
        return A.CompleteReassignment(coordinator_epoch=m.epoch, topic_ids=tids,
                                      partitions={key: {"partition_epoch": m.pepoch[key]}})
    others = [r for r in rep["isr"] if r != leader]
    t = key.rsplit(":", 1)[0]
    if others and (not m.unclean[t] or draw(st.booleans())):
        return A.ElectLeader(coordinator_epoch=m.epoch, topic_ids=tids, election="offline",
                             partitions={key: {"partition_epoch": m.pepoch[key],
                                               "leader": draw(st.sampled_from(others))}})
    if m.followers(key):
        return A.ElectLeader(coordinator_epoch=m.epoch, topic_ids=tids, election="unclean",
                             partitions={key: {"partition_epoch": m.pepoch[key],
                                               "leader": draw(st.sampled_from(
                                                   m.followers(key)))}})
    return None


def committed_map(ps) -> Dict[int, int]:
    """Committed offset at or above the log start offset -> the epoch it was written under."""
    lo = ps.log_start_offset
    return {o: epoch for s0, e0, epoch in ps.committed for o in range(max(s0, lo), e0)}


def after_elections(m: Model, action: A.ElectLeader, got: Dict[str, str], before, doomed,
                    truncated: Dict[str, Set[int]]) -> None:
    """§2.2 elect_leader's effect, steps 1 to 4, for each elected partition, and the abort of
    every open txn of those partitions."""
    s, kind = m.s, action.election
    for key, err in got.items():
        if err != A.OK:
            continue
        ps, old_rep = s.partitions[key], before[key][1]
        new, old = action.partitions[key]["leader"], m.lead[key]
        old_hw = old_rep["high_watermark"]
        # 1. committed offsets (at or above the log start) the new leader lacks are truncated
        trunc = set(m.cmap[key]) - m.held[key].get(new, set())
        assert trunc <= offsets(ps.aborted), (key, "truncated but not aborted")
        if kind != "unclean":
            # a clean election truncates only acks=1 data above the high watermark
            assert all(o >= old_hw for o in trunc), (key, kind, old_hw, sorted(trunc))
            assert not trunc & m.acked[key], (key, kind, "acks=all data truncated",
                                              sorted(trunc & m.acked[key]))
        for o in trunc:
            del m.cmap[key][o]
        m.acked[key] -= trunc
        truncated[key] = trunc
        m.truncations.append((key, kind, sorted(trunc)))
        # 3. held: the new leader's entry goes, the old leader holds what is committed
        m.held[key].pop(new, None)
        m.held[key].pop(old, None)
        if m.cmap[key]:
            m.held[key][old] = set(m.cmap[key])
        # 4. the sets, the epochs
        rep = ps.replication
        if kind == "unclean":   # acks=all data the new leader holds keeps its protection
            isr, joining = [new], []
        elif kind == "reassign":
            isr = [new] + [r for r in old_rep["isr"] if r != new]
            joining = [r for r in old_rep["joining"] if r != new]
        else:
            isr = [new] + [r for r in old_rep["isr"] if r not in (new, old)]
            joining = [r for r in old_rep["joining"] if r != new]
        assert (rep["leader"], rep["isr"], rep["joining"]) == (new, isr, joining), (key, rep)
        assert ps.leader_epoch == json.loads(before[key][0])["leader_epoch"] + 1
        m.lead[key] = new
        m.pepoch[key] += 1
    # 2. every open txn with a range in an elected partition is aborted, in all its partitions
    for txn in doomed:
        assert txn not in s.txns and s.decided.get(txn) == "aborted", txn
        for key, (a, b, _) in m.txn_info[txn]["ranges"].items():
            ps = s.partitions[key]
            assert txn not in ps.open
            assert {o for o in range(a, b) if o >= ps.log_start_offset} <= offsets(ps.aborted)


def apply_reassign_model(m: Model, key: str, targets: List[str]) -> None:
    t, p = key.rsplit(":", 1)
    cur = m.topics[t]["replicas"][int(p)]
    if set(targets) == set(cur):                  # only the order: nothing to move
        new = list(targets)
        assert "target" not in (m.s.partitions[key].replication or {})
    else:
        new = list(cur) + [x for x in targets if x not in cur]
        m.forced.add(key)                         # replicated from now on, even at RF 1
        m.target[key] = list(targets)
    m.topics[t]["replicas"][int(p)] = new


# -- the property ---------------------------------------------------------------------------------

def check_state(m: Model, before: Dict[str, tuple]) -> None:
    """What must hold after every step; ``before`` is each partition's (json, replication)."""
    s = m.s
    for key in m.keys():
        ps = s.partitions[key]
        lso = ps.last_stable_offset
        t, p = key.rsplit(":", 1)
        assert s.topics[t]["replicas"][int(p)] == m.replicas(key), key
        # committed offsets: what the model committed (its txn, its epoch), minus what the log
        # start offset and elections took; epochs never decrease with the offset
        cm = committed_map(ps)
        assert cm == {o: v[1] for o, v in m.cmap[key].items()}, (key, ps.committed)
        epochs = [r[2] for r in ps.committed]
        assert epochs == sorted(epochs), (key, ps.committed)
        assert all(a[1] <= b[0] for a, b in zip(ps.committed, ps.committed[1:])), key
        assert not set(cm) & offsets(ps.aborted), (key, "committed and aborted")
        assert not set(cm) & offsets(ps.open.values()), (key, "committed and open")
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
        assert rep["leader"] == m.leader(key) == rep["isr"][0], key
        assert rep["partition_epoch"] == m.pepoch[key], key
        # held is what the model says was copied, clipped at the log start offset
        assert {d: rs for d, rs in rep["held"].items()} == \
            {d: as_ranges(pts) for d, pts in m.held[key].items() if pts}, key
        for r in replicas:                        # isr.replica_end against brute force
            assert R.replica_end(ps, r, m.leader(key)) == m.end(key, r), (key, r)
        leader = m.leader(key)
        assert leader in replicas and set(rep["isr"] + rep["joining"]) <= set(replicas), key
        assert rep.get("target") == m.target.get(key), key
        assert set(rep.get("target", ())) <= set(replicas), key
        assert set(rep["held"]) <= set(m.followers(key)), (key, rep["held"])
        # acked_above_hw: the committed acks=all offsets above the HW (merged ranges may reach
        # below it); none ends at or below it
        assert all(b > hw for _, b in rep["acked_above_hw"]), key
        assert {o for o in offsets(rep["acked_above_hw"]) if o >= hw} == m.acked_above(key), \
            (key, rep["acked_above_hw"], sorted(m.acked_above(key)))
        for r in rep["isr"][1:]:                  # invariant J
            assert m.end(key, r) >= hw, (key, r, m.end(key, r), hw)
            held_r = m.held[key].get(r, set())
            for a, b in rep["acked_above_hw"]:
                assert set(range(max(a, ps.log_start_offset), b)) <= held_r, (key, r, a, b)
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
       + ["progress"] * 5 + ["alter_isr"] * 5 + ["stale"] + ["takeover"] + ["enable"]
       + ["elect"] * 3 + ["reassign"] * 2 + ["complete"] * 2 + ["unclean_cfg"]
       + ["drive"] * 8)


def run_step(m: Model, op: str, draw) -> None:
    s = m.s
    before = {k: (pjson(s, k), json.loads(json.dumps(s.partitions[k].replication)))
              for k in m.keys()}
    whole = frozen(s)
    shadow = s.copy()
    shadow_json = frozen(shadow)
    open_txns = sorted(s.txns)
    committed_before = {k: committed_map(s.partitions[k]) for k in m.keys()}
    truncated: Dict[str, Set[int]] = {}          # by an election of this step

    if op == "reserve":
        a = gen_reserve(m, draw)
        expected = expect_reserve(m, a)
        nxt = {k: s.partitions[k].next_offset for k in a.partitions}
        r = m.apply(a)
        if expected != A.OK:
            assert r.error == expected, (r, a)
            assert frozen(s) == whole
        else:
            assert r.ok, (r, a)
            m.txn_info[a.txn] = {"acks": a.acks, "ranges": {k: list(v)
                                                             for k, v in r.ranges.items()}}
            if a.acks == "all":
                assert s.txns[a.txn].get("acks") == "all"
            for key, (start, end, _) in r.ranges.items():
                assert start == nxt[key] and end == start + a.partitions[key]
                for o in range(start, end):
                    assert o not in m.owner[key], (key, o, "reserved twice")
                    m.owner[key][o] = a.txn
    elif op in ("commit", "abort") and open_txns:
        txns = draw(st.lists(st.sampled_from(open_txns), min_size=1, max_size=2, unique=True))
        expected = expect_commit(m, txns) if op == "commit" else A.OK
        replicated = {k: m.replicated(k) for k in m.keys()}
        r = m.apply(A.Commit(txns=txns) if op == "commit" else A.Abort(txns=txns))
        if expected != A.OK:
            assert r.error == expected, (r, txns)
            assert frozen(s) == whole          # nothing changes, the txns stay open
        else:
            assert r.ok, (r, txns, [m.txn_info[t] for t in txns])
            assert not set(txns) & set(s.txns)
            for txn in txns if op == "commit" else ():
                info = m.txn_info[txn]
                for key, (a, b, epoch) in info["ranges"].items():
                    for o in range(a, b):
                        assert o not in m.cmap[key] and m.owner[key][o] == txn, (key, o)
                        m.cmap[key][o] = (txn, epoch)
                    if info["acks"] == "all" and replicated[key]:
                        m.acked[key] |= set(range(a, b))
    elif op == "set_log_start":
        # mostly where a member of the ISR or joining lags behind the HW: there the log start
        # offset can change end(r), and with it the candidate
        lagging = [k for k in m.keys() if m.replicated(k) and m.lagging(k)]
        key = draw(st.sampled_from(lagging if lagging and draw(st.booleans()) else m.keys()))
        ps = s.partitions[key]
        hw, lo = ps.high_watermark, ps.log_start_offset
        ends = []
        for r in (m.lagging(key) or m.followers(key)) if ps.replication else []:
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
            m.cmap[key] = {o: v for o, v in m.cmap[key].items() if o >= new_lo}
            m.acked[key] = {o for o in m.acked[key] if o >= new_lo}
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
    elif op == "unclean_cfg":
        t = draw(st.sampled_from(sorted(m.topics)))
        v = draw(st.sampled_from(["true", "true", "false", " TRUE ", "yes", None]))
        name = "unclean.leader.election.enable"
        r = m.apply(A.AlterConfigs(topic=t, set={} if v is None else {name: v},
                                   delete=[name] if v is None else []))
        if v == "yes":
            assert r.error == "INVALID_CONFIG", r
            assert frozen(s) == whole
        else:
            assert r.ok, r
            m.unclean[t] = v is not None and v.strip().lower() == "true"
            assert s.topic_config(t).unclean_leader_election == m.unclean[t]
    elif op in ("progress", "alter_isr", "stale", "elect", "reassign", "complete", "drive"):
        if op == "stale":
            kind = draw(st.sampled_from(["progress", "alter_isr", "elect", "complete"]))
        elif op == "drive":
            action = gen_drive(m, draw)
            if action is None:
                return
            kind = {A.ReplicaProgress: "progress", A.AlterIsr: "alter_isr",
                    A.ElectLeader: "elect", A.CompleteReassignment: "complete"}[type(action)]
        else:
            kind = op
        if op != "drive":
            action = {"progress": gen_progress, "alter_isr": gen_alter_isr, "elect": gen_elect,
                      "reassign": gen_reassign, "complete": gen_complete}[kind](m, draw)
        if op == "stale":
            bad = draw(st.sampled_from([m.epoch - 1, m.epoch + 1])) if m.epoch > 1 \
                else m.epoch + 1
            action = dataclasses.replace(action, coordinator_epoch=bad)
        if kind == "progress":
            expected = {k: expect_progress(m, k, rs, action.topic_ids)
                        for k, rs in action.partitions.items()}
        elif kind == "alter_isr":
            expected = {k: expect_isr(m, k, ch, action.topic_ids)
                        for k, ch in action.partitions.items()}
        elif kind == "elect":
            expected = {k: expect_elect(m, k, action.election, ch, action.topic_ids)
                        for k, ch in action.partitions.items()}
        elif kind == "reassign":
            expected = {k: expect_reassign(m, k, ts, action.topic_ids)
                        for k, ts in action.partitions.items()}
        else:
            expected = {k: expect_complete(m, k, ch, action.topic_ids)
                        for k, ch in action.partitions.items()}
        # an election aborts every open txn with a range in an elected partition
        doomed = sorted({t for t in open_txns for k, err in expected.items()
                         if err == A.OK and k in m.txn_info[t]["ranges"]}) \
            if kind == "elect" else []
        r = m.apply(action)
        if op == "stale":
            assert r.error == "STALE_CONTROLLER_EPOCH", r
            assert frozen(s) == whole
        elif not m.feature_on or (kind == "elect" and action.election not in
                                  ("offline", "unclean", "reassign")):
            assert r.error == "INVALID_REQUEST", r
            assert frozen(s) == whole
        else:
            assert r.ok, r
            got = {k: res.error for k, res in r.partitions.items()}
            assert got == expected, (got, expected, action)
            touched = {k for t in doomed for k in m.txn_info[t]["ranges"]}
            for key in m.keys():
                if got.get(key, "absent") != A.OK and key not in touched:
                    assert pjson(s, key) == before[key][0], key   # errors change nothing
            if kind == "elect":
                after_elections(m, action, got, before, doomed, truncated)
            for key, err in got.items():
                if err != A.OK or kind in ("elect",):
                    continue
                if kind == "reassign":
                    apply_reassign_model(m, key, action.partitions[key])
                elif kind == "complete":
                    t, p = key.rsplit(":", 1)
                    target = m.target.pop(key)
                    old_rep = before[key][1]
                    m.topics[t]["replicas"][int(p)] = list(target)
                    assert s.topics[t]["replicas"][int(p)] == target   # replicas == the target
                    rep = s.partitions[key].replication
                    leader = m.leader(key)
                    assert rep["isr"] == [leader] + [r for r in old_rep["isr"]
                                                     if r in target and r != leader]
                    assert rep["joining"] == [r for r in old_rep["joining"] if r in target]
                    m.held[key] = {d: pts for d, pts in m.held[key].items() if d in target}
                    m.pepoch[key] += 1
                    m.forced.add(key)       # the replication state stays, even at RF 1
                elif kind == "progress":
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
    elif op in ("commit", "abort"):
        return
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
        raise AssertionError(op)
    assert frozen(shadow) == shadow_json, "a copy taken before the step changed"
    # committed offsets -> epoch only lose keys below the log start offset or by truncation
    for key in m.keys():
        old, new = committed_before[key], committed_map(s.partitions[key])
        lo = s.partitions[key].log_start_offset
        for o, epoch in old.items():
            if o in new:
                assert new[o] == epoch, (key, o, epoch, new[o])
            else:
                assert o < lo or o in truncated.get(key, ()), (key, o, "lost", op)
    check_state(m, before)


topic_specs = st.tuples(st.integers(2, 3), st.integers(1, 2), st.integers(1, 3),
                        st.booleans(), st.integers(2, 3), st.integers(1, 3))


@examples(40)
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


OPS_FAILOVER = (["reserve"] * 6 + ["commit"] * 6 + ["abort"] + ["set_log_start"] * 2
                + ["min_isr"] + ["progress"] * 3 + ["alter_isr"] * 3 + ["stale"] + ["takeover"]
                + ["elect"] * 3 + ["reassign"] * 3 + ["complete"] + ["unclean_cfg"]
                + ["drive"] * 14)


@examples(22)
@given(spec=topic_specs, unclean=st.tuples(st.booleans(), st.booleans()), data=st.data())
def test_failover_replay_properties(spec, unclean, data):
    """The same model and invariants with the feature on from the start and the coordinator's
    work (copies, ISR moves, elections, reassignments) weighted up: acks=all writes whose commit
    waits for the followers, acks=1 data that an election truncates, unclean elections where
    the topic allows them, reassignments that run to completion."""
    rf_a, n_a, min_a, with_b, rf_b, min_b = spec
    topics = [("a", rf_a, n_a, min_a), ("solo", 1, 1, 1)]
    if with_b:
        topics.append(("b", rf_b, 1, min_b))
    with tempfile.TemporaryDirectory() as tmp:
        m = Model(tmp)
        m.setup(topics, True)
        for t, on in zip(("a", "b"), unclean):
            if on and t in m.topics:
                assert m.apply(A.AlterConfigs(
                    topic=t, set={"unclean.leader.election.enable": "true"})).ok
                m.unclean[t] = True
        check_state(m, {})
        steps = data.draw(st.lists(st.sampled_from(OPS_FAILOVER), min_size=30, max_size=90),
                          label="ops")
        for i, op in enumerate(steps):
            run_step(m, op, data.draw)
            check_snapshots(m, parted=(i % 12 == 11 or i == len(steps) - 1))


# -- the examples of §1.3 ---------------------------------------------------------------------------

@pytest.fixture(autouse=True)
def _temp_dirs_under_tmp_path(tmp_path, monkeypatch):
    """The examples below make their storage roots with ``mkdtemp``: under the test's
    ``tmp_path`` (which pytest cleans up with its other temp dirs), not in the system's temp
    dir, where they were left behind, one per example and run."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))


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

    def write(self, count: int, commit: bool = True, acks: str = "1") -> str:
        self.n += 1
        txn = f"w{self.n}"
        assert self.m.apply(A.Reserve(txn=txn, producer="p", timeout_ms=10**9,
                                      partitions={self.key: count}, acks=acks)).ok
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

    def elect(self, kind: str, leader: str, epoch: Optional[int] = None) -> A.Result:
        r = self.m.apply(A.ElectLeader(
            coordinator_epoch=self.m.epoch, topic_ids={"t": "id-t"}, election=kind,
            partitions={self.key: {"partition_epoch": self.rep["partition_epoch"]
                                   if epoch is None else epoch, "leader": leader}}))
        return r if not r.ok else r.partitions[self.key]

    def complete(self) -> A.Result:
        r = self.m.apply(A.CompleteReassignment(
            coordinator_epoch=self.m.epoch, topic_ids={"t": "id-t"},
            partitions={self.key: {"partition_epoch": self.rep["partition_epoch"]}}))
        return r if not r.ok else r.partitions[self.key]

    def reassign(self, targets) -> A.Result:
        r = self.m.apply(A.ReassignPartitions(topic_ids={"t": "id-t"},
                                              partitions={self.key: list(targets)}))
        return r if not r.ok else r.partitions[self.key]

    def in_sync(self, *followers) -> None:
        """Copy everything committed to the followers and take them into the ISR."""
        for f in followers:
            for a, b, _ in self.ps.committed:
                assert self.progress(f, (max(a, self.ps.log_start_offset), b)).ok
            assert self.alter(self.rep["isr"], list(self.rep["joining"]) + [f]).ok
            assert self.alter(self.rep["isr"] + [f],
                              [j for j in self.rep["joining"] if j != f]).ok


def test_acks_all_commit_waits_for_every_isr_and_joining_member():
    c = Cl(rf=3, min_isr=2)
    d0, d1, d2 = c.replicas
    # the ISR is below min.insync.replicas: acks=all may not even reserve
    r = c.m.apply(A.Reserve(txn="x", producer="p", timeout_ms=10**9, partitions={"t:0": 1},
                            acks="all"))
    assert r.error == "NOT_ENOUGH_REPLICAS", r
    c.in_sync(d1)
    assert c.alter([d0, d1], [d2]).ok                    # d2 joining: it counts too
    txn = c.write(4, commit=False, acks="all")
    before = frozen(c.m.s)
    r = c.m.apply(A.Commit(txns=[txn]))
    assert r.error == "NOT_ENOUGH_REPLICAS_AFTER_APPEND", r
    assert frozen(c.m.s) == before and txn in c.m.s.txns         # nothing changed, still open
    assert c.progress(d1, (0, 4)).ok
    assert c.m.apply(A.Commit(txns=[txn])).error == "NOT_ENOUGH_REPLICAS_AFTER_APPEND"
    assert c.progress(d2, (0, 3)).ok                     # part of it is not enough
    assert c.m.apply(A.Commit(txns=[txn])).error == "NOT_ENOUGH_REPLICAS_AFTER_APPEND"
    assert c.progress(d2, (3, 4)).ok
    assert c.m.apply(A.Commit(txns=[txn])).ok
    assert c.ps.high_watermark == 4 and c.rep["acked_above_hw"] == []
    # acks=1 needs nothing: it commits, and shows once the ISR holds it
    c.write(2)
    assert c.ps.high_watermark == 4


def test_acked_above_the_high_watermark_bars_a_replica_from_the_isr():
    c = Cl(rf=3, min_isr=1)
    d0, d1, d2 = c.replicas
    c.in_sync(d1)
    held_back = c.write(2, commit=False)                 # 0..2 open: the LSO stays at 0
    txn = c.write(3, commit=False, acks="all")           # 2..5
    assert c.progress(d1, (2, 5)).ok
    assert c.m.apply(A.Commit(txns=[txn])).ok
    assert c.ps.high_watermark == 0 and c.rep["acked_above_hw"] == [[2, 5]]
    assert c.alter([d0, d1], [d2]).ok
    assert c.alter([d0, d1, d2]).error == "INELIGIBLE_REPLICA"   # end(d2) = 2 >= HW 0, lacks 2..5
    assert c.progress(d2, (2, 5)).ok
    assert c.alter([d0, d1, d2]).ok
    assert c.m.apply(A.Abort(txns=[held_back])).ok
    assert c.ps.high_watermark == 5 and c.rep["acked_above_hw"] == []


def test_a_clean_election_truncates_only_acks_1_data_above_the_high_watermark():
    c = Cl(rf=3, min_isr=1)
    d0, d1, d2 = c.replicas
    c.write(5)
    c.in_sync(d1, d2)
    assert c.ps.high_watermark == 5
    c.write(3)                                           # 5..8, acks=1, on d0 alone
    assert c.progress(d2, (5, 8)).ok                     # d2 has it, d1 not: HW stays 5
    open_txn = c.write(2, commit=False)                  # 8..10 open
    assert c.ps.high_watermark == 5
    epoch = c.ps.leader_epoch
    assert c.elect("offline", d0).error == "ELECTION_NOT_NEEDED"
    assert c.elect("offline", "logdir-7").error == "INVALID_REQUEST"
    assert c.elect("offline", d1, epoch=c.rep["partition_epoch"] + 1).error == \
        "INVALID_UPDATE_VERSION"
    assert c.elect("unclean", d1).error == "ELIGIBLE_LEADERS_NOT_AVAILABLE"   # config off
    assert c.elect("reassign", d1).error == "ELIGIBLE_LEADERS_NOT_AVAILABLE"  # no target
    assert c.elect("offline", d1).ok
    assert c.ps.committed == [[0, 5, 0]]                 # 5..8 truncated
    assert c.ps.aborted == [[5, 10]]                     # ... and the open txn aborted
    assert c.m.s.decided[open_txn] == "aborted"
    assert c.rep["leader"] == d1 and c.rep["isr"] == [d1, d2]
    assert c.rep["held"] == {d0: [[0, 5]], d2: [[0, 8]]}
    assert c.ps.leader_epoch == epoch + 1
    assert c.ps.high_watermark == c.ps.last_stable_offset == 10     # 5..10 are gaps now
    assert c.elect("offline", d0).error == "ELIGIBLE_LEADERS_NOT_AVAILABLE"   # left the ISR


def test_an_unclean_election_needs_the_topic_config():
    c = Cl(rf=2, min_isr=1)
    d0, d1 = c.replicas
    c.write(4)
    assert c.progress(d1, (0, 2)).ok
    assert c.elect("unclean", d1).error == "ELIGIBLE_LEADERS_NOT_AVAILABLE"
    assert c.m.apply(A.AlterConfigs(topic="t",
                                    set={"unclean.leader.election.enable": "true"})).ok
    assert c.elect("unclean", d1).ok
    assert c.ps.committed == [[0, 2, 0]] and c.ps.aborted == [[2, 4]]   # visible data lost
    assert c.ps.high_watermark == 4                      # the HW never goes back
    assert c.rep["isr"] == [d1] and c.rep["joining"] == [] and c.rep["held"] == {d0: [[0, 2]]}


def test_a_reassignment_runs_to_completion():
    m = Model(tempfile.mkdtemp(prefix="repl-move-"))
    m.setup([("t", 1, 1, 1)], True)                      # t:0 on logdir-0 alone
    c = Cl.__new__(Cl)
    c.m, c.key, c.replicas, c.n = m, "t:0", ["logdir-0"], 0
    assert c.ps.replication is None
    c.write(6)
    assert c.reassign(["logdir-0"]).ok                   # the same set: only the order
    assert c.ps.replication is None
    assert c.reassign(["logdir-2", "logdir-3"]).ok       # a log dir no replica was on
    assert m.s.topics["t"]["replicas"] == [["logdir-0", "logdir-2", "logdir-3"]]
    assert c.rep["target"] == ["logdir-2", "logdir-3"] and c.rep["high_watermark"] == 6
    assert c.reassign(["logdir-1"]).error == "REASSIGNMENT_IN_PROGRESS"
    assert c.complete().error == "INVALID_REQUEST"       # targets not in sync
    c.in_sync("logdir-2", "logdir-3")
    assert c.complete().error == "INVALID_REQUEST"       # the leader is no target
    assert c.elect("reassign", "logdir-3").ok
    assert c.rep["isr"] == ["logdir-3", "logdir-0", "logdir-2"]
    assert c.complete().ok
    assert m.s.topics["t"]["replicas"] == [["logdir-2", "logdir-3"]]
    assert c.rep["isr"] == ["logdir-3", "logdir-2"] and "target" not in c.rep
    assert c.rep["held"] == {"logdir-2": [[0, 6]]}
    assert c.ps.committed == [[0, 6, 0]] and c.ps.high_watermark == 6
    assert c.reassign(["logdir-3", "logdir-2"]).ok       # reorder only: the preferred leader
    assert m.s.topics["t"]["replicas"] == [["logdir-3", "logdir-2"]]
    assert "target" not in c.rep
    for bad in ([], ["logdir-2", "logdir-2"], ["dir-2"], ["logdir-\u0663"]):
        assert c.reassign(bad).error == "INVALID_REPLICA_ASSIGNMENT", bad


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
