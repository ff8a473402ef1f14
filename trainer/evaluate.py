"""Evaluation on the test window, against baselines computed in the same run on the same split.

- next engagement: Recall@K and NDCG@K of the items (ads, products) each user engages in the
  test window, ranked from state as of the test window's start; the same for deep-funnel
  actions alone (funnel_weight > 1);
- cold start: items first seen in the test window that have text, ranked among all items
  for the users who engage them (their embeddings come from type + world knowledge alone);
  popularity knows nothing of them;
- hierarchy: NMI / ARI of each level's assignments against planted labels (synthetic world)
  or any node -> label map (Taobao categories), and densification (how much denser the
  primitive graph is than the raw graph);
- BoM: recall of the inverted index (candidates sharing a token, re-ranked by inner product)
  against exact inner-product search on the same embeddings;
- baselines: popularity, item co-occurrence kNN, and matrix factorisation (truncated SVD of
  the user x item matrix).

Writes `metrics.json` and PNG plots.
"""
from __future__ import annotations

import json
import logging
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import torch
from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score

from encoder import checkpoint as ckpt
from encoder.model import HierarchicalEncoder
from encoder.serving import encoder_from
from encoder.quantize import BoMQuantizer, QuantizerConfig
from state.events import Engagement
from state.graph import GraphConfig, GraphStore
from state.schema import SchemaConfig
from state.views import STUDENT, ViewSampler
from state.writer import BOTH_SIDES, GraphWriter
from trainer.data import Windows
from trainer.train import embed

log = logging.getLogger(__name__)
ITEM_TYPES = ("ad", "product")


def load_model(path) -> tuple[HierarchicalEncoder, ckpt.Checkpoint]:
    ck = ckpt.load(path)
    return encoder_from(ck), ck


def _rank_metrics(scores: np.ndarray, truth: list[set[int]], k: int) -> tuple[float, float]:
    """Mean Recall@k and NDCG@k; scores (U, I), truth[u] = item indices engaged."""
    top = np.argsort(-scores, axis=1)[:, :k]
    rec, ndcg = [], []
    disc = 1.0 / np.log2(np.arange(2, k + 2))
    for u, t in enumerate(truth):
        hits = np.array([i in t for i in top[u]], float)
        rec.append(hits.sum() / len(t))
        ndcg.append((hits * disc).sum() / disc[:min(len(t), k)].sum())
    return float(np.mean(rec)), float(np.mean(ndcg))


def baselines(train: Sequence[Engagement], users: list[str], items: list[str],
              factors: int = 32) -> dict[str, np.ndarray]:
    """(U, I) scores of popularity, item co-occurrence kNN and SVD matrix factorisation."""
    ui = {u: i for i, u in enumerate(users)}
    ii = {x: i for i, x in enumerate(items)}
    m = np.zeros((len(users), len(items)), np.float32)
    for e in train:
        if e.src in ui and e.dst in ii:
            m[ui[e.src], ii[e.dst]] += e.w
    binary = (m > 0).astype(np.float32)
    pop = np.broadcast_to(binary.sum(0), m.shape).copy()
    norms = np.linalg.norm(binary, axis=0) + 1e-9
    sim = (binary.T @ binary) / norms[:, None] / norms[None, :]
    np.fill_diagonal(sim, 0.0)
    cooc = binary @ sim
    u, s, vt = np.linalg.svd(np.log1p(m), full_matrices=False)
    f = min(factors, len(s))
    mf = (u[:, :f] * s[:f]) @ vt[:f]
    return {"popularity": pop, "cooccurrence_knn": cooc, "matrix_factorisation": mf}


