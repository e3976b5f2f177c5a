"""Scheduled maintenance: the coordinator's timer for the broker's periodic log jobs (issue #16).

A Kafka broker's ``LogManager`` runs retention every ``log.retention.check.interval.ms`` and
rewrites its checkpoint files every ``log.flush.offset.checkpoint.interval.ms``; kafkalog has no
broker, so without this nothing runs them unless someone runs ``kafkalog retention``/``cleanup``
or the spark-submit jobs. The scheduler only decides *when*: every job calls the rule that the
CLI, the Admin API and ``jobs/`` call (``maintenance.retention``, ``cluster.checkpoints``,
``client.groups.consumed_offsets``), so a rule still lives in one place.

The scheduler knows nothing of leases: the coordinator service calls
:meth:`MaintenanceScheduler.tick` only while it holds the lease, and passes ``active`` so that a
tick starts no further job once the service was fenced or asked to stop. A
``FencedCoordinatorError`` from a job is not one job's failure but news that this process was
deposed, so it is never caught here: it reaches the service, which fences itself. Running only on
the lease holder is about not doing the work twice, not about correctness: every job here is safe
when two processes run it at once, or when a deposed coordinator finishes a run it started before
its lease lapsed (see docs/user-guide.md, "Scheduled maintenance", and
``maintenance/retention.py``): log start offsets only ever rise through the metadata log, and a file
is deleted only on the metadata's positive evidence that no reader may select it.

``tick`` runs the due jobs one after another in the caller's thread; retention or cleanup over
many partitions can take a while, so a service should not call it from the thread that renews
its lease.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, fields
from typing import Callable, Dict, List, Mapping, Optional, Tuple, Union

from ..cluster.checkpoints import sync_checkpoints
from ..cluster.config import read_properties_file
from ..config_def import (BOOLEAN, DOUBLE, INT, LONG, LONG_MAX, STRING, ConfigDef, at_least,
                          between)
from ..maintenance.flush import flush_logs
from ..client.groups import consumed_offsets, validate_group_id
from ..maintenance.compaction import (DEFAULT_DEDUPE_BUFFER_SIZE, DEFAULT_LOAD_FACTOR,
                                     CleanerSettings, Throttle)
from ..maintenance.retention import (FanOut, collect_garbage, compact, delete_records,
                                     offline_error, retention, serial)
from ..errors import FencedCoordinatorError, InvalidConfigError, KafkaLogError, OfflineLogDirError
from ..format.checkpoint import validate_topic_name

log = logging.getLogger(__name__)

#: the kinds of run, in the order a tick runs them when several are due: data first, then the
#: garbage it leaves, then the derived files that describe the result
RETENTION = "retention"
DELETE_AFTER_CONSUMPTION = "delete_after_consumption"
CLEANUP = "cleanup"
CHECKPOINTS = "checkpoints"
FLUSH = "flush"
LOG_CLEANER = "log_cleaner"
KINDS = (RETENTION, DELETE_AFTER_CONSUMPTION, LOG_CLEANER, CLEANUP, CHECKPOINTS, FLUSH)
#: kinds so frequent that a run which changed nothing is neither reported nor logged at INFO
#: (the flush check runs every second, and does nothing where no topic sets ``flush.ms``; the
#: log cleaner looks every ``log.cleaner.backoff.ms``, and cleans nothing where no topic is
#: compacted)
QUIET_WHEN_IDLE = frozenset({FLUSH, LOG_CLEANER})

POLICY_KEY = "kafkalog.delete.after.consumption"


def parse_delete_after_consumption(text: str) -> Dict[str, Tuple[str, ...]]:
    """``topicA:group1,group2;topicB:group3`` -> ``{"topicA": ("group1", "group2"), ...}``.
    Topic names and group ids follow the cluster's own rules; empty means no policy."""
    policy: Dict[str, Tuple[str, ...]] = {}
    for entry in text.split(";"):
        entry = entry.strip()
        if not entry:
            continue
        topic, sep, groups = entry.partition(":")
        topic = topic.strip()
        names = tuple(g.strip() for g in groups.split(",") if g.strip()) if sep else ()
        if not names:
            raise InvalidConfigError(f"{POLICY_KEY}: {entry!r} names no group; expected "
                                     "topic:group[,group...][;topic:group...]")
        try:
            validate_topic_name(topic)
            for g in names:
                validate_group_id(g)
        except KafkaLogError as exc:
            raise InvalidConfigError(f"{POLICY_KEY}: {exc}") from None
        if topic in policy:
            raise InvalidConfigError(f"{POLICY_KEY}: topic {topic!r} is listed twice")
        policy[topic] = tuple(dict.fromkeys(names))
    return policy


