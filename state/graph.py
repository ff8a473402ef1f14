"""The RocksDB graph store (rocksdict): column families, atomic commits with offsets, reads.

Column families (all keys are `state.keys` node keys unless said otherwise):

- ``nodes``     node key -> `NodeState` record (stats + bounded adjacency, both directions)
- ``entities``  node key -> entity record (text, attrs, image embedding; newest ts wins)
- ``knowledge`` node key -> world-knowledge text vector (float32 bytes, MiniLM 384-d)
- ``dirty``     node key -> [node id, oldest event ts not yet refreshed]
- ``meta``      ``schema_version``, ``num_partitions`` and consumed offsets
                (``o:<topic>:<partition>``) plus reverse-record high marks (``r:...``),
                the index generations (``index:...``) and, with a change log, each
                partition's position in it (``c:<partition>``, `state.partition_log`)
- ``embeddings``, ``postings``, ``members``, ``published``, ``outbox``: the serving index,
  see `state.index`; ``supergraph``: primitive aggregates, see `state.supergraph`

Every commit is one `WriteBatch` that carries the offsets of what it applied, so state and
offsets are durable together; after a crash the consumer resumes after the stored offset.
Reads go through `GraphReader`, which never writes.
"""
from __future__ import annotations

import logging
import os
import struct
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator, Mapping

import msgpack
import numpy as np
from rocksdict import AccessType, Options, Rdict, WriteOptions

from hirflow.state.batch import Batch
from hirflow.state.decay import value_at
from hirflow.state.events import Entity
from hirflow.state.keys import KeyCodec
from hirflow.state.node import IN, OUT, NodeState
from hirflow.state.partition_log import Op, Position, position_key
from hirflow.state.schema import SchemaConfig, node_type

log = logging.getLogger(__name__)

STORE_SCHEMA_VERSION = 2     # 2: reverse marks are origin offset * 4 + side
COLUMN_FAMILIES = ("nodes", "entities", "knowledge", "dirty", "meta",
                   # the serving index (state/index.py) and super-graph (state/supergraph.py)
                   "embeddings", "postings", "members", "published", "outbox", "supergraph")
# what a follower opens: the graph, not the index (a secondary instance replays the primary's
# log into the families it opened only, so the refresh's own writes cost it little)
FOLLOWER_FAMILIES = ("nodes", "entities", "knowledge", "meta")


class StoreError(RuntimeError):
    """The store cannot be used as asked; the message says why and what to do."""


class StoreLockedError(StoreError):
    pass


class StoreMissingError(StoreError):
    pass


class IncompatibleStoreError(StoreError):
    pass


@dataclass(frozen=True)
class GraphConfig:
    path: str = "var/state"            # RocksDB directory (one per worker)
    top_k: int = 128                   # adjacency bound per node (both directions together);
                                       # teacher views hold up to 128 nodes
    trim_slack: int = 32               # a full node is trimmed to top_k - trim_slack edges
    cache_nodes: int = 200_000         # hot node records kept in memory (write-back cache)
    cache_edges: int = 8_000_000       # and at most this many edges in them: the cache's
                                       # memory bound (about 250 bytes an edge in CPython)
    sync_writes: bool = False          # fsync each commit: survives power loss, not just kill -9
    expire_after_days: float = 0.0     # a node idle this long whose edges all weigh less than
                                       # `expire_below` is expired with its index entries
                                       # (its entity stays); 0: never
    expire_below: float = 1e-3         # |decayed edge weight| under which an edge is spent
    expire_sweep_nodes: int = 2000     # node records the retention sweep examines per second

    def __post_init__(self) -> None:
        if self.expire_after_days < 0 or self.expire_below < 0 or self.expire_sweep_nodes < 1:
            raise ValueError("expire_after_days and expire_below must be >= 0, "
                             "expire_sweep_nodes >= 1")
        if self.top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {self.top_k}")
        if not 0 <= self.trim_slack < self.top_k or self.cache_nodes < 1 or self.cache_edges < 1:
            raise ValueError(f"trim_slack must be in [0, top_k) and cache_nodes >= 1, got "
                             f"trim_slack={self.trim_slack}, cache_nodes={self.cache_nodes}")


