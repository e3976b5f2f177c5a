"""Replay of a replicated partition's actions (docs/protocol.md §1.3): ``replica_progress``,
``alter_isr``, ``elect_leader``, ``reassign_partitions``, ``complete_reassignment``, and the
high-watermark refresh the other handlers call. A part of :class:`state.ClusterState` kept in a
module of its own because it is one concept; the rules themselves are in ``isr.py``.
"""
from __future__ import annotations

from typing import Dict, Optional

from . import actions as A
from . import isr as R
from .features import REPLICA_CHECK, REPLICATION
from .partition_state import split_key, tp_key


class ReplicationReplay:
    """Mixed into ``ClusterState``: uses its topics, partitions, features and writable-copy
    helpers (``_partition_w``, ``_topic_w``, ``_abort``, ``topic_config``)."""

    def _start_replication(self, topic: str, p: int) -> None:
        """A partition with more than one replica is replicated once the cluster has the
        feature ``replication`` (§1.3); before it, and with one replica, its high watermark is
        its last stable offset."""
        replicas = self.topics[topic]["replicas"][p]
        key = tp_key(topic, p)
        if REPLICATION in self.reader_features and len(replicas) > 1 \
                and self.partitions[key].replication is None:
            ps = self._partition_w(key)
            ps.replication = R.new_replication(ps, replicas[0])

    def _refresh_hw(self, key: str) -> None:
        """Recompute a replicated partition's high watermark after a change (§1.3); the caller
        has taken the partition for writing."""
        ps = self.partitions[key]
        if ps.replication is None:
            return
        topic, p = split_key(key)
        info = self.topics[topic]
        R.recompute_high_watermark(ps, info["replicas"][p],
                                   self.topic_config(topic).min_insync_replicas)

    def _acks_all_problem(self, key: str, start: int, end: int, *, appended: bool):
        ps = self.partitions.get(key)
        if ps is None or ps.replication is None:
            return None
        topic, p = split_key(key)
        return R.acks_all_problem(ps, self.topics[topic]["replicas"][p],
                                  self.topic_config(topic).min_insync_replicas, start, end,
                                  appended=appended)

    def _elect_leader(self, a: A.ElectLeader, ts: int) -> A.Result:
        """A new leader per partition (§1.3): truncates what it lacks, aborts the partition's
        open txns (their writers wrote to the old leader)."""
        if REPLICATION in self.reader_features and a.election not in R.ELECTIONS:
            return A.error("INVALID_REQUEST", f"election {a.election!r:.20} is not one of "
                           f"{', '.join(R.ELECTIONS)}")

        def check(ps, replicas, topic, change):
            return R.check_election(ps, replicas, change["partition_epoch"], change["leader"],
                                    a.election, self.topic_config(topic).unclean_leader_election,
                                    whole_reassign=REPLICA_CHECK in self.reader_features)

        def apply(key, ps, topic, p, change):
            R.apply_election(ps, change["leader"], a.election)
            doomed = sorted(ps.open)
            if doomed:
                self._abort(A.Abort(txns=doomed, reason="leader_election"), ts)

        return self._each_replicated(a, REPLICATION, check, apply)

    def _reassign_partitions(self, a: A.ReassignPartitions, ts: int) -> A.Result:
        """Targets per partition (§1.3): the new ones join the replicas as followers; the
        coordinator copies to them and completes the reassignment once they are in sync."""
        if REPLICATION not in self.reader_features:
            return A.error("INVALID_REQUEST", f"reassign_partitions needs the feature "
                           f"{REPLICATION}")
        out: Dict[str, A.Result] = {}
        for key, targets in a.partitions.items():
            topic, p = split_key(key)
            ps = self.partitions.get(key)
            if ps is None or self.topics[topic]["topic_id"] != a.topic_ids.get(topic):
                out[key] = A.error("UNKNOWN_TOPIC_OR_PARTITION", f"no partition {key} of topic "
                                   f"id {a.topic_ids.get(topic)}")
                continue
            why = R.check_reassign(ps, targets)
            removed = self._removed_log_dir([targets]) if why is None else None
            if removed is not None:
                why = ("INVALID_REPLICA_ASSIGNMENT", f"{key}: {removed}")
            if why is not None:
                out[key] = A.error(*why)
                continue
            info = self._topic_w(topic)
            current = info["replicas"][p]
            replicas = list(info["replicas"])
            if set(targets) == set(current):       # only the order (the preferred leader)
                replicas[p] = list(targets)
            else:
                replicas[p] = list(current) + [t for t in targets if t not in current]
                ps = self._partition_w(key)
                if ps.replication is None:
                    ps.replication = R.new_replication(ps, current[0])
                ps.replication = dict(ps.replication, target=list(targets))
            info["replicas"] = replicas
            out[key] = A.Result()
        return A.PartitionsResult(partitions=out)

    def _complete_reassignment(self, a: A.CompleteReassignment, ts: int) -> A.Result:
        def check(ps, replicas, topic, change):
            return R.check_complete(ps, change["partition_epoch"])

        def apply(key, ps, topic, p, change):
            replicas = R.apply_complete(ps)
            info = self._topic_w(topic)
            info["replicas"] = [replicas if i == p else r for i, r in enumerate(info["replicas"])]

        return self._each_replicated(a, REPLICATION, check, apply)

    def _each_replicated(self, a, feature: str, check, apply) -> A.Result:
        """The skeleton of the coordinator's per-partition replication actions: the feature
        first, then per partition: it must exist under the entry's topic id and be replicated,
        ``check(ps, replicas, topic, change)`` gives why the change cannot apply (a Kafka error
        name and message) or None, and ``apply(key, ps, topic, p, change)`` applies it to the
        partition taken for writing; its high watermark is then recomputed. Valid partitions
        apply, each with its own result."""
        if feature not in self.reader_features:
            return A.error("INVALID_REQUEST", f"{a.OP} needs the feature {feature}")
        out: Dict[str, A.Result] = {}
        for key, change in a.partitions.items():
            topic, p = split_key(key)
            bad = self._replicated(key, a.topic_ids)
            if bad is None:
                why = check(self.partitions[key], self.topics[topic]["replicas"][p], topic,
                            change)
                bad = None if why is None else A.error(*why)
            if bad is not None:
                out[key] = bad
                continue
            apply(key, self._partition_w(key), topic, p, change)
            self._refresh_hw(key)
            out[key] = A.Result()
        return A.PartitionsResult(partitions=out)

    def _replicated(self, key: str, topic_ids: Dict[str, str]) -> Optional[A.Result]:
        """Why a coordinator's replication action cannot apply to one partition, or None."""
        topic, _ = split_key(key)
        ps = self.partitions.get(key)
        if ps is None or self.topics[topic]["topic_id"] != topic_ids.get(topic):
            return A.error("UNKNOWN_TOPIC_OR_PARTITION", f"no partition {key} of topic id "
                           f"{topic_ids.get(topic)}")
        if ps.replication is None:
            return A.error("INVALID_REQUEST", f"{key} is not replicated")
        return None

    def _replica_progress(self, a: A.ReplicaProgress, ts: int) -> A.Result:
        """Ranges copied to followers and checked (§1.3): valid partitions apply."""
        return self._follower_ranges(a, REPLICATION, R.apply_progress)

    def _replica_lost(self, a: A.ReplicaLost, ts: int) -> A.Result:
        """Ranges a follower's files were found not to hold (§1.3): valid partitions apply."""
        return self._follower_ranges(a, REPLICA_CHECK, R.apply_lost)

    def _follower_ranges(self, a, feature: str, apply) -> A.Result:
        """``replica_progress`` and ``replica_lost``: per partition, ranges per follower, checked
        alike (``isr.check_progress``); ``apply`` changes what the follower holds."""
        def check(ps, replicas, topic, ranges):
            why = R.check_progress(ps, replicas, ranges)
            return None if why is None else ("INVALID_REQUEST", why)

        return self._each_replicated(a, feature, check,
                                     lambda key, ps, topic, p, ranges: apply(ps, ranges))

    def _alter_isr(self, a: A.AlterIsr, ts: int) -> A.Result:
        """Kafka's AlterPartition (§1.3): valid partitions apply, each under its epoch."""
        def check(ps, replicas, topic, change):
            return R.check_isr_change(ps, replicas, change["partition_epoch"], change["isr"],
                                      change["joining"])

        def apply(key, ps, topic, p, change):
            R.apply_isr_change(ps, change["isr"], change["joining"])

        return self._each_replicated(a, REPLICATION, check, apply)