#: the scheduled maintenance's settings, the one declaration of each (``SchedulerConfig``'s
#: defaults, ``from_properties``, docs/configuration.md). Kafka's broker names and defaults where
#: Kafka has the job; ``kafkalog.*`` where it does not (Kafka has no garbage of dead writers).
#: One default is not Kafka's: its log flusher's interval is Long.MAX_VALUE, which leaves every
#: topic's ``flush.ms`` without effect; here the check runs every second, and costs nothing
#: where no topic sets ``flush.ms``. Intervals are milliseconds.
MAINTENANCE_SETTINGS = (
    ConfigDef("maintenance setting")
    .define("log.retention.check.interval.ms", LONG, 300_000,
            "how often retention deletes segments past retention.ms / retention.bytes",
            validator=between(1, LONG_MAX), attr="retention_check_interval_ms")
    .define("kafkalog.cleanup.interval.ms", LONG, 300_000,
            "how often cleanup aborts expired writes and deletes garbage",
            validator=between(1, LONG_MAX), attr="cleanup_interval_ms")
    .define("log.flush.offset.checkpoint.interval.ms", LONG, 60_000,
            "how often every partition's checkpoint files are rewritten from the metadata",
            validator=between(1, LONG_MAX), attr="checkpoint_interval_ms")
    .define("kafkalog.delete.after.consumption.interval.ms", LONG, 300_000,
            "how often records the named groups all consumed are deleted",
            validator=between(1, LONG_MAX), attr="delete_after_consumption_interval_ms")
    .define("log.flush.scheduler.interval.ms", LONG, 1000,
            "how often topics' flush.ms is checked (not Kafka's default, Long.MAX_VALUE)",
            validator=between(1, LONG_MAX), attr="flush_check_interval_ms")
    .define("log.cleaner.enable", BOOLEAN, True,
            "run the log cleaner on compacted topics (cleanup.policy=compact)",
            attr="cleaner_enable")
    .define("log.cleaner.backoff.ms", LONG, 15_000,
            "how long the log cleaner waits before it looks for dirty logs again",
            validator=between(1, LONG_MAX), attr="cleaner_backoff_ms")
    .define("log.cleaner.threads", INT, 1, "partitions cleaned at once",
            validator=at_least(1), attr="cleaner_threads")
    .define("log.cleaner.dedupe.buffer.size", LONG, DEFAULT_DEDUPE_BUFFER_SIZE,
            "the memory of the cleaners' offset maps, shared by its threads",
            validator=between(1 << 10, LONG_MAX), attr="cleaner_dedupe_buffer_size")
    .define("log.cleaner.io.buffer.load.factor", DOUBLE, DEFAULT_LOAD_FACTOR,
            "how full an offset map may get", validator=between(0.01, 1),
            attr="cleaner_io_buffer_load_factor")
    .define("log.cleaner.io.max.bytes.per.second", DOUBLE, 1.7976931348623157e308,
            "the cleaners' read and write rate, all threads together",
            validator=at_least(1), attr="cleaner_io_max_bytes_per_second")
    .define(POLICY_KEY, STRING, "",
            "delete records once these groups all consumed them: "
            "topic:group[,group...][;topic:group...]; empty: off",
            attr="delete_after_consumption", convert=parse_delete_after_consumption))
#: property name -> (SchedulerConfig attribute, default) of each interval
INTERVAL_KEYS: Dict[str, Tuple[str, int]] = {
    k.name: (k.attr, k.default) for k in MAINTENANCE_SETTINGS.keys.values()
    if k.type == LONG and k.name.endswith(".ms")}
#: every key the scheduler takes (a service reading one file for several parts can split by it)
KEYS = frozenset(MAINTENANCE_SETTINGS.names())
_DEFAULTS = MAINTENANCE_SETTINGS.defaults(by_attr=True)


