"""The batched sampler against the plain-Python statement of its rules
(`tests/state/reference_views.py`): the same views on random graphs, for several view
shapes, cutoffs, repeated calls (cached rows reused) and invalidated nodes."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from hirflow.state.events import Engagement
from hirflow.state.graph import GraphConfig, GraphStore
from hirflow.state.schema import SchemaConfig
from hirflow.state.views import STUDENT, TEACHER, ViewConfig, ViewSampler
from tests.state.helpers import apply_direct
from tests.state.reference_views import ReferenceSampler

T0 = 1_767_225_600_000
DAY = 86_400_000
ODD = ViewConfig(max_nodes=5, hops=3, fanout=2, walks=3, walk_length=4, restart=0.5)
WALKS_ONLY = ViewConfig(max_nodes=8, hops=0, fanout=3, walks=5, walk_length=5)
NO_WALKS = ViewConfig(max_nodes=12, hops=2, fanout=4, walks=0)


def random_events(rng, users, items, n, same_time):
    actions = ["impression", "click", "conversion", "not_interested", "owns"]
    ts = [T0 + int(rng.integers(0, 20)) * DAY if same_time else T0 + int(rng.integers(0, 30 * DAY))
          for _ in range(n)]
    return [Engagement(f"user:{rng.integers(users)}", f"ad:{rng.integers(items)}",
                       str(rng.choice(actions)), t) for t in ts]


def assert_same(got, want):
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


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 100_000), users=st.integers(2, 40), items=st.integers(2, 30),
       n=st.integers(0, 900), same_time=st.booleans(), cut_day=st.integers(-1, 35))
def test_batched_views_equal_the_reference(tmp_path_factory, seed, users, items, n, same_time, cut_day):
    rng = np.random.default_rng(seed)
    evs = random_events(rng, users, items, n, same_time)
    path = tmp_path_factory.mktemp("ref")
    schema = SchemaConfig()
    cutoff = T0 + cut_day * DAY
    with GraphStore(path, schema, 4) as store:
        apply_direct(store, evs[: n // 2], GraphConfig(path=str(path), top_k=24, trim_slack=4))
        anchors = [f"user:{i}" for i in range(0, users, 2)] + [f"ad:{i}" for i in range(items)] + ["user:0", "ad:missing"]
        for cfg in (STUDENT, TEACHER, ODD, WALKS_ONLY, NO_WALKS):
            fast = ViewSampler(store.reader, schema, cfg, seed=seed)
            ref = ReferenceSampler(store.reader, schema, cfg, seed=seed)
            assert_same(fast.sample(anchors, cutoff), ref.sample(anchors, cutoff))
            # a second call reuses cached rows; the walks draw on from the same generator
            assert_same(fast.sample(anchors[::-1], cutoff + 1000), ref.sample(anchors[::-1], cutoff + 1000))
        apply_direct(store, evs[n // 2:], GraphConfig(path=str(path), top_k=24, trim_slack=4))
        changed = sorted({x for e in evs[n // 2:] for x in (e.src, e.dst)})
        fast.invalidate(changed)
        ref.invalidate(changed)
        later = cutoff + 2 * DAY
        assert_same(fast.sample(anchors, later), ref.sample(anchors, later))
        rng_a, rng_b = np.random.default_rng(7), np.random.default_rng(7)
        assert_same(fast.sample(anchors[:3], later, rng_a), ref.sample(anchors[:3], later, rng_b))
