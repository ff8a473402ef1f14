"""The encoder's shortcuts change no output: the anchors-only last block and the per-view
path's unpadded tokens give every backend the embeddings of the full computation."""
import warnings

import pytest
import torch
import torch.nn.functional as F

from hirflow.encoder.batching import pack
from hirflow.encoder.model import EncoderConfig, HierarchicalEncoder
from hirflow.state.schema import SchemaConfig
from hirflow.state.random_views import random_views

warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(3)
    m = HierarchicalEncoder(EncoderConfig.for_schema(SchemaConfig(), levels=(4, 16), compile=False)).eval()
    with torch.no_grad():                      # bias tables start near zero: make them count
        for blk in m.blocks:
            for p in blk.bias.parameters():
                p.normal_()
    return m


def full_reference(model, b):
    """Every token through every block (S x S, padding included), anchors taken at the end."""
    with torch.no_grad():
        x = model.features(b)
        for blk in model.blocks:
            x = blk(x, b, "dense_packed", None)
        return F.normalize(model.head(model.ln_f(x[b.anchor_pos])), dim=-1)


@pytest.mark.parametrize("backend", ["dense_per_view", "dense_packed", "flex_eager"])
def test_every_backend_gives_the_full_computations_embeddings(model, backend):
    b = pack(random_views(9, 13), model.cfg.pack)
    assert b.seq_len > sum(b.view_sizes)        # the batch carries padding to leave out
    with torch.no_grad():
        emb, logits = model(b, backend)
    assert emb.shape == (b.n_views, model.cfg.d_emb)
    assert torch.allclose(emb, full_reference(model, b), atol=1e-5, rtol=0)
    assert [lg.shape for lg in logits] == [(b.n_views, k) for k in model.cfg.levels]
