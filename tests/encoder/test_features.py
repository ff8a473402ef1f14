import numpy as np
import pytest
import torch

from hirflow.encoder.batching import PackConfig, hash_features
from hirflow.encoder.features import DeepHashEmbedding


def count(m):
    return sum(p.numel() for p in m.parameters())


def embed_ids(n: int, cfg: PackConfig, dhe: DeepHashEmbedding, chunk: int = 500_000):
    distinct = set()
    for start in range(0, n, chunk):
        ids = [f"user:{i}" for i in range(start, min(n, start + chunk))]
        h = hash_features(ids, cfg)
        with torch.no_grad():
            out = dhe(torch.from_numpy(h[:2048]))
        assert torch.isfinite(out).all()
        distinct.update(map(bytes, h[:, :4].view(np.uint8).reshape(len(ids), -1)[:5000]))
    return distinct


@pytest.mark.parametrize("n", [200_000])
def test_deep_hash_embedding_parameters_do_not_grow_with_ids(n):
    cfg = PackConfig()
    dhe = DeepHashEmbedding(cfg.hash_count, 128, 64)
    before = count(dhe)
    distinct = embed_ids(n, cfg, dhe)
    assert count(dhe) == before
    assert len(distinct) >= 0.999 * min(n, 5000 * ((n + 499_999) // 500_000))


@pytest.mark.slow
def test_ten_million_distinct_ids_same_parameter_count():
    test_deep_hash_embedding_parameters_do_not_grow_with_ids(10_000_000)


def test_hash_features_are_deterministic_and_spread():
    cfg = PackConfig()
    a = hash_features(["ad:1", "ad:2"], cfg)
    assert np.array_equal(a, hash_features(["ad:1", "ad:2"], cfg))
    assert a.shape == (2, cfg.hash_count) and (np.abs(a) <= 1).all()
    assert not np.allclose(a[0], a[1])