@dataclass(frozen=True)
class EdgeView:
    """An edge as of a time: `weight` is decayed to that time; `age_ms` since its last event."""
    neighbor: str
    action: str
    direction: int          # OUT: this node was the src; IN: it was the dst
    weight: float
    age_ms: int
    count: int
    first_ts: int


@dataclass(frozen=True)
class NodeView:
    id: str
    type: str
    first_seen: int | None
    last_seen: int | None
    events: int
    activity: Mapping[tuple[str, int], float]   # (action, direction) -> decayed activity
    degree_out: int
    degree_in: int


def offset_key(topic: str, partition: int) -> bytes:
    return b"o:" + topic.encode() + b":" + struct.pack(">I", partition)


def reverse_mark_key(reverse_partition: int, origin_partition: int) -> bytes:
    return b"r:" + struct.pack(">II", reverse_partition, origin_partition)


def _id_of(record: bytes) -> str:
    """The node id of a stored node record (its first field), without decoding the rest."""
    u = msgpack.Unpacker()
    u.feed(record)
    u.read_array_header()
    return u.unpack()



# RocksDB keeps a write-ahead log file until every column family with writes in it has
# flushed them; a family written a little at every commit (meta: offsets) holds old files
# back. By default the logs may reach 4x all memtables before RocksDB flushes the families
# that hold them (about 5.5 GB with this store's families, measured on a million-node
# partition); past this bound it flushes them sooner.
MAX_WAL_BYTES = 512 << 20


def _options(create: bool) -> Options:
    opt = Options(raw_mode=True)
    opt.create_if_missing(create)
    opt.create_missing_column_families(create)
    opt.set_max_total_wal_size(MAX_WAL_BYTES)
    return opt


def _follower_options() -> Options:
    opt = Options(raw_mode=True)
    # RocksDB's advice for secondary instances: keep every table file open, so one that the
    # primary compacts away stays readable until the next catch-up
    opt.set_max_open_files(-1)
    return opt


def _meta_refusal(meta, path, num_partitions: int, follower: bool) -> StoreError | None:
    """Why a store cannot be opened with this schema version and partition count (None: it
    can); a new primary store records both."""
    version = meta.get(b"schema_version")
    if version is None and follower:
        return StoreMissingError(f"state store {path} is not initialised yet: a follower opens "
                                 "it after its primary has")
    if version is None:
        meta[b"schema_version"] = msgpack.packb(STORE_SCHEMA_VERSION)
        meta[b"num_partitions"] = msgpack.packb(num_partitions)
        return None
    version = msgpack.unpackb(version)
    if version != STORE_SCHEMA_VERSION:
        return IncompatibleStoreError(
            f"state store {path} has schema version {version}; this hirflow reads "
            f"{STORE_SCHEMA_VERSION}. Rebuild it by replaying the topics into a new path.")
    parts = msgpack.unpackb(meta.get(b"num_partitions"))
    if parts != num_partitions:
        return IncompatibleStoreError(
            f"state store {path} was built for {parts} partitions, config says "
            f"{num_partitions}; node keys depend on it. Use a new path or the old count.")
    return None


