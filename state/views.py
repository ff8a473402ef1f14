"""View sampling: an anchor plus a sampled neighbourhood, as of a time cutoff.

Two ways of choosing nodes are combined: importance-prioritised expansion (per hop, the
`fanout` neighbours with the highest |decayed weight| x recency) and random walks with
restart whose steps prefer heavier and more recent edges. A teacher view is broad (more hops,
up to 128 nodes), a student view narrow (up to 16). Reads are batched per hop (one multi-get)
and decoded records are cached, since RocksDB point reads are the bottleneck here.

The rules, per view:
- expansion: the anchor has priority infinity; at hop h each node reached at hop h - 1 gives
  each of its `fanout` most important neighbours the score base x importance / h, where base
  is the node's priority at the end of hop h - 1 (1 for the anchor, and for a node that has
  none); a neighbour's priority is the best score it got, its hop the first hop that reached it;
- walks: `walks` walkers of `walk_length` steps (see `ViewSampler._walk`) add 1 / walks to a
  node's priority per visit; a node first reached by a walk has the walk's depth as its hop;
- the view: the anchor, then the `max_nodes - 1` nodes of highest priority (ties by name),
  with every edge between two of them.

The whole batch is sampled with array operations over an `AdjacencyTable`
(`state.adjacency_table`); `testkit/reference_views.py` states the same rules one node
at a time in plain Python, and the tests hold the two equal on random graphs.

No edge whose first event is after the cutoff ever appears, and weights are decayed to it.
The output is a frozen dataclass of numpy arrays; turning it into tensors is encoder's job.
"""
from __future__ import annotations

import operator
from collections import OrderedDict
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import scipy.sparse

from hirflow.state.adjacency_table import EDGE_DTYPE, N_STATS, AdjacencyTable
from hirflow.state.graph import GraphReader
from hirflow.state.node import OUT, NodeState
from hirflow.state.schema import SchemaConfig

FREQUENT_STAT = 5   # the column of the frequent flag
MAX_HOP = 127  # hops from the anchor are stored as int8; farther reads as this


@dataclass(frozen=True)
class ViewConfig:
    max_nodes: int = 16             # view size, anchor included
    hops: int = 2                   # expansion depth
    fanout: int = 6                 # neighbours kept per expanded node, by importance
    walks: int = 8                  # random walks with restart per anchor
    walk_length: int = 3
    restart: float = 0.3            # probability of jumping back to the anchor per step
    recency_half_life_s: float = 7 * 86400.0   # how strongly steps prefer recent edges
    min_events_frequent: int = 5    # nodes with fewer events are "rare" (no hash-ID embedding)

    def __post_init__(self) -> None:
        # <= 256: the batched sampler packs local indices into 8 bits of a sort key
        if not 1 <= self.max_nodes <= 256 or self.hops < 0 or self.fanout < 1:
            raise ValueError(f"bad view config: max_nodes={self.max_nodes}, hops={self.hops}, "
                             f"fanout={self.fanout}")
        if not 0.0 <= self.restart < 1.0:
            raise ValueError(f"restart must be in [0, 1), got {self.restart}")


TEACHER = ViewConfig(max_nodes=128, hops=3, fanout=12, walks=32, walk_length=6)
STUDENT = ViewConfig(max_nodes=16, hops=2, fanout=6, walks=8, walk_length=3)


@dataclass(frozen=True, eq=False)
class View:
    """One sampled view. Local index 0 is the anchor; edges use local indices.

    nodes   tuple[str]       (n,)  node ids
    types   int16            (n,)  index into schema.all_node_types
    hop     int8             (n,)  hops from the anchor at which the node was reached
    stats   float32          (n, N_STATS) behavioural stats as of the cutoff
    edge_src, edge_dst int32 (e,)  local indices, src -> dst as engaged
    edge_action int16        (e,)  index into sorted(schema.all_actions)
    edge_weight float32      (e,)  decayed weight at the cutoff (negative for negative actions)
    edge_age    float32      (e,)  seconds since the edge's latest event, at the cutoff
    """
    anchor: str
    cutoff: int
    nodes: tuple[str, ...]
    types: np.ndarray
    hop: np.ndarray
    stats: np.ndarray
    edge_src: np.ndarray
    edge_dst: np.ndarray
    edge_action: np.ndarray
    edge_weight: np.ndarray
    edge_age: np.ndarray

    @property
    def size(self) -> int:
        return len(self.nodes)


