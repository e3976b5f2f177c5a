"""Every metadata action, typed: one frozen dataclass per action with its JSON form, the result
types replay gives back, and the registry replay dispatches through (docs/protocol.md §2.2).

Why one module: an action is a promise between clients of different versions. Writers build
actions only through these classes, so what is written is what the field tables of
``protocol.md`` say; readers parse through the same classes, so a field of the wrong type is
rejected before anything changes (an action applies whole or not at all), and a field or action
this client does not know is *refused*, not skipped: skipping would let this client compute
another state than a newer one and keep writing (§2.3, features).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable, ClassVar, Dict, List, Optional, Tuple, Type

ENTRY_VERSION = 1
INT64 = (-(1 << 63), (1 << 63) - 1)

Check = Callable[[object], Optional[str]]


class ActionFieldError(ValueError):
    """A field of a known action has the wrong type: the action is rejected (INVALID_REQUEST)."""


class UnknownActionError(ValueError):
    """An action, or a field of one, that this client does not know (UNSUPPORTED_VERSION)."""


# -- field checks --------------------------------------------------------------------------------

def check_int(v) -> Optional[str]:
    if not isinstance(v, int) or isinstance(v, bool):
        return f"expected an integer, got {v!r:.60}"
    if not INT64[0] <= v <= INT64[1]:
        return f"{v} does not fit a signed 64-bit integer"
    return None


def check_str(v) -> Optional[str]:
    return None if isinstance(v, str) else f"expected a string, got {v!r:.60}"


def optional(check: Check) -> Check:
    return lambda v: None if v is None else check(v)


def check_tp_key(k) -> Optional[str]:
    if not isinstance(k, str):
        return f"expected a 'topic:partition' key, got {k!r:.60}"
    topic, sep, part = k.rpartition(":")
    if not sep or not topic or not part.isdigit() or not part.isascii():
        return f"expected a 'topic:partition' key, got {k!r:.60}"
    return None


def dict_of(key: Check, value: Check) -> Check:
    def check(v) -> Optional[str]:
        if not isinstance(v, dict):
            return f"expected an object, got {v!r:.60}"
        for k, x in v.items():
            bad = key(k) or value(x)
            if bad:
                return f"[{k!r:.60}]: {bad}"
        return None
    return check


def list_of(item: Check) -> Check:
    def check(v) -> Optional[str]:
        if not isinstance(v, list):
            return f"expected a list, got {v!r:.60}"
        for i, x in enumerate(v):
            bad = item(x)
            if bad:
                return f"[{i}]: {bad}"
        return None
    return check


def check_range(v) -> Optional[str]:
    if not isinstance(v, list) or len(v) != 3:
        return f"expected [start, end, leader epoch], got {v!r:.60}"
    return list_of(check_int)(v)


def record_of(fields: Dict[str, Tuple[Check, bool]]) -> Check:
    """An object with these fields (check, required); other fields are not looked at."""
    def check(v) -> Optional[str]:
        if not isinstance(v, dict):
            return f"expected an object, got {v!r:.60}"
        for name, (field_check, required) in fields.items():
            if name not in v:
                if required:
                    return f"field {name!r} is missing"
                continue
            bad = field_check(v[name])
            if bad:
                return f"field {name!r}: {bad}"
        return None
    return check


REPLICAS = list_of(list_of(check_str))
ACL = record_of({"principal": (check_str, True), "topic": (check_str, True),
                 "operation": (check_str, True), "permission": (check_str, True)})


def spec(check: Check, *, required: bool = True, default=dataclasses.MISSING,
         factory=dataclasses.MISSING):
    """A dataclass field with its JSON check; optional fields are left out of the JSON when
    they hold their default (so an entry carries only what it says)."""
    kwargs = {"metadata": {"check": check, "required": required}}
    if default is not dataclasses.MISSING:
        kwargs["default"] = default
    if factory is not dataclasses.MISSING:
        kwargs["default_factory"] = factory
    return field(**kwargs)


# -- actions ----------------------------------------------------------------------------------

ACTIONS: Dict[str, Type["Action"]] = {}


@dataclass(frozen=True)
class Action:
    OP: ClassVar[str] = ""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.OP:
            ACTIONS[cls.OP] = cls

    def to_json(self) -> dict:
        out = {"op": self.OP}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if not f.metadata["required"] and value == _default(f):
                continue
            out[f.name] = value
        return out

    @classmethod
    def from_json(cls, d: dict) -> "Action":
        """Parse and check a JSON action of this class. Unknown fields raise
        UnknownActionError; a field of the wrong type or a missing one ActionFieldError."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(k for k in d if k != "op" and k != "feature" and k not in fields)
        if unknown:
            raise UnknownActionError(f"{cls.OP} action has field(s) {', '.join(unknown)} that "
                                     "this client does not know")
        kwargs = {}
        for name, f in fields.items():
            if name not in d:
                if f.metadata["required"]:
                    raise ActionFieldError(f"field {name!r} is missing")
                continue
            bad = f.metadata["check"](d[name])
            if bad:
                raise ActionFieldError(f"field {name!r}: {bad}")
            kwargs[name] = d[name]
        return cls(**kwargs)


