"""The coordinator's settings from one Java-properties file (conf/coordinator.properties).

One file for the whole service, as a broker has one server.properties: the service process's
own keys (which port, which token file, how long the lease; ``KEYS`` here) and the scheduled
maintenance's (``scheduler.KEYS``, handed to the ``MaintenanceScheduler`` as one
``SchedulerConfig``). A key neither knows is an error naming it, so a typo never silently falls
back to a default. Command-line options and keyword arguments win over the file.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Dict, Mapping, Optional, Union

from ..cluster.config import read_properties_file
from ..cluster.quotas import check_new_rate
from ..config_def import (BOOLEAN, DOUBLE, INT, LONG, STRING, ConfigDef, at_least, between,
                          check, one_of)
from ..errors import InvalidConfigError
from .fetch_session import DEFAULT_CACHE_SLOTS, MIN_EVICTION_MS
from .quota_manager import (DEFAULT_WINDOW_NUM, DEFAULT_WINDOW_SIZE_S, WINDOW_NUM_RULE,
                            WINDOW_SIZE_RULE)
from .replicator import (DEFAULT_BROKER_SESSION_TIMEOUT_MS, DEFAULT_NUM_REPLICA_FETCHERS,
                         DEFAULT_REPLICA_LAG_TIME_MAX_MS, DEFAULT_REPLICA_VERIFY_INTERVAL_MS)
from .scheduler import KEYS as MAINTENANCE_KEYS, SchedulerConfig

MIN_LEASE_MS = 100
ON_FENCED = ("standby", "exit")
DEFAULT_TICK_INTERVAL_MS = 1_000


def split_bind(bind: str):
    """``HOST:PORT`` (``[v6]:PORT`` too) as (host, port), checked: the port is a decimal number
    0..65535 (0: any free port). gRPC would take 99999 and listen on 99999 mod 65536."""
    host, sep, port = bind.rpartition(":") if isinstance(bind, str) else ("", "", "")
    if not sep or not port.isdigit() or not port.isascii():
        raise InvalidConfigError(f"bind address {bind!r}: expected HOST:PORT (port 0: any free "
                                 "port)")
    if not 0 <= int(port) <= 65535:
        raise InvalidConfigError(f"bind address {bind!r}: port {int(port)} is not 0..65535 "
                                 "(0: any free port)")
    return host.strip("[]"), int(port)


@check("HOST:PORT, port 0..65535")
def _bind(name: str, value: str, raw: Any) -> None:
    split_bind(value)


@check("[1,...,9223372036854775807], a whole number")
def _rate(name: str, value: float, raw: Any) -> None:
    # the rule of client quotas in the metadata log (kafkalog configs --entity-type clients)
    check_new_rate(name, raw)


#: the service's own settings, the one declaration of each (``CoordinatorConfig``'s defaults and
#: checks, ``coordinator_options``, ``kafkalog coordinator --help``, docs/configuration.md). The
#: scheduled maintenance's are ``scheduler.MAINTENANCE_SETTINGS``; one file holds both.
COORDINATOR_SETTINGS = (
    ConfigDef("coordinator setting")
    .define("coordinator.bind", STRING, "127.0.0.1:0",
            "where gRPC listens, HOST:PORT (port 0..65535, 0: any free port; clients find it "
            "through the metadata log)", validator=_bind, attr="bind")
    .define("coordinator.advertised.address", STRING, None,
            "the address clients are told (null: the bound one; the host name for a wildcard "
            "bind)", attr="advertised_address")
    .define("coordinator.metrics.port", INT, 0,
            "Prometheus metrics on http://HOST:N/metrics (0: any free port; printed at start "
            "and in --status)", validator=between(0, 65535), attr="metrics_port")
    .define("coordinator.token.file", STRING, None,
            "the file holding the shared token (null: $KAFKALOG_COORDINATOR_TOKEN)",
            attr="token_file")
    .define("coordinator.lease.ms", INT, 10_000,
            "lease length: a standby takes over this long after the active one dies; renewed "
            "every third of it", validator=at_least(MIN_LEASE_MS), attr="lease_ms")
    .define("coordinator.on.fenced", STRING, "standby",
            "when another took over: stand by, or exit with status 1",
            validator=one_of(*ON_FENCED, case_sensitive=True), attr="on_fenced")
    .define("coordinator.maintenance.enable", BOOLEAN, True,
            "run the scheduled maintenance (retention, cleanup, checkpoint rewrites, deletion "
            "after consumption)", attr="maintenance")
    .define("coordinator.replication.enable", BOOLEAN, True,
            "copy committed segments to followers and keep the ISR", attr="replication")
    .define("replica.lag.time.max.ms", LONG, DEFAULT_REPLICA_LAG_TIME_MAX_MS,
            "a follower not caught up for this long leaves the ISR", validator=at_least(1))
    .define("replica.fetch.wait.max.ms", INT, 500,
            "the pause between two replication passes", validator=at_least(1))
    .define("broker.session.timeout.ms", INT, DEFAULT_BROKER_SESSION_TIMEOUT_MS,
            "a log dir unreadable for this long is offline", validator=at_least(1))
    .define("num.replica.fetchers", INT, DEFAULT_NUM_REPLICA_FETCHERS,
            "segments of one follower copied at once", validator=at_least(1))
    .define("replica.verify.interval.ms", LONG, DEFAULT_REPLICA_VERIFY_INTERVAL_MS,
            "how often in-sync followers' files are checked against the metadata",
            validator=at_least(1))
    .define("quota.producer.default", DOUBLE, None,
            "bytes per second of a client id without a produce quota (null: none)",
            validator=_rate)
    .define("quota.consumer.default", DOUBLE, None,
            "bytes per second of a client id without a fetch quota (null: none)",
            validator=_rate)
    .define("quota.window.num", INT, DEFAULT_WINDOW_NUM,
            "samples of the quota window; a client may use num - 1 windows of its quota at "
            "once", validator=WINDOW_NUM_RULE)
    .define("quota.window.size.seconds", INT, DEFAULT_WINDOW_SIZE_S,
            "seconds of one quota window sample", validator=WINDOW_SIZE_RULE,
            attr="quota_window_size_s")
    .define("max.incremental.fetch.session.cache.slots", INT, DEFAULT_CACHE_SLOTS,
            "fetch sessions (KIP-227) the cache holds at most (0: none)",
            validator=at_least(0)))
#: every key the file may hold
ALL_KEYS = frozenset(COORDINATOR_SETTINGS.names()) | MAINTENANCE_KEYS
_DEFAULTS = COORDINATOR_SETTINGS.defaults(by_attr=True)


@dataclass(frozen=True)
class CoordinatorConfig:
    """Every setting of a :class:`~pyspark_kafkalog.coordinator.service.Coordinator`: one field
    per key of :data:`COORDINATOR_SETTINGS` (its default), the scheduled maintenance's as one
    ``SchedulerConfig``, and two that are no property. Every value is checked as the property
    would be, whichever way it came (``CoordinatorConfig(lease_ms=50)`` is refused naming
    ``coordinator.lease.ms``); ``None`` for a key without a default is "none" (and for
    ``metrics_port``: no metrics endpoint)."""

    bind: str = _DEFAULTS["bind"]
    advertised_address: Optional[str] = _DEFAULTS["advertised_address"]
    metrics_port: Optional[int] = _DEFAULTS["metrics_port"]
    token_file: Optional[str] = _DEFAULTS["token_file"]
    lease_ms: int = _DEFAULTS["lease_ms"]
    on_fenced: str = _DEFAULTS["on_fenced"]
    maintenance: bool = _DEFAULTS["maintenance"]
    replication: bool = _DEFAULTS["replication"]
    replica_lag_time_max_ms: int = _DEFAULTS["replica_lag_time_max_ms"]
    replica_fetch_wait_max_ms: int = _DEFAULTS["replica_fetch_wait_max_ms"]
    broker_session_timeout_ms: int = _DEFAULTS["broker_session_timeout_ms"]
    num_replica_fetchers: int = _DEFAULTS["num_replica_fetchers"]
    replica_verify_interval_ms: int = _DEFAULTS["replica_verify_interval_ms"]
    quota_producer_default: Optional[float] = _DEFAULTS["quota_producer_default"]
    quota_consumer_default: Optional[float] = _DEFAULTS["quota_consumer_default"]
    quota_window_num: int = _DEFAULTS["quota_window_num"]
    quota_window_size_s: int = _DEFAULTS["quota_window_size_s"]
    max_incremental_fetch_session_cache_slots: int = _DEFAULTS[
        "max_incremental_fetch_session_cache_slots"]
    #: the scheduled maintenance's settings (a ``SchedulerConfig``, or its properties)
    maintenance_config: Union[SchedulerConfig, Mapping[str, object]] = field(
        default_factory=SchedulerConfig)
    #: not properties: how often maintenance hooks are called, and KIP-227's minimum eviction
    #: time (a constant in Kafka, 120 s; tests set it)
    tick_interval_ms: int = DEFAULT_TICK_INTERVAL_MS
    fetch_session_min_eviction_ms: int = MIN_EVICTION_MS

    def __post_init__(self):
        for key in COORDINATOR_SETTINGS.keys.values():
            value = getattr(self, key.attr)
            if value is not None:
                object.__setattr__(self, key.attr, key.parse(value))
        if not isinstance(self.maintenance_config, SchedulerConfig):
            object.__setattr__(self, "maintenance_config",
                               SchedulerConfig.from_properties(self.maintenance_config))
        for name, value, least in (("tick_interval_ms", self.tick_interval_ms, 1),
                                   ("fetch_session_min_eviction_ms",
                                    self.fetch_session_min_eviction_ms, 0)):
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise InvalidConfigError(f"{name} must be an integer >= {least}, got {value!r}")

    @classmethod
    def of(cls, **settings) -> "CoordinatorConfig":
        """From keyword arguments (``CoordinatorConfig.of(lease_ms=2500, maintenance=False)``);
        unknown ones are refused naming them."""
        unknown = sorted(set(settings) - {f.name for f in fields(cls)})
        if unknown:
            raise InvalidConfigError(f"unknown coordinator setting(s) {unknown}; known: "
                                     f"{sorted(f.name for f in fields(cls))}")
        return cls(**settings)

    @classmethod
    def from_properties(cls, props: Optional[Mapping[str, str]] = None,
                        **overrides) -> "CoordinatorConfig":
        """From the properties of ``conf/coordinator.properties``; ``overrides`` (keyword
        arguments, command-line options) win over them."""
        return cls.of(**{**coordinator_options(props or {}), **overrides})

    @classmethod
    def load(cls, path: str, **overrides) -> "CoordinatorConfig":
        return cls.of(**{**load_coordinator_config(path), **overrides})


# every setting is a field
assert set(COORDINATOR_SETTINGS.attrs()) <= {f.name for f in fields(CoordinatorConfig)}


def coordinator_options(props: Mapping[str, str]) -> Dict[str, Any]:
    """Map properties to ``CoordinatorConfig`` fields (an empty value: the default): only the
    keys given. The scheduled maintenance's keys, if any, become one ``maintenance_config``
    (a ``SchedulerConfig``), checked here."""
    own: Dict[str, Any] = {}
    maintenance: Dict[str, Any] = {}
    for key, value in props.items():
        if key in MAINTENANCE_KEYS:
            maintenance[key] = value
        elif key not in COORDINATOR_SETTINGS:
            raise InvalidConfigError(f"unknown coordinator setting {key!r}; known: "
                                     f"{sorted(ALL_KEYS)}")
        elif str(value).strip():
            own[key] = value
    out = COORDINATOR_SETTINGS.parse(own, by_attr=True)
    if maintenance:
        out["maintenance_config"] = SchedulerConfig.from_properties(maintenance)
    return out


def load_coordinator_config(path: str) -> Dict[str, Any]:
    return coordinator_options(read_properties_file(path, "coordinator config"))
