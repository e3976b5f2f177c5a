"""Data commands of a kafkalog cluster: ``produce --cluster`` (the protocol mode of ``produce``;
its parser lives in produce.py with the raw ``--log-dir`` mode), ``consume`` and ``offsets``."""
from __future__ import annotations

import base64
import json
import sys
import time

from ..coordinator.follow import DEFAULT_POLL_INTERVAL_MS
from ..client.acks import parse_acks
from ..errors import (InvalidConfigError, InvalidRecordError, TopicAuthorizationFailedError,
                      UnknownTopicOrPartitionError)
from ..format import codecs
from ..format.checkpoint import validate_topic_name
from .cluster_common import (OUTPUT_HELP, columns, emit_rows, non_negative,
                             open_admin)
from .console_format import (CONSUME_FORMAT_HELP, CONSUME_FORMATS, CONSUMER_PROPERTIES,
                             TextPrinter, add_format_options, json_text_line, properties,
                             read_records)

ACK_COLUMNS = columns("topic", "partition", "offset")
OFFSET_COLUMNS = columns("topic", "partition", "offset", "timestamp")
ISOLATION_LEVELS = ("read_committed", "read_uncommitted")
COMMIT_INTERVAL_MS = 5000


# -- produce --cluster -----------------------------------------------------------------------

def _check_partition(admin, topic: str, partition):
    """The topic's partition count; ``partition`` (if given) must be one of them."""
    n = admin.cluster.partition_count(topic)
    if partition is not None and not 0 <= partition < n:
        raise UnknownTopicOrPartitionError(f"no partition {topic}-{partition}: topic {topic!r} "
                                           f"has {n} partition{'s' * (n != 1)}")
    return n


def run_produce(args) -> int:
    """Validate the options and every input line, then write all records as one atomic unit
    through ``Admin.produce`` (Kafka's default partitioner unless ``--partition``)."""
    validate_topic_name(args.topic)
    non_negative(args.partition, "--partition")
    acks = parse_acks(args.acks)
    non_negative(args.request_timeout_ms, "--request-timeout-ms")
    non_negative(args.delivery_timeout_ms, "--delivery-timeout-ms")
    non_negative(args.retry_backoff_ms, "--retry-backoff-ms")
    admin = open_admin(args, "produce")
    _check_partition(admin, args.topic, args.partition)
    cluster = admin.cluster
    if not cluster.state(refresh=False).authorized(cluster.principal, args.topic, "WRITE"):
        raise TopicAuthorizationFailedError(f"{cluster.principal} may not write to "
                                            f"{args.topic!r}")
    magic = cluster.topic_config(args.topic).magic
    if args.compression is not None:
        codecs.check_codec(codecs.codec_id(args.compression), magic)
    records, numbers = read_records(args, magic=2, now_ms=int(time.time() * 1000))
    if magic < 2:
        for n, rec in zip(numbers, records):
            if rec.headers:
                raise InvalidRecordError(f"line {n}: topic {args.topic!r} uses message format "
                                         f"{magic}, which has no record headers")
    if not records:
        return 0
    placed = admin.produce(args.topic, records, partition=args.partition,
                           compression=args.compression, acks=acks,
                           request_timeout_ms=args.request_timeout_ms,
                           delivery_timeout_ms=args.delivery_timeout_ms,
                           retry_backoff_ms=args.retry_backoff_ms)
    emit_rows(args, ACK_COLUMNS, [{"topic": a.topic, "partition": a.partition, "offset": a.offset}
                                  for a in placed])
    report_throttle(args, admin)
    return 0


def add_client_options(p) -> None:
    """``--client-id`` and ``--verbose``, of produce (cluster mode) and consume."""
    p.add_argument("--client-id", metavar="ID", default=None,
                   help="Kafka's client.id: whose quotas (KIP-13) this counts against (default: "
                        "the empty client id, which shares the <default> quota); the active "
                        "coordinator enforces them (token: $KAFKALOG_COORDINATOR_TOKEN)")
    p.add_argument("--verbose", action="store_true",
                   help="print to stderr at the end how long quotas throttled this client "
                        "(Kafka's produce-/fetch-throttle-time-max and -avg, ms)")


def report_throttle(args, admin) -> None:
    if getattr(args, "verbose", False):
        print("kafkalog: " + json.dumps(admin.throttle_stats(), sort_keys=True),
              file=sys.stderr, flush=True)


# -- consume ---------------------------------------------------------------------------------

