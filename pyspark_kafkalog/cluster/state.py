"""The replayed cluster state: a pure, deterministic function of the metadata log.

Every action is validated against the state at its point in the log; invalid actions are no-ops
with an error result, so two processes that read the same entries always agree, and a writer
learns the fate of its own actions by replaying to its own entry (docs/protocol.md, §2-§6).
Only the entry's own timestamp is used as "now", never the replaying process's clock.
"""
from __future__ import annotations

import bisect
from typing import Dict, List, Optional, Tuple

from ..errors import (CorruptRecordError, InvalidConfigError, InvalidTopicError, KafkaLogError,
                      UnsupportedVersionError)
from ..format.checkpoint import colliding_topics, validate_topic_name
from ..log.config import LogConfig
from .action_fields import check_action, check_entry, check_snapshot

MAX_DECIDED_TXNS = 100_000
MAX_DELETED_TOPICS = 100_000
MAX_KEPT_RESULTS = 256
SNAPSHOT_VERSION = 2

OK = "NONE"


def tp_key(topic: str, partition: int) -> str:
    return f"{topic}:{partition}"


def split_key(key: str) -> Tuple[str, int]:
    topic, _, part = key.rpartition(":")
    return topic, int(part)


def _err(name: str, message: str = "") -> dict:
    return {"error": name, "message": message}


class PartitionState:
    """Offsets of one partition. Ranges are ``[start, end, leader_epoch]``, end exclusive."""

    __slots__ = ("next_offset", "log_start_offset", "leader_epoch", "last_producer", "open",
                 "committed", "aborted")

    def __init__(self, next_offset: int = 0, log_start_offset: int = 0, leader_epoch: int = -1,
                 last_producer: Optional[str] = None, open_: Optional[dict] = None,
                 committed: Optional[list] = None, aborted: Optional[list] = None):
        self.next_offset = next_offset
        self.log_start_offset = log_start_offset
        self.leader_epoch = leader_epoch
        self.last_producer = last_producer
        self.open: Dict[str, list] = open_ or {}          # txn -> [start, end, epoch]
        self.committed: List[list] = committed or []      # sorted, merged
        # [start, end) of aborted reservations at or above the log start offset, sorted and
        # merged: cleanup deletes a segment only on this positive evidence (or the log start
        # offset), never because a range is merely absent from ``committed``
        self.aborted: List[list] = [] if aborted is None else aborted

    @property
    def high_watermark(self) -> int:
        """Start of the lowest open reservation: the HW moves only over resolved writes."""
        if self.open:
            return min(r[0] for r in self.open.values())
        return self.next_offset

    def visible_ranges(self) -> List[Tuple[int, int, int]]:
        """Committed ``(start, end, epoch)`` clipped to ``[log start offset, high watermark)``."""
        lo, hi = self.log_start_offset, self.high_watermark
        out = []
        for start, end, epoch in self.committed:
            s, e = max(start, lo), min(end, hi)
            if s < e:
                out.append((s, e, epoch))
        return out

    def is_visible(self, offset: int) -> bool:
        if not (self.log_start_offset <= offset < self.high_watermark):
            return False
        i = bisect.bisect_right([r[0] for r in self.committed], offset) - 1
        return i >= 0 and offset < self.committed[i][1]

    def next_visible_offset(self, offset: int) -> Optional[int]:
        """The first offset >= ``offset`` holding a visible record, or None if none is left."""
        offset = max(offset, self.log_start_offset)
        for start, end, _ in self.committed:
            if end > offset:
                first = max(start, offset)
                return first if first < self.high_watermark else None
        return None

    def segment_visible(self, base_offset: int) -> bool:
        """Readers may open a segment iff it starts in a committed range below the high
        watermark. Segments never span reservations, so the base decides the whole file; one
        that starts below the log start offset but reaches past it stays readable."""
        if base_offset >= self.high_watermark:
            return False
        i = bisect.bisect_right([r[0] for r in self.committed], base_offset) - 1
        return i >= 0 and base_offset < self.committed[i][1]

    def is_committed(self, offset: int) -> bool:
        """Committed data, whether or not an older open reservation still holds the high
        watermark below it: committed is not the same as visible (docs/protocol.md §7)."""
        i = bisect.bisect_right([r[0] for r in self.committed], offset) - 1
        return i >= 0 and offset < self.committed[i][1]

    def in_open_range(self, offset: int) -> bool:
        return any(r[0] <= offset < r[1] for r in self.open.values())

    def is_aborted(self, offset: int) -> bool:
        i = bisect.bisect_right([r[0] for r in self.aborted], offset) - 1
        return i >= 0 and offset < self.aborted[i][1]

    def add_aborted(self, start: int, end: int) -> None:
        if end <= self.log_start_offset:
            return
        ranges = sorted(self.aborted + [[max(start, self.log_start_offset), end]])
        merged: List[list] = []
        for r in ranges:
            if merged and merged[-1][1] >= r[0]:
                merged[-1][1] = max(merged[-1][1], r[1])
            else:
                merged.append(list(r))
        self.aborted = merged

    def segment_visible_uncommitted(self, base_offset: int) -> bool:
        """read_uncommitted also shows the data of open (undecided) writes."""
        return (self.segment_visible(base_offset)
                or any(r[0] <= base_offset < r[1] for r in self.open.values()))

    def add_committed(self, start: int, end: int, epoch: int) -> None:
        starts = [r[0] for r in self.committed]
        i = bisect.bisect_left(starts, start)
        self.committed.insert(i, [start, end, epoch])
        merged: List[list] = []
        for r in self.committed:
            if merged and merged[-1][1] == r[0] and merged[-1][2] == r[2]:
                merged[-1][1] = r[1]
            else:
                merged.append(r)
        self.committed = merged

    def leader_epoch_entries(self) -> List[Tuple[int, int]]:
        """``(epoch, start offset)`` for committed data, as ``leader-epoch-checkpoint`` has them."""
        out: List[Tuple[int, int]] = []
        for start, end, epoch in self.visible_ranges():
            if not out or epoch > out[-1][0]:
                out.append((epoch, start))
        return out

    def to_json(self) -> dict:
        return {"next_offset": self.next_offset, "log_start_offset": self.log_start_offset,
                "leader_epoch": self.leader_epoch, "last_producer": self.last_producer,
                "open": self.open, "committed": self.committed, "aborted": self.aborted}

    @classmethod
    def from_json(cls, d: dict) -> "PartitionState":
        return cls(d["next_offset"], d["log_start_offset"], d["leader_epoch"],
                   d.get("last_producer"), {k: list(r) for k, r in (d.get("open") or {}).items()},
                   [list(r) for r in d.get("committed") or []],
                   [list(r) for r in d.get("aborted") or []])


