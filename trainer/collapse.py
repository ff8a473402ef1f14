"""Collapse health: whether the encoder still tells items apart.

A retrieval encoder collapses when every item moves to the same direction: the softmax then
learns nothing but popularity (the score coordinate), and the served ranking is the same for
every user. It happens silently when steps have no negatives (a quiet day's batch holding
one user's history). Three figures catch it:
- `mean_cosine`: the mean pairwise cosine of item directions, from the norm of their sum
  ((|sum|^2 - n) / (n (n - 1)), no n x n matrix): near 1 means collapsed;
- `effective_rank`: exp of the entropy of the normalised singular values of the item
  directions (Roy and Vetterli 2007): 1 means every item on one line;
- `no_negative`: the share of positives that met no negative in their step.
`CollapseWatch` keeps them per training chunk (the item anchors its steps embedded) for the
log and the manifest; `health` scores the final embeddings, and a checkpoint whose item
directions' mean cosine exceeds the threshold is marked collapsed: its encoder part is then
never served (`trainer.collaborative_fit` serves the block alone).

numpy only.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np

log = logging.getLogger(__name__)
MAX_ROWS = 4096            # directions kept per chunk (a seeded subset beyond)


def mean_cosine(directions: np.ndarray) -> float:
    """Mean pairwise cosine of the rows of `directions` (each normalised first); nan for
    fewer than two rows."""
    x = np.asarray(directions, np.float64)
    x = x[np.linalg.norm(x, axis=1) > 0]
    n = len(x)
    if n < 2:
        return float("nan")
    x = x / np.linalg.norm(x, axis=1, keepdims=True)
    total = float(np.square(x.sum(0)).sum())
    return (total - n) / (n * (n - 1))


def effective_rank(directions: np.ndarray) -> float:
    """exp(entropy of the singular values over their sum) of the normalised rows: between 1
    (all on one line) and min(n, d) (spread evenly)."""
    x = np.asarray(directions, np.float64)
    x = x[np.linalg.norm(x, axis=1) > 0]
    if len(x) < 2:
        return float("nan")
    x = x / np.linalg.norm(x, axis=1, keepdims=True)
    s = np.linalg.svd(x, compute_uv=False)
    p = s / s.sum()
    p = p[p > 0]
    return float(np.exp(-(p * np.log(p)).sum()))


def health(directions: np.ndarray) -> dict:
    """Both figures of item directions, rounded for manifests (None for fewer than two)."""
    def rounded(v: float, digits: int) -> float | None:
        return None if np.isnan(v) else round(v, digits)
    return {"items": int(len(directions)), "mean_cosine": rounded(mean_cosine(directions), 4),
            "effective_rank": rounded(effective_rank(directions), 2)}


def collapsed(figures: dict, threshold: float) -> bool:
    return (figures.get("mean_cosine") or 0.0) > threshold


@dataclass
class CollapseWatch:
    """Per training chunk: the item directions its steps embedded and how many positives
    met no negative; `close_chunk` turns them into one row of `chunks`."""
    threshold: float = 0.9
    chunks: list[dict] = field(default_factory=list)
    positives: int = 0
    no_negative: int = 0
    _rows: list[np.ndarray] = field(default_factory=list)
    _chunk_pos: int = 0
    _chunk_none: int = 0
    _collapsed: bool = False

    def step(self, item_directions: np.ndarray, positives: int, no_negative: int) -> None:
        self._rows.append(np.asarray(item_directions, np.float32))
        self._chunk_pos += positives
        self._chunk_none += no_negative
        self.positives += positives
        self.no_negative += no_negative

    def close_chunk(self, chunk: int) -> dict | None:
        """The chunk's row (None when its steps embedded no item), logged when collapsed."""
        rows = np.concatenate(self._rows) if self._rows else np.zeros((0, 1), np.float32)
        pos, none = self._chunk_pos, self._chunk_none
        self._rows, self._chunk_pos, self._chunk_none = [], 0, 0
        if not len(rows):
            return None
        if len(rows) > MAX_ROWS:
            rows = rows[np.random.default_rng(chunk).choice(len(rows), MAX_ROWS, replace=False)]
        row = {"chunk": chunk, **health(rows),
               "no_negative": round(none / pos, 4) if pos else None}
        self.chunks.append(row)
        now = collapsed(row, self.threshold)
        if now != self._collapsed:             # one line when the state changes, not per chunk
            self._collapsed = now
            log.log(logging.WARNING if now else logging.INFO,
                    "chunk %d: item directions %s (mean cosine %.3f, effective rank %.1f, %d of "
                    "%d positives without a negative)", chunk,
                    "collapsed" if now else "apart again", row["mean_cosine"] or 0.0,
                    row["effective_rank"] or 0.0, none, pos)
        return row

    def summary(self, final: dict) -> dict:
        """What the manifest records: the final embeddings' health, whether they collapsed,
        the share of positives without a negative, and every chunk's row (as columns)."""
        cols = ("chunk", "mean_cosine", "effective_rank", "no_negative")
        return {**final, "threshold": self.threshold,
                "collapsed": collapsed(final, self.threshold),
                "no_negative": round(self.no_negative / self.positives, 4) if self.positives else None,
                "per_chunk": {c: [r[c] for r in self.chunks] for c in cols}}
