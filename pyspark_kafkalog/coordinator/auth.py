"""The coordinator's shared secret: where it comes from, and the gRPC interceptor that checks it.

Why a bearer token and not mTLS: every process that may talk to the coordinator (the driver,
executors, operators' CLIs) already shares the cluster's storage credentials, so one more shared
secret from configuration is the smallest thing that keeps strangers on the network out. Why no
unauthenticated mode: a coordinator acts on the cluster (maintenance today, leader elections
with replication); an open port that does that is a bug waiting for a network change, and a
token is one ``secrets.token_hex(32)`` away.

Clients send ``authorization: Bearer <token>`` as gRPC metadata. Tokens are compared with
``hmac.compare_digest`` (constant time), and every refusal is logged at WARNING with the peer
and the method. The token travels in clear text unless the channel is TLS: keep the coordinator
on a private network (docs/operations.md, "Security").
"""
from __future__ import annotations

import hmac
import logging
import os
import stat
from typing import Callable, Optional

import grpc

from ..errors import InvalidConfigError

log = logging.getLogger(__name__)

TOKEN_ENV = "KAFKALOG_COORDINATOR_TOKEN"
METADATA_KEY = "authorization"
SCHEME = "Bearer "
#: shorter secrets are guessable; secrets.token_hex(32) gives 64 characters
MIN_TOKEN_LENGTH = 16
MAKE_ONE = ('make one with: python -c "import secrets; print(secrets.token_hex(32))" > FILE; '
            "chmod 600 FILE")


def read_token_file(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            token = f.read().strip()
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise InvalidConfigError(f"cannot read the coordinator token file {path!r}: "
                                 f"{exc.strerror}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        log.warning("coordinator token file %s is readable by other users (mode %o): "
                    "chmod 600 it", path, stat.S_IMODE(mode))
    if not token:
        raise InvalidConfigError(f"the coordinator token file {path!r} is empty; {MAKE_ONE}")
    return token


def resolve_token(token: Optional[str] = None, token_file: Optional[str] = None) -> str:
    """The token to use: ``token`` if given, else the file's, else ``$KAFKALOG_COORDINATOR_TOKEN``.
    No token is an error: the coordinator never runs (and clients never call) unauthenticated."""
    if token is not None and token_file is not None:
        raise InvalidConfigError("give the coordinator token or a token file, not both")
    if token is None and token_file is not None:
        token = read_token_file(token_file)
    if token is None:
        token = os.environ.get(TOKEN_ENV)
    if token is None or not token.strip():
        raise InvalidConfigError(
            "the coordinator needs a shared token (it refuses every request without it): give "
            f"--token-file FILE (Python: token= or token_file=) or set ${TOKEN_ENV}; {MAKE_ONE}")
    token = token.strip()
    if len(token) < MIN_TOKEN_LENGTH:
        raise InvalidConfigError(f"the coordinator token is {len(token)} characters long; it "
                                 f"needs at least {MIN_TOKEN_LENGTH}; {MAKE_ONE}")
    return token


def call_metadata(token: str):
    """What a client sends with every call."""
    return ((METADATA_KEY, SCHEME + token),)


def _presented(details) -> Optional[str]:
    for key, value in details.invocation_metadata or ():
        if key == METADATA_KEY and isinstance(value, str):
            return value[len(SCHEME):] if value.startswith(SCHEME) else ""
    return None


class TokenInterceptor(grpc.ServerInterceptor):
    """Refuses (``UNAUTHENTICATED``) every call that does not carry the token, before its handler
    runs. ``on_refusal`` counts refusals (the coordinator's metric)."""

    def __init__(self, token: str, on_refusal: Callable[[], None] = lambda: None):
        self._expected = token.encode("utf-8")
        self._on_refusal = on_refusal

    def intercept_service(self, continuation, handler_call_details):
        presented = _presented(handler_call_details)
        if presented is not None and hmac.compare_digest(presented.encode("utf-8"),
                                                         self._expected):
            return continuation(handler_call_details)
        reason = "no token" if presented is None else "wrong token"
        return _refusal(handler_call_details.method, reason, self._on_refusal)


def _refusal(method: str, reason: str, on_refusal):
    """A handler that refuses: the peer is only known to the handler's context, so the refusal
    is logged there. Unary-unary for every method, known or not (an unauthenticated caller
    learns nothing about which methods exist)."""
    def refuse(request, context):
        log.warning("coordinator: refused %s from %s: %s", method, context.peer(), reason)
        on_refusal()
        context.abort(grpc.StatusCode.UNAUTHENTICATED,
                      f"{reason}: send 'authorization: Bearer <token>' metadata")
    return grpc.unary_unary_rpc_method_handler(refuse)
