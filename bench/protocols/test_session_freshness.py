"""Event-level staleness: which served vector each query gets, and that it is the worker's."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from hirflow.state.events import Engagement
from bench.protocols.next_click import next_click_task
from bench.protocols.session_freshness import NEVER, served_as_of

LO = 10_000


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 3000), min_size=2, max_size=15, unique=True),
       st.lists(st.integers(0, 2000), min_size=1, max_size=4, unique=True))
def test_a_query_is_served_the_vector_of_its_last_refresh_s_before_it(offsets, stale):
    times = sorted(LO + o for o in offsets)
    evs = [Engagement("user:1", "ad:0", "click", 0)] + [
        Engagement("user:1", f"ad:{k % 2}", "click", t) for k, t in enumerate(times)]
    task = next_click_task(evs, LO, LO + 10_000, {"click"}, "user", ["ad"])
    refreshes = {"user:1": np.array(times, np.int64)}
    staleness = {str(s): s for s in sorted(stale)}
    at = served_as_of(task, refreshes, train_cutoff=LO - 500, staleness=staleness)
    assert (at[NEVER] == LO - 501).all()
    for name, s in staleness.items():
        for q in range(len(task)):
            t = int(task.t[q])
            before = [x for x in times if x <= t - 1 - s]
            assert at[name][q] == (before[-1] if before else LO - 1)
            assert at[name][q] < t                        # never the query's own click
    # staler is never later
    for a, b in zip(list(staleness)[:-1], list(staleness)[1:]):
        assert (at[a] >= at[b]).all()


def test_ranks_per_staleness_come_from_the_served_vectors_of_a_trained_model(tmp_path):
    """On a tiny trained checkpoint: a rank per query at every staleness, the fresh one equal to
    ranking by the served vector as of the node's last engagement before the query."""
    from hirflow.streams.tools.synth import SynthConfig, SynthWorld
    from hirflow.trainer.data import chronological_windows
    from hirflow.trainer.embedding import served_embeddings, state_of
    from hirflow.trainer.evaluate import item_types, load_served, positive_actions
    from bench.protocols.next_click import ranks
    from bench.protocols.session_freshness import session_freshness
    from hirflow.trainer.train import train
    from testkit.tiny_training import small
    world = SynthWorld(SynthConfig(events=1500, users=40, advertisers=4, span_days=4, seed=3))
    evs = [e for e in world.stream() if isinstance(e, Engagement)]
    w = chronological_windows([e.ts for e in evs], train=0.8, val=0.1)
    schema, enc, cfg = small(tmp_path)
    path = train([e for e in evs if e.ts < w.val_end], schema, enc, cfg, tmp_path / "ck", progress=False)
    model, block, _ = load_served(path)
    task = next_click_task(evs, w.val_end, w.end + 1, positive_actions(schema), "user", item_types(schema))
    assert len(task) > 0
    got = session_freshness(model, block, evs, schema, task, w.val_end, {"0": 0, "1h": 3_600_000})
    assert set(got) == {"0", "1h", NEVER}
    for r in got.values():
        assert len(r) == len(task) and (r >= 1).all() and (r <= len(task.items)).all()
    q = len(task) - 1                                      # the last query, checked by hand
    node, t = task.history.nodes[task.node[q]], int(task.t[q])
    at = max([e.ts for e in evs if e.src == node and w.val_end <= e.ts < t] or [w.val_end - 1])
    codes = schema.action_codes()
    with state_of(sorted((e for e in evs if e.ts <= w.end), key=lambda e: e.ts), schema) as sampler:
        items = served_embeddings(model, block, sampler, task.items, w.val_end - 1, None, codes)
        v = served_embeddings(model, block, sampler, [node], at, None, codes)[0]
    assert got["0"][q] == ranks(items @ v, int(task.target[q]), task.popularity)
