"""Replay of the log dir registry (docs/protocol.md §1.1, §1.2; features ``logDirRegistry`` and
``logDirRemoval``): ``add_log_dir``, ``remove_log_dir``, and the checks every replica list
gets. A part of :class:`state.ClusterState` kept in a module of its own because it is one
concept; where log dirs are and how they are opened is ``log_dirs.py``'s.
"""
from __future__ import annotations

from typing import List, Optional

from . import actions as A
from .features import LOG_DIR_REGISTRY, LOG_DIR_REMOVAL
from .partition_state import tp_key


class LogDirReplay:
    """Mixed into ``ClusterState``: uses its topics, partitions and features, and keeps
    ``log_dirs`` (a name -> url, directory_id, storage_options, added, and removed once
    removed)."""

    def _duplicate_replicas(self, replicas: List[List[str]]) -> Optional[str]:
        """Two replicas of one partition in one log dir (§1.2). Checked only once the cluster has
        ``logDirRegistry``: before it a cluster has one log dir, and replay must not change for
        entries older clients wrote."""
        if LOG_DIR_REGISTRY not in self.reader_features:
            return None
        for i, r in enumerate(replicas):
            if len(set(r)) != len(r):
                return f"replica list {i} names a log dir twice: {r}"
        return None

    def _add_log_dir(self, a: A.AddLogDir, ts: int) -> A.Result:
        """A log dir at a URL of its own (§1.1). Its name and URL are each registered once; the
        log's order decides between two clients that chose the same name."""
        if LOG_DIR_REGISTRY not in self.reader_features:
            return A.error("INVALID_REQUEST", f"add_log_dir needs the feature {LOG_DIR_REGISTRY}, "
                           "which this cluster has not enabled")
        prefix, _, n = a.log_dir.rpartition("-")
        if prefix != "logdir" or not n.isdigit() or not n.isascii() or not a.url \
                or not a.directory_id:
            return A.error("INVALID_REQUEST", f"add_log_dir needs a name logdir-<n>, a url and a "
                           f"directory_id; got {a.log_dir!r:.60}, {a.url!r:.200}")
        if a.log_dir in self.log_dirs:
            return A.error("INVALID_REQUEST", f"log dir name {a.log_dir} is taken (by "
                           f"{self.log_dirs[a.log_dir]['url']})")
        for name, info in self.log_dirs.items():
            if "removed" in info:
                continue   # its name stays taken (above), its URL may be registered again
            if info["url"] == a.url or info["directory_id"] == a.directory_id:
                return A.error("INVALID_REQUEST", f"{a.url} is registered already, as {name}")
        self.log_dirs = dict(self.log_dirs, **{a.log_dir: {
            "url": a.url, "directory_id": a.directory_id,
            "storage_options": dict(a.storage_options), "added": ts}})
        return A.Result()

    def _remove_log_dir(self, a: A.RemoveLogDir, ts: int) -> A.Result:
        """A registered log dir that holds no replica, and is no reassignment's target, is
        removed (§1.1). It stays in ``log_dirs`` marked ``removed`` (the entry's timestamp):
        its name is never registered again and no replica list may name it, so a process that
        still resolves the name to the old URL never meets a new log dir's data under it."""
        if LOG_DIR_REMOVAL not in self.reader_features:
            return A.error("INVALID_REQUEST", f"remove_log_dir needs the feature "
                           f"{LOG_DIR_REMOVAL}, which this cluster has not enabled")
        info = self.log_dirs.get(a.log_dir)
        if info is None or "removed" in info:
            return A.error("INVALID_REQUEST", f"{a.log_dir!r:.60} is not a registered log dir"
                           + (" (it was removed)" if info is not None else ""))
        for topic, t in self.topics.items():
            for p, replicas in enumerate(t["replicas"]):
                rep = self.partitions[tp_key(topic, p)].replication
                if a.log_dir in replicas or (rep is not None
                                             and a.log_dir in rep.get("target", ())):
                    return A.error("INVALID_REQUEST", f"log dir {a.log_dir} holds a replica of "
                                   f"{topic}-{p}: move it away first (reassign_partitions)")
        self.log_dirs = dict(self.log_dirs, **{a.log_dir: dict(info, removed=ts)})
        return A.Result()

    def _removed_log_dir(self, replicas: List[List[str]]) -> Optional[str]:
        """A replica on a removed log dir (§1.1): refused, so that a writer that planned before
        the removal cannot place data under a name no longer a log dir."""
        if not any("removed" in info for info in self.log_dirs.values()):
            return None
        for i, r in enumerate(replicas):
            for d in r:
                if "removed" in self.log_dirs.get(d, ()):
                    return f"replica list {i} names log dir {d}, which was removed"
        return None
