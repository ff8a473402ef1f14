"""The training loop: time-ordered retrieval training with self-distillation beside it.

Events are replayed chunk by chunk into a fresh graph store built with the serving `state`
code; the engagements of chunk k are the positives of the steps on chunk k, and every view of
those steps is sampled as of the chunk's start, from the state of chunks < k only, so no step
ever sees its own future. Batches are shuffled only inside a chunk. The retrieval objective is
an in-batch sampled softmax over each batch's destinations with the logQ correction (or, with
`objective="bce"`, DistMult engagement prediction against sampled negatives). The teacher is
an EMA of the student (momentum schedule computed up front), its broad views give
Sinkhorn-balanced targets for the student's narrow views at every level, at a low weight
since they compete with retrieval. A non-finite loss stops the run.
After training, the primitive tree is refitted to the final embeddings (top-down k-means,
`encoder.hierarchy`) and the BoM quantizer fitted on them; everything goes into one
checkpoint. Same data, config and seed -> the same checkpoint bytes.
"""
from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import logging
import math
import random
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from hirflow.encoder import checkpoint as ckpt
from hirflow.encoder import collaborative
from hirflow.encoder.hierarchy import fit_tree
from hirflow.encoder.model import EncoderConfig, HierarchicalEncoder
from hirflow.encoder.quantize import BoMQuantizer
from hirflow.encoder.quantizer_config import QuantizerConfig
from hirflow.state.events import Engagement
from hirflow.state.schema import SchemaConfig
from hirflow.state.views import STUDENT, TEACHER, ViewConfig
from hirflow.trainer import losses as L
from hirflow.trainer.block_config import CollaborativeConfig
from hirflow.trainer.collapse import CollapseWatch, health
from hirflow.trainer import resume as resume_mod
from hirflow.trainer.collaborative_fit import CollaborativeFit
from hirflow.trainer.embedding import block_rows, embed
from hirflow.trainer.pipeline import BatchPipeline, ChunkDone, Prepared, chunk_plan
from hirflow.trainer.schedules import cosine, teacher_momentum
from hirflow.trainer.train_settings import TrainSettings

log = logging.getLogger(__name__)
HOLDOUT_KEY = "collaborative_holdout"    # the block's holdout windows and choice, in resume snapshots
CHUNKS_KEY = "collapse_chunks"           # the collapse watch's rows so far, in resume snapshots


class NonFiniteLoss(RuntimeError):
    pass


@dataclass(frozen=True)
class TrainConfig(TrainSettings):
    """`TrainSettings` (seed, steps per chunk, objective, passes, min steps, type centring,
    sampling threads: what `[train]` sets) and the research knobs, which keep their defaults
    in a configured run."""
    chunk_hours: float = 24.0        # time chunk: shuffles never cross one
    batch_edges: int = 256           # engagements per step
    softmax_temperature: float = 0.05
    logq: bool = True                # correct the sampled softmax for how often items are sampled
    sampled_negatives: int = 64      # "softmax": items drawn per step uniformly from every item
                                     # seen so far, beside the batch's destinations, so that a
                                     # step whose positives share one source still has negatives
    collapse_cosine: float = 0.9     # item directions whose mean pairwise cosine exceeds this
                                     # are collapsed: logged per chunk, and a checkpoint whose
                                     # final encoder is collapsed never serves its encoder part
    teacher_anchors: int | None = 32    # anchors per step that get a broad (teacher) view
    lr: float = 2e-3
    # the cosine schedule's last learning rate, as a share of lr: training runs in time order,
    # so the last weeks, the closest to what is served next, are learned at the schedule's tail
    lr_end: float = 0.3
    weight_decay: float = 0.01
    warmup_steps: int = 5
    momentum: float = 0.996          # teacher EMA momentum at the start (rises to 1)
    sinkhorn_epsilon: float = 0.05
    sinkhorn_iters: int = 3
    # distillation shapes the primitives but competes with retrieval, so it is kept light;
    # primitives are refitted to the final embeddings anyway (refit_prototypes)
    w_distill: float = 0.1
    w_engage: float = 1.0
    w_hierarchy: float = 0.01
    # the uniformity of the step's item directions (`losses.uniformity_loss`): keeps items
    # apart where the positives alone would let them collapse onto popularity (users with a
    # single engagement, quiet days)
    w_uniform: float = 0.5
    # each positive's source is seen with its own engagements earlier in the chunk, up to this
    # many (the latest): what a worker's view holds at that moment (0: the chunk-start state)
    chunk_prefix: int = 8
    negatives: int = 2               # "bce" only: per positive, same node type as the true dst
    cold_share: float = 0.2          # student views reduced to the anchor alone (cold-start drill)
    refit_prototypes: bool = True    # fit the primitive tree to the final embeddings (k-means)
    teacher_view: ViewConfig = TEACHER
    student_view: ViewConfig = STUDENT
    quantizer: QuantizerConfig = field(default_factory=QuantizerConfig)
    # the served embedding's collaborative coordinates (low-rank EASE^R; rank 0: none)
    collaborative: CollaborativeConfig = field(default_factory=CollaborativeConfig)
    log_path: str | None = None      # JSON lines, one per step
    prefetch: int = 4                # batches they may run ahead
    snapshot_chunks: int = 1         # resume snapshot at most every this many chunks (0: never) ...
    snapshot_every_s: float = 120.0  # ... and no sooner than this after the last one: a year of
                                     # daily chunks would otherwise write ~300 snapshots

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.batch_edges < 1 or self.chunk_hours <= 0:
            raise ValueError("batch_edges and chunk_hours must be positive")
        if self.sampled_negatives < 0 or not 0 < self.collapse_cosine <= 1:
            raise ValueError("sampled_negatives must be >= 0 and collapse_cosine in (0, 1]")
        if not 0.0 <= self.cold_share < 1.0:
            raise ValueError(f"cold_share must be in [0, 1), got {self.cold_share}")