def _default(f: dataclasses.Field):
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:   # type: ignore[misc]
        return f.default_factory()                     # type: ignore[misc]
    return dataclasses.MISSING


@dataclass(frozen=True)
class CreateTopic(Action):
    OP: ClassVar[str] = "create_topic"
    topic: str = spec(check_str)
    topic_id: str = spec(check_str)
    partitions: int = spec(check_int)
    replicas: List[List[str]] = spec(REPLICAS)
    configs: Dict[str, str] = spec(dict_of(check_str, check_str), required=False, factory=dict)


@dataclass(frozen=True)
class DeleteTopic(Action):
    OP: ClassVar[str] = "delete_topic"
    topic: str = spec(check_str)


@dataclass(frozen=True)
class AlterConfigs(Action):
    OP: ClassVar[str] = "alter_configs"
    topic: str = spec(check_str)
    set: Dict[str, str] = spec(dict_of(check_str, check_str), required=False, factory=dict)
    delete: List[str] = spec(list_of(check_str), required=False, factory=list)


@dataclass(frozen=True)
class CreatePartitions(Action):
    OP: ClassVar[str] = "create_partitions"
    topic: str = spec(check_str)
    total: int = spec(check_int)
    replicas: List[List[str]] = spec(REPLICAS)


@dataclass(frozen=True)
class Reserve(Action):
    OP: ClassVar[str] = "reserve"
    txn: str = spec(check_str)
    producer: str = spec(check_str)
    timeout_ms: int = spec(check_int)
    partitions: Dict[str, int] = spec(dict_of(check_tp_key, check_int))
    principal: Optional[str] = spec(optional(check_str), required=False, default=None)
    #: reader feature ``replication``: "all" waits for the ISR before the commit (§1.3)
    acks: str = spec(check_str, required=False, default="1")


@dataclass(frozen=True)
class Commit(Action):
    OP: ClassVar[str] = "commit"
    txns: List[str] = spec(list_of(check_str))
    spark_job: Optional[str] = spec(optional(check_str), required=False, default=None)


@dataclass(frozen=True)
class StreamCommit(Action):
    """A streaming micro-batch's commit, at most once per (sink, batch): reader feature
    ``streamingSink`` (docs/protocol.md §3.2)."""
    OP: ClassVar[str] = "stream_commit"
    txns: List[str] = spec(list_of(check_str))
    sink: str = spec(check_str)
    batch: int = spec(check_int)
    spark_job: Optional[str] = spec(optional(check_str), required=False, default=None)


LEASE_OPS = ("acquire", "renew", "release")


