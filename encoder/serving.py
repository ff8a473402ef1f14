"""What the refresh loop serves with: a verified checkpoint (encoder + BoM quantizer +
collaborative block), or, before any checkpoint exists, a cold-start encoder of world
knowledge + node type alone.

`encode(views, knowledge, prepared, edges)` -> embeddings (n, d), assignments (n, levels),
tokens (n, M), all numpy, so the caller never touches torch. The model runs on CUDA when
present. A served embedding is the encoder's (d_emb) followed by the collaborative block
(`encoder.collaborative`, read from the anchors' adjacencies `edges`) when the checkpoint has
one; assignments come from the encoder's coordinates, tokens from the whole embedding.
"""
from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import torch

from hirflow.encoder import checkpoint as ckpt
from hirflow.encoder import collaborative
from hirflow.encoder.batching import PackConfig, PackedBatch, Packer, pack
from hirflow.encoder.model import EncoderConfig, HierarchicalEncoder
from hirflow.encoder.quantize import BoMQuantizer
from hirflow.encoder.quantizer_config import QuantizerConfig
from hirflow.state.edge_columns import EdgeColumns
from hirflow.state.index import NO_PRIMITIVE
from hirflow.state.schema import UNKNOWN_TYPE, node_type, type_code_map
from hirflow.state.view_pool import PreparedParts
from hirflow.state.views import View

log = logging.getLogger(__name__)

COLD_MODEL_ID = "cold-start"


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def set_cpu_threads(n: int) -> None:
    """Torch's and faiss's threads for serving on CPU (0: their default, one per core). A
    worker's micro-batches are small matrices, and the worker shares its cores with ingest
    and often a broker: extra threads there mostly spin (bench/freshness.py at 2,000 ev/s,
    one run each: 1,568 refreshed nodes/s with OMP_NUM_THREADS=1, 1,272 without)."""
    if n > 0:
        import faiss
        torch.set_num_threads(n)
        faiss.omp_set_num_threads(n)


def quality_of(manifest: Mapping) -> dict:
    """What a checkpoint's manifest says of how it ranks: the trainer's holdout Recall@20 of
    the served vector, which parts it serves, and whether its encoder collapsed."""
    hold = (manifest.get("collaborative") or {}).get("holdout") or {}
    weight = hold.get("weight")
    parts = ("encoder" if weight is None or weight == collaborative.ENCODER_ALONE
             else "collaborative block" if weight >= collaborative.BLOCK_ALONE
             else "encoder and collaborative block")
    recall = (hold.get("weight_recall@20") or {}).get(str(weight))
    return {"checkpoint": manifest.get("id"), "serves": parts, "holdout_recall@20": recall,
            "holdout_users": hold.get("judged_users"), "why": hold.get("why"),
            "encoder_collapsed": bool((manifest.get("collapse") or {}).get("collapsed")),
            "data_window": manifest.get("data_window")}


