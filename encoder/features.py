"""Node features -> token embeddings.

Every token gets its node type and behavioural stats; nodes with enough events also get a
deep hash embedding of their id (k universal hashes -> a small dense network; Kang et al.
2021), so parameter memory does not grow with the number of ids; rare and unseen nodes fall
back to type + world knowledge + stats. World knowledge (MiniLM text vectors) and image
embeddings are projected into the same space when present.
"""
from __future__ import annotations

import torch
from torch import nn

from hirflow.encoder.batching import HOP_BUCKETS, PackedBatch


class DeepHashEmbedding(nn.Module):
    """(S, k) hash features in [-1, 1] -> (S, d). Parameters: O(k * hidden + hidden * d)."""

    def __init__(self, k: int, hidden: int, d: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(k, hidden), nn.Mish(), nn.Linear(hidden, hidden),
                                 nn.Mish(), nn.Linear(hidden, d))

    def forward(self, hash_x: torch.Tensor) -> torch.Tensor:
        return self.net(hash_x)


class NodeFeatures(nn.Module):
    def __init__(self, cfg) -> None:
        super().__init__()
        d = cfg.d_model
        self.type_emb = nn.Embedding(cfg.n_types, d)
        self.hop_emb = nn.Embedding(HOP_BUCKETS, d)
        self.n_stats = cfg.n_stats
        self.stats = nn.Linear(cfg.n_stats, d)
        self.dhe = DeepHashEmbedding(cfg.pack.hash_count, cfg.dhe_hidden, d)
        self.knowledge = nn.Linear(cfg.pack.knowledge_dim, d)
        self.image = nn.Linear(cfg.pack.image_dim, d)
        self.rwse = nn.Linear(cfg.pack.rwse_steps, d)
        # world knowledge and images normalised on their own: at init the projection of a
        # unit MiniLM vector is ~30x smaller than a type embedding, and the text signal would
        # start buried under it. (The hash-id embedding is not: amplified, it pins a node to
        # its identity and its embedding stops following its neighbourhood.)
        self.knowledge_norm, self.image_norm = nn.LayerNorm(d), nn.LayerNorm(d)
        self.norm = nn.LayerNorm(d)

    def forward(self, b: PackedBatch, n: int | None = None) -> torch.Tensor:
        """-> (S, d) token embeddings, or the first `n` tokens' (n, d). The id-only parts (deep
        hash, knowledge, image) are computed once per distinct node of the batch and gathered
        to its tokens."""
        sl = slice(None, n)
        x = self.type_emb(b.type_ids[sl]) + self.hop_emb(b.hop[sl])
        x = x + self.stats(b.stats[sl, :self.n_stats])
        x = x + self.rwse(b.rwse[sl])
        node = b.token_node[sl]
        x = x + self.dhe(b.hash_x)[node] * b.frequent[sl, None]           # frequent ids only
        known = (self.knowledge_norm(self.knowledge(b.knowledge)) * b.has_knowledge[:, None]
                 + self.image_norm(self.image(b.image)) * b.has_image[:, None])
        return self.norm(x + known[node])
