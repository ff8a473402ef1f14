"""Several training runs of one evaluation pooled: how far a training seed moves the served
embedding's Recall@20, and where the runs stand together against the best baseline.

One run's paired interval (`ranking.paired_ratio_ci`) says how much the figure would move
with another sample of users; it says nothing of another training seed, which on Online
Retail moved the ratio to the best baseline from 0.92 to 1.02 (docs/benchmarks.md). Pooling
averages each user's Recall@20 over the runs (the expected figure of a run whose seed is not
known) and pairs it with the baselines' (deterministic, so the same in every run; their mean
over the runs is taken all the same), and reports each run's own ratio beside it.

Input: each run's `per_user.json` task entry (`trainer.evaluate.PER_USER`): the test users'
names and each method's per-user Recall@20. The runs must share the test split (the same
users in the same order), or the pooled figure would mix users.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from hirflow.trainer.ranking import paired_ratio_ci

MODEL = "hirflow"


def pool(runs: Sequence[Mapping]) -> dict:
    """Runs' per-user Recall@20 (each `{"users": [...], "recall@20": {method: [...]}}`, the
    served model under `MODEL`) pooled: the best baseline by its mean over runs and users,
    each run's Recall@20 and paired ratio to it with its interval, and the users' Recall@20
    averaged over the runs against it (ratio and interval)."""
    if not runs:
        raise ValueError("pool: no runs")
    users = list(runs[0]["users"])
    for i, r in enumerate(runs[1:], 1):
        if list(r["users"]) != users:
            raise ValueError(f"pool: run {i} was scored on other test users than run 0: "
                             "pool runs of the same data set and split only")
    methods = [set(r["recall@20"]) for r in runs]
    if any(MODEL not in m for m in methods):
        raise ValueError(f"pool: every run needs the served model's figures ({MODEL!r})")
    # the served model's parts (`hirflow_encoder`, `hirflow_block`) are no baselines; a
    # baseline is deterministic on a split, so a run may leave it out (`--no-baselines`) and
    # take the figures of the runs that scored it
    baselines = sorted(m for m in set.union(*methods) if m != MODEL and not m.startswith(MODEL + "_"))
    if not baselines:
        raise ValueError("pool: no run scored a baseline")

    def mean_over_runs(method: str) -> np.ndarray:
        return np.mean([np.asarray(r["recall@20"][method], np.float64) for r in runs
                        if method in r["recall@20"]], axis=0)

    base = {b: mean_over_runs(b) for b in baselines}
    best = max(baselines, key=lambda b: base[b].mean())
    per_run = []
    for r in runs:
        own = np.asarray(r["recall@20"][MODEL], np.float64)
        ratio, lo, hi = paired_ratio_ci(own, base[best])
        per_run.append({"recall@20": round(float(own.mean()), 4), "ratio": round(ratio, 3),
                        "ci95": [round(lo, 3), round(hi, 3)]})
    pooled = mean_over_runs(MODEL)
    ratio, lo, hi = paired_ratio_ci(pooled, base[best])
    ratios = [p["ratio"] for p in per_run]
    parts = {}
    for name in sorted(set.intersection(*methods)):
        if name.startswith(MODEL + "_"):
            parts[name] = [round(paired_ratio_ci(np.asarray(r["recall@20"][name], np.float64),
                                                 base[best])[0], 3) for r in runs]
    return {"runs": len(runs), "users": len(users), "best_baseline": best, "parts_ratio": parts,
            "best_baseline_recall@20": round(float(base[best].mean()), 4),
            "per_run": per_run,
            "recall@20": round(float(pooled.mean()), 4), "ratio": round(ratio, 3),
            "ci95": [round(lo, 3), round(hi, 3)], "ratio_range": [min(ratios), max(ratios)]}
