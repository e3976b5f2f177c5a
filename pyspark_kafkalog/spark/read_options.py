"""Options of ``spark.read.format("kafkalog")`` (and ``readStream``: ``parse(streaming=True)``):
Spark's Kafka source names and meanings.

Every option Spark's Kafka source documents (structured-streaming-kafka-integration) is either
supported with the same meaning, accepted as a documented no-op, or rejected with a reason.
Anything else is ignored with a warning naming the option and, for a likely typo, the option it
probably meant, as Spark's Kafka source ignores options it does not know. Each option is declared
once, in ``READ_OPTIONS`` below (type, default, validator, doc); docs/user-guide.md and
docs/streaming.md show it, checked by tests/spark/test_option_tables.py.
Option names are case-insensitive, as in Spark. Errors are :class:`InvalidConfigError` and name
the option and its value.

``kafkalog.test.statsFile`` is a hidden, test-only option: each range read appends a JSON line with
the bytes it read (``ReadStats``) to that local file, so tests can assert on bytes, not time.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Dict, Mapping, Optional, Tuple

from ..connector.read_plan import EARLIEST, LATEST, OffsetLimit, Subscription
from ..config_def import (BOOLEAN, INT, LONG, NO_DEFAULT, STRING, at_least, one_of,
                          parse_integer)
from ..errors import InvalidConfigError
from .option_table import (NO_OP, REJECTED, STREAMING, OptionTable, lower_text, raw_text)

STORAGE_PREFIX = "storage."
ISOLATION_LEVELS = ("read_uncommitted", "read_committed")


def _err(option: str, value, why: str) -> InvalidConfigError:
    return InvalidConfigError(f"option {option}={value!r}: {why}")


def _duration_ms(option: str, value: str) -> int:
    """Spark's time strings (``15m``, ``30s``, ``500ms``, ``1h``, ``2 days``) or plain ms."""
    m = re.fullmatch(r"\s*(\d+)\s*(ms|milliseconds?|s|sec|seconds?|m|min|minutes?|h|hours?|"
                     r"d|days?)?\s*", str(value).lower())
    if not m:
        raise _err(option, value, "expected a duration such as 15m, 30s or 500ms")
    unit = (m.group(2) or "ms")
    scale = (1 if unit.startswith("ms") or unit.startswith("milli") else
             1000 if unit.startswith("s") else 60_000 if unit.startswith("m") else
             3_600_000 if unit.startswith("h") else 86_400_000)
    return int(m.group(1)) * scale


_BYTE_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "m": 1 << 20, "mb": 1 << 20,
               "g": 1 << 30, "gb": 1 << 30, "t": 1 << 40, "tb": 1 << 40}


def _byte_size(option: str, value: str, allow_zero: bool = False) -> int:
    """A size as Spark's byte configs take it: ``134217728``, ``128m``, ``128MB`` (binary)."""
    m = re.fullmatch(r"\s*(\d+)\s*([a-zA-Z]*)\s*", str(value))
    unit = m and _BYTE_UNITS.get(m.group(2).lower())
    if not unit:
        raise _err(option, value, "expected a size in bytes, e.g. 134217728 or 128MB")
    n = int(m.group(1)) * unit
    if n <= 0 and not allow_zero:
        raise _err(option, value, "must be positive")
    return n


def _size(option: str, value) -> int:
    return _byte_size(option, value)


def _size_or_zero(option: str, value) -> int:
    return _byte_size(option, value, allow_zero=True)


def _rejected(reason: str):
    """A validator that refuses every value, with the reason."""
    def refuse(name, value, raw):
        raise InvalidConfigError(f"option {name}={raw!r}: {reason}")
    return refuse


#: The read options, each declared once: Spark's Kafka source names and meanings (module doc).
#: ``kind``: supported; streaming (only readStream acts on it: spark/stream_reader.py; batch
#: reads ignore it, as Spark's batch source ignores the trigger options); no-op; rejected.
READ_OPTIONS = OptionTable(
    "read option", "format('kafkalog') reads", "pyspark_kafkalog/spark/read_options.py",
    lambda name, raw, rule: _err(name, raw, f"must be {rule}"))
