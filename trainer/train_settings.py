"""The training settings a user sets: the `[train]` config section's training keys, which the
trainer's `TrainConfig` inherits beside its research knobs (learning rate, temperatures, loss
weights). Torch-free, so the config loader can own it without importing the model."""
from __future__ import annotations

from dataclasses import dataclass

OBJECTIVES = ("softmax", "bce")


@dataclass(frozen=True)
class TrainSettings:
    seed: int = 0                       # same data, config and seed give the same checkpoint
    steps_per_chunk: int | None = None  # most optimiser steps per pass over a 24 h chunk
                                        # (unset: as many as its events fill)
    objective: str = "softmax"          # softmax: in-batch sampled softmax over each batch's
                                        # items (retrieval); bce: DistMult vs sampled negatives
    passes: int = 1                     # shuffled passes over each chunk's events
    min_steps: int = 1000               # more passes for a small data set, to at least this
                                        # many steps (not when steps_per_chunk caps the run)
    centre_types: bool = True           # fit primitives to embeddings less their type's mean
    sample_workers: int = 1             # threads sampling views ahead of the model (0: inline)

    def __post_init__(self) -> None:
        checks = (("objective", self.objective in OBJECTIVES, f"one of {OBJECTIVES}"),
                  ("steps_per_chunk", self.steps_per_chunk is None or self.steps_per_chunk >= 1,
                   ">= 1 or unset"),
                  ("passes", self.passes >= 1, ">= 1"),
                  ("min_steps", self.min_steps >= 0, ">= 0"),
                  ("sample_workers", self.sample_workers >= 0, ">= 0"))
        for name, ok, rule in checks:
            if not ok:
                raise ValueError(f"{name} must be {rule}, got {getattr(self, name)!r}")
