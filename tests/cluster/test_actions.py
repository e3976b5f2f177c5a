"""Every metadata action through ``ClusterState.apply`` directly, valid and invalid, with the
result expected (docs/protocol.md §2.2): table-driven, no storage."""
from __future__ import annotations

import json

import pytest

from pyspark_kafkalog.cluster import actions as A
from pyspark_kafkalog.cluster.state import ClusterState
from pyspark_kafkalog.errors import CorruptRecordError, UnsupportedVersionError

TS = 1_000_000


def base() -> ClusterState:
    """Topic t (2 partitions), an open txn o1 on t:0 (3 offsets), a committed c1 on t:1."""
    s = ClusterState()
    for action in [A.CreateTopic(topic="t", topic_id="id-t", partitions=2,
                                 replicas=[["logdir-0"], ["logdir-0"]]),
                   A.Reserve(txn="c1", producer="p", timeout_ms=10_000, partitions={"t:1": 2}),
                   A.Commit(txns=["c1"]),
                   A.Reserve(txn="o1", producer="p", timeout_ms=10_000, partitions={"t:0": 3})]:
        apply(s, action)
        assert s.results[s.seq][0].ok, s.results[s.seq][0]
    return s


def apply(s: ClusterState, action, ts: int = TS):
    raw = action.to_json() if isinstance(action, A.Action) else action
    s.apply(s.seq + 1, {"version": 1, "writer": "w", "timestamp": ts, "actions": [raw]})
    return s.results[s.seq][0]


CASES = [
    # (name, action, expected error, check on the state after)
    ("create", A.CreateTopic(topic="u", topic_id="id-u", partitions=1, replicas=[["d"]]),
     "NONE", lambda s: s.partition("u", 0).next_offset == 0),
    ("create exists", A.CreateTopic(topic="t", topic_id="x", partitions=1, replicas=[["d"]]),
     "TOPIC_ALREADY_EXISTS", None),
    ("create other", A.CreateTopic(topic="a.b", topic_id="x", partitions=1, replicas=[["d"]]),
     "NONE", None),
    ("create bad name", A.CreateTopic(topic="a/b", topic_id="x", partitions=1, replicas=[["d"]]),
     "INVALID_TOPIC_EXCEPTION", None),
    ("create 0 partitions", A.CreateTopic(topic="u", topic_id="x", partitions=0, replicas=[]),
     "INVALID_PARTITIONS", None),
    ("create replicas", A.CreateTopic(topic="u", topic_id="x", partitions=2, replicas=[["d"]]),
     "INVALID_REPLICA_ASSIGNMENT", None),
    ("create config", A.CreateTopic(topic="u", topic_id="x", partitions=1, replicas=[["d"]],
                                    configs={"retention.ms": "soon"}), "INVALID_CONFIG", None),
    ("create typed", {"op": "create_topic", "topic": "u", "topic_id": "x", "partitions": "1",
                      "replicas": [["d"]]}, "INVALID_REQUEST", lambda s: "u" not in s.topics),
    ("delete", A.DeleteTopic(topic="t"), "NONE",
     lambda s: "t" not in s.topics and s.deleted_topics == {"id-t": "t"} and not s.txns
     and s.decided["o1"] == "aborted"),
    ("delete unknown", A.DeleteTopic(topic="nope"), "UNKNOWN_TOPIC_OR_PARTITION", None),
    ("alter", A.AlterConfigs(topic="t", set={"retention.ms": "5"}), "NONE",
     lambda s: s.topics["t"]["configs"] == {"retention.ms": "5"}),
    ("alter invalid", A.AlterConfigs(topic="t", set={"segment.bytes": "1"}),
     "INVALID_CONFIG", lambda s: s.topics["t"]["configs"] == {}),
    ("alter unknown", A.AlterConfigs(topic="x"), "UNKNOWN_TOPIC_OR_PARTITION", None),
    ("partitions", A.CreatePartitions(topic="t", total=3, replicas=[["d"]]), "NONE",
     lambda s: s.topics["t"]["partitions"] == 3 and s.partition("t", 2) is not None),
    ("partitions fewer", A.CreatePartitions(topic="t", total=2, replicas=[]),
     "INVALID_PARTITIONS", None),
    ("partitions replicas", A.CreatePartitions(topic="t", total=4, replicas=[["d"]]),
     "INVALID_REPLICA_ASSIGNMENT", None),
    ("reserve", A.Reserve(txn="r", producer="q", timeout_ms=5, partitions={"t:0": 2}), "NONE",
     lambda s: s.txns["r"]["ranges"] == {"t:0": [3, 5, 1]} and s.txns["r"]["deadline"] == TS + 5
     and s.partition("t", 0).high_watermark == 0),
    ("reserve twice", A.Reserve(txn="o1", producer="q", timeout_ms=5, partitions={"t:0": 1}),
     "INVALID_TXN_STATE", None),
    ("reserve decided", A.Reserve(txn="c1", producer="q", timeout_ms=5, partitions={"t:0": 1}),
     "INVALID_TXN_STATE", None),
    ("reserve empty", A.Reserve(txn="r", producer="q", timeout_ms=5, partitions={}),
     "INVALID_REQUEST", None),
    ("reserve unknown", A.Reserve(txn="r", producer="q", timeout_ms=5, partitions={"t:9": 1}),
     "UNKNOWN_TOPIC_OR_PARTITION", None),
    ("reserve zero", A.Reserve(txn="r", producer="q", timeout_ms=5, partitions={"t:0": 0}),
     "INVALID_REQUEST", lambda s: s.partition("t", 0).next_offset == 3),
    ("reserve negative timeout", A.Reserve(txn="r", producer="q", timeout_ms=-1,
                                           partitions={"t:0": 1}), "INVALID_REQUEST", None),
    ("reserve typed", {"op": "reserve", "txn": "r", "producer": "q", "timeout_ms": "abc",
                       "partitions": {"t:0": 1}}, "INVALID_REQUEST",
     lambda s: "r" not in s.txns and s.partition("t", 0).next_offset == 3),
    ("reserve key", {"op": "reserve", "txn": "r", "producer": "q", "timeout_ms": 1,
                     "partitions": {"t-0": 1}}, "INVALID_REQUEST", None),
    ("commit", A.Commit(txns=["o1"]), "NONE",
     lambda s: s.partition("t", 0).high_watermark == 3 and s.decided["o1"] == "committed"),
    ("commit again", A.Commit(txns=["c1"]), "NONE", None),
    ("commit late", A.Commit(txns=["o1"]), "FENCED_LEADER_EPOCH", lambda s: "o1" in s.txns),
    ("commit unknown", A.Commit(txns=["o1", "zz"]), "INVALID_TXN_STATE",
     lambda s: "o1" in s.txns),
    ("abort", A.Abort(txns=["o1", "c1", "zz"]), "NONE",
     lambda s: s.partition("t", 0).aborted == [[0, 3]] and s.partition("t", 0).high_watermark == 3
     and s.results[s.seq][0].skipped == {"c1": "committed", "zz": "unknown"}),
    ("log start", A.SetLogStart(partitions={"t:1": 1}, principal="User:a"), "NONE",
     lambda s: s.partition("t", 1).log_start_offset == 1
     and s.results[s.seq][0].partitions["t:1"].low_watermark == 1),
    ("log start hw", A.SetLogStart(partitions={"t:1": -1}), "NONE",
     lambda s: s.partition("t", 1).log_start_offset == 2),
    ("log start past hw", A.SetLogStart(partitions={"t:1": 3}), "NONE",
     lambda s: s.results[s.seq][0].partitions["t:1"].error == "OFFSET_OUT_OF_RANGE"),
    ("log start recreated", A.SetLogStart(partitions={"t:1": 1}, topic_ids={"t": "old"}),
     "NONE", lambda s: s.results[s.seq][0].partitions["t:1"].error
     == "UNKNOWN_TOPIC_OR_PARTITION" and s.partition("t", 1).log_start_offset == 0),
    ("acl", A.AclChange(add=[{"principal": "User:a", "topic": "t", "operation": "WRITE",
                              "permission": "DENY"}]), "NONE",
     lambda s: not s.authorized("User:a", "t", "WRITE")),
    ("acl bad", A.AclChange(add=[{"principal": "User:a", "topic": "t", "operation": "WRITE",
                                  "permission": "MAYBE"}]), "INVALID_REQUEST",
     lambda s: s.acls == []),
    ("features", A.EnableFeatures(writer_features=["x"]), "NONE",
     lambda s: s.writer_features == ["x"] and s.unwritable_features() == ["x"]),
]


