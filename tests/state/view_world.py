"""Helpers for the view tests: random engagement graphs and view comparisons."""
from __future__ import annotations

import numpy as np

from hirflow.state.events import Engagement
from hirflow.state.views import ViewConfig

T0 = 1_767_225_600_000
DAY = 86_400_000
ODD = ViewConfig(max_nodes=5, hops=3, fanout=2, walks=3, walk_length=4, restart=0.5)
FIELDS = ("types", "hop", "stats", "edge_src", "edge_dst", "edge_action", "edge_weight", "edge_age")


def world(rng, n_users=30, n_ads=20, n=600):
    """`n` impressions, clicks and conversions of random users on random ads over 30 days."""
    return [Engagement(f"user:{rng.integers(n_users)}", f"ad:{rng.integers(n_ads)}",
                       str(rng.choice(["impression", "click", "conversion"])),
                       int(T0 + rng.integers(0, 30 * DAY))) for _ in range(n)]


def random_events(rng, users, items, n, same_time):
    """`n` events of every action kind; `same_time`: on 20 whole days, so many share a ts."""
    actions = ["impression", "click", "conversion", "not_interested", "owns"]
    ts = [T0 + int(rng.integers(0, 20)) * DAY if same_time else T0 + int(rng.integers(0, 30 * DAY))
          for _ in range(n)]
    return [Engagement(f"user:{rng.integers(users)}", f"ad:{rng.integers(items)}",
                       str(rng.choice(actions)), t) for t in ts]


def assert_same(got, want):
    """The same views: exact structure and dtypes, floats to 1e-6."""
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.anchor == w.anchor and g.cutoff == w.cutoff
        assert g.nodes == w.nodes
        for f in ("types", "hop", "edge_src", "edge_dst", "edge_action"):
            assert np.array_equal(getattr(g, f), getattr(w, f)), f
            assert getattr(g, f).dtype == getattr(w, f).dtype, f
        for f in ("stats", "edge_weight", "edge_age"):
            assert getattr(g, f).dtype == getattr(w, f).dtype and getattr(g, f).shape == getattr(w, f).shape, f
            assert np.allclose(getattr(g, f), getattr(w, f), rtol=1e-6, atol=1e-7), f


def same_views(a, b) -> None:
    """Bit-equal views (what another process or path must reproduce exactly)."""
    assert [v.nodes for v in a] == [v.nodes for v in b]
    for va, vb in zip(a, b):
        for f in FIELDS:
            np.testing.assert_array_equal(getattr(va, f), getattr(vb, f), err_msg=f)
