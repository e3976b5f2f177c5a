"""Kafka's default partitioner, bit for bit: ``toPositive(murmur2(key)) % numPartitions``.

Keyed records must land where a Java producer would put them, so that kafkalog topics and Kafka
topics agree on which partition holds a key.
"""
from __future__ import annotations

_M = 0x5BD1E995
_SEED = 0x9747B28C
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's ``Utils.murmur2`` (signed 32-bit result)."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    n4 = length & ~3
    for i in range(0, n4, 4):
        k = data[i] | (data[i + 1] << 8) | (data[i + 2] << 16) | (data[i + 3] << 24)
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = (h * _M) & _MASK
        h ^= k
    rest = length & 3
    if rest == 3:
        h ^= data[n4 + 2] << 16
    if rest >= 2:
        h ^= data[n4 + 1] << 8
    if rest >= 1:
        h ^= data[n4]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def to_positive(n: int) -> int:
    return n & 0x7FFFFFFF


def partition_for_key(key: bytes, num_partitions: int) -> int:
    return to_positive(murmur2(key)) % num_partitions


class RoundRobin:
    """Records without a key are spread evenly (a producer's sticky batches, one batch each)."""

    def __init__(self, num_partitions: int, start: int = 0):
        self.n = num_partitions
        self.next = start % num_partitions

    def __call__(self) -> int:
        p = self.next
        self.next = (self.next + 1) % self.n
        return p
