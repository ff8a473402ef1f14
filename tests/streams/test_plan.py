"""The assignment plan (`streams.scaleout.plan`, `hirflow scale`): the newest good plan counts, a
worker follows it at start and waits while it is left out, and running workers switch to a
new plan without a restart from outside, losing nothing and applying nothing twice."""
import json
import threading
import time
import urllib.error
import urllib.request

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hirflow.state.events import Engagement
from hirflow.streams import clients
from hirflow.streams.broker import free_port
from hirflow.streams.scaleout.plan import Plan, PlanError, PlanWatcher, follow_plan, newest_plan, publish_plan
from hirflow.streams.tools.replay import produce
from hirflow.streams.tools.synth import SynthConfig, SynthWorld
from hirflow.streams.topics import Topics
from hirflow.streams.worker.worker_process import WorkerProcess, peer_ports
from tests.conftest import replace_section
from tests.streams.scale_helpers import (assert_changes_consistent, assert_state_is_direct, wait_done,
                                         wait_refreshed)


@given(st.integers(1, 10**6))
def test_a_plan_round_trips(count):
    assert Plan.decode(Plan.encode(count), 7) == Plan(count, 7)


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
                    lambda xs: st.lists(xs, max_size=3)
                    | st.dictionaries(st.sampled_from(["count", "x"]), xs, max_size=2),
                    max_leaves=6)


@settings(max_examples=300)
@given(st.one_of(st.binary(max_size=40), st.none(), JSON.map(lambda v: json.dumps(v).encode())))
def test_any_record_is_a_plan_or_a_plan_error(raw):
    try:
        plan = Plan.decode(raw, 0)
    except PlanError:
        return
    assert isinstance(plan.count, int) and not isinstance(plan.count, bool) and plan.count >= 1


def _produce_raw(cfg, value: bytes) -> None:
    p = clients.producer(cfg.kafka)
    p.produce(Topics(cfg.kafka.topic_prefix).plan, value=value)
    assert p.flush(10) == 0


def test_the_newest_good_plan_counts_and_bad_ones_are_skipped(cfg):
    assert newest_plan(cfg) is None
    publish_plan(cfg, 2)
    assert newest_plan(cfg).count == 2
    _produce_raw(cfg, b"not json")
    _produce_raw(cfg, b'{"count": 0}')
    assert newest_plan(cfg).count == 2
    publish_plan(cfg, 3)
    assert newest_plan(cfg) == Plan(3, 3)
    for bad in (0, cfg.kafka.partitions + 1):
        with pytest.raises(PlanError, match="share the partitions"):
            publish_plan(cfg, bad)


def test_a_worker_follows_the_plan_and_waits_while_it_is_left_out(cfg):
    assert follow_plan(cfg) is cfg                                    # no plan: worker.count
    publish_plan(cfg, 2)
    with pytest.raises(PlanError, match="change log"):
        follow_plan(cfg)                                              # cannot move partitions
    logged = replace_section(cfg, "worker", changelog=True)
    assert follow_plan(logged).worker.count == 2
    publish_plan(cfg, 1)
    second = replace_section(cfg, "worker", changelog=True, count=2, index=1, web_port=free_port())
    got = []
    t = threading.Thread(target=lambda: got.append(follow_plan(second, poll_s=0.2)), daemon=True)
    t.start()
    time.sleep(2.0)
    assert not got                                                    # left out: waiting,
    page = f"http://127.0.0.1:{second.worker.web_port}"
    assert urllib.request.urlopen(page + "/health", timeout=5).status == 200   # alive
    with pytest.raises(urllib.error.HTTPError, match="503"):
        urllib.request.urlopen(page + "/ready", timeout=5)                       # not ready
    publish_plan(cfg, 4)
    t.join(30)
    assert got and (got[0].worker.index, got[0].worker.count) == (1, 4)


def test_hirflow_scale_publishes_and_prints_the_plan(cfg):
    from click.testing import CliRunner

    from hirflow.streams.tools.cli import cli
    base = ["--bootstrap", cfg.kafka.bootstrap, "--topic-prefix", cfg.kafka.topic_prefix,
            "--partitions", str(cfg.kafka.partitions)]
    r = CliRunner().invoke(cli, base + ["scale"])
    assert r.exit_code == 0 and "no plan: workers follow worker.count (1)" in r.output, r.output
    r = CliRunner().invoke(cli, base + ["scale", "2"])
    assert r.exit_code == 0 and "plan: 2 workers over 4 partitions" in r.output, r.output
    assert newest_plan(cfg).count == 2
    r = CliRunner().invoke(cli, base + ["scale", "5"])
    assert r.exit_code != 0 and "1 to 4 (the partitions)" in r.output
    r = CliRunner().invoke(cli, base + ["scale"])
    assert r.exit_code == 0 and "plan: 2 workers" in r.output, r.output


