"""Freshness benchmark: event produced -> token change received by a subscriber.

Starts the embedded broker and a real worker process (refresh on) serving a trained model:
`--checkpoint DIR`, else a small one trained here first on a world of the same generator
and seed (`--train-events` events over a week, `--train-steps` optimiser steps per day of
it; kept in var/bench/freshness-model/ and reused while its recipe is the same): the cold-start model's
tokens change only for new nodes, so it would measure nothing of freshness under load
(`--cold-start` measures it anyway). Streams one synthetic world at fixed rates, one phase per
rate after a warm-up that takes the world's catalog burst, with event time = production time,
and measures per token change `received - event_ts` in a subscriber, for all changes and for
endpoint changes alone (nodes the event touched; the rest are neighbour refreshes paced by
`refresh.neighbor_rate`). Per-change latencies go to var/bench/freshness-RATE.npz. The peer,
measured in the same run: Kafka alone (produce -> consume on a plain topic, same
producer settings). Also: refresh throughput and whether the dirty backlog grows.

The events' producer lingers `--linger-ms` (20 by default) before sending a batch, and the
keyed topics have `--partitions` (1 by default, as in `hirflow demo`): tansu's in-memory log
(the embedded broker) lists every batch a partition holds at each fetch, so its CPU grows
with partitions x stored batches; at a 5 ms linger on 8 partitions it took most of a core
within a minute of streaming on this 2-core machine. Per phase the bench prints the CPU share
of the broker, the worker, its sampling process and itself while the stream ran, and in
phases of a minute or more the endpoint p99 per 30 s of event time (a slow drift shows there).
The synthetic world has ~2,900 nodes whose adjacencies keep growing for minutes (mean edges
per node 23 after 240,000 events, 32 after 480,000, 55 after 1.9 million), and the cost per
refreshed node grows with them at first; `--prefill` streams that many events first, as fast
as the worker takes them, so the phases run on a grown graph rather than a young one.

`--yoochoose DIR` replays real click sessions instead: the clicks before YOOCHOOSE's test
day fill the graph first, then the warm-up and the phases replay the test day in its order
(every session a new node, refreshed at each click) at each rate, faster and faster than its
real pace of 0.16 clicks/s; the worker serves `--checkpoint`, a model of those sessions.

    python bench/freshness.py [--quick] [--rates 1000,2000,5000] [--seconds 120] [--checkpoint DIR]
                              [--cold-start] [--train-events 40000] [--train-steps 20]
                              [--warmup 30] [--linger-ms 20] [--partitions 1] [--prefill 0]
                              [--yoochoose DIR]

Writes var/bench/freshness.png and keeps the broker's and the worker's logs beside it
(var/bench/freshness-broker.log, -worker.log); the last line printed is one JSON object of the
figures.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
from confluent_kafka import OFFSET_END, TopicPartition  # noqa: E402

from bench.proc_cpu import CpuMeter, children  # noqa: E402
from hirflow.state.config import build  # noqa: E402
from hirflow.streams import clients  # noqa: E402
from hirflow.streams.broker import EmbeddedBroker  # noqa: E402
from hirflow.streams.config import HirflowConfig  # noqa: E402
from hirflow.streams.tools.demo import EMBEDDED_PARTITIONS, UPSTREAM_LINGER_MS, stamped_now, upstream  # noqa: E402
from hirflow.streams.tools.freshness_watch import endpoint_flags, touched_keys  # noqa: E402
from hirflow.streams.tools.replay import produce  # noqa: E402
from hirflow.streams.subscribe import Subscriber  # noqa: E402
from hirflow.streams.tools.synth import SynthConfig, SynthWorld  # noqa: E402
from hirflow.streams.topics import Topics, ensure_topics  # noqa: E402
from hirflow.streams.worker.worker_process import WorkerProcess  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
POLL_S = 0.005   # consumer poll timeout of the measuring clients (see `listen`)
WORLD_SEED = 11  # the streamed world's; the model trained here learns a world of the same seed


def trained_here(events: int, steps_per_day: int, root: Path) -> Path:
    """A small checkpoint of the default model trained on a world of the bench's generator
    and seed (`events` engagements over a week, at most `steps_per_day` steps per day, no
    world knowledge: the worker runs without it), reused from `root` while the recipe (the
    world, the step cap and the default configs) is the same."""
    import dataclasses
    import hashlib
    import json
    from hirflow.encoder.model import EncoderConfig
    from hirflow.state.events import Engagement
    from hirflow.state.schema import SchemaConfig
    from hirflow.trainer.train import TrainConfig, train
    schema = SchemaConfig()
    enc, cfg = EncoderConfig.for_schema(schema), TrainConfig(seed=0, steps_per_chunk=steps_per_day)
    configs = json.dumps([enc.to_dict(), dataclasses.asdict(cfg)], sort_keys=True, default=str)
    recipe = (f"world{WORLD_SEED}-events{events}-steps{steps_per_day}-"
              f"{hashlib.sha256(configs.encode()).hexdigest()[:8]}")
    marker = root / recipe / "checkpoint.txt"
    if marker.exists() and Path(marker.read_text().strip()).is_dir():
        return Path(marker.read_text().strip())
    world = SynthWorld(SynthConfig(events=events, seed=WORLD_SEED, span_days=7))
    engagements = [e for e in world.stream() if isinstance(e, Engagement)]
    t = time.monotonic()
    path = train(engagements, schema, enc, cfg, root / recipe, progress=False)
    marker.write_text(str(path.resolve()))
    print(f"trained {path.name} on {len(engagements):,} events in {time.monotonic() - t:.0f} s", flush=True)
    return path.resolve()
WINDOW_S = 30.0  # event-time window of the per-window p99 in long phases


def kafka_alone(cfg: HirflowConfig, rate: float, seconds: float) -> list[float]:
    """Latency of a plain produce -> consume at `rate` (ms)."""
    topic = cfg.kafka.topic_prefix + "bench.raw"
    p = clients.producer(cfg.kafka)
    c = clients.consumer(cfg.kafka, "bench-raw", **{"auto.offset.reset": "latest"})
    p.produce(topic, b"warm")                       # creates the topic
    p.flush(10)
    # static assignment at the log end: no group join to wait for (tansu takes seconds)
    c.assign([TopicPartition(topic, 0, OFFSET_END)])
    lat, stop = [], threading.Event()

    def consume():
        while not stop.is_set():
            msgs = c.consume(1000, timeout=POLL_S)
            now = time.time() * 1000
            lat.extend(now - float(m.value()) for m in msgs
                       if m.error() is None and m.value() != b"warm")

    t = threading.Thread(target=consume)
    t.start()
    time.sleep(1)                                   # first fetch positions at the end
    t0 = time.monotonic()
    n = 0
    while time.monotonic() - t0 < seconds:
        p.produce(topic, str(time.time() * 1000).encode())
        p.poll(0)
        n += 1
        time.sleep(max(0.0, t0 + n / rate - time.monotonic()))
    p.flush(10)
    time.sleep(1)
    stop.set()
    t.join()
    c.close()
    return lat


def run_rate(cfg, producer_cfg, worker, stream, rate, seconds, phase, pids, drain_s=60.0):
    """Returns (latency ms per change, endpoint mask, (node, event_ts, latency, change ts)
    per change, refresh nodes/s, backlog samples, grows, refresh batch figures, CPU share per
    process group while the stream ran). `producer_cfg`: the config the events are produced
    with (its producer linger); `pids`: name -> process ids whose CPU to measure; `drain_s`:
    longest wait after the stream for the refresh to go idle (the neighbour refreshes that
    token moves queue drain at `refresh.neighbor_rate`), changes received meanwhile count.

    A change is an endpoint change when its node was touched by an event (an engagement's
    endpoint, an entity record) with exactly its `event_ts` (the node's oldest pending event)
    and is the first such change; otherwise it is a neighbour refresh, which
    carries the event time of the node whose move queued it and waits for the neighbour budget.
    """
    got, stop = [], threading.Event()
    touched: set[tuple[str, int]] = set()
    sub = Subscriber(cfg, group_id=f"bench-fresh-{rate}-{phase}", from_start=False)
    sub.poll(3.0)                                   # join before the stream starts

    def listen():
        # short polls, the clock read after each returns: a consume call waits out its whole
        # timeout unless the batch fills, so a long timeout skews every latency by up to it
        # (a clock read before a 200 ms poll made some latencies negative)
        while not stop.is_set():
            batch = sub.poll(POLL_S)
            now = time.time() * 1000
            got.extend((c.node, c.event_ts, now - c.event_ts, c.ts) for c in batch)

    def remember(items):
        for it in items:
            touched.update(touched_keys(it))
            yield it

    t = threading.Thread(target=listen)
    t.start()
    m0 = worker.metrics()
    t0, start_ms = time.monotonic(), int(time.time() * 1000)
    backlog = []
    items = itertools.islice(stream, int(rate * seconds))
    prod = threading.Thread(target=produce, args=(producer_cfg, remember(stamped_now(items))),
                            kwargs={"rate": rate, "progress": False})
    prod.start()
    meter = CpuMeter(pids)
    while prod.is_alive():
        time.sleep(1.0)
        backlog.append(worker.metrics().get("hirflow_dirty_nodes", 0.0))
    elapsed = time.monotonic() - t0
    cpu = meter.shares()
    m_streamed = worker.metrics()                   # refresh batches while the stream ran
    wait_idle(worker, drain_s)                      # the tail: until nothing is left to refresh
    stop.set()
    t.join()
    sub.close()
    m1 = worker.metrics()
    refreshed = m1.get("hirflow_nodes_refreshed_total", 0) - m0.get("hirflow_nodes_refreshed_total", 0)
    # the drain's small neighbour-only batches left out: they made the mean look small
    d = {k: m_streamed.get(k, 0.0) - m0.get(k, 0.0) for k in (
        "hirflow_refresh_batch_seconds_sum", "hirflow_refresh_batch_seconds_count",
        "hirflow_refresh_batch_nodes_sum", "hirflow_view_wait_seconds_sum")}
    n = max(1.0, d["hirflow_refresh_batch_seconds_count"])
    batches = {"batches": int(d["hirflow_refresh_batch_seconds_count"]),   # the refresh thread
               "mean_nodes": d["hirflow_refresh_batch_nodes_sum"] / n,     # while the stream
               "mean_ms": 1000 * d["hirflow_refresh_batch_seconds_sum"] / n,   # ran
               "view_wait_ms": 1000 * d["hirflow_view_wait_seconds_sum"] / n}
    half = len(backlog) // 2
    grows = bool(backlog and np.median(backlog[half:]) > 2 * max(1.0, np.median(backlog[:half])) + 500)
    mine = [g for g in got if g[1] >= start_ms]     # not the tail of an earlier phase
    lat = np.array([x for _, _, x, _ in mine])
    endpoint = endpoint_flags(((n, ts) for n, ts, _, _ in mine), touched)
    return lat, endpoint, mine, refreshed / elapsed, backlog, grows, batches, cpu


def wait_idle(worker, timeout_s: float) -> bool:
    """Wait until the worker has nothing left to refresh for 3 s in a row (or the timeout)."""
    until, quiet = time.monotonic() + timeout_s, 0
    while time.monotonic() < until and quiet < 3:
        time.sleep(1.0)
        m = worker.metrics()
        idle = m.get("hirflow_dirty_nodes", 0.0) == 0 and m.get("hirflow_neighbor_refresh_backlog", 0.0) == 0
        quiet = quiet + 1 if idle else 0
    return quiet >= 3


def windowed_p99(event_ts: np.ndarray, lat: np.ndarray, window_s: float = WINDOW_S) -> list[float]:
    """p99 per window of event time: a latency that creeps up during a long phase (a lag
    that grows, a broker that slows) shows here while the phase's p99 hides it."""
    if not len(lat):
        return []
    w = ((event_ts - event_ts.min()) // (1000 * window_s)).astype(int)
    return [float(np.percentile(lat[w == i], 99)) for i in range(w.max() + 1) if (w == i).any()]


def yoochoose_replay(folder: Path):
    """YOOCHOOSE's clicks in time order (an iterator) and how many come before its test day
    (session-rec's split): the history to prefill, then the day to replay."""
    from bench.session_freshness import yoochoose_split
    _, evs, test_start, _ = yoochoose_split(folder, False)
    return iter(evs), sum(e.ts < test_start for e in evs)


def _pct(x) -> list[float]:
    return list(np.percentile(x, [50, 95, 99])) if len(x) else [float("nan")] * 3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rates", default=None)
    ap.add_argument("--seconds", type=float, default=None)
    ap.add_argument("--checkpoint", default="", help="serve this checkpoint (default: one trained here)")
    ap.add_argument("--cold-start", action="store_true",
                    help="serve the cold-start model (no checkpoint): tokens change for new nodes only")
    ap.add_argument("--train-events", type=int, default=None,
                    help="events of the world the model trained here learns (default 40,000; 20,000 quick)")
    ap.add_argument("--train-steps", type=int, default=None,
                    help="most optimiser steps per day of them (default 20; 5 quick)")
    ap.add_argument("--linger-ms", type=int, default=UPSTREAM_LINGER_MS,
                    help="linger of the producer that streams the events (and of the Kafka-alone "
                         "peer): each linger window stores one more batch per partition in the "
                         "embedded broker, which lists them at every fetch, so 5 ms starves the "
                         "worker of CPU within a minute (see the README)")
    ap.add_argument("--partitions", type=int, default=EMBEDDED_PARTITIONS,
                    help="partitions of the keyed topics (kafka.partitions; the demo's): the "
                         "embedded broker lists all the batches a partition holds at each fetch, "
                         "so its CPU grows with partitions x log length (see the README)")
    ap.add_argument("--warmup", type=float, default=None,
                    help="seconds of stream at the first rate before measuring (compiles the "
                         "encoder's shape buckets; not counted)")
    ap.add_argument("--drain-s", type=float, default=None,
                    help="longest wait after each phase for the queued neighbour refreshes "
                         "(default 60; 3 quick): their changes count in the all-changes figures")
    ap.add_argument("--yoochoose", type=Path, metavar="DIR",
                    help="replay YOOCHOOSE (session-rec's 100k sample, train_full and test files) "
                         "instead of a synthetic world: its clicks before the test day are the "
                         "prefill, the phases replay the test day (every session a new node) at "
                         "each rate; the worker runs configs/yoochoose.toml and serves "
                         "--checkpoint, which must be fitted before the test day (bench/"
                         "session_freshness.py --out DIR trains one)")
    ap.add_argument("--prefill", type=int, default=0,
                    help="events streamed as fast as the worker takes them before the warm-up, "
                         "then applied and refreshed: the phases run on a grown graph rather "
                         "than a young one (480,000 take 10-12 s here)")
    a = ap.parse_args()
    rates = [float(r) for r in (a.rates or ("1000,2000" if a.quick else "1000,2000,5000")).split(",")]
    seconds = a.seconds or (8 if a.quick else 120)
    out_dir = Path("var/bench")
    out_dir.mkdir(parents=True, exist_ok=True)
    checkpoint = a.checkpoint
    if a.yoochoose and not checkpoint:
        raise SystemExit("--yoochoose needs --checkpoint: a model of its sessions, fitted before its test day")
    if not checkpoint and not a.cold_start:
        checkpoint = str(trained_here(a.train_events or (20_000 if a.quick else 40_000),
                                      a.train_steps or (5 if a.quick else 20), out_dir / "freshness-model"))
    model = Path(checkpoint).name if checkpoint else "cold-start"
    drain_s = a.drain_s if a.drain_s is not None else (3.0 if a.quick else 60.0)
    print(f"model: {model}" + (f" ({checkpoint})" if checkpoint else ""), flush=True)
    import tempfile
    logs = {name: out_dir / f"freshness-{name}.log" for name in ("broker", "worker")}
    for path in logs.values():                      # kept after the run, for a stall's cause
        path.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory() as tmp, EmbeddedBroker(log_path=str(logs["broker"])) as broker:
        cfg = build(HirflowConfig, {"kafka": {"bootstrap": broker.bootstrap, "partitions": a.partitions},
                                    "graph": {"path": os.path.join(tmp, "state")}})
        ensure_topics(cfg.kafka, Topics())
        up = upstream(cfg, a.linger_ms)
        raw = np.array(kafka_alone(up, rates[0], min(seconds / 2, 10)))
        env = {"HIRFLOW_WORKER__KNOWLEDGE": "false", "HIRFLOW_REFRESH__CHECKPOINT": checkpoint,
               "HIRFLOW_WORKER__METRICS_INTERVAL_S": "0.5"}
        if a.yoochoose:
            env["HIRFLOW_CONFIG"] = str(ROOT / "configs" / "yoochoose.toml")
        worker = WorkerProcess(cfg, logs["worker"], env).start()
        try:
            deadline = time.monotonic() + 120
            while True:
                try:
                    if worker.get("/v1/status")[0] == 200:
                        break
                except OSError:
                    pass
                if time.monotonic() > deadline or worker.proc.poll() is not None:
                    raise SystemExit(f"worker did not come up; see {logs['worker']}")
                time.sleep(0.3)
            warmup = a.warmup if a.warmup is not None else (5 if a.quick else 30)
            # one world streamed on through every phase: its catalog (~1,800 entities and
            # structural edges, all at its start) lands in the warm-up, and each measured
            # phase is the same stream going on at another rate
            if a.yoochoose:
                stream, history = yoochoose_replay(a.yoochoose)
                a.prefill = a.prefill or history
            else:
                total = int(a.prefill + warmup * rates[0] + sum(rates) * seconds)
                # the world's clock runs at the first rate through the prefill (its events are
                # stamped when produced, so only the order of the world's drift depends on this)
                span_s = a.prefill / rates[0] + warmup + seconds * len(rates)
                stream = SynthWorld(SynthConfig(events=total, seed=WORLD_SEED, start_ms=int(time.time() * 1000),
                                                span_days=span_s / 86400)).stream()
            if a.prefill > 0:
                t = time.monotonic()
                applied = worker.metrics().get("hirflow_events_applied_total", 0.0)
                produce(up, stamped_now(itertools.islice(stream, a.prefill)), progress=False)
                worker.wait_metric("hirflow_events_applied_total", applied + a.prefill, timeout=600)
                drained = wait_idle(worker, 600)
                m = worker.metrics()
                print(f"prefill: {a.prefill:,} events as fast as taken, drained in "
                      f"{time.monotonic() - t:.0f} s{'' if drained else ' (not idle yet)'}; "
                      f"{m.get('hirflow_index_nodes', 0):,.0f} nodes in the index", flush=True)
            if warmup > 0:
                lat = run_rate(cfg, up, worker, stream, rates[0], warmup, phase=0, pids={},
                               drain_s=drain_s)[0]
                print(f"warm-up: {warmup:.0f}s at {rates[0]:,.0f} ev/s, {len(lat)} changes "
                      f"(not counted)", flush=True)
            pids = {"broker": [broker.proc.pid], "worker": [worker.proc.pid],
                    "sampler": children(worker.proc.pid), "bench": [os.getpid()]}
            results = {}
            for i, rate in enumerate(rates):
                lat, endpoint, mine, thr, backlog, grows, batches, cpu = run_rate(
                    cfg, up, worker, stream, rate, seconds, phase=1 + i, pids=pids, drain_s=drain_s)
                event_ts = np.array([ts for _, ts, _, _ in mine])
                drift = windowed_p99(event_ts[endpoint], lat[endpoint]) if seconds >= 2 * WINDOW_S else []
                results[rate] = (lat, endpoint, thr, grows, batches, cpu, drift)
                np.savez(out_dir / f"freshness-{rate:.0f}.npz", latency_ms=lat, endpoint=endpoint,
                         node=np.array([n for n, _, _, _ in mine]),     # per change, in
                         event_ts=event_ts,                                 # arrival order
                         change_ts=np.array([cts for _, _, _, cts in mine]))
                q, qe = _pct(lat), _pct(lat[endpoint])
                print(f"{rate:,.0f} ev/s for {seconds:.0f}s: {len(lat)} changes, freshness p50 "
                      f"{q[0]:.0f} ms p95 {q[1]:.0f} ms p99 {q[2]:.0f} ms; endpoint changes "
                      f"({int(endpoint.sum())}) p50 {qe[0]:.0f} p95 {qe[1]:.0f} p99 {qe[2]:.0f} ms; "
                      f"refresh {thr:,.0f} nodes/s; dirty backlog "
                      f"{'grows' if grows else 'steady'} (max {max(backlog or [0]):.0f}); "
                      f"{batches['batches']} refresh batches of {batches['mean_nodes']:.0f} nodes "
                      f"on average, each {batches['mean_ms']:.0f} ms to encode and write after "
                      f"{batches['view_wait_ms']:.0f} ms waiting for its views; CPU (% of a core) "
                      + ", ".join(f"{k} {100 * v:.0f}" for k, v in cpu.items()), flush=True)
                if drift:
                    print(f"  endpoint p99 per {WINDOW_S:.0f} s of event time: "
                          + " / ".join(f"{x:.0f}" for x in drift) + " ms", flush=True)
        finally:
            worker.stop()
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    for i, (rate, (lat, endpoint, *_)) in enumerate(results.items()):
        if len(lat):
            bins = np.logspace(0, 5, 60)
            ax.hist(np.clip(lat[endpoint], 1, None), bins=bins, histtype="step", color=f"C{i}",
                    label=f"{rate:,.0f} ev/s, endpoints")
            ax.hist(np.clip(lat[~endpoint], 1, None), bins=bins, histtype="step", color=f"C{i}",
                    linestyle=":", label=f"{rate:,.0f} ev/s, neighbours")
    ax.set_xscale("log")
    ax.set_xlabel("event produced -> token change received (ms)")
    ax.set_ylabel("token changes")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out_dir / "freshness.png", dpi=120)
    rq = np.percentile(raw, [50, 99]) if len(raw) else [float("nan")] * 2
    print(f"Kafka alone at {rates[0]:,.0f} msg/s (producer linger {a.linger_ms} ms): p50 {rq[0]:.1f} ms "
          f"p99 {rq[1]:.1f} ms; plot {out_dir / 'freshness.png'}")
    figs = {"kafka_alone_p50_ms": {"value": round(float(rq[0]), 1), "unit": "ms"},
            "kafka_alone_p99_ms": {"value": round(float(rq[1]), 1), "unit": "ms"},
            "producer_linger_ms": {"value": a.linger_ms, "unit": "ms"},
            "partitions": {"value": a.partitions, "unit": "partitions per keyed topic"},
            "model": model}
    for rate, (lat, endpoint, thr, grows, batches, cpu, drift) in results.items():
        q, qe = _pct(lat), _pct(lat[endpoint])
        r = int(rate)
        figs[f"endpoint_p50_ms_at_{r}"] = {"value": round(float(qe[0]), 1), "unit": "ms"}
        figs[f"endpoint_p99_ms_at_{r}"] = {"value": round(float(qe[2]), 1), "unit": "ms",
                                           "ratio_to_kafka_alone": round(float(qe[2] / rq[1]), 1)}
        figs[f"endpoint_share_at_{r}"] = {"value": round(float(endpoint.mean()), 3) if len(lat) else 0.0,
                                          "unit": "fraction"}
        figs[f"p50_ms_at_{r}"] = {"value": round(float(q[0]), 1), "unit": "ms", "ratio_to_kafka_alone": round(float(q[0] / rq[0]), 1)}
        figs[f"p95_ms_at_{r}"] = {"value": round(float(q[1]), 1), "unit": "ms"}
        figs[f"p99_ms_at_{r}"] = {"value": round(float(q[2]), 1), "unit": "ms", "ratio_to_kafka_alone": round(float(q[2] / rq[1]), 1)}
        figs[f"refresh_nodes_per_s_at_{r}"] = {"value": round(thr), "unit": "nodes/s"}
        figs[f"backlog_grows_at_{r}"] = {"value": grows, "unit": "bool"}
        figs[f"refresh_batch_nodes_at_{r}"] = {"value": round(batches["mean_nodes"]), "unit": "nodes"}
        figs[f"refresh_batch_ms_at_{r}"] = {"value": round(batches["mean_ms"], 1), "unit": "ms"}
        if drift:
            figs[f"endpoint_p99_ms_per_{WINDOW_S:.0f}s_at_{r}"] = {"value": [round(x) for x in drift], "unit": "ms"}
        for name, share in cpu.items():
            figs[f"cpu_{name}_at_{r}"] = {"value": round(100 * share), "unit": "% of a core"}
    print(json.dumps(figs))


if __name__ == "__main__":
    main()
