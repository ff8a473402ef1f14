"""One atomic write to the store, and the record of what it changed in each partition.

A `Batch` is a RocksDB `WriteBatch` addressed by column-family name. When the store has a
change log (`GraphStore.attach_log`), the batch also keeps every put and delete that belongs
to a partition's movable state, grouped by partition, so the log can carry exactly the
bytes the local store receives (see `state.partition_log` for what is movable and why).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from rocksdict import WriteBatch

from hirflow.state.partition_log import FAMILY_CODE, Op, partition_of_key

if TYPE_CHECKING:
    from hirflow.state.graph import GraphStore


class Batch:
    """Puts and deletes by family name; `ops` holds the movable ones per partition."""

    def __init__(self, store: "GraphStore", logged: bool = True) -> None:
        self.wb = WriteBatch(raw_mode=True)
        self._h = store.handle
        # None: nothing recorded (no change log attached, or a replay of the log itself)
        self._logged = store.logged_partitions if logged else None
        self.ops: dict[int, list[Op]] = {}

    def put(self, cf: str, key: bytes, value: bytes) -> None:
        self.wb.put(key, value, self._h[cf])
        if self._logged is not None:
            self._record(cf, key, value)

    def delete(self, cf: str, key: bytes) -> None:
        self.wb.delete(key, self._h[cf])
        if self._logged is not None:
            self._record(cf, key, None)

    def delete_range(self, cf: str, begin: bytes, end: bytes) -> None:
        """Delete keys in [begin, end); never recorded (a partition leaving the store)."""
        self.wb.delete_range(begin, end, self._h[cf])

    def _record(self, cf: str, key: bytes, value: bytes | None) -> None:
        code = FAMILY_CODE.get(cf)
        if code is None:
            return
        p = partition_of_key(cf, key)
        if p is not None and p in self._logged:
            self.ops.setdefault(p, []).append((code, key, value))
