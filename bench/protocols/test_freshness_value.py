"""The freshness-value replay: which engagements become queries, and that staleness is honoured."""
import numpy as np

from hirflow.state.events import Engagement
from bench.protocols.freshness_value import DAY, HOUR, freshness_value, queries

POS = {"click", "conversion"}


def ev(u, i, t, action="click"):
    return Engagement(f"user:{u}", f"ad:{i}", action, t)


def test_queries_are_hourly_new_items_known_before_the_window():
    lo = 10 * DAY
    evs = [ev(1, 1, 0), ev(2, 2, 0), ev(3, 3, 0),
           ev(1, 2, lo + 10), ev(1, 3, lo + 20),          # one query: hour 0, two new items
           ev(1, 2, lo + HOUR + 5),                       # seen in hour 0: no query
           ev(2, 9, lo + 5),                              # ad:9 unknown before the window
           ev(2, 1, lo + 2 * HOUR, "not_interested"),     # not positive
           ev(3, 1, lo + 3 * HOUR + 1, "conversion")]
    items, qs = queries(evs, lo, lo + DAY, POS, ["ad"])
    assert items == ["ad:1", "ad:2", "ad:3"]
    assert [(q.hour - lo, q.user, sorted(q.truth)) for q in qs] == [
        (0, "user:1", ["ad:2", "ad:3"]), (3 * HOUR, "user:3", ["ad:1"])]
    assert qs[0].seen == {"ad:1"} and qs[1].seen == {"ad:3"}


def test_recall_per_staleness_on_a_trained_model(tmp_path):
    """Fresh and stale embeddings give recalls in [0, 1] for every staleness, one per query."""
    from hirflow.streams.tools.synth import SynthConfig, SynthWorld
    from testkit.tiny_training import small
    from hirflow.trainer.data import chronological_windows
    from hirflow.trainer.evaluate import item_types, load_model, positive_actions
    from hirflow.trainer.train import train
    world = SynthWorld(SynthConfig(events=1500, users=50, advertisers=4, span_days=4, seed=3))
    evs = [e for e in world.stream() if isinstance(e, Engagement)]
    w = chronological_windows([e.ts for e in evs], train=0.8, val=0.1)
    schema, enc, cfg = small(tmp_path)
    path = train([e for e in evs if e.ts < w.train_end], schema, enc, cfg, tmp_path / "ck", progress=False)
    model, _ = load_model(path)
    res = freshness_value(model, evs, schema, w.train_end, w.val_end, w.end + 1, positive_actions(schema),
                          item_types(schema))
    assert res["queries"] > 0 and set(res["recall"]) == {"0", "1h", "1d", "7d", "never"}
    for r in res["recall"].values():
        assert 0.0 <= r["ci_low"] <= r["mean"] <= r["ci_high"] <= 1.0
    assert np.isfinite([r["mean"] for r in res["recall"].values()]).all()
