"""The collaborative block's popularity prior: what it counts, when the holdout adds it, and
that a served block carries it as one coordinate every user adds alike."""
import numpy as np
from hypothesis import given, settings, strategies as st

from hirflow.encoder import collaborative as C
from hirflow.state.edge_columns import EdgeColumns
from hirflow.trainer import block_fit
from hirflow.trainer.holdout import Holdout
from hirflow.trainer.interactions import Interactions
from hirflow.trainer.popularity_prior import Prior, choose_prior, prior_scores

DAY = C.DAY_MS


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 4), st.integers(0, 30)), min_size=1, max_size=40),
       st.floats(0.5, 50.0))
def test_the_prior_counts_distinct_users_weighted_by_their_last_engagement(pairs, tau):
    rows, cols, days = (np.array(x) for x in zip(*pairs))
    at = 31 * DAY
    flat = prior_scores(rows, cols, days * DAY, 5, at, (0.0,))
    distinct = [len({r for r, c, _ in pairs if c == i}) for i in range(5)]
    np.testing.assert_allclose(flat, np.log1p(distinct))
    decayed = prior_scores(rows, cols, days * DAY, 5, at, (tau,))
    assert np.all(decayed <= flat + 1e-12) and np.all((decayed > 0) == (flat > 0))
    # a user's repeat of an item moves its weight to the later time, never adds a user
    again = prior_scores(np.r_[rows, rows[:1]], np.r_[cols, cols[:1]], np.r_[days, 30] * DAY, 5, at, (tau,))
    assert again[cols[0]] >= decayed[cols[0]] - 1e-12
    np.testing.assert_allclose(np.delete(again, cols[0]), np.delete(decayed, cols[0]))


def _stream(trending: bool, seed: int = 0, users: int = 400, items: int = 60):
    """(user, item, ts) over 100 days: with `trending`, most engagements go to the four items
    in fashion that month (a new four each month), the rest to random items: what a user had
    says little, what many engage lately says most; without it, users stay inside one of six
    taste groups of equal popularity."""
    rng = np.random.default_rng(seed)
    out = []
    for u in range(users):
        g = int(rng.integers(0, 6))
        for _ in range(6):
            day = int(rng.integers(0, 100))
            if trending:
                i = 4 * (day // 25) + int(rng.integers(0, 4)) if rng.random() < 0.6 else int(rng.integers(16, items))
            else:
                i = g * (items // 6) + int(rng.integers(0, items // 6))
            out.append((f"user:{u}", f"product:{i}", day * DAY + int(rng.integers(0, DAY))))
    return sorted(out, key=lambda x: x[2])


def _choose(trending: bool) -> tuple[Holdout, float, dict]:
    data = Interactions.of(_stream(trending), ("user",), ("product",), max_items=100)
    h = Holdout.at_time(data, data.quantile_time(0.75))
    h.choose_fit((10.0,))
    weight, tried = choose_prior(h, 10.0, 0.0, 0.0, 32, (5.0,), (0.0, 0.5, 1.0, 2.0))
    return h, weight, tried


def test_the_holdout_adds_the_prior_where_popularity_decides_and_not_where_tastes_do():
    h, weight, tried = _choose(trending=True)
    assert weight > 0 and tried[weight] > tried[0.0] and h.prior is not None
    # the encoder-against-block curve scores the block with its chosen prior
    encoder = np.random.default_rng(0).normal(size=(len(h.judged), h.before.shape[1])) * 1e-3
    assert h.weight_curve(encoder, 10.0, 32, (C.BLOCK_ALONE,))[C.BLOCK_ALONE].mean() == tried[weight]
    h, weight, tried = _choose(trending=False)
    assert weight == 0.0 and h.prior is None and set(tried) == {0.0, 0.5, 1.0, 2.0}


def test_a_served_block_carries_the_prior_as_one_coordinate_every_user_adds_alike():
    data = Interactions.of(_stream(trending=True), ("user",), ("product",), max_items=30)
    assert data.tail                                     # the prior covers the folded-in items too
    plain = block_fit.fit(data, 10.0, 8, [3], ("user",))
    block = block_fit.fit(data, 10.0, 8, [3], ("user",), prior=Prior(1.0, (10.0,)))
    assert plain.prior is None and plain.rank == 8 and C.PRIOR not in plain.weights()
    assert block.rank == 9 and block.prior.shape == (len(block.items),)
    np.testing.assert_array_equal(block.key, plain.key)
    counts = prior_scores(*data.arrays(), len(data.items), data.last_time + 1, (10.0,))
    np.testing.assert_allclose(block.prior[:len(data.items)] / block.settings["prior_unit"], counts, rtol=1e-5)
    assert block_fit.fit(data, 10.0, 8, [3], ("user",), prior=Prior(0.0, (10.0,))).prior is None

    scaled = block_fit.scaled(block, np.array([0.0, 4.0]), np.array([0.0, 1.0]), 0.5)   # scale 2
    again = C.CollaborativeBlock.from_parts(scaled.manifest(), *(scaled.weights()[k] for k in (C.QUERY, C.KEY)),
                                            scaled.weights()[C.PRIOR])
    users, items = ["user:1", "user:2"], list(block.items[:5])
    names = users + items
    edges = EdgeColumns(nodes=tuple(names), present=np.ones(len(names), bool),
                        bounds=np.array([0, 2, 3] + [3] * len(items)), names=tuple(items[:2]),
                        nbr=np.array([0, 1, 0], np.int32), action=np.array([3, 3, 3], np.int16),
                        w=np.ones(3), t_ref=np.array([1, 2, 3]), first=np.array([1, 2, 3]))
    rows = again.blocks(names, edges)
    assert rows.shape == (len(names), 9)
    np.testing.assert_allclose(rows[2:, -1], scaled.prior[:5])
    np.testing.assert_allclose(rows[:2, -1], scaled.settings["prior_user"])
    # the served score: the item-item part, plus the same prior for every user, both doubled
    served = rows[:2] @ rows[2:].T
    base = block.blocks(names, edges)
    item_item = base[:2, :8] @ base[2:, :8].T
    np.testing.assert_allclose(served, 2 * (item_item + block.prior[:5][None, :]), rtol=1e-4, atol=1e-6)
