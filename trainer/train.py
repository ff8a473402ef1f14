"""The training loop: time-ordered self-distillation + engagement prediction.

Events are replayed chunk by chunk into a fresh graph store built with the serving `state`
code; the engagements of chunk k are the positives of the steps on chunk k, and every view of
those steps is sampled as of the chunk's start, from the state of chunks < k only, so no step
ever sees its own future. Batches are shuffled only inside a chunk. The teacher is an EMA of
the student (momentum schedule computed up front), its broad views give Sinkhorn-balanced
targets for the student's narrow views at every level. A non-finite loss stops the run.
After training, the BoM quantizer is fitted on the final embeddings and everything goes into
one checkpoint. Same data, config and seed -> the same checkpoint bytes.
"""
from __future__ import annotations

import copy
import dataclasses
import json
import logging
import math
import random
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from encoder import checkpoint as ckpt
from encoder.batching import pack
from encoder.model import EncoderConfig, HierarchicalEncoder
from encoder.quantize import BoMQuantizer, QuantizerConfig
from state.events import Engagement
from state.graph import GraphConfig, GraphStore
from state.schema import SchemaConfig
from state.views import STUDENT, TEACHER, ViewConfig, ViewSampler
from state.writer import BOTH_SIDES, GraphWriter
from trainer import losses as L
from trainer.schedules import cosine, teacher_momentum

log = logging.getLogger(__name__)


class NonFiniteLoss(RuntimeError):
    pass


@dataclass(frozen=True)
class TrainConfig:
    seed: int = 0
    chunk_hours: float = 24.0        # time chunk: shuffles never cross one
    batch_edges: int = 64            # positive engagements per step
    max_steps_per_chunk: int = 8
    lr: float = 2e-3
    weight_decay: float = 0.01
    warmup_steps: int = 5
    momentum: float = 0.996          # teacher EMA momentum at the start (rises to 1)
    sinkhorn_epsilon: float = 0.05
    sinkhorn_iters: int = 3
    w_distill: float = 1.0
    w_engage: float = 1.0
    w_hierarchy: float = 0.1
    negatives: int = 2               # per positive, same node type as the true dst
    teacher_view: ViewConfig = TEACHER
    student_view: ViewConfig = STUDENT
    quantizer: QuantizerConfig = field(default_factory=QuantizerConfig)
    log_path: str | None = None      # JSON lines, one per step

    def __post_init__(self) -> None:
        if self.batch_edges < 1 or self.max_steps_per_chunk < 1 or self.chunk_hours <= 0:
            raise ValueError("batch_edges, max_steps_per_chunk and chunk_hours must be positive")


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
          progress: bool = True) -> Path:
    """Train on `events` (the training window) and write a checkpoint under `out_dir`."""
    # gradient scatter-adds (bias-table lookups, embeddings) must sum in a fixed order for
    # byte-identical checkpoints; the previous setting is restored afterwards
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        return _train(events, schema, enc_cfg, cfg, out_dir, parent, texts, device, progress)
    finally:
        torch.use_deterministic_algorithms(was)


