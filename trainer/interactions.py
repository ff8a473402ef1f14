"""A training window's positive user-item engagements as arrays, over the dense vocabulary
of its most-engaged items and the tail of every other item enough users engaged."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np
import scipy.sparse as sp

from hirflow.encoder.collaborative import recency_weighted
from hirflow.state.schema import node_type

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

    def median_gap(self) -> float:
        """The median time (ms) between a user's successive engagements, any item, those at
        the same instant counted once: the data set's own tempo (a click session's is a
        minute, a shop's customer's weeks); 0 when no user engaged at two instants."""
        order = np.lexsort((self.times, self.rows))
        rows, times = self.rows[order], self.times[order]
        gaps = np.diff(times)[rows[1:] == rows[:-1]]
        gaps = gaps[gaps > 0]
        return float(np.median(gaps)) if len(gaps) else 0.0

    def quantile_time(self, share: float) -> int:
        return int(self.times[min(len(self.times) - 1, int(len(self.times) * share))])