def evaluate(path, events: Sequence[Engagement], windows: Windows, schema: SchemaConfig,
             out_dir, labels: Mapping[str, Mapping[str, int]] | None = None,
             texts: Mapping[str, np.ndarray] | None = None,
             later_texts: Mapping[str, np.ndarray] | None = None, ks: Sequence[int] = (10, 50)) -> dict:
    """Evaluate checkpoint `path` on the test window of `events`; writes metrics.json + PNGs.

    `texts`: world knowledge known at the test window's start; `later_texts`: known by its
    end, used only for the items first seen in it (cold start)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model, ck = load_model(path)
    enc_cfg = model.cfg
    events = sorted(events, key=lambda e: e.ts)
    before = [e for e in events if e.ts < windows.val_end]
    test = [e for e in events if e.ts >= windows.val_end]
    funnel = {a for a, s in schema.all_actions.items() if s.funnel_weight > 1}
    with tempfile.TemporaryDirectory() as tmp:
        store = GraphStore(Path(tmp) / "s", schema, 1)
        w = GraphWriter(store, GraphConfig(path=str(Path(tmp) / "s")))
        for i in range(0, len(before), 20_000):
            w.apply_batch([(e, BOTH_SIDES) for e in before[i:i + 20_000]])
            w.commit()
        nodes = sorted({n for e in before for n in (e.src, e.dst)})
        sampler = ViewSampler(store.reader, schema, STUDENT, seed=0)
        emb = embed(model, sampler, nodes, windows.val_end - 1, enc_cfg, texts, model.device)
        known = set(nodes)
        cold = sorted({e.dst for e in test if e.dst not in known and e.dst.partition(":")[0] in ITEM_TYPES
                       and e.dst in (later_texts or {})})
        cold_emb = embed(model, sampler, cold, windows.val_end - 1, enc_cfg, later_texts, model.device)
        store.close()
    index = {n: i for i, n in enumerate(nodes)}
    items = [n for n in nodes if n.partition(":")[0] in ITEM_TYPES]
    metrics: dict = {"checkpoint": ck.id, "test_events": len(test), "windows": windows.__dict__}
    for name, acts in (("next_engagement", None), ("deep_funnel", funnel)):
        truth_map: dict[str, set[int]] = defaultdict(set)
        item_idx = {x: i for i, x in enumerate(items)}
        used: set[str] = set()
        for e in test:
            if e.src in index and e.dst in item_idx and (acts is None or e.action in acts):
                truth_map[e.src].add(item_idx[e.dst])
                used.add(e.action)
        users = sorted(truth_map)
        if not users:
            metrics[name] = {"users": 0}
            continue
        truth = [truth_map[u] for u in users]
        u_emb, i_emb = emb[[index[u] for u in users]], emb[[index[x] for x in items]]
        # the model's own score: <u * r_a, i> averaged over the evaluated actions (DistMult
        # is linear in r); the plain inner product is what the BoM index retrieves by
        scores = {"hirflow": (u_emb * _relation(ck, schema, used)) @ i_emb.T,
                  "hirflow_inner_product": u_emb @ i_emb.T}
        scores.update(baselines(before, users, items))
        res = {"users": len(users)}
        for method, sc in scores.items():
            for k in ks:
                r, n = _rank_metrics(sc, truth, min(k, len(items)))
                res[f"{method}_recall@{k}"] = round(r, 4)
                res[f"{method}_ndcg@{k}"] = round(n, 4)
        metrics[name] = res
    with torch.no_grad():
        assign = model.assign(torch.from_numpy(emb), torch.tensor(schema.type_codes(nodes))).numpy()
    metrics["cold_start"] = _cold_start(emb, index, items, cold, cold_emb, before, test, ks)
    if labels:
        metrics["hierarchy"] = _hierarchy(assign, nodes, labels)
    metrics["densification"] = _densification(assign, index, before)
    metrics["bom_recall@100"] = _bom_recall(emb, ck)
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2, sort_keys=True))
    _plot(metrics, out / "recall.png", ks)
    return metrics


def _relation(ck: ckpt.Checkpoint, schema: SchemaConfig, actions: set[str]) -> np.ndarray:
    """Mean relation vector of `actions` from the checkpoint's engagement head (ones if none)."""
    rel = ck.weights.get("head.relation.weight")
    order = sorted(schema.all_actions)
    if rel is None or rel.shape[0] != len(order) or not actions:
        return np.ones((1, ck.manifest["config"]["d_emb"]), np.float32)
    idx = [order.index(a) for a in sorted(actions)]
    return rel[idx].float().mean(0, keepdim=True).numpy()


def _cold_start(emb, index, items: list[str], cold: list[str], cold_emb: np.ndarray, before, test,
                ks) -> dict:
    """Recall / NDCG of the cold items (first seen in the test window, with text) each known
    user engages there, ranked among all items, warm and cold, as a new ad must compete.
    Popularity knows nothing of the cold items (zero, ties in a seeded random order)."""
    ci = {x: len(items) + i for i, x in enumerate(cold)}
    truth_map: dict[str, set[int]] = defaultdict(set)
    for e in test:
        if e.src in index and e.dst in ci:
            truth_map[e.src].add(ci[e.dst])
    users = sorted(truth_map)
    res: dict = {"users": len(users), "cold_items": len(cold), "items": len(items) + len(cold)}
    if not users:
        return res
    truth = [truth_map[u] for u in users]
    cand = np.concatenate([emb[[index[x] for x in items]], cold_emb]) if items else cold_emb
    pop = np.zeros(len(items) + len(cold))
    ii = {x: i for i, x in enumerate(items)}
    for e in before:
        if e.dst in ii:
            pop[ii[e.dst]] += 1
    noise = np.random.default_rng(0).random((len(users), len(pop))) * 1e-3   # tie-break
    scores = {"hirflow": emb[[index[u] for u in users]] @ cand.T,
              "popularity": pop[None, :] + noise}
    for method, sc in scores.items():
        for k in ks:
            r, n = _rank_metrics(sc, truth, min(k, len(pop)))
            res[f"{method}_recall@{k}"] = round(r, 4)
            res[f"{method}_ndcg@{k}"] = round(n, 4)
    return res