_d = READ_OPTIONS.define
_d("path", STRING, NO_DEFAULT, "a kafkalog cluster root or a Kafka log dir (load(path))")
_d("assign", STRING, None, 'JSON {"topicA":[0,1]}; a partition that does not exist is an error')
_d("subscribe", STRING, None, "comma-separated topics; a missing topic reads as empty")
_d("subscribePattern", STRING, None,
   "a regex matching whole topic names; Kafka's internal topics are left out")
_d("startingOffsets", STRING, "earliest",
   'earliest, latest (streams only) or JSON {"t":{"0":23,"1":-2}}; a stream\'s default is latest')
_d("endingOffsets", STRING, "latest",
   'latest or JSON {"t":{"0":42,"1":-1}} (batch only)')
_d("startingOffsetsByTimestamp", STRING, None,
   'JSON {"t":{"0":1700000000000}} (ms), through the .timeindex; over startingOffsets')
_d("startingTimestamp", STRING, None, "one timestamp (ms) for every partition; over both above")
_d("endingOffsetsByTimestamp", STRING, None, "as startingOffsetsByTimestamp (batch only)")
_d("endingTimestamp", STRING, None, "as startingTimestamp (batch only)")
_d("startingOffsetsByTimestampStrategy", STRING, "error",
   "error fails when no offset matches a starting timestamp, latest starts at latest",
   validator=one_of("error", "latest"), parser=lower_text, attr="starting_strategy")
_d("failOnDataLoss", BOOLEAN, True, "fail on offsets deleted or past the high watermark",
   attr="fail_on_data_loss")
_d("minPartitions", INT, None, "split offset ranges into at least this many tasks",
   validator=at_least(1), attr="min_partitions")
_d("maxRecordsPerPartition", LONG, None, "at most this many offsets per task",
   validator=at_least(1), attr="max_records_per_partition")
_d("maxPartitionBytes", STRING, "128MB",
   "log bytes one task packs ranges into; the session's spark.sql.files.maxPartitionBytes "
   "where set", parser=_size, attr="max_partition_bytes")
_d("openCostInBytes", STRING, "64KB",
   "what each packed range costs on top of its bytes; the session's "
   "spark.sql.files.openCostInBytes where set", parser=_size_or_zero, attr="open_cost_in_bytes")
_d("includeHeaders", BOOLEAN, False, "adds the headers column", attr="include_headers")
_d("kafka.isolation.level", STRING, "read_uncommitted",
   "read_committed drops aborted Kafka transactions and stops at the last stable offset",
   validator=one_of(*ISOLATION_LEVELS), parser=lower_text, attr="isolation_level")
_d("readToLogEnd", BOOLEAN, False,
   "read a Kafka log dir to its log end offset, not its checkpointed high watermark",
   attr="read_to_log_end")
_d("kafka.client.id", STRING, None,
   "whose fetch quota (KIP-13) the tasks count against; default the empty client id",
   parser=raw_text, attr="client_id")
_d("coordinator.tokenFile", STRING, None,
   "the coordinator's token file for the tasks (else $KAFKALOG_COORDINATOR_TOKEN)",
   attr="coordinator_token_file")
_d("kafkalog.test.statsFile", STRING, None,
   "test only: each range read appends a JSON line of its bytes to this local file",
   attr="stats_file", hidden=True)
_d("storage.<name>", STRING, None, "a storage backend option (e.g. storage.endpoint_url)",
   prefix=STORAGE_PREFIX, parser=raw_text)
# streaming only
_d("kafka.group.id", STRING, None, "a stream commits each batch's end offsets to this group",
   kind=STREAMING, parser=raw_text, attr="group_id")
_d("groupIdPrefix", STRING, None, "a stream commits to the group <prefix>-<uuid>",
   kind=STREAMING, parser=raw_text, attr="group_id_prefix")
_d("maxOffsetsPerTrigger", LONG, None, "at most this many offsets per micro-batch",
   kind=STREAMING, validator=at_least(1), attr="max_offsets_per_trigger")
