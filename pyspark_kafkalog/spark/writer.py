"""``df.write.format("kafkalog")``: the batch sink, and the shuffle helper that goes with it.

Thin by design: each task hands its Arrow batches to ``connector.arrow_writer.TaskWriter`` (encode
per partition, reserve, write final segments) and returns the pending writes as its commit
message; the driver commits all of them in one metadata entry (``commit_job``), so a job's
records appear at once, or aborts them (``abort_job``). Options: ``spark.write_options``.

Save modes. PySpark 4.3 hands a Python data source only ``overwrite`` (True for
``mode("overwrite")``, False for ``mode("append")``); it refuses the other modes itself, before
any data source code runs, with ``[UNSUPPORTED_DATA_SOURCE_SAVE_MODE]``. ErrorIfExists, Spark's
default, which Spark's Kafka sink treats as Append, becomes an append in the driver
(``spark/save_mode.py``, installed by ``register``); Ignore stays refused by Spark, as Spark's
Kafka sink refuses it; Overwrite fails here (a Kafka log is append-only).

No shuffle in the sink: a Python data source cannot ask Spark for a distribution of its input
(``PythonWrite`` has no ``RequiresDistributionAndOrdering``), so every task writes every partition
its rows map to — with T tasks and P partitions up to T x P segments per job.
:func:`repartition_by_kafka_partition` shuffles rows so that each Kafka partition is written by
exactly one task (P segments per job); see docs/spark-write.md for what each choice costs.
"""
from __future__ import annotations

import logging
import os
import uuid
from dataclasses import dataclass, field, replace
from typing import Iterator, List, Optional

from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage

from ..connector.arrow_writer import COLUMNS, IGNORED_COLUMNS, TaskWriter, check_schema
from ..connector.spark_job import (abort_job, commit_job, ensure_topic, job_producer_id,
                                 open_cluster_for_write)
from ..cluster.cluster import Cluster
from ..client.producer import PendingWrite
from ..cluster.quotas import PRODUCE
from ..coordinator.quota_client import ThrottleStats, planned_coordinator
from ..errors import InvalidConfigError
from . import worker_gc
from .quota import log_throttled, task_quota
from .surface import surfaces_errors
from .write_options import WriteOptions

log = logging.getLogger(__name__)


@dataclass
class KafkaLogCommitMessage(WriterCommitMessage):
    """What one task reserved and wrote: its ``PendingWrite``\\ s (JSON) and counts."""

    pending: List[dict] = field(default_factory=list)
    records: int = 0
    batches: int = 0
    bytes: int = 0
    segments: int = 0
    #: the task's wait for its client id's produce quota (``ThrottleStats.to_json``)
    throttle: dict = field(default_factory=dict)

    def pending_writes(self) -> List[PendingWrite]:
        return [PendingWrite.from_json(d) for d in self.pending]


