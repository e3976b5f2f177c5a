"""Following a topic (``kafkalog consume --follow``, ``Admin.consume(..., follow=True)``): its
records as they are committed, like ``kafka-console-consumer``.

Why a fetch session: a follower asks for the same partitions' positions every poll, and almost
always nothing has changed. Through one incremental fetch session over ``ClusterPositions``, an
idle poll costs one storage read (the metadata entry that does not exist yet) however many
partitions the topic has, and only partitions whose high watermark moved past the follower's
position are read at all. Records are read one bounded fetch at a time (``fetch_chunks``), so
memory does not grow with what the follower has seen.
"""
from __future__ import annotations

import logging
import time
from typing import Callable, Dict, List, Optional

from ..client.consumer import Consumer, fetch_chunks
from ..errors import (InvalidConfigError, KafkaStorageError, OffsetOutOfRangeError,
                      UnknownTopicIdError)
from .cluster_positions import ClusterPositions
from .fetch_client import SessionServer
from .fetch_session import FetchSessionClient

log = logging.getLogger(__name__)

DEFAULT_POLL_INTERVAL_MS = 500


class Follower(Consumer):
    """A :class:`Consumer` that does not end at the end of the log: after the records that
    exist, it polls every ``poll_interval_ms`` and hands out records committed since, until
    ``max_records`` or :meth:`close`. Positions, group commits and ``wrap`` are the consumer's.

    ``new_partitions``: also read partitions added to the topic while following, from their log
    start offset (as Spark's Kafka source does). ``on_caught_up`` is called whenever everything
    committed so far has been handed out, before the follower waits: the moment for a caller
    that buffers its output to flush it. With auto-commit, consumed offsets are also committed
    then (at most every ``auto_commit_interval_ms``, and only if they moved), so a quiet topic
    does not leave them uncommitted. Records deleted before they were read (delete-records or
    retention past the follower's position) are skipped, and ``on_data_loss`` (default: a logged
    warning) gets a message naming the lost range (Spark's ``failOnDataLoss=false``). A topic
    deleted, or deleted and created again, ends the iteration with :class:`UnknownTopicIdError`.

    The fetch session is the active coordinator's when one is found (``coordinator_token_file``,
    else the quota client's, else ``$KAFKALOG_COORDINATOR_TOKEN``), shared with every other
    client of the cluster; else this process's (``fetch_client``).
    """

    def __init__(self, cluster, topic: str, partitions: List[int], *,
                 new_partitions: bool = False,
                 poll_interval_ms: int = DEFAULT_POLL_INTERVAL_MS,
                 on_caught_up: Optional[Callable[[], None]] = None,
                 on_data_loss: Callable[[str], None] = log.warning,
                 coordinator_token_file: Optional[str] = None, **consumer_options):
        if poll_interval_ms < 0:
            raise InvalidConfigError(f"poll_interval_ms must be >= 0, got {poll_interval_ms}")
        super().__init__(cluster, topic, partitions, **consumer_options)
        self._cluster = cluster
        self._read_committed = consumer_options.get("isolation_level",
                                                    "read_committed") == "read_committed"
        self._new_partitions = new_partitions
        self._poll_interval = poll_interval_ms / 1000.0
        self._on_caught_up = on_caught_up
        self._on_data_loss = on_data_loss
        self._source = ClusterPositions(cluster)
        if coordinator_token_file is None and self.quota is not None:
            # the token file the client was given for the coordinator, for its quota
            coordinator_token_file = getattr(self.quota, "token_file", None)
        self._server = SessionServer(cluster, token_file=coordinator_token_file)
        self._session = FetchSessionClient(self._server, self._source)
        self._last_commit: Optional[Dict[int, int]] = None
        #: partition -> offset whose read failed once as deleted; a second failure there raises
        self._failed: Dict[int, int] = {}
        self._away: set = set()     # partitions whose leader's root could not be read
        #: test-visible: polls made, and polls that found nothing to read
        self.polls = self.idle_polls = 0

    def _records(self):
        """(partition, record or None, position after it), forever or until ``max_records``."""
        pos: Dict[int, Optional[int]] = {}
        for p, _view, begin in self._plan:
            pos[p] = begin
            yield p, None, begin
        self._plan = []                    # the first snapshot's views: the polls have their own
        try:
            while self._left is None or self._left > 0:
                polled_at = time.monotonic()
                ends = self._poll(pos)
                read = 0
                for p in sorted(ends):
                    start = pos[p]
                    log_start, end = ends[p]
                    if start is None or start < log_start:
                        if start is not None:
                            self._lost(p, start, log_start)
                        pos[p] = start = log_start
                        yield p, None, start
                    if start >= end:
                        continue
                    view = self._cluster.partition_view(
                        self.topic, p, self._source.state,
                        isolation_level="read_committed" if self._read_committed
                        else "read_uncommitted")
                    try:
                        for rows, next_offset in fetch_chunks(view, start, end,
                                                              max_bytes=self._max_bytes,
                                                              on_fetch=self._on_fetch):
                            for r in rows:
                                read += 1
                                yield p, r, r.offset + 1
                                if self._left is not None:
                                    self._left -= 1
                                    if self._left <= 0:
                                        return
                            pos[p] = next_offset
                            self._failed.pop(p, None)
                            self._away.discard(p)
                            yield p, None, next_offset
                    except OffsetOutOfRangeError:
                        # deleted while we read it: the next poll says where the log starts now
                        if self._failed.get(p) == pos[p]:
                            raise
                        self._failed[p] = pos[p]
                    except KafkaStorageError as exc:
                        # the leader's root is away: keep following; the next polls read the
                        # leader a coordinator elects (docs/protocol.md §1.3)
                        if p not in self._away:
                            log.warning("%s-%d: %s", self.topic, p, exc)
                        self._away.add(p)
                        continue
                if not read:
                    self.idle_polls += 1
                self._caught_up()
                time.sleep(max(0.0, polled_at + self._poll_interval - time.monotonic()))
        finally:
            try:
                self._session.close()
            finally:
                self._server.close()

    def _poll(self, pos: Dict[int, Optional[int]]) -> Dict[int, tuple]:
        """Ask the fetch session once; ``{partition: (log start offset, end)}`` for the
        partitions with records past the follower's position (or new to it)."""
        self.polls += 1
        self._source.prefetch()               # one metadata poll, which the fetch then uses
        state = self._source.state
        info = state.topics.get(self.topic)
        if info is None or info["topic_id"] != self._topic_id:
            raise UnknownTopicIdError(
                f"topic {self.topic!r} was deleted while being followed"
                + ("" if info is None else " (and created again)"))
        if self._new_partitions:
            for p in range(info["partitions"]):
                pos.setdefault(p, None)
        got = self._session.fetch([(self.topic, p) for p in pos])
        out = {}
        for p, start in pos.items():
            position = got[(self.topic, p)]
            if position.error is not None or position.topic_id != self._topic_id:
                raise UnknownTopicIdError(f"topic {self.topic!r} was deleted while being "
                                          f"followed ({position.error or 'a new topic id'})")
            # read_uncommitted also reads writes not yet decided: past the high watermark, up
            # to the partition's next offset (in the state the fetch used: no request)
            end = (position.high_watermark if self._read_committed
                   else state.partition(self.topic, p).next_offset)
            if start is None or start < end or start < position.log_start_offset:
                out[p] = (position.log_start_offset, end)
        return out

    def _lost(self, p: int, start: int, log_start: int) -> None:
        self._on_data_loss(f"{self.topic}-{p}: offsets {start}..{log_start - 1} were deleted before "
                   f"they were read ({log_start - start} records lost); skipping to {log_start}")

    def _caught_up(self) -> None:
        if self._auto and time.monotonic() >= self._next_commit \
                and self._consumed != self._last_commit:
            self._commit(self._consumed)
        if self._on_caught_up is not None:
            self._on_caught_up()

    def _commit(self, parts) -> None:
        super()._commit(parts)
        self._last_commit = dict(parts)
