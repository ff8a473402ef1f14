"""The collaborative block: its inner products are EASE^R's scores (exact at full rank), a
user's block is the sum over the distinct items it engaged as of a cutoff, and the served
embedding carries it through a checkpoint into serving."""
import numpy as np
import scipy.sparse as sp
from hypothesis import given, settings, strategies as st

from hirflow.encoder import collaborative as C
from hirflow.state.edge_columns import EdgeColumns
from hirflow.state.node import OUT, NodeState

ITEMS = [f"product:{i}" for i in range(6)]


def engagements(rng: np.random.Generator, users: int = 40, per_user: int = 4):
    """Time-ordered (user, item, ts): each user buys a few items of a 6-item shop, items
    0-2 and 3-5 bought together more often."""
    out, t = [], 0
    for u in range(users):
        group = rng.integers(0, 2)
        for _ in range(per_user):
            i = int(rng.integers(0, 3)) + 3 * int(group) if rng.random() < 0.8 else int(rng.integers(0, 6))
            t += int(rng.integers(1, 1000))
            out.append((f"user:{u}", ITEMS[i], t))
    return sorted(out, key=lambda x: x[2])


def test_a_full_rank_block_scores_as_ease_and_lambda_comes_from_the_grid():
    rng = np.random.default_rng(0)
    pairs = engagements(rng)
    cfg = C.CollaborativeConfig(rank=64, l2_grid=(1.0, 10.0, 100.0))
    block = C.fit(pairs, ("user",), ("product",), [3], cfg)
    assert block.items == tuple(ITEMS) and block.rank == 5          # at most items - 1
    assert block.settings["l2"] in cfg.l2_grid and len(block.settings["holdout_recall@20"]) == 3
    users = sorted({u for u, _, _ in pairs})
    x = sp.csr_matrix((np.ones(len(pairs)), ([users.index(u) for u, _, _ in pairs],
                                              [ITEMS.index(i) for _, i, _ in pairs])), shape=(len(users), 6))
    x.data[:] = 1.0
    b = C.ease_weights(x, block.settings["l2"])
    # rank I - 1 drops only the smallest singular direction of B
    u, s, vt = np.linalg.svd(b)
    np.testing.assert_allclose(block.query @ block.key.T, (u[:, :5] * s[:5]) @ vt[:5], atol=1e-5)
    # encoder scores spread (std) 2, block scores 0.5, weight 0.5: block scores times 2
    scaled = C.scaled(block, np.array([0.0, 4.0]), np.array([0.0, 1.0]), 0.5)
    assert scaled.settings["scale"] == 2.0
    np.testing.assert_allclose(scaled.query @ scaled.key.T, 2 * block.query @ block.key.T,
                               rtol=1e-5, atol=1e-6)


def test_nothing_to_fit_gives_no_block():
    cfg = C.CollaborativeConfig()
    assert C.fit([], ("user",), ("product",), [0], cfg) is None
    assert C.fit([("user:1", "product:1", 1)] * 5, ("user",), ("product",), [0],
                 C.CollaborativeConfig(rank=0)) is None


edge = st.tuples(st.integers(0, 7),            # neighbour: products 0-5 (6-7 outside the vocabulary)
                 st.integers(0, 2),            # action code: 0 counts, 1 counts, 2 does not
                 st.floats(-1.0, 2.0),         # stored weight (negative: negative feedback)
                 st.integers(0, 100))          # first event time


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(edge, max_size=12), min_size=1, max_size=5), st.integers(0, 110))
def test_a_users_block_sums_its_distinct_counted_items_as_of_the_cutoff(adjacency, cutoff):
    rng = np.random.default_rng(1)
    block = C.CollaborativeBlock(tuple(ITEMS), rng.standard_normal((6, 3)).astype(np.float32),
                                 rng.standard_normal((6, 3)).astype(np.float32), (0, 1), ("user",))
    names = [f"user:{i}" for i in range(len(adjacency))] + ["product:2", "product:7", "advertiser:1"]
    actions = ["a0", "a1", "a2"]
    states = {}
    for n, edges in zip(names, adjacency):
        s = NodeState(n)
        for nbr, act, w, first in edges:
            s.edges[(f"product:{nbr}", actions[act], OUT)] = (w, first, 1, first)
        states[n] = s
    cols = EdgeColumns.from_states(names, states, {a: i for i, a in enumerate(actions)})
    got = block.blocks(names, cols, cutoff)
    for i, n in enumerate(names[:len(adjacency)]):
        items = {int(nbr.split(":")[1]) for (nbr, act, _), (w, _, _, first) in states[n].edges.items()
                 if nbr in ITEMS and act in ("a0", "a1") and w > 0 and first <= cutoff}
        want = block.query[sorted(items)].sum(0) if items else np.zeros(3, np.float32)
        np.testing.assert_allclose(got[i], want, atol=1e-5)
    np.testing.assert_array_equal(got[-3], block.key[2])      # an item: its own row
    assert not got[-2:].any()                                 # outside the vocabulary, other types


def test_served_embeddings_carry_the_block_through_the_checkpoint(tiny_checkpoints, tiny_world):
    """The tiny successor checkpoint serves d_emb + rank coordinates: the encoder's, then a
    user's block as the sum of its items' query rows; tokens cover the whole embedding."""
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
    assert np.abs(emb[:len(users), d:]).sum(1).min() > 0     # every user engaged some item
    try:
        model.encode(views, {})
    except ValueError as exc:
        assert "adjacencies" in str(exc)
    else:
        raise AssertionError("a model with a block encoded without the anchors' adjacencies")