@pytest.mark.parametrize("name,action,expected,check", CASES, ids=[c[0] for c in CASES])
def test_action(name, action, expected, check):
    s = base()
    ts = TS + 20_000 if name == "commit late" else TS
    before = json.dumps(s.to_snapshot(), sort_keys=True)
    result = apply(s, action, ts)
    assert result.error == expected, result
    if expected not in ("NONE",) and name not in ("commit again",):
        after = s.to_snapshot()
        after["seq"], after["timestamp"] = json.loads(before)["seq"], json.loads(before)["timestamp"]
        assert json.dumps(after, sort_keys=True) == before    # rejected: nothing changed
    if check is not None:
        assert check(s)


def test_every_action_round_trips_through_json():
    for _, action, _, _ in CASES:
        if isinstance(action, A.Action):
            again = A.parse_action(json.loads(json.dumps(action.to_json())))
            assert again == action


@pytest.mark.parametrize("entry,error", [
    ({"version": 1, "timestamp": 1, "actions": [{"op": "frobnicate_partitions"}]},
     UnsupportedVersionError),
    ({"version": 1, "timestamp": 1, "actions": [{"op": "commit", "txns": [], "isr": []}]},
     UnsupportedVersionError),
    ({"version": 1, "timestamp": 1, "actions": [{"op": "protocol", "reader_features": ["x"]}]},
     UnsupportedVersionError),
    ({"version": 3, "timestamp": 1, "actions": []}, UnsupportedVersionError),
    ({"version": 1, "timestamp": True, "actions": []}, CorruptRecordError),
    ({"version": 1, "timestamp": 1.5, "actions": []}, CorruptRecordError),
    ({"version": 1, "timestamp": 1, "actions": {}}, CorruptRecordError),
])
def test_entries_that_stop_the_replay(entry, error):
    s = base()
    before = json.dumps(s.to_snapshot(), sort_keys=True)
    with pytest.raises(error):
        s.apply(s.seq + 1, entry)
    assert json.dumps(s.to_snapshot(), sort_keys=True) == before
