"""Replay of the segment rewrites: ``merge_segments`` (docs/protocol.md §4.1, feature
``segmentMerge``) and ``clean_segments`` (§4.2, feature ``logCompaction``). A part of
:class:`state.ClusterState` kept in a module of its own because it is one concept; the rewrites
themselves (which runs, the files) are ``maintenance/segment_merges.py``'s and
``maintenance/compaction.py``'s.
"""
from __future__ import annotations

from typing import Optional

from . import actions as A
from .features import LOG_COMPACTION, SEGMENT_MERGE
from .partition_state import tp_key


class MergeReplay:
    """Mixed into ``ClusterState``: uses its topics, partitions, features and ``seq``, and
    keeps ``segment_merges`` (a partition key -> the seq of its last applied merge or clean)
    and ``cleaner_checkpoints`` (a partition key -> its ``cleaned_to``)."""

    def _merge_segments(self, a: A.MergeSegments, ts: int) -> A.Result:
        """Segment merges of one partition (§4.1): valid when planned on the partition's last
        rewrite, and every run is committed data, contiguous, at or above the log start offset
        and below the high watermark. Nothing else changes: the entry is what lets the merger
        replace the files, and what orders two rewriters."""
        bad = self._rewrite_problem(a, SEGMENT_MERGE, min_segments=2)
        if bad is not None:
            return bad
        self.segment_merges = dict(self.segment_merges, **{tp_key(a.topic, a.partition):
                                                           self.seq + 1})
        return A.Result()

    def _clean_segments(self, a: A.CleanSegments, ts: int) -> A.Result:
        """A clean of one compacted partition (§4.2): valid as a merge is (a group may be one
        segment), for a compacted topic, with a cleaner checkpoint that does not go back and
        does not pass the high watermark. It moves the checkpoint."""
        bad = self._rewrite_problem(a, LOG_COMPACTION, min_segments=1, empty_ok=True)
        if bad is not None:
            return bad
        key = tp_key(a.topic, a.partition)
        if not self.topic_config(a.topic).compact:
            return A.error("INVALID_REQUEST", f"{key}: topic {a.topic} is not compacted "
                           "(cleanup.policy)")
        ps = self.partitions[key]
        current = self.cleaner_checkpoints.get(key, 0)
        if not current <= a.cleaned_to <= ps.high_watermark:
            return A.error("OFFSET_OUT_OF_RANGE", f"{key}: cleaned_to {a.cleaned_to} is not "
                           f"between the partition's cleaner checkpoint {current} and its high "
                           f"watermark {ps.high_watermark}")
        self.segment_merges = dict(self.segment_merges, **{key: self.seq + 1})
        self.cleaner_checkpoints = dict(self.cleaner_checkpoints, **{key: a.cleaned_to})
        return A.Result()

    def _rewrite_problem(self, a, feature: str, min_segments: int,
                         empty_ok: bool = False) -> Optional[A.Result]:
        """Why a merge or clean cannot apply, or None: the rules the two share (§4.1)."""
        if feature not in self.reader_features:
            return A.error("INVALID_REQUEST", f"{a.OP} needs the feature {feature}, which this "
                           "cluster has not enabled")
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
        if (not a.runs and not empty_ok) or not a.log_dirs:
            return A.error("INVALID_REQUEST", f"{a.OP} needs runs and log dirs")
        previous_end = None
        for base, end, segments, size in a.runs:
            if segments < min_segments or size < 1 or not base < end or (
                    previous_end is not None and base < previous_end):
                what = "two or more segments" if min_segments > 1 else "segments"
                return A.error("INVALID_REQUEST", f"{key}: run {[base, end, segments, size]} is "
                               f"not {what} in offset order")
            if base < ps.log_start_offset or end > ps.high_watermark:
                return A.error("OFFSET_OUT_OF_RANGE", f"{key}: run [{base}, {end}) is not between "
                               f"the log start offset {ps.log_start_offset} and the high "
                               f"watermark {ps.high_watermark}")
            if ps.contiguous_committed_end(base) < end:
                return A.error("INVALID_REQUEST", f"{key}: run [{base}, {end}) is not all "
                               "committed data")
            previous_end = end
        return None
