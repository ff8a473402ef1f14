"""Retrieval before the first checkpoint: what a user's neighbourhood engaged.

A fresh deployment serves cold-start embeddings (type and world knowledge), whose tokens a
user and an item rarely share, so `retrieve` by embedding answers nothing useful until a
checkpoint is trained. Until then, a user's items are found in the graph itself, as
neighbourhood collaborative filtering does (user-based kNN): the users who engaged the same
items (co-users, read from the user's student view), each weighted by the decayed weight of
what they share with the user, vote for their own other items with their decayed weights;
the user's own items are left out. Local to the worker that answers: it reads other
workers' nodes only through the view sampler's peer reads.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Callable, Iterable

import numpy as np

from hirflow.state.views import View

MAX_CO_USERS = 16          # co-users whose items are read (the best by shared weight)


def linked(view: View, local: int) -> dict[int, float]:
    """The view's nodes linked to node `local` (either direction) -> the edge's summed weight
    (negative feedback counts against)."""
    out: dict[int, float] = defaultdict(float)
    for s, d, w in zip(view.edge_src.tolist(), view.edge_dst.tolist(), view.edge_weight.tolist()):
        if s == local:
            out[d] += w
        elif d == local:
            out[s] += w
    return out


def neighbourhood_items(view_of: Callable[[str, int, int], View | None], user: str, now: int,
                        k: int, item_types: Iterable[str], type_names: list[str]) -> list[tuple[str, float]]:
    """Up to `k` (item, score) of `item_types` for `user`, best first (see the module)."""
    v = view_of(user, now, 0)
    if v is None:
        return []
    kinds = set(item_types)
    typ = [type_names[t] for t in v.types.tolist()]
    own = {j: w for j, w in linked(v, 0).items() if w > 0 and typ[j] in kinds}
    user_type = typ[0]
    shared: dict[str, float] = defaultdict(float)
    for j, w in own.items():                          # co-users: who engaged the same items
        for c, wc in linked(v, j).items():
            if c != 0 and typ[c] == user_type and wc > 0:
                shared[v.nodes[c]] += w * wc
    mine = {v.nodes[j] for j in own}
    scores: dict[str, float] = defaultdict(float)
    for co, sim in sorted(shared.items(), key=lambda kv: (-kv[1], kv[0]))[:MAX_CO_USERS]:
        cv = view_of(co, now, 0)
        if cv is None:
            continue
        ctyp = [type_names[t] for t in cv.types.tolist()]
        for j, w in linked(cv, 0).items():
            item = cv.nodes[j]
            if w > 0 and ctyp[j] in kinds and item not in mine:
                scores[item] += sim * w
    best = sorted(scores.items(), key=lambda kv: (-kv[1], kv[0]))[:k]
    top = max((s for _, s in best), default=1.0) or 1.0
    return [(n, float(np.round(s / top, 6))) for n, s in best]