class EngagementHead(nn.Module):
    """One relation vector per action (DistMult); saved with the checkpoint."""

    def __init__(self, n_actions: int, d: int) -> None:
        super().__init__()
        self.relation = nn.Embedding(n_actions, d)
        nn.init.ones_(self.relation.weight)


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def train(events: Sequence[Engagement], schema: SchemaConfig, enc_cfg: EncoderConfig,
          cfg: TrainConfig, out_dir: str | Path, parent: str | None = None,
          texts: dict[str, np.ndarray] | None = None, device: str | None = None,
          progress: bool = True, init: ckpt.Checkpoint | None = None, resume: bool = False,
          stats: dict | None = None) -> Path:
    """Train on `events` (the training window) and write a checkpoint under `out_dir`.

    `texts`: node -> world-knowledge vector; `init`: start from this checkpoint's weights;
    `resume`: continue the interrupted run of the same data and configs from its snapshot
    in `out_dir/_resume`; `stats` receives wall, model, sampling and wait seconds."""
    # gradient scatter-adds (bias-table lookups, embeddings) must sum in a fixed order for
    # byte-identical checkpoints; the previous setting is restored afterwards
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        return _train(events, schema, enc_cfg, cfg, out_dir, parent, texts, device, progress,
                      init, resume, stats)
    finally:
        torch.use_deterministic_algorithms(was)


def _train(events, schema, enc_cfg, cfg, out_dir, parent, texts, device, progress, init,
           resume, stats) -> Path:
    _seed_everything(cfg.seed)
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    events = sorted(events, key=lambda e: (e.ts, e.src, e.dst, e.action))
    if not events:
        raise ValueError("no training events")
    models = _Models.create(enc_cfg, cfg, len(schema.all_actions), init, dev)
    fp = resume_mod.fingerprint([(e.ts, e.src, e.dst, e.action, e.w) for e in events], _manifest_train(cfg),
                                enc_cfg.to_dict(), parent, init.id if init is not None else None,
                                _texts_digest(texts))
    collab = CollaborativeFit(events, schema, _inherited_weight(cfg.collaborative, init))
    loop = _Loop(events, schema, enc_cfg, cfg, texts, dev, models, collab, Path(out_dir) / "_resume", fp)
    if resume:
        loop.resume()
    trained = loop.run(progress)
    if stats is not None:
        stats.update(loop.timing)
    codes = np.asarray(schema.type_codes(trained.nodes), np.int64)
    _fit_primitives(models.student, trained.embs, codes, enc_cfg, cfg, dev)
    path = _save(out_dir, trained, models, codes, enc_cfg, cfg, parent, init, events, dev)
    shutil.rmtree(loop.snap_dir, ignore_errors=True)     # the run is complete
    return path


