"""Writing through the protocol: reserve offsets, write final segments, commit (docs/protocol.md §3).

The three steps are separate methods because a Spark job runs them in different processes: each
task reserves and writes (``write``, returning a :class:`PendingWrite`), and the driver commits
every task's writes in one entry (``commit``), so the job becomes visible all at once.
"""
from __future__ import annotations

import logging
import time
import uuid
from functools import partial
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from ..errors import (FencedLeaderEpochError, InvalidConfigError, InvalidRecordError,
                      KafkaLogError, UnknownTopicOrPartitionError)
from ..errors import error_for
from ..format import codecs
from ..format.encode import EncodedBatch, encode_records
from ..format.partitioner import RoundRobin, partition_for_key
from ..format.records import Record
from ..log.segment_spool import SegmentSpool
from ..log.segment_writer import write_segments
from ..log import validator
from ..log.config import LogConfig
from ..log.write_pool import run_all, worth_concurrent
from ..cluster import actions as A
from .acks import parse_acks, reserve_acks, submit_commit
from ..cluster.checkpoints import sync_checkpoints, written_ranges
from ..cluster.state import split_key, tp_key

TopicPartition = Tuple[str, int]


@dataclass
class PendingWrite:
    """A reserved and written, not yet committed, write (a Spark task's commit message)."""

    txn: str
    ranges: Dict[str, List[int]]          # "topic:p" -> [start, end, leader_epoch]
    segments: Dict[str, List[int]] = field(default_factory=dict)

    def offsets(self) -> Dict[TopicPartition, Tuple[int, int]]:
        """(first, last) offset per partition."""
        return {split_key(k): (r[0], r[1] - 1) for k, r in self.ranges.items()}

    def to_json(self) -> dict:
        return {"txn": self.txn, "ranges": self.ranges, "segments": self.segments}

    @classmethod
    def from_json(cls, d: dict) -> "PendingWrite":
        return cls(d["txn"], d["ranges"], d.get("segments", {}))


def _fitting(records: List[Record], magic: int, codec: int,
             max_message_bytes: int) -> List[EncodedBatch]:
    batch = encode_records(records, magic=magic, compression=codec)
    if len(batch.data) <= max_message_bytes or len(records) == 1:
        return [batch]
    mid = len(records) // 2
    return (_fitting(records[:mid], magic, codec, max_message_bytes)
            + _fitting(records[mid:], magic, codec, max_message_bytes))


def check_append(state, batches: Mapping[TopicPartition, Sequence[EncodedBatch]]) -> None:
    """The broker's checks of every batch (``log.validator``: ``max.message.bytes``, keys in a
    compacted topic), before anything is reserved or written (a topic that does not exist is
    left to the reservation to refuse)."""
    configs: Dict[str, LogConfig] = {}
    for (topic, p), bs in batches.items():
        config = configs.get(topic)
        if config is None:
            if topic not in state.topics:
                continue
            config = configs[topic] = state.topic_config(topic)
        validator.check_append(bs, config, f"{topic}-{p}")


def flushed(state, counts: Mapping[TopicPartition, int], configs: Optional[dict] = None) -> bool:
    """Whether a write of ``counts`` records per partition is flushed before its commit: one
    partition whose topic's ``flush.messages``/``flush.ms`` ask for it is enough, since a write's
    files are synced together (docs/protocol.md §3, "Durability"). ``configs``: a cache of
    parsed topic configs, by topic."""
    configs = {} if configs is None else configs
    for (topic, _), n in counts.items():
        if topic not in configs:
            configs[topic] = state.topic_config(topic)
        if configs[topic].flushes(n):
            return True
    return False


def all_flushed(state, pending: Iterable["PendingWrite"]) -> bool:
    """Whether every write of ``pending`` was flushed by its writer before it was handed over:
    only then may their commit move the recovery point (§8)."""
    configs: dict = {}
    return all(flushed(state, {split_key(k): r[1] - r[0] for k, r in p.ranges.items()}, configs)
               for p in pending)


def span(batches: Sequence[EncodedBatch]) -> int:
    """Offsets a run of batches occupies once they follow each other."""
    return sum(b.last_offset - b.base_offset + 1 for b in batches)


log = logging.getLogger(__name__)

#: Kafka's producer defaults
DEFAULT_DELIVERY_TIMEOUT_MS = 120_000
DEFAULT_RETRY_BACKOFF_MS = 100


def may_retry(exc: KafkaLogError) -> bool:
    """A failed write unit worth another attempt: Kafka's retriable errors, and a unit an
    election or expiry aborted (FENCED_LEADER_EPOCH, retriable in Kafka too)."""
    return exc.retriable or isinstance(exc, FencedLeaderEpochError)


