"""The trainer's holdout: a split of its own training window that the collaborative block's
settings, and the weight between the encoder and the block, are chosen on.

A holdout judges the users with a history before its start who engage items new to them
from it on (with `sessions`, a session first seen there is judged on its later half given
its earlier half). Each of the block's settings is the simpler one unless another leads it
by more than a standard error of the users' paired difference (`clear_lead`); the served
weight (`choose_parts`) is never an encoder below popularity, else the best mean, ties to
the part that ranks better alone.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Mapping, Sequence

import numpy as np
import scipy.sparse as sp

from hirflow.encoder.collaborative import BLOCK_ALONE, ENCODER_ALONE, recency_weighted, taus_of, user_rows
from hirflow.trainer.interactions import Interactions
from hirflow.trainer.item_item import block_weights, blend, reduced_rank, score_rms, users_gram
from hirflow.trainer.next_period import NextPeriod, binary, first_engagements, next_period_weights
from hirflow.trainer.propagation import Propagation, propagation_weights

def recall_at(scores: np.ndarray, seen: sp.csr_matrix, truth: Sequence[np.ndarray],
              k: int = 20) -> np.ndarray:
    """Per-row Recall@k of `truth` (item indices per row) ranking `scores`, `seen` items masked."""
    scores = np.array(scores, np.float64)
    scores[seen.nonzero()] = -np.inf
    top = np.argpartition(-scores, min(k, scores.shape[1] - 1), axis=1)[:, :k]
    return np.array([len(np.intersect1d(top[i], t)) / len(t) for i, t in enumerate(truth)])


@dataclass
class Holdout:
    """The window's split at `at`: what users had engaged before it (`before`; `history`: its
    (user rows, item columns, times)), and the users (`judged`, rows) who engaged items new to
    them from it on, with those items (`truth`)."""
    at: int
    before: sp.csr_matrix
    judged: np.ndarray
    truth: list[np.ndarray]
    history: tuple[np.ndarray, np.ndarray, np.ndarray]
    prop: Propagation | None = None  # the graph propagation added to them (None: none;
                                     # `choose_propagation`)
    nxt: NextPeriod | None = None    # the next-period part added to EASE^R's weights, its
                                     # periods ending at `at` (None: none; `choose_next`)
    prior: np.ndarray | None = None  # popularity prior added to block scores (`choose_prior`)
    _ease: tuple[tuple, np.ndarray] | None = field(default=None, repr=False)  # last solve
    prefix: set = field(default_factory=set)    # (user, item, ts) pairs of the window that are
                                                # history (sessions' first halves)

    @classmethod
    def at_time(cls, data: Interactions, at: int, until: int | None = None,
                sessions: bool = False) -> "Holdout":
        """The split at `at`, judged on the pairs from `at` to `until` (None: the end); with
        `sessions`, a user first seen there with at least two pairs is judged on the later
        half of them given the earlier (`session_prefix`)."""
        r, c, t = data.arrays()
        early = t < at
        inside = ~early if until is None else ~early & (t < until)
        prefix = session_prefix(r, t, early, inside) if sessions else np.zeros(len(t), bool)
        keep = early | prefix
        history = (r[keep], c[keep], t[keep])
        before = recency_weighted(*history, data.shape, 0.0)
        later = inside & ~prefix
        new, judged = first_engagements(before, binary(r[later], c[later], data.shape))
        # only users with a history: a user without one has an empty block, which no weight
        # or setting can change, and the evaluation never ranks such a user either
        judged = judged[np.diff(before.indptr)[judged] > 0]
        h = cls(at, before, judged, [new.indices[new.indptr[u]:new.indptr[u + 1]] for u in judged],
                history)
        h.prefix = {(data.users[u], data.items[i], int(ts))
                    for u, i, ts in zip(r[prefix], c[prefix], t[prefix])}
        return h

    def queries(self, days: float | Sequence[float]) -> sp.csr_matrix:
        """The judged users' item weights before `at`, recency-weighted with tau `days` (or
        the mean of several taus' weights)."""
        if not any(taus_of(days)):
            return self.before[self.judged]
        return recency_weighted(*self.history, self.before.shape, days)[self.judged]

    @property
    def usable(self) -> bool:
        return len(self.judged) > 0 and self.before.nnz > 0

    def popularity(self) -> np.ndarray:
        """Each judged user's Recall@20 of popularity: items by how many users engaged them
        before `at` (the floor an encoder must clear to be served)."""
        counts = np.asarray(self.before.sum(0), np.float64).ravel()
        return self.per_user(np.broadcast_to(counts, (len(self.judged), len(counts))))

    def recall(self, scores: np.ndarray) -> float:
        """Recall@20 of (judged, items) `scores`, items the user had engaged masked."""
        return mean_of(self.per_user(scores))

    def per_user(self, scores: np.ndarray) -> np.ndarray:
        """Each judged user's Recall@20 of `scores`."""
        return recall_at(scores, self.before[self.judged], self.truth)

    def choose_fit(self, l2_grid: Sequence[float], fits: Sequence = (0.0,)
                   ) -> tuple[float, float | tuple[float, ...], dict[tuple, float]]:
        """EASE^R's lambda and its fit (a tau of the pairs' weights, `fit_weighted`, or a
        tuple of taus whose fits are summed, `ease_scales`), together, with the best holdout
        Recall@20 of the block alone (full rank, users' items alike): -> (lambda, fit,
        Recall@20 per (lambda, fit) tried); ties go to the first."""
        tried = {(lam, fit): self.recall(np.asarray(self.before[self.judged] @ self.ease(lam, fit)))
                 for fit in fits for lam in l2_grid}
        lam, fit = max(tried, key=tried.get)
        return lam, fit, tried

    def choose_recency(self, lam: float, fit_days: float | Sequence[float],
                       candidates: Sequence) -> tuple[float | tuple[float, ...], dict]:
        """The users' item weights (`candidates`, each a tau in days or a tuple of taus whose
        weights are averaged, the default first) by the holdout Recall@20 of the block alone
        (full rank, EASE^R with `lam` and `fit_days`): the best (ties to the first), kept only
        when it leads the first by more than a standard error of the users' paired
        difference (`clear_lead`), else the first. -> (taus, Recall@20 per candidate)."""
        first = candidates[0]
        if len(candidates) == 1:
            return first, {}
        b = self.ease(lam, fit_days)
        per_user = {taus_of(c): self.per_user(np.asarray(self.queries(c) @ b)) for c in candidates}
        tried = {k: mean_of(r) for k, r in per_user.items()}
        best = max(tried, key=tried.get)
        if not clear_lead(per_user[best], per_user[taus_of(first)]):
            return first, tried
        return next(c for c in candidates if taus_of(c) == best), tried

    def ease(self, lam: float, fit_days: float | Sequence[float] = 0.0) -> np.ndarray:
        """The block's weights on the pairs before `at` (`block_weights`: EASE^R with `lam`
        and fit `fit_days`, one tau or several, plus the next-period part), the last solve
        kept for the choices that follow."""
        key = (lam, taus_of(fit_days), self.nxt, self.prop)
        if self._ease is None or self._ease[0] != key:
            self._ease = (key, block_weights(*self.history, self.before.shape, lam, fit_days,
                                             self.nxt, self.at, self.prop))
        return self._ease[1]

    def choose_next(self, lam: float, fit_days: float | Sequence[float],
                    recency_days: float | Sequence[float], base: NextPeriod,
                    grid: Sequence[float]) -> tuple[float, dict[float, float]]:
        """The next-period part's weight (`base` with each weight of `grid`) by the holdout
        Recall@20 of the block alone (full rank, users' items weighted by `recency_days`):
        the best (ties to the first), kept only when it leads the grid's lightest weight by
        more than one standard error of the users' paired difference, else that lightest
        weight (a lead inside the noise of one window's users is no reason to change the
        block: `clear_lead`). The holdout keeps the chosen part (`nxt`) and its weights:
        -> (weight, Recall@20 per weight)."""
        self.nxt = None
        if not replace(base, weight=max(grid)).active:      # no periods, or nothing to weigh
            return min(grid), {}
        b = self.ease(lam, fit_days)
        n = next_period_weights(*self.history, self.before.shape, base.l2, base.periods,
                                base.span, self.at)
        best, tried, blended = self._choose_added(b, n, recency_days, grid)
        self.nxt = replace(base, weight=best)
        self._ease = ((lam, taus_of(fit_days), self.nxt, self.prop), blended)
        return best, tried

    def _choose_added(self, b: np.ndarray, extra: np.ndarray, recency_days, grid: Sequence[float]
                      ) -> tuple[float, dict[float, float], np.ndarray]:
        """The weight of `extra` added to the block's weights `b`, each at unit score spread
        (`blend`), by the holdout Recall@20 of the block alone: the best (ties to the first),
        kept only when it leads the grid's lightest weight by more than one standard error of
        the users' paired difference (`clear_lead`), else that lightest weight.
        -> (weight, Recall@20 per weight, the blended weights)."""
        gram = users_gram(self.history[0], self.history[1], self.before.shape)
        spreads = score_rms(b, gram, self.before.shape), score_rms(extra, gram, self.before.shape)
        queries = self.queries(recency_days)
        per_user = {w: self.per_user(np.asarray(queries @ blend(b, extra, spreads, w))) for w in grid}
        tried = {w: mean_of(r) for w, r in per_user.items()}
        best = max(tried, key=tried.get)
        lightest = min(grid)
        if not clear_lead(per_user[best], per_user[lightest]):
            best = lightest
        return best, tried, blend(b, extra, spreads, best)

    def choose_propagation(self, lam: float, fit_days: float | Sequence[float],
                           recency_days: float | Sequence[float], layers: int,
                           grid: Sequence[float]) -> tuple[float, dict[float, float]]:
        """The graph propagation's weight (`trainer.propagation`, `layers` layers), added to
        the block's weights so far (EASE^R and the chosen next-period part), by the holdout
        Recall@20 of the block alone, as `choose_next` chooses: the best, kept only on a clear
        lead over the grid's lightest weight. The holdout keeps the chosen part (`prop`):
        -> (weight, Recall@20 per weight)."""
        self.prop = None
        if layers <= 0 or max(grid) <= 0:
            return min(grid), {}
        b = self.ease(lam, fit_days)
        p = propagation_weights(self.history[0], self.history[1], self.before.shape, layers)
        best, tried, blended = self._choose_added(b, p, recency_days, grid)
        self.prop = Propagation(layers, best)
        self._ease = ((lam, taus_of(fit_days), self.nxt, self.prop), blended)
        return best, tried

    def choose_rank(self, recency_days: float | Sequence[float], ranks: Sequence[int]
                    ) -> tuple[int, dict[int, float]]:
        """The block's width by the holdout Recall@20 of the block alone (the last solve's
        weights, users' items weighted by `recency_days`, cut to each rank of `ranks`): the
        narrowest, unless a wider one leads it by more than a standard error (`clear_lead`),
        step by step: a wider served vector costs every node, so it must earn its place.
        -> (rank, Recall@20 per rank)."""
        assert self._ease is not None, "choose_rank follows a solve (ease / choose_next)"
        b = self._ease[1]
        queries = self.queries(recency_days)
        n = b.shape[0]
        per_user = {}
        for r in sorted(set(ranks)):
            q, k = reduced_rank(b, self.before, min(r, n - 1))
            per_user[r] = self.per_user(user_rows(queries, q, 1.0) @ k.T)
            if r >= n - 1:
                break
        chosen = min(per_user)
        for r in sorted(per_user)[1:]:
            if clear_lead(per_user[r], per_user[chosen]):
                chosen = r
        return chosen, {r: mean_of(v) for r, v in per_user.items()}

    def weight_curve(self, encoder_scores: np.ndarray, lam: float, rank: int,
                     grid: Sequence[float], unit_users: bool = True,
                     recency_days: float | Sequence[float] = 0.0,
                     fit_days: float | Sequence[float] = 0.0) -> dict[float, np.ndarray]:
        """Per weight of `grid`, each judged user's Recall@20 of `encoder_scores` plus the
        block at that weight (its scores' spread over the encoder's); users' blocks of unit
        length with `unit_users` and items weighted by `recency_days`, EASE^R fitted with
        `fit_days` and cut to `rank`, the chosen popularity prior added, as `fit` serves them."""
        q, k = reduced_rank(self.ease(lam, fit_days), self.before, rank)
        block = user_rows(self.queries(recency_days), q, 1.0 if unit_users else None) @ k.T \
            + (0.0 if self.prior is None else self.prior)
        spread = float(np.std(block)) or 1.0
        unit = float(np.std(encoder_scores)) / spread
        return {w: self.per_user(encoder_scores + w * unit * block) for w in grid}