@dataclass
class _Models:
    """The student, its EMA teacher (never stepped itself), the engagement head and the
    optimiser of the student's and the head's parameters."""
    student: HierarchicalEncoder
    teacher: HierarchicalEncoder
    head: EngagementHead
    opt: torch.optim.Optimizer

    @classmethod
    def create(cls, enc_cfg: EncoderConfig, cfg: TrainConfig, n_actions: int,
               init: ckpt.Checkpoint | None, dev: torch.device) -> "_Models":
        student = HierarchicalEncoder(enc_cfg).to(dev).train()
        head = EngagementHead(n_actions, enc_cfg.d_emb).to(dev)
        if init is not None:
            _warm_start(student, head, init, enc_cfg)
        teacher = copy.deepcopy(student).eval()
        for p in teacher.parameters():
            p.requires_grad_(False)
        opt = torch.optim.AdamW(list(student.parameters()) + list(head.parameters()), lr=cfg.lr,
                                weight_decay=cfg.weight_decay)
        return cls(student, teacher, head, opt)

    def modules(self) -> dict[str, nn.Module]:
        """What a resume snapshot saves beside the optimiser."""
        return {"student": self.student, "teacher": self.teacher, "head": self.head}


def _inherited_weight(ccfg: CollaborativeConfig, init: ckpt.Checkpoint | None) -> CollaborativeConfig:
    """A run continuing a checkpoint has a student that saw this window's holdout (its parent
    trained up to a recent cutoff): it keeps the weight its parent chose."""
    parent_weight = (init.manifest.get("collaborative") or {}).get("weight") if init is not None else None
    if ccfg.weight is None and parent_weight is not None:
        return dataclasses.replace(ccfg, weight=float(parent_weight))
    return ccfg


def _funnel(schema: SchemaConfig, cfg: TrainConfig) -> torch.Tensor:
    """Each action's weight as a training target, in the order of the sorted action names;
    under the softmax objective negative feedback (not_interested, cancel) is no positive to
    retrieve, so it weighs nothing."""
    return torch.tensor([0.0 if cfg.objective == "softmax" and schema.all_actions[a].sign < 0
                         else schema.all_actions[a].funnel_weight for a in sorted(schema.all_actions)])


@dataclass
class _Trained:
    """What the loop leaves: the final embeddings of every node it saw, the served rows (the
    embeddings with the block's coordinates), the block, the collapse health, the last step's
    metrics and the number of steps taken."""
    nodes: list[str]
    embs: np.ndarray
    served: np.ndarray
    block: object | None
    collapse: dict
    metrics: dict
    steps: int


