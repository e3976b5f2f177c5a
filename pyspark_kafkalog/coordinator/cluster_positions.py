"""A cluster's partition positions as a fetch session's server sees them (``PositionSource``).

Why a change log: KIP-227's point is that an incremental fetch costs what changed. The metadata
log already says what changed, entry by entry (``MetadataLog.poll`` reads new entries by number,
without listing, and reports the partitions they touched), so this keeps the touched partitions
of recent entries and answers ``changed_since(version)`` from them. A session older than that
history, or a view idle for longer than the metadata log's cleanup age allows, falls back to the
slow path (a full replay, every partition compared), which is always correct.

A coordinator shares one instance among every client's fetch (``fetch_service``), so it is
thread safe: refreshes are serialized (the view only moves forward, and ``changed_since`` sees a
history in order), and a refresh that waited for another one that began after it was called
takes that one's result instead of polling again, so a burst of clients costs one poll.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from typing import Callable, Deque, Dict, Iterable, Optional, Set, Tuple

from ..cluster.partition_state import split_key
from ..errors import KafkaStorageError
from .fetch_session import FetchSessionCache, PartitionPosition

TopicPartition = Tuple[str, int]
#: poll by number only while the entries we have not read cannot have been cleaned up yet
#: (cleanup keeps them an hour, docs/protocol.md §2); past this, list and replay instead
MAX_POLL_GAP_S = 600.0
DEFAULT_HISTORY = 4096


_LOCAL_CACHE: Optional[FetchSessionCache] = None


def local_cache() -> FetchSessionCache:
    """This process's session cache, shared by its streaming queries and followers while no
    coordinator serves them the cluster's (``fetch_client``)."""
    global _LOCAL_CACHE
    if _LOCAL_CACHE is None:
        _LOCAL_CACHE = FetchSessionCache()
    return _LOCAL_CACHE


class ClusterPositions:
    """Positions of a cluster's partitions, refreshed incrementally from its metadata log."""

    def __init__(self, cluster, *, history: int = DEFAULT_HISTORY,
                 clock: Callable[[], float] = time.monotonic):
        self.cluster = cluster
        self.clock = clock
        self._history: Deque[Tuple[int, Set[TopicPartition]]] = deque(maxlen=history)
        self._floor = -1            # changes after this version are all in the history
        self._state = None
        self._polled_at = 0.0
        self.full_refreshes = 0
        self._skip_next = False
        self._lock = threading.Lock()
        self._refreshes = 0         # refreshes begun, for coalescing concurrent ones ...
        self._refreshed = 0         # ... and the number of the last one that succeeded

    @property
    def state(self):
        if self._state is None:
            self.refresh()
        return self._state

    def prefetch(self) -> int:
        """Refresh now, and let the fetch that follows use this refresh instead of polling
        again (a client that must see the topics before it asks for their partitions)."""
        seq = self.refresh()
        self._skip_next = True
        return seq

    @property
    def seq(self) -> Optional[int]:
        """The metadata entry the view is at; None before the first refresh (no request)."""
        state = self._state
        return None if state is None else state.seq

    def refresh(self) -> int:
        ticket = self._refreshes
        with self._lock:
            if self._skip_next and self._state is not None:
                self._skip_next = False
                return self._state.seq
            if self._refreshed > ticket:
                # one begun after this call was made has succeeded: its view is as new as
                # ours would be
                return self._state.seq
            self._refreshes += 1
            mine = self._refreshes
            now = self.clock()
            if self._state is None or now - self._polled_at > MAX_POLL_GAP_S:
                self._state = self.cluster.state()
                self._history.clear()
                self._floor = self._state.seq
                self.full_refreshes += 1
            else:
                # from our own state: anything else in the process (a group commit's
                # writability check, a producer) may have replayed the shared cache past it,
                # and the entries in between must still count as changes
                state, touched = self.cluster.metalog.poll(self._state)
                if state.seq != self._state.seq:
                    if len(self._history) == self._history.maxlen:
                        self._floor = self._history[0][0]
                    self._history.append((state.seq, {split_key(k) for k in touched}))
                self._state = state
            self._polled_at = now
            self._refreshed = mine
            return self._state.seq

    def catch_up(self, seq: Optional[int]) -> None:
        """The end of a fetch a coordinator answered (``fetch_client``), which did not refresh
        this view: it ends a :meth:`prefetch` (so the next one polls), and makes the view at
        least as new as metadata entry ``seq``, the one the coordinator read the positions
        from: this process reads records with its own view, which must then know every commit
        those positions count."""
        self._skip_next = False
        if seq is None:
            return
        for _ in range(2):
            if self._state is not None and self._state.seq >= seq:
                return
            self.refresh()
        if self._state.seq < seq:
            raise KafkaStorageError(f"the metadata log reads up to entry {self._state.seq} here, "
                                    f"but the coordinator answered from entry {seq}")

    def positions(self, tps: Iterable[TopicPartition]) -> Dict[TopicPartition, PartitionPosition]:
        state = self.state
        out = {}
        for topic, p in tps:
            ps = state.partition(topic, p)
            if ps is None:
                out[(topic, p)] = PartitionPosition(-1, -1, -1, error="UNKNOWN_TOPIC_OR_PARTITION")
                continue
            hw = ps.high_watermark
            # a cluster shows only committed writes, in both isolation levels (§4): its last
            # stable offset is its high watermark
            out[(topic, p)] = PartitionPosition(hw, ps.log_start_offset, hw,
                                                topic_id=state.topics[topic]["topic_id"])
        return out

    def changed_since(self, version: int) -> Optional[Set[TopicPartition]]:
        with self._lock:
            if version < self._floor:
                return None
            out: Set[TopicPartition] = set()
            for seq, touched in reversed(self._history):
                if seq <= version:
                    break
                out |= touched
            return out

    def topics(self) -> Dict[str, int]:
        """Topic -> partition count, from the state of the last refresh (no request)."""
        return {t: info["partitions"] for t, info in self.state.topics.items()}
