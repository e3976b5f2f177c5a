"""Whether the coordinator's RPC server can still take a call (docs/operations.md, "One at a
time"): a coordinator that holds the lease but cannot serve must give it up, or no standby
ever takes over while every client's call times out.

Why this measure: the lease is renewed by a thread of its own, which a wedged handler does not
stop, so a renewal proves nothing about serving. What does is whether a call can start: gRPC
runs each call on one of a fixed pool of worker threads (``rpc.MAX_WORKERS``). When every
worker is running a call, and the newest of those calls began ``t`` seconds ago, no worker has
been free for ``t`` seconds and nothing sent meanwhile has even begun. Cheap (a dict of start
times under a lock), no network, no false alarm from one slow call while other workers serve.
"""
from __future__ import annotations

import threading
import time
from typing import Callable, Dict


class ServingWatch:
    """Counts the calls running on a server of ``workers`` worker threads. Wrap every
    handler with :meth:`wrap`; :meth:`stalled_s` says how long no worker has been free."""

    def __init__(self, workers: int, clock: Callable[[], float] = time.monotonic):
        self.workers = workers
        self._clock = clock
        self._running: Dict[int, float] = {}      # call number -> when it began
        self._calls = 0
        self._lock = threading.Lock()

    def wrap(self, handler: Callable[[dict], dict]) -> Callable[[dict], dict]:
        def watched(request: dict) -> dict:
            with self._lock:
                self._calls += 1
                call = self._calls
                self._running[call] = self._clock()
            try:
                return handler(request)
            finally:
                with self._lock:
                    del self._running[call]
        watched.__wrapped__ = handler
        return watched

    def running(self) -> int:
        """Calls running now."""
        with self._lock:
            return len(self._running)

    def stalled_s(self) -> float:
        """Seconds since a worker was last free: 0 while fewer than ``workers`` calls run,
        else the age of the newest running call."""
        with self._lock:
            if len(self._running) < self.workers:
                return 0.0
            return max(0.0, self._clock() - max(self._running.values()))
