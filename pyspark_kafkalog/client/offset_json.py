"""kafka-delete-records.sh's ``--offset-json-file``, read and checked in one place so that
``kafkalog delete-records`` and ``jobs/delete_records.py`` accept and refuse the same files."""
from __future__ import annotations

import json
import sys
from typing import List, Tuple

from ..errors import InvalidConfigError

OFFSET_FILE_EXAMPLE = '{"partitions": [{"topic": "t", "partition": 0, "offset": 3}], "version": 1}'

OffsetEntries = List[Tuple[Tuple[str, int], int]]


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def load_offset_json(path: str) -> OffsetEntries:
    """Read the file (``-``: stdin) and check it (parse_offset_json); an unreadable file is an
    InvalidConfigError too, so both callers report it as a user error."""
    where = "--offset-json-file " + ("(stdin)" if path == "-" else path)
    try:
        if path == "-":
            text = sys.stdin.read()
        else:
            with open(path, encoding="utf-8") as f:
                text = f.read()
    except OSError as exc:
        raise InvalidConfigError(f"cannot read {where}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise InvalidConfigError(f"{where}: not UTF-8 text") from None
    return parse_offset_json(text, where)


def parse_offset_json(text: str, where: str = "offset JSON") -> OffsetEntries:
    """kafka-delete-records.sh's format as ``[((topic, partition), offset)]`` in file order.
    ``version`` may be left out (Kafka reads it as 1); anything else wrong is an
    InvalidConfigError naming the field: a missing or misspelt key, a non-integer partition or
    offset, an empty list, a partition listed twice (Kafka's rule too)."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidConfigError(f"{where}: not valid JSON ({exc.msg} at line {exc.lineno} "
                                 f"column {exc.colno}); expected {OFFSET_FILE_EXAMPLE}") from None
    if not isinstance(doc, dict):
        raise InvalidConfigError(f"{where}: expected a JSON object like {OFFSET_FILE_EXAMPLE}")
    unknown = sorted(set(doc) - {"partitions", "version"})
    if unknown:
        raise InvalidConfigError(f"{where}: unknown field(s) {', '.join(unknown)}")
    version = doc.get("version", 1)
    if not _is_int(version) or version != 1:
        raise InvalidConfigError(f"{where}: unsupported version {version!r} (only 1)")
    if "partitions" not in doc:
        raise InvalidConfigError(f"{where}: missing the \"partitions\" list")
    parts = doc["partitions"]
    if not isinstance(parts, list):
        raise InvalidConfigError(f"{where}: \"partitions\" must be a list")
    if not parts:
        raise InvalidConfigError(f"{where}: \"partitions\" is empty: nothing to delete")
    out, seen = [], {}
    for i, e in enumerate(parts):
        at = f"{where}: partitions[{i}]"
        if not isinstance(e, dict):
            raise InvalidConfigError(f"{at}: expected an object {{\"topic\", \"partition\", "
                                     "\"offset\"}")
        unknown = sorted(set(e) - {"topic", "partition", "offset"})
        if unknown:
            raise InvalidConfigError(f"{at}: unknown field(s) {', '.join(unknown)}")
        for name in ("topic", "partition", "offset"):
            if name not in e:
                raise InvalidConfigError(f"{at}: missing \"{name}\"")
        if not isinstance(e["topic"], str) or not e["topic"]:
            raise InvalidConfigError(f"{at}: \"topic\" must be a non-empty string")
        if not _is_int(e["partition"]):
            raise InvalidConfigError(f"{at}: \"partition\" must be an integer")
        if not _is_int(e["offset"]):
            raise InvalidConfigError(f"{at}: \"offset\" must be an integer (-1: the high "
                                     "watermark)")
        tp = (e["topic"], e["partition"])
        if tp in seen:
            raise InvalidConfigError(f"{at}: {tp[0]}-{tp[1]} is listed twice (first at "
                                     f"partitions[{seen[tp]}])")
        seen[tp] = i
        out.append((tp, e["offset"]))
    return out
