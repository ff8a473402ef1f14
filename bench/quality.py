"""Model quality benchmark: hirflow's served embeddings, and each of their two parts alone,
against the baselines on five data sets, with the evaluation protocol of `trainer.evaluate`
(global time split, new items only, baselines tuned on validation, bootstrap intervals over
users).

Data sets (a file argument or environment variable each; a data set without one is
skipped): the synthetic world (always), UCI Online Retail (`--online-retail`,
$HIRFLOW_ONLINE_RETAIL; next purchase), CiaoDVD ratings (`--ciaodvd`, $HIRFLOW_CIAODVD;
positives are ratings of 4-5), the Taobao UserBehavior head (`--taobao`, $HIRFLOW_TAOBAO;
a pv/fav/cart/buy funnel) and YOOCHOOSE click sessions (`--yoochoose DIR` with session-rec's
train_full and test files, $HIRFLOW_YOOCHOOSE; sessions are the unit: a session first seen in
a window is judged on its later clicks given its earlier ones, `SchemaConfig.session_users`).
Configs: `configs/<name>.toml`.

Per data set and seed: train on everything before the test window (last 10 % of events in
time), then rank each user's unseen items at its start by the served embedding's inner
product, by its encoder part and by its collaborative block alone, against popularity (all
time and recent), item-kNN, EASE^R (binary, and on recency-weighted pairs), ALS and the
LightGCN-style propagation, each tuned on the validation window (the 10 % before it).
Reports Recall@20 / NDCG@20 with 95 % intervals, the paired ratios to the best baseline,
the encoder's collapse health, training time and peak memory; with several `--seeds` the
runs are pooled too (`bench.protocols.pooling`).

    python bench/quality.py [--quick] [--only NAME ...] [--seeds 0 1 2] [--online-retail FILE]
                            [--ciaodvd FILE] [--taobao FILE] [--yoochoose DIR]
                            [--no-knowledge] [--device cpu|cuda] [--out DIR [--reuse]]
    python bench/quality.py --pool DIR [DIR ...]

--quick: small slices, two steps per day, one or two grid points per baseline: checks the
pipeline, its figures mean little. The last line printed is one JSON object of the figures.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from hirflow.encoder.model import EncoderConfig  # noqa: E402
from hirflow.state.events import Engagement, Validator  # noqa: E402
from hirflow.state.schema import SchemaConfig  # noqa: E402
from hirflow.streams import config as config_mod  # noqa: E402
from hirflow.streams.tools.replay import read_events  # noqa: E402
from hirflow.streams.tools.synth import SynthConfig, SynthWorld  # noqa: E402
from hirflow.trainer import baselines as B  # noqa: E402
from hirflow.trainer.data import chronological_windows, world_knowledge  # noqa: E402
from hirflow.trainer.evaluate import PER_USER, category_labels, evaluate  # noqa: E402
from bench.protocols.pooling import pool  # noqa: E402
from hirflow.trainer.train import TrainConfig, train  # noqa: E402

warnings.filterwarnings("ignore")
ROOT = Path(__file__).resolve().parent.parent
DAY = 86_400_000


def _read(path: Path, config: str, fmt: str, quick_days: float, quick: bool):
    """A data set's events through its adapter and config; with `quick`, its last days."""
    schema = config_mod.load(ROOT / "configs" / f"{config}.toml", env={}).schema
    evs, ents = [], []
    for e in read_events(path, fmt, Validator(schema, now_ms=lambda: 2 ** 62)):
        (evs if isinstance(e, Engagement) else ents).append(e)
    if quick:
        lo = max(e.ts for e in evs) - int(quick_days * DAY)
        evs = [e for e in evs if e.ts >= lo]
    return schema, evs, ents, None


def online_retail(path: Path, quick: bool):
    return _read(path, "online_retail", "online-retail", 14, quick)


def ciaodvd(path: Path, quick: bool):
    return _read(path, "ciaodvd", "ciaodvd", 365, quick)


def taobao(path: Path, quick: bool):
    schema, evs, ents, _ = _read(path, "taobao", "taobao", 2, quick)
    return schema, evs, ents, category_labels(evs)


