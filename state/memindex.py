"""The in-memory mirror of one index generation, which queries are answered from.

RocksDB holds the durable postings (`state.index`), but a prefix scan runs at ~3 million
postings/s and point reads of embeddings at ~150k/s here, too slow for a query budget of a
few ms over a million nodes. The mirror keeps the embedding matrix, the token matrix and
per-token posting arrays in numpy. Postings are append-only between compactions: a node
that leaves a token is filtered out at query time by checking the token matrix (the truth),
so an update costs one row write and a few list appends.

Retrieval (docs/architecture.md): union of the postings of the query's tokens (optionally more
probes of the first codebook), filtered by node type, re-ranked by exact inner product. The
first codebook doubles as an IVF layout: compaction orders the rows by their first token, so a
probed cell is one contiguous block of the embedding matrix, scored exactly by one
matrix-vector product (at a million 64-d rows, 48 probes score ~190k rows in ~3 ms here).
Postings outside the probed cells are gathered and scored exactly too.
"""
from __future__ import annotations

import threading
from typing import Iterable, Sequence

import numpy as np

from hirflow.state.memindex_parts import (CellLayout, TokenPostings, drop_removed_rows, grow_rows,
                                         ivf_candidates, order_rows_by_first_token,
                                         towards_prototypes)
from hirflow.state.schema import UNKNOWN_TYPE, node_type, type_code_map


