"""Fitting and choosing the collaborative block: its inner products are EASE^R's scores
(exact at full rank), the holdout judges users with a history and chooses lambda, the fit,
the rank and the parts, and the items beyond the dense vocabulary are folded in."""
import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings, strategies as st

from hirflow.encoder import collaborative as C
from hirflow.trainer import block_fit
from hirflow.trainer.block_config import CollaborativeConfig
from hirflow.encoder.collaborative import BLOCK_ALONE, ENCODER_ALONE
from hirflow.trainer.holdout import Holdout, choose_parts, weights_tried
from hirflow.trainer.interactions import Interactions
from hirflow.trainer.item_item import ease_scales, ease_weights, fit_weighted, reduced_rank
from hirflow.trainer.next_period import binary

ITEMS = [f"product:{i}" for i in range(6)]


def engagements(rng: np.random.Generator, users: int = 40, per_user: int = 4, groups: int = 2,
                per_group: int = 3):
    """Time-ordered (user, item, ts), users' purchases interleaved in time: each buys a few
    items of a shop of `groups` x `per_group` items, mostly from one group."""
    n = groups * per_group
    out = []
    for u in range(users):
        g = int(rng.integers(0, groups))
        for _ in range(per_user):
            i = g * per_group + int(rng.integers(0, per_group)) if rng.random() < 0.8 else int(rng.integers(0, n))
            out.append((f"user:{u}", f"product:{i}", int(rng.integers(0, 1_000_000))))
    return sorted(out, key=lambda x: x[2])


def test_a_block_scores_as_rank_truncated_ease_and_the_holdout_chooses_from_its_grids():
    rng = np.random.default_rng(0)
    pairs = engagements(rng)
    data = Interactions.of(pairs, ("user",), ("product",), max_items=10)
    assert data.items == sorted(ITEMS)
    h = Holdout.at_time(data, data.quantile_time(0.8))
    assert h.usable and all(t.size for t in h.truth)
    # the holdout's truth: items new to the user from `at` on, never ones it had before
    assert not any(h.before[u, t].sum() for u, t in zip(h.judged, h.truth))
    lam, fit_days, tried = h.choose_fit((1.0, 10.0, 100.0), (0.0, 3.0))
    assert set(tried) == {(lam_, d) for lam_ in (1.0, 10.0, 100.0) for d in (0.0, 3.0)}
    assert tried[(lam, fit_days)] == max(tried.values())
    lam = h.choose_fit((1.0, 10.0, 100.0))[0]                 # binary fit only, from here on
    curve = h.weight_curve(np.zeros((len(h.judged), 6)), lam, 3, weights_tried((0.5, 2.0)))
    assert set(curve) == {0.0, 0.5, 2.0, BLOCK_ALONE}
    assert all(len(r) == len(h.judged) for r in curve.values())

    b = ease_weights(data.matrix(), lam)
    block = block_fit.fit(data, lam, 64, [3], ("user",))
    assert block.items == tuple(sorted(ITEMS)) and block.rank == 5   # at most items - 1
    q, k = reduced_rank(b, data.matrix(), 5)
    np.testing.assert_allclose(block.query @ block.key.T, q @ k.T, atol=1e-6)
    # encoder scores spread (std) 2, block scores 0.5, weight 0.5: block scores times 2
    scaled = block_fit.scaled(block, np.array([0.0, 4.0]), np.array([0.0, 1.0]), 0.5)
    assert scaled.settings["scale"] == 2.0
    np.testing.assert_allclose(scaled.query @ scaled.key.T, 2 * block.query @ block.key.T,
                               rtol=1e-5, atol=1e-6)
    # users' blocks have unit length before scaling; the served user-item scores double too
    x = data.matrix()
    assert block.user_norm == 1.0
    lengths = np.linalg.norm(C.user_rows(x, block.query, 1.0), axis=1)
    np.testing.assert_allclose(lengths[np.diff(x.indptr) > 0], 1.0, rtol=1e-5)
    np.testing.assert_allclose(C.user_rows(x, scaled.query, scaled.user_norm) @ scaled.key.T,
                               2 * C.user_rows(x, block.query, block.user_norm) @ block.key.T,
                               rtol=1e-4, atol=1e-6)
    assert block_fit.fit(data, lam, 64, [3], ("user",), unit_users=False).user_norm is None


