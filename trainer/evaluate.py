"""Evaluation on the test window, against baselines computed in the same run on the same split.

- ranking (`trainer.ranking`): a global time split; for each user, the items known before
  the test window that the user had not engaged before, ranked by the served embedding's
  inner product (what the BoM index retrieves by and subscribers receive), from state as of
  the window's start; positives are the configured positive actions (never negative ones),
  overall and deep funnel (funnel_weight > 1); repeats are counted apart; Recall@K and
  NDCG@K with bootstrap confidence intervals over users, and the paired ratio to the best
  baseline;
- baselines (`trainer.baselines`): popularity (all time and recent), item-kNN, EASE^R, ALS
  and LightGCN-style propagation, each tuned on the validation window, then refitted on
  everything before the test window (as the served model's state is);
- cold start: items first seen in the test window that have text, ranked among all items
  for the users who engage them (their embeddings come from type + world knowledge alone);
  popularity knows nothing of them;
- hierarchy: NMI / ARI of each level's assignments against planted labels (synthetic world)
  or any node -> label map (Taobao categories), usage entropy per level, and densification
  (how much denser the primitive graph is than the raw graph);
- BoM: recall of the inverted index (candidates sharing a token, re-ranked by inner product)
  against exact inner-product search on the same embeddings.

Writes `metrics.json`, PNG plots and `per_user.json` (each task's users and each method's
Recall@20 per user: what several training seeds' results are pooled over).
"""
from __future__ import annotations

import json
import logging
import time
from collections import defaultdict
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import scipy.sparse as sp
import torch
from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score

from hirflow.encoder import checkpoint as ckpt
from hirflow.encoder import collaborative
from hirflow.encoder.model import HierarchicalEncoder
from hirflow.encoder.serving import encoder_from
from hirflow.encoder.quantize import BoMQuantizer
from hirflow.encoder.quantizer_config import QuantizerConfig
from hirflow.state.events import Engagement
from hirflow.state.schema import SchemaConfig, node_type
from hirflow.trainer import baselines as B
from hirflow.trainer.data import Windows
from hirflow.trainer.ranking import (RankingTask, paired_ratio_ci, per_user_metrics, ranking_task,
                                    session_prefixes, summarise)
from hirflow.trainer.embedding import served_embeddings, state_of

log = logging.getLogger(__name__)
KS = (10, 20, 50)
PER_USER = "per_user.json"       # {task: {"users": [...], "recall@20": {method: [...]}}}


class TrainedOnTestWindow(ValueError):
    """The checkpoint was fitted on events of the test window it is asked to be scored on."""


def load_model(path) -> tuple[HierarchicalEncoder, ckpt.Checkpoint]:
    ck = ckpt.load(path)
    return encoder_from(ck), ck


def load_served(path) -> tuple[HierarchicalEncoder, "collaborative.CollaborativeBlock | None", ckpt.Checkpoint]:
    """The checkpoint's encoder and collaborative block (None when it has none)."""
    model, ck = load_model(path)
    return model, collaborative.from_checkpoint(ck), ck


def positive_actions(schema: SchemaConfig) -> set[str]:
    """Actions that say a user wants an item: positive sign, not structural."""
    return {a for a, s in schema.all_actions.items() if s.sign > 0 and not s.structural}


def deep_funnel_actions(schema: SchemaConfig) -> set[str]:
    return {a for a in positive_actions(schema) if schema.all_actions[a].funnel_weight > 1}


def item_types(schema: SchemaConfig) -> tuple[str, ...]:
    return schema.item_node_types


def state_embeddings(model: HierarchicalEncoder, before: Sequence[Engagement], schema: SchemaConfig,
                     cutoff: int, texts=None, extra: Sequence[str] = (),
                     extra_texts=None, block: "collaborative.CollaborativeBlock | None" = None,
                     ) -> tuple[dict[str, int], np.ndarray, np.ndarray]:
    """Embeddings of every node of `before` as serving would compute them at `cutoff`: the
    events applied to a fresh graph store, student views sampled as of the cutoff, the
    collaborative `block` appended when given.
    -> (node -> row, embeddings, embeddings of `extra` nodes (with `extra_texts`))."""
    nodes = sorted({n for e in before for n in (e.src, e.dst)})
    with state_of(before, schema) as sampler:
        codes = schema.action_codes()
        emb = served_embeddings(model, block, sampler, nodes, cutoff, texts, codes)
        extra_emb = served_embeddings(model, block, sampler, list(extra), cutoff, extra_texts, codes)
    return {n: i for i, n in enumerate(nodes)}, emb, extra_emb


