"""The primitive tree refitted to embeddings: contiguous subtrees, recovered clusters, reproducible."""
import numpy as np
import torch
from sklearn.metrics import normalized_mutual_info_score as nmi

from hirflow.encoder.hierarchy import fit_tree
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


def test_type_centre_moves_assignments_not_embeddings():
    """A node type's mean is removed before its embeddings meet the prototypes, so nodes
    that all lean the type's way are still told apart by the rest; the embedding the model
    returns (which retrieval uses) stays as it was."""
    from hirflow.encoder.batching import pack
    from hirflow.state.random_views import random_views
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
