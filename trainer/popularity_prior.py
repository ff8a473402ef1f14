"""The popularity prior of the collaborative block: how many users engaged an item lately,
as one more coordinate of the served vector.

Where users' histories say little about what they engage next (sparse ratings over years),
what many users engaged lately is what the best baseline ranks by; item-item models see
co-occurrence only. The prior is an item's count of distinct users, each weighted by how
recently it last engaged the item (the mean of `taus`' exponential decays, relative to the
reference time), on a log scale: its weight in the served score then acts as an exponent of
popularity, a multiplicative prior beside the block's evidence. Items get it as a coordinate
of their block and users a constant, so the served inner product adds it to every user's
scores alike. The holdout chooses its weight by the block alone (`choose_prior`): above 0
only on a clear lead. The prior is fixed at the checkpoint's fit, as the items' block rows
are; a new checkpoint refreshes it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from hirflow.encoder.collaborative import DAY_MS, latest_per_pair, user_rows
from hirflow.trainer.holdout import Holdout, clear_lead, mean_of
from hirflow.trainer.item_item import reduced_rank


@dataclass(frozen=True)
class Prior:
    """The prior as a fit adds it: its weight at the block scores' spread (0: none) and its
    decay taus in days."""
    weight: float = 0.0
    taus: tuple[float, ...] = ()

    @property
    def active(self) -> bool:
        return self.weight > 0


def prior_scores(rows: np.ndarray, cols: np.ndarray, t: np.ndarray, n_items: int, at: float,
                 taus: Sequence[float]) -> np.ndarray:
    """(n_items,) log(1 + each item's distinct users, weighted by exp((their latest
    engagement - `at`) / tau) averaged over `taus` in days, a tau of 0 weighing 1) of the
    engagements (`rows` users, `cols` items in [0, n_items), times `t` in ms) before `at`."""
    out = np.zeros(n_items)
    if not len(t):
        return out
    r, c, t = latest_per_pair(rows, cols, t)
    age = np.minimum(t - at, 0.0)
    g = np.mean([np.exp(age / (d * DAY_MS)) if d else np.ones(len(t)) for d in taus], axis=0)
    return np.log1p(np.bincount(c, weights=g, minlength=n_items)[:n_items])


def prior_unit(block_scores: np.ndarray, prior: np.ndarray) -> float:
    """The factor that gives the prior the block scores' spread: std(block scores) /
    std(prior), so a weight of 1 adds it at the block's own scale (0 when either is flat)."""
    spread = float(np.std(prior))
    return float(np.std(block_scores)) / spread if spread > 0 else 0.0


def choose_prior(h: Holdout, lam: float, fit_days: float | Sequence[float],
                 recency_days: float | Sequence[float], rank: int, taus: Sequence[float],
                 grid: Sequence[float]) -> tuple[float, dict[float, float]]:
    """The prior's weight (decayed with `taus` days, at the block scores' spread) added to
    the block of holdout `h` (its weights with `lam` and `fit_days` and the parts chosen so
    far, `Holdout.ease`, cut to `rank`, users' items weighted by `recency_days`), by the
    holdout Recall@20 of the block alone: the lightest weight of `grid`, then each heavier
    one only on a clear lead over the one chosen so far, as `Holdout.choose_rank` widens. The holdout keeps the chosen prior (`h.prior`), which its
    weight curve adds: -> (weight, Recall@20 per weight)."""
    h.prior = None
    lightest = min(grid)
    if max(grid) <= 0:
        return lightest, {}
    q, k = reduced_rank(h.ease(lam, fit_days), h.before, rank)
    block = user_rows(h.queries(recency_days), q, 1.0) @ k.T
    p = prior_scores(*h.history, h.before.shape[1], h.at, taus)
    unit = prior_unit(block, p)
    per_user = {w: h.per_user(block + w * unit * p) for w in sorted(set(grid))}
    chosen = lightest
    for w in sorted(per_user)[1:]:
        if clear_lead(per_user[w], per_user[chosen]):
            chosen = w
    if chosen > 0 and unit > 0:
        h.prior = chosen * unit * p
    return chosen, {w: mean_of(v) for w, v in per_user.items()}