class GraphStore:
    """Owns the RocksDB handle. Use `reader` for reads and `commit` for atomic writes.

    With `follower_dir` the store is a read-only follower (a RocksDB secondary instance) of
    the store another process has open at `path`: it sees what that process committed as of
    its last `catch_up()`, and it never writes (`follower_dir` holds only its own logs)."""

    def __init__(self, path: str | os.PathLike, schema: SchemaConfig, num_partitions: int,
                 create: bool = True, sync_writes: bool = False,
                 follower_dir: str | os.PathLike | None = None) -> None:
        self.path = Path(path)
        self.schema = schema
        self.keys = KeyCodec(num_partitions)
        self.rates = {name: spec.decay_rate for name, spec in schema.all_actions.items()}
        self.follower = follower_dir is not None
        if (self.follower or not create) and not (self.path / "CURRENT").exists():
            raise StoreMissingError(f"no state store at {self.path}: run the worker once to "
                                    "create it, or pass the right --state path")
        self.path.mkdir(parents=True, exist_ok=True)
        families = FOLLOWER_FAMILIES if self.follower else COLUMN_FAMILIES
        cfs = {cf: Options(raw_mode=True) for cf in families}
        try:
            if self.follower:
                self.db = Rdict(str(self.path), _follower_options(), column_families=cfs,
                                access_type=AccessType.secondary(str(follower_dir)))
            else:
                self.db = Rdict(str(self.path), _options(create), column_families=cfs)
        except Exception as exc:  # rocksdict raises plain Exception with RocksDB's message
            msg = str(exc)
            if "lock" in msg.lower():
                raise StoreLockedError(
                    f"state store {self.path} is locked by another process (another worker "
                    f"running on the same directory?): {msg}") from None
            if "does not exist" in msg:
                raise StoreMissingError(f"no state store at {self.path}: {msg}") from None
            raise StoreError(f"cannot open state store {self.path}: {msg}") from None
        self.cf = {cf: self.db.get_column_family(cf) for cf in families}
        self.handle = {cf: self.db.get_column_family_handle(cf) for cf in families}
        self._write_opt = WriteOptions()
        self._write_opt.sync = sync_writes
        refused = _meta_refusal(self.cf["meta"], self.path, num_partitions, self.follower)
        if refused is not None:
            self._release()
            raise refused
        self.logged_partitions: frozenset[int] | None = None    # see attach_log
        self._log = None
        self.log_lock = threading.RLock()
        self.reader = GraphReader(self)
        self._closed = False

    def topic_ids(self) -> dict[str, str]:
        """The Kafka topic id each consumed topic had when its offsets were first stored."""
        return {k[len(b"topic_id:"):].decode(): msgpack.unpackb(v)
                for k, v in self.reader._iter_prefix("meta", b"topic_id:")}

    def set_topic_ids(self, ids: Mapping[str, str]) -> None:
        wb = self.batch()
        for name, tid in ids.items():
            wb.put("meta", b"topic_id:" + name.encode(), msgpack.packb(tid))
        self.write(wb)

    def claim_worker(self, count: int, index: int, movable: bool = False) -> None:
        """Record which worker of how many built this store; refuse another unless the
        partitions can move (`movable`: a change log restores what this worker gains and
        `state.partition_state` drops what it loses). Without one, a store opened by a
        worker with another count or index would replay partitions it never held, or keep
        ones it no longer owns."""
        meta = self.cf["meta"]
        raw = meta.get(b"worker_topology")
        if raw is None or movable:
            meta[b"worker_topology"] = msgpack.packb([count, index])
            return
        was = msgpack.unpackb(raw)
        if was != [count, index]:
            raise IncompatibleStoreError(
                f"state store {self.path} belongs to worker {was[1]} of {was[0]}; this worker is "
                f"{index} of {count}. Changing the worker count needs the change log "
                f"(worker.changelog = true, which moves partitions between workers), or new "
                f"state: empty volumes that rebuild from the topics, or go back to {was[0]}.")

    def catch_up(self) -> None:
        """A follower: see everything the primary has written so far (WAL included)."""
        self.db.try_catch_up_with_primary()

    # -- writes ---------------------------------------------------------------------------
    def commit(self, nodes: Iterable[NodeState] = (), entities: Iterable[Entity] = (),
               dirty_put: Mapping[str, int] | None = None, dirty_del: Iterable[str] = (),
               offsets: Mapping[tuple[str, int], int] | None = None,
               reverse_marks: Mapping[tuple[int, int], int] | None = None,
               knowledge: Mapping[str, np.ndarray] | None = None,
               delete_nodes: Iterable[str] = ()) -> None:
        """Write everything in one atomic, durable batch (offsets included)."""
        wb = self.batch()
        key = self.keys.key
        for node_id in delete_nodes:
            wb.delete("nodes", key(node_id))
        for s in nodes:
            wb.put("nodes", key(s.id), s.pack())
        for e in entities:
            wb.put("entities", key(e.node), _pack_entity(e))
        for node_id, vec in (knowledge or {}).items():
            wb.put("knowledge", key(node_id), np.asarray(vec, np.float32).tobytes())
        for node_id, ts in (dirty_put or {}).items():
            wb.put("dirty", key(node_id), msgpack.packb([node_id, ts]))
        for node_id in dirty_del:
            wb.delete("dirty", key(node_id))
        for (topic, p), off in (offsets or {}).items():
            wb.put("meta", offset_key(topic, p), msgpack.packb(off))
        for (rp, op), off in (reverse_marks or {}).items():
            wb.put("meta", reverse_mark_key(rp, op), msgpack.packb(off))
        self.write(wb)

    def batch(self) -> Batch:
        """An empty atomic batch; `write` it."""
        return Batch(self)

    def batch_unlogged(self) -> Batch:
        """A batch whose changes never go to the change log: a replay of the log, or state
        that is rebuilt rather than moved."""
        return Batch(self, logged=False)

    def write(self, wb: Batch) -> None:
        """Write a batch with the store's durability. With a change log attached, the
        batch's movable changes go to the log first (the hook returns once the log has
        them, or raises and nothing is written here), and the partitions' new log
        positions are part of the same local batch."""
        if not wb.ops or self._log is None:
            self.db.write(wb.wb, self._write_opt)
            return
        with self.log_lock:        # log order = local order, and no snapshot in between
            for p, pos in self._log(wb.ops).items():
                wb.wb.put(position_key(p), pos.pack(), self.handle["meta"])
            self.db.write(wb.wb, self._write_opt)

    def attach_log(self, partitions: Iterable[int],
                   hook: Callable[[dict[int, list[Op]]], dict[int, Position]]) -> None:
        """From now on, every write's changes to `partitions` go through `hook` (the
        change-log writer) before they reach RocksDB."""
        self.logged_partitions = frozenset(partitions)
        self._log = hook

    # -- raw loads for the write-back cache -------------------------------------------------
    def load_nodes(self, node_ids: list[str], collided: set[str] | None = None) -> dict[str, NodeState]:
        """Multi-get node records; ids not stored are absent from the result. An id whose
        8-byte key holds another node's record (a hash collision) goes into `collided`
        when given, else raises: nodes are never mixed."""
        if not node_ids:
            return {}
        raws = self.cf["nodes"].get([self.keys.key(n) for n in node_ids])
        out = {}
        for node_id, raw in zip(node_ids, raws):
            if raw is not None:
                s = NodeState.unpack(raw)
                if s.id != node_id:  # an 8-byte hash collision: refuse rather than mix nodes
                    if collided is None:
                        raise StoreError(f"node key collision between {s.id!r} and {node_id!r}")
                    collided.add(node_id)
                    continue
                out[node_id] = s
        return out

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            if not self.follower:
                self.db.flush()
            self._release()

    def _release(self) -> None:
        """Close the DB; column-family handles keep RocksDB's lock alive, so drop them first."""
        self.cf.clear()
        self.handle.clear()
        self.db.close()

    def __enter__(self) -> "GraphStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _pack_entity(e: Entity) -> bytes:
    return msgpack.packb([e.node, e.ts, e.text, e.attrs,
                          list(e.image_emb) if e.image_emb is not None else None])