def cold_view(view: View) -> View:
    """The view its anchor would have if it were new: the anchor alone, no edges, no
    behavioural stats (so no hash-id embedding either). Training swaps some student views for
    these so the model learns to place cold nodes from type + world knowledge alone."""
    return View(anchor=view.anchor, cutoff=view.cutoff, nodes=view.nodes[:1],
                types=view.types[:1].copy(), hop=np.zeros(1, np.int8),
                stats=np.zeros((1, N_STATS), np.float32), edge_src=np.zeros(0, np.int32),
                edge_dst=np.zeros(0, np.int32), edge_action=np.zeros(0, np.int16),
                edge_weight=np.zeros(0, np.float32), edge_age=np.zeros(0, np.float32))


def with_prefix(view: View, items: Sequence[str], types: np.ndarray, stats: np.ndarray,
                actions: np.ndarray, weights: np.ndarray, ages: np.ndarray) -> View:
    """`view` with its anchor's own latest engagements added (the trainer's view of a source
    at one of its positives inside a time chunk, which the chunk-start state does not hold
    yet): each item not in the view joins it at hop 1 with its `types` and `stats` rows, and
    an edge anchor -> item with its action, decayed weight and age (seconds) where the anchor
    has no edge to it yet."""
    nodes = list(view.nodes)
    local = {n: i for i, n in enumerate(nodes)}
    new = [k for k, n in enumerate(items) if n not in local]
    for k in new:
        local[items[k]] = len(nodes)
        nodes.append(items[k])
    linked = set(view.edge_dst[view.edge_src == 0].tolist()) | set(view.edge_src[view.edge_dst == 0].tolist())
    add = [k for k, n in enumerate(items) if local[n] not in linked and local[n] != 0]
    return View(anchor=view.anchor, cutoff=view.cutoff, nodes=tuple(nodes),
                types=np.concatenate([view.types, np.asarray(types, view.types.dtype)[new]]),
                hop=np.concatenate([view.hop, np.ones(len(new), view.hop.dtype)]),
                stats=np.concatenate([view.stats, np.asarray(stats, view.stats.dtype)[new]]),
                edge_src=np.concatenate([view.edge_src, np.zeros(len(add), view.edge_src.dtype)]),
                edge_dst=np.concatenate([view.edge_dst, np.array([local[items[k]] for k in add],
                                                                 view.edge_dst.dtype)]),
                edge_action=np.concatenate([view.edge_action,
                                            np.asarray(actions, view.edge_action.dtype)[add]]),
                edge_weight=np.concatenate([view.edge_weight,
                                            np.asarray(weights, view.edge_weight.dtype)[add]]),
                edge_age=np.concatenate([view.edge_age, np.asarray(ages, view.edge_age.dtype)[add]]))


class RecordCache:
    """Decoded node records by id: read in one multi-get when missing, the oldest forgotten
    past `size`. A changed node's record is dropped; with `defer_free` only set aside until
    `release()`: freeing a filled node's record (a few thousand small objects) is slow enough
    to be worth doing after a reply has been sent."""

    def __init__(self, reader: GraphReader, size: int) -> None:
        self.reader = reader
        self.size = size
        self._records: OrderedDict[str, NodeState | None] = OrderedDict()
        self.retired: list[NodeState | None] = []    # dropped records not freed yet

    def get(self, ids: list[str]) -> dict[str, NodeState | None]:
        records = self._records
        missing = [n for n in dict.fromkeys(ids) if n not in records]
        if missing:
            for n, s in zip(missing, self.reader.states(missing)):
                records[n] = s
        out = {n: records[n] for n in ids}
        # forgotten after the answer is taken: a request larger than what is left of the
        # cache (or one whose cached ids are the oldest) still gets every record it asked for
        while len(records) > self.size:
            records.popitem(last=False)
        return out

    def drop(self, ids, defer_free: bool = False) -> None:
        for n in ids:
            record = self._records.pop(n, None)
            if defer_free:
                self.retired.append(record)

    def release(self) -> None:
        self.retired.clear()


