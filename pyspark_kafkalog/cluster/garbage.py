"""The protocol's garbage rule (docs/protocol.md §7), in one place: what cleanup may delete, and
what topic creation may remove as a deleted incarnation's leftovers. Garbage is only what the
metadata names as such (an aborted range, below the log start offset, a deleted topic id),
never what a state merely lacks.
"""
from __future__ import annotations

from ..errors import KafkaLogError, StorageNotFoundError
from .state import ClusterState

SEGMENT_SUFFIXES = (".log", ".index", ".timeindex", ".txnindex")


def is_garbage_segment(ps, base: int, has_log: bool) -> bool:
    """The protocol's garbage rule for the files of one segment base in a live partition (§7).
    A ``.log`` goes only in an aborted range (segments below the log start offset that still
    have one are for ``delete_below_log_start``, which applies Kafka's rule to them). Indexes
    without their ``.log`` are never read; they go unless a write the state knows of, or does
    not know of yet, may still be writing them (``.log`` is written last)."""
    if has_log:
        return ps.is_aborted(base) and not ps.is_committed(base)
    return base < ps.next_offset and not ps.in_open_range(base)


def is_deleted_topic_dir(cluster, state: ClusterState, path: str, topic: str) -> bool:
    """A partition directory is a deleted topic's only on positive evidence: its
    ``partition.metadata`` names a topic id that the metadata log deleted (or that is no longer
    the id of a live topic of that name), or, without that file, its topic's name was deleted."""
    from ..format.checkpoint import parse_partition_metadata
    try:
        topic_id = parse_partition_metadata(
            cluster.storage.read(f"{path}/partition.metadata").decode("utf-8", "replace"))
    except (StorageNotFoundError, KafkaLogError, ValueError):
        topic_id = None
    if topic_id is not None:
        if topic_id in state.deleted_topics:
            return True
        live = state.topics.get(topic)
        return live is not None and live["topic_id"] != topic_id
    return topic in state.deleted_topics.values()
