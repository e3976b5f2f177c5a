"""The coordinator's ``Fetch`` RPC messages (docs/protocol.md §11.4): KIP-227's fetch request
and response as JSON, checked field by field.

A module of its own because both ends use it: the coordinator (``fetch_service``) and its
clients (``fetch_client``), and neither should import the other. Positions are objects with
Kafka's field names rather than bare arrays, so a message reads on its own; full fetches, the
only large messages, are rare. Unknown fields are ignored, so a later version can add some.
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Tuple, Type

from ..errors import InvalidRequestError, KafkaLogError
from .fetch_session import (FINAL_EPOCH, MAX_EPOCH, FetchRequest, FetchResponse,
                            PartitionPosition, TopicPartition)

METHOD = "Fetch"


def position_to_json(pos: Optional[PartitionPosition]) -> Optional[dict]:
    if pos is None:
        return None
    return {"high_watermark": pos.high_watermark, "log_start_offset": pos.log_start_offset,
            "last_stable_offset": pos.last_stable_offset, "error": pos.error,
            "topic_id": pos.topic_id}


def request_to_json(request: FetchRequest) -> dict:
    return {"session_id": request.session_id, "epoch": request.epoch,
            "to_add": [[t, p, position_to_json(pos)] for (t, p), pos in request.to_add.items()],
            "to_forget": [[t, p] for t, p in request.to_forget],
            "privileged": request.privileged,
            "full_partitions": (None if request.full_partitions is None
                                else [[t, p] for t, p in request.full_partitions])}


def response_to_json(response: FetchResponse, metadata_seq: Optional[int] = None) -> dict:
    """``metadata_seq``: the metadata entry the answer is as of (at least); the client's own
    view must reach it before it reads records up to the positions."""
    return {"error": response.error, "error_code": response.error_code,
            "session_id": response.session_id, "next_epoch": response.next_epoch,
            "positions": [[t, p, position_to_json(pos)]
                          for (t, p), pos in response.positions.items()],
            "full": response.full, "metadata_seq": metadata_seq}


class _Reader:
    """Field checks that name the message and the field; ``error`` is what a bad one raises
    (the server refuses a bad request as the client's error; a bad response is the server's)."""

    def __init__(self, what: str, error: Type[KafkaLogError]):
        self.what = what
        self.error = error

    def fail(self, why: str) -> KafkaLogError:
        return self.error(f"{self.what}: {why}")

    def integer(self, value: Any, name: str, lo: int, hi: int = MAX_EPOCH) -> int:
        if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
            raise self.fail(f"{name} must be an integer in [{lo}, {hi}], got {value!r}")
        return value

    def offset(self, value: Any, name: str) -> int:
        # -1: unknown (a partition that does not exist)
        return self.integer(value, name, -1, 2 ** 63 - 1)

    def str_or_none(self, value: Any, name: str) -> Optional[str]:
        if value is not None and not isinstance(value, str):
            raise self.fail(f"{name} must be a string or null, got {value!r}")
        return value

    def array(self, value: Any, name: str) -> list:
        if not isinstance(value, list):
            raise self.fail(f"{name} must be a list, got {type(value).__name__}")
        return value

    def tp(self, item: Any, name: str, arity: int) -> Tuple[TopicPartition, list]:
        if not isinstance(item, list) or len(item) != arity or not isinstance(item[0], str) \
                or not item[0]:
            raise self.fail(f"each of {name} must be [topic, partition"
                            f"{', position' if arity == 3 else ''}], got {item!r}")
        return (item[0], self.integer(item[1], f"the partition of {item[0]!r}", 0)), item[2:]

    def position(self, value: Any, name: str) -> Optional[PartitionPosition]:
        if value is None:
            return None
        if not isinstance(value, dict):
            raise self.fail(f"the position of {name} must be an object or null, got {value!r}")
        return PartitionPosition(
            self.offset(value.get("high_watermark"), f"{name}: high_watermark"),
            self.offset(value.get("log_start_offset"), f"{name}: log_start_offset"),
            self.offset(value.get("last_stable_offset"), f"{name}: last_stable_offset"),
            error=self.str_or_none(value.get("error"), f"{name}: error"),
            topic_id=self.str_or_none(value.get("topic_id"), f"{name}: topic_id"))

    def positions(self, value: Any, name: str) -> Dict[TopicPartition, Optional[PartitionPosition]]:
        out = {}
        for item in self.array(value, name):
            tp, (pos,) = self.tp(item, name, 3)
            out[tp] = self.position(pos, f"{tp[0]}-{tp[1]}")
        return out

    def partitions(self, value: Any, name: str) -> Tuple[TopicPartition, ...]:
        return tuple(self.tp(item, name, 2)[0] for item in self.array(value, name))


def request_from_json(message: Any) -> FetchRequest:
    """The request a client sent; :class:`InvalidRequestError` naming the first bad field."""
    r = _Reader("Fetch request", InvalidRequestError)
    if not isinstance(message, dict):
        raise r.fail("must be a JSON object")
    privileged = message.get("privileged", False)
    if not isinstance(privileged, bool):
        raise r.fail(f"privileged must be true or false, got {privileged!r}")
    full = message.get("full_partitions")
    return FetchRequest(r.integer(message.get("session_id"), "session_id", 0),
                        r.integer(message.get("epoch"), "epoch", FINAL_EPOCH),
                        r.positions(message.get("to_add", []), "to_add"),
                        r.partitions(message.get("to_forget", []), "to_forget"),
                        privileged,
                        None if full is None else r.partitions(full, "full_partitions"))


def response_from_json(message: Any) -> Tuple[FetchResponse, Optional[int]]:
    """The response and its ``metadata_seq``; :class:`KafkaLogError` for a malformed one."""
    r = _Reader("Fetch response", KafkaLogError)
    if not isinstance(message, dict):
        raise r.fail("must be a JSON object")
    full = message.get("full")
    if not isinstance(full, bool):
        raise r.fail(f"full must be true or false, got {full!r}")
    seq = message.get("metadata_seq")
    positions = r.positions(message.get("positions", []), "positions")
    if any(pos is None for pos in positions.values()):
        raise r.fail("every position of a response must be an object")
    return (FetchResponse(r.str_or_none(message.get("error"), "error"),
                          r.integer(message.get("error_code", 0), "error_code", -1, 2 ** 15 - 1),
                          r.integer(message.get("session_id"), "session_id", 0),
                          r.integer(message.get("next_epoch"), "next_epoch", FINAL_EPOCH),
                          positions, full),
            None if seq is None else r.offset(seq, "metadata_seq"))
