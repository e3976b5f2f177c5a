"""``Fetch``'s protobuf messages (``kafkalog_rpc.proto``) to and from the JSON-shaped dicts of
``fetch_wire``.

Why through those dicts: ``fetch_wire`` checks every field of a request (ranges, empty topics,
privilege) and of a response; the protobuf types only say "an int32", so the server still runs
``request_from_json`` on what it decoded, and the client ``response_from_json``. Presence is kept
(``optional`` fields, ``full_partitions`` as a message) so that a missing field and a null one
mean what they meant in JSON.
"""
from __future__ import annotations

from typing import Any, Optional

from google.protobuf.message import Message

from ..errors import InvalidRequestError, KafkaLogError
from . import kafkalog_rpc_pb2 as pb
from .rpc_fields import get, put


def _fill(entry: Message, item: Any, what: str, error, arity: int) -> None:
    if not isinstance(item, (list, tuple)) or len(item) != arity:
        raise error(f"{what}: each entry must be [topic, partition"
                    f"{', position' if arity == 3 else ''}], got {item!r}")
    put(entry, {"topic": item[0], "partition": item[1]}, what, error)
    if arity == 3 and item[2] is not None:
        if not isinstance(item[2], dict):
            raise error(f"{what}: the position of {item[0]}-{item[1]} must be an object or "
                        f"null, got {item[2]!r}")
        entry.position.SetInParent()
        put(entry.position, item[2], what, error)


def _entries(repeated, items: Any, what: str, error, arity: int) -> None:
    if items is None:
        return
    if not isinstance(items, (list, tuple)):
        raise error(f"{what} must be a list, got {type(items).__name__}")
    for item in items:
        _fill(repeated.add(), item, what, error, arity)


def _position(entry: Message) -> Optional[dict]:
    return get(entry.position, True) if entry.HasField("position") else None


def request_to_msg(values: dict) -> Message:
    msg = put(pb.FetchRequest(), values, "Fetch request")
    _entries(msg.to_add, values.get("to_add"), "Fetch request: to_add", InvalidRequestError, 3)
    _entries(msg.to_forget, values.get("to_forget"), "Fetch request: to_forget",
             InvalidRequestError, 2)
    if values.get("full_partitions") is not None:
        msg.full_partitions.SetInParent()
        _entries(msg.full_partitions.partitions, values["full_partitions"],
                 "Fetch request: full_partitions", InvalidRequestError, 2)
    return msg


def request_from_msg(msg: Message) -> dict:
    out = get(msg, False)
    out["to_add"] = [[e.topic, e.partition, _position(e)] for e in msg.to_add]
    out["to_forget"] = [[e.topic, e.partition] for e in msg.to_forget]
    out["full_partitions"] = ([[e.topic, e.partition] for e in msg.full_partitions.partitions]
                              if msg.HasField("full_partitions") else None)
    return out


def response_to_msg(values: dict) -> Message:
    msg = put(pb.FetchResponse(), values, "Fetch response", KafkaLogError)
    _entries(msg.positions, values.get("positions"), "Fetch response: positions",
             KafkaLogError, 3)
    return msg


def response_from_msg(msg: Message) -> dict:
    out = get(msg, True)
    out["positions"] = [[e.topic, e.partition, _position(e)] for e in msg.positions]
    return out
