"""Ranking tasks and their metrics: what a recommender engineer checks before trusting a model.

A `RankingTask` is one time window of a global time split: for each user active in the
window, the items the user engaged there with a positive action (never a negative one) that
the user had not engaged before it ("new" items); the candidates are the items known before
the window; the items each user had already engaged are removed from the ranking (and from
the truth) and the window's repeats are counted apart. Metrics are per user (Recall@K, NDCG@K)
so that confidence intervals can be bootstrapped over users, and paired comparisons use the
same resampled users for both methods.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Collection, Iterable, Mapping, Sequence

import numpy as np
import scipy.sparse as sp

from hirflow.state.events import Engagement
from hirflow.state.schema import node_type


@dataclass(frozen=True)
class RankingTask:
    """users x items: `history` (binary csr, positives before the window), per evaluated
    user the new items engaged in the window (`truth`, item indices), and counts."""
    lo: int                          # the window's start (ms)
    users: list[str]                 # every user with a positive before the window
    items: list[str]                 # candidates: items known before the window
    history: sp.csr_matrix           # (U, I) 1 where the user engaged the item before
    last_ts: sp.csr_matrix           # (U, I) time (ms, less the window's start) of the last such
    eval_users: np.ndarray           # indices into `users` of users with new items in the window
    truth: list[np.ndarray]          # per evaluated user, the new items' indices
    repeats: int                     # positives in the window on items the user had engaged
    new: int                         # positives in the window on new items (what is ranked)
    fitted: np.ndarray | None = None  # (U,) users whose rows a model may be fitted on (None:
                                      # all); sessions judged from their first half in the
                                      # window are scored from it, never fitted on it

    @property
    def n_eval(self) -> int:
        return len(self.eval_users)

    @property
    def fit_history(self) -> sp.csr_matrix:
        """`history` with the rows no model may be fitted on emptied."""
        return self.history if self.fitted is None else self._fitted_rows(self.history)

    @property
    def fit_last_ts(self) -> sp.csr_matrix:
        return self.last_ts if self.fitted is None else self._fitted_rows(self.last_ts)

    def _fitted_rows(self, m: sp.csr_matrix) -> sp.csr_matrix:
        out = (sp.diags(self.fitted.astype(m.dtype)) @ m).tocsr()
        out.eliminate_zeros()
        return out


def session_prefixes(events: Iterable[Engagement], lo: int, hi: int, positive: Collection[str],
                     user_type: str) -> list[Engagement]:
    """For users first seen in [lo, hi) with at least two positives there (sessions: a node
    that lives minutes), the first half of those positives in time order: the history such a
    user is judged from, on the rest (`ranking_task`'s `prefix`)."""
    seen_before: set[str] = set()
    inside: dict[str, list[Engagement]] = {}
    for e in events:
        if e.action not in positive or node_type(e.src) != user_type:
            continue
        if e.ts < lo:
            seen_before.add(e.src)
        elif e.ts < hi and e.src not in seen_before:
            inside.setdefault(e.src, []).append(e)
    out = []
    for evs in inside.values():
        if len(evs) >= 2:
            evs = sorted(evs, key=lambda e: (e.ts, e.dst))
            out.extend(evs[:len(evs) // 2])
    return sorted(out, key=lambda e: (e.ts, e.src, e.dst))


def _key(e: Engagement) -> tuple:
    return e.src, e.dst, e.action, e.ts


def ranking_task(events: Iterable[Engagement], lo: int, hi: int, positive: Collection[str],
                 item_types: Collection[str], user_type: str = "user",
                 prefix: Sequence[Engagement] = ()) -> RankingTask:
    """The task of window [lo, hi): history from the events before `lo` (all of them, as a
    served model knows everything before the window) and the `prefix` events inside it
    (`session_prefixes`: rows a model scores from but is not fitted on), truth from the rest
    of [lo, hi)."""
    before, during = [], []
    known_items: set[str] = set()
    early = {_key(e) for e in prefix}
    for e in events:
        if early and e.ts >= lo and _key(e) in early:
            if e.dst in known_items:
                before.append(e)
            continue
        if e.ts < lo:
            for n in (e.src, e.dst):
                if node_type(n) in item_types:
                    known_items.add(n)
            if e.action in positive and node_type(e.src) == user_type and e.dst in known_items:
                before.append(e)
        elif e.ts < hi and e.action in positive and node_type(e.src) == user_type:
            during.append(e)
    users = sorted({e.src for e in before})
    items = sorted(known_items)
    ui = {u: i for i, u in enumerate(users)}
    ii = {x: i for i, x in enumerate(items)}
    rows = np.array([ui[e.src] for e in before], np.int64)
    cols = np.array([ii[e.dst] for e in before], np.int64)
    hist = sp.csr_matrix((np.ones(len(rows), np.float32), (rows, cols)), shape=(len(users), len(items)))
    hist.data[:] = 1.0                          # duplicates summed: binary again
    # the latest time of each (user, item) pair, relative to the window's start (negative)
    ages = np.array([e.ts - lo for e in before], np.float64)
    order = np.lexsort((ages, cols, rows))                     # per pair, latest last
    last_of_pair = np.ones(len(order), bool)
    last_of_pair[:-1] = (rows[order][1:] != rows[order][:-1]) | (cols[order][1:] != cols[order][:-1])
    o = order[last_of_pair]
    last = sp.csr_matrix((ages[o], (rows[o], cols[o])), shape=hist.shape)
    truth: dict[int, set[int]] = {}
    repeats = 0
    for e in during:
        u, i = ui.get(e.src), ii.get(e.dst)
        if u is None or i is None:              # a new user or an item unknown before: not rankable
            continue
        if hist[u, i] > 0:
            repeats += 1
        else:
            truth.setdefault(u, set()).add(i)
    eval_users = np.array(sorted(truth), np.int64)
    fitted = None
    if early:        # models are fitted on what happened before the window, as served ones are
        fitted = np.zeros(len(users), bool)
        fitted[[ui[e.src] for e in before if e.ts < lo]] = True
    return RankingTask(lo, users, items, hist, last, eval_users,
                       [np.array(sorted(truth[u]), np.int64) for u in eval_users], repeats,
                       sum(len(t) for t in truth.values()), fitted)


def per_user_metrics(scores: np.ndarray, task: RankingTask, ks: Sequence[int],
                     chunk: int = 2048) -> dict[str, np.ndarray]:
    """Per evaluated user Recall@k (hits / new items) and NDCG@k. `scores` is
    (n_eval, I), rows in `task.eval_users` order; items the user engaged before are masked."""
    kmax = min(max(ks), scores.shape[1])
    disc = 1.0 / np.log2(np.arange(2, kmax + 2))
    out = {f"{m}@{k}": np.zeros(task.n_eval) for k in ks for m in ("recall", "ndcg")}
    for c0 in range(0, task.n_eval, chunk):
        s = np.array(scores[c0:c0 + chunk], np.float64, copy=True)
        seen = task.history[task.eval_users[c0:c0 + chunk]]
        s[seen.nonzero()] = -np.inf
        top = np.argpartition(-s, kmax - 1, axis=1)[:, :kmax]
        order = np.take_along_axis(s, top, 1).argsort(1)[:, ::-1]
        top = np.take_along_axis(top, order, 1)                 # (n, kmax) best first
        for j in range(len(top)):
            t = task.truth[c0 + j]
            hits = np.isin(top[j], t)
            for k in ks:
                kk = min(k, kmax)
                out[f"recall@{k}"][c0 + j] = hits[:kk].sum() / len(t)
                out[f"ndcg@{k}"][c0 + j] = (hits[:kk] * disc[:kk]).sum() / disc[:min(len(t), kk)].sum()
    return out


def bootstrap_ci(values: np.ndarray, n: int = 1000, level: float = 0.95, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean over users."""
    if len(values) == 0:
        return (float("nan"), float("nan"))
    rng = np.random.default_rng(seed)
    means = values[rng.integers(0, len(values), (n, len(values)))].mean(1)
    a = (1 - level) / 2
    return float(np.quantile(means, a)), float(np.quantile(means, 1 - a))


def paired_ratio_ci(a: np.ndarray, b: np.ndarray, n: int = 1000, level: float = 0.95,
                    seed: int = 0) -> tuple[float, float, float]:
    """mean(a) / mean(b) and its percentile bootstrap interval, both means over the same
    resampled users (the paired comparison of two methods on one task)."""
    if len(a) == 0 or b.mean() == 0:
        return (float("nan"),) * 3
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(a), (n, len(a)))
    ratios = a[idx].mean(1) / np.maximum(b[idx].mean(1), 1e-12)
    q = (1 - level) / 2
    return float(a.mean() / b.mean()), float(np.quantile(ratios, q)), float(np.quantile(ratios, 1 - q))


def summarise(per_user: Mapping[str, np.ndarray], seed: int = 0) -> dict[str, dict[str, float]]:
    """{metric: {"mean", "ci_low", "ci_high"}} rounded for reports."""
    out = {}
    for name, v in per_user.items():
        lo, hi = bootstrap_ci(v, seed=seed)
        out[name] = {"mean": round(float(v.mean()), 4) if len(v) else float("nan"),
                     "ci_low": round(lo, 4), "ci_high": round(hi, 4)}
    return out