def yoochoose(folder: Path, quick: bool):
    """session-rec's train_full and test files of the 100k sample, as one stream."""
    files = sorted(Path(folder).glob("*train_full*")) + sorted(Path(folder).glob("*_test*"))
    if not files:
        raise SystemExit(f"{folder}: no *train_full* / *_test* files of YOOCHOOSE")
    parts = [_read(f, "yoochoose", "yoochoose", 2, quick) for f in files]
    evs = sorted((e for p in parts for e in p[1]), key=lambda e: e.ts)
    return parts[0][0], evs, [], None


def synthetic(path, quick: bool):
    world = SynthWorld(SynthConfig(events=4000 if quick else 60_000, users=100 if quick else 1500,
                                   seed=7, span_days=6 if quick else 28, late_launch=0.5))
    evs, ents = [], []
    for e in world.stream():
        (evs if isinstance(e, Engagement) else ents).append(e)
    labels = {r["node"]: r for r in world.labels() if "fine" in r}
    return SchemaConfig(), evs, ents, labels


# name -> (loader, its path's environment variable; None: needs no file)
DATASETS = {"synthetic": (synthetic, None), "online_retail": (online_retail, "HIRFLOW_ONLINE_RETAIL"),
            "ciaodvd": (ciaodvd, "HIRFLOW_CIAODVD"), "taobao": (taobao, "HIRFLOW_TAOBAO"),
            "yoochoose": (yoochoose, "HIRFLOW_YOOCHOOSE")}


