"""The view sampler as a plain-Python reference: one anchor, one neighbour, one edge at a time,
with dicts. `hirflow.state.views.ViewSampler` computes the same views for whole batches with
numpy; tests compare the two on random graphs. Kept simple rather than fast.

One rule differs from a naive sequential expansion and is the documented one: a node expanded
at hop h starts from its priority as it stood at the end of hop h - 1 (a snapshot), so the
order in which a hop's frontier is expanded does not change the views.
"""
from __future__ import annotations

import bisect
import itertools
import math
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from hirflow.state.node import IN, OUT, NodeState
from hirflow.state.schema import SchemaConfig
from hirflow.state.views import MAX_HOP, N_STATS, RecordCache, View, ViewConfig


class ReferenceSampler:
    """Samples views from a `GraphReader` (or any object with `states(ids)`), one at a time."""

    def __init__(self, reader, schema: SchemaConfig, config: ViewConfig,
                 seed: int = 0, cache_size: int = 50_000, rank_reuse_ms: int = 60_000) -> None:
        self.reader = reader
        self.cfg = config
        self.rates = {a: s.decay_rate for a, s in schema.all_actions.items()}
        self.schema = schema
        self.action_index = schema.action_codes()
        self.rng = np.random.default_rng(seed)
        self.cache = RecordCache(reader, cache_size)
        self._cache_size = cache_size
        self._rank_cache: OrderedDict[str, tuple[int, _NodeInfo]] = OrderedDict()
        self._walk_cache: dict[str, tuple] = {}
        self.rank_reuse_ms = rank_reuse_ms
        self._recency = math.log(2) / (config.recency_half_life_s * 1000.0)

    # -- reads ----------------------------------------------------------------------------
    def records(self, ids: list[str]) -> dict[str, NodeState | None]:
        return self.cache.get(ids)

    def invalidate(self, node_ids, defer_free: bool = False) -> None:
        node_ids = list(node_ids)
        self.cache.drop(node_ids, defer_free)
        for n in node_ids:
            self._rank_cache.pop(n, None)
            self._walk_cache.pop(n, None)

    def release(self) -> None:
        self.cache.release()

    def _info(self, s: NodeState | None, cutoff: int) -> "_NodeInfo":
        """What sampling needs of a node as of the cutoff, computed in one pass over its
        edges and cached for cutoffs within `rank_reuse_ms` (orderings change slowly);
        `invalidate` drops a node whose edges changed."""
        if s is None:
            return _EMPTY
        hit = self._rank_cache.get(s.id)
        if hit is not None and abs(hit[0] - cutoff) <= self.rank_reuse_ms:
            return hit[1]
        info = self._compute(s, cutoff)
        self._rank_cache[s.id] = (cutoff, info)
        if len(self._rank_cache) > self._cache_size:
            self._rank_cache.popitem(last=False)
        return info

    def _compute(self, s: NodeState, cutoff: int) -> "_NodeInfo":
        best: dict[str, float] = {}
        by_nbr: dict[str, tuple] = {}
        # numpy's exp, as the batched sampler uses: libm's can differ in the last bit, and a
        # last-bit difference decides between two neighbours of mathematically equal importance
        rates, rec, exp, codes = self.rates, self._recency, np.exp, self.action_index
        deg = [0, 0]
        recent = 0.0
        for (nbr, action, d), (w, tref, _, first) in s.edges.items():
            if first > cutoff:
                continue
            rate = rates[action]
            dt = cutoff - tref if cutoff > tref else 0
            wt = w * exp(-rate * dt) if rate else w
            fresh = exp(-rec * dt)
            recent += fresh
            imp = abs(wt) * fresh
            if imp > best.get(nbr, 0.0):
                best[nbr] = imp
            # tuples, not lists: a tuple of numbers drops out of the cyclic GC, while each of
            # these lists (one per neighbour of every cached node) was walked by every full
            # collection
            by_nbr[nbr] = by_nbr.get(nbr, ()) + ((codes[action], d, wt, dt),)
            deg[d] += 1
        day = 86_400_000.0
        stats = (math.log1p(s.events), math.log1p(deg[OUT]), math.log1p(deg[IN]),
                 math.log1p(max(0.0, cutoff - s.first) / day) if s.first is not None else 0.0,
                 math.log1p(max(0.0, cutoff - s.last) / day) if s.last is not None else 0.0,
                 1.0 if s.events >= self.cfg.min_events_frequent else 0.0, math.log1p(recent))
        return _NodeInfo(sorted(((v, n) for n, v in best.items()), reverse=True), by_nbr, stats)

    # -- sampling -------------------------------------------------------------------------
    def sample(self, anchors: list[str], cutoff: int,
               rng: np.random.Generator | None = None) -> list[View]:
        """One view per anchor; all anchors of a call share one cutoff and batched reads.
        `rng` (default: the sampler's own) drives the walks: the trainer passes one per batch
        so that which worker samples a batch does not change it."""
        cfg = self.cfg
        prio: list[dict[str, float]] = [{a: math.inf} for a in anchors]
        hops: list[dict[str, int]] = [{a: 0} for a in anchors]
        ranked: dict[str, list[tuple[float, str]]] = {}
        frontier = [[a] for a in anchors]
        for hop in range(1, cfg.hops + 1):
            before = [dict(p) for p in prio]     # each node expands from its priority as of the last hop
            need = [n for f in frontier for n in f if n not in ranked]
            for n, s in self.records(need).items():
                ranked[n] = self._info(s, cutoff).ranked
            nxt = []
            for i, f in enumerate(frontier):
                new = []
                for n in f:
                    base = before[i].get(n, 1.0)
                    base = 1.0 if math.isinf(base) else base
                    for imp, nb in ranked[n][:cfg.fanout]:
                        score = base * imp / hop
                        if nb not in hops[i]:
                            hops[i][nb] = hop
                            new.append(nb)
                        if score > prio[i].get(nb, 0.0):
                            prio[i][nb] = score
                nxt.append(new)
            frontier = nxt
        self._walk(anchors, cutoff, prio, hops, ranked, self.rng if rng is None else rng)
        chosen = []
        for i, a in enumerate(anchors):
            rest = sorted(((p, n) for n, p in prio[i].items() if n != a), key=lambda x: (-x[0], x[1]))
            chosen.append([a] + [n for _, n in rest[:cfg.max_nodes - 1]])
        states = self.records([n for c in chosen for n in c])
        return [self._build(a, cutoff, c, hops[i], states) for i, (a, c) in enumerate(zip(anchors, chosen))]

    def _walk(self, anchors, cutoff, prio, hops, ranked, rng: np.random.Generator) -> None:
        """Random walks with restart, all anchors stepping together (one batched read per
        step); a step picks a neighbour with probability proportional to its importance;
        each visit adds to that node's priority."""
        cfg = self.cfg
        if cfg.walks == 0 or cfg.walk_length == 0:
            return
        W = cfg.walks
        pos = [a for a in anchors for _ in range(W)]
        depth = [0] * len(pos)
        inc = 1.0 / W
        for _step in range(cfg.walk_length):
            need = [n for n in dict.fromkeys(pos) if n not in ranked]
            if need:
                for n, st in self.records(need).items():
                    ranked[n] = self._info(st, cutoff).ranked
            u = rng.random((len(pos), 2))
            for j, here in enumerate(pos):
                i = j // W
                a = anchors[i]
                info = self._walk_info(here, ranked)
                if u[j, 0] < cfg.restart or info is None:
                    pos[j], depth[j] = a, 0
                    continue
                names, cum = info
                nb = names[min(len(names) - 1, bisect.bisect_left(cum, u[j, 1] * cum[-1]))]
                pos[j], depth[j] = nb, depth[j] + 1
                if nb != a:
                    hops[i].setdefault(nb, depth[j])
                    p = prio[i].get(nb, 0.0)
                    prio[i][nb] = p + inc if not math.isinf(p) else p

    def _walk_info(self, node: str, ranked) -> tuple[list[str], list[float]] | None:
        """Names and cumulative importance of a node's top 2 x fanout neighbours."""
        hit = self._walk_cache.get(node)
        r = ranked[node]
        if hit is not None and hit[0] is r:
            return hit[1]
        opts = r[:self.cfg.fanout * 2]
        out = None
        if opts and opts[0][0] > 0:
            out = ([n for _, n in opts], list(itertools.accumulate(v for v, _ in opts)))
        self._walk_cache[node] = (r, out)
        if len(self._walk_cache) > self._cache_size:
            self._walk_cache.pop(next(iter(self._walk_cache)))
        return out

    def _build(self, anchor: str, cutoff: int, nodes: list[str], hops: dict[str, int],
               states: dict[str, NodeState | None]) -> View:
        local = {n: j for j, n in enumerate(nodes)}
        infos = [self._info(states.get(n), cutoff) for n in nodes]
        edges: dict[tuple[int, int, int], tuple[float, int]] = {}
        for j, info in enumerate(infos):
            by_nbr = info.by_nbr
            # C-level intersection instead of n x n lookups; an edge is seen from both ends
            # (both records hold it, unless one evicted it): the first one kept
            for other in by_nbr.keys() & local.keys():
                k = local[other]
                for action, d, wt, dt in by_nbr[other]:
                    key = (j, k, action) if d == OUT else (k, j, action)
                    if key not in edges:
                        edges[key] = (wt, dt)
        # sorted: set order follows the per-process string hash, edge order must not
        keys = sorted(edges)
        vals = [edges[k] for k in keys]
        return View(
            anchor=anchor, cutoff=cutoff, nodes=tuple(nodes),
            types=np.array(self.schema.model_type_codes(nodes), np.int16),
            hop=np.array([min(hops.get(n, 0), MAX_HOP) for n in nodes], np.int8),
            stats=np.array([info.stats for info in infos], np.float32).reshape(len(nodes), N_STATS),
            edge_src=np.array([k[0] for k in keys], np.int32),
            edge_dst=np.array([k[1] for k in keys], np.int32),
            edge_action=np.array([k[2] for k in keys], np.int16),
            edge_weight=np.array([v[0] for v in vals], np.float32),
            edge_age=np.array([v[1] / 1000.0 for v in vals], np.float32),
        )


@dataclass(frozen=True)
class _NodeInfo:
    ranked: list            # [(importance, neighbour)] heaviest first
    by_nbr: dict            # neighbour -> [(action code, direction, weight at cutoff, age ms)]
    stats: tuple            # N_STATS floats


_EMPTY = _NodeInfo([], {}, (0.0,) * N_STATS)
