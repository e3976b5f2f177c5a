"""The names of a partition directory's segment files, as Kafka's ``LogFileUtils`` has them:
``<base offset, 20 digits>.<suffix>``. One home for the pattern, because every module that
lists a partition directory (the log, maintenance, the Spark sink's cleanup, the replicator)
needs it, and four copies had drifted (one without ``.txnindex``)."""
from __future__ import annotations

import re
from typing import Optional, Tuple

LOG_SUFFIX, INDEX_SUFFIX, TIMEINDEX_SUFFIX, TXNINDEX_SUFFIX = (".log", ".index", ".timeindex",
                                                               ".txnindex")
_SEGMENT_FILE = re.compile(r"^(\d{20})\.(log|index|timeindex|txnindex)$")


def segment_name(base_offset: int, suffix: str) -> str:
    return f"{base_offset:020d}{suffix}"


def parse_segment_file(name: str) -> Optional[Tuple[int, str]]:
    """``(base offset, kind)`` of a segment file's name, kind one of ``log``, ``index``,
    ``timeindex``, ``txnindex``; None for any other name (temp files, checkpoints, ...)."""
    m = _SEGMENT_FILE.match(name)
    return (int(m.group(1)), m.group(2)) if m else None


def log_file_base(name: str) -> Optional[int]:
    """The base offset of a ``.log`` file's name, else None."""
    parsed = parse_segment_file(name)
    return parsed[0] if parsed is not None and parsed[1] == "log" else None
