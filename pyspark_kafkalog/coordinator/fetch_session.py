"""KIP-227 incremental fetch sessions: the session cache a coordinator keeps, and the client half.

A streaming source asks for the positions of the same partitions (high watermark, log start
offset, last stable offset) every micro-batch, and between two asks few of them change. A fetch
session lets the server remember what the client last saw, so a request names only the partitions
it adds or drops and a response carries only the partitions that changed.

The cache is self-contained (standard library and ``errors`` only) because a coordinator will
serve it to many clients over RPC; it sees the cluster only through :class:`PositionSource`.
Sessions, epochs, eviction and metrics follow Kafka's ``FetchSessionCache``/``FetchManager``.
"""
from __future__ import annotations

import logging
import secrets
import threading
import time
from collections import deque
from types import MappingProxyType
from dataclasses import dataclass
from typing import (Any, Callable, Deque, Dict, Iterable, List, Mapping, Optional, Protocol,
                    Sequence, Set, Tuple)

from ..errors import (FetchSessionIdNotFoundError, InvalidFetchSessionEpochError, KafkaLogError,
                      error_for)

log = logging.getLogger(__name__)

TopicPartition = Tuple[str, int]

INVALID_SESSION_ID = 0
INITIAL_EPOCH = 0
FINAL_EPOCH = -1
MAX_EPOCH = 2 ** 31 - 1
#: max.incremental.fetch.session.cache.slots
DEFAULT_CACHE_SLOTS = 1000
MIN_EVICTION_MS = 120_000
#: IncrementalFetchSessionEvictionsPerSec is measured over this many recent seconds
EVICTION_RATE_WINDOW_S = 30.0

NUM_INCREMENTAL_FETCH_SESSIONS = "NumIncrementalFetchSessions"
NUM_INCREMENTAL_FETCH_PARTITIONS_CACHED = "NumIncrementalFetchPartitionsCached"
INCREMENTAL_FETCH_SESSION_EVICTIONS_PER_SEC = "IncrementalFetchSessionEvictionsPerSec"

UNKNOWN_TOPIC_OR_PARTITION = "UNKNOWN_TOPIC_OR_PARTITION"


def next_epoch(epoch: int) -> int:
    """The epoch after ``epoch``. 0 and -1 mean "full fetch", so the sequence wraps to 1."""
    if epoch < 0:
        return FINAL_EPOCH
    return 1 if epoch >= MAX_EPOCH else epoch + 1


@dataclass(frozen=True)
class PartitionPosition:
    """What a fetcher must know of a partition; a change in any field is news to it."""

    high_watermark: int
    log_start_offset: int
    last_stable_offset: int
    error: Optional[str] = None
    #: a deleted and recreated topic keeps its name but not its id
    topic_id: Optional[str] = None


def _unknown_partition() -> PartitionPosition:
    return PartitionPosition(-1, -1, -1, error=UNKNOWN_TOPIC_OR_PARTITION)


class PositionSource(Protocol):
    """What the server asks the cluster.

    ``positions`` must reflect at least the version the preceding ``refresh`` returned, and
    ``changed_since(v)`` must name every partition whose position changed after version ``v``
    (more is harmless, fewer is wrong). The cache calls it without holding its lock, possibly
    from several threads at once.
    """

    def refresh(self) -> int: ...

    def positions(self, tps: Iterable[TopicPartition]) -> Dict[TopicPartition, PartitionPosition]:
        ...

    def changed_since(self, version: int) -> Optional[Set[TopicPartition]]: ...


@dataclass(frozen=True)
class FetchRequest:
    """(session_id, epoch) say which kind of request it is, as in KIP-227: (0, 0) full, open a
    session; (0, -1) full, sessionless; (id, -1) close it, sessionless; (id, 0) close it, full,
    open a new one; (id, epoch > 0) incremental."""

    session_id: int
    epoch: int
    #: partitions added to the session (or re-sent), with the client's last-known position
    to_add: Mapping[TopicPartition, Optional[PartitionPosition]]
    to_forget: Sequence[TopicPartition] = ()
    privileged: bool = False
    #: a full fetch's partitions when they are not just ``to_add``'s keys
    full_partitions: Optional[Sequence[TopicPartition]] = None

    @property
    def is_full(self) -> bool:
        return self.epoch in (INITIAL_EPOCH, FINAL_EPOCH)


@dataclass(frozen=True)
class FetchResponse:
    """A top-level error means the server could not tell which partitions the request meant,
    so ``positions`` is empty and the client must start over with a full fetch."""

    error: Optional[str]
    error_code: int
    session_id: int
    next_epoch: int
    positions: Dict[TopicPartition, PartitionPosition]
    full: bool


