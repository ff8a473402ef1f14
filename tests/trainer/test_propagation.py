"""The graph propagation part of the block: the GF-CF filter, added at unit score spread,
its weight chosen on the holdout only on a clear lead."""
import numpy as np
from hypothesis import given, settings, strategies as st

from hirflow.trainer.holdout import Holdout
from hirflow.trainer.interactions import Interactions
from hirflow.trainer.item_item import block_weights, score_rms, users_gram
from hirflow.trainer.propagation import Propagation, propagation_weights


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 7), st.integers(0, 9)), min_size=1, max_size=40),
       st.integers(1, 3))
def test_the_weights_are_the_normalised_co_engagement_filter_to_a_power(pairs, layers):
    rows, cols = (np.array(x) for x in zip(*pairs))
    r = np.zeros((8, 10))
    r[rows, cols] = 1.0
    du, di = r.sum(1), r.sum(0)
    rn = r / np.sqrt(np.where(du > 0, du, 1))[:, None] / np.sqrt(np.where(di > 0, di, 1))[None, :]
    want = np.linalg.matrix_power(rn.T @ rn, layers)
    np.testing.assert_allclose(propagation_weights(rows, cols, (8, 10), layers), want, atol=1e-10)


def test_the_block_adds_it_at_unit_spread_and_the_holdout_keeps_it_only_on_a_clear_lead():
    rng = np.random.default_rng(0)
    users, items, t = [], [], []
    for u in range(400):                 # chains: users of item i also take i+1 and i+2 (two hops)
        start = int(rng.integers(0, 60))
        for k, i in enumerate((start, start + 1, start + 2, start + 3)):
            users.append(f"user:{u}")
            items.append(f"product:{i}")
            t.append(u * 10 + k)
    data = Interactions.of(list(zip(users, items, t)), ("user",), ("product",), max_items=100)
    r, c, tt = data.arrays()
    plain = block_weights(r, c, tt, data.shape, 10.0, 0.0)
    both = block_weights(r, c, tt, data.shape, 10.0, 0.0, prop=Propagation(2, 0.5))
    p = propagation_weights(r, c, data.shape, 2)
    gram = users_gram(r, c, data.shape)
    want = plain / score_rms(plain, gram, data.shape) + 0.5 * p / score_rms(p, gram, data.shape)
    np.testing.assert_allclose(both, want, rtol=1e-9)
    assert np.array_equal(block_weights(r, c, tt, data.shape, 10.0, 0.0, prop=Propagation(2, 0.0)), plain)
    h = Holdout.at_time(data, data.quantile_time(0.8))
    weight, tried = h.choose_propagation(10.0, 0.0, 0.0, 2, (0.0, 0.5, 1.0))
    assert set(tried) == {0.0, 0.5, 1.0} and weight in tried
    if weight > 0:
        assert tried[weight] > tried[0.0]
    assert h.prop == Propagation(2, weight)
    assert h.choose_propagation(10.0, 0.0, 0.0, 0, (0.0, 0.5)) == (0.0, {}) and h.prop is None