@dataclass
class ServingModel:
    id: str
    path: str | None
    d: int
    m: int
    nbits: int
    levels: int
    encoder: HierarchicalEncoder | None = None
    quantizer: BoMQuantizer | None = None
    cold: "ColdStart | None" = None
    collab: "collaborative.CollaborativeBlock | None" = None
    collapsed: bool = False          # the trainer found the encoder's item directions
                                     # collapsed: its part only breaks the block's ties
    quality: dict = field(default_factory=dict)   # what is known of how it ranks (`quality_of`)

    @classmethod
    def from_checkpoint(cls, path: str | Path, device: torch.device | None = None) -> "ServingModel":
        """Verify (sha256 of every file) and load; raises `CheckpointError` when it fails."""
        ck = ckpt.load(path)
        try:
            model = encoder_from(ck)
        except (TypeError, KeyError, ValueError) as exc:
            raise ckpt.CheckpointError(f"{path}: its model config is not one this version "
                                       f"reads (a newer trainer?): {exc}") from None
        cfg = model.cfg
        if ck.codebooks is None:
            raise ckpt.CheckpointError(f"{path}: no quantizer codebooks; cannot make BoM tokens")
        try:
            qcfg = QuantizerConfig.of_manifest(ck.manifest["quantizer"])
        except (TypeError, KeyError, ValueError) as exc:
            raise ckpt.CheckpointError(f"{path}: its quantizer config is not one this version "
                                       f"reads: {exc}") from None
        try:
            block = collaborative.from_checkpoint(ck)
        except (TypeError, KeyError, ValueError) as exc:
            raise ckpt.CheckpointError(f"{path}: its collaborative block is unreadable: {exc}") from None
        d = cfg.d_emb + (block.rank if block is not None else 0)
        if ck.codebooks.shape[-1] != d:
            raise ckpt.CheckpointError(f"{path}: codebooks of width {ck.codebooks.shape[-1]} for "
                                       f"embeddings of width {d}")
        quant = BoMQuantizer.from_codebooks(ck.codebooks, qcfg)
        model = model.to(device or default_device()).eval()
        collapsed = bool((ck.manifest.get("collapse") or {}).get("collapsed"))
        if collapsed:
            log.warning("%s: its encoder collapsed in training (item directions' mean cosine "
                        "%s); the collaborative block carries its ranking", ck.id,
                        ck.manifest["collapse"].get("mean_cosine"))
        return cls(ck.id, str(Path(path).resolve()), d, qcfg.m, qcfg.nbits,
                   len(cfg.levels), encoder=model, quantizer=quant, collab=block,
                   collapsed=collapsed, quality=quality_of(ck.manifest))

    @classmethod
    def cold_start(cls, type_names: Sequence[str], d: int = 64, m: int = 8, nbits: int = 8,
                   levels: int = 3, knowledge_dim: int = 384) -> "ServingModel":
        return cls(COLD_MODEL_ID, None, d, m, nbits, levels,
                   cold=ColdStart(type_names, d, m, nbits, knowledge_dim, levels),
                   quality={"checkpoint": None, "retrieve": "neighbourhood: the items of the users "
                            "who engaged the same items; embeddings know only type and text until "
                            "a checkpoint is trained (hirflow train)"})

    @property
    def codebooks(self) -> np.ndarray | None:
        return None if self.quantizer is None else self.quantizer.codebooks_array()

    def prototypes(self) -> list[np.ndarray] | None:
        if self.encoder is None:
            return None
        with torch.no_grad():
            return [p.float().cpu().numpy() for p in self.encoder.level_prototypes()]

    def type_centres(self) -> np.ndarray | None:
        """(n_types, d) mean embedding per node type, removed before comparing with prototypes."""
        if self.encoder is None:
            return None
        return self.encoder.type_centre.float().cpu().numpy()

    @property
    def packer(self) -> Packer | None:
        """What packs views for this model where they are sampled (None: cold start packs
        nothing)."""
        return None if self.encoder is None else Packer(self.encoder.cfg.pack)

    def encode(self, views: Sequence[View], knowledge: Mapping[str, np.ndarray],
               prepared: "tuple[PackConfig, dict] | PreparedParts | None" = None,
               edges: EdgeColumns | None = None):
        """`prepared`: a `Packer`'s output for these views, used when packed with this
        model's config (a batch sampled before a hot swap is packed again here), or the
        outputs for consecutive parts of them (`state.view_pool`), encoded part by part.
        `edges`: the anchors' adjacencies, which a model with a collaborative block needs."""
        if self.cold is not None:
            return self.cold.encode([v.anchor for v in views], knowledge)
        emb, assign = self._encoder_part(views, knowledge, prepared)
        if self.collab is not None:
            if edges is None:
                raise ValueError(f"model {self.id} has a collaborative block: encode needs the "
                                 "anchors' adjacencies (edges)")
            emb = np.concatenate([emb, self.collab.blocks([v.anchor for v in views], edges)], axis=1)
        return emb, assign, self.quantizer.tokens(emb)

    @torch.no_grad()
    def _encoder_part(self, views, knowledge, prepared) -> tuple[np.ndarray, np.ndarray]:
        if isinstance(prepared, PreparedParts):     # packed in parts by several processes
            out, at = [], 0
            for n, part in zip(prepared.sizes, prepared.parts):
                out.append(self._encoder_part(views[at:at + n], knowledge, part))
                at += n
            return tuple(np.concatenate(x) for x in zip(*out))
        model = self.encoder
        if prepared is not None and prepared[0] == model.cfg.pack:
            b = PackedBatch.from_arrays(prepared[1]).to(model.device)
        else:
            b = pack(views, model.cfg.pack, knowledge=knowledge).to(model.device)
        emb, _ = model(b, model.backend(training=False, max_view=max(b.view_sizes)))
        assign = model.assign(emb, b.type_ids[b.anchor_pos]).cpu().numpy().astype(np.int32)
        return emb.float().cpu().numpy(), assign