def add_consume_parser(sub, parents) -> None:
    p = sub.add_parser(
        "consume", parents=parents,
        help="print committed records of a topic: JSON lines, or text as "
             "kafka-console-consumer prints them",
        description="Read committed records of a topic, partition by partition. "
                    + CONSUME_FORMAT_HELP,
        epilog="Output with --format json: one JSON object per record, with the fields of "
               "`kafkalog dump --json --deep-iteration --print-data-log` (no segment) plus topic "
               "and partition: topic, partition, offset, timestamp, timestampType, magic, "
               "control, transactional, producerId, key, value (base64 or null), headers "
               "[{key, value}]. "
               "With --group, partitions where the group has committed offsets resume from them "
               "unless --from names another start than earliest. Only offsets of records already "
               "written to stdout and flushed are committed: every --commit-interval-ms, at the "
               "end, and on Ctrl-C or a closed pipe (`| head`), so the next consume of the group "
               "resumes right after the last record that reached the output. With --follow "
               "(kafka-console-consumer) it does not end at the end of the log: every "
               "--poll-interval-ms it prints records committed since, also those of partitions "
               "added meanwhile (from their log start offset), flushing whenever it has caught "
               "up; it ends at --max-records, on Ctrl-C (exit 0) or a closed pipe, and with exit "
               "1 if the topic is deleted. Records deleted (delete-records, retention) before it "
               "read them are skipped with a warning on stderr naming the lost offsets.")
    p.add_argument("--topic", required=True, metavar="T")
    add_format_options(p, CONSUME_FORMATS, "output: json (default), json-text or text")
    p.add_argument("--partition", type=int, metavar="P", help="one partition (default: all)")
    p.add_argument("--from", dest="start", default="earliest", metavar="WHERE",
                   help="earliest (default), latest, an offset (needs --partition) or "
                        "@TIMESTAMP_MS (the first record at or after that time)")
    p.add_argument("--max-records", "--max-messages", dest="max_records", type=int, metavar="N",
                   help="stop after N records")
    p.add_argument("--isolation-level", default="read_committed", choices=ISOLATION_LEVELS,
                   help="read_uncommitted also shows writes not yet committed")
    p.add_argument("--group", metavar="G", help="consumer group: resume from and commit offsets")
    p.add_argument("--commit-interval-ms", type=int, metavar="MS",
                   help="with --group: flush and commit at most this often while printing "
                        f"(default {COMMIT_INTERVAL_MS}, Kafka's auto.commit.interval.ms; 0: "
                        "after every record)")
    p.add_argument("--follow", action="store_true",
                   help="keep printing records as they are committed, until Ctrl-C")
    p.add_argument("--poll-interval-ms", type=int, metavar="MS",
                   help=f"with --follow: ask for new records this often (default "
                        f"{DEFAULT_POLL_INTERVAL_MS})")
    add_client_options(p)
    p.set_defaults(run=run_consume)


def _b64(b):
    return None if b is None else base64.b64encode(b).decode("ascii")


def record_json(r) -> dict:
    return {"topic": r.topic, "partition": r.partition, "offset": r.offset,
            "timestamp": r.timestamp, "timestampType": r.timestamp_type, "magic": r.magic,
            "control": False, "transactional": r.is_transactional, "producerId": r.producer_id,
            "key": _b64(r.key), "value": _b64(r.value),
            "headers": [{"key": k, "value": _b64(v)} for k, v in r.headers]}


def run_consume(args) -> int:
    """Stream records to stdout. A record is delivered once its line has been flushed to stdout,
    so the group's offsets are committed only from a snapshot of the consumer's positions taken
    right after a flush; a closed pipe or Ctrl-C commits that snapshot and nothing beyond it.
    A follower flushes whenever it has caught up, since its output is watched as it comes, and
    Ctrl-C is how it normally ends: exit 0."""
    from ..client.consumer import parse_start
    from ..client.groups import validate_group_id
    validate_topic_name(args.topic)
    non_negative(args.partition, "--partition")
    non_negative(args.max_records, "--max-records", 1)
    non_negative(args.commit_interval_ms, "--commit-interval-ms")
    non_negative(args.poll_interval_ms, "--poll-interval-ms")
    if args.poll_interval_ms is not None and not args.follow:
        raise InvalidConfigError("--poll-interval-ms needs --follow")
    if args.group is not None:
        validate_group_id(args.group)
    elif args.commit_interval_ms is not None:
        raise InvalidConfigError("--commit-interval-ms needs --group (it commits the group's "
                                 "offsets)")
    spec = parse_start(args.start)
    if isinstance(spec, int) and args.partition is None:
        raise InvalidConfigError(f"--from {args.start}: an offset needs --partition (offsets "
                                 "are per partition)")
    admin = open_admin(args, "consume")
    _check_partition(admin, args.topic, args.partition)
    try:
        return _consume(args, admin)
    finally:
        report_throttle(args, admin)


