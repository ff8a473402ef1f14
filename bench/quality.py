"""Model quality benchmark: hirflow's served embeddings against the baselines, on real data
(UCI Online Retail) and on the synthetic world, with the evaluation protocol of
`trainer.evaluate` (global time split, new items only, baselines tuned on validation,
bootstrap intervals over users).

Per data set: train on the training window (first 80 % of events in time; fixed seed), then
rank each user's unseen items at the start of the test window (last 10 %) by the served
embedding's inner product, against popularity (all time and recent), item-kNN, EASE^R
(fitted binary, and on recency-weighted pairs), ALS and LightGCN-style propagation, each
tuned on the validation window (the 10 % between).
Reports Recall@20 / NDCG@20 with 95 % intervals, the paired ratio to the best baseline,
training time and peak memory.

    python bench/quality.py [--quick] [--online-retail FILE] [--no-knowledge] [--no-unit-users]
                            [--weight-rule best|one_se] [--weight-windows N]
                            [--recency-days DAYS]
                            [--recency-rule mix|choose] [--fit-days DAYS]
                            [--fit-rule scales|choose] [--factorization reduced_rank|svd]
                            [--next-periods N] [--next-weight W]
                            [--device cpu|cuda] [--seed N] [--out DIR [--reuse]]
    python bench/quality.py --pool DIR [DIR ...]

The Online Retail file (`online_retail.csv.gz`, see `streams/adapters/online_retail.py`) is
read from --online-retail or $HIRFLOW_ONLINE_RETAIL; without it that data set is skipped.
--quick: the last two weeks of Online Retail and a small synthetic world, two steps per
day, one or two grid points per baseline: checks the pipeline, its figures mean little.
--pool: the runs of several seeds together (`--seed N --out DIR_N` each, then `--pool
DIR_0 DIR_1 ...`): one run's interval covers another sample of users, not another training
seed, which moves the ratio to the best baseline by several per cent.
The last line printed is one JSON object of the figures.
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

import torch  # noqa: E402

from hirflow.encoder.collaborative import CollaborativeConfig  # noqa: E402
from hirflow.encoder.model import EncoderConfig  # noqa: E402
from hirflow.state.events import Engagement, Validator  # noqa: E402
from hirflow.state.schema import SchemaConfig  # noqa: E402
from hirflow.streams import config as config_mod  # noqa: E402
from hirflow.streams.replay import read_events  # noqa: E402
from hirflow.streams.synth import SynthConfig, SynthWorld  # noqa: E402
from hirflow.trainer import baselines as B  # noqa: E402
from hirflow.trainer.data import chronological_windows, world_knowledge  # noqa: E402
from hirflow.trainer.evaluate import PER_USER, evaluate  # noqa: E402
from hirflow.trainer.pooling import pool  # noqa: E402
from hirflow.trainer.train import TrainConfig, train  # noqa: E402

warnings.filterwarnings("ignore")
ROOT = Path(__file__).resolve().parent.parent
DAY = 86_400_000


def online_retail(path: Path, quick: bool):
    schema = config_mod.load(ROOT / "configs" / "online_retail.toml", env={}).schema
    evs, ents = [], []
    for e in read_events(path, "online-retail", Validator(schema, now_ms=lambda: 2 ** 62)):
        (evs if isinstance(e, Engagement) else ents).append(e)
    if quick:
        lo = max(e.ts for e in evs) - 14 * DAY
        evs = [e for e in evs if e.ts >= lo]
    return schema, evs, ents, None


def synthetic(quick: bool):
    world = SynthWorld(SynthConfig(events=4000 if quick else 60_000, users=100 if quick else 1500,
                                   seed=7, span_days=6 if quick else 28, late_launch=0.5))
    evs, ents = [], []
    for e in world.stream():
        (evs if isinstance(e, Engagement) else ents).append(e)
    labels = {r["node"]: r for r in world.labels() if "fine" in r}
    return SchemaConfig(), evs, ents, labels


def run(name, schema, evs, ents, labels, a, encode, out: Path) -> dict:
    w = chronological_windows([e.ts for e in evs], train=0.8, val=0.1)
    fit_end = w.val_end if a.fit_validation else w.train_end
    train_evs = [e for e in evs if e.ts < fit_end]
    texts = later = None
    if encode is not None and ents:
        texts = world_knowledge(ents, w.val_end - 1, encode)
        later = world_knowledge(ents, w.end, encode)
    levels = (4, 16, 64) if a.quick else (16, 128, 1024)
    enc = EncoderConfig.for_schema(schema, levels=levels, score_bias=a.score_bias)
    cfg = TrainConfig(seed=a.seed, passes=a.passes, lr_end=a.lr_end, snapshot_chunks=0,
                      max_steps_per_chunk=2 if a.quick else None,
                      collaborative=CollaborativeConfig(unit_users=a.unit_users, weight_rule=a.weight_rule,
                                                        weight_windows=a.weight_windows,
                                                        recency_days=a.recency_days,
                                                        recency_rule=a.recency_rule,
                                                        fit_days=a.fit_days, fit_rule=a.fit_rule,
                                                        factorization=a.factorization,
                                                        next_periods=a.next_periods,
                                                        next_weight=a.next_weight))
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
                 baselines=B.QUICK if a.quick else B.STANDARD)
    eval_s = time.perf_counter() - t
    res = m[task_of(name)]
    trained = (f"{stats['steps']} steps ({stats['passes']} passes) in {train_s:.0f} s" if stats
               else "reused checkpoint")
    print(f"{name}: {len(train_evs):,} training events, {trained}; "
          f"{res['users']} test users, {res['new_positives']} new / {res['repeat_positives']} repeat positives")
    for meth, r in sorted(res["methods"].items(), key=lambda kv: -kv[1]["recall@20"]["mean"]):
        rc, nd = r["recall@20"], r["ndcg@20"]
        print(f"  {meth:22s} Recall@20 {rc['mean']:.4f} [{rc['ci_low']:.4f}, {rc['ci_high']:.4f}]  "
              f"NDCG@20 {nd['mean']:.4f}")
    vs = res["hirflow_vs_best_recall@20"]
    print(f"  hirflow / {res['best_baseline']}: {vs['ratio']:.3f} [{vs['ci_low']:.3f}, {vs['ci_high']:.3f}]; "
          f"usage entropy {m['usage_entropy']}; cold start hirflow "
          f"{m['cold_start'].get('hirflow_recall@20')} vs popularity {m['cold_start'].get('popularity_recall@20')}",
          flush=True)
    out_ = {f"{meth}_recall@20": {"value": r["recall@20"]["mean"], "unit": "recall",
                                  "ci95": [r["recall@20"]["ci_low"], r["recall@20"]["ci_high"]]}
            for meth, r in res["methods"].items()}
    out_.update({f"{meth}_ndcg@20": {"value": r["ndcg@20"]["mean"], "unit": "ndcg",
                                     "ci95": [r["ndcg@20"]["ci_low"], r["ndcg@20"]["ci_high"]]}
                 for meth, r in res["methods"].items()})
    out_["hirflow_recall@20"]["ratio_to_best_baseline"] = vs["ratio"]
    out_["hirflow_recall@20"]["ratio_ci95"] = [vs["ci_low"], vs["ci_high"]]
    out_["best_baseline"] = res["best_baseline"]
    out_["test_users"] = {"value": res["users"], "unit": "users"}
    out_["usage_entropy_min"] = {"value": min(m["usage_entropy"].values()), "unit": "fraction of log K",
                                 "ratio_to_goal_0.9": round(min(m["usage_entropy"].values()) / 0.9, 3)}
    cold = m["cold_start"]
    if "hirflow_recall@20" in cold:
        pop = cold["popularity_recall@20"]
        out_["cold_start_recall@20"] = {"value": cold["hirflow_recall@20"], "unit": "recall",
                                        "users": cold["users"], "popularity": pop,
                                        "ratio_to_popularity": round(cold["hirflow_recall@20"] / pop, 3) if pop else None}
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
    (`trainer.pooling`): per run and over the runs, against the best baseline."""
    figures: dict = {"runs": [str(d) for d in dirs]}
    for name in ("online_retail", "synthetic"):
        files = [d / f"{name}-eval" / PER_USER for d in dirs]
        if not all(f.exists() for f in files):
            print(f"{name}: skipped (not every directory has {name}-eval/{PER_USER})")
            continue
        p = pool([json.loads(f.read_text())[task_of(name)] for f in files])
        print(f"{name}: {p['runs']} runs, {p['users']} test users; best baseline "
              f"{p['best_baseline']} Recall@20 {p['best_baseline_recall@20']:.4f}")
        for d, r in zip(dirs, p["per_run"]):
            print(f"  {str(d):40s} Recall@20 {r['recall@20']:.4f}  ratio {r['ratio']:.3f} "
                  f"[{r['ci95'][0]:.3f}, {r['ci95'][1]:.3f}]")
        print(f"  {'users averaged over the runs':40s} Recall@20 {p['recall@20']:.4f}  ratio "
              f"{p['ratio']:.3f} [{p['ci95'][0]:.3f}, {p['ci95'][1]:.3f}]", flush=True)
        figures[name] = {"hirflow_recall@20": {"value": p["recall@20"], "unit": "recall",
                                               "ratio_to_best_baseline": p["ratio"],
                                               "ratio_ci95": p["ci95"]},
                         "best_baseline": p["best_baseline"],
                         "ratio_per_run": {"value": [r["ratio"] for r in p["per_run"]],
                                           "unit": "ratio"},
                         "runs": {"value": p["runs"], "unit": "runs"}}
    return figures


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small slices, a few steps (about a minute)")
    ap.add_argument("--online-retail", type=Path, default=os.environ.get("HIRFLOW_ONLINE_RETAIL"),
                    help="the Online Retail CSV (.gz); default $HIRFLOW_ONLINE_RETAIL")
    ap.add_argument("--only", choices=["online_retail", "synthetic"])
    ap.add_argument("--passes", type=int, default=1, help="shuffled passes over each day's events")
    ap.add_argument("--lr-end", type=float, default=TrainConfig.lr_end,
                    help="the learning rate's last value, as a share of its peak (cosine schedule)")
    ap.add_argument("--fit-validation", action=argparse.BooleanOptionalAction, default=True,
                    help="fit the model on the training and validation windows, everything before "
                         "the test window, as each baseline is refitted (default: on); off: the "
                         "training window only")
    ap.add_argument("--score-bias", action=argparse.BooleanOptionalAction, default=True,
                    help="the embedding's score coordinate (a learned item bias; default: on)")
    ap.add_argument("--unit-users", action=argparse.BooleanOptionalAction, default=True,
                    help="users' collaborative blocks of fixed length (default: on); off: their "
                         "plain sums, whose share of the score grows with a user's history")
    ap.add_argument("--weight-rule", choices=["best", "one_se"], default="best",
                    help="how the trainer's holdout picks the block's weight: the best (default), "
                         "or the lightest within one standard error of the best")
    ap.add_argument("--weight-windows", type=int, default=1, metavar="N",
                    help="successive holdout windows (10 %% each) whose users together choose "
                         "the block's weight (default: 1, the last alone)")
    ap.add_argument("--recency-days", type=float, default=None, metavar="DAYS",
                    help="tau of the recency weights of a user's items in its collaborative block "
                         "(0: all alike; default: as --recency-rule says)")
    ap.add_argument("--recency-rule", choices=["mix", "choose"], default="mix",
                    help="without --recency-days: a user's items weighted by the mean of their "
                         "recency weights at several taus (default), or by one tau chosen by the "
                         "trainer's holdout")
    ap.add_argument("--fit-days", type=float, default=None, metavar="DAYS",
                    help="tau of the pairs' recency weights in the block's EASE^R fit (0: all "
                         "alike; default: as --fit-rule says)")
    ap.add_argument("--fit-rule", choices=["scales", "choose"], default="scales",
                    help="without --fit-days: the block's EASE^R fitted at several recency scales "
                         "and the fits summed (default), or one tau chosen with lambda by the "
                         "trainer's holdout")
    ap.add_argument("--factorization", choices=["reduced_rank", "svd"], default="reduced_rank",
                    help="how the block's EASE^R weights are cut to its rank: the rank-r model "
                         "closest to EASE^R's scores of the training users (default), or the "
                         "weights' truncated SVD")
    ap.add_argument("--next-periods", type=int, default=2, metavar="N",
                    help="periods of the next-period regression added to the block's EASE^R "
                         "(each as long as the trainer's holdout window; 0: none; default 2)")
    ap.add_argument("--next-weight", type=float, default=None, metavar="W",
                    help="its score spread over EASE^R's (default: chosen by the trainer's holdout)")
    ap.add_argument("--knowledge", action=argparse.BooleanOptionalAction, default=None,
                    help="MiniLM texts as world knowledge (default: on, off with --quick)")
    ap.add_argument("--device", choices=["cpu", "cuda"])
    ap.add_argument("--seed", type=int, default=0, help="training seed (the data sets are fixed)")
    ap.add_argument("--out", type=Path, help="keep checkpoints and metrics here")
    ap.add_argument("--reuse", action="store_true",
                    help="with --out: evaluate the checkpoint an earlier run left there instead "
                         "of training again")
    ap.add_argument("--pool", type=Path, nargs="+", metavar="OUT",
                    help="train nothing: pool the evaluations of earlier runs' --out directories "
                         "(e.g. one per --seed), each run's ratio to the best baseline and the "
                         "users' Recall@20 averaged over the runs")
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
    figures: dict = {"device": a.device, "quick": a.quick}
    with tempfile.TemporaryDirectory(prefix="hirflow-quality-") as tmp:
        out = a.out or Path(tmp)
        if a.only in (None, "online_retail"):
            if a.online_retail and Path(a.online_retail).exists():
                figures["online_retail"] = run("online_retail", *online_retail(Path(a.online_retail), a.quick),
                                               a, encode, out)
            else:
                print("online_retail: skipped (no --online-retail file)")
        if a.only in (None, "synthetic"):
            figures["synthetic"] = run("synthetic", *synthetic(a.quick), a, encode, out)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
