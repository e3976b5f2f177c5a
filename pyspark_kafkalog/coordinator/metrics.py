"""The coordinator's metrics, in Prometheus' text format on an HTTP endpoint.

Each coordinator has its own ``CollectorRegistry``, not prometheus_client's global one: two
coordinators in one process (tests; a driver that runs one per cluster) must not share counters,
and a process that never starts one must export nothing. Only what is measured today is
exported: the replication gauges count what the metadata says at each scrape: the ISR of every
replicated partition (docs/protocol.md §1.3; the leader alone for a partition that is not), the
partitions by ISR size, and the largest replication lag in offsets (docs/coordinator.md,
"Metrics"); the fetch session cache's KIP-227 metrics are read from the cache at each scrape.
"""
from __future__ import annotations

import logging
import re
from typing import Callable, Dict, Mapping, Optional

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from .fetch_session import (INCREMENTAL_FETCH_SESSION_EVICTIONS_PER_SEC,
                            NUM_INCREMENTAL_FETCH_PARTITIONS_CACHED, NUM_INCREMENTAL_FETCH_SESSIONS)

log = logging.getLogger(__name__)

PREFIX = "kafkalog_coordinator"
#: what a client id label may not hold as it is: '%' (the escape itself), control characters
#: (Unicode Cc: C0, DEL, C1) and lone surrogates (a JSON string may hold one; UTF-8 cannot)
_UNSAFE_IN_LABEL = re.compile("[%\x00-\x1f\x7f-\x9f\ud800-\udfff]")


def client_label(client_id: str) -> str:
    """A client id as a Prometheus label value: the client id itself, except that '%',
    control characters and lone surrogates are percent-encoded as their UTF-8 bytes
    (``a\\r`` -> ``a%0D``, NUL -> ``%00``, ``50%`` -> ``50%25``), as Kafka's ``Sanitizer``
    percent-encodes client ids for JMX (it encodes more). Label values may hold any UTF-8, but
    a CR or NUL in a scrape breaks parsers and log lines alike, and a lone surrogate cannot be
    written at all; escaping '%' too keeps two client ids two series (docs/operations.md,
    "Metrics")."""
    if not _UNSAFE_IN_LABEL.search(client_id):
        return client_id
    return _UNSAFE_IN_LABEL.sub(
        lambda m: "".join(f"%{b:02X}" for b in m.group().encode("utf-8", "surrogatepass")),
        client_id)


