"""Embeddings as serving computes them, for the trainer and the evaluator: the encoder's
from student views (`embed`), the collaborative block's from the nodes' adjacencies
(`block_rows`), both together (`served_embeddings`), and a graph store holding a window's
events to compute them from (`state_of`)."""
from __future__ import annotations

import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import torch

from hirflow.encoder.batching import pack
from hirflow.encoder.collaborative import CollaborativeBlock
from hirflow.encoder.model import EncoderConfig, HierarchicalEncoder
from hirflow.state.edge_columns import EdgeColumns
from hirflow.state.events import Engagement
from hirflow.state.graph import GraphConfig, GraphStore
from hirflow.state.schema import SchemaConfig
from hirflow.state.views import STUDENT, ViewSampler
from hirflow.state.writer import BOTH_SIDES, GraphWriter


@torch.no_grad()
def embed(model: HierarchicalEncoder, sampler: ViewSampler, nodes: list[str], cutoff: int,
          enc_cfg: EncoderConfig, texts, dev, batch: int = 512) -> np.ndarray:
    """(len(nodes), d_emb) embeddings from student views as of `cutoff` (inference)."""
    model.eval()
    out = []
    for i in range(0, len(nodes), batch):
        views = sampler.sample(nodes[i:i + batch], cutoff)
        b = pack(views, enc_cfg.pack, knowledge=texts).to(dev)
        emb, _ = model(b, model.backend(training=False, max_view=max(b.view_sizes)))
        out.append(emb.float().cpu().numpy())
    model.train()
    return np.concatenate(out) if out else np.zeros((0, enc_cfg.d_emb), np.float32)


def block_rows(block: CollaborativeBlock, sampler: ViewSampler, nodes: list[str], codes,
               cutoff: int | None = None, chunk: int = 8192) -> np.ndarray:
    """(len(nodes), rank) collaborative blocks of `nodes` from the records `sampler` reads
    (edges that existed at `cutoff`; None: all)."""
    out = [np.zeros((0, block.rank), np.float32)]
    for i in range(0, len(nodes), chunk):
        part = nodes[i:i + chunk]
        edges = EdgeColumns.from_states(part, sampler.records(part), codes)
        out.append(block.blocks(part, edges, cutoff))
    return np.concatenate(out)


def served_embeddings(model: HierarchicalEncoder, block: CollaborativeBlock | None,
                      sampler: ViewSampler, nodes: list[str], cutoff: int, texts, codes) -> np.ndarray:
    """What a worker serves for `nodes` as of `cutoff`: the encoder's embedding followed by
    the collaborative block (edges that existed at `cutoff`), when the checkpoint has one."""
    emb = embed(model, sampler, nodes, cutoff, model.cfg, texts, model.device)
    if block is None:
        return emb
    return np.concatenate([emb, block_rows(block, sampler, nodes, codes, cutoff)], axis=1)


@contextmanager
def state_of(events: Sequence[Engagement], schema: SchemaConfig, seed: int = 0) -> Iterator[ViewSampler]:
    """A student-view sampler over a temporary graph store with `events` applied."""
    with tempfile.TemporaryDirectory(prefix="hirflow-state-") as tmp:
        store = GraphStore(Path(tmp) / "s", schema, 1)
        try:
            w = GraphWriter(store, GraphConfig(path=str(Path(tmp) / "s")))
            for i in range(0, len(events), 20_000):
                w.apply_batch([(e, BOTH_SIDES) for e in events[i:i + 20_000]])
                w.commit()
            yield ViewSampler(store.reader, schema, STUDENT, seed=seed)
        finally:
            store.close()