_d("minOffsetsPerTrigger", LONG, None,
   "wait for this many new offsets, at most maxTriggerDelay", kind=STREAMING,
   validator=at_least(1), attr="min_offsets_per_trigger")
_d("maxTriggerDelay", STRING, "15m", "how long minOffsetsPerTrigger waits at most",
   kind=STREAMING, parser=lambda name, raw: _duration_ms(name, raw),
   attr="max_trigger_delay_ms")
_d("maxBytesPerTrigger", STRING, None, "kafkalog only: a byte budget per micro-batch",
   kind=STREAMING, parser=_size, attr="max_bytes_per_trigger")
_d("fastCatchUp", BOOLEAN, False, "KIP-333 fast catch-up of a stream that fell behind",
   kind=STREAMING, attr="fast_catch_up")
_d("enable.parallel.rebalance", BOOLEAN, False, "an alias of fastCatchUp", kind=STREAMING,
   attr="fast_catch_up")
_d("fastCatchUpThreshold", LONG, 100_000, "the backlog (offsets) that starts a catch-up",
   kind=STREAMING, validator=at_least(1), attr="fast_catch_up_threshold")
_d("fastCatchUpRecordsPerTrigger", LONG, 100_000, "records per micro-batch while catching up",
   kind=STREAMING, validator=at_least(1), attr="fast_catch_up_records_per_trigger")
# accepted and ignored
_d("kafka.<consumer config>", STRING, None,
   "a Kafka consumer config: client tuning of a broker connection that does not exist",
   kind=NO_OP, prefix="kafka.")
for _name, _doc in (("fetchOffset.numRetries", "no broker request to retry"),
                    ("fetchOffset.retryIntervalMs", "no broker request to retry"),
                    ("kafkaConsumer.pollTimeoutMs", "no consumer to poll")):
    _d(_name, STRING, None, f"no-op: {_doc}", kind=NO_OP)
for _name, _reason in (
        ("kafka.bootstrap.servers",
         "kafkalog reads Kafka's log files from storage, there are no brokers to connect to: "
         "remove it and name the data with load(path) or option('path', ...)"),
        ("kafka.auto.offset.reset", "not supported (as in Spark's Kafka source): set "
                                    "startingOffsets to 'earliest' or a JSON of offsets instead"),
        ("kafka.key.deserializer", "not supported (as in Spark's Kafka source): keys are binary; "
                                   "deserialize them with DataFrame operations"),
        ("kafka.value.deserializer", "not supported (as in Spark's Kafka source): values are "
                                     "binary; deserialize them with DataFrame operations"),
        ("kafka.enable.auto.commit", "not supported (as in Spark's Kafka source): batch reads "
                                     "commit no offsets"),
        ("kafka.interceptor.classes", "not supported (as in Spark's Kafka source): there is no "
                                      "consumer to intercept"),
        ("topic", "a write option; to read, name topics with subscribe, subscribePattern or "
                  "assign"),
        ("paths", "format('kafkalog') reads one cluster root or log dir: load(path) with one "
                  "path")):
    _d(_name, STRING, None, _reason, kind=REJECTED, validator=_rejected(_reason))
del _d

#: defaults that differ in a stream (docs/streaming.md)
STREAMING_DEFAULTS = {"startingOffsets": "latest"}

# Kafka consumer configs (ConsumerConfig and CommonClientConfigs): accepted under kafka.* and
# ignored, since they tune a broker connection that does not exist here.
_CONSUMER_CONFIGS = frozenset("""
allow.auto.create.topics auto.commit.interval.ms auto.include.jmx.reporter check.crcs
client.dns.lookup client.id client.rack connections.max.idle.ms default.api.timeout.ms enable.metrics.push
exclude.internal.topics fetch.max.bytes fetch.max.wait.ms fetch.min.bytes group.instance.id
group.protocol group.remote.assignor heartbeat.interval.ms internal.leave.group.on.close
max.partition.fetch.bytes max.poll.interval.ms max.poll.records metadata.max.age.ms
metadata.recovery.strategy metric.reporters metrics.num.samples metrics.recording.level
metrics.sample.window.ms partition.assignment.strategy receive.buffer.bytes
reconnect.backoff.max.ms reconnect.backoff.ms request.timeout.ms retry.backoff.max.ms
retry.backoff.ms security.protocol security.providers send.buffer.bytes session.timeout.ms
socket.connection.setup.timeout.max.ms socket.connection.setup.timeout.ms
""".split())
_CONSUMER_PREFIXES = ("ssl.", "sasl.")