def compare(hirflow: np.ndarray | None, test: RankingTask, val: RankingTask,
            baselines: Sequence[B.Baseline], ks: Sequence[int] = KS,
            per_user_out: dict | None = None, parts: Mapping[str, np.ndarray] | None = None) -> dict:
    """hirflow's scores (n_eval, I) on `test` against each baseline tuned on `val`: per method
    every metric with its interval, the validation search, and the paired ratio of hirflow
    (and of each of its `parts`: name -> scores, diagnostics that are no baseline) to the
    best baseline at Recall@20. `per_user_out` (when given) receives each method's per-user
    Recall@20 and the users' names, in the same order (`PER_USER`)."""
    res: dict = {"users": test.n_eval, "items": len(test.items), "new_positives": test.new,
                 "repeat_positives": test.repeats, "methods": {}, "tuning": {}}
    per_user: dict[str, dict[str, np.ndarray]] = {}
    if hirflow is not None:
        per_user["hirflow"] = per_user_metrics(hirflow, test, ks)
    ours = {"hirflow", *(parts or {})}
    for name, scores in (parts or {}).items():
        per_user[name] = per_user_metrics(scores, test, ks)
    for b in baselines:
        t = time.perf_counter()
        params, val_score, tried = B.tune(b, val)
        per_user[b.name] = per_user_metrics(b.score(test, params), test, ks)
        res["tuning"][b.name] = {"chosen": params, "validation_recall@20": val_score, "grid": tried,
                                 "seconds": round(time.perf_counter() - t, 1)}
    for name, m in per_user.items():
        res["methods"][name] = summarise(m)
    if per_user_out is not None:
        per_user_out["users"] = [test.users[i] for i in test.eval_users]
        per_user_out["recall@20"] = {n: [round(float(x), 6) for x in m["recall@20"]]
                                     for n, m in per_user.items()}
    base = [n for n in per_user if n not in ours]
    if base:
        best = max(base, key=lambda n: per_user[n]["recall@20"].mean())
        res["best_baseline"] = best
        for name in sorted(ours & set(per_user)):
            r, lo, hi = paired_ratio_ci(per_user[name]["recall@20"], per_user[best]["recall@20"])
            res[f"{name}_vs_best_recall@20"] = {"ratio": round(r, 3), "ci_low": round(lo, 3),
                                                "ci_high": round(hi, 3)}
    return res


