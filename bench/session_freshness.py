"""What each second of freshness is worth on real click streams: next-click HitRate@20 and
MRR@20 of the served vector refreshed after every click (staleness 0) and 10 s, 1 min,
10 min, 1 h, 1 d stale, or never refreshed since training, beside the session-based
baselines (most-popular-recent, co-occurrence and sequential rules on the last click, session
kNN, V-SKNN, EASE^R on the session's clicks), each tuned on the validation window and fresh.
See `bench.protocols.session_freshness` and `bench.protocols.next_click` for the protocol.

Data sets: YOOCHOOSE (`--yoochoose DIR`: session-rec's train_full and test files; the test
window is the test file's day, as session-rec splits it) and the Taobao UserBehavior head
(`--taobao FILE`; the test window is the last 10 % of events). The model is trained on
everything before the test window with `hirflow train`'s defaults (or `--checkpoint
NAME=DIR`); the validation window, of the test window's length just before it, tunes the
baselines only.

    python bench/session_freshness.py [--quick] [--yoochoose DIR] [--taobao FILE] [--seed N] [--out DIR]

--quick: YOOCHOOSE's last training day and the test day's first two hours, two steps
per chunk, one grid point per baseline (checks the pipeline, within a minute).
Writes session_freshness.png to --out (or the working directory). The last line printed is
one JSON object of the figures.
"""
from __future__ import annotations

import argparse
import gzip
import json
import logging
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from bench.quality import taobao, yoochoose  # noqa: E402
from hirflow.encoder.model import EncoderConfig  # noqa: E402
from bench.protocols import session_baselines as SB  # noqa: E402
from hirflow.trainer.data import chronological_windows  # noqa: E402
from hirflow.trainer.evaluate import item_types, load_served, positive_actions  # noqa: E402
from bench.protocols.next_click import grouped_ratio_ci, hit_and_rr, next_click_task, summary  # noqa: E402
from bench.protocols.session_freshness import NEVER, STALENESS, session_freshness  # noqa: E402
from hirflow.trainer.train import TrainConfig, train  # noqa: E402

warnings.filterwarnings("ignore")
HOUR = 3_600_000


def yoochoose_split(folder: Path, quick: bool):
    """The events and session-rec's test window start (the test file's first click)."""
    schema, evs, _, _ = yoochoose(folder, False)
    test = sorted(Path(folder).glob("*_test*"))[0]
    with (gzip.open(test, "rt") if test.suffix == ".gz" else open(test)) as f:
        next(f)
        lo = min(int(round(float(line.split("\t")[2]) * 1000)) for line in f if line.strip())
    hi = max(e.ts for e in evs) + 1
    if quick:
        evs = [e for e in evs if lo - 24 * HOUR <= e.ts < lo + 2 * HOUR]
        hi = lo + 2 * HOUR
    return schema, evs, lo, hi


def taobao_split(path: Path, quick: bool):
    schema, evs, _, _ = taobao(path, quick)
    w = chronological_windows([e.ts for e in evs], train=0.8, val=0.1)
    return schema, evs, w.val_end, w.end + 1


def ratio(a_rank, b_rank, groups) -> dict:
    a, _ = hit_and_rr(a_rank)
    b, _ = hit_and_rr(b_rank)
    r, lo, hi = grouped_ratio_ci(a, b, groups)
    return {"value": round(r, 3), "ci95": [round(lo, 3), round(hi, 3)]}


