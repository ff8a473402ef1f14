"""Ingest benchmark: events/s applied durably (broker -> RocksDB) beside its two peers.

Measured in the same run, on the same topic of Zipf-skewed synthetic engagements:
  raw    confluent-kafka consume(num_messages) + msgpack decode (the upper bound)
  faust  a plain faust agent that only counts, with stream.take(1000, within=0.1)
  hirflow the ingest loop: consume, validate, apply to the write-back cache, commit state +
         dirty markers + offsets in one RocksDB batch every ingest.commit_interval_ms

    python bench/ingest.py [--quick] [--events N] [--repeat R] [--profile]

The last line printed is one JSON object of the figures.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import msgpack
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from confluent_kafka import TopicPartition  # noqa: E402

from hirflow.state.config import build  # noqa: E402
from hirflow.state.graph import GraphStore  # noqa: E402
from hirflow.state.writer import GraphWriter  # noqa: E402
from hirflow.streams import clients  # noqa: E402
from hirflow.streams.broker import EmbeddedBroker  # noqa: E402
from hirflow.streams.config import HirflowConfig  # noqa: E402
from hirflow.streams.ingest.loop import IngestLoop  # noqa: E402
from hirflow.streams.worker.runtime import tune_gc  # noqa: E402
from hirflow.streams.topics import Topics, ensure_topics  # noqa: E402

T0 = 1_767_225_600_000


def produce_zipf(cfg: HirflowConfig, n: int, seed: int = 1) -> float:
    """n engagements, users Zipf(1.1) over n/20 ids, ads Zipf(1.05) over n/200 ids."""
    rng = np.random.default_rng(seed)
    users = np.minimum(rng.zipf(1.1, n), max(1, n // 20))
    ads = np.minimum(rng.zipf(1.05, n), max(1, n // 200))
    acts = rng.choice(["impression", "click", "add_to_cart", "conversion"], n,
                      p=[0.9, 0.07, 0.02, 0.01])
    topic = Topics(cfg.kafka.topic_prefix).engagements
    p = clients.producer(cfg.kafka, **{"linger.ms": 20, "batch.size": 1_000_000})
    t = time.perf_counter()
    pack = msgpack.packb
    for i in range(n):
        src = f"user:{users[i]}"
        v = pack({"v": 1, "src": src, "dst": f"ad:{ads[i]}", "action": str(acts[i]), "ts": T0 + i})
        clients.produce_blocking(p, topic, v, src.encode())
        if i % 5000 == 0:
            p.poll(0)
    assert p.flush(120) == 0
    return n / (time.perf_counter() - t)


def raw_rate(cfg: HirflowConfig, n: int) -> float:
    topic = Topics(cfg.kafka.topic_prefix).engagements
    c = clients.consumer(cfg.kafka, f"bench-raw-{time.time_ns()}")
    c.assign([TopicPartition(topic, p, 0) for p in range(cfg.kafka.partitions)])
    got, t = 0, None
    unpack = msgpack.unpackb
    while got < n:
        msgs = c.consume(10_000, timeout=1.0)
        if msgs and t is None:
            t = time.perf_counter()
        for m in msgs:
            unpack(m.value())
        got += len(msgs)
    rate = got / (time.perf_counter() - t)
    c.close()
    return rate


def hirflow_rate(cfg: HirflowConfig, n: int, profile: bool = False) -> tuple[float, str]:
    tune_gc()                       # as the worker process does
    path = Path(tempfile.mkdtemp(prefix="hirflow-bench-"))
    try:
        c = build(HirflowConfig, {**_as(cfg), "graph": {**_as(cfg)["graph"], "path": str(path)},
                                  "ingest": {**_as(cfg)["ingest"], "group_id": f"b{time.time_ns()}"}})
        with GraphStore(path, c.schema, c.kafka.partitions) as store:
            loop = IngestLoop(c, GraphWriter(store, c.graph), Topics(c.kafka.topic_prefix))
            prof = cProfile.Profile() if profile else None
            while loop.poll_once(timeout=1.0) == 0:      # wait for the first batch
                pass
            t = time.perf_counter()
            first = loop.applied
            if prof:
                prof.enable()
            while loop.applied < n:
                loop.poll_once(timeout=1.0)
            rate = (loop.applied - first) / (time.perf_counter() - t)
            report = ""
            if prof:
                prof.disable()
                s = io.StringIO()
                pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(12)
                report = s.getvalue()
            loop.close()
        return rate, report
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _as(cfg):
    import dataclasses
    return dataclasses.asdict(cfg)


FAUST_AGENT = r'''
import sys, time, json, faust
bootstrap, topic, n, limit, port, out, datadir = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5]), sys.argv[6], sys.argv[7]
app = faust.App(f"bench-faust-{time.time_ns()}", broker=f"kafka://{bootstrap}", store="memory://", datadir=datadir,
                web_port=port, broker_session_timeout=6, broker_heartbeat_interval=1,
                consumer_auto_offset_reset="earliest", topic_allow_declare=False)
t = app.topic(topic, value_serializer="raw")
state = {"n": 0, "t0": None}
@app.agent(t)
async def count(stream):
    async for batch in stream.take(1000, within=0.1):
        if state["t0"] is None:
            state["t0"] = time.perf_counter()
        state["n"] += len(batch)
        el = time.perf_counter() - state["t0"]
        if state["n"] >= n or el > limit:
            open(out, "w").write(json.dumps({"faust_rate": state["n"] / el}))
            import os; os._exit(0)
sys.argv = ["bench", "worker", "-l", "error"]
app.main()
'''


def faust_rate(cfg: HirflowConfig, n: int, limit_s: float) -> float:
    from hirflow.streams.broker import free_port
    topic = Topics(cfg.kafka.topic_prefix).engagements
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "faust.json"
        out = subprocess.run([sys.executable, "-c", FAUST_AGENT, cfg.kafka.bootstrap, topic, str(n),
                              str(limit_s), str(free_port()), str(result), str(Path(tmp) / "data")],
                             capture_output=True, text=True, timeout=limit_s + 90)
        if result.exists():
            return json.loads(result.read_text())["faust_rate"]
    raise RuntimeError(f"faust agent gave no figure: {out.stdout[-500:]} {out.stderr[-1500:]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes (within a minute)")
    ap.add_argument("--events", type=int)
    ap.add_argument("--repeat", type=int)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--profile", action="store_true", help="print where the ingest time goes")
    a = ap.parse_args()
    n = a.events or (200_000 if a.quick else 1_000_000)
    repeat = a.repeat or (1 if a.quick else 3)
    with EmbeddedBroker() as broker:
        cfg = build(HirflowConfig, {"kafka": {"bootstrap": broker.bootstrap,
                                              "partitions": a.partitions,
                                              "topic_prefix": "bench."}})
        ensure_topics(cfg.kafka, Topics("bench."))
        prod = produce_zipf(cfg, n)
        print(f"produced {n} events at {prod:,.0f}/s", flush=True)
        raws, ours = [], []
        for r in range(repeat):
            raws.append(raw_rate(cfg, n))
            rate, report = hirflow_rate(cfg, n, profile=a.profile and r == 0)
            ours.append(rate)
            print(f"run {r + 1}: raw {raws[-1]:,.0f}/s  hirflow {ours[-1]:,.0f}/s", flush=True)
            if report:
                print(report)
        fa = faust_rate(cfg, min(n, 100_000), 15.0 if a.quick else 30.0)
        print(f"faust counting agent {fa:,.0f}/s", flush=True)
    raw_m, ours_m = statistics.median(raws), statistics.median(ours)
    print(f"median of {repeat}: hirflow {ours_m:,.0f} events/s applied durably; "
          f"{ours_m / raw_m:.2f}x raw consume+decode ({raw_m:,.0f}/s); "
          f"{ours_m / fa:.1f}x faust counting agent ({fa:,.0f}/s)")
    print(json.dumps({
        "events": {"value": n, "unit": "events"},
        "hirflow_ingest": {"value": round(ours_m), "unit": "events/s",
                           "ratio_to_raw": round(ours_m / raw_m, 3),
                           "ratio_to_faust": round(ours_m / fa, 2)},
        "raw_consume_decode": {"value": round(raw_m), "unit": "events/s"},
        "faust_counting_agent": {"value": round(fa), "unit": "events/s"},
        "runs": repeat,
    }))


if __name__ == "__main__":
    main()
