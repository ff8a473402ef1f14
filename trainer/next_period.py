"""Next-period regression: item-item weights that map what a user had engaged before a cut
to the items the user engaged for the first time in the period after it.

EASE^R (`trainer.item_item`) learns which items go together in a user's history; what a
served ranking is judged on is different: which items, new to the user, come next. A ridge
regression says that directly. At `periods` cuts, each one `span` before the next and the
last one `span` before the window's end, X_k holds the users' binary histories before cut k
and Y_k the items each of them engaged first in [cut k, cut k + span); stacked over the
cuts,

    N = (X^T X + lambda I)^-1 X^T Y

and a user's scores are x_u N, an inner product through the same item-item form as EASE^R's,
so `item_item.block_weights` adds N to EASE^R's weights before the block is cut to its
rank. Only the last few periods count: what is bought new now moves with the season, and on
Online Retail's windows before its test window two periods ranked better than four, four
better than twelve (docs/evaluation.md). Rows are the users who engaged something new in a
period (the users a served ranking is judged on); a large lambda keeps N close to X^T Y,
the overlap counts between histories and the next period's new items.

numpy and scipy only.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.linalg
import scipy.sparse as sp


@dataclass(frozen=True)
class NextPeriod:
    """How the next-period weights are fitted and how much they weigh."""
    periods: int            # cuts (0: none)
    span: int               # each period's length in ms
    l2: float               # ridge lambda
    weight: float           # their score spread over EASE^R's in the sum (0: none)

    @property
    def active(self) -> bool:
        return self.periods > 0 and self.span > 0 and self.weight > 0


def binary(rows: np.ndarray, cols: np.ndarray, shape) -> sp.csr_matrix:
    """Users x items, 1 where a (row, col) pair occurs."""
    x = sp.csr_matrix((np.ones(len(rows), np.float64), (rows, cols)), shape=shape)
    x.data[:] = 1.0
    return x


def first_engagements(history: sp.csr_matrix, after: sp.csr_matrix) -> tuple[sp.csr_matrix, np.ndarray]:
    """The (user, item) pairs of `after` that `history` lacks (items new to the user), and
    the rows that have any."""
    new = (after - after.multiply(history)).tocsr()
    new.eliminate_zeros()
    return new, np.flatnonzero(np.diff(new.indptr) > 0)


def next_period_weights(rows: np.ndarray, cols: np.ndarray, t: np.ndarray, shape, lam: float,
                        periods: int, span: int, end: int) -> np.ndarray:
    """(I, I) ridge weights from users' histories before each of `periods` cuts (end - k x
    span, k = 1..periods) to the items each user engaged first in the span after it; zeros
    when no period has any."""
    rows, cols, t = np.asarray(rows, np.int64), np.asarray(cols, np.int64), np.asarray(t, np.float64)
    n = shape[1]
    gram, cross = np.zeros((n, n)), np.zeros((n, n))
    for k in range(1, periods + 1):
        cut = end - k * span
        before = t < cut
        history = binary(rows[before], cols[before], shape)
        during = (t >= cut) & (t < cut + span)
        new, judged = first_engagements(history, binary(rows[during], cols[during], shape))
        if not len(judged):
            continue
        x = history[judged]
        gram += (x.T @ x).toarray()
        cross += (x.T @ new[judged]).toarray()
    if not cross.any():
        return np.zeros((n, n))
    gram[np.diag_indices_from(gram)] += lam
    return scipy.linalg.solve(gram, cross, assume_a="pos")