class CoordinatorMetrics:
    def __init__(self):
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.epoch = Gauge(f"{PREFIX}_epoch", "Coordinator epoch held by this process "
                           "(0 while it is a standby)", registry=r)
        self.active = Gauge(f"{PREFIX}_active", "1 while this process is the active "
                            "coordinator (Kafka's ActiveControllerCount)", registry=r)
        # the log cleaner's, as of its last run: Kafka's kafka.log:type=LogCleaner metrics
        self.cleaner = {
            "max_dirty_percent": Gauge(
                f"{PREFIX}_log_cleaner_max_dirty_percent", "Kafka's max-dirty-percent: the "
                "largest dirty share of a compacted log, in percent", registry=r),
            "recopy_percent": Gauge(
                f"{PREFIX}_log_cleaner_recopy_percent", "Kafka's cleaner-recopy-percent: "
                "bytes written over bytes read by the last clean, in percent", registry=r),
            "max_clean_time_ms": Gauge(
                f"{PREFIX}_log_cleaner_max_clean_time_secs", "Kafka's max-clean-time-secs: "
                "the longest clean of one log in the last run", registry=r),
            "max_compaction_delay_ms": Gauge(
                f"{PREFIX}_log_cleaner_max_compaction_delay_secs", "Kafka's "
                "max-compaction-delay-secs: how far past max.compaction.lag.ms a log was "
                "cleaned", registry=r)}
        self.lease_acquisitions = Counter(f"{PREFIX}_lease_acquisitions",
                                          "Times this process took the lease (a new epoch)",
                                          registry=r)
        self.lease_renewals = Counter(f"{PREFIX}_lease_renewals", "Lease renewals written",
                                      registry=r)
        self.lease_renewal_failures = Counter(
            f"{PREFIX}_lease_renewal_failures", "Lease renewals that failed for a reason other "
            "than fencing (storage unavailable, ...)", registry=r)
        self.fenced = Counter(f"{PREFIX}_fenced", "Times this process found its epoch "
                              "superseded, or its lease lapsed, and stopped acting", registry=r)
        self.leader_elections = Counter(f"{PREFIX}_leader_elections", "Partition leader "
                                        "elections this coordinator made", registry=r)
        self.maintenance_runs = Counter(f"{PREFIX}_maintenance_runs", "Scheduled maintenance "
                                        "runs, by kind", ["kind"], registry=r)
        self.maintenance_failures = Counter(f"{PREFIX}_maintenance_failures", "Scheduled "
                                            "maintenance runs that failed, by kind", ["kind"],
                                            registry=r)
        self.unclean_leader_elections = Counter(
            f"{PREFIX}_unclean_leader_elections", "Unclean leader elections this coordinator "
            "made (Kafka's UncleanLeaderElectionsPerSec)", registry=r)
        self.isr_shrinks = Counter(f"{PREFIX}_isr_shrinks", "Replicas taken out of an ISR "
                                   "(Kafka's IsrShrinksPerSec)", registry=r)
        self.isr_expands = Counter(f"{PREFIX}_isr_expands", "Replicas added to an ISR "
                                   "(Kafka's IsrExpandsPerSec)", registry=r)
        self.replication_segments = Counter(f"{PREFIX}_replication_segments", "Segments "
                                            "copied to followers, by mode (streamed, "
                                            "server_side, existing)", ["mode"], registry=r)
        self.replication_bytes = Counter(f"{PREFIX}_replication_bytes", "Bytes of segments "
                                         "copied to followers", registry=r)
        self.client_bytes = Counter(f"{PREFIX}_client_bytes", "Bytes clients reported, by client "
                                    "id and kind (produce, fetch)", ["client_id", "kind"],
                                    registry=r)
        self.client_throttle = Counter(f"{PREFIX}_client_throttle_seconds", "Throttle time "
                                       "given to clients over their quota, by client id and kind",
                                       ["client_id", "kind"], registry=r)
        self.auth_failures = Counter(f"{PREFIX}_rpc_authentication_failures",
                                     "RPC calls refused for a missing or wrong token",
                                     registry=r)
        self._server = None
        self._thread = None

    def watch_replication(self, summary: Callable[[], Mapping[str, object]]) -> None:
        """Export ``summary()`` (``cluster.replication_summary`` of the current state), computed
        at each scrape: counts of partitions (and ``partitions_by_isr_size``, {size: count}, as
        one gauge labelled ``size``), so never stale and never a placeholder."""
        self.registry.register(_ReplicationCollector(summary))

    def watch_client_quotas(self, usage: Callable[[], Mapping]) -> None:
        """Export ``usage()`` (``QuotaService.usage``: {(client_id, kind): (byte rate, throttle
        time max ms, avg ms)}) at each scrape: Kafka's per-client ``byte-rate`` and
        ``throttle-time``, labelled by :func:`client_label`."""
        self.registry.register(_ClientQuotaCollector(usage))

    def watch_fetch_sessions(self, cache) -> None:
        """Export the KIP-227 metrics of the coordinator's fetch session cache
        (``FetchSessionCache``), read at each scrape."""
        self.registry.register(_FetchSessionCollector(cache))

    def count_runs(self, runs) -> None:
        """What a maintenance hook reports it ran: runs with ``.kind`` and ``.ok`` (the
        scheduler's ``MaintenanceRun``), kind names, or ``{kind: count}``; None for nothing."""
        if runs is None:
            return
        if isinstance(runs, str):
            runs = [runs]
        if isinstance(runs, Mapping):
            runs = [kind for kind, n in runs.items() for _ in range(int(n))]
        for run in runs:
            kind = str(getattr(run, "kind", run))
            if kind == "log_cleaner" and getattr(run, "changed", None):
                for name, gauge in self.cleaner.items():
                    value = run.changed.get(name, 0)
                    gauge.set(value / 1000 if name.endswith("_ms") else value)
            self.maintenance_runs.labels(kind=kind).inc()
            if getattr(run, "ok", True) is False:
                self.maintenance_failures.labels(kind=kind).inc()

    def count_replication(self, result) -> None:
        """What one replication pass did (``replicator.PassResult``)."""
        for mode, n in result.by_mode.items():
            self.replication_segments.labels(mode=mode).inc(n)
        self.replication_bytes.inc(result.bytes)
        self.leader_elections.inc(sum(result.elections.values()))
        self.unclean_leader_elections.inc(result.elections.get("unclean", 0))
        self.isr_shrinks.inc(result.isr_shrinks)
        self.isr_expands.inc(result.isr_expands)

    def count_usage(self, client_id: str, kind: str, nbytes: int, delay_s: float) -> None:
        label = client_label(client_id)
        self.client_bytes.labels(client_id=label, kind=kind).inc(nbytes)
        if delay_s > 0:
            self.client_throttle.labels(client_id=label, kind=kind).inc(delay_s)

    def summary(self) -> Dict[str, object]:
        """The current values, for the Status RPC: by their names without the prefix (and
        ``_total``), the maintenance counters as ``{kind: count}``, the per-client ones as
        ``{client_id: {kind: value}}`` (client ids as their labels: :func:`client_label`)."""
        out: Dict[str, object] = {}
        for family in self.registry.collect():
            short = family.name[len(PREFIX) + 1:]
            if family.name.startswith(f"{PREFIX}_maintenance_") or short == _BY_ISR_SIZE[0] \
                    or family.name.startswith(f"{PREFIX}_client_") \
                    or family.name.startswith(f"{PREFIX}_replication_segments"):
                out[short] = {}
            for sample in family.samples:
                if sample.name.endswith("_created"):
                    continue
                value = int(sample.value) if float(sample.value).is_integer() else sample.value
                if "client_id" in sample.labels:
                    out[short].setdefault(sample.labels["client_id"], {})[
                        sample.labels["kind"]] = value
                elif "mode" in sample.labels:
                    out[short][sample.labels["mode"]] = value
                elif "kind" in sample.labels:
                    out[short][sample.labels["kind"]] = value
                elif "size" in sample.labels:    # partitions_by_isr_size: {size: count}
                    out[short][int(sample.labels["size"])] = value
                else:
                    out[short] = value
        return out

    def serve(self, host: str, port: int) -> int:
        """Start the HTTP endpoint (``/metrics``); returns the port it listens on."""
        self._server, self._thread = start_http_server(port, addr=host, registry=self.registry)
        return self._server.server_port

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


