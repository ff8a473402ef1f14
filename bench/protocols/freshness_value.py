"""The value of freshness: how much ranking quality is lost when embeddings are `s` stale.

The test window is replayed as a stream into a graph store, hour by hour. A query is a user's
positives on new items within one hour H (items known before the test window, not engaged
by the user before H). For each staleness s the query is scored with the user's embedding
as of H - s and the items' embeddings as of the start of H's day less s (items are
re-embedded once a day: a whole catalogue per hour would cost more than the rest), all from
one checkpoint; "never" uses embeddings as of the checkpoint's training cutoff, as a
deployment that only swaps in new checkpoints would. Views honour their cutoff, so state
applied after H - s is invisible to them.

-> per staleness, mean Recall@K over queries with a bootstrap interval, and its paired ratio
to the fresh (s = 0) figure over the same resampled queries.
"""
from __future__ import annotations

import tempfile
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from hirflow.encoder.collaborative import CollaborativeBlock
from hirflow.encoder.model import HierarchicalEncoder
from hirflow.state.events import Engagement
from hirflow.state.graph import GraphConfig, GraphStore
from hirflow.state.schema import SchemaConfig, node_type
from hirflow.state.views import STUDENT, ViewSampler
from hirflow.state.writer import BOTH_SIDES, GraphWriter
from hirflow.trainer.ranking import bootstrap_ci, paired_ratio_ci
from hirflow.trainer.embedding import served_embeddings

HOUR = 3_600_000
DAY = 24 * HOUR
STALENESS = {"0": 0, "1h": HOUR, "1d": DAY, "7d": 7 * DAY}


@dataclass(frozen=True)
class Query:
    hour: int                        # the hour's start (ms)
    user: str
    truth: frozenset[str]            # new items engaged in the hour
    seen: frozenset[str]             # items the user engaged before the hour (masked)


def queries(events: Sequence[Engagement], lo: int, hi: int, positive: set[str],
            item_types: Sequence[str]) -> tuple[list[str], list[Query]]:
    """Candidate items (known before `lo`) and the hourly queries of [lo, hi)."""
    items = sorted({n for e in events if e.ts < lo for n in (e.src, e.dst)
                    if node_type(n) in item_types})
    known = set(items)
    evs = [e for e in sorted(events, key=lambda e: e.ts) if e.action in positive and e.ts < hi]
    engaged: dict[tuple[int, str], set[str]] = defaultdict(set)      # (hour, user) -> items
    for e in evs:
        if e.ts >= lo and e.dst in known:
            engaged[((e.ts - lo) // HOUR * HOUR + lo, e.src)].add(e.dst)
    seen: dict[str, set[str]] = defaultdict(set)                    # as of each query's hour
    out: list[Query] = []
    j = 0
    for hour, user in sorted(engaged):
        while j < len(evs) and evs[j].ts < hour:
            seen[evs[j].src].add(evs[j].dst)
            j += 1
        truth = engaged[(hour, user)] - seen[user]
        if truth:
            out.append(Query(hour, user, frozenset(truth), frozenset(seen[user])))
    return items, out


def _recall(u: np.ndarray, item_emb: np.ndarray, items: list[str], q: Query, k: int) -> float:
    s = item_emb @ u
    idx = {x: i for i, x in enumerate(items)}
    for x in q.seen:
        if x in idx:
            s[idx[x]] = -np.inf
    top = np.argpartition(-s, k - 1)[:k]
    return len({items[i] for i in top} & q.truth) / len(q.truth)


def freshness_value(model: HierarchicalEncoder, events: Sequence[Engagement], schema: SchemaConfig,
                    train_cutoff: int, lo: int, hi: int, positive: set[str], item_types: Sequence[str],
                    texts: Mapping[str, np.ndarray] | None = None, k: int = 20,
                    staleness: Mapping[str, int] = STALENESS, progress=None,
                    block: "CollaborativeBlock | None" = None) -> dict:
    """Recall@k per staleness (see the module docstring) over the queries of [lo, hi);
    `block`: the checkpoint's collaborative block, served after the encoder's coordinates."""
    events = sorted(events, key=lambda e: e.ts)
    items, qs = queries(events, lo, hi, positive, item_types)
    recalls: dict[str, list[float]] = {name: [] for name in [*staleness, "never"]}
    with tempfile.TemporaryDirectory(prefix="hirflow-fresh-") as tmp:
        store = GraphStore(Path(tmp) / "s", schema, 1)
        writer = GraphWriter(store, GraphConfig(path=str(Path(tmp) / "s")))
        sampler = ViewSampler(store.reader, schema, STUDENT, seed=0)
        applied = 0

        def apply_until(t: int) -> None:
            nonlocal applied
            j = applied
            while j < len(events) and events[j].ts < t:
                j += 1
            if j > applied:
                batch = events[applied:j]
                for i in range(0, len(batch), 20_000):
                    writer.apply_batch([(e, BOTH_SIDES) for e in batch[i:i + 20_000]])
                    writer.commit()
                sampler.invalidate(sorted({n for e in batch for n in (e.src, e.dst)}))
                applied = j

        def emb(nodes: list[str], cutoff: int) -> np.ndarray:
            return served_embeddings(model, block, sampler, nodes, cutoff, texts, schema.action_codes())

        apply_until(lo)
        never_items = emb(items, train_cutoff - 1)
        by_day: dict[int, list[Query]] = defaultdict(list)
        for q in qs:
            by_day[(q.hour - lo) // DAY].append(q)
        for n_day, day in enumerate(sorted(by_day)):
            day_start = lo + day * DAY
            day_qs = by_day[day]
            apply_until(max(q.hour for q in day_qs))
            users = sorted({q.user for q in day_qs})
            never_users = dict(zip(users, emb(users, train_cutoff - 1)))
            for q in day_qs:
                recalls["never"].append(_recall(never_users[q.user], never_items, items, q, k))
            for name, s in staleness.items():
                item_emb = emb(items, day_start - s - 1)
                for hour in sorted({q.hour for q in day_qs}):
                    hq = [q for q in day_qs if q.hour == hour]
                    u_emb = emb([q.user for q in hq], hour - s - 1)
                    for q, u in zip(hq, u_emb):
                        recalls[name].append(_recall(u, item_emb, items, q, k))
            if progress is not None:
                progress(n_day + 1, len(by_day))
        store.close()
    return _summary(recalls, next(iter(staleness)), len(qs), len(items), k)


def _summary(recalls: dict[str, list[float]], fresh_name: str, n_queries: int, n_items: int,
             k: int) -> dict:
    """Each staleness's mean Recall@k with its interval, and its paired ratio to the fresh one."""
    out = {"queries": n_queries, "items": n_items, "k": k, "recall": {}}
    fresh = np.array(recalls[fresh_name])
    for name, v in recalls.items():
        arr = np.array(v)
        lo_ci, hi_ci = bootstrap_ci(arr)
        r, r_lo, r_hi = paired_ratio_ci(arr, fresh)
        out["recall"][name] = {"mean": round(float(arr.mean()), 4) if len(arr) else float("nan"),
                               "ci_low": round(lo_ci, 4), "ci_high": round(hi_ci, 4),
                               "ratio_to_fresh": round(r, 3), "ratio_ci": [round(r_lo, 3), round(r_hi, 3)]}
    return out