@dataclass(frozen=True)
class SchedulerConfig:
    """Defaults from :data:`MAINTENANCE_SETTINGS`."""
    retention_check_interval_ms: int = _DEFAULTS["retention_check_interval_ms"]
    cleanup_interval_ms: int = _DEFAULTS["cleanup_interval_ms"]
    checkpoint_interval_ms: int = _DEFAULTS["checkpoint_interval_ms"]
    delete_after_consumption_interval_ms: int = _DEFAULTS["delete_after_consumption_interval_ms"]
    flush_check_interval_ms: int = _DEFAULTS["flush_check_interval_ms"]
    cleaner_enable: bool = _DEFAULTS["cleaner_enable"]
    cleaner_backoff_ms: int = _DEFAULTS["cleaner_backoff_ms"]
    cleaner_threads: int = _DEFAULTS["cleaner_threads"]
    cleaner_dedupe_buffer_size: int = _DEFAULTS["cleaner_dedupe_buffer_size"]
    cleaner_io_buffer_load_factor: float = _DEFAULTS["cleaner_io_buffer_load_factor"]
    cleaner_io_max_bytes_per_second: float = _DEFAULTS["cleaner_io_max_bytes_per_second"]
    #: topic -> the groups that must all have consumed a record before it is deleted; empty: off
    delete_after_consumption: Mapping[str, Tuple[str, ...]] = field(
        default_factory=lambda: MAINTENANCE_SETTINGS[POLICY_KEY].value)

    @classmethod
    def from_properties(cls, props: Optional[Mapping[str, object]] = None) -> "SchedulerConfig":
        """Validate a Java-properties mapping; an unknown key or a bad value raises
        ``InvalidConfigError`` naming the key, so a typo never falls back to a default."""
        return cls(**MAINTENANCE_SETTINGS.parse(props, by_attr=True))

    def interval_ms(self, kind: str) -> Optional[int]:
        """How often ``kind`` runs; None when it is off (no delete-after-consumption policy)."""
        if kind == DELETE_AFTER_CONSUMPTION and not self.delete_after_consumption:
            return None
        if kind == LOG_CLEANER and not self.cleaner_enable:
            return None
        return getattr(self, {RETENTION: "retention_check_interval_ms",
                              CLEANUP: "cleanup_interval_ms",
                              CHECKPOINTS: "checkpoint_interval_ms",
                              FLUSH: "flush_check_interval_ms",
                              LOG_CLEANER: "cleaner_backoff_ms",
                              DELETE_AFTER_CONSUMPTION: "delete_after_consumption_interval_ms"}[kind])


# every setting is a field and every field a setting
assert {f.name for f in fields(SchedulerConfig)} == set(MAINTENANCE_SETTINGS.attrs())


def threaded(threads: int) -> FanOut:
    """A fan-out over ``threads`` threads of this process (``log.cleaner.threads``): the
    partitions dealt round-robin, one group a thread."""
    def fan_out(items, fn):
        from concurrent.futures import ThreadPoolExecutor
        groups = [list(items)[i::threads] for i in range(threads)]
        with ThreadPoolExecutor(threads, thread_name_prefix="kafkalog-cleaner") as pool:
            return [r for rs in pool.map(fn, [g for g in groups if g]) for r in rs]
    return fan_out


def load_scheduler_config(path: str) -> SchedulerConfig:
    """A properties file of the scheduler's keys only, read as Java reads one. The coordinator
    reads them from its own settings file instead (``conf/coordinator.properties``,
    ``coordinator/config.py``)."""
    return SchedulerConfig.from_properties(read_properties_file(path, "maintenance config"))


@dataclass(frozen=True)
class MaintenanceRun:
    """One run of one job: what a ``maintenance runs`` metric counts, labelled by ``kind`` and
    ``ok``. ``changed`` holds counts (segments, bytes, partitions...) by name; ``error`` is
    ``"NAME: message"`` (a Kafka error name, or the exception's type) when ``ok`` is false."""

    kind: str
    ok: bool
    started: float                 # the tick's ``now``
    duration_s: float
    changed: Dict[str, int] = field(default_factory=dict)
    error: Optional[str] = None