def evaluate(path, events: Sequence[Engagement], windows: Windows, schema: SchemaConfig,
             out_dir, labels: Mapping[str, Mapping[str, int]] | None = None,
             texts: Mapping[str, np.ndarray] | None = None,
             later_texts: Mapping[str, np.ndarray] | None = None, ks: Sequence[int] = KS,
             baselines: Sequence[B.Baseline] = B.STANDARD) -> dict:
    """Evaluate checkpoint `path` on the test window of `events`; writes metrics.json + PNGs.

    `texts`: world knowledge known at the test window's start; `later_texts`: known by its
    end, used only for the items first seen in it (cold start)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model, block, ck = load_served(path)
    _refuse_trained_on_test(path, ck, windows)
    events = sorted(events, key=lambda e: e.ts)
    before = [e for e in events if e.ts < windows.val_end]
    test = [e for e in events if e.ts >= windows.val_end]
    kinds = item_types(schema)
    known = {n for e in before for n in (e.src, e.dst)}
    cold = sorted({e.dst for e in test if e.dst not in known and node_type(e.dst) in kinds
                   and e.dst in (later_texts or {})})
    t = time.perf_counter()
    prefix = _session_prefixes(events, before, windows, schema)
    cutoff = (max(e.ts for e in prefix["test"]) if prefix["test"] else windows.val_end - 1)
    index, emb, cold_emb = state_embeddings(model, before + prefix["test"], schema, cutoff, texts,
                                            cold, later_texts, block)
    metrics: dict = {"checkpoint": ck.id, "test_events": len(test), "windows": windows.__dict__,
                     "embed_seconds": round(time.perf_counter() - t, 1),
                     "collaborative": ck.manifest.get("collaborative"),   # its lambda, weight
                     "collapse": {k: v for k, v in (ck.manifest.get("collapse") or {}).items()
                                  if k != "per_chunk"}}
    per_user: dict = {}            # task -> its users and each method's Recall@20 (PER_USER)
    for name, acts in (("next_engagement", positive_actions(schema)),
                       ("deep_funnel", deep_funnel_actions(schema))):
        if acts:
            metrics[name] = _ranking(events, before, windows, schema, acts, prefix, index, emb,
                                     model.cfg.d_emb, block, baselines, ks, per_user, name,
                                     _holdout_weights(ck.manifest))
    nodes = sorted(index, key=index.get)
    assign = _assignments(model, emb, nodes, schema)
    items = [n for n in nodes if node_type(n) in kinds]
    metrics["cold_start"] = _cold_start(emb, index, items, cold, cold_emb, before, test, ks)
    if labels:
        metrics["hierarchy"] = _hierarchy(assign, nodes, labels)
    metrics["usage_entropy"] = _usage_entropy(assign, model.cfg.levels)
    metrics["densification"] = _densification(assign, index, before)
    metrics["bom_recall@100"] = _bom_recall(emb, ck)
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2, sort_keys=True))
    (out / PER_USER).write_text(json.dumps(per_user))
    _plot(metrics, out / "recall.png")
    return metrics


def _refuse_trained_on_test(path, ck, windows: Windows) -> None:
    fitted = ck.manifest.get("data_window")
    if fitted and fitted[1] >= windows.val_end:
        raise TrainedOnTestWindow(
            f"{path}: the model was fitted on events up to {fitted[1]}, inside the test window "
            f"(from {windows.val_end}): its test figures would score what it was trained on; "
            "train with a cutoff before the test window")


def _session_prefixes(events, before, windows: Windows, schema: SchemaConfig) -> dict[str, list]:
    """Sessions first seen in a window are judged from their first half there: the state and
    the tasks hold it (`ranking.session_prefixes`); none where users are not sessions."""
    if not schema.session_users:
        return {"val": [], "test": []}
    acts = positive_actions(schema)
    return {"val": session_prefixes(before, windows.train_end, windows.val_end, acts, schema.user_type),
            "test": session_prefixes(events, windows.val_end, windows.end + 1, acts, schema.user_type)}


def _ranking(events, before, windows: Windows, schema: SchemaConfig, acts, prefix, index, emb,
             d: int, block, baselines, ks, per_user: dict, name: str,
             weights: Sequence[float] = ()) -> dict:
    """One ranking task on the test window (its baselines tuned on the validation window):
    the served inner product, each part of the served vector alone, the served vector as it
    would be at each other holdout weight of `weights` (`at_weights`), and the baselines;
    each user's figures go to `per_user[name]`."""
    kinds = item_types(schema)
    val_task = ranking_task(before, windows.train_end, windows.val_end, acts, kinds, schema.user_type,
                            [e for e in prefix["val"] if e.action in acts])
    test_task = ranking_task(events, windows.val_end, windows.end + 1, acts, kinds, schema.user_type,
                             [e for e in prefix["test"] if e.action in acts])
    if test_task.n_eval == 0:
        return {"users": 0}
    u = emb[[index[test_task.users[i]] for i in test_task.eval_users]]
    v = emb[[index[x] for x in test_task.items]]
    scores = u @ v.T                                                  # the served inner product
    # each part of the served vector alone: what it adds (diagnostics, not baselines)
    parts = {"hirflow_encoder": u[:, :d] @ v[:, :d].T}
    if block is not None and block.user_norm != 0:      # 0: the encoder alone is served
        parts["hirflow_block"] = u[:, d:] @ v[:, d:].T
        parts.update(at_weights(parts["hirflow_encoder"], parts["hirflow_block"],
                                block.settings.get("weight"), weights))
    per_user[name] = {}
    return compare(scores, test_task, val_task, baselines if val_task.n_eval else (), ks,
                   per_user[name], parts)


