"""The cluster's metadata log: numbered JSON entries created with put-if-absent, plus snapshots.

This is the only place where processes agree on anything. An append is a create-if-absent of
``log/<seq>.json``; losing the race means someone else's entry took that number, so we replay it
and try the next one. Replay is deterministic (``state.ClusterState.apply``), so every process
that has read the same entries holds the same state. See docs/protocol.md, §2.
"""
from __future__ import annotations

import hashlib
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
        return parse_json(path, self.storage.read(path))

    def _load_base(self, snapshots: List[int], entries: Optional[List[int]] = None
                   ) -> ClusterState:
        """The newest snapshot that proves itself, else the empty state before entry 0.

        A snapshot is derived data and is never trusted on its own word (docs/protocol.md §2):
        one of version 2 must match its checksum and the entry it claims to follow; an old one
        (version 1, no checksum) is used only when the entries before it are gone, so that
        replaying them is not possible; anything else is skipped."""
        entries = self._listing()[0] if entries is None else entries
        replayable_from_zero = not entries or entries[0] == 0
        for seq in reversed(snapshots):
            try:
                data = self.storage.read(snapshot_name(seq))
                snap = parse_json(snapshot_name(seq), data)
                if entries and seq > entries[-1]:
                    continue   # claims a state after the newest entry: cannot be ours
                if snapshot_verified(snap, seq, self._entry_bytes(seq)):
                    return ClusterState.from_snapshot(snap)
                if isinstance(snap, dict) and snap.get("version") == 1 \
                        and not replayable_from_zero and snap.get("seq") == seq:
                    return ClusterState.from_snapshot(snap)
            except (CorruptRecordError, StorageNotFoundError):
                continue   # fall back to an older one
        if not replayable_from_zero:
            raise CorruptRecordError(
                f"metadata log: entries before {entries[0]:020d}.json were cleaned up and no "
                "snapshot at or after them can be verified; run `kafkalog --cluster URL metadata "
                "--verify`")
        return ClusterState()

    def _entry_bytes(self, seq: int) -> Optional[bytes]:
        try:
            return self.storage.read(entry_name(seq))
        except StorageNotFoundError:
            return None

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
                state = self._load_base(snapshots, entries)
        if state.seq < (entries[0] - 1 if entries else -1):
            # entries we still need were cleaned up: only a snapshot can tell us the past
            state = self._load_base(snapshots, entries)
            if state.seq < entries[0] - 1:
                raise CorruptRecordError(
                    f"metadata log: entries {state.seq + 1:020d}.json to "
                    f"{entries[0] - 1:020d}.json are missing and no snapshot covers them; run "
                    "`kafkalog --cluster URL metadata --verify`")
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
        except CorruptRecordError as exc:
            raise CorruptRecordError(f"{exc}; replay stops here (see `kafkalog --cluster URL "
                                     "metadata --verify`)") from None
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
        entry = self._entry_bytes(state.seq)
        if entry is None:
            return
        data = seal_snapshot(state.to_snapshot(), entry)
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
        now = self.storage.clock(LOG_DIR)   # compared with the files' mtimes: their clock
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


def parse_json(path: str, data: bytes):
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CorruptRecordError(f"{path} is not valid JSON: {exc}") from None


def _digest(body: dict) -> str:
    return hashlib.sha256(json.dumps(body, separators=(",", ":"), sort_keys=True).encode()
                          ).hexdigest()


def seal_snapshot(snapshot: dict, entry_bytes: bytes) -> bytes:
    """A snapshot that can prove itself: the hash of the entry it follows, and a checksum of
    everything in it."""
    body = dict(snapshot, entry_sha256=hashlib.sha256(entry_bytes).hexdigest())
    body["checksum"] = _digest(body)
    return json.dumps(body, separators=(",", ":"), sort_keys=True).encode()


def snapshot_verified(snap, seq: int, entry_bytes: Optional[bytes]) -> bool:
    """Version 2, its checksum matches, its seq is its file's, and the entry it follows (when
    that is still on storage) is the one it was made from."""
    if not isinstance(snap, dict) or snap.get("version") != 2 or snap.get("seq") != seq:
        return False
    body = {k: v for k, v in snap.items() if k != "checksum"}
    if snap.get("checksum") != _digest(body):
        return False
    if entry_bytes is not None and \
            snap.get("entry_sha256") != hashlib.sha256(entry_bytes).hexdigest():
        return False
    return True
