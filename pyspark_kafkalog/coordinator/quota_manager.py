"""KIP-13's byte-rate measurement and throttle time, per client id and quota kind.

Kafka measures a client's byte rate over ``quota.window.num`` samples of
``quota.window.size.seconds`` each and, when the rate is over the quota, delays the client by
the time the excess bytes need at the quota's rate: (bytes in the window − quota × window) ÷
quota. A producer's data is written first and its acknowledgement delayed; a consumer is
delayed before it reads. Here one coordinator sees every client of a cluster, so the quota is
cluster-wide instead of per broker (docs/protocol.md §12); this class is only the arithmetic,
with the clock passed in, so the service and tests drive it alike.
"""
from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass
from typing import Callable, Deque, Dict, Optional, Tuple

DEFAULT_WINDOW_NUM = 11          # Kafka's quota.window.num
DEFAULT_WINDOW_SIZE_S = 1.0      # Kafka's quota.window.size.seconds
#: Kafka's ClientQuotaManager drops a client id's sensors after an hour without a request; a
#: coordinator runs for weeks and client ids can be per job, so it forgets them too
INACTIVE_EXPIRY_S = 3600.0


@dataclass
class _Sample:
    start: float
    bytes: float = 0.0


class QuotaManager:
    """``record(client_id, kind, nbytes, now)`` returns the throttle time in seconds (0 when
    within quota). ``quota(client_id, kind)`` gives the byte rate that applies, or None; it is
    read at every call, so a changed quota takes effect at the next request."""

    def __init__(self, quota: Callable[[str, str], Optional[float]], *,
                 window_num: int = DEFAULT_WINDOW_NUM,
                 window_size_s: float = DEFAULT_WINDOW_SIZE_S,
                 inactive_expiry_s: float = INACTIVE_EXPIRY_S):
        if window_num < 2 or window_size_s <= 0:
            raise ValueError("quota.window.num must be >= 2 and quota.window.size.seconds > 0")
        self.quota = quota
        self.window_num = window_num
        self.window_size_s = window_size_s
        self._samples: Dict[Tuple[str, str], Deque[_Sample]] = {}
        #: (max, requests, total) throttle seconds, over every request (Kafka's client metrics
        #: ``*-throttle-time-max`` / ``-avg`` count unthrottled responses as 0)
        self._throttled: Dict[Tuple[str, str], Tuple[float, int, float]] = {}
        self.inactive_expiry_s = max(inactive_expiry_s, window_num * window_size_s)
        self._seen: Dict[Tuple[str, str], float] = {}   # the time of each key's last request
        self._swept = float("-inf")
        self._lock = threading.Lock()

    def _window(self, key: Tuple[str, str], now: float) -> Deque[_Sample]:
        samples = self._samples.setdefault(key, deque())
        if not samples or now >= samples[-1].start + self.window_size_s:
            samples.append(_Sample(now))
        horizon = now - self.window_num * self.window_size_s
        while samples and samples[0].start + self.window_size_s <= horizon:
            samples.popleft()
        return samples

    def record(self, client_id: str, kind: str, nbytes: int, now: float) -> float:
        """Count ``nbytes`` and return how long the client must wait (seconds)."""
        with self._lock:
            key = (client_id or "", kind)
            self._expire(now)
            self._seen[key] = now
            samples = self._window(key, now)
            delay = self._throttle(key, samples, now, nbytes)
            self._sample_at(samples, now + delay).bytes += nbytes
            top, n, total = self._throttled.get(key, (0.0, 0, 0.0))
            self._throttled[key] = (max(top, delay), n + 1, total + delay)
            return delay

    def _expire(self, now: float) -> None:
        """Forget the client ids without a request for ``inactive_expiry_s`` (never less than
        the quota window): their samples, and their throttle max and average, as Kafka's
        expired sensors. Swept at most 60 times per expiry period."""
        if now < self._swept + self.inactive_expiry_s / 60:
            return
        self._swept = now
        for key in [k for k, t in self._seen.items() if t + self.inactive_expiry_s <= now]:
            del self._seen[key]
            self._samples.pop(key, None)
            self._throttled.pop(key, None)

    def _sample_at(self, samples: Deque[_Sample], t: float) -> _Sample:
        """The sample whose window holds time ``t``, made (in the future) if need be.

        Why the bytes of a throttled request count at the end of its wait, where Kafka counts
        them when they arrive: the client has them only then (a producer's acknowledgement, a
        consumer's records), so that is when they add to its rate. Counted on arrival, bytes
        that arrive late in a sample leave the window with it while the wait they caused stays,
        and every task of a client id with a request in flight gains that much: 4 concurrent
        tasks ran at 1.25 x the quota, and at 0.97 x counted this way (docs/performance.md)."""
        while t >= samples[-1].start + self.window_size_s:
            samples.append(_Sample(samples[-1].start + self.window_size_s))
        for sample in reversed(samples):
            if sample.start <= t:
                return sample
        return samples[0]

    def _throttle(self, key, samples, now: float, nbytes: int = 0) -> float:
        bound = self.quota(*key)
        if bound is None or bound <= 0:
            return 0.0
        total = sum(s.bytes for s in samples) + nbytes
        # Kafka's elapsed window: the full windows kept plus the current one so far, and never
        # less than (num - 1) windows, so that a first burst is not judged over a tiny span
        elapsed = max(now - samples[0].start, (self.window_num - 1) * self.window_size_s)
        excess = total - bound * elapsed
        return excess / bound if excess > 0 else 0.0

    def rate(self, client_id: str, kind: str, now: float) -> float:
        """Bytes per second over the window, as the quota check sees it."""
        with self._lock:
            key = (client_id or "", kind)
            if key not in self._samples:   # asking about a client id does not make it one
                return 0.0
            samples = self._window(key, now)
            elapsed = max(now - samples[0].start, (self.window_num - 1) * self.window_size_s)
            return sum(s.bytes for s in samples) / elapsed

    def clients(self):
        """The (client id, kind) pairs seen within ``inactive_expiry_s``."""
        with self._lock:
            return list(self._samples)

    def throttle_stats(self, client_id: str, kind: str) -> Tuple[float, float, int]:
        """(max, average) throttle time in seconds over the client's requests since it was
        last forgotten (an hour without one), and their number."""
        top, n, total = self._throttled.get((client_id or "", kind), (0.0, 0, 0.0))
        return top, (total / n if n else 0.0), n
