"""The coordinator's side of client quotas (KIP-13, docs/protocol.md §12): the RPC method
``RecordUsage`` that a client calls with the bytes it produced or is about to fetch, answered
with how long it must wait.

One coordinator sees every client of a cluster, so a client id's quota holds across every task
of every job that uses it, wherever they run. The quotas are read from the metadata log at most
once per quota window, so a change takes effect within one window, without a restart.
"""
from __future__ import annotations

import threading
import time
from typing import Callable, Mapping, Optional

from ..cluster.quotas import FETCH, LONG_MAX, MAX_CLIENT_ID, PRODUCE, quota_for
from ..errors import InvalidRequestError
from .quota_manager import DEFAULT_WINDOW_NUM, DEFAULT_WINDOW_SIZE_S, QuotaManager

KINDS = (PRODUCE, FETCH)


class QuotaService:
    def __init__(self, cluster, *, defaults: Optional[Mapping[str, float]] = None,
                 window_num: int = DEFAULT_WINDOW_NUM,
                 window_size_s: float = DEFAULT_WINDOW_SIZE_S,
                 clock: Callable[[], float] = time.monotonic, on_usage=None):
        """``defaults``: KIP-13's ``quota.producer.default`` / ``quota.consumer.default`` as
        {produce|fetch: bytes per second}; ``on_usage(client_id, kind, nbytes, delay_s)`` lets
        the service count it in its metrics."""
        self.cluster = cluster
        self.defaults = dict(defaults or {})
        self.clock = clock
        self.on_usage = on_usage
        self.manager = QuotaManager(self._quota, window_num=window_num,
                                    window_size_s=window_size_s)
        self._quotas: Mapping[str, Mapping[str, str]] = {}
        self._read_at: Optional[float] = None
        self._lock = threading.Lock()

    def _quota(self, client_id: str, kind: str) -> Optional[float]:
        return quota_for(self._quotas, client_id, kind, self.defaults)

    def _refresh(self, now: float) -> None:
        with self._lock:
            if self._read_at is not None and now - self._read_at < self.manager.window_size_s:
                return
            self._quotas = self.cluster.state().client_quotas
            self._read_at = now

    def record_usage(self, request: dict) -> dict:
        """RPC ``RecordUsage{client_id, kind: produce|fetch, bytes}`` -> ``{throttle_ms,
        quota}``: the client counts its bytes and waits ``throttle_ms`` (a producer after its
        write, before it acknowledges; a consumer before it reads). ``throttle_ms`` is at most
        the whole quota window (``quota.window.num`` x ``quota.window.size.seconds``),
        whatever the quota."""
        client_id, kind, nbytes = (request.get("client_id"), request.get("kind"),
                                   request.get("bytes"))
        if not isinstance(client_id, str) or len(client_id) > MAX_CLIENT_ID or kind not in KINDS \
                or not isinstance(nbytes, int) or isinstance(nbytes, bool) \
                or not 0 <= nbytes <= LONG_MAX:
            raise InvalidRequestError(f"RecordUsage needs client_id (a string of at most "
                                      f"{MAX_CLIENT_ID} characters), kind (produce or fetch) and "
                                      f"bytes (an integer from 0 to {LONG_MAX})")
        now = self.clock()
        self._refresh(now)
        delay = self.manager.record(client_id, kind, nbytes, now)
        if self.on_usage is not None:
            self.on_usage(client_id, kind, nbytes, delay)
        return {"throttle_ms": int(round(delay * 1000)), "quota": self._quota(client_id, kind)}

    def usage(self) -> dict:
        """{(client_id, kind): (byte rate, throttle time max ms, avg ms)} of every client id
        seen, for the metrics."""
        now = self.clock()
        out = {}
        for client_id, kind in self.manager.clients():
            top, avg, _ = self.manager.throttle_stats(client_id, kind)
            out[(client_id, kind)] = (self.manager.rate(client_id, kind, now), top * 1000,
                                      avg * 1000)
        return out

    def client_usage(self, request: dict) -> dict:
        """RPC ``ClientUsage{client_id}`` -> per kind: the quota, the byte rate over the window
        and Kafka's client metrics ``<kind>-throttle-time-max`` / ``-avg`` (ms, over every
        request since this coordinator started, or since the client id came back after an
        hour without a request): what a streaming query shows in its
        progress, although its tasks ran elsewhere."""
        client_id = request.get("client_id")
        if not isinstance(client_id, str):
            raise InvalidRequestError("ClientUsage needs client_id (a string)")
        now = self.clock()
        self._refresh(now)
        out = {"client_id": client_id}
        for kind in KINDS:
            top, avg, n = self.manager.throttle_stats(client_id, kind)
            out[kind] = {"quota": self._quota(client_id, kind), "requests": n,
                         "byte_rate": round(self.manager.rate(client_id, kind, now), 1),
                         f"{kind}-throttle-time-max": round(top * 1000, 1),
                         f"{kind}-throttle-time-avg": round(avg * 1000, 1)}
        return out
