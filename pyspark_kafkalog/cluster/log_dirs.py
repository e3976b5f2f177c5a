"""Log dirs on other roots, and where a topic's replicas go (docs/protocol.md §1.1, §1.2).

A cluster's first log dir lives under its root; more can be registered at URLs of their own
(another bucket, another disk), so that a topic's replicas can sit on different roots, as
Kafka's sit on different brokers. Registering is the one rule :func:`add_log_dir` keeps (the
admin API and ``kafkalog log-dirs --add`` call it); placing replicas is Kafka's own assignment,
:func:`assign_replicas_to_log_dirs`, with log dirs for brokers.

In this stage only the leader replica (the first, Kafka's preferred leader) holds data: writers
write it and readers read it. Followers are placed but not yet copied to; copying, the ISR, acks
and failover come next.
"""
from __future__ import annotations

import os
import random
import re
from contextlib import contextmanager
from typing import Dict, Iterator, List, Mapping, Optional

from ..errors import (InconsistentClusterIdError, InvalidConfigError, InvalidReplicationFactorError,
                      InvalidRequestError, KafkaStorageError, LogDirNotEmptyError,
                      StorageNotFoundError, error_for)
from ..log.config import LogConfig
from ..log.logdir import META_PROPERTIES, LogDir
from ..storage import open_storage
from . import actions as A
from .features import LOG_DIR_REGISTRY, LOG_DIR_REMOVAL
from .state import ClusterState

LOG_DIR_PREFIX = "logdir-"
#: how often a registration retries with the next name after another client took its name
ADD_ATTEMPTS = 5
#: client settings, not a log dir's: they would bind every client if registered
CLIENT_STORAGE_OPTIONS = ("fsync", "direct_io")
#: option names that hold credentials: never written to the metadata log, which every client
#: reads (a root that needs credentials takes them from each process's environment)
_CREDENTIAL = re.compile(r"^(key|secret|token|password)$|secret|password|token|credential|"
                         r"access_key", re.IGNORECASE)


def is_log_dir_name(name: str) -> bool:
    return name.startswith(LOG_DIR_PREFIX)


def log_dir_number(name: str) -> int:
    n = name[len(LOG_DIR_PREFIX):]
    return int(n) if is_log_dir_name(name) and n.isdigit() and n.isascii() else 1 << 62


def is_local_url(url: str) -> bool:
    return "://" not in url or url.split("://", 1)[0].lower() in ("file", "local")


def normalize_log_dir_url(url) -> str:
    """A local path becomes absolute (every client must find the same directory); a URL keeps
    its spelling without a trailing slash."""
    if not isinstance(url, str) or not url.strip():
        raise InvalidConfigError(f"a log dir URL must be a non-empty string, got {url!r}")
    url = url.strip()
    if "://" not in url:
        return os.path.abspath(url)
    return url.rstrip("/") if url.split("://", 1)[1].strip("/") else url


def _location_key(url: str) -> str:
    """One spelling per place, for the overlap check: local paths resolved (symlinks, ``..``),
    ``s3a://`` and ``s3n://`` as ``s3://``."""
    if is_local_url(url):
        path = url if "://" not in url else url.split("://", 1)[1]
        return os.path.realpath(path).rstrip("/") + "/"
    scheme, rest = url.split("://", 1)
    scheme = scheme.lower()
    scheme = "s3" if scheme in ("s3a", "s3n") else scheme
    return f"{scheme}://{rest.strip('/')}/"


def overlaps(a: str, b: str) -> bool:
    """Whether one location is the other or inside it."""
    ka, kb = _location_key(a), _location_key(b)
    return ka.startswith(kb) or kb.startswith(ka)


def checked_storage_options(options: Optional[Mapping[str, str]]) -> Dict[str, str]:
    out: Dict[str, str] = {}
    for k, v in (options or {}).items():
        if not isinstance(k, str) or not isinstance(v, str) or not k:
            raise InvalidConfigError(f"storage options of a log dir are strings (they are "
                                     f"recorded in the metadata log), got {k!r}={v!r}")
        if k in CLIENT_STORAGE_OPTIONS:
            raise InvalidConfigError(f"storage option {k} is a client setting "
                                     "(storage.* in conf/cluster.properties), not a log dir's")
        if _CREDENTIAL.search(k):
            raise InvalidConfigError(
                f"storage option {k!r} looks like a credential; a log dir's options are "
                "recorded in the metadata log, which every client reads. Give the processes "
                "credentials for that root in their environment (for S3: AWS_* variables or "
                "~/.aws) instead")
        out[k] = v
    return out


