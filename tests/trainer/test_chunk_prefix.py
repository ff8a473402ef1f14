"""A source's own earlier engagements inside its time chunk join its student view: what a
worker's view holds at that moment, never anything at or after its positives."""
from pathlib import Path

import numpy as np
from hypothesis import given, settings, strategies as st

from hirflow.encoder.batching import PackConfig
from hirflow.state.events import Engagement
from hirflow.state.schema import SchemaConfig
from hirflow.state.views import STUDENT, TEACHER, View, with_prefix
from hirflow.trainer.pipeline import BatchPipeline, ChunkDone, chunk_plan

DAY = 86_400_000
T0 = 1_767_225_600_000


def test_with_prefix_adds_the_items_at_hop_one_linked_to_the_anchor_once():
    v = View("user:u", 0, ("user:u", "ad:a"), np.array([0, 1], np.int16), np.array([0, 1], np.int8),
             np.zeros((2, 7), np.float32), np.array([0], np.int32), np.array([1], np.int32),
             np.array([3], np.int16), np.array([1.0], np.float32), np.array([60.0], np.float32))
    got = with_prefix(v, ["ad:a", "ad:b"], np.array([1, 1]), np.ones((2, 7)), np.array([2, 2]),
                      np.array([0.9, 0.8]), np.array([5.0, 9.0]))
    assert got.nodes == ("user:u", "ad:a", "ad:b") and got.hop.tolist() == [0, 1, 1]
    assert got.stats[2].tolist() == [1.0] * 7
    # ad:a was linked already: only the edge to ad:b is new
    assert list(zip(got.edge_src.tolist(), got.edge_dst.tolist())) == [(0, 1), (0, 2)]
    assert got.edge_action.tolist() == [3, 2] and got.edge_age.tolist() == [60.0, 9.0]


@settings(max_examples=15, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 9), st.integers(1, 2 * DAY // 60_000 - 1)),
                min_size=10, max_size=40), st.integers(0, 1000))
def test_a_view_never_holds_an_engagement_at_or_after_its_sources_positives(tmp_path_factory, rows, seed):
    evs = sorted((Engagement(f"user:u{u}", f"product:p{i}", "click", T0 + m * 60_000) for u, i, m in rows),
                 key=lambda e: (e.ts, e.src, e.dst))
    schema = SchemaConfig()
    plan = chunk_plan(evs, DAY, 4, None, seed)
    actions = {a: i for i, a in enumerate(sorted(schema.all_actions))}
    pipe = BatchPipeline(evs, plan, Path(tmp_path_factory.mktemp("s")) / "state", schema, TEACHER,
                         STUDENT, PackConfig(), actions, 0, seed, workers=0, chunk_prefix=8)
    seen_before = set()
    try:
        for item in pipe:
            if isinstance(item, ChunkDone):
                seen_before |= {(e.src, e.dst) for e in evs if (e.ts - evs[0].ts) // DAY <= item.chunk}
                continue
            idx = plan[item.chunk][1 + item.step - pipe.steps_before(item.chunk)]
            batch = [evs[i] for i in idx]
            first = {}
            for e in batch:
                first[e.src] = min(first.get(e.src, e.ts), e.ts)
            chunk = [evs[i] for i in plan[item.chunk][0]]
            views = pipe._pair()[1].sample(sorted({n for e in batch for n in (e.src, e.dst)}),
                                           item.cutoff)
            for src, t0 in first.items():
                allowed = {e.dst for e in chunk if e.src == src and e.ts < t0}
                edges_now = {e.dst for e in chunk if e.src == src}
                # what a prefix may add: the source's own items before its first positive
                got = pipe._with_prefixes(item.chunk, batch, [v.anchor for v in views], views,
                                          pipe._pair()[1], item.cutoff, np.random.default_rng(0))
                v = got[[x.anchor for x in views].index(src)]
                linked = {v.nodes[d] for s, d in zip(v.edge_src, v.edge_dst) if s == 0}
                fresh = linked - {d for s, d in seen_before if s == src}
                assert fresh <= allowed, (fresh, allowed)
                assert not (fresh & (edges_now - allowed))
    finally:
        pipe.close()
