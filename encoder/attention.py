"""Topology-aware attention: FlexAttention score/mask mods over packed views, and the dense
reference (materialised bias + SDPA) that must give the same output.

Each `generate_*` factory closes over small precomputed tensors (attention-gym style) and
returns a closure with the fixed signature; the closure only indexes and adds. Bias terms:
shortest-path distance, edge action, signed log edge weight, edge recency (from the per-view
flat tables of `encoder.batching`) and node-type transition (from token types). All are
learnable per head (`GraphBias`), so one set of weights serves every path:

- flex, compiled: CUDA (training and inference) and CPU inference;
- flex, eager: tests and environments without a compiler;
- dense per view: CPU training (this torch has no FlexAttention backward on CPU);
- dense packed S x S: reference for tests and the memory benchmark only.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from encoder.batching import PackedBatch, block_tables

torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)


class GraphBias(nn.Module):
    """Learnable per-head bias tables, shared by every attention path (one set of weights)."""

    def __init__(self, n_heads: int, n_spd: int, n_actions: int, recency_buckets: int,
                 n_types: int) -> None:
        super().__init__()
        self.n_types = n_types
        self.spd = nn.Parameter(torch.zeros(n_spd, n_heads))                 # (n_spd, H)
        self.action = nn.Parameter(torch.zeros(n_actions + 1, n_heads))      # 0 = no edge
        self.weight = nn.Parameter(torch.zeros(n_heads))                     # per unit log w
        self.recency = nn.Parameter(torch.zeros(recency_buckets + 1, n_heads))
        self.types = nn.Parameter(torch.zeros(n_types * n_types, n_heads))   # type(q) x type(kv)
        for p in (self.spd, self.action, self.recency, self.types):
            nn.init.normal_(p, std=0.02)


# -- masks -------------------------------------------------------------------------------
def generate_view_mask_mod(doc: torch.Tensor):
    """Tokens attend only inside their own view (padding forms a view of its own)."""
    def view_mask_mod(b, h, q_idx, kv_idx):
        return doc[q_idx] == doc[kv_idx]
    view_mask_mod.__name__ = "view_mask_mod"
    return view_mask_mod


def build_block_mask(batch: PackedBatch, device) -> BlockMask:
    """The view-diagonal BlockMask straight from the view offsets (no S x S evaluation)."""
    kv_num, kv_idx, full_num, full_idx = (torch.from_numpy(a).to(device)[None, None]
                                          for a in block_tables(batch))
    S = batch.seq_len
    return BlockMask.from_kv_blocks(kv_num, kv_idx, full_num, full_idx,
                                    BLOCK_SIZE=batch.block_size,
                                    mask_mod=generate_view_mask_mod(batch.doc.to(device)),
                                    seq_lengths=(S, S))


# -- score mods ----------------------------------------------------------------------------
def _pair_index(batch: PackedBatch):
    doc, base, n, local = batch.doc, batch.tok_base, batch.tok_n, batch.local

    def pair(q_idx, kv_idx):
        same = doc[q_idx] == doc[kv_idx]
        return torch.where(same, base[q_idx] + local[q_idx] * n[q_idx] + local[kv_idx], 0)
    return pair


def generate_spd_score_mod(batch: PackedBatch, table: torch.Tensor):
    pair, spd = _pair_index(batch), batch.spd

    def spd_score_mod(score, b, h, q_idx, kv_idx):
        return score + table[spd[pair(q_idx, kv_idx)], h]
    return spd_score_mod


def generate_edge_score_mod(batch: PackedBatch, action: torch.Tensor, weight: torch.Tensor,
                            recency: torch.Tensor):
    pair, et, ew, er = _pair_index(batch), batch.etype, batch.eweight, batch.erec

    def edge_score_mod(score, b, h, q_idx, kv_idx):
        i = pair(q_idx, kv_idx)
        return score + action[et[i], h] + ew[i] * weight[h] + recency[er[i], h]
    return edge_score_mod


def generate_type_score_mod(types: torch.Tensor, table: torch.Tensor, n_types: int):
    def type_score_mod(score, b, h, q_idx, kv_idx):
        return score + table[types[q_idx] * n_types + types[kv_idx], h]
    return type_score_mod


def compose_score_mods(*mods):
    """Apply score mods in turn (each adds its bias)."""
    def composed(score, b, h, q_idx, kv_idx):
        for m in mods:
            score = m(score, b, h, q_idx, kv_idx)
        return score
    composed.__name__ = "+".join(getattr(m, "__name__", "mod") for m in mods)
    return composed


def generate_graph_score_mod(batch: PackedBatch, bias: GraphBias):
    return compose_score_mods(
        generate_spd_score_mod(batch, bias.spd),
        generate_edge_score_mod(batch, bias.action, bias.weight, bias.recency),
        generate_type_score_mod(batch.type_ids, bias.types, bias.n_types))


# -- dense references ------------------------------------------------------------------------
def view_bias(batch: PackedBatch, bias: GraphBias, i: int) -> torch.Tensor:
    """(H, n, n) bias of view i, straight from its flat tables."""
    n = batch.view_sizes[i]
    t0 = int(batch.tok_base[batch.anchor_pos[i]])
    sl = slice(t0, t0 + n * n)
    ty = batch.type_ids[batch.anchor_pos[i]: batch.anchor_pos[i] + n]
    b = (bias.spd[batch.spd[sl]] + bias.action[batch.etype[sl]]
         + batch.eweight[sl][:, None] * bias.weight + bias.recency[batch.erec[sl]])
    b = b.view(n, n, -1) + bias.types[ty[:, None] * bias.n_types + ty[None, :]]
    return b.permute(2, 0, 1)


def dense_packed_bias(batch: PackedBatch, bias: GraphBias) -> torch.Tensor:
    """(H, S, S) materialised bias, -inf across views. Memory grows with S^2: reference only."""
    S, H = batch.seq_len, bias.weight.shape[0]
    full = torch.full((H, S, S), float("-inf"), dtype=bias.weight.dtype, device=batch.doc.device)
    for i, n in enumerate(batch.view_sizes):
        s0 = int(batch.anchor_pos[i])
        full[:, s0:s0 + n, s0:s0 + n] = view_bias(batch, bias, i)
    pad = slice(sum(batch.view_sizes), S)
    full[:, pad, pad] = 0.0                                  # padding attends to padding only
    return full


def attend_dense_packed(q, k, v, batch: PackedBatch, bias: GraphBias) -> torch.Tensor:
    """q, k, v (1, H, S, D) -> (1, H, S, D) with SDPA and the materialised bias."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=dense_packed_bias(batch, bias)[None])


