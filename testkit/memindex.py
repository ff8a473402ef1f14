"""Many rows into a `MemoryIndex` at once, for tests and benchmarks that fill an index of a
given size without a refresh loop (a worker fills it node by node with `upsert`)."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from hirflow.state.memindex import MemoryIndex
from hirflow.state.memindex_parts import grow_rows
from hirflow.state.schema import UNKNOWN_TYPE, node_type


def bulk_load(ix: MemoryIndex, ids: Sequence[str], emb: np.ndarray, tokens: np.ndarray,
              assign: np.ndarray, seq: np.ndarray | None = None) -> None:
    """Append rows for `ids` (new nodes) with their vectors, then compact."""
    with ix.lock:
        start, n = ix.n, len(ids)
        grow_rows(ix, start + n)
        sl = slice(start, start + n)
        ix.emb[sl] = emb
        ix.tokens[sl] = tokens
        ix.assign[sl] = assign
        ix.seq[sl] = 0 if seq is None else seq
        ix.types[sl] = [ix.type_code.get(node_type(i), UNKNOWN_TYPE) for i in ids]
        for j, node in enumerate(ids):
            ix.rows[node] = start + j
        ix.ids.extend(ids)
        ix.n += n
    ix.compact()
