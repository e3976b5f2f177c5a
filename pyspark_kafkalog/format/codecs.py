"""Kafka's record compression codecs, byte-compatible with the Java client.

Kafka does not use the codecs' "standard" containers everywhere: snappy is wrapped in
snappy-java's xerial stream framing, and lz4 is a restricted LZ4 frame whose header checksum is
deliberately wrong for message format v0. Reading what the broker stored, and writing what its
readers accept, therefore needs the framing done here; the libraries only supply raw blocks.

Codec libraries are imported on first use so a missing optional dependency only disables its own
codec. Decompression is on the read hot path: inputs may be memoryviews (slices of a mapped
segment) and are never copied before decoding; every failure surfaces as
:class:`CorruptRecordError`, and output is capped so a hostile payload cannot exhaust memory.
"""
from __future__ import annotations

import importlib
import struct
import threading
import zlib

from pyspark_kafkalog.errors import (CorruptRecordError, InvalidConfigError, KafkaLogError,
                                     UnsupportedCodecError)

NONE, GZIP, SNAPPY, LZ4, ZSTD = 0, 1, 2, 3, 4
CODEC_NAMES = {NONE: "none", GZIP: "gzip", SNAPPY: "snappy", LZ4: "lz4", ZSTD: "zstd"}
_CODEC_IDS = {name: cid for cid, name in CODEC_NAMES.items()}
_CODEC_IDS["uncompressed"] = NONE

#: Default cap on decompressed size. A batch's length field is an int32, so nothing larger can
#: ever be a legitimate batch; the cap turns decompression bombs into CorruptRecordError.
MAX_OUTPUT = (1 << 31) - 1

_BE_INT = struct.Struct(">i")
_LE_UINT = struct.Struct("<I")


def codec_id(name_or_id: str | int) -> int:
    """Map a config value (Kafka's ``compression.type`` spelling, or a numeric id) to an id."""
    if isinstance(name_or_id, int) and not isinstance(name_or_id, bool):
        if name_or_id in CODEC_NAMES:
            return name_or_id
    elif isinstance(name_or_id, str):
        cid = _CODEC_IDS.get(name_or_id.strip().lower())
        if cid is not None:
            return cid
    raise InvalidConfigError(
        f"unknown compression codec {name_or_id!r}; expected one of "
        f"{', '.join(sorted(_CODEC_IDS))} or an id 0-4")


# -- lazy library loading -------------------------------------------------------------------------

_LIBRARY = {SNAPPY: "cramjam", LZ4: "lz4.block", ZSTD: "zstandard"}
_PIP_NAME = {"cramjam": "cramjam", "lz4.block": "lz4", "zstandard": "zstandard", "xxhash": "xxhash"}
_loaded: dict[str, object] = {}
_MISSING = object()


def _import(name: str):
    # The single place a codec library is imported; tests replace it to simulate a missing one.
    return importlib.import_module(name)


def _lib(name: str, required: bool = True):
    """The imported library, or None for a missing optional one (misses are cached too)."""
    mod = _loaded.get(name)
    if mod is None:
        try:
            mod = _import(name)
        except ImportError as exc:
            if required:
                pip = _PIP_NAME.get(name, name)
                raise UnsupportedCodecError(
                    f"the {pip} library is not installed (pip install {pip})") from exc
            mod = _MISSING
        _loaded[name] = mod
    return None if mod is _MISSING else mod


def check_codec(codec: int, magic: int) -> None:
    """Fail early, with Kafka's UNSUPPORTED_COMPRESSION_TYPE, before any bytes are touched."""
    if codec not in CODEC_NAMES:
        raise UnsupportedCodecError(f"unknown compression codec id {codec!r}")
    if codec == ZSTD and magic < 2:
        raise UnsupportedCodecError(
            f"zstd compression needs message format v2 (magic 2), not magic {magic}")
    lib = _LIBRARY.get(codec)
    if lib is not None:
        try:
            _lib(lib)
        except UnsupportedCodecError as exc:
            raise UnsupportedCodecError(f"cannot use {CODEC_NAMES[codec]}: {exc}") from exc