_REPLICATION = {
    "partitions": "Partitions in the cluster",
    "under_replicated_partitions": "Partitions whose ISR is smaller than their replicas "
                                   "(Kafka's UnderReplicatedPartitions)",
    "under_min_isr_partitions": "Partitions whose ISR is smaller than their topic's "
                                "min.insync.replicas, at most the replication factor (Kafka's "
                                "UnderMinIsrPartitionCount); their high watermark does not move",
    "at_min_isr_partitions": "Partitions whose ISR is exactly their topic's min.insync.replicas, "
                             "at most the replication factor (Kafka's AtMinIsrPartitionCount)",
    "replication_max_lag_offsets": "The largest lag of any follower of a replicated partition, "
                                   "in offsets: last stable offset - the end of what it holds "
                                   "(Kafka's MaxLag)",
}
#: partitions by ISR size, one sample per size present
_BY_ISR_SIZE = ("partitions_by_isr_size", "Partitions by the size of their ISR")


class _ReplicationCollector:
    def __init__(self, summary: Callable[[], Mapping[str, int]]):
        self._summary = summary

    def describe(self):   # without reading the cluster when registered
        return ([GaugeMetricFamily(f"{PREFIX}_{k}", h) for k, h in _REPLICATION.items()]
                + [GaugeMetricFamily(f"{PREFIX}_{_BY_ISR_SIZE[0]}", _BY_ISR_SIZE[1],
                                     labels=["size"])])

    def collect(self):
        try:
            values = self._summary()
        except Exception as exc:   # a scrape must not fail for the storage's trouble
            log.warning("replication metrics unavailable: %s", exc)
            return
        for key, help_ in _REPLICATION.items():
            yield GaugeMetricFamily(f"{PREFIX}_{key}", help_, value=values[key])
        by_size = GaugeMetricFamily(f"{PREFIX}_{_BY_ISR_SIZE[0]}", _BY_ISR_SIZE[1],
                                    labels=["size"])
        for size, count in sorted((values.get(_BY_ISR_SIZE[0]) or {}).items()):
            by_size.add_metric([str(size)], count)
        yield by_size


