"""``kafkalog produce --log-dir URL``: append JSON lines to one partition as a broker would.

Input lines: ``{"key": b64|null, "value": b64|null, "headers": [{"key": str, "value": b64|null}],
"timestamp": ms}`` (every field optional). All input is read and validated before anything is
written, so bad input changes nothing. Output: one JSON line per record with the offset assigned.
"""
from __future__ import annotations

import base64
import binascii
import json
import sys
import time
from typing import List

from ..errors import InvalidConfigError, InvalidRecordError
from ..format import codecs
from ..format.encode import encode_records
from ..format.records import CREATE_TIME, LOG_APPEND_TIME, Record, parse_timestamp_type
from ..log.config import LogConfig
from ..log.logdir import LogDir
from ..storage import open_storage

DEFAULT_LEADER_EPOCH = 0
MAX_BATCH_BYTES = 1 << 20


def add_parser(sub) -> None:
    p = sub.add_parser("produce", help="append JSON-lines records from stdin to a partition",
                       description="Append records read as JSON lines from stdin to one partition "
                                   "of a Kafka log dir, assigning offsets, rolling segments and "
                                   "maintaining indexes and checkpoints as a broker does.")
    p.add_argument("--log-dir", required=True, help="the log dir (path or URL)")
    p.add_argument("--topic", required=True)
    p.add_argument("--partition", required=True, type=int)
    p.add_argument("--compression", default="none", help="none, gzip, snappy, lz4, zstd")
    p.add_argument("--message-format-version", type=int, default=2, choices=(0, 1, 2),
                   help="record format (magic) to write")
    p.add_argument("--timestamp-type", default="CreateTime", help="CreateTime or LogAppendTime")
    p.add_argument("--segment-bytes", type=int, default=None, help="segment.bytes (roll size)")
    p.add_argument("--segment-ms", type=int, default=None, help="segment.ms (roll age)")
    p.add_argument("--index-interval-bytes", type=int, default=None)
    p.add_argument("--batch-records", type=int, default=500, help="records per batch")
    p.set_defaults(run=run)


def _b64(value, what: str, lineno: int):
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidRecordError(f"line {lineno}: {what} must be base64 text or null")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRecordError(f"line {lineno}: {what} is not valid base64") from None


def parse_records(lines, *, magic: int, now_ms: int) -> List[Record]:
    records = []
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InvalidRecordError(f"line {lineno}: not valid JSON ({exc.msg})") from None
        if not isinstance(obj, dict):
            raise InvalidRecordError(f"line {lineno}: expected a JSON object")
        unknown = set(obj) - {"key", "value", "headers", "timestamp"}
        if unknown:
            raise InvalidRecordError(f"line {lineno}: unknown fields {sorted(unknown)}")
        headers = []
        for h in obj.get("headers") or []:
            if not isinstance(h, dict) or not isinstance(h.get("key"), str):
                raise InvalidRecordError(f"line {lineno}: each header needs a string 'key'")
            headers.append((h["key"], _b64(h.get("value"), "header value", lineno)))
        if headers and magic < 2:
            raise InvalidRecordError(f"line {lineno}: headers need --message-format-version 2")
        ts = obj.get("timestamp")
        if ts is None:
            ts = now_ms if magic > 0 else -1
        elif not isinstance(ts, int) or isinstance(ts, bool) or ts < -1:
            raise InvalidRecordError(f"line {lineno}: timestamp must be an integer (ms) >= -1")
        if magic == 0:
            ts = -1
        records.append(Record(_b64(obj.get("key"), "key", lineno),
                              _b64(obj.get("value"), "value", lineno), ts, tuple(headers)))
    return records


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
    now_ms = int(time.time() * 1000)
    records = parse_records(sys.stdin, magic=magic, now_ms=now_ms)
    if not records:
        return 0
    encoded = [encode_records(b, magic=magic, compression=codec, timestamp_type=CREATE_TIME)
               for b in _batches(records, args.batch_records)]

    storage = open_storage(logdir_name)
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
