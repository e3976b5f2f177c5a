"""Snapshots of the replayed state (docs/protocol.md §2, "Snapshots").

A snapshot is a *manifest* (``log/<seq>.snapshot.json``, version 3): the small, fast-changing
part of the state (open transactions, decided ones, ACLs, features) inline, and for the rest
the content hashes of *parts* (``log/parts/<sha256>.json``): one per topic (its id, configs and
replica assignment) and one per 1,024 partitions of a topic. A part is named by the hash of its
bytes, so a snapshot reuses every part that did not change since the snapshot its state was
loaded from, and a write that touched k partitions costs a new snapshot O(k) bytes, not the
whole cluster. Snapshots are derived data: each proves itself (checksum, entry hash, part
hashes) or is ignored.
"""
from __future__ import annotations

import hashlib
import json
import math
from typing import Dict, Optional

from ..errors import AlreadyExistsError, CorruptRecordError, StorageNotFoundError
from .state import PARTITIONS_PER_PART, ClusterState, tp_key

MANIFEST_VERSION = 3
INLINE = ("txns", "decided", "acls", "deleted_topics", "sinks", "reader_features",
          "writer_features", "coordinator", "log_dirs", "client_quotas", "segment_merges",
          "cleaner_checkpoints")
#: inline fields newer than version 3's first clients: left out while empty, so a cluster that
#: does not use them writes the manifests it wrote before
OMITTED_WHEN_EMPTY = ("segment_merges", "cleaner_checkpoints")


def _canonical(obj) -> bytes:
    return json.dumps(obj, separators=(",", ":"), sort_keys=True).encode("utf-8")


def digest(body: dict) -> str:
    return hashlib.sha256(_canonical(body)).hexdigest()


def seal(body: dict, entry_bytes: bytes) -> bytes:
    """A snapshot that can prove itself: the hash of the entry it follows, and a checksum of
    everything in it (SHA-256 of its canonical JSON without the ``checksum`` field)."""
    body = dict(body, entry_sha256=hashlib.sha256(entry_bytes).hexdigest())
    body["checksum"] = digest(body)
    return _canonical(body)


def verified(snap, seq: int, entry_bytes: Optional[bytes]) -> bool:
    """Version 2 or 3, its checksum matches, its seq is its file's, and the entry it follows
    (when that is still on storage) is the one it was made from."""
    if not isinstance(snap, dict) or snap.get("version") not in (2, MANIFEST_VERSION) \
            or snap.get("seq") != seq:
        return False
    body = {k: v for k, v in snap.items() if k != "checksum"}
    if snap.get("checksum") != digest(body):
        return False
    if entry_bytes is not None and \
            snap.get("entry_sha256") != hashlib.sha256(entry_bytes).hexdigest():
        return False
    return True


def part_path(log_dir: str, h: str) -> str:
    return f"{log_dir}/parts/{h}.json"


def _part_ids(state: ClusterState):
    for topic, info in state.topics.items():
        yield f"t/{topic}", topic, None
        for chunk in range(math.ceil(info["partitions"] / PARTITIONS_PER_PART)):
            yield f"p/{topic}/{chunk}", topic, chunk


def _part_body(state: ClusterState, topic: str, chunk: Optional[int]) -> dict:
    info = state.topics[topic]
    if chunk is None:
        return info
    lo = chunk * PARTITIONS_PER_PART
    hi = min(lo + PARTITIONS_PER_PART, info["partitions"])
    return {"topic": topic, "first": lo,
            "rows": [state.partitions[tp_key(topic, p)].to_row() for p in range(lo, hi)]}


