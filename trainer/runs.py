"""Training runs: once, or periodically (`hirflow train --every 1h`).

A round takes the data up to its cutoff (now, for periodic runs), splits it into
chronological windows, trains on everything before the test window (the training and
validation windows; with `fit_validation` off, the training window only) and announces the
checkpoint once its files are complete. A periodic round starts from the previous round's
weights and names that checkpoint as its parent, so the manifests form a chain. Reading the
data is passed in (`load(cutoff) -> (engagements, entities)`), so any source that `hirflow
replay` reads or the Kafka topics work the same, and this package does not depend on the
readers.
"""
from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterator, Sequence

from hirflow.encoder import checkpoint as ckpt
from hirflow.encoder.model import EncoderConfig
from hirflow.state.events import Engagement, Entity
from hirflow.state.schema import SchemaConfig
from hirflow.trainer.announcement import Announcement
from hirflow.trainer.data import Windows, chronological_windows, world_knowledge
from hirflow.trainer.train import TrainConfig, train
from hirflow.trainer.train_settings import RunSettings

log = logging.getLogger(__name__)

Loader = Callable[[int], tuple[Sequence[Engagement], Sequence[Entity]]]
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> float:
    """'90s', '30m', '1h', '7d' or plain seconds -> seconds."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text or "")
    if not m or float(m.group(1)) <= 0:
        raise ValueError(f"not a duration: {text!r} (use e.g. 90s, 30m, 1h, 7d)")
    return float(m.group(1)) * _UNITS[m.group(2) or "s"]


@dataclass(frozen=True)
class RunOptions(RunSettings):
    window_s: float | None = None       # only this much data before the cutoff (None: all)
    encoder: dict = field(default_factory=dict)   # EncoderConfig fields of a new model
                                                  # (levels, widths); a parent's shape wins
    resume: bool = False                # continue an interrupted run in the output directory
    train: TrainConfig = TrainConfig()


@dataclass(frozen=True)
class RoundResult:
    checkpoint: Path
    id: str
    parent: str | None
    windows: Windows
    events: int
    announced: Announcement | None


def run_once(load: Loader, cutoff: int, schema: SchemaConfig, opts: RunOptions, out: Path,
             parent: ckpt.Checkpoint | None = None, text_encode=None,
             announce: Callable[[Path], Announcement] | None = None, progress: bool = True) -> RoundResult:
    """One round: data up to `cutoff` -> windows -> train (from `parent`'s weights) -> announce."""
    engagements, entities = load(cutoff)
    lo = cutoff - int(opts.window_s * 1000) if opts.window_s else None
    evs = [e for e in engagements if e.ts <= cutoff and (lo is None or e.ts >= lo)]
    if not evs:
        raise ValueError(f"no engagement events up to the cutoff {cutoff}")
    windows = chronological_windows([e.ts for e in evs], train=opts.train_share,
                                    val=min(0.1, (1 - opts.train_share) / 2))
    fit_end = windows.val_end if opts.fit_validation else windows.train_end
    train_evs = [e for e in evs if e.ts < fit_end]
    texts = None
    if opts.knowledge and text_encode is not None:
        # texts known by the end of the fitted windows: what serving would have had then
        texts = world_knowledge(entities, fit_end - 1, text_encode) or None
    if parent is not None:
        enc_cfg = EncoderConfig.from_dict(parent.manifest["config"])
    else:
        enc_cfg = EncoderConfig.for_schema(schema, **opts.encoder)
    log.info("training on %d of %d events (window %d..%d), %d texts", len(train_evs), len(evs),
             windows.start, fit_end, len(texts or {}))
    out.mkdir(parents=True, exist_ok=True)
    path = train(train_evs, schema, enc_cfg, opts.train, out, parent=parent.id if parent else None,
                 texts=texts, init=parent, resume=opts.resume, progress=progress)
    ck = ckpt.load(path)
    announced = announce(path) if announce else None
    return RoundResult(path, ck.id, ck.manifest.get("parent"), windows, len(train_evs), announced)


def run_every(period_s: float, load: Loader, schema: SchemaConfig, opts: RunOptions, out: Path,
              parent: ckpt.Checkpoint | None = None, text_encode=None,
              announce: Callable[[Path], Announcement] | None = None, rounds: int | None = None,
              clock: Callable[[], float] = time.time, sleep: Callable[[float], None] = time.sleep,
              progress: bool = True) -> Iterator[RoundResult]:
    """A round every `period_s` (cutoff = the round's start), each continuing the previous
    checkpoint; a failed round is logged and the next one starts from the last good
    checkpoint. Stops after `rounds` rounds when given."""
    done = 0
    while rounds is None or done < rounds:
        started = clock()
        try:
            res = run_once(load, int(started * 1000), schema, opts, out, parent, text_encode,
                           announce, progress)
            parent = ckpt.load(res.checkpoint)
            yield res
            opts = replace(opts, resume=False)         # only the first round may continue one
        except (ValueError, RuntimeError) as exc:      # no data yet, a non-finite loss, ...
            log.error("training round at %d failed: %s; keeping %s", int(started * 1000), exc,
                      parent.id if parent else "no checkpoint")
        done += 1
        if rounds is not None and done >= rounds:
            return
        sleep(max(0.0, started + period_s - clock()))

