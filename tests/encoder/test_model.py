"""The encoder's shortcuts change no output: the anchors-only last block and the per-view
path's unpadded tokens give every backend the embeddings of the full computation."""
import warnings

import pytest
import torch

from hirflow.encoder.batching import pack
from hirflow.encoder.model import EncoderConfig, HierarchicalEncoder
from hirflow.state.schema import SchemaConfig
from testkit.random_views import random_views

warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(3)
    m = HierarchicalEncoder(EncoderConfig.for_schema(SchemaConfig(), levels=(4, 16), compile=False)).eval()
    with torch.no_grad():                      # bias tables start near zero: make them count
        for blk in m.blocks:
            for p in blk.bias.parameters():
                p.normal_()
        m.bias_head.weight.normal_()            # starts at zero: a score term that varies
    return m


def full_reference(model, b):
    """Every token through every block (S x S, padding included), anchors taken at the end."""
    with torch.no_grad():
        x = model.features(b)
        for blk in model.blocks:
            x = blk(x, b, "dense_packed", None)
        return model.embedding(x[b.anchor_pos], b.type_ids[b.anchor_pos])


@pytest.mark.parametrize("backend", ["dense_per_view", "dense_packed", "flex_eager"])
def test_every_backend_gives_the_full_computations_embeddings(model, backend):
    b = pack(random_views(9, 13), model.cfg.pack)
    assert b.seq_len > sum(b.view_sizes)        # the batch carries padding to leave out
    with torch.no_grad():
        emb, logits = model(b, backend)
    assert emb.shape == (b.n_views, model.cfg.d_emb)
    assert torch.allclose(emb, full_reference(model, b), atol=1e-5, rtol=0)
    assert [lg.shape for lg in logits] == [(b.n_views, k) for k in model.cfg.levels]


def test_the_score_coordinate_is_one_for_users_and_a_learned_bias_for_the_rest(model):
    """A user . item inner product is direction similarity plus the item's bias."""
    b = pack(random_views(5, 40), model.cfg.pack)
    with torch.no_grad():
        emb, _ = model(b, "dense_packed")
    types = b.type_ids[b.anchor_pos]
    query = torch.isin(types, torch.tensor(model.cfg.query_types))
    assert query.any() and (~query).any()
    assert torch.allclose(emb[:, :-1].norm(dim=-1), torch.ones(len(emb)), atol=1e-5)
    assert torch.all(emb[query, -1] == 1.0)
    assert emb[~query, -1].std() > 0
    u, i = emb[query][0], emb[~query]
    assert torch.allclose(i @ u, i[:, :-1] @ u[:-1] + i[:, -1], atol=1e-6)


def test_a_model_saved_before_the_score_coordinate_and_the_recent_edges_stat_loads_as_it_was():
    cfg = EncoderConfig.for_schema(SchemaConfig(), levels=(4, 16), compile=False)
    d = cfg.to_dict()
    del d["score_bias"], d["query_types"]
    del d["n_stats"]
    old = EncoderConfig.from_dict(d)
    assert not old.score_bias and "bias_head.weight" not in HierarchicalEncoder(old).state_dict()
    assert old.n_stats == 6 and HierarchicalEncoder(old).features.stats.in_features == 6