_JSON_OFFSETS_EXAMPLE = '{"topicA":{"0":23,"1":-1},"topicB":{"0":-2}}'
_JSON_TIMESTAMPS_EXAMPLE = '{"topicA":{"0":1700000000000,"1":1700000000000}}'
_JSON_ASSIGN_EXAMPLE = '{"topicA":[0,1],"topicB":[2,4]}'


def _timestamp(option: str, value) -> int:
    try:
        ts = int(str(value).strip())
    except ValueError:
        raise _err(option, value, "expected a timestamp in milliseconds since the epoch") from None
    if ts < 0:
        raise _err(option, value, "a timestamp must be >= 0 (milliseconds since the epoch)")
    return ts


def _json_object(option: str, value: str, example: str):
    try:
        parsed = json.loads(value)
    except (TypeError, ValueError):
        parsed = None
    if not isinstance(parsed, dict):
        raise _err(option, value, f"expected JSON like {example}")
    return parsed


def _partition_key(option: str, value: str, key, example: str) -> int:
    text = str(key)
    if not re.fullmatch(r"\d+", text):
        raise _err(option, value, f"partition {key!r} is not a partition number; expected JSON "
                                  f"like {example}")
    return int(text)


def _per_partition(option: str, value: str,
                   example: str) -> Tuple[Tuple[Tuple[str, int], int], ...]:
    """``{"topic": {"0": n, ...}, ...}`` -> sorted ((topic, partition), n) pairs."""
    parsed = _json_object(option, value, example)
    out = {}
    for topic, parts in parsed.items():
        if not isinstance(parts, dict) or not parts:
            raise _err(option, value, f"expected JSON like {example}")
        for key, n in parts.items():
            if isinstance(n, bool) or not isinstance(n, int):
                raise _err(option, value, f"{topic}-{key}: {n!r} is not an integer; expected "
                                          f"JSON like {example}")
            out[(topic, _partition_key(option, value, key, example))] = n
    if not out:
        raise _err(option, value, f"names no partition; expected JSON like {example}")
    return tuple(sorted(out.items()))


def _subscription(opts: Dict[str, str]) -> Subscription:
    given = [k for k in ("assign", "subscribe", "subscribepattern") if k in opts]
    names = ", ".join(READ_OPTIONS.lookup(k).name for k in given)
    if len(given) != 1:
        raise InvalidConfigError(
            f"exactly one of the options assign, subscribe, subscribePattern must be given "
            f"(got {names or 'none'})")
    key = given[0]
    value = opts[key]
    if key == "assign":
        parsed = _json_object("assign", value, _JSON_ASSIGN_EXAMPLE)
        tps = []
        for topic, parts in parsed.items():
            if not isinstance(parts, list) or any(
                    isinstance(p, bool) or not isinstance(p, int) or p < 0 for p in parts):
                raise _err("assign", value, f"expected JSON like {_JSON_ASSIGN_EXAMPLE}")
            tps += [(topic, p) for p in parts]
        if not tps:
            raise _err("assign", value, "no topic partitions to assign")
        return Subscription("assign", value, assign=tuple(sorted(set(tps))))
    if key == "subscribe":
        topics = tuple(t.strip() for t in str(value).split(",") if t.strip())
        if not topics:
            raise _err("subscribe", value, "no topics to subscribe to")
        return Subscription("subscribe", value, topics=topics)
    pattern = str(value).strip()
    if not pattern:
        raise _err("subscribePattern", value, "the pattern to subscribe is empty")
    try:
        re.compile(pattern)
    except re.error as exc:
        raise _err("subscribePattern", value, f"not a valid regular expression ({exc})") from None
    return Subscription("subscribePattern", value, pattern=pattern)


