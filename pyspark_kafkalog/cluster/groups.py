"""Consumer group offsets on storage (docs/protocol.md, §9).

Each commit creates ``groups/<group>/<seq>.json`` holding the group's *complete* offsets, with
create-if-absent: concurrent committers of one group are serialised by the sequence numbers and
the newest file is the group's state. Groups are independent of the metadata log, so a consumer
committing often never contends with producers.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Dict, List, Mapping, Tuple
from urllib.parse import quote, unquote

from ..errors import (AlreadyExistsError, CorruptRecordError, GroupIdNotFoundError,
                      InvalidGroupIdError, KafkaStorageError, StorageNotFoundError)
from .metalog import META_DIR
from .state import split_key, tp_key

GROUPS_DIR = f"{META_DIR}/groups"
_ENTRY = re.compile(r"^(\d{20})\.json$")
KEEP_ENTRIES = 5
TopicPartition = Tuple[str, int]


@dataclass(frozen=True)
class OffsetAndMetadata:
    offset: int
    metadata: str = ""


def _group_dir(group: str) -> str:
    if not isinstance(group, str) or not group or len(group) > 255:
        raise InvalidGroupIdError(f"invalid group id {group!r}: a non-empty string of at most "
                                  "255 characters is required")
    return f"{GROUPS_DIR}/{quote(group, safe='-_.')}"


class GroupStore:
    def __init__(self, storage, clock=None):
        self.storage = storage
        self.clock = clock

    def _entries(self, group: str) -> List[int]:
        seqs = []
        for info in self.storage.list(_group_dir(group)):
            m = _ENTRY.match(info.name)
            if m:
                seqs.append(int(m.group(1)))
        return sorted(seqs)

    def list_groups(self) -> List[str]:
        return sorted(unquote(name) for name in self.storage.list_dirs(GROUPS_DIR))

    def _read(self, group: str, seq: int) -> dict:
        path = f"{_group_dir(group)}/{seq:020d}.json"
        try:
            return json.loads(self.storage.read(path))
        except (ValueError, UnicodeDecodeError) as exc:
            raise CorruptRecordError(f"{path} is not valid JSON: {exc}") from None

    def fetch(self, group: str) -> Dict[TopicPartition, OffsetAndMetadata]:
        """The group's committed offsets ({} for a group that never committed)."""
        for _ in range(5):
            seqs = self._entries(group)
            if not seqs:
                return {}
            try:
                data = self._read(group, seqs[-1])
            except StorageNotFoundError:
                continue   # cleaned up under us: list again
            return {split_key(k): OffsetAndMetadata(v["offset"], v.get("metadata", ""))
                    for k, v in data["offsets"].items()}
        raise KafkaStorageError(f"could not read the offsets of group {group!r}")

    def exists(self, group: str) -> bool:
        return bool(self._entries(group))

    def commit(self, group: str, offsets: Mapping[TopicPartition, OffsetAndMetadata],
               *, replace_all: bool = False, now_ms: int = 0) -> int:
        """Merge ``offsets`` into the group's state (or replace it); returns the entry number."""
        d = _group_dir(group)
        for _ in range(1000):
            seqs = self._entries(group)
            current = {} if (replace_all or not seqs) else self._read(group, seqs[-1])["offsets"]
            merged = dict(current)
            for (topic, partition), om in offsets.items():
                if not isinstance(om, OffsetAndMetadata):
                    om = OffsetAndMetadata(int(om))
                if om.offset < 0:
                    raise InvalidGroupIdError(f"negative offset {om.offset} for {topic}-{partition}")
                merged[tp_key(topic, partition)] = {"offset": om.offset, "metadata": om.metadata}
            seq = seqs[-1] + 1 if seqs else 0
            body = json.dumps({"offsets": merged, "timestamp": now_ms}, sort_keys=True).encode()
            try:
                self.storage.create_if_absent(f"{d}/{seq:020d}.json", body)
            except AlreadyExistsError:
                continue
            for old in seqs[:-KEEP_ENTRIES]:
                self.storage.delete(f"{d}/{old:020d}.json")
            return seq
        raise KafkaStorageError(f"could not commit offsets of group {group!r}: too much contention")

    def delete(self, group: str) -> None:
        if not self.exists(group):
            raise GroupIdNotFoundError(f"group {group!r} does not exist")
        self.storage.delete_tree(_group_dir(group))


def require_group(store: GroupStore, group: str) -> Dict[TopicPartition, OffsetAndMetadata]:
    if not store.exists(group):
        raise GroupIdNotFoundError(f"group {group!r} has no committed offsets")
    return store.fetch(group)


