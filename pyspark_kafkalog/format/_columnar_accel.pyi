"""Types of the C extension ``_columnar_accel`` (``_columnar_accel.c``, ``_columnar_arrow.c``):
the C twin of the magic 2 record loop and the Spark reader's route into Arrow buffers. Loaded
only by ``format/accel.py``; ``tests/format/test_accel_switch.py`` checks that these are exactly the
names the built extension exports."""
from typing import Callable, Optional, Tuple

import pyarrow as pa
from _typeshed import ReadableBuffer

from .columnar import Columns

#: ``(rows, key nulls, value nulls, headers, header value nulls, buffers)``; the 15 buffers in
#: the order offset, timestamp (us), timestampType (int32), key validity, key offsets (int32),
#: key data, the same for value, then the headers' list offsets, key offsets, key data, value
#: validity, value offsets, value data (None where a column has none, e.g. without headers).
ArrowRun = Tuple[int, int, int, int, int, Tuple[Optional[pa.Buffer], ...]]


def scan_v2(blob: ReadableBuffer, count: int, base_offset: int, base_timestamp: int,
            timestamp_type: int, max_timestamp: int, cols: Columns, with_headers: bool,
            /) -> None:
    """Appends ``count`` records of a decompressed records section to ``cols``; raises
    ``CorruptRecordError`` where ``_columnar_py.scan_v2`` does, leaving ``cols`` unchanged."""


def scan_run_arrow(buf: ReadableBuffer, with_headers: bool,
                   allocate: Callable[[int], pa.Buffer],
                   crc32c: Callable[[memoryview], int],
                   decompress: Callable[[int, memoryview], ReadableBuffer],
                   lz4_into: Optional[Callable[[memoryview, memoryview, int], int]],
                   /) -> Optional[ArrowRun]:
    """Every whole magic 2 batch of ``buf`` decoded into Spark's Arrow layout, or None when the
    run is not for this route (the general decoder then gives the rows or the error)."""