def _limit(opts: Dict[str, str], starting: bool, streaming: bool = False) -> OffsetLimit:
    """Spark's precedence: *Timestamp, then *OffsetsByTimestamp, then *Offsets."""
    side = "starting" if starting else "ending"
    if streaming and not starting:
        for key in ("endingTimestamp", "endingOffsetsByTimestamp", "endingOffsets"):
            if key.lower() in opts:
                raise _err(key, opts[key.lower()], "ending offsets are not valid in streaming "
                                                   "queries (as in Spark): a stream has no end")
        return OffsetLimit("endingOffsets", "latest", "latest")
    ts_key, by_ts_key, off_key = (f"{side}Timestamp", f"{side}OffsetsByTimestamp",
                                  f"{side}Offsets")
    if ts_key.lower() in opts:
        value = opts[ts_key.lower()]
        return OffsetLimit(ts_key, value, "timestamp", timestamp=_timestamp(ts_key, value))
    if by_ts_key.lower() in opts:
        value = opts[by_ts_key.lower()]
        pairs = _per_partition(by_ts_key, value, _JSON_TIMESTAMPS_EXAMPLE)
        for (topic, p), ts in pairs:
            if ts < 0:
                raise _err(by_ts_key, value, f"{topic}-{p}: a timestamp must be >= 0 "
                                             "(milliseconds since the epoch)")
        return OffsetLimit(by_ts_key, value, "timestamps", per_partition=pairs)
    default = (STREAMING_DEFAULTS.get(off_key) if streaming else None) or \
        READ_OPTIONS[off_key].default
    value = opts.get(off_key.lower(), default)
    text = str(value).strip().lower()
    if text in ("earliest", "latest"):
        if starting and text == "latest" and not streaming:
            raise _err(off_key, value, "starting offset can't be latest for batch queries")
        if not starting and text == "earliest":
            raise _err(off_key, value, "ending offset can't be earliest for batch queries")
        return OffsetLimit(off_key, value, text)
    if not str(value).strip().startswith("{"):
        raise _err(off_key, value, f"expected earliest, latest or JSON like "
                                   f"{_JSON_OFFSETS_EXAMPLE}")
    pairs = _per_partition(off_key, value, _JSON_OFFSETS_EXAMPLE)
    for (topic, p), offset in pairs:
        if starting and offset == LATEST and not streaming:
            raise _err(off_key, value, f"{topic}-{p}: starting offset can't be latest (-1) for "
                                       "batch queries")
        if not starting and offset == EARLIEST:
            raise _err(off_key, value, f"{topic}-{p}: ending offset can't be earliest (-2) for "
                                       "batch queries")
        if offset < EARLIEST:
            raise _err(off_key, value, f"{topic}-{p}: invalid offset {offset} (use an offset "
                                       ">= 0, -2 for earliest or -1 for latest)")
    return OffsetLimit(off_key, value, "offsets", per_partition=pairs)


def client_options(opts: Mapping[str, str]) -> Tuple[Optional[str], Optional[str]]:
    """``kafka.client.id`` (KIP-13: whose quota applies) and ``coordinator.tokenFile`` (how the
    tasks authenticate to the coordinator that enforces it), from lower-cased options; the
    write options share them."""
    from ..cluster.quotas import MAX_CLIENT_ID
    client_id = opts.get("kafka.client.id")
    if client_id is not None and len(client_id) > MAX_CLIENT_ID:
        raise _err("kafka.client.id", client_id, f"a client id has at most {MAX_CLIENT_ID} "
                   "characters")
    token_file = opts.get("coordinator.tokenfile", "").strip() or None
    return client_id, token_file