class _FetchSession:
    """One client's cached view. Ranks are fixed at each use (``touch``), as in Kafka."""

    __slots__ = ("id", "privileged", "partitions", "creation_ms", "last_used_ms", "epoch",
                 "version", "cached_size", "evictable_by_all", "evictable_by_privileged")

    def __init__(self, sid: int, privileged: bool,
                 partitions: Dict[TopicPartition, Optional[PartitionPosition]],
                 now_ms: float, version: Optional[int]):
        self.id = sid
        self.privileged = privileged
        self.partitions = partitions
        self.creation_ms = now_ms
        self.last_used_ms = now_ms
        self.epoch = next_epoch(INITIAL_EPOCH)      # the epoch the next request must carry
        self.version = version                      # the source version `partitions` is as of
        self.cached_size = -1                       # size counted in the metrics; -1: not yet
        self.evictable_by_all = False
        self.evictable_by_privileged = False

    def evictable_key(self) -> Tuple[bool, int, int]:
        return (self.privileged, self.cached_size, self.id)


def _error_response(err: type) -> FetchResponse:
    return FetchResponse(err.error_name, err.error_code, INVALID_SESSION_ID, INITIAL_EPOCH, {},
                         full=False)


def _read(source: PositionSource,
          tps: List[TopicPartition]) -> Dict[TopicPartition, PartitionPosition]:
    if not tps:
        return {}
    got = source.positions(tps)
    return {tp: got.get(tp) or _unknown_partition() for tp in tps}


