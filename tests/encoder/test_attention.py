"""Flex vs dense: the same attention on every path, per bias term; no cross-view leakage."""
import warnings

import networkx as nx
import numpy as np
import pytest
import torch

from hirflow.encoder import attention as A
from hirflow.encoder.batching import PackConfig, block_tables, pack, shortest_paths
from testkit.random_views import random_view, random_views

warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")
H, D = 4, 16
TERMS = ("spd", "action", "weight", "recency", "types")


def qkv(S, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, H, S, D, generator=g) for _ in range(3)]


def bias_with(term: str | None, cfg: PackConfig, seed=1) -> A.GraphBias:
    """Random values in one term (or all when None), zeros elsewhere."""
    torch.manual_seed(seed)
    b = A.GraphBias(H, cfg.n_spd, 9, cfg.recency_buckets, 6)
    with torch.no_grad():
        for name, p in b.named_parameters():
            p.copy_(torch.randn_like(p) if term in (None, name) else torch.zeros_like(p))
    return b


@pytest.mark.parametrize("term", TERMS + (None,))
def test_flex_eager_equals_dense_for_each_bias_term(term):
    cfg = PackConfig()
    batch = pack(random_views(3, 12), cfg)
    b = bias_with(term, cfg)
    q, k, v = qkv(batch.seq_len)
    with torch.no_grad():
        ref = A.attend_dense_packed(q, k, v, batch, b)
        flex = A.attend_flex(q, k, v, batch, b, A.build_block_mask(batch, "cpu"), compiled=False)
        per_view = A.attend_dense_per_view(q, k, v, batch, b)
    real = batch.doc < batch.n_views
    assert torch.allclose(flex[..., real, :], ref[..., real, :], atol=1e-5, rtol=0)
    assert torch.allclose(per_view[..., real, :], ref[..., real, :], atol=1e-5, rtol=0)


def test_flex_compiled_equals_dense():
    cfg = PackConfig()
    batch = pack(random_views(4, 10), cfg)
    b = bias_with(None, cfg)
    q, k, v = qkv(batch.seq_len)
    with torch.no_grad():
        ref = A.attend_dense_packed(q, k, v, batch, b)
        out = A.attend_flex(q, k, v, batch, b, A.build_block_mask(batch, "cpu"), compiled=True)
    real = batch.doc < batch.n_views
    assert torch.allclose(out[..., real, :], ref[..., real, :], atol=1e-5, rtol=0)


def test_dense_per_view_gradients_equal_dense_packed():
    """The CPU training path has the reference's gradients (flex backward: CUDA only)."""
    cfg = PackConfig()
    batch = pack(random_views(5, 8), cfg)
    real = batch.doc < batch.n_views
    grads = []
    for fn in (A.attend_dense_packed, A.attend_dense_per_view):
        b = bias_with(None, cfg)
        q, k, v = (x.requires_grad_() for x in qkv(batch.seq_len))
        fn(q, k, v, batch, b)[..., real, :].pow(2).sum().backward()
        grads.append([q.grad, k.grad, v.grad] + [p.grad for p in b.parameters()])
    for a, c in zip(*grads):
        assert torch.allclose(a, c, atol=1e-4, rtol=1e-4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="FlexAttention backward needs CUDA here")
def test_flex_gradients_equal_dense_on_cuda():
    cfg = PackConfig()
    batch = pack(random_views(6, 8), cfg).to("cuda")
    real = batch.doc < batch.n_views
    grads = []
    for flex in (False, True):
        b = bias_with(None, cfg).cuda()
        q, k, v = (x.cuda().requires_grad_() for x in qkv(batch.seq_len))
        out = (A.attend_flex(q, k, v, batch, b, A.build_block_mask(batch, "cuda")) if flex
               else A.attend_dense_packed(q, k, v, batch, b))
        out[..., real, :].pow(2).sum().backward()
        grads.append([q.grad, k.grad, v.grad] + [p.grad for p in b.parameters()])
    for a, c in zip(*grads):
        assert torch.allclose(a, c, atol=1e-3, rtol=1e-3)


def test_no_cross_view_leakage():
    """Changing one view leaves every other view's output bit-identical."""
    cfg = PackConfig()
    views = random_views(7, 9)
    changed = list(views)
    changed[4] = random_view(np.random.default_rng(99), views[4].size, prefix="other")
    b = bias_with(None, cfg)
    outs = []
    for vs in (views, changed):
        batch = pack(vs, cfg)
        q, k, v = qkv(batch.seq_len)
        g = torch.Generator().manual_seed(5)
        q[..., batch.doc == 4, :] = torch.randn(1, H, int((batch.doc == 4).sum()), D, generator=g)
        with torch.no_grad():
            outs.append((batch, A.attend_flex(q, k, v, batch, b, A.build_block_mask(batch, "cpu"),
                                              compiled=False)))
    (b0, o0), (b1, o1) = outs
    other = (b0.doc != 4) & (b0.doc < b0.n_views)
    assert torch.equal(o0[..., other, :], o1[..., other, :])


