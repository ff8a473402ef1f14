"""Graph propagation weights: the item-item filter LightGCN's propagation reduces to.

LightGCN's layers without training are a linear filter on the users x items matrix R
(Shen et al. 2021, GF-CF): with R~ = D_u^-1/2 R D_i^-1/2, one layer scores a user's items as
r_u P, P = R~^T R~ (co-engagement, each pair discounted by how active its users and how
popular its items are), `layers` layers as r_u P^layers. EASE^R (`trainer.item_item`)
regresses each item on the others; this spreads a user's items over the co-engagement graph,
reaching items two steps away. Both are item-item matrices scored by the same inner product,
so `item_item.block_weights` can add P^layers to EASE^R's weights before the block is
cut to its rank; the trainer's holdout chooses how much (`holdout.Holdout.choose_propagation`).

numpy and scipy only.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp


@dataclass(frozen=True)
class Propagation:
    """How many layers the propagation has and how much it weighs."""
    layers: int             # 0: none
    weight: float           # its score spread over the rest of the block's (0: none)

    @property
    def active(self) -> bool:
        return self.layers > 0 and self.weight > 0


def propagation_weights(rows: np.ndarray, cols: np.ndarray, shape, layers: int) -> np.ndarray:
    """(I, I) P^layers, P = D_i^-1/2 R^T D_u^-1 R D_i^-1/2 of the binary users x items R of the
    (row, col) pairs; zeros for an item no one engaged."""
    r = sp.csr_matrix((np.ones(len(rows)), (rows, cols)), shape=shape)
    r.data[:] = 1.0
    du = np.asarray(r.sum(1)).ravel()
    di = np.asarray(r.sum(0)).ravel()
    inv_u = np.divide(1.0, np.sqrt(du), out=np.zeros_like(du), where=du > 0)
    inv_i = np.divide(1.0, np.sqrt(di), out=np.zeros_like(di), where=di > 0)
    rn = sp.diags(inv_u) @ r @ sp.diags(inv_i)
    p = (rn.T @ rn).toarray()
    out = p
    for _ in range(layers - 1):
        out = out @ p
    return out
