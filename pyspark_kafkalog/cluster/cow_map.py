"""A mapping whose copies share their contents: the partition index of a replayed state.

Why: every metadata append replays into a copy of the cached state, and a cluster has up to
hundreds of thousands of partitions. A plain ``dict`` copy is O(partitions) per append; here a
copy shares a frozen *base* dict and copies only its own small *overlay* of changes since that
base. When the overlay grows past a fraction of the base it is folded into a new base, so the
amortised cost of a change stays constant and lookups stay two dict probes at most.
"""
from __future__ import annotations

from typing import Dict, Iterator, MutableMapping, Optional, Set, TypeVar

V = TypeVar("V")
_ABSENT = object()
FOLD_MIN = 1024        # overlays below this size are never folded
FOLD_FRACTION = 8      # ... above len(base) / FOLD_FRACTION they are


class CowMap(MutableMapping[str, V]):
    __slots__ = ("_base", "_over", "_gone", "_len")

    def __init__(self, data: Optional[Dict[str, V]] = None):
        self._base: Dict[str, V] = dict(data or {})
        self._over: Dict[str, V] = {}
        self._gone: Set[str] = set()          # keys of the base deleted here
        self._len = len(self._base)

    def copy(self) -> "CowMap[V]":
        """O(changes since the last fold), not O(len)."""
        c = CowMap.__new__(CowMap)
        c._base, c._over, c._gone, c._len = self._base, dict(self._over), set(self._gone), self._len
        return c

    def _fold(self) -> None:
        if len(self._over) + len(self._gone) < max(FOLD_MIN, len(self._base) // FOLD_FRACTION):
            return
        base = {k: v for k, v in self._base.items() if k not in self._gone}
        base.update(self._over)
        self._base, self._over, self._gone = base, {}, set()

    def __getitem__(self, key: str) -> V:
        v = self._over.get(key, _ABSENT)
        if v is not _ABSENT:
            return v
        if key in self._gone:
            raise KeyError(key)
        return self._base[key]

    def get(self, key, default=None):
        v = self._over.get(key, _ABSENT)
        if v is not _ABSENT:
            return v
        if key in self._gone:
            return default
        return self._base.get(key, default)

    def __contains__(self, key) -> bool:
        return key in self._over or (key not in self._gone and key in self._base)

    def __setitem__(self, key: str, value: V) -> None:
        if key not in self:
            self._len += 1
        self._over[key] = value
        self._gone.discard(key)
        self._fold()

    def __delitem__(self, key: str) -> None:
        if key not in self:
            raise KeyError(key)
        self._over.pop(key, None)
        if key in self._base:
            self._gone.add(key)
        self._len -= 1
        self._fold()

    def __iter__(self) -> Iterator[str]:
        for k in self._base:
            if k not in self._gone and k not in self._over:
                yield k
        yield from self._over

    def __len__(self) -> int:
        return self._len
