"""The two checksums of Kafka's formats: CRC32 (magic 0/1) and CRC32C (magic 2)."""
from __future__ import annotations

import zlib

#: ``package_crc32c``: the crc32c package's own function, or None on a broken install (the
#: package is a runtime dependency; None only keeps imports working). The C reader
#: (``arrow_decode``) calls it directly, without the check in :func:`crc32c`.
try:
    from crc32c import crc32c as package_crc32c
except ImportError:  # pragma: no cover - exercised only on a broken install
    package_crc32c = None


def crc32(data) -> int:
    return zlib.crc32(data) & 0xFFFFFFFF


def crc32c(data, value: int = 0) -> int:
    """CRC32C of ``data``; ``value`` continues a CRC of the bytes before it."""
    if package_crc32c is None:
        from ..errors import UnsupportedCodecError
        raise UnsupportedCodecError("the 'crc32c' package is required for magic 2 batches: "
                                    "pip install crc32c")
    return package_crc32c(data, value)