def client_storage_options(url: str, options: Mapping[str, object]) -> Dict[str, object]:
    """The client's own settings (``fsync``, ``direct_io``) that also apply to a log dir at
    ``url``: direct I/O exists on local storage only."""
    return {k: options[k] for k in CLIENT_STORAGE_OPTIONS
            if k in options and (k != "direct_io" or is_local_url(url))}


def open_registered(name: str, info: dict, client_options: Mapping[str, object]):
    """The storage of a registered log dir, after checking that its ``meta.properties`` has the
    registered directory id: a URL that names another place now (a disk not mounted, a bucket
    replaced) must not be written to as if it were this log dir."""
    storage = open_storage(info["url"], **info["storage_options"], create_root=False,
                           **client_storage_options(info["url"], client_options))
    found = (LogDir(storage).read_meta() or {}).get("directory.id")
    if found != info["directory_id"]:
        raise KafkaStorageError(
            f"log dir {name} at {info['url']}: meta.properties has directory.id {found}, but "
            f"the metadata log registered {info['directory_id']}; the URL does not hold that "
            "log dir now (not mounted, or replaced), so nothing is read or written there")
    return storage


@contextmanager
def noting_offline(offline: Optional[Dict[str, str]], log_dir: str) -> Iterator[None]:
    """Work on one log dir in whose failure maintenance goes on with the others (KIP-112,
    docs/protocol.md §6): a storage error there is noted in ``offline`` (the log dir's name ->
    why) instead of raised. A missing file or directory is still raised (that is no offline
    disk, and the callers have their own rules for it), and so is everything with ``offline``
    None."""
    try:
        yield
    except StorageNotFoundError:
        raise
    except KafkaStorageError as exc:
        if offline is None:
            raise
        offline[log_dir] = str(exc)


# -- replica placement (§1.2) ------------------------------------------------------------------

def assign_replicas_to_log_dirs(log_dirs: List[str], partitions: int, replication_factor: int,
                                *, fixed_start_index: int = -1, start_partition: int = 0,
                                rng: Optional[random.Random] = None) -> List[List[str]]:
    """Kafka's rack-unaware replica assignment (``AdminUtils.assignReplicasToBrokers``) with
    log dirs in place of brokers, in the order given.

    Why Kafka's: the leaders go round the log dirs from a random one, so small topics do not
    all lead on the first; and the followers of one log dir's partitions spread over all the
    others (the follower shift grows by one each round), so that when a root is lost its
    partitions' leadership can move to many roots, not all to one. In Kafka's own words: a
    random start index and a random shift are drawn (or both are ``fixed_start_index``);
    partition p's first replica is at (p + start) mod n; its j-th further replica is 1 + (shift
    + j) mod (n - 1) places after the first, so never on the same one; and each time p reaches a
    multiple of n the shift grows by one."""
    n = len(log_dirs)
    if not isinstance(replication_factor, int) or not 1 <= replication_factor <= n:
        raise InvalidReplicationFactorError(
            f"replication factor {replication_factor} must be between 1 and the number of log "
            f"dirs ({n}); add log dirs on other roots with: kafkalog --cluster URL log-dirs "
            "--add URL2")
    if partitions <= 0:
        return []
    rng = rng or random.Random()
    start = fixed_start_index if fixed_start_index >= 0 else rng.randrange(n)
    shift = fixed_start_index if fixed_start_index >= 0 else rng.randrange(n)
    out = []
    first_partition = max(0, start_partition)
    for p in range(first_partition, first_partition + partitions):
        if p > 0 and p % n == 0:
            shift += 1
        first = (p + start) % n
        out.append([log_dirs[first]] + [log_dirs[(first + 1 + (shift + j) % (n - 1)) % n]
                                        for j in range(replication_factor - 1)])
    return out


