"""A Spark write job as one write unit of the protocol: open the target, commit or abort the job.

Tasks reserve and write (``arrow_writer.TaskWriter``); the driver decides the whole job in one
metadata entry here: ``commit_job`` commits every task's ``PendingWrite`` at once, ``abort_job``
aborts them and deletes their files (docs/protocol.md §3).

Lost attempts. Spark may run a task more than once (a failed attempt is retried, a slow one is
speculated), and an attempt whose commit message never reaches the driver may still have
reserved offsets. Every reservation of a job is made under one producer id
(``job_producer_id``), so the decision entry also aborts the job's open reservations that it does
not commit, and their files are deleted.

Late attempts. Spark decides a job while attempts may still run (it aborts as soon as one task
fails and kills the others asynchronously), so an attempt can reserve *after* the decision; left
alone, that reservation would hold back its partitions' high watermark until it expires
(``transaction.timeout.ms``). The driver therefore (1) creates the job's *decision marker*
``_kafkalog/jobs/<job>.json`` (create-if-absent), (2) appends the decision entry (its actions
carry the job id in their ``spark_job`` field, which replay ignores), (3) replays and aborts any job
reservation it had not seen. A task, after reserving and writing, aborts its own write if the
marker exists. A reservation whose task checked before (1) was appended before (3) replayed, so
(3) aborts it; a task that checked after (1) aborts itself. Only an attempt that dies between
its reservation and its check is left to expiry. Markers are advisory (nothing else reads them);
the driver deletes old ones (a job's after a day, a streaming batch's after an hour), looking
at most every ten minutes.

Streaming micro-batches (docs/protocol.md §3.2). Each micro-batch is a job of its own, under
``stream_producer_id(query, batch, run)``, committed by ``commit_stream_batch`` with a
``stream_commit`` whose sink is the query id: a batch Spark replays after a restart (same query,
same batch id) is refused by the log if the first run's commit landed, and the replay's files are
deleted. Reservations of the query that no one will commit (earlier runs, whose driver died, and
late attempts of earlier batches) are aborted by the next batch's commit entry.
"""
from __future__ import annotations

import json
import logging
import os
import re
import time
from typing import Dict, Iterable, List, NamedTuple, Optional

from ..errors import (FencedLeaderEpochError, InvalidConfigError, KafkaLogError,
                      TopicAlreadyExistsError, UnknownTopicOrPartitionError, error_for)
from ..log.file_names import parse_segment_file
from ..cluster import actions as A
from ..client.acks import submit_commit, wait_for_replicas
from ..cluster.checkpoints import sync_checkpoints, written_ranges
from ..cluster.cluster import CLUSTER_FILE, Cluster
from ..cluster.config import CLIENT_SETTINGS
from ..cluster.features import STREAMING_SINK
from ..client.producer import PendingWrite, Producer, all_flushed
from ..cluster.state import split_key

log = logging.getLogger(__name__)

PRODUCER_PREFIX = "spark-job:"
STREAM_PRODUCER_PREFIX = "spark-stream:"
#: tag on the driver's commit/abort actions: the job (producer id) they decide
JOBS_DIR = "_kafkalog/jobs"
MARKER_MAX_AGE_S = 24 * 3600
STREAM_MARKER_MAX_AGE_S = 3600
MARKER_SWEEP_INTERVAL_S = 600


# -- opening the target -------------------------------------------------------------------------

def looks_like_kafka_logdir(storage) -> bool:
    names = {i.name for i in storage.list("")}
    if names & {"meta.properties", "replication-offset-checkpoint",
                "recovery-point-offset-checkpoint", "log-start-offset-checkpoint",
                "partition.metadata", "leader-epoch-checkpoint"}:
        return True
    if any(parse_segment_file(n) for n in names):
        return True      # a partition directory
    return any(re.match(r"^.+-\d+$", d) for d in storage.list_dirs(""))


