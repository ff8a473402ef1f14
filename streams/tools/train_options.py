"""The [train], [encoder] and [quantizer] config sections -> the trainer's run options.

`[train.collaborative]` and `[quantizer]` are the trainer's and the encoder's own config
classes, handed over as they are; `[train]`'s training keys are the trainer's
`TrainSettings`, which `TrainConfig` extends with the research knobs (learning rate,
temperatures, loss weights) that keep their defaults here, and its `RunSettings`, which
`RunOptions` extends."""
from __future__ import annotations

import dataclasses

from hirflow.streams.config import HirflowConfig
from hirflow.trainer.runs import RunOptions, parse_duration
from hirflow.trainer.train import TrainConfig
from hirflow.trainer.train_settings import RunSettings, TrainSettings

# the [train] keys that are TrainConfig's too (their common TrainSettings), and RunOptions'
TRAIN_FIELDS = tuple(f.name for f in dataclasses.fields(TrainSettings))
RUN_FIELDS = tuple(f.name for f in dataclasses.fields(RunSettings))


def run_options(cfg: HirflowConfig, resume: bool = False, log_path: str | None = None) -> RunOptions:
    tc = cfg.train
    train = TrainConfig(**{k: getattr(tc, k) for k in TRAIN_FIELDS},
                        quantizer=cfg.quantizer, collaborative=tc.collaborative, log_path=log_path)
    return RunOptions(**{k: getattr(tc, k) for k in RUN_FIELDS},
                      window_s=parse_duration(tc.window) if tc.window else None,
                      encoder=dataclasses.asdict(cfg.encoder), resume=resume, train=train)
