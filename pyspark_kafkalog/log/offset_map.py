"""The log cleaner's key map: Kafka's ``SkimpyOffsetMap``, a key -> latest offset map held in a
fixed memory budget, so that a log with more distinct keys than fit is cleaned in passes
instead of by holding every key (docs/compaction.md).

As in Kafka, a key is not stored: its 128-bit digest is, with the offset, 24 bytes per slot,
in one table allocated once at ``log.cleaner.dedupe.buffer.size`` (each cleaner thread's share)
and never grown. The map is *full* at ``slots * log.cleaner.io.buffer.load.factor`` distinct
keys: it then refuses new keys (``put_many`` says how many of the given records it took) and
the cleaner stops its dirty range before the first record that did not fit. Two keys with one
digest would be taken for one key (the older record of the other key cleaned away); with a
well-mixed 128-bit digest that has probability ~n²/2¹²⁹, as in Kafka with MD5.

Deviations from Kafka, for speed (results per key are the same):

* the digest is MurmurHash3_x64_128 (seed 0) instead of MD5: a documented 128-bit hash that
  costs a tenth of MD5 per short key;
* the table uses double hashing over a prime number of slots instead of Kafka's probes taken
  from the digest's bytes;
* the map is full only when a *new* key does not fit (Kafka stops at the first record once the
  count of puts reached the limit, even for a key it holds), so a pass covers slightly more;
* whole runs of keys are hashed, put and looked up at once (numpy arrays in, C loops in
  ``_encode_accel``; numpy/Python twins here give the same results when the extension is
  missing or ``KAFKALOG_PURE_PYTHON=1``).
"""
from __future__ import annotations

from typing import Optional, Sequence, Tuple

import numpy as np

from ..format import accel

#: Kafka's ``log.cleaner.dedupe.buffer.size`` default (for all cleaner threads together).
DEFAULT_DEDUPE_BUFFER_SIZE = 128 * 1024 * 1024
#: Kafka's ``log.cleaner.io.buffer.load.factor`` default.
DEFAULT_LOAD_FACTOR = 0.9
#: Bytes of one slot: the 16-byte digest and the 8-byte offset (Kafka's ``bytesPerEntry``).
BYTES_PER_ENTRY = 24

#: a slot is (digest high, digest low, offset + 1): 0 in the last word is an empty slot, so a
#: zeroed table is an empty map (allocated with calloc: no pass over it to mark it empty)
_EMPTY = 0
_M64 = (1 << 64) - 1
_C1, _C2 = 0x87C37B91114253D5, 0x4CF5AD432745937F

_ENCODE = accel.ENCODE
#: The C loops, or None for the twins below (tests swap these module attributes).
_key_digests = _ENCODE.key_digests if _ENCODE is not None else None
_map_put = _ENCODE.offset_map_put if _ENCODE is not None else None
_map_get = _ENCODE.offset_map_get if _ENCODE is not None else None


# -- the digest -------------------------------------------------------------------------------

def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (64 - r))) & _M64


def _fmix(k: int) -> int:
    k ^= k >> 33
    k = (k * 0xFF51AFD7ED558CCD) & _M64
    k ^= k >> 33
    k = (k * 0xC4CEB9FE1A85EC53) & _M64
    return k ^ (k >> 33)


def murmur3_128(key: bytes) -> Tuple[int, int]:
    """MurmurHash3_x64_128 of ``key`` with seed 0, as ``(h1, h2)`` (the reference of the C
    ``key_digests``; ``mmh3.hash128(key)`` is ``h2 << 64 | h1``)."""
    n = len(key)
    h1 = h2 = 0
    nblocks = n // 16
    for i in range(nblocks):
        k1 = int.from_bytes(key[16 * i:16 * i + 8], "little")
        k2 = int.from_bytes(key[16 * i + 8:16 * i + 16], "little")
        k1 = (_rotl((k1 * _C1) & _M64, 31) * _C2) & _M64
        h1 ^= k1
        h1 = (((_rotl(h1, 27) + h2) & _M64) * 5 + 0x52DCE729) & _M64
        k2 = (_rotl((k2 * _C2) & _M64, 33) * _C1) & _M64
        h2 ^= k2
        h2 = (((_rotl(h2, 31) + h1) & _M64) * 5 + 0x38495AB5) & _M64
    tail = key[16 * nblocks:]
    if len(tail) > 8:
        k2 = int.from_bytes(tail[8:], "little")
        h2 ^= (_rotl((k2 * _C2) & _M64, 33) * _C1) & _M64
    if tail:
        k1 = int.from_bytes(tail[:8], "little")
        h1 ^= (_rotl((k1 * _C1) & _M64, 31) * _C2) & _M64
    h1 ^= n
    h2 ^= n
    h1 = (h1 + h2) & _M64
    h2 = (h2 + h1) & _M64
    h1, h2 = _fmix(h1), _fmix(h2)
    h1 = (h1 + h2) & _M64
    h2 = (h2 + h1) & _M64
    return h1, h2


