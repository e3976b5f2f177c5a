"""``kafkalog produce``: append JSON lines from stdin.

Two modes share this parser. ``--log-dir URL`` (raw mode, below) appends to one partition of a
plain Kafka log dir as a broker would. ``--cluster URL`` (protocol mode, cluster_data.py) writes
to a topic of a kafkalog cluster through the metadata log. Exactly one of the two is required.

Input lines: ``{"key": b64|null, "value": b64|null, "headers": [{"key": str, "value": b64|null}],
"timestamp": ms}`` (every field optional), read by jsonlines.py for both modes. All input is read
and validated before anything is written, so bad input changes nothing. Output: one JSON line per
record with the offset assigned.
"""
from __future__ import annotations

import json
import sys
import time

from ..errors import InvalidConfigError
from ..format import codecs
from ..format.encode import encode_records
from ..format.records import CREATE_TIME, LOG_APPEND_TIME, parse_timestamp_type
from ..log.config import LogConfig
from ..log.logdir import LogDir
from ..storage import open_storage
from .cluster_common import refuse_cluster_dir, storage_options
from .console_format import FORMAT_HELP, PRODUCE_FORMATS, add_format_options, read_records

DEFAULT_LEADER_EPOCH = 0
MAX_BATCH_BYTES = 1 << 20


# Options of the raw mode only (in cluster mode the topic's configs decide), with their defaults.
RAW_ONLY = {"message_format_version": ("--message-format-version", 2),
            "timestamp_type": ("--timestamp-type", "CreateTime"),
            "segment_bytes": ("--segment-bytes", None), "segment_ms": ("--segment-ms", None),
            "index_interval_bytes": ("--index-interval-bytes", None),
            "batch_records": ("--batch-records", 500)}


def add_parser(sub, parents=()) -> None:
    p = sub.add_parser("produce", parents=list(parents),
                       help="append records from stdin (JSON lines, or text lines as "
                            "kafka-console-producer reads them) to a log dir partition "
                            "(--log-dir) or a cluster topic (--cluster)",
                       description="Append records read from stdin (" + FORMAT_HELP + ") With "
                                   "--log-dir, "
                                   "to one partition of a Kafka log dir, assigning offsets, "
                                   "rolling segments and maintaining indexes and checkpoints as "
                                   "a broker does. With --cluster, to a topic of a kafkalog "
                                   "cluster, as one atomic write (Kafka's default partitioner "
                                   "unless --partition). All input is validated first.",
                       epilog="Output: one line per record, {topic, partition, offset}: JSON "
                              "lines with --log-dir; with --cluster an aligned table, or JSON "
                              "lines with --json.")
    add_format_options(p, PRODUCE_FORMATS, "input: json (default) or text lines")
    p.add_argument("--log-dir", default=None, help="raw mode: the log dir (path or URL)")
    p.add_argument("--topic", required=True)
    p.add_argument("--partition", type=int, default=None,
                   help="required with --log-dir; with --cluster the default is Kafka's "
                        "partitioner (murmur2 of the key, unkeyed records spread)")
    p.add_argument("--compression", default=None,
                   help="none, gzip, snappy, lz4, zstd (default: none with --log-dir, the "
                        "topic's compression.type with --cluster)")
    proto = p.add_argument_group("cluster mode (--cluster) only")
    proto.add_argument("--acks", default=None,
                       help="all or -1 (default): acknowledged once the ISR of each replicated "
                            "partition holds the records; 1: at the leader (docs/protocol.md "
                            "§1.3). 0 is not supported")
    from .cluster_data import add_client_options
    add_client_options(proto)
    proto.add_argument("--request-timeout-ms", type=int, default=None,
                       help="how long acks=all waits for the ISR (default 30000)")
    proto.add_argument("--delivery-timeout-ms", type=int, default=None,
                       help="Kafka's producer setting: how long a write that failed with a "
                            "retriable error (an election, the ISR below min.insync.replicas, "
                            "a timeout) is tried again before the command fails; nothing of a "
                            "failed attempt is visible (default 120000; 0: no retries)")
    proto.add_argument("--retry-backoff-ms", type=int, default=None,
                       help="the pause between two attempts (default 100)")
    raw = p.add_argument_group("raw mode (--log-dir) only")
    raw.add_argument("--message-format-version", type=int, default=None, choices=(0, 1, 2),
                     help="record format (magic) to write (default 2)")
    raw.add_argument("--timestamp-type", default=None,
                     help="CreateTime (default) or LogAppendTime")
    raw.add_argument("--segment-bytes", type=int, default=None, help="segment.bytes (roll size)")
    raw.add_argument("--segment-ms", type=int, default=None, help="segment.ms (roll age)")
    raw.add_argument("--index-interval-bytes", type=int, default=None)
    raw.add_argument("--batch-records", type=int, default=None,
                     help="records per batch (default 500)")
    p.set_defaults(run=dispatch)