def write(storage, log_dir: str, path: str, state: ClusterState, entry_bytes: bytes) -> int:
    """Write the manifest of ``state`` at ``path``, and the parts that changed since its base;
    returns the bytes written. Losing the race for ``path`` is fine (another process wrote
    the same state)."""
    parts: Dict[str, str] = {}
    written = 0
    for pid, topic, chunk in _part_ids(state):
        reuse = state.parts.get(pid)
        if reuse is not None and state.dirty is not None and pid not in state.dirty:
            parts[pid] = reuse
            continue
        data = _canonical(_part_body(state, topic, chunk))
        h = hashlib.sha256(data).hexdigest()
        parts[pid] = h
        if h != reuse:
            try:
                storage.create_if_absent(part_path(log_dir, h), data)
                written += len(data)
            except AlreadyExistsError:
                pass
    body = {"version": MANIFEST_VERSION, "seq": state.seq, "timestamp": state.timestamp,
            "parts": parts,
            **{k: getattr(state, k) for k in INLINE if getattr(state, k) is not None
               and (k not in OMITTED_WHEN_EMPTY or getattr(state, k))}}
    data = seal(body, entry_bytes)
    try:
        storage.create_if_absent(path, data)
        written += len(data)
    except AlreadyExistsError:
        pass
    state.parts, state.dirty, state.replay_changes = parts, set(), 0
    return written


def load(storage, log_dir: str, snap: dict) -> ClusterState:
    """The state of a verified snapshot: flat (version 1 or 2) or a manifest whose every part
    must match its hash."""
    if snap.get("version") != MANIFEST_VERSION:
        state = ClusterState.from_snapshot(snap)
        state.parts, state.dirty, state.replay_changes = {}, None, 0
        return state
    parts = snap.get("parts")
    if not isinstance(parts, dict):
        raise CorruptRecordError("snapshot manifest without parts")
    try:
        return _assemble(storage, log_dir, snap, parts)
    except (TypeError, ValueError, KeyError, IndexError, AttributeError) as exc:
        raise CorruptRecordError(f"snapshot manifest at {snap.get('seq')} does not hold "
                                 f"together: {exc}") from None


def _assemble(storage, log_dir: str, snap: dict, parts: Dict[str, str]) -> ClusterState:
    """The state from a verified manifest. Its checksum and every part's hash prove the bytes
    are the ones a client wrote, so only the shape needed to build the state is checked (a
    cold open of 100,000 partitions must not spend seconds re-validating them)."""
    from .features import check_readable
    from .partition_state import PartitionState
    # a newer cluster's parts may have rows this client cannot parse: say why, not "corrupt"
    check_readable(snap.get("reader_features") or [], f"snapshot at {snap.get('seq')}")
    flat = {"version": 2, "seq": snap.get("seq"), "timestamp": snap.get("timestamp"),
            "topics": {}, "partitions": {}, **{k: snap.get(k) for k in INLINE}}
    partitions = {}
    for pid, h in parts.items():
        if not isinstance(h, str) or not isinstance(pid, str):
            raise CorruptRecordError(f"snapshot part {pid!r} has no hash")
        try:
            data = storage.read(part_path(log_dir, h))
        except StorageNotFoundError:
            raise CorruptRecordError(f"snapshot part {pid} ({h}) is missing") from None
        if hashlib.sha256(data).hexdigest() != h:
            raise CorruptRecordError(f"snapshot part {pid} does not match its hash {h}")
        body = json.loads(data)
        kind, _, rest = pid.partition("/")
        if kind == "t":
            flat["topics"][rest] = body
        elif kind == "p":
            topic, first = body["topic"], body["first"]
            for i, row in enumerate(body["rows"]):
                partitions[tp_key(topic, first + i)] = PartitionState.from_row(row)
        else:
            raise CorruptRecordError(f"snapshot part {pid!r} is of no known kind")
    for topic, info in flat["topics"].items():
        for p in range(info["partitions"]):
            if tp_key(topic, p) not in partitions:
                raise CorruptRecordError(f"snapshot: partition {topic}-{p} is in no part")
    state = ClusterState.from_snapshot(flat, partitions=partitions)
    state.parts, state.dirty, state.replay_changes = dict(parts), set(), 0
    return state


def referenced_parts(snap) -> set:
    if isinstance(snap, dict) and isinstance(snap.get("parts"), dict):
        return {h for h in snap["parts"].values() if isinstance(h, str)}
    return set()
