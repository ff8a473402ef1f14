"""Item-item models the collaborative block is made of, and their cut to an inner product.

EASE^R (Steck 2019) fits B = I - P diag(1 / diag(P)), P = (X^T X + lambda I)^-1, on the users x
items matrix X of positive engagements; here fitted on pairs weighted by recency at several
scales and the fits summed (`ease_scales`), plus a next-period regression
(`trainer.next_period`) and a graph propagation (`trainer.propagation`), each at unit score
spread times its weight (`block_weights`). Cut to rank r by reduced-rank regression
(`reduced_rank`: the rank-r model closest to the summed model's scores of the training users),
a user's scores become an inner product of a query and a key.

numpy and scipy only.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import scipy.linalg
import scipy.sparse as sp

from hirflow.encoder.collaborative import DAY_MS, latest_per_pair, recency_weighted, taus_of
from hirflow.trainer.next_period import NextPeriod, binary, next_period_weights
from hirflow.trainer.propagation import Propagation, propagation_weights

def fit_weighted(rows: np.ndarray, cols: np.ndarray, t: np.ndarray, shape,
                 days: float) -> sp.csr_matrix:
    """Users x items matrix for EASE^R's fit: one entry per pair, 1 when `days` is 0, else
    exp(the pair's latest t / `days`), scaled so that the squared entries sum to the number
    of pairs: recent pairs weigh more, and the Gram matrix keeps the binary one's trace, so
    one lambda grid serves every tau (the scaling also makes the weights independent of
    the clock: only differences of times count)."""
    if not days or not len(t):
        return recency_weighted(rows, cols, t, shape, 0.0)
    r, c, t = latest_per_pair(rows, cols, t)
    g = np.exp((t - t.max()) / (days * DAY_MS))
    g *= np.sqrt(len(g) / float(np.sum(g * g)))
    return sp.csr_matrix((g.astype(np.float32), (r, c)), shape=shape)


def ease_weights(x: sp.csr_matrix, lam: float) -> np.ndarray:
    """EASE^R's (I, I) item-item weights for the users x items matrix `x` (binary, or
    weighted by `fit_weighted`)."""
    g = (x.T @ x).toarray().astype(np.float64)
    g[np.diag_indices_from(g)] += lam
    p = np.linalg.inv(g)
    b = -p / np.diag(p)[None, :]
    np.fill_diagonal(b, 0.0)
    return b


def taus_json(fit: float | Sequence[float]) -> float | list[float]:
    """A fit (or users' recency weights) as manifests and the holdout's choice record it: a
    number or a list of taus."""
    taus = taus_of(fit)
    return taus[0] if np.isscalar(fit) else list(taus)


def taus_label(fit: float | Sequence[float]) -> str:
    """"15" for one tau, "15+30+60" for several (the holdout's figures are keyed by it)."""
    return "+".join(f"{d:g}" for d in taus_of(fit))


def ease_scales(rows: np.ndarray, cols: np.ndarray, t: np.ndarray, shape, lam: float,
                fit: float | Sequence[float]) -> np.ndarray:
    """EASE^R's (I, I) weights with `lam` on the pairs (`rows`, `cols`) at times `t`, their
    weights from `fit_weighted` with each tau of `fit`: with one tau its fit; with several,
    the mean of their fits, each divided by the root mean square of its scores of the
    pairs' users (binary rows), so every recency scale has the same say whatever lambda does
    to the units. The spread is read from B^T (X^T X) B, so memory stays I x I."""
    taus = taus_of(fit)
    if len(taus) == 1:
        return ease_weights(fit_weighted(rows, cols, t, shape, taus[0]), lam)
    gram = users_gram(rows, cols, shape)
    total = np.zeros((shape[1], shape[1]))
    for days in taus:
        b = ease_weights(fit_weighted(rows, cols, t, shape, days), lam)
        rms = score_rms(b, gram, shape)
        total += b / rms if rms > 0 else b
    return total / len(taus)


def users_gram(rows: np.ndarray, cols: np.ndarray, shape) -> np.ndarray:
    """X^T X of the pairs' binary users x items matrix X, dense (I, I)."""
    x = binary(rows, cols, shape)
    return (x.T @ x).toarray()


def score_rms(b: np.ndarray, gram: np.ndarray, shape) -> float:
    """The root mean square of the scores X B over every (user, item) of the binary X whose
    X^T X is `gram` (read from B^T (X^T X) B, so memory stays I x I)."""
    return float(np.sqrt(max(float(np.sum((gram @ b) * b)), 0.0) / (shape[0] * shape[1])))


def block_weights(rows: np.ndarray, cols: np.ndarray, t: np.ndarray, shape, lam: float,
                  fit: float | Sequence[float], nxt: NextPeriod | None = None,
                  end: int | None = None, prop: Propagation | None = None) -> np.ndarray:
    """The block's (I, I) item-item weights: EASE^R's (`ease_scales`), plus, when `nxt` is
    active, the next-period regression's (`trainer.next_period`, periods ending at `end`,
    None: just after the last pair), plus, when `prop` is active, the graph propagation's
    (`trainer.propagation`); each added at unit score spread over the pairs' users times its
    weight."""
    b = ease_scales(rows, cols, t, shape, lam, fit)
    if not len(t):
        return b
    gram = None
    if nxt is not None and nxt.active:
        end = int(np.max(t)) + 1 if end is None else int(end)
        n = next_period_weights(rows, cols, t, shape, nxt.l2, nxt.periods, nxt.span, end)
        gram = users_gram(rows, cols, shape)
        b = blend(b, n, (score_rms(b, gram, shape), score_rms(n, gram, shape)), nxt.weight)
    if prop is not None and prop.active:
        p = propagation_weights(rows, cols, shape, prop.layers)
        gram = users_gram(rows, cols, shape) if gram is None else gram
        b = blend(b, p, (score_rms(b, gram, shape), score_rms(p, gram, shape)), prop.weight)
    return b


def blend(b: np.ndarray, n: np.ndarray, spreads: tuple[float, float], weight: float) -> np.ndarray:
    """EASE^R's weights `b` plus `weight` times the next-period weights `n`, each divided by
    its score spread (`spreads`, from `score_rms`); `b` itself when either has no spread or
    `weight` is 0."""
    rb, rn = spreads
    if rb <= 0 or rn <= 0 or weight <= 0:
        return b
    return b / rb + weight * n / rn


def reduced_rank(b: np.ndarray, x: sp.csr_matrix, rank: int) -> tuple[np.ndarray, np.ndarray]:
    """(B V D^-1/2, V D^1/2): the rank-r model x B V V^T closest (in squared error over the
    users x items scores) to EASE^R's scores x B of the users of `x` (their binary
    histories), V the top-r eigenvectors of (X B)^T (X B), D their singular values relative
    to the largest (the inner product is x B V V^T whatever D; D keeps the key's columns
    ordered by weight, as the SVD's are). (X B)^T (X B) is formed as B^T (X^T X) B, so memory
    stays I x I whatever the number of users. Two I x I products and the top-r
    eigenvectors of a symmetric matrix (3,600 items, rank 128, 2 cores: 3.4 s
    with 4,300 users, 4.0 s with 40,000, against 10.1 s for B's SVD)."""
    n = b.shape[0]
    rank = min(rank, n)
    gram = (x.T @ x).toarray().astype(np.float64)
    val, vec = scipy.linalg.eigh(b.T @ (gram @ b), subset_by_index=[n - rank, n - 1])
    order = np.argsort(-val, kind="stable")
    val, vec = np.maximum(val[order], 0.0), vec[:, order]
    sv = np.sqrt(val)
    root = np.sqrt(np.maximum(sv / sv[0], 1e-6)) if sv[0] > 0 else np.ones(rank)
    return (b @ vec / root).astype(np.float32), (vec * root).astype(np.float32)