def test_the_watcher_reports_only_a_new_count(cfg):
    publish_plan(cfg, 2)
    seen = []
    watcher = PlanWatcher(cfg, 2, seen.append, poll_s=0.2).start()
    try:
        publish_plan(cfg, 2)
        _produce_raw(cfg, b"{}")
        time.sleep(2.0)
        assert not seen
        publish_plan(cfg, 3)
        deadline = time.monotonic() + 20
        while not seen and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [p.count for p in seen] == [3]
    finally:
        watcher.close()


def _count_of(w: WorkerProcess) -> int | None:
    try:
        status, body = w.get("/v1/status")
    except OSError:
        return None
    return json.loads(body)["assignment"]["count"] if status == 200 else None


def _wait_count(w: WorkerProcess, count: int | None, timeout: float = 120.0) -> None:
    """Until the worker serves with `count` workers (None: until it serves nothing)."""
    deadline = time.monotonic() + timeout
    while _count_of(w) != count:
        assert w.proc.poll() is None, f"worker exited with {w.proc.returncode}; see {w.log_path}"
        assert time.monotonic() < deadline, f"worker did not switch to {count}; see {w.log_path}"
        time.sleep(0.3)


def test_running_workers_switch_plans_without_losing_or_doubling_anything(cfg, tmp_path, tiny_checkpoints):
    """Two worker processes with a standby copy of each partition; the plan goes 1 -> 2 -> 1
    while the stream flows. Each switch happens inside the running processes (same PIDs):
    worker 1 waits until the plan includes it and restores its partitions from the change
    log, while worker 0 keeps them as standby copies; back at one worker, worker 0 promotes
    its copies."""
    world = SynthWorld(SynthConfig(events=5_000, users=100, advertisers=5, seed=23))
    evs = [e for e in world.stream() if isinstance(e, Engagement)]
    chunks = [evs[:1500], evs[1500:3500], evs[3500:]]
    ports, peer_url = peer_ports(2)
    env = {"HIRFLOW_WORKER__COUNT": "2", "HIRFLOW_WORKER__PEER_URL": peer_url,
           "HIRFLOW_WORKER__CHANGELOG": "true", "HIRFLOW_WORKER__STANDBY_REPLICAS": "1",
           "HIRFLOW_INGEST__BATCH_MAX": "400",
           "HIRFLOW_WORKER__APP_ID": "hirflow-plan", "HIRFLOW_WORKER__KNOWLEDGE": "false",
           "HIRFLOW_REFRESH__CHECKPOINT": str(tiny_checkpoints[1]),
           "HIRFLOW_REFRESH__SAMPLE_PROCESS": "false", "HIRFLOW_WORKER__METRICS_INTERVAL_S": "0.5",
           "HIRFLOW_GRAPH__TOP_K": str(cfg.graph.top_k)}
    publish_plan(cfg, 1)
    workers = [WorkerProcess(cfg, tmp_path / f"w{i}.log",
                             {**env, "HIRFLOW_WORKER__INDEX": str(i), "HIRFLOW_WORKER__WEB_PORT": str(ports[i]),
                              "HIRFLOW_GRAPH__PATH": str(tmp_path / f"volume{i}")})
               for i in range(2)]
    try:
        for w in workers:
            w.start()
        pids = [w.proc.pid for w in workers]
        produce(cfg, chunks[0], progress=False)
        _wait_count(workers[0], 1)
        wait_done(cfg, workers[:1])
        assert _count_of(workers[1]) is None and workers[1].proc.poll() is None   # waiting,
        assert workers[1].get("/health")[0] == 200 and workers[1].get("/ready")[0] == 503  # alive

        publish_plan(cfg, 2)
        produce(cfg, chunks[1], progress=False)
        for w in workers:
            _wait_count(w, 2)
        wait_done(cfg, workers)

        publish_plan(cfg, 1)
        produce(cfg, chunks[2], progress=False)
        _wait_count(workers[0], 1)
        _wait_count(workers[1], None)
        wait_done(cfg, workers[:1])
        wait_refreshed(workers[:1])
        assert [w.proc.pid for w in workers] == pids and all(w.proc.poll() is None for w in workers)
        assert workers[0].stop() == 0
        workers[1].terminate()
    finally:
        for w in workers:
            w.close()
    log0 = (tmp_path / "w0.log").read_text()
    assert log0.count("stopping for the new plan") == 2 and "following the plan: 1 workers" in log0
    odd = [p for p in range(cfg.kafka.partitions) if p % 2]
    for p in odd:      # handed over as copies at 1 -> 2, taken back from them at 2 -> 1
        assert f"partition {p} kept as a standby copy" in log0
        assert f"promoted the standby copy of partition {p} " in log0
    assert "waiting for one that includes it" in (tmp_path / "w1.log").read_text()
    assert_changes_consistent(cfg)
    assert_state_is_direct(cfg, tmp_path, "volume0", evs)
