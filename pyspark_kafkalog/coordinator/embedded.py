"""``pyspark_kafkalog.coordinator.start``: the coordinator beside a Spark driver, in its process.

Why a watcher thread: Spark has no hook for "the session stopped" that Python can subscribe to,
and a coordinator that outlives its driver's session keeps holding the lease for a job that is
over. A daemon thread asks the SparkContext whether it stopped (``sc._jsc.sc().isStopped()``,
or ``_jsc`` gone, which is what ``SparkContext.stop()`` leaves) and stops the coordinator, which
releases the lease; ``atexit`` does the same when the interpreter ends first.
"""
from __future__ import annotations

import atexit
import dataclasses
import logging
import os
import threading
from typing import Mapping, Optional, Union

from ..cluster.cluster import Cluster
from ..errors import InvalidConfigError
from .config import CoordinatorConfig, coordinator_options, load_coordinator_config
from .service import Coordinator

log = logging.getLogger(__name__)

WATCH_INTERVAL_S = 1.0
#: the keyword arguments of ``start`` that are Coordinator's own, not settings
RUNTIME = ("token", "ticks", "holder", "leases")


def session_stopped(spark) -> bool:
    """Whether ``spark``'s SparkContext has stopped (a JVM that no longer answers has too)."""
    sc = getattr(spark, "_sc", None)
    jsc = getattr(sc, "_jsc", None)
    if jsc is None:
        return True
    try:
        return bool(jsc.sc().isStopped())
    except Exception:   # noqa: BLE001 - py4j: the gateway is gone with the JVM
        return True


class SessionWatch:
    """Stops ``coordinator`` once ``spark`` stops; a daemon thread, ended by the coordinator's
    own stop too."""

    def __init__(self, spark, coordinator: Coordinator, interval_s: float = WATCH_INTERVAL_S):
        if getattr(spark, "_sc", None) is None:
            raise InvalidConfigError(
                "start(spark) watches a classic SparkSession's SparkContext; this session has "
                "none (Spark Connect?): start(cluster_url) and stop the handle yourself")
        self.spark, self.coordinator, self.interval_s = spark, coordinator, interval_s
        self.thread = threading.Thread(target=self._run, name="kl-coordinator-session-watch",
                                       daemon=True)

    def start(self) -> "SessionWatch":
        self.thread.start()
        return self

    def _run(self) -> None:
        while not self.coordinator.wait(self.interval_s):
            if session_stopped(self.spark):
                log.info("the Spark session stopped: stopping coordinator %s",
                         self.coordinator.holder)
                self.coordinator.stop()
                return


def start(spark_or_cluster, *, cluster=None,
          config: Union[str, os.PathLike, Mapping[str, str], CoordinatorConfig, None] = None,
          cluster_options: Optional[dict] = None, **options) -> Coordinator:
    """Start a coordinator in a background thread of this process and return it (``.stop()``,
    ``.address``, ``.metrics_url``, ``.epoch``: None while it stands by).

    ``spark_or_cluster``: a SparkSession (then ``cluster=`` names the cluster, and the
    coordinator stops when the session does), a cluster URL, or a :class:`Cluster`. ``config``:
    the settings file (``conf/coordinator.properties``: the service's keys and the scheduled
    maintenance's), those properties as a mapping, or a :class:`CoordinatorConfig`. The other
    keyword arguments are :class:`Coordinator`'s (``token``, ``ticks``, ``holder``, ``leases``)
    or :class:`CoordinatorConfig`'s (``token_file``, ``bind``, ``lease_ms``, ``maintenance``,
    ``maintenance_config``, ...) and win over ``config``. It always stops at interpreter
    exit."""
    spark = None
    target = spark_or_cluster
    if not isinstance(target, (str, Cluster)):
        spark, target = target, cluster
        if target is None:
            raise InvalidConfigError("start(spark, cluster=URL): name the cluster the "
                                     "coordinator serves")
    elif cluster is not None:
        raise InvalidConfigError("start(cluster_url) takes no cluster=; give one or the other")
    if isinstance(target, str):
        target = Cluster(target, create=False, **(cluster_options or {}))
    runtime = {k: options.pop(k) for k in RUNTIME if k in options}
    given = {}
    if isinstance(config, CoordinatorConfig):
        given = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    elif isinstance(config, Mapping):
        given = coordinator_options(config)
    elif config is not None:
        given = load_coordinator_config(os.fspath(config))
    settings = CoordinatorConfig.of(**{**given, **options})
    coordinator = Coordinator(target, settings, **runtime)
    watch = SessionWatch(spark, coordinator) if spark is not None else None
    coordinator.start()
    atexit.register(coordinator.stop)
    if watch is not None:
        watch.start()
    return coordinator