def run(name, schema, evs, ents, labels, a, seed: int, encode, out: Path, baselines: bool = True) -> dict:
    """Train and evaluate one seed; without `baselines` only hirflow and its parts are
    scored (the baselines are deterministic on the split: pooling takes them from the runs
    that scored them)."""
    w = chronological_windows([e.ts for e in evs], train=0.8, val=0.1)
    fit_end = w.val_end if a.fit_validation else w.train_end
    train_evs = [e for e in evs if e.ts < fit_end]
    texts = later = None
    if encode is not None and ents:
        texts = world_knowledge(ents, w.val_end - 1, encode)
        later = world_knowledge(ents, w.end, encode)
    levels = (4, 16, 64) if a.quick else (16, 128, 1024)
    enc = EncoderConfig.for_schema(schema, levels=levels)
    cfg = TrainConfig(seed=seed, snapshot_chunks=0, steps_per_chunk=2 if a.quick else None,
                      sampled_negatives=a.sampled_negatives)
    stats: dict = {}
    t = time.perf_counter()
    earlier = sorted((out / f"{name}-ck").glob("ckpt-*")) if a.reuse else []
    if earlier:                 # --reuse: score the checkpoint a run with this --out trained
        ck = earlier[-1]
        print(f"{name}: reusing {ck} (not trained again)")
    else:
        ck = train(train_evs, schema, enc, cfg, out / f"{name}-ck", texts=texts, device=a.device,
                   progress=not a.quick, stats=stats)
    train_s = time.perf_counter() - t
    t = time.perf_counter()
    m = evaluate(ck, evs, w, schema, out / f"{name}-eval", labels=labels, texts=texts, later_texts=later,
                 baselines=() if not baselines else B.QUICK if a.quick else B.STANDARD)
    eval_s = time.perf_counter() - t
    res = m[task_of(name)]
    if not res.get("methods"):
        print(f"{name}: no test users with a history (nothing to rank)")
        return {"test_users": {"value": 0, "unit": "users"}}
    trained = (f"{stats['steps']} steps ({stats['passes']} passes) in {train_s:.0f} s" if stats
               else "reused checkpoint")
    print(f"{name} (seed {seed}): {len(train_evs):,} training events, {trained}; {res['users']} test "
          f"users, {res['new_positives']} new / {res['repeat_positives']} repeat positives")
    at = sorted((m_ for m_ in res["methods"] if m_.startswith("hirflow_at_")),
                key=lambda m_: float(m_.rsplit("_", 1)[1]))     # the holdout's other weights
    for meth, r in sorted(res["methods"].items(), key=lambda kv: -kv[1]["recall@20"]["mean"]):
        if meth in at:
            continue
        rc, nd = r["recall@20"], r["ndcg@20"]
        print(f"  {meth:22s} Recall@20 {rc['mean']:.4f} [{rc['ci_low']:.4f}, {rc['ci_high']:.4f}]  "
              f"NDCG@20 {nd['mean']:.4f}")
    chosen = (m.get("collaborative") or {}).get("holdout") or {}
    collapse = m.get("collapse") or {}
    for part in ("hirflow", "hirflow_encoder", "hirflow_block"):
        if f"{part}_vs_best_recall@20" in res:
            vs = res[f"{part}_vs_best_recall@20"]
            print(f"  {part} / {res['best_baseline']}: {vs['ratio']:.3f} [{vs['ci_low']:.3f}, {vs['ci_high']:.3f}]")
    if at and "best_baseline" in res:
        print("  served at the holdout's other weights, / best: " + ", ".join(
            f"{m_.rsplit('_', 1)[1]} {res[f'{m_}_vs_best_recall@20']['ratio']:.3f}" for m_ in at))
    print(f"  block weight {chosen.get('weight')} ({chosen.get('why')}); item directions' mean cosine "
          f"{collapse.get('mean_cosine')}, effective rank {collapse.get('effective_rank')}, positives "
          f"without a negative {collapse.get('no_negative')}; usage entropy {m['usage_entropy']}", flush=True)
    out_ = {f"{meth}_recall@20": {"value": r["recall@20"]["mean"], "unit": "recall",
                                  "ci95": [r["recall@20"]["ci_low"], r["recall@20"]["ci_high"]]}
            for meth, r in res["methods"].items()}
    out_.update({f"{meth}_ndcg@20": {"value": r["ndcg@20"]["mean"], "unit": "ndcg",
                                     "ci95": [r["ndcg@20"]["ci_low"], r["ndcg@20"]["ci_high"]]}
                 for meth, r in res["methods"].items()})
    for part in ("hirflow", "hirflow_encoder", "hirflow_block", *at):
        if f"{part}_vs_best_recall@20" in res:
            vs = res[f"{part}_vs_best_recall@20"]
            out_[f"{part}_recall@20"]["ratio_to_best_baseline"] = vs["ratio"]
            out_[f"{part}_recall@20"]["ratio_ci95"] = [vs["ci_low"], vs["ci_high"]]
    out_["best_baseline"] = res.get("best_baseline")
    out_["block_weight"] = {"value": chosen.get("weight"), "unit": "weight", "why": chosen.get("why")}
    out_["collapse"] = {"value": collapse.get("mean_cosine"), "unit": "mean cosine",
                        "effective_rank": collapse.get("effective_rank"),
                        "no_negative": collapse.get("no_negative"), "collapsed": collapse.get("collapsed")}
    out_["test_users"] = {"value": res["users"], "unit": "users"}
    out_["usage_entropy_min"] = {"value": min(m["usage_entropy"].values()), "unit": "fraction of log K",
                                 "ratio_to_goal_0.9": round(min(m["usage_entropy"].values()) / 0.9, 3)}
    if "hierarchy" in m:
        out_["nmi"] = {k: v["nmi"] for k, v in m["hierarchy"].items()}
    if stats:
        out_["train_time"] = {"value": round(train_s, 1), "unit": "s", "steps": stats["steps"],
                              "passes": stats["passes"], "events": len(train_evs)}
    out_["eval_time"] = {"value": round(eval_s, 1), "unit": "s"}
    out_["peak_rss"] = {"value": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024), "unit": "MB"}
    return out_


def task_of(name: str) -> str:
    """The task a data set is judged on: Online Retail's purchases are its deep funnel."""
    return "deep_funnel" if name == "online_retail" else "next_engagement"


