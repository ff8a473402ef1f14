"""The write path: a write-back cache of hot node records, flushed with offsets atomically.

RocksDB here does ~300k puts/s in a batch but only ~150k point gets/s, so a read-modify-write
per event cannot keep up. The writer keeps recently touched `NodeState`s in memory, loads
misses for a whole consumed batch with one multi-get, applies events to memory, and `commit`
writes every changed record, the dirty markers and the consumed offsets in one WriteBatch.
A crash before `commit` loses only memory: the consumer resumes after the stored offsets.

The ingest thread and the entity agent (through `entities`, `state.entity_writer`) both
write through one writer and hold `lock` while they do; the refresh thread never touches the writer's records, only its `DirtyQueue`
(`dirty`), which has its own lock.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from typing import Iterable, Mapping

import numpy as np

from hirflow.state.decay import group_sums
from hirflow.state.dirty_queue import DirtyQueue
from hirflow.state.entity_writer import EntityWriter
from hirflow.state.events import Engagement
from hirflow.state.graph import GraphConfig, GraphStore
from hirflow.state.node import IN, OUT, NodeState
from hirflow.state.retention import RetentionSweep

log = logging.getLogger(__name__)

SRC_SIDE, DST_SIDE = 1, 2
BOTH_SIDES = SRC_SIDE | DST_SIDE


def sum_per_edge(items: list[tuple[Engagement, int]], rates: Mapping[str, float],
                 signs: Mapping[str, int]) -> dict[tuple, tuple]:
    """(src, dst, action, sides) -> (w, t_ref, events, first ts, t_ref): each edge's events
    summed with the decay algebra (`state.decay.group_sums`, one numpy pass); `rates` and
    `signs` per action."""
    index: dict[tuple, int] = {}
    n = len(items)
    key = np.fromiter((index.setdefault((ev.src, ev.dst, ev.action, sides), len(index))
                       for ev, sides in items), np.int64, n)
    w = np.fromiter((ev.w * signs[ev.action] for ev, _ in items), np.float64, n)
    t = np.fromiter((ev.ts for ev, _ in items), np.int64, n)
    rate = np.fromiter((rates[ev.action] for ev, _ in items), np.float64, n)
    _, _, sw, tref = group_sums(key, w, t, rate)      # keys come out as 0 .. len(index)-1
    count = np.bincount(key, minlength=len(index))
    first = tref.copy()
    np.minimum.at(first, key, t)
    return {edge: (w_, tr, c, f, tr) for edge, w_, tr, c, f in
            zip(index, sw.tolist(), tref.tolist(), count.tolist(), first.tolist())}


class GraphWriter:
    """Applies engagements and entities to state; one writer per store."""

    def __init__(self, store: GraphStore, config: GraphConfig) -> None:
        self.store = store
        self.config = config
        self.rates = store.rates
        self.signs = {a: spec.sign for a, spec in store.schema.all_actions.items()}
        self._cache: OrderedDict[str, NodeState] = OrderedDict()
        self._changed: set[str] = set()      # nodes changed since the last commit
        self._key_owner: dict[bytes, str] = {}   # store key -> the cached node that has it
        self.retention = RetentionSweep(store, config)
        self._edge_count: dict[str, int] = {}     # cached node -> its edges when last counted
        self._edges_cached = 0                    # their sum: the cache's size in edges
        self.dirty = DirtyQueue(store.reader.dirty())
        self.offsets: dict[tuple[str, int], int] = store.reader.offsets()
        self._offsets_new: dict[tuple[str, int], int] = {}
        self.reverse_marks: dict[tuple[int, int], int] = store.reader.reverse_marks()
        self._marks_new: dict[tuple[int, int], int] = {}
        self.lock = threading.RLock()   # held by the ingest thread and the entity agent
        self.entities = EntityWriter(store, self.dirty, self.lock, self.offsets)
        self.evicted_edges = 0

    # -- engagements ----------------------------------------------------------------------
    def prefetch(self, node_ids: Iterable[str]) -> set[str]:
        """Load the records of these nodes that are not cached, in one multi-get -> the ids
        that cannot be applied because their 8-byte key belongs to another node (a hash
        collision, with a stored or a cached node); those are never cached."""
        cache, owner, key = self._cache, self._key_owner, self.store.keys.key
        missing, collided = [], set()
        for n in set(node_ids):
            if n in cache:
                cache.move_to_end(n)    # keep hot records: eviction drops the oldest first
            elif owner.get(key(n), n) != n:
                collided.add(n)
            else:
                missing.append(n)
        if missing:
            loaded = self.store.load_nodes(missing, collided)
            for n in missing:
                if n in collided:
                    continue
                k = key(n)
                if owner.setdefault(k, n) != n:      # two new ids of one key in this call
                    collided.add(n)
                    continue
                s = cache[n] = loaded.get(n) or NodeState(n)
                self._edge_count[n] = len(s.edges)
                self._edges_cached += len(s.edges)
        if collided:
            log.error("node key collision: %d node ids refused (e.g. %r)", len(collided),
                      next(iter(collided)))
        return collided

    def apply(self, ev: Engagement, sides: int = BOTH_SIDES) -> None:
        """Apply one engagement to the sides this worker owns; marks them dirty."""
        self.apply_batch([(ev, sides)])

    def apply_batch(self, items: list[tuple[Engagement, int]]) -> set[str]:
        """Apply many engagements: events of the same edge are first summed with the decay
        algebra (associative), so a hub touched 500 times in a batch is updated once per edge.
        -> the node ids refused for a key collision (`prefetch`): engagements touching them
        are not applied; ingest dead-letters them."""
        rates = self.rates
        agg = sum_per_edge(items, self.rates, self.signs)
        collided = self.prefetch([n for (src, dst, _, _) in agg for n in (src, dst)])
        if collided:
            agg = {k: v for k, v in agg.items() if k[0] not in collided and k[1] not in collided}
        cache, limit = self._cache, self.config.top_k
        keep = self.config.top_k - self.config.trim_slack
        touched: dict[str, int] = {}            # node -> its oldest event in this batch
        ahead: dict[str, int] = {}              # node -> its newest event ahead of the clock
        now = int(time.time() * 1000)

        def touch(node: str, ts: int, newest: int) -> None:
            old = touched.get(node)
            if old is None or ts < old:
                touched[node] = ts
            if newest > now and newest > ahead.get(node, -1):
                ahead[node] = newest
        for (src, dst, action, sides), (w, tref, n, first, last) in agg.items():
            rate = rates[action]
            for side, node, other, direction in ((SRC_SIDE, src, dst, OUT), (DST_SIDE, dst, src, IN)):
                if sides & side:
                    s = cache[node]
                    s.apply_sum(other, action, direction, w, tref, n, first, last, rate)
                    if len(s.edges) > limit:
                        self.evicted_edges += s.trim(keep, rates)
                    touch(node, first, last)
        self._changed.update(touched)
        self.dirty.touch_many(touched)
        if ahead:
            self.dirty.defer(ahead)
        return collided

    # -- offsets --------------------------------------------------------------------------
    def applied(self, topic: str, partition: int, offset: int) -> None:
        """Record that everything up to `offset` of this partition is in memory state."""
        self.offsets[(topic, partition)] = offset
        self._offsets_new[(topic, partition)] = offset

    def stored_offset(self, topic: str, partition: int) -> int:
        """Last applied offset, -1 when nothing was applied yet."""
        return self.offsets.get((topic, partition), -1)

    def reverse_applied(self, reverse_partition: int, origin_partition: int, origin_offset: int) -> None:
        key = (reverse_partition, origin_partition)
        self.reverse_marks[key] = origin_offset
        self._marks_new[key] = origin_offset

    def reverse_mark(self, reverse_partition: int, origin_partition: int) -> int:
        return self.reverse_marks.get((reverse_partition, origin_partition), -1)

    # -- retention --------------------------------------------------------------------------
    def expire_slice(self, now_ms: int) -> list[str]:
        """Expire the spent nodes of the next slice of the store (`state.retention`) that are
        neither dirty nor changed since the last commit: their records are deleted and a
        dirty marker written in the same batch, so the refresh removes them from the index
        (`RefreshLoop`); their entities and text vectors stay. -> the expired ids."""
        if not self.config.expire_after_days:
            return []
        with self.lock:
            spent = self.retention.spent(now_ms, lambda n: n in self._changed or n in self.dirty)
            if not spent:
                return []
            markers = {n: now_ms for n in spent}
            self.dirty.mark_durably(markers, lambda: self.store.commit(
                delete_nodes=spent, dirty_put=markers))
            for n in spent:
                self._drop(n)
        return spent

    # -- commit ---------------------------------------------------------------------------
    def commit(self) -> int:
        """Flush changed node records + their dirty markers + the engagement offsets and
        reverse marks in one batch; returns records written. Entities: `entities.commit`."""
        with self.lock:
            changed = [self._cache[n] for n in self._changed]
            for s in changed:                    # recount what this commit cycle changed
                self._edges_cached += len(s.edges) - self._edge_count.get(s.id, 0)
                self._edge_count[s.id] = len(s.edges)
            self.dirty.commit_with(lambda markers: self.store.commit(
                nodes=changed, dirty_put=markers, offsets=self._offsets_new,
                reverse_marks=self._marks_new))
            self._changed.clear()
            self._offsets_new = {}
            self._marks_new = {}
            self._evict()
            return len(changed)

    def _evict(self) -> None:
        """Drop the least recently used clean records beyond the cache's bounds (records and
        edges), with a tenth of the bound's headroom so eviction runs seldom."""
        cfg = self.config
        if len(self._cache) <= cfg.cache_nodes and self._edges_cached <= cfg.cache_edges:
            return
        nodes_to, edges_to = cfg.cache_nodes * 9 // 10, cfg.cache_edges * 9 // 10
        while self._cache and (len(self._cache) > nodes_to or self._edges_cached > edges_to):
            self._drop(next(iter(self._cache)))

    def _drop(self, n: str) -> None:
        """Forget one cached record (clean, or dropped on purpose)."""
        self._cache.pop(n, None)
        self._key_owner.pop(self.store.keys.key(n), None)
        self._edges_cached -= self._edge_count.pop(n, 0)

    @property
    def cached_nodes(self) -> int:
        return len(self._cache)

    def discard_uncommitted(self) -> None:
        """Forget everything since the last commit (used when a commit failed)."""
        with self.lock:
            for n in self._changed:
                self._drop(n)
            self._changed.clear()
            self._offsets_new = {}
            self._marks_new = {}
            self.entities.discard()
            self.dirty.reset(self.store.reader.dirty())
            self.offsets.clear()                 # in place: the entity writer shares it
            self.offsets.update(self.store.reader.offsets())
            self.reverse_marks = self.store.reader.reverse_marks()