def _printer(args):
    """``emit(record)`` in ``--format``: JSON lines (base64 or UTF-8 strings) or text bytes."""
    props = properties(args.property, CONSUMER_PROPERTIES, args.format)
    if args.format == "text":
        sys.stdout.flush()   # text lines go to the byte stream under stdout
        return TextPrinter(props)
    if args.format == "json-text":
        return lambda r: sys.stdout.write(json_text_line(record_json(r), r) + "\n")
    return lambda r: sys.stdout.write(json.dumps(record_json(r)) + "\n")


def _consume(args, admin) -> int:
    emit = _printer(args)   # a bad --property is refused before anything is read
    out = sys.stdout
    interval = (COMMIT_INTERVAL_MS if args.commit_interval_ms is None
                else args.commit_interval_ms) / 1000.0
    delivered = committed = {}
    next_commit = time.monotonic() + interval

    def caught_up():       # --follow: every record read so far is written; show it now
        nonlocal delivered, committed, next_commit
        written = consumer.positions()      # every record handed out has been written
        out.flush()
        if args.group is not None:
            delivered = written
            if time.monotonic() >= next_commit and delivered != committed:
                consumer.commit(delivered)
                committed = delivered
                next_commit = time.monotonic() + interval

    follow = {}
    if args.follow:
        args.sigint_status = 0
        follow = dict(follow=True, on_caught_up=caught_up,
                      poll_interval_ms=(DEFAULT_POLL_INTERVAL_MS if args.poll_interval_ms is None
                                        else args.poll_interval_ms),
                      on_data_loss=lambda m: print(f"kafkalog: warning: {m}", file=sys.stderr,
                                                   flush=True))
    consumer = admin.consume(args.topic, args.partition, start=args.start.strip(),
                             max_records=args.max_records, isolation_level=args.isolation_level,
                             group=args.group, enable_auto_commit=False, **follow)
    if args.group is None:
        for r in consumer:
            emit(r)
        out.flush()
        return 0
    try:
        for r in consumer:
            emit(r)
            if time.monotonic() >= next_commit:
                out.flush()
                delivered = consumer.positions()
                consumer.commit(delivered)
                committed = delivered
                next_commit = time.monotonic() + interval
        out.flush()
        delivered = consumer.positions()   # every partition reached, also those with no record
    finally:
        if delivered != committed:
            consumer.commit(delivered)
    return 0


# -- offsets ---------------------------------------------------------------------------------

def add_offsets_parser(sub, parents) -> None:
    p = sub.add_parser(
        "offsets", parents=parents, help="list offsets: earliest, latest or for a time",
        description="Kafka's ListOffsets (kafka-get-offsets.sh) per partition of a topic.",
        epilog=OUTPUT_HELP + " Columns: topic, partition, offset, timestamp (the record's, "
               "when found by --time TIMESTAMP_MS; else -1). A time after every record gives "
               "the high watermark.")
    p.add_argument("--topic", required=True, metavar="T")
    p.add_argument("--partition", type=int, metavar="P", help="one partition (default: all)")
    p.add_argument("--time", default="latest", metavar="WHEN",
                   help="earliest (or -2), latest (or -1, the default) or a timestamp in ms: "
                        "the first offset whose record timestamp is >= it")
    p.set_defaults(run=run_offsets)


def parse_time(text: str):
    text = str(text).strip()
    if text in ("earliest", "-2"):
        return "earliest"
    if text in ("latest", "-1"):
        return "latest"
    try:
        ts = int(text)
    except ValueError:
        ts = -3
    if ts < 0:
        raise InvalidConfigError(f"--time {text!r}: expected earliest, latest, -2, -1 or a "
                                 "timestamp in ms >= 0")
    return ts


def run_offsets(args) -> int:
    from ..admin import TopicPartition
    validate_topic_name(args.topic)
    non_negative(args.partition, "--partition")
    spec = parse_time(args.time)
    admin = open_admin(args, "offsets")
    n = _check_partition(admin, args.topic, args.partition)
    parts = [args.partition] if args.partition is not None else range(n)
    result = admin.list_offsets({TopicPartition(args.topic, p): spec for p in parts})
    emit_rows(args, OFFSET_COLUMNS, [{"topic": tp.topic, "partition": tp.partition,
                                      "offset": r.offset, "timestamp": r.timestamp}
                                     for tp, r in sorted(result.items())])
    return 0
