"""Fitting the served collaborative block: the item-item models on the whole training
window, cut to the chosen rank, every item beyond the dense vocabulary folded in, the
popularity prior beside them, scaled against the encoder.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Mapping, Sequence

import numpy as np
import scipy.linalg
import scipy.sparse as sp

from hirflow.encoder.collaborative import DAY_MS, CollaborativeBlock, recency_weighted, user_rows
from hirflow.trainer.interactions import Interactions
from hirflow.trainer.item_item import block_weights, reduced_rank, taus_json
from hirflow.trainer.next_period import NextPeriod, binary
from hirflow.trainer.popularity_prior import Prior, prior_scores, prior_unit
from hirflow.trainer.propagation import Propagation


def fit(data: Interactions, lam: float, rank: int, actions: Sequence[int],
        query_types: Sequence[str], settings: Mapping | None = None,
        unit_users: bool = True, recency_days: float | Sequence[float] = 0.0,
        fit_days: float | Sequence[float] = 0.0,
        nxt: NextPeriod | None = None,
        prop: Propagation | None = None,
        prior: Prior | None = None) -> CollaborativeBlock | None:
    """EASE^R with `lam` on all of `data`, its pairs weighted by recency with tau `fit_days`
    (0: binary; several taus: their fits summed, `ease_scales`), cut to `rank` (at most
    items - 1) by reduced-rank regression, unscaled (`scaled` sets its
    weight); users' blocks of unit length with `unit_users`, their items weighted by recency
    with tau `recency_days` (0: alike; several: their weights averaged); the next-period
    part `nxt` added to EASE^R's weights before the cut (`block_weights`, its periods ending
    just after the last pair); the popularity `prior` as one more coordinate when active
    (`with_prior`). None when there is nothing to fit."""
    if rank == 0 or len(data.items) < 2 or not data.pairs:
        return None
    rank = min(rank, len(data.items) - 1)
    arrays = data.arrays()
    b = block_weights(*arrays, data.shape, lam, fit_days, nxt, prop=prop)
    q, k = reduced_rank(b, recency_weighted(*arrays, data.shape, 0.0), rank)
    extra = {"user_norm": 1.0} if unit_users else {}
    items = tuple(data.items)
    if data.tail:
        users = recency_weighted(*arrays, data.shape, recency_days)
        tr, tc, tt = data.arrays(tail=True)
        q_tail, k_tail = fold_in(users, q, k, binary(tr, tc, (len(data.users), len(data.tail))),
                                 unit_users)
        q, k = np.concatenate([q, q_tail]), np.concatenate([k, k_tail])
        items += tuple(data.tail)
        extra["tail_items"] = len(data.tail)
    block = CollaborativeBlock(items, q, k, tuple(sorted(actions)), tuple(query_types),
                               dict(settings or {}, l2=lam, rank=rank, items=len(data.items),
                                    users=len(data.users), recency_days=taus_json(recency_days),
                                    fit_days=taus_json(fit_days),
                                    **next_settings(nxt), **propagation_settings(prop), **extra))
    return with_prior(block, data, prior, recency_days) if prior is not None and prior.active else block


PRIOR_USERS = 2000     # users whose block scores set the prior's scale


def with_prior(block: CollaborativeBlock, data: Interactions, prior: Prior,
               recency_days: float | Sequence[float]) -> CollaborativeBlock:
    """`block` with the popularity prior of every item it has (vocabulary and tail), as of
    just after the last pair, at `prior.weight` times the vocabulary's block scores' spread
    over its first `PRIOR_USERS` users (`choose_prior`'s scale on the holdout); users' constant 1
    (`scaled` scales both sides)."""
    at, n, arrays = data.last_time + 1, len(data.items), data.arrays()
    head = prior_scores(*arrays, n, at, prior.taus)
    tail = prior_scores(*data.arrays(tail=True), len(block.items) - n, at, prior.taus)
    users = recency_weighted(*arrays, data.shape, recency_days)[:PRIOR_USERS]
    unit = prior_unit(user_rows(users, block.query[:n], 1.0) @ block.key[:n].T, head)
    values = (prior.weight * unit * np.concatenate([head, tail])).astype(np.float32)
    settings = dict(block.settings, prior_weight=prior.weight, prior_days=list(prior.taus),
                    prior_unit=round(unit, 6), prior_user=1.0)
    return replace(block, settings=settings, prior=values)


FOLD_L2 = 1e-2       # the fold-in's ridge, relative to the mean eigenvalue of the users' Gram


def fold_in(users: sp.csr_matrix, query: np.ndarray, key: np.ndarray, tail: sp.csr_matrix,
            unit_users: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """(query, key) rows for items outside the dense vocabulary: each tail item's key is the
    ridge regression of its users x 1 engagement column on the users' served blocks P
    (`users`: their vocabulary items' weights, summed through `query`, of unit length with
    `unit_users`), K = (P^T P + l I)^-1 P^T Y, with Y divided by each user's block length as
    the vocabulary's scores are when users are set to unit length; so a user's score of a
    tail item predicts, from its block, whether it engages that item, on the vocabulary's
    scale. Its query row (what engaging it adds to a user's block) is its key mapped by the
    per-column least-squares ratio of the vocabulary's query to key rows. Linear in the
    engagements: a million tail items cost one sparse product and a rank x rank solve."""
    raw = np.asarray(users @ query, np.float64)
    length = np.linalg.norm(raw, axis=1)
    p = raw
    y = sp.csr_matrix(tail, dtype=np.float64)
    inv = np.divide(1.0, length, out=np.zeros_like(length), where=length > 0)
    if unit_users:
        p = raw * inv[:, None]
        y = sp.diags(inv) @ y
    gram = p.T @ p
    gram[np.diag_indices_from(gram)] += FOLD_L2 * max(np.trace(gram) / len(gram), 1e-12)
    k_tail = scipy.linalg.solve(gram, np.asarray((y.T @ p).T), assume_a="pos").T
    k64 = key.astype(np.float64)
    # the same regression of the vocabulary's own columns, each user's block less the item's
    # own query row (a tail item is never in the blocks it is regressed on; EASE^R's keys
    # never score an item by itself), against the keys EASE^R gave them: one scale that puts
    # the folded-in keys on the vocabulary's
    scale = inv if unit_users else np.ones_like(length)
    yh = sp.diags(scale) @ sp.csr_matrix(users > 0, dtype=np.float64)
    own = np.asarray(sp.csr_matrix(users, dtype=np.float64).T @ (scale * scale)).ravel()
    cross = np.asarray(yh.T @ p) - query.astype(np.float64) * own[:, None]
    k_head = scipy.linalg.solve(gram, cross.T, assume_a="pos").T
    alpha = float((k_head * k64).sum() / max((k_head * k_head).sum(), 1e-300))
    k_tail *= max(alpha, 0.0)
    ratio = np.divide((query.astype(np.float64) * k64).sum(0), (k64 * k64).sum(0),
                      out=np.zeros(key.shape[1]), where=(k64 * k64).sum(0) > 0)
    return (k_tail * ratio).astype(np.float32), k_tail.astype(np.float32)


def propagation_settings(prop: Propagation | None) -> dict:
    """The propagation part as manifests record it (empty: none)."""
    if prop is None or not prop.active:
        return {}
    return {"propagation_layers": prop.layers, "propagation_weight": prop.weight}


def next_settings(nxt: NextPeriod | None) -> dict:
    """The next-period part as manifests record it (empty: none)."""
    if nxt is None or not nxt.active:
        return {}
    return {"next_periods": nxt.periods, "next_span_days": round(nxt.span / DAY_MS, 3),
            "next_l2": nxt.l2, "next_weight": nxt.weight}


def scaled(block: CollaborativeBlock, encoder_scores: np.ndarray, block_scores: np.ndarray,
           weight: float) -> CollaborativeBlock:
    """The block with both sides multiplied by sqrt(c), c = weight x std(encoder scores) /
    std(block scores) over the same (user, item) pairs: its share of the served inner
    product, independent of lambda's and the data's units."""
    spread = float(np.std(block_scores))
    c = weight * float(np.std(encoder_scores)) / spread if spread > 0 else 0.0
    root = np.float32(np.sqrt(c))
    settings = dict(block.settings, scale=round(c, 6), weight=weight)
    if block.user_norm is not None:
        settings["user_norm"] = float(block.user_norm * root)
    prior = None
    if block.prior is not None:
        prior = block.prior * root
        settings["prior_user"] = float(block.prior_user * root)
    return CollaborativeBlock(block.items, block.query * root, block.key * root, block.actions,
                              block.query_types, settings, prior)
