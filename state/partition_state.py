"""A partition's key range in the store: read it whole (a snapshot), drop it, rebuild it from
replayed log steps, and where it stands in its change log.

What is movable is defined in `state.partition_log`. Writes here bypass the change log on
purpose: they replay or remove what the log already says, they are not new changes.
"""
from __future__ import annotations

import struct
from typing import Iterable, Iterator

import msgpack

from hirflow.state.graph import GraphStore
from hirflow.state.index import IndexRecord, TokenIndex
from hirflow.state.keys import KeyCodec
from hirflow.state.node import NodeState
from hirflow.state.partition_log import (FAMILY_CODE, FAMILY_NAME, META, NODE_FAMILIES, Op, Position,
                                         Step, partition_of_key, position_key)

APPLY_CHUNK = 20_000        # ops per local write batch while restoring


def position(store: GraphStore, partition: int) -> Position | None:
    raw = store.cf["meta"].get(position_key(partition))
    return None if raw is None else Position.unpack(raw)


def set_position(store: GraphStore, partition: int, pos: Position) -> None:
    store.cf["meta"][position_key(partition)] = pos.pack()


def _meta_keys(store: GraphStore, partition: int) -> Iterator[tuple[bytes, bytes]]:
    for prefix in (b"o:", b"r:"):
        for k, v in store.reader._iter_prefix("meta", prefix):
            if partition_of_key("meta", k) == partition:
                yield k, v


def movable_ops(store: GraphStore, partition: int) -> Iterator[Op]:
    """Every movable key of the partition as a put: what a snapshot carries."""
    prefix = KeyCodec.partition_prefix(partition)
    for cf in NODE_FAMILIES:
        code = FAMILY_CODE[cf]
        for k, v in store.reader._iter_prefix(cf, prefix):
            yield code, k, v
    for k, v in _meta_keys(store, partition):
        yield META, k, v


def has_state(store: GraphStore, partition: int, meta: bool = True) -> bool:
    """Whether the store holds any of the partition's keys (`meta`: its offsets and marks
    too; a worker stores the entity offsets of every partition, owned or not)."""
    prefix = KeyCodec.partition_prefix(partition)
    return any(True for cf in NODE_FAMILIES for _ in store.reader._iter_prefix(cf, prefix)) \
        or (meta and any(True for _ in _meta_keys(store, partition)))


def drop(store: GraphStore, partition: int, keep_position: bool = False) -> int:
    """Remove the partition's movable state, its index entries in every generation and
    (unless `keep_position`) its log position; returns the node records removed. The super-graph's aggregates (sums over
    primitives) keep the dropped nodes' past contributions until they decay."""
    prefix = KeyCodec.partition_prefix(partition)
    end = (partition + 1).to_bytes(2, "big")
    nodes = sum(1 for _ in store.reader._iter_prefix("nodes", prefix))
    _drop_index(store, partition)
    wb = store.batch_unlogged()
    for cf in NODE_FAMILIES:
        wb.delete_range(cf, prefix, end)
    for k, _ in list(_meta_keys(store, partition)):
        wb.delete("meta", k)
    if not keep_position:
        wb.delete("meta", position_key(partition))
    store.write(wb)
    return nodes


def _drop_index(store: GraphStore, partition: int) -> None:
    """Index records of the partition's nodes, with their postings and memberships."""
    index = TokenIndex(store)
    batch = index.batch()
    batch.wb = store.batch_unlogged()
    n = 0
    for k, v in store.reader._iter_prefix("embeddings", b""):
        if int.from_bytes(k[2:4], "big") != partition:
            continue
        batch.delete_record(struct.unpack(">H", k[:2])[0], IndexRecord.unpack(v))
        n += 1
        if n % APPLY_CHUNK == 0:
            store.write(batch.wb)
            batch.wb = store.batch_unlogged()
    store.write(batch.wb)


def apply(store: GraphStore, partition: int, steps: Iterable[Step]) -> tuple[int, int]:
    """Replay log steps into the partition (a snapshot step replaces what is there);
    returns (commit sequence reached, ops applied); -1 when no step came."""
    cseq, n = -1, 0
    for step in steps:
        if step.replace:
            drop(store, partition, keep_position=True)
        _write_all(store, ((FAMILY_NAME[code], key, value) for code, key, value in step.ops))
        cseq, n = step.cseq, n + len(step.ops)
    return cseq, n


def _write_all(store: GraphStore, writes: Iterable[tuple[str, bytes, bytes | None]]) -> int:
    """Write (family, key, value; None deletes) in batches of APPLY_CHUNK; how many."""
    wb, n = store.batch_unlogged(), 0
    for cf, key, value in writes:
        if value is None:
            wb.delete(cf, key)
        else:
            wb.put(cf, key, value)
        n += 1
        if n % APPLY_CHUNK == 0:
            store.write(wb)
            wb = store.batch_unlogged()
    store.write(wb)
    return n


def mark_dirty(store: GraphStore, partition: int) -> int:
    """Mark every node of the partition dirty (as of its last event), so that the refresh
    rebuilds the index entries the log does not carry; returns how many."""
    def marks():
        for k, v in store.reader._iter_prefix("nodes", KeyCodec.partition_prefix(partition)):
            node_id, last = NodeState.id_and_last(v)
            yield "dirty", k, msgpack.packb([node_id, last or 0])

    return _write_all(store, marks())


def copy(src: GraphStore, dst: GraphStore, partition: int) -> int:
    """Make `dst`'s movable state of the partition a copy of `src`'s (what `dst` held is
    dropped first; positions are the caller's); returns the ops copied. Streams in chunks:
    a partition of millions of nodes never sits in memory whole."""
    drop(dst, partition, keep_position=True)
    return _write_all(dst, ((FAMILY_NAME[code], key, value) for code, key, value in movable_ops(src, partition)))
