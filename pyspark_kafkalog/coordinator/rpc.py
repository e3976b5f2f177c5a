"""The coordinator's RPC: gRPC, server and client (docs/protocol.md §11.5).

A request whose metadata names its version (``kafkalog-api-version``) has a protobuf body of
that version (``kafkalog_rpc.proto``, ``rpc_schema``); one without has a JSON body, the encoding
of before the schema, which older clients still send and methods added without a schema
(``add_method``) use. Both reach the same handler as the same dict. A client asks
``ApiVersions`` once per connection before its first other call, and refuses with
``UNSUPPORTED_VERSION`` what the coordinator does not serve, before sending it.

Typed errors cross the wire as a status code plus the Kafka error name in the trailing metadata
``kafkalog-error``; the client raises the same typed error. A method registered ``mutating`` is
refused with ``NOT_CONTROLLER`` unless this process is the active coordinator at that moment, so
a standby or a fenced coordinator never acts on a request.
"""
from __future__ import annotations

import json
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Dict, Optional, Tuple

import grpc

from ..errors import (CoordinatorAuthenticationError, CoordinatorNotAvailableError,
                      InvalidConfigError, InvalidRequestError, KafkaLogError, NotControllerError,
                      UnsupportedVersionError, error_for)
from .auth import TokenInterceptor, call_metadata
from .rpc_schema import APIS, BOOTSTRAP, VERSION_KEY, requested_version

log = logging.getLogger(__name__)

SERVICE = "kafkalog.coordinator.Coordinator"
ERROR_KEY = "kafkalog-error"
DEFAULT_TIMEOUT_S = 10.0
MAX_WORKERS = 8


def encode(obj) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode("utf-8")


def decode(data: bytes):
    return json.loads(data) if data else {}


@dataclass(frozen=True)
class _Malformed:
    """A request body that is no JSON object, and why."""
    problem: str


def decode_request(data: bytes):
    """The server's request deserializer: the JSON object (an empty body is ``{}``), or a
    :class:`_Malformed` naming what is wrong, which the call answers with INVALID_ARGUMENT
    (``INVALID_REQUEST``). It never raises nor returns None: gRPC would answer either with
    INTERNAL, "Exception deserializing request!", and log a traceback for the former."""
    if not data:
        return {}
    try:
        obj = json.loads(data)
    except RecursionError:
        return _Malformed("the request body is not JSON this server reads (nested too deep)")
    except ValueError as exc:              # not UTF-8, or not JSON
        return _Malformed(f"the request body is not JSON ({str(exc)[:200]})")
    if not isinstance(obj, dict):
        kind = ("null" if obj is None else "a boolean" if isinstance(obj, bool)
                else "a number" if isinstance(obj, (int, float))
                else "a string" if isinstance(obj, str) else "an array")
        return _Malformed(f"the request body must be a JSON object, got {kind}")
    return obj


def method_path(name: str) -> str:
    return f"/{SERVICE}/{name}"


@dataclass(frozen=True)
class Method:
    handler: Callable[[dict], dict]
    mutating: bool


def _status_for(exc: KafkaLogError) -> grpc.StatusCode:
    if isinstance(exc, NotControllerError):
        return grpc.StatusCode.FAILED_PRECONDITION
    if isinstance(exc, UnsupportedVersionError):
        return grpc.StatusCode.UNIMPLEMENTED
    if exc.user_error:
        return grpc.StatusCode.INVALID_ARGUMENT
    return grpc.StatusCode.UNAVAILABLE if exc.retriable else grpc.StatusCode.INTERNAL


class _Dispatch(grpc.GenericRpcHandler):
    def __init__(self, server: "RpcServer"):
        self._server = server

    def service(self, handler_call_details):
        prefix = f"/{SERVICE}/"
        name = handler_call_details.method
        if not name.startswith(prefix):
            return None
        method = self._server.methods.get(name[len(prefix):])
        if method is None:
            return None
        # bytes in and out: which encoding a body has is in the call's metadata
        return grpc.unary_unary_rpc_method_handler(
            lambda request, context: self._server.call(name, method, request, context))


class RpcServer:
    """A gRPC server whose every call must carry ``token``. ``is_active`` is asked on every
    call of a mutating method; ``on_refusal`` counts refused tokens."""

    def __init__(self, bind: str, token: str, *, is_active: Callable[[], bool],
                 on_refusal: Callable[[], None] = lambda: None, max_workers: int = MAX_WORKERS):
        self.methods: Dict[str, Method] = {}
        self._is_active = is_active
        self._server = grpc.server(ThreadPoolExecutor(max_workers, thread_name_prefix="kl-rpc"),
                                   interceptors=[TokenInterceptor(token, on_refusal)])
        self._server.add_generic_rpc_handlers([_Dispatch(self)])
        try:
            self.port = self._server.add_insecure_port(bind)
        except RuntimeError as exc:
            raise InvalidConfigError(f"the coordinator cannot listen on {bind!r}: {exc}") from None
        if not self.port:
            raise InvalidConfigError(f"the coordinator cannot listen on {bind!r}")
        self.add_method("ApiVersions", self._api_versions)

    def _api_versions(self, request: dict) -> dict:
        """What this server serves with a schema now (a method added later is listed once
        added)."""
        return {"api_versions": [{"name": name, "min_version": APIS[name].min_version,
                                  "max_version": APIS[name].max_version}
                                 for name in list(self.methods) if name in APIS]}

    def add_method(self, name: str, handler: Callable[[dict], dict], *,
                   mutating: bool = False) -> None:
        self.methods[name] = Method(handler, mutating)

    def call(self, path: str, method: Method, body: bytes, context):
        name = path.rpartition('/')[2]
        try:
            version = requested_version(context.invocation_metadata())
            api = APIS.get(name) if version is not None else None
            if api is None:                               # a JSON body
                request = decode_request(body)
                if isinstance(request, _Malformed):
                    raise InvalidRequestError(f"{name}: {request.problem}")
            elif not api.min_version <= version <= api.max_version:
                raise UnsupportedVersionError(
                    f"{name} version {version} is not served here (versions "
                    f"{api.min_version} to {api.max_version}; ask ApiVersions)")
            else:
                request = api.decode_request(body, version)
            if method.mutating and not self._is_active():
                raise NotControllerError("this coordinator is not the active one (standby or "
                                         "fenced); ask the one the metadata log names")
            response = method.handler(request)
            if api is None:
                return encode(response)
            # says the body is protobuf: a client of Ping or Status cannot tell otherwise
            context.send_initial_metadata(((VERSION_KEY, str(version)),))
            return api.response_to_msg(response).SerializeToString()
        except KafkaLogError as exc:
            context.set_trailing_metadata(((ERROR_KEY, exc.error_name),))
            context.abort(_status_for(exc), str(exc))

    def start(self) -> None:
        self._server.start()

    def stop(self, grace_s: Optional[float] = 1.0) -> None:
        self._server.stop(grace_s).wait()


