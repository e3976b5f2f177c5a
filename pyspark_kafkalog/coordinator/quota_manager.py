"""KIP-13's byte-rate quotas, per client id and quota kind: how long a client must wait, and
its byte rate over the quota window.

Here one coordinator sees every client of a cluster, so the quota is cluster-wide instead of
per broker (docs/protocol.md §12.1). A producer's data is written first and its
acknowledgement delayed; a consumer is delayed before it reads. This class is only the
arithmetic, with the clock passed in, so the service and tests drive it alike.

- **The wait** comes from a token bucket, Kafka's ``TokenBucket`` stat (KIP-599, which Kafka
  enforces its controller mutation quotas with): a client id's *level* is the bytes it took
  that the quota has not yet drained, ``level = max(0, level − quota × elapsed) + bytes``, and
  a request waits ``(level − burst) ÷ quota`` when the level is over ``burst = quota ×
  (quota.window.num − 1) × quota.window.size.seconds``: a fresh (or long idle) client may use
  that many windows' worth of its quota at once, as Kafka's windowed ``Rate`` lets it.
- **The wait is bounded** by the whole window, ``window_num × window_size_s``. (Kafka bounds
  its request-time and connection-rate throttles so, ``QuotaUtils.boundedThrottleTime``, at one
  window; its byte-rate throttles it does not bound.) A tiny quota (1 B/s, or a 1e-300 an older
  client wrote) then slows its client to one request per window instead of telling it to wait
  for days; what the bound does not make a client wait for is forgiven, so that the level stays
  bounded and a raised quota counts at the next request.
- **The byte rate** reported (``rate``: ClientUsage, the metrics) is over ``window_num``
  samples of ``window_size_s``, as before the bucket: a request's bytes count in the sample
  that holds the end of its wait (when the client has them), a sample is kept until it ended
  ``window_num`` windows ago, and the rate is the bytes kept over the time since the oldest
  kept sample began, at least ``window_num − 1`` windows. Samples are made ahead only as far
  as the bounded wait, so a client id and kind hold at most ``2 × window_num + 2`` of them and
  a few numbers, whatever the quota and the traffic.

Why a bucket and not the windowed rate Kafka throttles byte rates with: a window forgets, a
bucket does not. With the window, bytes counted on arrival leave it before the wait they
caused, and concurrent tasks of one client id together ran over the quota (4 tasks 1.25 ×);
counted as one lump at the end of their wait (this package until now), a steady consumer's
just-delivered bytes sat beside its next request's and it ran under its quota (0.87 × of 2 MB/s
with 1 MiB fetches and 2 windows of 1 s, 0.75 × of 1 MiB/s); spread over the wait instead, a
job that had spent its burst got it again as soon as the burst left the window (two jobs of
one client id: 1.13 ×, tests/spark/test_quota_spark.py). The bucket gives a steady client its quota,
queues concurrent requests one after another at the quota, and never grants the burst twice
without the idle time that earns it (simulated: 1.00 ×, 1.00 ×; tests/coordinator/test_quota_abuse.py).
Its one limit is the bound: requests in flight that together hold more than quota × the bound
(a 3 MB write against 1 B/s; 16 tasks × 1 MiB at 4 MB/s against 2 s) get more than the quota.
"""
from __future__ import annotations

import math
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Deque, Dict, Optional, Tuple

from ..config_def import at_least, invalid

DEFAULT_WINDOW_NUM = 11          # Kafka's quota.window.num
DEFAULT_WINDOW_SIZE_S = 1        # Kafka's quota.window.size.seconds
#: the bounds of both, Kafka's: the validators of the coordinator's settings (config.py) too
WINDOW_NUM_RULE, WINDOW_SIZE_RULE = at_least(2), at_least(1)
#: Kafka's ClientQuotaManager drops a client id's sensors after an hour without a request; a
#: coordinator runs for weeks and client ids can be per job, so it forgets them too
INACTIVE_EXPIRY_S = 3600.0
#: Kafka's Rate.windowSize is never less than 1 ms
_MIN_ELAPSED_S = 0.001


def check_quota_window(window_num: Any, window_size_s: Any) -> None:
    """The one rule of the quota window, for the settings and :class:`QuotaManager` (which
    takes seconds as a float): :data:`WINDOW_NUM_RULE`, :data:`WINDOW_SIZE_RULE`."""
    for name, value, rule in (("quota.window.num", window_num, WINDOW_NUM_RULE),
                              ("quota.window.size.seconds", window_size_s, WINDOW_SIZE_RULE)):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise invalid(name, value, "a number")
        rule(name, value, value)


@dataclass
class _Sample:
    start: float
    bytes: float = 0.0


@dataclass
class _Meter:
    """One (client id, kind): the samples of its byte rate (oldest first, the current one
    last), its bucket's level (bytes) as of ``at``, and the latest time it was asked at (a
    clock that steps back is taken as standing still)."""
    at: float
    samples: Deque[_Sample] = field(default_factory=deque)
    level: float = 0.0


