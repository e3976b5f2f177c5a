"""The shapes of metadata entries, actions and snapshots (docs/protocol.md §2), checked before
anything is applied.

Replay must be a pure function of the entries, and an action must apply whole or not at all: a
handler that converted a field half-way through (``int("abc")``) would leave the state changed
and the action reported as rejected. So every field is checked here first, and the handlers in
``state.py`` may assume the types they read. A check returns a message naming the first field
that is wrong, or None.
"""
from __future__ import annotations

from typing import Callable, Dict, Optional, Tuple

ENTRY_VERSION = 1
SNAPSHOT_VERSIONS = (1, 2)
INT64 = (-(1 << 63), (1 << 63) - 1)

Check = Callable[[object], Optional[str]]


def _int(v) -> Optional[str]:
    if not isinstance(v, int) or isinstance(v, bool):
        return f"expected an integer, got {v!r:.60}"
    if not INT64[0] <= v <= INT64[1]:
        return f"{v} does not fit a signed 64-bit integer"
    return None


def _str(v) -> Optional[str]:
    return None if isinstance(v, str) else f"expected a string, got {v!r:.60}"


def _opt(check: Check) -> Check:
    return lambda v: None if v is None else check(v)


def _tp_key(k) -> Optional[str]:
    if not isinstance(k, str):
        return f"expected a 'topic:partition' key, got {k!r:.60}"
    topic, sep, part = k.rpartition(":")
    if not sep or not topic or not part.isdigit() or not part.isascii():
        return f"expected a 'topic:partition' key, got {k!r:.60}"
    return None


def _dict_of(key: Check, value: Check) -> Check:
    def check(v) -> Optional[str]:
        if not isinstance(v, dict):
            return f"expected an object, got {v!r:.60}"
        for k, x in v.items():
            bad = key(k) or value(x)
            if bad:
                return f"[{k!r:.60}]: {bad}"
        return None
    return check


def _list_of(item: Check) -> Check:
    def check(v) -> Optional[str]:
        if not isinstance(v, list):
            return f"expected a list, got {v!r:.60}"
        for i, x in enumerate(v):
            bad = item(x)
            if bad:
                return f"[{i}]: {bad}"
        return None
    return check


def _range(v) -> Optional[str]:
    if not isinstance(v, list) or len(v) != 3:
        return f"expected [start, end, leader epoch], got {v!r:.60}"
    return _list_of(_int)(v)


def _record(fields: Dict[str, Tuple[Check, bool]]) -> Check:
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


_REPLICAS = _list_of(_list_of(_str))
_ACL = _record({"principal": (_str, True), "topic": (_str, True), "operation": (_str, True),
                "permission": (_str, True)})

ACTION_FIELDS: Dict[str, Check] = {
    "create_topic": _record({"topic": (_str, True), "topic_id": (_str, True),
                             "partitions": (_int, True), "replicas": (_REPLICAS, True),
                             "configs": (_opt(_dict_of(_str, _str)), False)}),
    "delete_topic": _record({"topic": (_str, True)}),
    "alter_configs": _record({"topic": (_str, True), "set": (_opt(_dict_of(_str, _str)), False),
                              "delete": (_opt(_list_of(_str)), False)}),
    "create_partitions": _record({"topic": (_str, True), "total": (_int, True),
                                  "replicas": (_REPLICAS, True)}),
    "reserve": _record({"txn": (_str, True), "producer": (_str, True),
                        "timeout_ms": (_int, True), "partitions": (_dict_of(_tp_key, _int), True),
                        "principal": (_opt(_str), False)}),
    "commit": _record({"txns": (_list_of(_str), True)}),
    "abort": _record({"txns": (_list_of(_str), True), "reason": (_opt(_str), False)}),
    "set_log_start": _record({"partitions": (_dict_of(_tp_key, _int), True),
                              "principal": (_opt(_str), False),
                              "topic_ids": (_opt(_dict_of(_str, _str)), False),
                              "reason": (_opt(_str), False)}),
    "acl": _record({"add": (_opt(_list_of(_ACL)), False),
                    "remove": (_opt(_list_of(_ACL)), False)}),
}


def check_action(op: str, action: dict) -> Optional[str]:
    check = ACTION_FIELDS.get(op)
    return None if check is None else check(action)


def check_entry(entry) -> Optional[str]:
    """None for a well-formed entry; a message starting with "version" for an unknown version."""
    if not isinstance(entry, dict):
        return f"an entry must be a JSON object, not {type(entry).__name__}"
    version = entry.get("version")
    if version != ENTRY_VERSION:
        return (f"version {version!r:.40} is not one this client knows ({ENTRY_VERSION}); "
                "upgrade pyspark-kafkalog")
    bad = _int(entry.get("timestamp")) if "timestamp" in entry else "field 'timestamp' is missing"
    if bad:
        return f"timestamp: {bad}" if "missing" not in bad else bad
    if not isinstance(entry.get("actions"), list):
        return "field 'actions' must be a list"
    return None


_PARTITION = _record({"next_offset": (_int, True), "log_start_offset": (_int, True),
                      "leader_epoch": (_int, True), "last_producer": (_opt(_str), False),
                      "open": (_dict_of(_str, _range), True),
                      "committed": (_list_of(_range), True),
                      "aborted": (_list_of(_list_of(_int)), False)})
_TOPIC = _record({"topic_id": (_str, True), "partitions": (_int, True),
                  "replicas": (_REPLICAS, True), "configs": (_dict_of(_str, _str), True)})
_TXN = _record({"deadline": (_int, True), "producer": (_str, True),
                "ranges": (_dict_of(_tp_key, _range), True), "seq": (_int, False),
                "timeout_ms": (_int, False)})
_SNAPSHOT = _record({"seq": (_int, True), "timestamp": (_int, True),
                     "topics": (_dict_of(_str, _TOPIC), True),
                     "partitions": (_dict_of(_tp_key, _PARTITION), True),
                     "txns": (_dict_of(_str, _TXN), True),
                     "decided": (_dict_of(_str, _str), True),
                     "acls": (_list_of(_ACL), True),
                     "deleted_topics": (_dict_of(_str, _str), False)})


def snapshot_problem(d) -> Optional[str]:
    if not isinstance(d, dict):
        return f"a snapshot must be a JSON object, not {type(d).__name__}"
    if d.get("version") not in SNAPSHOT_VERSIONS:
        return f"unknown snapshot version {d.get('version')!r:.40}"
    bad = _SNAPSHOT(d)
    if bad:
        return bad
    for topic, info in d["topics"].items():
        if info["partitions"] != len(info["replicas"]):
            return f"topic {topic!r}: {info['partitions']} partitions but " \
                   f"{len(info['replicas'])} replica lists"
        for p in range(info["partitions"]):
            if f"{topic}:{p}" not in d["partitions"]:
                return f"topic {topic!r}: partition {p} has no state"
    return None


def check_snapshot(d) -> None:
    from ..errors import CorruptRecordError
    bad = snapshot_problem(d)
    if bad:
        raise CorruptRecordError(f"snapshot does not hold together: {bad}")