def _holdout(seed: int = 2) -> Holdout:
    rng = np.random.default_rng(seed)
    data = Interactions.of(engagements(rng, users=300, per_user=6, groups=8, per_group=8),
                             ("user",), ("product",), max_items=100)
    assert len(data.items) > 40                 # Recall@20 must be able to miss
    return Holdout.at_time(data, data.quantile_time(0.7))


def test_the_holdout_judges_only_users_with_a_history():
    h = _holdout()
    assert len(h.judged) and (np.diff(h.before.indptr)[h.judged] > 0).all()


def test_the_served_weight_follows_the_part_the_holdout_rewards():
    """Encoder scores that know the holdout's answers: the encoder alone (or a mix leaning on
    it); scores that are noise: the block alone; a random encoder (below popularity): the
    block alone, whatever the mixes say."""
    h = _holdout()
    n = h.before.shape[1]
    oracle = np.zeros((len(h.judged), n))
    for i, t in enumerate(h.truth):
        oracle[i, t] = 1.0
    grid = weights_tried((0.25, 1.0, 4.0))
    weight, tried, _ = choose_parts(h.weight_curve(oracle, 10.0, 16, grid), h.popularity())
    assert weight == ENCODER_ALONE and tried[weight] == max(tried.values())
    noise = np.random.default_rng(3).standard_normal((len(h.judged), n))
    curve = h.weight_curve(noise, 10.0, 16, grid)
    assert choose_parts(curve)[0] == BLOCK_ALONE
    assert choose_parts(curve, h.popularity())[0] == BLOCK_ALONE
    np.testing.assert_allclose(curve[BLOCK_ALONE].mean(), curve[max(grid[:-1])].mean(), atol=0.05)


@settings(max_examples=30, deadline=None)
@given(enc=st.lists(st.floats(0, 1), min_size=5, max_size=5),
       blk=st.lists(st.floats(0, 1), min_size=5, max_size=5),
       mixes=st.lists(st.lists(st.floats(0, 1), min_size=5, max_size=5), min_size=1, max_size=3),
       pop=st.floats(0, 1))
def test_the_served_weight_is_the_best_mean_ties_to_the_better_part(enc, blk, mixes, pop):
    """Whatever the curve: below popularity the encoder is never served; otherwise the
    weight with the best mean, and a mix only when its mean is above both parts alone (a
    tie goes to the better part alone, and between the parts to the block)."""
    per_user = {ENCODER_ALONE: np.array(enc), BLOCK_ALONE: np.array(blk)}
    per_user.update({0.5 * (i + 1): np.array(m) for i, m in enumerate(mixes)})
    popularity = np.full(5, pop)
    weight, tried, why = choose_parts(per_user, popularity)
    if np.mean(enc) < pop:
        assert weight == BLOCK_ALONE
        return
    alone = BLOCK_ALONE if tried[BLOCK_ALONE] >= tried[ENCODER_ALONE] else ENCODER_ALONE
    assert tried[weight] == max(tried.values())
    if weight not in (ENCODER_ALONE, BLOCK_ALONE):
        assert tried[weight] > tried[alone]
    else:
        assert weight == alone
    assert why


def test_a_flat_curve_serves_the_part_that_ranks_better_alone():
    """The failure a ratings data set showed: every weight ties, the lightest used to win."""
    same = np.array([0.0, 0.2, 0.1, 0.0])
    per_user = {w: same for w in weights_tried((0.25, 0.5, 1.0))}
    per_user[ENCODER_ALONE] = np.zeros(4)
    assert choose_parts(per_user, np.zeros(4))[0] == BLOCK_ALONE


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.integers(0, 5), st.integers(0, 400)), min_size=1,
                max_size=40),
       st.sampled_from([0.0, 1.0, 30.0]), st.integers(-10 ** 12, 10 ** 12))