class _Loop:
    """One run's plan, in order: chunk markers (collapse rows, resume snapshots), the holdout's
    choices just before the encoder trains on a holdout window, the optimiser steps; then the
    final embeddings of every node and the collaborative block on them."""

    def __init__(self, events, schema: SchemaConfig, enc_cfg: EncoderConfig, cfg: TrainConfig,
                 texts, dev: torch.device, models: _Models, collab: CollaborativeFit,
                 snap_dir: Path, fingerprint: str) -> None:
        self.events, self.schema, self.enc_cfg, self.cfg = events, schema, enc_cfg, cfg
        self.texts, self.dev, self.models, self.collab = texts, dev, models, collab
        self.snap_dir, self.fp = snap_dir, fingerprint
        self.plan, passes = _plan(events, cfg, collab.starts)
        self.total = sum(len(p) - 1 for p in self.plan)
        n = max(1, self.total)
        self.lr = cosine(cfg.lr, cfg.lr * cfg.lr_end, n, warmup_steps=min(cfg.warmup_steps, n - 1))
        self.mom = teacher_momentum(n, cfg.momentum)
        self.watch = CollapseWatch(cfg.collapse_cosine)
        self.item_codes = torch.tensor(sorted({schema.all_node_types.index(t)
                                               for t in schema.item_node_types}), device=dev)
        self.funnel = _funnel(schema, cfg)
        self.start_chunk, self.step, self.metrics = 0, 0, {}
        self.timing = {"wait_s": 0.0, "model_s": 0.0, "anchors": 0, "steps": 0, "passes": passes}
        self.last_snapshot = 0.0

    def resume(self) -> None:
        """Continue from the run's snapshot, when one of the same data and configs exists."""
        got = resume_mod.load(self.snap_dir, self.fp, self.models.modules(), self.models.opt)
        if got is not None:
            self.start_chunk, self.step, self.metrics = got
            self.collab.restore(self.metrics.pop(HOLDOUT_KEY, None))
            self.watch.chunks = list(self.metrics.pop(CHUNKS_KEY, None) or [])
            log.info("resuming at chunk %d, step %d of %d", self.start_chunk, self.step, self.total)

    def run(self, progress: bool) -> _Trained:
        logf = _open_log(self.cfg.log_path, self.step) if self.cfg.log_path else None
        wall = self.last_snapshot = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="hirflow-train-") as tmp:
            pipe = self._pipeline(Path(tmp) / "state")
            items = iter(pipe)
            try:
                with tqdm(total=self.total, initial=self.step, unit="step", disable=not progress,
                          desc="train") as bar:
                    self._steps(items, bar, logf)
                trained = self._final(pipe)
            finally:
                if hasattr(items, "close"):
                    items.close()                        # stops the sampling workers
                if logf:
                    logf.close()
                self.timing["sample_s"] = pipe.sample_s
                pipe.close()
        self.timing["wall_s"] = time.perf_counter() - wall
        return trained

    def _pipeline(self, store_dir: Path) -> BatchPipeline:
        cfg = self.cfg
        return BatchPipeline(self.events, self.plan, store_dir, self.schema, cfg.teacher_view,
                             cfg.student_view, self.enc_cfg.pack,
                             {a: i for i, a in enumerate(sorted(self.schema.all_actions))},
                             cfg.negatives if cfg.objective == "bce" else 0, cfg.seed,
                             texts=self.texts, workers=cfg.sample_workers, prefetch=cfg.prefetch,
                             start_chunk=self.start_chunk, cold_share=cfg.cold_share,
                             teacher_anchors=cfg.teacher_anchors,
                             sampled_negatives=cfg.sampled_negatives if cfg.objective == "softmax" else 0,
                             chunk_prefix=cfg.chunk_prefix)

    def _steps(self, items, bar, logf) -> None:
        while True:
            t = time.perf_counter()
            item = next(items, None)                     # blocks only when sampling is behind
            if item is None:
                return
            if isinstance(item, ChunkDone):
                self._chunk_done(item.chunk, logf)
                continue
            self.timing["wait_s"] += time.perf_counter() - t
            if self.collab.due(item.cutoff):             # nothing from here on trained yet
                self.collab.choose(self.models.student, item.cutoff, self.texts, self.dev)
            self._one_step(item, logf)
            bar.update(1)

    def _chunk_done(self, chunk: int, logf) -> None:
        """The chunk's collapse row, and a resume snapshot when one is due."""
        cfg = self.cfg
        row = self.watch.close_chunk(chunk)
        if row is not None and logf:
            # keyed by the chunk's last step: a resumed run keeps it with that step
            logf.write(json.dumps({"chunk_health": row, "step": self.step - 1}, sort_keys=True) + "\n")
        if cfg.snapshot_chunks and (chunk + 1) % cfg.snapshot_chunks == 0 and chunk + 1 < len(self.plan) \
                and time.perf_counter() - self.last_snapshot >= cfg.snapshot_every_s:
            resume_mod.save(self.snap_dir, self.fp, chunk + 1, self.step, self.models.modules(),
                            self.models.opt, {**self.metrics, HOLDOUT_KEY: self.collab.snapshot(),
                                              CHUNKS_KEY: self.watch.chunks})
            self.last_snapshot = time.perf_counter()

    def _one_step(self, item: Prepared, logf) -> None:
        m_ = self.models
        t = time.perf_counter()
        m = _step(item, m_.student, m_.teacher, m_.head, m_.opt, self.funnel, self.cfg, self.dev,
                  self.lr[self.step], self.mom[self.step], self.watch, self.item_codes)
        self.timing["model_s"] += time.perf_counter() - t
        self.timing["anchors"] += item.anchors
        self.timing["steps"] += 1
        m.update(step=self.step, chunk=item.chunk, cutoff=item.cutoff)
        if logf:
            logf.write(json.dumps(m, sort_keys=True) + "\n")
        self.metrics = m
        self.step += 1

    def _final(self, pipe: BatchPipeline) -> _Trained:
        nodes = sorted(pipe.seen)
        final = pipe.final_sampler(self.cfg.student_view)
        embs = embed(self.models.student, final, nodes, self.events[-1].ts, self.enc_cfg, self.texts, self.dev)
        collapse = self.watch.summary(health(_item_directions(embs, nodes, self.schema, self.enc_cfg)))
        if collapse["collapsed"]:
            log.error("the encoder collapsed: item directions' mean cosine %.3f (threshold "
                      "%.2f), effective rank %.1f; its part of the embedding is not served",
                      collapse["mean_cosine"], self.cfg.collapse_cosine, collapse["effective_rank"])
        block = self.collab.block(embs, nodes, final, encoder_ok=not collapse["collapsed"])
        served = embs if block is None else np.concatenate(
            [embs, block_rows(block, final, nodes, self.schema.action_codes())], axis=1)
        return _Trained(nodes, embs, served, block, collapse, self.metrics, self.step)


