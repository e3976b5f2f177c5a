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
import threading
import time
import uuid
from typing import Callable, Dict, List, Optional, Set, Tuple

from ..errors import AlreadyExistsError, CorruptRecordError, KafkaStorageError, StorageNotFoundError
from . import snapshots as snaps
from .actions import Action
from .features import check_writable
from .state import ClusterState

META_DIR = "_kafkalog"
LOG_DIR = f"{META_DIR}/log"
_ENTRY = re.compile(r"^(\d{20})\.json$")
_SNAPSHOT = re.compile(r"^(\d{20})\.snapshot\.json$")
DEFAULT_SNAPSHOT_INTERVAL = 50
#: A snapshot also follows an entry that leaves this many partition changes to replay since the
#: base snapshot (about 0.2 s of replay): with 1,000-partition jobs (8,000 changes each: four
#: reserves and their commit) every 50th entry left up to 0.5 s of replay to every process
#: that opens the cluster, and a Spark job opens it in fresh processes twice (docs/protocol.md §2)
SNAPSHOT_REPLAY_CHANGES = 20_000
MAX_APPEND_ATTEMPTS = 1000
#: Kafka KRaft's ``metadata.max.retention.ms``, with kafkalog's default of an hour: how long
#: cleanup keeps entries and snapshots below the newest verified snapshot (docs/protocol.md §2)
DEFAULT_METADATA_RETENTION_MS = 3_600_000
#: a warm process follows the log by number (no listing) for at most this long after it last
#: listed it, and never for more than a sixth of its retention (docs/protocol.md §2, "Following
#: the log"): entries cleaned up while it was not looking cannot be told from entries not yet
#: written
MAX_FOLLOW_WITHOUT_LISTING_S = 600.0
#: how often, at most, a poll that found nothing new checks that its newest entry is still
#: there (``MetadataLog._behind_cleanup``)
CONFIRM_INTERVAL_S = 1.0


