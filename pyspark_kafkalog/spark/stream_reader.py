"""``spark.readStream.format("kafkalog")``: the DataSourceStreamReader, a shell over the layers
below (docs/streaming.md).

Spark runs ``initialOffset``, ``latestOffset``, ``partitions`` and ``commit`` in one long-lived
Python process per query, so that process holds the query's incremental fetch session (KIP-227,
``coordinator.fetch_session``): each trigger replays only the metadata entries written since the
last one and compares only the partitions they touched. ``read`` runs in executors, on a pickled
copy that carries the options only.

What a batch reads follows from its start and end offsets alone (``connector.stream_plan``), so a
batch Spark replays after a crash reads the same records.
"""
from __future__ import annotations

import logging
import time
import uuid
from typing import Dict, Iterator, List, Optional, Tuple

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (ReadAllAvailable, ReadLimit, ReadMaxBytes,
                                              ReadMaxRows, ReadMinRows,
                                              SupportsTriggerAvailableNow)

from ..connector.range_reader import missing_committed, missing_committed_message
from ..connector.read_plan import (ReadSplit, ReadTask, pack, range_bytes, split, starting_offset,
                                   subscribed_topics)
from ..connector.sources import ClusterSource, open_source
from ..connector.stream_plan import (Limits, SourceOffset, admit, advance_gaps, batch_ranges,
                                   open_gaps)
from ..errors import (InvalidConfigError, KafkaLogError, OffsetOutOfRangeError,
                      UnknownTopicOrPartitionError)
from . import worker_gc
from .read_options import ReadOptions
from .quota import plan_coordinator
from .reader import KafkaLogInputPartition, checked_options, read_split
from .surface import surfaces_errors

log = logging.getLogger(__name__)
TopicPartition = Tuple[str, int]


#: where ``reportLatestOffset`` puts the fetch quota's throttle time (a key no topic can have)
THROTTLE_KEY = "$throttle"


def _name(tp: TopicPartition) -> str:
    return f"{tp[0]}-{tp[1]}"


