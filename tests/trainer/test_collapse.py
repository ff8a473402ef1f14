"""Collapse health: the figures against their definitions, every step's negatives, and a
collapsed encoder kept out of the served vector."""
import numpy as np
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st
from hypothesis.extra.numpy import arrays

from hirflow.trainer.collapse import CollapseWatch, collapsed, effective_rank, health, mean_cosine
from hirflow.trainer.losses import in_batch_softmax_loss, uniformity_loss


@settings(max_examples=40, deadline=None)
@given(arrays(np.float64, st.tuples(st.integers(2, 12), st.integers(1, 6)),
              elements=st.floats(-10, 10, allow_nan=False)))
def test_mean_cosine_is_the_mean_over_pairs_of_their_cosines(x):
    rows = x[np.linalg.norm(x, axis=1) > 1e-6]
    if len(rows) < 2:
        return
    u = rows / np.linalg.norm(rows, axis=1, keepdims=True)
    c = u @ u.T
    want = c[np.triu_indices(len(u), 1)].mean()
    assert abs(mean_cosine(rows) - want) < 1e-9


def test_effective_rank_runs_from_one_line_to_an_even_spread():
    rng = np.random.default_rng(0)
    line = np.outer(rng.random(50) + 0.1, rng.standard_normal(8))
    assert abs(effective_rank(line) - 1.0) < 1e-6 and mean_cosine(line) > 0.999
    assert abs(effective_rank(np.eye(8)) - 8.0) < 1e-6 and abs(mean_cosine(np.eye(8))) < 1e-12
    assert health(np.eye(1)) == {"items": 1, "mean_cosine": None, "effective_rank": None}
    assert not collapsed(health(np.eye(1)), 0.9) and collapsed(health(line), 0.9)


def test_the_watch_keeps_a_row_per_chunk_and_says_when_it_collapsed(caplog):
    rng = np.random.default_rng(1)
    w = CollapseWatch(0.9)
    w.step(rng.standard_normal((40, 8)), positives=10, no_negative=0)
    assert not collapsed(w.close_chunk(0), 0.9)
    w.step(np.tile(rng.standard_normal(8), (40, 1)), positives=10, no_negative=10)
    with caplog.at_level("WARNING"):
        row = w.close_chunk(1)
    assert collapsed(row, 0.9) and row["no_negative"] == 1.0 and "collapsed" in caplog.text
    assert w.close_chunk(2) is None                      # no item embedded: no row
    s = w.summary(health(np.tile(np.ones(8), (5, 1))))
    assert s["collapsed"] and s["no_negative"] == 0.5 and s["per_chunk"]["chunk"] == [0, 1]


@settings(max_examples=40, deadline=None)
@given(p=st.integers(1, 8), items=st.integers(3, 20), drawn=st.integers(0, 6), seed=st.integers(0, 999))
def test_with_sampled_items_every_positive_has_a_negative(p, items, drawn, seed):
    """One source's positives only (a quiet day's batch): in-batch alone leaves them without
    a negative; any item drawn from the pool that is not among them gives each one."""
    g = torch.Generator().manual_seed(seed)
    n = 1 + items
    emb = F.normalize(torch.randn(n, 8, generator=g), dim=-1)
    types = torch.tensor([0] + [1] * items)
    dst = torch.randperm(items, generator=g)[:min(p, items)] + 1
    src = torch.zeros(len(dst), dtype=torch.long)
    others = torch.tensor(sorted(set(range(1, n)) - set(dst.tolist())))[:drawn]
    stats: dict = {}
    loss = in_batch_softmax_loss(emb, src, dst, torch.ones(len(dst)), torch.zeros(n), types, 1.0,
                                 others, stats)
    assert stats["positives"] == len(dst)
    assert stats["no_negative"] == (0 if len(others) else len(dst))
    assert (float(loss) > 0) == bool(len(others))


def test_uniformity_is_lowest_spread_out_and_zero_collapsed():
    spread = torch.eye(6)
    same = torch.ones(6, 6)
    assert abs(float(uniformity_loss(same))) < 1e-6
    assert float(uniformity_loss(spread)) < -3.9           # log exp(-2 * 2)
    x = torch.randn(10, 6, requires_grad=True)
    uniformity_loss(x).backward()
    assert torch.isfinite(x.grad).all()
