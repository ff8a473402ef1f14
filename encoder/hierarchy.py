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
0.82-0.85 with 10 restarts). k-means leaves some clusters much larger than others (Online
Retail, second training seed: usage entropy 0.90 / 0.90 / 0.90 of log K, the design's floor),
so each split's centres are then moved `BALANCE_ROUNDS` times to the means of an entropic
transport plan that gives every centre an equal share of the points (Sinkhorn): the same
embeddings' usage entropy 0.99 / 0.98 / 0.92, the synthetic world's fine NMI 0.84 -> 0.82
(docs/evaluation.md). Single-threaded k-means with fixed seeds: the same embeddings give the
same prototypes.
"""
from __future__ import annotations

import logging
from typing import Sequence

import faiss
import numpy as np

log = logging.getLogger(__name__)
RESTARTS = 10
BALANCE_ROUNDS = 3         # moves of each split's centres to their balanced plan's means
BALANCE_EPSILON = 0.05     # entropic temperature of that plan, on cosine similarities
SINKHORN_ITERATIONS = 50


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def balanced_plan(similarity: np.ndarray, epsilon: float = BALANCE_EPSILON,
                  iterations: int = SINKHORN_ITERATIONS, tol: float = 0.0) -> np.ndarray:
    """(n, k) entropic transport plan of n points (mass 1/n each) to k centres (1/k each)
    with cost -`similarity`, by at most `iterations` of Sinkhorn's scaling, stopping early
    once no row's mass is more than `tol` off 1/n (0: never early; the tree's refit runs a
    fixed budget, a near-balanced plan is all it needs). Cosine similarities over
    epsilon 0.05 span at most 40 nats, so the kernel exp((s - max s) / epsilon) stays far
    from float64's underflow and no log-domain arithmetic is needed; columns sum to 1/k."""
    n, k = similarity.shape
    kernel = np.exp((similarity.astype(np.float64) - similarity.max()) / epsilon)
    v = np.ones(k)
    for _ in range(iterations):
        u = (1.0 / n) / (kernel @ v)
        v = (1.0 / k) / (kernel.T @ u)
        if tol and np.max(np.abs(u * (kernel @ v) - 1.0 / n)) <= tol:
            break
    return u[:, None] * kernel * v[None]


def balance(points: np.ndarray, centres: np.ndarray, rounds: int = BALANCE_ROUNDS) -> np.ndarray:
    """`centres` moved `rounds` times to the unit means of the points their balanced plan
    (`balanced_plan`) gives them: each takes a like share of `points`."""
    for _ in range(rounds):
        centres = _unit((balanced_plan(points @ centres.T).T @ points).astype(np.float32))
    return centres


def _split(points: np.ndarray, n: int, around: np.ndarray, seed: int,
           balance_rounds: int = BALANCE_ROUNDS) -> np.ndarray:
    """(n, d) unit centres for `points` (k-means, then `balance`); with fewer points than
    centres, the points and jittered copies of `around` (the parent) fill the rest."""
    d = around.shape[0]
    if len(points) >= max(2, n):
        km = faiss.Kmeans(d, n, niter=20, nredo=RESTARTS, seed=seed, spherical=True, verbose=False,
                          min_points_per_centroid=1, max_points_per_centroid=100_000)
        km.train(np.ascontiguousarray(points, np.float32))
        return balance(points, _unit(km.centroids.astype(np.float32)), balance_rounds)
    rng = np.random.default_rng(seed)
    fill = around[None] + 0.05 * rng.standard_normal((n - len(points), d)) / np.sqrt(d)
    return _unit(np.concatenate([points, fill]).astype(np.float32))


def fit_tree(emb: np.ndarray, levels: Sequence[int], seed: int = 0,
             balance_rounds: int = BALANCE_ROUNDS) -> np.ndarray | None:
    """(K_fine, d) unit fine prototypes fitted top-down to `emb` (each split's k-means
    centres balanced `balance_rounds` times, 0: plain k-means); None when a level's size is
    not a multiple of the coarser one (the tree would not be contiguous blocks)."""
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
                c = _split(x[idx], per, centres[p], seed * 1_000_003 + depth * 10_007 + p,
                           balance_rounds)
                new[p * per:(p + 1) * per] = c
                if len(idx):
                    nxt[idx] = p * per + np.argmax(x[idx] @ c.T, axis=1)
            centres, member = new, nxt
        return centres
    finally:
        faiss.omp_set_num_threads(threads)
