"""The next-click task: which engagements are queries, what a prefix holds, ranks and metrics."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from hirflow.state.events import Engagement
from bench.protocols.next_click import grouped_ci, grouped_ratio_ci, hit_and_rr, next_click_task, ranks

POS = {"click"}


def ev(s, i, t, action="click"):
    return Engagement(f"user:{s}", f"ad:{i}", action, t)


def test_queries_are_every_engagement_of_the_window_with_something_strictly_before_it():
    lo = 1000
    evs = [ev(1, 1, 10), ev(2, 2, 20), ev(3, 3, 30),
           ev(1, 2, lo + 1), ev(1, 1, lo + 2),            # two queries; the second a repeat
           ev(4, 1, lo + 5), ev(4, 2, lo + 5),            # the same millisecond: no prefix for either
           ev(4, 3, lo + 9),                              # prefix: both of lo + 5
           ev(2, 9, lo + 7),                              # ad:9 unknown before the window
           ev(3, 2, lo + 8, "not_interested")]            # not positive
    task = next_click_task(evs, lo, lo + 100, POS, "user", ["ad"])
    assert task.items == ["ad:1", "ad:2", "ad:3"]
    got = [(task.history.nodes[n], int(t), task.items[g], [task.items[i] for i in task.prefix(q)])
           for q, (n, t, g) in enumerate(zip(task.node, task.t, task.target))]
    assert got == [("user:1", lo + 1, "ad:2", ["ad:1"]), ("user:1", lo + 2, "ad:1", ["ad:1", "ad:2"]),
                   ("user:4", lo + 9, "ad:3", ["ad:1", "ad:2"])]
    assert task.popularity.tolist() == [1, 1, 1]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=2, max_size=12), st.data())
def test_rank_is_the_position_in_the_order_by_score_then_popularity_then_index(scores, data):
    s = np.array(scores, np.float64)
    pop = np.array(data.draw(st.lists(st.integers(0, 2), min_size=len(s), max_size=len(s))))
    order = sorted(range(len(s)), key=lambda i: (-s[i], -pop[i], i))
    for target in range(len(s)):
        assert ranks(s, target, pop) == order.index(target) + 1


def test_hit_and_reciprocal_rank_stop_at_k():
    hit, rr = hit_and_rr(np.array([1, 4, 20, 21]), k=20)
    assert hit.tolist() == [1, 1, 1, 0]
    assert np.allclose(rr, [1, 0.25, 0.05, 0])


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.floats(0, 1)), min_size=1, max_size=40))
def test_grouped_intervals_hold_the_mean_and_a_method_against_itself_is_one(rows):
    groups = np.array([g for g, _ in rows])
    v = np.array([x for _, x in rows])
    lo, hi = grouped_ci(v, groups)
    assert lo - 1e-9 <= v.mean() <= hi + 1e-9
    if v.sum() > 0:
        r, rlo, rhi = grouped_ratio_ci(v, v, groups)
        assert np.isclose(r, 1) and np.isclose(rlo, 1) and np.isclose(rhi, 1)
