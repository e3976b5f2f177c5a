"""``spark.readStream.format("kafkalog")``: the DataSourceStreamReader, a shell over the layers
below (docs/streaming.md).

Spark runs ``initialOffset``, ``latestOffset``, ``partitions`` and ``commit`` in one long-lived
Python process per query, so that process holds the query's incremental fetch session (KIP-227,
``coordinator.fetch_session``): each trigger replays only the metadata entries written since the
last one and compares only the partitions they touched. ``read`` runs in executors, on a pickled
copy that carries the options only.

What a batch reads follows from its start and end offsets alone (``cluster.stream_plan``), so a
batch Spark replays after a crash reads the same records.
"""
from __future__ import annotations

import logging
import re
import time
import uuid
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (ReadAllAvailable, ReadLimit, ReadMaxBytes,
                                              ReadMaxRows, ReadMinRows,
                                              SupportsTriggerAvailableNow)

from ..cluster.read_plan import ReadSplit, ReadTask, pack, range_bytes, split, starting_offset
from ..cluster.sources import INTERNAL_TOPICS, ClusterSource, normalize_url, open_source
from ..cluster.stream_plan import Limits, SourceOffset, admit, batch_ranges, split_budget
from ..errors import InvalidConfigError, OffsetOutOfRangeError, UnknownTopicOrPartitionError
from . import worker_gc
from .read_options import ReadOptions
from .reader import KafkaLogInputPartition, read_split
from .schema import kafka_schema

log = logging.getLogger(__name__)
TopicPartition = Tuple[str, int]


def _name(tp: TopicPartition) -> str:
    return f"{tp[0]}-{tp[1]}"


class KafkaLogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: ReadOptions, schema):
        expected = kafka_schema(options.include_headers)
        if schema is not None and schema != expected:
            raise InvalidConfigError(
                "format('kafkalog') has a fixed schema (Spark's Kafka source schema) and cannot "
                f"be read with a custom one: expected {expected.simpleString()}, got "
                f"{schema.simpleString()}")
        self.options = options
        self.options.path = normalize_url(options.path)
        self.group_id = options.group_id or (
            f"{options.group_id_prefix}-{uuid.uuid4()}" if options.group_id_prefix else None)
        self._reset()

    def _reset(self) -> None:
        self._cluster = None
        self._positions = None
        self._session = None
        self._target: Optional[Dict[TopicPartition, int]] = None
        self._latest: Dict[TopicPartition, int] = {}
        self._pos: Dict = {}
        self._last_trigger_ms = int(time.time() * 1000)
        self._first_trigger = True
        self._group_committed: Optional[Dict[TopicPartition, int]] = None
        self._bytes_per_offset: Dict[TopicPartition, Tuple[int, float]] = {}
        #: test-visible counters: how much each trigger cost
        self.stats = {"triggers": 0, "full_fetches": 0}

    def __getstate__(self):
        """Executors get the options only: the session and caches live in the planner."""
        return {"options": self.options, "group_id": self.group_id}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._reset()

    # -- the cluster and the fetch session --------------------------------------------------

    def _open(self):
        if self._cluster is not None:
            return
        from ..coordinator.cluster_positions import ClusterPositions, local_cache
        from ..coordinator.fetch_session import FetchSessionClient
        source = open_source(self.options.path, self.options.storage_options)
        if not isinstance(source, ClusterSource):
            raise InvalidConfigError(
                f"readStream.format('kafkalog') needs a kafkalog cluster root; {self.options.path}"
                " is a plain Kafka log dir, which has no metadata log to follow (read it with "
                "spark.read)")
        self._cluster = source.cluster
        self._positions = ClusterPositions(self._cluster)
        self._session = FetchSessionClient(local_cache(), self._positions)

    def _subscribed(self) -> List[TopicPartition]:
        sub = self.options.subscription
        topics = self._positions.topics()
        if sub.kind == "assign":
            return [tp for tp in sub.assign if tp[0] in topics and tp[1] < topics[tp[0]]]
        if sub.kind == "subscribe":
            names = [t for t in sorted(set(sub.topics)) if t in topics]
        else:
            rx = re.compile(sub.pattern)
            names = [t for t in sorted(topics) if t not in INTERNAL_TOPICS and rx.fullmatch(t)]
        return [(t, p) for t in names for p in range(topics[t])]

    def _fetch(self, extra: Sequence[TopicPartition] = ()) -> Dict:
        """Positions of the subscribed partitions (and ``extra`` ones the offsets still name),
        through the fetch session: one refresh of the metadata log, O(what changed)."""
        self._open()
        self._positions.prefetch()
        tps = list(dict.fromkeys(self._subscribed() + list(extra)))
        self._pos = self._session.fetch(tps)
        self.stats["full_fetches"] = getattr(self._session, "full_fetches", 0)
        return self._pos

    # -- offsets ---------------------------------------------------------------------------

    def initialOffset(self) -> dict:
        """Where ``startingOffsets`` (default latest) puts each partition; used only when the
        query has no checkpoint (Spark keeps the rest)."""
        self._open()
        pos = self._fetch()
        tps = [tp for tp, p in pos.items() if p.error is None]
        opts = self.options
        if opts.subscription.kind == "assign":
            missing = sorted(set(opts.subscription.assign) - set(tps))
            if missing:
                raise UnknownTopicOrPartitionError(
                    f"option assign={opts.subscription.value}: partition(s) "
                    f"{', '.join(map(_name, missing))} do not exist in {opts.path}")
        if opts.starting.kind in ("offsets", "timestamps"):
            named = set(opts.starting.lookup())
            if named != set(tps):
                raise InvalidConfigError(
                    f"option {opts.starting.option}={opts.starting.value}: if it names specific "
                    f"partitions it must name all of them (-2 earliest, -1 latest); subscribed: "
                    f"{', '.join(map(_name, sorted(tps))) or 'none'}")
        positions = {}
        source = ClusterSource(opts.path, opts.storage_options, cluster=self._cluster,
                               state=self._positions.state)
        for tp in tps:
            if opts.starting.kind == "earliest":
                positions[tp] = pos[tp].log_start_offset
            elif opts.starting.kind == "latest":
                positions[tp] = pos[tp].high_watermark
            else:
                handle, plog = source.view(*tp)
                positions[tp] = starting_offset(handle, plog, opts)
        self._latest = {tp: pos[tp].high_watermark for tp in tps}
        self._first_trigger = False   # a new query, not a restart: no fast catch-up (KIP-333)
        return SourceOffset(positions, {}).to_json()

    def getDefaultReadLimit(self) -> ReadLimit:
        o = self.options
        if o.max_offsets_per_trigger is not None:
            return ReadMaxRows(o.max_offsets_per_trigger)
        if o.max_bytes_per_trigger is not None:
            return ReadMaxBytes(o.max_bytes_per_trigger)
        if o.min_offsets_per_trigger is not None:
            return ReadMinRows(o.min_offsets_per_trigger)
        return ReadAllAvailable()

    def _limits(self, limit) -> Optional[Limits]:
        """Spark's limit, with the options' other limits: ReadAllAvailable means all of them
        are off (Spark asks so to honour a trigger's semantics)."""
        if limit is None or isinstance(limit, ReadAllAvailable):
            return None
        o = self.options
        out = Limits(o.max_offsets_per_trigger, o.min_offsets_per_trigger,
                     o.max_trigger_delay_ms, o.max_bytes_per_trigger)
        if isinstance(limit, ReadMaxRows):
            out.max_rows = limit.max_rows
        elif isinstance(limit, ReadMaxBytes):
            out.max_bytes = limit.max_bytes
        elif isinstance(limit, ReadMinRows):
            out.min_rows = limit.min_rows
        return out

    def _data_loss(self, message: str) -> None:
        if self.options.fail_on_data_loss:
            raise OffsetOutOfRangeError(
                f"{message}. Some data may have been lost because it is not available any more "
                "(deleted by retention or delete-records, or the topic was deleted or "
                "recreated). If you want the query to go on instead of failing, set the option "
                "failOnDataLoss to false")
        log.warning("%s; failOnDataLoss=false: skipping it", message)

    def _checked_start(self, start: SourceOffset, pos) -> Dict[TopicPartition, int]:
        """The fresh stream's start per partition now subscribed, after the data-loss rules:
        partitions gone, offsets below the log start offset, offsets past the high watermark
        (a recreated topic). New partitions start at their log start offset, as in Spark."""
        out = {}
        for tp, offset in start.positions.items():
            p = pos.get(tp)
            if p is None or p.error is not None:
                self._data_loss(f"partition {_name(tp)} is gone (its topic was deleted or it "
                                f"is no longer subscribed), offsets from {offset} on were not read")
                continue
            if offset > p.high_watermark:
                self._data_loss(f"{_name(tp)}: offset {offset} is past the high watermark "
                                f"{p.high_watermark} (the topic was recreated?)")
                offset = p.log_start_offset
            out[tp] = offset
        for tp, p in pos.items():
            if tp not in out and tp not in start.positions and p.error is None:
                out[tp] = p.log_start_offset
        return out

    def latestOffset(self, start: dict, limit: ReadLimit = None) -> dict:
        t0 = time.monotonic()
        st = SourceOffset.from_json(start)
        if start:
            self._commit_group(st)
        pos = self._fetch(extra=list(st.positions))
        self.stats["triggers"] += 1
        begin = self._checked_start(st, pos)
        latest = {tp: pos[tp].high_watermark for tp in begin}
        self._latest = dict(latest)
        gaps = {tp: g for tp, g in st.gaps.items() if tp in begin}
        if self._target is not None:   # Trigger.AvailableNow: nothing after its start
            latest = {tp: min(latest[tp], self._target.get(tp, begin[tp])) for tp in latest}
            latest = {tp: max(v, begin[tp]) for tp, v in latest.items()}
        fresh_from = dict(begin)
        if self._first_trigger:
            self._first_trigger = False
            backlog = sum(max(0, latest[tp] - max(begin[tp], pos[tp].log_start_offset))
                          for tp in latest)
            if (self.options.fast_catch_up and not gaps and start
                    and backlog > self.options.fast_catch_up_threshold):
                # KIP-333: fresh records first, the backlog read alongside in slices
                gaps = {tp: (begin[tp], latest[tp]) for tp in latest if latest[tp] > begin[tp]}
                fresh_from = {tp: latest[tp] for tp in latest}
                log.info("fast catch-up: %d records behind; reading fresh records from the "
                         "latest offsets and the gap alongside", backlog)
        limits = self._limits(limit)
        now_ms = int(time.time() * 1000)
        fresh_end = admit(fresh_from, latest, limits, now_ms=now_ms,
                          last_trigger_ms=self._last_trigger_ms,
                          bytes_per_offset=self._bytes_per_offset_of
                          if limits and limits.max_bytes else None)
        if fresh_end is None:
            fresh_end = dict(fresh_from)
        new_gaps = self._advance_gaps(gaps, pos)
        end = SourceOffset({tp: max(fresh_end[tp], fresh_from[tp]) for tp in fresh_end}, new_gaps)
        out = end.to_json()
        if SourceOffset.from_json(out).positions != st.positions or new_gaps != st.gaps:
            self._last_trigger_ms = now_ms
        self.stats["last_latest_offset_ms"] = (time.monotonic() - t0) * 1000
        if out == start:
            return start
        return out

    def _advance_gaps(self, gaps, pos) -> Dict[TopicPartition, Tuple[int, int]]:
        """Each open gap moves by its share of ``fastCatchUpRecordsPerTrigger``; a gap that
        closed in the previous batch is dropped, one closing now stays as ``[end, end]``."""
        open_gaps = {tp: g for tp, g in gaps.items() if g[0] < g[1]}
        backlog = {}
        for tp, (gpos, gend) in open_gaps.items():
            lso = pos[tp].log_start_offset
            if gpos < lso:
                self._data_loss(f"{_name(tp)}: catch-up gap offsets {gpos} to "
                                f"{min(lso, gend) - 1} were deleted before they were read")
                gpos = min(lso, gend)
                open_gaps[tp] = (gpos, gend)
            backlog[tp] = gend - gpos
        budget = self.options.fast_catch_up_records_per_trigger
        shares = split_budget({tp: float(n) for tp, n in backlog.items() if n > 0}, budget) \
            if sum(backlog.values()) > budget else {tp: n for tp, n in backlog.items()}
        return {tp: (gpos + min(gend - gpos, shares.get(tp, 0)), gend)
                for tp, (gpos, gend) in open_gaps.items()}

    def _bytes_per_offset_of(self, tp: TopicPartition) -> float:
        """Average log bytes per offset, from the partition's segment sizes (one listing of its
        directory, cached until the partition's high watermark moves)."""
        hw = self._latest.get(tp, 0)
        cached = self._bytes_per_offset.get(tp)
        if cached is not None and cached[0] == hw:
            return cached[1]
        source = ClusterSource(self.options.path, self.options.storage_options,
                               cluster=self._cluster, state=self._positions.state)
        handle, plog = source.view(*tp)
        lo = handle.log_start_offset
        size = range_bytes(plog, lo, hw, hw) / max(1, hw - lo) if hw > lo else 1.0
        self._bytes_per_offset[tp] = (hw, size)
        return size

    def reportLatestOffset(self) -> Optional[dict]:
        if not self._latest:
            return None
        return SourceOffset(self._latest, {}).to_json()

    def prepareForTriggerAvailableNow(self) -> None:
        pos = self._fetch()
        self._target = {tp: p.high_watermark for tp, p in pos.items() if p.error is None}

    # -- planning and reading ----------------------------------------------------------------

    def partitions(self, start: dict, end: dict) -> List[InputPartition]:
        st, en = SourceOffset.from_json(start), SourceOffset.from_json(end)
        if st.positions == en.positions and st.gaps == en.gaps:
            return []
        self._open()
        pos = self._fetch(extra=list(en.positions))
        opts = self.options
        source = ClusterSource(opts.path, opts.storage_options, cluster=self._cluster,
                               state=self._positions.state)
        tasks = []
        for tp, lo, hi, kind in batch_ranges(st, en, lambda t: pos[t].log_start_offset
                                             if t in pos and pos[t].error is None else 0):
            p = pos.get(tp)
            if p is None or p.error is not None:
                self._data_loss(f"partition {_name(tp)} is gone; offsets {lo} to {hi - 1} "
                                "were not read")
                continue
            if lo < p.log_start_offset:
                self._data_loss(f"{_name(tp)}: offsets {lo} to {min(hi, p.log_start_offset) - 1}"
                                f" were deleted before they were read (log start offset "
                                f"{p.log_start_offset})")
                lo = min(p.log_start_offset, hi)
            if hi > p.high_watermark:
                self._data_loss(f"{_name(tp)}: offsets {p.high_watermark} to {hi - 1} are past "
                                "the high watermark (the topic was recreated?)")
                hi = max(lo, p.high_watermark)
            if hi <= lo:
                continue
            handle, plog = source.view(*tp)
            tasks.append(ReadTask(handle, lo, hi, [], range_bytes(plog, lo, hi,
                                                                  handle.high_watermark)))
        tasks = split(tasks, opts.min_partitions, opts.max_records_per_partition)
        splits = pack(tasks, opts.max_partition_bytes, opts.open_cost_in_bytes,
                      opts.min_partitions, opts.max_records_per_partition,
                      opts.min_partition_num)
        return [KafkaLogInputPartition(s) for s in splits]

    def read(self, partition: InputPartition) -> Iterator:
        worker_gc.freeze_once()
        split_ = partition.value
        if not isinstance(split_, ReadSplit):
            return iter(())
        return read_split(split_, self.options)

    def commit(self, end: dict) -> None:
        """Spark committed the batch: the consumer group (if any) gets its end offsets, so
        ``kafkalog groups --describe`` shows the query's lag (Spark's connector never
        commits, SPARK-27549). During fast catch-up the gap's position is what is committed."""
        self._commit_group(SourceOffset.from_json(end))

    def _commit_group(self, offset: SourceOffset) -> None:
        """Also called with a trigger's start: Spark plans a batch only after the previous one
        committed, so the start is committed too. Spark does not always call ``commit`` for a
        query's last batch (``Trigger.AvailableNow`` ends without it), and a restarted query
        would otherwise show a lag of one batch until its next one."""
        if not self.group_id:
            return
        positions = offset.committed_positions()
        if positions == self._group_committed:
            return
        from ..cluster.groups import GroupStore, OffsetAndMetadata
        self._open()
        state = self._positions.state
        offsets = {}
        for (topic, p), pos in positions.items():
            info = state.topics.get(topic)
            if info is not None:
                offsets[(topic, p)] = OffsetAndMetadata(pos, "", info["topic_id"])
        if offsets:
            GroupStore(self._cluster.storage, guard=self._cluster.check_writable).commit(
                self.group_id, offsets, now_ms=self._cluster.now_ms())
        self._group_committed = positions

    def stop(self) -> None:
        if self._session is not None:
            try:
                self._session.close()
            except Exception:   # best effort: the slot is evicted when idle anyway
                pass