@dataclass(frozen=True)
class DenseViewLayout:
    """What the per-view dense path needs of a batch, computed once per forward and shared by
    every layer (only the bias tables differ between layers): each view's tokens padded to
    the largest view, per pair one index into the joint (spd, action, recency, type pair)
    table and the edge weight, and the additive view mask."""
    tok: torch.Tensor           # (V, n) token index (padding slots point at token 0)
    valid: torch.Tensor         # (V, n) slot holds a real token
    joint: torch.Tensor         # (V, n, n) index into `joint_table`
    eweight: torch.Tensor       # (V, n, n) signed log edge weight
    mask: torch.Tensor          # (V, 1, n, n) 0 or -inf; padded query rows all 0 (no NaN)


def joint_table(bias: GraphBias) -> torch.Tensor:
    """(n_spd * n_action * n_recency * n_types^2, H): every combination of the four table
    terms, summed. A few hundred KB, so one gather per pair replaces four."""
    H = bias.weight.shape[0]
    return (bias.spd[:, None, None, None] + bias.action[None, :, None, None]
            + bias.recency[None, None, :, None] + bias.types[None, None, None, :]).reshape(-1, H)


def dense_view_layout(batch: PackedBatch, bias: GraphBias) -> DenseViewLayout:
    tok = batch.dense_tok
    valid = tok >= 0
    t = tok.clamp(min=0)
    n = t.shape[1]
    q, kv = t[:, :, None].expand(-1, -1, n), t[:, None, :].expand(-1, n, -1)
    same = batch.doc[q] == batch.doc[kv]
    i = torch.where(same, batch.tok_base[q] + batch.local[q] * batch.tok_n[q] + batch.local[kv], 0)
    ty = batch.type_ids[t]
    n_act, n_rec, n_tt = bias.action.shape[0], bias.recency.shape[0], bias.types.shape[0]
    joint = ((batch.spd[i] * n_act + batch.etype[i]) * n_rec + batch.erec[i]) * n_tt \
        + ty[:, :, None] * bias.n_types + ty[:, None, :]
    pair_ok = valid[:, :, None] & valid[:, None, :]
    mask = torch.zeros(pair_ok.shape, dtype=batch.eweight.dtype, device=t.device)
    mask = mask.masked_fill(~pair_ok & valid[:, :, None], float("-inf"))[:, None]
    return DenseViewLayout(tok=t, valid=valid, joint=joint, eweight=batch.eweight[i], mask=mask)


def attend_dense_per_view(q, k, v, batch: PackedBatch, bias: GraphBias,
                          layout: DenseViewLayout | None = None) -> torch.Tensor:
    """The same attention computed view by view, padded to the largest view: (V, H, n, n)
    biases only, with a backward on every device (the CPU training path)."""
    lay = layout if layout is not None else dense_view_layout(batch, bias)
    V, n = lay.tok.shape
    flat = lay.tok.reshape(-1)
    qv, kv_, vv = (x[0].index_select(1, flat).unflatten(1, (V, n)).transpose(0, 1)
                   for x in (q, k, v))                                  # (V, H, n, D)
    b = F.embedding(lay.joint, joint_table(bias)) + lay.eweight[..., None] * bias.weight
    out = F.scaled_dot_product_attention(qv, kv_, vv, attn_mask=b.permute(0, 3, 1, 2) + lay.mask)
    full = torch.zeros_like(q[0]).transpose(0, 1)             # (S, H, D)
    full = full.index_put((batch.dense_tok[lay.valid],), out.transpose(1, 2)[lay.valid])
    return full.transpose(0, 1)[None]


@functools.lru_cache(maxsize=1)
def compiled_flex():
    return torch.compile(flex_attention, dynamic=False)


def attend_flex(q, k, v, batch: PackedBatch, bias: GraphBias, block_mask: BlockMask,
                compiled: bool = True) -> torch.Tensor:
    fn = compiled_flex() if compiled else flex_attention
    return fn(q, k, v, score_mod=generate_graph_score_mod(batch, bias), block_mask=block_mask)


FLEX_CPU_MIN_VIEW = 64   # below this view size the per-view dense path is faster on CPU


def choose_backend(device: torch.device, training: bool, compile_ok: bool = True,
                   max_view: int = 128) -> str:
    """flex_compiled on CUDA always; on CPU, dense_per_view for training (no FlexAttention
    backward on CPU in this torch) and for inference on small views: with views of 8-16
    nodes, 128-token tiles are mostly masked and compiled flex took 233 ms per layer at 8k
    tokens where per-view SDPA took 33 ms (measured here); flex_compiled for larger views."""
    if device.type == "cuda":
        return "flex_compiled" if compile_ok else "flex_eager"
    if training or max_view < FLEX_CPU_MIN_VIEW:
        return "dense_per_view"
    return "flex_compiled" if compile_ok else "flex_eager"