def test_fit_weights_favour_recent_pairs_and_keep_the_binary_trace(pairs, days, shift):
    """One entry per (user, item) at its latest time, exp(t / tau) up to one factor that makes
    the squared entries sum to the number of pairs (a binary matrix's Gram trace), so a clock
    shift changes nothing; tau 0 is the binary matrix."""
    rows, cols, t = (np.array(c) for c in zip(*pairs))
    t = t * C.DAY_MS / 10.0
    x = fit_weighted(rows, cols, t + shift, (5, 6), days)
    binary = C.recency_weighted(rows, cols, t, (5, 6), 0.0)
    assert (x.toarray() > 0).sum() == binary.nnz
    np.testing.assert_allclose(x.multiply(x).sum(), binary.nnz, rtol=1e-4)
    if not days:
        np.testing.assert_array_equal(x.toarray(), binary.toarray())
        return
    latest = {}
    for r, c, tt in zip(rows, cols, t):
        latest[(r, c)] = max(latest.get((r, c), -np.inf), tt)
    want = np.zeros((5, 6))
    for (r, c), tt in latest.items():
        want[r, c] = np.exp((tt - max(latest.values())) / (days * C.DAY_MS))
    want *= np.sqrt(len(latest) / np.sum(want ** 2))
    np.testing.assert_allclose(x.toarray(), want, rtol=1e-4, atol=1e-30)


