"""Bag-of-Meaning tokens: composite (residual) quantization of embeddings with faiss.

M codebooks of 2^nbits codes each; a node's tokens are its M codes, made globally unique
and stable as ``m * 2^nbits + code`` (an unordered bag). Codebooks travel in the checkpoint,
so every worker encodes the same embedding into the same tokens.
"""
from __future__ import annotations

import logging

import faiss
import numpy as np
import torch

from hirflow.encoder.quantizer_config import QuantizerConfig

log = logging.getLogger(__name__)

# faiss k-means warns below this many training points per centroid
SPARSE_POINTS_PER_CODE = 39
# beam width of the residual encoding while the codebooks are fitted: a wider beam finds
# better residuals for each next codebook to learn from (encoding, `QuantizerConfig.beam`,
# may be narrower)
TRAIN_BEAM = 4


class BoMQuantizer:
    def __init__(self, d: int, cfg: QuantizerConfig) -> None:
        self.d, self.cfg = d, cfg
        self.rq = faiss.ResidualQuantizer(d, cfg.m, cfg.nbits)
        self.rq.max_beam_size = cfg.beam
        # faiss prints one stderr line per codebook when it has fewer than 39 points per code;
        # the threshold only warns (it changes no result), so `train` says it once in the log
        self.rq.cp.min_points_per_centroid = 1
        self._greedy: tuple[torch.Tensor, torch.Tensor] | None = None   # codebooks, norms

    @property
    def trained(self) -> bool:
        return bool(self.rq.is_trained)

    def train(self, x: np.ndarray) -> "BoMQuantizer":
        x = np.ascontiguousarray(x, np.float32)
        if len(x) < SPARSE_POINTS_PER_CODE << self.cfg.nbits:
            log.warning("BoM quantizer fitted on %d embeddings: fewer than %d per code of its "
                        "%d codebooks; tokens are coarse until the data grows", len(x),
                        SPARSE_POINTS_PER_CODE, self.cfg.m)
        if len(x) > self.cfg.train_size:
            idx = np.random.default_rng(self.cfg.seed).choice(len(x), self.cfg.train_size, replace=False)
            x = x[np.sort(idx)]
        threads = faiss.omp_get_max_threads()
        faiss.omp_set_num_threads(1)          # k-means sums in one order: reproducible codebooks
        self.rq.max_beam_size = TRAIN_BEAM
        if len(x) <= x.shape[1]:              # the progressive-dimension training needs a PCA
            self.rq.train_type = faiss.ResidualQuantizer.Train_default   # of more points than dims
        try:
            self.rq.train(x)
        finally:
            faiss.omp_set_num_threads(threads)
            self.rq.max_beam_size = self.cfg.beam
        self._greedy = None
        return self

    def codes(self, x: np.ndarray) -> np.ndarray:
        """(n, M) int64 code per codebook: faiss's beam search, or at beam 1 the same greedy
        residual encoding as a few matrix products (`greedy_codes`)."""
        x = np.ascontiguousarray(x, np.float32)
        if self.cfg.beam == 1:
            return self.greedy_codes(x)
        return unpack_codes(self.rq.compute_codes(x), self.cfg.m, self.cfg.nbits)

    def greedy_codes(self, x: np.ndarray) -> np.ndarray:
        """Greedy residual encoding: codebook by codebook, the code nearest the residual left
        by the ones before. What faiss's `compute_codes` does at beam 1, as one (n, d) x (d, K)
        product per codebook in torch (on the serving threads `set_cpu_threads` sets), in
        about a third of the time faiss's beam search loop takes for 512 vectors of 192
        floats on one thread (docs/benchmarks.md). Codes equal faiss's except where two codes
        are equally near to float rounding."""
        if self._greedy is None:
            cb = torch.from_numpy(np.ascontiguousarray(self.codebooks_array()))
            self._greedy = (cb, (cb * cb).sum(-1))
        cb, norms = self._greedy
        r = torch.from_numpy(np.array(x, np.float32, copy=True))
        out = torch.empty((len(r), self.cfg.m), dtype=torch.int64)
        for m in range(self.cfg.m):
            # ||r - c||^2 = ||r||^2 - 2 r.c + ||c||^2; ||r||^2 is the same for every c
            k = torch.addmm(norms[m], r, cb[m].T, alpha=-2.0).argmin(1)
            out[:, m] = k
            r -= cb[m][k]
        return out.numpy()

    def tokens(self, x: np.ndarray) -> np.ndarray:
        """(n, M) int64 stable tokens: m * 2^nbits + code."""
        return self.codes(x) + (np.arange(self.cfg.m, dtype=np.int64) << self.cfg.nbits)[None]

    def decode(self, codes: np.ndarray) -> np.ndarray:
        return self.codebooks_array()[np.arange(self.cfg.m)[None], codes].sum(1)

    def reconstruction_error(self, x: np.ndarray) -> float:
        """Mean squared error relative to mean squared norm (0 = exact)."""
        x = np.asarray(x, np.float32)
        r = self.decode(self.codes(x))
        return float(((x - r) ** 2).sum(1).mean() / max(1e-12, (x ** 2).sum(1).mean()))

    def codebooks_array(self) -> np.ndarray:
        """(M, 2^nbits, d) float32."""
        cb = faiss.vector_to_array(self.rq.codebooks)
        return cb.reshape(self.cfg.m, 1 << self.cfg.nbits, self.d)

    @classmethod
    def from_codebooks(cls, codebooks: np.ndarray, cfg: QuantizerConfig) -> "BoMQuantizer":
        m, k, d = codebooks.shape
        if m != cfg.m or k != 1 << cfg.nbits:
            raise ValueError(f"codebooks of shape {codebooks.shape} do not match m={cfg.m}, nbits={cfg.nbits}")
        q = cls(d, cfg)
        faiss.copy_array_to_vector(np.ascontiguousarray(codebooks, np.float32).ravel(), q.rq.codebooks)
        q.rq.is_trained = True
        q.rq.compute_codebook_tables()
        return q


def unpack_codes(packed: np.ndarray, m: int, nbits: int) -> np.ndarray:
    """faiss packs codes LSB-first into bytes; unpack to (n, m) int64."""
    bits = np.unpackbits(packed, axis=1, bitorder="little")[:, :m * nbits]
    weights = (1 << np.arange(nbits, dtype=np.int64))
    return (bits.reshape(len(packed), m, nbits).astype(np.int64) * weights).sum(-1)
