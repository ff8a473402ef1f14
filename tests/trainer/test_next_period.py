"""The next-period regression: a ridge solve from users' histories before each cut to the
items they engaged first in the period after it, added to EASE^R's weights at unit score
spread, its weight chosen on the holdout by the block alone."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from hirflow.encoder import collaborative as C
from hirflow.trainer import block_fit
from hirflow.trainer.block_config import CollaborativeConfig
from hirflow.trainer.holdout import Holdout, clear_lead
from hirflow.trainer.interactions import Interactions
from hirflow.trainer.item_item import block_weights, ease_scales, ease_weights
from hirflow.trainer.next_period import NextPeriod, next_period_weights

DAY = C.DAY_MS


def reference(rows, cols, t, shape, lam, periods, span, end):
    """The same ridge regression written row by row: for each cut and user, x = the items
    engaged before the cut, y = the items engaged in [cut, cut + span) and not before; a
    row only where y has any."""
    xs, ys = [], []
    for k in range(1, periods + 1):
        cut = end - k * span
        for u in range(shape[0]):
            x, y = np.zeros(shape[1]), np.zeros(shape[1])
            for r, c, s in zip(rows, cols, t):
                if r == u and s < cut:
                    x[c] = 1.0
            for r, c, s in zip(rows, cols, t):
                if r == u and cut <= s < cut + span and not x[c]:
                    y[c] = 1.0
            if y.any():
                xs.append(x)
                ys.append(y)
    if not xs:
        return np.zeros((shape[1], shape[1]))
    x, y = np.array(xs), np.array(ys)
    return np.linalg.solve(x.T @ x + lam * np.eye(shape[1]), x.T @ y)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), periods=st.integers(1, 3), lam=st.sampled_from([0.5, 10.0, 3000.0]))
def test_the_weights_are_the_ridge_solve_over_the_stacked_periods(seed, periods, lam):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 60))
    rows, cols = rng.integers(0, 8, n), rng.integers(0, 5, n)
    t = rng.integers(0, 40, n).astype(float) * DAY
    end = 40 * DAY
    got = next_period_weights(rows, cols, t, (8, 5), lam, periods, 10 * DAY, end)
    want = reference(rows, cols, t, (8, 5), lam, periods, 10 * DAY, end)
    np.testing.assert_allclose(got, want, rtol=1e-7, atol=1e-10)


def test_what_comes_next_is_what_the_weights_point_to():
    """Users who own item 0 go on to buy item 1 (never the reverse, and never item 2, which
    only ever sits beside item 0 in a history): the next-period weights send 0 (and 2, its
    twin, sharing the weight) to 1, where
    EASE^R, which sees only what is owned together, sends 0 to 1 and 2 alike."""
    rows, cols, t = [], [], []
    for u in range(40):
        start = u % 20                       # users start on days 0-19
        rows += [u, u, u]
        cols += [0, 2, 1]
        t += [start * DAY, start * DAY, (start + 5) * DAY]
    rows, cols, t = np.array(rows), np.array(cols), np.array(t, float)
    n = next_period_weights(rows, cols, t, (40, 3), 1.0, 2, 10 * DAY, 25 * DAY)
    assert n[0, 1] > 0.4 and abs(n[0, 2]) < 1e-9 and abs(n[1, 0]) < 1e-9
    b = ease_weights(C.recency_weighted(rows, cols, t, (40, 3), 0.0), 1.0)
    assert b[0, 2] == pytest.approx(b[0, 1], rel=0.2)


def test_the_block_adds_them_at_unit_spread_and_the_holdout_chooses_their_weight():
    rng = np.random.default_rng(3)
    rows, cols = rng.integers(0, 30, 400), rng.integers(0, 12, 400)
    t = rng.uniform(0, 90, 400) * DAY
    shape = (30, 12)
    base = NextPeriod(2, 15 * DAY, 50.0, 0.0)
    # inactive (no weight, or no periods): EASE^R's weights unchanged
    ease = ease_scales(rows, cols, t, shape, 5.0, (10.0, 60.0))
    np.testing.assert_array_equal(block_weights(rows, cols, t, shape, 5.0, (10.0, 60.0), base), ease)
    np.testing.assert_array_equal(
        block_weights(rows, cols, t, shape, 5.0, (10.0, 60.0), NextPeriod(0, 15 * DAY, 50.0, 1.0)), ease)
    # active: both parts at unit root-mean-square score over the binary users, then summed
    x = C.recency_weighted(rows, cols, t, shape, 0.0).toarray()
    n = next_period_weights(rows, cols, t, shape, 50.0, 2, 15 * DAY, int(t.max()) + 1)
    rms = lambda b: np.sqrt(np.mean((x @ b) ** 2))
    got = block_weights(rows, cols, t, shape, 5.0, (10.0, 60.0), NextPeriod(2, 15 * DAY, 50.0, 0.5))
    np.testing.assert_allclose(got, ease / rms(ease) + 0.5 * n / rms(n), rtol=1e-6, atol=1e-9)


def test_the_holdout_keeps_the_chosen_part_and_solves_it_as_the_fit_does():
    """`choose_next` tries every weight of the grid by the block alone and keeps the best;
    the weights it then serves (cached) are those `block_weights` solves afresh, so the
    weight curve and the fit after training see the same block. In this shop a user buys
    a group's anchor with 5 of its 25 companions, and 10 days later one of its 25 next
    items: EASE^R ranks the companions first (they are co-owned with the anchor five times
    as often), the next-period weights know that only next items come next, so the holdout
    gives them a weight."""
    rng = np.random.default_rng(5)
    pairs = []
    for u in range(800):
        t0, g = int(rng.integers(0, 50)), int(rng.integers(0, 4))
        pairs += [(f"user:{u}", f"product:{g}.anchor", t0 * DAY)]
        pairs += [(f"user:{u}", f"product:{g}.c{c}", t0 * DAY) for c in rng.choice(25, 5, replace=False)]
        pairs += [(f"user:{u}", f"product:{g}.n{int(rng.integers(0, 25))}", (t0 + 10) * DAY)]
    data = Interactions.of(sorted(pairs, key=lambda p: p[2]), ("user",), ("product",), 500)
    at = data.quantile_time(0.85)
    base = NextPeriod(2, 10 * DAY, 100.0, 0.0)
    h = Holdout.at_time(data, at)
    lam, fit, _ = h.choose_fit((10.0,), ((15.0, 60.0),))
    weight, tried = h.choose_next(lam, fit, 0.0, base, (0.0, 0.5, 1.0))
    assert set(tried) == {0.0, 0.5, 1.0} and tried[weight] == max(tried.values())
    assert weight > 0 and tried[weight] > tried[0.0] + 0.1       # what comes next is learnable
    assert h.nxt == NextPeriod(2, 10 * DAY, 100.0, weight)
    fresh = block_weights(*h.history, h.before.shape, lam, fit, h.nxt, at)
    np.testing.assert_allclose(h.ease(lam, fit), fresh, rtol=1e-6, atol=1e-9)
    block = block_fit.fit(data, lam, 4, [0], ("user",), fit_days=fit, nxt=h.nxt)
    assert block.settings["next_weight"] == weight and block.settings["next_periods"] == 2


def test_the_config_offers_the_holdout_its_weights():
    assert CollaborativeConfig().next_weights() == CollaborativeConfig().next_grid
    assert CollaborativeConfig(next_weight=0.7).next_weights() == (0.7,)
    assert CollaborativeConfig(next_periods=0).next_weights() == (0.0,)
    for bad in ({"next_periods": -1}, {"next_l2": 0.0}, {"next_weight": -1.0}, {"next_grid": ()}):
        with pytest.raises(ValueError, match="next_"):
            CollaborativeConfig(**bad)


@settings(max_examples=50, deadline=None)
@given(a=st.lists(st.floats(0, 1), min_size=2, max_size=40), shift=st.floats(1e-3, 1))
def test_a_clear_lead_is_more_than_one_standard_error(a, shift):
    a = np.array(a)
    assert clear_lead(a + shift, a)                       # the same lead for every user
    assert not clear_lead(a, a)                           # no lead
    b = a[::-1]
    assert not (clear_lead(a, b) and clear_lead(b, a))
    d = a - b
    assert clear_lead(a, b) == (d.mean() > d.std(ddof=1) / np.sqrt(len(d)))


def test_a_lead_inside_the_noise_keeps_the_block_as_it_was():
    """Where the next period is noise (users' next items unrelated to what they had), the
    holdout's best weight here leads weight 0 by less than a standard error, and weight 0
    is kept: EASE^R's block unchanged."""
    rng = np.random.default_rng(16)
    pairs = []
    for u in range(400):
        t0, g = int(rng.integers(0, 50)), int(rng.integers(0, 4))
        pairs += [(f"user:{u}", f"product:{g}.{int(c)}", t0 * DAY) for c in rng.choice(20, 4, replace=False)]
        pairs += [(f"user:{u}", f"product:{int(rng.integers(0, 4))}.{int(rng.integers(0, 20))}", (t0 + 10) * DAY)]
    data = Interactions.of(sorted(pairs, key=lambda p: p[2]), ("user",), ("product",), 500)
    at = data.quantile_time(0.85)
    h = Holdout.at_time(data, at)
    lam, fit, _ = h.choose_fit((10.0,), ((15.0, 60.0),))
    weight, tried = h.choose_next(lam, fit, 0.0, NextPeriod(2, 10 * DAY, 100.0, 0.0), (0.0, 0.5, 1.0))
    assert weight == 0.0 and max(tried.values()) > tried[0.0], tried     # a lead, not kept
    np.testing.assert_array_equal(h.ease(lam, fit), ease_scales(*h.history, h.before.shape, lam, fit))
    # no periods: nothing to try, nothing added
    assert h.choose_next(lam, fit, 0.0, NextPeriod(0, 10 * DAY, 100.0, 0.0), (0.0,)) == (0.0, {})
    assert h.nxt is None
