"""What a follower's files prove it holds, against what ``held`` says (docs/protocol.md §1.3,
"Verification").

``held`` records what the coordinator copied and checked, but files can go afterwards: deleted
by hand, lost with a disk, cut short, zeroed, or a root restored from an older copy. Kafka's
leader learns a follower's log end from the follower itself on every fetch; here roots run no
code, so the coordinator looks. Cheaply, but for real: a listing of the partition directory
(names, sizes and modification times) each time, and, for each ``.log`` not seen before with
that size and time, its last batch read and its CRC checked, which gives the offset the file
ends at. A file whose tail does not check counts as holding nothing.
"""
from __future__ import annotations

from typing import Dict, List, Tuple

from ..cluster.isr import committed_missing, merge_ranges
from ..errors import KafkaLogError
from ..log.file_names import log_file_base
from ..log.segment import LogSegment


class ReplicaCheck:
    """The coordinator's memory of checked follower files: per partition directory, the topic
    id it was checked for and, per ``.log`` base offset, ((size, mtime), end offset). Only a
    cache: a file listed at another size or time (rewritten, zeroed, restored), or a directory
    of another topic id, is checked again."""

    def __init__(self, storage):
        self.storage = storage
        self._files: Dict[str, Tuple[str, Dict[int, Tuple[tuple, int]]]] = {}

    def coverage(self, d: str, topic_id: str) -> List[List[int]]:
        """Merged ``[base, end)`` ranges of the ``.log`` files in ``d`` whose tail checks.
        Raises ``KafkaLogError`` when ``d`` cannot be listed (nothing is concluded then)."""
        listed = {}
        for f in self.storage.list(d):
            base = log_file_base(f.name)
            if base is not None:
                listed[base] = (f.size, f.mtime)
        known_id, known = self._files.get(d, (None, {}))
        if known_id != topic_id:
            known = {}
        checked: Dict[int, Tuple[tuple, int]] = {}
        for base, seen in listed.items():
            hit = known.get(base)
            if hit is not None and hit[0] == seen:
                checked[base] = hit
                continue
            try:
                end = LogSegment(self.storage, d, base).verified_end()
            except KafkaLogError:
                continue            # damaged, cut short or gone meanwhile: holds nothing
            checked[base] = (seen, end)
        self._files[d] = (topic_id, checked)
        return merge_ranges([[base, end] for base, (_, end) in checked.items() if end > base])

    def forget_except(self, dirs) -> None:
        """Drop what is known of directories no longer followed (a reassignment moved them)."""
        keep = set(dirs)
        for d in [d for d in self._files if d not in keep]:
            del self._files[d]


def lacking(ps, held: List[list], coverage: List[List[int]]) -> List[List[int]]:
    """The committed ranges at or above the log start offset that ``held`` names and
    ``coverage`` does not: what a follower was recorded to hold and does not. Aborted and
    truncated ranges need no bytes, so only committed ones count."""
    return committed_missing(ps, held, coverage)


def describe(ranges: List[List[int]], limit: int = 3) -> str:
    shown = ", ".join(f"{s}-{e - 1}" for s, e in ranges[:limit])
    more = f" and {len(ranges) - limit} more" if len(ranges) > limit else ""
    return f"offsets {shown}{more}"