#: States replayed in this process, for the logs that opt in (``share_key``): Spark runs many
#: write tasks in one reused Python worker, and each opened its cluster by replaying every entry
#: since the newest snapshot, up to 49 entries of 1,000 partitions each (about 10 ms apiece).
#: Held as ``share_key -> (sha256 of entry seq's bytes, state after seq, time.monotonic() of
#: the listing it descends from, or None)``. Only a cache: a state is used only while its entry
#: is still on storage with the same bytes, and only as a starting point, which a catch-up by
#: number (within the listing's follow window) or a listing then brings up to date.
_SHARED: Dict[tuple, Tuple[str, ClusterState, Optional[float]]] = {}
_SHARED_LOCK = threading.Lock()


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
                 writer_id: Optional[str] = None, clock: Callable[[], float] = time.time,
                 retention_ms: int = DEFAULT_METADATA_RETENTION_MS):
        self.storage = storage
        self.snapshot_interval = snapshot_interval
        self.retention_ms = retention_ms
        #: ``time.monotonic()`` before the last listing of the log: until
        #: :attr:`follow_window_s` after it, :meth:`state` follows the log by number
        self._listed_at: Optional[float] = None
        #: ``time.monotonic()`` of the last check that this process is not behind a cleanup
        self._confirmed_at = time.monotonic()
        self.writer_id = writer_id or new_writer_id()
        self.clock = clock
        self._state: Optional[ClusterState] = None
        #: set (by ``Cluster(shared_state=True)``) to start from, and add to, the states this
        #: process replayed before (``_SHARED``)
        self.share_key: Optional[tuple] = None
        self._applied: Optional[Tuple[int, str]] = None   # (seq, sha256) of the newest entry

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    @property
    def follow_window_s(self) -> float:
        return min(MAX_FOLLOW_WITHOUT_LISTING_S, self.retention_ms / 6000.0)

    def _may_follow(self) -> bool:
        return (self._state is not None and self._listed_at is not None
                and time.monotonic() - self._listed_at < self.follow_window_s)

    # -- reading ------------------------------------------------------------------------------

    def _listing(self) -> Tuple[List[int], List[int]]:
        entries, snapshots = [], []
        for name in self.storage.list_names(LOG_DIR):
            m = _ENTRY.match(name)
            if m:
                entries.append(int(m.group(1)))
                continue
            m = _SNAPSHOT.match(name)
            if m:
                snapshots.append(int(m.group(1)))
        return sorted(entries), sorted(snapshots)

    def _read_json(self, path: str) -> dict:
        return parse_json(path, self.storage.read(path))

    def _load_base(self, snapshots: List[int], entries: Optional[List[int]] = None
                   ) -> ClusterState:
        """The newest snapshot that proves itself, else the empty state before entry 0.

        A snapshot is derived data and is never trusted on its own word (docs/protocol.md §2):
        one of version 2 or 3 must match its checksum, the entry it claims to follow and (a
        manifest) its parts' hashes; an old one (version 1, no checksum) is used only when the
        entries before it are gone, so that replaying them is not possible; anything else is
        skipped."""
        entries = self._listing()[0] if entries is None else entries
        replayable_from_zero = not entries or entries[0] == 0
        for seq in reversed(snapshots):
            try:
                data = self.storage.read(snapshot_name(seq))
                snap = parse_json(snapshot_name(seq), data)
                if entries and seq > entries[-1]:
                    continue   # claims a state after the newest entry: cannot be ours
                if snaps.verified(snap, seq, self._entry_bytes(seq)):
                    return snaps.load(self.storage, LOG_DIR, snap)
                if isinstance(snap, dict) and snap.get("version") == 1 \
                        and not replayable_from_zero and snap.get("seq") == seq:
                    return snaps.load(self.storage, LOG_DIR, snap)
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

        A warm process that listed the log recently follows it by number (:meth:`poll`): one
        read per new entry plus one that finds nothing, whatever the log's length. Only a cold
        open, or one that has not listed for :attr:`follow_window_s`, lists it.

        ``replay_only``: replay entries from the cached state rather than jump to a newer
        snapshot, which holds no per-action results: a writer reads its own entry's outcome."""
        if self._state is not None and not refresh:
            return self._state
        if self._may_follow() or self._start_from_shared():
            return self.poll()[0]
        state = self._state
        listed_at = time.monotonic()
        entries, snapshots = self._listing()
        if state is None and self.share_key is not None:
            state = self._state = self._shared_state(entries)
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
        if state is self._state and entries and entries[-1] > state.seq:
            state = state.copy()   # whoever holds the cached state keeps it as it was
        for seq in entries:
            if seq > state.seq:
                self._catch_up(state, seq)
        self._state = state
        self._listed_at = listed_at
        self._share(state)
        return state

    def _start_from_shared(self) -> bool:
        """A first open in a process that listed this log recently (Spark's reused Python
        workers: a write task after another) starts from the state it shares and follows the
        log by number from there, without listing it: only while the listing it came from is
        within :attr:`follow_window_s`, and its newest entry is still there with the bytes
        it was replayed from (a cluster made again at the same URL is not the same log)."""
        if self._state is not None or self.share_key is None:
            return False
        with _SHARED_LOCK:
            held = _SHARED.get(self.share_key)
        if held is None or held[2] is None \
                or time.monotonic() - held[2] >= self.follow_window_s \
                or not self._still_current(held):
            return False
        self._state, self._listed_at = held[1], held[2]
        return True

    def _still_current(self, held) -> bool:
        """Whether a shared state's entry is still on storage with the bytes it was replayed
        from (a cluster made again at the same URL is not the same log); if so, this log goes
        on from it."""
        data = self._entry_bytes(held[1].seq)
        if data is None or hashlib.sha256(data).hexdigest() != held[0]:
            return False
        self._applied = (held[1].seq, held[0])
        return True

    def _shared_state(self, entries: List[int]) -> Optional[ClusterState]:
        """The newest state this process replayed of this log, if its entry is still there
        with the bytes it was replayed from (a cluster made again at the same URL is not)."""
        with _SHARED_LOCK:
            held = _SHARED.get(self.share_key)
        if held is None or not entries or not entries[0] <= held[1].seq <= entries[-1] \
                or not self._still_current(held):
            return None
        return held[1]

    def _share(self, state: ClusterState) -> None:
        if self.share_key is None or self._applied is None or self._applied[0] != state.seq:
            return
        with _SHARED_LOCK:
            held = _SHARED.get(self.share_key)
            if held is None or held[1].seq < state.seq:
                _SHARED[self.share_key] = (self._applied[1], state, self._listed_at)

    def _note_applied(self, seq: int, data: bytes) -> None:
        if self.share_key is not None:
            self._applied = (seq, hashlib.sha256(data).hexdigest())

    def poll(self, base: Optional[ClusterState] = None) -> Tuple[ClusterState, Set[str]]:
        """The state after the entries written since the cached one, read by number without
        listing the log, and the partition keys those entries changed.

        Why: an incremental fetch (KIP-227) must cost what changed, and a listing costs the
        whole log. Entries are numbered densely and created in order, so the entries after
        ``seq`` are ``seq + 1``, ``seq + 2``, ... up to the first that does not exist: one read
        per new entry plus one that finds nothing. What this cannot see is an entry cleaned up
        before it was read (cleanup keeps entries for an hour and above the newest verified
        snapshot): a caller that has not polled for a long time takes :meth:`state` instead.

        ``base``: replay from this state (the caller's own) rather than from the cached one,
        which anything else in the process may have moved on, so that ``touched`` covers every
        entry after ``base``."""
        state = base if base is not None else (
            self._state if self._state is not None else self.state())
        touched: Set[str] = set()
        new = state
        seq = state.seq + 1
        while True:
            data = self._entry_bytes(seq)
            if data is None:
                break
            if new is state:
                new = state.copy()   # whoever holds the cached state keeps it as it was
            entry = parse_json(entry_name(seq), data)
            new.touched = touched
            try:
                new.apply(seq, entry)
            finally:
                new.touched = None
            self._note_applied(seq, data)
            seq += 1
        if new is state and self._behind_cleanup(state):
            # the entries after ours were cleaned up: only a listing (and a snapshot) can
            # tell what they held, and anything may have changed
            self._listed_at = None
            full = self.state()
            return full, {k for k, _ in full.partitions.items()}
        if self._state is None or new.seq > self._state.seq:
            self._state = new
            self._share(new)
        return new, touched

    def _behind_cleanup(self, state: ClusterState) -> bool:
        """Whether a cleanup deleted the entries after ``state`` (so a read by number finds
        nothing although the log went on): then ``state``'s own entry is gone too, since
        cleanup deletes in ascending order (docs/protocol.md §2). Looked at once a second at
        most, when a poll found nothing new: a process whose cleaner keeps entries for less
        than this client's follow window (``metadata.max.retention.ms`` set lower there) is
        then behind for a second, not until its next listing."""
        now = time.monotonic()
        if state.seq < 0 or now - self._confirmed_at < CONFIRM_INTERVAL_S:
            return False
        self._confirmed_at = now
        return not self.storage.exists(entry_name(state.seq))

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
            data = self.storage.read(entry_name(seq))
            entry = parse_json(entry_name(seq), data)
        except StorageNotFoundError:
            raise KafkaStorageError(f"metadata entry {seq} was listed but cannot be read") from None
        except CorruptRecordError as exc:
            raise CorruptRecordError(f"{exc}; replay stops here (see `kafkalog --cluster URL "
                                     "metadata --verify`)") from None
        state.apply(seq, entry)
        self._note_applied(seq, data)

    # -- appending ----------------------------------------------------------------------------

    def append(self, actions: List[Action], *, timestamp_ms: Optional[int] = None
               ) -> Tuple[int, ClusterState]:
        """Append one entry holding ``actions`` (typed, ``actions.py``; JSON objects only in
        tests that write malformed ones on purpose); returns its number and the state after
        it. The caller reads its actions' outcomes from ``state.results[seq]``. A client that
        lacks a writer feature the cluster uses refuses here, before writing anything."""
        actions = [a.to_json() if isinstance(a, Action) else a for a in actions]
        # a warm process appends on the state it holds: a newer entry makes the create fail,
        # and only then is the log read (one request saved per append on an object store)
        state = self._state if self._may_follow() else self.state()
        for _attempt in range(MAX_APPEND_ATTEMPTS):
            check_writable(state.writer_features, "append to the metadata log")
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
            # our outcome is in the replay of our entry, which directly follows the state we
            # appended on: replay the bytes we wrote into a copy (no listing, no read; never a
            # newer snapshot another process wrote meanwhile, which keeps no results)
            state = state.copy()   # whoever holds the cached state keeps it as it was
            state.apply(seq, json.loads(data))
            self._state = state
            self._note_applied(seq, data)
            self._maybe_snapshot(state, data)   # first: it marks the state's parts as written
            self._share(state)
            return seq, state
        raise KafkaStorageError(f"could not append to the metadata log after "
                                f"{MAX_APPEND_ATTEMPTS} attempts")

    def _maybe_snapshot(self, state: ClusterState, entry: bytes) -> None:
        """``entry``: the bytes of entry ``state.seq``, which this process just created (not
        read back: on an object store that is a request per snapshot)."""
        if self.snapshot_interval <= 0 or (state.seq % self.snapshot_interval
                                           and state.replay_changes < SNAPSHOT_REPLAY_CHANGES):
            return
        if state.unwritable_features():
            return
        snaps.write(self.storage, LOG_DIR, snapshot_name(state.seq), state, entry)

    def cleanup(self, *, min_age_ms: Optional[int] = None) -> List[str]:
        """Delete entries and snapshots below the newest verified snapshot, and the parts no
        kept snapshot names, once older than ``min_age_ms`` (default: this client's
        ``metadata.max.retention.ms``) on the storage's clock (docs/protocol.md §2, "Cleanup").

        Entries go in ascending order, so that an entry still on storage proves that none after
        it was cleaned up (a follower that finds its own newest entry is not behind a cleanup).
        The snapshot's own entry stays: it proves the snapshot (``entry_sha256``)."""
        min_age_ms = self.retention_ms if min_age_ms is None else min_age_ms
        entries, snapshots = self._listing()
        try:   # the snapshot a cold open starts from (it proves itself, parts included)
            keep_from = self._load_base(snapshots, entries).seq
        except CorruptRecordError:
            return []   # no way to the past but the entries: keep them all
        if keep_from < 0:
            return []
        now = self.storage.clock(LOG_DIR)   # compared with the files' mtimes: their clock
        removed = []
        for seq in entries:
            if seq >= keep_from or not self._old_enough(entry_name(seq), now, min_age_ms):
                break   # ascending, and never past one that must stay
            self.storage.delete(entry_name(seq))
            removed.append(entry_name(seq))
        for seq in snapshots:
            if seq < keep_from and self._old_enough(snapshot_name(seq), now, min_age_ms):
                self.storage.delete(snapshot_name(seq))
                removed.append(snapshot_name(seq))
        # parts no kept snapshot names (a part is immutable and shared by many snapshots)
        kept = set()
        for seq in snapshots:
            if seq >= keep_from:
                try:
                    kept |= snaps.referenced_parts(self._read_json(snapshot_name(seq)))
                except (CorruptRecordError, StorageNotFoundError):
                    return removed   # cannot tell what is still needed: keep every part
        part_dir = f"{LOG_DIR}/parts"
        for info in self.storage.list(part_dir):
            h = info.name[:-5] if info.name.endswith(".json") else None
            path = f"{part_dir}/{info.name}"
            if h and h not in kept and self._old_enough(path, now, min_age_ms):
                self.storage.delete(path)
                removed.append(path)
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