def _unpack_entity(raw: bytes) -> Entity:
    node, ts, text, attrs, emb = msgpack.unpackb(raw)
    return Entity(node, ts, text, attrs, tuple(emb) if emb is not None else None)


class GraphReader:
    """Read-only view of committed state; every read can be taken "as of" a time."""

    def __init__(self, store: GraphStore) -> None:
        self._store = store
        self._cf = store.cf
        self._key = store.keys.key
        self.rates = store.rates

    def state(self, node_id: str) -> NodeState | None:
        raw = self._cf["nodes"].get(self._key(node_id))
        return None if raw is None else NodeState.unpack(raw)

    def states(self, node_ids: list[str]) -> list[NodeState | None]:
        """Batched reads (one multi-get), for samplers that expand many nodes at once."""
        if not node_ids:
            return []
        raws = self._cf["nodes"].get([self._key(n) for n in node_ids])
        return [None if r is None else NodeState.unpack(r) for r in raws]

    def raw(self, node_ids: list[str]) -> list[tuple[bytes | None, bytes | None]]:
        """Each node's packed record and knowledge vector as stored (None where there is
        none), in two multi-gets: what a worker sends another that samples views through
        its nodes (`state.routed_reader`)."""
        if not node_ids:
            return []
        keys = [self._key(n) for n in node_ids]
        return list(zip(self._cf["nodes"].get(keys), self._cf["knowledge"].get(keys)))

    def node(self, node_id: str, as_of: int | None = None) -> NodeView | None:
        s = self.state(node_id)
        if s is None or (as_of is not None and s.first is not None and s.first > as_of):
            return None
        t = s.last if as_of is None else as_of
        activity = {k: value_at(w, tr, t, self.rates[k[0]]) for k, (w, tr) in s.activity.items()}
        edges = list(s.edge_weights(as_of, self.rates))
        return NodeView(s.id, node_type(s.id), s.first, s.last, s.events, activity,
                        sum(1 for e in edges if e[2] == OUT), sum(1 for e in edges if e[2] == IN))

    def neighbors(self, node_id: str, as_of: int | None = None, k: int | None = None,
                  direction: int | None = None) -> list[EdgeView]:
        """Edges of a node heaviest first (|decayed weight| at `as_of`, default latest)."""
        s = self.state(node_id)
        if s is None:
            return []
        t = s.last if as_of is None else as_of
        out = [EdgeView(n, a, d, w, t - tref, c, f)
               for n, a, d, w, tref, c, f in s.edge_weights(as_of, self.rates)
               if direction is None or d == direction]
        out.sort(key=lambda e: (-abs(e.weight), e.neighbor, e.action))
        return out[:k] if k is not None else out

    def entity(self, node_id: str) -> Entity | None:
        raw = self._cf["entities"].get(self._key(node_id))
        return None if raw is None else _unpack_entity(raw)

    def knowledge(self, node_ids: list[str]) -> dict[str, np.ndarray]:
        """Text vectors of the nodes that have one (one multi-get)."""
        if not node_ids:
            return {}
        raws = self._cf["knowledge"].get([self._key(n) for n in node_ids])
        return {n: np.frombuffer(r, np.float32) for n, r in zip(node_ids, raws) if r is not None}

    def offsets(self) -> dict[tuple[str, int], int]:
        """Last applied offset per (topic, partition)."""
        out = {}
        for k, v in self._iter_prefix("meta", b"o:"):
            topic, p = k[2:-5].decode(), struct.unpack(">I", k[-4:])[0]
            out[(topic, p)] = msgpack.unpackb(v)
        return out

    def reverse_marks(self) -> dict[tuple[int, int], int]:
        """Highest origin offset applied per (reverse partition, origin partition)."""
        return {struct.unpack(">II", k[2:]): msgpack.unpackb(v)
                for k, v in self._iter_prefix("meta", b"r:")}

    def dirty(self) -> dict[str, int]:
        """Nodes waiting for refresh -> oldest event time that made them dirty."""
        return {node: ts for node, ts in (msgpack.unpackb(v) for _, v in self._iter_prefix("dirty", b""))}

    def node_ids(self, partition: int | None = None) -> Iterator[str]:
        prefix = b"" if partition is None else KeyCodec.partition_prefix(partition)
        for _, v in self._iter_prefix("nodes", prefix):
            yield _id_of(v)

    def node_ids_after(self, after: bytes | None, limit: int) -> tuple[list[str], bytes | None]:
        """Up to `limit` node ids in key order, starting after key `after` (None: from the
        start) -> (ids, the last key read, None at the end): a listing that can be taken a
        slice at a time while the store is written, without holding an iterator between."""
        it = self._cf["nodes"].iter()
        try:
            if after is None:
                it.seek_to_first()
            else:
                it.seek(after)
                if it.valid() and it.key() == after:
                    it.next()
            ids, last = [], None
            while it.valid() and len(ids) < limit:
                last = it.key()
                ids.append(_id_of(it.value()))
                it.next()
            return ids, (last if it.valid() else None)
        finally:
            del it

    def count(self, cf: str = "nodes") -> int:
        return sum(1 for _ in self._iter_prefix(cf, b""))

    def size_bytes(self) -> int:
        """Estimated live data (SST + memtables) in bytes, for the state-size metric."""
        db = self._store.db
        total = 0
        for cf in COLUMN_FAMILIES:
            for prop in ("rocksdb.estimate-live-data-size", "rocksdb.cur-size-all-mem-tables"):
                v = self._store.cf[cf].property_int_value(prop)
                total += v or 0
        return total or (db.property_int_value("rocksdb.cur-size-all-mem-tables") or 0)

    def _iter_prefix(self, cf: str, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        it = self._cf[cf].iter()
        try:
            it.seek(prefix)
            while it.valid():
                k = it.key()
                if not k.startswith(prefix):
                    break
                yield k, it.value()
                it.next()
        finally:
            del it