def open_cluster_for_write(path: str, *, create: bool = False, **kwargs) -> Cluster:
    """The cluster at ``path``; a plain Kafka log dir (or nothing) is a clear error.

    With ``create`` an absent or empty root becomes a new cluster (``createTopic=true``).
    """
    from ..storage import open_storage
    if "://" not in path and not create and not os.path.isdir(path):
        raise InvalidConfigError(f"{path} does not exist; it must be a kafkalog cluster root "
                                 "(set createTopic=true to create one)")
    storage_opts = {k: v for k, v in kwargs.items()
                    if k not in CLIENT_SETTINGS}
    storage = open_storage(path, **storage_opts)
    if not storage.exists(CLUSTER_FILE):
        if looks_like_kafka_logdir(storage):
            raise InvalidConfigError(
                f"{path} is a plain Kafka log (or partition) dir, not a kafkalog cluster: it can "
                "be read with spark.read.format('kafkalog') but not written (writes go through "
                "a cluster's metadata log; create one with `kafkalog --cluster URL topics "
                "--create`)")
        if not create:
            raise InvalidConfigError(f"{path} is not a kafkalog cluster root (no {CLUSTER_FILE}); "
                                     "set createTopic=true to create one")
    return Cluster(path, create=create, **kwargs)


def ensure_topic(cluster: Cluster, topic: str, *, create: bool, partitions: int = 1,
                 replication_factor: int = 1, configs: Optional[Dict[str, str]] = None) -> dict:
    """The topic's description, creating it first when asked and absent."""
    state = cluster.state()
    if topic not in state.topics:
        if not create:
            raise UnknownTopicOrPartitionError(
                f"topic {topic!r} does not exist in {cluster.url}; create it first or set "
                "createTopic=true (with topic.partitions, topic.config.*)")
        try:
            cluster.create_topic(topic, partitions, replication_factor, configs or {})
        except TopicAlreadyExistsError:
            pass   # someone else created it meanwhile: write to theirs
    return cluster.describe_topic(topic)


def job_producer_id(job_id: str) -> str:
    return f"{PRODUCER_PREFIX}{job_id}"


class StreamProducer(NamedTuple):
    query: str
    batch: int
    run: str


def stream_producer_id(query_id: str, batch_id: int, run_id: str) -> str:
    """The producer of one micro-batch of one run of a streaming query."""
    return f"{STREAM_PRODUCER_PREFIX}{query_id}:{int(batch_id)}:{run_id}"


def parse_stream_producer(producer: Optional[str]) -> Optional[StreamProducer]:
    if not producer or not producer.startswith(STREAM_PRODUCER_PREFIX):
        return None
    parts = producer[len(STREAM_PRODUCER_PREFIX):].rsplit(":", 2)
    if len(parts) != 3 or not parts[1].isdigit():
        return None
    return StreamProducer(parts[0], int(parts[1]), parts[2])


# -- deciding the job ---------------------------------------------------------------------

def _job_txns(state, producer: str, exclude: Iterable[str]) -> Dict[str, dict]:
    skip = set(exclude)
    return {t: info for t, info in state.txns.items()
            if info.get("producer") == producer and t not in skip}


def _delete_ranges(cluster: Cluster, state, txns: Dict[str, dict]) -> None:
    """Best effort: delete the segment files inside the offset ranges of aborted txns."""
    for info in txns.values():
        for key, (start, end, _epoch) in info["ranges"].items():
            topic, p = split_key(key)
            try:
                d = cluster.partition_dir(topic, p, state=state)
                for f in cluster.storage.list(d):
                    parsed = parse_segment_file(f.name)
                    if parsed and start <= parsed[0] < end:
                        cluster.storage.delete(f"{d}/{f.name}")
            except KafkaLogError:
                continue


def marker_path(producer: str) -> str:
    return f"{JOBS_DIR}/{producer.replace(':', '-')}.json"


def job_decided(cluster: Cluster, producer: str) -> bool:
    """Whether the driver has committed or aborted the job (its marker exists)."""
    return cluster.storage.exists(marker_path(producer))


def _mark_decided(cluster: Cluster, producer: str, outcome: str) -> None:
    """Create the job's decision marker (before the decision entry), and drop old markers."""
    data = json.dumps({"job": producer, "decision": outcome, "timestamp": cluster.now_ms()})
    try:
        cluster.storage.create_if_absent(marker_path(producer), data.encode())
    except KafkaLogError:
        pass   # exists already (a retried commit/abort)
    _sweep_markers(cluster)


#: cluster url -> when this process last swept old markers (time.monotonic)
_LAST_SWEEP: Dict[str, float] = {}