def check_min_insync_replicas(configs: Mapping[str, str], replication_factor: int) -> None:
    """``min.insync.replicas`` must be one that the topic's replicas can meet: 1 <= M <= RF.
    (Enforcing it on writes comes with the ISR.)"""
    if "min.insync.replicas" not in configs:
        return
    m = LogConfig.from_properties({"min.insync.replicas": configs["min.insync.replicas"]}
                                  ).min_insync_replicas
    if not 1 <= m <= replication_factor:
        raise InvalidConfigError(f"min.insync.replicas={m} must be between 1 and the topic's "
                                 f"replication factor ({replication_factor})")


# -- registering (§1.1) ------------------------------------------------------------------------

def add_log_dir(cluster, url: str,
                storage_options: Optional[Mapping[str, str]] = None) -> dict:
    """Register a log dir at ``url``, a root of its own, with ``cluster`` (a ``Cluster``;
    docs/protocol.md §1.1); returns its description (``Cluster.log_dir_info``). Every refusal
    comes before anything is written there or to the metadata log: an overlap with the cluster's root or a known log dir
    (INVALID_REQUEST), a credential or client setting among ``storage_options``
    (INVALID_CONFIG), a storage that lives in this process only (``memory://``: other processes
    would find the log dir empty; INVALID_REQUEST), an unreachable URL (KAFKA_STORAGE_ERROR),
    another cluster's log dir (INCONSISTENT_CLUSTER_ID), or any other files
    (:class:`LogDirNotEmptyError`)."""
    url = normalize_log_dir_url(url)
    options = checked_storage_options(storage_options)
    state = cluster.state()
    cluster.check_writable(state)
    if overlaps(url, cluster.url):
        raise InvalidRequestError(f"{url} is the cluster's root {cluster.url} or overlaps it: a "
                                  "log dir registered this way must be on another root")
    known = cluster.log_dir_info(state)
    for d in known:
        if overlaps(url, d["url"]):
            raise InvalidRequestError(
                f"{url} is log dir {d['log_dir']} already"
                if _location_key(url) == _location_key(d["url"]) else
                f"{url} overlaps log dir {d['log_dir']} at {d['url']}")
    try:
        storage = open_storage(url, **options,
                               **client_storage_options(url, cluster.client_options))
    except KafkaStorageError as exc:
        raise KafkaStorageError(f"log dir {url} is unreachable: {exc}") from None
    if not storage.guarantees.multi_process:
        raise InvalidRequestError(
            f"{url}: its storage lives in this process only ({type(storage).__name__}), so every "
            "other process (executors, the coordinator, other clients) would find the log dir "
            "empty and fail the topics placed there; a log dir must be on storage that every "
            "client of the cluster shares (a path they all mount, a bucket)")
    try:
        dirs, files = storage.list_dirs(""), [f.name for f in storage.list("")]
    except KafkaStorageError as exc:
        raise KafkaStorageError(f"log dir {url} is unreachable: {exc}") from None
    meta = LogDir(storage).read_meta() if META_PROPERTIES in files else None
    if meta is not None:
        if meta.get("cluster.id") != cluster.cluster_id:
            raise InconsistentClusterIdError(
                f"{url} is a log dir of cluster {meta.get('cluster.id')}, not of this one "
                f"({cluster.cluster_id})")
        taken = [d["log_dir"] for d in known if d["directory_id"] == meta.get("directory.id")]
        if taken:
            raise InvalidRequestError(f"{url} holds the log dir {taken[0]} of this cluster "
                                      "already (its directory.id)")
    if dirs or [f for f in files if f != META_PROPERTIES or meta is None]:
        listed = sorted(dirs + files)
        raise LogDirNotEmptyError(
            f"{url} is not empty ({', '.join(listed[:5])}{', …' if len(listed) > 5 else ''}) "
            "and is not a log dir of this cluster: a log dir is registered on an empty root")
    try:
        storage.clock("")   # a probe file: the URL must take writes, not only listings
    except KafkaStorageError as exc:
        raise KafkaStorageError(f"log dir {url} is unreachable: {exc}") from None
    if meta is None:   # else a registration that died before its entry: its meta is reused
        meta = LogDir(storage).ensure_meta(cluster_id=cluster.cluster_id, node_id=0)
    if LOG_DIR_REGISTRY not in state.reader_features:
        cluster.submit_one(A.EnableFeatures(reader_features=[LOG_DIR_REGISTRY]))
    for _ in range(ADD_ATTEMPTS):
        # after every name ever given: a removed log dir's name is never given again (§1.1)
        taken = [*cluster.log_dir_names(state), *state.log_dirs]
        name = f"{LOG_DIR_PREFIX}{1 + max(log_dir_number(d) for d in taken)}"
        _, state, results = cluster.submit([A.AddLogDir(
            log_dir=name, url=url, directory_id=meta["directory.id"], storage_options=options)])
        if results[0].ok:
            return next(d for d in cluster.log_dir_info(state) if d["log_dir"] == name)
        if not _name_lost(state, name, url, meta["directory.id"]):
            raise error_for(results[0].error, results[0].message)
    raise InvalidRequestError(f"registering {url}: another client took the chosen log dir name "
                              f"{ADD_ATTEMPTS} times; try again")


