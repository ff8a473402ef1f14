"""Collaborative block at catalogue scale: fitting the served block for every item with at
least three users, on a power-law stream of N items and E engagements.

The stream: users with a log-normal number of engagements, items drawn from a Zipf law
(exponent 1.1) inside one of 200 taste groups per user (80 %) or from the whole catalogue,
times spread over 90 days. `CollaborativeFit`'s path without the encoder: the pairs into
`Interactions` (the dense vocabulary of `max_items`, the tail of every other item with 3+
users), EASE^R with the next-period part on the vocabulary, cut to rank 128, the tail folded
in (`block_fit.fold_in`), and every user's served block computed once. Reports each
stage's seconds, peak RSS and the items the block covers against the items with 3+ users.

    python bench/block_scale.py [--quick] [--items 1000000] [--engagements 10000000]

--quick: 100,000 items, 1,000,000 engagements and a dense vocabulary of 2,000 (within a
minute). The last line printed is one JSON object of the figures.
"""
from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

from hirflow.encoder import collaborative as C  # noqa: E402
from hirflow.trainer.block_config import CollaborativeConfig  # noqa: E402
from hirflow.trainer.block_fit import fit  # noqa: E402
from hirflow.trainer.interactions import Interactions  # noqa: E402
from hirflow.trainer.next_period import NextPeriod  # noqa: E402

DAY = 86_400_000
BUDGET_S = 15 * 60          # the trainer's budget for a run on this machine


def stream(items: int, engagements: int, seed: int = 0):
    """(user, item, ts) triples of the power-law stream (see the module docstring)."""
    rng = np.random.default_rng(seed)
    per_user = np.maximum(1, rng.lognormal(2.5, 1.0, engagements // 12).astype(np.int64))
    per_user = per_user[np.cumsum(per_user) <= engagements]
    users = np.repeat(np.arange(len(per_user)), per_user)
    n = len(users)
    ranks = np.minimum(rng.zipf(1.1, n), items) - 1
    group = rng.integers(0, 200, len(per_user))[users]
    inside = rng.random(n) < 0.8
    item = np.where(inside, (ranks * 200 + group) % items, rng.permutation(items)[ranks])
    ts = np.sort(rng.integers(0, 90 * DAY, n)) + 1_700_000_000_000
    order = rng.permutation(n)                    # users' engagements spread over the 90 days
    return users[order], item[order], ts


def rss_mb() -> int:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="100,000 items, 1,000,000 engagements")
    ap.add_argument("--items", type=int, default=1_000_000)
    ap.add_argument("--engagements", type=int, default=10_000_000)
    ap.add_argument("--max-items", type=int, default=CollaborativeConfig.max_items,
                    help="the dense vocabulary")
    a = ap.parse_args()
    if a.quick:
        a.items, a.engagements, a.max_items = 100_000, 1_000_000, 2_000
    stages: dict[str, float] = {}
    t = time.perf_counter()
    u, i, ts = stream(a.items, a.engagements)
    distinct = np.unique(u.astype(np.int64) * a.items + i)
    eligible = int((np.bincount(distinct % a.items, minlength=a.items) >= 3).sum())
    del distinct
    pairs = list(zip(np.char.add("user:", u.astype(str)).tolist(),
                     np.char.add("product:", i.astype(str)).tolist(), ts.tolist()))
    stages["stream_s"] = time.perf_counter() - t
    t0 = time.perf_counter()
    data = Interactions.of(pairs, ("user",), ("product",), a.max_items)
    del pairs
    stages["interactions_s"] = time.perf_counter() - t0
    t = time.perf_counter()
    span = int(data.last_time - data.quantile_time(0.9))
    nxt = NextPeriod(2, span, CollaborativeConfig.next_l2, 0.5)
    block = fit(data, 3000.0, 128, [0], ("user",), recency_days=(0.0, 30.0, 60.0),
                  fit_days=(15.0, 30.0, 60.0), nxt=nxt)
    stages["fit_s"] = time.perf_counter() - t
    t = time.perf_counter()
    r, c, tt = data.arrays()
    tr, tc, ttt = data.arrays(tail=True)
    rows = np.concatenate([r, tr])
    cols = np.concatenate([c, tc + len(data.items)])
    x = C.recency_weighted(rows, cols, np.concatenate([tt, ttt]), (len(data.users), len(block.items)),
                           (0.0, 30.0, 60.0))
    users = C.user_rows(x, block.query, 1.0)
    stages["user_blocks_s"] = time.perf_counter() - t
    total = time.perf_counter() - t0
    print(f"{a.items:,} items, {a.engagements:,} engagements, {len(data.users):,} users: "
          f"{len(block.items):,} items in the block ({len(data.items):,} dense + {len(data.tail):,} "
          f"folded in) in {total:.0f} s; peak RSS {rss_mb():,} MB; "
          + ", ".join(f"{k} {v:.1f}" for k, v in stages.items()))
    figures = {"items": {"value": a.items, "unit": "items"},
               "engagements": {"value": a.engagements, "unit": "engagements"},
               "block_items": {"value": len(block.items), "unit": "items",
                               "ratio_to_items_with_3_users": round(len(block.items) / max(1, eligible), 3)},
               "fit_time": {"value": round(total, 1), "unit": "s",
                            "ratio_to_budget": round(total / BUDGET_S, 3)},
               "peak_rss": {"value": rss_mb(), "unit": "MB"},
               "users": {"value": len(data.users), "unit": "users"},
               "user_block_norm": {"value": round(float(np.median(np.linalg.norm(users, axis=1))), 3),
                                   "unit": "length"},
               **{k: {"value": round(v, 1), "unit": "s"} for k, v in stages.items()}}
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
