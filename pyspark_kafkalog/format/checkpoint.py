"""Kafka's small text files in a log dir: offset checkpoints, ``leader-epoch-checkpoint``,
``partition.metadata`` and ``meta.properties``.

Pure functions (str in, str out). Parsing accepts what Kafka's readers accept (Java
``readLine`` line ends, ``\\s+`` field splitting, ``Integer.parseInt``-style numbers) and
formatting produces what Kafka's writers produce byte for byte, so a file we rewrite is
indistinguishable from a broker's.
Malformed text raises :class:`CorruptRecordError` naming the line; a version Kafka would refuse
raises :class:`UnsupportedVersionError`; values that Kafka could never have written are refused on
format (:class:`InvalidTopicError`, :class:`InvalidPartitionsError`, :class:`InvalidRequestError`).
"""
from __future__ import annotations

import base64
import datetime as _dt
import operator
import re
import uuid
from typing import Iterable, Mapping, NamedTuple

from ..errors import (CorruptRecordError, InvalidPartitionsError, InvalidRequestError,
                      InvalidTopicError, UnsupportedVersionError)

CHECKPOINT_VERSION = 0
PARTITION_METADATA_VERSION = 0
#: Kafka's reserved Uuids (``Uuid.ZERO_UUID``; ``Uuid.ONE_UUID`` = ``METADATA_TOPIC_ID``).
ZERO_UUID = "AAAAAAAAAAAAAAAAAAAAAA"
METADATA_TOPIC_ID = "AAAAAAAAAAAAAAAAAAAAAQ"

_INT32 = (-2**31, 2**31 - 1)
_INT64 = (-2**63, 2**63 - 1)
_LINE_END = re.compile(r"\r\n|\r|\n")          # what java.io.BufferedReader.readLine splits on
_JAVA_WS = re.compile(r"[ \t\n\x0b\f\r]+")      # Java's \s
_META_SEP = re.compile(r":[ \t\n\x0b\f\r]+")    # PartitionMetadataReadBuffer's ":\s+"
_JAVA_INT = re.compile(r"[+-]?[0-9]+\Z")
_UUID_TEXT = re.compile(r"[A-Za-z0-9_-]{22}(==)?\Z")
_TOPIC = re.compile(r"[a-zA-Z0-9._-]+\Z")


class EpochEntry(NamedTuple):
    """A ``leader-epoch-checkpoint`` line: ``epoch``'s leader wrote from ``start_offset`` on."""

    epoch: int
    start_offset: int


# -- shared line handling -------------------------------------------------------------------------

def _lines(text: str) -> list[str]:
    # Kafka reads with readLine: \n, \r and \r\n end a line and a final terminator adds no line.
    # str.splitlines would also split on \v, \f and Unicode separators, which Kafka keeps in a line.
    if not text:
        return []
    parts = _LINE_END.split(text)
    if parts[-1] == "":
        parts.pop()
    return parts


def _java_split(pattern: re.Pattern, line: str) -> list[str]:
    # String.split: a leading separator yields a leading "", trailing empty strings are dropped.
    parts = pattern.split(line)
    if len(parts) > 1:
        while parts and parts[-1] == "":
            parts.pop()
    return parts


def _java_int(token: str, bounds: tuple[int, int], where: str) -> int:
    # Python's int() would also take "1_000", " 7" or non-ASCII digits; Kafka's parseInt would not.
    if _JAVA_INT.match(token):
        value = int(token)
        if bounds[0] <= value <= bounds[1]:
            return value
    bits = 32 if bounds == _INT32 else 64
    raise CorruptRecordError(f"{where}: {token!r} is not a {bits}-bit integer")


def _int(value, bounds: tuple[int, int], what: str, error=InvalidRequestError) -> int:
    number = None if isinstance(value, bool) else operator.index(value)
    if number is None or not bounds[0] <= number <= bounds[1]:
        raise error(f"{what} {value!r} is not an integer in range")
    return number


