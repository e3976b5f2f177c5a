"""Verifying and repairing the metadata log (docs/protocol.md §2.1).

A bad entry stops every replay, on purpose: a client that skipped it could compute a state its
peers do not. So the way past one is an operator's explicit step, never an automatic one: the
entry is quarantined (its bytes kept) and replaced by an empty entry that says it was repaired.
"""
from __future__ import annotations

import hashlib
import json
import secrets
from dataclasses import dataclass, field
from typing import List, Optional

from ..errors import AlreadyExistsError, KafkaLogError, StorageNotFoundError
from ..progress import tracked
from ..cluster import snapshots as snaps
from ..cluster.actions import check_entry
from ..cluster.metalog import LOG_DIR, META_DIR, MetadataLog, entry_name, parse_json, snapshot_name
from ..cluster.state import ClusterState

QUARANTINE_DIR = f"{META_DIR}/quarantine"


@dataclass
class MetadataProblem:
    kind: str          # malformed-entry | missing-entry | bad-snapshot | snapshot-mismatch
    path: str
    message: str
    seq: int = -1


@dataclass
class VerifyReport:
    entries: int = 0
    snapshots: int = 0
    first_entry: int = -1
    last_entry: int = -1
    problems: List[MetadataProblem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def verify(metalog: MetadataLog) -> VerifyReport:
    """Read every entry and snapshot; replay the entries from the first point where that is
    possible and compare every verified snapshot after it with the replayed state."""
    storage = metalog.storage
    entries, snapshots = metalog._listing()
    report = VerifyReport(len(entries), len(snapshots),
                          entries[0] if entries else -1, entries[-1] if entries else -1)
    present = set(entries)
    for seq in range(entries[0] if entries else 0, (entries[-1] + 1) if entries else 0):
        if seq not in present:
            report.problems.append(MetadataProblem("missing-entry", entry_name(seq),
                                                   "entry missing below the newest entry", seq))
    parsed = {}
    for seq in tracked("reading entries", entries):
        try:
            entry = parse_json(entry_name(seq), storage.read(entry_name(seq)))
        except (KafkaLogError, StorageNotFoundError) as exc:
            report.problems.append(MetadataProblem("malformed-entry", entry_name(seq), str(exc),
                                                   seq))
            continue
        bad = check_entry(entry)
        if bad:
            report.problems.append(MetadataProblem("malformed-entry", entry_name(seq), bad, seq))
            continue
        parsed[seq] = entry
    verified = {}
    for seq in snapshots:
        try:
            snap = parse_json(snapshot_name(seq), storage.read(snapshot_name(seq)))
            entry = storage.read(entry_name(seq)) if seq in present else None
            if snap.get("version") != 1 and not snaps.verified(snap, seq, entry):
                raise KafkaLogError("unknown version, or checksum, seq or entry hash does not "
                                    "match")
            if entries and seq > entries[-1]:
                raise KafkaLogError(f"claims seq {seq}, after the newest entry {entries[-1]}")
            verified[seq] = snaps.load(storage, LOG_DIR, snap)
        except (KafkaLogError, StorageNotFoundError, AttributeError) as exc:
            report.problems.append(MetadataProblem("bad-snapshot", snapshot_name(seq),
                                                   str(exc), seq))
    if report.problems:
        return report
    # a replay from the earliest base there is, compared with each later snapshot
    if entries and entries[0] == 0:
        state = ClusterState()
    else:
        base = [s for s in verified if entries and s >= entries[0] - 1]
        if not base:
            return report
        state = verified[min(base)].copy()
    for seq in entries:
        if seq <= state.seq:
            continue
        try:
            state.apply(seq, parsed[seq])
        except KafkaLogError as exc:
            report.problems.append(MetadataProblem("malformed-entry", entry_name(seq), str(exc),
                                                   seq))
            return report
        snap = verified.get(seq)
        if snap is not None and _comparable(snap) != _comparable(state):
            report.problems.append(MetadataProblem(
                "snapshot-mismatch", snapshot_name(seq),
                "the snapshot's state differs from a replay of the entries", seq))
    return report


def _comparable(state: ClusterState) -> str:
    snap = state.to_snapshot()
    snap.pop("version", None)
    return json.dumps(snap, sort_keys=True)


@dataclass
class Repair:
    path: str
    action: str        # replaced | created | deleted-snapshot
    reason: str
    quarantined: Optional[str] = None


def repair(metalog: MetadataLog, *, dry_run: bool = False) -> List[Repair]:
    """Quarantine and replace malformed entries, fill gaps with empty entries, and delete
    snapshots that contradict the entries (they are derived data). Nothing else is touched."""
    storage = metalog.storage
    report = verify(metalog)
    now = metalog.now_ms()
    done: List[Repair] = []
    for problem in report.problems:
        if problem.kind == "malformed-entry":
            try:
                old = storage.read(problem.path)
            except StorageNotFoundError:
                continue
            digest = hashlib.sha256(old).hexdigest()
            kept = f"{QUARANTINE_DIR}/{problem.seq:020d}.json.{secrets.token_hex(4)}"
            if not dry_run:
                storage.create_if_absent(kept, old)
                storage.replace(problem.path, _empty_entry(now, problem.message, digest))
            done.append(Repair(problem.path, "replaced", problem.message, kept))
        elif problem.kind == "missing-entry":
            if not dry_run:
                try:
                    storage.create_if_absent(problem.path, _empty_entry(now, problem.message,
                                                                        None))
                except AlreadyExistsError:
                    continue   # it was only late in the listing
            done.append(Repair(problem.path, "created", problem.message))
        elif problem.kind in ("bad-snapshot", "snapshot-mismatch"):
            if not dry_run:
                storage.delete(problem.path)
            done.append(Repair(problem.path, "deleted-snapshot", problem.message))
    if done and not dry_run:
        metalog._state = None
    return done


def _empty_entry(now_ms: int, reason: str, sha256: Optional[str]) -> bytes:
    return json.dumps({"version": 1, "writer": "repair", "timestamp": now_ms, "actions": [],
                       "repaired": {"reason": reason[:500], "sha256": sha256}},
                      sort_keys=True, separators=(",", ":")).encode()
