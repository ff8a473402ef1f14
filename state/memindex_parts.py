"""What a `MemoryIndex` keeps beside its matrices, per-token posting lists and the IVF layout
of the first codebook; the upkeep of its per-row columns (grow, drop removed rows, reorder);
the candidate search over the layout and the projection into the prototypes' space. All run
under the index's lock."""
from __future__ import annotations

import numpy as np


class TokenPostings:
    """token -> the rows that hold it. Arrays are rebuilt from the token matrix (the truth)
    at each compaction; between compactions a row that gains a token is appended to a list,
    and a row that lost one is filtered out at read time against the matrix."""

    def __init__(self) -> None:
        self._base: dict[int, np.ndarray] = {}
        self._extra: dict[int, list[int]] = {}
        self.pending = 0                        # appended rows since the last rebuild

    def add(self, row: int, tokens) -> None:
        for t in tokens:
            self._extra.setdefault(t, []).append(row)
        self.pending += len(tokens)

    def appended(self, t: int) -> list[int] | None:
        return self._extra.get(t)

    def rebuild(self, tokens: np.ndarray) -> None:
        """From the (n, m) token matrix of the rows in use."""
        n, m = tokens.shape
        flat = tokens.ravel()
        rows = np.repeat(np.arange(n, dtype=np.int64), m)
        keep = flat >= 0
        flat, rows = flat[keep], rows[keep]
        order = np.argsort(flat, kind="stable")
        flat, rows = flat[order], rows[order]
        uniq, starts = np.unique(flat, return_index=True)
        bounds = list(starts[1:]) + [len(flat)]
        self._base = {int(t): rows[s:e] for t, s, e in zip(uniq, starts, bounds)}
        self._extra = {}
        self.pending = 0

    def rows(self, t: int, tokens: np.ndarray, col: int | None) -> np.ndarray:
        """Rows that hold token `t` now (checked against `tokens`, in column `col` when the
        token's codebook is known)."""
        base, extra = self._base.get(t), self._extra.get(t)
        parts = [p for p in (base, np.asarray(extra, np.int64) if extra else None) if p is not None]
        if not parts:
            return np.zeros(0, np.int64)
        rows = np.concatenate(parts) if len(parts) > 1 else parts[0]
        if col is not None:
            return rows[tokens[rows, col] == t]
        return rows[(tokens[rows] == t).any(1)]


class CellLayout:
    """The first codebook as an IVF layout: at compaction the index orders its rows by their
    first token, so cell c is the contiguous block `block(c)`; a row whose first token has
    changed since is no longer in its block (`in_cell`), and rows added since are in none."""

    def __init__(self, capacity: int, nbits: int) -> None:
        self.nbits = nbits
        self.laid = 0                           # rows [0, laid) were ordered at compaction
        self.start: np.ndarray | None = None    # cell c: rows start[c]:start[c + 1]
        self.home = np.full(capacity, -1, np.int64)
        self.in_cell = np.zeros(capacity, bool)

    def grow(self, capacity: int) -> None:
        old = len(self.home)
        home, in_cell = np.full(capacity, -1, np.int64), np.zeros(capacity, bool)
        home[:old], in_cell[:old] = self.home, self.in_cell
        self.home, self.in_cell = home, in_cell

    def first_token_set(self, row: int, first: int) -> None:
        if row < self.laid:
            self.in_cell[row] = first == self.home[row]

    def lay_out(self, first: np.ndarray) -> None:
        """After the rows were ordered by first token (`first`, one per row in use)."""
        n = len(first)
        self.start = np.searchsorted(first, np.arange((1 << self.nbits) + 1))
        self.laid = n
        self.home[:n] = first
        self.in_cell[:n] = True

    def block(self, c: int) -> tuple[int, int]:
        if self.start is None:                  # no layout before the first compaction
            return 0, 0
        return int(self.start[c]), int(self.start[c + 1])


