"""Merging runs of adjacent small segments into one: the byte half of a segment merge
(docs/protocol.md §4.1). No metadata here: which runs may be merged, the action that publishes
a merge and the deletion of what it covers are ``maintenance/segment_merges.py``'s.

Every segment file is immutable, so a partition that is written in small commits (a streaming
query's micro-batches, single-record produces) gets a segment per commit, and every reader,
listing and maintenance pass pays for each. Kafka appends to an active segment until
``segment.bytes``; here the layout converges the way log-structured stores on object storage
converge: adjacent segments are merged in the background, and the result replaces the files of
the first one. The merged ``.log`` is the run's ``.log`` files back to back, batch for batch and
byte for byte (CRCs, offsets, timestamps, producer ids and sequences, control batches and leader
epochs are what they were), so it begins with the exact bytes of the file it replaces: a reader
holding the old file sees a prefix of the new one. Its indexes are what Kafka's recovery would
rebuild (``IndexBuilder``).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Iterator, List, Optional, Sequence, Tuple

from ..errors import CorruptRecordError
from ..format import index as idx
from ..format.batch import scan_entries
from ..format.index_builder import IndexBuilder
from .segment import INDEX_SUFFIX, LOG_SUFFIX, TIMEINDEX_SUFFIX, segment_name

#: A run is merged only when no one of its segments outweighs all the others together by more
#: than this factor: then every merge adds at least 1/RATIO to the largest segment it rewrites,
#: so a byte is rewritten a bounded number of times, and the segments a partition keeps
#: unmerged shrink by more than RATIO + 1 from one to the next (at most about
#: log_3(segment.bytes / the smallest) of them). A size-tiered policy, as LSM stores use,
#: instead of rewriting the whole head on every pass. 2 was chosen by simulating 25,000
#: single-record commits under 1 GiB segments (docs/performance.md): write amplification 7
#: (1: 4.7, 8: 14) with a merge pass every 60 commits, and 5 segments left.
MERGE_RATIO = 2
#: a merge keeps the run's bytes in memory up to this size (one read of each source); a
#: larger run is read twice, once to check and index it and once while it is published
IN_MEMORY_BYTES = 64 << 20


def plan_runs(sizes: Sequence[int], segment_bytes: int, ratio: int = MERGE_RATIO
              ) -> List[Tuple[int, int]]:
    """``[i, j)`` runs of adjacent segments (``sizes`` of their ``.log``, in offset order) to
    merge: two or more segments, at most ``segment_bytes`` together, none larger than ``ratio``
    times the rest of its run. Longest first from the left; linear in the number of segments
    (a sliding maximum), since an unmerged partition can hold tens of thousands."""
    runs: List[Tuple[int, int]] = []
    n = len(sizes)
    i = j = 0
    total = 0
    window: deque = deque()   # indexes of [i, j) with decreasing sizes: window[0] is the max

    def fits(lo: int, hi: int, tot: int, biggest: int) -> bool:
        return hi - lo >= 2 and biggest <= ratio * (tot - biggest)

    while i < n:
        while j < n and total + sizes[j] <= segment_bytes:
            total += sizes[j]
            while window and sizes[window[-1]] <= sizes[j]:
                window.pop()
            window.append(j)
            j += 1
        if j <= i:            # one segment at least segment.bytes on its own: never merged
            i = j = i + 1
            total, window = 0, deque()
            continue
        top = window[0]
        if fits(i, j, total, sizes[top]):
            runs.append((i, j))
            i, total, window = j, 0, deque()
            continue
        # the run before its largest segment may merge among itself
        before = sum(sizes[i:top]) if top - i >= 2 else 0
        if before and fits(i, top, before, max(sizes[i:top])):
            runs.append((i, top))
            i = top
            total -= before
            continue
        total -= sizes[i]
        if window and window[0] == i:
            window.popleft()
        i += 1
    return runs


@dataclass
class MergedSegment:
    """A run merged in memory (or checked, for a large one): what publishing it needs."""

    base: int                      # the first source's base offset: the merged file's name
    end: int                       # one past the last offset it holds
    sources: List[Tuple[int, int]]  # (base offset, .log size) of each source, in order
    size: int                      # bytes of the merged .log
    index: bytes
    timeindex: bytes
    #: the merged ``.log`` as pieces, or None for a run larger than ``IN_MEMORY_BYTES``
    pieces: Optional[List[memoryview]] = field(default=None, repr=False)
    #: the topic's config it was indexed with
    config: object = field(default=None, repr=False)


def _kept(data, file: str, last_taken: Optional[int]) -> Iterator[Tuple[int, int, object]]:
    """``(start, end, header)`` of the entries of one source ``.log`` to copy: every entry,
    its CRC checked (a damaged batch is never copied into a new file), except those an earlier
    source already holds (a segment merged before, whose covered segments are still listed)."""
    for h in scan_entries(data, validate_crc=True, check_offsets=False, strict=True, file=file):
        if last_taken is not None and h.last_offset <= last_taken:
            continue
        if last_taken is not None and h.base_offset != -1 and h.base_offset <= last_taken:
            raise CorruptRecordError(f"{file}: the batch at position {h.position} (offsets "
                                     f"{h.base_offset}-{h.last_offset}) overlaps offset "
                                     f"{last_taken} of an earlier segment")
        yield h.position, h.end, h


def build(storage, dir_path: str, sources: Sequence[Tuple[int, int]], config) -> MergedSegment:
    """Read and check the run ``sources`` (``(base, .log size)``, in offset order) and make the
    merged segment's indexes. A source whose size differs from the listing's (replaced by
    another merge meanwhile) or that holds a damaged batch raises: nothing is published."""
    base = sources[0][0]
    builder = IndexBuilder(base, config.index_interval_bytes)
    keep = sum(size for _, size in sources) <= IN_MEMORY_BYTES
    pieces: List[memoryview] = []
    last_taken: Optional[int] = None
    size = 0
    for b, expected in sources:
        path = f"{dir_path}/{segment_name(b, LOG_SUFFIX)}"
        data = storage.read(path)
        if len(data) != expected:
            raise CorruptRecordError(f"{path} has {len(data)} bytes, the listing said "
                                     f"{expected}: another merge replaced it; try again")
        view = memoryview(data)
        run_start = run_end = None
        for start, end, h in _kept(data, path, last_taken):
            builder.add(h.size, h.last_offset, h.max_timestamp)
            last_taken = h.last_offset
            size += end - start
            if run_end != start:
                if keep and run_start is not None:
                    pieces.append(view[run_start:run_end])
                run_start = start
            run_end = end
        if keep and run_start is not None:
            pieces.append(view[run_start:run_end])
    if last_taken is None:
        raise CorruptRecordError(f"{dir_path}: segments {sources[0][0]}.. hold no batch")
    return MergedSegment(
        base=base, end=last_taken + 1, sources=list(sources), size=size,
        index=idx.encode_offset_index(builder.offset_entries, base),
        timeindex=idx.encode_time_index(builder.final_time_entries(), base),
        pieces=pieces if keep else None, config=config)


def _pieces(storage, dir_path: str, merged: MergedSegment) -> Iterator:
    """The merged ``.log``, read again from the sources (a run too large to hold)."""
    last_taken: Optional[int] = None
    for b, expected in merged.sources:
        path = f"{dir_path}/{segment_name(b, LOG_SUFFIX)}"
        data = storage.read(path)
        if len(data) != expected:
            raise CorruptRecordError(f"{path} changed while it was merged")
        view = memoryview(data)
        for start, end, h in _kept(data, path, last_taken):
            last_taken = h.last_offset
            yield view[start:end]


#: ``<base>.merging``: a merge is replacing the files of segment ``base`` (no Kafka suffix, so
#: Kafka and every reader pass it by)
MERGING_SUFFIX = ".merging"


def marker_name(base: int) -> str:
    return f"{base:020d}{MERGING_SUFFIX}"


def publish(storage, dir_path: str, merged: MergedSegment,
            still_valid: Callable[[], None] = lambda: None, *,
            source_dir: Optional[str] = None) -> None:
    """Replace the first source's files by the merged segment, each by an atomic replace
    (durable as the storage makes a replace): the ``.log`` first, then its ``.timeindex`` and
    ``.index``. A reader that opens the new ``.log`` with the old indexes has a valid, sparser
    index of its prefix (and a time index whose last entry it checks against the tail, as for
    a broker's active segment); one that opens the old ``.log`` with new indexes finds their
    entries past its end and walks the log instead. A marker ``<base>.merging`` stands from
    before the first replace to after the last, so that a merger that died in between leaves a
    name for the next pass to find in its listing (``repair_interrupted``).
    ``still_valid()`` raises to veto the replace of the ``.log`` after its last byte is
    produced, just before it is renamed into place; then, as after any failure here, the
    indexes are made again from whatever ``.log`` is there and the marker goes.
    ``source_dir``: where the sources are, when not in ``dir_path`` (a follower given the
    leader's bytes)."""
    base = merged.base
    marker = f"{dir_path}/{marker_name(base)}"
    storage.replace(marker, b"")

    def chunks():
        size = 0
        for piece in (merged.pieces if merged.pieces is not None
                      else _pieces(storage, source_dir or dir_path, merged)):
            size += len(piece)
            yield piece
        if size != merged.size:
            raise CorruptRecordError(f"{dir_path}: merged {size} bytes, expected {merged.size}")
        still_valid()
    try:
        storage.publish_stream(f"{dir_path}/{segment_name(base, LOG_SUFFIX)}", chunks(),
                               replace=True)
        storage.replace(f"{dir_path}/{segment_name(base, TIMEINDEX_SUFFIX)}", merged.timeindex)
        storage.replace(f"{dir_path}/{segment_name(base, INDEX_SUFFIX)}", merged.index)
    except BaseException:
        try:   # the indexes of what is there now, whichever .log that is
            rebuild_indexes(storage, dir_path, base, merged.config)
            storage.delete(marker)
        except Exception:
            pass   # the marker stays: the next pass repairs it
        raise
    storage.delete(marker)


def repair_interrupted(storage, dir_path: str, base: int, config) -> None:
    """After a merger that died while it replaced segment ``base``'s files (its marker is
    there): the indexes made again from the ``.log`` that is there, then the marker goes."""
    if storage.exists(f"{dir_path}/{segment_name(base, LOG_SUFFIX)}"):
        rebuild_indexes(storage, dir_path, base, config)
    storage.delete(f"{dir_path}/{marker_name(base)}")


def rebuild_indexes(storage, dir_path: str, base: int, config) -> None:
    """The indexes of ``base`` made again from its ``.log`` (Kafka's recovery rule): after a
    merge that died between its indexes and its ``.log``."""
    path = f"{dir_path}/{segment_name(base, LOG_SUFFIX)}"
    data = storage.read(path)
    builder = IndexBuilder(base, config.index_interval_bytes)
    for h in scan_entries(data, validate_crc=True, check_offsets=False, strict=True, file=path):
        builder.add(h.size, h.last_offset, h.max_timestamp)
    storage.replace(f"{dir_path}/{segment_name(base, TIMEINDEX_SUFFIX)}",
                    idx.encode_time_index(builder.final_time_entries(), base))
    storage.replace(f"{dir_path}/{segment_name(base, INDEX_SUFFIX)}",
                    idx.encode_offset_index(builder.offset_entries, base))