def _plain(obj):
    """A copy of JSON-shaped data: dicts and lists copied all the way down, the rest shared
    (str, int, float, bool, None and tuples are immutable)."""
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_plain(v) for v in obj]
    return obj


class ClusterState:
    def __init__(self):
        self.seq = -1
        self.timestamp = -1
        self.topics: Dict[str, dict] = {}
        self.partitions: Dict[str, PartitionState] = {}
        self.txns: Dict[str, dict] = {}            # open txns only
        self.decided: Dict[str, str] = {}          # txn -> "committed" | "aborted" (bounded)
        self.acls: List[dict] = []
        self.deleted_topics: Dict[str, str] = {}   # topic id -> name (bounded)
        self.results: Dict[int, List[dict]] = {}   # seq -> per-action results (not persisted)

    # -- persistence --------------------------------------------------------------------------

    def copy(self) -> "ClusterState":
        """An independent copy. The state is JSON-shaped (dicts, lists, scalars), so a plain
        recursive copy does what ``copy.deepcopy`` did, without its memo: several times
        faster, and every write task copies the state a few times."""
        c = ClusterState()
        c.seq, c.timestamp = self.seq, self.timestamp
        c.topics, c.txns, c.decided = _plain(self.topics), _plain(self.txns), dict(self.decided)
        c.acls, c.results = _plain(self.acls), _plain(self.results)
        c.deleted_topics = dict(self.deleted_topics)
        c.partitions = {k: PartitionState(p.next_offset, p.log_start_offset, p.leader_epoch,
                                          p.last_producer, _plain(p.open), _plain(p.committed),
                                          _plain(p.aborted))
                        for k, p in self.partitions.items()}
        return c

    def to_snapshot(self) -> dict:
        return {"version": SNAPSHOT_VERSION, "seq": self.seq, "timestamp": self.timestamp,
                "topics": self.topics,
                "partitions": {k: p.to_json() for k, p in self.partitions.items()},
                "txns": self.txns, "decided": self.decided, "acls": self.acls,
                "deleted_topics": self.deleted_topics}

    @classmethod
    def from_snapshot(cls, d) -> "ClusterState":
        """The state a snapshot holds, after checking its whole shape: a snapshot is derived
        data, so one that does not hold together raises CorruptRecordError and the caller falls
        back to an older one (or to entry 0) instead of acting on it."""
        check_snapshot(d)
        s = cls()
        s.seq, s.timestamp = d["seq"], d["timestamp"]
        s.topics = _plain(d["topics"])
        s.partitions = {k: PartitionState.from_json(v) for k, v in d["partitions"].items()}
        s.txns, s.decided, s.acls = _plain(d["txns"]), dict(d["decided"]), _plain(d["acls"])
        s.deleted_topics = dict(d.get("deleted_topics") or {})
        return s

    # -- queries ------------------------------------------------------------------------------

    def partition(self, topic: str, partition: int) -> Optional[PartitionState]:
        return self.partitions.get(tp_key(topic, partition))

    def topic_config(self, topic: str) -> LogConfig:
        return LogConfig.from_properties(self.topics[topic]["configs"])

    def open_txns_past_deadline(self, now_ms: int) -> List[str]:
        return sorted(t for t, info in self.txns.items() if info["deadline"] < now_ms)

    def topic_of_id(self, topic_id: str) -> Optional[str]:
        for name, info in self.topics.items():
            if info["topic_id"] == topic_id:
                return name
        return None

    def authorized(self, principal: Optional[str], topic: str, operation: str) -> bool:
        """DENY wins; with no ACL naming this topic (or ``*``) everything is allowed."""
        relevant = [a for a in self.acls if a["topic"] in (topic, "*")]
        if not relevant:
            return True
        matches = [a for a in relevant if a["principal"] in (principal, "*")
                   and a["operation"] in (operation, "ALL")]
        if any(a["permission"] == "DENY" for a in matches):
            return False
        return any(a["permission"] == "ALLOW" for a in matches)

    # -- replay -------------------------------------------------------------------------------

    def apply(self, seq: int, entry) -> None:
        """Replay one entry. An entry that is not an entry at all (not an object, no integer
        timestamp, no list of actions) stops the replay with CorruptRecordError naming it; an
        entry of an unknown version with UnsupportedVersionError: guessing would let this
        process compute another state than its peers. An action whose fields do not have their
        types is rejected whole before anything changes (INVALID_REQUEST), so no action is ever
        half applied."""
        if seq != self.seq + 1:
            raise ValueError(f"entry {seq} applied to state at {self.seq}")
        problem = check_entry(entry)
        if problem is not None:
            error = UnsupportedVersionError if problem.startswith("version") else CorruptRecordError
            raise error(f"metadata entry {seq:020d}.json: {problem}; replay stops here (see "
                        "`kafkalog --cluster URL metadata --verify`)")
        ts = entry["timestamp"]
        results = []
        for action in entry["actions"]:
            op = action.get("op") if isinstance(action, dict) else None
            handler = getattr(self, f"_do_{op}", None) if isinstance(op, str) else None
            if handler is None:
                results.append(_err("INVALID_REQUEST", f"unknown action {op!r}"))
                continue
            bad = check_action(op, action)
            if bad is not None:
                results.append(_err("INVALID_REQUEST", f"malformed {op} action: {bad}"))
                continue
            try:
                results.append(handler(action, ts))
            except KafkaLogError as exc:
                results.append(_err(exc.error_name, str(exc)))
        self.seq, self.timestamp = seq, max(self.timestamp, ts)
        self.results[seq] = results
        if len(self.results) > MAX_KEPT_RESULTS:
            for old in sorted(self.results)[:-MAX_KEPT_RESULTS]:
                del self.results[old]

    def _do_create_topic(self, a: dict, ts: int) -> dict:
        topic = a["topic"]
        try:
            validate_topic_name(topic)
        except InvalidTopicError as exc:
            return _err("INVALID_TOPIC_EXCEPTION", str(exc))
        if topic in self.topics:
            return _err("TOPIC_ALREADY_EXISTS", f"topic {topic!r} already exists")
        collides = colliding_topics(topic, self.topics)
        if collides:
            return _err("INVALID_TOPIC_EXCEPTION", f"topic {topic!r} collides with existing "
                        f"topic {', '.join(map(repr, collides))}: '.' and '_' give the same "
                        "metric names (Kafka's Topic.hasCollision)")
        n = int(a["partitions"])
        if n < 1:
            return _err("INVALID_PARTITIONS", "a topic needs at least one partition")
        replicas = a["replicas"]
        if len(replicas) != n or any(not r for r in replicas):
            return _err("INVALID_REPLICA_ASSIGNMENT", "one non-empty replica list per partition")
        try:
            LogConfig.from_properties(a.get("configs") or {})
        except InvalidConfigError as exc:
            return _err("INVALID_CONFIG", str(exc))
        self.topics[topic] = {"topic_id": a["topic_id"], "partitions": n, "replicas": replicas,
                              "configs": dict(a.get("configs") or {}), "created": ts}
        for p in range(n):
            self.partitions[tp_key(topic, p)] = PartitionState()
        return {"error": OK}

    def _do_delete_topic(self, a: dict, ts: int) -> dict:
        topic = a["topic"]
        if topic not in self.topics:
            return _err("UNKNOWN_TOPIC_OR_PARTITION", f"topic {topic!r} does not exist")
        info = self.topics.pop(topic)
        self.deleted_topics[info["topic_id"]] = topic
        if len(self.deleted_topics) > MAX_DELETED_TOPICS:
            for old in list(self.deleted_topics)[:len(self.deleted_topics) - MAX_DELETED_TOPICS]:
                del self.deleted_topics[old]
        for p in range(info["partitions"]):
            self.partitions.pop(tp_key(topic, p), None)
        for txn in list(self.txns):
            ranges = self.txns[txn]["ranges"]
            for key in [k for k in ranges if split_key(k)[0] == topic]:
                del ranges[key]
            if not ranges:
                del self.txns[txn]
                self._decide(txn, "aborted")
        return {"error": OK, "topic_id": info["topic_id"]}

    def _do_alter_configs(self, a: dict, ts: int) -> dict:
        topic = a["topic"]
        if topic not in self.topics:
            return _err("UNKNOWN_TOPIC_OR_PARTITION", f"topic {topic!r} does not exist")
        configs = dict(self.topics[topic]["configs"])
        configs.update(a.get("set") or {})
        for key in a.get("delete") or []:
            configs.pop(key, None)
        try:
            LogConfig.from_properties(configs)
        except InvalidConfigError as exc:
            return _err("INVALID_CONFIG", str(exc))
        self.topics[topic]["configs"] = configs
        return {"error": OK}

    def _do_create_partitions(self, a: dict, ts: int) -> dict:
        topic = a["topic"]
        if topic not in self.topics:
            return _err("UNKNOWN_TOPIC_OR_PARTITION", f"topic {topic!r} does not exist")
        info = self.topics[topic]
        total, replicas = int(a["total"]), a["replicas"]
        if total <= info["partitions"]:
            return _err("INVALID_PARTITIONS", f"topic {topic!r} already has "
                        f"{info['partitions']} partitions; the new count must be larger")
        if len(replicas) != total - info["partitions"]:
            return _err("INVALID_REPLICA_ASSIGNMENT", "one replica list per new partition")
        for p in range(info["partitions"], total):
            self.partitions[tp_key(topic, p)] = PartitionState()
        info["replicas"] = info["replicas"] + replicas
        info["partitions"] = total
        return {"error": OK}

    def _do_reserve(self, a: dict, ts: int) -> dict:
        txn, producer = a["txn"], a["producer"]
        if txn in self.txns or txn in self.decided:
            return _err("INVALID_TXN_STATE", f"transaction {txn} already exists")
        counts = a["partitions"]
        if not counts:
            return _err("INVALID_REQUEST", "a reservation needs at least one partition")
        for key, count in counts.items():
            topic, _ = split_key(key)
            if key not in self.partitions:
                return _err("UNKNOWN_TOPIC_OR_PARTITION", f"no partition {key}")
            if not self.authorized(a.get("principal"), topic, "WRITE"):
                return _err("TOPIC_AUTHORIZATION_FAILED",
                            f"{a.get('principal')} may not write to {topic!r}")
            if int(count) < 1:
                return _err("INVALID_REQUEST", f"reservation of {count} offsets in {key}")
        ranges = {}
        for key, count in counts.items():
            p = self.partitions[key]
            if p.last_producer != producer:
                p.leader_epoch += 1
                p.last_producer = producer
            r = [p.next_offset, p.next_offset + int(count), p.leader_epoch]
            p.next_offset = r[1]
            p.open[txn] = r
            ranges[key] = r
        # seq and timeout_ms let others judge expiry by the storage's clock (the entry's
        # server-side time), not by the writer's own, which may be wrong either way
        self.txns[txn] = {"deadline": ts + int(a["timeout_ms"]), "producer": producer,
                          "ranges": ranges, "seq": self.seq + 1,
                          "timeout_ms": int(a["timeout_ms"])}
        return {"error": OK, "ranges": ranges}

    def _do_commit(self, a: dict, ts: int) -> dict:
        """All listed txns commit together or none does (one unit, e.g. a Spark job)."""
        txns = list(a["txns"])
        for txn in txns:
            if txn in self.txns:
                if ts > self.txns[txn]["deadline"]:
                    return _err("FENCED_LEADER_EPOCH",
                                f"transaction {txn} passed its deadline before this commit")
                continue
            state = self.decided.get(txn)
            if state == "aborted":
                return _err("FENCED_LEADER_EPOCH", f"transaction {txn} was aborted")
            if state is None:
                return _err("INVALID_TXN_STATE", f"unknown transaction {txn}")
        for txn in txns:
            info = self.txns.pop(txn, None)
            if info is None:
                continue   # already committed: commits are idempotent
            for key, (start, end, epoch) in info["ranges"].items():
                p = self.partitions.get(key)
                if p is not None:
                    p.open.pop(txn, None)
                    p.add_committed(start, end, epoch)
            self._decide(txn, "committed")
        return {"error": OK}

    def _do_abort(self, a: dict, ts: int) -> dict:
        aborted, skipped = [], {}
        for txn in a["txns"]:
            info = self.txns.pop(txn, None)
            if info is None:
                skipped[txn] = self.decided.get(txn, "unknown")
                continue
            for key, (start, end, _epoch) in info["ranges"].items():
                p = self.partitions.get(key)
                if p is not None:
                    p.open.pop(txn, None)
                    p.add_aborted(start, end)
            self._decide(txn, "aborted")
            aborted.append(txn)
        return {"error": OK, "aborted": aborted, "skipped": skipped}

    def _do_set_log_start(self, a: dict, ts: int) -> dict:
        """KIP-107: per partition a new low watermark or an error; valid ones all apply."""
        out = {}
        principal = a.get("principal")
        for key, offset in a["partitions"].items():
            topic, _ = split_key(key)
            p = self.partitions.get(key)
            if p is None:
                out[key] = _err("UNKNOWN_TOPIC_OR_PARTITION", f"no partition {key}")
                continue
            expected_id = (a.get("topic_ids") or {}).get(topic)
            if expected_id is not None and self.topics[topic]["topic_id"] != expected_id:
                out[key] = _err("UNKNOWN_TOPIC_OR_PARTITION",
                                f"topic {topic!r} was recreated (topic id changed)")
                continue
            if principal is not None and not self.authorized(principal, topic, "DELETE"):
                out[key] = _err("TOPIC_AUTHORIZATION_FAILED",
                                f"{principal} may not delete records of {topic!r}")
                continue
            offset = int(offset)
            hw = p.high_watermark
            if offset == -1:
                offset = hw
            if offset < 0 or offset > hw:
                out[key] = _err("OFFSET_OUT_OF_RANGE",
                                f"offset {offset} is not between 0 and the high watermark {hw}")
                continue
            if offset > p.log_start_offset:
                p.log_start_offset = offset
                p.committed = [r for r in p.committed if r[1] > offset]
                p.aborted = [[max(r[0], offset), r[1]] for r in p.aborted if r[1] > offset]
            out[key] = {"error": OK, "low_watermark": p.log_start_offset}
        return {"error": OK, "partitions": out}

    def _do_acl(self, a: dict, ts: int) -> dict:
        for acl in a.get("add") or []:
            entry = {k: acl[k] for k in ("principal", "topic", "operation", "permission")}
            if entry["permission"] not in ("ALLOW", "DENY"):
                return _err("INVALID_REQUEST", f"permission must be ALLOW or DENY: {entry}")
            if entry not in self.acls:
                self.acls.append(entry)
        for acl in a.get("remove") or []:
            entry = {k: acl[k] for k in ("principal", "topic", "operation", "permission")}
            if entry in self.acls:
                self.acls.remove(entry)
        return {"error": OK}

    def _decide(self, txn: str, outcome: str) -> None:
        self.decided[txn] = outcome
        if len(self.decided) > MAX_DECIDED_TXNS:
            for old in list(self.decided)[:len(self.decided) - MAX_DECIDED_TXNS]:
                del self.decided[old]