def run(name: str, schema, evs, lo: int, hi: int, a, out: Path) -> dict:
    positive, types = positive_actions(schema), item_types(schema)
    test = next_click_task(evs, lo, hi, positive, schema.user_type, types)
    val = next_click_task(evs, lo - (hi - lo), lo, positive, schema.user_type, types)
    print(f"{name}: {len(test):,} test queries from {len(set(test.node.tolist())):,} nodes over "
          f"{len(test.items):,} items; {len(val):,} validation queries", flush=True)
    if name in a.checkpoints:
        ck = a.checkpoints[name]
    else:
        enc = EncoderConfig.for_schema(schema, levels=(4, 16, 64) if a.quick else (16, 128, 1024))
        cfg = TrainConfig(seed=a.seed, snapshot_chunks=0, steps_per_chunk=2 if a.quick else None)
        t = time.perf_counter()
        ck = train([e for e in evs if e.ts < lo], schema, enc, cfg, out / f"{name}-ck", progress=not a.quick)
        print(f"{name}: trained in {time.perf_counter() - t:.0f} s", flush=True)
    model, block, manifest = load_served(ck)
    fitted = manifest.manifest.get("data_window")
    if fitted and fitted[1] >= lo:
        raise SystemExit(f"{name}: the checkpoint saw events up to {fitted[1]}, inside the test window "
                         f"(from {lo}): train one on the events before it")
    cutoff = fitted[1] + 1 if fitted else lo
    staleness = dict(STALENESS)
    t = time.perf_counter()
    served = session_freshness(model, block, evs, schema, test, cutoff, staleness,
                               progress=lambda i, n: print(f"  {name}: {i}/{n} refreshes", end="\r", flush=True))
    served_s = time.perf_counter() - t
    print(f"\n{name}: served vectors at every staleness in {served_s:.0f} s", flush=True)
    baselines, chosen = {}, {}
    for b in SB.QUICK if a.quick else SB.BASELINES:
        t = time.perf_counter()
        params, val_hit, _ = SB.tune(b, val)
        baselines[b.name] = SB.score_on(b, params, test)
        chosen[b.name] = {"params": params, "validation_hit@20": round(val_hit, 4)}
        print(f"  {b.name}: {params} (validation HitRate@20 {val_hit:.4f}; {time.perf_counter() - t:.0f} s)",
              flush=True)
    best = max(chosen, key=lambda n: chosen[n]["validation_hit@20"])
    groups = test.node
    table = {f"hirflow@{s}": summary(r, groups) for s, r in served.items()}
    table.update({n: summary(r, groups) for n, r in baselines.items()})
    print(f"{name}: next click, {len(test):,} queries (95 % intervals over nodes)")
    print(f"  {'method':22s} HitRate@20               MRR@20")
    for meth, r in table.items():
        h, m = r["hit@20"], r["mrr@20"]
        print(f"  {meth:22s} {h['mean']:.4f} [{h['ci95'][0]:.4f}, {h['ci95'][1]:.4f}]  "
              f"{m['mean']:.4f} [{m['ci95'][0]:.4f}, {m['ci95'][1]:.4f}]")
    fresh = served["0"]
    figures = {"queries": {"value": len(test), "unit": "queries"},
               "nodes": {"value": int(len(set(groups.tolist()))), "unit": "nodes"},
               "methods": table,
               "baseline_params": chosen,
               "best_baseline": best,
               "fresh_vs_best_baseline_hit@20": ratio(fresh, baselines[best], groups),
               "fresh_vs_stale_hit@20": {s: ratio(fresh, served[s], groups) for s in [*staleness, NEVER] if s != "0"},
               "served_time": {"value": round(served_s, 1), "unit": "s"}}
    v = figures["fresh_vs_best_baseline_hit@20"]
    print(f"  fresh hirflow / {best} (best on validation): {v['value']} [{v['ci95'][0]}, {v['ci95'][1]}]")
    h = figures["fresh_vs_stale_hit@20"]["1h"]
    print(f"  fresh / one hour stale: {h['value']} [{h['ci95'][0]}, {h['ci95'][1]}]", flush=True)
    return figures


def plot(figures: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = [n for n in figures if isinstance(figures[n], dict) and "methods" in figures[n]]
    fig, axes = plt.subplots(1, len(names), figsize=(6 * len(names), 4), squeeze=False)
    for ax, name in zip(axes[0], names):
        m = figures[name]["methods"]
        labels = [k.split("@", 1)[1] for k in m if k.startswith("hirflow@")]
        hit = [m[f"hirflow@{s}"]["hit@20"] for s in labels]
        x = np.arange(len(labels))
        ax.errorbar(x, [h["mean"] for h in hit], fmt="o-", label="hirflow served vector",
                    yerr=[[h["mean"] - h["ci95"][0] for h in hit], [h["ci95"][1] - h["mean"] for h in hit]])
        for k, b in enumerate(n for n in m if not n.startswith("hirflow@")):
            ax.axhline(m[b]["hit@20"]["mean"], linestyle="--", linewidth=1, color=f"C{k + 1}",
                       label=f"{b} (fresh)")
        ax.set_xticks(x, labels)
        ax.set_xlabel("staleness of the served vector")
        ax.set_ylabel("next-click HitRate@20")
        ax.set_title(name)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="YOOCHOOSE slices, a few steps (about a minute)")
    ap.add_argument("--yoochoose", type=Path, default=os.environ.get("HIRFLOW_YOOCHOOSE"), metavar="DIR",
                    help="session-rec's YOOCHOOSE train_full and test files (default $HIRFLOW_YOOCHOOSE)")
    ap.add_argument("--taobao", type=Path, default=os.environ.get("HIRFLOW_TAOBAO"), metavar="FILE",
                    help="the Taobao UserBehavior head (default $HIRFLOW_TAOBAO; skipped with --quick)")
    ap.add_argument("--checkpoint", action="append", default=[], metavar="NAME=DIR",
                    help="score this checkpoint (fitted before the test window) instead of training")
    ap.add_argument("--seed", type=int, default=0, help="the training seed")
    ap.add_argument("--out", type=Path, help="keep checkpoints and the plot here")
    a = ap.parse_args()
    a.checkpoints = dict(c.split("=", 1) for c in a.checkpoint)
    logging.basicConfig(level=logging.WARNING)
    torch.manual_seed(a.seed)
    figures: dict = {"quick": a.quick, "seed": a.seed}
    with tempfile.TemporaryDirectory(prefix="hirflow-session-fresh-") as tmp:
        out = a.out or Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        if a.yoochoose and Path(a.yoochoose).exists():
            figures["yoochoose"] = run("yoochoose", *yoochoose_split(a.yoochoose, a.quick), a, out)
        else:
            print("yoochoose: skipped (no --yoochoose / $HIRFLOW_YOOCHOOSE)")
        if a.taobao and Path(a.taobao).exists() and not a.quick:
            figures["taobao"] = run("taobao", *taobao_split(a.taobao, a.quick), a, out)
        if any(isinstance(v, dict) and "methods" in v for v in figures.values()):
            png = (a.out or Path.cwd()) / "session_freshness.png"
            plot(figures, png)
            print(f"plot: {png}")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
