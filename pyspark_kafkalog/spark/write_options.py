"""Options of ``df.write.format("kafkalog")``.

Spark's Kafka sink takes ``topic`` and ``kafka.*`` producer settings. There is no producer here:
the sink encodes record batches itself and commits them through the cluster protocol
(docs/protocol.md), so the settings a Kafka producer or broker would apply are options of their
own, under Kafka's names where the meaning is the same. Keys are case-insensitive.

Read-only options (``subscribe``, ``startingOffsets``, …) are errors; unknown options are ignored
with a warning naming the closest known one, as Spark's Kafka sink ignores them. Each option is
declared once, in ``WRITE_OPTIONS`` below; docs/spark-write.md shows it, checked by
tests/spark/test_option_tables.py. The streaming sink (``df.writeStream``) takes the
same options, and Spark's own ``checkpointLocation``, which Spark passes on to the sink.

``transaction.timeout.ms``: every task reserves its offsets when it has encoded its rows, and the
driver commits all of them in one entry at the end of the job. A reservation past its deadline
can no longer be committed (the protocol's commit rule), so the deadline must cover the time from
the first task finishing to the job's commit. The price of a long timeout: if the driver dies,
the job's reservations hold back the high watermark of the partitions it wrote (readers see
nothing newer there) until they expire. Kafka's own default (60 s) suits a producer that commits
right away, not a Spark job.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Mapping, Optional

from ..config_def import BOOLEAN, INT, LONG, NO_DEFAULT, STRING, at_least
from ..errors import InvalidConfigError
from ..format import codecs
from ..format.checkpoint import validate_topic_name
from ..client.acks import parse_acks
from .option_table import NO_OP, REJECTED, OptionTable, raw_text
from .read_options import client_options
from ..log.config import LogConfig, magic_for_format_version

DEFAULT_BATCH_SIZE = 512 * 1024
DEFAULT_BATCH_RECORDS = 10_000
DEFAULT_BUFFER_MEMORY = 128 * 1024 * 1024
DEFAULT_TXN_TIMEOUT_MS = 15 * 60 * 1000

TOPIC_CONFIG_PREFIX = "topic.config."
STORAGE_PREFIX = "storage."

_LEVELS = {codecs.GZIP: "gzip", codecs.LZ4: "lz4", codecs.ZSTD: "zstd"}

# options of Spark's DataStreamWriter that Spark also hands the sink
_STREAM_SPARK = ("checkpointlocation",)

# Spark Kafka source options that mean nothing to a write
_READ_ONLY = ("assign", "subscribe", "subscribepattern", "startingoffsets", "endingoffsets",
              "startingoffsetsbytimestamp", "startingtimestamp", "endingoffsetsbytimestamp",
              "endingtimestamp", "startingoffsetsbytimestampstrategy", "failondataloss",
              "minpartitions", "maxrecordsperpartition", "includeheaders", "maxoffsetspertrigger",
              "minoffsetspertrigger", "maxtriggerdelay", "groupidprefix", "fetchoffset.numretries",
              "fetchoffset.retryintervalms", "kafkaconsumer.polltimeoutms", "readtolatest",
              "logdir.readtologend")

# kafka.* producer settings that would change what is written: an error naming ours
_KAFKA_REJECTED = {
    "bootstrap.servers": "there are no brokers: the path names the cluster root "
                         "(save(path) or option('path', ...))",
    "compression.type": "use the option compression.type",
    "compression.gzip.level": "use the option compression.gzip.level",
    "compression.lz4.level": "use the option compression.lz4.level",
    "compression.zstd.level": "use the option compression.zstd.level",
    "batch.size": "use the options batch.size (bytes) and batch.records",
    "max.request.size": "use the option batch.size; batches are bounded by the topic's "
                        "max.message.bytes",
    "buffer.memory": "use the option buffer.memory",
    "transaction.timeout.ms": "use the option transaction.timeout.ms",
    "transactional.id": "every job is committed atomically already; there is no transaction id",
    "partitioner.class": "keyed rows use Kafka's default partitioner; set a partition column "
                         "to place rows yourself",
    "partitioner.ignore.keys": "set a partition column to place rows yourself",
    "key.serializer": "not supported (as in Spark's Kafka sink): key is a string or binary "
                      "column",
    "value.serializer": "not supported (as in Spark's Kafka sink): value is a string or binary "
                        "column",
    "interceptor.classes": "not supported (as in Spark's Kafka sink)",
}
# Kafka producer configs (ProducerConfig, CommonClientConfigs) that tune delivery to a broker:
# accepted under kafka.* and ignored (a job's commit is durable and exactly-once by itself)
_KAFKA_NO_OPS = frozenset("""
auto.include.jmx.reporter client.dns.lookup client.id connections.max.idle.ms
enable.idempotence enable.metrics.push linger.ms max.block.ms
max.in.flight.requests.per.connection metadata.max.age.ms metadata.max.idle.ms
metadata.recovery.strategy metric.reporters metrics.num.samples metrics.recording.level
metrics.sample.window.ms partitioner.adaptive.partitioning.enable
partitioner.availability.timeout.ms receive.buffer.bytes reconnect.backoff.max.ms
reconnect.backoff.ms retries retry.backoff.max.ms
security.protocol security.providers send.buffer.bytes socket.connection.setup.timeout.max.ms
socket.connection.setup.timeout.ms
""".split())
_KAFKA_NO_OP_PREFIXES = ("ssl.", "sasl.")


def _err(name: str, raw, rule: str) -> InvalidConfigError:
    return InvalidConfigError(f"option {name} must be {rule}, got {raw!r}")


def _rejected(reason: str):
    def refuse(name, value, raw):
        raise InvalidConfigError(f"option {name}={raw!r}: {reason}")
    return refuse


def _codec(name: str, raw) -> int:
    return codecs.codec_id(raw)


def _magic(name: str, raw) -> int:
    return magic_for_format_version(raw)


#: The write options, each declared once (module doc): name as the user writes it (any case),
#: type, default, validator, one-line doc. ``acks`` and the timeouts also go by their
#: ``kafka.`` names (Kafka's producer configs); the plain name wins.
WRITE_OPTIONS = OptionTable(
    "write option", "df.write.format('kafkalog')", "pyspark_kafkalog/spark/write_options.py",
    _err)
_d = WRITE_OPTIONS.define
_d("path", STRING, NO_DEFAULT, "the kafkalog cluster root (save(path)); a Kafka log dir is "
                               "read-only", parser=raw_text)
_d("topic", STRING, None, "topic of every row, over the topic column", parser=raw_text)
_d("compression.type", STRING, None,
   "none, gzip, snappy, lz4, zstd; default the topic's compression.type", parser=_codec,
   attr="compression")
for _codec_name in ("gzip", "lz4", "zstd"):
    _d(f"compression.{_codec_name}.level", INT, None, f"KIP-390 level of {_codec_name}")
_d("message.format.version", STRING, None,
   "0, 1, 2 or a Kafka version (0.10.2, 3.0); default the topic's", parser=_magic,
   attr="magic")
_d("batch.size", INT, DEFAULT_BATCH_SIZE, "max bytes of records (before compression) per batch",
   validator=at_least(1))
_d("batch.records", INT, DEFAULT_BATCH_RECORDS, "max records per record batch",
   validator=at_least(1))
_d("buffer.memory", LONG, DEFAULT_BUFFER_MEMORY,
   "encoded bytes a task holds before it reserves and writes them", validator=at_least(1))
_d("createTopic", BOOLEAN, False, "create the topic option's topic (and the cluster root) "
                                  "when absent", attr="create_topic")
_d("topic.partitions", INT, 1, "partitions of a created topic", validator=at_least(1))
_d("topic.replication.factor", INT, 1, "log dirs holding each partition of a created topic",
   validator=at_least(1))
_d("topic.config.<name>", STRING, None, "a Kafka topic config of a created topic",
   prefix=TOPIC_CONFIG_PREFIX, parser=raw_text, attr="topic_configs")
_d("transaction.timeout.ms", INT, DEFAULT_TXN_TIMEOUT_MS,
   "how long a task's reserved offsets may stay uncommitted", validator=at_least(1))
_d("acks", STRING, "all", "all (-1): the commit waits for the ISR; 1: the leader only",
   parser=lambda name, raw: parse_acks(raw))
_d("kafka.acks", STRING, "all", "as acks", parser=lambda name, raw: parse_acks(raw),
   attr="acks")
for _prefix in ("", "kafka."):
    _d(f"{_prefix}request.timeout.ms", INT, 30_000,
       "how long the job's commit waits for the ISR (acks=all)", validator=at_least(1),
       attr="request_timeout_ms")
    _d(f"{_prefix}delivery.timeout.ms", INT, 120_000,
       "how long a task writes again after a retriable error; 0: fail at once",
       validator=at_least(0), attr="delivery_timeout_ms")
    _d(f"{_prefix}retry.backoff.ms", INT, 100, "the pause between a task's attempts",
       validator=at_least(0), attr="retry_backoff_ms")
_d("kafka.client.id", STRING, None,
   "whose produce quota (KIP-13) the tasks count against; default the empty client id",
   parser=raw_text, attr="client_id")
_d("coordinator.tokenFile", STRING, None,
   "the coordinator's token file for the tasks (else $KAFKALOG_COORDINATOR_TOKEN)",
   attr="coordinator_token_file")
_d("kafkalog.principal", STRING, None, "who writes, for ACLs (else $KAFKALOG_PRINCIPAL)",
   parser=raw_text, attr="principal")
_d("kafkalog.snapshot.interval", INT, None,
   "metadata snapshot interval; default the cluster's (50)", validator=at_least(1),
   attr="snapshot_interval")
_d("maxTasks", INT, None, "at most this many tasks write (df.write only); default the "
                          "session's parallelism, none under dynamic allocation; 0: never",
   validator=at_least(0), attr="max_tasks")
_d("storage.<name>", STRING, None, "a storage backend option (e.g. storage.direct_io)",
   prefix=STORAGE_PREFIX, parser=raw_text, attr="storage_options")
_d("kafka.<producer config>", STRING, None,
   "a Kafka producer config tuning delivery to a broker: ignored", kind=NO_OP,
   prefix="kafka.")
for _name, _reason in _KAFKA_REJECTED.items():
    _d(f"kafka.{_name}", STRING, None, _reason, kind=REJECTED, validator=_rejected(_reason))
del _d


_default = WRITE_OPTIONS.default


@dataclass(frozen=True)
class WriteOptions:
    path: str
    topic: Optional[str] = None
    compression: Optional[int] = None          # codec id; None: the topic's compression.type
    compression_levels: Dict[int, int] = field(default_factory=dict)   # codec id -> level
    magic: Optional[int] = None                # None: the topic's message.format.version
    # the defaults of options are the table's (WRITE_OPTIONS)
    batch_size: int = _default("batch.size")
    batch_records: int = _default("batch.records")
    buffer_memory: int = _default("buffer.memory")
    create_topic: bool = _default("createTopic")
    topic_partitions: int = _default("topic.partitions")
    topic_replication_factor: int = _default("topic.replication.factor")
    topic_configs: Dict[str, str] = field(default_factory=dict)
    transaction_timeout_ms: int = _default("transaction.timeout.ms")
    principal: Optional[str] = None
    snapshot_interval: Optional[int] = None
    storage_options: Dict[str, str] = field(default_factory=dict)
    acks: str = _default("acks")
    request_timeout_ms: int = _default("request.timeout.ms")
    delivery_timeout_ms: int = _default("delivery.timeout.ms")
    retry_backoff_ms: int = _default("retry.backoff.ms")
    #: KIP-13: whose produce quota the tasks count against (None: the empty client id)
    client_id: Optional[str] = None
    coordinator_token_file: Optional[str] = None
    #: not an option: the lease of the coordinator active when the driver prepared the write
    #: (``writer.prepare_sink``), which the tasks report to; None: none was
    coordinator: Optional[dict] = None

    @classmethod
    def parse(cls, options: Mapping[str, str], validate: bool = True,
              streaming: bool = False) -> "WriteOptions":
        """Options as Spark hands them (a case-insensitive mapping, or any dict); ``streaming``:
        of ``df.writeStream``."""
        opts = {str(k).lower(): v for k, v in dict(options or {}).items() if v is not None
                and not (streaming and str(k).lower() in _STREAM_SPARK)}
        topic_configs = {k[len(TOPIC_CONFIG_PREFIX):]: str(v) for k, v in opts.items()
                         if k.startswith(TOPIC_CONFIG_PREFIX)}
        storage = {k[len(STORAGE_PREFIX):]: str(v) for k, v in opts.items()
                   if k.startswith(STORAGE_PREFIX) and len(k) > len(STORAGE_PREFIX)}
        unknown = _check_names(opts) if validate else {}
        if validate:
            if streaming and "maxtasks" in opts:
                raise InvalidConfigError("option maxTasks applies to df.write: a streaming "
                                         "query writes each micro-batch with the tasks of its "
                                         "plan (coalesce the DataFrame in foreachBatch instead)")
            max_tasks(opts)
        path = opts.get("path")
        if validate and not (isinstance(path, str) and path.strip()):
            raise InvalidConfigError("kafkalog sink needs the cluster root: save(path) or "
                                     "option('path', ...)")
        get = lambda name: WRITE_OPTIONS.get(opts, name)  # noqa: E731
        topic = opts.get("topic")
        if topic is not None and validate:
            validate_topic_name(topic)
        compression, magic = get("compression.type"), get("message.format.version")
        if compression is not None and magic is not None and validate:
            codecs.check_codec(compression, magic)
        levels = {cid: get(f"compression.{name}.level") for cid, name in _LEVELS.items()
                  if f"compression.{name}.level" in opts}
        create = get("createTopic")
        if validate:
            if topic_configs:
                LogConfig.from_properties(topic_configs)
            if (topic_configs or "topic.partitions" in opts
                    or "topic.replication.factor" in opts) and not create:
                raise InvalidConfigError("topic.partitions, topic.replication.factor and "
                                         "topic.config.* apply to a topic the sink creates: "
                                         "set createTopic=true")
            if create and topic is None:
                raise InvalidConfigError("createTopic=true needs the topic option: topics named "
                                         "only by the topic column must exist before the write")
        client_id, token_file = client_options({k: str(v) for k, v in opts.items()})

        def either(name: str):
            """The option, else its ``kafka.`` name (both checked), else the default."""
            alias = get(f"kafka.{name}")
            return get(name) if name in opts else alias

        out = cls(path=path or "", topic=topic, compression=compression,
                  compression_levels=levels, magic=magic,
                  batch_size=get("batch.size"), batch_records=get("batch.records"),
                  buffer_memory=get("buffer.memory"), create_topic=create,
                  topic_partitions=get("topic.partitions"),
                  topic_replication_factor=get("topic.replication.factor"),
                  topic_configs=topic_configs,
                  transaction_timeout_ms=get("transaction.timeout.ms"),
                  principal=opts.get("kafkalog.principal"),
                  snapshot_interval=get("kafkalog.snapshot.interval"),
                  storage_options=storage,
                  acks=parse_acks(opts.get("acks", opts.get("kafka.acks"))),
                  request_timeout_ms=either("request.timeout.ms"),
                  delivery_timeout_ms=either("delivery.timeout.ms"),
                  retry_backoff_ms=either("retry.backoff.ms"),
                  client_id=client_id, coordinator_token_file=token_file)
        WRITE_OPTIONS.warn_unknown(unknown)
        return out

    def cluster_kwargs(self) -> dict:
        """Keyword arguments of ``Cluster(path, ...)`` for this write."""
        kw = dict(self.storage_options)
        kw["transaction_timeout_ms"] = self.transaction_timeout_ms
        if self.principal:
            kw["principal"] = self.principal
        if self.snapshot_interval:
            kw["snapshot_interval"] = self.snapshot_interval
        return kw


def max_tasks(options: Mapping[str, object]) -> Optional[int]:
    """The ``maxTasks`` option of ``options`` (keys in any case): None when unset, else an
    integer >= 0 (``0``: never coalesce), or InvalidConfigError naming it."""
    raw = next((v for k, v in dict(options or {}).items()
                if str(k).lower() == "maxtasks" and v is not None), None)
    return None if raw is None else WRITE_OPTIONS.parse("maxTasks", raw)


def _check_names(opts: Mapping[str, str]) -> Dict[str, str]:
    """Refuse the rejected options (with their reason), read options, and ``kafka.<name>``
    where the name is no Kafka producer config; the unknown options, which the caller warns
    about."""
    unknown = {}
    for key, value in opts.items():
        row = WRITE_OPTIONS.lookup(key)
        if row is not None and WRITE_OPTIONS.kind(row.name) == REJECTED:
            WRITE_OPTIONS.parse(row.name, value)             # raises the reason
        elif row is not None and row.name == "kafka.<producer config>":
            name = key[len("kafka."):]
            if not (name in _KAFKA_NO_OPS or name.startswith(_KAFKA_NO_OP_PREFIXES)):
                raise InvalidConfigError(
                    f"option {key}={value!r}: {name!r} is not a Kafka producer config (kafka.* "
                    "options are producer configs; the ones that tune a broker connection are "
                    "ignored, see pyspark_kafkalog/spark/write_options.py)")
        elif key in _READ_ONLY:
            raise InvalidConfigError(f"option {key!r} is a read option; it means nothing to "
                                     "df.write.format('kafkalog')")
        elif row is None:
            unknown[key] = value
    return unknown
