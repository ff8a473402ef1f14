"""What the query API reads: the serving generation, its model and its in-memory index, as
one immutable value. The refresh loop replaces it whole when a hot swap switches, so a
reader that took one snapshot never mixes the old model with the new index."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from hirflow.encoder.serving import ServingModel
from hirflow.state.index import ACTIVE_KEY, TokenIndex
from hirflow.state.memindex import MemoryIndex


@dataclass(frozen=True)
class ServingSnapshot:
    gen: int
    model: ServingModel
    memory: MemoryIndex


def empty_memory(gen: int, model: ServingModel, types: Sequence[str]) -> MemoryIndex:
    """An empty in-memory index shaped for `model` (dims, levels, codebooks, prototypes)."""
    return MemoryIndex(gen, model.id, model.d, model.m, model.levels, list(types),
                       nbits=model.nbits, codebooks=model.codebooks,
                       prototypes=model.prototypes(), centres=model.type_centres())


def open_serving(index: TokenIndex, types: Sequence[str], load: Callable[[str], ServingModel | None],
                 checkpoint: str = "") -> ServingSnapshot:
    """The snapshot a worker starts with: the active generation's model (`load`ed; on a
    first start the configured `checkpoint`, made the active one; the cold-start model when
    neither loads) and its records from RocksDB in memory."""
    gen, _, path = index.active()
    model = None
    if path:
        model = load(path)
    elif checkpoint:
        model = load(checkpoint)
        if model is not None:
            b = index.batch()
            b.set_meta(ACTIVE_KEY, [gen, model.id, model.path])
            b.commit()
    model = model or ServingModel.cold_start(types)
    memory = empty_memory(gen, model, types)
    for rec in index.iter_records(gen):
        memory.upsert(rec.node, rec.emb, rec.tokens, rec.assign, rec.seq)
    memory.compact()
    return ServingSnapshot(gen, model, memory)