def _train(events, schema, enc_cfg, cfg, out_dir, parent, texts, device, progress) -> Path:
    _seed_everything(cfg.seed)
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    events = sorted(events, key=lambda e: (e.ts, e.src, e.dst, e.action))
    if not events:
        raise ValueError("no training events")
    actions = sorted(schema.all_actions)
    a_index = {a: i for i, a in enumerate(actions)}
    funnel = torch.tensor([schema.all_actions[a].funnel_weight for a in actions])
    student = HierarchicalEncoder(enc_cfg).to(dev).train()
    teacher = copy.deepcopy(student).eval()
    for p in teacher.parameters():
        p.requires_grad_(False)
    head = EngagementHead(len(actions), enc_cfg.d_emb).to(dev)
    opt = torch.optim.AdamW(list(student.parameters()) + list(head.parameters()), lr=cfg.lr,
                            weight_decay=cfg.weight_decay)
    chunk_ms = int(cfg.chunk_hours * 3_600_000)
    t0 = events[0].ts
    chunk_ids = [(e.ts - t0) // chunk_ms for e in events]
    bounds = np.flatnonzero(np.diff(chunk_ids)) + 1
    chunks = np.split(np.arange(len(events)), bounds)
    steps = sum(min(cfg.max_steps_per_chunk, math.ceil(len(c) / cfg.batch_edges)) for c in chunks[1:])
    lr = cosine(cfg.lr, cfg.lr * 0.05, max(1, steps), warmup_steps=min(cfg.warmup_steps, max(1, steps) - 1))
    mom = teacher_momentum(max(1, steps), cfg.momentum)
    rng = np.random.default_rng(cfg.seed)
    logf = open(cfg.log_path, "w") if cfg.log_path else None
    metrics: dict[str, float] = {}
    step = 0
    with tempfile.TemporaryDirectory(prefix="hirflow-train-") as tmp:
        store = GraphStore(Path(tmp) / "state", schema, 1)
        writer = GraphWriter(store, GraphConfig(path=str(Path(tmp) / "state")))
        tsampler = ViewSampler(store.reader, schema, cfg.teacher_view, seed=cfg.seed)
        ssampler = ViewSampler(store.reader, schema, cfg.student_view, seed=cfg.seed + 1)
        by_type: dict[str, list[str]] = {}        # node type -> nodes seen so far (negatives)
        seen: set[str] = set()
        bar = tqdm(total=steps, unit="step", disable=not progress, desc="train")
        try:
            for k, idx in enumerate(chunks):
                cutoff = events[idx[0]].ts - 1
                if k > 0 and by_type:                       # chunk 0 only builds state
                    order = idx[np.argsort(rng.random(len(idx)), kind="stable")]
                    for b in range(min(cfg.max_steps_per_chunk, math.ceil(len(order) / cfg.batch_edges))):
                        batch = [events[i] for i in order[b * cfg.batch_edges:(b + 1) * cfg.batch_edges]]
                        m = _step(batch, cutoff, student, teacher, head, opt, tsampler, ssampler,
                                  by_type, a_index, funnel, rng, cfg, enc_cfg, texts, dev,
                                  lr[step], mom[step])
                        m.update(step=step, chunk=int(k), cutoff=int(cutoff))
                        if logf:
                            logf.write(json.dumps(m, sort_keys=True) + "\n")
                        metrics = m
                        step += 1
                        bar.update(1)
                writer.apply_batch([(events[i], BOTH_SIDES) for i in idx])
                writer.commit()
                touched = sorted({n for i in idx for n in (events[i].src, events[i].dst)})
                tsampler.invalidate(touched)
                ssampler.invalidate(touched)
                for n in touched:
                    if n not in seen:
                        seen.add(n)
                        by_type.setdefault(n.partition(":")[0], []).append(n)
            bar.close()
            emb_nodes = sorted(seen)
            final_cutoff = events[-1].ts
            embs = embed(student, ssampler, emb_nodes, final_cutoff, enc_cfg, texts, dev)
        finally:
            if logf:
                logf.close()
            store.close()
    quant = BoMQuantizer(enc_cfg.d_emb, cfg.quantizer).train(embs)
    metrics["reconstruction_error"] = quant.reconstruction_error(embs)
    weights = {f"encoder.{k}": v for k, v in student.state_dict().items()}
    weights.update({f"head.{k}": v for k, v in head.state_dict().items()})
    manifest = {"parent": parent, "config": enc_cfg.to_dict(),
                # where the log went is not part of what was trained
                "train": _jsonable({k: v for k, v in dataclasses.asdict(cfg).items() if k != "log_path"}),
                "data_window": [int(events[0].ts), int(events[-1].ts)], "events": len(events),
                "seed": cfg.seed, "steps": step, "quantizer": dataclasses.asdict(cfg.quantizer),
                "metrics": {k: (round(v, 6) if isinstance(v, float) else v) for k, v in metrics.items()}}
    return ckpt.save(out_dir, weights, manifest, quant.codebooks_array())


def _jsonable(d):
    return json.loads(json.dumps(d, default=str))


def _step(batch, cutoff, student, teacher, head, opt, tsampler, ssampler, by_type, a_index,
          funnel, rng, cfg: TrainConfig, enc_cfg: EncoderConfig, texts, dev, lr, momentum) -> dict:
    anchors = sorted({n for e in batch for n in (e.src, e.dst)})
    pos = {n: i for i, n in enumerate(anchors)}
    negs = []
    for e in batch:                                  # negatives of the dst's node type
        pool = by_type.get(e.dst.partition(":")[0]) or [e.dst]
        negs.extend(pool[j] for j in rng.integers(0, len(pool), cfg.negatives))
    extra = sorted(set(negs) - set(pos))
    for n in extra:
        pos[n] = len(anchors)
        anchors.append(n)
    s_views = ssampler.sample(anchors, cutoff)
    t_views = tsampler.sample(anchors, cutoff)
    s_batch = pack(s_views, enc_cfg.pack, knowledge=texts).to(dev)
    t_batch = pack(t_views, enc_cfg.pack, knowledge=texts).to(dev)
    for g in opt.param_groups:
        g["lr"] = float(lr)
    s_emb, s_logits = student(s_batch, student.backend(training=True))
    with torch.no_grad():
        # the training path for the teacher too: one backend per device, no CPU recompiles
        t_emb, _ = teacher(t_batch, teacher.backend(training=True))
        t_scores = [t_emb @ p.T for p in teacher.level_prototypes()]       # cosines
    distill = L.distillation_loss(s_logits, t_scores, cfg.sinkhorn_epsilon, cfg.sinkhorn_iters)
    hier = L.hierarchy_consistency_loss(s_logits, [student.parents(i) for i in range(len(s_logits))])
    src = torch.tensor([pos[e.src] for e in batch for _ in range(1 + cfg.negatives)], device=dev)
    dst = torch.tensor([x for i, e in enumerate(batch)
                        for x in [pos[e.dst]] + [pos[n] for n in negs[i * cfg.negatives:(i + 1) * cfg.negatives]]],
                       device=dev)
    act = torch.tensor([a_index[e.action] for e in batch for _ in range(1 + cfg.negatives)], device=dev)
    labels = torch.tensor([1.0 if j == 0 else 0.0 for _ in batch for j in range(1 + cfg.negatives)], device=dev)
    logits = L.engagement_logits(s_emb[src], s_emb[dst], head.relation(act))
    engage = L.engagement_loss(logits, labels, funnel.to(dev)[act])
    loss = cfg.w_distill * distill + cfg.w_engage * engage + cfg.w_hierarchy * hier
    if not torch.isfinite(loss):
        raise NonFiniteLoss(f"loss became {loss.item()} (distill {distill.item()}, engage "
                            f"{engage.item()}, hierarchy {hier.item()}); stopping")
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    with torch.no_grad():                            # teacher = EMA of the student
        for pt, ps in zip(teacher.parameters(), student.parameters()):
            pt.mul_(momentum).add_(ps.detach(), alpha=1 - momentum)
    return {"loss": float(loss), "distill": float(distill), "engage": float(engage),
            "hierarchy": float(hier), "lr": float(lr), "momentum": float(momentum)}


@torch.no_grad()
def embed(model: HierarchicalEncoder, sampler: ViewSampler, nodes: list[str], cutoff: int,
          enc_cfg: EncoderConfig, texts, dev, batch: int = 512) -> np.ndarray:
    """(len(nodes), d_emb) embeddings from student views as of `cutoff` (inference)."""
    model.eval()
    out = []
    for i in range(0, len(nodes), batch):
        views = sampler.sample(nodes[i:i + batch], cutoff)
        b = pack(views, enc_cfg.pack, knowledge=texts).to(dev)
        emb, _ = model(b, model.backend(training=False, max_view=max(b.view_sizes)))
        out.append(emb.float().cpu().numpy())
    model.train()
    return np.concatenate(out) if out else np.zeros((0, enc_cfg.d_emb), np.float32)
