"""The collaborative block: a low-rank EASE^R item-item model served as extra coordinates of
every embedding, so that the served inner product carries the item-to-item signal the
strongest simple baselines have.

EASE^R (Steck 2019) fits item-item weights B = I - P diag(1 / diag(P)), P = (X^T X + lambda
I)^-1, on the users x items matrix X of positive engagements (here the sum of fits on pairs
weighted by recency at several scales, plus a next-period regression, `encoder.next_period`,
of which items users engage new after what they had). Cut to rank r by reduced-rank
regression (`reduced_rank`: the rank-r model closest to EASE^R's scores of the training
users), a user's scores become an inner product: an item's block is its `key` row; a user's
block the sum of the `query` rows of the items it engaged, each weighted by how recently,
set to unit length, so it moves with every engagement the worker applies. EASE^R is dense
over a vocabulary of the `max_items` most-engaged items; every other item engaged by three
or more users gets rows by a ridge fold-in on the users' blocks (`fold_in`), so the block
covers a catalogue of millions of items.

Served embedding = [encoder embedding (d_emb) ; block (rank)]; the hierarchy's prototypes live
in the first d_emb coordinates. Nodes the block does not know get zeros. Everything chosen
(lambda, the rank, the next-period weight, the block's weight against the encoder, each
part alone included) is chosen by the trainer on holdouts of its own window
(`Holdout`, `trainer.collaborative_fit`); recency scales are multiples of the holdout
window's length, so a data set's clock is its own.

numpy and scipy only; `EdgeColumns` is state's data type for a batch's adjacencies.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Iterable, Mapping, Sequence

import numpy as np
import scipy.linalg
import scipy.sparse as sp
from scipy.sparse.linalg import svds

from hirflow.encoder.next_period import NextPeriod, binary, first_engagements, next_period_weights
from hirflow.encoder.propagation import Propagation, propagation_weights
from hirflow.state.edge_columns import EdgeColumns
from hirflow.state.schema import node_type

FILE = "collaborative.json"          # the block's vocabulary and settings, beside the weights
QUERY, KEY = "collab.query", "collab.key"     # its (I, rank) matrices in weights.safetensors
FACTORIZATIONS = ("reduced_rank", "svd")
DAY_MS = 86_400_000


@dataclass(frozen=True)
class CollaborativeConfig:
    rank: int | None = None          # block width (0: no block; None: chosen on the holdout
                                     # from `rank_grid` by the block alone, a wider one only
                                     # on a clear lead: session data needs more of EASE^R's
                                     # rank than a shop's year)
    rank_grid: tuple[int, ...] = (128, 256, 512)
    weight: float | None = None      # block score spread / encoder score spread (None: chosen
                                     # on the holdout from `weight_grid`)
    weight_grid: tuple[float, ...] = (0.25, 0.5, 1.0, 2.0, 4.0)
    l2_grid: tuple[float, ...] = (30.0, 100.0, 300.0, 1000.0, 3000.0, 10000.0)   # EASE^R lambdas
    holdout: float = 0.1             # last share of the training window's engagements that
                                     # chooses lambda and the weight
    weight_windows: int = 1          # successive holdout windows (each a `holdout` share, the
                                     # last ending the training window) whose users' Recall@20
                                     # together choose the weight (2: on validation the same
                                     # weight in 3 runs of 4, Recall@20 1.4 % lower in the
                                     # fourth: docs/evaluation.md)
    min_holdout_users: int = 200     # users with a history the holdout windows judge together:
                                     # earlier windows (each a `holdout` share) are added until
                                     # they hold this many, up to `max_holdout_share`
    max_holdout_share: float = 0.5   # the most of the training window the holdouts may cover
    max_items: int = 5_000           # most-engaged items in the vocabulary: a dense I x I
                                     # solve and SVD per lambda tried; on 2 cores 3,600 items
                                     # take 2 s per solve and 12 s per SVD, 10,000 items 45 s
                                     # and 103 s (~8 minutes in all), 5,000 about a minute
    unit_users: bool = True          # a user's block set to a fixed length (False: the plain
                                     # sum, whose share grows with the user's history)
    recency_days: float | None = None    # tau of a user's item weights in days (0: all alike;
                                         # None: the mean of the weights at `recency_windows`)
    recency_windows: tuple[float, ...] = (0.0, 2.0, 4.0, 8.0, 16.0)   # taus in holdout windows:
                                     # a data set's clock is its own (a day of sessions, a
                                     # shop's season, a decade of ratings), so the scales are
                                     # multiples of the last holdout window's length (Online
                                     # Retail's: 16 days)
    fit_days: float | None = None    # tau of the pairs' weights in EASE^R's fit in days (0:
                                     # binary; None: the holdout's choice of the binary fit and
                                     # the fits at every tau of `fit_windows` summed, each at
                                     # unit score spread)
    fit_windows: tuple[float, ...] = (1.0, 2.0, 4.0, 8.0, 16.0)     # in holdout windows
    factorization: str = "reduced_rank"   # how B is cut to `rank`: "reduced_rank" (the rank-r
                                          # model closest to EASE^R's scores of the training
                                          # users) or "svd" (B's own truncated SVD)
    next_periods: int = 2            # periods of the next-period regression added to EASE^R
                                     # (`encoder.next_period`; 0: none), each as long as the
                                     # holdout window; on Online Retail's windows before its
                                     # test window 2 ranked better than 4 (docs/evaluation.md)
    next_l2: float = 3000.0          # its ridge lambda
    next_weight: float | None = None     # its score spread over EASE^R's (None: chosen on the
                                         # holdout from `next_grid` by the block alone, above
                                         # the lightest only on a clear lead)
    next_grid: tuple[float, ...] = (0.0, 0.25, 0.5, 1.0)
    propagation_layers: int = 2      # layers of the graph propagation added to the block
                                     # (`encoder.propagation`; 0: none)
    propagation_weight: float | None = None   # its score spread over the rest of the block's
                                              # (None: chosen on the holdout from
                                              # `propagation_grid` by the block alone, above
                                              # the lightest only on a clear lead)
    propagation_grid: tuple[float, ...] = (0.0, 0.25, 0.5, 1.0)

    def __post_init__(self) -> None:
        if (self.rank is not None and self.rank < 0) or not self.rank_grid \
                or min(self.rank_grid) < 1 \
                or (self.weight is not None and self.weight < 0) or self.max_items < 2 \
                or not 0 < self.holdout < 1 or not self.l2_grid or min(self.l2_grid) <= 0 \
                or self.weight_windows < 1 or self.holdout * self.weight_windows >= 1 \
                or self.min_holdout_users < 0 or not 0 < self.max_holdout_share < 1 \
                or not self.weight_grid or min(self.weight_grid) < 0 \
                or self.factorization not in FACTORIZATIONS \
                or (self.recency_days is not None and self.recency_days < 0) \
                or not self.recency_windows or min(self.recency_windows) < 0 \
                or (self.fit_days is not None and self.fit_days < 0) \
                or not self.fit_windows or min(self.fit_windows) < 0 \
                or self.next_periods < 0 or self.next_l2 <= 0 \
                or (self.next_weight is not None and self.next_weight < 0) \
                or not self.next_grid or min(self.next_grid) < 0 \
                or self.propagation_layers < 0 \
                or (self.propagation_weight is not None and self.propagation_weight < 0) \
                or not self.propagation_grid or min(self.propagation_grid) < 0:
            raise ValueError("collaborative: rank >= 0 or None, rank_grid >= 1, weight >= 0 or "
                             "None, max_items >= 2, holdout in (0, 1), weight_windows >= 1 with "
                             "holdout x weight_windows < 1, min_holdout_users >= 0, "
                             "max_holdout_share in (0, 1), non-empty l2_grid (> 0) and "
                             f"weight_grid (>= 0), factorization one of {FACTORIZATIONS}, "
                             "recency_days and fit_days >= 0 or None, non-empty recency_windows "
                             "and fit_windows (>= 0), next_periods >= 0, next_l2 > 0, "
                             "next_weight >= 0 or None, non-empty next_grid (>= 0), "
                             "propagation_layers >= 0, propagation_weight >= 0 or None, "
                             "non-empty propagation_grid (>= 0)")

    @property
    def enabled(self) -> bool:
        return self.rank != 0

    def ranks(self) -> tuple[int, ...]:
        """The block widths the holdout chooses among (one when configured)."""
        return (self.rank,) if self.rank is not None else tuple(sorted(self.rank_grid))

    def next_weights(self) -> tuple[float, ...]:
        """The next-period part's weights the holdout chooses among (one when configured;
        (0,) when it has no periods)."""
        if self.next_periods == 0:
            return (0.0,)
        return (self.next_weight,) if self.next_weight is not None else tuple(self.next_grid)

    def propagation_weights(self) -> tuple[float, ...]:
        """The propagation's weights the holdout chooses among (one when configured; (0,)
        without layers)."""
        if self.propagation_layers == 0:
            return (0.0,)
        return (self.propagation_weight,) if self.propagation_weight is not None \
            else tuple(self.propagation_grid)

    def fits(self, window_days: float) -> tuple[float | tuple[float, ...], ...]:
        """EASE^R's fits the holdout chooses among, with lambda: the taus (`fit_windows` x
        the holdout window's length) whose fits are summed (`ease_scales`), and the binary
        fit (0): a shop's catalogue moves with its seasons, a week of click sessions does
        not, and the two differ by more than one window's noise (28 % and 6 % on Online
        Retail's and YOOCHOOSE's holdouts, in opposite directions); a configured tau alone."""
        if self.fit_days is not None:
            return (self.fit_days,)
        return (tuple(round(m * window_days, 3) for m in self.fit_windows), 0.0)

    def recency_taus(self, window_days: float) -> float | tuple[float, ...]:
        """A user's item weights: a tau in days, or the taus (`recency_windows` x the holdout
        window's length) whose weights are averaged (`recency_weighted`)."""
        if self.recency_days is not None:
            return self.recency_days
        return tuple(round(m * window_days, 3) for m in self.recency_windows)


