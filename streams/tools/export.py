"""`hirflow export`: embeddings, tokens and assignments of the serving generation to a file.

Formats: JSON lines (one node per line), npz (numpy arrays ids/emb/tokens/assign/seq, what
`np.load` reads) or parquet (needs pyarrow, which hirflow does not install by default).
Reads the RocksDB store directly, so run it with the worker stopped or on a copy.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

import numpy as np

from hirflow.state.index import TokenIndex
from hirflow.state.schema import node_type


def select(index: TokenIndex, nodes: Iterable[str] = (), types: Iterable[str] = ()):
    gen, model, _ = index.active()
    nodes, types = list(nodes), set(types)
    recs = (r for r in index.records(gen, nodes) if r is not None) if nodes else index.iter_records(gen)
    return model, [r for r in recs if not types or node_type(r.node) in types]


def write(path: Path, fmt: str, model: str | None, recs) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "jsonl":
        with path.open("w") as f:
            for r in recs:
                f.write(json.dumps({"node": r.node, "model": r.model, "seq": r.seq,
                                    "embedding": [round(float(x), 7) for x in r.emb],
                                    "tokens": list(r.tokens), "assign": list(r.assign)}) + "\n")
    elif fmt == "npz":
        d = recs[0].emb.shape[0] if recs else 0
        np.savez(path, ids=np.array([r.node for r in recs], dtype=object).astype(str),
                 emb=np.stack([r.emb for r in recs]) if recs else np.zeros((0, d), np.float32),
                 tokens=np.array([r.tokens for r in recs], np.int64),
                 assign=np.array([r.assign for r in recs], np.int32),
                 seq=np.array([r.seq for r in recs], np.int64), model=np.array(model or ""))
    elif fmt == "parquet":
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ImportError:
            raise RuntimeError("parquet export needs pyarrow: pip install pyarrow") from None
        pq.write_table(pa.table({"node": [r.node for r in recs], "model": [r.model for r in recs],
                                 "seq": [r.seq for r in recs],
                                 "embedding": [r.emb.tolist() for r in recs],
                                 "tokens": [list(r.tokens) for r in recs],
                                 "assign": [list(r.assign) for r in recs]}), path)
    else:
        raise ValueError(f"unknown export format {fmt!r}")
    return len(recs)
