"""The batched sampler against the plain-Python statement of its rules
(`testkit/reference_views.py`): the same views on random graphs, for several view
shapes, cutoffs, repeated calls (cached rows reused) and invalidated nodes."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from hirflow.state.graph import GraphConfig, GraphStore
from hirflow.state.schema import SchemaConfig
from hirflow.state.views import STUDENT, TEACHER, ViewConfig, ViewSampler
from tests.state.helpers import apply_direct
from testkit.reference_views import ReferenceSampler
from tests.state.view_world import DAY, ODD, T0, assert_same, random_events

WALKS_ONLY = ViewConfig(max_nodes=8, hops=0, fanout=3, walks=5, walk_length=5)
NO_WALKS = ViewConfig(max_nodes=12, hops=2, fanout=4, walks=0)


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
