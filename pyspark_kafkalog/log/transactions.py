"""Kafka transactions in a log Kafka wrote: which transactional data was aborted, and where the
last stable offset is.

A transactional producer writes data batches (``isTransactional``) and then one control batch
(a COMMIT or ABORT marker) per partition. A data batch of producer P is *aborted* iff the next
control record of P after it is an ABORT. Brokers keep this in ``.txnindex`` files and producer
snapshots; a copied log dir may have neither, so we derive it from the log itself:

* only batch *headers* are walked (the offset index gets us to the start, windows of about
  ``index.interval.bytes`` carry us forward), and only control batches, a few dozen bytes each,
  are read whole and decoded;
* a transaction still open at the end of the requested range is followed past the end until its
  marker, so a range that ends mid-transaction still knows the transaction's fate;
* a transaction with no marker before the high watermark is still open: Kafka's last stable
  offset (LSO) is the first offset of the earliest such transaction, and ``read_committed``
  consumers never read at or past it.

Known limit: the walk starts at the range's start, so a transaction that began *before* it and
never wrote inside it is not seen; if it is still open, Kafka's LSO would be below the start
(and a read_committed consumer would get nothing) while we return the range.

The kafkalog cluster protocol never writes Kafka transactional batches (its atomicity comes from
the metadata log, docs/protocol.md §3), so this is only needed for logs Kafka wrote.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Dict, List, Sequence, Tuple

from ..errors import CorruptRecordError
from ..format.batch import BatchHeader
from ..format.columnar import decode_records

CONTROL_ABORT = 0
CONTROL_COMMIT = 1
_CONTROL_KEY = struct.Struct(">hh")   # version int16, type int16

#: (producer id, first offset of the aborted data, offset of the ABORT marker)
AbortedRange = Tuple[int, int, int]


def control_type(entry: bytes) -> int:
    """The type (ABORT 0, COMMIT 1) of the control record in one whole control batch."""
    records = decode_records(entry)
    if not records or records[0].key is None or len(records[0].key) < _CONTROL_KEY.size:
        raise CorruptRecordError("control batch without a valid control record key")
    return _CONTROL_KEY.unpack_from(records[0].key)[1]


@dataclass
class TxnScan:
    """What a walk over ``[start, end)`` (and past it, for open transactions) found."""

    start: int
    end: int
    limit: int
    aborted: List[AbortedRange] = field(default_factory=list)
    #: producer id -> first offset (>= start) of its transaction still open at ``limit``
    open: Dict[int, int] = field(default_factory=dict)

    @property
    def last_stable_offset(self) -> int:
        """Where read_committed must stop: the first offset of the earliest open transaction."""
        return min(self.open.values(), default=self.limit)

    def aborted_in(self, start: int, end: int) -> List[AbortedRange]:
        """The aborted ranges that touch ``[start, end)``."""
        return [r for r in self.aborted if r[1] < end and r[2] > start]


class TxnTracker:
    """Feed it entry headers in log order; it pairs transactional data with its marker."""

    def __init__(self, start: int, end: int):
        self.start, self.end = start, end
        self.open: Dict[int, int] = {}
        self.aborted: List[AbortedRange] = []

    def feed(self, header: BatchHeader, read_body) -> None:
        """``read_body()`` returns the entry's bytes; it is called for control batches only."""
        if header.magic < 2 or header.last_offset < self.start:
            return
        pid = header.producer_id
        if header.is_control:
            first = self.open.pop(pid, None)
            if first is not None and control_type(read_body()) == CONTROL_ABORT:
                self.aborted.append((pid, first, header.base_offset))
        elif header.is_transactional and header.base_offset < self.end:
            self.open.setdefault(pid, max(header.base_offset, self.start))

    def done(self, next_base_offset: int) -> bool:
        """Past the range with nothing left undecided: nothing further can matter."""
        return next_base_offset >= self.end and not self.open


def scan_transactions(log, start: int, end: int, limit: int) -> TxnScan:
    """Walk ``log`` (a :class:`~pyspark_kafkalog.log.partition.PartitionLog`) from ``start``:
    the aborted ranges touching ``[start, end)`` and the transactions still open at ``limit``
    (the high watermark). Reads headers only, plus the bytes of control batches."""
    tracker = TxnTracker(start, end)
    segments = log.segments
    i = log.segment_for(start) or 0
    finished = start >= end
    while not finished and i < len(segments):
        seg = segments[i]
        i += 1
        if seg.base_offset >= limit or tracker.done(seg.base_offset):
            break
        if i < len(segments) and segments[i].base_offset <= start:
            continue
        entry = seg.lookup(max(start, seg.base_offset))
        for header, _ in seg._walk_from_entry(entry):
            if header.last_offset < start:
                continue
            if header.base_offset >= limit or tracker.done(header.base_offset):
                finished = True
                break
            tracker.feed(header, lambda h=header, s=seg: s.read(h.position, h.end))
    return TxnScan(start, end, limit, tracker.aborted, tracker.open)


def aborted_mask(producer_ids, offsets, transactional, aborted: Sequence[AbortedRange]):
    """numpy bool mask of the rows that belong to aborted transactions."""
    import numpy as np

    mask = np.zeros(len(offsets), dtype=bool)
    for pid, first, marker in aborted:
        mask |= (producer_ids == pid) & (offsets >= first) & (offsets < marker)
    return mask & transactional