def session_prefix(rows: np.ndarray, t: np.ndarray, early: np.ndarray, inside: np.ndarray) -> np.ndarray:
    """Mask of the pairs `inside` a window that are the first half (in time) of a user's pairs
    there, for users with none `early` (before it) and at least two inside: the history a
    session is judged from."""
    cand = np.flatnonzero(inside & ~np.isin(rows, rows[early]))
    out = np.zeros(len(t), bool)
    if not len(cand):
        return out
    order = cand[np.lexsort((t[cand], rows[cand]))]
    users, first, counts = np.unique(rows[order], return_index=True, return_counts=True)
    rank = np.arange(len(order)) - np.repeat(first, counts)
    half = np.repeat(counts // 2, counts)
    out[order[rank < half]] = True
    return out


def mean_of(per_user: np.ndarray) -> float:
    """The mean of users' figures; 0 when no user is judged (a window without one)."""
    return float(per_user.mean()) if len(per_user) else 0.0


def clear_lead(better: np.ndarray, base: np.ndarray) -> bool:
    """Whether the same users' figures `better` lead `base` by more than one standard error
    of their paired difference."""
    d = np.asarray(better, np.float64) - np.asarray(base, np.float64)
    if len(d) < 2:
        return False
    return float(d.mean()) > float(np.std(d, ddof=1)) / np.sqrt(len(d))


def weights_tried(grid: Sequence[float]) -> tuple[float, ...]:
    """The weights a holdout scores: each part alone beside the grid's mixes."""
    return tuple(sorted({ENCODER_ALONE, *grid, BLOCK_ALONE}))


def choose_parts(per_user: Mapping[float, np.ndarray], popularity: np.ndarray | None = None,
                 ) -> tuple[float, dict[float, float], str]:
    """The served weight from the same users' Recall@20 per weight (`weights_tried`: each
    part alone and the mixes): never an encoder that ranks below `popularity` (the block
    alone then), else the weight with the best mean, ties to the part that ranks better
    alone (ties: the block). No clear lead is asked of a mix: the choice between the two
    parts alone is itself made on the means, and where the holdout cannot tell them apart a
    mix that leads both hedges between them, where keeping one part alone bets on it.
    -> (weight, mean Recall@20 per weight, the reason in words)."""
    tried = {w: float(np.mean(r)) for w, r in per_user.items()}
    enc = tried[ENCODER_ALONE]
    if popularity is not None and len(popularity) and enc < float(np.mean(popularity)):
        return BLOCK_ALONE, tried, (f"encoder alone {enc:.4f} below popularity "
                                    f"{np.mean(popularity):.4f}: the block alone")
    alone = BLOCK_ALONE if tried[BLOCK_ALONE] >= enc else ENCODER_ALONE
    best = max(tried, key=tried.get)             # the best mean; ties go to the first
    if tried[best] <= tried[alone]:
        return alone, tried, f"the {'block' if alone == BLOCK_ALONE else 'encoder'} alone ranks best"
    return best, tried, f"the mix at {best:g} ranks best"
