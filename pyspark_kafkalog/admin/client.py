"""The admin client: every cluster operation the CLI and the jobs offer, as one Python class.

Names and shapes follow Kafka's ``Admin`` client where the meaning is the same
(``delete_records_before`` is KIP-107's ``deleteRecordsBefore``); results are typed, and errors
are the typed hierarchy of :mod:`pyspark_kafkalog.errors`.
"""
from __future__ import annotations

from typing import (Callable, Dict, Iterable, List, Mapping, Optional, Sequence,
                    Tuple, Union)

from ..cluster import actions as A
from ..cluster.actions import AclChange
from ..cluster.cluster import Cluster
from ..client.consumer import Consumer, resolve_offset
from ..client.groups import (GroupStore, OffsetAndMetadata, live_offsets, require_group,
                              topic_ids)
from ..cluster.features import CLIENT_QUOTAS, REPLICATION
from ..cluster.isr import check_reassign, replica_lag
from ..cluster.log_dirs import add_log_dir, log_dir_name, noting_offline, remove_log_dir
from ..cluster.partition_state import split_key
from ..maintenance.retention import (DeleteRecordsDryRun, DeleteRecordsResult, RetentionPlan,
                                   collect_garbage, delete_records, delete_records_dry_run,
                                   offline_error, retention)
from ..client.producer import Producer
from ..cluster.quotas import (DEFAULT_ENTITY as DEFAULT_QUOTA_ENTITY, QUOTA_CONFIGS,
                              check_new_entity as check_new_quota_entity, check_new_rate,
                              describe as describe_quotas)
from ..maintenance.repair import PartitionRepair, repair
from ..coordinator.follow import DEFAULT_POLL_INTERVAL_MS, Follower
from ..coordinator.quota_client import QuotaClient
from ..errors import (InvalidConfigError, InvalidReplicaAssignmentError, InvalidRequestError,
                      UnknownTopicOrPartitionError, error_for)
from ..format.records import DecodedRecord, Record
from ..log.logdir import LogDir
from .results import (ConsumerRecord, GroupPartitionLag, ListOffsetsResult, LogDirInfo,
                      RecordMetadata, TopicDescription, TopicPartition, describe_topic_result)



