"""The cluster's metadata log: numbered JSON entries created with put-if-absent, plus snapshots.

This is the only place where processes agree on anything. An append is a create-if-absent of
``log/<seq>.json``; losing the race means someone else's entry took that number, so we replay it
and try the next one. Replay is deterministic (``state.ClusterState.apply``), so every process
that has read the same entries holds the same state. See docs/protocol.md, §2.
"""
from __future__ import annotations

import json
import os
import re
import time
import uuid
from typing import Callable, List, Optional, Tuple

from ..errors import AlreadyExistsError, CorruptRecordError, KafkaStorageError, StorageNotFoundError
from .state import ClusterState

META_DIR = "_kafkalog"
LOG_DIR = f"{META_DIR}/log"
_ENTRY = re.compile(r"^(\d{20})\.json$")
_SNAPSHOT = re.compile(r"^(\d{20})\.snapshot\.json$")
DEFAULT_SNAPSHOT_INTERVAL = 50
MAX_APPEND_ATTEMPTS = 1000


def entry_name(seq: int) -> str:
    return f"{LOG_DIR}/{seq:020d}.json"


def snapshot_name(seq: int) -> str:
    return f"{LOG_DIR}/{seq:020d}.snapshot.json"


def new_writer_id() -> str:
    """Identifies one process's session (also the producer for leader-epoch purposes)."""
    return f"{os.uname().nodename}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class MetadataLog:
    """Replays and appends the metadata log; caches the state it has replayed (only a cache)."""

    def __init__(self, storage, *, snapshot_interval: int = DEFAULT_SNAPSHOT_INTERVAL,
                 writer_id: Optional[str] = None, clock: Callable[[], float] = time.time):
        self.storage = storage
        self.snapshot_interval = snapshot_interval
        self.writer_id = writer_id or new_writer_id()
        self.clock = clock
        self._state: Optional[ClusterState] = None

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    # -- reading ------------------------------------------------------------------------------

    def _listing(self) -> Tuple[List[int], List[int]]:
        entries, snapshots = [], []
        for info in self.storage.list(LOG_DIR):
            m = _ENTRY.match(info.name)
            if m:
                entries.append(int(m.group(1)))
                continue
            m = _SNAPSHOT.match(info.name)
            if m:
                snapshots.append(int(m.group(1)))
        return sorted(entries), sorted(snapshots)

    def _read_json(self, path: str) -> dict:
        data = self.storage.read(path)
        try:
            return json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CorruptRecordError(f"{path} is not valid JSON: {exc}") from None

    def _load_base(self, snapshots: List[int]) -> ClusterState:
        for seq in reversed(snapshots):
            try:
                return ClusterState.from_snapshot(self._read_json(snapshot_name(seq)))
            except (CorruptRecordError, StorageNotFoundError, KeyError, TypeError, ValueError):
                continue   # snapshots are derived: fall back to an older one
        return ClusterState()

    def state(self, refresh: bool = True, *, replay_only: bool = False) -> ClusterState:
        """The state after the newest entry (replaying only what we have not seen yet).

        ``replay_only``: replay entries from the cached state rather than jump to a newer
        snapshot, which holds no per-action results: a writer reads its own entry's outcome."""
        if self._state is not None and not refresh:
            return self._state
        state = self._state
        entries, snapshots = self._listing()
        if state is None or (snapshots and snapshots[-1] > state.seq and not replay_only):
            newest_snapshot = snapshots[-1] if snapshots else -1
            if state is None or newest_snapshot > state.seq:
                state = self._load_base(snapshots)
        if state.seq < (entries[0] - 1 if entries else -1):
            # entries we still need were cleaned up: only a snapshot can tell us the past
            state = self._load_base(snapshots)
        state = state.copy() if state is self._state else state
        for seq in entries:
            if seq > state.seq:
                self._catch_up(state, seq)
        self._state = state
        return state

    def _catch_up(self, state: ClusterState, seq: int) -> None:
        """Replay up to entry ``seq``. A directory listing is no snapshot: an entry created while
        we listed can be missing from it although a later one is there (local file systems
        list in hash order), so entries missing before ``seq`` are read directly; only one that
        does not exist is a gap (entries are immutable, and never deleted above a snapshot)."""
        for missing in range(state.seq + 1, seq):
            if not self.storage.exists(entry_name(missing)):
                raise CorruptRecordError(
                    f"metadata log has a gap before entry {seq} (replayed to {state.seq})")
            self._apply_entry(state, missing)
        self._apply_entry(state, seq)

    def _apply_entry(self, state: ClusterState, seq: int) -> None:
        try:
            entry = self._read_json(entry_name(seq))
        except StorageNotFoundError:
            raise KafkaStorageError(f"metadata entry {seq} was listed but cannot be read") from None
        state.apply(seq, entry)

    # -- appending ----------------------------------------------------------------------------

    def append(self, actions: List[dict], *, timestamp_ms: Optional[int] = None
               ) -> Tuple[int, ClusterState]:
        """Append one entry holding ``actions``; returns its number and the state after it.

        The caller reads its actions' outcomes from ``state.results[seq]``.
        """
        state = self.state()
        for _attempt in range(MAX_APPEND_ATTEMPTS):
            seq = state.seq + 1
            entry = {"version": 1, "writer": self.writer_id,
                     "timestamp": self.now_ms() if timestamp_ms is None else timestamp_ms,
                     "actions": actions}
            data = json.dumps(entry, separators=(",", ":"), sort_keys=True).encode("utf-8")
            try:
                self.storage.create_if_absent(entry_name(seq), data)
            except AlreadyExistsError:
                state = self.state()
                continue
            # our outcome is in the replay of our entry: never skip it by loading a newer
            # snapshot that another process wrote meanwhile (snapshots keep no results)
            state = self.state(replay_only=True)
            if state.seq < seq:   # listing lagged behind our own write: replay it directly
                self._catch_up(state, seq)
            self._maybe_snapshot(state)
            return seq, state
        raise KafkaStorageError(f"could not append to the metadata log after "
                                f"{MAX_APPEND_ATTEMPTS} attempts")

    def _maybe_snapshot(self, state: ClusterState) -> None:
        if self.snapshot_interval <= 0 or state.seq % self.snapshot_interval:
            return
        data = json.dumps(state.to_snapshot(), separators=(",", ":"), sort_keys=True).encode()
        try:
            self.storage.create_if_absent(snapshot_name(state.seq), data)
        except AlreadyExistsError:
            pass

    def cleanup(self, *, min_age_ms: int = 3_600_000) -> List[str]:
        """Delete entries and snapshots older than the second-newest snapshot (and old enough)."""
        entries, snapshots = self._listing()
        if len(snapshots) < 2:
            return []
        keep_from = snapshots[-2]
        now = self.clock()
        removed = []
        for seq in entries:
            if seq <= keep_from and self._old_enough(entry_name(seq), now, min_age_ms):
                self.storage.delete(entry_name(seq))
                removed.append(entry_name(seq))
        for seq in snapshots:
            if seq < keep_from and self._old_enough(snapshot_name(seq), now, min_age_ms):
                self.storage.delete(snapshot_name(seq))
                removed.append(snapshot_name(seq))
        return removed

    def _old_enough(self, path: str, now: float, min_age_ms: int) -> bool:
        try:
            return (now - self.storage.mtime(path)) * 1000 >= min_age_ms
        except Exception:
            return False
