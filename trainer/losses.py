"""Training objectives: the sampled softmax of retrieval (in-batch and sampled negatives),
cross-view self-distillation with Sinkhorn-Knopp balanced targets, hierarchy consistency,
DistMult engagement prediction, and the uniformity of item directions.

Shapes: V anchors per batch, K_l prototypes at level l. Logits are cosine similarities over
temperature (see `encoder.model`). Teacher targets never carry gradients.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F


@torch.no_grad()
def sinkhorn_knopp(logits: torch.Tensor, epsilon: float = 0.05, n_iters: int = 3) -> torch.Tensor:
    """(V, K) scores (cosine similarities) -> (V, K) soft assignments whose rows sum to 1 and whose columns are
    balanced (each prototype gets V/K of the mass), so no level collapses onto a few clusters.

    This is the entropic optimal-transport plan between uniform marginals with cost
    -logits and regularisation epsilon (times V), computed in log space for stability.
    """
    V, K = logits.shape
    log_q = logits.float() / epsilon                         # (V, K)
    log_r = torch.full((V,), -np.log(V), device=logits.device)   # row marginal 1/V
    log_c = torch.full((K,), -np.log(K), device=logits.device)   # column marginal 1/K
    u = torch.zeros(V, device=logits.device)
    v = torch.zeros(K, device=logits.device)
    for _ in range(n_iters):
        u = log_r - torch.logsumexp(log_q + v[None, :], dim=1)
        v = log_c - torch.logsumexp(log_q + u[:, None], dim=0)
    plan = torch.exp(log_q + u[:, None] + v[None, :])        # (V, K), sums to 1
    return plan / plan.sum(1, keepdim=True)


def distillation_loss(student_logits: Sequence[torch.Tensor], teacher_scores: Sequence[torch.Tensor],
                      epsilon: float = 0.05, n_iters: int = 3) -> torch.Tensor:
    """Mean over levels of the cross-entropy between the teacher's balanced targets and the
    student's assignment distribution (narrow view learns to predict the broad view).
    `teacher_scores` are cosine similarities to the prototypes (SwAV's epsilon applies to
    them), `student_logits` cosines over the student temperature."""
    losses = []
    for s, t in zip(student_logits, teacher_scores):
        q = sinkhorn_knopp(t.detach(), epsilon, n_iters)
        losses.append(-(q * F.log_softmax(s, dim=-1)).sum(-1).mean())
    return torch.stack(losses).mean()


def hierarchy_consistency_loss(logits: Sequence[torch.Tensor], parents: Sequence[torch.Tensor]) -> torch.Tensor:
    """KL(coarse || fine mass summed per parent) for each coarser level: a node's coarse
    assignment should be the parent of its fine one. `parents[l]` maps fine -> level l."""
    fine = F.softmax(logits[-1], dim=-1)                      # (V, K_fine)
    losses = []
    for lvl, coarse_logits in enumerate(logits[:-1]):
        k = coarse_logits.shape[-1]
        agg = torch.zeros(fine.shape[0], k, device=fine.device, dtype=fine.dtype)
        agg = agg.index_add(1, parents[lvl], fine)            # (V, K_l)
        logp = F.log_softmax(coarse_logits, dim=-1)
        losses.append(F.kl_div(torch.log(agg.clamp_min(1e-8)), logp, log_target=True,
                               reduction="batchmean"))
    return torch.stack(losses).mean() if losses else logits[-1].new_zeros(())


def engagement_logits(src: torch.Tensor, dst: torch.Tensor, relation: torch.Tensor,
                      temperature: float = 0.1) -> torch.Tensor:
    """(E,) scores of (src, action, dst) triples: <src * r_action, dst> / T (DistMult)."""
    return (src * relation * dst).sum(-1) / temperature


def engagement_loss(logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Weighted binary cross-entropy: positives are edges that exist at the time, negatives
    are sampled per node type; deep-funnel actions carry larger `weights`."""
    per = F.binary_cross_entropy_with_logits(logits, labels.float(), reduction="none")
    return (per * weights).sum() / weights.sum().clamp_min(1e-8)


