"""Where a client's fetch session lives: the active coordinator's cache when there is one, this
process's (``cluster_positions.local_cache``) otherwise. The ``server`` of a
``FetchSessionClient``.

Why fall back instead of failing: a fetch session only saves work, and positions come from the
metadata log either way, so a follower or a streaming query keeps running when no coordinator
is active, none is configured (no token), or the active one stops answering. Switching caches
costs one full fetch: the other cache does not know the session (``FETCH_SESSION_ID_NOT_FOUND``)
and the session client starts a new one by itself.

Why the client's view catches up: the coordinator reads positions from its own view of the
metadata log, which can be newer than this process's, and this process reads records up to those
positions with its own view. Each response says which metadata entry it is as of
(``metadata_seq``), and the source replays up to there before the positions are used.

The connection is kept; after a failure, or while no coordinator is active, the metadata log's
lease is looked at again at most every ``REDISCOVER_S`` (in the state the client already
replayed, so looking costs no request until a coordinator is there to ask).
"""
from __future__ import annotations

import logging
import os
import time
from typing import Callable, Optional

from ..cluster.lease import current_lease
from ..errors import CoordinatorAuthenticationError, KafkaLogError, UnsupportedVersionError
from .cluster_positions import local_cache
from .fetch_session import FetchRequest, FetchResponse
from .fetch_wire import METHOD, request_to_json, response_from_json

log = logging.getLogger(__name__)

#: how long a client works with its local cache before it looks for a coordinator again
REDISCOVER_S = 5.0
#: the Fetch RPC is on a query's planning path: a coordinator that does not answer in this
#: long is skipped for the local cache
FETCH_TIMEOUT_S = 5.0
#: auth.TOKEN_ENV, named here so that a process without a token never imports gRPC
_TOKEN_ENV = "KAFKALOG_COORDINATOR_TOKEN"


def _falls_back(exc: KafkaLogError) -> bool:
    """Errors that mean "this coordinator cannot serve the session now": none active or
    answering, not the active one, an older coordinator without ``Fetch``, trouble on its side
    (retriable), or a refused token (logged, as the token is then wrong)."""
    return exc.retriable or isinstance(exc, (CoordinatorAuthenticationError,
                                             UnsupportedVersionError))


class SessionServer:
    """``fetch(request, source)`` for one client. Not thread safe (one per session client).

    ``token`` / ``token_file``: the coordinator's token, else ``$KAFKALOG_COORDINATOR_TOKEN``;
    with none at all, the session stays local. ``local``: the cache to fall back to."""

    def __init__(self, cluster, *, token: Optional[str] = None,
                 token_file: Optional[str] = None, local=None,
                 rediscover_s: float = REDISCOVER_S, timeout_s: float = FETCH_TIMEOUT_S,
                 clock: Callable[[], float] = time.monotonic):
        self.cluster = cluster
        self._token, self._token_file = token, token_file
        self._configured = (token is not None or token_file is not None
                            or bool(os.environ.get(_TOKEN_ENV, "").strip()))
        self.local = local if local is not None else local_cache()
        self.rediscover_s = rediscover_s
        self.timeout_s = timeout_s
        self._clock = clock
        self._client = None
        self._next_look = 0.0
        self._said = False          # working locally was logged (once until connected)
        #: test-visible: requests each cache answered
        self.remote_fetches = self.local_fetches = 0

    @property
    def address(self) -> Optional[str]:
        """The coordinator the session is served by; None while it is local."""
        return self._client.address if self._client is not None else None

    def fetch(self, request: FetchRequest, source) -> FetchResponse:
        client = self._connected(source)
        if client is not None:
            try:
                reply = client.call(METHOD, request_to_json(request))
            except KafkaLogError as exc:
                if not _falls_back(exc):
                    raise
                self._lost(exc)
            else:
                response, seq = response_from_json(reply)
                catch_up = getattr(source, "catch_up", None)
                if response.error is None and catch_up is not None:
                    catch_up(seq)
                self.remote_fetches += 1
                return response
        self.local_fetches += 1
        return self.local.fetch(request, source)

    def _connected(self, source):
        if self._client is not None or not self._configured:
            return self._client
        now = self._clock()
        if now < self._next_look:
            return None
        self._next_look = now + self.rediscover_s
        state = getattr(source, "state", None)
        if state is not None:
            lease = current_lease(state)
            if lease is None or not lease.holder or not lease.address \
                    or self.cluster.now_ms() >= lease.expires_ms:
                self._local("no coordinator is active")
                return None
        from .discovery import connect     # gRPC only once there is a coordinator to call
        try:
            self._client = connect(self.cluster, self._token, token_file=self._token_file,
                                   timeout_s=self.timeout_s, state=state)
        except KafkaLogError as exc:
            self._local(str(exc), warn=not exc.retriable)
            return None
        log.info("fetch sessions served by the coordinator at %s", self._client.address)
        self._said = False
        return self._client

    def _lost(self, exc: KafkaLogError) -> None:
        """The coordinator failed a call: local for this request; the next one looks again at
        once (a failover names the new coordinator right away), then every ``rediscover_s``."""
        client, self._client = self._client, None
        self._next_look = self._clock()
        self._local(f"the coordinator at {client.address} failed: {exc}",
                    warn=not exc.retriable)
        client.close()

    def _local(self, why: str, warn: bool = False) -> None:
        """Say why the session is local, once (a token that is refused or unusable: WARNING,
        every time the coordinator is looked for, since it is a mistake to fix)."""
        if warn or not self._said:
            log.log(logging.WARNING if warn else logging.INFO,
                    "fetch sessions served by this process: %s", why)
            self._said = True

    def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            client.close()