@surfaces_errors
class KafkaLogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: ReadOptions, schema):
        self.options = checked_options(options, schema)
        self.group_id = options.group_id or (
            f"{options.group_id_prefix}-{uuid.uuid4()}" if options.group_id_prefix else None)
        self._reset()

    def _reset(self) -> None:
        self._cluster = None
        self._positions = None
        self._session = None
        self._session_server = None
        self._target: Optional[Dict[TopicPartition, int]] = None
        self._latest: Dict[TopicPartition, int] = {}
        self._pos: Dict = {}
        self._last_trigger_ms = int(time.time() * 1000)
        self._first_trigger = True
        #: what ``initialOffset`` returned: a first trigger from it is a new query's
        self._initial: Optional[dict] = None
        self._group_committed: Optional[Dict[TopicPartition, int]] = None
        self._bytes_per_offset: Dict[TopicPartition, Tuple[int, float]] = {}
        self._subs_key = None
        self._subs: List[TopicPartition] = []
        self._subs_set = frozenset()
        self._pending = set()          # partitions changed since a trigger last looked
        self._backlog = set()          # partitions the last end left behind their latest
        self._parsed: List[Tuple[dict, SourceOffset]] = []
        self._last_out = None          # the offset the last latestOffset returned
        self._subs_of_last_out = None  # ... and the subscription it was made for
        self._latest_json: dict = {}
        self._quota = None             # the coordinator's view of the client id, for progress
        #: (segment file, base offset) -> (its size, the offset after its last entry): the
        #: segments checked for lost data (failOnDataLoss=false), each read once
        self._segment_ends: Dict[Tuple[str, int], Tuple[int, int]] = {}
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
        from ..coordinator.cluster_positions import ClusterPositions
        from ..coordinator.fetch_client import SessionServer
        from ..coordinator.fetch_session import FetchSessionClient
        source = open_source(self.options.path, self.options.storage_options)
        if not isinstance(source, ClusterSource):
            raise InvalidConfigError(
                f"readStream.format('kafkalog') needs a kafkalog cluster root; {self.options.path}"
                " is a plain Kafka log dir, which has no metadata log to follow (read it with "
                "spark.read)")
        self._cluster = source.cluster
        self._positions = ClusterPositions(self._cluster)
        # the active coordinator's session cache, shared by every query of the cluster, or
        # this process's without one
        self._session_server = SessionServer(self._cluster,
                                             token_file=self.options.coordinator_token_file)
        self._session = FetchSessionClient(self._session_server, self._positions)

    def _subscribed(self) -> List[TopicPartition]:
        """The subscribed partitions, rebuilt only when the topics changed (the same list
        object otherwise, which the fetch session compares at no cost)."""
        sub = self.options.subscription
        topics = self._positions.topics()
        names = subscribed_topics(sub, topics)
        key = tuple((t, topics.get(t, 0), self._positions.state.topics[t]["topic_id"]
                     if t in topics else None) for t in names)
        if key != self._subs_key:
            if sub.kind == "assign":
                tps = [tp for tp in sub.assign if tp[0] in topics and tp[1] < topics[tp[0]]]
            else:
                tps = [(t, p) for t in names for p in range(topics[t])]
            self._subs_key, self._subs, self._subs_set = key, tps, frozenset(tps)
        return self._subs

    def _fetch(self):
        """Positions of the subscribed partitions through the fetch session: one refresh of
        the metadata log, O(what changed). What the session learnt is kept in ``_pending``
        until a trigger looks at it."""
        self._open()
        self._positions.prefetch()
        self._pos = self._session.fetch(self._subscribed())
        self._pending |= self._session.changed
        self.stats["full_fetches"] = getattr(self._session, "full_fetches", 0)
        return self._pos

    def _parse(self, offset: dict) -> SourceOffset:
        """A source offset parsed once: Spark hands back the offsets this process returned, and
        parsing 10,000 partitions at every call would cost more than the trigger's work."""
        for known, parsed in self._parsed:
            if known is offset or known == offset:
                return parsed
        parsed = SourceOffset.from_json(offset)
        self._remember(offset, parsed)
        return parsed

    def _remember(self, offset: dict, parsed: SourceOffset) -> None:
        self._parsed = ([(offset, parsed)] + self._parsed)[:4]

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
        self._note_latest({tp: pos[tp].high_watermark for tp in tps}, ())
        # A first trigger from this offset is a new query's, not a restart's: no fast catch-up
        # (KIP-333). Not every call here is a new query: a restarted query whose batch 0 was
        # planned but not committed calls it too (for that batch's start) before it replays
        # the batch and asks for the next from the batch's end.
        self._initial = SourceOffset(positions, {}).to_json()
        return self._initial

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

    def _checked_start(self, start: SourceOffset, pos, active, gone) -> Dict[TopicPartition, int]:
        """The fresh stream's start for the ``active`` partitions, after the data-loss rules:
        partitions ``gone`` (topic deleted, or no longer subscribed) and offsets past the high
        watermark (a recreated topic). New partitions start at their log start offset, as in
        Spark. Offsets below the log start offset are left to ``partitions``."""
        for tp in sorted(gone):
            self._data_loss(f"partition {_name(tp)} is gone (its topic was deleted or it is no "
                            f"longer subscribed), offsets from {start.positions[tp]} on were "
                            "not read")
        out = {}
        for tp in active:
            p = pos.get(tp)
            offset = start.positions.get(tp)
            if p is None or p.error is not None:
                if offset is not None:
                    self._data_loss(f"partition {_name(tp)} is gone, offsets from {offset} on "
                                    "were not read")
                continue
            if offset is None:
                offset = p.log_start_offset
            elif offset > p.high_watermark:
                self._data_loss(f"{_name(tp)}: offset {offset} is past the high watermark "
                                f"{p.high_watermark} (the topic was recreated?)")
                offset = p.log_start_offset
            out[tp] = offset
        return out

    def latestOffset(self, start: dict, limit: ReadLimit = None) -> dict:
        """The next batch's end. In the steady state (Spark passes back the end this process
        returned last) only the partitions the fetch session reported as changed, plus those
        the last batch left behind, are looked at: the rest of the end is the start's. The
        first trigger, AvailableNow and fast catch-up look at every partition."""
        t0 = time.monotonic()
        st = self._parse(start)
        if start:
            self._commit_group(st)
        pos = self._fetch()
        self.stats["triggers"] += 1
        subs = self._subs_set
        changed, self._pending = self._pending, set()
        steady = (self._last_out is not None and not self._first_trigger and not st.gaps
                  and self._target is None
                  and (start is self._last_out or start == self._last_out))
        if steady and subs is self._subs_of_last_out:
            # the subscription is the one the start was made for: nothing new, nothing gone
            self.stats["steady"] = self.stats.get("steady", 0) + 1
            active, gone = (changed | self._backlog) & subs, set()
        elif steady:
            self.stats["steady"] = self.stats.get("steady", 0) + 1
            active = ((changed | self._backlog) & subs) | (subs - st.positions.keys())
            gone = st.positions.keys() - subs
        else:
            active, gone = set(subs), st.positions.keys() - subs
        begin = self._checked_start(st, pos, active, gone)
        latest = {tp: pos[tp].high_watermark for tp in begin}
        self._note_latest(latest, gone)
        gaps = {tp: rs for tp, rs in st.gap_ranges().items() if tp in begin}
        if self._target is not None:   # Trigger.AvailableNow: nothing after its start
            latest = {tp: max(min(latest[tp], self._target.get(tp, begin[tp])), begin[tp])
                      for tp in latest}
        fresh_from = dict(begin)
        if self._first_trigger:
            self._first_trigger = False
            opened = None
            restart = bool(start) and start != self._initial
            if self.options.fast_catch_up and restart:
                # KIP-333: a restart far behind reads fresh records from the latest offsets on
                # and the backlog alongside in slices (behind any gap an earlier restart left)
                opened = open_gaps(begin, latest,
                                   {tp: pos[tp].log_start_offset for tp in latest}, gaps,
                                   self.options.fast_catch_up_threshold)
            if opened is not None:
                fresh_from, gaps = opened
                log.info("fast catch-up: %d records behind; reading fresh records from the "
                         "latest offsets and the gap alongside",
                         SourceOffset.of_ranges({}, gaps).remaining_gap())
        limits = self._limits(limit)
        now_ms = int(time.time() * 1000)
        fresh_end = admit(fresh_from, latest, limits, now_ms=now_ms,
                          last_trigger_ms=self._last_trigger_ms,
                          bytes_per_offset=self._bytes_per_offset_of
                          if limits and limits.max_bytes else None)
        if fresh_end is None:
            fresh_end = fresh_from
        # the gap moves by its own budget, whatever Spark's read limit (docs/streaming.md)
        new_gaps = advance_gaps(gaps, self.options.fast_catch_up_records_per_trigger,
                                {tp: pos[tp].log_start_offset for tp in gaps},
                                self._gap_lost)
        positions = dict(st.positions)
        for tp in gone:
            del positions[tp]
        moved = set()
        for tp, offset in fresh_end.items():
            offset = max(offset, fresh_from[tp])
            if positions.get(tp) != offset:
                positions[tp] = offset
                moved.add(tp)
        self._backlog = {tp for tp in begin if positions[tp] < latest[tp]}
        if not moved and not gone and new_gaps == st.gap_ranges():
            out = start
        else:
            out = self._end_json(start, positions, moved, gone, new_gaps)
            self._last_trigger_ms = now_ms
            self._remember(out, SourceOffset.of_ranges(positions, new_gaps))
        self._last_out, self._subs_of_last_out = out, subs
        self.stats["last_latest_offset_ms"] = (time.monotonic() - t0) * 1000
        return out

    @staticmethod
    def _end_json(start: dict, positions, moved, gone, gaps) -> dict:
        """The end offset's JSON from the start's, copying only the topics that changed."""
        touched = {t for t, _ in moved} | {t for t, _ in gone}
        out = {t: (dict(parts) if t in touched else parts) for t, parts in start.items()
               if not t.startswith("$")}
        for topic, p in gone:
            out[topic].pop(str(p), None)
        for topic, p in moved:
            out.setdefault(topic, {})[str(p)] = positions[(topic, p)]
        for topic in [t for t, parts in out.items() if not parts]:
            del out[topic]
        if gaps:
            out.update(SourceOffset.of_ranges({}, gaps).to_json())
        return out

    def _note_latest(self, latest: Dict[TopicPartition, int], gone) -> None:
        """The latest offsets for ``reportLatestOffset``, kept up to date change by change."""
        for tp, hw in latest.items():
            self._latest[tp] = hw
            self._latest_json.setdefault(tp[0], {})[str(tp[1])] = hw
        for tp in gone:
            self._latest.pop(tp, None)
            self._latest_json.get(tp[0], {}).pop(str(tp[1]), None)

    def _gap_lost(self, tp: TopicPartition, first: int, last: int) -> None:
        self._data_loss(f"{_name(tp)}: catch-up gap offsets {first} to {last} were deleted "
                        "before they were read")

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
        """The latest offsets; with a coordinator, also the query's client id's fetch quota
        and throttle time (KIP-13) under ``"$throttle"``, as the coordinator counts them for
        every task of every job with that client id: the read tasks wait in other processes,
        and this is the one place of the query progress a Python source can fill."""
        out = {t: parts for t, parts in self._latest_json.items() if parts}
        throttle = self._throttle()
        if throttle:
            out[THROTTLE_KEY] = throttle
        return out or None

    def _throttle(self) -> Optional[dict]:
        if self._cluster is None:
            return None
        if self._quota is None:
            from ..coordinator.quota_client import QuotaClient
            self._quota = QuotaClient(self._cluster, self.options.client_id,
                                      token_file=self.options.coordinator_token_file)
        usage = self._quota.usage()
        if not usage:
            return None
        fetch = usage.get("fetch") or {}
        return {"client_id": usage.get("client_id", ""), "quota": fetch.get("quota"),
                "byte_rate": fetch.get("byte_rate"),
                "fetch-throttle-time-max": fetch.get("fetch-throttle-time-max"),
                "fetch-throttle-time-avg": fetch.get("fetch-throttle-time-avg")}

    def prepareForTriggerAvailableNow(self) -> None:
        pos = self._fetch()
        self._target = {tp: p.high_watermark for tp, p in pos.items() if p.error is None}

    # -- planning and reading ----------------------------------------------------------------

    def partitions(self, start: dict, end: dict) -> List[InputPartition]:
        """The batch's ranges as input partitions. While a catch-up gap is open the fresh
        ranges get tasks of their own, first, and the gap's follow (each packed as usual):
        Spark schedules a batch's tasks in this order, and a sink that writes a batch in task
        order (one writer, or a coalesce(1)) writes fresh records before that batch's backlog,
        so at most the one batch in flight when a record arrived writes backlog before it."""
        st, en = self._parse(start), self._parse(end)
        if st.positions == en.positions and st.gap_ranges() == en.gap_ranges():
            return []
        # only the partitions whose offsets differ (C-level set operations, not a loop over
        # every partition), with the positions of the trigger that planned the batch (a
        # replayed batch after a restart fetches them first)
        tps = ({tp for tp, _ in en.positions.items() - st.positions.items()}
               | set(en.gaps) | set(st.gaps))
        pos = self._pos if self._pos else self._fetch()
        opts = self.options
        source = ClusterSource(opts.path, opts.storage_options, cluster=self._cluster,
                               state=self._positions.state)
        tasks = {"fresh": [], "gap": []}
        views = {}
        for tp, lo, hi, kind in batch_ranges(st, en, lambda t: pos[t].log_start_offset
                                             if t in pos and pos[t].error is None else 0, tps):
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
            if tp not in views:
                views[tp] = source.view(*tp)
            handle, plog = views[tp]
            for a, b in self._held(tp, handle, plog, lo, hi):
                tasks[kind].append(ReadTask(handle, a, b, [], range_bytes(plog, a, b,
                                                                          handle.high_watermark)))
        splits = []
        for kind in ("fresh", "gap"):
            group = split(tasks[kind], opts.min_partitions, opts.max_records_per_partition)
            splits += pack(group, opts.max_partition_bytes, opts.open_cost_in_bytes,
                           opts.min_partitions, opts.max_records_per_partition,
                           opts.min_partition_num)
        plan_coordinator(splits, self._cluster, self._positions.state, opts.client_id)
        return [KafkaLogInputPartition(s) for s in splits]

    def _held(self, tp: TopicPartition, handle, plog, lo: int, hi: int) -> List[Tuple[int, int]]:
        """``[lo, hi)`` as pieces to read. With failOnDataLoss=false, the committed offsets no
        segment file holds are left out, each run with a warning here, on the driver (as Spark's
        Kafka source warns per lost range): the tasks would step over them anyway, in executor
        logs. With failOnDataLoss=true the task that meets them fails, naming the repair."""
        if self.options.fail_on_data_loss:
            return [(lo, hi)]
        lost = missing_committed(handle, plog, lo, hi, self._segment_end)
        pieces, at = [], lo
        for first, last in lost:
            log.warning("%s; failOnDataLoss=false: skipping them", missing_committed_message(
                tp[0], tp[1], self.options.path, f"offsets {first} to {last} are in no segment "
                "file", handle.log_start_offset, advice=False, plural=True))
            if first > at:
                pieces.append((at, first))
            at = last + 1
        if at < hi:
            pieces.append((at, hi))
        return pieces

    def _segment_end(self, seg) -> Optional[int]:
        """The offset after ``seg``'s last entry, read once per segment file (a cluster's are
        immutable; a merge that rewrites one under its name changes its size); None when it
        cannot be read here (the reading task will tell)."""
        key, size = (seg.log_path, seg.base_offset), seg.size()
        known = self._segment_ends.get(key)
        if known is not None and known[0] == size:
            return known[1]
        try:
            end = seg.next_offset()
        except (KafkaLogError, OSError):
            return None
        if len(self._segment_ends) >= 100_000:
            self._segment_ends.clear()
        self._segment_ends[key] = (size, end)
        return end

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
        if self.group_id:
            self._commit_group(self._parse(end))

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
        from ..client.groups import GroupStore, OffsetAndMetadata
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
            self._session_server.close()
