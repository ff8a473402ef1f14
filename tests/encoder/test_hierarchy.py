"""The primitive tree refitted to embeddings: contiguous subtrees, recovered clusters, reproducible."""
import numpy as np
import ot
import torch
from hypothesis import given, settings, strategies as st
from sklearn.metrics import normalized_mutual_info_score as nmi

from hirflow.encoder.hierarchy import balanced_plan, fit_tree
from hirflow.encoder.model import EncoderConfig, HierarchicalEncoder
from hirflow.state.schema import SchemaConfig


def planted(seed=0, d=32, per=40):
    """4 coarse directions, 4 fine blobs around each."""
    rng = np.random.default_rng(seed)
    coarse = rng.normal(size=(4, d))
    fine = np.repeat(coarse, 4, axis=0) + 0.6 * rng.normal(size=(16, d))
    x = np.repeat(fine, per, axis=0) + 0.15 * rng.normal(size=(16 * per, d))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    labels = np.repeat(np.arange(16), per)
    return x.astype(np.float32), labels


def test_refitted_tree_recovers_planted_clusters_and_parents():
    x, fine = planted()
    protos = fit_tree(x, (4, 16), seed=0)
    assert protos.shape == (16, 32) and np.allclose(np.linalg.norm(protos, axis=1), 1, atol=1e-5)
    model = HierarchicalEncoder(EncoderConfig.for_schema(SchemaConfig(), levels=(4, 16), d_emb=32))
    with torch.no_grad():
        model.prototypes.copy_(torch.from_numpy(protos))
        a = model.assign(torch.from_numpy(x), torch.zeros(len(x), dtype=torch.long)).numpy()
    assert nmi(fine // 4, a[:, 0]) > 0.9 and nmi(fine, a[:, 1]) > 0.9
    assert (a[:, 0] == a[:, 1] * 4 // 16).all()                  # coarse is the fine's parent
    assert len(np.unique(a[:, 1])) == 16                         # every primitive in use
    assert np.array_equal(protos, fit_tree(x, (4, 16), seed=0))  # reproducible


def test_tree_with_more_primitives_than_points_and_uneven_levels():
    x, _ = planted(per=1)                                       # 16 points, 64 fine primitives
    protos = fit_tree(x, (4, 64), seed=1)
    assert protos.shape == (64, 32) and np.isfinite(protos).all()
    assert fit_tree(x, (3, 16)) is None                          # 16 is not a multiple of 3


@settings(max_examples=25, deadline=None)
@given(n=st.integers(2, 60), k=st.integers(1, 12), spread=st.floats(0.05, 0.4), seed=st.integers(0, 10_000))
def test_balanced_plan_matches_pot(n, k, spread, seed):
    """Run to convergence, the plan's marginals are 1/n per point and 1/k per centre, and it
    is POT's plan for the same cost and regularisation (similarities up to `spread` apart,
    epsilon 0.05: far wider gaps converge too slowly for POT's reference to settle; some
    cases within it need thousands of iterations, n = k = 5 at spread 0.375 more than 500)."""
    sim = spread * np.random.default_rng(seed).uniform(-1, 1, (n, k))
    ours = balanced_plan(sim, 0.05, iterations=20000, tol=1e-12)
    ref = ot.bregman.sinkhorn_log(np.full(n, 1 / n), np.full(k, 1 / k), -sim, reg=0.05,
                                  numItermax=20000, stopThr=1e-12)
    assert np.allclose(ours.sum(0), 1 / k, atol=1e-12) and np.allclose(ours.sum(1), 1 / n, atol=1e-6)
    assert np.allclose(ours, ref, atol=1e-6)


def usage_entropy(assign: np.ndarray, k: int) -> float:
    p = np.bincount(assign, minlength=k) / len(assign)
    p = p[p > 0]
    return float(-(p * np.log(p)).sum() / np.log(k))


def test_balanced_tree_evens_out_usage_of_a_skewed_world():
    """One broad blob holds 62 % of the points, 12 tight ones the rest: plain k-means gives
    the blob few centres and its usage entropy stays below the design's 0.9 of log K; the
    balanced centres share the points more evenly (>= 0.9 at both levels) and still keep
    apart the tight blobs' points."""
    rng = np.random.default_rng(3)
    d = 24
    dirs = rng.normal(size=(13, d))
    sizes = [2000] + [100] * 12
    x = np.concatenate([dirs[i] + (0.9 if i == 0 else 0.2) * rng.normal(size=(s, d))
                        for i, s in enumerate(sizes)])
    x = (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)
    model = HierarchicalEncoder(EncoderConfig.for_schema(SchemaConfig(), levels=(8, 32), d_emb=d))
    ent = {}
    for rounds in (0, 3):
        with torch.no_grad():
            model.prototypes.copy_(torch.from_numpy(fit_tree(x, (8, 32), seed=0, balance_rounds=rounds)))
            a = model.assign(torch.from_numpy(x), torch.zeros(len(x), dtype=torch.long)).numpy()
        ent[rounds] = [usage_entropy(a[:, lvl], k) for lvl, k in enumerate((8, 32))]
    assert min(ent[0]) < 0.9 <= min(ent[3]), ent
    assert all(b > p for b, p in zip(ent[3], ent[0])), ent


def test_type_centre_moves_assignments_not_embeddings():
    """A node type's mean is removed before its embeddings meet the prototypes, so nodes
    that all lean the type's way are still told apart by the rest; the embedding the model
    returns (which retrieval uses) stays as it was."""
    from hirflow.encoder.batching import pack
    from testkit.random_views import random_views
    F = torch.nn.functional
    model = HierarchicalEncoder(EncoderConfig.for_schema(SchemaConfig(), levels=(2, 4), d_emb=32)).eval()
    g = torch.Generator().manual_seed(0)
    lean = F.normalize(torch.randn(32, generator=g), dim=-1)
    protos = F.normalize(torch.randn(4, 32, generator=g), dim=-1)
    protos[0] = lean
    planted = torch.arange(30) % 3 + 1                            # each node near prototype 1-3
    emb = F.normalize(3 * lean + protos[planted] + 0.05 * torch.randn(30, 32, generator=g), dim=-1)
    types = torch.zeros(30, dtype=torch.long)
    b = pack(random_views(3, 12), model.cfg.pack)
    with torch.no_grad():
        plain, _ = model(b)
        model.prototypes.copy_(protos)
        assert (model.assign(emb, types)[:, -1] == 0).all()      # uncentred: all on the lean
        model.type_centre[0] = emb.mean(0)
        assert torch.equal(model.assign(emb, types)[:, -1], planted)
        model.type_centre.copy_(emb.mean(0).expand_as(model.type_centre))
        out, logits = model(b)
    assert torch.allclose(out, plain, atol=1e-6)                 # the embedding is unchanged
    assert torch.equal(logits[-1].argmax(-1), model.assign(out, b.type_ids[b.anchor_pos])[:, -1])