def ivf_candidates(ix, q: np.ndarray, toks: set[int], limit: int) -> tuple[np.ndarray, np.ndarray]:
    """Candidate rows of MemoryIndex `ix` (under its lock) for query `q`, with their exact
    inner products. Probed cells are scored block by block; rows that joined a probed cell
    since the last compaction and the postings of the query's other tokens are gathered
    (`np.take`, faster than a lookup-table sum over their codes) and scored with repeats, cut
    to `limit`, and only then deduplicated (a row repeats at most m times, so `limit` >= m * k
    keeps k)."""
    cells = sorted(t for t in toks if t >> ix.nbits == 0)
    probed = np.zeros(1 << ix.nbits, bool)
    probed[cells] = True
    rows, scores, loose = [], [], []
    in_cell = ix.cells.in_cell
    for c in cells:
        s, e = ix.cells.block(c)
        if e > s:
            ok = in_cell[s:e]
            rows.append(np.arange(s, e)[ok])
            scores.append((ix.emb[s:e] @ q)[ok])
        extra = ix.postings.appended(c)
        if extra:
            x = np.asarray(extra, np.int64)
            loose.append(x[(ix.tokens[x, 0] == c) & ~in_cell[x]])
    for t in toks:
        if t >> ix.nbits != 0:
            r = ix.token_rows(t)
            if len(r):                                  # rows of probed cells: scored above
                loose.append(r[~probed[ix.tokens[r, 0]]])
    if loose:
        lr = np.concatenate(loose)                      # repeats: a row shares several tokens
        ls = np.take(ix.emb, lr, axis=0) @ q
        if len(lr) > limit:
            top = np.argpartition(-ls, limit - 1)[:limit]
            lr, ls = lr[top], ls[top]
        lr, first = np.unique(lr, return_index=True)
        rows.append(lr)
        scores.append(ls[first])
    if not rows:
        return np.zeros(0, np.int64), np.zeros(0, np.float32)
    return np.concatenate(rows), np.concatenate(scores)


# the index's per-row columns, kept parallel: grown, filtered and reordered together
ROW_COLUMNS = ("emb", "tokens", "assign", "types", "seq")


def _empty(name: str) -> int:
    return -1 if name in ("tokens", "assign") else 0


def grow_rows(ix, need: int) -> None:
    """Room for `need` rows in every column of MemoryIndex `ix` (doubling)."""
    cap = len(ix.emb)
    if need <= cap:
        return
    new = max(need, cap * 2)
    for name in ROW_COLUMNS:
        a = getattr(ix, name)
        b = np.full((new,) + a.shape[1:], _empty(name), a.dtype)
        b[:cap] = a
        setattr(ix, name, b)
    ix.cells.grow(new)


def drop_removed_rows(ix) -> None:
    """The rows of removed nodes out of `ix`'s columns, the others moved up in order."""
    live = np.zeros(ix.n, bool)
    live[list(ix.rows.values())] = True
    n = int(live.sum())
    for name in ROW_COLUMNS:
        a = getattr(ix, name)
        a[:n] = a[:ix.n][live]
        a[n:ix.n] = _empty(name)
    ix.ids = [node for node, keep in zip(ix.ids, live.tolist()) if keep]
    ix.rows = {node: j for j, node in enumerate(ix.ids)}
    ix.n, ix.removed = n, 0


def order_rows_by_first_token(ix) -> None:
    """`ix`'s rows sorted (stably) by their first token: the IVF layout's blocks."""
    n = ix.n
    order = np.argsort(ix.tokens[:n, 0], kind="stable")
    if (order != np.arange(n)).any():
        for name in ROW_COLUMNS:
            a = getattr(ix, name)
            a[:n] = a[:n][order]
        ix.ids = [ix.ids[i] for i in order]
        ix.rows = {node: j for j, node in enumerate(ix.ids)}


def towards_prototypes(ix, rows: np.ndarray) -> np.ndarray:
    """Embeddings of `ix`'s `rows` less their type's mean, unit length (as the model assigns),
    in the prototypes' coordinates: the first ones (a collaborative block follows them)."""
    x = ix.emb[rows]
    if ix.prototypes is not None:
        x = x[:, :ix.prototypes[0].shape[1]]
    if ix.centres is None:
        return x
    x = x - ix.centres[ix.types[rows]]
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