def _check_names(opts: Dict[str, str]) -> Dict[str, str]:
    """Refuse the rejected options (with their reason) and ``kafka.<name>`` where the name is
    no Kafka consumer config; the unknown options, which the caller warns about."""
    unknown = {}
    for key, value in opts.items():
        row = READ_OPTIONS.lookup(key)
        if row is None:
            unknown[key] = value
        elif READ_OPTIONS.kind(row.name) == REJECTED:
            READ_OPTIONS.parse(row.name, value)          # raises the reason
        elif row.name == "kafka.<consumer config>":
            name = key[len("kafka."):]
            if not (name in _CONSUMER_CONFIGS or name.startswith(_CONSUMER_PREFIXES)):
                raise InvalidConfigError(
                    f"option {key}={value!r}: {name!r} is not a Kafka consumer config (kafka.* "
                    "options are Kafka consumer configs; only kafka.isolation.level has an "
                    "effect)")
    return unknown


_default = READ_OPTIONS.default


@dataclass
class ReadOptions:
    """Parsed read options; the fields ``connector.read_plan.plan`` uses are named as it says."""

    path: Optional[str] = None
    subscription: Optional[Subscription] = None
    starting: OffsetLimit = field(default_factory=lambda: OffsetLimit(
        "startingOffsets", "earliest", "earliest"))
    ending: OffsetLimit = field(default_factory=lambda: OffsetLimit(
        "endingOffsets", "latest", "latest"))
    # the defaults of options are the table's (READ_OPTIONS)
    starting_strategy: str = _default("startingOffsetsByTimestampStrategy")
    fail_on_data_loss: bool = _default("failOnDataLoss")
    min_partitions: Optional[int] = _default("minPartitions")
    max_records_per_partition: Optional[int] = _default("maxRecordsPerPartition")
    max_partition_bytes: int = _default("maxPartitionBytes")
    open_cost_in_bytes: int = _default("openCostInBytes")
    #: Spark's ``minPartitionNum`` of file sources (``spark.sql.files.minPartitionNum``, else
    #: the default parallelism), from the session when ``register`` ran; not an option
    min_partition_num: Optional[int] = None
    include_headers: bool = _default("includeHeaders")
    isolation_level: str = _default("kafka.isolation.level")
    read_to_log_end: bool = _default("readToLogEnd")
    storage_options: Dict[str, str] = field(default_factory=dict)
    stats_file: Optional[str] = None
    #: KIP-13: whose fetch quota the tasks count against (None: the empty client id)
    client_id: Optional[str] = None
    coordinator_token_file: Optional[str] = None
    # streaming only (spark/stream_reader.py)
    streaming: bool = False
    max_offsets_per_trigger: Optional[int] = _default("maxOffsetsPerTrigger")
    min_offsets_per_trigger: Optional[int] = _default("minOffsetsPerTrigger")
    max_trigger_delay_ms: int = _default("maxTriggerDelay")
    max_bytes_per_trigger: Optional[int] = _default("maxBytesPerTrigger")
    group_id: Optional[str] = None
    group_id_prefix: Optional[str] = None
    fast_catch_up: bool = _default("fastCatchUp")
    fast_catch_up_threshold: int = _default("fastCatchUpThreshold")
    fast_catch_up_records_per_trigger: int = _default("fastCatchUpRecordsPerTrigger")

    @property
    def read_committed(self) -> bool:
        return self.isolation_level == "read_committed"

    @classmethod
    def parse(cls, options: Mapping[str, str], validate: bool = True,
              session: Optional[Mapping[str, str]] = None,
              streaming: bool = False) -> "ReadOptions":
        """Parse Spark's option map (keys case-insensitive). ``validate=False`` (used for the
        schema) parses only ``includeHeaders`` and never fails on the other options.
        ``session`` holds :func:`session_defaults` (what the planner cannot read itself)."""
        opts = {str(k).lower(): ("" if v is None else str(v)) for k, v in dict(options).items()}
        out = cls()
        session = dict(session or {})
        try:
            if session.get("maxPartitionBytes"):
                out.max_partition_bytes = _byte_size("spark.sql.files.maxPartitionBytes",
                                                     session["maxPartitionBytes"])
            if session.get("openCostInBytes"):
                out.open_cost_in_bytes = _byte_size("spark.sql.files.openCostInBytes",
                                                    session["openCostInBytes"], allow_zero=True)
            if session.get("minPartitionNum"):
                out.min_partition_num = parse_integer("spark.sql.files.minPartitionNum",
                                                      session["minPartitionNum"], 1)
        except InvalidConfigError:   # a session value we cannot read: Spark's defaults
            pass
        out.include_headers = READ_OPTIONS.get(opts, "includeHeaders")
        if not validate:
            return out
        unknown = _check_names(opts)
        path = opts.get("path", "").strip()
        if not path:
            raise InvalidConfigError(
                "format('kafkalog') needs a path: load(path) or option('path', ...), naming a "
                "kafkalog cluster root or a Kafka log dir")
        out.path = path
        out.subscription = _subscription(opts)
        out.streaming = streaming
        out.starting = _limit(opts, True, streaming)
        out.ending = _limit(opts, False, streaming)
        for name in ("startingOffsetsByTimestampStrategy", "failOnDataLoss", "minPartitions",
                     "maxRecordsPerPartition", "maxPartitionBytes", "openCostInBytes",
                     "kafka.isolation.level", "readToLogEnd"):
            if name.lower() in opts:      # else the default, or the session's (above)
                setattr(out, READ_OPTIONS[name].attr, READ_OPTIONS.parse(name, opts[name.lower()]))
        out.storage_options = {k[len(STORAGE_PREFIX):]: v for k, v in opts.items()
                               if k.startswith(STORAGE_PREFIX)}
        out.stats_file = opts.get("kafkalog.test.statsfile") or None
        out.client_id, out.coordinator_token_file = client_options(opts)
        if streaming:
            _streaming_options(out, opts)
        READ_OPTIONS.warn_unknown(unknown)
        return out


