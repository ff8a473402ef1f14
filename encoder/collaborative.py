"""The collaborative block as a worker serves it: extra coordinates of every embedding that
carry an item-item model through the served inner product.

An item's block is its `key` row (and its popularity prior, when the block has one); a
user's block the sum of the `query` rows of the items it engaged (as of a cutoff), each
weighted by how recently it engaged them relative to its own latest engagement, set to a
fixed length (and the prior's constant): so it moves with every engagement the worker
applies, and never with the clock. Nodes the block does not know get zeros. The trainer fits
the block and chooses everything in it (`trainer.block_fit`, `trainer.collaborative_fit`);
this module only reads it from a checkpoint and computes it from adjacencies.

numpy and scipy only; `EdgeColumns` is state's data type for a batch's adjacencies.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np
import scipy.sparse as sp

from hirflow.state.edge_columns import EdgeColumns
from hirflow.state.schema import node_type

FILE = "collaborative.json"          # the block's vocabulary and settings, beside the weights


QUERY, KEY = "collab.query", "collab.key"     # its (I, rank) matrices in weights.safetensors
PRIOR = "collab.prior"               # its (I,) popularity prior, when it has one


DAY_MS = 86_400_000

# the block's weight against the encoder (a checkpoint's `collaborative.weight`) at the two
# ends: the block alone (the encoder's part only breaks ties, and ranks users and items the
# block does not know) and the encoder alone (the block's coordinates are zeros)
BLOCK_ALONE = 1000.0
ENCODER_ALONE = 0.0


@dataclass
class CollaborativeBlock:
    items: tuple[str, ...]           # vocabulary, row order of `query` and `key`
    query: np.ndarray                # (I, rank) float32: what an engaged item adds to a user
    key: np.ndarray                  # (I, rank) float32: the item's own block
    actions: tuple[int, ...]         # action codes (`SchemaConfig.action_codes`) that count
    query_types: tuple[str, ...]     # node types whose block sums their items' `query` rows
    settings: dict = field(default_factory=dict)   # l2, scale, fit figures (for the manifest)
    prior: np.ndarray | None = None  # (I,) float32: the items' popularity prior, one more
                                     # coordinate whose users' value is `prior_user`
                                     # (`trainer.popularity_prior`; None: none)

    def __post_init__(self) -> None:
        self.row = {n: i for i, n in enumerate(self.items)}
        # the length of a user's block; None (checkpoints fitted before it existed): the sum
        self.user_norm = self.settings.get("user_norm")
        # taus of a user's item weights in days, their weights averaged; 0 (and checkpoints
        # fitted before it): all alike
        self.recency_days = taus_of(self.settings.get("recency_days") or 0.0)
        self.action_mask = np.zeros(max(self.actions, default=0) + 1, bool)
        self.action_mask[list(self.actions)] = True
        self.prior_user = float(self.settings.get("prior_user", 0.0))

    @property
    def rank(self) -> int:
        """The block's width: the item-item model's, and the prior's coordinate."""
        return int(self.key.shape[1]) + (self.prior is not None)

    def item_rows(self, rows: Sequence[int] | np.ndarray) -> np.ndarray:
        """(len(rows), rank) blocks of the vocabulary's `rows`: their keys, and their prior."""
        key = self.key[np.asarray(rows, np.int64)]
        if self.prior is None:
            return key
        return np.concatenate([key, self.prior[np.asarray(rows, np.int64)][:, None]], axis=1)

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
        out[items] = self.item_rows(own[items])
        if self.prior is not None:
            out[is_query, -1] = self.prior_user       # every user adds the items' prior alike
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
            out[is_query, :self.key.shape[1]] = user_rows(x, self.query, self.user_norm)[is_query]
        return out

    def manifest(self) -> dict:
        return {"items": list(self.items), "actions": list(self.actions),
                "query_types": list(self.query_types), "settings": self.settings}

    def weights(self) -> dict[str, np.ndarray]:
        out = {QUERY: self.query, KEY: self.key}
        if self.prior is not None:
            out[PRIOR] = self.prior
        return out

    @classmethod
    def from_parts(cls, manifest: Mapping, query: np.ndarray, key: np.ndarray,
                   prior: np.ndarray | None = None) -> "CollaborativeBlock":
        items = tuple(manifest["items"])
        if query.shape != key.shape or query.shape[0] != len(items):
            raise ValueError(f"collaborative block: {len(items)} items but matrices of shapes "
                             f"{query.shape} and {key.shape}")
        if prior is not None and prior.shape != (len(items),):
            raise ValueError(f"collaborative block: {len(items)} items but a prior of shape {prior.shape}")
        return cls(items, np.asarray(query, np.float32), np.asarray(key, np.float32),
                   tuple(int(a) for a in manifest["actions"]), tuple(manifest["query_types"]),
                   dict(manifest.get("settings", {})),
                   None if prior is None else np.asarray(prior, np.float32))


def latest_per_pair(rows, cols, t) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
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
    r, c, t = latest_per_pair(rows, cols, t)
    taus = taus_of(days)
    if any(taus):
        latest = np.full(shape[0], -np.inf)
        np.maximum.at(latest, r, t)
        age = t - latest[r]
        g = np.mean([np.exp(age / (d * DAY_MS)) if d else np.ones(len(t)) for d in taus], axis=0)
    else:
        g = np.ones(len(t))
    return sp.csr_matrix((g.astype(np.float32), (r, c)), shape=shape)


def user_rows(x: sp.csr_matrix, query: np.ndarray, norm: float | None) -> np.ndarray:
    """Users' blocks: the users x items weights `x` times `query`, each non-zero row set to
    length `norm` (None: left as the sum)."""
    rows = np.asarray(x @ query, np.float32)
    if norm is not None:
        length = np.linalg.norm(rows, axis=1, keepdims=True)
        np.divide(rows * np.float32(norm), length, out=rows, where=length > 0)
    return rows


def taus_of(fit: float | Sequence[float]) -> tuple[float, ...]:
    """A fit's taus in days: one (a number) or several (a sequence, `ease_scales`)."""
    return (float(fit),) if np.isscalar(fit) else tuple(float(d) for d in fit)


def from_checkpoint(ck) -> CollaborativeBlock | None:
    """The block of a verified `encoder.checkpoint.Checkpoint`, None when it has none."""
    doc = (ck.documents or {}).get(FILE)
    if doc is None:
        return None
    if QUERY not in ck.weights or KEY not in ck.weights:
        raise ValueError(f"{FILE} is present but the weights lack {QUERY} / {KEY}")
    prior = ck.weights.get(PRIOR)
    return CollaborativeBlock.from_parts(doc, ck.weights[QUERY].float().numpy(),
                                         ck.weights[KEY].float().numpy(),
                                         None if prior is None else prior.float().numpy())