def encoder_from(ck: ckpt.Checkpoint) -> HierarchicalEncoder:
    """The encoder of a verified checkpoint (eval mode, CPU)."""
    model = HierarchicalEncoder(EncoderConfig.from_dict(ck.manifest["config"]))
    enc = {k[len("encoder."):]: v for k, v in ck.weights.items() if k.startswith("encoder.")}
    try:
        model.load_state_dict(enc)
    except RuntimeError as exc:
        raise ckpt.CheckpointError(f"{ck.path}: weights do not fit the model ({exc})") from None
    return model.eval()


class ColdStart:
    """Before the first checkpoint: a fixed random projection of the world-knowledge vector
    plus a per-type direction, unit norm; tokens by sign hashing (M groups of `nbits` random
    hyperplanes), no primitives. Deterministic across processes (seeded by name)."""

    def __init__(self, type_names: Sequence[str], d: int, m: int, nbits: int, knowledge_dim: int,
                 levels: int) -> None:
        seed = int.from_bytes(hashlib.blake2b(b"hirflow-cold-start", digest_size=4).digest(), "big")
        rng = np.random.default_rng(seed)
        self.type_index = type_code_map(tuple(type_names))
        self.proj = rng.standard_normal((knowledge_dim, d)).astype(np.float32) / np.sqrt(knowledge_dim)
        # one direction per type, the last for UNKNOWN_TYPE (-1 indexes it)
        self.type_vec = rng.standard_normal((len(type_names) + 1, d)).astype(np.float32)
        self.type_vec /= np.linalg.norm(self.type_vec, axis=1, keepdims=True)
        self.planes = rng.standard_normal((m, nbits, d)).astype(np.float32)
        self.m, self.nbits, self.levels = m, nbits, levels

    def encode(self, nodes: Sequence[str], knowledge: Mapping[str, np.ndarray]):
        d = self.proj.shape[1]
        emb = np.zeros((len(nodes), d), np.float32)
        for i, n in enumerate(nodes):
            t = self.type_index.get(node_type(n), UNKNOWN_TYPE)
            v = 0.5 * self.type_vec[t]
            k = knowledge.get(n)
            if k is not None:
                v = v + k @ self.proj
            emb[i] = v
        emb /= np.maximum(np.linalg.norm(emb, axis=1, keepdims=True), 1e-12)
        assign = np.full((len(nodes), self.levels), NO_PRIMITIVE, np.int32)
        return emb, assign, self.tokens(emb)

    def tokens(self, emb: np.ndarray) -> np.ndarray:
        bits = np.einsum("mbd,nd->nmb", self.planes, emb) > 0
        codes = (bits * (1 << np.arange(self.nbits))).sum(-1).astype(np.int64)
        return codes + (np.arange(self.m, dtype=np.int64) << self.nbits)[None]
