"""The coordinator's settings from one Java-properties file (conf/coordinator.properties).

One file for the whole service, as a broker has one server.properties: the service process's
own keys (which port, which token file, how long the lease; ``KEYS`` here) and the scheduled
maintenance's (``scheduler.KEYS``, handed to the ``MaintenanceScheduler`` as one
``SchedulerConfig``). A key neither knows is an error naming it, so a typo never silently falls
back to a default. Command-line options and keyword arguments win over the file.
"""
from __future__ import annotations

from typing import Any, Dict, Mapping

from ..errors import InvalidConfigError
from ..cluster.config import read_properties_file
from .scheduler import KEYS as MAINTENANCE_KEYS, SchedulerConfig

#: property -> (Coordinator keyword, type)
KEYS = {"coordinator.bind": ("bind", str),
        "coordinator.advertised.address": ("advertised_address", str),
        "coordinator.metrics.port": ("metrics_port", int),
        "coordinator.token.file": ("token_file", str),
        "coordinator.lease.ms": ("lease_ms", int),
        "coordinator.on.fenced": ("on_fenced", str),
        "coordinator.maintenance.enable": ("maintenance", bool),
        "coordinator.replication.enable": ("replication", bool),
        "replica.lag.time.max.ms": ("replica_lag_time_max_ms", int),
        "replica.fetch.wait.max.ms": ("replica_fetch_wait_max_ms", int),
        "broker.session.timeout.ms": ("broker_session_timeout_ms", int),
        "num.replica.fetchers": ("num_replica_fetchers", int),
        "replica.verify.interval.ms": ("replica_verify_interval_ms", int),
        "quota.producer.default": ("quota_producer_default", float),
        "quota.consumer.default": ("quota_consumer_default", float),
        "quota.window.num": ("quota_window_num", int),
        "quota.window.size.seconds": ("quota_window_size_s", int),
        "max.incremental.fetch.session.cache.slots": ("max_incremental_fetch_session_cache_slots",
                                                      int)}
#: every key the file may hold
ALL_KEYS = frozenset(KEYS) | MAINTENANCE_KEYS


def coordinator_options(props: Mapping[str, str]) -> Dict[str, Any]:
    """Map properties to ``Coordinator(cluster, **options)`` keyword arguments (an empty
    value: the default). The scheduled maintenance's keys, if any, become one
    ``maintenance_config`` (a ``SchedulerConfig``), checked here."""
    out: Dict[str, Any] = {}
    maintenance: Dict[str, str] = {}
    for key, value in props.items():
        if key in MAINTENANCE_KEYS:
            maintenance[key] = value
            continue
        if key not in KEYS:
            raise InvalidConfigError(f"unknown coordinator setting {key!r}; known: "
                                     f"{sorted(ALL_KEYS)}")
        name, kind = KEYS[key]
        value = str(value).strip()
        if not value:
            continue
        if kind is int:
            try:
                value = int(value)
            except ValueError:
                raise InvalidConfigError(f"{key} must be an integer, got {value!r}") from None
        elif kind is float:
            try:
                value = float(value)
            except ValueError:
                raise InvalidConfigError(f"{key} must be a number, got {value!r}") from None
        elif kind is bool:                 # as Kafka's ConfigDef reads a BOOLEAN
            if value.lower() not in ("true", "false"):
                raise InvalidConfigError(f"{key} must be true or false, got {value!r}")
            value = value.lower() == "true"
        out[name] = value
    if maintenance:
        out["maintenance_config"] = SchedulerConfig.from_properties(maintenance)
    return out


def load_coordinator_config(path: str) -> Dict[str, Any]:
    return coordinator_options(read_properties_file(path, "coordinator config"))
