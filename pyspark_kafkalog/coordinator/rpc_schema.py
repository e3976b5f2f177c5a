"""The coordinator RPC's schema (``kafkalog_rpc.proto``, docs/protocol.md §11.5): which versions
of which RPC this code speaks, and the mapping between its protobuf messages and the dicts that
handlers take and callers get.

Why handlers keep dicts: older clients still send the JSON bodies of before the schema, and a
handler per RPC that serves both encodings keeps one set of checks (``fetch_wire``,
``quota_service``) instead of two that drift apart. The dicts are exactly those JSON bodies, so a
caller cannot tell which encoding carried them. Every conversion that can meet a bad value says
which RPC and which field, as :class:`InvalidRequestError` (the caller's mistake) or
:class:`KafkaLogError` (a response this client cannot read).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable, Dict, Optional, Type

from google.protobuf.message import DecodeError, Message

from ..errors import InvalidRequestError, KafkaLogError
from . import kafkalog_rpc_pb2 as pb
from .rpc_fetch_schema import (request_from_msg, request_to_msg, response_from_msg,
                               response_to_msg)
from .rpc_fields import bytes_text, get, put, text_bytes

#: the gRPC metadata key that carries a request's version (Kafka's request header api_version);
#: a request without it has a JSON body (the encoding of before the schema)
VERSION_KEY = "kafkalog-api-version"
#: RPCs a client calls without asking ApiVersions first: their version 0 is served by every
#: coordinator that has the schema, for good (``ApiVersions`` itself; ``Ping`` and ``Status``,
#: so that discovery and ``kafkalog coordinator status`` work against any coordinator)
BOOTSTRAP = frozenset({"ApiVersions", "Ping", "Status"})


@dataclass(frozen=True)
class Api:
    name: str
    min_version: int
    max_version: int
    request: Type[Message]
    response: Type[Message]
    request_to_msg: Callable[[dict], Message]      # client
    request_from_msg: Callable[[Message], dict]    # server
    response_to_msg: Callable[[dict], Message]     # server
    response_from_msg: Callable[[Message], dict]   # client

    def decode_request(self, body: bytes, version: int) -> dict:
        """The request's dict; :class:`InvalidRequestError` (one line) for a body that is no
        ``request`` message."""
        try:
            return self.request_from_msg(self.request.FromString(body))
        except (DecodeError, RecursionError, ValueError) as exc:
            why = " ".join(str(exc).split())[:200]
            raise InvalidRequestError(f"{self.name}: the request body is not a "
                                      f"{self.request.DESCRIPTOR.name} version {version} "
                                      f"({why})") from None

    def decode_response(self, body: bytes, address: str) -> dict:
        try:
            return self.response_from_msg(self.response.FromString(body))
        except (DecodeError, RecursionError, ValueError) as exc:
            raise KafkaLogError(f"{self.name} at {address}: the response is not a "
                                f"{self.response.DESCRIPTOR.name} ({exc})") from None


def flat(cls: Type[Message], what: str, error=InvalidRequestError) -> Callable[[dict], Message]:
    return lambda values: put(cls(), values, what, error)


def _status_to_msg(values: dict) -> Message:
    msg = put(pb.StatusResponse(), values, "Status response", KafkaLogError)
    msg.metrics_json = json.dumps(values.get("metrics") or {}, separators=(",", ":"))
    if values.get("maintenance") is not None:
        msg.maintenance.SetInParent()
        msg.maintenance.interval_ms.update(values["maintenance"])
    return msg


def _status_from_msg(msg: Message) -> dict:
    out = get(msg, True)
    del out["metrics_json"]
    out["metrics"] = json.loads(msg.metrics_json) if msg.metrics_json else {}
    out["maintenance"] = (dict(msg.maintenance.interval_ms) if msg.HasField("maintenance")
                          else None)
    return out


def _usage_to_msg(values: dict) -> Message:
    msg = pb.ClientUsageResponse(client_id=text_bytes(values["client_id"]))
    for kind in ("produce", "fetch"):
        usage = values[kind]
        put(getattr(msg, kind), {"quota": usage["quota"], "requests": usage["requests"],
                                 "byte_rate": usage["byte_rate"],
                                 "throttle_time_max_ms": usage[f"{kind}-throttle-time-max"],
                                 "throttle_time_avg_ms": usage[f"{kind}-throttle-time-avg"]},
            "ClientUsage response", KafkaLogError)
    return msg


def _usage_from_msg(msg: Message) -> dict:
    out = {"client_id": bytes_text(msg.client_id)}
    for kind in ("produce", "fetch"):
        usage = getattr(msg, kind)
        out[kind] = {"quota": usage.quota if usage.HasField("quota") else None,
                     "requests": usage.requests, "byte_rate": usage.byte_rate,
                     f"{kind}-throttle-time-max": usage.throttle_time_max_ms,
                     f"{kind}-throttle-time-avg": usage.throttle_time_avg_ms}
    return out


def _versions_to_msg(values: dict) -> Message:
    return pb.ApiVersionsResponse(api_versions=[pb.ApiVersion(**v)
                                                for v in values["api_versions"]])


def _versions_from_msg(msg: Message) -> dict:
    return {"api_versions": [get(v, False) for v in msg.api_versions]}


def _api(name, request, response, request_to_msg=None, request_from_msg=None,
         response_to_msg=None, response_from_msg=None, versions=(0, 0)) -> Api:
    return Api(name, versions[0], versions[1], request, response,
               request_to_msg or flat(request, f"{name} request"),
               request_from_msg or (lambda msg: get(msg, False)),
               response_to_msg or flat(response, f"{name} response", KafkaLogError),
               response_from_msg or (lambda msg: get(msg, True)))


def _fetch_api() -> Api:
    return _api("Fetch", pb.FetchRequest, pb.FetchResponse, request_to_msg, request_from_msg,
                response_to_msg, response_from_msg)


#: every RPC with a schema, by method name: what this code serves and calls
APIS: Dict[str, Api] = {api.name: api for api in (
    _api("ApiVersions", pb.ApiVersionsRequest, pb.ApiVersionsResponse,
         response_to_msg=_versions_to_msg, response_from_msg=_versions_from_msg),
    _api("Ping", pb.PingRequest, pb.PingResponse),
    _api("Status", pb.StatusRequest, pb.StatusResponse, response_to_msg=_status_to_msg,
         response_from_msg=_status_from_msg),
    _api("RecordUsage", pb.RecordUsageRequest, pb.RecordUsageResponse),
    _api("ClientUsage", pb.ClientUsageRequest, pb.ClientUsageResponse,
         response_to_msg=_usage_to_msg, response_from_msg=_usage_from_msg),
    _fetch_api(),
)}


def requested_version(metadata) -> Optional[int]:
    """The version a request's metadata names; None: none (a JSON body)."""
    for key, value in metadata or ():
        if key == VERSION_KEY:
            if not (isinstance(value, str) and value.isdigit() and len(value) <= 5):
                raise InvalidRequestError(f"{VERSION_KEY} must be a version number, got "
                                          f"{value!r}")
            return int(value)
    return None