class QuotaManager:
    """``record(client_id, kind, nbytes, now)`` returns the throttle time in seconds (0 when
    within quota, at most :attr:`max_throttle_s`). ``quota(client_id, kind)`` gives the byte
    rate that applies, or None; it is read at every call, so a changed quota takes effect at
    the next request."""

    def __init__(self, quota: Callable[[str, str], Optional[float]], *,
                 window_num: int = DEFAULT_WINDOW_NUM,
                 window_size_s: float = DEFAULT_WINDOW_SIZE_S,
                 inactive_expiry_s: float = INACTIVE_EXPIRY_S):
        check_quota_window(window_num, window_size_s)
        self.quota = quota
        self.window_num = window_num
        self.window_size_s = window_size_s
        #: the longest wait ever given: the whole quota window
        self.max_throttle_s = float(window_num * window_size_s)
        self._meters: Dict[Tuple[str, str], _Meter] = {}
        #: (max, requests, total) throttle seconds, over every request (Kafka's client metrics
        #: ``*-throttle-time-max`` / ``-avg`` count unthrottled responses as 0)
        self._throttled: Dict[Tuple[str, str], Tuple[float, int, float]] = {}
        self.inactive_expiry_s = max(inactive_expiry_s, window_num * window_size_s)
        self._seen: Dict[Tuple[str, str], float] = {}   # the time of each key's last request
        self._swept = float("-inf")
        self._lock = threading.Lock()

    def record(self, client_id: str, kind: str, nbytes: int, now: float) -> float:
        """Count ``nbytes`` and return how long the client must wait (seconds)."""
        with self._lock:
            key = (client_id or "", kind)
            self._expire(now)
            self._seen[key] = now
            meter = self._meters.get(key)
            if meter is None:
                meter = self._meters[key] = _Meter(at=now)
            now = max(now, meter.at)
            delay = self._throttle(key, meter, now, nbytes)
            self._sample_at(self._window(meter.samples, now), now + delay).bytes += nbytes
            top, n, total = self._throttled.get(key, (0.0, 0, 0.0))
            self._throttled[key] = (max(top, delay), n + 1, total + delay)
            return delay

    def _throttle(self, key, meter: _Meter, now: float, nbytes: int) -> float:
        """The bucket (Kafka's ``TokenBucket``): drain the level at the quota that applies
        now, add the request's bytes, and wait until the level is back at the burst; at most
        ``max_throttle_s``, the rest forgiven. Without a quota, nothing is kept."""
        bound = self.quota(*key)
        if bound is None or not 0 < bound < math.inf:
            meter.level, meter.at = 0.0, now
            return 0.0
        level = max(0.0, meter.level - bound * (now - meter.at)) + nbytes
        burst = bound * (self.window_num - 1) * self.window_size_s
        delay = 0.0
        if level > burst:
            delay = (level - burst) / bound
            if not delay <= self.max_throttle_s:        # past the bound, or not even finite
                delay = self.max_throttle_s
                level = burst + bound * delay
        meter.level, meter.at = level, now
        return delay

    def _window(self, samples: Deque[_Sample], now: float) -> Deque[_Sample]:
        """The samples as of ``now``: a current one begun at now if the last one has ended,
        and those that ended ``window_num`` windows ago or earlier dropped."""
        if not samples or now >= samples[-1].start + self.window_size_s:
            samples.append(_Sample(now))
        horizon = now - self.window_num * self.window_size_s
        while samples[0].start + self.window_size_s <= horizon:
            samples.popleft()
        return samples

    def _sample_at(self, samples: Deque[_Sample], t: float) -> _Sample:
        """The sample whose window holds time ``t`` (at most ``max_throttle_s`` from now),
        made ahead if need be."""
        while t >= samples[-1].start + self.window_size_s:
            samples.append(_Sample(samples[-1].start + self.window_size_s))
        for sample in reversed(samples):
            if sample.start <= t:
                return sample
        return samples[0]

    def _elapsed(self, oldest_start: float, now: float) -> float:
        """The span the byte rate is over: since the oldest sample kept began, and never less
        than ``window_num − 1`` windows."""
        return max(now - oldest_start, (self.window_num - 1) * self.window_size_s,
                   _MIN_ELAPSED_S)

    def _expire(self, now: float) -> None:
        """Forget the client ids without a request for ``inactive_expiry_s`` (never less than
        the quota window): their samples and bucket, and their throttle max and average, as
        Kafka's expired sensors. Swept at most 60 times per expiry period."""
        if now < self._swept + self.inactive_expiry_s / 60:
            return
        self._swept = now
        for key in [k for k, t in self._seen.items() if t + self.inactive_expiry_s <= now]:
            del self._seen[key]
            self._meters.pop(key, None)
            self._throttled.pop(key, None)

    def rate(self, client_id: str, kind: str, now: float) -> float:
        """Bytes per second over the window, the bytes of waits still running included.
        Changes nothing: asking is not a request."""
        with self._lock:
            meter = self._meters.get((client_id or "", kind))
            if meter is None:      # asking about a client id does not make it one
                return 0.0
            now = max(now, meter.at)
            horizon = now - self.window_num * self.window_size_s
            kept = [s for s in meter.samples if s.start + self.window_size_s > horizon]
            if not kept:
                return 0.0
            return sum(s.bytes for s in kept) / self._elapsed(kept[0].start, now)

    def clients(self):
        """The (client id, kind) pairs seen within ``inactive_expiry_s``."""
        with self._lock:
            return list(self._meters)

    def sample_count(self) -> int:
        """Samples held, over every client id and kind (at most ``2 × window_num + 2``
        each)."""
        with self._lock:
            return sum(len(m.samples) for m in self._meters.values())

    def throttle_stats(self, client_id: str, kind: str) -> Tuple[float, float, int]:
        """(max, average) throttle time in seconds over the client's requests since it was
        last forgotten (an hour without one), and their number."""
        top, n, total = self._throttled.get((client_id or "", kind), (0.0, 0, 0.0))
        return top, (total / n if n else 0.0), n