class Admin:
    def __init__(self, cluster: Union[str, Cluster], *, principal: Optional[str] = None,
                 create: bool = True, client_id: Optional[str] = None,
                 coordinator_token_file: Optional[str] = None, **options):
        """``client_id``: Kafka's ``client.id``, whose quotas (KIP-13) :meth:`produce` and
        :meth:`consume` count against (default: the empty client id, which shares the
        ``<default>`` quota); the active coordinator enforces them, reached with
        ``coordinator_token_file`` (else ``$KAFKALOG_COORDINATOR_TOKEN``)."""
        self.cluster = cluster if isinstance(cluster, Cluster) else Cluster(
            cluster, principal=principal, create=create, **options)
        self.groups = GroupStore(self.cluster.storage, guard=self.cluster.check_writable)
        self.quota = QuotaClient(self.cluster, client_id, token_file=coordinator_token_file)

    @property
    def client_id(self) -> str:
        return self.quota.client_id

    def throttle_stats(self) -> Dict[str, object]:
        """What this Admin's produce and consume calls waited for their quotas, with Kafka's
        client metric names (``produce-throttle-time-max`` / ``-avg``,
        ``fetch-throttle-time-max`` / ``-avg``, in ms)."""
        return self.quota.summary()

    # -- topics -------------------------------------------------------------------------------

    def create_topic(self, name: str, num_partitions: int = 1, replication_factor: int = 1,
                     configs: Optional[Mapping[str, object]] = None) -> TopicDescription:
        return describe_topic_result(self.cluster.create_topic(name, num_partitions, replication_factor,
                                                   dict(configs or {})))

    def delete_topic(self, name: str) -> None:
        self.cluster.delete_topic(name)

    def list_topics(self) -> List[str]:
        return self.cluster.list_topics()

    def describe_topic(self, name: str) -> TopicDescription:
        return describe_topic_result(self.cluster.describe_topic(name))

    def alter_configs(self, topic: str, set_configs: Optional[Mapping[str, object]] = None,
                      delete: Sequence[str] = ()) -> TopicDescription:
        return describe_topic_result(self.cluster.alter_configs(topic, dict(set_configs or {}), list(delete)))

    def create_partitions(self, topic: str, total: int) -> TopicDescription:
        return describe_topic_result(self.cluster.create_partitions(topic, total))

    # -- data ---------------------------------------------------------------------------------

    def produce(self, topic: str, records: Iterable[Union[Record, tuple]], *,
                partition: Optional[int] = None, compression=None, acks=None,
                request_timeout_ms: Optional[int] = None,
                delivery_timeout_ms: Optional[int] = None,
                retry_backoff_ms: Optional[int] = None) -> List[RecordMetadata]:
        """Write records as one atomic unit; returns where each landed (acknowledged).
        ``acks``: ``"all"`` (default: once the ISR of each replicated partition holds them) or
        ``"1"`` (at the leader), docs/protocol.md §1.3; ``request_timeout_ms``: how long
        acks=all waits (default 30000) before it aborts the write. A write that fails with a
        retriable error (an election, the ISR below ``min.insync.replicas``, that timeout) is
        written again, as Kafka's producer does, every ``retry_backoff_ms`` (100) until
        ``delivery_timeout_ms`` (120000; 0: never): a failed attempt was aborted, so no record
        is ever written twice (docs/protocol.md §3)."""
        recs = [r if isinstance(r, Record) else Record(*r) for r in records]
        if not recs:
            return []
        retries = {k: v for k, v in (("delivery_timeout_ms", delivery_timeout_ms),
                                     ("retry_backoff_ms", retry_backoff_ms)) if v is not None}
        placed = Producer(self.cluster, acks=acks, request_timeout_ms=request_timeout_ms,
                          quota=self.quota, **retries
                          ).produce(topic, recs, partition=partition, compression=compression)
        return [RecordMetadata(topic, p, o) for p, o in placed]

    def _partitions(self, topic: str, partition: Optional[int]) -> List[int]:
        n = self.cluster.partition_count(topic)
        if partition is None:
            return list(range(n))
        if not isinstance(partition, int) or not 0 <= partition < n:
            raise UnknownTopicOrPartitionError(f"no partition {topic}-{partition}")
        return [partition]

    def consume(self, topic: str, partition: Optional[int] = None, *, start="earliest",
                max_records: Optional[int] = None, isolation_level: str = "read_committed",
                group: Optional[str] = None, enable_auto_commit: bool = True,
                auto_commit_interval_ms: int = 5000, follow: bool = False,
                poll_interval_ms: int = DEFAULT_POLL_INTERVAL_MS,
                on_caught_up: Optional[Callable[[], None]] = None,
                on_data_loss: Optional[Callable[[str], None]] = None) -> Consumer:
        """A :class:`Consumer`: an iterator of :class:`ConsumerRecord`, partition by partition,
        that holds one bounded fetch at a time (``list(...)`` for all of them at once).

        With ``group``, partitions where the group has committed offsets resume from them
        (unless ``start`` is other than ``"earliest"``), and offsets are committed as Kafka's
        consumer does with ``enable.auto.commit``, but only for records the caller has
        *consumed*: a record counts once the next one is asked for, or the iteration ends.
        Commits happen at most every ``auto_commit_interval_ms`` while iterating, at the end,
        and on ``close()`` / leaving a ``with`` block; ``commit()`` commits every record handed
        out so far (Kafka's ``commitSync()``). An abandoned iterator commits nothing more::

            with admin.consume("orders", group="billing") as records:
                for r in records:
                    bill(r)          # a crash here re-delivers r next time, never skips it

        ``follow=True`` (``kafka-console-consumer``): a :class:`Follower` that does not end at
        the end of the log but polls every ``poll_interval_ms`` for records committed since
        (through an incremental fetch session), and reads partitions added to the topic
        meanwhile when ``partition`` is None. ``on_caught_up()`` is called each time everything
        committed so far has been handed out, before it waits; records deleted before they were
        read are skipped with a message to ``on_data_loss`` (default: a logged warning); a
        deleted topic raises :class:`UnknownTopicIdError`. It ends at ``max_records`` or
        ``close()``.
        """
        parts = self._partitions(topic, partition)
        options = dict(start=start, max_records=max_records, isolation_level=isolation_level,
                       group=group, enable_auto_commit=enable_auto_commit,
                       auto_commit_interval_ms=auto_commit_interval_ms,
                       wrap=lambda p, r: _consumer_record(topic, p, r), quota=self.quota)
        if not follow:
            if on_caught_up is not None or on_data_loss is not None:
                raise InvalidConfigError("on_caught_up and on_data_loss need follow=True")
            return Consumer(self.cluster, topic, parts, **options)
        if on_data_loss is not None:
            options["on_data_loss"] = on_data_loss
        return Follower(self.cluster, topic, parts, new_partitions=partition is None,
                        poll_interval_ms=poll_interval_ms, on_caught_up=on_caught_up, **options)

    def list_offsets(self, specs: Mapping[TopicPartition, object],
                     isolation_level: str = "read_committed") -> Dict[TopicPartition, ListOffsetsResult]:
        """earliest / latest / a timestamp in ms (Kafka's ``offsetsForTimes``) per partition."""
        state = self.cluster.state()
        out = {}
        for tp, spec in specs.items():
            tp = TopicPartition(*tp)
            view = self.cluster.partition_view(tp.topic, tp.partition, state,
                                               isolation_level=isolation_level)
            if isinstance(spec, int) and not isinstance(spec, bool):
                spec = ("timestamp", spec)
            offset, ts = resolve_offset(view, spec)
            out[tp] = ListOffsetsResult(offset, ts)
        return out

    def delete_records_before(self, offsets: Mapping[TopicPartition, int]
                              ) -> Dict[TopicPartition, DeleteRecordsResult]:
        """KIP-107: per partition the new low watermark, or an error (``-1`` = high watermark)."""
        res = delete_records(self.cluster, {TopicPartition(*tp): o for tp, o in offsets.items()})
        return {TopicPartition(*tp): r for tp, r in res.items()}

    def delete_records_dry_run(self, offsets: Mapping[TopicPartition, int]
                               ) -> Dict[TopicPartition, DeleteRecordsDryRun]:
        """What ``delete_records_before`` would answer now, and each partition's current log
        start offset and high watermark; changes nothing."""
        res = delete_records_dry_run(self.cluster,
                                     {TopicPartition(*tp): o for tp, o in offsets.items()})
        return {TopicPartition(*tp): r for tp, r in res.items()}

    def retention(self, *, dry_run: bool = False, now_ms: Optional[int] = None,
                  partitions: Optional[List[TopicPartition]] = None) -> List[RetentionPlan]:
        """The plans applied (or, with ``dry_run``, that would be). A log dir that cannot be
        reached is skipped and the rest done; then ``OfflineLogDirError`` names it, with the
        plans as its ``done``."""
        return retention(self.cluster, dry_run=dry_run, now_ms=now_ms,
                         partitions=[tuple(tp) for tp in partitions] if partitions else None)

    def cleanup(self, *, compact_now: bool = False) -> Dict[str, List[str]]:
        """What was removed or rewritten, by kind (``cleaned``: compacted segments, §4.2).
        ``compact_now``: clean every compacted partition with dirty records, due or not. A log
        dir that cannot be reached is skipped and the others cleaned; then
        ``OfflineLogDirError`` names it, with this dict as its ``done``."""
        return collect_garbage(self.cluster, compact_now=compact_now)

    def repair_partition(self, topic: str, partition: Optional[int] = None, *,
                         dry_run: bool = False) -> List[PartitionRepair]:
        """Check every batch of the committed segments of one partition of ``topic`` (or all);
        replace damaged segments by their intact batches and rebuild wrong indexes, never in
        place, and report the offsets lost (docs/protocol.md §7.1). ``dry_run``: report only."""
        return repair(self.cluster, topic, partition, dry_run=dry_run)

    def describe_log_dirs(self) -> Dict[str, Dict[TopicPartition, Optional[int]]]:
        """Bytes on storage per partition replica, per log dir (visible segments only).

        A log dir that cannot be read (a root not mounted, a URL that no longer holds it, a
        storage that fails; its ``meta.properties`` missing) does not stop the others, as
        Kafka's DescribeLogDirs answers KAFKA_STORAGE_ERROR for that log dir alone: every other
        one is described, then :class:`OfflineLogDirError` names it (``offline``: name -> why),
        with the description as its ``done``, where that log dir's replicas have size None."""
        state = self.cluster.state()
        names = self.cluster.log_dir_names(state)
        out: Dict[str, Dict[TopicPartition, Optional[int]]] = {d: {} for d in names}
        offline: Dict[str, str] = {}
        for d in names:
            with noting_offline(offline, d):
                if LogDir(self.cluster.storage, d).read_meta() is None:
                    offline[d] = f"{d}/meta.properties is missing: its root is away"
        for topic, p in self.cluster.partitions(state):
            for d in state.topics[topic]["replicas"][p]:
                tp = TopicPartition(topic, p)
                out.setdefault(d, {})[tp] = None
                if d in offline:
                    continue
                with noting_offline(offline, d):
                    view = self.cluster.partition_view(topic, p, state, logdir=d)
                    out[d][tp] = view.log.size_in_bytes()
        if offline:
            for d in offline:
                out[d] = dict.fromkeys(out.get(d, {}), None)
            raise offline_error("log-dirs --describe", offline, [], out)
        return out

    def replica_lags(self) -> Dict[str, Dict[TopicPartition, int]]:
        """Per log dir, per partition replica there, its offset lag behind the last stable
        offset (Kafka's DescribeLogDirs ``offsetLag``; 0 for leaders)."""
        state = self.cluster.state()
        out: Dict[str, Dict[TopicPartition, int]] = {}
        for topic, p in self.cluster.partitions(state):
            replicas = state.topics[topic]["replicas"][p]
            ps = state.partition(topic, p)
            for d in replicas:
                out.setdefault(d, {})[TopicPartition(topic, p)] = replica_lag(ps, d, replicas)
        return out

    def reassign_partitions(self, assignments: Mapping[Tuple[str, int], Sequence[Union[str, int]]]
                            ) -> Dict[TopicPartition, str]:
        """Start moving partitions to target replicas (Kafka's AlterPartitionReassignments;
        ``kafkalog reassign-partitions --execute``). Targets are log dir names or their numbers
        (Kafka's broker ids): ``{("t", 0): [2, 1]}``. The active coordinator copies to the new
        replicas and completes each move once they are in sync (docs/protocol.md §1.3).
        Returns the error name per partition (``NONE`` when accepted;
        ``REASSIGNMENT_IN_PROGRESS`` for a partition still moving, which is left out of the
        request). The whole request is checked before anything is written, and a bad one
        writes nothing, not even the feature ``replication``: a partition that does not exist
        (:class:`UnknownTopicOrPartitionError`), or targets that are empty, name a log dir twice
        or name one the cluster does not have (:class:`InvalidReplicaAssignmentError`)."""
        state = self.cluster.state()
        known = self.cluster.log_dir_names(state)
        request: Dict[str, List[str]] = {}
        ids: Dict[str, str] = {}
        answers: Dict[TopicPartition, str] = {}
        for (topic, p), targets in assignments.items():
            info = state.topics.get(topic)
            if info is None or not isinstance(p, int) or isinstance(p, bool) \
                    or not 0 <= p < info["partitions"]:
                raise UnknownTopicOrPartitionError(f"no partition {topic}-{p}")
            names = _reassignment_targets(topic, p, targets, known)
            why = check_reassign(state.partition(topic, p), names)
            if why is not None and why[0] != "REASSIGNMENT_IN_PROGRESS":
                raise error_for(*why)
            if why is not None:
                answers[TopicPartition(topic, p)] = why[0]
                continue
            request[f"{topic}:{p}"] = names
            ids[topic] = info["topic_id"]
        if not request:
            return answers
        if REPLICATION not in state.reader_features:
            self.cluster.enable_feature(REPLICATION)
        _, _, results = self.cluster.submit([A.ReassignPartitions(topic_ids=ids,
                                                                  partitions=request)])
        res = results[0]
        if not res.ok:
            raise error_for(res.error, res.message)
        answers.update({TopicPartition(*split_key(k)): r.error
                        for k, r in res.partitions.items()})
        return answers

    def list_partition_reassignments(self) -> Dict[TopicPartition, dict]:
        """Reassignments in progress: replicas, target, adding and removing (Kafka's
        ListPartitionReassignments)."""
        state = self.cluster.state()
        out = {}
        for topic, p in self.cluster.partitions(state):
            rep = state.partition(topic, p).replication
            if rep is not None and "target" in rep:
                replicas = state.topics[topic]["replicas"][p]
                out[TopicPartition(topic, p)] = {
                    "replicas": replicas, "target": rep["target"],
                    "adding": [r for r in rep["target"] if r not in rep["isr"]],
                    "removing": [r for r in replicas if r not in rep["target"]]}
        return out

    # -- client quotas (KIP-13, docs/protocol.md §12) ---------------------------------------------

    def alter_client_quotas(self, entity: Optional[str], set_configs: Optional[Mapping[str, object]]
                            = None, delete: Sequence[str] = ()) -> Dict[str, float]:
        """Set or delete ``producer_byte_rate`` / ``consumer_byte_rate`` (bytes per second) of
        a client id, or of the default entity (``entity=None``); as ``kafka-configs.sh
        --alter --entity-type clients``. Takes effect at the coordinator's next look at the
        log, without a restart. Returns the entity's values after the change.

        Checked as ``kafka-configs.sh`` checks them (docs/protocol.md §12), before anything is
        written: a value is a whole number of bytes per second from 1 to Long.MAX_VALUE
        (``1e-300``, ``1_000``, ``1.5``, ``nan`` are refused), a client id holds no control
        character (unless the call only deletes); else :class:`InvalidConfigError` naming the
        value and the rule. Values are stored as their decimal digits (``1e6`` as
        ``1000000``)."""
        name = DEFAULT_QUOTA_ENTITY if entity is None else entity
        bad = check_new_quota_entity(name, setting=bool(set_configs))
        if bad:
            raise InvalidConfigError(f"client quota entity {name!r}: {bad}")
        values = {}
        for k, v in (set_configs or {}).items():
            if k not in QUOTA_CONFIGS:
                raise InvalidConfigError(f"unknown quota config {k!r}; known: "
                                         f"{', '.join(QUOTA_CONFIGS)}")
            values[k] = check_new_rate(k, v)
        for k in delete:
            if k not in QUOTA_CONFIGS:
                raise InvalidConfigError(f"unknown quota config {k!r}; known: "
                                         f"{', '.join(QUOTA_CONFIGS)}")
        if CLIENT_QUOTAS not in self.cluster.state().reader_features:
            self.cluster.enable_feature(CLIENT_QUOTAS)
        self.cluster.submit_one(A.ClientQuotaChange(entity=name, set=values, delete=list(delete)))
        return self.describe_client_quotas(entity).get(name, {})

    def describe_client_quotas(self, entity: Optional[str] = None) -> Dict[str, Dict[str, float]]:
        """{entity: {config: bytes per second}}: all entities, or the one named (``"<default>"``
        for the default entity)."""
        quotas = describe_quotas(self.cluster.state().client_quotas)
        return quotas if entity is None else {k: v for k, v in quotas.items() if k == entity}

    def list_log_dirs(self) -> List[LogDirInfo]:
        """Every log dir, by number, with its URL (docs/protocol.md §1.1)."""
        return [LogDirInfo(**d) for d in self.cluster.log_dir_info()]

    def add_log_dir(self, url: str, storage_options: Optional[Mapping[str, str]] = None
                    ) -> LogDirInfo:
        """Register a log dir on another root (another bucket, another disk) that topics'
        replicas can be placed on (docs/protocol.md §1.1). ``storage_options`` (strings, e.g.
        ``endpoint_url``) are recorded in the metadata log for every client, so credentials
        are refused: each process takes them from its environment. Refused, with nothing
        written: an unreachable URL (:class:`KafkaStorageError`), another cluster's log dir
        (:class:`InconsistentClusterIdError`), any other non-empty URL
        (:class:`LogDirNotEmptyError`), or one overlapping the root or a known log dir."""
        return LogDirInfo(**add_log_dir(self.cluster, url, storage_options))

    def remove_log_dir(self, name: Union[str, int]) -> LogDirInfo:
        """Remove a registered log dir, named ``logdir-<n>`` or by its number n, that holds no
        replica (docs/protocol.md §1.1); returns it as it was. Refused, with nothing written
        (:class:`InvalidRequestError`): a log dir under the root, a name that is no log dir of
        the cluster, or one that holds a replica of any partition or is a reassignment's
        target (move them first, :meth:`reassign_partitions`). Its files stay at its URL; its
        name is never given to another log dir."""
        return LogDirInfo(**remove_log_dir(self.cluster, name))

    # -- consumer groups ----------------------------------------------------------------------

    def list_groups(self) -> List[str]:
        return self.groups.list_groups()

    def list_group_offsets(self, group: str) -> Dict[TopicPartition, OffsetAndMetadata]:
        """The group's committed offsets, without those of a topic since deleted (or deleted and
        created again under the same name)."""
        ids = topic_ids(self.cluster.state())
        return {TopicPartition(*tp): om for tp, om in self.groups.fetch(group, ids).items()}

    def commit_group_offsets(self, group: str, offsets: Mapping[TopicPartition, object]) -> None:
        state = self.cluster.state()
        clean = {}
        for tp, om in offsets.items():
            om = om if isinstance(om, OffsetAndMetadata) else OffsetAndMetadata(int(om))
            if state.partition(*tp) is None:
                raise UnknownTopicOrPartitionError(f"no partition {tp[0]}-{tp[1]}")
            clean[tuple(tp)] = OffsetAndMetadata(om.offset, om.metadata,
                                                 state.topics[tp[0]]["topic_id"])
        self.groups.commit(group, clean, now_ms=self.cluster.now_ms())

    def describe_group(self, group: str) -> List[GroupPartitionLag]:
        """Committed offset, log end (high watermark) and lag per partition of the group's topics.
        An offset of a topic that was deleted and created again shows as not committed."""
        stored = require_group(self.groups, group)
        state = self.cluster.state()
        committed = live_offsets(stored, topic_ids(state))
        topics = sorted({t for t, _ in stored})
        out = []
        for topic in topics:
            if topic not in state.topics:
                continue
            for p in range(state.topics[topic]["partitions"]):
                hw = state.partition(topic, p).high_watermark
                om = committed.get((topic, p))
                out.append(GroupPartitionLag(topic, p, om.offset if om else None, hw,
                                             None if om is None else max(hw - om.offset, 0)))
        return out

    def reset_group_offsets(self, group: str, topic: str, *, to: str = "earliest",
                            timestamp_ms: Optional[int] = None, shift: Optional[int] = None,
                            dry_run: bool = False) -> Dict[TopicPartition, int]:
        """Kafka's ``--reset-offsets``: ``to`` is earliest, latest, timestamp or shift."""
        state = self.cluster.state()
        if topic not in state.topics:
            raise UnknownTopicOrPartitionError(f"topic {topic!r} does not exist")
        committed = self.groups.fetch(group, topic_ids(state))
        new = {}
        for p in range(state.topics[topic]["partitions"]):
            view = self.cluster.partition_view(topic, p, state)
            if to == "earliest":
                off = view.log_start_offset
            elif to == "latest":
                off = view.high_watermark
            elif to == "timestamp":
                if timestamp_ms is None:
                    raise InvalidConfigError("reset to a timestamp needs timestamp_ms")
                off = resolve_offset(view, ("timestamp", timestamp_ms))[0]
            elif to == "shift":
                if shift is None:
                    raise InvalidConfigError("reset by shift needs shift")
                cur = committed.get((topic, p))
                base = cur.offset if cur else view.log_start_offset
                off = min(max(base + shift, view.log_start_offset), view.high_watermark)
            else:
                raise InvalidRequestError(f"unknown reset target {to!r}: earliest, latest, "
                                          "timestamp or shift")
            new[TopicPartition(topic, p)] = off
        if not dry_run:
            tid = state.topics[topic]["topic_id"]
            self.groups.commit(group, {tp: OffsetAndMetadata(o, topic_id=tid)
                                       for tp, o in new.items()}, now_ms=self.cluster.now_ms())
        return new

    def delete_group(self, group: str) -> None:
        self.groups.delete(group)

    # -- protocol features (docs/protocol.md §2.3) ----------------------------------------------

    def features(self) -> Dict[str, dict]:
        """Each feature the cluster uses or this client knows: kind (reader or writer),
        enabled, supported, description."""
        return self.cluster.features()

    def enable_feature(self, name: str) -> dict:
        """Turn a protocol feature on for every client of the cluster (never off). Returns it as
        :meth:`features` describes it, with ``changed`` False when it was on already (then
        nothing is written); a name this client does not implement raises
        :class:`InvalidRequestError`, with nothing written."""
        return self.cluster.enable_feature(name)

    # -- ACLs ---------------------------------------------------------------------------------

    def add_acl(self, principal: str, topic: str, operation: str, permission: str = "ALLOW") -> None:
        self.cluster.submit_one(AclChange(add=[{"principal": principal, "topic": topic,
                                                "operation": operation.upper(),
                                                "permission": permission.upper()}]))

    def remove_acl(self, principal: str, topic: str, operation: str,
                   permission: str = "ALLOW") -> None:
        self.cluster.submit_one(AclChange(remove=[{"principal": principal, "topic": topic,
                                                   "operation": operation.upper(),
                                                   "permission": permission.upper()}]))

    def list_acls(self) -> List[dict]:
        return list(self.cluster.state().acls)


