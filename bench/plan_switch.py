"""Plan-switch benchmark: how long running workers take to follow a new assignment plan
(`hirflow scale N`), and how fast they restore the partitions they gain from the change log.

    python bench/plan_switch.py [--quick] [--events N] [--partitions 8] [--plans 2,4,1]
                                [--standby-replicas R]

As many worker processes as the largest plan start under a plan of 1 (change log on,
refresh off: the move is measured, not the re-encoding of the moved nodes that follows it):
worker 0 ingests the whole synthetic stream while the others wait. Then each plan is
published in turn, with nothing new produced, and the bench measures from the publish until
every worker in the plan serves its share of the partitions (`hirflow_partitions_owned`,
set once its start has claimed, restored and dropped them) and the others wait. Per switch: those
seconds, the change-log records the gaining workers replayed
(`hirflow_changelog_restored_changes`), the partitions taken over from standby copies
(`hirflow_changelog_promoted_partitions`, with `--standby-replicas`) and the longest
claim-restore-drop time of one worker (`hirflow_changelog_settle_seconds`). The last line is
one JSON object.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from hirflow.state.config import build
from hirflow.state.events import Engagement
from hirflow.streams.broker import EmbeddedBroker
from hirflow.streams.config import HirflowConfig
from hirflow.streams.scaleout.plan import publish_plan
from hirflow.streams.tools.replay import produce
from hirflow.streams.scaleout.routing import partitions_of
from hirflow.streams.tools.synth import SynthConfig, SynthWorld
from hirflow.streams.topics import Topics, ensure_topics
from hirflow.streams.worker.worker_process import WorkerProcess, peer_ports


def settled(workers: list[WorkerProcess], count: int, partitions: int) -> list[dict] | None:
    """Each worker's metrics once the plan of `count` holds everywhere, else None."""
    ms = [w.metrics() for w in workers]
    for i, m in enumerate(ms):
        if i >= count:
            if m:                                 # left out: waiting, no metrics page
                return None
        elif not m or m.get("hirflow_partitions_owned") != len(partitions_of(i, count, partitions)):
            return None
    return ms


def lagging(worker: WorkerProcess) -> bool:
    """Whether the worker has records left to apply (the gauge appears with its first fetch)."""
    return worker.metrics().get("hirflow_consumer_lag", 1) != 0


def switch(cfg: HirflowConfig, workers: list[WorkerProcess], count: int, timeout: float = 900.0) -> dict:
    t0 = time.monotonic()
    publish_plan(cfg, count)
    while (ms := settled(workers, count, cfg.kafka.partitions)) is None:
        if time.monotonic() - t0 > timeout:
            raise RuntimeError(f"the plan of {count} did not settle in {timeout:.0f} s")
        time.sleep(0.1)
    seconds = time.monotonic() - t0
    restored = sum(m.get("hirflow_changelog_restored_changes", 0) for m in ms[:count])
    settle = max(m.get("hirflow_changelog_settle_seconds", 0) for m in ms[:count])
    promoted = sum(m.get("hirflow_changelog_promoted_partitions", 0) for m in ms[:count])
    return {"workers": count, "seconds": round(seconds, 1), "restored_changes": int(restored),
            "promoted_partitions": int(promoted),
            "longest_settle_s": round(settle, 1),
            "restored_per_s": round(restored / settle) if settle > 0 and restored else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes (within a minute or two)")
    ap.add_argument("--events", type=int)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--plans", default="2,4,1", help="plans published in turn after the plan of 1")
    ap.add_argument("--standby-replicas", type=int, default=0,
                    help="worker.standby_replicas of every worker (standby copies of each partition)")
    a = ap.parse_args()
    plans = [int(x) for x in a.plans.split(",")]
    n = a.events or (30_000 if a.quick else 200_000)
    world = SynthWorld(SynthConfig(events=n, users=max(100, n // 40), seed=5))
    evs = [e for e in world.stream() if isinstance(e, Engagement)]
    tmp = Path(tempfile.mkdtemp(prefix="hirflow-bench-plan-"))
    size = max(plans + [1])
    results = []
    with EmbeddedBroker() as broker:
        cfg = build(HirflowConfig, {"kafka": {"bootstrap": broker.bootstrap, "partitions": a.partitions,
                                              "topic_prefix": "plan."},
                                    "graph": {"path": str(tmp / "w0")}})
        ensure_topics(cfg.kafka, Topics(cfg.kafka.topic_prefix))
        publish_plan(cfg, 1)
        ports, peer_url = peer_ports(size)
        workers = [WorkerProcess(cfg, tmp / f"worker-{i}.log", {
            "HIRFLOW_WORKER__COUNT": str(size), "HIRFLOW_WORKER__INDEX": str(i),
            "HIRFLOW_WORKER__WEB_PORT": str(ports[i]), "HIRFLOW_WORKER__PEER_URL": peer_url,
            "HIRFLOW_WORKER__CHANGELOG": "true", "HIRFLOW_GRAPH__PATH": str(tmp / f"w{i}"),
            "HIRFLOW_WORKER__STANDBY_REPLICAS": str(a.standby_replicas), "HIRFLOW_WORKER__KNOWLEDGE": "false", "HIRFLOW_REFRESH__ENABLED": "false",
            "HIRFLOW_WORKER__METRICS_INTERVAL_S": "0.25"}) for i in range(size)]
        try:
            for w in workers:
                w.start()
            t = time.monotonic()
            produce(cfg, evs, progress=False)
            while settled(workers, 1, a.partitions) is None or lagging(workers[0]):
                if time.monotonic() - t > 900:
                    raise RuntimeError("worker 0 did not apply the stream in 900 s")
                time.sleep(0.2)
            print(f"{len(evs):,} events applied by one worker in {time.monotonic() - t:.0f} s", flush=True)
            for count in plans:
                r = switch(cfg, workers, count)
                results.append(r)
                print(f"plan {count}: settled in {r['seconds']} s, {r['restored_changes']:,} change-log "
                      f"records replayed, {r['promoted_partitions']} partitions from standby copies, "
                      f"longest settle {r['longest_settle_s']} s", flush=True)
        finally:
            for w in workers:
                w.terminate()
    out = {"events": {"value": len(evs), "unit": "events"},
           "partitions": {"value": a.partitions, "unit": "partitions"},
           "cores_here": {"value": os.cpu_count(), "unit": "cores"},
           "standby_replicas": {"value": a.standby_replicas, "unit": "copies"}}
    before = 1
    for r in results:
        key = f"switch_{before}_to_{r['workers']}_workers"
        before = r["workers"]
        out[key] = {"value": r["seconds"], "unit": "s", "restored_changes": r["restored_changes"],
                    "promoted_partitions": r["promoted_partitions"],
                    "longest_settle_s": r["longest_settle_s"], "restored_per_s": r["restored_per_s"]}
    print(json.dumps(out))


if __name__ == "__main__":
    sys.exit(main())
