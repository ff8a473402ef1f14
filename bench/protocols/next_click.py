"""The next-click task as session-based recommendation scores it: every engagement of a query
node (a session, or a user) inside a time window is a query, given everything that node did
before it; repeats are allowed (the item clicked next may be one the node clicked before).
HitRate@K (the next item among the top K) and MRR@K (1 / its rank, 0 beyond K) are averaged
over all queries, as session-rec (Ludewig et al.) does; intervals resample whole nodes, since
a session's positions are not independent.

A node's "prefix" at a query is its engagements strictly before the query's time: two clicks
in the same millisecond never see each other, for any method. Ranks break score ties by the
items' popularity before the window, then by index, the same for every method.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Collection, Iterable, Sequence

import numpy as np

from hirflow.state.events import Engagement
from hirflow.state.schema import node_type


@dataclass(frozen=True)
class History:
    """Each query node's engagements in time order, item indices and times (ms)."""
    nodes: list[str]
    items: list[np.ndarray]
    times: list[np.ndarray]

    def prefix(self, n: int, t: int) -> np.ndarray:
        """Node `n`'s items engaged strictly before `t`, oldest first."""
        return self.items[n][:np.searchsorted(self.times[n], t, side="left")]


@dataclass(frozen=True)
class NextClickTask:
    """The queries of [lo, hi): `node` (index into `history.nodes`), `t` (the engagement's
    time) and `target` (the item engaged, an index into `items`), for each engagement with a
    non-empty prefix; `popularity` counts each item's engagements before `lo`."""
    lo: int
    hi: int
    items: list[str]
    history: History
    node: np.ndarray
    t: np.ndarray
    target: np.ndarray
    popularity: np.ndarray

    def __len__(self) -> int:
        return len(self.target)

    def prefix(self, q: int) -> np.ndarray:
        return self.history.prefix(int(self.node[q]), int(self.t[q]))


def next_click_task(events: Iterable[Engagement], lo: int, hi: int, positive: Collection[str],
                    user_type: str, item_types: Sequence[str]) -> NextClickTask:
    """The task of [lo, hi) over `events` (any order): query nodes are those of `user_type`
    engaging with a `positive` action items of `item_types` known before `lo` (the
    candidates); engagements of other items are neither queries nor part of a prefix."""
    evs = sorted((e for e in events if e.ts < hi and e.action in positive
                  and node_type(e.src) == user_type and node_type(e.dst) in item_types),
                 key=lambda e: (e.ts, e.src, e.dst))
    items = sorted({e.dst for e in evs if e.ts < lo})
    index = {x: i for i, x in enumerate(items)}
    popularity = np.bincount([index[e.dst] for e in evs if e.ts < lo], minlength=len(items))
    per_node: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for e in evs:
        if e.dst in index:
            per_node[e.src].append((index[e.dst], e.ts))
    nodes = sorted(per_node)
    history = History(nodes, [np.array([i for i, _ in per_node[n]], np.int64) for n in nodes],
                      [np.array([t for _, t in per_node[n]], np.int64) for n in nodes])
    node, t, target = [], [], []
    for k, n in enumerate(nodes):
        times, its = history.times[k], history.items[k]
        for j in np.flatnonzero(times >= lo):
            if times[0] < times[j]:                  # something strictly before it
                node.append(k)
                t.append(int(times[j]))
                target.append(int(its[j]))
    order = np.lexsort((np.array(node), np.array(t))) if t else np.zeros(0, np.int64)
    return NextClickTask(lo, hi, items, history, np.array(node, np.int64)[order],
                         np.array(t, np.int64)[order], np.array(target, np.int64)[order], popularity)


def ranks(scores: np.ndarray, target: int, popularity: np.ndarray) -> int:
    """The 1-based rank of `target` under `scores` (ties: the more popular item first, then
    the lower index)."""
    s = scores[target]
    better = scores > s
    tied = (scores == s) & ((popularity > popularity[target])
                            | ((popularity == popularity[target]) & (np.arange(len(scores)) < target)))
    return int(better.sum() + tied.sum()) + 1


def hit_and_rr(rank: np.ndarray, k: int = 20) -> tuple[np.ndarray, np.ndarray]:
    """Per query: 1 when the rank is at most `k` (HitRate@k), and 1 / rank there (MRR@k)."""
    rank = np.asarray(rank, np.float64)
    inside = rank <= k
    return inside.astype(np.float64), np.where(inside, 1.0 / rank, 0.0)


def grouped_ci(values: np.ndarray, groups: np.ndarray, n: int = 1000, level: float = 0.95,
               seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean over queries, resampling whole groups (nodes)."""
    if len(values) == 0:
        return float("nan"), float("nan")
    _, g = np.unique(groups, return_inverse=True)
    sums, counts = np.bincount(g, values), np.bincount(g).astype(np.float64)
    rng = np.random.default_rng(seed)
    pick = rng.integers(0, len(sums), (n, len(sums)))
    means = sums[pick].sum(1) / counts[pick].sum(1)
    a = (1 - level) / 2
    return float(np.quantile(means, a)), float(np.quantile(means, 1 - a))


def grouped_ratio_ci(a: np.ndarray, b: np.ndarray, groups: np.ndarray, n: int = 1000,
                     level: float = 0.95, seed: int = 0) -> tuple[float, float, float]:
    """mean(a) / mean(b) over the same queries and its interval, both means over the same
    resampled groups (a paired comparison of two methods or staleness levels)."""
    if len(a) == 0 or b.sum() == 0:
        return (float("nan"),) * 3
    _, g = np.unique(groups, return_inverse=True)
    sa, sb = np.bincount(g, a), np.bincount(g, b)
    rng = np.random.default_rng(seed)
    pick = rng.integers(0, len(sa), (n, len(sa)))
    num, den = sa[pick].sum(1), sb[pick].sum(1)
    ratios = num[den > 0] / den[den > 0]            # a resample without b's hits has no ratio
    q = (1 - level) / 2
    return float(a.sum() / b.sum()), float(np.quantile(ratios, q)), float(np.quantile(ratios, 1 - q))


def summary(rank: np.ndarray, groups: np.ndarray, k: int = 20) -> dict:
    """HitRate@k and MRR@k with their grouped intervals."""
    hit, rr = hit_and_rr(rank, k)
    out = {}
    for name, v in ((f"hit@{k}", hit), (f"mrr@{k}", rr)):
        lo, hi = grouped_ci(v, groups)
        out[name] = {"mean": round(float(v.mean()), 4) if len(v) else float("nan"),
                     "ci95": [round(lo, 4), round(hi, 4)]}
    return out