@pytest.mark.parametrize("B", [128, 32])
def test_block_tables_cover_exactly_the_view_diagonal(B):
    cfg = PackConfig()
    batch = pack(random_views(8, 30, 20, 120), cfg)
    kv_num, kv_idx, full_num, full_idx = block_tables(batch, B)
    S = batch.seq_len
    nb = S // B
    doc = batch.doc.numpy()
    need = np.zeros((nb, nb), bool)
    same = doc[:, None] == doc[None, :]
    for i in range(nb):
        for j in range(nb):
            need[i, j] = same[i * B:(i + 1) * B, j * B:(j + 1) * B].any()
    got = np.zeros((nb, nb), bool)
    for i in range(nb):
        got[i, kv_idx[i, :kv_num[i]]] = True
        for j in full_idx[i, :full_num[i]]:
            assert same[i * B:(i + 1) * B, j * B:(j + 1) * B].all()    # full tiles need no mask
            got[i, j] = True
    assert (got == need).all()


@pytest.mark.parametrize("seed", range(5))
def test_shortest_paths_equal_networkx(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(5, 60))
    e = int(rng.integers(n // 2, 3 * n))
    src, dst = rng.integers(0, n, e), rng.integers(0, n, e)
    g = nx.Graph()
    g.add_nodes_from(range(n))
    g.add_edges_from(zip(src.tolist(), dst.tolist()))
    ours = shortest_paths(n, src, dst, max_spd=6)
    ref = dict(nx.all_pairs_shortest_path_length(g))
    for i in range(n):
        for j in range(n):
            d = ref[i].get(j)
            assert ours[i, j] == (7 if d is None or d > 6 else d)


def test_edge_tables_keep_the_heaviest_and_the_most_recent_edge_of_a_pair_either_way():
    """A pair holding edges both ways (and a repeat) gets, in both directions, the action and
    weight of its heaviest edge and the recency of its most recent one; packing many views at
    once gives each view the tables it gets alone."""
    from dataclasses import replace
    rng = np.random.default_rng(0)
    v = replace(random_view(rng, 3, 0),
                edge_src=np.array([0, 1, 0], np.int32), edge_dst=np.array([1, 0, 1], np.int32),
                edge_action=np.array([2, 5, 7], np.int16),
                edge_weight=np.array([-3.0, 0.5, 1.0], np.float32),
                edge_age=np.array([7200.0, 10.0, 3600.0 * 40], np.float32))
    cfg = PackConfig()
    b = pack([v], cfg)
    n = 3
    at = lambda t, i, j: t[i * n + j].item()                  # noqa: E731
    for i, j in ((0, 1), (1, 0)):
        assert at(b.etype, i, j) == 3                          # action 2 (+1): |-3| heaviest
        assert at(b.eweight, i, j) == pytest.approx(-np.log1p(3.0))
        assert at(b.erec, i, j) == 1                           # 10 s old: bucket 0 (+1)
    assert at(b.etype, 0, 2) == 0 and at(b.erec, 1, 2) == 0
    views = random_views(4, 6)
    together = pack(views, cfg)
    for i, view in enumerate(views):
        alone = pack([view], cfg)
        t0, m = int(together.tok_base[together.anchor_pos[i]]), view.size ** 2
        for name in ("spd", "etype", "eweight", "erec"):
            assert torch.equal(getattr(together, name)[t0:t0 + m], getattr(alone, name)[:m])


def test_anchor_queries_alone_give_the_anchors_rows_of_the_full_output():
    """The last block asks only for its anchors: the same rows as every token querying."""
    cfg = PackConfig()
    batch = pack(random_views(6, 11), cfg)
    b = bias_with(None, cfg)
    q, k, v = qkv(batch.seq_len)
    with torch.no_grad():
        full = A.attend_dense_per_view(q, k, v, batch, b)
        anchors = A.attend_dense_per_view(q, k, v, batch, b, anchors_only=True)
    assert anchors.shape == (1, H, batch.n_views, D)
    assert torch.allclose(anchors, full[:, :, batch.anchor_pos], atol=1e-6, rtol=0)
