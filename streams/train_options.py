"""The [train], [encoder] and [quantizer] config sections -> the trainer's run options.

`[train.collaborative]` and `[quantizer]` are the trainer's and the encoder's own config
classes, handed over as they are. The rest of `[train]` holds what a user or the chart's
CronJob sets; the trainer's `TrainConfig` also holds the research knobs (learning rate,
temperatures, loss weights) that keep their defaults here."""
from __future__ import annotations

import dataclasses

from hirflow.streams.config import HirflowConfig
from hirflow.trainer.runs import RunOptions, parse_duration
from hirflow.trainer.train import TrainConfig

# the [train] keys that are TrainConfig fields of the same name
TRAIN_FIELDS = ("seed", "steps_per_chunk", "objective", "passes", "min_steps", "centre_types",
                "sample_workers")


def run_options(cfg: HirflowConfig, resume: bool = False, log_path: str | None = None) -> RunOptions:
    tc = cfg.train
    train = TrainConfig(**{k: getattr(tc, k) for k in TRAIN_FIELDS},
                        quantizer=cfg.quantizer, collaborative=tc.collaborative, log_path=log_path)
    return RunOptions(train_share=tc.train_share, fit_validation=tc.fit_validation,
                      window_s=parse_duration(tc.window) if tc.window else None,
                      encoder=dataclasses.asdict(cfg.encoder), knowledge=tc.knowledge,
                      resume=resume, train=train)
