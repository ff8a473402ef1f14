"""The baselines a session-recommendation engineer brings to next-click prediction
(`bench.protocols.next_click`), each scoring every candidate item from a node's prefix:

- ``popular_recent``: the items clicked most in the last `hours` before the query, by anyone
  (fresh: it sees every click before the query's time, the window's own included);
- ``cooccurrence``: items that shared a training session with the last click (association
  rules on the last click);
- ``sequential_rules``: items that followed the last click within `steps` clicks in a training
  session, weighted 1 / distance (Ludewig and Jannach's SR);
- ``sknn``: session kNN: the `k` training sessions most similar (cosine of item sets) to the
  prefix among the `sample` most recent that share an item with it; items scored by the sum
  of their sessions' similarities;
- ``vsknn``: V-SKNN: as ``sknn`` with the prefix's items weighted by their position
  (``linear``: 1 for the last click, 0.1 less per step back, at least 0.1; ``div``:
  1 / steps back + 1), optionally by their inverse document frequency, and a dot product
  as the similarity;
- ``ease``: EASE^R (Steck 2019) fitted on training sessions as rows, scoring the prefix's
  items (binary); on the most clicked `MAX_DENSE_ITEMS` items when the catalogue is larger.

Training sessions are the query nodes' engagements before the window (`History.before`).
Each baseline has a small grid searched on the validation window only (`tune`). numpy and
scipy only; no session-rec code.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np
import scipy.sparse as sp

from hirflow.trainer.baselines import MAX_DENSE_ITEMS
from hirflow.trainer.item_item import ease_weights
from bench.protocols.next_click import NextClickTask, hit_and_rr, ranks

HOUR = 3_600_000
Scores = Callable[[np.ndarray, int], np.ndarray]      # (prefix items, query time) -> (I,) scores


@dataclass(frozen=True)
class Sessions:
    """Training sessions: a binary sessions x items matrix, rows oldest first (by their last
    click), its transpose for the sessions holding an item, and every click's item and time
    (for recency counts)."""
    matrix: sp.csr_matrix
    by_item: sp.csr_matrix
    clicks: np.ndarray
    click_times: np.ndarray
    sequences: list[np.ndarray]

    @classmethod
    def of(cls, task: NextClickTask) -> "Sessions":
        h, n_items = task.history, len(task.items)
        seqs, last = [], []
        for items, times in zip(h.items, h.times):
            before = items[times < task.lo]
            if len(before):
                seqs.append(before)
                last.append(times[times < task.lo][-1])
        order = np.argsort(np.array(last, np.int64), kind="stable")
        seqs = [seqs[i] for i in order]
        rows = np.repeat(np.arange(len(seqs)), [len(s) for s in seqs])
        cols = np.concatenate(seqs) if seqs else np.zeros(0, np.int64)
        m = sp.csr_matrix((np.ones(len(cols), np.float32), (rows, cols)), shape=(len(seqs), n_items))
        m.data[:] = 1.0                                   # repeats inside a session count once
        m.sum_duplicates()
        m.data[:] = 1.0
        every = np.concatenate(h.items) if h.items else np.zeros(0, np.int64)
        when = np.concatenate(h.times) if h.times else np.zeros(0, np.int64)
        o = np.argsort(when, kind="stable")
        return cls(m, m.T.tocsr(), every[o], when[o], seqs)


def popular_recent(s: Sessions, n_items: int, hours: float) -> Scores:
    def scores(prefix: np.ndarray, t: int) -> np.ndarray:
        a, b = np.searchsorted(s.click_times, [t - int(hours * HOUR), t], side="left")
        return np.bincount(s.clicks[a:b], minlength=n_items).astype(np.float64)
    return scores


def cooccurrence(s: Sessions, n_items: int) -> Scores:
    c = (s.by_item @ s.matrix).tocsr()
    c.setdiag(0)
    c.eliminate_zeros()

    def scores(prefix: np.ndarray, t: int) -> np.ndarray:
        return c[int(prefix[-1])].toarray().ravel().astype(np.float64)
    return scores


def sequential_rules(s: Sessions, n_items: int, steps: int) -> Scores:
    rows, cols, vals = [], [], []
    for seq in s.sequences:
        for d in range(1, min(steps, len(seq) - 1) + 1):
            rows.append(seq[:-d])
            cols.append(seq[d:])
            vals.append(np.full(len(seq) - d, 1.0 / d))
    r = sp.csr_matrix((np.concatenate(vals) if vals else np.zeros(0),
                       (np.concatenate(rows) if rows else np.zeros(0, np.int64),
                        np.concatenate(cols) if cols else np.zeros(0, np.int64))),
                      shape=(n_items, n_items))

    def scores(prefix: np.ndarray, t: int) -> np.ndarray:
        return r[int(prefix[-1])].toarray().ravel()
    return scores


def _neighbours(s: Sessions, prefix: np.ndarray, sample: int) -> np.ndarray:
    """The `sample` most recent training sessions sharing an item with `prefix`."""
    items = np.unique(prefix)
    cand = np.unique(np.concatenate([s.by_item.indices[s.by_item.indptr[i]:s.by_item.indptr[i + 1]]
                                     for i in items]))
    return cand[-sample:]


def sknn(s: Sessions, n_items: int, k: int, sample: int) -> Scores:
    lengths = np.asarray(s.matrix.sum(1)).ravel()

    def scores(prefix: np.ndarray, t: int) -> np.ndarray:
        cand = _neighbours(s, prefix, sample)
        q = np.zeros(n_items)
        q[np.unique(prefix)] = 1.0
        sim = (s.matrix[cand] @ q) / np.sqrt(lengths[cand] * q.sum())
        top = np.argsort(-sim, kind="stable")[:k]
        return np.asarray(s.matrix[cand[top]].T @ sim[top]).ravel()
    return scores


def vsknn(s: Sessions, n_items: int, k: int, sample: int, weighting: str, idf: bool) -> Scores:
    df = np.asarray(s.matrix.sum(0)).ravel()
    idf_w = np.log((s.matrix.shape[0] + 1) / (df + 1)) + 1.0

    def scores(prefix: np.ndarray, t: int) -> np.ndarray:
        cand = _neighbours(s, prefix, sample)
        back = np.arange(len(prefix))[::-1]                   # steps back from the last click
        w = np.maximum(0.1, 1 - 0.1 * back) if weighting == "linear" else 1.0 / (back + 1)
        q = np.zeros(n_items)
        np.maximum.at(q, prefix, w)
        if idf:
            q *= idf_w
        sim = s.matrix[cand] @ q
        top = np.argsort(-sim, kind="stable")[:k]
        return np.asarray(s.matrix[cand[top]].T @ sim[top]).ravel()
    return scores


def ease(s: Sessions, n_items: int, lam: float) -> Scores:
    """EASE^R on the `MAX_DENSE_ITEMS` most clicked items (its dense item-item matrix), the
    other items ranked after them by popularity, as `trainer.baselines` runs it."""
    clicked = np.asarray(s.matrix.sum(0)).ravel()
    head = np.sort(np.argsort(-clicked, kind="stable")[:MAX_DENSE_ITEMS])
    b = ease_weights(s.matrix[:, head], lam)
    at = np.full(n_items, -1)
    at[head] = np.arange(len(head))
    tail = clicked / (clicked.max() + 1.0) - 1e6             # below any head score

    def scores(prefix: np.ndarray, t: int) -> np.ndarray:
        out = tail.copy()
        rows = at[np.unique(prefix)]
        out[head] = b[rows[rows >= 0]].sum(0)
        return out
    return scores


@dataclass(frozen=True)
class SessionBaseline:
    name: str
    fit: Callable[..., Scores]
    grid: Sequence[Mapping]


BASELINES = (
    SessionBaseline("popular_recent", popular_recent, [{"hours": h} for h in (1, 24, 24 * 7)]),
    SessionBaseline("cooccurrence", cooccurrence, [{}]),
    SessionBaseline("sequential_rules", sequential_rules, [{"steps": n} for n in (1, 3, 10)]),
    SessionBaseline("sknn", sknn, [{"k": k, "sample": m} for k in (50, 100, 200) for m in (500, 1000)]),
    SessionBaseline("vsknn", vsknn, [{"k": k, "sample": m, "weighting": w, "idf": i}
                                     for k in (100, 200) for m in (500, 1000)
                                     for w in ("linear", "div") for i in (False, True)]),
    SessionBaseline("ease", ease, [{"lam": lam} for lam in (10.0, 50.0, 200.0, 500.0)]),
)
QUICK = tuple(SessionBaseline(b.name, b.fit, b.grid[:1]) for b in BASELINES)


def rank_all(scores: Scores, task: NextClickTask) -> np.ndarray:
    """Each query's rank of its target under `scores`."""
    return np.array([ranks(scores(task.prefix(q), int(task.t[q])), int(task.target[q]), task.popularity)
                     for q in range(len(task))], np.int64)


def tune(b: SessionBaseline, val: NextClickTask, k: int = 20) -> tuple[Mapping, float, list]:
    """The grid point with the best validation HitRate@k (ties: the first), its figure, and
    every point's figure."""
    s = Sessions.of(val)
    tried = []
    for params in b.grid:
        hit, _ = hit_and_rr(rank_all(b.fit(s, len(val.items), **params), val), k)
        tried.append((dict(params), float(hit.mean()) if len(hit) else 0.0))
    best = max(tried, key=lambda p: p[1])
    return best[0], best[1], tried


def score_on(b: SessionBaseline, params: Mapping, test: NextClickTask) -> np.ndarray:
    """Ranks on `test`, refitted on its own training sessions (everything before its window)."""
    return rank_all(b.fit(Sessions.of(test), len(test.items), **params), test)
