"""Scale-out benchmark: ingest and refresh throughput of 1, 2 and 4 worker processes on one
broker, each worker owning p % count == index of the partitions (with the change log on, as
the Helm chart runs them), and the CPU each process used.

    python bench/scale.py [--quick] [--events N] [--workers 1,2,4]

For each worker count: a fresh topic prefix, the same synthetic stream produced up front,
then the workers started and sampled every 0.25 s through their /metrics pages. Ingest rate
= events applied from when every worker was applying until 90 % of the stream, over that time; refresh rate =
dirty nodes re-encoded over the time from the first refresh until none are dirty. CPU: seconds of
CPU (worker + its sampling child) per wall second in the ingest interval, per worker, and
the broker's. Neighbour refreshes (paced by `refresh.neighbor_rate`) are not counted. A
small checkpoint trained on the stream's first fifth is served, world knowledge off. The
workers route to each other (`worker.peer_url`): views read other workers' nodes from their
owners, counted as peer reads.

On a machine with fewer cores than processes the workers take CPU from each other: read
the ratios with the CPU figures. Each worker reads the machine's cores as its own, so the
bench sets `refresh.sample_processes` to the cores over twice the worker count (at least 1):
the sampling processes of all the workers together are the one-per-two-cores a single
worker would start, as a user running several workers on one machine should set it. The
last line is one JSON object.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from hirflow.trainer.block_config import CollaborativeConfig
from hirflow.encoder.model import EncoderConfig
from hirflow.state.config import build
from hirflow.state.events import Engagement
from hirflow.streams.broker import EmbeddedBroker
from hirflow.streams.worker.cores import available_cores
from hirflow.streams.config import HirflowConfig
from hirflow.streams.tools.replay import produce
from hirflow.streams.tools.synth import SynthConfig, SynthWorld
from hirflow.streams.topics import Topics, ensure_topics
from hirflow.streams.worker.worker_process import WorkerProcess, peer_ports
from hirflow.trainer.train import TrainConfig, train

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """CPU seconds of a process and its live children (the sampling process)."""
    total = 0.0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(entry) == pid or int(fields[1]) == pid:       # fields[1]: the parent's pid
            total += (int(fields[11]) + int(fields[12])) / TICK
    return total


def run(base: HirflowConfig, evs, count: int, checkpoint: Path, tmp: Path, broker_pid: int) -> dict:
    prefix = f"scale{count}."
    cfg = build(HirflowConfig, {"kafka": {"bootstrap": base.kafka.bootstrap,
                                          "partitions": base.kafka.partitions, "topic_prefix": prefix},
                                "graph": {"path": str(tmp / f"{count}-0")}})
    ensure_topics(cfg.kafka, Topics(prefix))
    produce(cfg, evs, progress=False)
    workers = []
    ports, peer_url = peer_ports(count)
    for i in range(count):
        env = {"HIRFLOW_WORKER__COUNT": str(count), "HIRFLOW_WORKER__INDEX": str(i),
               "HIRFLOW_WORKER__WEB_PORT": str(ports[i]), "HIRFLOW_WORKER__PEER_URL": peer_url,
               "HIRFLOW_WORKER__CHANGELOG": "true", "HIRFLOW_GRAPH__PATH": str(tmp / f"{count}-{i}"),
               "HIRFLOW_WORKER__KNOWLEDGE": "false", "HIRFLOW_REFRESH__CHECKPOINT": str(checkpoint),
               "HIRFLOW_REFRESH__CPU_THREADS": "1", "HIRFLOW_WORKER__METRICS_INTERVAL_S": "0.25",
               "HIRFLOW_INGEST__GROUP_ID": f"scale-{count}-{i}",
               # the machine's share of one worker, not the whole machine each
               "HIRFLOW_REFRESH__SAMPLE_PROCESSES": str(max(1, available_cores() // (2 * count)))}
        workers.append(WorkerProcess(cfg, tmp / f"worker-{count}-{i}.log", env).start())
    t0 = time.monotonic()
    cpu: list[list[float]] = []         # per sample, each worker's CPU seconds so far
    samples = []                        # (t, applied, refreshed, dirty, workers applying)
    peer = {"read": 0.0, "missing": 0.0}
    try:
        while True:
            ms = [w.metrics() for w in workers]
            now = time.monotonic() - t0
            applied = sum(m.get("hirflow_events_applied_total", 0) for m in ms)
            refreshed = sum(m.get('hirflow_nodes_refreshed_total{reason="dirty"}', 0) for m in ms)
            dirty = sum(m.get("hirflow_dirty_nodes", 1) for m in ms) if all(ms) else 1
            lag = sum(m.get("hirflow_consumer_lag", 1) for m in ms) if all(ms) else 1
            applying = sum(1 for m in ms if m.get("hirflow_events_applied_total", 0) > 0)
            samples.append((now, applied, refreshed, dirty, applying))
            for result in peer:
                peer[result] = sum(m.get(f'hirflow_peer_reads_total{{result="{result}"}}', 0) for m in ms)
            cpu.append([cpu_seconds(w.proc.pid) for w in workers] + [cpu_seconds(broker_pid)])
            if len(samples) % 50 == 0:
                print(f"  {now:.0f} s: {applied:,.0f} applied, {refreshed:,.0f} re-encoded, "
                      f"{dirty:,.0f} dirty, lag {lag:,.0f}", file=sys.stderr, flush=True)
            # done: every event applied and every node it touched re-encoded (neighbour
            # refreshes, paced by refresh.neighbor_rate, may go on: they are not counted)
            done = applied >= len(evs) and dirty == 0 and lag == 0 and refreshed > 0
            if done and len(samples) > 1 and samples[-2][1:3] == samples[-1][1:3]:
                break
            if now > 900:
                raise RuntimeError(f"{count} workers did not finish: {samples[-1]}")
            time.sleep(0.1)
        wall = time.monotonic() - t0
    finally:
        for w in workers:
            w.terminate()
    # applied counts both sides of an engagement where one worker owns both: use the share
    # of the final total, which is the same stream whatever the count
    # over the time all of them were applying (they start one after another: imports, model
    # load), up to 90 % of the stream; the samples bound the interval from outside
    total = samples[-1][1]
    hi = next(s for s in samples if s[1] >= 0.9 * total)
    lo = next(s for s in samples if s[4] == count)
    if lo[0] >= hi[0]:
        raise RuntimeError(f"{count} workers: one finished before the last began; use more --events")
    lo = samples[samples.index(lo) - 1]
    ingest = (hi[1] - lo[1]) / total * len(evs) / (hi[0] - lo[0])
    a, b = cpu[samples.index(lo)], cpu[samples.index(hi)]
    used = [(y - x) / (hi[0] - lo[0]) for x, y in zip(a, b)]      # during that ingest window
    cores, broker_cores = used[:-1], used[-1]
    first_refresh = next(s for s in samples if s[2] > 0)
    refresh = samples[-1][2] / max(samples[-1][0] - first_refresh[0], 1e-9)
    return {"workers": count, "ingest_events_per_s": round(ingest), "refresh_nodes_per_s": round(refresh),
            "nodes_refreshed": int(samples[-1][2]), "wall_s": round(wall, 1),
            "cores_per_worker": [round(c, 2) for c in cores], "broker_cores": round(broker_cores, 2),
            "peer_reads": int(peer["read"]), "peer_missing": int(peer["missing"])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes (within a minute or two)")
    ap.add_argument("--events", type=int)
    ap.add_argument("--workers", default="1,2,4")
    ap.add_argument("--partitions", type=int, default=8)
    a = ap.parse_args()
    n = a.events or (60_000 if a.quick else 300_000)
    world = SynthWorld(SynthConfig(events=n, users=max(100, n // 40), seed=5))
    evs = [e for e in world.stream() if isinstance(e, Engagement)]
    tmp = Path(tempfile.mkdtemp(prefix="hirflow-bench-scale-"))
    enc = EncoderConfig.for_schema(world_schema := build(HirflowConfig, {}).schema)
    checkpoint = train(evs[:len(evs) // 5], world_schema, enc,
                       TrainConfig(seed=1, steps_per_chunk=2, collaborative=CollaborativeConfig(rank=0)),
                       tmp / "ckpt", progress=False)
    results = []
    try:
        with EmbeddedBroker() as broker:
            base = build(HirflowConfig, {"kafka": {"bootstrap": broker.bootstrap, "partitions": a.partitions}})
            for count in (int(x) for x in a.workers.split(",")):
                r = run(base, evs, count, checkpoint, tmp, broker.proc.pid)
                results.append(r)
                print(f"{count} worker(s): ingest {r['ingest_events_per_s']:,} events/s, refresh "
                      f"{r['refresh_nodes_per_s']:,} nodes/s ({r['nodes_refreshed']:,} re-encoded), "
                      f"cores per worker {r['cores_per_worker']}, broker {r['broker_cores']}, "
                      f"nodes read from peers {r['peer_reads']:,} ({r['peer_missing']:,} missing), {r['wall_s']} s",
                      flush=True)
    except BaseException:
        print(f"the workers' logs and state are kept in {tmp}", file=sys.stderr)
        raise
    shutil.rmtree(tmp, ignore_errors=True)          # the stores of every count: gone once measured
    one = results[0]
    out = {"events": {"value": len(evs), "unit": "events"}, "cores_here": {"value": os.cpu_count(), "unit": "cores"}}
    for r in results:
        k = r["workers"]
        out[f"ingest_{k}_workers"] = {"value": r["ingest_events_per_s"], "unit": "events/s",
                                      "ratio_to_1_worker": round(r["ingest_events_per_s"] / one["ingest_events_per_s"], 2)}
        out[f"refresh_{k}_workers"] = {"value": r["refresh_nodes_per_s"], "unit": "nodes/s",
                                       "ratio_to_1_worker": round(r["refresh_nodes_per_s"] / one["refresh_nodes_per_s"], 2)}
        out[f"cores_used_{k}_workers"] = {"value": round(sum(r["cores_per_worker"]), 2), "unit": "cores",
                                          "broker": r["broker_cores"]}
        out[f"peer_reads_{k}_workers"] = {"value": r["peer_reads"], "unit": "nodes",
                                          "per_node_refreshed": round(r["peer_reads"] / max(r["nodes_refreshed"], 1), 2),
                                          "missing": r["peer_missing"]}
    print(json.dumps(out))


if __name__ == "__main__":
    sys.exit(main())