@dataclass
class CollaborativeBlock:
    items: tuple[str, ...]           # vocabulary, row order of `query` and `key`
    query: np.ndarray                # (I, rank) float32: what an engaged item adds to a user
    key: np.ndarray                  # (I, rank) float32: the item's own block
    actions: tuple[int, ...]         # action codes (`SchemaConfig.action_codes`) that count
    query_types: tuple[str, ...]     # node types whose block sums their items' `query` rows
    settings: dict = field(default_factory=dict)   # l2, scale, fit figures (for the manifest)

    def __post_init__(self) -> None:
        self.row = {n: i for i, n in enumerate(self.items)}
        # the length of a user's block; None (checkpoints fitted before it existed): the sum
        self.user_norm = self.settings.get("user_norm")
        # taus of a user's item weights in days, their weights averaged; 0 (and checkpoints
        # fitted before it): all alike
        self.recency_days = taus_of(self.settings.get("recency_days") or 0.0)
        self.action_mask = np.zeros(max(self.actions, default=0) + 1, bool)
        self.action_mask[list(self.actions)] = True

    @property
    def rank(self) -> int:
        return int(self.key.shape[1])

    def blocks(self, nodes: Sequence[str], edges: EdgeColumns, cutoff: int | None = None) -> np.ndarray:
        """(len(nodes), rank) blocks of `nodes`, whose adjacencies `edges` holds (same order):
        an item its `key` row, a query-type node the sum of `query` rows over the distinct
        vocabulary items it engaged with a counted action (edges that existed at `cutoff`,
        None: all), each weighted by the recency of its last such engagement (an edge's
        `t_ref`, at most `cutoff`) as its `recency_days` say, set to length
        `user_norm` when it has one, anything else zeros."""
        if edges.nodes != tuple(nodes):
            raise ValueError("the adjacencies are not those of the nodes to embed")
        out = np.zeros((len(nodes), self.rank), np.float32)
        is_query = np.fromiter((node_type(n) in self.query_types for n in nodes), bool, len(nodes))
        own = np.fromiter((self.row.get(n, -1) for n in nodes), np.int64, len(nodes))
        items = (own >= 0) & ~is_query
        out[items] = self.key[own[items]]
        if is_query.any() and len(edges.nbr):
            nbr_row = np.fromiter((self.row.get(n, -1) for n in edges.names), np.int64,
                                  len(edges.names))[edges.nbr]
            codes = edges.action.astype(np.int64)
            counted = np.zeros(len(codes), bool)
            inside = codes < len(self.action_mask)
            counted[inside] = self.action_mask[codes[inside]]
            owner = edges.owner
            keep = counted & (nbr_row >= 0) & is_query[owner] & (edges.w > 0)
            if cutoff is not None:
                keep &= edges.first <= cutoff
            t = edges.t_ref[keep] if cutoff is None else np.minimum(edges.t_ref[keep], cutoff)
            # one per (node, item): several actions or both directions count once, at the latest
            x = recency_weighted(owner[keep], nbr_row[keep], t, (len(nodes), len(self.items)),
                                 self.recency_days)
            out[is_query] = user_rows(x, self.query, self.user_norm)[is_query]
        return out

    def manifest(self) -> dict:
        return {"items": list(self.items), "actions": list(self.actions),
                "query_types": list(self.query_types), "settings": self.settings}

    def weights(self) -> dict[str, np.ndarray]:
        return {QUERY: self.query, KEY: self.key}

    @classmethod
    def from_parts(cls, manifest: Mapping, query: np.ndarray, key: np.ndarray) -> "CollaborativeBlock":
        items = tuple(manifest["items"])
        if query.shape != key.shape or query.shape[0] != len(items):
            raise ValueError(f"collaborative block: {len(items)} items but matrices of shapes "
                             f"{query.shape} and {key.shape}")
        return cls(items, np.asarray(query, np.float32), np.asarray(key, np.float32),
                   tuple(int(a) for a in manifest["actions"]), tuple(manifest["query_types"]),
                   dict(manifest.get("settings", {})))


