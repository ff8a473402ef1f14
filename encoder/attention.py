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

import enum
import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from hirflow.encoder.batching import PackedBatch, block_tables


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


CPU_FLEX_BLOCK = 32   # tile on CPU: views of 16-128 nodes waste most of a 128-token tile there


def flex_block_size(batch: PackedBatch, device) -> int:
    """The batch's tile (128) on CUDA; on CPU 32, where the compiled kernel's cost follows
    the scores it computes, so smaller tiles waste less on the padding around small views
    (`bench/attention.py` measures it)."""
    if torch.device(device).type == "cuda":
        return batch.block_size
    return min(batch.block_size, CPU_FLEX_BLOCK)


def build_block_mask(batch: PackedBatch, device) -> BlockMask:
    """The view-diagonal BlockMask straight from the view offsets (no S x S evaluation)."""
    block = flex_block_size(batch, device)
    kv_num, kv_idx, full_num, full_idx = (torch.from_numpy(a).to(device)[None, None]
                                          for a in block_tables(batch, block))
    S = batch.seq_len
    return BlockMask.from_kv_blocks(kv_num, kv_idx, full_num, full_idx,
                                    BLOCK_SIZE=block,
                                    mask_mod=generate_view_mask_mod(batch.doc.to(device)),
                                    seq_lengths=(S, S),
                                    # the q-side tables serve the backward only (an argsort
                                    # over nb x nb tiles: 14 ms at 16k tokens here)
                                    compute_q_blocks=torch.is_grad_enabled())


# -- score mods ----------------------------------------------------------------------------
@dataclass(frozen=True)
class PairLayout:
    """What the flex path needs of a batch, computed once per forward and shared by every
    layer: per query token where its view's pair rows start, per key token its index inside
    its view, and per entry of the flat per-view tables (T,) the joint (spd, action, recency,
    type pair) code and the edge weight. A layer turns these into its (H, T) pair bias, so
    the score mod does one gather per score instead of one per term."""
    row: torch.Tensor           # (S,) int64 tok_base + local * n (padding: 0)
    col: torch.Tensor           # (S,) int64 local index (padding: 0)
    joint: torch.Tensor         # (T,) int32 index into `joint_table`
    eweight: torch.Tensor       # (T,) float signed log edge weight


def pair_layout(batch: PackedBatch, bias: GraphBias) -> PairLayout:
    n_act, n_rec, n_tt = bias.action.shape[0], bias.recency.shape[0], bias.types.shape[0]
    joint = batch.spd.to(torch.int32, copy=True)     # in place: T is ~1.4M at 16k tokens
    joint.mul_(n_act).add_(batch.etype).mul_(n_rec).add_(batch.erec).mul_(n_tt)
    joint.add_(batch.type_q, alpha=bias.n_types).add_(batch.type_k)
    return PairLayout(row=batch.tok_base + batch.local * batch.tok_n, col=batch.local,
                      joint=joint, eweight=batch.eweight)


def pair_bias(lay: PairLayout, bias: GraphBias) -> torch.Tensor:
    """(H, T) every bias term of every table entry, summed: the layer's small per-view
    tables, never the packed S x S bias."""
    per_code = joint_table(bias).T.contiguous()                       # (H, n_codes)
    # in place on index_select's own output: its backward needs neither tensor's old values
    return per_code.index_select(1, lay.joint).addcmul_(bias.weight[:, None], lay.eweight[None])


def generate_pair_bias_score_mod(row: torch.Tensor, col: torch.Tensor, table: torch.Tensor):
    """Adds table[h, row[q] + col[kv]]. A pair across views reads some other entry (clamped
    into the table), which the view mask discards."""
    last = table.shape[1] - 1

    def pair_bias_score_mod(score, b, h, q_idx, kv_idx):
        return score + table[h, torch.clamp(row[q_idx] + col[kv_idx], max=last)]
    return pair_bias_score_mod


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
    pairs = pair_layout(batch, bias)
    same = batch.doc[q] == batch.doc[kv]
    i = torch.where(same, pairs.row[q] + pairs.col[kv], 0)     # padding slots: masked below
    pair_ok = valid[:, :, None] & valid[:, None, :]
    mask = torch.zeros(pair_ok.shape, dtype=batch.eweight.dtype, device=t.device)
    mask = mask.masked_fill(~pair_ok & valid[:, :, None], float("-inf"))[:, None]
    return DenseViewLayout(tok=t, valid=valid, joint=pairs.joint[i], eweight=batch.eweight[i],
                           mask=mask)


