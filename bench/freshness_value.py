"""The value of freshness: next-engagement Recall@20 when the embeddings serving a query are
0, 1 hour, 1 day or 7 days stale, or never refreshed since the checkpoint's training cutoff
(one checkpoint throughout; see `bench.protocols.freshness_value` for the exact protocol).

Per data set (UCI Online Retail when its file is given, and the synthetic world): train on the
first 90 % of events in time, everything before the test window (or load the data set's
checkpoint: `--checkpoint NAME=DIR`, e.g. those `bench/quality.py --out` keeps), replay the
test window (the last 10 %) hour by hour, print a table and write `freshness_value.png`.
`--window validation` replays the 10 % before it instead, training on (or requiring a
checkpoint fitted on) the first 80 % only: the window on which model choices are made.

    python bench/freshness_value.py [--quick] [--online-retail FILE] [--window test|validation] [--out DIR]

--quick: the synthetic world only, small, a few training steps: checks the pipeline.
The last line printed is one JSON object of the figures.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


from bench.quality import online_retail, synthetic  # noqa: E402
from hirflow.encoder.model import EncoderConfig  # noqa: E402
from hirflow.trainer.data import chronological_windows, world_knowledge  # noqa: E402
from hirflow.trainer.evaluate import deep_funnel_actions, item_types, load_served, positive_actions  # noqa: E402
from bench.protocols.freshness_value import freshness_value  # noqa: E402
from hirflow.trainer.train import TrainConfig, train  # noqa: E402

warnings.filterwarnings("ignore")


def run(name, schema, evs, ents, labels, a, encode, out: Path) -> dict:
    w = chronological_windows([e.ts for e in evs], train=0.8, val=0.1)
    lo, hi = (w.val_end, w.end + 1) if a.window == "test" else (w.train_end, w.val_end)
    texts = world_knowledge(ents, hi - 1, encode) if encode is not None and ents else None
    if name in a.checkpoints:
        ck = a.checkpoints[name]
    else:
        enc = EncoderConfig.for_schema(schema, levels=(4, 16, 64) if a.quick else (16, 128, 1024))
        cfg = TrainConfig(seed=0, snapshot_chunks=0, steps_per_chunk=2 if a.quick else None)
        ck = train([e for e in evs if e.ts < lo], schema, enc, cfg, out / f"{name}-ck",
                   texts=texts, progress=not a.quick)
    model, block, manifest = load_served(ck)
    fitted = manifest.manifest.get("data_window")
    if fitted and fitted[1] >= lo:
        raise SystemExit(f"{name}: the checkpoint was fitted on events up to {fitted[1]}, inside the "
                         f"{a.window} window (from {lo}); for the validation window use one fitted on "
                         "the training window only (bench/quality.py --no-fit-validation --out DIR)")
    cutoff = fitted[1] + 1 if fitted else lo                 # "never": as the checkpoint was fitted
    acts = deep_funnel_actions(schema) if name == "online_retail" else positive_actions(schema)
    t = time.perf_counter()
    res = freshness_value(model, [e for e in evs if e.ts < hi], schema, cutoff, lo, hi, acts, item_types(schema),
                          texts=texts, block=block,
                          progress=lambda i, n: print(f"  {name}: day {i}/{n}", end="\r", flush=True))
    res["seconds"] = round(time.perf_counter() - t, 1)
    print(f"{name}: {res['queries']} hourly queries over {res['items']} items ({res['seconds']} s)")
    print(f"  {'staleness':10s} Recall@20   95% CI             / fresh (paired 95% CI)")
    for s, r in res["recall"].items():
        print(f"  {s:10s} {r['mean']:.4f}     [{r['ci_low']:.4f}, {r['ci_high']:.4f}]   "
              f"{r['ratio_to_fresh']:.3f} [{r['ratio_ci'][0]:.3f}, {r['ratio_ci'][1]:.3f}]")
    return res


def plot(figures: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, res in figures.items():
        labels = list(res["recall"])
        mean = [res["recall"][s]["mean"] for s in labels]
        lo = [res["recall"][s]["mean"] - res["recall"][s]["ci_low"] for s in labels]
        hi = [res["recall"][s]["ci_high"] - res["recall"][s]["mean"] for s in labels]
        ax.errorbar(labels, mean, yerr=[lo, hi], marker="o", capsize=3, label=name)
    ax.set_xlabel("staleness of the embeddings serving a query")
    ax.set_ylabel("Recall@20 (new items, 95% CI)")
    ax.set_title("What freshness is worth")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small synthetic world only (about a minute)")
    ap.add_argument("--online-retail", type=Path, default=os.environ.get("HIRFLOW_ONLINE_RETAIL"))
    ap.add_argument("--only", choices=["online_retail", "synthetic"])
    ap.add_argument("--checkpoint", action="append", default=[], metavar="[NAME=]DIR",
                    help="use this checkpoint of data set NAME (online_retail, synthetic) instead of "
                         "training; repeatable; a bare DIR needs --only")
    ap.add_argument("--knowledge", action=argparse.BooleanOptionalAction, default=None,
                    help="MiniLM texts as world knowledge (default: on, off with --quick)")
    ap.add_argument("--window", choices=["test", "validation"], default="test",
                    help="the window replayed (default: test, the last 10 %%); validation: the 10 %% "
                         "before it, scored with checkpoints fitted on the training window only")
    ap.add_argument("--out", type=Path, default=Path("var/freshness_value"))
    a = ap.parse_args()
    a.checkpoints = {}
    for spec in a.checkpoint:
        name, sep, path = spec.rpartition("=")
        if not sep and not a.only:
            ap.error("a --checkpoint without NAME= needs --only (a checkpoint belongs to one data set)")
        if (name or a.only) not in ("online_retail", "synthetic"):
            ap.error(f"--checkpoint {spec}: the data set is online_retail or synthetic")
        a.checkpoints[name or a.only] = Path(path)
    encode = None
    if a.knowledge if a.knowledge is not None else not a.quick:
        from hirflow.encoder.knowledge import TextEncoder
        encode = TextEncoder().encode
    a.out.mkdir(parents=True, exist_ok=True)
    figures: dict = {}
    with tempfile.TemporaryDirectory(prefix="hirflow-fv-") as tmp:
        if a.only in (None, "online_retail") and not a.quick:
            if a.online_retail and Path(a.online_retail).exists():
                figures["online_retail"] = run("online_retail", *online_retail(Path(a.online_retail), False),
                                               a, encode, Path(tmp))
            else:
                print("online_retail: skipped (no --online-retail file)")
        if a.only in (None, "synthetic"):
            figures["synthetic"] = run("synthetic", *synthetic(None, a.quick), a, encode, Path(tmp))
    plot(figures, a.out / "freshness_value.png")
    print(f"plot: {a.out / 'freshness_value.png'}")
    out = {}
    for name, res in figures.items():
        for s, r in res["recall"].items():
            out[f"{name}_recall@20_stale_{s}"] = {
                "value": r["mean"], "unit": "recall", "ci95": [r["ci_low"], r["ci_high"]],
                "ratio_to_fresh": r["ratio_to_fresh"], "ratio_ci95": r["ratio_ci"]}
        out[f"{name}_queries"] = {"value": res["queries"], "unit": "queries"}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