class FetchSessionCache:
    """The bounded set of incremental fetch sessions, and the request handling over it.

    One lock guards the sessions; the source is read outside it, so a slow storage read for one
    client does not stall the others.
    """

    def __init__(self, max_slots: int = DEFAULT_CACHE_SLOTS, min_eviction_ms: int = MIN_EVICTION_MS,
                 clock: Callable[[], float] = time.monotonic):
        self.max_slots = max_slots
        self.min_eviction_ms = min_eviction_ms
        self._clock = clock
        self._lock = threading.Lock()
        self._sessions: Dict[int, _FetchSession] = {}
        self._num_partitions = 0
        self.incremental_fetch_session_evictions = 0
        self._eviction_times: Deque[float] = deque()

    # -- metrics --------------------------------------------------------------------------------

    @property
    def num_incremental_fetch_sessions(self) -> int:
        with self._lock:
            return len(self._sessions)

    @property
    def num_incremental_fetch_partitions_cached(self) -> int:
        with self._lock:
            return self._num_partitions

    def evictions_per_sec(self) -> float:
        with self._lock:
            return self._eviction_rate(self._clock())

    def metrics(self) -> Dict[str, Any]:
        with self._lock:
            return {NUM_INCREMENTAL_FETCH_SESSIONS: len(self._sessions),
                    NUM_INCREMENTAL_FETCH_PARTITIONS_CACHED: self._num_partitions,
                    INCREMENTAL_FETCH_SESSION_EVICTIONS_PER_SEC: self._eviction_rate(self._clock())}

    def _eviction_rate(self, now_s: float) -> float:
        while self._eviction_times and self._eviction_times[0] <= now_s - EVICTION_RATE_WINDOW_S:
            self._eviction_times.popleft()
        return len(self._eviction_times) / EVICTION_RATE_WINDOW_S

    # -- the cache ------------------------------------------------------------------------------

    def remove(self, session_id: int) -> bool:
        """Close a session at its client's request (not an eviction)."""
        with self._lock:
            session = self._sessions.get(session_id)
            if session is not None:
                self._remove(session)
            return session is not None

    def _remove(self, session: _FetchSession) -> None:
        del self._sessions[session.id]
        self._num_partitions -= max(session.cached_size, 0)

    def _touch(self, session: _FetchSession, now_ms: float) -> None:
        session.last_used_ms = now_ms
        if session.cached_size >= 0:
            self._num_partitions -= session.cached_size
        session.cached_size = len(session.partitions)
        self._num_partitions += session.cached_size
        # Judged now and kept until the next use, as Kafka files sessions in its evictable trees.
        old = now_ms - session.creation_ms > self.min_eviction_ms
        session.evictable_by_all = old
        session.evictable_by_privileged = old or not session.privileged

    def _new_session_id(self) -> int:
        while True:
            sid = secrets.randbelow(MAX_EPOCH) + 1     # unguessable, positive 31-bit, never 0
            if sid not in self._sessions:
                return sid

    def _try_evict(self, privileged: bool, size: int, now_ms: float) -> bool:
        """Make room for a new session if KIP-227 lets it displace one.

        A session unused for longer than the minimum eviction time goes first, whoever asks.
        Otherwise the lowest ranked (unprivileged first, then fewest partitions) of the sessions
        the newcomer may displace goes, if the newcomer ranks above it: a privileged newcomer may
        take any unprivileged session and privileged ones older than the minimum eviction time;
        an unprivileged one only older sessions, and only when it has more partitions.
        Scanning is O(slots), paid only when the cache is full.
        """
        if not self._sessions:
            return False
        victim = min(self._sessions.values(), key=lambda s: (s.last_used_ms, s.id))
        if now_ms - victim.last_used_ms <= self.min_eviction_ms:
            pool = [s for s in self._sessions.values()
                    if (s.evictable_by_privileged if privileged else s.evictable_by_all)]
            if not pool:
                return False
            victim = min(pool, key=_FetchSession.evictable_key)
            if (privileged, size, 0) < victim.evictable_key():
                return False
        log.debug("evicting fetch session %d", victim.id)
        self._remove(victim)
        self.incremental_fetch_session_evictions += 1
        self._eviction_times.append(now_ms / 1000.0)
        return True

    def _maybe_create_session(self, privileged: bool,
                              partitions: Dict[TopicPartition, Optional[PartitionPosition]],
                              version: Optional[int]) -> int:
        now_ms = self._clock() * 1000.0
        if len(self._sessions) >= self.max_slots and \
                not self._try_evict(privileged, len(partitions), now_ms):
            return INVALID_SESSION_ID
        session = _FetchSession(self._new_session_id(), privileged, partitions, now_ms, version)
        self._sessions[session.id] = session
        self._touch(session, now_ms)
        return session.id

    # -- requests -------------------------------------------------------------------------------

    def fetch(self, request: FetchRequest, source: PositionSource) -> FetchResponse:
        if request.is_full:
            return self._full_fetch(request, source)
        return self._incremental_fetch(request, source)

    def _full_fetch(self, request: FetchRequest, source: PositionSource) -> FetchResponse:
        if request.session_id != INVALID_SESSION_ID:
            self.remove(request.session_id)     # a full request always ends the session it names
        tps = list(dict.fromkeys(request.full_partitions if request.full_partitions is not None
                                 else request.to_add))
        version = source.refresh() if tps else None
        positions = _read(source, tps)
        if request.epoch == FINAL_EPOCH:
            return FetchResponse(None, 0, INVALID_SESSION_ID, INITIAL_EPOCH, positions, full=True)
        with self._lock:
            sid = self._maybe_create_session(request.privileged, dict(positions), version)
        epoch = next_epoch(INITIAL_EPOCH) if sid != INVALID_SESSION_ID else INITIAL_EPOCH
        return FetchResponse(None, 0, sid, epoch, positions, full=True)

    def _incremental_fetch(self, request: FetchRequest, source: PositionSource) -> FetchResponse:
        with self._lock:
            session = self._sessions.get(request.session_id)
            if session is None:
                return _error_response(FetchSessionIdNotFoundError)
            if session.epoch != request.epoch:
                return _error_response(InvalidFetchSessionEpochError)
            session.partitions.update(request.to_add)
            for tp in request.to_forget:
                session.partitions.pop(tp, None)
            if not session.partitions:
                self._remove(session)
                return FetchResponse(None, 0, INVALID_SESSION_ID, INITIAL_EPOCH, {}, full=True)
            added = [tp for tp in request.to_add if tp in session.partitions]
            session.epoch = expected = next_epoch(session.epoch)
            self._touch(session, self._clock() * 1000.0)
            since = session.version

        version = source.refresh()
        changed = source.changed_since(since) if since is not None else None

        with self._lock:
            if changed is None:         # history too short: compare everything (slow, correct)
                candidates = list(session.partitions)
            else:
                candidates = [tp for tp in changed if tp in session.partitions]
                candidates += [tp for tp in added if tp not in changed]

        current = _read(source, candidates)

        with self._lock:
            if session.epoch != expected:       # a later request of the same session overtook us
                return _error_response(InvalidFetchSessionEpochError)
            out = {}
            for tp, pos in current.items():
                if tp in session.partitions and session.partitions[tp] != pos:
                    session.partitions[tp] = pos
                    out[tp] = pos
            session.version = version
        return FetchResponse(None, 0, session.id, expected, out, full=False)