def _streaming_options(out: "ReadOptions", opts: Dict[str, str]) -> None:
    for name in ("maxOffsetsPerTrigger", "minOffsetsPerTrigger", "maxTriggerDelay",
                 "maxBytesPerTrigger", "groupIdPrefix", "fastCatchUpThreshold",
                 "fastCatchUpRecordsPerTrigger"):
        if name.lower() in opts:
            setattr(out, READ_OPTIONS[name].attr, READ_OPTIONS.parse(name, opts[name.lower()]))
    if (out.max_offsets_per_trigger is not None and out.min_offsets_per_trigger is not None
            and out.min_offsets_per_trigger > out.max_offsets_per_trigger):
        raise _err("minOffsetsPerTrigger", opts["minoffsetspertrigger"],
                   f"must not be above maxOffsetsPerTrigger ({out.max_offsets_per_trigger})")
    if "kafka.group.id" in opts:
        from ..client.groups import validate_group_id
        out.group_id = validate_group_id(opts["kafka.group.id"])
    for name in ("fastCatchUp", "enable.parallel.rebalance"):     # one is enough
        if name.lower() in opts:
            out.fast_catch_up = READ_OPTIONS.parse(name, opts[name.lower()]) or out.fast_catch_up


def session_defaults(spark) -> Dict[str, str]:
    """The session settings packing follows, read on the driver when ``register`` runs: a
    Python data source's planner runs in a worker that cannot see the session's conf. Anything
    unreadable (Spark Connect has no SparkContext) is left to Spark's defaults."""
    out: Dict[str, str] = {}
    for key, conf in (("maxPartitionBytes", "spark.sql.files.maxPartitionBytes"),
                      ("openCostInBytes", "spark.sql.files.openCostInBytes"),
                      ("minPartitionNum", "spark.sql.files.minPartitionNum")):
        try:
            value = spark.conf.get(conf, None)
        except Exception:
            value = None
        if value:
            out[key] = str(value)
    if "minPartitionNum" not in out:
        try:   # Spark's leafNodeDefaultParallelism
            out["minPartitionNum"] = str(spark.conf.get("spark.sql.leafNodeDefaultParallelism",
                                                        None)
                                         or spark.sparkContext.defaultParallelism)
        except Exception:
            pass
    return out
