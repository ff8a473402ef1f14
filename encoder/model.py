"""The hierarchical encoder: pre-norm graph transformer over packed views.

Outputs, per view, the anchor's embedding and assignment logits over the prototypes of each
hierarchy level (coarse to fine). The embedding is a unit direction, and with `score_bias`
its last coordinate carries a score term: 1 for the query side (users), a learned bias for
every other node, read from its features (behavioural stats included, so it follows recent
activity). The inner product of a user and an item is then direction similarity plus the
item's bias: the popularity term of a two-tower retrieval score, served in the embedding
itself (what the index retrieves by and subscribers receive).

Levels form a tree: fine primitive j has parent ``j * K_l // K_fine`` at level l, and a
coarse primitive is the normalised mean of its children, so every primitive lives in the
node embedding space and a node's coarse assignment follows its fine one. `forward` takes
tensors only (a `PackedBatch`).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from hirflow.encoder import attention as A
from hirflow.encoder.batching import PackConfig, PackedBatch
from hirflow.encoder.features import NodeFeatures
from hirflow.encoder.shape import EncoderShape
from hirflow.state.schema import SchemaConfig
from hirflow.state.views import N_STATS


@dataclass(frozen=True)
class EncoderConfig(EncoderShape):
    """The model's `EncoderShape` (levels and widths: what `[encoder]` sets) and what the
    schema decides, the features read and the packing."""
    n_types: int = 6                # from the schema (see `for_schema`)
    n_actions: int = 9
    dhe_hidden: int = 128
    temperature: float = 0.1        # assignment softmax temperature (cosine logits / T)
    n_stats: int = N_STATS          # behavioural stats read per token (`state.views.N_STATS`)
    score_bias: bool = False        # last coordinate: 1 for query types, a learned bias for the
                                    # rest (`for_schema` turns it on, naming the user type)
    query_types: tuple[int, ...] = ()   # type codes of the query side
    dropout: float = 0.0
    compile: bool = True            # compiled FlexAttention where it applies
    pack: PackConfig = field(default_factory=PackConfig)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.score_bias and not self.query_types:
            raise ValueError("score_bias needs the query side's types (query_types): with none, "
                             "a user's bias would multiply an item's instead of adding to it")

    @classmethod
    def for_schema(cls, schema: SchemaConfig, **kw) -> "EncoderConfig":
        kw.setdefault("score_bias", True)
        query = (schema.all_node_types.index(schema.user_type),)
        return cls(n_types=len(schema.all_node_types), n_actions=len(schema.all_actions),
                   query_types=query, **kw)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "EncoderConfig":
        d = dict(d)
        d["levels"] = tuple(d["levels"])
        d["query_types"] = tuple(d.get("query_types", ()))
        d.setdefault("score_bias", False)          # models saved before the key had none
        d.setdefault("n_stats", 6)                  # ... and read 6 stats
        p = dict(d.pop("pack"))
        p["seq_buckets"] = tuple(p["seq_buckets"])
        return cls(pack=PackConfig(**p), **d)


class Block(nn.Module):
    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        self.h, self.d = cfg.n_heads, cfg.d_model
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = nn.Sequential(nn.Linear(cfg.d_model, cfg.d_ff), nn.GELU(),
                                 nn.Linear(cfg.d_ff, cfg.d_model))
        self.drop = nn.Dropout(cfg.dropout)
        self.bias = A.GraphBias(cfg.n_heads, cfg.pack.n_spd, cfg.n_actions,
                                cfg.pack.recency_buckets, cfg.n_types)

    def forward(self, x: torch.Tensor, b: PackedBatch, backend: str, layout,
                anchors_only: bool = False) -> torch.Tensor:
        """`layout`: (BlockMask, PairLayout) on the flex paths, the DenseViewLayout on
        dense_per_view. `anchors_only` (the last block): -> (V, d), the anchors' rows only,
        since nothing reads the other tokens' output (on dense_per_view only the anchors
        query; elsewhere their rows are taken after attention)."""
        S = x.shape[0]
        q, k, v = self.qkv(self.ln1(x)).view(S, 3, self.h, self.d // self.h).permute(1, 2, 0, 3)
        q, k, v = q[None], k[None], v[None]                       # (1, H, S, hd)
        if backend == A.Backend.DENSE_PER_VIEW:
            y = A.attend_dense_per_view(q, k, v, b, self.bias, layout, anchors_only=anchors_only)
        elif backend == A.Backend.DENSE_PACKED:
            y = A.attend_dense_packed(q, k, v, b, self.bias)
        else:
            y = A.attend_flex(q, k, v, b, self.bias, layout[0], compiled=backend == A.Backend.FLEX_COMPILED,
                              pairs=layout[1])
        if anchors_only:
            x = x[b.anchor_pos]
            if backend != A.Backend.DENSE_PER_VIEW:
                y = y[:, :, b.anchor_pos]
        y = y[0].permute(1, 0, 2).reshape(x.shape[0], self.d)      # (rows, d)
        x = x + self.drop(self.proj(y))
        return x + self.drop(self.mlp(self.ln2(x)))


class HierarchicalEncoder(nn.Module):
    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.features = NodeFeatures(cfg)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.d_emb - 1 if cfg.score_bias else cfg.d_emb)
        if cfg.score_bias:
            self.bias_head = nn.Linear(cfg.d_model, 1)
            nn.init.zeros_(self.bias_head.weight)
            nn.init.zeros_(self.bias_head.bias)
            query = torch.zeros(cfg.n_types, dtype=torch.bool)
            query[list(cfg.query_types)] = True
            self.register_buffer("is_query", query, persistent=False)
        k_fine = cfg.levels[-1]
        self.prototypes = nn.Parameter(F.normalize(torch.randn(k_fine, cfg.d_emb), dim=-1))
        # per-type mean embedding, removed before an embedding meets the prototypes (not from
        # the embedding served for retrieval): zero while training; the trainer sets it after
        # training (`centre_types`), since node type is otherwise the largest direction of the
        # space and the coarsest primitives split nodes by type, not by interest
        self.register_buffer("type_centre", torch.zeros(cfg.n_types, cfg.d_emb))
        for i, k in enumerate(cfg.levels):
            self.register_buffer(f"parent_{i}", torch.arange(k_fine) * k // k_fine, persistent=False)

    @property
    def device(self) -> torch.device:
        return self.prototypes.device

    def backend(self, training: bool | None = None, max_view: int = 128) -> str:
        training = self.training and torch.is_grad_enabled() if training is None else training
        return A.choose_backend(self.device, training, self.cfg.compile, max_view)

    def level_prototypes(self) -> list[torch.Tensor]:
        """Unit prototypes per level (coarse to fine); coarse = normalised mean of children."""
        fine = F.normalize(self.prototypes, dim=-1)
        out = []
        for i, k in enumerate(self.cfg.levels):
            parent = getattr(self, f"parent_{i}")
            sums = torch.zeros(k, fine.shape[1], device=fine.device, dtype=fine.dtype)
            out.append(F.normalize(sums.index_add(0, parent, fine), dim=-1))
        return out

    def parents(self, level: int) -> torch.Tensor:
        """(K_fine,) index of each fine primitive's ancestor at `level`."""
        return getattr(self, f"parent_{level}")

    def forward(self, b: PackedBatch, backend: str | None = None):
        """-> emb (V, d_emb) (unit vectors, or a unit direction + the score coordinate with
        `score_bias`), logits: list of (V, K_l) per level."""
        backend = A.Backend(backend or self.backend(max_view=max(b.view_sizes)))
        if backend.is_flex:
            layout = (A.build_block_mask(b, self.device), A.pair_layout(b, self.blocks[0].bias))
        elif backend == A.Backend.DENSE_PER_VIEW:
            layout = A.dense_view_layout(b, self.blocks[0].bias)
        else:
            layout = None
        # the per-view path reads real tokens only: the padding up to the length bucket
        # (there for the compiled kernels' shapes; ~20% of a serving batch) is left out
        x = self.features(b, sum(b.view_sizes) if backend == A.Backend.DENSE_PER_VIEW else None)
        last = len(self.blocks) - 1
        for i, blk in enumerate(self.blocks):
            x = blk(x, b, backend, layout, anchors_only=i == last)   # the last: (V, d)
        if not self.blocks:
            x = x[b.anchor_pos]
        types = b.type_ids[b.anchor_pos]
        emb = self.embedding(x, types)                                 # (V, d_emb)
        z = self.centred(emb, types)
        logits = [z @ p.T / self.cfg.temperature for p in self.level_prototypes()]
        return emb, logits

    def embedding(self, x: torch.Tensor, type_ids: torch.Tensor) -> torch.Tensor:
        """Anchors' last hidden states (V, d_model) -> their embeddings (V, d_emb): a unit
        direction, and with `score_bias` the score coordinate (1 for query types)."""
        h = self.ln_f(x)
        emb = F.normalize(self.head(h), dim=-1)
        if not self.cfg.score_bias:
            return emb
        bias = self.bias_head(h)                                      # (V, 1)
        score = torch.where(self.is_query[type_ids, None], torch.ones_like(bias), bias)
        return torch.cat([emb, score], -1)

    def centred(self, emb: torch.Tensor, type_ids: torch.Tensor) -> torch.Tensor:
        """`emb` in the prototypes' space: less its type's mean, unit length. Retrieval keeps
        the plain embedding, whose type mean carries a useful per-item prior."""
        return F.normalize(emb - self.type_centre[type_ids], dim=-1)

    def assign(self, emb: torch.Tensor, type_ids: torch.Tensor) -> torch.Tensor:
        """(V, levels) primitive per level of embeddings `emb` of nodes of types `type_ids`:
        fine by argmax, coarser as its ancestors, so the assignments always form a path."""
        fine = (self.centred(emb, type_ids) @ F.normalize(self.prototypes, dim=-1).T).argmax(-1)
        return torch.stack([self.parents(i)[fine] for i in range(len(self.cfg.levels))], dim=-1)