def _read_checkpoint(text: str, what: str, fields: int, parse_entry) -> list:
    """The shared ``CheckpointFile`` layout: version line, entry count line, one entry per line.

    Like Kafka, an empty file (or one with only a version line) reads as no entries: that is what
    a crash between creating and first writing the file leaves behind.
    """
    if not (lines := _lines(text)):
        return []
    version = _java_int(lines[0], _INT32, f"{what} line 1 (version)")
    if version != CHECKPOINT_VERSION:
        raise UnsupportedVersionError(f"{what} line 1: version {version}, only "
                                      f"{CHECKPOINT_VERSION} is known")
    if len(lines) == 1:
        return []
    count = _java_int(lines[1], _INT32, f"{what} line 2 (entry count)")
    if count < 0:
        raise CorruptRecordError(f"{what} line 2: negative entry count {count}")
    entries = []
    for n, line in enumerate(lines[2:], start=3):
        parts = _java_split(_JAVA_WS, line)
        if len(parts) != fields:
            raise CorruptRecordError(f"{what} line {n}: expected {fields} fields, found "
                                     f"{len(parts)}: {line!r}")
        entries.append(parse_entry(parts, f"{what} line {n}"))
    if len(entries) != count:
        raise CorruptRecordError(f"{what} line 2: declares {count} entries but {len(entries)} "
                                 "follow")
    return entries


def _write_checkpoint(lines: list[str]) -> str:
    # Kafka's BufferedWriter.newLine on the Linux brokers that write these files: "\n".
    return "".join(f"{line}\n" for line in [str(CHECKPOINT_VERSION), str(len(lines)), *lines])


# -- offset checkpoints ---------------------------------------------------------------------------

def validate_topic_name(topic: str) -> str:
    """Kafka's ``Topic.validate``: a name outside these rules can never reach a checkpoint."""
    if not isinstance(topic, str) or topic in ("", ".", "..") or len(topic) > 249:
        raise InvalidTopicError(f"topic name {topic!r:.60} is empty, '.', '..', longer than 249 "
                                "characters or not a string")
    if not _TOPIC.match(topic):
        raise InvalidTopicError(f"topic name {topic!r} has characters other than ASCII "
                                "alphanumerics, '.', '_' and '-'")
    return topic


def colliding_topics(topic: str, existing) -> list[str]:
    """The names among ``existing`` that Kafka's ``Topic.hasCollision`` says ``topic`` collides
    with: its metric names replace '.' by '_' (``Topic.unifyCollisionChars``), so ``a.b`` and
    ``a_b`` would report as one topic, and Kafka refuses to create the second."""
    unified = topic.replace(".", "_")
    return sorted(t for t in existing if t != topic and t.replace(".", "_") == unified)


def parse_offset_checkpoint(text: str) -> dict[tuple[str, int], int]:
    """Parse ``replication-``/``log-start-``/``recovery-point-``/``cleaner-offset-checkpoint``.

    The dict keeps file order so that formatting it again reproduces the file. A repeated
    partition keeps its first position and its last offset, as Kafka's map would.
    """
    def entry(parts, where):
        return ((parts[0], _java_int(parts[1], _INT32, f"{where} (partition)")),
                _java_int(parts[2], _INT64, f"{where} (offset)"))
    return dict(_read_checkpoint(text, "offset checkpoint", 3, entry))


def format_offset_checkpoint(offsets: Mapping[tuple[str, int], int]) -> str:
    """The text Kafka's ``OffsetCheckpointFile`` writes for ``offsets``, in mapping order."""
    lines = []
    for (topic, partition), offset in offsets.items():
        validate_topic_name(topic)
        partition = _int(partition, (0, _INT32[1]), f"partition of {topic}",
                         InvalidPartitionsError)
        offset = _int(offset, _INT64, f"offset of {topic}-{partition}")
        lines.append(f"{topic} {partition} {offset}")
    return _write_checkpoint(lines)


# -- leader-epoch-checkpoint ----------------------------------------------------------------------

def parse_leader_epoch_checkpoint(text: str) -> list[EpochEntry]:
    """Parse a ``leader-epoch-checkpoint``.

    Negative epochs or offsets are reported as corrupt: Kafka's ``LeaderEpochFileCache`` refuses to
    load them. Out-of-order entries are returned as found; Kafka's cache repairs those itself.
    """
    def entry(parts, where):
        e = EpochEntry(_java_int(parts[0], _INT32, f"{where} (epoch)"),
                       _java_int(parts[1], _INT64, f"{where} (start offset)"))
        if e.epoch < 0 or e.start_offset < 0:
            raise CorruptRecordError(f"{where}: negative leader epoch entry {tuple(e)}")
        return e
    return _read_checkpoint(text, "leader-epoch-checkpoint", 2, entry)


