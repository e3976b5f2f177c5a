"""The line formats of ``produce`` and ``consume``, as Kafka's console tools have them.

``kafka-console-producer`` reads plain text lines (a record's value; with ``parse.key=true``
the key before the first ``key.separator``); ``kafka-console-consumer`` prints values as text
and, with ``print.key``, ``print.timestamp``, ``print.partition``, ``print.offset`` or
``print.headers``, the rest before it (``DefaultMessageFormatter``). Those are ``--format
text`` with ``--property K=V`` here, byte for byte: a record's bytes go out as they are stored,
and a text line's bytes become the record's. ``--format json`` is the JSON-lines form with
base64 bytes (``jsonlines.py``), which carries any byte and every field; ``consume --format
json-text`` is that with key, value and header values as UTF-8 strings.
"""
from __future__ import annotations

import json
import sys
from typing import Dict, Iterable, List, Optional

from ..config_def import parse_bool
from ..errors import InvalidConfigError, InvalidRecordError
from ..format.records import Record
from .jsonlines import parse_records

PRODUCE_FORMATS = ("json", "text")
CONSUME_FORMATS = ("json", "json-text", "text")

#: ``--property`` names and defaults, Kafka's (LineMessageReader, DefaultMessageFormatter)
PRODUCER_PROPERTIES = {"parse.key": "false", "key.separator": "\t"}
CONSUMER_PROPERTIES = {"print.key": "false", "print.value": "true", "print.timestamp": "false",
                       "print.partition": "false", "print.offset": "false",
                       "print.headers": "false", "key.separator": "\t", "line.separator": "\n",
                       "headers.separator": ",", "null.literal": "null"}
_BOOLEAN = ("parse.key", "print.key", "print.value", "print.timestamp", "print.partition",
            "print.offset", "print.headers")
_TIMESTAMP_TYPES = {0: "CreateTime", 1: "LogAppendTime", -1: "NoTimestampType"}

FORMAT_HELP = ("--format text: kafka-console-producer's lines, each a record's value (its "
               "bytes as they are), with --property parse.key=true the key before the first "
               "key.separator (default a tab); --format json (default): one JSON object per "
               "line, {\"key\": base64|null, \"value\": base64|null, \"headers\": [{\"key\": "
               "str, \"value\": base64|null}], \"timestamp\": ms}, every field optional.")
CONSUME_FORMAT_HELP = ("--format json (default): one JSON object per record, bytes in base64; "
                       "json-text: the same with key, value and header values as UTF-8 "
                       "strings (bytes that are not UTF-8 are an error: use json); text: "
                       "kafka-console-consumer's lines, the value's bytes as they are, with "
                       "--property print.key=true, print.timestamp, print.partition, "
                       "print.offset, print.headers, print.value=false, key.separator (a tab), "
                       "line.separator, headers.separator, null.literal as Kafka's "
                       "DefaultMessageFormatter prints them.")


def add_format_options(p, formats, help_text: str) -> None:
    p.add_argument("--format", choices=formats, default="json", help=help_text)
    p.add_argument("--property", metavar="K=V", action="append", default=[],
                   help="a line-format property (--format text), as the console tools take")


def properties(pairs: Iterable[str], known: Dict[str, str], fmt: str) -> Dict[str, str]:
    """``--property K=V`` settings over Kafka's defaults; an unknown name or a bad boolean is a
    typed error naming it, as are properties given with a format that takes none."""
    out = dict(known)
    pairs = list(pairs)
    if pairs and fmt != "text":
        raise InvalidConfigError(f"--property applies to --format text, not {fmt}")
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep:
            raise InvalidConfigError(f"--property {pair!r}: expected NAME=VALUE")
        if name not in known:
            raise InvalidConfigError(f"unknown --property {name!r}; known: {', '.join(known)}")
        if name in _BOOLEAN:
            try:
                value = str(parse_bool(name, value)).lower()
            except InvalidConfigError:
                raise InvalidConfigError(
                    f"--property {name} takes true or false, not {value!r}") from None
        out[name] = value if name in _BOOLEAN else _unescape(value)
    return out


