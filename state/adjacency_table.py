"""What view sampling needs of each node as of a cutoff, held as arrays.

`ViewSampler` expands, walks and builds views for a whole batch of anchors at once with
numpy; this table is what it reads. Node ids are interned to small integers on first sight,
and per interned node it holds, computed from the node's record as of a cutoff:

- the head of its neighbour ranking: the `width` neighbours with the highest importance
  (|weight decayed to the cutoff| x recency of the edge, best edge per neighbour, only
  neighbours of importance > 0; ties by name, descending), with cumulative importances for
  the walks' weighted steps;
- its behavioural stats (`N_STATS` floats);
- its edges as of the cutoff, sorted by neighbour, from which views take the edges between
  their nodes: `EDGE_DTYPE` records held as raw bytes (one row of `EDGE_DTYPE.itemsize`
  bytes per edge), since concatenating thousands of plain byte arrays is a memory copy and
  concatenating structured arrays checks their fields array by array.

A row computed for one cutoff serves cutoffs within `reuse_ms` of it (orderings change
slowly); `invalidate` drops the rows of nodes whose record changed. Records of a batch are
computed together: each record's edges are transposed into columns by `zip` (C, not a
Python step per edge), then decay, ranking and stats run over all of them as arrays.

The table grows with every node seen; past `limit` interned nodes the sampler clears it
between batches (it is a cache: everything in it can be computed again).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from hirflow.state.decay import rate_from_half_life, values_at
from hirflow.state.node import IN, OUT, NodeState, edge_lists
from hirflow.state.schema import SchemaConfig

N_STATS = 7   # log1p(events), log1p(deg out), log1p(deg in), log1p(days since first seen),
              # log1p(days since last seen), frequent flag, log1p(recent edges: each edge
              # weighs 1 halved per recency half-life of its age: how many neighbours engaged
              # lately, the trend an item's popularity follows); models saved with 6 read 6
NOT_COMPUTED = -(2 ** 62)   # the cutoff of a row never computed (far from any real cutoff)
DAY_MS = 86_400_000.0
EDGE_DTYPE = np.dtype([("nbr", np.int32), ("action", np.int16), ("dir", np.int8),
                       ("weight", np.float32), ("age", np.float32)])
NO_EDGES = np.zeros((0, EDGE_DTYPE.itemsize), np.uint8)


class AdjacencyTable:
    """Interned nodes and, per node, its ranking head, stats and edges as of a cutoff."""

    def __init__(self, schema: SchemaConfig, width: int, recency_half_life_s: float,
                 min_events_frequent: int, reuse_ms: int, limit: int) -> None:
        self.schema = schema
        self.width = width
        self.codes = schema.action_codes()
        self.rates = np.array([schema.all_actions[a].decay_rate for a in sorted(schema.all_actions)],
                              np.float64)
        self.recency = rate_from_half_life(recency_half_life_s)
        self.min_events_frequent = min_events_frequent
        self.reuse_ms = reuse_ms
        self.limit = limit
        self.clear()

    def clear(self) -> None:
        """Forget every node (ids handed out before are no longer valid)."""
        self.ids: dict[str, int] = {}
        self.names: list[str] = []
        self.types = np.zeros(0, np.int16)
        self.cutoff = np.zeros(0, np.int64)             # the cutoff each row was computed at
        self.top = np.zeros((0, self.width), np.int32)   # ranking head, -1 past its end
        self.importance = np.zeros((0, self.width), np.float64)
        self.cumulative = np.zeros((0, self.width), np.float64)
        self.top_len = np.zeros(0, np.int64)
        self.stats = np.zeros((0, N_STATS), np.float32)
        self.edges: list[np.ndarray] = []               # raw `EDGE_DTYPE` rows per node

    @property
    def full(self) -> bool:
        return len(self.names) > self.limit

    def __len__(self) -> int:
        return len(self.names)

    # -- ids ------------------------------------------------------------------------------
    def intern(self, names: Sequence[str]) -> np.ndarray:
        """The ids of `names` (int64), new names added."""
        ids = self.ids
        new = [n for n in dict.fromkeys(names) if n not in ids]
        if new:
            start = len(self.names)
            ids.update(zip(new, range(start, start + len(new))))
            self.names += new
            self._grow(len(self.names))
            self.types[start:start + len(new)] = self.schema.model_type_codes(new)
        return np.fromiter(map(ids.__getitem__, names), np.int64, len(names))

    def _grow(self, n: int) -> None:
        cap = len(self.cutoff)
        if n > cap:
            new_cap = max(n, 2 * cap, 1024)

            def grown(a: np.ndarray, fill) -> np.ndarray:
                out = np.full((new_cap,) + a.shape[1:], fill, a.dtype)
                out[:cap] = a
                return out
            self.types = grown(self.types, 0)
            self.cutoff = grown(self.cutoff, NOT_COMPUTED)
            self.top = grown(self.top, -1)
            self.importance = grown(self.importance, 0.0)
            self.cumulative = grown(self.cumulative, 0.0)
            self.top_len = grown(self.top_len, 0)
            self.stats = grown(self.stats, 0.0)
        self.edges += [NO_EDGES] * (n - len(self.edges))

    def invalidate(self, names) -> None:
        """Rows of these nodes are computed again when next needed."""
        ids = self.ids
        for n in names:
            i = ids.get(n)
            if i is not None:
                self.cutoff[i] = NOT_COMPUTED

    # -- rows -----------------------------------------------------------------------------
    def stale(self, ids: np.ndarray, cutoff: int) -> np.ndarray:
        """The distinct ids among `ids` whose row does not serve `cutoff`."""
        ids = np.unique(ids)
        return ids[np.abs(self.cutoff[ids] - cutoff) > self.reuse_ms]

    def compute(self, ids: np.ndarray, states: Sequence[NodeState | None], cutoff: int) -> None:
        """Rows of `ids` (distinct) from their records `states` as of `cutoff`."""
        m = len(ids)
        events = np.zeros(m, np.float64)
        present = np.zeros(m, bool)
        seen = np.full((m, 2), np.nan)                   # first, last event time
        for i, s in enumerate(states):
            if s is not None:
                events[i], present[i] = s.events, True
                seen[i] = (np.nan if s.first is None else s.first, np.nan if s.last is None else s.last)
        e = edge_lists(states)
        nbrs, acts, dirs, w, tref, first = e.nbr, e.action, e.direction, e.w, e.t_ref, e.first
        counts = np.array(e.counts, np.int64)
        owner = np.repeat(np.arange(m), counts)
        nbr = self.intern(nbrs)
        act = np.fromiter(map(self.codes.__getitem__, acts), np.int16, len(acts))
        d = np.array(dirs, np.int8)
        w_ = np.array(w, np.float64)
        tref_ = np.array(tref, np.int64)
        keep = np.array(first, np.int64) <= cutoff        # no edge from after the cutoff
        owner, nbr, act, d, w_, tref_ = owner[keep], nbr[keep], act[keep], d[keep], w_[keep], tref_[keep]
        dt = np.maximum(cutoff - tref_, 0)
        rate = self.rates[act]
        wt = values_at(w_, cutoff - dt, cutoff, rate)       # an edge newer than the cutoff: as is
        fresh = values_at(np.ones(len(dt)), cutoff - dt, cutoff, self.recency)
        imp = np.abs(wt) * fresh

        day = DAY_MS
        with np.errstate(invalid="ignore"):
            since = np.log1p(np.maximum(0.0, cutoff - seen) / day)
        stats = np.stack([
            np.log1p(events),
            np.log1p(np.bincount(owner[d == OUT], minlength=m)),
            np.log1p(np.bincount(owner[d == IN], minlength=m)),
            np.nan_to_num(since[:, 0], nan=0.0), np.nan_to_num(since[:, 1], nan=0.0),
            (present & (events >= self.min_events_frequent)).astype(np.float64),
            np.log1p(np.bincount(owner, weights=fresh, minlength=m)),
        ], axis=1)
        self.stats[ids] = stats.astype(np.float32)

        self._rank(ids, owner, nbr, imp)

        # edges sorted by neighbour per node: a view finds those between its nodes by pair
        order = np.lexsort((nbr, owner))
        rows = np.empty(len(order), EDGE_DTYPE)
        rows["nbr"], rows["action"], rows["dir"] = nbr[order], act[order], d[order]
        rows["weight"], rows["age"] = wt[order], dt[order] / 1000.0
        rows = rows.view(np.uint8).reshape(len(rows), EDGE_DTYPE.itemsize)
        bounds = np.searchsorted(owner[order], np.arange(m + 1))
        edges = self.edges
        for i, node in enumerate(ids.tolist()):
            edges[node] = rows[bounds[i]:bounds[i + 1]]
        self.cutoff[ids] = cutoff

    def _rank(self, ids: np.ndarray, owner: np.ndarray, nbr: np.ndarray, imp: np.ndarray) -> None:
        """The ranking head of each node: best importance per neighbour, heaviest first, ties
        by neighbour name descending."""
        pos = imp > 0
        o, n, v = owner[pos], nbr[pos], imp[pos]
        order = np.lexsort((-v, n, o))                   # best edge of each neighbour first
        o, n, v = o[order], n[order], v[order]
        head = np.r_[True, (o[1:] != o[:-1]) | (n[1:] != n[:-1])] if len(o) else np.zeros(0, bool)
        o, n, v = o[head], n[head], v[head]
        order = self.order_by(o, v, n, names_descending=True)
        o, n, v = o[order], n[order], v[order]
        start = np.searchsorted(o, np.arange(len(ids)))
        at = np.arange(len(o)) - start[o]
        keep = at < self.width
        self.top[ids] = -1
        self.importance[ids] = 0.0
        self.top[ids[o[keep]], at[keep]] = n[keep]
        self.importance[ids[o[keep]], at[keep]] = v[keep]
        self.cumulative[ids] = np.cumsum(self.importance[ids], axis=1)
        self.top_len[ids] = np.minimum(np.bincount(o, minlength=len(ids)), self.width)

    def order_by(self, group: np.ndarray, value: np.ndarray, nodes: np.ndarray,
                 names_descending: bool = False) -> np.ndarray:
        """The order of rows (group, value, node) by group, then value descending, then the
        node's name (ascending, or descending with `names_descending`). Names are compared
        only where two rows of a group tie on value, which is rare for importances; the
        rows of each tie are then reordered among themselves."""
        order = np.lexsort((-value, group))
        if len(order) < 2:
            return order
        g, v = group[order], value[order]
        eq = (g[1:] == g[:-1]) & (v[1:] == v[:-1])
        if not eq.any():
            return order
        tied = np.r_[eq, False] | np.r_[False, eq]        # sorted positions in some tie
        distinct = np.unique(nodes[order[tied]])
        names = self.names
        by_name = sorted(range(len(distinct)), key=lambda i: names[distinct[i]],
                         reverse=names_descending)
        ranks = np.empty(len(distinct), np.int64)
        ranks[by_name] = np.arange(len(distinct))
        rank = np.zeros(len(order), np.int64)
        rank[tied] = ranks[np.searchsorted(distinct, nodes[order[tied]])]
        run = np.cumsum(np.r_[True, ~eq])                 # one run per (group, value)
        return order[np.lexsort((rank, run))]
