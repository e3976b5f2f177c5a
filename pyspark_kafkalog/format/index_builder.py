"""The rule that decides which index entries a segment has: Kafka's ``LogSegment.recover()``.

We keep one invariant for every segment we write: its ``.index`` and ``.timeindex`` are exactly
what Kafka's recovery would rebuild from its ``.log``. Appending therefore applies the recovery
rule batch by batch, and the time index always ends with the "final" entry (the largest timestamp
so far) that Kafka writes when a segment is closed, so a broker reading our files never
underestimates a segment's largest timestamp (which drives time-based retention).
"""
from __future__ import annotations

from typing import List, Tuple

NO_TIMESTAMP = -1


class IndexBuilder:
    """Feeds batch headers through Kafka's recovery rule; pure, no I/O."""

    __slots__ = ("base_offset", "interval", "valid_bytes", "last_index_entry", "max_ts",
                 "offset_of_max_ts", "offset_entries", "time_entries")

    def __init__(self, base_offset: int, index_interval_bytes: int = 4096):
        self.base_offset = base_offset
        self.interval = index_interval_bytes
        self.valid_bytes = 0
        self.last_index_entry = 0
        self.max_ts = NO_TIMESTAMP
        self.offset_of_max_ts = -1
        self.offset_entries: List[Tuple[int, int]] = []   # (absolute offset, position)
        self.time_entries: List[Tuple[int, int]] = []     # interval entries (timestamp, offset)

    def add(self, size: int, last_offset: int, max_timestamp: int) -> None:
        """Account for the next batch (at position ``valid_bytes``)."""
        if max_timestamp > self.max_ts:
            self.max_ts, self.offset_of_max_ts = max_timestamp, last_offset
        if self.valid_bytes - self.last_index_entry > self.interval:
            self.offset_entries.append((last_offset, self.valid_bytes))
            self._maybe_append_time(self.time_entries)
            self.last_index_entry = self.valid_bytes
        self.valid_bytes += size

    def _maybe_append_time(self, entries: List[Tuple[int, int]]) -> None:
        last_ts = entries[-1][0] if entries else NO_TIMESTAMP
        if self.max_ts > last_ts:
            entries.append((self.max_ts, self.offset_of_max_ts))

    def final_time_entries(self) -> List[Tuple[int, int]]:
        """The time index as a closed (or recovered) segment has it: interval entries + final."""
        entries = list(self.time_entries)
        self._maybe_append_time(entries)
        return entries

    @property
    def largest_timestamp(self) -> int:
        return self.max_ts
