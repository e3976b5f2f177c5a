"""Consumer group offsets on storage (docs/protocol.md, §9).

Each commit creates ``groups/<group>/<seq>.json`` holding the group's *complete* offsets, with
create-if-absent: concurrent committers of one group are serialised by the sequence numbers and
the newest file is the group's state. Groups are independent of the metadata log, so a consumer
committing often never contends with producers.

An offset is stored with the id of the topic it was read from. A topic deleted and created again
under the same name has a new id, and an offset of the old topic means nothing in the new one
(Kafka drops a deleted topic's offsets from its groups): :func:`live_offsets` treats such an
offset as never committed. Entries written before ids were stored have none and are kept.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple
from urllib.parse import quote, unquote

from ..errors import (AlreadyExistsError, CorruptRecordError, GroupIdNotFoundError,
                      InvalidGroupIdError, KafkaStorageError, StorageNotFoundError)
from ..cluster.metalog import META_DIR
from ..cluster.state import split_key, tp_key

GROUPS_DIR = f"{META_DIR}/groups"
_ENTRY = re.compile(r"^(\d{20})\.json$")
KEEP_ENTRIES = 5
MAX_GROUP_ID_LENGTH = 249   # Kafka's limit for a topic name, which is a directory name too
MAX_NAME_BYTES = 255        # a directory name on common filesystems and object-store keys
TopicPartition = Tuple[str, int]


@dataclass(frozen=True)
class OffsetAndMetadata:
    offset: int
    metadata: str = ""
    topic_id: Optional[str] = None   # the topic the offset was read from (None: not recorded)


def validate_group_id(group) -> str:
    """The one rule for group ids (CLI, admin API, jobs): the id names a directory on storage,
    so it follows Kafka's topic-name rules where those are about paths."""
    if not isinstance(group, str):
        raise InvalidGroupIdError(f"invalid group id {group!r}: a string is required")
    problem = None
    if not group:
        problem = "it must not be empty"
    elif group in (".", ".."):
        problem = "'.' and '..' are not allowed"
    elif "/" in group:
        problem = "it must not contain '/'"
    elif any(ord(c) < 0x20 or 0x7f <= ord(c) <= 0x9f for c in group):
        problem = "it must not contain control characters"
    elif len(group) > MAX_GROUP_ID_LENGTH:
        problem = f"it is longer than {MAX_GROUP_ID_LENGTH} characters ({len(group)})"
    elif len(_dir_name(group)) > MAX_NAME_BYTES:
        problem = (f"its storage name (percent-encoded) is longer than {MAX_NAME_BYTES} "
                   "characters")
    if problem:
        raise InvalidGroupIdError(f"invalid group id {group!r}: {problem}")
    return group


def _dir_name(group: str) -> str:
    return quote(group, safe="-_.")


def _group_dir(group: str) -> str:
    return f"{GROUPS_DIR}/{_dir_name(validate_group_id(group))}"


def topic_ids(state) -> Dict[str, str]:
    """Topic name -> id of the topics that exist in a metadata state."""
    return {topic: info["topic_id"] for topic, info in state.topics.items()}


def live_offsets(committed: Mapping[TopicPartition, OffsetAndMetadata],
                 current_ids: Mapping[str, str]) -> Dict[TopicPartition, OffsetAndMetadata]:
    """The offsets that still belong to the topic of that name: one stored with another topic id
    (the topic was deleted, and maybe created again) counts as not committed."""
    return {tp: om for tp, om in committed.items()
            if om.topic_id is None or om.topic_id == current_ids.get(tp[0])}


def consumed_offsets(cluster, groups: Sequence[str], topics: Optional[Iterable[str]] = None
                     ) -> Tuple[Dict[TopicPartition, int], Dict[str, str]]:
    """What every one of ``groups`` has consumed, for deleting records after consumption
    (KIP-107's motivation): per partition of ``topics`` (default: any) the smallest of their
    committed offsets, and the ids of the topics those offsets belong to (pass them to
    ``delete_records``, which then refuses a topic recreated since: its records were never
    consumed). A partition some group has no live offset for is left out: that group may still
    read it from the start. The one rule for the delete-records job and the coordinator's
    scheduled deletion."""
    if not groups:
        raise InvalidGroupIdError("at least one group is required")
    ids = topic_ids(cluster.state())
    wanted = None if topics is None else set(topics)
    store = GroupStore(cluster.storage)
    common: Optional[Dict[TopicPartition, int]] = None
    for group in groups:
        mine = {tp: om.offset for tp, om in store.fetch(group, ids).items()
                if wanted is None or tp[0] in wanted}
        common = mine if common is None else {tp: min(o, mine[tp]) for tp, o in common.items()
                                              if tp in mine}
    return common, {t: ids[t] for t, _ in common if t in ids}


class GroupStore:
    def __init__(self, storage, clock=None, guard=None):
        """``guard``: called before every write, to refuse (UNSUPPORTED_VERSION) when the
        cluster uses a writer feature this client lacks (``Cluster.check_writable``)."""
        self.storage = storage
        self.clock = clock
        self.guard = guard

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

    def fetch(self, group: str, current_ids: Optional[Mapping[str, str]] = None
              ) -> Dict[TopicPartition, OffsetAndMetadata]:
        """The group's committed offsets ({} for a group that never committed); with
        ``current_ids`` (:func:`topic_ids`) only the :func:`live_offsets`."""
        if current_ids is not None:
            return live_offsets(self.fetch(group), current_ids)
        for _ in range(5):
            seqs = self._entries(group)
            if not seqs:
                return {}
            try:
                data = self._read(group, seqs[-1])
            except StorageNotFoundError:
                continue   # cleaned up under us: list again
            return {split_key(k): OffsetAndMetadata(v["offset"], v.get("metadata", ""),
                                                    v.get("topic_id"))
                    for k, v in data["offsets"].items()}
        raise KafkaStorageError(f"could not read the offsets of group {group!r}")

    def exists(self, group: str) -> bool:
        return bool(self._entries(group))

    def commit(self, group: str, offsets: Mapping[TopicPartition, OffsetAndMetadata],
               *, replace_all: bool = False, now_ms: int = 0) -> int:
        """Merge ``offsets`` into the group's state (or replace it); returns the entry number.
        Each offset's ``topic_id`` should be the id of the topic its records were read from (not
        looked up now), so that a commit racing a topic's re-creation is stale, not wrong."""
        d = _group_dir(group)
        if self.guard is not None:
            self.guard()
        for _ in range(1000):
            seqs = self._entries(group)
            current = {} if (replace_all or not seqs) else self._read(group, seqs[-1])["offsets"]
            merged = dict(current)
            for (topic, partition), om in offsets.items():
                if not isinstance(om, OffsetAndMetadata):
                    om = OffsetAndMetadata(int(om))
                if om.offset < 0:
                    raise InvalidGroupIdError(f"negative offset {om.offset} for {topic}-{partition}")
                entry = {"offset": om.offset, "metadata": om.metadata}
                if om.topic_id is not None:
                    entry["topic_id"] = om.topic_id
                merged[tp_key(topic, partition)] = entry
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
        if self.guard is not None:
            self.guard()
        self.storage.delete_tree(_group_dir(group))


def require_group(store: GroupStore, group: str) -> Dict[TopicPartition, OffsetAndMetadata]:
    if not store.exists(group):
        raise GroupIdNotFoundError(f"group {group!r} has no committed offsets")
    return store.fetch(group)