def test_the_holdout_fits_on_recent_pairs_when_items_change_company():
    """Items sell in groups of 25 that are reshuffled after 70 % of the window (a catalogue's
    seasons): the binary fit still ranks an item's old companions first, filling the top 20,
    while the holdout's purchases follow the new groups, so the holdout prefers a fit that
    weighs recent pairs more."""
    rng = np.random.default_rng(4)
    n_items, size, day = 200, 25, C.DAY_MS
    old_group = np.arange(n_items) // size
    new_group = rng.permutation(n_items) // size
    pairs = []
    for u in range(1500):
        t0 = int(rng.integers(0, 200))
        groups = old_group if t0 < 140 else new_group
        g = int(rng.integers(0, n_items // size))
        for k, i in enumerate(rng.choice(np.flatnonzero(groups == g), 4, replace=False)):
            pairs.append((f"user:{u}", f"product:{i}", (t0 + 3 * k) * day))   # over 9 days
    data = Interactions.of(sorted(pairs, key=lambda p: p[2]), ("user",), ("product",), n_items)
    h = Holdout.at_time(data, data.quantile_time(0.9))
    lam, days, tried = h.choose_fit((10.0,), (0.0, 20.0))
    assert days == 20.0 and tried[(10.0, 20.0)] > tried[(10.0, 0.0)] + 0.05, tried
    block = block_fit.fit(data, lam, 16, [0], ("user",), fit_days=days)
    assert block.settings["fit_days"] == 20.0
    # the fits at several scales summed (the default) follow the new groups as well
    lam, fit, tried = h.choose_fit((10.0,), (0.0, (20.0, 80.0)))
    assert fit == (20.0, 80.0) and tried[(10.0, fit)] > tried[(10.0, 0.0)] + 0.05, tried
    assert block_fit.fit(data, lam, 16, [0], ("user",), fit_days=fit).settings["fit_days"] == [20.0, 80.0]


def test_a_sum_of_recency_scales_gives_each_scale_the_same_say():
    """`ease_scales` with several taus is the mean of each tau's EASE^R weights divided by the
    root mean square of its scores of the fitting users (their binary rows); with one tau it
    is that tau's fit, unscaled."""
    rng = np.random.default_rng(2)
    rows, cols = rng.integers(0, 30, 300), rng.integers(0, 12, 300)
    t = rng.uniform(0, 90, 300) * C.DAY_MS
    shape = (30, 12)
    x = C.recency_weighted(rows, cols, t, shape, 0.0).toarray()
    fits = [ease_weights(fit_weighted(rows, cols, t, shape, d), 5.0) for d in (10.0, 60.0)]
    want = sum(b / np.sqrt(np.mean((x @ b) ** 2)) for b in fits) / 2
    np.testing.assert_allclose(ease_scales(rows, cols, t, shape, 5.0, (10.0, 60.0)), want,
                               rtol=1e-6, atol=1e-9)
    np.testing.assert_array_equal(ease_scales(rows, cols, t, shape, 5.0, 10.0), fits[0])
    np.testing.assert_array_equal(ease_scales(rows, cols, t, shape, 5.0, (10.0,)), fits[0])


def test_recency_scales_are_multiples_of_the_holdout_window_unless_fixed():
    """Each data set's own clock: the same multiples give days on a shop's year, hours on a
    day of sessions; a fixed tau is that tau; the ranks offered follow the config."""
    c = CollaborativeConfig()
    assert c.fits(16.0) == (tuple(16.0 * m for m in c.fit_windows), 0.0)
    mixture = tuple(0.5 * m for m in c.recency_windows)
    assert c.recency_taus(0.5) == (mixture,)
    assert c.recency_taus(0.5, 0.01) == (mixture, *(0.01 * m for m in c.recency_gaps))
    assert CollaborativeConfig(fit_days=7.0).fits(16.0) == (7.0,)
    assert CollaborativeConfig(recency_days=0.0).recency_taus(16.0, 0.01) == (0.0,)
    assert c.ranks() == (128, 256, 512) and CollaborativeConfig(rank=64).ranks() == (64,)
    assert not CollaborativeConfig(rank=0).enabled
    with pytest.raises(ValueError, match="rank_grid"):
        CollaborativeConfig(rank_grid=())


def test_a_wider_block_is_chosen_only_on_a_clear_lead():
    """Items in many small groups: a narrow block cannot hold them and a wider one ranks
    clearly better; a narrow block that holds them all keeps the narrowest width."""
    rng = np.random.default_rng(4)
    many = Interactions.of(engagements(rng, users=600, per_user=8, groups=30, per_group=4),
                             ("user",), ("product",), max_items=200)
    h = Holdout.at_time(many, many.quantile_time(0.8))
    h.ease(10.0)
    rank, tried = h.choose_rank(0.0, (2, 8, 64))
    assert rank > 2 and tried[rank] > tried[2]
    few = Interactions.of(engagements(rng, users=300, per_user=6, groups=2, per_group=12),
                            ("user",), ("product",), max_items=200)
    h = Holdout.at_time(few, few.quantile_time(0.8))
    h.ease(10.0)
    assert h.choose_rank(0.0, (8, 16))[0] == 8


def test_the_holdout_weighs_recent_items_more_when_tastes_drift():
    """Users who buy from one group of items, then move to another and stay there: the
    holdout's new items are the second group's, so a short tau (weighing the first
    group down) to weighing all alike: the block ranks better with it. Groups of 40 items, so that Recall@20 can miss."""
    rng = np.random.default_rng(3)
    n_groups, per_group, day = 5, 40, C.DAY_MS
    pairs = []
    for u in range(300):
        a = int(rng.integers(0, n_groups))
        b = (a + 1 + int(rng.integers(0, n_groups - 1))) % n_groups
        for k in range(6):                     # days 0-5 from group a, then from b (day 60 on)
            for g, t in ((a, k), (b, 60 + 3 * k)):
                pairs.append((f"user:{u}", f"product:{g * per_group + int(rng.integers(0, per_group))}",
                              t * day))
    data = Interactions.of(sorted(pairs, key=lambda p: p[2]), ("user",), ("product",), 200)
    h = Holdout.at_time(data, data.quantile_time(0.75))
    b = h.ease(10.0)
    tried = {d: h.recall(np.asarray(h.queries(d) @ b)) for d in (0.0, 5.0)}
    assert tried[5.0] > tried[0.0] + 0.05, tried


def switching_sessions(rng: np.random.Generator, sessions: int = 600, groups: int = 5,
                       per_group: int = 40) -> list[tuple[str, str, int]]:
    """Sessions a minute per click over 20 days: three clicks in one group of items, then
    five in another, where the session stays: what it clicks last says where it goes."""
    out = []
    for s in range(sessions):
        a = int(rng.integers(0, groups))
        b = (a + 1 + int(rng.integers(0, groups - 1))) % groups
        start = int(rng.integers(0, 20 * C.DAY_MS))
        for k, g in enumerate((a, a, a, b, b, b, b, b)):
            out.append((f"user:{s}", f"product:{g * per_group + int(rng.integers(0, per_group))}",
                        start + k * 60_000 + int(rng.integers(0, 20_000))))
    return sorted(out, key=lambda x: x[2])


def test_the_holdout_weighs_a_sessions_last_clicks_at_its_own_tempo():
    """Sessions whose intent moves within minutes: the median gap is about a minute, and a
    tau of that tempo clearly beats the season-long mixture (which weighs a session's clicks
    alike); on a shop whose users keep their taste the mixture stays."""
    c = CollaborativeConfig()
    data = Interactions.of(switching_sessions(np.random.default_rng(5)), ("user",), ("product",), 300)
    gap = data.median_gap()
    assert 40_000 < gap < 80_000, gap
    h = Holdout.at_time(data, data.quantile_time(0.8), sessions=True)
    candidates = c.recency_taus(1.0, gap / C.DAY_MS)
    taus, tried = h.choose_recency(10.0, 0.0, candidates)
    assert taus in candidates[1:] and tried[C.taus_of(taus)] > tried[C.taus_of(candidates[0])] + 0.05, tried
    shop = Interactions.of(engagements(np.random.default_rng(6), users=400, per_user=8, groups=5,
                                       per_group=40), ("user",), ("product",), 300)
    h = Holdout.at_time(shop, shop.quantile_time(0.8))
    candidates = c.recency_taus(1.0, shop.median_gap() / C.DAY_MS)
    assert h.choose_recency(10.0, 0.0, candidates)[0] == candidates[0]
    assert h.choose_recency(10.0, 0.0, (3.0,)) == (3.0, {})


@given(st.lists(st.tuples(st.integers(0, 4), st.integers(0, 50)), max_size=40))
@settings(max_examples=60, deadline=None)
def test_the_median_gap_is_between_a_users_successive_instants(pairs):
    """The median of the gaps between each user's successive distinct engagement times, all
    users' gaps pooled (any item; 0 without two instants), whatever order they come in."""
    data = Interactions.of([(f"user:{u}", f"product:{t % 3}", t * 1000) for u, t in pairs],
                           ("user",), ("product",), 10)
    gaps = [b - a for u in {u for u, _ in pairs}
            for a, b in zip(sorted({t * 1000 for v, t in pairs if v == u}),
                            sorted({t * 1000 for v, t in pairs if v == u})[1:])]
    assert data.median_gap() == (float(np.median(gaps)) if gaps else 0.0)


def test_nothing_to_fit_gives_no_block():
    empty = Interactions.of([], ("user",), ("product",), 10)
    assert block_fit.fit(empty, 10.0, 8, [0], ("user",)) is None
    one = Interactions.of([("user:1", "product:1", 1)] * 5, ("user",), ("product",), 10)
    assert block_fit.fit(one, 10.0, 8, [0], ("user",)) is None                # one item: nothing to learn
    assert block_fit.fit(Interactions.of(engagements(np.random.default_rng(0)), ("user",), ("product",), 10),
                 10.0, 0, [0], ("user",)) is None                   # rank 0: no block


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2 ** 31 - 1), users=st.integers(5, 60), items=st.integers(3, 30),
       density=st.floats(0.05, 0.6), lam=st.floats(0.1, 100.0), rank=st.integers(1, 30))