class FetchSessionClient:
    """The fetcher's half (Kafka's ``FetchSessionHandler``): keeps the positions the session has
    told it, so each call returns complete positions while the wire carries only changes.

    ``server`` is anything with ``fetch(request, source)``: a cache in process, or
    ``fetch_client.SessionServer`` (the active coordinator's cache over RPC, else this
    process's). Not thread safe: one client per fetcher.
    """

    def __init__(self, server: Any, source: PositionSource, privileged: bool = False):
        self._server = server
        self._source = source
        self.privileged = privileged
        self.session_id = INVALID_SESSION_ID
        self.next_epoch = INITIAL_EPOCH
        #: the session's partitions, as both sides know them
        self._positions: Dict[TopicPartition, PartitionPosition] = {}
        #: the session the next full fetch closes (Kafka's "close existing, attempt new")
        self._close_id = INVALID_SESSION_ID
        self.full_fetches = 0
        self.incremental_fetches = 0
        self.fallbacks = 0
        #: the partitions the last call learnt something new about
        self.changed: Set[TopicPartition] = set()
        self._wanted: Optional[List[TopicPartition]] = None
        self._wanted_set: Set[TopicPartition] = set()

    def fetch(self,
              partitions: Iterable[TopicPartition]) -> Mapping[TopicPartition, PartitionPosition]:
        """Complete positions of ``partitions`` (a read-only view of the client's own map when
        they are the session's partitions); :attr:`changed` says which of them the call
        learnt something new about (every one after a full fetch). Asking for the same
        partitions as last time costs O(changed), not O(partitions)."""
        wanted = partitions if isinstance(partitions, list) else list(partitions)
        same = wanted == self._wanted
        if not same:
            wanted = list(dict.fromkeys(wanted))
        if self.session_id != INVALID_SESSION_ID:
            try:
                problem = self._incremental(wanted, same)
            except Exception as e:          # unknown whether the server moved on: start over
                problem = repr(e)
                self._lose_session(close=True)
            if problem is None:
                self._wanted = wanted
                if self._positions.keys() == self._wanted_set:
                    return MappingProxyType(self._positions)
                return {tp: self._positions[tp] for tp in wanted}
            self.fallbacks += 1
            log.info("incremental fetch failed (%s); falling back to a full fetch", problem)
        out = self._full(wanted)
        self._wanted, self._wanted_set = wanted, set(wanted)
        self.changed = set(wanted)
        return out

    def _incremental(self, wanted: List[TopicPartition], same: bool = False) -> Optional[str]:
        if same:
            wanted_set, to_add, to_forget = self._wanted_set, {}, []
        else:
            wanted_set = set(wanted)
            to_add = {tp: None for tp in wanted if tp not in self._positions}
            to_forget = [tp for tp in self._positions if tp not in wanted_set]
        self.incremental_fetches += 1
        resp = self._server.fetch(FetchRequest(self.session_id, self.next_epoch, to_add, to_forget,
                                               self.privileged), self._source)
        if resp.error is not None:
            self._lose_session(close=resp.error_code != FetchSessionIdNotFoundError.error_code)
            return resp.error
        if resp.session_id == INVALID_SESSION_ID:     # the server closed an emptied session
            self._lose_session(close=False)
            self._positions = {}
            self._wanted_set, self.changed = set(), set()
            return None if not wanted else "session closed by the server"
        if not wanted_set.issuperset(resp.positions) or not set(to_add) <= resp.positions.keys():
            self._lose_session(close=True)
            return "incremental response does not match the session's partitions"
        for tp in to_forget:
            del self._positions[tp]
        self._positions.update(resp.positions)
        self._wanted_set = wanted_set
        self.changed = set(resp.positions)
        self.next_epoch = resp.next_epoch
        return None

    def _full(self, wanted: List[TopicPartition]) -> Dict[TopicPartition, PartitionPosition]:
        request = FetchRequest(self._close_id, INITIAL_EPOCH,
                               {tp: self._positions.get(tp) for tp in wanted},
                               privileged=self.privileged, full_partitions=wanted)
        self.full_fetches += 1
        resp = self._server.fetch(request, self._source)
        if resp.error is not None:
            raise error_for(resp.error, f"full fetch failed: {resp.error}")
        missing = [tp for tp in wanted if tp not in resp.positions]
        if missing:
            raise KafkaLogError(f"full fetch response lacks {len(missing)} partition(s), "
                                f"e.g. {missing[0]}")
        self._positions = {tp: resp.positions[tp] for tp in wanted}
        self._close_id = INVALID_SESSION_ID
        self.session_id = resp.session_id
        self.next_epoch = (resp.next_epoch if resp.session_id != INVALID_SESSION_ID
                           else INITIAL_EPOCH)
        return dict(self._positions)

    def _lose_session(self, close: bool) -> None:
        self._close_id = self.session_id if close else INVALID_SESSION_ID
        self.session_id = INVALID_SESSION_ID
        self.next_epoch = INITIAL_EPOCH

    def close(self) -> None:
        """Give the session's slot back now rather than after the eviction time."""
        sid = self.session_id or self._close_id
        self._lose_session(close=False)
        self._positions = {}
        self._wanted, self._wanted_set = None, set()
        if sid != INVALID_SESSION_ID:
            self._server.fetch(FetchRequest(sid, FINAL_EPOCH, {}), self._source)

    def __enter__(self) -> "FetchSessionClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