@dataclass(frozen=True)
class CoordinatorLeaseChange(Action):
    """The coordinator's lease: acquire (a new epoch), renew, release; reader feature
    ``coordinatorLease`` (docs/protocol.md §11). ``lease_op``, not ``op``: that name is the
    action's own. For renew and release, ``epoch`` is the action's coordinator epoch, fenced
    like any other."""
    OP: ClassVar[str] = "coordinator_lease"
    lease_op: str = spec(check_str)
    epoch: int = spec(check_int)
    holder: str = spec(check_str)
    address: str = spec(check_str)
    lease_ms: int = spec(check_int)
    renewed_ms: int = spec(check_int)


@dataclass(frozen=True)
class AddLogDir(Action):
    """A log dir at a URL of its own, not under the root: reader feature ``logDirRegistry``
    (docs/protocol.md §1.1). Readers must know it, or they would look for its partitions under
    the root and find none."""
    OP: ClassVar[str] = "add_log_dir"
    log_dir: str = spec(check_str)
    url: str = spec(check_str)
    directory_id: str = spec(check_str)
    storage_options: Dict[str, str] = spec(dict_of(check_str, check_str), required=False,
                                           factory=dict)


@dataclass(frozen=True)
class RemoveLogDir(Action):
    """A registered log dir that holds no replica removed (reader feature ``logDirRemoval``,
    docs/protocol.md §1.1). The name stays taken: it is never registered again, and no replica
    list may name it, so a process that still has the old URL behind that name never writes a
    new log dir's data there."""
    OP: ClassVar[str] = "remove_log_dir"
    log_dir: str = spec(check_str)


def check_span(v) -> Optional[str]:
    if not isinstance(v, list) or len(v) != 2:
        return f"expected [start, end], got {v!r:.60}"
    return list_of(check_int)(v)


ISR_STATE = record_of({"partition_epoch": (check_int, True), "isr": (list_of(check_str), True),
                       "joining": (list_of(check_str), True)})


@dataclass(frozen=True)
class ReplicaProgress(Action):
    """Ranges the coordinator copied to followers and checked: reader feature ``replication``
    (docs/protocol.md §1.3). A copy counts only once this action names it."""
    OP: ClassVar[str] = "replica_progress"
    coordinator_epoch: int = spec(check_int)
    topic_ids: Dict[str, str] = spec(dict_of(check_str, check_str))
    partitions: Dict[str, Dict[str, List[List[int]]]] = spec(
        dict_of(check_tp_key, dict_of(check_str, list_of(check_span))))


@dataclass(frozen=True)
class ReplicaLost(Action):
    """Ranges ``held`` names that a follower's log dir was found not to hold (its files gone,
    cut short or damaged): reader feature ``replicaCheck`` (docs/protocol.md §1.3). The
    follower leaves the ISR at once and is copied to again; Kafka's follower learns the same
    from its own log on its next fetch."""
    OP: ClassVar[str] = "replica_lost"
    coordinator_epoch: int = spec(check_int)
    topic_ids: Dict[str, str] = spec(dict_of(check_str, check_str))
    partitions: Dict[str, Dict[str, List[List[int]]]] = spec(
        dict_of(check_tp_key, dict_of(check_str, list_of(check_span))))


@dataclass(frozen=True)
class AlterIsr(Action):
    """Kafka's AlterPartition: new in-sync and joining replicas per partition, each under its
    partition epoch; reader feature ``replication`` (docs/protocol.md §1.3)."""
    OP: ClassVar[str] = "alter_isr"
    coordinator_epoch: int = spec(check_int)
    topic_ids: Dict[str, str] = spec(dict_of(check_str, check_str))
    partitions: Dict[str, dict] = spec(dict_of(check_tp_key, ISR_STATE))
    reason: Optional[str] = spec(optional(check_str), required=False, default=None)


