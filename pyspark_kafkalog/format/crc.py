"""The two checksums of Kafka's formats: CRC32 (magic 0/1) and CRC32C (magic 2)."""
from __future__ import annotations

import zlib

try:  # the crc32c package is a runtime dependency; the fallback only keeps imports working
    from crc32c import crc32c as _crc32c
except ImportError:  # pragma: no cover - exercised only on a broken install
    _crc32c = None


def crc32(data) -> int:
    return zlib.crc32(data) & 0xFFFFFFFF


def crc32c(data, value: int = 0) -> int:
    """CRC32C of ``data``; ``value`` continues a CRC of the bytes before it."""
    if _crc32c is None:
        from ..errors import UnsupportedCodecError
        raise UnsupportedCodecError("the 'crc32c' package is required for magic 2 batches: "
                                    "pip install crc32c")
    return _crc32c(data, value)
