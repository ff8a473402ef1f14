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
def test_a_positive_sees_its_sources_earlier_engagements_and_nothing_later(tmp_path_factory, rows, seed):
    """Each positive's source view holds the source's own engagements of the chunk before
    that positive (up to `chunk_prefix`), never the positive itself or anything after it;
    positives with the same prefix share a view, and rows keep their source node."""
    evs = sorted((Engagement(f"user:u{u}", f"product:p{i}", "click", T0 + m * 60_000) for u, i, m in rows),
                 key=lambda e: (e.ts, e.src, e.dst))
    schema = SchemaConfig()
    plan = chunk_plan(evs, DAY, 4, None, seed)
    actions = {a: i for i, a in enumerate(sorted(schema.all_actions))}
    pipe = BatchPipeline(evs, plan, Path(tmp_path_factory.mktemp("s")) / "state", schema, TEACHER,
                         STUDENT, PackConfig(), actions, 0, seed, workers=0, chunk_prefix=8)
    known: set = set()            # (src, dst) pairs in the state at the chunk's start
    try:
        for item in pipe:
            if isinstance(item, ChunkDone):
                known |= {(e.src, e.dst) for e in evs if (e.ts - evs[0].ts) // DAY <= item.chunk}
                continue
            idx = plan[item.chunk][1 + item.step - pipe.steps_before(item.chunk)]
            batch = [evs[i] for i in idx]
            chunk = [evs[i] for i in plan[item.chunk][0]]
            anchors = sorted({n for e in batch for n in (e.src, e.dst)})
            pos = {n: k for k, n in enumerate(anchors)}
            views = pipe._pair()[1].sample(anchors, item.cutoff)
            more, src_of = pipe._at_positives(item.chunk, batch, pos, views, pipe._pair()[1],
                                             item.cutoff, np.random.default_rng(0))
            every = views + more
            assert item.src_node.tolist() == [pos[e.src] for e in batch]
            assert len(every) == item.anchors
            for e, k in zip(batch, src_of):
                v = every[k]
                assert v.anchor == e.src
                linked = {v.nodes[d] for s, d in zip(v.edge_src, v.edge_dst) if s == 0}
                fresh = linked - {d for s, d in known if s == e.src}
                earlier = {x.dst for x in chunk if x.src == e.src and x.ts < e.ts}
                assert fresh <= earlier, (fresh, earlier)
    finally:
        pipe.close()