class ViewSampler:
    """Samples views from a `GraphReader` (or any object with `states(ids)`), a batch of
    anchors at a time: every step (expand a hop, move the walkers, choose, build) is a few
    array operations over the whole batch, on the rows of an `AdjacencyTable`."""

    def __init__(self, reader: GraphReader, schema: SchemaConfig, config: ViewConfig,
                 seed: int = 0, cache_size: int = 50_000, rank_reuse_ms: int = 60_000) -> None:
        self.reader = reader
        self.cfg = config
        self.schema = schema
        self.rng = np.random.default_rng(seed)
        self.cache = RecordCache(reader, cache_size)
        self.table = AdjacencyTable(schema, 2 * config.fanout, config.recency_half_life_s,
                                    config.min_events_frequent, rank_reuse_ms, limit=4 * cache_size)

    # -- reads ----------------------------------------------------------------------------
    def records(self, ids: list[str]) -> dict[str, NodeState | None]:
        """The records of `ids` that views are sampled from (cached; read when missing)."""
        return self.cache.get(ids)

    def invalidate(self, node_ids, defer_free: bool = False) -> None:
        """Forget what is cached of nodes whose state changed (`RecordCache.drop`)."""
        node_ids = list(node_ids)
        self.cache.drop(node_ids, defer_free)
        self.table.invalidate(node_ids)

    def release(self) -> None:
        """Free the records `invalidate(..., defer_free=True)` set aside."""
        self.cache.release()

    def _ensure(self, ids: np.ndarray, cutoff: int) -> None:
        """Table rows of `ids` that serve `cutoff`, computed from their records if needed."""
        t = self.table
        stale = t.stale(ids, cutoff)
        if len(stale):
            names = [t.names[i] for i in stale.tolist()]
            records = self.records(names)
            t.compute(stale, [records[n] for n in names], cutoff)

    # -- sampling -------------------------------------------------------------------------
    def sample(self, anchors: list[str], cutoff: int,
               rng: np.random.Generator | None = None) -> list[View]:
        """One view per anchor; all anchors of a call share one cutoff and batched reads.
        `rng` (default: the sampler's own) drives the walks: the trainer passes one per batch
        so that which worker samples a batch does not change it."""
        if not anchors:
            return []
        cfg, t = self.cfg, self.table
        if t.full:
            t.clear()
        home = t.intern(anchors)
        reached = _Reached(np.arange(len(anchors), dtype=np.int64), home)
        fv, fn = reached.view.copy(), home
        for hop in range(1, cfg.hops + 1):
            if not len(fn):
                break
            self._ensure(fn, cutoff)
            # a node expands from its priority as of the previous hop (1 for the anchor and
            # for nodes reached without one)
            base = reached.priority(fv, fn)
            base = np.where((base == 0) | np.isinf(base), 1.0, base)
            nb = t.top[fn, :cfg.fanout]
            ok = nb >= 0
            score = (base[:, None] * t.importance[fn, :cfg.fanout] / hop)[ok]
            fv, fn = reached.expand(np.broadcast_to(fv[:, None], nb.shape)[ok],
                                    nb[ok].astype(np.int64), score, hop)
        self._walk(home, cutoff, reached, self.rng if rng is None else rng)
        view, node, hop = reached.choose(cfg.max_nodes - 1, t)
        self._ensure(node, cutoff)
        return self._build(anchors, cutoff, view, node, hop)

    def _walk(self, home: np.ndarray, cutoff: int, reached: "_Reached",
              rng: np.random.Generator) -> None:
        """Random walks with restart, all anchors' walkers stepping together: a step jumps
        back to the anchor with probability `restart` (or when the node has no neighbour),
        else picks one of the node's ranking head with probability proportional to its
        importance; each visit adds 1 / walks to that node's priority."""
        cfg, t = self.cfg, self.table
        if cfg.walks == 0 or cfg.walk_length == 0:
            return
        start = np.repeat(home, cfg.walks)
        view = np.repeat(np.arange(len(home), dtype=np.int64), cfg.walks)
        pos, depth = start.copy(), np.zeros(len(start), np.int64)
        cols = np.arange(t.width)
        rows = np.arange(len(pos))
        keys, depths = [], []
        for _step in range(cfg.walk_length):
            self._ensure(pos, cutoff)
            u = rng.random((len(pos), 2))
            n = t.top_len[pos]
            last = np.maximum(n - 1, 0)
            cum = t.cumulative[pos]
            x = u[:, 1] * cum[rows, last]
            # the first head entry whose cumulative importance reaches x (bisect_left)
            pick = np.minimum(((cum < x[:, None]) & (cols < n[:, None])).sum(axis=1), last)
            nb = t.top[pos, pick].astype(np.int64)
            back = (u[:, 0] < cfg.restart) | (n == 0)
            pos = np.where(back, start, nb)
            depth = np.where(back, 0, depth + 1)
            moved = ~back & (nb != start)
            keys.append((view[moved] << 32) | nb[moved])
            depths.append(depth[moved])
        reached.visit(np.concatenate(keys), np.concatenate(depths), 1.0 / cfg.walks)

    def _build(self, anchors: list[str], cutoff: int, view: np.ndarray, node: np.ndarray,
               hop: np.ndarray) -> list[View]:
        """Views from the chosen nodes (by view, anchor first): their types, hops and stats,
        and every edge between two nodes of a view, looked up pair by pair in the nodes'
        neighbour-sorted edges (an edge both ends hold is taken from the one listed first)."""
        m, b = self.cfg.max_nodes, len(anchors)
        bounds = np.r_[0, np.cumsum(np.bincount(view, minlength=b))]
        local = np.arange(len(node)) - bounds[view]
        grid = np.full((b, m), -1, np.int64)
        grid[view, local] = np.arange(len(node))               # view, local -> chosen row
        groups = _edge_groups(self.table, node)
        v, src, dst, e = _view_edges(groups, view, local, grid)
        e_bounds = np.r_[0, np.cumsum(np.bincount(v, minlength=b))]
        t = self.table
        names = list(operator.itemgetter(*node.tolist())(t.names)) if len(node) > 1 else \
            [t.names[i] for i in node.tolist()]
        types = t.types[node].astype(np.int16)
        hops = np.minimum(hop, MAX_HOP).astype(np.int8)
        stats = t.stats[node]
        src, dst = src.astype(np.int32), dst.astype(np.int32)
        action, weight, age = e["action"].astype(np.int16), e["weight"].copy(), e["age"].copy()
        views = []
        for i, a in enumerate(anchors):
            p, q, r, s = bounds[i], bounds[i + 1], e_bounds[i], e_bounds[i + 1]
            views.append(View(anchor=a, cutoff=cutoff, nodes=tuple(names[p:q]), types=types[p:q],
                              hop=hops[p:q], stats=stats[p:q], edge_src=src[r:s],
                              edge_dst=dst[r:s], edge_action=action[r:s],
                              edge_weight=weight[r:s], edge_age=age[r:s]))
        return views