def _sweep_markers(cluster: Cluster) -> None:
    """Delete old decision markers, at most once per ``MARKER_SWEEP_INTERVAL_S`` per process:
    a streaming query decides a batch every few seconds, and listing (plus one mtime per
    marker) at every commit would cost O(markers). A stream's markers matter only while its
    batch's task attempts can still run, so they go after an hour, a job's after a day."""
    now_mono = time.monotonic()
    last = _LAST_SWEEP.get(cluster.url)
    if last is not None and now_mono - last < MARKER_SWEEP_INTERVAL_S:
        return
    _LAST_SWEEP[cluster.url] = now_mono
    stream_marker = marker_path(STREAM_PRODUCER_PREFIX).rsplit("/", 1)[1][:-len(".json")]
    try:
        now = cluster.storage.clock(JOBS_DIR)   # compared with the markers' mtimes: their clock
        for f in cluster.storage.list(JOBS_DIR):
            if not f.name.endswith(".json"):
                continue
            path = f"{JOBS_DIR}/{f.name}"
            max_age = (STREAM_MARKER_MAX_AGE_S if f.name.startswith(stream_marker)
                       else MARKER_MAX_AGE_S)
            if now - cluster.storage.mtime(path) > max_age:
                cluster.storage.delete(path)
    except KafkaLogError:
        pass


def abort_writes(cluster: Cluster, pending: List[PendingWrite], producer: str,
                 reason: str, stale: Optional[Dict[str, dict]] = None) -> List[str]:
    """One abort entry for ``pending`` (and ``stale`` job txns); then delete the files of what
    is aborted now. Files of a txn that turns out committed are never touched."""
    txns = list(dict.fromkeys([p.txn for p in pending] + sorted(stale or {})))
    if not txns:
        return []
    _, state, results = cluster.submit([A.Abort(txns=txns, spark_job=producer, reason=reason)])
    res = results[0]
    gone = set(getattr(res, "aborted", [])) | {t for t, o in getattr(res, "skipped", {}).items()
                                               if o == "aborted"}
    Producer(cluster)._delete_files([p for p in pending if p.txn in gone])
    _delete_ranges(cluster, state, {t: i for t, i in (stale or {}).items() if t in gone})
    return sorted(gone)


def _sweep_late(cluster: Cluster, producer: str, decided: Iterable[str]) -> None:
    """After the decision entry: abort the job's reservations appended before it but not seen
    when it was written (tasks check for the decision themselves after that)."""
    late = _job_txns(cluster.state(), producer, decided)
    if late:
        abort_writes(cluster, [], producer, "spark task attempt reserved while its job was "
                     "decided", late)


def commit_job(cluster: Cluster, pending: List[PendingWrite], producer: str,
               request_timeout_ms: Optional[int] = None) -> None:
    """Commit every task's writes in ONE entry, aborting the job's other reservations in it.
    acks=all writes first wait for the ISR (docs/protocol.md §1.3): before the decision
    marker, so that a job that cannot be replicated is aborted (Spark calls ``abort_job``)."""
    cluster.metalog.writer_id = producer
    txns = list(dict.fromkeys(p.txn for p in pending))
    wait_for_replicas(cluster, txns, request_timeout_ms)
    _mark_decided(cluster, producer, "commit")
    stale = _job_txns(cluster.state(), producer, txns)
    _decide_commit(cluster, pending, producer,
                   A.Commit(txns=txns, spark_job=producer) if txns else None, stale,
                   request_timeout_ms)


