"""Types of the C extension ``_encode_accel`` (``_encode_accel.c`` and its headers): the C twin
of the magic 2 records builder, the sink's accumulator and Kafka's murmur2 partitioner over a
column. Loaded only by ``format/accel.py``; ``tests/format/test_accel_switch.py`` checks that these
are exactly the names the built extension exports."""
from typing import Callable, List, Optional, Tuple

import numpy as np
import pyarrow as pa

#: A closed batch: ``(partition, buffer, end, count, base_timestamp, max_timestamp)``; its
#: records are ``buffer[room:end]``, the ``room`` bytes in front are for the batch header.
ClosedBatch = Tuple[int, pa.Buffer, int, int, int, int]


def encode_v2_records(key: pa.Array, value: pa.Array, timestamps: np.ndarray,
                      bounds: np.ndarray, hrec: Optional[pa.Array], hcount: Optional[np.ndarray],
                      allocate: Callable[[int], pa.Buffer], /) -> Tuple[pa.Buffer, pa.Buffer]:
    """The records sections of the batches ``[bounds[i], bounds[i+1])``, back to back:
    ``(int64 offsets of each record, data)``; ``InvalidRecordError`` at 2**31 bytes."""


def murmur2_hashes(keys: pa.Array, out: np.ndarray, /) -> None:
    """Kafka's ``Utils.murmur2`` of every key into ``out`` (uint32 or int32); a null hashes
    as the empty key."""


def murmur2_partitions(keys: pa.Array, num_partitions: int, out: np.ndarray, /) -> None:
    """``toPositive(murmur2(key)) % num_partitions`` of every key into ``out`` (int64)."""


class Accumulator:
    """One open magic 2 batch per partition, filled as rows come (Kafka's
    ``RecordAccumulator``)."""

    def __init__(self, partitions: int, batch_records: int, batch_size: int, max_bytes: int,
                 room: int, allocate: Callable[[int], pa.Buffer]) -> None: ...

    def append(self, key: pa.Array, value: pa.Array, timestamps: np.ndarray,
               hrec: Optional[pa.Array], hcount: Optional[np.ndarray], partitions: np.ndarray,
               sizes: Optional[np.ndarray], /) -> List[ClosedBatch]:
        """Appends each row to its partition's open batch; returns the batches that closed."""

    def drain(self) -> List[ClosedBatch]:
        """Closes every open batch, by partition."""

    @property
    def pending(self) -> int:
        """Records in open batches."""


def key_digests(offsets, data, out, /) -> None:
    """MurmurHash3_x64_128 (seed 0) of each key ``data[offsets[i]:offsets[i+1]]`` (int64
    offsets, ``n + 1`` of them) into ``out`` (``2 * n`` uint64: high, low per key)."""


def offset_map_put(table, digests, offsets, entries: int, max_entries: int, /) -> Tuple[int, int]:
    """Put digests (``(n, 2)`` uint64) with their offsets (int64) into the offset map's table
    (``(slots, 3)`` int64), in order; stops before a new digest once ``max_entries`` are held.
    Returns ``(number put, entries now)``."""


def offset_map_get(table, digests, out, /) -> None:
    """Each digest's offset in the table into ``out`` (int64), -1 where absent."""


def filter_v2_records(records, count: int, keep, ts_shift: int, /) -> bytes:
    """The kept records (``keep``: uint8 per record) of an uncompressed magic 2 records
    section, their timestamp deltas lowered by ``ts_shift``."""