def key_digests(offsets, data) -> np.ndarray:
    """The digest of every key of an Arrow-style binary column (``offsets``: ``n + 1`` int64
    ends, ``data``: the bytes; a null is a zero-length span, to be masked by the caller), as an
    ``(n, 2)`` uint64 array."""
    offs = np.ascontiguousarray(np.frombuffer(offsets, dtype=np.int64)
                                if not isinstance(offsets, np.ndarray) else offsets,
                                dtype=np.int64)
    n = max(len(offs) - 1, 0)
    out = np.empty((n, 2), dtype=np.uint64)
    if not n:
        return out
    if _key_digests is not None:
        _key_digests(offs, data, out)
        return out
    view = memoryview(data).cast("B")
    bounds = offs.tolist()
    for i in range(n):
        out[i] = murmur3_128(bytes(view[bounds[i]:bounds[i + 1]]))
    return out


def digests_of(keys: Sequence[bytes]) -> np.ndarray:
    """:func:`key_digests` of a list of keys (for tools and tests)."""
    offs = np.zeros(len(keys) + 1, dtype=np.int64)
    np.cumsum([len(k) for k in keys], out=offs[1:])
    return key_digests(offs, b"".join(keys))


# -- the map ----------------------------------------------------------------------------------

def _largest_prime_at_most(n: int) -> int:
    if n < 2:
        raise ValueError("an offset map needs room for at least 2 slots")

    def prime(m: int) -> bool:
        if m < 4:
            return m >= 2
        if m % 2 == 0:
            return False
        f = 3
        while f * f <= m:
            if m % f == 0:
                return False
            f += 2
        return True
    while not prime(n):
        n -= 1
    return n


