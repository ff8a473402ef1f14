"""The [train], [encoder] and [quantizer] config sections -> the trainer's run options.

The sections hold what a user or the chart's CronJob sets; the trainer's own dataclasses
(`RunOptions`, `TrainConfig`, `EncoderConfig`, `QuantizerConfig`) also hold the research
knobs (learning rate, temperatures, loss weights) that keep their defaults here. Defaults
of the fields both sides have are the same (a test holds them equal)."""
from __future__ import annotations

import dataclasses

from hirflow.trainer.block_config import CollaborativeConfig
from hirflow.encoder.quantize import QuantizerConfig
from hirflow.streams.config import HirflowConfig
from hirflow.trainer.runs import RunOptions, parse_duration
from hirflow.trainer.train import TrainConfig

# [train] key -> TrainConfig field
TRAIN_FIELDS = {"seed": "seed", "steps_per_chunk": "max_steps_per_chunk", "objective": "objective",
                "passes": "passes", "min_steps": "min_steps", "centre_types": "centre_types",
                "sample_workers": "sample_workers"}


def run_options(cfg: HirflowConfig, resume: bool = False, log_path: str | None = None) -> RunOptions:
    tc = cfg.train
    train = TrainConfig(**{f: getattr(tc, k) for k, f in TRAIN_FIELDS.items()},
                        quantizer=QuantizerConfig(**dataclasses.asdict(cfg.quantizer)),
                        collaborative=CollaborativeConfig(rank=tc.collaborative_rank,
                                                          weight=tc.collaborative_weight,
                                                          weight_windows=tc.collaborative_weight_windows,
                                                          recency_days=tc.collaborative_recency_days,
                                                          fit_days=tc.collaborative_fit_days,
                                                          next_periods=tc.collaborative_next_periods,
                                                          next_weight=tc.collaborative_next_weight),
                        log_path=log_path)
    return RunOptions(train_share=tc.train_share, fit_validation=tc.fit_validation,
                      window_s=parse_duration(tc.window) if tc.window else None,
                      encoder=dataclasses.asdict(cfg.encoder), knowledge=tc.knowledge,
                      resume=resume, train=train)