def _densification(assign: np.ndarray, index: Mapping[str, int], edges: Sequence[Engagement]) -> dict:
    """Per level: density of the primitive graph (primitives joined when any of their nodes
    share an edge) over the density of the raw node graph."""
    pairs = {(min(index[e.src], index[e.dst]), max(index[e.src], index[e.dst]))
             for e in edges if e.src != e.dst}
    n = len(index)
    raw = len(pairs) / max(1, n * (n - 1) / 2)
    out = {"raw_density": round(raw, 6)}
    for lvl in range(assign.shape[1]):
        a = assign[:, lvl]
        prim = {(min(a[i], a[j]), max(a[i], a[j])) for i, j in pairs if a[i] != a[j]}
        k = len(np.unique(a))
        dens = len(prim) / max(1, k * (k - 1) / 2)
        out[f"level{lvl}"] = {"primitives": int(k), "density": round(dens, 4),
                              "densification": round(dens / raw, 1) if raw else None}
    return out


def _hierarchy(assign: np.ndarray, nodes: list[str], labels: Mapping[str, Mapping[str, int]]) -> dict:
    """NMI / ARI per level of `assign` (N, levels; coarse to fine). Planted labels (coarse /
    mid / fine) are compared level by level, coarsest with coarsest; any other label (a Taobao
    category) with every level."""
    picked = [i for i, n in enumerate(nodes) if n in labels]
    keys = sorted({k for i in picked for k in labels[nodes[i]]})
    tree = [k for k in ("coarse", "mid", "fine") if k in keys]
    if tree:
        tree = tree[-assign.shape[1]:]
        pairs = [(lvl + assign.shape[1] - len(tree), k) for lvl, k in enumerate(tree)]
    else:
        pairs = [(lvl, k) for k in keys for lvl in range(assign.shape[1])]
    out = {}
    for lvl, key in pairs:
        ok = [i for i in picked if isinstance(labels[nodes[i]].get(key), int)]
        if len(ok) > 1:
            t = [labels[nodes[i]][key] for i in ok]
            pred = assign[ok, lvl]
            out[f"level{lvl}_vs_{key}"] = {"nmi": round(float(normalized_mutual_info_score(t, pred)), 4),
                                           "ari": round(float(adjusted_rand_score(t, pred)), 4),
                                           "nodes": len(ok)}
    return out


def category_labels(events: Sequence[Engagement], action: str = "belongs_to") -> dict[str, dict[str, int]]:
    """node -> {"category": k} from structural `belongs_to` edges (Taobao products)."""
    cats: dict[str, int] = {}
    out: dict[str, dict[str, int]] = {}
    for e in events:
        if e.action == action:
            out[e.src] = {"category": cats.setdefault(e.dst, len(cats))}
    return out


def _bom_recall(emb: np.ndarray, ck: ckpt.Checkpoint, k: int = 100, queries: int = 200) -> float | None:
    """Recall@k of token-sharing candidates re-ranked by inner product, vs exact search."""
    if ck.codebooks is None or len(emb) < 2:
        return None
    q = BoMQuantizer.from_codebooks(ck.codebooks, QuantizerConfig(**ck.manifest["quantizer"]))
    tokens = q.tokens(emb)
    postings: dict[int, list[int]] = defaultdict(list)
    for i, row in enumerate(tokens):
        for t in row:
            postings[int(t)].append(i)
    rng = np.random.default_rng(0)
    hits, total = 0, 0
    for i in rng.choice(len(emb), min(queries, len(emb)), replace=False):
        exact = set(np.argsort(-(emb @ emb[i]))[:min(k, len(emb))])
        cand = np.array(sorted({j for t in tokens[i] for j in postings[int(t)]}))
        got = set(cand[np.argsort(-(emb[cand] @ emb[i]))[:k]]) if len(cand) else set()
        hits += len(exact & got)
        total += len(exact)
    return round(hits / max(1, total), 4)


def _plot(metrics: dict, path: Path, ks) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 3, figsize=(16, 4))
    for ax, name in zip(axes, ("next_engagement", "deep_funnel", "cold_start")):
        res = metrics.get(name, {})
        methods = sorted({k.split("_recall@")[0] for k in res if "_recall@" in k})
        x = np.arange(len(methods))
        for j, k in enumerate(ks):
            ax.bar(x + j * 0.4, [res.get(f"{m}_recall@{k}", 0) for m in methods], 0.4, label=f"Recall@{k}")
        ax.set_xticks(x + 0.2, methods, rotation=15)
        ax.set_title(f"{name} ({res.get('users', 0)} users)")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
