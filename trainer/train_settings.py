"""The training settings a user sets: the `[train]` config section's training keys, which the
trainer's `TrainConfig` inherits beside its research knobs (learning rate, temperatures, loss
weights), and the run's split and inputs, which its `RunOptions` inherit. Torch-free, so the
config loader can own them without importing the model."""
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


@dataclass(frozen=True)
class RunSettings:
    train_share: float = 0.8            # share of events, in time order, to train on; then
                                        # 10% validation, the rest test
    fit_validation: bool = True         # fit the model on the training and validation windows
                                        # (all but the test window; as `hirflow evaluate` refits
                                        # each baseline); false: the training window only
    knowledge: bool = True              # entity texts as MiniLM world knowledge, as served

    def __post_init__(self) -> None:
        if not 0 < self.train_share < 1:
            raise ValueError(f"train_share must be in (0, 1), got {self.train_share}")
