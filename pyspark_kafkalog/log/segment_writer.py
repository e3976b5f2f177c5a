"""Write whole, immutable segments: the shared-storage way to add data to a partition.

On shared storage there is no safe append (object stores have none, and two processes appending
to one file corrupt it), so a writer that owns an offset range writes it as new segments named by
their first offset, each file with create-if-absent: the indexes first (created in place: until
the ``.log`` exists they belong to no segment), the ``.log`` last and published whole, so a
``.log`` that exists is complete, indexes included (docs/protocol.md, §3). The indexes are
exactly what Kafka's recovery would rebuild.
"""
from __future__ import annotations

from typing import List, Sequence

from ..errors import AlreadyExistsError
from ..format import index as idx
from ..format.batch import iter_headers
from ..format.encode import EncodedBatch
from ..format.index_builder import IndexBuilder
from .config import LogConfig
from .segment import INDEX_SUFFIX, LOG_SUFFIX, TIMEINDEX_SUFFIX, segment_name


def plan_segments(batches: Sequence[EncodedBatch], segment_bytes: int) -> List[List[EncodedBatch]]:
    """Split batches (in offset order) into segments of at most ``segment_bytes`` (one batch
    always fits: a batch larger than a segment gets a segment of its own)."""
    groups: List[List[EncodedBatch]] = []
    size = 0
    for b in batches:
        if not groups or size + len(b.data) > segment_bytes:
            groups.append([])
            size = 0
        groups[-1].append(b)
        size += len(b.data)
    return groups


def segment_files(base_offset: int, batches: Sequence[EncodedBatch], config: LogConfig):
    """``{suffix: content}`` for one segment holding ``batches``: bytes for the indexes, the
    list of the batches' bytes for the ``.log`` (written back to back, never joined here: a
    segment can be hundreds of megabytes)."""
    builder = IndexBuilder(base_offset, config.index_interval_bytes)
    for b in batches:
        for h in iter_headers(b.data):
            builder.add(h.size, h.last_offset, h.max_timestamp)
    return {TIMEINDEX_SUFFIX: idx.encode_time_index(builder.final_time_entries(), base_offset),
            INDEX_SUFFIX: idx.encode_offset_index(builder.offset_entries, base_offset),
            LOG_SUFFIX: [b.data for b in batches]}


def write_segments(storage, dir_path: str, batches: Sequence[EncodedBatch], config: LogConfig,
                   *, replace_garbage: bool = True) -> List[int]:
    """Write offset-assigned ``batches`` as new segments; returns their base offsets.

    ``replace_garbage``: the caller owns this offset range exclusively, so a file already there
    was left by a dead or fenced writer and is replaced.
    """
    bases = []   # no makedirs: creating a segment makes its directory (Storage.create_segment)
    created: List[str] = []
    try:
        for group in plan_segments(batches, config.segment_bytes):
            base = group[0].base_offset
            files = [(segment_name(base, suffix), content)
                     for suffix, content in segment_files(base, group, config).items()]
            try:   # all three at once; it leaves nothing behind when it fails
                storage.create_segment(dir_path, files)
            except AlreadyExistsError:
                if not replace_garbage:
                    raise
                for name, content in files:   # garbage of a dead writer in the way
                    create_segment_file(storage, f"{dir_path}/{name}", content, True)
                    created.append(f"{dir_path}/{name}")
            else:
                created += [f"{dir_path}/{name}" for name, _ in files]
            bases.append(base)
    except BaseException:
        delete_quietly(storage, created)
        raise
    return bases


def delete_quietly(storage, paths: Sequence[str]) -> None:
    """Remove the files of a write that failed part-way (whole segments, and indexes without
    their ``.log``): the caller's abort only knows the partitions that were written whole."""
    for path in paths:
        try:
            storage.delete(path)
        except Exception:
            pass   # best effort: cleanup removes index files without a .log later


def create_segment_file(storage, path: str, content, replace_garbage: bool) -> None:
    """Create one file of a segment (``content``: bytes for an index, created in place; a list
    of buffers written back to back for the ``.log``, published whole); with
    ``replace_garbage`` a file already there is replaced (see write_segments)."""
    try:
        if isinstance(content, list):
            storage.create_if_absent_pieces(path, content)
        else:   # an index means nothing until its .log exists (docs/protocol.md §3)
            storage.create_in_place(path, content)
    except AlreadyExistsError:
        if not replace_garbage:
            raise
        storage.replace(path, b"".join(content) if isinstance(content, list) else content)