def format_leader_epoch_checkpoint(entries: Iterable[tuple[int, int]]) -> str:
    """The text Kafka's ``LeaderEpochCheckpointFile`` writes for ``entries``."""
    lines = []
    for epoch, start_offset in entries:
        epoch = _int(epoch, (0, _INT32[1]), "leader epoch")
        start_offset = _int(start_offset, (0, _INT64[1]), f"start offset of epoch {epoch}")
        lines.append(f"{epoch} {start_offset}")
    return _write_checkpoint(lines)


# -- topic ids and partition.metadata -------------------------------------------------------------

def topic_id_to_bytes(topic_id: str) -> bytes:
    """The 16 bytes of a Kafka Uuid string, accepting exactly what ``Uuid.fromString`` accepts.

    That is 22 base64url characters, optionally padded with "==". Like Java's decoder, the unused
    low bits of the last character are ignored, so only :func:`topic_id_from_bytes` of the result
    is canonical.
    """
    if not isinstance(topic_id, str) or not _UUID_TEXT.match(topic_id):
        raise InvalidRequestError(f"{topic_id!r} is not a base64url-encoded 16-byte Kafka Uuid")
    return base64.urlsafe_b64decode(topic_id[:22] + "==")


def topic_id_from_bytes(raw: bytes) -> str:
    """Kafka's ``Uuid.toString``: base64url without padding."""
    raw = bytes(raw)
    if len(raw) != 16:
        raise InvalidRequestError(f"a Kafka Uuid is 16 bytes, not {len(raw)}")
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def new_topic_id() -> str:
    """A fresh id the way ``Uuid.randomUuid`` makes one.

    A random (version 4) UUID, redrawn if it is reserved or if its string starts with "-", which
    command-line tools would take for an option.
    """
    while True:
        topic_id = topic_id_from_bytes(uuid.uuid4().bytes)
        if topic_id not in (ZERO_UUID, METADATA_TOPIC_ID) and not topic_id.startswith("-"):
            return topic_id


def parse_partition_metadata(text: str) -> str:
    """The (canonical) topic id in a ``partition.metadata`` file.

    Follows ``PartitionMetadataReadBuffer``: two ``name: value`` lines whose names Kafka does not
    check. Versions above 0 are accepted, as Kafka does for downgrade compatibility (the layout
    promises the topic id stays on line 2); a negative version is refused.
    """
    what, lines = "partition.metadata", _lines(text)
    if not lines:
        raise CorruptRecordError(f"{what} is empty")
    parts = _java_split(_META_SEP, lines[0])
    if len(parts) != 2:
        raise CorruptRecordError(f"{what} line 1: expected 'version: <n>', found {lines[0]!r}")
    version = _java_int(parts[1], _INT32, f"{what} line 1 (version)")
    if version < PARTITION_METADATA_VERSION:
        raise UnsupportedVersionError(f"{what} line 1: unknown version {version}")
    if len(lines) < 2:
        raise CorruptRecordError(f"{what} line 2: missing 'topic_id: <id>' line")
    parts = _java_split(_META_SEP, lines[1])
    if len(parts) != 2:
        raise CorruptRecordError(f"{what} line 2: expected 'topic_id: <id>', found {lines[1]!r}")
    try:
        topic_id = topic_id_from_bytes(topic_id_to_bytes(parts[1]))
    except InvalidRequestError as exc:
        raise CorruptRecordError(f"{what} line 2: {exc}") from None
    if topic_id == ZERO_UUID:
        raise CorruptRecordError(f"{what} line 2: the zero Uuid is not a topic id")
    return topic_id


def format_partition_metadata(topic_id: str) -> str:
    """What ``PartitionMetadataFile`` writes: two lines and, unlike the checkpoints, no final
    newline."""
    topic_id = topic_id_from_bytes(topic_id_to_bytes(topic_id))
    if topic_id == ZERO_UUID:
        raise InvalidRequestError("the zero Uuid is not a topic id")
    return f"version: {PARTITION_METADATA_VERSION}\ntopic_id: {topic_id}"


# -- meta.properties (java.util.Properties) -------------------------------------------------------