@dataclass
class _EdgeGroups:
    """The edges of the chosen nodes between chosen nodes, one block per distinct node, sorted
    by (block, neighbour); one group per (block, neighbour block): the run of its edges (one
    per action and direction), found by a sparse (block + 1) x (block + 1) matrix whose
    entries are group numbers + 1."""
    edges: np.ndarray        # EDGE_DTYPE records
    block: np.ndarray        # each chosen row's block
    n_blocks: int
    group_start: np.ndarray
    group_len: np.ndarray
    groups: scipy.sparse.csr_matrix


def _edge_groups(t: AdjacencyTable, node: np.ndarray) -> _EdgeGroups:
    distinct, block = np.unique(node, return_inverse=True)
    parts = [t.edges[i] for i in distinct.tolist()]
    raw = np.concatenate(parts) if parts else np.zeros((0, EDGE_DTYPE.itemsize), np.uint8)
    edges = raw.view(EDGE_DTYPE).reshape(len(raw))
    lengths = np.fromiter(map(len, parts), np.int64, len(parts))
    to_block = np.full(len(t), -1, np.int64)
    to_block[distinct] = np.arange(len(distinct))
    nbr_block = to_block[edges["nbr"]]
    among = nbr_block >= 0
    edges, nbr_block = edges[among], nbr_block[among]
    own_block = np.repeat(np.arange(len(parts), dtype=np.int64), lengths)[among]
    # distinct ids ascend, so (block, neighbour id) order is (block, neighbour block) order
    starts = np.r_[True, (own_block[1:] != own_block[:-1]) | (nbr_block[1:] != nbr_block[:-1])] \
        if len(edges) else np.zeros(0, bool)
    group_start = np.flatnonzero(starts)
    group_len = np.diff(np.r_[group_start, len(edges)])
    groups = scipy.sparse.csr_matrix(
        (np.arange(1, len(group_start) + 1), nbr_block[group_start],
         np.r_[0, np.cumsum(np.bincount(own_block[group_start], minlength=len(parts) + 1))]),
        shape=(len(parts) + 1, len(parts) + 1))
    return _EdgeGroups(edges, block, len(parts), group_start, group_len, groups)


