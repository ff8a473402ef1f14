"""The Bag-of-Meaning quantizer's settings: the `[quantizer]` config section and the part of a
checkpoint's manifest that every worker must share to make the same tokens. Torch-free, so
the config loader can own it without importing the model."""
from __future__ import annotations

from dataclasses import dataclass

# the encoding beam of checkpoints whose manifest predates `beam`: their tokens stay the same
LEGACY_BEAM = 4


@dataclass(frozen=True)
class QuantizerConfig:
    """Bag-of-Meaning tokens of a new model."""
    m: int = 8                          # tokens per node (codebooks)
    nbits: int = 8                      # bits per token: 2^nbits codes per codebook
    train_size: int = 65_536            # embeddings sampled to fit the codebooks
    seed: int = 0                       # seed of that sample
    beam: int = 1                       # encoding beam (1: greedy); beam 4 costs 4.3x the
                                        # time for the same BoM recall

    def __post_init__(self) -> None:
        if not 1 <= self.m <= 64 or not 1 <= self.nbits <= 16 or not 1 <= self.beam <= 64 \
                or self.train_size < 1:
            raise ValueError(f"quantizer.m must be in 1..64, nbits in 1..16, beam in 1..64 and "
                             f"train_size >= 1, got {self.m}, {self.nbits}, {self.beam}, "
                             f"{self.train_size}")

    @classmethod
    def of_manifest(cls, doc: dict) -> "QuantizerConfig":
        """The config a checkpoint's manifest records; one written before `beam` existed
        encodes with the beam its tokens were made with."""
        return cls(**{"beam": LEGACY_BEAM, **doc})
