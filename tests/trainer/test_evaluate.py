import json

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from hirflow.state.events import Engagement
from hirflow.streams.tools.synth import SynthConfig, SynthWorld
from testkit.tiny_training import small
from hirflow.trainer.data import Windows, chronological_windows
from hirflow.trainer import baselines as B
from hirflow.encoder.collaborative import user_rows
from hirflow.trainer import block_fit
from hirflow.trainer.evaluate import TrainedOnTestWindow, at_weights, evaluate
from hirflow.trainer.interactions import Interactions
from hirflow.trainer.train import train


def interest_vectors(labels, dim=384, seed=0):
    """Stand-in world knowledge: one direction per planted fine interest, plus noise."""
    rng = np.random.default_rng(seed)
    centre = rng.normal(size=(64, dim))
    out = {}
    for n, r in sorted(labels.items()):
        v = centre[r["fine"]] + 0.3 * rng.normal(size=dim)
        out[n] = (v / np.linalg.norm(v)).astype(np.float32)
    return out


def test_evaluation_end_to_end_writes_metrics_and_plots(tmp_path):
    world = SynthWorld(SynthConfig(events=3000, users=80, advertisers=4, span_days=6, seed=5,
                                   late_launch=0.5))
    evs = [e for e in world.stream() if isinstance(e, Engagement)]
    labels = {r["node"]: r for r in world.labels() if "fine" in r}
    w = chronological_windows([e.ts for e in evs])
    texts = interest_vectors(labels)
    schema, enc, cfg = small(tmp_path)
    path = train([e for e in evs if e.ts < w.train_end], schema, enc, cfg, tmp_path / "ck",
                 texts=texts, progress=False)
    m = evaluate(path, evs, w, schema, tmp_path / "eval", labels=labels, texts=texts, later_texts=texts,
                 baselines=B.QUICK)
    assert (tmp_path / "eval" / "recall.png").stat().st_size > 1000
    assert json.loads((tmp_path / "eval" / "metrics.json").read_text())["checkpoint"] == m["checkpoint"]
    res = m["next_engagement"]
    assert res["users"] > 0 and res["new_positives"] > 0
    # the served vector, each of its parts alone, the served vector at the holdout's other
    # weights, and every baseline
    holdout = m["collaborative"]["holdout"]
    others = {f"hirflow_at_{float(k):g}" for k in holdout["weight_recall@20"]
              if k != "popularity" and float(k) not in (0.0, holdout["weight"])}
    assert others and set(res["methods"]) == ({"hirflow", "hirflow_encoder", "hirflow_block"} | others
                                              | {b.name for b in B.QUICK})
    assert res["best_baseline"] in {b.name for b in B.QUICK}
    served = np.asarray(json.loads((tmp_path / "eval" / "per_user.json").read_text())
                        ["next_engagement"]["recall@20"]["hirflow"])
    assert {"hirflow_encoder_vs_best_recall@20", "hirflow_block_vs_best_recall@20"} <= set(res)
    assert len(served) == res["users"]
    for method, r in res["methods"].items():
        assert 0.0 <= r["recall@10"]["mean"] <= r["recall@50"]["mean"] <= 1.0
        assert r["recall@20"]["ci_low"] <= r["recall@20"]["mean"] <= r["recall@20"]["ci_high"]
    assert res["best_baseline"] in res["tuning"]
    assert all(t["chosen"] in [g["params"] for g in t["grid"]] for t in res["tuning"].values())
    assert res["hirflow_vs_best_recall@20"]["ratio"] >= 0
    per_user = json.loads((tmp_path / "eval" / "per_user.json").read_text())["next_engagement"]
    assert len(per_user["users"]) == res["users"] and set(per_user["recall@20"]) == set(res["methods"])
    for method, r in res["methods"].items():     # the same figures, user by user
        assert np.mean(per_user["recall@20"][method]) == pytest.approx(r["recall@20"]["mean"], abs=1e-4)
    assert set(m["usage_entropy"]) == {"level0", "level1"}
    assert set(m["hierarchy"]) == {"level0_vs_mid", "level1_vs_fine"}
    assert 0.0 <= m["bom_recall@100"] <= 1.0
    cold = m["cold_start"]                      # ads launched in the test window, with text
    launched = {r["node"] for r in world.labels() if r.get("launch_ts", 0) >= w.val_end}
    assert cold["users"] > 0 and 0 < cold["cold_items"] <= len(launched) < cold["items"]
    for method in ("hirflow", "popularity"):
        assert 0.0 <= cold[f"{method}_recall@10"] <= cold[f"{method}_recall@50"] <= 1.0
    dens = m["densification"]
    assert 0 < dens["raw_density"] < 1
    for lvl in ("level0", "level1"):
        assert dens[lvl]["primitives"] >= 1 and dens[lvl]["density"] <= 1.0
    early = Windows(w.start, w.start + 1, w.start + 2, w.end)       # a test window it trained on
    with pytest.raises(TrainedOnTestWindow, match="inside the test window"):
        evaluate(path, evs, early, schema, tmp_path / "eval2", baselines=B.QUICK)


@settings(max_examples=25, deadline=None)
@given(served=st.sampled_from([0.25, 1.0, 4.0, 1000.0]), other=st.sampled_from([0.25, 0.5, 2.0, 1000.0]),
       seed=st.integers(0, 10))
def test_the_scores_at_another_holdout_weight_are_what_that_weight_serves(served, other, seed):
    """`at_weights` from the scores served at one weight gives, exactly, the scores a block
    scaled at another weight serves (its share of the inner product is linear in it)."""
    rng = np.random.default_rng(seed)
    pairs = [("user:%d" % u, "product:%d" % rng.integers(8), int(t))
             for t, u in enumerate(rng.integers(0, 12, 90))]
    data = Interactions.of(pairs, ("user",), ("product",), max_items=8)
    block = block_fit.fit(data, 10.0, 64, [3], ("user",))
    x = data.matrix()
    encoder = rng.normal(size=(x.shape[0], len(block.items)))

    def serve(w):
        s = block_fit.scaled(block, encoder.ravel(), (x @ block.query @ block.key.T).ravel(), w)
        return encoder + user_rows(x, s.query, s.user_norm) @ s.key.T

    out = at_weights(encoder, serve(served) - encoder, served, [0.0, served, other])
    assert set(out) == ({f"hirflow_at_{other:g}"} if other != served else set())
    for scores in out.values():
        np.testing.assert_allclose(scores, serve(other), rtol=1e-4, atol=1e-4)
    assert at_weights(encoder, serve(served) - encoder, 0.0, [other]) == {}


def test_category_labels_are_compared_with_every_level():
    from hirflow.trainer.evaluate import _hierarchy, category_labels
    evs = [Engagement(f"product:{i}", f"category:{i % 3}", "belongs_to", 1) for i in range(30)]
    labels = category_labels(evs)
    assert labels["product:4"] == labels["product:7"] != labels["product:5"]
    assign = np.stack([np.arange(30) % 4, np.arange(30) % 16], axis=1)     # levels 4, 16
    out = _hierarchy(assign, [f"product:{i}" for i in range(30)], labels)
    assert set(out) == {"level0_vs_category", "level1_vs_category"}
    assert all(0.0 <= v["nmi"] <= 1.0 and v["nodes"] == 30 for v in out.values())