def _fit_primitives(student: HierarchicalEncoder, embs: np.ndarray, codes: np.ndarray,
                    enc_cfg: EncoderConfig, cfg: TrainConfig, dev: torch.device) -> None:
    """Centre each node type (`cfg.centre_types`) and refit the primitive tree to the final
    embeddings (`cfg.refit_prototypes`)."""
    if cfg.centre_types:
        _centre_types(student, embs, codes)
    if cfg.refit_prototypes:
        with torch.no_grad():
            fit_to = student.centred(torch.from_numpy(embs).to(dev), torch.from_numpy(codes).to(dev)).cpu().numpy()
        fine = fit_tree(fit_to, enc_cfg.levels, cfg.seed)
        if fine is not None:
            with torch.no_grad():
                student.prototypes.copy_(torch.from_numpy(fine).to(student.prototypes.device))


def _save(out_dir, trained: _Trained, models: _Models, codes: np.ndarray, enc_cfg: EncoderConfig,
          cfg: TrainConfig, parent, init, events, dev: torch.device) -> Path:
    """The BoM quantizer fitted on the served rows, then one checkpoint: weights, the block,
    codebooks and the manifest."""
    qcfg = _fitting_quantizer(cfg.quantizer, len(trained.embs))
    quant = BoMQuantizer(trained.served.shape[1], qcfg).train(trained.served)  # retrieval: what is served
    metrics = dict(trained.metrics)
    with torch.no_grad():
        used = models.student.assign(torch.from_numpy(trained.embs).to(dev),
                                     torch.from_numpy(codes).to(dev)).cpu().numpy()
    metrics["primitives_used"] = [int(len(np.unique(used[:, i]))) for i in range(used.shape[1])]
    metrics["reconstruction_error"] = quant.reconstruction_error(trained.served)
    weights = {f"encoder.{k}": v for k, v in models.student.state_dict().items()}
    weights.update({f"head.{k}": v for k, v in models.head.state_dict().items()})
    block, documents = trained.block, None
    if block is not None:
        weights.update({k: torch.from_numpy(v) for k, v in block.weights().items()})
        documents = {collaborative.FILE: block.manifest()}
    manifest = {"parent": parent, "config": enc_cfg.to_dict(), "train": _manifest_train(cfg),
                "init": init.id if init is not None else None,
                "data_window": [int(events[0].ts), int(events[-1].ts)], "events": len(events),
                "seed": cfg.seed, "steps": trained.steps, "quantizer": dataclasses.asdict(qcfg),
                "collapse": trained.collapse,
                "metrics": {k: (round(v, 6) if isinstance(v, float) else v) for k, v in metrics.items()}}
    if block is not None:
        manifest["collaborative"] = block.settings
    return ckpt.save(out_dir, weights, manifest, quant.codebooks_array(), documents)