def test_the_reduced_rank_is_the_rank_r_model_closest_to_easer_on_its_users(seed, users, items,
                                                                             density, lam, rank):
    """For any users x items history: the reduced rank's scores of the fitting users are at
    least as close to EASE^R's as those of B's truncated SVD of the same rank (it is the best
    rank-r approximation of the score matrix, which the truncated B's scores are one of), and
    exactly EASE^R's at full rank."""
    rng = np.random.default_rng(seed)
    x = sp.csr_matrix((rng.random((users, items)) < density).astype(np.float64))
    b = ease_weights(x, lam)
    rank = min(rank, items)
    scores = np.asarray(x @ b)
    q, k = reduced_rank(b, x, rank)
    u, sv, vt = np.linalg.svd(b)                        # B's own truncated SVD
    err = np.linalg.norm(scores - x @ (q @ k.T))
    err_svd = np.linalg.norm(scores - x @ ((u[:, :rank] * sv[:rank]) @ vt[:rank]))
    assert err <= err_svd * (1 + 1e-4) + 1e-4
    q, k = reduced_rank(b, x, items)
    np.testing.assert_allclose(q @ k.T, b, atol=2e-4)


def test_items_beyond_the_dense_vocabulary_are_folded_in_on_its_scale():
    """A vocabulary of 10 of 24 items: every other item with 3+ users gets rows, on the scale
    of the vocabulary's (folded-in vocabulary items would get EASE^R's keys back up to one
    scale), and a user scores the tail items of its own group above the other group's."""
    rng = np.random.default_rng(3)
    pairs = engagements(rng, users=300, per_user=6, groups=2, per_group=12)
    full = Interactions.of(pairs, ("user",), ("product",), max_items=100)
    data = Interactions.of(pairs, ("user",), ("product",), max_items=10)
    assert len(data.items) == 10 and set(data.items) | set(data.tail) == set(full.items)
    block = block_fit.fit(data, 10.0, 8, [3], ("user",))
    assert block.items == tuple(data.items) + tuple(data.tail) and block.settings["tail_items"] == len(data.tail)
    head_scale = np.linalg.norm(block.key[:10], axis=1).mean()
    tail_scale = np.linalg.norm(block.key[10:], axis=1).mean()
    assert 0.2 < tail_scale / head_scale < 5
    group = {f"product:{g * 12 + i}": g for g in range(2) for i in range(12)}
    r, c, t = data.arrays()
    users = C.user_rows(binary(r, c, (len(data.users), len(block.items))), block.query, 1.0)
    tail_cols = np.arange(10, len(block.items))
    wins = []
    for u in range(len(data.users)):
        own = [group[data.items[j]] for j in c[r == u]]
        if not own:
            continue
        g = max(set(own), key=own.count)
        s = users[u] @ block.key[tail_cols].T
        mine = [s[k] for k, j in enumerate(tail_cols) if group[block.items[j]] == g]
        other = [s[k] for k, j in enumerate(tail_cols) if group[block.items[j]] != g]
        if mine and other:
            wins.append(np.mean(mine) > np.mean(other))
    assert np.mean(wins) > 0.8