def attend_dense_per_view(q, k, v, batch: PackedBatch, bias: GraphBias,
                          layout: DenseViewLayout | None = None,
                          anchors_only: bool = False) -> torch.Tensor:
    """The same attention computed view by view, padded to the largest view: (V, H, n, n)
    biases only, with a backward on every device (the CPU training path). `anchors_only`:
    only each view's anchor (its first slot) queries, -> (1, H, V, D) in view order."""
    lay = layout if layout is not None else dense_view_layout(batch, bias)
    V, n = lay.tok.shape
    rows = 1 if anchors_only else n
    flat = lay.tok.reshape(-1)
    kv_, vv = (x[0].index_select(1, flat).unflatten(1, (V, n)).transpose(0, 1)
               for x in (k, v))                                        # (V, H, n, D)
    qv = q[0].index_select(1, lay.tok[:, :rows].reshape(-1)).unflatten(1, (V, rows)).transpose(0, 1)
    joint, eweight = lay.joint[:, :rows], lay.eweight[:, :rows]
    b = F.embedding(joint, joint_table(bias)) + eweight[..., None] * bias.weight
    out = F.scaled_dot_product_attention(qv, kv_, vv,
                                         attn_mask=b.permute(0, 3, 1, 2) + lay.mask[:, :, :rows])
    if anchors_only:
        return out[:, :, 0].transpose(0, 1)[None]              # (1, H, V, D)
    full = torch.zeros_like(q[0]).transpose(0, 1)             # (S, H, D)
    full = full.index_put((batch.dense_tok[lay.valid],), out.transpose(1, 2)[lay.valid])
    return full.transpose(0, 1)[None]


@functools.lru_cache(maxsize=1)
def compiled_flex():
    """The compiled FlexAttention kernel, built on first use. Each shape bucket is its own
    compiled graph: the recompile cap is raised to 64 so that every bucket stays compiled
    (at the default 8, later buckets would fall back to the slow eager path)."""
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    return torch.compile(flex_attention, dynamic=False)


def attend_flex(q, k, v, batch: PackedBatch, bias: GraphBias, block_mask: BlockMask,
                compiled: bool = True, pairs: PairLayout | None = None) -> torch.Tensor:
    """`pairs`: the batch's PairLayout, shared by the layers of one forward (built if None)."""
    lay = pairs if pairs is not None else pair_layout(batch, bias)
    fn = compiled_flex() if compiled else flex_attention
    mod = generate_pair_bias_score_mod(lay.row, lay.col, pair_bias(lay, bias))
    return fn(q, k, v, score_mod=mod, block_mask=block_mask)


FLEX_CPU_MIN_VIEW = 32   # below this view size the per-view dense path is faster on CPU


class Backend(str, enum.Enum):
    """How a block attends. All give the same embeddings (tests/encoder/test_model.py)."""
    FLEX_COMPILED = "flex_compiled"     # FlexAttention, compiled kernels (bucketed shapes)
    FLEX_EAGER = "flex_eager"           # FlexAttention without compilation
    DENSE_PER_VIEW = "dense_per_view"   # one dense attention per view, real tokens only
    DENSE_PACKED = "dense_packed"       # one dense S x S attention with a mask (reference)

    @property
    def is_flex(self) -> bool:
        return self in (Backend.FLEX_COMPILED, Backend.FLEX_EAGER)


def choose_backend(device: torch.device, training: bool, compile_ok: bool = True,
                   max_view: int = 128) -> Backend:
    """flex_compiled on CUDA always; on CPU, dense_per_view for training (no FlexAttention
    backward on CPU in this torch) and for inference on views below `FLEX_CPU_MIN_VIEW`
    nodes, where the per-view dense path is faster (`bench/attention.py` compares them)."""
    flex = Backend.FLEX_COMPILED if compile_ok else Backend.FLEX_EAGER
    if device.type == "cuda":
        return flex
    if training or max_view < FLEX_CPU_MIN_VIEW:
        return Backend.DENSE_PER_VIEW
    return flex
