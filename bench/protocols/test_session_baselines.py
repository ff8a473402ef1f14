"""Session baselines: each recommends what its rule says, from the prefix and the past only."""
import numpy as np

from hirflow.state.events import Engagement
from bench.protocols import session_baselines as SB
from bench.protocols.next_click import next_click_task

HOUR = SB.HOUR


def sessions(rows, t0=0, gap=1000):
    """Engagements of sessions given as item lists, one session after the other."""
    out, t = [], t0
    for s, items in rows:
        for i in items:
            out.append(Engagement(f"user:{s}", f"ad:{i}", "click", t))
            t += gap
    return out


TRAIN = sessions([(1, [1, 2, 3]), (2, [1, 2, 3]), (3, [4, 5, 6]), (4, [1, 7]), (5, [4, 5, 8]), (6, [9, 1])])


def task_with(test_rows, lo=100_000):
    return next_click_task(TRAIN + sessions(test_rows, t0=lo), lo, lo + 10 ** 6, {"click"}, "user", ["ad"])


def top(scores_fn, task, q=0):
    s = scores_fn(task.prefix(q), int(task.t[q]))
    return [task.items[i] for i in np.argsort(-s, kind="stable") if s[i] > 0]


def test_rules_follow_the_last_click():
    task = task_with([(10, [4, 1, 2])])                 # the second query: last click ad:1
    s = SB.Sessions.of(task)
    n = len(task.items)
    assert top(SB.sequential_rules(s, n, steps=1), task, q=1) == ["ad:2", "ad:7"]   # 1 -> 2 twice, -> 7 once
    assert set(top(SB.cooccurrence(s, n), task, q=1)) == {"ad:2", "ad:3", "ad:7", "ad:9"}


def test_session_knn_finds_the_sessions_that_share_the_prefix():
    task = task_with([(10, [4, 5, 6])])                 # queries: after [4] and after [4, 5]
    s = SB.Sessions.of(task)
    n = len(task.items)
    for fit in (SB.sknn(s, n, k=2, sample=10), SB.vsknn(s, n, k=2, sample=10, weighting="linear", idf=True)):
        assert set(top(fit, task, q=1)) == {"ad:4", "ad:5", "ad:6", "ad:8"}
    # the sample keeps the most recent sessions: with one, only session 5 (the later) is a neighbour
    assert set(top(SB.sknn(s, n, k=2, sample=1), task, q=1)) == {"ad:4", "ad:5", "ad:8"}


def test_vsknn_weighs_the_last_click_most():
    task = task_with([(10, [2, 4, 5])])                 # the second query: earlier ad:2, last ad:4
    s = SB.Sessions.of(task)
    best = top(SB.vsknn(s, len(task.items), k=1, sample=10, weighting="div", idf=False), task, q=1)
    assert best[0] in ("ad:4", "ad:5") and "ad:1" not in best


def test_popular_recent_sees_only_clicks_before_the_query():
    task = task_with([(10, [1, 9]), (11, [9, 9])], lo=100_000)
    s = SB.Sessions.of(task)
    pop = SB.popular_recent(s, len(task.items), hours=1)
    q = int(np.flatnonzero(task.t == task.t.min())[0])          # the first query: ad:9 after [ad:1]
    scores = pop(task.prefix(q), int(task.t[q]))
    i9 = task.items.index("ad:9")
    assert scores[i9] == 1                                      # ad:9 of the training sessions only
    later = pop(task.prefix(q), int(task.t.max()) + 1)
    assert later[i9] > scores[i9]                               # the window's own clicks once past


def test_tune_picks_the_validation_best_and_scores_every_query():
    task = task_with([(10, [1, 2]), (11, [4, 5, 8])])
    b = SB.SessionBaseline("sr", SB.sequential_rules, [{"steps": 1}, {"steps": 3}])
    params, hit, tried = SB.tune(b, task)
    assert [p for p, _ in tried] == [{"steps": 1}, {"steps": 3}] and hit == max(h for _, h in tried)
    r = SB.score_on(b, params, task)
    assert len(r) == len(task) and (r >= 1).all() and (r <= len(task.items)).all()


def test_ease_on_a_large_catalogue_fits_its_head_and_ranks_the_rest_after_it(monkeypatch):
    monkeypatch.setattr(SB, "MAX_DENSE_ITEMS", 3)
    task = task_with([(10, [1, 2, 3])])
    s = SB.Sessions.of(task)
    scores = SB.ease(s, len(task.items), lam=1.0)(task.prefix(1), int(task.t[1]))
    clicked = np.asarray(s.matrix.sum(0)).ravel()
    head = set(np.argsort(-clicked, kind="stable")[:3].tolist())
    assert min(scores[i] for i in head) > max(scores[i] for i in range(len(scores)) if i not in head)