def _latest_per_pair(rows, cols, t) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One entry per (row, col) pair, at its latest time."""
    rows, cols = np.asarray(rows, np.int64), np.asarray(cols, np.int64)
    t = np.asarray(t, np.float64)
    order = np.lexsort((t, cols, rows))                 # each pair's latest time sorts last
    r, c, t = rows[order], cols[order], t[order]
    last = np.r_[(r[1:] != r[:-1]) | (c[1:] != c[:-1]), True]
    return r[last], c[last], t[last]


def recency_weighted(rows: np.ndarray, cols: np.ndarray, t: np.ndarray, shape,
                     days: float | Sequence[float]) -> sp.csr_matrix:
    """Users x items weights of engagements (`rows`, `cols`) at times `t` (ms): one entry per
    pair, exp((its latest t - the row's latest t) / `days`), so 1 for a user's latest item;
    1 everywhere when `days` is 0; with several taus the mean of their weights (a tau of 0
    weighs 1). Relative to the row's own latest time, not to a clock."""
    if not len(t):
        return sp.csr_matrix(shape, dtype=np.float32)
    r, c, t = _latest_per_pair(rows, cols, t)
    taus = taus_of(days)
    if any(taus):
        latest = np.full(shape[0], -np.inf)
        np.maximum.at(latest, r, t)
        age = t - latest[r]
        g = np.mean([np.exp(age / (d * DAY_MS)) if d else np.ones(len(t)) for d in taus], axis=0)
    else:
        g = np.ones(len(t))
    return sp.csr_matrix((g.astype(np.float32), (r, c)), shape=shape)


def fit_weighted(rows: np.ndarray, cols: np.ndarray, t: np.ndarray, shape,
                 days: float) -> sp.csr_matrix:
    """Users x items matrix for EASE^R's fit: one entry per pair, 1 when `days` is 0, else
    exp(the pair's latest t / `days`), scaled so that the squared entries sum to the number
    of pairs: recent pairs weigh more, and the Gram matrix keeps the binary one's trace, so
    one lambda grid serves every tau (the scaling also makes the weights independent of
    the clock: only differences of times count)."""
    if not days or not len(t):
        return recency_weighted(rows, cols, t, shape, 0.0)
    r, c, t = _latest_per_pair(rows, cols, t)
    g = np.exp((t - t.max()) / (days * DAY_MS))
    g *= np.sqrt(len(g) / float(np.sum(g * g)))
    return sp.csr_matrix((g.astype(np.float32), (r, c)), shape=shape)


def user_rows(x: sp.csr_matrix, query: np.ndarray, norm: float | None) -> np.ndarray:
    """Users' blocks: the users x items weights `x` times `query`, each non-zero row set to
    length `norm` (None: left as the sum)."""
    rows = np.asarray(x @ query, np.float32)
    if norm is not None:
        length = np.linalg.norm(rows, axis=1, keepdims=True)
        np.divide(rows * np.float32(norm), length, out=rows, where=length > 0)
    return rows


def ease_weights(x: sp.csr_matrix, lam: float) -> np.ndarray:
    """EASE^R's (I, I) item-item weights for the users x items matrix `x` (binary, or
    weighted by `fit_weighted`)."""
    g = (x.T @ x).toarray().astype(np.float64)
    g[np.diag_indices_from(g)] += lam
    p = np.linalg.inv(g)
    b = -p / np.diag(p)[None, :]
    np.fill_diagonal(b, 0.0)
    return b


def taus_of(fit: float | Sequence[float]) -> tuple[float, ...]:
    """A fit's taus in days: one (a number) or several (a sequence, `ease_scales`)."""
    return (float(fit),) if np.isscalar(fit) else tuple(float(d) for d in fit)


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
    active, the next-period regression's (`encoder.next_period`, periods ending at `end`,
    None: just after the last pair), plus, when `prop` is active, the graph propagation's
    (`encoder.propagation`); each added at unit score spread over the pairs' users times its
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


def truncated(b: np.ndarray, rank: int) -> tuple[np.ndarray, np.ndarray]:
    """(U_r S_r^1/2, V_r S_r^1/2): B's best rank-r approximation as a product. A full SVD
    up to the default vocabulary's 5,000 items; ARPACK's top-r (scipy `svds`, from a fixed
    start vector, so every run gets the same factors) beyond, where a full SVD of I x I
    takes minutes (10,000 items: 103 s against an estimated 250 on 2 cores)."""
    n = min(b.shape)
    if n <= 5000 or rank >= n // 4:
        u, s, vt = np.linalg.svd(b)
        u, s, vt = u[:, :rank], s[:rank], vt[:rank]
    else:
        u, s, vt = svds(b, k=rank, v0=np.full(n, n ** -0.5), tol=0)
        order = np.argsort(-s, kind="stable")
        u, s, vt = u[:, order], s[order], vt[order]
    root = np.sqrt(s)
    return (u * root).astype(np.float32), (vt.T * root).astype(np.float32)


def reduced_rank(b: np.ndarray, x: sp.csr_matrix, rank: int) -> tuple[np.ndarray, np.ndarray]:
    """(B V D^-1/2, V D^1/2): the rank-r model x B V V^T closest (in squared error over the
    users x items scores) to EASE^R's scores x B of the users of `x` (their binary
    histories), V the top-r eigenvectors of (X B)^T (X B), D their singular values relative
    to the largest (the inner product is x B V V^T whatever D; D keeps the key's columns
    ordered by weight, as the SVD's are). (X B)^T (X B) is formed as B^T (X^T X) B, so memory
    stays I x I whatever the number of users. Cheaper than `truncated`: two I x I products
    and the top-r eigenvectors of a symmetric matrix (3,600 items, rank 128, 2 cores: 3.4 s
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


def factors(b: np.ndarray, x: sp.csr_matrix, rank: int, how: str) -> tuple[np.ndarray, np.ndarray]:
    """(query, key) of rank `rank` for EASE^R's weights `b`, fitted on users `x` (binary):
    `reduced_rank` or B's `truncated` SVD."""
    return reduced_rank(b, x, rank) if how == "reduced_rank" else truncated(b, rank)


def recall_at(scores: np.ndarray, seen: sp.csr_matrix, truth: Sequence[np.ndarray],
              k: int = 20) -> np.ndarray:
    """Per-row Recall@k of `truth` (item indices per row) ranking `scores`, `seen` items masked."""
    scores = np.array(scores, np.float64)
    scores[seen.nonzero()] = -np.inf
    top = np.argpartition(-scores, min(k, scores.shape[1] - 1), axis=1)[:, :k]
    return np.array([len(np.intersect1d(top[i], t)) / len(t) for i, t in enumerate(truth)])


@dataclass
class Interactions:
    """Time-ordered positive (user, item, ts) engagements of a training window as arrays: the
    vocabulary (`items`) is its `max_items` most-engaged items (the dense EASE^R fit); the
    `tail` every other item that at least `min_users` users engaged (rows of the served
    block fitted by `fold_in`)."""
    users: list[str]
    items: list[str]
    tail: list[str]
    rows: np.ndarray             # user index of every pair, time-ordered
    cols: np.ndarray             # item index: < len(items) the vocabulary, then the tail, -1 others
    times: np.ndarray            # ms

    @classmethod
    def of(cls, engagements: Iterable[tuple[str, str, int]], query_types: Sequence[str],
           item_types: Sequence[str], max_items: int, min_users: int = 3) -> "Interactions":
        pairs = [(u, i, t) for u, i, t in engagements
                 if node_type(u) in query_types and node_type(i) in item_types]
        if not pairs:
            z = np.zeros(0, np.int64)
            return cls([], [], [], z, z, z.astype(np.float64))
        u, i, t = zip(*pairs)
        times = np.asarray(t, np.float64)
        order = np.argsort(times, kind="stable")
        users, urow = np.unique(np.asarray(u, object)[order].astype(str), return_inverse=True)
        names, icol = np.unique(np.asarray(i, object)[order].astype(str), return_inverse=True)
        # distinct users per item; the vocabulary by (-users, name), the tail by name
        distinct = np.unique(urow.astype(np.int64) * len(names) + icol)
        counts = np.bincount(distinct % len(names), minlength=len(names))
        ranked = np.lexsort((names, -counts))
        head = np.sort(ranked[:max_items])
        rest = ranked[max_items:]
        tail = np.sort(rest[counts[rest] >= min_users])
        code = np.full(len(names), -1, np.int64)
        code[head] = np.arange(len(head))
        code[tail] = len(head) + np.arange(len(tail))
        return cls(users.tolist(), names[head].tolist(), names[tail].tolist(),
                   urow.astype(np.int64), code[icol], times[order])

    def matrix(self, before: int | None = None, since: int | None = None) -> sp.csr_matrix:
        """Binary users x items of the vocabulary's pairs with ts < `before` and ts >= `since`."""
        return recency_weighted(*self.arrays(before, since), self.shape, 0.0)

    def arrays(self, before: int | None = None, since: int | None = None, tail: bool = False):
        """(user rows, item columns, times) of the vocabulary's pairs (the tail's, columns
        from 0, with `tail`) with ts < `before` and ts >= `since`."""
        n = len(self.items)
        keep = (self.cols >= n) if tail else (self.cols >= 0) & (self.cols < n)
        if before is not None:
            keep &= self.times < before
        if since is not None:
            keep &= self.times >= since
        return self.rows[keep], self.cols[keep] - (n if tail else 0), self.times[keep]

    @property
    def shape(self) -> tuple[int, int]:
        return len(self.users), len(self.items)

    @property
    def pairs(self) -> int:
        return len(self.times)

    @property
    def last_time(self) -> int:
        return int(self.times[-1]) if len(self.times) else 0

    def quantile_time(self, share: float) -> int:
        return int(self.times[min(len(self.times) - 1, int(len(self.times) * share))])


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
        return float(self.per_user(scores).mean())

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
        gram = users_gram(self.history[0], self.history[1], self.before.shape)
        spreads = score_rms(b, gram, self.before.shape), score_rms(n, gram, self.before.shape)
        queries = self.queries(recency_days)
        per_user = {w: self.per_user(np.asarray(queries @ blend(b, n, spreads, w))) for w in grid}
        tried = {w: float(r.mean()) for w, r in per_user.items()}
        best = max(tried, key=tried.get)
        lightest = min(grid)
        if not clear_lead(per_user[best], per_user[lightest]):
            best = lightest
        self.nxt = replace(base, weight=best)
        self._ease = ((lam, taus_of(fit_days), self.nxt, self.prop), blend(b, n, spreads, best))
        return best, tried

    def choose_propagation(self, lam: float, fit_days: float | Sequence[float],
                           recency_days: float | Sequence[float], layers: int,
                           grid: Sequence[float]) -> tuple[float, dict[float, float]]:
        """The graph propagation's weight (`encoder.propagation`, `layers` layers), added to
        the block's weights so far (EASE^R and the chosen next-period part), by the holdout
        Recall@20 of the block alone, as `choose_next` chooses: the best, kept only on a clear
        lead over the grid's lightest weight. The holdout keeps the chosen part (`prop`):
        -> (weight, Recall@20 per weight)."""
        self.prop = None
        if layers <= 0 or max(grid) <= 0:
            return min(grid), {}
        b = self.ease(lam, fit_days)
        p = propagation_weights(self.history[0], self.history[1], self.before.shape, layers)
        gram = users_gram(self.history[0], self.history[1], self.before.shape)
        spreads = score_rms(b, gram, self.before.shape), score_rms(p, gram, self.before.shape)
        queries = self.queries(recency_days)
        per_user = {w: self.per_user(np.asarray(queries @ blend(b, p, spreads, w))) for w in grid}
        tried = {w: float(r.mean()) for w, r in per_user.items()}
        best = max(tried, key=tried.get)
        lightest = min(grid)
        if not clear_lead(per_user[best], per_user[lightest]):
            best = lightest
        self.prop = Propagation(layers, best)
        self._ease = ((lam, taus_of(fit_days), self.nxt, self.prop), blend(b, p, spreads, best))
        return best, tried

    def choose_rank(self, recency_days: float | Sequence[float], ranks: Sequence[int],
                    factorization: str = "reduced_rank") -> tuple[int, dict[int, float]]:
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
            q, k = factors(b, self.before, min(r, n - 1), factorization)
            per_user[r] = self.per_user(user_rows(queries, q, 1.0) @ k.T)
            if r >= n - 1:
                break
        chosen = min(per_user)
        for r in sorted(per_user)[1:]:
            if clear_lead(per_user[r], per_user[chosen]):
                chosen = r
        return chosen, {r: float(v.mean()) for r, v in per_user.items()}

    def weight_curve(self, encoder_scores: np.ndarray, lam: float, rank: int,
                     grid: Sequence[float], unit_users: bool = True,
                     recency_days: float | Sequence[float] = 0.0,
                     fit_days: float | Sequence[float] = 0.0,
                     factorization: str = "reduced_rank") -> dict[float, np.ndarray]:
        """Per weight of `grid`, each judged user's Recall@20 of `encoder_scores` plus the
        block at that weight (its scores' spread over the encoder's); users' blocks of unit
        length with `unit_users` and items weighted by `recency_days`, EASE^R fitted with
        `fit_days` and cut to `rank` by `factorization`, as `fit` serves them."""
        q, k = factors(self.ease(lam, fit_days), self.before, rank, factorization)
        block = user_rows(self.queries(recency_days), q, 1.0 if unit_users else None) @ k.T
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


def clear_lead(better: np.ndarray, base: np.ndarray) -> bool:
    """Whether the same users' figures `better` lead `base` by more than one standard error
    of their paired difference."""
    d = np.asarray(better, np.float64) - np.asarray(base, np.float64)
    if len(d) < 2:
        return False
    return float(d.mean()) > float(np.std(d, ddof=1)) / np.sqrt(len(d))


BLOCK_ALONE = 1000.0     # the block's weight when it is served alone: the encoder's part
                         # only breaks ties (and ranks users and items the block does not know)
ENCODER_ALONE = 0.0


def weights_tried(grid: Sequence[float]) -> tuple[float, ...]:
    """The weights a holdout scores: each part alone beside the grid's mixes."""
    return tuple(sorted({ENCODER_ALONE, *grid, BLOCK_ALONE}))


def choose_parts(per_user: Mapping[float, np.ndarray], popularity: np.ndarray | None = None,
                 ) -> tuple[float, dict[float, float], str]:
    """The served weight from the same users' Recall@20 per weight (`weights_tried`: each
    part alone and the mixes): never an encoder that ranks below `popularity` (the block
    alone then), else the part that ranks better alone (ties: the block) unless the best
    mix (`pick_weight`) leads it by more than a standard error (`clear_lead`): a
    served vector no worse than its better part where the holdout cannot tell them apart.
    -> (weight, mean Recall@20 per weight, the reason in words)."""
    tried = {w: float(np.mean(r)) for w, r in per_user.items()}
    enc, blk = per_user[ENCODER_ALONE], per_user[BLOCK_ALONE]
    if popularity is not None and len(popularity) and float(np.mean(enc)) < float(np.mean(popularity)):
        return BLOCK_ALONE, tried, (f"encoder alone {np.mean(enc):.4f} below popularity "
                                    f"{np.mean(popularity):.4f}: the block alone")
    alone = BLOCK_ALONE if float(np.mean(blk)) >= float(np.mean(enc)) else ENCODER_ALONE
    best = pick_weight(per_user)
    if tried[best] <= tried[alone]:
        return alone, tried, "a part alone ranks best"
    if not clear_lead(per_user[best], per_user[alone]):
        name = "block" if alone == BLOCK_ALONE else "encoder"
        return alone, tried, f"no mix clearly ahead of the {name} alone"
    return best, tried, f"the mix at {best:g} clearly ahead of either part alone"


def pick_weight(per_user: Mapping[float, np.ndarray]) -> float:
    """The weight whose users' Recall@20 (`per_user`: weight -> the same users' figures) has
    the best mean; ties go to the first."""
    return max(per_user, key=lambda w: float(np.mean(per_user[w])))


def fit(data: Interactions, lam: float, rank: int, actions: Sequence[int],
        query_types: Sequence[str], settings: Mapping | None = None,
        unit_users: bool = True, recency_days: float | Sequence[float] = 0.0,
        fit_days: float | Sequence[float] = 0.0,
        factorization: str = "reduced_rank", nxt: NextPeriod | None = None,
        prop: Propagation | None = None) -> CollaborativeBlock | None:
    """EASE^R with `lam` on all of `data`, its pairs weighted by recency with tau `fit_days`
    (0: binary; several taus: their fits summed, `ease_scales`), cut to `rank` (at most
    items - 1) by `factorization`, unscaled (`scaled` sets its
    weight); users' blocks of unit length with `unit_users`, their items weighted by recency
    with tau `recency_days` (0: alike; several: their weights averaged); the next-period
    part `nxt` added to EASE^R's weights before the cut (`block_weights`, its periods ending
    just after the last pair). None when there is nothing to fit."""
    if rank == 0 or len(data.items) < 2 or not data.pairs:
        return None
    rank = min(rank, len(data.items) - 1)
    arrays = data.arrays()
    b = block_weights(*arrays, data.shape, lam, fit_days, nxt, prop=prop)
    q, k = factors(b, recency_weighted(*arrays, data.shape, 0.0), rank, factorization)
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
    return CollaborativeBlock(items, q, k, tuple(sorted(actions)), tuple(query_types),
                              dict(settings or {}, l2=lam, rank=rank, items=len(data.items),
                                   users=len(data.users), recency_days=taus_json(recency_days),
                                   fit_days=taus_json(fit_days), factorization=factorization,
                                   **next_settings(nxt), **propagation_settings(prop), **extra))


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
    return CollaborativeBlock(block.items, block.query * root, block.key * root, block.actions,
                              block.query_types, settings)


def from_checkpoint(ck) -> CollaborativeBlock | None:
    """The block of a verified `encoder.checkpoint.Checkpoint`, None when it has none."""
    doc = (ck.documents or {}).get(FILE)
    if doc is None:
        return None
    if QUERY not in ck.weights or KEY not in ck.weights:
        raise ValueError(f"{FILE} is present but the weights lack {QUERY} / {KEY}")
    return CollaborativeBlock.from_parts(doc, ck.weights[QUERY].float().numpy(),
                                         ck.weights[KEY].float().numpy())
