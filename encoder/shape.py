"""The shape of a new model: the `[encoder]` config section, which the encoder's `EncoderConfig`
inherits beside what the schema decides (type and action counts, the query side) and the
packing settings. Torch-free, so the config loader can own it without importing the model.
A run that continues a checkpoint keeps its parent's shape."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EncoderShape:
    """The shape of a new model; a run that continues a checkpoint keeps its parent's."""
    levels: tuple[int, ...] = (16, 128, 1024)   # prototypes per level, coarse to fine
    d_model: int = 64                   # transformer width (CPU serving: thousands of nodes/s)
    n_heads: int = 4                    # attention heads (d_model must divide by it)
    n_layers: int = 2                   # transformer layers
    d_ff: int = 128                     # feed-forward width
    d_emb: int = 64                     # output embedding and prototype dimension

    def __post_init__(self) -> None:
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model {self.d_model} must be divisible by n_heads {self.n_heads}")
        if not self.levels or list(self.levels) != sorted(self.levels) or min(self.levels) < 1:
            raise ValueError(f"levels must be increasing (coarse to fine) and positive, got {self.levels}")
