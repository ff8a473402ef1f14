"""The baselines a recommender engineer already has, each with a small hyper-parameter grid
that is searched on the validation window only (never on test).

Every baseline fits on the users x items history (`RankingTask.fit_history`, binary; its
times `fit_last_ts` where a baseline weighs by recency: everything before the window) and
scores the task's evaluated users, from their rows of `history`, against all candidate
items:
- ``popularity``: how many users engaged each item before the window;
- ``popularity_recent``: users who engaged each item in the last `days` before the window
  (what is trending; the grid picks the span);
- ``item_knn``: cosine item-item similarity, each item keeping its `k` nearest neighbours;
- ``ease``: EASE^R (Steck 2019), closed form, its one regulariser `lam` searched;
- ``ease_recent``: EASE^R fitted on pairs weighted by their recency, exp(t / `days`) before
  the window (recent co-purchases count more; `lam` and `days` searched): the time-decayed
  item-item model a practitioner reaches for when a catalogue has seasons;
- ``als``: implicit-feedback matrix factorisation (Hu, Koren and Volinsky 2008) by the
  `implicit` library;
- ``lightgcn_propagation``: LightGCN's propagation without training, as the linear filter it
  reduces to (Shen et al. 2021, GF-CF): scores = r_u R~^T R~ with R~ = D_u^-1/2 R D_i^-1/2,
  repeated for `layers` and mixed with an ideal low-pass part when `alpha` > 0.

The item-item methods (item-kNN, both EASE^R, the propagation) hold dense I x I matrices, as
their reference forms do: on a catalogue larger than `MAX_DENSE_ITEMS` (the served block's
own dense vocabulary) they are fitted on that many most-engaged items, as a practitioner
would run them, and rank the other candidates after those, by popularity (`on_head`).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Callable, Mapping, Sequence

import numpy as np
import scipy.linalg
import scipy.sparse as sp

from hirflow.trainer.item_item import ease_weights, fit_weighted
from hirflow.trainer.ranking import RankingTask, per_user_metrics

log = logging.getLogger(__name__)
Scorer = Callable[[RankingTask, Mapping], np.ndarray]    # (task, params) -> (n_eval, I) scores
MAX_DENSE_ITEMS = 5_000      # the largest item-item matrix a dense baseline fits: the dense
                             # vocabulary of the served block (`CollaborativeConfig.max_items`)


def on_head(score: Scorer) -> Scorer:
    """`score` fitted on the `MAX_DENSE_ITEMS` most-engaged items when the task has more;
    the other candidates rank after them, by popularity."""
    def scored(task: RankingTask, params: Mapping) -> np.ndarray:
        if len(task.items) <= MAX_DENSE_ITEMS:
            return score(task, params)
        pop = np.asarray(task.fit_history.sum(0), np.float64).ravel()
        head = np.sort(np.argsort(-pop, kind="stable")[:MAX_DENSE_ITEMS])
        sub = replace(task, items=[task.items[i] for i in head], history=task.history[:, head].tocsr(),
                      last_ts=task.last_ts[:, head].tocsr())   # `fitted` carries over
        s = np.asarray(score(sub, params), np.float64)
        out = np.empty((task.n_eval, len(task.items)))
        out[:] = (s.min() if s.size else 0.0) - 1.0 + pop / (pop.max() + 1.0)
        out[:, head] = s
        return out
    scored.__name__ = score.__name__
    return scored


def popularity(task: RankingTask, params: Mapping) -> np.ndarray:
    pop = np.asarray(task.fit_history.sum(0)).ravel()
    return np.broadcast_to(pop, (task.n_eval, len(pop)))


@on_head
def item_knn(task: RankingTask, params: Mapping) -> np.ndarray:
    r = task.fit_history
    norms = np.sqrt(np.asarray(r.multiply(r).sum(0)).ravel()) + 1e-9
    sim = (r.T @ r).toarray() / norms[:, None] / norms[None, :]
    np.fill_diagonal(sim, 0.0)
    k = params["k"]
    if k < sim.shape[0]:                        # keep each item's k nearest neighbours
        cut = np.partition(sim, -k, axis=0)[-k]
        sim = np.where(sim >= cut[None, :], sim, 0.0)
    return np.asarray(task.history[task.eval_users] @ sim)


@on_head
def ease(task: RankingTask, params: Mapping) -> np.ndarray:
    return np.asarray(task.history[task.eval_users] @ ease_weights(task.fit_history, params["lam"]))


@on_head
def ease_recent(task: RankingTask, params: Mapping) -> np.ndarray:
    """EASE^R fitted on pairs weighted by how recent they are, exp(t / `days`) with t the
    pair's last engagement before the window (so <= 0), scaled so that the squared weights
    sum to the number of pairs (lambda keeps its binary scale); users' rows binary, as in
    `ease`; the weights are the block's own fit weights (`trainer.item_item.fit_weighted`).
    Recent co-purchases count more: a catalogue and its seasons move."""
    last = task.fit_last_ts.tocoo()
    x = fit_weighted(last.row, last.col, last.data, last.shape, params["days"])
    return np.asarray(task.history[task.eval_users] @ ease_weights(x, params["lam"]))


def als(task: RankingTask, params: Mapping) -> np.ndarray:
    from implicit.cpu.als import AlternatingLeastSquares
    from threadpoolctl import threadpool_limits
    with threadpool_limits(1, "blas"):           # implicit's own threads do the work
        model = AlternatingLeastSquares(factors=params["factors"], regularization=params["reg"],
                                        alpha=params["alpha"], iterations=15, random_state=0)
        model.fit(sp.csr_matrix(task.fit_history), show_progress=False)
        users = model.user_factors[task.eval_users]
        if task.fitted is not None:              # users it was not fitted on: folded in
            new = ~task.fitted[task.eval_users]
            if new.any():
                rows = task.eval_users[new]
                users = users.copy()
                users[new] = model.recalculate_user(rows, sp.csr_matrix(task.history[rows]))
    return users @ model.item_factors.T


@on_head
def lightgcn_propagation(task: RankingTask, params: Mapping) -> np.ndarray:
    r = task.fit_history
    rows = task.history[task.eval_users]
    du = np.asarray(r.sum(1)).ravel() + 1e-9
    di = np.asarray(r.sum(0)).ravel() + 1e-9
    rn = sp.diags(du ** -0.5) @ r @ sp.diags(di ** -0.5)
    p = (rn.T @ rn).toarray()                   # (I, I) normalised item-item propagation
    s = np.asarray(rows @ p)
    for _ in range(params["layers"] - 1):
        s = s @ p
    if params["alpha"] > 0:                     # ideal low-pass part: top singular vectors
        # ARPACK from a fixed start vector: a random one changes the subspace a little on
        # every call, and with it the baseline's figure (deep funnel Recall@20 on 33 users
        # moved by 0.06 between two runs of one split)
        n = min(r.shape)
        k = min(params["rank"], n - 1)
        try:
            _, _, vt = sp.linalg.svds(rn.astype(np.float64), k=k, v0=np.full(n, n ** -0.5))
        except sp.linalg.ArpackNoConvergence:
            # the top right singular vectors are the top eigenvectors of the dense
            # item-item matrix at hand (slower, exact)
            _, vecs = scipy.linalg.eigh(p.astype(np.float64), subset_by_index=[len(p) - k, len(p) - 1])
            vt = vecs.T
        ideal = (rows @ sp.diags(di ** -0.5)).toarray() @ vt.T @ vt * (di ** 0.5)[None, :]
        s = s + params["alpha"] * ideal
    return s


def popularity_recent(task: RankingTask, params: Mapping) -> np.ndarray:
    """Users who engaged each item in the last `days` before the window."""
    last = task.fit_last_ts
    recent = sp.csr_matrix((last.data >= -params["days"] * 86_400_000.0, last.indices, last.indptr),
                           shape=last.shape)
    pop = np.asarray(recent.sum(0)).ravel().astype(np.float64)
    return np.broadcast_to(pop, (task.n_eval, len(pop)))


@dataclass(frozen=True)
class Baseline:
    name: str
    score: Scorer
    grid: Sequence[Mapping]


STANDARD = (
    Baseline("popularity", popularity, ({},)),
    Baseline("popularity_recent", popularity_recent, tuple({"days": d} for d in (7.0, 14.0, 30.0))),
    Baseline("item_knn", item_knn, tuple({"k": k} for k in (50, 200, 1000))),
    Baseline("ease", ease, tuple({"lam": v} for v in (30.0, 100.0, 300.0, 1000.0, 3000.0))),
    Baseline("ease_recent", ease_recent, tuple({"lam": v, "days": d}
                                               for v in (100.0, 300.0, 1000.0, 3000.0, 10000.0)
                                               for d in (15.0, 30.0, 60.0, 120.0))),
    Baseline("als", als, tuple({"factors": f, "reg": g, "alpha": a}
                               for f in (64, 128) for g in (0.01, 0.1) for a in (1.0, 10.0))),
    Baseline("lightgcn_propagation", lightgcn_propagation,
             tuple({"layers": n, "alpha": a, "rank": 128} for n in (1, 2) for a in (0.0, 0.3))),
)
QUICK = (                       # one or two grid points each: for tests and --quick runs
    Baseline("popularity", popularity, ({},)),
    Baseline("popularity_recent", popularity_recent, ({"days": 7.0}, {"days": 30.0})),
    Baseline("item_knn", item_knn, ({"k": 200},)),
    Baseline("ease", ease, ({"lam": 100.0}, {"lam": 1000.0})),
    Baseline("ease_recent", ease_recent, ({"lam": 300.0, "days": 60.0},)),
    Baseline("als", als, ({"factors": 64, "reg": 0.1, "alpha": 10.0},)),
    Baseline("lightgcn_propagation", lightgcn_propagation, ({"layers": 1, "alpha": 0.0, "rank": 64},)),
)


def tune(b: Baseline, val: RankingTask, metric: str = "recall@20") -> tuple[Mapping, float, list]:
    """The grid point with the best mean `metric` on the validation task, and every point's."""
    tried = []
    for params in b.grid:
        v = float(per_user_metrics(b.score(val, params), val, [int(metric.split("@")[1])])[metric].mean())
        tried.append({"params": dict(params), metric: round(v, 4)})
        log.info("baseline %s %s: validation %s %.4f", b.name, dict(params), metric, v)
    best = max(tried, key=lambda t: t[metric])
    return best["params"], best[metric], tried
