"""The shape of a flat snapshot (docs/protocol.md §2), checked before a state is built from it:
a snapshot is derived data, and one that does not hold together must be skipped, not half
loaded."""
from __future__ import annotations

from typing import Optional

from .actions import (ACL, REPLICAS, check_int, check_range, check_str, check_tp_key, dict_of,
                      list_of, optional, record_of)

SNAPSHOT_VERSIONS = (1, 2)


def _replication(v) -> Optional[str]:
    from .partition_state import check_replication
    return None if check_replication(v) else f"not a replication state: {v!r:.60}"


_PARTITION = record_of({"next_offset": (check_int, True), "log_start_offset": (check_int, True),
                      "leader_epoch": (check_int, True), "last_producer": (optional(check_str), False),
                      "open": (dict_of(check_str, check_range), True),
                      "committed": (list_of(check_range), True),
                      "aborted": (list_of(list_of(check_int)), False),
                      "replication": (_replication, False)})
_TOPIC = record_of({"topic_id": (check_str, True), "partitions": (check_int, True),
                  "replicas": (REPLICAS, True), "configs": (dict_of(check_str, check_str), True)})
_TXN = record_of({"deadline": (check_int, True), "producer": (check_str, True),
                "ranges": (dict_of(check_tp_key, check_range), True), "seq": (check_int, False),
                "timeout_ms": (check_int, False)})
_LEASE = record_of({"epoch": (check_int, True), "holder": (check_str, True),
                   "address": (check_str, True), "lease_ms": (check_int, True),
                   "renewed_ms": (check_int, True)})
_LOG_DIR = record_of({"url": (check_str, True), "directory_id": (check_str, True),
                     "storage_options": (dict_of(check_str, check_str), True),
                     "added": (check_int, True)})
_SNAPSHOT_FIELDS = {"seq": (check_int, True), "timestamp": (check_int, True),
                   "topics": (dict_of(check_str, _TOPIC), True),
                   "partitions": (dict_of(check_tp_key, _PARTITION), True),
                   "txns": (dict_of(check_str, _TXN), True),
                   "decided": (dict_of(check_str, check_str), True),
                   "acls": (list_of(ACL), True),
                   "deleted_topics": (dict_of(check_str, check_str), False),
                   "sinks": (dict_of(check_str, check_int), False),
                   "segment_merges": (optional(dict_of(check_tp_key, check_int)), False),
                   "cleaner_checkpoints": (optional(dict_of(check_tp_key, check_int)), False),
                   "coordinator": (optional(_LEASE), False),
                   "log_dirs": (optional(dict_of(check_str, _LOG_DIR)), False),
                   "client_quotas": (optional(dict_of(check_str, dict_of(check_str, check_str))),
                                     False),
                   "reader_features": (list_of(check_str), False),
                   "writer_features": (list_of(check_str), False)}
_SNAPSHOT = record_of(_SNAPSHOT_FIELDS)
_SNAPSHOT_NO_PARTITIONS = record_of({k: v for k, v in _SNAPSHOT_FIELDS.items()
                                     if k != "partitions"})


def snapshot_problem(d, partitions_checked: bool = False) -> Optional[str]:
    """``partitions_checked``: the partition states come from a manifest's parts (built and
    shape-checked row by row), so only the rest is looked at here."""
    if not isinstance(d, dict):
        return f"a snapshot must be a JSON object, not {type(d).__name__}"
    if d.get("version") not in SNAPSHOT_VERSIONS:
        return f"unknown snapshot version {d.get('version')!r:.40}"
    bad = (_SNAPSHOT_NO_PARTITIONS if partitions_checked else _SNAPSHOT)(d)
    if bad:
        return bad
    for topic, info in d["topics"].items():
        if info["partitions"] != len(info["replicas"]):
            return f"topic {topic!r}: {info['partitions']} partitions but " \
                   f"{len(info['replicas'])} replica lists"
        if partitions_checked:
            continue
        for p in range(info["partitions"]):
            if f"{topic}:{p}" not in d["partitions"]:
                return f"topic {topic!r}: partition {p} has no state"
    return None


def check_snapshot(d, partitions_checked: bool = False) -> None:
    from ..errors import CorruptRecordError
    bad = snapshot_problem(d, partitions_checked)
    if bad:
        raise CorruptRecordError(f"snapshot does not hold together: {bad}")