def _decide_commit(cluster: Cluster, pending: List[PendingWrite], producer: str,
                   commit: Optional[A.Action], stale: Dict[str, dict],
                   request_timeout_ms: Optional[int] = None) -> bool:
    """Append ``commit`` (None: nothing to commit) and the abort of ``stale`` as ONE entry,
    after the decision marker exists. False when the log refused the commit as a replay of a
    committed micro-batch (its writes are then aborted); any other refusal raises."""
    actions = [commit] if commit is not None else []
    if stale:
        actions.append(A.Abort(txns=sorted(stale), spark_job=producer,
                               reason="spark task attempt not committed by its job"))
    if not actions:     # an empty job: nothing to decide but late attempts
        _sweep_late(cluster, producer, ())
        return True
    txns = list(commit.txns) if commit is not None else []
    if commit is not None:   # acks=all: the ISR may have grown since the wait (§1.3)
        try:
            _, new_state, results = submit_commit(cluster, actions, txns, request_timeout_ms)
        except KafkaLogError:   # the ISR could not hold it in time: nothing of it may show
            abort_writes(cluster, pending, producer, "spark job commit: the ISR did not hold "
                         "it (acks=all)", stale)
            _sweep_late(cluster, producer, txns + sorted(stale))
            raise
    else:
        _, new_state, results = cluster.submit(actions)
    aborted = set(getattr(results[-1], "aborted", None) or []) if stale else set()
    stale_gone = {t: i for t, i in stale.items() if t in aborted}
    if commit is not None and not results[0].ok:
        replay = results[0].error == "DUPLICATE_SEQUENCE_NUMBER"
        abort_writes(cluster, pending, producer,
                     "replay of a micro-batch committed before" if replay
                     else "spark job commit rejected")
        _delete_ranges(cluster, new_state, stale_gone)
        _sweep_late(cluster, producer, txns + sorted(stale))
        if replay:
            return False
        err = error_for(results[0].error, results[0].message)
        if isinstance(err, FencedLeaderEpochError):
            raise FencedLeaderEpochError(
                f"the job could not be committed, nothing of it is visible: {err}. A task's "
                "reserved offsets must be committed within transaction.timeout.ms "
                f"({cluster.transaction_timeout_ms} ms) of its reservation; raise that option "
                "for long jobs") from None
        raise err
    # committed: from here on nothing may fail the job (Spark would call abort())
    try:
        _delete_ranges(cluster, new_state, stale_gone)
        _sweep_late(cluster, producer, txns + sorted(stale))
        written = written_ranges(pending)
        sync_checkpoints(cluster, new_state, sorted(written), written=written,
                         recovery_point=all_flushed(new_state, pending))
    except Exception:   # derived files and garbage: maintenance redoes both
        pass
    return True


def abort_job(cluster: Cluster, pending: List[PendingWrite], producer: str) -> None:
    """Abort every write of the job (those reported and those of lost attempts); delete files."""
    cluster.metalog.writer_id = producer
    _mark_decided(cluster, producer, "abort")
    txns = list(dict.fromkeys(p.txn for p in pending))
    stale = _job_txns(cluster.state(), producer, txns)
    abort_writes(cluster, pending, producer, "spark job aborted", stale)
    _sweep_late(cluster, producer, txns + sorted(stale))




# -- streaming micro-batches (§3.2) --------------------------------------------------------------

def _stream_txns(state, sink: str, batch: int, exclude: Iterable[str]) -> Dict[str, dict]:
    """Open reservations of ``sink``'s micro-batches up to ``batch`` that this commit does not
    commit: lost attempts of this batch, earlier runs' (their driver died, and Spark replays
    their batch with the same id) and late attempts of earlier batches (decided already, as
    Spark starts a batch only after the previous one committed)."""
    skip = set(exclude)
    out = {}
    for t, info in state.txns.items():
        p = parse_stream_producer(info.get("producer"))
        if p is not None and p.query == sink and p.batch <= batch and t not in skip:
            out[t] = info
    return out


def commit_stream_batch(cluster: Cluster, pending: List[PendingWrite], producer: str,
                        sink: str, batch: int, request_timeout_ms: Optional[int] = None) -> bool:
    """Commit a micro-batch at most once per (sink, batch), in ONE entry that also aborts the
    sink's stale reservations. False when the batch had been committed before (a replay after a
    restart): the replay's writes are aborted and their files deleted, and the batch counts as
    committed, since the first run's records are visible. An empty micro-batch commits nothing."""
    cluster.metalog.writer_id = producer
    txns = list(dict.fromkeys(p.txn for p in pending))
    if not txns:
        return True
    wait_for_replicas(cluster, txns, request_timeout_ms)   # acks=all (§1.3), before deciding
    if STREAMING_SINK not in cluster.state().reader_features:
        # its own entry before the first stream_commit (§2.3); a concurrent enabler's entry
        # only makes ours a no-op
        cluster.enable_feature(STREAMING_SINK)
    _mark_decided(cluster, producer, "commit")
    stale = _stream_txns(cluster.state(), sink, batch, txns)
    committed = _decide_commit(cluster, pending, producer,
                               A.StreamCommit(txns=txns, sink=sink, batch=int(batch),
                                              spark_job=producer), stale, request_timeout_ms)
    if not committed:
        log.info("batch %d of query %s was committed before (replayed after a restart); its "
                 "rewrite is discarded", batch, sink)
    return committed


def abort_stream_batch(cluster: Cluster, pending: List[PendingWrite], producer: str) -> None:
    """Abort a micro-batch: as ``abort_job`` (its sink's last committed batch stays)."""
    abort_job(cluster, pending, producer)