@dataclass(frozen=True)
class ElectLeader(Action):
    """A new leader per partition after its leader's log dir went offline: reader feature
    ``replication`` (docs/protocol.md §1.3); truncates what the new leader lacks."""
    OP: ClassVar[str] = "elect_leader"
    coordinator_epoch: int = spec(check_int)
    topic_ids: Dict[str, str] = spec(dict_of(check_str, check_str))
    election: str = spec(check_str)
    partitions: Dict[str, dict] = spec(dict_of(check_tp_key, record_of(
        {"partition_epoch": (check_int, True), "leader": (check_str, True)})))


@dataclass(frozen=True)
class ReassignPartitions(Action):
    """Target replicas per partition (kafka-reassign-partitions.sh --execute): reader feature
    ``replication`` (docs/protocol.md §1.3); the coordinator carries it out."""
    OP: ClassVar[str] = "reassign_partitions"
    topic_ids: Dict[str, str] = spec(dict_of(check_str, check_str))
    partitions: Dict[str, List[str]] = spec(dict_of(check_tp_key, list_of(check_str)))


@dataclass(frozen=True)
class CompleteReassignment(Action):
    """The coordinator ends a reassignment whose targets are all in sync (§1.3)."""
    OP: ClassVar[str] = "complete_reassignment"
    coordinator_epoch: int = spec(check_int)
    topic_ids: Dict[str, str] = spec(dict_of(check_str, check_str))
    partitions: Dict[str, dict] = spec(dict_of(check_tp_key, record_of(
        {"partition_epoch": (check_int, True)})))


def check_merge_run(v) -> Optional[str]:
    if not isinstance(v, list) or len(v) != 4:
        return f"expected [base, end, segments, size], got {v!r:.60}"
    return list_of(check_int)(v)


@dataclass(frozen=True)
class MergeSegments(Action):
    """Runs of adjacent committed segments of one partition merged into one each (reader
    feature ``segmentMerge``, docs/protocol.md §4.1). ``after``: the seq of the partition's
    previous applied merge (-1: none) the merger planned on, so that two mergers of one
    partition cannot both publish; ``runs``: ``[base, end, segments, size]`` (the merged
    segment's name, one past its last offset, how many segment files it replaces, the bytes
    of its .log); ``log_dirs``: the replicas whose files it replaces, leader first."""
    OP: ClassVar[str] = "merge_segments"
    topic: str = spec(check_str)
    topic_id: str = spec(check_str)
    partition: int = spec(check_int)
    after: int = spec(check_int)
    runs: List[list] = spec(list_of(check_merge_run))
    log_dirs: List[str] = spec(list_of(check_str))


@dataclass(frozen=True)
class CleanSegments(Action):
    """Groups of adjacent committed segments of one compacted partition cleaned into one each
    (reader feature ``logCompaction``, docs/protocol.md §4.2), ordered with merges by ``after``
    (the partition's last merge or clean); ``runs`` as ``MergeSegments``' (a group may be one
    segment); ``cleaned_to``: the first offset the clean's offset map did not cover, Kafka's
    cleaner checkpoint."""
    OP: ClassVar[str] = "clean_segments"
    topic: str = spec(check_str)
    topic_id: str = spec(check_str)
    partition: int = spec(check_int)
    after: int = spec(check_int)
    runs: List[list] = spec(list_of(check_merge_run))
    cleaned_to: int = spec(check_int)
    log_dirs: List[str] = spec(list_of(check_str))


@dataclass(frozen=True)
class ClientQuotaChange(Action):
    """Byte-rate quotas of a client id or the default entity (KIP-13): reader feature
    ``clientQuotas`` (docs/protocol.md §12)."""
    OP: ClassVar[str] = "client_quota"
    entity: str = spec(check_str)
    set: Dict[str, str] = spec(dict_of(check_str, check_str), required=False, factory=dict)
    delete: List[str] = spec(list_of(check_str), required=False, factory=list)


@dataclass(frozen=True)
class Abort(Action):
    OP: ClassVar[str] = "abort"
    txns: List[str] = spec(list_of(check_str))
    reason: Optional[str] = spec(optional(check_str), required=False, default=None)
    spark_job: Optional[str] = spec(optional(check_str), required=False, default=None)