def _unescape(value: str) -> str:
    """``\\t`` and ``\\n`` as a shell passes them (``--property key.separator=\\t``)."""
    return value.replace("\\t", "\t").replace("\\n", "\n").replace("\\r", "\r")


def stdin_bytes() -> bytes:
    stream = getattr(sys.stdin, "buffer", None)
    return stream.read() if stream is not None else sys.stdin.read().encode("utf-8")


def text_records(data: bytes, props: Dict[str, str], *, magic: int, now_ms: int) -> List[Record]:
    """Every line (``\\n``, or ``\\r\\n``, ends it; an empty line is an empty value, as Kafka's
    reader has it) a record; with ``parse.key`` a line without the separator names its line
    and nothing is written."""
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()        # the newline that ends the last line starts no record
    sep = props["key.separator"].encode("utf-8")
    parse_key = props["parse.key"] == "true"
    ts = now_ms if magic > 0 else -1
    out = []
    for n, line in enumerate(lines, 1):
        if line.endswith(b"\r"):
            line = line[:-1]
        key = None
        if parse_key:
            at = line.find(sep)
            if at < 0:
                raise InvalidRecordError(f"line {n}: no key separator {props['key.separator']!r} "
                                         "(parse.key=true)")
            key, line = line[:at], line[at + len(sep):]
        out.append(Record(key, line, ts, ()))
    return out


def read_records(args, *, magic: int, now_ms: int):
    """Every record of stdin, in ``--format``, checked before anything is written, and the
    number of the input line each came from."""
    props = properties(args.property, PRODUCER_PROPERTIES, args.format)
    if args.format == "text":
        records = text_records(stdin_bytes(), props, magic=magic, now_ms=now_ms)
        return records, list(range(1, len(records) + 1))
    lines = sys.stdin.readlines()
    numbers = [i for i, line in enumerate(lines, 1) if line.strip()]
    return parse_records(lines, magic=magic, now_ms=now_ms), numbers


def _text(value: Optional[bytes], what: str, offset: int) -> Optional[str]:
    if value is None:
        return None
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidRecordError(f"offset {offset}: the {what} is not UTF-8; --format json "
                                 "prints any bytes (base64)") from None


def json_text_line(d: dict, r) -> str:
    """A ``record_json`` dict with its bytes as UTF-8 strings."""
    d = dict(d, key=_text(r.key, "key", r.offset), value=_text(r.value, "value", r.offset),
             headers=[{"key": k, "value": _text(v, f"header {k!r}", r.offset)}
                      for k, v in r.headers])
    return json.dumps(d, ensure_ascii=False)


class TextPrinter:
    """kafka-console-consumer's ``DefaultMessageFormatter``: the fields asked for (timestamp,
    partition, offset, headers, key, value) between ``key.separator``s, then
    ``line.separator``; bytes as they are."""

    def __init__(self, props: Dict[str, str]):
        self.p = props
        self.sep = props["key.separator"].encode("utf-8")
        self.null = props["null.literal"].encode("utf-8")
        stream = getattr(sys.stdout, "buffer", None)
        self.write = stream.write if stream is not None else (
            lambda b: sys.stdout.write(b.decode("utf-8", "surrogateescape")))

    def line(self, r) -> bytes:
        p = self.p
        fields = []
        if p["print.timestamp"] == "true":
            kind = _TIMESTAMP_TYPES.get(r.timestamp_type, "CreateTime")
            fields.append(f"{kind}:{r.timestamp}".encode() if kind != "NoTimestampType"
                          else b"NO_TIMESTAMP")
        if p["print.partition"] == "true":
            fields.append(f"Partition:{r.partition}".encode())
        if p["print.offset"] == "true":
            fields.append(f"Offset:{r.offset}".encode())
        if p["print.headers"] == "true":
            hs = p["headers.separator"].encode("utf-8").join(
                k.encode("utf-8") + b":" + (self.null if v is None else v) for k, v in r.headers)
            fields.append(hs or b"NO_HEADERS")
        if p["print.key"] == "true":
            fields.append(self.null if r.key is None else r.key)
        if p["print.value"] == "true":
            fields.append(self.null if r.value is None else r.value)
        return self.sep.join(fields) + p["line.separator"].encode("utf-8")

    def __call__(self, r) -> None:
        self.write(self.line(r))