class CoordinatorClient:
    """Calls one coordinator at ``address``. Errors are typed: a refused token is
    :class:`CoordinatorAuthenticationError`, a coordinator that does not answer is
    :class:`CoordinatorNotAvailableError`, and the server's own typed errors come back as
    themselves. ``lease``: the lease that named this address, when found through discovery."""

    def __init__(self, address: str, token: str, *, timeout_s: float = DEFAULT_TIMEOUT_S,
                 lease=None):
        self.address = address
        self.lease = lease
        self.timeout_s = timeout_s
        self._metadata = call_metadata(token)
        self._channel = grpc.insecure_channel(address)
        self._served: Optional[Dict[str, Tuple[int, int]]] = None
        self._lock = threading.Lock()

    def call(self, name: str, request: Optional[dict] = None) -> dict:
        """``name``'s answer to ``request`` (dicts shaped as docs/protocol.md's tables): with
        the RPC's protobuf messages, at the highest version both sides serve, for an RPC with a
        schema; as JSON for any other."""
        api = APIS.get(name)
        if api is None:
            stub = self._channel.unary_unary(method_path(name), request_serializer=encode,
                                             response_deserializer=decode)
            try:
                return stub(request or {}, timeout=self.timeout_s, metadata=self._metadata)
            except grpc.RpcError as exc:
                raise self._typed(name, exc) from None
        version = api.max_version if name in BOOTSTRAP else self._version(name)
        body = api.request_to_msg(request or {}).SerializeToString()
        stub = self._channel.unary_unary(method_path(name))
        try:
            reply, call = stub.with_call(body, timeout=self.timeout_s,
                                         metadata=self._metadata + ((VERSION_KEY, str(version)),))
        except grpc.RpcError as exc:
            raise self._typed(name, exc) from None
        if not any(key == VERSION_KEY for key, _ in call.initial_metadata() or ()):
            # a coordinator older than the schema read the empty body of a bootstrap RPC as
            # JSON ({}), and answered in JSON
            return decode(reply)
        return api.decode_response(reply, self.address)

    def api_versions(self) -> Dict[str, Tuple[int, int]]:
        """{RPC: (min, max version)} the coordinator serves, asked once per client (one
        channel: one coordinator process, as discovery checks its epoch)."""
        with self._lock:
            if self._served is None:
                try:
                    reply = self.call("ApiVersions")
                except UnsupportedVersionError:
                    raise UnsupportedVersionError(
                        f"the coordinator at {self.address} is older than ApiVersions; this "
                        "client does not guess what it serves: upgrade it") from None
                self._served = {v["name"]: (v["min_version"], v["max_version"])
                                for v in reply["api_versions"]}
            return self._served

    def _version(self, name: str) -> int:
        """The highest version of ``name`` both sides serve; :class:`UnsupportedVersionError`
        when there is none."""
        api = APIS[name]
        served = self.api_versions().get(name)
        if served is None:
            raise UnsupportedVersionError(f"the coordinator at {self.address} does not serve "
                                          f"{name}")
        low, high = max(served[0], api.min_version), min(served[1], api.max_version)
        if low > high:
            raise UnsupportedVersionError(
                f"the coordinator at {self.address} serves {name} versions {served[0]} to "
                f"{served[1]}, this client {api.min_version} to {api.max_version}")
        return high

    def _typed(self, name: str, exc: grpc.RpcError) -> KafkaLogError:
        code, details = exc.code(), exc.details()
        for key, value in exc.trailing_metadata() or ():
            if key == ERROR_KEY:
                return error_for(value, details)
        if code == grpc.StatusCode.UNAUTHENTICATED:
            return CoordinatorAuthenticationError(
                f"the coordinator at {self.address} refused the token ({details}); check "
                "--token-file / $KAFKALOG_COORDINATOR_TOKEN")
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            return CoordinatorNotAvailableError(
                f"the coordinator at {self.address} does not answer {name} "
                f"({code.name}: {details})")
        if code == grpc.StatusCode.UNIMPLEMENTED:   # an older coordinator, without the method
            return UnsupportedVersionError(f"the coordinator at {self.address} does not serve "
                                           f"{name}")
        return KafkaLogError(f"{name} at {self.address} failed: {code.name}: {details}")

    def status(self) -> dict:
        return self.call("Status")

    def ping(self) -> dict:
        return self.call("Ping")

    def close(self) -> None:
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
