"""Rows to per-partition record batches as input batches come: the encoder of the Spark sink.

Kafka's producer appends every record to its partition's open batch and sends the batch when it
is full (``RecordAccumulator``). The sink does the same with whole Arrow batches of rows whose
partitions are known: :meth:`append` takes an input batch and each row's partition, and returns
the record batches that filled up; :meth:`drain` closes the rest at the end of a task.

Two implementations give the same batches:

* ``_encode_accel.Accumulator`` (C, magic 2): each record is written once, straight from the
  input batch while it is still in the CPU's caches, into the buffer its batch is sent from,
  behind room for the header; the CRC then runs in place. No row is copied before that.
* :class:`PieceAccumulator` (Python, every magic): buffers each partition's rows as pieces of
  the input batches and encodes a batch's worth at a time (``arrow_encode.encode_pieces``): the
  fallback without a compiler or with ``KAFKALOG_PURE_PYTHON=1``, and the reference.

The batch rule is ``arrow_encode.chunk_bounds``'s: at most ``batch.records`` records and, unless
one record is bigger, at most ``batch.size`` estimated bytes (``arrow_encode.estimated_sizes``).
A batch must also fit the topic's ``max.message.bytes``: the C accumulator closes a batch before
a record would take it past a bound (:func:`records_limit`); the Python one encodes first and
splits a batch that came out too big in halves. Only a single record too big for a batch of its
own is an error (``RecordTooLargeError``), as in Kafka.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import numpy as np
import pyarrow as pa

from ..format import codecs
from ..format import accel
from .arrow_encode import (EncodeInput, Piece, chunk_bounds, encode_pieces, estimated_sizes,
                           slice_pieces, v2_batch, v2_header)
from ..format.batch import V2_HEADER_SIZE
from ..format.encode import EncodedBatch, check_batch_size
from ..format.records import MAGIC_V2

#: The C accumulator, or None (no compiler, or ``KAFKALOG_PURE_PYTHON=1``); tests swap it.
_Accumulator = getattr(accel.ENCODE, "Accumulator", None)

Closed = Tuple[int, EncodedBatch]   # (partition, batch)


def records_limit(compression: int, max_message_bytes: int) -> int:
    """The most bytes of records a batch may hold so that, header included and however badly
    they compress, it stays within ``max_message_bytes``."""
    lo, hi = 0, max(max_message_bytes - V2_HEADER_SIZE, 0)
    while lo < hi:      # the largest n with header + max_compressed_size(n) <= the limit
        mid = (lo + hi + 1) // 2
        if V2_HEADER_SIZE + codecs.max_compressed_size(compression, mid) <= max_message_bytes:
            lo = mid
        else:
            hi = mid - 1
    return lo


class BatchAccumulator:
    """Magic 2 batches of one topic, built by the C accumulator."""

    def __init__(self, topic: str, partitions: int, *, compression: int,
                 level: Optional[int], batch_records: int, batch_size: int,
                 max_message_bytes: int, allocate=None):
        """``allocate``: where batch buffers come from (``pyarrow.allocate_buffer`` if None;
        the sink passes an ``arena.Arena``'s)."""
        codecs.check_codec(compression, MAGIC_V2)
        self.topic, self.compression, self.level = topic, compression, level
        self.max_message_bytes = max_message_bytes
        # at least 1: a record too big for any batch still gets one, and is refused below
        limit = max(records_limit(compression, max_message_bytes), 1)
        self._acc = _Accumulator(partitions, batch_records, batch_size, min(limit, 2**31 - 1),
                                 V2_HEADER_SIZE, allocate or pa.allocate_buffer)

    def append(self, data: EncodeInput, part: np.ndarray,
               sizes: Optional[np.ndarray] = None) -> List[Closed]:
        """``sizes``: each row's ``estimated_sizes``, or None to have them computed (in C,
        in the same pass, when there are no headers)."""
        hrec, hcount = data.header_bytes()
        if sizes is None and hrec is not None:
            sizes = estimated_sizes(data.key, data.value, data.headers)
        return self._finish(self._acc.append(
            data.key, data.value, data.timestamps, hrec, hcount,
            np.ascontiguousarray(part, dtype=np.int64),
            None if sizes is None else np.ascontiguousarray(sizes, np.int64)))

    def drain(self) -> List[Closed]:
        return self._finish(self._acc.drain())

    @property
    def pending(self) -> int:
        return self._acc.pending

    def _finish(self, raw) -> List[Closed]:
        out = []
        for p, buf, end, count, base_ts, max_ts in raw:
            view = memoryview(buf).cast("B")[:end]
            if self.compression:
                payload = codecs.compress(self.compression, view[V2_HEADER_SIZE:], MAGIC_V2,
                                          level=self.level)
                batch = v2_batch(payload, count, base_ts, max_ts, self.compression)
            else:
                batch = v2_header(view, count, base_ts, max_ts, self.compression)
            # records_limit bounds every batch of more than one record: only one record can fail
            check_batch_size(batch, self.max_message_bytes, f"{self.topic}-{p}")
            out.append((p, batch))
        return out


@dataclass
class _Rows:
    pieces: List[Piece] = field(default_factory=list)
    sizes: List[np.ndarray] = field(default_factory=list)
    rows: int = 0
    nbytes: int = 0


class PieceAccumulator:
    """The same batches for every magic, from pieces of the input batches (no copy of a row
    until its batch is encoded)."""

    def __init__(self, topic: str, partitions: int, *, magic: int, compression: int,
                 level: Optional[int], batch_records: int, batch_size: int,
                 max_message_bytes: int):
        codecs.check_codec(compression, magic)
        self.topic, self.magic, self.compression, self.level = topic, magic, compression, level
        self.batch_records, self.batch_size = batch_records, batch_size
        self.max_message_bytes = max_message_bytes
        self.partitions = partitions
        self._rows: Dict[int, _Rows] = {}

    @property
    def pending(self) -> int:
        return sum(r.rows for r in self._rows.values())

    def append(self, data: EncodeInput, part: np.ndarray,
               sizes: Optional[np.ndarray] = None) -> List[Closed]:
        if sizes is None:
            sizes = estimated_sizes(data.key, data.value, data.headers)
        part = np.asarray(part, dtype=np.int64)
        bad = (part < 0) | (part >= self.partitions)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(f"row {i} has partition {int(part[i])}, not "
                             f"0..{self.partitions - 1}")
        n = len(part)
        out: List[Closed] = []
        if n == 0:
            return out
        if (part == part[0]).all():      # one partition (e.g. after the shuffle helper)
            self._add(int(part[0]), Piece(data, None), sizes, out)
            return out
        # numpy's stable sort is a radix sort for 16-bit keys: partitions nearly always fit
        order = np.argsort(part.astype(np.int16) if self.partitions <= 32767 else part,
                           kind="stable")
        sorted_part = part[order]
        osizes = np.asarray(sizes, dtype=np.int64)[order]
        cuts = np.flatnonzero(np.diff(sorted_part)) + 1
        starts = np.concatenate([[0], cuts]).tolist()
        ends = np.concatenate([cuts, [n]]).tolist()
        for a, b in zip(starts, ends):
            self._add(int(sorted_part[a]), Piece(data, order[a:b]), osizes[a:b], out)
        return out

    def drain(self) -> List[Closed]:
        out: List[Closed] = []
        for p in sorted(self._rows):
            self._encode(p, out, keep_tail=False)
        return out

    def _add(self, p: int, piece: Piece, sizes: np.ndarray, out: List[Closed]) -> None:
        buf = self._rows.setdefault(p, _Rows())
        buf.pieces.append(piece)
        buf.sizes.append(sizes)
        buf.rows += len(piece)
        buf.nbytes += int(sizes.sum())
        if buf.rows >= self.batch_records or buf.nbytes >= self.batch_size:
            self._encode(p, out, keep_tail=True)

    def _encode(self, p: int, out: List[Closed], keep_tail: bool) -> None:
        buf = self._rows.pop(p, None)
        if buf is None or not buf.rows:
            return
        sizes = np.concatenate(buf.sizes) if len(buf.sizes) > 1 else buf.sizes[0]
        bounds = chunk_bounds(sizes, self.batch_size, self.batch_records)
        if keep_tail and len(bounds) > 1 and bounds[-1] - bounds[-2] < self.batch_records and \
                int(sizes[bounds[-2]:].sum()) < self.batch_size:
            tail = bounds.pop()   # the last chunk is not full: keep buffering it
            cut = bounds[-1]
            self._rows[p] = _Rows(slice_pieces(buf.pieces, cut, tail), [sizes[cut:]],
                                  tail - cut, int(sizes[cut:].sum()))
        if len(bounds) >= 2:
            out.extend((p, b) for b in self._encode_range(
                slice_pieces(buf.pieces, 0, bounds[-1]), bounds, p))

    def _encode_range(self, pieces: List[Piece], bounds: List[int],
                      p: int) -> List[EncodedBatch]:
        batches = encode_pieces(pieces, bounds, magic=self.magic, compression=self.compression,
                                level=self.level)
        result = []
        for (a, b), batch in zip(zip(bounds[:-1], bounds[1:]), batches):
            if len(batch.data) <= self.max_message_bytes or b - a == 1:
                # a record too big for a batch of its own is refused here
                check_batch_size(batch, self.max_message_bytes, f"{self.topic}-{p}")
                result.append(batch)
            else:   # split the batch in two, as a producer would with a smaller batch.size
                mid = (a + b) // 2
                result += self._encode_range(slice_pieces(pieces, a, b), [0, mid - a, b - a],
                                             p)
        return result


def new_accumulator(topic: str, partitions: int, *, magic: int, compression: int,
                    level: Optional[int], batch_records: int, batch_size: int,
                    max_message_bytes: int, allocate=None):
    """The C accumulator for magic 2 when it is built, else the Python one. ``allocate``: the
    C accumulator's batch buffers (see :class:`BatchAccumulator`); the Python one ignores it."""
    kw = dict(compression=compression, level=level, batch_records=batch_records,
              batch_size=batch_size, max_message_bytes=max_message_bytes)
    if _Accumulator is not None and magic == MAGIC_V2:
        return BatchAccumulator(topic, partitions, allocate=allocate, **kw)
    return PieceAccumulator(topic, partitions, magic=magic, **kw)