def test_an_item_engaged_by_fewer_than_three_users_gets_no_row():
    pairs = [("user:a", "product:x", 1), ("user:b", "product:x", 2), ("user:a", "product:y", 3),
             ("user:b", "product:y", 4), ("user:c", "product:y", 5), ("user:c", "product:z", 6),
             ("user:a", "product:w", 7), ("user:b", "product:w", 8), ("user:c", "product:w", 9)]
    data = Interactions.of(pairs, ("user",), ("product",), max_items=1)
    assert data.items == ["product:w"] and data.tail == ["product:y"]      # x: 2 users, z: 1


def test_a_session_holdout_judges_each_new_session_on_its_later_half():
    pairs = [("user:a", "product:1", 1), ("user:a", "product:2", 2)]        # before the window
    pairs += [(f"user:s{k}", f"product:{(k + j) % 5}", 10 + 3 * k + j) for k in range(6) for j in range(4)]
    data = Interactions.of(pairs, ("user",), ("product",), max_items=10)
    plain = Holdout.at_time(data, 10)
    sessions = Holdout.at_time(data, 10, sessions=True)
    assert len(plain.judged) == 0                                           # no session has history
    assert len(sessions.judged) == 6 and len(sessions.prefix) == 12         # 2 of 4 clicks each
    assert all(sessions.before[u].nnz == 2 for u in sessions.judged)