def _reassignment_targets(topic: str, p: int, targets, known: List[str]) -> List[str]:
    """A partition's reassignment targets as log dir names, checked: a non-empty list of log
    dir names or numbers, distinct, each a log dir of the cluster."""
    where = f"{topic}-{p}"
    if isinstance(targets, (str, bytes)) or not isinstance(targets, Sequence) or not targets:
        raise InvalidReplicaAssignmentError(f"{where}: the target replicas must be a non-empty "
                                            f"list of log dirs, got {targets!r:.80}")
    try:
        names = [log_dir_name(t) for t in targets]
    except InvalidRequestError as exc:
        raise InvalidReplicaAssignmentError(f"{where}: {exc}") from None
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise InvalidReplicaAssignmentError(f"{where}: the target replicas {names} name log "
                                            f"dir(s) {', '.join(twice)} more than once")
    unknown = [n for n in names if n not in known]
    if unknown:
        raise InvalidReplicaAssignmentError(
            f"{where}: log dir(s) {', '.join(unknown)} are not the cluster's "
            f"({', '.join(known)})")
    return names


def _consumer_record(topic: str, partition: int, r: DecodedRecord) -> ConsumerRecord:
    return ConsumerRecord(topic, partition, r.offset, r.timestamp, r.timestamp_type, r.key,
                          r.value, tuple(r.headers), r.magic, r.is_transactional, r.producer_id)