def uniformity_loss(directions: torch.Tensor, t: float = 2.0) -> torch.Tensor:
    """log E exp(-t |x - y|^2) over the pairs of unit `directions` (Wang and Isola 2020; DirectAU
    for recommenders): lowest when the directions spread over the sphere, highest when they
    collapse onto one point. Zero for fewer than two rows."""
    n = len(directions)
    if n < 2:
        return directions.new_zeros(())
    x = F.normalize(directions, dim=-1)
    sq = (2.0 - 2.0 * x @ x.T).clamp_min(0.0)               # squared distances of unit vectors
    upper = torch.triu(torch.ones(n, n, dtype=torch.bool, device=x.device), diagonal=1)
    return sq[upper].mul(-t).exp().mean().clamp_min(1e-12).log()


def usage_entropy(assignments: torch.Tensor, k: int) -> float:
    """Entropy (nats) of how often each of k prototypes is the argmax; log k = perfectly even."""
    counts = torch.bincount(assignments.flatten(), minlength=k).double()
    p = counts / counts.sum()
    p = p[p > 0]
    return float(-(p * p.log()).sum())


def in_batch_softmax_loss(emb: torch.Tensor, src: torch.Tensor, dst: torch.Tensor,
                          weights: torch.Tensor, log_q: torch.Tensor, type_ids: torch.Tensor,
                          temperature: float = 0.05, sampled: torch.Tensor | None = None,
                          stats: dict | None = None, src_node: torch.Tensor | None = None) -> torch.Tensor:
    """Sampled softmax over the batch's destinations and `sampled` negatives (mixed negative
    sampling, the two-tower retrieval objective).

    `emb` (V, d) anchor embeddings; `src`, `dst` (P,) anchor indices of the positives;
    `sampled` (S,) anchor indices of items drawn from the whole item pool: without them a
    batch whose positives all share one source (one user's history in a quiet day) has no
    negative at all, and nothing stops every item from moving to the same place;
    `log_q` (V,) log of how many times each anchor is expected among a batch's candidates
    (the logQ correction: sampled softmax then estimates the full softmax, popularity
    included, instead of punishing items for being sampled as negatives more often);
    `type_ids` (V,) node types: a positive competes only with candidates of its type.
    The batch's other positives of the same source are not negatives (`src_node`: each row's
    source node, when `src` holds views of it as of different moments). `stats` (when given)
    receives how many positives had no negative left (`no_negative`, of `positives`)."""
    cand = torch.unique(dst if sampled is None or not len(sampled) else torch.cat([dst, sampled]))
    logits = emb[src] @ emb[cand].T / temperature - log_q[cand][None, :]   # (P, C)
    col = torch.searchsorted(cand, dst)                             # (P,) own destination
    pos = torch.zeros_like(logits, dtype=torch.bool)
    node = src if src_node is None else src_node                    # a source as of each positive
    same_src = node[:, None] == node[None, :]                       # (P, P): the same source node
    pos[torch.nonzero(same_src, as_tuple=True)[0], col[torch.nonzero(same_src, as_tuple=True)[1]]] = True
    own = torch.zeros_like(pos)
    own[torch.arange(len(src)), col] = True
    other_type = type_ids[cand][None, :] != type_ids[dst][:, None]
    masked = (pos & ~own) | other_type
    if stats is not None:
        negatives = (~masked & ~own).sum(1)
        stats["positives"] = int(len(src))
        stats["no_negative"] = int((negatives == 0).sum())
    logits = logits.masked_fill(masked, float("-inf"))
    per = F.cross_entropy(logits, col, reduction="none")
    return (per * weights).sum() / weights.sum().clamp_min(1e-8)
