"""The in-memory mirror of one index generation, which queries are answered from.

RocksDB holds the durable postings (`state.index`), but a prefix scan runs at ~3 million
postings/s and point reads of embeddings at ~150k/s here, too slow for a query budget of a
few ms over a million nodes. The mirror keeps the embedding matrix, the token matrix and
per-token posting arrays in numpy. Postings are append-only between compactions: a node
that leaves a token is filtered out at query time by checking the token matrix (the truth),
so an update costs one row write and a few list appends.

Retrieval follows DESIGN.md: union of the postings of the query's tokens (optionally more
probes of the first codebook), filtered by node type, cut to a bounded candidate set by the
quantized inner product (lookup tables over the token matrix), re-ranked by exact inner product.
"""
from __future__ import annotations

import threading
from typing import Iterable, Sequence

import numpy as np


class MemoryIndex:
    def __init__(self, gen: int, model: str | None, d: int, m: int, levels: int,
                 type_names: Sequence[str], nbits: int = 8, codebooks: np.ndarray | None = None,
                 prototypes: Sequence[np.ndarray] | None = None) -> None:
        self.gen, self.model, self.d, self.m, self.levels = gen, model, d, m, levels
        self.nbits = nbits
        self.type_code = {t: i for i, t in enumerate(type_names)}
        self.type_names = list(type_names)
        self.codebooks = codebooks              # (m, 2^nbits, d) or None (cold start)
        self.prototypes = list(prototypes) if prototypes is not None else None  # per level (K_l, d)
        self.rows: dict[str, int] = {}
        self.ids: list[str] = []
        self.n = 0
        cap = 1024
        self.emb = np.zeros((cap, d), np.float32)
        self.tokens = np.full((cap, m), -1, np.int64)
        self.assign = np.full((cap, levels), -1, np.int32)
        self.types = np.zeros(cap, np.int16)
        self.seq = np.zeros(cap, np.int64)
        self._base: dict[int, np.ndarray] = {}
        self._extra: dict[int, list[int]] = {}
        # IVF layout of the first codebook, rebuilt by compact(): per cell its rows, their
        # token rows as int16/int32 (a token is its own index into the flattened lookup table) and
        # whether each row still sits there; `_cell_pos[row]` is the row's place in its cell
        self._cell_rows: dict[int, np.ndarray] = {}
        self._cell_tok: dict[int, np.ndarray] = {}
        self._cell_valid: dict[int, np.ndarray] = {}
        self._cell_pos = np.full(cap, -1, np.int64)
        self._extra_n = 0
        self.lock = threading.RLock()

    def __len__(self) -> int:
        return self.n

    # -- writes (refresh thread) ----------------------------------------------------------
    def _grow(self, need: int) -> None:
        cap = len(self.emb)
        if need <= cap:
            return
        new = max(need, cap * 2)
        for name in ("emb", "tokens", "assign", "types", "seq", "_cell_pos"):
            a = getattr(self, name)
            b = np.full((new,) + a.shape[1:], -1 if name in ("tokens", "assign", "_cell_pos") else 0,
                        a.dtype)
            b[:cap] = a
            setattr(self, name, b)

    def upsert(self, node: str, emb: np.ndarray, tokens: Sequence[int], assign: Sequence[int],
               seq: int) -> None:
        with self.lock:
            row = self.rows.get(node)
            if row is None:
                row = self.n
                self._grow(row + 1)
                self.rows[node] = row
                self.ids.append(node)
                self.types[row] = self.type_code.get(node.partition(":")[0], -1)
                self.n += 1
                old = set()
            else:
                old = set(self.tokens[row].tolist())
                self._move_in_cell(row, tokens)
            self.emb[row] = emb
            self.tokens[row] = tokens
            self.assign[row] = assign
            self.seq[row] = seq
            for t in set(int(x) for x in tokens) - old:
                self._extra.setdefault(t, []).append(row)
                self._extra_n += 1
        if self._extra_n > max(50_000, self.n // 4):
            self.compact()

    def _move_in_cell(self, row: int, tokens: Sequence[int]) -> None:
        """Keep the row's entry in its first-codebook cell current (or mark it gone)."""
        pos = self._cell_pos[row]
        if pos < 0 or self.codebooks is None:
            return
        cell = int(self.tokens[row, 0])
        if int(tokens[0]) == cell:
            self._cell_tok[cell][pos] = tokens
        else:
            self._cell_valid[cell][pos] = False
            self._cell_pos[row] = -1

    def bulk_load(self, ids: Sequence[str], emb: np.ndarray, tokens: np.ndarray,
                  assign: np.ndarray, seq: np.ndarray | None = None) -> None:
        """Load many rows at once (startup from RocksDB, benchmarks), then compact."""
        with self.lock:
            start = self.n
            n = len(ids)
            self._grow(start + n)
            sl = slice(start, start + n)
            self.emb[sl] = emb
            self.tokens[sl] = tokens
            self.assign[sl] = assign
            self.seq[sl] = 0 if seq is None else seq
            self.types[sl] = [self.type_code.get(i.partition(":")[0], -1) for i in ids]
            for j, node in enumerate(ids):
                self.rows[node] = start + j
            self.ids.extend(ids)
            self.n += n
        self.compact()

    def compact(self) -> None:
        """Rebuild the per-token posting arrays from the token matrix (the truth)."""
        with self.lock:
            n, m = self.n, self.m
            flat = self.tokens[:n].ravel()
            rows = np.repeat(np.arange(n, dtype=np.int64), m)
            keep = flat >= 0
            flat, rows = flat[keep], rows[keep]
            order = np.argsort(flat, kind="stable")
            flat, rows = flat[order], rows[order]
            uniq, starts = np.unique(flat, return_index=True)
            bounds = list(starts[1:]) + [len(flat)]
            self._base = {int(t): rows[s:e] for t, s, e in zip(uniq, starts, bounds)}
            self._extra = {}
            self._extra_n = 0
            self._cell_rows, self._cell_tok, self._cell_valid = {}, {}, {}
            self._cell_pos[:] = -1
            if self.codebooks is not None:
                tok_dtype = np.int16 if self.m << self.nbits <= np.iinfo(np.int16).max else np.int32
                for t, r in self._base.items():
                    if t >> self.nbits == 0:            # first codebook: one cell per row
                        self._cell_rows[t] = r
                        self._cell_tok[t] = self.tokens[r].astype(tok_dtype)
                        self._cell_valid[t] = np.ones(len(r), bool)
                        self._cell_pos[r] = np.arange(len(r))

    # -- reads (query threads) ------------------------------------------------------------
    def row(self, node: str) -> int | None:
        return self.rows.get(node)

    def get(self, node: str) -> dict | None:
        with self.lock:
            r = self.rows.get(node)
            if r is None:
                return None
            return {"node": node, "embedding": self.emb[r].tolist(),
                    "tokens": self.tokens[r].tolist(), "assign": self.assign[r].tolist(),
                    "seq": int(self.seq[r]), "model": self.model, "generation": self.gen}

    def probe_tokens(self, query: np.ndarray, probes: int) -> list[int]:
        """Tokens of the `probes` first-codebook codes nearest the query (multi-probe)."""
        if self.codebooks is None or probes <= 0:
            return []
        scores = self.codebooks[0] @ query
        return [int(c) for c in np.argsort(-scores)[:probes]]

    def _token_rows(self, t: int) -> np.ndarray:
        base = self._base.get(t)
        extra = self._extra.get(t)
        parts = [p for p in (base, np.asarray(extra, np.int64) if extra else None) if p is not None]
        if not parts:
            return np.zeros(0, np.int64)
        rows = np.concatenate(parts) if len(parts) > 1 else parts[0]
        col = t >> self.nbits if self.codebooks is not None else None
        if col is not None and col < self.m:
            return rows[self.tokens[rows, col] == t]
        return rows[(self.tokens[rows] == t).any(1)]

    def search(self, query: np.ndarray, tokens: Iterable[int], k: int = 50,
               types: Iterable[str] | None = None, exclude: Iterable[str] = (),
               probes: int = 0, max_candidates: int = 2048) -> list[tuple[str, float]]:
        """Nodes sharing tokens with the query, best inner product first.

        Candidates beyond `max_candidates` (at least 4k) are cut by their quantized inner
        product through a per-query lookup table (asymmetric distance computation: the
        quantizer is additive, so <q, x> ~ sum_j <q, C_j[code_j]>), and only the survivors are
        scored exactly; without codebooks, by shared tokens.
        """
        q = np.asarray(query, np.float32)
        limit = max(max_candidates, 4 * k)
        with self.lock:
            toks = set(int(t) for t in tokens) | set(self.probe_tokens(q, probes))
            if self.codebooks is not None:
                rows, rank = self._candidates_ivf(q, toks)
            else:
                parts = [p for p in (self._token_rows(t) for t in toks) if len(p)]
                if not parts:
                    return []
                rows, shared = np.unique(np.concatenate(parts), return_counts=True)
                rank = shared.astype(np.float32)              # most shared tokens first
            if not len(rows):
                return []
            keep = np.ones(len(rows), bool)
            if types is not None:
                codes = [self.type_code[t] for t in types if t in self.type_code]
                keep &= np.isin(self.types[rows], codes)
            skip = [self.rows[x] for x in exclude if x in self.rows]
            if skip:
                keep &= ~np.isin(rows, skip)
            rows, rank = rows[keep], rank[keep]
            if len(rows) > limit:
                rows = rows[np.argpartition(-rank, limit - 1)[:limit]]
            scores = self.emb[rows] @ q
            kk = min(k, len(rows))
            if kk == 0:
                return []
            best = np.argpartition(-scores, kk - 1)[:kk]
            best = best[np.argsort(-scores[best], kind="stable")]
            return [(self.ids[rows[i]], float(scores[i])) for i in best]

    def _candidates_ivf(self, q: np.ndarray, toks: set[int]) -> tuple[np.ndarray, np.ndarray]:
        """Candidate rows and their quantized inner products. Rows of first-codebook cells are
        scored from the cell's contiguous token block; the postings of other tokens (and rows
        that joined a cell since the last compaction) by gathering their token rows."""
        lut = (self.codebooks @ q).ravel()                  # token value -> <q, codeword>
        cells = {t for t in toks if t >> self.nbits == 0}
        rows, rank, loose = [], [], []
        for t in toks:
            if t in cells:
                if t in self._cell_rows:
                    v = self._cell_valid[t]
                    rows.append(self._cell_rows[t][v])
                    rank.append(lut[self._cell_tok[t][v]].sum(1))
                extra = self._extra.get(t)
                if extra:
                    e = np.asarray(extra, np.int64)
                    loose.append(e[self.tokens[e, 0] == t])
            else:
                r = self._token_rows(t)
                if len(r):                                  # rows in a probed cell are there
                    loose.append(r[~np.isin(self.tokens[r, 0], list(cells))] if cells else r)
        if loose:
            lr = np.unique(np.concatenate(loose))
            rows.append(lr)
            rank.append(lut[self.tokens[lr]].sum(1))
        if not rows:
            return np.zeros(0, np.int64), np.zeros(0, np.float32)
        return np.concatenate(rows), np.concatenate(rank)

    def similar(self, node: str, k: int = 20, types: Iterable[str] | None = None,
                probes: int = 0) -> list[tuple[str, float]] | None:
        with self.lock:
            r = self.rows.get(node)
            if r is None:
                return None
            q, toks = self.emb[r].copy(), self.tokens[r].tolist()
        return self.search(q, toks, k, types, exclude=[node], probes=probes)

    def members(self, level: int, prim: int, k: int = 50,
                types: Iterable[str] | None = None) -> list[tuple[str, float]]:
        """Nodes assigned to a primitive, closest to its prototype first."""
        with self.lock:
            rows = np.flatnonzero(self.assign[:self.n, level] == prim)
            if types is not None:
                codes = [self.type_code[t] for t in types if t in self.type_code]
                rows = rows[np.isin(self.types[rows], codes)]
            if self.prototypes is not None:
                scores = self.emb[rows] @ self.prototypes[level][prim]
            else:
                scores = np.zeros(len(rows), np.float32)
            order = np.argsort(-scores, kind="stable")[:k]
            return [(self.ids[rows[i]], float(scores[i])) for i in order]
