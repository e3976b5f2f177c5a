"""Kafka's log flusher for ``flush.ms`` (docs/protocol.md §3, "Durability").

A broker checks every ``log.flush.scheduler.interval.ms`` whether each log has gone unflushed for
its topic's ``flush.ms``, and flushes it. Here a write is flushed before its commit only when its
topic asks per write (``LogConfig.flushes``); a topic with a positive ``flush.ms`` is kept to it
by the coordinator's scheduler calling :func:`flush_logs`. It flushes by log dir, not by
partition: on local disk a flush is one ``syncfs`` of the filesystem, whose cost is what is dirty
there, not how many partitions asked. Without a coordinator nothing runs this, and the kernel's
write-back is the only bound (docs/protocol.md §3).
"""
from __future__ import annotations

from typing import Dict, List, Tuple

from ..cluster.log_dirs import noting_offline

_LONG_MAX = 2**63 - 1


def flush_intervals(state) -> Dict[str, int]:
    """Per log dir holding a replica of a topic with a positive ``flush.ms``, the smallest such
    ``flush.ms``. ``flush.ms`` = 0 is left out: every write of such a topic flushes itself."""
    due: Dict[str, int] = {}
    for topic, info in state.topics.items():
        ms = state.topic_config(topic).flush_ms
        if ms == 0 or ms >= _LONG_MAX:
            continue
        for replicas in info["replicas"]:
            for logdir in replicas:
                due[logdir] = min(ms, due.get(logdir, ms))
    return due


def flush_logs(cluster, state, now_ms: int, last: Dict[str, int]
               ) -> Tuple[List[str], Dict[str, str]]:
    """Flush every log dir whose smallest ``flush.ms`` has passed since ``last[log_dir]`` (the
    caller's memory of its own flushes, updated here; absent: never), each on its own. Returns
    the log dirs flushed and, for those that could not be reached (KIP-112), why; the others
    are flushed all the same."""
    flushed: List[str] = []
    offline: Dict[str, str] = {}
    for logdir, ms in sorted(flush_intervals(state).items()):
        if logdir in last and now_ms - last[logdir] < ms:
            continue
        with noting_offline(offline, logdir):
            cluster.storage.flush(logdir)
            last[logdir] = now_ms
            flushed.append(logdir)
    return flushed, offline