_PROP_WS = " \t\f"
_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}
_ESCAPE = re.compile(r"\\(u(.{0,4})|.)", re.S)
_HEX4 = re.compile(r"[0-9a-fA-F]{4}\Z")
_SAVE_ESCAPES = {"\t": "\\t", "\n": "\\n", "\r": "\\r", "\f": "\\f", "\\": "\\\\",
                 "=": "\\=", ":": "\\:", "#": "\\#", "!": "\\!"}
_DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_JAVA_TRIM = "".join(map(chr, range(33)))  # String.trim drops every char <= ' '
_KAFKA_KEY_ORDER = ("version", "cluster.id", "node.id", "broker.id", "directory.id")


def _unescape(s: str, where: str) -> str:
    def one(m: re.Match) -> str:
        if m[2] is None:
            return _ESCAPES.get(m[1], m[1])  # \t \n \r \f; any other escaped char is itself
        if not _HEX4.match(m[2]):
            raise CorruptRecordError(f"{where}: malformed \\uxxxx escape")
        return chr(int(m[2], 16))
    return _ESCAPE.sub(one, s)


def parse_properties(text: str) -> dict[str, str]:
    """``java.util.Properties.load``: comments, continuations, ``=``/``:``/blank separators,
    escapes.

    Kafka loads ``meta.properties`` from a byte stream, which Java decodes as ISO-8859-1; decode the
    file's bytes that way before calling this. A repeated key keeps its first position and its last
    value.
    """
    natural = _lines(text)
    props: dict[str, str] = {}
    i = 0
    while i < len(natural):
        start = i + 1
        line = natural[i].lstrip(_PROP_WS)
        i += 1
        if not line or line[0] in "#!":
            continue
        pieces = []
        while True:  # an odd run of trailing backslashes continues the logical line
            if (len(line) - len(line.rstrip("\\"))) % 2 == 0:
                pieces.append(line)
                break
            pieces.append(line[:-1])  # at end of text Java drops the dangling backslash too
            if i >= len(natural):
                break
            line = natural[i].lstrip(_PROP_WS)
            i += 1
        line = "".join(pieces)
        key_end = value_start = len(line)
        has_sep, escaped = False, False
        for j, c in enumerate(line):
            if not escaped and c in "=:" + _PROP_WS:
                key_end, value_start, has_sep = j, j + 1, c in "=:"
                break
            escaped = c == "\\" and not escaped
        while value_start < len(line):
            c = line[value_start]
            if c not in _PROP_WS:
                if has_sep or c not in "=:":
                    break
                has_sep = True
            value_start += 1
        where = f"properties line {start}"
        props[_unescape(line[:key_end], where)] = _unescape(line[value_start:], where)
    return props


def _save_convert(s: str, is_key: bool) -> str:
    # Properties.store to a Writer: no \uXXXX escapes, spaces escaped in keys and leading in values.
    return "".join("\\ " if c == " " and (is_key or j == 0) else _SAVE_ESCAPES.get(c, c)
                   for j, c in enumerate(s))


def _check_meta(props: Mapping[str, str], error) -> None:
    """The checks of Kafka's ``MetaProperties.Builder``, so we never accept or write a file that
    the broker would refuse to start with."""
    raw = props.get("version", "0")
    if not _JAVA_INT.match(raw.strip(_JAVA_TRIM)):  # Kafka trims the version, and only it
        raise error(f"meta.properties: version {raw!r} is not a number")
    if (version := int(raw.strip(_JAVA_TRIM))) not in (0, 1):
        raise UnsupportedVersionError(f"meta.properties: unknown version {version}")
    id_key = "broker.id" if version == 0 else "node.id"
    for key in ("node.id", "cluster.id") if version == 1 else ():
        if key not in props:
            raise error(f"meta.properties: version 1 requires {key}")
    if id_key in props and not (_JAVA_INT.match(props[id_key])
                                and _INT32[0] <= int(props[id_key]) <= _INT32[1]):
        raise error(f"meta.properties: {id_key} {props[id_key]!r} is not a 32-bit integer")
    if "directory.id" in props and not _UUID_TEXT.match(props["directory.id"]):
        raise error(f"meta.properties: directory.id {props['directory.id']!r} is not a Uuid")


def parse_meta_properties(text: str) -> dict[str, str]:
    """:func:`parse_properties` plus the checks Kafka applies when a broker loads the file."""
    props = parse_properties(text)
    _check_meta(props, CorruptRecordError)
    return props