def at_weights(encoder: np.ndarray, block: np.ndarray, served: float | None,
               weights: Sequence[float]) -> dict[str, np.ndarray]:
    """The served scores had the holdout chosen another weight of `weights` than `served`:
    the block's share of the inner product grows with the weight (`block_fit.scaled`: c =
    weight x one unit), so at weight w it is encoder + (w / served) x block, exactly. How
    far the holdout's choice carries to the test window, weight by weight (diagnostics named
    `hirflow_at_<w>`; none when the served block is empty or its weight unknown)."""
    if not served:
        return {}
    return {f"hirflow_at_{w:g}": encoder + (w / served) * block
            for w in sorted(weights) if w not in (served, collaborative.ENCODER_ALONE)}


def _holdout_weights(manifest: Mapping) -> list[float]:
    """The weights a checkpoint's holdout scored (`collaborative.holdout.weight_recall@20`)."""
    tried = (((manifest.get("collaborative") or {}).get("holdout") or {}).get("weight_recall@20") or {})
    return [float(w) for w in tried if w != "popularity"]


def _assignments(model, emb: np.ndarray, nodes: list[str], schema: SchemaConfig) -> np.ndarray:
    """Every node's primitive at each level; the hierarchy lives in the encoder's coordinates,
    the first d_emb."""
    with torch.no_grad():
        return model.assign(torch.from_numpy(emb[:, :model.cfg.d_emb].copy()).to(model.device),
                            torch.tensor(schema.type_codes(nodes), device=model.device)).cpu().numpy()


def _usage_entropy(assign: np.ndarray, levels: Sequence[int]) -> dict:
    """Per level, the entropy of primitive usage over log K (1 = perfectly even)."""
    out = {}
    for lvl, k in enumerate(levels):
        p = np.bincount(assign[:, lvl], minlength=k) / max(1, len(assign))
        p = p[p > 0]
        out[f"level{lvl}"] = round(float(-(p * np.log(p)).sum() / np.log(k)), 4) if k > 1 else 1.0
    return out


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
    task = RankingTask(0, users, items + cold, sp.csr_matrix((len(users), len(items) + len(cold))),
                       sp.csr_matrix((len(users), len(items) + len(cold))), np.arange(len(users)),
                       [np.array(sorted(truth_map[u])) for u in users], 0, 0)
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
        m = per_user_metrics(sc, task, ks)
        for k in ks:
            res[f"{method}_recall@{k}"] = round(float(m[f"recall@{k}"].mean()), 4)
            res[f"{method}_ndcg@{k}"] = round(float(m[f"ndcg@{k}"].mean()), 4)
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
    q = BoMQuantizer.from_codebooks(ck.codebooks, QuantizerConfig.of_manifest(ck.manifest["quantizer"]))
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


def _plot(metrics: dict, path: Path) -> None:
    """Recall@20 with its 95 % interval per method, one panel per task."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    tasks = [n for n in ("next_engagement", "deep_funnel") if metrics.get(n, {}).get("methods")]
    fig, axes = plt.subplots(1, len(tasks) + 1, figsize=(6 * (len(tasks) + 1), 4), squeeze=False)
    for ax, name in zip(axes[0], tasks):
        res = metrics[name]["methods"]
        methods = sorted(res, key=lambda m: res[m]["recall@20"]["mean"])
        mean = np.array([res[m]["recall@20"]["mean"] for m in methods])
        err = np.array([[mean[i] - res[m]["recall@20"]["ci_low"], res[m]["recall@20"]["ci_high"] - mean[i]]
                        for i, m in enumerate(methods)]).T
        ax.barh(methods, mean, xerr=err, color=["C3" if m == "hirflow" else "C0" for m in methods])
        ax.set_xlabel("Recall@20 (new items, 95% CI over users)")
        ax.set_title(f"{name} ({metrics[name]['users']} users)")
    cold = metrics.get("cold_start", {})
    ax = axes[0][-1]
    methods = [m for m in ("hirflow", "popularity") if f"{m}_recall@20" in cold]
    ax.bar(methods, [cold[f"{m}_recall@20"] for m in methods], color=["C3", "C0"][:len(methods)])
    ax.set_title(f"cold start ({cold.get('users', 0)} users)")
    ax.set_ylabel("Recall@20")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