class MemoryIndex:
    def __init__(self, gen: int, model: str | None, d: int, m: int, levels: int,
                 type_names: Sequence[str], nbits: int = 8, codebooks: np.ndarray | None = None,
                 prototypes: Sequence[np.ndarray] | None = None,
                 centres: np.ndarray | None = None) -> None:
        self.gen, self.model, self.d, self.m, self.levels = gen, model, d, m, levels
        self.nbits = nbits
        self.type_code = type_code_map(tuple(type_names))
        self.type_names = list(type_names)
        self.codebooks = codebooks              # (m, 2^nbits, d) or None (cold start)
        self.prototypes = list(prototypes) if prototypes is not None else None  # per level (K_l, d)
        self.centres = centres                  # (n_types, d) type means, removed before prototypes
        self.rows: dict[str, int] = {}
        self.ids: list[str] = []                # row -> node (removed rows too, until compaction)
        self.removed = 0                        # rows of removed nodes, dropped at compaction
        self.n = 0
        cap = 1024
        self.emb = np.zeros((cap, d), np.float32)
        self.tokens = np.full((cap, m), -1, np.int64)
        self.assign = np.full((cap, levels), -1, np.int32)
        self.types = np.zeros(cap, np.int16)
        self.seq = np.zeros(cap, np.int64)
        self.postings = TokenPostings()
        self.cells = CellLayout(cap, nbits)     # rebuilt by compact()
        self.lock = threading.RLock()

    def __len__(self) -> int:
        return self.n - self.removed

    def live_ids(self) -> list[str]:
        """The indexed nodes (`ids` also holds the rows of removed nodes until compaction)."""
        with self.lock:
            if not self.removed:
                return list(self.ids)
            return [node for j, node in enumerate(self.ids) if self.rows.get(node) == j]

    # -- writes (refresh thread) ----------------------------------------------------------
    def upsert(self, node: str, emb: np.ndarray, tokens: Sequence[int], assign: Sequence[int],
               seq: int) -> None:
        with self.lock:
            row = self.rows.get(node)
            if row is None:
                row = self.n
                grow_rows(self, row + 1)
                self.rows[node] = row
                self.ids.append(node)
                self.types[row] = self.type_code.get(node_type(node), UNKNOWN_TYPE)
                self.n += 1
                old = set()
            else:
                old = set(self.tokens[row].tolist())
                self.cells.first_token_set(row, int(tokens[0]))   # still in its cell's block?
            self.emb[row] = emb
            self.tokens[row] = tokens
            self.assign[row] = assign
            self.seq[row] = seq
            self.postings.add(row, set(int(x) for x in tokens) - old)
        if self.postings.pending > max(50_000, self.n // 4):
            self.compact()

    def remove(self, node: str) -> None:
        """Take a node out of the index (it expired): its row answers nothing from now on
        (no tokens, no primitive, no type, outside every cell) and goes at the next
        compaction."""
        with self.lock:
            row = self.rows.pop(node, None)
            if row is None:
                return
            self.tokens[row] = -1
            self.assign[row] = -1
            self.types[row] = UNKNOWN_TYPE
            self.emb[row] = 0.0
            self.cells.in_cell[row] = False
            self.removed += 1
        if self.removed > max(10_000, self.n // 4):
            self.compact()

    def compact(self) -> None:
        """Drop the rows of removed nodes and rebuild the per-token posting arrays from the
        token matrix (the truth); with codebooks, first reorder the rows by first token (the
        IVF layout). Row numbers change here, so they are only valid under the lock or until
        the next upsert."""
        with self.lock:
            if self.removed:
                drop_removed_rows(self)
            if self.codebooks is not None and self.n:
                order_rows_by_first_token(self)
                self.cells.lay_out(self.tokens[:self.n, 0])
            self.postings.rebuild(self.tokens[:self.n])

    def set_seq(self, node: str, seq: int) -> None:
        """A new published seq for an indexed node whose record is otherwise unchanged."""
        with self.lock:
            self.seq[self.rows[node]] = seq

    # -- reads (query threads) ------------------------------------------------------------
    def row(self, node: str) -> int | None:
        """The node's row: valid until the next compaction (which reorders rows), so other
        threads read a node through `get` / `similar`, which hold the lock."""
        return self.rows.get(node)

    def get(self, node: str) -> dict | None:
        with self.lock:
            r = self.rows.get(node)
            if r is None:
                return None
            return {"node": node, "embedding": self.emb[r].tolist(),
                    "tokens": self.tokens[r].tolist(), "assign": self.assign[r].tolist(),
                    "seq": int(self.seq[r]), "model": self.model, "generation": self.gen}

    def prototype_cosine(self, node: str, level: int, prim: int) -> float | None:
        """Cosine of a node to a primitive's prototype, in the space the assignments use."""
        with self.lock:
            r = self.rows.get(node)
            if r is None or self.prototypes is None:
                return None
            return float(towards_prototypes(self, np.array([r]))[0] @ self.prototypes[level][prim])

    def assignments(self, nodes: Sequence[str]) -> np.ndarray:
        """(len(nodes), levels) assignment per level of each node, in one gather; rows of
        nodes not indexed are NO_PRIMITIVE (-1)."""
        with self.lock:
            rows = np.fromiter((self.rows.get(n, -1) for n in nodes), np.int64, len(nodes))
            out = self.assign[rows]
        out[rows < 0] = -1
        return out

    def probe_tokens(self, query: np.ndarray, probes: int) -> list[int]:
        """Tokens of the `probes` first-codebook codes nearest the query (multi-probe)."""
        if self.codebooks is None or probes <= 0:
            return []
        scores = self.codebooks[0] @ query
        return [int(c) for c in np.argsort(-scores)[:probes]]

    def token_rows(self, t: int) -> np.ndarray:
        """Rows holding token `t` now (under the lock)."""
        col = t >> self.nbits if self.codebooks is not None else None
        return self.postings.rows(t, self.tokens, col if col is not None and col < self.m else None)

    def search(self, query: np.ndarray, tokens: Iterable[int], k: int = 50,
               types: Iterable[str] | None = None, exclude: Iterable[str] = (),
               probes: int = 0, max_candidates: int = 2048) -> list[tuple[str, float]]:
        """Nodes sharing tokens with the query, best inner product first.

        With codebooks every candidate is scored exactly: the probed first-codebook cells
        block by block, the other postings by gathering their rows. Without codebooks (cold
        start) candidates beyond `max_candidates` (at least m * k) are cut by shared tokens
        before their exact scores.
        """
        q = np.asarray(query, np.float32)
        limit = max(max_candidates, self.m * k)
        with self.lock:
            toks = set(int(t) for t in tokens) | set(self.probe_tokens(q, probes))
            if self.codebooks is not None:
                rows, scores = ivf_candidates(self, q, toks, limit)
            else:
                parts = [p for p in (self.token_rows(t) for t in toks) if len(p)]
                if not parts:
                    return []
                rows, shared = np.unique(np.concatenate(parts), return_counts=True)
                if len(rows) > limit:                       # most shared tokens first
                    rows = rows[np.argpartition(-shared, limit - 1)[:limit]]
                scores = self.emb[rows] @ q
            keep = np.ones(len(rows), bool)
            if types is not None:
                wanted = np.zeros(len(self.type_names) + 1, bool)    # type code -1: unknown
                wanted[[self.type_code[t] for t in types if t in self.type_code]] = True
                keep &= wanted[self.types[rows]]
            skip = [self.rows[x] for x in exclude if x in self.rows]
            if skip:
                keep &= ~np.isin(rows, skip)
            rows, scores = rows[keep], scores[keep]
            kk = min(k, len(rows))
            if kk == 0:
                return []
            best = np.argpartition(-scores, kk - 1)[:kk]
            best = best[np.argsort(-scores[best], kind="stable")]
            return [(self.ids[rows[i]], float(scores[i])) for i in best]

    def members(self, level: int, prim: int, k: int = 50,
                types: Iterable[str] | None = None) -> list[tuple[str, float]]:
        """Nodes assigned to a primitive, closest to its prototype first."""
        with self.lock:
            rows = np.flatnonzero(self.assign[:self.n, level] == prim)
            if types is not None:
                codes = [self.type_code[t] for t in types if t in self.type_code]
                rows = rows[np.isin(self.types[rows], codes)]
            if self.prototypes is not None:
                scores = towards_prototypes(self, rows) @ self.prototypes[level][prim]
            else:
                scores = np.zeros(len(rows), np.float32)
            order = np.argsort(-scores, kind="stable")[:k]
            return [(self.ids[rows[i]], float(scores[i])) for i in order]
