"""``df.writeStream.format("kafkalog")``: the streaming sink, exactly once per micro-batch.

Each micro-batch is written as the batch sink writes a job (``spark/writer.py``: same options,
columns, partitioner and topic creation): tasks reserve and write, the driver decides the batch
in one metadata entry. The entry is a ``stream_commit`` (docs/protocol.md §3.2) whose sink is the
query id (kept in the checkpoint, so stable across restarts) and whose batch is Spark's batch id.
Spark replays its last planned batch after a restart, with the same id, whenever its commit log
does not record it; if the first run's ``stream_commit`` landed, the log refuses the replay's,
whose writes are then aborted and deleted (``spark_job.commit_stream_batch``). Each batch's rows
are visible exactly once.

Ids. PySpark creates the writer anew for every micro-batch (``streamWriter`` on the driver, then
pickled to the batch's tasks) and once more for the commit, so the writer carries no identity of
its own across calls: a task takes the query and batch ids from Spark's local properties, adds the
``run_id`` of the writer it was pickled with (shared by all attempts of the batch's tasks, new in
a replay), and reports all three in its commit message, from which the driver's commit takes them.

Output modes. Append only: Complete (``overwrite``) would rewrite the whole result every batch,
which an append-only log cannot do; Spark refuses Update itself (the sink does not declare it).
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Iterator, List, Optional

from pyspark.sql.datasource import DataSourceStreamArrowWriter

from ..connector.spark_job import abort_stream_batch, commit_stream_batch, stream_producer_id
from ..errors import InvalidConfigError, InvalidRequestError
from .surface import surfaces_errors
from .write_options import WriteOptions
from .writer import (KafkaLogCommitMessage, pending_writes, prepare_sink, report_throttle,
                     sink_cluster, write_task)

#: Spark's local properties of a streaming write task (StreamExecution, MicroBatchExecution)
QUERY_ID_PROPERTY = "sql.streaming.queryId"
BATCH_ID_PROPERTY = "streaming.sql.batchId"


@dataclass
class KafkaLogStreamCommitMessage(KafkaLogCommitMessage):
    """A task's writes in a micro-batch, with the ids they were reserved under."""

    query: str = ""
    batch: int = -1
    producer: str = ""


@surfaces_errors
class KafkaLogStreamWriter(DataSourceStreamArrowWriter):
    """Created on the driver for each micro-batch (``DataSource.streamWriter``), pickled to its
    tasks; created again on the driver to commit or abort it."""

    def __init__(self, options: WriteOptions, schema, overwrite: bool):
        if overwrite:
            raise InvalidConfigError(
                "output mode Complete is not supported by the kafkalog sink: it would rewrite "
                "the whole result every micro-batch, and a kafkalog topic is an append-only log. "
                "Use outputMode('append')")
        self.options = prepare_sink(options, schema)
        self.schema = schema
        self.run_id = uuid.uuid4().hex

    def write(self, iterator: Iterator) -> KafkaLogStreamCommitMessage:
        from pyspark import TaskContext
        tc = TaskContext.get()
        query = tc.getLocalProperty(QUERY_ID_PROPERTY) if tc is not None else None
        batch = tc.getLocalProperty(BATCH_ID_PROPERTY) if tc is not None else None
        if not query or batch is None:
            raise InvalidRequestError(
                "the kafkalog streaming sink runs in micro-batch streaming queries only: this "
                f"task has no {QUERY_ID_PROPERTY} / {BATCH_ID_PROPERTY}")
        producer = stream_producer_id(query, int(batch), self.run_id)
        message = KafkaLogStreamCommitMessage(query=query, batch=int(batch), producer=producer)
        return write_task(self.options, producer, iterator, message)

    @staticmethod
    def _batch_of(messages, batch_id: int) -> Optional[KafkaLogStreamCommitMessage]:
        """A message naming the micro-batch's ids (all must agree); None when no task
        reported any (failed tasks send None)."""
        msgs: List[KafkaLogStreamCommitMessage] = [
            m for m in messages if isinstance(m, KafkaLogStreamCommitMessage)]
        ids = {(m.query, m.batch, m.producer) for m in msgs}
        if len(ids) > 1 or any(b != batch_id for _, b, _ in ids):
            raise InvalidRequestError(
                f"micro-batch {batch_id}: the tasks' commit messages name different queries, "
                f"batches or runs: {sorted(ids)}")
        return msgs[0] if msgs else None

    def commit(self, messages, batchId: int) -> None:
        pending = pending_writes(messages)
        if not pending:
            return      # nothing written: nothing to commit (stale reservations wait for the next)
        m = self._batch_of(messages, batchId)
        commit_stream_batch(sink_cluster(self.options), pending, m.producer, m.query, batchId,
                            self.options.request_timeout_ms)
        report_throttle(messages, self.options.client_id, f"micro-batch {batchId}")

    def abort(self, messages, batchId: int) -> None:
        m = self._batch_of(messages, batchId)
        if m is None:
            return      # failed tasks abort their own writes; the next run's commit the rest
        abort_stream_batch(sink_cluster(self.options), pending_writes(messages), m.producer)