_CLIENT_GAUGES = (
    ("client_byte_rate", "Bytes per second of a client id over the quota window, by kind "
                         "(Kafka's per-client byte-rate)"),
    ("client_throttle_time_max_ms", "The longest throttle time given to a client id, by kind "
                                    "(ms, since the coordinator started or the client id's "
                                    "first request after an hour without one)"),
    ("client_throttle_time_avg_ms", "The average throttle time of a client id's requests, by "
                                    "kind (ms; unthrottled requests count 0)"),
)


class _ClientQuotaCollector:
    def __init__(self, usage: Callable[[], Mapping]):
        self._usage = usage

    def describe(self):
        return [GaugeMetricFamily(f"{PREFIX}_{n}", h, labels=["client_id", "kind"])
                for n, h in _CLIENT_GAUGES]

    def collect(self):
        families = [GaugeMetricFamily(f"{PREFIX}_{n}", h, labels=["client_id", "kind"])
                    for n, h in _CLIENT_GAUGES]
        for (client_id, kind), values in sorted(self._usage().items()):
            for family, value in zip(families, values):
                family.add_metric([client_label(client_id), kind], value)
        yield from families


#: KIP-227's metric -> (our name without the prefix, help)
_FETCH_SESSIONS = {
    NUM_INCREMENTAL_FETCH_SESSIONS: (
        "incremental_fetch_sessions", "Incremental fetch sessions in the coordinator's cache, "
        "the replicator's included (Kafka's NumIncrementalFetchSessions)"),
    NUM_INCREMENTAL_FETCH_PARTITIONS_CACHED: (
        "incremental_fetch_partitions_cached", "Partitions those sessions hold (Kafka's "
        "NumIncrementalFetchPartitionsCached)"),
    INCREMENTAL_FETCH_SESSION_EVICTIONS_PER_SEC: (
        "incremental_fetch_session_evictions_per_sec", "Sessions evicted to make room for "
        "another, per second over the last 30 s (Kafka's IncrementalFetchSessionEvictionsPerSec;"
        " a session its client closes is not counted)"),
}
_EVICTIONS = ("incremental_fetch_session_evictions", "Sessions evicted to make room for "
              "another since the coordinator started")


class _FetchSessionCollector:
    def __init__(self, cache):
        self._cache = cache

    def describe(self):
        return self.collect()

    def collect(self):
        values = self._cache.metrics()
        for kip_name, (name, help_) in _FETCH_SESSIONS.items():
            yield GaugeMetricFamily(f"{PREFIX}_{name}", help_, value=values[kip_name])
        yield CounterMetricFamily(f"{PREFIX}_{_EVICTIONS[0]}", _EVICTIONS[1],
                                  value=self._cache.incremental_fetch_session_evictions)


def metrics_url(host: str, port: Optional[int]) -> Optional[str]:
    if port is None:
        return None
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}/metrics"
