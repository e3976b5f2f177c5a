"""Reading a cluster: resolve where to start, list offsets, fetch committed records.

A fetch reads exactly what docs/protocol.md §4 lets a reader see, from the segments the
metadata state selects; a segment deleted under the reader is an OFFSET_OUT_OF_RANGE, never a
silently shorter answer.
"""
from __future__ import annotations

from typing import Iterator, List, Optional, Tuple, Union

from ..errors import InvalidConfigError, OffsetOutOfRangeError, StorageNotFoundError
from ..format.columnar import Columns
from ..format.records import DecodedRecord
from .cluster import PartitionView
from .repair import names_damaged_segments

EARLIEST, LATEST = "earliest", "latest"
StartSpec = Union[str, int, Tuple[str, int]]


def parse_start(text: str) -> StartSpec:
    """CLI form: ``earliest``, ``latest``, an offset, or ``@<timestamp ms>``."""
    text = str(text).strip()
    if text in (EARLIEST, LATEST):
        return text
    if text.startswith("@"):
        try:
            return ("timestamp", int(text[1:]))
        except ValueError:
            raise InvalidConfigError(f"invalid timestamp in {text!r}: expected @<ms>") from None
    try:
        return int(text)
    except ValueError:
        raise InvalidConfigError(f"invalid start {text!r}: expected earliest, latest, an offset "
                                 "or @<timestamp ms>") from None


def resolve_offset(view: PartitionView, spec: StartSpec) -> Tuple[int, int]:
    """``(offset, timestamp)`` for a start spec (timestamp -1 unless found by time)."""
    if spec == EARLIEST:
        return view.log_start_offset, -1
    if spec == LATEST:
        return view.high_watermark, -1
    if isinstance(spec, tuple) and spec[0] == "timestamp":
        found = view.log.offset_for_timestamp(spec[1])
        if found is None or found[0] >= view.high_watermark:
            return view.high_watermark, -1
        return found
    if isinstance(spec, int) and not isinstance(spec, bool):
        if not view.log_start_offset <= spec <= view.high_watermark:
            raise OffsetOutOfRangeError(
                f"offset {spec} is out of range for {view.topic}-{view.partition}: log start "
                f"offset {view.log_start_offset}, high watermark {view.high_watermark}")
        return spec, -1
    raise InvalidConfigError(f"invalid start offset spec {spec!r}")


def read_columns(view: PartitionView, start: int, end: Optional[int] = None, *,
                 max_records: Optional[int] = None, max_bytes: int = 1 << 20) -> Columns:
    try:
        return view.log.read_columns(start, end, max_records=max_records, max_bytes=max_bytes)
    except StorageNotFoundError as exc:
        raise OffsetOutOfRangeError(
            f"{view.topic}-{view.partition}: data at or after offset {start} was deleted while "
            f"being read ({exc})") from None


@names_damaged_segments
def iter_records(view: PartitionView, start: int, end: Optional[int] = None, *,
                 max_records: Optional[int] = None) -> Iterator[DecodedRecord]:
    """Committed records from ``start``, in offset order, at most ``max_records``."""
    from ..format.columnar import decode_records
    offset, left = start, max_records
    end = view.high_watermark if end is None else min(end, view.high_watermark)
    while offset < end and (left is None or left > 0):
        try:
            data, _ = view.log.read(offset, 1 << 20)
        except StorageNotFoundError as exc:
            raise OffsetOutOfRangeError(f"{view.topic}-{view.partition}: offset {offset} was "
                                        f"deleted while being read ({exc})") from None
        if not data:
            return
        rows: List[DecodedRecord] = decode_records(data, min_offset=offset, max_offset=end,
                                                   skip_control=True)
        if not rows:
            from ..format.batch import iter_headers
            last = None
            for h in iter_headers(data):
                last = h
            offset = max(offset + 1, last.last_offset + 1)
            continue
        for r in rows:
            if left is not None:
                if left <= 0:
                    return
                left -= 1
            yield r
        offset = rows[-1].offset + 1
