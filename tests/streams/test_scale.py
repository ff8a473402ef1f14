"""The worker set changes while a stream flows: 1 -> 2 -> 4 -> 2 -> 1 worker processes on
the embedded broker, ingesting and refreshing, with the change log moving each partition's
state to its new owner (restored from the log, or promoted from a standby copy: one copy of
each partition is kept) and one worker killed -9 mid-stream. With two workers after the
shrink, a node's view through either equals the one a single store of the events so far
gives. At the end the last worker's state, and a fresh restore of every partition from the
log, equal a direct apply of the whole stream, and no token change was published twice
with different content."""
import json

from hirflow.state.events import Engagement
from hirflow.state.graph import GraphStore
from hirflow.streams.tools.replay import produce
from hirflow.streams.tools.synth import SynthConfig, SynthWorld
from hirflow.streams.worker.worker_process import WorkerProcess, peer_ports
from tests.state.helpers import apply_direct
from tests.streams.scale_helpers import (assert_changes_consistent, assert_state_is_direct, wait_done,
                                         wait_refreshed)
from tests.streams.view_helpers import assert_same_view, direct_view


def test_the_worker_set_grows_and_shrinks_without_losing_or_doubling_anything(cfg, tmp_path, tiny_checkpoints):
    world = SynthWorld(SynthConfig(events=9_000, users=150, advertisers=6, seed=21))
    evs = [e for e in world.stream() if isinstance(e, Engagement)]
    chunks = [evs[:2000], evs[2000:4500], evs[4500:6500], evs[6500:8000], evs[8000:]]
    started: list[WorkerProcess] = []
    ports, peer_url = peer_ports(4)

    def start(phase: int, index: int, count: int, volume: str) -> WorkerProcess:
        env = {"HIRFLOW_WORKER__COUNT": str(count), "HIRFLOW_WORKER__INDEX": str(index),
               "HIRFLOW_WORKER__WEB_PORT": str(ports[index]), "HIRFLOW_WORKER__PEER_URL": peer_url,
               "HIRFLOW_WORKER__CHANGELOG": "true", "HIRFLOW_WORKER__STANDBY_REPLICAS": "1",
               "HIRFLOW_GRAPH__PATH": str(tmp_path / volume),
               "HIRFLOW_INGEST__BATCH_MAX": "400", "HIRFLOW_INGEST__GROUP_ID": f"ingest-{phase}-{index}",
               "HIRFLOW_WORKER__APP_ID": "hirflow-scale", "HIRFLOW_WORKER__KNOWLEDGE": "false",
               "HIRFLOW_REFRESH__CHECKPOINT": str(tiny_checkpoints[1]),
               "HIRFLOW_REFRESH__SAMPLE_PROCESS": "false", "HIRFLOW_WORKER__METRICS_INTERVAL_S": "0.5",
               "HIRFLOW_GRAPH__TOP_K": str(cfg.graph.top_k)}
        started.append(WorkerProcess(cfg, tmp_path / f"w-{phase}-{index}.log", env).start())
        return started[-1]

    # (count, the volume of each index): a volume keeps what its new owner still owns
    phases = [(1, ["a"]), (2, ["a", "b"]), (4, ["a", "b", "c", "d"]), (2, ["c", "d"]), (1, ["d"])]
    try:
        for phase, ((count, volumes), chunk) in enumerate(zip(phases, chunks)):
            produce(cfg, chunk, progress=False)
            running = [start(phase, i, count, v) for i, v in enumerate(volumes)]
            if phase == 1:                   # one of the two is killed mid-stream
                running[1].wait_metric("hirflow_events_applied_total", 200, timeout=90)
                running[1].kill9()
                running[1] = start(phase, 1, count, volumes[1])
            wait_done(cfg, running)
            if phase == 3:                   # views through the other worker's nodes
                assert_views_of_one_store(cfg, tmp_path, running, evs[:8000])
            if phase == len(phases) - 1:     # the last owner publishes what is left
                wait_refreshed(running)
            assert all(w.stop() == 0 for w in running)
    finally:
        for w in started:
            w.close()

    logs = {f.name: f.read_text() for f in tmp_path.glob("w-*.log")}
    # at the last shrink volume d (worker 1 of 2 before, owning the odd partitions) takes
    # the even ones over from the copies it kept of them
    last = logs[f"w-{len(phases) - 1}-0.log"]
    assert all(f"promoted the standby copy of partition {p} " in last
               for p in range(cfg.kafka.partitions) if p % 2 == 0), last[-3000:]
    assert any("restored partition" in text for text in logs.values())
    assert_changes_consistent(cfg)
    assert_state_is_direct(cfg, tmp_path, "d", evs)


def assert_views_of_one_store(cfg, tmp_path, running: list[WorkerProcess], evs) -> None:
    """Every worker answers a node's view (forwarded to its owner, sampled there through
    the other workers' nodes) as one store of `evs` samples it."""
    cutoff = max(e.ts for e in evs) + 1000
    nodes = sorted({n for e in evs[::97] for n in (e.src, e.dst)})[:40]
    with GraphStore(tmp_path / "direct-views", cfg.schema, cfg.kafka.partitions) as store:
        apply_direct(store, evs, cfg.graph)
        want = {n: direct_view(cfg, store, n, cutoff) for n in nodes}
    for w in running:
        for n, view in want.items():
            status, body = w.get(f"/v1/nodes/{n}/view?cutoff={cutoff}&seed=0")
            assert status == 200, body
            assert_same_view(json.loads(body), view)
