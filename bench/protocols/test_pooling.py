"""Pooling training runs: each run's own figure, the users' mean over runs, refusals."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from bench.protocols.pooling import pool
from hirflow.trainer.ranking import paired_ratio_ci


def run(model, baselines, users=None):
    n = len(model)
    return {"users": users or [f"user:{i}" for i in range(n)],
            "recall@20": {"hirflow": list(model), **{k: list(v) for k, v in baselines.items()}}}


@settings(max_examples=60, deadline=None)
@given(st.data(), st.integers(1, 4))
def test_pooled_figure_is_the_mean_of_the_runs_against_the_same_best_baseline(data, n_runs):
    n = data.draw(st.integers(3, 30))
    user = st.lists(st.floats(0, 1, allow_nan=False), min_size=n, max_size=n)
    strong = np.array(data.draw(user)) * 0.5 + 0.5          # ranks above `weak` for every user
    weak = strong * 0.5
    models = [data.draw(user) for _ in range(n_runs)]
    runs = [run(m, {"ease": strong, "popularity": weak}) for m in models]
    out = pool(runs)
    assert out["best_baseline"] == "ease" and out["runs"] == n_runs and out["users"] == n
    means = [float(np.mean(m)) for m in models]
    assert out["recall@20"] == pytest.approx(np.mean(means), abs=1e-4)
    # the baseline is the same in every run, so the pooled ratio is the mean of the runs' ratios
    assert out["ratio"] == pytest.approx(np.mean(means) / strong.mean(), abs=1e-3)
    assert min(out["ratio_range"]) - 1e-3 <= out["ratio"] <= max(out["ratio_range"]) + 1e-3
    for m, p in zip(models, out["per_run"]):
        r, lo, hi = paired_ratio_ci(np.array(m), strong)
        assert p["ratio"] == round(r, 3) and p["ci95"] == [round(lo, 3), round(hi, 3)]
    r, lo, hi = paired_ratio_ci(np.mean(models, axis=0), strong)
    assert out["ci95"] == [round(lo, 3), round(hi, 3)]      # over users, of the runs' mean


def test_runs_scored_on_other_users_are_refused():
    a = run([0.1, 0.2, 0.3], {"ease": [0.2, 0.2, 0.2]})
    b = run([0.1, 0.2, 0.3], {"ease": [0.2, 0.2, 0.2]}, users=["user:0", "user:2", "user:1"])
    with pytest.raises(ValueError, match="other test users"):
        pool([a, b])


def test_runs_without_the_model_or_a_shared_baseline_are_refused():
    with pytest.raises(ValueError, match="no runs"):
        pool([])
    with pytest.raises(ValueError, match="no run scored a baseline"):
        pool([run([0.1, 0.2, 0.3], {}), run([0.1, 0.2, 0.3], {"hirflow_block": [0.2] * 3})])
    only_baseline = {"users": ["user:0"], "recall@20": {"ease": [0.5]}}
    with pytest.raises(ValueError, match="served model"):
        pool([only_baseline])


def test_a_run_without_baselines_is_judged_against_the_runs_that_scored_them():
    """Baselines are deterministic on a split: later seeds skip them and pool against the
    first run's; the served model's parts are reported per run, never taken as baselines."""
    first = run([0.2, 0.4, 0.6], {"ease": [0.4, 0.4, 0.4], "hirflow_block": [0.9, 0.9, 0.9]})
    later = run([0.4, 0.4, 0.4], {"hirflow_block": [0.3, 0.3, 0.3]})
    out = pool([first, later])
    assert out["best_baseline"] == "ease"
    assert [p["ratio"] for p in out["per_run"]] == [1.0, 1.0]
    assert out["parts_ratio"] == {"hirflow_block": [2.25, 0.75]}