class OffsetMap:
    """A key digest -> latest offset map in ``memory`` bytes (Kafka's ``SkimpyOffsetMap``).

    ``slots`` = the largest prime ≤ ``memory // 24``; the table is exactly ``slots * 24`` bytes
    (``nbytes``), allocated here once. ``max_entries`` (Kafka's ``maxDesiredMapSize``) =
    ``slots * load_factor``, below ``slots``. ``latest_offset`` is Kafka's ``latestOffset``:
    the last offset the map covers (puts and :meth:`update_latest_offset` raise it).
    """

    __slots__ = ("slots", "max_entries", "size", "latest_offset", "_table", "_touched")

    def __init__(self, memory: int = DEFAULT_DEDUPE_BUFFER_SIZE,
                 load_factor: float = DEFAULT_LOAD_FACTOR):
        if not 0 < load_factor <= 1:
            raise ValueError(f"load factor {load_factor} is not in (0, 1]")
        self.slots = _largest_prime_at_most(memory // BYTES_PER_ENTRY)
        self.max_entries = max(1, min(int(self.slots * load_factor), self.slots - 1))
        # zeroed pages from the kernel, faulted in as the map fills: an empty table costs no pass
        self._table = np.zeros((self.slots, 3), dtype=np.int64)
        self._touched = False
        self.size = 0
        self.latest_offset = -1

    @property
    def nbytes(self) -> int:
        """The memory the map holds: its table (the budget, at most)."""
        return self._table.nbytes

    @property
    def full(self) -> bool:
        return self.size >= self.max_entries

    def clear(self) -> None:
        """Empty the map for the next pass (Kafka's ``clear``)."""
        if self._touched:      # a map nothing was put into since it was made or cleared is empty
            self._table[:, 2] = _EMPTY
            self._touched = False
        self.size = 0
        self.latest_offset = -1

    def update_latest_offset(self, offset: int) -> None:
        """Kafka's ``updateLatestOffset``: the map covers the dirty range up to ``offset``."""
        self.latest_offset = offset

    def put_many(self, digests: np.ndarray, offsets: np.ndarray) -> int:
        """Put each ``(digests[i], offsets[i])`` in order (offsets increasing), a key's offset
        replacing the one it had. Stops before the first key the map does not hold once it is
        full; returns how many were put (``len(offsets)`` unless full). ``latest_offset``
        becomes the last offset put."""
        digests = np.ascontiguousarray(digests, dtype=np.uint64).reshape(-1, 2)
        offsets = np.ascontiguousarray(offsets, dtype=np.int64)
        if len(offsets) != len(digests):
            raise ValueError("put_many: as many offsets as digests")
        if not len(offsets):
            return 0
        self._touched = True
        if _map_put is not None:
            done, self.size = _map_put(self._table, digests, offsets, self.size,
                                       self.max_entries)
        else:
            done = self._put_numpy(digests, offsets)
        if done:
            self.latest_offset = int(offsets[done - 1])
        return done

    def get_many(self, digests: np.ndarray) -> np.ndarray:
        """The offset of each digest (int64), -1 where the map does not hold it."""
        digests = np.ascontiguousarray(digests, dtype=np.uint64).reshape(-1, 2)
        out = np.empty(len(digests), dtype=np.int64)
        if not len(digests):
            return out
        if _map_get is not None:
            _map_get(self._table, digests, out)
            return out
        slot, _ = self._find_numpy(digests)
        out[:] = self._table[slot, 2] - 1
        return out

    # -- the numpy twins (same results as the C loops; the table's layout may differ) --------

    def _probe(self, digests: np.ndarray):
        s = np.uint64(self.slots)
        return digests[:, 0] % s, np.uint64(1) + digests[:, 1] % np.uint64(self.slots - 1)

    def _find_numpy(self, digests: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """Each digest's slot: its own or the first empty one on its probe sequence; and
        whether it was its own."""
        n = len(digests)
        pos, step = self._probe(digests)
        slot = np.empty(n, dtype=np.int64)
        found = np.zeros(n, dtype=bool)
        pending = np.arange(n)
        table, s = self._table, np.uint64(self.slots)
        tbl_u = table.view(np.uint64)
        while len(pending):
            p = pos[pending].astype(np.int64)
            empty = table[p, 2] == _EMPTY
            match = ~empty & (tbl_u[p, 0] == digests[pending, 0]) & (
                tbl_u[p, 1] == digests[pending, 1])
            done = empty | match
            slot[pending[done]] = p[done]
            found[pending[match]] = True
            pending = pending[~done]
            pos[pending] = (pos[pending] + step[pending]) % s
        return slot, found

    def _put_numpy(self, digests: np.ndarray, offsets: np.ndarray) -> int:
        n = len(offsets)
        _, known = self._find_numpy(digests)
        # the distinct new keys, each at its first record, in record order
        new = np.flatnonzero(~known)
        done = n
        if len(new):
            order = np.lexsort((digests[new, 1], digests[new, 0]))
            sd = digests[new][order]
            first = np.ones(len(new), dtype=bool)
            first[1:] = (sd[1:, 0] != sd[:-1, 0]) | (sd[1:, 1] != sd[:-1, 1])
            # the first record of each distinct key: the smallest index in its group
            group = np.cumsum(first) - 1
            firsts = np.full(int(group[-1]) + 1, n, dtype=np.int64)
            np.minimum.at(firsts, group, new[order])
            firsts.sort()
            room = self.max_entries - self.size
            if len(firsts) > room:
                done = int(firsts[room])
        if not done:
            return 0
        d, o = digests[:done], offsets[:done]
        # each key's last record in the run (the latest offset: offsets increase)
        rev = np.lexsort((np.arange(done)[::-1], d[:, 1], d[:, 0]))
        sd = d[rev]
        last = np.ones(done, dtype=bool)
        last[1:] = (sd[1:, 0] != sd[:-1, 0]) | (sd[1:, 1] != sd[:-1, 1])
        pick = rev[last]
        d, o = d[pick], o[pick]
        table = self._table
        pending = np.arange(len(pick))
        s = np.uint64(self.slots)
        pos, step = self._probe(d)
        tbl_u = table.view(np.uint64)
        while len(pending):
            p = pos[pending].astype(np.int64)
            empty = table[p, 2] == _EMPTY
            match = ~empty & (tbl_u[p, 0] == d[pending, 0]) & (tbl_u[p, 1] == d[pending, 1])
            table[p[match], 2] = o[pending[match]] + 1
            # claim empty slots; of several keys after one slot, the first claims it
            cand = np.flatnonzero(empty)
            _, first_of = np.unique(p[cand], return_index=True)
            win = cand[first_of]
            wp, wi = p[win], pending[win]
            tbl_u[wp, 0] = d[wi, 0]
            tbl_u[wp, 1] = d[wi, 1]
            table[wp, 2] = o[wi] + 1
            self.size += len(win)
            settled = match.copy()
            settled[win] = True
            lost = empty & ~settled          # its slot was taken by another key: probe on
            advance = ~empty & ~match
            move = advance | lost
            # a loser looks at the same slot again (now another key's): next round moves it
            adv = pending[advance]
            pos[adv] = (pos[adv] + step[adv]) % s
            pending = pending[move]
        return done

