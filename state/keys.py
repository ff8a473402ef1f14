"""Node keys: Kafka partition of the node id (murmur2, as Kafka's Java client and librdkafka's
``murmur2_random`` partitioner compute it) followed by an 8-byte stable hash of the id.

So the state of one partition is one contiguous key range that can be moved, dropped or
rebuilt, and a node's key never depends on the process (Python's ``hash`` is salted).
"""
from __future__ import annotations

import hashlib
from functools import lru_cache

_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 (seed 0x9747b28c) as an unsigned 32-bit int."""
    length = len(data)
    h = (0x9747B28C ^ length) & _MASK
    n4 = length & ~3
    for i in range(0, n4, 4):
        k = data[i] | (data[i + 1] << 8) | (data[i + 2] << 16) | (data[i + 3] << 24)
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = (h * _M) & _MASK
        h ^= k
    tail = length & 3
    if tail == 3:
        h ^= data[n4 + 2] << 16
    if tail >= 2:
        h ^= data[n4 + 1] << 8
    if tail >= 1:
        h ^= data[n4]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h


def partition_of(node_id: str, num_partitions: int) -> int:
    """The partition Kafka's default (murmur2) partitioner picks for this key."""
    return (murmur2(node_id.encode()) & 0x7FFFFFFF) % num_partitions


def stable_hash(node_id: str) -> bytes:
    """8 bytes that identify the id (blake2b; collisions are checked against the stored id)."""
    return hashlib.blake2b(node_id.encode(), digest_size=8).digest()


class KeyCodec:
    """node id -> 10-byte RocksDB key (2-byte partition, 8-byte hash), memoised."""

    def __init__(self, num_partitions: int, cache_size: int = 1 << 20) -> None:
        if not 0 < num_partitions < 1 << 16:
            raise ValueError(f"num_partitions must be in 1..65535, got {num_partitions}")
        self.num_partitions = num_partitions
        self.key = lru_cache(maxsize=cache_size)(self._key)

    def _key(self, node_id: str) -> bytes:
        return partition_of(node_id, self.num_partitions).to_bytes(2, "big") + stable_hash(node_id)

    def partition(self, node_id: str) -> int:
        return int.from_bytes(self.key(node_id)[:2], "big")

    @staticmethod
    def partition_prefix(partition: int) -> bytes:
        return partition.to_bytes(2, "big")