class MaintenanceScheduler:
    """Runs each job once its interval has passed since its last run (the first one interval
    after construction, as a broker's first retention check waits too), never more often,
    whatever the tick rate; a job that fails is retried one interval later."""

    def __init__(self, cluster, config: Union[SchedulerConfig, Mapping[str, object], None] = None,
                 *, clock: Callable[[], float] = time.time, fan_out: FanOut = serial,
                 active: Callable[[], bool] = lambda: True):
        """``config``: a ``SchedulerConfig`` or a properties mapping; ``clock``: seconds, what
        ``tick`` is called with; ``fan_out``: how retention and deletion spread per-partition
        work (``jobs/_common.spark_fan_out`` puts it on Spark executors); ``active``: asked
        before each job, a false answer ends the tick (the coordinator: while it holds the
        lease and is not stopping), leaving the remaining jobs due."""
        if not isinstance(config, SchedulerConfig):
            config = SchedulerConfig.from_properties(config)
        self.cluster, self.config, self.clock, self.fan_out = cluster, config, clock, fan_out
        self.active = active
        start = clock()
        self._next: Dict[str, float] = {}
        for kind in KINDS:
            ms = config.interval_ms(kind)
            if ms is not None:
                self._next[kind] = start + ms / 1000.0
        self._jobs: Dict[str, Callable[[float], Tuple[Dict[str, int], Optional[str]]]] = {
            RETENTION: self._retention, DELETE_AFTER_CONSUMPTION: self._delete_after_consumption,
            CLEANUP: self._cleanup, CHECKPOINTS: self._checkpoints, FLUSH: self._flush,
            LOG_CLEANER: self._log_cleaner}
        rate = config.cleaner_io_max_bytes_per_second
        self._throttle = Throttle(rate) if rate < 1e300 else None
        self._flushed: Dict[str, int] = {}   # log dir -> when this process last flushed it

    def next_due(self) -> Dict[str, float]:
        """When each enabled job runs next, on ``clock``'s scale."""
        return dict(self._next)

    def tick(self, now: Optional[float] = None) -> List[MaintenanceRun]:
        """Run the jobs due at ``now`` (default: ``clock()``), each wrapped so that a failure is
        logged at WARNING and reported, and neither stops the others nor escapes; except
        ``FencedCoordinatorError``, which ends the tick and propagates (the caller was deposed
        and must run nothing more)."""
        now = self.clock() if now is None else now
        runs = []
        for kind in KINDS:
            due = self._next.get(kind)
            if due is None or now < due:
                continue
            if not self.active():
                break
            run = self._run(kind, now)
            self._next[kind] = now + self.config.interval_ms(kind) / 1000.0
            if run.ok and kind in QUIET_WHEN_IDLE and not any(run.changed.values()):
                continue
            runs.append(run)
        return runs

    def _run(self, kind: str, now: float) -> MaintenanceRun:
        t0 = time.perf_counter()
        try:
            changed, problem = self._jobs[kind](now)
        except FencedCoordinatorError:
            raise                     # deposed: the service fences itself (and logs it)
        except Exception as exc:      # noqa: BLE001 - one job's failure must not stop the rest
            name = getattr(exc, "error_name", type(exc).__name__)
            log.warning("scheduled %s failed: %s: %s", kind, name, exc,
                        exc_info=not isinstance(exc, KafkaLogError))
            return MaintenanceRun(kind, False, now, time.perf_counter() - t0,
                                  error=f"{name}: {exc}")
        run = MaintenanceRun(kind, problem is None, now, time.perf_counter() - t0, changed,
                             problem)
        if problem is not None:
            log.warning("scheduled %s: %s", kind, problem)
        else:
            log.log(logging.DEBUG if kind in QUIET_WHEN_IDLE and not any(changed.values())
                    else logging.INFO, "scheduled %s: %s", kind, changed)
        return run

    # -- the jobs: each calls the rule the CLI and jobs/ call ------------------------------

    # each takes the tick's ``now`` and returns (counts of what changed, a problem that makes
    # the run not ok, or None); an offline log dir (KIP-112) is such a problem, with what the
    # run did elsewhere counted

    def _retention(self, now: float) -> Tuple[Dict[str, int], Optional[str]]:
        try:
            plans, problem = retention(self.cluster, fan_out=self.fan_out), None
        except OfflineLogDirError as exc:
            plans, problem = exc.done, f"{exc.error_name}: {exc}"
        return {"partitions": len(plans), "segments": sum(len(p.segments) for p in plans),
                "bytes": sum(p.bytes for p in plans)}, problem

    def _cleanup(self, now: float) -> Tuple[Dict[str, int], Optional[str]]:
        try:
            removed, problem = collect_garbage(self.cluster), None
        except OfflineLogDirError as exc:
            removed, problem = exc.done, f"{exc.error_name}: {exc}"
        return {k: len(v) for k, v in removed.items()}, problem

    def _log_cleaner(self, now: float) -> Tuple[Dict[str, int], Optional[str]]:
        # Kafka's LogCleaner: its threads share the dedupe buffer and the io rate; the counts
        # are its metrics (max-dirty-percent, cleaner-recopy-percent, max-clean-time-secs,
        # max-compaction-delay-secs), as coordinator/metrics.py exports them
        threads = self.config.cleaner_threads
        settings = CleanerSettings(self.config.cleaner_dedupe_buffer_size // threads,
                                   self.config.cleaner_io_buffer_load_factor, self._throttle)
        fan_out = threaded(threads) if threads > 1 else serial
        offline: Dict[str, str] = {}
        results = compact(self.cluster, offline=offline, fan_out=fan_out, settings=settings)
        cleaned = [c for c in results if c.cleaned]
        read = sum(c.bytes_read for c in cleaned)
        changed = {
            "partitions": len(cleaned), "segments": sum(len(c.cleaned) for c in cleaned),
            "bytes_read": read, "bytes_written": sum(c.bytes_written for c in cleaned),
            "max_dirty_percent": int(100 * max((c.dirty_ratio for c in results), default=0)),
            "recopy_percent": (int(100 * sum(c.bytes_written for c in cleaned) / read)
                               if read else 0),
            "max_clean_time_ms": int(1000 * max((c.elapsed_s for c in cleaned), default=0)),
            "max_compaction_delay_ms": max((c.compaction_delay_ms for c in results),
                                           default=0)}
        if not offline:
            return changed, None
        exc = offline_error("log cleaner", offline, [], None)
        return changed, f"{exc.error_name}: {exc}"

    def _checkpoints(self, now: float) -> Tuple[Dict[str, int], Optional[str]]:
        # what cleanup ends with: every partition's files from the metadata state (protocol §8)
        state = self.cluster.state()
        tps = self.cluster.partitions(state)
        offline = sync_checkpoints(self.cluster, state, tps, log_dir_files=True,
                                   skip_offline=True)
        if not offline:
            return {"partitions": len(tps)}, None
        exc = offline_error("checkpoints", offline, [], None)
        return {"partitions": len(tps)}, f"{exc.error_name}: {exc}"

    def _flush(self, now: float) -> Tuple[Dict[str, int], Optional[str]]:
        # topics' flush.ms (protocol §3, "Durability"): this process's own cadence
        flushed, offline = flush_logs(self.cluster, self.cluster.state(),
                                      int(now * 1000), self._flushed)
        if not offline:
            return {"log_dirs": len(flushed)}, None
        exc = offline_error("flush", offline, [], None)
        return {"log_dirs": len(flushed)}, f"{exc.error_name}: {exc}"

    def _delete_after_consumption(self, now: float) -> Tuple[Dict[str, int], Optional[str]]:
        offsets, ids = {}, {}
        for topic, groups in self.config.delete_after_consumption.items():
            o, i = consumed_offsets(self.cluster, groups, [topic])
            offsets.update(o)
            ids.update(i)
        state = self.cluster.state()
        # only partitions where it moves something: a request at the log start offset would
        # still append a metadata entry every interval
        before = {}
        for tp, offset in offsets.items():
            ps = state.partition(*tp)
            if ps is not None and offset > ps.log_start_offset:
                before[tp] = ps.log_start_offset
        if not before:
            return {"partitions": 0, "errors": 0, "offsets": 0}, None
        results = delete_records(self.cluster, {tp: offsets[tp] for tp in before},
                                 topic_ids=ids, fan_out=self.fan_out)
        done = {tp: r for tp, r in results.items() if r.error is None}
        failed = {tp: r.error for tp, r in results.items() if r.error is not None}
        # a refused partition (e.g. TOPIC_AUTHORIZATION_FAILED for this process's principal)
        # makes the run not ok, so that the metrics show it; the others are deleted all the same
        changed = {"partitions": len(done), "errors": len(failed),
                   "offsets": sum(max(0, r.low_watermark - before[tp]) for tp, r in done.items())}
        problem = "; ".join(f"{t}-{p}: {e.error_name}: {e}" for (t, p), e in sorted(failed.items()))
        return changed, problem or None