def java_date(when: _dt.datetime | None = None) -> str:
    """``java.util.Date.toString`` in UTC, e.g. ``Thu Sep 12 10:15:30 UTC 2024``: the second
    comment line ``Properties.store`` writes."""
    when = (when or _dt.datetime.now(_dt.timezone.utc)).astimezone(_dt.timezone.utc)
    return (f"{_DAYS[when.weekday()]} {_MONTHS[when.month - 1]} {when.day:02d} "
            f"{when:%H:%M:%S} UTC {when.year}")


def _hash_order(keys: list[str]) -> list[str]:
    """Iteration order of the ConcurrentHashMap behind Properties on JDK <= 17 (16 buckets)."""
    if len(keys) > 11:  # the 12th key resizes the table, which reshuffles buckets
        raise InvalidRequestError("hash key order is only emulated for up to 11 properties")
    buckets: dict[int, list[str]] = {}
    for key in keys:
        h, raw = 0, key.encode("utf-16-be")
        for i in range(0, len(raw), 2):  # String.hashCode runs over UTF-16 code units
            h = (31 * h + (raw[i] << 8 | raw[i + 1])) & 0xFFFFFFFF
        buckets.setdefault((h ^ (h >> 16)) & 15, []).append(key)
    if any(len(b) > 8 for b in buckets.values()):  # a 9th key in one bin also resizes
        raise InvalidRequestError("hash key order cannot be emulated for these keys")
    return [k for b in sorted(buckets) for k in buckets[b]]


def format_meta_properties(props: Mapping[str, str | int], comment_time: str | None = None, *,
                           key_order: str = "sorted") -> str:
    """The ``meta.properties`` text Kafka writes (``Properties.store(writer, "")``).

    Layout: ``#`` (the empty comment), ``#`` + date, then ``key=value`` lines. ``comment_time``
    is the date text (default: now, as :func:`java_date`). The entry order depends on the broker's
    JVM, not on Kafka: JDK 18 and later sort by key (``key_order="sorted"``, also the official
    Docker image's JDK 21); JDK 11 and 17 write hash-table order (``key_order="hash"``, e.g.
    ``node.id, directory.id, version, cluster.id``).
    """
    values: dict[str, str] = {}
    for key, value in props.items():
        if not isinstance(key, str):
            raise InvalidRequestError(f"property key {key!r} is not a string")
        values[key] = str(_int(value, _INT64, key)) if not isinstance(value, str) else value
    _check_meta(values, InvalidRequestError)
    if comment_time is None:
        comment_time = java_date()
    if "\n" in comment_time or "\r" in comment_time:
        raise InvalidRequestError("comment_time must be a single line")
    # Properties.writeComments writes characters beyond Latin-1 as \uXXXX.
    comment_time = "".join(c if ord(c) <= 0xFF else f"\\u{ord(c):04X}" for c in comment_time)
    if key_order == "sorted":
        keys = sorted(values, key=lambda k: k.encode("utf-16-be"))  # String.compareTo order
    elif key_order == "hash":
        # Kafka's MetaProperties.toProperties inserts its keys in this order; it decides the order
        # inside a bucket.
        keys = _hash_order(sorted(values, key=lambda k: (
            _KAFKA_KEY_ORDER.index(k) if k in _KAFKA_KEY_ORDER else len(_KAFKA_KEY_ORDER))))
    else:
        raise InvalidRequestError(f"key_order must be 'sorted' or 'hash', not {key_order!r}")
    body = "".join(f"{_save_convert(k, True)}={_save_convert(values[k], False)}\n" for k in keys)
    return f"#\n#{comment_time}\n{body}"


__all__ = [
    "CHECKPOINT_VERSION", "PARTITION_METADATA_VERSION", "ZERO_UUID", "METADATA_TOPIC_ID",
    "EpochEntry", "validate_topic_name", "parse_offset_checkpoint", "format_offset_checkpoint",
    "parse_leader_epoch_checkpoint", "format_leader_epoch_checkpoint", "topic_id_to_bytes",
    "topic_id_from_bytes", "new_topic_id", "parse_partition_metadata", "format_partition_metadata",
    "parse_properties", "parse_meta_properties", "format_meta_properties", "java_date",
]