def _plan(events, cfg: TrainConfig, holdout_starts: Sequence[int] = ()) -> tuple[list, int]:
    """The run's `chunk_plan` and its passes: `cfg.passes`, raised until the run takes at
    least `cfg.min_steps` steps (not when the steps per chunk are capped: a capped run is
    asked to be short). A holdout window is judged at the first chunk that begins at or
    after its start, before the encoder trains on it; where no chunk would begin before the
    data's end (a stream of a few days in day-long chunks), one is cut at the start."""
    chunk_ms = int(cfg.chunk_hours * 3_600_000)
    t0, last = events[0].ts, events[-1].ts
    cuts = [s for s in holdout_starts if t0 + -(-(s - t0) // chunk_ms) * chunk_ms > last]

    def plan(passes: int) -> list:
        return chunk_plan(events, chunk_ms, cfg.batch_edges, cfg.steps_per_chunk, cfg.seed,
                          passes, cuts)
    first = plan(cfg.passes)
    per_pass = sum(len(p) - 1 for p in first) // cfg.passes
    if not cfg.min_steps or cfg.steps_per_chunk is not None or not per_pass:
        return first, cfg.passes
    passes = max(cfg.passes, math.ceil(cfg.min_steps / per_pass))
    return (first if passes == cfg.passes else plan(passes)), passes


def _fitting_quantizer(q: QuantizerConfig, n: int) -> QuantizerConfig:
    """The quantizer config, with codebooks no larger than the embeddings that train them
    (k-means needs at least as many points as codes): a small data set gets fewer codes per
    codebook, said in the log and recorded in the manifest."""
    bits = max(1, min(q.nbits, int(np.log2(max(2, n)))))
    if bits < q.nbits:
        log.warning("%d embeddings cannot train %d codes per codebook: fitting %d", n, 2 ** q.nbits, 2 ** bits)
        return dataclasses.replace(q, nbits=bits)
    return q


def _open_log(path: str, resumed_at: int):
    """The metrics log, keeping only the rows before `resumed_at` (a resumed run repeats the
    steps between its last snapshot and the crash)."""
    p = Path(path)
    keep = []
    if resumed_at and p.exists():
        keep = [ln for ln in p.read_text().splitlines() if ln and json.loads(ln).get("step", 0) < resumed_at]
    f = open(p, "w")
    for ln in keep:
        f.write(ln + "\n")
    return f


def _manifest_train(cfg: TrainConfig) -> dict:
    """What was trained, without where the log went or how many threads sampled (neither
    changes a single byte of the result)."""
    return _jsonable({k: v for k, v in dataclasses.asdict(cfg).items()
                      if k not in ("log_path", "sample_workers", "prefetch", "snapshot_chunks",
                                   "snapshot_every_s")})


def _texts_digest(texts) -> str | None:
    if not texts:
        return None
    h = hashlib.sha256()
    for k in sorted(texts):
        h.update(k.encode())
        h.update(np.ascontiguousarray(texts[k], np.float32).tobytes())
    return h.hexdigest()


def _centre_types(model: HierarchicalEncoder, embs: np.ndarray, types: np.ndarray) -> None:
    """Store each node type's mean embedding in the model: from now on embeddings meet the
    prototypes less their type's mean (`HierarchicalEncoder.centred`)."""
    centre = np.zeros((model.cfg.n_types, embs.shape[1]), np.float32)
    for t in np.unique(types):
        centre[t] = embs[types == t].mean(0)
    with torch.no_grad():
        model.type_centre.copy_(torch.from_numpy(centre).to(model.type_centre.device))


def _warm_start(student: HierarchicalEncoder, head: "EngagementHead", init: ckpt.Checkpoint,
                enc_cfg: EncoderConfig) -> None:
    """Start from a checkpoint's weights (periodic training continues its parent)."""
    if EncoderConfig.from_dict(init.manifest["config"]) != enc_cfg:
        raise ValueError(f"checkpoint {init.id} has another encoder config; train it with the "
                         "same config (or without --init)")
    student.load_state_dict({k[8:]: v for k, v in init.weights.items() if k.startswith("encoder.")})
    with torch.no_grad():
        student.type_centre.zero_()                  # training runs uncentred; refitted after
    hw = {k[5:]: v for k, v in init.weights.items() if k.startswith("head.")}
    if hw:
        head.load_state_dict(hw)


def _jsonable(d):
    return json.loads(json.dumps(d, default=str))


def _item_directions(embs: np.ndarray, nodes: list[str], schema: SchemaConfig,
                     enc_cfg: EncoderConfig) -> np.ndarray:
    """The unit directions of the item nodes' embeddings (the score coordinate left out)."""
    kinds = set(schema.item_node_types)
    rows = [i for i, n in enumerate(nodes) if n.split(":", 1)[0] in kinds]
    return embs[rows, :enc_cfg.d_emb - 1] if enc_cfg.score_bias else embs[rows]


def _step(b: Prepared, student, teacher, head, opt, funnel, cfg: TrainConfig, dev, lr, momentum,
          watch: CollapseWatch | None = None, item_codes: torch.Tensor | None = None) -> dict:
    s_batch, t_batch = b.student.to(dev), b.teacher.to(dev)
    for g in opt.param_groups:
        g["lr"] = float(lr)
    s_emb, s_logits = student(s_batch, student.backend(training=True))
    with torch.no_grad():
        # the training path for the teacher too: one backend per device, no CPU recompiles
        t_emb, _ = teacher(t_batch, teacher.backend(training=True))
        t_dir = teacher.centred(t_emb, t_batch.type_ids[t_batch.anchor_pos])   # unit length
        t_scores = [t_dir @ p.T for p in teacher.level_prototypes()]       # cosines
    t_idx = b.teacher_idx.to(dev)
    distill = L.distillation_loss([x[t_idx] for x in s_logits], t_scores, cfg.sinkhorn_epsilon,
                                  cfg.sinkhorn_iters)
    hier = L.hierarchy_consistency_loss(s_logits, [student.parents(i) for i in range(len(s_logits))])
    src, dst, act = b.src.to(dev), b.dst.to(dev), b.action.to(dev)
    seen = {"positives": int(b.label.sum()), "no_negative": 0 if cfg.negatives else int(b.label.sum())}
    if cfg.objective == "softmax":
        keep = funnel.to(dev)[act] > 0
        engage = L.in_batch_softmax_loss(s_emb, src[keep], dst[keep], funnel.to(dev)[act[keep]],
                                         b.log_q.to(dev) if cfg.logq else torch.zeros_like(b.log_q, device=dev),
                                         s_batch.type_ids[s_batch.anchor_pos],
                                         cfg.softmax_temperature, b.sampled.to(dev), seen,
                                         b.src_node.to(dev)[keep])
    else:
        logits = L.engagement_logits(s_emb[src], s_emb[dst], head.relation(act))
        engage = L.engagement_loss(logits, b.label.to(dev), funnel.to(dev)[act])
    uniform = s_emb.new_zeros(())
    if item_codes is not None:
        items = torch.isin(s_batch.type_ids[s_batch.anchor_pos], item_codes)
        d = s_emb[items][:, :-1] if student.cfg.score_bias else s_emb[items]
        if cfg.w_uniform:
            uniform = L.uniformity_loss(d)
        if watch is not None:
            watch.step(d.detach().float().cpu().numpy(), seen["positives"], seen["no_negative"])
    loss = cfg.w_distill * distill + cfg.w_engage * engage + cfg.w_hierarchy * hier \
        + cfg.w_uniform * uniform
    if not torch.isfinite(loss):
        raise NonFiniteLoss(f"loss became {loss.item()} (distill {distill.item()}, engage "
                            f"{engage.item()}, hierarchy {hier.item()}); stopping")
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    with torch.no_grad():                            # teacher = EMA of the student
        for pt, ps in zip(teacher.parameters(), student.parameters()):
            pt.mul_(momentum).add_(ps.detach(), alpha=1 - momentum)
    return {"loss": float(loss.detach()), "distill": float(distill.detach()),
            "engage": float(engage.detach()), "hierarchy": float(hier.detach()),
            "uniform": float(uniform.detach()), "lr": float(lr),
            "momentum": float(momentum)}