@dataclass(frozen=True)
class SetLogStart(Action):
    OP: ClassVar[str] = "set_log_start"
    partitions: Dict[str, int] = spec(dict_of(check_tp_key, check_int))
    principal: Optional[str] = spec(optional(check_str), required=False, default=None)
    topic_ids: Dict[str, str] = spec(optional(dict_of(check_str, check_str)), required=False,
                                     factory=dict)
    reason: Optional[str] = spec(optional(check_str), required=False, default=None)

    def to_json(self) -> dict:
        out = super().to_json()
        out.setdefault("principal", None)   # null means "the cluster's own policy": say it
        return out


@dataclass(frozen=True)
class AclChange(Action):
    OP: ClassVar[str] = "acl"
    add: List[dict] = spec(list_of(ACL), required=False, factory=list)
    remove: List[dict] = spec(list_of(ACL), required=False, factory=list)


@dataclass(frozen=True)
class EnableFeatures(Action):
    """Turns protocol features on (§2.3); features are never turned off."""
    OP: ClassVar[str] = "protocol"
    reader_features: List[str] = spec(list_of(check_str), required=False, factory=list)
    writer_features: List[str] = spec(list_of(check_str), required=False, factory=list)


# -- results ----------------------------------------------------------------------------------

OK = "NONE"


@dataclass(frozen=True)
class Result:
    """What replay decided for one action: ``error`` is a Kafka error name, ``NONE`` if the
    action applied. Results live only in the replaying process (they are never persisted)."""

    error: str = OK
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.error == OK


@dataclass(frozen=True)
class ReserveResult(Result):
    ranges: Dict[str, List[int]] = field(default_factory=dict)   # "topic:p" -> [start, end, epoch]


@dataclass(frozen=True)
class DeleteTopicResult(Result):
    topic_id: str = ""


@dataclass(frozen=True)
class AbortResult(Result):
    aborted: List[str] = field(default_factory=list)
    skipped: Dict[str, str] = field(default_factory=dict)        # txn -> committed|aborted|unknown


@dataclass(frozen=True)
class LogStartResult(Result):
    low_watermark: int = -1


@dataclass(frozen=True)
class SetLogStartResult(Result):
    partitions: Dict[str, LogStartResult] = field(default_factory=dict)


@dataclass(frozen=True)
class PartitionsResult(Result):
    """Per partition, ``NONE`` or an error: the valid partitions of the action applied."""
    partitions: Dict[str, Result] = field(default_factory=dict)


def error(name: str, message: str = "") -> Result:
    return Result(name, message)


# -- entries ----------------------------------------------------------------------------------

def check_entry(entry) -> Optional[str]:
    """None for a well-formed entry; a message starting with "version" for an unknown version."""
    if not isinstance(entry, dict):
        return f"an entry must be a JSON object, not {type(entry).__name__}"
    version = entry.get("version")
    if version != ENTRY_VERSION:
        return (f"version {version!r:.40} is not one this client knows ({ENTRY_VERSION}); "
                "upgrade pyspark-kafkalog")
    if "timestamp" not in entry:
        return "field 'timestamp' is missing"
    bad = check_int(entry["timestamp"])
    if bad:
        return f"timestamp: {bad}"
    if not isinstance(entry.get("actions"), list):
        return "field 'actions' must be a list"
    return None


def parse_action(d) -> Action:
    """The typed action of one JSON action; UnknownActionError for an op this client does not
    know (or an unknown field), ActionFieldError for a malformed one."""
    op = d.get("op") if isinstance(d, dict) else None
    if not isinstance(op, str):
        raise ActionFieldError(f"an action must be an object with a string 'op', got {d!r:.80}")
    cls = ACTIONS.get(op)
    if cls is None:
        raise UnknownActionError(f"action {op!r:.60} is not one this client knows")
    return cls.from_json(d)
