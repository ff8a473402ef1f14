import numpy as np
import ot
import pytest
import torch

from hirflow.trainer.losses import (distillation_loss, engagement_loss, hierarchy_consistency_loss,
                                    sinkhorn_knopp, usage_entropy)
from hirflow.trainer.schedules import cosine, teacher_momentum


@pytest.mark.parametrize("V,K,eps", [(64, 16, 0.5), (200, 32, 0.2), (50, 128, 1.0)])
def test_sinkhorn_matches_pot(V, K, eps):
    """Same plan and marginals as POT's ot.sinkhorn on the same cost and regularisation."""
    g = torch.Generator().manual_seed(V + K)
    logits = torch.randn(V, K, generator=g) * 2
    ours = sinkhorn_knopp(logits, epsilon=eps, n_iters=2000) / V            # plan, sums to 1
    a, b = np.full(V, 1 / V), np.full(K, 1 / K)
    ref = ot.sinkhorn(a, b, -logits.double().numpy(), reg=eps, numItermax=20000, stopThr=1e-12)
    assert np.allclose(ours.sum(1).numpy(), a, atol=1e-6)
    assert np.allclose(ours.sum(0).numpy(), b, atol=1e-5)
    assert np.allclose(ours.double().numpy(), ref, atol=1e-6, rtol=1e-3)