def pool_runs(dirs: list[Path]) -> dict:
    """Each data set that every `--out` directory of `dirs` has evaluated, its runs pooled
    (`bench.protocols.pooling`): per run and over the runs, against the best baseline."""
    figures: dict = {"runs": [str(d) for d in dirs]}
    for name in DATASETS:
        files = [d / f"{name}-eval" / PER_USER for d in dirs]
        if not all(f.exists() for f in files):
            continue
        tasks = [json.loads(f.read_text()).get(task_of(name)) for f in files]
        if not all(t and t.get("users") for t in tasks):
            continue
        p = pool(tasks)
        print(f"{name}: {p['runs']} runs, {p['users']} test users; best baseline "
              f"{p['best_baseline']} Recall@20 {p['best_baseline_recall@20']:.4f}")
        for d, r in zip(dirs, p["per_run"]):
            print(f"  {str(d):40s} Recall@20 {r['recall@20']:.4f}  ratio {r['ratio']:.3f} "
                  f"[{r['ci95'][0]:.3f}, {r['ci95'][1]:.3f}]")
        print(f"  {'users averaged over the runs':40s} Recall@20 {p['recall@20']:.4f}  ratio "
              f"{p['ratio']:.3f} [{p['ci95'][0]:.3f}, {p['ci95'][1]:.3f}]; parts per run "
              f"{p['parts_ratio']}", flush=True)
        ratios = [r["ratio"] for r in p["per_run"]]
        figures[name] = {"hirflow_recall@20": {"value": p["recall@20"], "unit": "recall",
                                               "ratio_to_best_baseline": p["ratio"],
                                               "ratio_ci95": p["ci95"]},
                         "best_baseline": p["best_baseline"],
                         "ratio_per_run": {"value": ratios, "unit": "ratio",
                                           "median": float(np.median(ratios)), "worst": min(ratios)},
                         "parts_ratio_per_run": p["parts_ratio"],
                         "runs": {"value": p["runs"], "unit": "runs"}}
    return figures


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small slices, a few steps (about a minute)")
    for name, (_, env) in DATASETS.items():
        if env:
            ap.add_argument(f"--{name.replace('_', '-')}", type=Path, default=os.environ.get(env),
                            metavar="DIR" if name == "yoochoose" else "FILE",
                            help=f"the {name} data (default ${env}; skipped without it)")
    ap.add_argument("--only", nargs="+", choices=list(DATASETS), help="these data sets only")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0],
                    help="training seeds (the data sets are fixed); several are pooled")
    ap.add_argument("--sampled-negatives", type=int, default=TrainConfig.sampled_negatives,
                    help="items drawn per training step from the whole item pool as negatives")
    ap.add_argument("--baselines", action=argparse.BooleanOptionalAction, default=True,
                    help="score the baselines (default: with the first seed only; they are "
                         "deterministic on a split, and pooling takes them from that run)")
    ap.add_argument("--fit-validation", action=argparse.BooleanOptionalAction, default=True,
                    help="fit the model on the training and validation windows, everything before "
                         "the test window, as each baseline is refitted (default: on); off: the "
                         "training window only")
    ap.add_argument("--knowledge", action=argparse.BooleanOptionalAction, default=None,
                    help="MiniLM texts as world knowledge (default: on, off with --quick)")
    ap.add_argument("--device", choices=["cpu", "cuda"])
    ap.add_argument("--out", type=Path, help="keep checkpoints and metrics here (OUT/seed-N)")
    ap.add_argument("--reuse", action="store_true",
                    help="with --out: evaluate the checkpoints an earlier run left there instead "
                         "of training again")
    ap.add_argument("--pool", type=Path, nargs="+", metavar="OUT",
                    help="train nothing: pool the evaluations of earlier runs' seed directories")
    a = ap.parse_args()
    if a.pool:
        print(json.dumps(pool_runs(a.pool)))
        return
    if a.reuse and not a.out:
        ap.error("--reuse needs --out (the directory of the run whose checkpoints to reuse)")
    logging.basicConfig(level=logging.WARNING)
    a.device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    encode = None
    if a.knowledge if a.knowledge is not None else not a.quick:
        from hirflow.encoder.knowledge import TextEncoder
        encode = TextEncoder().encode
    figures: dict = {"device": a.device, "quick": a.quick, "seeds": a.seeds}
    with tempfile.TemporaryDirectory(prefix="hirflow-quality-") as tmp:
        root = a.out or Path(tmp)
        for name, (load, env) in DATASETS.items():
            if a.only and name not in a.only:
                continue
            path = getattr(a, name, None) if env else None
            if env and not (path and Path(path).exists()):
                print(f"{name}: skipped (no --{name.replace('_', '-')} / ${env})")
                continue
            data = load(Path(path) if path else None, a.quick)
            runs = {}
            for k, seed in enumerate(a.seeds):
                runs[f"seed{seed}"] = run(name, *data, a, seed, encode, root / f"seed-{seed}",
                                          baselines=a.baselines and k == 0)
            figures[name] = runs
        if len(a.seeds) > 1:
            figures["pooled"] = pool_runs([root / f"seed-{s}" for s in a.seeds])
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
