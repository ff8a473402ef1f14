"""Packing sampled views into one block-masked sequence with small per-view tables.

Views of different sizes are laid end to end (no attention across views, no padding except
at the end, up to a length bucket so compiled kernels are reused). Graph structure travels as
small per-view n x n tables in flat buffers (shortest-path distance, edge action, signed log
weight, recency bucket); a token finds its pair's entry at ``base[view] + i * n + j``. So the
packed S x S bias is never materialised on the flex path. Positional encodings: random-walk
return probabilities (RWSE) and the hop from the anchor. The block mask is built straight
from the view offsets (`BlockMask.from_kv_blocks`), not by evaluating a mask over S x S.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Mapping, Sequence

import numpy as np
import torch

from hirflow.state.views import FREQUENT_STAT, N_STATS, View

SEQ_BUCKETS = (128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
HOP_BUCKETS = 16    # hop embeddings: 0..14 exact, 15 = "15 hops or more" (views store up to
                    # `state.views.MAX_HOP`)
_P = (1 << 31) - 1


@dataclass(frozen=True)
class PackConfig:
    block_size: int = 128           # FlexAttention tile on CUDA; sequence buckets are multiples of it
    max_spd: int = 6                # distances above are "far"; one more index = unreachable
    rwse_steps: int = 8             # k-step return probabilities as positional encoding
    recency_buckets: int = 12       # log2(1 + hours) buckets of an edge's age
    hash_count: int = 32            # k independent hashes of the node id (deep hash embedding)
    hash_buckets: int = 1_000_003
    hash_seed: int = 20211104       # fixed: hashes must mean the same in every process
    knowledge_dim: int = 384        # MiniLM sentence vectors
    image_dim: int = 64             # image embeddings are cut or zero-padded to this
    seq_buckets: tuple[int, ...] = SEQ_BUCKETS

    @property
    def n_spd(self) -> int:
        return self.max_spd + 2


@lru_cache(maxsize=1 << 20)
def _id_words(node_id: str) -> tuple[int, int]:
    d = hashlib.blake2b(node_id.encode(), digest_size=8).digest()
    return int.from_bytes(d[:4], "little") & 0x7FFFFFFF, int.from_bytes(d[4:], "little") & 0x7FFFFFFF


@lru_cache(maxsize=8)
def _hash_params(k: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(1, _P, size=(3, k), dtype=np.uint64)


def hash_features(node_ids: Sequence[str], cfg: PackConfig) -> np.ndarray:
    """(n, k) float32 in [-1, 1]: k universal hashes of each id, for the deep hash embedding
    (Kang et al. 2021). Parameter memory does not depend on how many ids exist."""
    a, b, c = _hash_params(cfg.hash_count, cfg.hash_seed)
    x = np.array([_id_words(n) for n in node_ids], np.uint64).reshape(-1, 2)
    h = ((a[None] * x[:, :1] % _P + b[None] * x[:, 1:] % _P + c[None]) % _P) % cfg.hash_buckets
    return (h.astype(np.float64) / (cfg.hash_buckets - 1) * 2.0 - 1.0).astype(np.float32)


def bucket_length(n: int, buckets: Sequence[int]) -> int:
    for b in buckets:
        if n <= b:
            return b
    raise ValueError(f"{n} tokens exceed the largest sequence bucket {buckets[-1]}")


def adjacency(views: Sequence[View], n_max: int) -> torch.Tensor:
    """(V, n_max, n_max) float32 undirected 0/1 adjacency of every view, in one scatter."""
    a = torch.zeros((len(views), n_max, n_max))
    vi = torch.from_numpy(np.repeat(np.arange(len(views), dtype=np.int64), [len(v.edge_src) for v in views]))
    src = torch.from_numpy(np.concatenate([v.edge_src for v in views]).astype(np.int64))
    dst = torch.from_numpy(np.concatenate([v.edge_dst for v in views]).astype(np.int64))
    a[vi, src, dst] = 1.0
    a[vi, dst, src] = 1.0
    return a


def shortest_paths_batched(a: torch.Tensor, max_spd: int) -> np.ndarray:
    """(V, n, n) int8 hop distances by BFS as batched matmuls (torch: threaded BLAS, which
    numpy's stacked matmul is not); max_spd + 1 = unreachable/far."""
    V, n, _ = a.shape
    dist = torch.full((V, n, n), max_spd + 1, dtype=torch.int8)
    eye = torch.eye(n, dtype=torch.bool).expand(V, n, n)
    dist.masked_fill_(eye, 0)
    reach, seen = eye.float(), eye.clone()
    for d in range(1, max_spd + 1):
        hit = torch.bmm(reach, a) > 0
        new = hit & ~seen
        if not new.any():
            break
        dist.masked_fill_(new, d)
        seen |= new
        reach = hit.float()
    return dist.numpy()


def shortest_paths(n: int, src: np.ndarray, dst: np.ndarray, max_spd: int) -> np.ndarray:
    """(n, n) int64 hop distances on the undirected view graph; max_spd + 1 = unreachable/far."""
    a = torch.zeros((1, n, n))
    a[0, torch.from_numpy(np.asarray(src, np.int64)), torch.from_numpy(np.asarray(dst, np.int64))] = 1.0
    a[0, torch.from_numpy(np.asarray(dst, np.int64)), torch.from_numpy(np.asarray(src, np.int64))] = 1.0
    return shortest_paths_batched(a, max_spd)[0].astype(np.int64)


def rwse_batched(a: torch.Tensor, steps: int) -> np.ndarray:
    """(V, n, steps): probability that a k-step random walk returns to its start."""
    deg = a.sum(-1, keepdim=True)
    p = a / deg.clamp_min(1.0)                  # rows of isolated nodes stay zero
    out = torch.zeros(a.shape[:2] + (steps,))
    m = p
    for k in range(steps):
        out[:, :, k] = m.diagonal(dim1=1, dim2=2)
        if k + 1 < steps:
            m = torch.bmm(m, p)
    return out.numpy()


def _winner_per_key(key: np.ndarray, value: np.ndarray, size: int) -> np.ndarray:
    """Per distinct key, the index of the element with the largest value, the last such one
    on ties: "written last wins" without a sort and without relying on the unspecified order
    of a fancy-index assignment with repeated indices."""
    best = np.full(size, -np.inf, value.dtype)
    np.maximum.at(best, key, value)
    win = np.flatnonzero(value == best[key])
    last = np.full(size, -1, np.int64)
    np.maximum.at(last, key[win], win)
    return last[last >= 0]


def edge_tables_batched(views: Sequence[View], n_max: int, cfg: PackConfig):
    """(V, n_max, n_max) tables per pair, either direction: action of the heaviest edge (+1;
    0 = none), its signed log1p weight, and the recency bucket of the most recent edge (+1;
    0 = none). All views in one pass: a scatter-max per table, no per-view loop or sort."""
    V = len(views)
    etype = np.zeros(V * n_max * n_max, np.int64)
    eweight = np.zeros(V * n_max * n_max, np.float32)
    erec = np.zeros(V * n_max * n_max, np.int64)
    counts = [len(v.edge_src) for v in views]
    if sum(counts):
        vi = np.repeat(np.arange(V, dtype=np.int64), counts)
        s = np.concatenate([v.edge_src for v in views]).astype(np.int64)
        d = np.concatenate([v.edge_dst for v in views]).astype(np.int64)
        w = np.concatenate([v.edge_weight for v in views])
        act = np.concatenate([v.edge_action for v in views]).astype(np.int64) + 1
        age = np.concatenate([v.edge_age for v in views])
        base = vi * n_max * n_max
        key = np.concatenate([base + s * n_max + d, base + d * n_max + s])   # both directions
        w2, act2, age2 = np.tile(w, 2), np.tile(act, 2), np.tile(age, 2)
        size = V * n_max * n_max
        heavy = _winner_per_key(key, np.abs(w2), size)                        # heaviest edge
        etype[key[heavy]] = act2[heavy]
        eweight[key[heavy]] = np.sign(w2[heavy]) * np.log1p(np.abs(w2[heavy]))
        recent = _winner_per_key(key, -age2, size)                            # most recent edge
        bucket = np.clip(np.floor(np.log2(1.0 + age2[recent] / 3600.0)), 0, cfg.recency_buckets - 1)
        erec[key[recent]] = bucket.astype(np.int64) + 1
    shape = (V, n_max, n_max)
    return etype.reshape(shape), eweight.reshape(shape), erec.reshape(shape)


@dataclass
class PackedBatch:
    """Tensors for one forward pass. S = bucketed total tokens, V = views, T = table entries.

    doc (S,) int64 view of each token (V for padding); local (S,) index inside its view;
    tok_base (S,) int64 where its view's tables start; tok_n (S,) its view's size;
    anchor_pos (V,) token of each anchor; type_ids, hop (S,) int64; stats (S, N_STATS);
    rwse (S, steps); frequent (S,) bool; tables spd/etype/erec (T,) int32, eweight (T,) float,
    type_q/type_k (T,) int32 node types of the pair (the node-type transition table).
    What depends on the node id alone is stored once per distinct node (U of them; views of
    one batch share many nodes) and found through token_node (S,) (padding -> 0):
    hash_x (U, k); knowledge (U, Dk) + has_knowledge (U,); image (U, Di) + has_image (U,).
    Dense per-view layout: dense_tok (V, n_max) token index or -1.
    """
    doc: torch.Tensor
    local: torch.Tensor
    tok_base: torch.Tensor
    tok_n: torch.Tensor
    anchor_pos: torch.Tensor
    type_ids: torch.Tensor
    hop: torch.Tensor
    stats: torch.Tensor
    token_node: torch.Tensor
    hash_x: torch.Tensor
    rwse: torch.Tensor
    knowledge: torch.Tensor
    has_knowledge: torch.Tensor
    image: torch.Tensor
    has_image: torch.Tensor
    frequent: torch.Tensor
    spd: torch.Tensor
    etype: torch.Tensor
    eweight: torch.Tensor
    erec: torch.Tensor
    type_q: torch.Tensor
    type_k: torch.Tensor
    dense_tok: torch.Tensor
    view_sizes: list[int] = field(default_factory=list)
    block_size: int = 128

    @property
    def seq_len(self) -> int:
        return int(self.doc.shape[0])

    @property
    def n_views(self) -> int:
        return len(self.view_sizes)

    def to(self, device) -> "PackedBatch":
        """The batch on `device`. To a GPU through page-locked memory: the copies then run
        asynchronously (one synchronisation when the results come back) instead of staging
        each tensor through a pageable buffer."""
        device = torch.device(device)
        pin = device.type == "cuda"

        def moved(v: torch.Tensor) -> torch.Tensor:
            if pin and v.device.type == "cpu":
                v = v.pin_memory()
            return v.to(device, non_blocking=True)
        return PackedBatch(**{k: moved(v) if isinstance(v, torch.Tensor) else v
                              for k, v in self.__dict__.items()})

    @classmethod
    def from_arrays(cls, arrays: Mapping) -> "PackedBatch":
        """Tensors over `pack_arrays`'s numpy arrays (no copy)."""
        return cls(**{k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v
                      for k, v in arrays.items()})


def pack(views: Sequence[View], cfg: PackConfig,
         knowledge: Mapping[str, np.ndarray] | None = None,
         images: Mapping[str, np.ndarray] | None = None) -> PackedBatch:
    """Pack views (CPU, numpy) into tensors; `knowledge`/`images` map node id -> vector."""
    return PackedBatch.from_arrays(pack_arrays(views, cfg, knowledge, images))


@dataclass(frozen=True)
class Packer:
    """`pack_arrays` with a config, picklable: a worker's view-sampling process packs the
    views it sampled (`state.view_source`), and sends numpy arrays (unpickled in 0.6 ms
    for 400 views, against 7 ms as tensors)."""
    cfg: PackConfig

    def __call__(self, views: Sequence[View], knowledge: Mapping[str, np.ndarray] | None):
        return self.cfg, pack_arrays(views, self.cfg, knowledge)


def pack_arrays(views: Sequence[View], cfg: PackConfig,
                knowledge: Mapping[str, np.ndarray] | None = None,
                images: Mapping[str, np.ndarray] | None = None) -> dict:
    """`PackedBatch`'s fields as numpy arrays (plus view sizes and block size)."""
    if not views:
        raise ValueError("pack needs at least one view")
    sizes = [v.size for v in views]
    total = sum(sizes)
    S = bucket_length(total, cfg.seq_buckets)
    V = len(views)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    tbl_sizes = np.array(sizes, np.int64) ** 2
    tbl_starts = np.concatenate([[0], np.cumsum(tbl_sizes)[:-1]]).astype(np.int64)
    T = max(1024, 1 << int(np.ceil(np.log2(max(1, tbl_sizes.sum())))))   # pow2 bucket

    n_max = max(sizes)
    size_arr = np.asarray(sizes, np.int64)
    vid = np.repeat(np.arange(V, dtype=np.int64), size_arr)          # view of each token
    loc = np.arange(total, dtype=np.int64) - starts[vid]             # index inside its view
    doc = np.full(S, V, np.int64)
    local = np.zeros(S, np.int64)
    tok_base = np.zeros(S, np.int64)
    tok_n = np.ones(S, np.int64)
    doc[:total], local[:total] = vid, loc
    tok_base[:total], tok_n[:total] = tbl_starts[vid], size_arr[vid]
    type_ids = np.zeros(S, np.int64)
    hop = np.zeros(S, np.int64)
    stats = np.zeros((S, N_STATS), np.float32)
    type_ids[:total] = np.concatenate([v.types for v in views])
    hop[:total] = np.concatenate([v.hop for v in views])
    stats[:total] = np.concatenate([v.stats for v in views])
    dense_tok = np.full((V, n_max), -1, np.int64)
    dense_tok[vid, loc] = np.arange(total)
    adj = adjacency(views, n_max)
    rw = np.zeros((S, cfg.rwse_steps), np.float32)
    rw[:total] = rwse_batched(adj, cfg.rwse_steps)[vid, loc]
    spd, etype, eweight, erec = _pair_tables(views, adj, cfg, sizes, tbl_starts, T)
    # tables are n x n row-major per view: an entry's query token is the token repeated n
    # times, its key the view's first token + the entry's offset in that row
    P = int(tbl_sizes.sum())
    q_tok = np.repeat(np.arange(total, dtype=np.int64), size_arr[vid])
    k_tok = q_tok - loc[q_tok] + (np.arange(P, dtype=np.int64) - (tok_base + local * tok_n)[q_tok])
    type_q, type_k = np.zeros(T, np.int32), np.zeros(T, np.int32)
    type_q[:P], type_k[:P] = type_ids[q_tok], type_ids[k_tok]
    return dict(
        doc=doc, local=local, tok_base=tok_base, tok_n=tok_n,
        anchor_pos=starts.copy(), type_ids=type_ids, hop=np.minimum(hop, HOP_BUCKETS - 1),
        stats=stats, rwse=rw, frequent=stats[:, FREQUENT_STAT] > 0.5,
        spd=spd, etype=etype, eweight=eweight, erec=erec,
        type_q=type_q, type_k=type_k, dense_tok=dense_tok,
        view_sizes=list(sizes), block_size=cfg.block_size,
        **_node_features(views, cfg, S, knowledge, images))


def _pair_tables(views: Sequence[View], adj: torch.Tensor, cfg: PackConfig, sizes: list[int],
                 tbl_starts: np.ndarray, T: int) -> tuple[np.ndarray, ...]:
    """The n x n tables of every view (shortest paths, edge type, weight and recency), each
    view's row-major at its offset of one flat array of `T` entries."""
    n_max = adj.shape[1]
    spd = np.zeros(T, np.int32)              # int32: T is ~1.4M entries at 16k tokens
    etype = np.zeros(T, np.int32)
    eweight = np.zeros(T, np.float32)
    erec = np.zeros(T, np.int32)
    tables = (shortest_paths_batched(adj, cfg.max_spd),) + edge_tables_batched(views, n_max, cfg)
    for out, full in zip((spd, etype, eweight, erec), tables):
        for i, n in enumerate(sizes):              # contiguous copies: cheaper than a gather
            out[tbl_starts[i]:tbl_starts[i] + n * n] = full[i, :n, :n].ravel()
    return spd, etype, eweight, erec


def _node_features(views: Sequence[View], cfg: PackConfig, S: int,
                   knowledge: Mapping[str, np.ndarray] | None,
                   images: Mapping[str, np.ndarray] | None) -> dict:
    """Per distinct node of the batch (views share many): hash features, world-knowledge and
    image vectors with their presence flags; per token, its node's row (`token_node`)."""
    ids = [n for v in views for n in v.nodes]
    uniq = {n: j for j, n in enumerate(dict.fromkeys(ids))}
    token_node = np.zeros(S, np.int64)
    token_node[:len(ids)] = np.fromiter((uniq[n] for n in ids), np.int64, len(ids))
    names = list(uniq)
    U = len(names)
    kn, has_kn = np.zeros((U, cfg.knowledge_dim), np.float32), np.zeros(U, bool)
    im, has_im = np.zeros((U, cfg.image_dim), np.float32), np.zeros(U, bool)
    for vecs, out, has, dim in ((knowledge, kn, has_kn, cfg.knowledge_dim),
                                (images, im, has_im, cfg.image_dim)):
        if not vecs:
            continue
        for j, n in enumerate(names):
            if (vec := vecs.get(n)) is not None:
                vec = np.asarray(vec, np.float32)[:dim]
                out[j, :len(vec)] = vec
                has[j] = True
    return dict(token_node=token_node, hash_x=hash_features(names, cfg), knowledge=kn,
                has_knowledge=has_kn, image=im, has_image=has_im)


def block_tables(batch: PackedBatch, block_size: int | None = None) -> tuple[np.ndarray, ...]:
    """kv block tables of the view-diagonal mask, from the view offsets alone.

    Returns (kv_num, kv_idx, full_num, full_idx): per q tile, the partial tiles (mask needed)
    and the full tiles (q and kv tile both inside one view) it attends to. Shapes are fixed per
    sequence bucket (nb and nb x nb), so compiled kernels see the same shapes every batch.
    """
    S, B = batch.seq_len, block_size or batch.block_size
    if S % B:
        raise ValueError(f"block size {B} does not divide the sequence length {S}")
    nb = S // B
    sizes = np.array(batch.view_sizes + [S - sum(batch.view_sizes)], np.int64)
    sizes = sizes[sizes > 0]
    ends = np.cumsum(sizes)
    starts = ends - sizes
    doc = np.repeat(np.arange(len(sizes)), sizes)                       # padding = last "view"
    tile0 = np.arange(nb) * B
    d_first, d_last = doc[tile0], doc[tile0 + B - 1]
    lo = starts[d_first] // B
    hi = (ends[d_last] - 1) // B
    W = int((hi - lo).max()) + 1                    # most kv tiles one q tile can touch
    cand = lo[:, None] + np.arange(W)[None, :]
    valid = cand <= hi[:, None]
    cand = np.minimum(cand, nb - 1)
    single_q = d_first == d_last
    kv_single = doc[cand * B] == doc[cand * B + B - 1]
    full = valid & single_q[:, None] & kv_single & (doc[cand * B] == d_first[:, None])
    part = valid & ~full

    def compact(sel: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        order = np.argsort(~sel, axis=1, kind="stable")
        idx = np.zeros((nb, nb), np.int32)          # fixed shape per bucket
        idx[:, :W] = np.take_along_axis(cand, order, axis=1)
        return sel.sum(1).astype(np.int32), idx

    kv_num, kv_idx = compact(part)
    full_num, full_idx = compact(full)
    return kv_num, kv_idx, full_num, full_idx
