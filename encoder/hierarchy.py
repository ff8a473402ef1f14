"""Fitting the primitive tree to the embeddings of a trained encoder.

Training learns prototypes by self-distillation, but a short run leaves them where they
started, and embeddings that are still close together all pick the same few. After training
the tree is therefore refitted top-down by spherical k-means (faiss): the coarse level
clusters all embeddings, every coarse cluster is split into its children, and so on, so
every fine primitive has exactly the parent the model's fixed parent map gives it
(contiguous blocks) and siblings really are close. Coarse prototypes stay the normalised
means of their children (`HierarchicalEncoder.level_prototypes`). Each split keeps the best
of `RESTARTS` k-means runs by their objective: with one run the coarse level depended on its
seed (NMI against planted coarse interests 0.58-0.85 over four seeds on the same embeddings;
0.82-0.85 with 10 restarts). Single-threaded k-means with fixed seeds: the same embeddings
give the same prototypes.
"""
from __future__ import annotations

import logging
from typing import Sequence

import faiss
import numpy as np

log = logging.getLogger(__name__)
RESTARTS = 10


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def _split(points: np.ndarray, n: int, around: np.ndarray, seed: int) -> np.ndarray:
    """(n, d) unit centres for `points`; with fewer points than centres, the points and
    jittered copies of `around` (the parent) fill the rest."""
    d = around.shape[0]
    if len(points) >= max(2, n):
        km = faiss.Kmeans(d, n, niter=20, nredo=RESTARTS, seed=seed, spherical=True, verbose=False,
                          min_points_per_centroid=1, max_points_per_centroid=100_000)
        km.train(np.ascontiguousarray(points, np.float32))
        return _unit(km.centroids.astype(np.float32))
    rng = np.random.default_rng(seed)
    fill = around[None] + 0.05 * rng.standard_normal((n - len(points), d)) / np.sqrt(d)
    return _unit(np.concatenate([points, fill]).astype(np.float32))


def fit_tree(emb: np.ndarray, levels: Sequence[int], seed: int = 0) -> np.ndarray | None:
    """(K_fine, d) unit fine prototypes fitted top-down to `emb`; None when a level's size
    is not a multiple of the coarser one (the tree would not be contiguous blocks)."""
    if any(k % p for p, k in zip(levels, levels[1:])) or len(emb) == 0:
        log.warning("prototype tree not refitted: levels %s are not multiples of each other", levels)
        return None
    x = _unit(np.asarray(emb, np.float32))
    threads = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)                  # k-means sums in one order: reproducible
    try:
        centres = _unit(x.mean(0, keepdims=True))
        member = np.zeros(len(x), np.int64)        # cluster at the previous level (one root)
        for depth, k in enumerate(levels):
            per = k // len(centres)
            new = np.zeros((k, x.shape[1]), np.float32)
            nxt = np.zeros(len(x), np.int64)
            for p in range(len(centres)):
                idx = np.flatnonzero(member == p)
                c = _split(x[idx], per, centres[p], seed * 1_000_003 + depth * 10_007 + p)
                new[p * per:(p + 1) * per] = c
                if len(idx):
                    nxt[idx] = p * per + np.argmax(x[idx] @ c.T, axis=1)
            centres, member = new, nxt
        return centres
    finally:
        faiss.omp_set_num_threads(threads)