def log_dir_name(name) -> str:
    """A log dir named by its name (``logdir-2``) or its number (``2``, as Kafka's tools name
    brokers)."""
    if isinstance(name, int) and not isinstance(name, bool) and name >= 0:
        return f"{LOG_DIR_PREFIX}{name}"
    if isinstance(name, str) and name.strip().isdigit() and name.strip().isascii():
        return f"{LOG_DIR_PREFIX}{int(name)}"
    if isinstance(name, str) and name.strip():
        return name.strip()
    raise InvalidRequestError(f"a log dir is named logdir-<n> or by its number n, got {name!r}")


def replicas_on(state: ClusterState, name: str) -> List[str]:
    """The partitions (``topic-p``) with a replica, or a reassignment's target, on log dir
    ``name``."""
    out = []
    for topic, info in state.topics.items():
        for p, replicas in enumerate(info["replicas"]):
            rep = state.partition(topic, p).replication
            if name in replicas or (rep is not None and name in rep.get("target", ())):
                out.append(f"{topic}-{p}")
    return out


def remove_log_dir(cluster, name) -> dict:
    """Remove the registered log dir ``name`` (or its number) from ``cluster`` (docs/protocol.md
    §1.1); returns its description as it was (``Cluster.log_dir_info``). Refused, with nothing
    written (INVALID_REQUEST): a name that is no registered log dir (a log dir under the root
    cannot be removed), or one that holds a replica of any partition or is the target of a
    reassignment in progress (move them first: ``reassign-partitions``). The first removal
    enables ``logDirRemoval`` in an entry of its own. The log dir's files stay where they are;
    its name is never given to another log dir."""
    name = log_dir_name(name)
    state = cluster.state()
    cluster.check_writable(state)
    if name in cluster.root_logdirs:
        raise InvalidRequestError(f"log dir {name} is under the cluster's root {cluster.url}: "
                                  "only a log dir registered at a URL of its own can be removed")
    info = state.log_dirs.get(name)
    if info is None or "removed" in info:
        raise InvalidRequestError(
            f"{name} is not a log dir of this cluster"
            + (" any more (it was removed)" if info is not None else "")
            + f"; its log dirs: {', '.join(cluster.log_dir_names(state))}")
    users = replicas_on(state, name)
    if users:
        raise InvalidRequestError(
            f"log dir {name} holds replicas (or reassignment targets) of {len(users)} "
            f"partition(s): {', '.join(users[:5])}{', …' if len(users) > 5 else ''}; move them "
            "to other log dirs first (kafkalog reassign-partitions), then remove it")
    described = next(d for d in cluster.log_dir_info(state) if d["log_dir"] == name)
    if LOG_DIR_REMOVAL not in state.reader_features:
        cluster.submit_one(A.EnableFeatures(reader_features=[LOG_DIR_REMOVAL]))
    cluster.submit_one(A.RemoveLogDir(log_dir=name))
    return described


def _name_lost(state: ClusterState, name: str, url: str, directory_id: str) -> bool:
    """Whether a rejected ``add_log_dir`` only lost its name to another registration (then the
    next name is tried), rather than its URL or directory having been registered meanwhile."""
    info = state.log_dirs.get(name)
    return info is not None and info["url"] != url and info["directory_id"] != directory_id
