"""The demo's freshness bookkeeping, and the demo end to end (slow: run with -m slow)."""
from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from hirflow.state.events import Engagement, Entity
from hirflow.streams.changes import TokenChange
from hirflow.streams.tools.freshness_watch import FreshnessWatch

T0 = 1_767_225_600_000


def _change(node: str, event_ts: int) -> TokenChange:
    return TokenChange(node, "m", 1, [1], [1], [], [0], event_ts, event_ts + 1)


def test_endpoint_changes_are_the_first_change_of_a_touched_node_and_event():
    w = FreshnessWatch()
    list(w.touched([Engagement("user:1", "ad:1", "click", T0), Entity("ad:2", T0 + 5)]))
    now = (T0 + 250) / 1000
    w.received([_change("user:1", T0), _change("ad:1", T0), _change("ad:2", T0 + 5),
                _change("user:1", T0),            # a second change for the same event: neighbour
                _change("ad:9", T0)], now_s=now)  # never touched: neighbour refresh
    ep = w.window(10, now_s=now)
    assert ep.count == 3 and ep.p50_ms == 250
    assert w.window(10, endpoint_only=False, now_s=now).count == 5
    assert w.since_start().count == 3
    assert w.produced == 2


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 100_000), st.integers(0, 5_000)), min_size=1, max_size=60),
       st.integers(1, 50_000))
def test_window_counts_only_changes_received_within_it(arrivals, window_ms):
    """Whatever the arrival times (ms after T0), a window holds exactly the changes received
    inside it, and its quantiles lie within their latencies."""
    w = FreshnessWatch(keep_s=1_000)
    arrivals = sorted(arrivals)
    for i, (t, lat) in enumerate(arrivals):
        w.received([_change(f"user:{i}", T0 + t - lat)], now_s=(T0 + t) / 1000)
    now_ms = T0 + arrivals[-1][0]
    expected = [lat for t, lat in arrivals if T0 + t >= now_ms - window_ms]
    q = w.window(window_ms / 1000, endpoint_only=False, now_s=now_ms / 1000)
    assert q.count == len(expected)
    assert min(expected) - 1e-3 <= q.p50_ms <= q.p99_ms <= max(expected) + 1e-3


def test_the_demo_line_reads_the_hot_swap_status_the_worker_reports(monkeypatch):
    """The demo prints the swap's progress from /v1/status: the keys it reads are the ones
    `HotSwapBuild.status` writes (a renamed key once crashed the demo at its first swap)."""
    from types import SimpleNamespace

    from hirflow.streams.tools import demo
    from hirflow.streams.hotswap.build import HotSwapBuild
    building = SimpleNamespace(model=SimpleNamespace(id="ckpt-b"), gen=2, done=300, total=1200)
    status = {"model": "ckpt-a", "hot_swap": HotSwapBuild.status(SimpleNamespace(building=building))}
    monkeypatch.setattr(demo, "get_json", lambda api, path, timeout: status)
    assert demo._model("http://w") == "ckpt-a (swapping 300/~1200)"
    status["hot_swap"] = HotSwapBuild.status(SimpleNamespace(building=None))
    assert demo._model("http://w") == "ckpt-a"


@pytest.mark.slow
def test_demo_trains_swaps_and_reports(tmp_path, capsys):
    """A short demo: the first checkpoint is trained, announced and served, and the summary
    checks it against the planted interests."""
    from hirflow.streams.config import load
    from hirflow.streams.tools.demo import run_demo

    cfg = load(env={})
    rc = run_demo(cfg, tmp_path / "demo", events=240_000, rate=2_000, duration=None,
                  train_after=10.0)
    out = capsys.readouterr().out
    assert rc == 0
    assert "announced" in out and "what the model" in out
    assert (tmp_path / "demo" / "freshness.png").exists()


def test_endpoint_flags_mark_the_first_change_of_each_touched_pair():
    from hirflow.streams.tools.freshness_watch import endpoint_flags, touched_keys
    touched = set(touched_keys(Engagement("user:1", "ad:1", "click", T0))) | set(touched_keys(Entity("ad:2", T0)))
    keys = [("user:1", T0), ("ad:9", T0), ("user:1", T0), ("ad:1", T0), ("ad:2", T0)]
    assert endpoint_flags(keys, touched).tolist() == [True, False, False, True, True]


def test_after_the_stream_the_demo_waits_for_the_first_checkpoint_to_serve(monkeypatch, capsys):
    """The stream ended with the first checkpoint still training: the demo waits until it is
    announced and swapped in (then the summary shows what it learned), or gives up when the
    training fails."""
    from types import SimpleNamespace

    from hirflow.streams.tools import demo
    models = iter(["cold-start", "cold-start", "cold-start (swapping 3/~9)", "ckpt-a", "ckpt-a"])
    monkeypatch.setattr(demo, "_model", lambda api: next(models))
    monkeypatch.setattr(demo.time, "sleep", lambda s: None)
    first = SimpleNamespace(announced=None, running=True, status="training", poll=lambda: None)

    def poll():
        first.announced = (0.0, "ckpt-a")
    first.poll = poll
    demo._await_first(first, "http://w")
    assert "waiting for it" in capsys.readouterr().out
    assert next(models) == "ckpt-a"                  # it stopped asking once ckpt-a served
    failed = SimpleNamespace(announced=None, running=False, status="training failed: x",
                             poll=lambda: None)
    monkeypatch.setattr(demo, "_model", lambda api: "cold-start")
    demo._await_first(failed, "http://w")
    assert "training failed: x" in capsys.readouterr().out