def _view_edges(g: _EdgeGroups, view: np.ndarray, local: np.ndarray, grid: np.ndarray):
    """Every ordered pair (j, k) of a view, self pairs included, looked up in j's edges; j's
    taken block by block, so that the lookups walk the matrix in order; an empty place of a
    view reads as block `n_blocks`, a row and column without groups. -> (view, src, dst,
    edge record) of one edge per (view, src, dst, action), from the end listed first."""
    m = grid.shape[1]
    block = g.block
    by_block = np.argsort(block, kind="stable")
    grid_block = np.where(grid >= 0, block[np.maximum(grid, 0)], g.n_blocks)
    found = np.asarray(g.groups[np.repeat(block[by_block], m),
                                grid_block[view[by_block]].ravel()]).ravel()
    at_pair = np.flatnonzero(found)
    gi = found[at_pair] - 1
    j_row = by_block[at_pair // m]
    k_row = grid[view[j_row], at_pair % m]
    lo, count = g.group_start[gi], g.group_len[gi]
    pair = np.repeat(np.arange(len(lo)), count)
    at = np.repeat(lo - np.cumsum(np.r_[0, count[:-1]]), count) + np.arange(len(pair))
    j, k = local[j_row[pair]], local[k_row[pair]]
    out = g.edges["dir"][at] == OUT
    action = g.edges["action"][at].astype(np.int64)
    src, dst = np.where(out, j, k), np.where(out, k, j)
    v = view[j_row[pair]]
    # one edge per (view, src, dst, action), from the end listed first (lowest j); in
    # that order: one int64 key, 8 bits per local index and action, the view above
    key = (((v << 8 | src) << 8 | dst) << 8 | action) << 8 | j
    order = np.argsort(key)
    key = key[order] >> 8
    first = np.r_[True, key[1:] != key[:-1]] if len(key) else np.zeros(0, bool)
    order = order[first]
    return v[order], src[order], dst[order], g.edges[at[order]]


class _Reached:
    """The nodes each view has reached so far: sorted keys (view << 32 | node) with their
    priority (0: none yet; inf: the anchor) and the hop at which they were first reached."""

    def __init__(self, view: np.ndarray, home: np.ndarray) -> None:
        self.view = view
        keys = (view << 32) | home
        self.keys = keys                      # one anchor per view, views ascending: sorted
        self.prio = np.full(len(keys), np.inf)
        self.hop = np.zeros(len(keys), np.int64)

    def _find(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        idx = np.searchsorted(self.keys, keys)
        found = np.zeros(len(keys), bool)
        inside = idx < len(self.keys)
        found[inside] = self.keys[idx[inside]] == keys[inside]
        return idx, found

    def _insert(self, keys: np.ndarray, prio: np.ndarray, hop: np.ndarray) -> None:
        k = np.concatenate([self.keys, keys])
        order = np.argsort(k, kind="stable")
        self.keys = k[order]
        self.prio = np.concatenate([self.prio, prio])[order]
        self.hop = np.concatenate([self.hop, hop])[order]

    def priority(self, view: np.ndarray, node: np.ndarray) -> np.ndarray:
        idx, found = self._find((view << 32) | node)
        return np.where(found, self.prio[np.minimum(idx, len(self.keys) - 1)], 0.0)

    def expand(self, view: np.ndarray, node: np.ndarray, score: np.ndarray,
               hop: int) -> tuple[np.ndarray, np.ndarray]:
        """Neighbours reached at `hop` with these scores: priorities rise to the best score,
        new nodes enter at this hop; returns the new ones (the next frontier)."""
        keys = (view << 32) | node
        order = np.lexsort((-score, keys))
        keys, score = keys[order], score[order]
        best = np.r_[True, keys[1:] != keys[:-1]] if len(keys) else np.zeros(0, bool)
        keys, score = keys[best], score[best]
        idx, found = self._find(keys)
        at = idx[found]
        self.prio[at] = np.maximum(self.prio[at], score[found])
        new = keys[~found]
        self._insert(new, score[~found], np.full(len(new), hop, np.int64))
        return new >> 32, new & 0xFFFFFFFF

    def visit(self, keys: np.ndarray, depth: np.ndarray, inc: float) -> None:
        """Walk visits in the order they happened: a node not reached before enters at the
        depth of its first visit; each visit adds `inc` to the priority (one addition per
        visit, as a walk would)."""
        if not len(keys):
            return
        keys, first, count = np.unique(keys, return_index=True, return_counts=True)
        _, found = self._find(keys)
        self._insert(keys[~found], np.zeros(int((~found).sum())), depth[first[~found]])
        idx, _ = self._find(keys)
        prio = self.prio[idx]
        for c in range(1, int(count.max()) + 1):
            more = count >= c
            prio[more] += inc
        self.prio[idx] = prio

    def choose(self, k: int, table: AdjacencyTable) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per view, the anchor and then the `k` nodes of highest priority (ties by name),
        as (view, node, hop) rows ordered by view."""
        view, node = self.keys >> 32, self.keys & 0xFFFFFFFF
        anchor = np.isinf(self.prio)
        cand = ~anchor & (self.prio > 0)
        v, n, p, h = view[cand], node[cand], self.prio[cand], self.hop[cand]
        order = table.order_by(v, p, n)
        v, n, h = v[order], n[order], h[order]
        views = len(self.view)
        start = np.searchsorted(v, np.arange(views))
        keep = np.arange(len(v)) - start[v] < k
        v, n, h = v[keep], n[keep], h[keep]
        # rows by view, each view's anchor first: the anchor of view i goes after the chosen
        # nodes of the views before it, each chosen node after its view's anchor
        before = np.r_[0, np.cumsum(np.bincount(v, minlength=views))[:-1]]
        at_anchor = np.arange(views) + before
        rows = len(v) + views
        out_v, out_n, out_h = (np.empty(rows, np.int64) for _ in range(3))
        out_v[at_anchor], out_n[at_anchor], out_h[at_anchor] = view[anchor], node[anchor], self.hop[anchor]
        at = np.arange(len(v)) - before[v] + at_anchor[v] + 1
        out_v[at], out_n[at], out_h[at] = v, n, h
        return out_v, out_n, out_h