def _arrow_schema(schema):
    """The Spark schema as Arrow, one field at a time so that a bad type names its column."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_type
    fields = []
    for f in schema.fields:
        try:
            fields.append(pa.field(f.name, to_arrow_type(f.dataType, timezone="UTC")))
        except Exception as exc:
            raise InvalidConfigError(f"column {f.name!r} has type {f.dataType.simpleString()}, "
                                     f"which the kafkalog sink cannot take ({exc})") from None
    return pa.schema(fields)


def _check_columns(schema, topic: Optional[str]) -> None:
    unknown = [f for f in schema.fields if f.name not in COLUMNS + IGNORED_COLUMNS]
    if unknown:   # the name error first: an odd type in an unknown column is not the point
        import pyarrow as pa
        check_schema(pa.schema([pa.field(f.name, pa.binary()) for f in schema.fields]), topic)
    check_schema(_arrow_schema(schema), topic)


def _absolute(path: str) -> str:
    return path if "://" in path else os.path.abspath(path)


def prepare_sink(options: WriteOptions, schema) -> WriteOptions:
    """On the driver, before any task: check the columns, open the cluster (creating it and the
    topic when asked). The options with the path made absolute, for the tasks."""
    _check_columns(schema, options.topic)
    options = replace(options, path=_absolute(options.path))
    cluster = open_cluster_for_write(options.path, create=options.create_topic,
                                     **options.cluster_kwargs())
    if options.topic is not None:
        ensure_topic(cluster, options.topic, create=options.create_topic,
                     partitions=options.topic_partitions,
                     replication_factor=options.topic_replication_factor,
                     configs=options.topic_configs)
    # the coordinator the tasks report their bytes to (KIP-13), found once here
    return replace(options, coordinator=planned_coordinator(
        cluster, cluster.state(refresh=False), options.client_id, PRODUCE))


def sink_cluster(options: WriteOptions, shared_state: bool = False) -> Cluster:
    """The cluster a sink writes to; ``shared_state`` for tasks, which Spark runs one after
    another in reused Python workers (the driver's commit runs in a fresh one)."""
    return Cluster(options.path, create=False, shared_state=shared_state,
                   **options.cluster_kwargs())


def write_task(options: WriteOptions, producer: str, iterator: Iterator,
               message=None) -> KafkaLogCommitMessage:
    """One task: reserve and write its rows under ``producer``; ``message`` (a
    ``KafkaLogCommitMessage``) gets the pending writes and counts."""
    worker_gc.freeze_once()
    cluster = sink_cluster(options, shared_state=True)
    tw = TaskWriter(cluster, options, producer=producer)
    quota = task_quota(options.path, options.storage_options, options.client_id,
                       options.coordinator_token_file, cluster, options.coordinator) \
        if options.coordinator else None
    reported = 0
    try:
        # KIP-13: the record batches each Arrow batch closed are reported, and the wait done,
        # before the task takes the next; the job commits (acknowledges) only after its
        # tasks return, so the acknowledgement is what is delayed
        for batch in iterator:
            tw.add(batch)
            encoded = tw.stats.bytes + tw.encoded_bytes
            if quota is not None and encoded > reported:
                quota.produced(encoded - reported)
                reported = encoded
        pending = tw.finish()
        if quota is not None:
            quota.produced(tw.stats.bytes - reported)
    except BaseException:
        tw.abort()
        raise
    s = tw.stats
    message = message if message is not None else KafkaLogCommitMessage()
    if quota is not None:
        log_throttled(quota, "write task")
        message.throttle = quota.stats[PRODUCE].to_json()
    message.pending = [p.to_json() for p in pending]
    message.records, message.batches = s.records, s.batches
    message.bytes, message.segments = s.bytes, s.segments
    return message


def pending_writes(messages) -> List[PendingWrite]:
    """The pending writes of the tasks' commit messages (None: a task that failed)."""
    return [p for m in messages if isinstance(m, KafkaLogCommitMessage)
            for p in m.pending_writes()]


@surfaces_errors
class KafkaLogWriter(DataSourceArrowWriter):
    """Created on the driver (``DataSource.writer``), pickled to every task and to the commit."""

    def __init__(self, options: WriteOptions, schema, overwrite: bool):
        if overwrite:
            raise InvalidConfigError(
                "save mode Overwrite is not supported: a kafkalog topic is an append-only log. "
                "Use mode('append'); to remove old records use delete-records or retention")
        self.options = prepare_sink(options, schema)
        self.schema = schema
        self.job_id = uuid.uuid4().hex
        self.producer = job_producer_id(self.job_id)

    def _cluster(self) -> Cluster:
        return sink_cluster(self.options)

    def write(self, iterator: Iterator) -> KafkaLogCommitMessage:
        return write_task(self.options, self.producer, iterator)

    def commit(self, messages) -> None:
        commit_job(self._cluster(), pending_writes(messages), self.producer,
                   self.options.request_timeout_ms)
        report_throttle(messages, self.options.client_id, "write")

    def abort(self, messages) -> None:
        abort_job(self._cluster(), pending_writes(messages), self.producer)


def report_throttle(messages, client_id: Optional[str], what: str) -> Optional[ThrottleStats]:
    """The tasks' produce-quota waits, summed on the driver and logged at INFO when any task
    waited: where a throttled job shows (Spark gives a Python sink no task metrics)."""
    total = ThrottleStats()
    for m in messages:
        if isinstance(m, KafkaLogCommitMessage):
            total.merge(ThrottleStats.from_json(m.throttle))
    if total.throttled:
        log.info("%s: client id %r was throttled by its produce quota (KIP-13): %d ms in all "
                 "over %d of %d requests, produce-throttle-time-max %d ms, -avg %.1f ms", what,
                 client_id or "", total.total_ms, total.throttled, total.requests,
                 total.max_ms, total.avg_ms)
    return total


# -- the shuffle helper -------------------------------------------------------------------------

def repartition_by_kafka_partition(df, path: Optional[str] = None, topic: Optional[str] = None,
                                   *, num_tasks: Optional[int] = None, **options):
    """``df`` shuffled so that every Kafka partition is written by exactly one Spark task.

    Fills the ``partition`` column with the partition the sink would choose (explicit values
    kept, Kafka's murmur2 for keys, runs of ``batch.records`` rows per partition for unkeyed
    rows) and repartitions on it (spark/shuffle.py): Kafka partition ``p`` of the i-th topic (by
    name) lands in Spark partition ``(first_i + p) % num_tasks``; the default ``num_tasks`` is
    the number of target partitions. Then::

        repartition_by_kafka_partition(df, path, "events") \\
            .write.format("kafkalog").mode("append").option("topic", "events").save(path)

    writes one segment per partition instead of one per (task, partition). ``options`` are the
    sink's (``batch.records``, ``createTopic``, ``topic.partitions``, ``storage.*``, ...); the
    partition counts are read from the cluster now, on the driver.
    """
    from .shuffle import shuffle_by_partition
    opts = dict(options)
    if path is not None:
        opts["path"] = path
    if topic is not None:
        opts["topic"] = topic
    wo = WriteOptions.parse(opts)
    _check_columns(df.schema, wo.topic)
    cluster = open_cluster_for_write(_absolute(wo.path), create=wo.create_topic,
                                     **wo.cluster_kwargs())
    state = cluster.state()
    if wo.topic is not None:
        info = state.topics.get(wo.topic)
        if info is None and not wo.create_topic:
            ensure_topic(cluster, wo.topic, create=False)    # raises the clear error
        counts = {wo.topic: info["partitions"] if info else wo.topic_partitions}
    else:
        counts = {t: info["partitions"] for t, info in state.topics.items()}
    if num_tasks is not None and (not isinstance(num_tasks, int) or num_tasks < 1):
        raise InvalidConfigError(f"num_tasks must be an int >= 1, got {num_tasks!r}")
    if not counts:
        raise InvalidConfigError(f"{wo.path} has no topics to write to")
    return shuffle_by_partition(df, counts, topic=wo.topic, tasks=num_tasks,
                                sticky_rows=wo.batch_records)
