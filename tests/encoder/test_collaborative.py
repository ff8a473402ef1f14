"""The served collaborative block: a user's block is the sum over the distinct items it
engaged as of a cutoff, weighted by how recently it engaged each, set to a fixed length, and
the served embedding carries it through a checkpoint into serving."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from hirflow.encoder import collaborative as C
from hirflow.state.edge_columns import EdgeColumns
from hirflow.state.node import OUT, NodeState

ITEMS = [f"product:{i}" for i in range(6)]
edge = st.tuples(st.integers(0, 7),            # neighbour: products 0-5 (6-7 outside the vocabulary)
                 st.integers(0, 2),            # action code: 0 counts, 1 counts, 2 does not
                 st.floats(-1.0, 2.0),         # stored weight (negative: negative feedback)
                 st.integers(0, 100),          # first event time
                 st.integers(0, 60))           # last event time (t_ref) after the first


def test_recency_weights_follow_a_users_own_latest_engagement():
    """One entry per (user, item) at its latest time, weighted relative to the user's latest
    item: shifting every time by the same amount changes nothing; tau 0 weighs all alike."""
    rows, cols = np.array([0, 0, 0, 1, 1]), np.array([2, 2, 1, 0, 3])
    t = np.array([5.0, 1.0, 3.0, 7.0, 7.0]) * C.DAY_MS
    x = C.recency_weighted(rows, cols, t, (3, 4), 2.0).toarray()
    np.testing.assert_allclose(x, [[0, np.exp(-1), 1, 0], [1, 0, 0, 1], [0, 0, 0, 0]], rtol=1e-6)
    np.testing.assert_allclose(C.recency_weighted(rows, cols, t + 10 ** 12, (3, 4), 2.0).toarray(), x,
                               rtol=1e-6)
    assert (C.recency_weighted(rows, cols, t, (3, 4), 0.0).toarray() == (x > 0)).all()
    # several taus: the mean of their weights (tau 0 weighs 1)
    np.testing.assert_allclose(C.recency_weighted(rows, cols, t, (3, 4), (0.0, 2.0)).toarray(),
                               ((x > 0) + x) / 2, rtol=1e-6)


@pytest.mark.parametrize("user_norm,recency", [(None, 0.0), (2.5, 0.0), (2.5, 40 / C.DAY_MS),
                                               (2.5, [0.0, 40 / C.DAY_MS, 400 / C.DAY_MS])])
@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(edge, max_size=12), min_size=1, max_size=5), st.integers(0, 110))
def test_a_users_block_sums_its_distinct_counted_items_as_of_the_cutoff(user_norm, recency, adjacency,
                                                                         cutoff):
    """A user's block is the sum of the query rows of its distinct counted items, each
    weighted exp((its last time - the user's latest) / tau) when the block has a recency
    (the mean of those weights over several taus, a tau of 0 weighing 1; times as of the
    cutoff), set to length `user_norm` when it has one (a user without such items: zeros)."""
    rng = np.random.default_rng(1)
    settings_ = {} if user_norm is None else {"user_norm": user_norm}
    block = C.CollaborativeBlock(tuple(ITEMS), rng.standard_normal((6, 3)).astype(np.float32),
                                 rng.standard_normal((6, 3)).astype(np.float32), (0, 1), ("user",),
                                 dict(settings_, recency_days=recency) if recency else settings_)
    names = [f"user:{i}" for i in range(len(adjacency))] + ["product:2", "product:7", "advertiser:1"]
    actions = ["a0", "a1", "a2"]
    states = {}
    for n, edges in zip(names, adjacency):
        s = NodeState(n)
        for nbr, act, w, first, later in edges:
            s.edges[(f"product:{nbr}", actions[act], OUT)] = (w, first + later, 1, first)
        states[n] = s
    cols = EdgeColumns.from_states(names, states, {a: i for i, a in enumerate(actions)})
    got = block.blocks(names, cols, cutoff)
    for i, n in enumerate(names[:len(adjacency)]):
        last: dict[int, int] = {}
        for (nbr, act, _), (w, t_ref, _, first) in states[n].edges.items():
            if nbr in ITEMS and act in ("a0", "a1") and w > 0 and first <= cutoff:
                j = int(nbr.split(":")[1])
                last[j] = max(last.get(j, -1), min(t_ref, cutoff))
        age = {j: t - max(last.values()) for j, t in last.items()}
        weight = {j: np.mean([np.exp(a / (d * C.DAY_MS)) if d else 1.0 for d in C.taus_of(recency)])
                  for j, a in age.items()}
        want = sum((block.query[j] * weight[j] for j in last), np.zeros(3, np.float32))
        if user_norm is not None and last:
            want = want / np.linalg.norm(want) * user_norm
        np.testing.assert_allclose(got[i], want, atol=1e-5)
    np.testing.assert_array_equal(got[-3], block.key[2])      # an item: its own row
    assert not got[-2:].any()                                 # outside the vocabulary, other types


def test_served_embeddings_carry_the_block_through_the_checkpoint(tiny_checkpoints, tiny_world):
    """The tiny successor checkpoint serves d_emb + rank coordinates: the encoder's, then a
    user's block as the sum of its items' query rows set to the block's user length; tokens
    cover the whole embedding."""
    from hirflow.encoder.serving import ServingModel
    from hirflow.state.schema import SchemaConfig
    from hirflow.state.views import STUDENT, ViewSampler
    from hirflow.state.graph import GraphConfig, GraphStore
    from hirflow.state.writer import BOTH_SIDES, GraphWriter
    import tempfile
    from pathlib import Path
    model = ServingModel.from_checkpoint(tiny_checkpoints[1])
    assert model.collab is not None and model.d == model.encoder.cfg.d_emb + model.collab.rank
    assert ServingModel.from_checkpoint(tiny_checkpoints[0]).collab is None
    schema = SchemaConfig()
    with tempfile.TemporaryDirectory() as tmp:
        store = GraphStore(Path(tmp) / "s", schema, 1)
        w = GraphWriter(store, GraphConfig(path=str(Path(tmp) / "s")))
        w.apply_batch([(e, BOTH_SIDES) for e in tiny_world])
        w.commit()
        sampler = ViewSampler(store.reader, schema, STUDENT, seed=0)
        ids = sorted(store.reader.node_ids())
        users = [n for n in ids if n.startswith("user:")][:5]
        items = [n for n in model.collab.items[:5]]
        nodes = users + items
        views = sampler.sample(nodes, max(e.ts for e in tiny_world))
        edges = EdgeColumns.from_states(nodes, sampler.records(nodes), schema.action_codes())
        emb, assign, tokens = model.encode(views, {}, None, edges)
        store.close()
    d = model.encoder.cfg.d_emb
    assert emb.shape == (len(nodes), model.d) and tokens.shape == (len(nodes), model.m)
    np.testing.assert_array_equal(emb[len(users):, d:], model.collab.key[:5])
    # every user engaged some item: its block has the checkpoint's user length
    np.testing.assert_allclose(np.linalg.norm(emb[:len(users), d:], axis=1), model.collab.user_norm,
                               rtol=1e-4)
    try:
        model.encode(views, {})
    except ValueError as exc:
        assert "adjacencies" in str(exc)
    else:
        raise AssertionError("a model with a block encoded without the anchors' adjacencies")
