"""The GPU machine's suite (`bench/device_suite.py`): how it reads the benchmarks' output and
`nvidia-smi`, and how it sums up the rates; running the suite itself is `--quick`'s job."""
import argparse
import json
import math

import pytest
from hypothesis import given, strategies as st

from bench import device_suite as S

rates = st.sampled_from([1000.0, 2000.0, 5000.0, 10000.0, 20000.0, 40000.0])
p99s = st.floats(min_value=1.0, max_value=10_000.0) | st.just(math.nan)


@given(st.dictionaries(rates, p99s), st.floats(min_value=1.0, max_value=5_000.0))
def test_highest_holding_is_the_highest_rate_within_the_bound(p99_by_rate, bound):
    best = S.highest_holding(p99_by_rate, bound)
    held = {r for r, p in p99_by_rate.items() if p <= bound}        # NaN never holds
    if not held:
        assert best is None
    else:
        assert best == max(held)
        assert all(r <= best or not p99_by_rate[r] <= bound for r in p99_by_rate)


def test_last_json_takes_the_last_object_line():
    text = 'warming up\n{"a": 1}\nmore\n{"b": {"value": 2, "unit": "ms"}}\n\n'
    assert S.last_json(text) == {"b": {"value": 2, "unit": "ms"}}
    assert S.last_json("Traceback (most recent call last):\n  boom\n") is None
    assert S.last_json('{"cut off') is None


def test_parse_smi_reads_busy_and_memory_of_the_first_gpu():
    assert S.parse_smi("87, 40123\n12, 5\n") == (87.0, 40123.0)
    assert S.parse_smi("[N/A], 100\n") is None
    assert S.parse_smi("") is None


def test_summary_collects_rates_refresh_and_goals():
    fresh = {r: S.Step(f"freshness-{r}", [], 0, status="ok",
                       figures={f"endpoint_p99_ms_at_{r}": {"value": p, "unit": "ms"},
                                f"refresh_nodes_per_s_at_{r}": {"value": n, "unit": "nodes/s"}})
             for r, p, n in ((5000, 400.0, 4_900), (20000, 1_250.0, 18_000), (10000, 800.0, 9_800))}
    encode = S.Step("encode", [], 0, status="ok",
                    figures={"pipeline_nodes_per_s_8_sampling_processes": {"value": 24_000, "unit": "nodes/s"}})
    skipped = S.Step("train", [], 60, status="skipped: 10 s of the budget left")
    out = S.summary([skipped, encode, *fresh.values()], 1_000.0, "cuda", 16)
    json.dumps(out)                                      # printable as the last line
    assert out["highest_rate_holding_p99"]["value"] == 10000.0
    assert out["refresh_nodes_per_s_max"]["value"] == 24_000
    assert out["refresh_nodes_per_s_max"]["ratio_to_goal"] == 1.2
    assert out["endpoint_p99_ms_at_20000"]["ratio_to_goal"] == 1.25
    assert out["train"]["status"].startswith("skipped") and out["train"]["figures"] is None


def test_plan_counts_processes_and_workers_by_cores_and_runs_only_the_steps_asked():
    def args(only=""):
        return argparse.Namespace(quick=False, only=only, rates="5000,20000", seconds=30.0, warmup=20.0)

    steps = S.plan(args(), "cuda", 16)
    assert [s.name for s in steps] == ["train", "encode", "freshness-5000", "freshness-20000", "scale"]
    scale = steps[-1].argv
    assert scale[scale.index("--workers") + 1] == "1,2,4,8"
    encode = steps[1].argv
    assert encode[encode.index("--processes") + 1] == "1,2,4,8"
    two = S.plan(args(), "cpu", 2)[-1].argv                   # a 2-core machine: one of each
    assert two[two.index("--workers") + 1] == "1"
    assert [s.name for s in S.plan(args("scale,freshness"), "cuda", 16)] == \
        ["freshness-5000", "freshness-20000", "scale"]
    with pytest.raises(SystemExit, match="unknown steps"):
        S.plan(args("gpu"), "cuda", 16)


def test_summary_takes_the_scale_steps_refresh_as_well():
    scale = S.Step("scale", [], 0, status="ok",
                   figures={"refresh_1_workers": {"value": 3_000, "unit": "nodes/s"},
                            "refresh_8_workers": {"value": 21_000, "unit": "nodes/s"},
                            "ingest_8_workers": {"value": 400_000, "unit": "events/s"}})
    out = S.summary([scale], 1_000.0, "cuda", 16)
    assert out["refresh_nodes_per_s_max"] == {"value": 21_000, "unit": "nodes/s",
                                              "from": "scale:refresh_8_workers", "ratio_to_goal": 1.05}
    assert out["highest_rate_holding_p99"]["value"] is None