def test_balanced_targets_keep_every_level_in_use():
    """Skewed, clustered teacher scores (cosines): the argmax of balanced targets uses the
    prototypes evenly (entropy >= 0.9 log K) at every level, more evenly than raw argmax."""
    rng = np.random.default_rng(0)
    for k in (16, 128, 1024):
        V = 8 * k
        centers = rng.standard_normal((k, 32))
        centers /= np.linalg.norm(centers, axis=1, keepdims=True)
        # data from only a quarter of the clusters, plus a strong pull towards prototype 0
        x = centers[rng.integers(0, max(1, k // 4), V)] + 0.3 * rng.standard_normal((V, 32))
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        scores = torch.from_numpy(x @ centers.T).float()
        scores[:, 0] += 0.3
        raw = usage_entropy(scores.argmax(1), k)
        balanced = usage_entropy(sinkhorn_knopp(scores, epsilon=0.05, n_iters=3).argmax(1), k)
        assert balanced >= 0.9 * np.log(k), (k, balanced, np.log(k))
        assert raw < balanced


def test_distillation_loss_prefers_a_student_that_agrees_with_the_teacher():
    g = torch.Generator().manual_seed(1)
    teacher = [torch.randn(256, k, generator=g) * 5 for k in (8, 32)]
    agree = [t.clone() for t in teacher]
    other = [torch.randn(256, t.shape[1], generator=g) * 5 for t in teacher]
    assert distillation_loss(agree, teacher) < distillation_loss(other, teacher)
    s = [t.clone().requires_grad_() for t in other]
    distillation_loss(s, teacher).backward()
    assert all(x.grad is not None and torch.isfinite(x.grad).all() for x in s)


def test_hierarchy_consistency_is_zero_only_when_coarse_is_the_parent_of_fine():
    parents = [torch.arange(8) // 4]                     # 8 fine -> 2 coarse
    fine = torch.full((1, 8), -20.0)
    fine[0, 1] = 20.0                                    # fine 1, parent 0
    good = [torch.tensor([[20.0, -20.0]]), fine]
    bad = [torch.tensor([[-20.0, 20.0]]), fine]
    assert hierarchy_consistency_loss(good, parents) < 1e-6
    assert hierarchy_consistency_loss(bad, parents) > 1.0


def test_engagement_loss_weights_deep_funnel_actions():
    logits = torch.tensor([0.0, 0.0])
    labels = torch.tensor([1, 0])
    light = engagement_loss(logits, labels, torch.tensor([1.0, 1.0]))
    assert torch.isclose(light, torch.log(torch.tensor(2.0)))
    wrong = torch.tensor([-3.0, 0.0])                     # misses the positive
    assert engagement_loss(wrong, labels, torch.tensor([4.0, 1.0])) > engagement_loss(wrong, labels, torch.tensor([1.0, 1.0]))


def test_schedules_have_their_length_and_ends():
    m = teacher_momentum(100)
    assert len(m) == 100 and m[0] == pytest.approx(0.996) and m[-1] == pytest.approx(1.0)
    lr = cosine(1e-3, 1e-5, 50, warmup_steps=5)
    assert len(lr) == 50 and lr[0] == 0.0 and lr[5] == pytest.approx(1e-3) and lr[-1] == pytest.approx(1e-5)
    with pytest.raises(ValueError):
        cosine(1, 0, 0)


def test_in_batch_softmax_uses_the_batch_as_negatives_and_spares_other_positives():
    import torch.nn.functional as F
    from hirflow.trainer.losses import in_batch_softmax_loss
    emb = F.normalize(torch.randn(6, 8), dim=-1)
    types = torch.tensor([0, 0, 1, 1, 1, 2])            # users 0, 1; items 2, 3, 4; other 5
    src, dst = torch.tensor([0, 0, 1]), torch.tensor([2, 3, 4])
    w, logq = torch.ones(3), torch.zeros(6)
    got = in_batch_softmax_loss(emb, src, dst, w, logq, types, temperature=1.0)
    s = emb @ emb.T
    # user 0's positive 2 competes with 4 only (3 is its own other positive), and vice versa
    want = [-(s[0, 2] - torch.logsumexp(s[0, [2, 4]], 0)), -(s[0, 3] - torch.logsumexp(s[0, [3, 4]], 0)),
            -(s[1, 4] - torch.logsumexp(s[1, [2, 3, 4]], 0))]
    assert torch.allclose(got, torch.stack(want).mean(), atol=1e-6)
    # logQ: a candidate that turns up in batches more often is discounted by its log share
    logq2 = torch.tensor([0.0, 0.0, 0.0, 0.0, 2.0, 0.0])
    got2 = in_batch_softmax_loss(emb, src, dst, w, logq2, types, temperature=1.0)
    s4 = s[:, 4] - 2.0
    want2 = [-(s[0, 2] - torch.logsumexp(torch.stack([s[0, 2], s4[0]]), 0)),
             -(s[0, 3] - torch.logsumexp(torch.stack([s[0, 3], s4[0]]), 0)),
             -(s4[1] - torch.logsumexp(torch.stack([s[1, 2], s[1, 3], s4[1]]), 0))]
    assert torch.allclose(got2, torch.stack(want2).mean(), atol=1e-6)
    # a destination of another type is never a negative
    got3 = in_batch_softmax_loss(emb, torch.tensor([0, 1]), torch.tensor([2, 5]), torch.ones(2), logq,
                                 types, temperature=1.0)
    assert float(got3) == 0.0                           # each positive alone among its type


def test_a_source_seen_as_of_two_positives_still_spares_its_own_positives():
    """Rows whose source views differ (as of each positive) but are the same node: each
    row's other positives are still no negatives of it."""
    import torch.nn.functional as F
    from hirflow.trainer.losses import in_batch_softmax_loss
    emb = F.normalize(torch.randn(6, 8), dim=-1)
    emb[5] = emb[0]                                      # node 0 as of its second positive
    types = torch.tensor([0, 1, 1, 1, 1, 0])
    w, logq = torch.ones(2), torch.zeros(6)
    same = in_batch_softmax_loss(emb, torch.tensor([0, 0]), torch.tensor([1, 2]), w, logq, types, 1.0,
                                 torch.tensor([3, 4]))
    split = in_batch_softmax_loss(emb, torch.tensor([0, 5]), torch.tensor([1, 2]), w, logq, types, 1.0,
                                  torch.tensor([3, 4]), src_node=torch.tensor([0, 0]))
    unspared = in_batch_softmax_loss(emb, torch.tensor([0, 5]), torch.tensor([1, 2]), w, logq, types, 1.0,
                                     torch.tensor([3, 4]))
    assert torch.allclose(same, split) and not torch.allclose(same, unspared)
