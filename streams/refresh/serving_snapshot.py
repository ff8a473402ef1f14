"""What the query API reads: the serving generation, its model and its in-memory index, as
one immutable value. The refresh loop replaces it whole when a hot swap switches, so a
reader that took one snapshot never mixes the old model with the new index."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from hirflow.encoder.serving import ServingModel
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
