"""Replay of ``merge_segments`` (docs/protocol.md §4.1, feature ``segmentMerge``). A part of
:class:`state.ClusterState` kept in a module of its own because it is one concept; the merges
themselves (which runs, the files) are ``segment_merges.py``'s.
"""
from __future__ import annotations

from . import actions as A
from .features import SEGMENT_MERGE
from .partition_state import tp_key


class MergeReplay:
    """Mixed into ``ClusterState``: uses its topics, partitions, features and ``seq``, and
    keeps ``segment_merges`` (a partition key -> the seq of its last applied merge)."""

    def _merge_segments(self, a: A.MergeSegments, ts: int) -> A.Result:
        """Segment merges of one partition (§4.1): valid when planned on the partition's last
        merge, and every run is committed data, contiguous, at or above the log start offset
        and below the high watermark. Nothing else changes: the entry is what lets the merger
        replace the files, and what orders two mergers."""
        if SEGMENT_MERGE not in self.reader_features:
            return A.error("INVALID_REQUEST", f"merge_segments needs the feature {SEGMENT_MERGE}, "
                           "which this cluster has not enabled")
        info = self.topics.get(a.topic)
        key = tp_key(a.topic, a.partition)
        ps = self.partitions.get(key)
        if info is None or ps is None or info["topic_id"] != a.topic_id:
            return A.error("UNKNOWN_TOPIC_OR_PARTITION", f"no partition {a.topic}-{a.partition} "
                           f"of topic id {a.topic_id}")
        last = self.segment_merges.get(key, -1)
        if a.after != last:
            return A.error("INVALID_UPDATE_VERSION", f"{key}: planned after merge {a.after}, but "
                           f"the partition's last merge is {last}")
        if not a.runs or not a.log_dirs:
            return A.error("INVALID_REQUEST", "merge_segments needs runs and log dirs")
        previous_end = None
        for base, end, segments, size in a.runs:
            if segments < 2 or size < 1 or not base < end or (
                    previous_end is not None and base < previous_end):
                return A.error("INVALID_REQUEST", f"{key}: run {[base, end, segments, size]} is "
                               "not two or more segments in offset order")
            if base < ps.log_start_offset or end > ps.high_watermark:
                return A.error("OFFSET_OUT_OF_RANGE", f"{key}: run [{base}, {end}) is not between "
                               f"the log start offset {ps.log_start_offset} and the high "
                               f"watermark {ps.high_watermark}")
            if ps.contiguous_committed_end(base) < end:
                return A.error("INVALID_REQUEST", f"{key}: run [{base}, {end}) is not all "
                               "committed data")
            previous_end = end
        self.segment_merges = dict(self.segment_merges, **{key: self.seq + 1})
        return A.Result()
