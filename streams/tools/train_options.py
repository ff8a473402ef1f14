"""The [train], [encoder] and [quantizer] config sections -> the trainer's run options.

`[train.collaborative]` and `[quantizer]` are the trainer's and the encoder's own config
classes, handed over as they are; `[train]`'s training keys are the trainer's
`TrainSettings`, which `TrainConfig` extends with the research knobs (learning rate,
temperatures, loss weights) that keep their defaults here."""
from __future__ import annotations

import dataclasses

from hirflow.streams.config import HirflowConfig
from hirflow.trainer.runs import RunOptions, parse_duration
from hirflow.trainer.train import TrainConfig
from hirflow.trainer.train_settings import TrainSettings

# the [train] keys that are TrainConfig's too: the fields of their common TrainSettings
TRAIN_FIELDS = tuple(f.name for f in dataclasses.fields(TrainSettings))


def run_options(cfg: HirflowConfig, resume: bool = False, log_path: str | None = None) -> RunOptions:
    tc = cfg.train
    train = TrainConfig(**{k: getattr(tc, k) for k in TRAIN_FIELDS},
                        quantizer=cfg.quantizer, collaborative=tc.collaborative, log_path=log_path)
    return RunOptions(train_share=tc.train_share, fit_validation=tc.fit_validation,
                      window_s=parse_duration(tc.window) if tc.window else None,
                      encoder=dataclasses.asdict(cfg.encoder), knowledge=tc.knowledge,
                      resume=resume, train=train)