def dispatch(args) -> int:
    """``--log-dir``: the raw mode (``run``); ``--cluster``: the protocol mode."""
    log_dir, cluster = args.log_dir, getattr(args, "cluster", None)
    if log_dir and cluster:
        raise InvalidConfigError("produce takes --log-dir DIR (a plain Kafka log dir) or "
                                 "--cluster URL (a kafkalog cluster), not both")
    if not log_dir and not cluster:
        raise InvalidConfigError("produce needs --log-dir DIR (a plain Kafka log dir) or "
                                 "--cluster URL (a kafkalog cluster)")
    if cluster:
        for attr, (flag, _) in RAW_ONLY.items():
            if getattr(args, attr) is not None:
                raise InvalidConfigError(f"{flag} applies to --log-dir only; with --cluster "
                                         "the topic's configs (kafkalog topics --alter) decide "
                                         "how records are written")
        from .cluster_data import run_produce
        return run_produce(args)
    if args.client_id is not None or args.verbose:
        raise InvalidConfigError("--client-id and --verbose apply to --cluster only: a plain "
                                 "Kafka log dir has no coordinator and no quotas")
    if args.partition is None:
        raise InvalidConfigError("produce --log-dir needs --partition P")
    for attr, (_, default) in RAW_ONLY.items():
        if getattr(args, attr) is None:
            setattr(args, attr, default)
    if args.compression is None:
        args.compression = "none"
    return run(args)


def _batches(records, size: int):
    batch, batch_bytes = [], 0
    for rec in records:
        rec_bytes = len(rec.key or b"") + len(rec.value or b"") + 64
        if batch and (len(batch) >= size or batch_bytes + rec_bytes > MAX_BATCH_BYTES):
            yield batch
            batch, batch_bytes = [], 0
        batch.append(rec)
        batch_bytes += rec_bytes
    if batch:
        yield batch


def run(args) -> int:
    magic = args.message_format_version
    codec = codecs.codec_id(args.compression)
    codecs.check_codec(codec, magic)
    ts_type = parse_timestamp_type(args.timestamp_type)
    if magic == 0 and ts_type == LOG_APPEND_TIME:
        raise InvalidConfigError("magic 0 has no timestamps: LogAppendTime needs format 1 or 2")
    if args.batch_records < 1:
        raise InvalidConfigError(f"--batch-records must be >= 1, got {args.batch_records}")
    if args.partition < 0:
        raise InvalidConfigError(f"--partition must be >= 0, got {args.partition}")
    props = {"message.timestamp.type": "LogAppendTime" if ts_type == LOG_APPEND_TIME else "CreateTime",
             "message.format.version": str(magic)}
    for name, value in (("segment.bytes", args.segment_bytes), ("segment.ms", args.segment_ms),
                        ("index.interval.bytes", args.index_interval_bytes)):
        if value is not None:
            props[name] = value
    config = LogConfig.from_properties(props)
    logdir_name = args.log_dir
    from ..format.checkpoint import validate_topic_name
    validate_topic_name(args.topic)
    partition = f" --partition {args.partition}"
    refuse_cluster_dir(logdir_name, args, "produce --log-dir",
                       f"kafkalog --cluster {{root}} produce --topic {args.topic}{partition}")
    now_ms = int(time.time() * 1000)
    records, _ = read_records(args, magic=magic, now_ms=now_ms)
    if not records:
        return 0
    encoded = [encode_records(b, magic=magic, compression=codec, timestamp_type=CREATE_TIME)
               for b in _batches(records, args.batch_records)]

    storage = open_storage(logdir_name, **storage_options(args))
    logdir = LogDir(storage)
    logdir.ensure_meta()
    log = logdir.open_partition(args.topic, args.partition, config, create=True)
    leader_epoch = DEFAULT_LEADER_EPOCH if magic >= 2 else -1
    result = log.append(encoded, leader_epoch=leader_epoch, now_ms=now_ms)
    if magic < 2:  # leader epochs still name the epoch of the writer for magic 0/1 logs
        log.assign_leader_epoch(DEFAULT_LEADER_EPOCH, result.first_offset)
    leo = result.last_offset + 1
    logdir.update_partition_state((args.topic, args.partition), high_watermark=leo,
                                  log_start_offset=log.log_start_offset, recovery_point=leo)
    out = sys.stdout
    for i in range(len(records)):
        out.write(json.dumps({"topic": args.topic, "partition": args.partition,
                              "offset": result.first_offset + i}) + "\n")
    return 0