def _byte_view(data) -> memoryview:
    view = data if isinstance(data, memoryview) else memoryview(data)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return view


# -- public entry points --------------------------------------------------------------------------

def compress(codec: int, data: bytes, magic: int = 2, *, level: int | None = None) -> bytes:
    """Compress one batch/wrapper payload the way Kafka's producer would for ``magic``.

    ``level`` follows KIP-390 (``compression.<codec>.level``); None means Kafka's default.
    """
    check_codec(codec, magic)
    if codec == NONE:
        return bytes(data)
    if codec == GZIP:
        # -1 is Deflater.DEFAULT_COMPRESSION, Kafka's default; wbits 31 writes a gzip member.
        return zlib.compress(data, -1 if level is None else level, 31)
    if codec == SNAPPY:
        return _snappy_compress(_byte_view(data))
    if codec == LZ4:
        return _lz4_compress(_byte_view(data), magic, level)
    return _zstd_compress(data, level)


def max_compressed_size(codec: int, n: int) -> int:
    """An upper bound of :func:`compress`'s output for ``n`` bytes of input, whatever they are:
    the sink keeps a batch of several records under ``max.message.bytes`` with it before it
    compresses (each codec's worst case: stored blocks, literals, block and frame headers)."""
    blocks = lambda size: -(-n // size) if n else 1   # noqa: E731
    if codec == NONE:
        return n
    if codec == GZIP:       # zlib's compressBound, and the gzip member's header and trailer
        return n + (n >> 12) + (n >> 14) + (n >> 25) + 13 + 18 + 64
    if codec == SNAPPY:     # xerial header; per block a length and snappy's 32 + n + n/6
        return n + n // 6 + 36 * blocks(_SNAPPY_BLOCK) + 16 + 64
    if codec == LZ4:        # frame header, a stored block's length, the end mark
        return n + 4 * blocks(_LZ4_BLOCK) + 19 + 4 + 64
    if codec == ZSTD:       # ZSTD_COMPRESSBOUND and a frame header
        return n + (n >> 8) + 64 + 18 + 64
    raise UnsupportedCodecError(f"unknown compression codec id {codec}")


def decompress(codec: int, data: bytes | memoryview, magic: int = 2, *,
               max_output: int = MAX_OUTPUT) -> bytes:
    """Decompress a payload as Kafka's reader would, accepting what Kafka accepts.

    Raises CorruptRecordError for anything undecodable or larger than ``max_output`` bytes.
    """
    check_codec(codec, magic)
    view = _byte_view(data)
    try:
        if codec == NONE:
            return data if type(data) is bytes else bytes(view)
        if codec == GZIP:
            return _gzip_decompress(view, max_output)
        if codec == SNAPPY:
            return _snappy_decompress(view, max_output)
        if codec == LZ4:
            return _lz4_decompress(view, magic, max_output)
        return _zstd_decompress(view, max_output)
    except (KafkaLogError, TypeError):
        raise
    except Exception as exc:  # zlib.error, cramjam/lz4/zstd errors, struct.error, ...
        raise CorruptRecordError(
            f"{CODEC_NAMES[codec]} payload does not decompress: {exc}") from exc


def decompress_into(codec: int, data: bytes | memoryview, magic: int, allocate, *,
                    max_output: int = MAX_OUTPUT):
    """:func:`decompress`, with the output in a buffer from ``allocate(n)`` where the codec
    allows (LZ4, block by block); other codecs return ``bytes`` as :func:`decompress` does.

    Why: readers hold a run of decompressed batches at once, and fresh ``bytes`` of that size
    are page-faulted in again for every run by the C allocator; a pool keeps its pages.
    Accepts exactly what :func:`decompress` accepts (error messages may differ)."""
    cramjam = _lib("cramjam", required=False) if codec == LZ4 else None
    into = getattr(getattr(cramjam, "lz4", None), "decompress_block_into", None)
    if into is None:   # another codec, or a cramjam without LZ4 blocks
        return decompress(codec, data, magic, max_output=max_output)
    check_codec(codec, magic)
    try:
        return _lz4_decompress_into(_byte_view(data), magic, max_output, allocate, into)
    except (KafkaLogError, TypeError):
        raise
    except Exception as exc:
        raise CorruptRecordError(f"lz4 payload does not decompress: {exc}") from exc


def _corrupt(codec: str, why: str) -> CorruptRecordError:
    return CorruptRecordError(f"{codec} payload does not decompress: {why}")


def _too_big(codec: str, limit: int) -> CorruptRecordError:
    return _corrupt(codec, f"output exceeds max_output={limit} bytes")


def _join(parts: list) -> bytes:
    return bytes(parts[0]) if len(parts) == 1 else b"".join(parts)  # bytes(bytes) is no copy


# -- gzip -----------------------------------------------------------------------------------------

def _gzip_decompress(view: memoryview, limit: int) -> bytes:
    """Like java.util.zip.GZIPInputStream: members are concatenated, and trailing bytes that do not
    start another member are ignored; a truncated member is an error."""
    parts, total, pos, n = [], 0, 0, len(view)
    while True:
        dec = zlib.decompressobj(31)
        out = dec.decompress(view[pos:], limit - total + 1)
        total += len(out)
        if total > limit:
            raise _too_big("gzip", limit)
        if not dec.eof:
            raise _corrupt("gzip", "truncated gzip stream")
        parts.append(out)
        rest = len(dec.unused_data)
        pos = n - rest
        if rest < 10 or view[pos:pos + 3] != b"\x1f\x8b\x08":
            break
    return _join(parts)


# -- snappy (snappy-java's xerial stream framing) -------------------------------------------------

_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = _XERIAL_MAGIC + struct.pack(">ii", 1, 1)  # format version 1, compatible with 1
_XERIAL_MAGIC_HEAD = _BE_INT.unpack(_XERIAL_MAGIC[:4])[0]   # a "chunk size" that is a new stream
_SNAPPY_BLOCK = 32 * 1024                                   # SnappyOutputStream.DEFAULT_BLOCK_SIZE
_SNAPPY_MAX_RATIO = 22  # no snappy element expands more than 64 bytes per 3 input bytes


def _snappy_compress(view: memoryview) -> bytes:
    snappy = _lib("cramjam").snappy
    parts = [_XERIAL_HEADER]
    for start in range(0, len(view), _SNAPPY_BLOCK):
        block = snappy.compress_raw(view[start:start + _SNAPPY_BLOCK])
        parts.append(_BE_INT.pack(len(block)))
        parts.append(block)
    return b"".join(parts)


def _snappy_raw(snappy, chunk: memoryview, budget: int):
    # Check the claimed length before cramjam allocates it: garbage can claim gigabytes.
    size = snappy.decompress_raw_len(chunk)
    if size > budget:
        raise _too_big("snappy", budget)
    if size > len(chunk) * _SNAPPY_MAX_RATIO + 8:
        raise _corrupt("snappy", f"block claims {size} bytes from {len(chunk)}")
    return snappy.decompress_raw(chunk), size


def _snappy_decompress(view: memoryview, limit: int) -> bytes:
    """Like SnappyInputStream: xerial framing when the magic is there (streams may be concatenated,
    and a partial trailing length is ignored), otherwise one raw snappy block."""
    snappy = _lib("cramjam").snappy
    n = len(view)
    if n < 16 or view[:8] != _XERIAL_MAGIC:
        if n == 0:
            raise _corrupt("snappy", "empty input")
        return bytes(_snappy_raw(snappy, view, limit)[0])
    parts, total, pos = [], 0, 16
    while n - pos >= 4:
        size = _BE_INT.unpack_from(view, pos)[0]
        pos += 4
        if size == _XERIAL_MAGIC_HEAD:
            if n - pos < 12:
                raise _corrupt("snappy", "truncated header of a concatenated stream")
            if view[pos - 4:pos + 4] != _XERIAL_MAGIC:
                break  # SnappyInputStream ends the stream here
            if _BE_INT.unpack_from(view, pos + 4)[0] < 1:
                raise _corrupt("snappy", "incompatible xerial stream version")
            pos += 12
            continue
        if size < 0 or size > n - pos:
            raise _corrupt("snappy", f"bad chunk size {size} at {pos - 4}")
        out, produced = _snappy_raw(snappy, view[pos:pos + size], limit - total)
        parts.append(out)
        total += produced
        pos += size
    return _join(parts)


# -- lz4 (Kafka's Lz4BlockOutputStream / Lz4BlockInputStream frame) -------------------------------

_P1, _P2, _P3, _P4, _P5 = 2654435761, 2246822519, 3266489917, 668265263, 374761393
_M32 = 0xFFFFFFFF


def xxh32(data, seed: int = 0) -> int:
    """XXH32, needed for LZ4 frame checksums; lz4 does not expose it and xxhash is optional."""
    view = _byte_view(data)
    n = len(view)
    pos = 0
    if n >= 16:
        v1, v2 = (seed + _P1 + _P2) & _M32, (seed + _P2) & _M32
        v3, v4 = seed & _M32, (seed - _P1) & _M32
        stripes = n >> 4
        lanes = struct.unpack_from(f"<{stripes * 4}I", view)
        for i in range(0, stripes * 4, 4):
            v1 = (v1 + lanes[i] * _P2) & _M32
            v1 = (((v1 << 13) | (v1 >> 19)) * _P1) & _M32
            v2 = (v2 + lanes[i + 1] * _P2) & _M32
            v2 = (((v2 << 13) | (v2 >> 19)) * _P1) & _M32
            v3 = (v3 + lanes[i + 2] * _P2) & _M32
            v3 = (((v3 << 13) | (v3 >> 19)) * _P1) & _M32
            v4 = (v4 + lanes[i + 3] * _P2) & _M32
            v4 = (((v4 << 13) | (v4 >> 19)) * _P1) & _M32
        h = (((v1 << 1) | (v1 >> 31)) + ((v2 << 7) | (v2 >> 25))
             + ((v3 << 12) | (v3 >> 20)) + ((v4 << 18) | (v4 >> 14)))
        pos = stripes << 4
    else:
        h = seed + _P5
    h = (h + n) & _M32
    while pos + 4 <= n:
        h = (h + _LE_UINT.unpack_from(view, pos)[0] * _P3) & _M32
        h = (((h << 17) | (h >> 15)) * _P4) & _M32
        pos += 4
    while pos < n:
        h = (h + view[pos] * _P5) & _M32
        h = (((h << 11) | (h >> 21)) * _P1) & _M32
        pos += 1
    h = ((h ^ (h >> 15)) * _P2) & _M32
    h = ((h ^ (h >> 13)) * _P3) & _M32
    return h ^ (h >> 16)


def _block_xxh32(chunk: memoryview) -> int:
    # Block checksums cover whole blocks (up to 4 MiB): use the C xxhash when it is installed.
    fast = _lib("xxhash", required=False)
    return fast.xxh32_intdigest(chunk) if fast is not None else xxh32(chunk)


_LZ4_MAGIC = b"\x04\x22\x4d\x18"
# FLG 0x60: version 01, independent blocks, no block/content checksum, no content size.
# BD 0x40: 64 KiB maximum block size (Lz4BlockOutputStream.BLOCKSIZE_64KB).
_LZ4_DESCRIPTOR = b"\x60\x40"
_LZ4_BLOCK = 64 * 1024
_LZ4_UNCOMPRESSED = 0x80000000
_LZ4_DEFAULT_LEVEL = 9  # CompressionType.LZ4 default; Kafka uses the fast compressor for it
# Magic 0 keeps Kafka's original bug: the header checksum also hashes the 4 magic bytes.
_LZ4_HEADER_V0 = (_LZ4_MAGIC + _LZ4_DESCRIPTOR
                  + bytes([(xxh32(_LZ4_MAGIC + _LZ4_DESCRIPTOR) >> 8) & 0xFF]))
_LZ4_HEADER = _LZ4_MAGIC + _LZ4_DESCRIPTOR + bytes([(xxh32(_LZ4_DESCRIPTOR) >> 8) & 0xFF])
_LZ4_END_MARK = b"\0\0\0\0"


def _lz4_compress(view: memoryview, magic: int, level: int | None) -> bytes:
    block = _lib("lz4.block")
    if level is None or level == _LZ4_DEFAULT_LEVEL:
        options = {"mode": "default"}
    else:
        options = {"mode": "high_compression", "compression": level}
    parts = [_LZ4_HEADER_V0 if magic == 0 else _LZ4_HEADER]
    for start in range(0, len(view), _LZ4_BLOCK):
        chunk = view[start:start + _LZ4_BLOCK]
        packed = block.compress(chunk, store_size=False, **options)
        if len(packed) >= len(chunk):  # incompressible: stored raw, flagged by the high bit
            parts += (_LE_UINT.pack(len(chunk) | _LZ4_UNCOMPRESSED), chunk)
        else:
            parts += (_LE_UINT.pack(len(packed)), packed)
    parts.append(_LZ4_END_MARK)
    return b"".join(parts)


def _lz4_blocks(view: memoryview, magic: int):
    """Walk a frame as Lz4BlockInputStream does: ``(max block size, [(block, stored raw)],
    most bytes the blocks can decode to)``.

    The header checksum is ignored for magic 0 (old writers got it wrong) and verified
    otherwise; an 8-byte content size is skipped; block checksums are verified; the content
    checksum is skipped unverified; bytes after the end mark are ignored."""
    n = len(view)
    if n < 6:
        raise _corrupt("lz4", "stream ended prematurely")
    if view[:4] != _LZ4_MAGIC:
        raise _corrupt("lz4", "not an LZ4 frame (bad magic)")
    flg, bd = view[4], view[5]
    if flg & 0x03 or not flg & 0x20 or flg >> 6 != 1:
        raise _corrupt("lz4", f"unsupported frame flags 0x{flg:02x} (Kafka needs version 1, "
                              "independent blocks, no dictionary)")
    if bd & 0x8F or (bd >> 4) & 7 < 4:
        raise _corrupt("lz4", f"bad block descriptor 0x{bd:02x}")
    max_block = 1 << (2 * ((bd >> 4) & 7) + 8)
    pos = 14 if flg & 0x08 else 6
    if pos >= n:
        raise _corrupt("lz4", "stream ended prematurely")
    if magic != 0 and view[pos] != _lz4_header_checksum(view[4:pos]):
        raise _corrupt("lz4", "frame descriptor checksum mismatch")
    pos += 1
    checked = flg & 0x10
    blocks = []
    capacity = 0
    unpack = _LE_UINT.unpack_from
    while True:
        if n - pos < 4:
            raise _corrupt("lz4", "stream ended prematurely")
        word = unpack(view, pos)[0]
        pos += 4
        size = word & 0x7FFFFFFF
        if size == 0:
            if flg & 0x04 and n - pos < 4:
                raise _corrupt("lz4", "content checksum missing")
            return max_block, blocks, capacity
        if size > max_block:
            raise _corrupt("lz4", f"block size {size} exceeds max {max_block}")
        if n - pos < size + (4 if checked else 0):
            raise _corrupt("lz4", "stream ended prematurely")
        chunk = view[pos:pos + size]
        pos += size
        if checked:
            if _block_xxh32(chunk) != unpack(view, pos)[0]:
                raise _corrupt("lz4", "block checksum mismatch")
            pos += 4
        raw = word >= _LZ4_UNCOMPRESSED
        # LZ4 expands a block at most ~255 times: capacity follows the input, not max_block only
        capacity += size if raw else min(max_block, 255 * size + 64)
        blocks.append((chunk, raw))


_LZ4_HEADER_CHECKSUMS: dict = {}


def _lz4_header_checksum(descriptor) -> int:
    """Second byte of xxh32 over the frame descriptor; the few descriptors seen are cached
    (the pure-Python xxh32 would otherwise run once per batch)."""
    key = bytes(descriptor)
    got = _LZ4_HEADER_CHECKSUMS.get(key)
    if got is None:
        got = (xxh32(key) >> 8) & 0xFF
        if len(_LZ4_HEADER_CHECKSUMS) < 64:
            _LZ4_HEADER_CHECKSUMS[key] = got
    return got


def _lz4_decompress(view: memoryview, magic: int, limit: int) -> bytes:
    max_block, blocks, _ = _lz4_blocks(view, magic)
    decompress = _lib("lz4.block").decompress
    parts, total = [], 0
    for chunk, raw in blocks:
        out = bytes(chunk) if raw else decompress(chunk, uncompressed_size=max_block)
        total += len(out)
        if total > limit:
            raise _too_big("lz4", limit)
        parts.append(out)
    return _join(parts)


def _lz4_decompress_into(view: memoryview, magic: int, limit: int, allocate, into) -> memoryview:
    """:func:`_lz4_decompress` into one buffer from ``allocate``, block by block (``into`` is
    cramjam's ``decompress_block_into``), with no intermediate ``bytes``."""
    max_block, blocks, capacity = _lz4_blocks(view, magic)
    out = memoryview(allocate(min(capacity, limit + 1))).cast("B")
    size = len(out)
    total = 0
    for chunk, raw in blocks:
        room = size - total
        if room > max_block:
            room = max_block
        if raw:
            if len(chunk) > room:
                raise _too_big("lz4", limit)
            out[total:total + len(chunk)] = chunk
            total += len(chunk)
        else:
            total += into(chunk, out[total:total + room], output_len=room)
    if total > limit:
        raise _too_big("lz4", limit)
    return out[:total]


# -- zstd -----------------------------------------------------------------------------------------

_ZSTD_DEFAULT_LEVEL = 3  # CompressionType.ZSTD default
_zstd_local = threading.local()  # zstd contexts are reusable but not thread-safe


def _zstd_compress(data, level: int | None) -> bytes:
    zstd = _lib("zstandard")
    level = _ZSTD_DEFAULT_LEVEL if level is None else level
    cache = _zstd_local.__dict__.setdefault("compressors", {})
    cctx = cache.get(level)
    if cctx is None:
        cctx = cache[level] = zstd.ZstdCompressor(level=level, write_content_size=False)
    return cctx.compress(data)


def _zstd_decompress(view: memoryview, limit: int) -> bytes:
    """Like zstd-jni's ZstdInputStream: frames (with or without a content size) may follow one
    another, a truncated frame is an error, and empty input is empty output.

    Input is fed in steps so that even a worst-case expansion (a 4-byte RLE block yields 128 KiB)
    of one step cannot run far past the remaining output budget before we check it.
    """
    dctx = getattr(_zstd_local, "decompressor", None)
    if dctx is None:
        dctx = _zstd_local.decompressor = _lib("zstandard").ZstdDecompressor()
    parts, total, pos, n = [], 0, 0, len(view)
    dobj = None
    while pos < n:
        if dobj is None:
            dobj = dctx.decompressobj()
        step = min(n - pos, max(256, (limit - total) >> 15))
        out = dobj.decompress(view[pos:pos + step])
        total += len(out)
        if total > limit:
            raise _too_big("zstd", limit)
        if out:
            parts.append(out)
        pos += step
        if dobj.eof:
            pos -= len(dobj.unused_data)
            dobj = None
    if dobj is not None:
        raise _corrupt("zstd", "truncated zstd frame")
    return _join(parts)