class Producer:
    def __init__(self, cluster, *, transaction_timeout_ms: Optional[int] = None,
                 acks=None, request_timeout_ms: Optional[int] = None, quota=None,
                 delivery_timeout_ms: int = DEFAULT_DELIVERY_TIMEOUT_MS,
                 retry_backoff_ms: int = DEFAULT_RETRY_BACKOFF_MS):
        """``acks``: Kafka's producer setting, ``all`` (default) or ``1`` (docs/protocol.md
        §1.3); ``request_timeout_ms``: how long an acks=all commit waits for the ISR.
        ``quota``: KIP-13 throttling, ``quota.produced(nbytes)`` waiting out the client's
        throttle time after a write is committed and before :meth:`send` returns (its
        acknowledgement); ``coordinator.quota_client.QuotaClient``. None: not throttled.
        ``delivery_timeout_ms`` / ``retry_backoff_ms``: Kafka's producer settings; a unit that
        failed with a retriable error, and of which nothing became visible, is written again
        until then (0: never retried)."""
        self.cluster = cluster
        self.quota = quota
        self.timeout_ms = transaction_timeout_ms or cluster.transaction_timeout_ms
        self.acks = parse_acks(acks)
        self.request_timeout_ms = request_timeout_ms
        for name, value in (("delivery.timeout.ms", delivery_timeout_ms),
                            ("retry.backoff.ms", retry_backoff_ms)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise InvalidConfigError(f"{name} must be an integer >= 0, got {value!r}")
        self.delivery_timeout_ms = delivery_timeout_ms
        self.retry_backoff_ms = retry_backoff_ms

    def encode(self, topic: str, records: Sequence[Record], *, compression=None,
               batch_records: int = 1000, state=None) -> List[EncodedBatch]:
        """Encode records with the topic's message format and codec (``compression.type``).

        A batch that comes out bigger than ``max.message.bytes`` is split in halves, as Kafka's
        producer splits a batch the broker refused, so that only a single record too big for a
        batch of its own fails (in :meth:`write`)."""
        config = self.cluster.topic_config(topic, state)
        magic = config.magic
        codec = compression
        if codec is None:
            codec = 0 if config.compression_type == "producer" else config.compression_type
        codec = codecs.codec_id(codec)
        codecs.check_codec(codec, magic)
        out = []
        for i in range(0, len(records), batch_records):
            chunk = list(records[i:i + batch_records])
            if magic == 0:
                chunk = [r._replace(timestamp=-1, headers=()) for r in chunk]
            elif any(r.headers for r in chunk) and magic < 2:
                raise InvalidRecordError(f"topic {topic!r} uses message format {magic}, "
                                         "which has no record headers")
            out += _fitting(chunk, magic, codec, config.max_message_bytes)
        return out

    def write(self, batches: Mapping[TopicPartition, Sequence[EncodedBatch]],
              spools: Optional[Mapping[TopicPartition, "SegmentSpool"]] = None, *,
              state=None) -> PendingWrite:
        """Reserve offsets for every partition in one entry, then write their segments.

        ``state``: the caller's fresh state, read for this write (a warm produce reads the
        metadata log once, not once per step)
        ``spools``: partitions whose batches are already in temp files
        (``log.segment_spool``); they are published instead of written, unless they no longer
        match (another partition dir or segment size by now), and are discarded either way."""
        spools = dict(spools or {})
        batches = {tp: list(b) for tp, b in batches.items() if b}
        cluster = self.cluster
        try:
            if not batches:
                raise InvalidRecordError("nothing to write")
            state = cluster.state() if state is None else state
            check_append(state, batches)
        except BaseException:
            for spool in spools.values():
                spool.discard()
            raise
        cluster.abort_expired(state)   # dead writers must not hold the high watermark for long
        txn = uuid.uuid4().hex
        counts = {tp_key(*tp): span(b) for tp, b in batches.items()}
        try:
            result = cluster.submit_one(A.Reserve(txn=txn, producer=cluster.metalog.writer_id,
                                                  timeout_ms=self.timeout_ms,
                                                  principal=cluster.principal, partitions=counts,
                                                  acks=reserve_acks(state, self.acks)))
        except BaseException:   # refused (NOT_ENOUGH_REPLICAS, ACLs, ...): nothing to keep
            for spool in spools.values():
                spool.discard()
            raise
        pending = PendingWrite(txn, result.ranges)
        state = cluster.state(refresh=False)
        now = cluster.now_ms()
        jobs = []
        configs = {}   # per topic: parsing it per partition was a cost of 1,000-partition writes
        try:
            for tp, bs in batches.items():
                key = tp_key(*tp)
                start, end, epoch = pending.ranges[key]
                config = configs.get(tp[0])
                if config is None:
                    config = configs[tp[0]] = state.topic_config(tp[0])
                stamped, nxt = [], start
                for b in bs:
                    # the batches are handed over: a bytearray one is stamped, not copied
                    b = validator.stamp(b, nxt, epoch, config, now, in_place=True)
                    stamped.append(b)
                    nxt = b.last_offset + 1
                assert nxt == end, (nxt, end)
                jobs.append(partial(self._write_partition, pending, key,
                                    cluster.partition_dir(*tp, state=state), stamped, config,
                                    spools.get(tp)))
            # each job records its segments in pending as it ends, so that an abort after
            # another partition's failure deletes them too. With many partitions their files
            # are made durable together, once all are written (storage.local_sync.SyncBatch); a
            # write no topic config asks to flush leaves them to the kernel (protocol §3,
            # "Durability")
            durable = flushed(state, {tp: span(bs) for tp, bs in batches.items()}, configs)
            batch = (cluster.storage.sync_batch(durable) if len(jobs) > 1 or not durable
                     else None)
            if batch is not None:
                jobs = [batch.wrap(job) for job in jobs]
            size = sum(len(b.data) for bs in batches.values() for b in bs)
            run_all(jobs, cluster.storage.concurrent_writes
                    and worth_concurrent(size, len(jobs)))
            if batch is not None:
                batch.sync()
        except BaseException:
            self._try_abort([pending])
            raise
        finally:   # every job has ended: this deletes what was not published
            for spool in spools.values():
                spool.discard()
        return pending

    def write_retrying(self, batches: Mapping[TopicPartition, Sequence[EncodedBatch]],
                       spools: Optional[Mapping[TopicPartition, "SegmentSpool"]] = None
                       ) -> PendingWrite:
        """:meth:`write`, written again after a retriable error until ``delivery.timeout.ms``
        (a Spark task's reserve-and-write; its job commits). A failed write was aborted, so
        nothing of it is visible; the spools are used by the first attempt only (a failed one
        discards them)."""
        return self._retrying("write", lambda n: self.write(batches, spools if n == 0 else None))

    def _retrying(self, what: str, attempt, in_doubt=lambda: False):
        """``attempt(n)`` for n = 0, 1, ... until it returns, fails with an error that is not
        retriable (or leaves ``in_doubt()`` true), or ``delivery.timeout.ms`` would pass before
        the next try, ``retry.backoff.ms`` after this one: Kafka's producer's retry rule."""
        deadline = time.monotonic() + self.delivery_timeout_ms / 1000
        n = 0
        while True:
            try:
                return attempt(n)
            except KafkaLogError as exc:
                backoff = self.retry_backoff_ms / 1000
                if in_doubt() or not may_retry(exc) or time.monotonic() + backoff >= deadline:
                    raise
                n += 1
                log.warning("%s: attempt %d failed with %s: %s; retrying in %d ms "
                            "(delivery.timeout.ms %d)", what, n, exc.error_name, exc,
                            self.retry_backoff_ms, self.delivery_timeout_ms)
                time.sleep(backoff)

    def _write_partition(self, pending: PendingWrite, key: str, dir_path: str,
                         stamped: List[EncodedBatch], config,
                         spool: Optional[SegmentSpool]) -> None:
        """One partition's offset-assigned batches as segments: its spool published when it
        still matches, else written (and the spool discarded)."""
        if (spool is not None and spool.dir_path == dir_path
                and spool.matches(stamped, config.segment_bytes)):
            pending.segments[key] = spool.publish(stamped, config)
            return
        if spool is not None:
            spool.discard()
        pending.segments[key] = write_segments(self.cluster.storage, dir_path, stamped, config)

    def commit(self, pending: Iterable[PendingWrite]) -> None:
        """Make every pending write visible at once, or raise (and then none is visible)."""
        pending = list(pending)
        if not pending:
            return
        cluster = self.cluster
        txns = [p.txn for p in pending]
        try:
            _, state, results = submit_commit(cluster, [A.Commit(txns=txns)], txns,
                                              self.request_timeout_ms)
        except BaseException:
            self._try_abort(pending)
            raise
        result = results[0]
        if not result.ok:
            self._try_abort(pending)
            raise error_for(result.error, result.message)
        written = written_ranges(pending)
        sync_checkpoints(cluster, state, sorted(written), written=written,
                         recovery_point=all_flushed(state, pending))

    def _outcome(self, pending: PendingWrite) -> Optional[str]:
        """``pending``'s txn as the log records it: "committed", "aborted", "open", or None
        when the log cannot be read (the caller then raises rather than guess)."""
        try:
            state = self.cluster.state()
        except KafkaLogError:
            return None
        return state.decided.get(pending.txn) or ("open" if pending.txn in state.txns
                                                  else None)

    def abort(self, pending: Iterable[PendingWrite]) -> None:
        pending = list(pending)
        if pending:
            self.cluster.submit([A.Abort(txns=[p.txn for p in pending],
                                         reason="aborted by writer")])
            self._delete_files(pending)

    def _try_abort(self, pending: List[PendingWrite]) -> None:
        try:
            self.abort(pending)
        except Exception:
            pass   # expiry will abort it; cleanup will delete the files

    def _delete_files(self, pending: List[PendingWrite]) -> None:
        cluster = self.cluster
        state = cluster.state(refresh=False)
        for p in pending:
            for key, bases in p.segments.items():
                tp = split_key(key)
                try:
                    d = cluster.partition_dir(*tp, state=state)
                except UnknownTopicOrPartitionError:
                    continue
                for base in bases:
                    for suffix in (".log", ".index", ".timeindex"):
                        cluster.storage.delete(f"{d}/{base:020d}{suffix}")

    def produce(self, topic: str, records: Sequence[Record], *,
                partition: Optional[int] = None, partitions: Optional[Sequence[Optional[int]]] = None,
                compression=None, batch_records: int = 1000) -> List[Tuple[int, int]]:
        """Partition, encode, reserve, write and commit ``records`` as one unit.

        The partition of each record is ``partitions[i]`` or ``partition`` when given, else
        Kafka's default partitioner: murmur2 of the key, and unkeyed records spread evenly.
        Returns ``(partition, offset)`` per record, in input order.
        """
        state = self.cluster.state()
        info = state.topics.get(topic)
        if info is None:
            raise UnknownTopicOrPartitionError(f"topic {topic!r} does not exist")
        n = info["partitions"]
        spread = RoundRobin(n, start=uuid.uuid4().int)
        chosen = []
        for i, rec in enumerate(records):
            p = partitions[i] if partitions is not None else partition
            if p is None:
                p = partition_for_key(rec.key, n) if rec.key is not None else spread()
            if not isinstance(p, int) or not 0 <= p < n:
                raise UnknownTopicOrPartitionError(
                    f"partition {p!r} is out of range for topic {topic!r} ({n} partitions)")
            chosen.append(p)
        by_partition: Dict[int, List[int]] = {}
        for i, p in enumerate(chosen):
            by_partition.setdefault(p, []).append(i)
        batches = {(topic, p): self.encode(topic, [records[i] for i in idxs],
                                           compression=compression, batch_records=batch_records,
                                           state=state)
                   for p, idxs in by_partition.items()}
        offsets = self.send(batches, state=state)
        out: List[Tuple[int, int]] = [(-1, -1)] * len(chosen)
        for p, idxs in by_partition.items():
            first = offsets[(topic, p)][0]
            for j, i in enumerate(idxs):
                out[i] = (p, first + j)
        return out

    def send(self, batches: Mapping[TopicPartition, Sequence[EncodedBatch]], *, state=None
             ) -> Dict[TopicPartition, Tuple[int, int]]:
        """Reserve, write and commit in one call; returns (first, last) offset per partition.

        A unit that fails with a retriable error is written again (new offsets, the same
        records) every ``retry.backoff.ms`` until ``delivery.timeout.ms``, as Kafka's producer
        retries: a failed unit was aborted, so nothing of it is visible and another attempt
        duplicates nothing (docs/protocol.md §3). Where the failure leaves that in doubt (the
        commit's entry may have landed and only its answer failed) the txn's recorded outcome
        decides: committed is success, anything else is retried or raised."""
        doubt = []

        def attempt(n: int) -> PendingWrite:
            pending = None
            try:
                # after a failure, what made it fail (an election, an ISR change) is news
                pending = self.write(batches, state=state if n == 0 else None)
                self.commit([pending])
                return pending
            except KafkaLogError:
                if pending is not None:
                    outcome = self._outcome(pending)
                    if outcome == "committed":
                        return pending     # the commit landed; only its answer failed
                    if outcome is None:
                        doubt.append(pending.txn)   # cannot tell: a retry might duplicate it
                raise

        pending = self._retrying("produce", attempt, lambda: bool(doubt))
        if self.quota is not None:
            self.quota.produced(sum(len(b.data) for bs in batches.values() for b in bs))
        return pending.offsets()


