"""Records of ``kafkalog produce`` as JSON lines on stdin: one rule for both modes.

The raw mode (``produce --log-dir``, produce.py) and the protocol mode (``produce --cluster``,
cluster_data.py) read the same input, so they take it from here: each line is checked against
what the format can store before anything is written, and an error names its line.

A line: ``{"key": b64|null, "value": b64|null, "headers": [{"key": str, "value": b64|null}],
"timestamp": ms}`` (every field optional).
"""
from __future__ import annotations

import base64
import binascii
import json
from typing import List

from ..errors import InvalidRecordError
from ..format.records import Record


def _b64(value, what: str, lineno: int):
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidRecordError(f"line {lineno}: {what} must be base64 text or null")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRecordError(f"line {lineno}: {what} is not valid base64") from None


#: A timestamp is a Java long; Kafka's producer takes none below 0 (null, -1 here, is "none").
_MAX_TIMESTAMP = 2**63 - 1


def _headers(value, lineno: int):
    if value is None:
        return []
    if not isinstance(value, list):
        raise InvalidRecordError(f"line {lineno}: headers must be a JSON array of "
                                 "{\"key\": str, \"value\": base64|null} objects")
    headers = []
    for h in value:
        if not isinstance(h, dict) or not isinstance(h.get("key"), str):
            raise InvalidRecordError(f"line {lineno}: each header needs a string 'key'")
        try:   # the key is written as UTF-8: a lone surrogate (JSON "\ud800") has none
            h["key"].encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidRecordError(f"line {lineno}: header key {h['key']!r} is not valid "
                                     "Unicode (a lone surrogate)") from None
        headers.append((h["key"], _b64(h.get("value"), "header value", lineno)))
    return headers


def _timestamp(value, lineno: int) -> int:
    """The batch header and the records store it as a signed 64-bit int: anything else would
    only fail (or wrap) at encoding, after the input was said to be valid."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidRecordError(f"line {lineno}: timestamp must be an integer (ms), "
                                 f"got {json.dumps(value)}")
    if not -1 <= value <= _MAX_TIMESTAMP:
        raise InvalidRecordError(f"line {lineno}: timestamp {value} is out of range: Kafka "
                                 f"takes -1 (none) or 0 to {_MAX_TIMESTAMP} ms")
    return value


def parse_records(lines, *, magic: int, now_ms: int) -> List[Record]:
    """Every line checked against what the format can store, so that bad input fails here,
    naming its line, and never halfway through a write."""
    records = []
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InvalidRecordError(f"line {lineno}: not valid JSON ({exc.msg})") from None
        except RecursionError:
            raise InvalidRecordError(f"line {lineno}: JSON nested too deeply") from None
        if not isinstance(obj, dict):
            raise InvalidRecordError(f"line {lineno}: expected a JSON object")
        unknown = set(obj) - {"key", "value", "headers", "timestamp"}
        if unknown:
            raise InvalidRecordError(f"line {lineno}: unknown fields {sorted(unknown)}")
        headers = _headers(obj.get("headers"), lineno)
        if headers and magic < 2:
            raise InvalidRecordError(f"line {lineno}: headers need --message-format-version 2")
        ts = obj.get("timestamp")
        if ts is None:
            ts = now_ms if magic > 0 else -1
        else:
            ts = _timestamp(ts, lineno)
        if magic == 0:
            ts = -1
        records.append(Record(_b64(obj.get("key"), "key", lineno),
                              _b64(obj.get("value"), "value", lineno), ts, tuple(headers)))
    return records
