"""`hirflow demo`: the whole loop on the embedded default, with live progress in the terminal.

Starts the embedded broker, creates the topics, starts a worker process (serving cold-start
embeddings at first), streams a synthetic world in real time (event time = now), trains a
first checkpoint on the early events in a background process and announces it (the worker
hot-swaps it in), and prints every 2 s: events/s, freshness p50/p99 of endpoint changes over
the last 10 s and since start (as a token-change subscriber receives them), dirty backlog,
index size and the model in use. At the end: freshness of the last minute, what the model
learned checked against the world's planted interests, example API calls, a freshness plot.
"""
from __future__ import annotations

import itertools
import logging
import multiprocessing
import shutil
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable

from hirflow.streams import clients
from hirflow.streams.broker import EmbeddedBroker
from hirflow.streams.config import HirflowConfig
from hirflow.streams.tools.demo_report import get_json, learned, plot_freshness, print_examples, print_learned
from hirflow.streams.tools.freshness_watch import FreshnessWatch
from hirflow.streams.tools.replay import produce
from hirflow.streams.tools.synth import SynthConfig, SynthWorld
from hirflow.streams.topics import Topics, ensure_topics
from hirflow.streams.worker.worker_process import WorkerProcess, scrape, wait_http

# linger of the producer that streams the synthetic world: each linger window stores one more
# batch per partition in the embedded broker, which lists them all at every fetch: a short
# linger makes the broker take a core from the worker within minutes (bench/broker.py
# measures it with --linger-ms)
UPSTREAM_LINGER_MS = 20
# partitions of the keyed topics on the embedded broker: tansu stores each produced batch as
# one object per partition and lists all of a partition's objects at every fetch that finds
# new data there, so its CPU grows with partitions x log length; one worker on one machine
# gains nothing from more (bench/broker.py, bench/freshness.py --partitions)
EMBEDDED_PARTITIONS = 1


def upstream(cfg: HirflowConfig, linger_ms: int = UPSTREAM_LINGER_MS) -> HirflowConfig:
    """The config the synthetic world is produced with: `cfg` with the producer's linger."""
    return replace(cfg, kafka=replace(cfg.kafka, linger_ms=linger_ms))

# the live line's freshness window, and the summary's
WINDOW_S = 10.0
SUMMARY_WINDOW_S = 60.0

log = logging.getLogger(__name__)


def stamped_now(items):
    """Event time = the moment it is produced, so freshness reads as wall-clock latency."""
    import msgspec

    for it in items:
        yield msgspec.structs.replace(it, ts=int(time.time() * 1000))


def _subscribe(cfg: HirflowConfig, watch: FreshnessWatch, done: threading.Event) -> None:
    """Freshness as a subscriber sees it: receive time - oldest event time, per change."""
    from hirflow.streams.subscribe import Subscriber
    with Subscriber(cfg, group_id="hirflow-demo", from_start=False) as sub:
        while not done.is_set():
            watch.received(sub.poll(0.005))   # short: a consume call waits out its timeout


# the first checkpoint: three shuffled passes over the events streamed so far. On the
# young synthetic world one pass leaves users barely personalised, while three separate them
# by their planted interests (the summary checks it); fewer teacher anchors per step roughly
# halve the training time without losing that. Each positive's source is seen as of the
# chunk's start only (`chunk_prefix` 0): the prefix views cost 1.6x the training time here
# (168 s against 105 s on the 39,000 events of the first 20 s, 2 cores), which the
# 200-second stream does not have.
FIRST_TRAIN = dict(passes=3, min_steps=0, teacher_anchors=8, chunk_prefix=0)   # a quick first model


def _train_first(cfg: HirflowConfig, synth: SynthConfig, workdir: Path, produced: int,
                 status) -> None:
    """In a child process: train a first checkpoint on the world's first `produced` items
    (the events streamed so far: the stream is regenerated from the same seed),
    announce it, and report progress on the `status` pipe as (kind, text) pairs. A process,
    not a thread: the demo's producer and subscriber threads hold the parent's interpreter
    lock most of the time, so a training thread would be starved."""
    from hirflow.encoder.model import EncoderConfig
    from hirflow.state.events import Engagement, Entity
    from hirflow.trainer.data import world_knowledge
    from hirflow.trainer.publish import announce
    from hirflow.trainer.train import TrainConfig, train
    try:
        items = list(itertools.islice(SynthWorld(synth).stream(), produced))
        cut_ms = max(e.ts for e in items)
        evs = [e for e in items if isinstance(e, Engagement)]
        texts = None
        if cfg.worker.knowledge:                  # train on what the worker serves with
            from hirflow.encoder.knowledge import TextEncoder
            status.send(("status", "encoding entity texts for training"))
            texts = world_knowledge([e for e in items if isinstance(e, Entity)], cut_ms,
                                    TextEncoder().encode) or None
        t0 = time.monotonic()
        status.send(("status", f"training a first checkpoint on {len(evs):,} events"))
        tcfg = TrainConfig(chunk_hours=max(1e-3, (cut_ms - synth.start_ms) / 3_600_000 / 6),
                           **FIRST_TRAIN)
        path = train(evs, cfg.schema, EncoderConfig.for_schema(cfg.schema), tcfg,
                     workdir / "checkpoints", texts=texts, progress=False)
        rec = announce(clients.connection(cfg.kafka),
                       Topics(cfg.kafka.topic_prefix).checkpoints, path)
        status.send(("status", f"trained in {time.monotonic() - t0:.0f} s, announced"))
        status.send(("announced", rec.id))
    except Exception as exc:                      # the demo goes on serving cold start
        status.send(("status", f"training failed: {exc}"))


class FirstCheckpoint:
    """The background training of the demo's first checkpoint, started `after_s` into the
    stream; `poll()` folds the child's reports into `status` and `announced`."""

    def __init__(self, cfg: HirflowConfig, synth: SynthConfig, workdir: Path, after_s: float,
                 produced: Callable[[], int]) -> None:
        self.cfg, self.synth, self.workdir, self.after_s = cfg, synth, workdir, after_s
        self.produced = produced
        self._ctx = multiprocessing.get_context("spawn")
        self._reports, self._sender = self._ctx.Pipe(duplex=False)
        self._proc = None
        self._t0 = time.monotonic()
        self.status = f"first checkpoint: training starts at {after_s:.0f} s"
        self.announced: tuple[float, str] | None = None

    def poll(self) -> None:
        if self._proc is None and time.monotonic() - self._t0 >= self.after_s:
            self._proc = self._ctx.Process(target=_train_first, daemon=True, args=(
                self.cfg, self.synth, self.workdir, self.produced(), self._sender))
            self._proc.start()
            self.status = "first checkpoint: reading the events streamed so far"
        while self._reports.poll():
            try:
                kind, text = self._reports.recv()
            except EOFError:
                break
            if kind == "announced":
                self.announced = (time.time(), text)
            else:
                self.status = text

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.is_alive()

    def stop(self) -> None:
        if self._proc is not None and self._proc.is_alive():
            self._proc.terminate()
            self._proc.join(10)


FIRST_WAIT_S = 240.0    # after the stream: time left for the first checkpoint to train and swap in


def _await_first(first: FirstCheckpoint, api: str) -> None:
    """After the stream: wait (up to `FIRST_WAIT_S`) until the first checkpoint serves, so
    the summary shows what it learned; its training has the machine to itself now."""
    if not _model(api).startswith("cold-start"):
        return
    print(f"the stream ended before the first checkpoint served: waiting for it (at most "
          f"{FIRST_WAIT_S:.0f} s)", flush=True)
    t0 = time.monotonic()
    while time.monotonic() - t0 < FIRST_WAIT_S:
        time.sleep(2)
        first.poll()
        model = _model(api)
        if first.announced is not None and not model.startswith("cold-start") and "swapping" not in model:
            return
        if not first.running and first.announced is None:
            break                                    # training failed: its status says why
        print(f"[+{time.monotonic() - t0:3.0f}s] {model} | {first.status}", flush=True)
    print(f"the first checkpoint is not serving ({first.status}); the summary shows cold start")


def _model(api: str) -> str:
    s = get_json(api, "/v1/status", timeout=2)
    if not s:
        return "?"
    swap = s.get("hot_swap")
    return s["model"] + (f" (swapping {swap['done']}/~{swap['total_estimate']})" if swap else "")


def wait_idle(metrics: str, timeout: float) -> None:
    """Until the dirty backlog is empty (or `timeout`): the queries then see every event."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if scrape(metrics).get("hirflow_dirty_nodes", 0.0) == 0:
                return
        except OSError:
            return
        time.sleep(0.5)


def _summary(api: str, world: SynthWorld, watch: FreshnessWatch, workdir: Path, applied: float,
             t0_wall: float, announced: tuple[float, str] | None, stream_end: float) -> None:
    last = watch.window(SUMMARY_WINDOW_S, now_s=stream_end)
    every = watch.window(SUMMARY_WINDOW_S, endpoint_only=False, now_s=stream_end)
    print(f"\nsummary: {applied:,.0f} events applied in {stream_end - t0_wall:.0f} s")
    if last.count:
        print(f"  freshness, the stream's last {SUMMARY_WINDOW_S:.0f} s: endpoint changes p50 {last.p50_ms:.0f} ms, "
              f"p99 {last.p99_ms:.0f} ms ({last.count:,} changes); all changes incl. neighbour "
              f"refreshes p99 {every.p99_ms:.0f} ms ({every.count:,})")
    else:
        cold = announced is None or announced[0] > stream_end - SUMMARY_WINDOW_S
        serving = ("cold start, whose tokens stay put once every node is indexed" if cold
                   else "the first checkpoint")
        print(f"  freshness, the stream's last {SUMMARY_WINDOW_S:.0f} s: no token changed (the model "
              f"serving then: {serving})")
    start = watch.since_start()
    print(f"  since start (includes start-up and the hot swap): endpoint p50 {start.p50_ms:.0f} ms, "
          f"p99 {start.p99_ms:.0f} ms")
    print_learned(learned(api, world))
    user = f"user:u{int(world.user_act.argmax())}"
    print_examples(api, user)
    swaps = [(announced[0], f"announced {announced[1]}")] if announced else []
    png = plot_freshness(watch, t0_wall, swaps,
                         workdir / "freshness.png")
    if png:
        print(f"\nplot of freshness over the run: {png}")
    print(f"state in {workdir / 'state'}; inspect a node with: "
          f"hirflow --state {workdir / 'state'} state --node {user}")


def _follow(worker: WorkerProcess, metrics: str, api: str, watch: FreshnessWatch,
            first: FirstCheckpoint, done: threading.Event, duration: float | None) -> float | None:
    """A progress line every 2 s while the stream runs (events applied, freshness, dirty and
    indexed nodes, the serving model, the first checkpoint's state); -> the events applied,
    None when the worker exited."""
    t0, last_n, last_t = time.monotonic(), 0.0, time.monotonic()
    applied = 0.0
    while not done.is_set() and (duration is None or time.monotonic() - t0 < duration):
        time.sleep(2)
        first.poll()
        if worker.proc.poll() is not None:
            return None
        try:
            m = scrape(metrics)
        except OSError as exc:
            print(f"metrics unavailable: {exc}")
            continue
        applied = m.get("hirflow_events_applied_total", 0.0)
        now = time.monotonic()
        print(f"[{now - t0:4.0f}s] {applied:>8,.0f} events {(applied - last_n) / (now - last_t):6,.0f}/s"
              f" | fresh {WINDOW_S:.0f}s {watch.window(WINDOW_S)} | since start {watch.since_start()}"
              f" | dirty {m.get('hirflow_dirty_nodes', 0):5.0f} | nodes {m.get('hirflow_index_nodes', 0):5.0f}"
              f" | {_model(api)} | {first.status}", flush=True)
        last_n, last_t = applied, now
    return applied


def run_demo(cfg: HirflowConfig, workdir: Path, events: int, rate: float,
             duration: float | None, log_level: str = "WARNING", train_after: float = 20.0) -> int:
    """Stream, serve, train and report; returns the exit status."""
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    with EmbeddedBroker(log_path=str(workdir / "broker.log")) as broker:
        cfg = replace(cfg, kafka=replace(cfg.kafka, bootstrap=broker.bootstrap,
                                         partitions=EMBEDDED_PARTITIONS),
                      graph=replace(cfg.graph, path=str(workdir / "state")))
        ensure_topics(cfg.kafka, Topics(cfg.kafka.topic_prefix))
        worker = WorkerProcess(cfg, workdir / "worker.log", log_level=log_level).start()
        port = worker.port
        metrics = f"http://127.0.0.1:{port}/metrics"
        first: FirstCheckpoint | None = None
        try:
            print(f"broker {broker.bootstrap} | worker pid {worker.proc.pid} | metrics {metrics}")
            if not wait_http(metrics, 60):
                print(f"worker did not come up; see {workdir / 'worker.log'}")
                return 1
            world = SynthWorld(SynthConfig(events=events, start_ms=int(time.time() * 1000),
                                           span_days=events / rate / 86400))
            done = threading.Event()
            watch = FreshnessWatch()
            t = threading.Thread(target=lambda: (produce(upstream(cfg), watch.touched(stamped_now(world.stream())),
                                                         rate=rate, progress=False), done.set()),
                                 daemon=True)
            t.start()
            threading.Thread(target=_subscribe, args=(cfg, watch, done), daemon=True).start()
            first = FirstCheckpoint(cfg, world.cfg, workdir, train_after, lambda: watch.produced)
            api = f"http://127.0.0.1:{port}"
            print(f"streaming {events:,} synthetic events at {rate:,.0f}/s; freshness = event -> "
                  f"token change received, endpoint changes, p50/p99 ms over the last "
                  f"{WINDOW_S:.0f} s and since start")
            t0_wall = time.time()
            applied = _follow(worker, metrics, api, watch, first, done, duration)
            if applied is None:
                print(f"worker exited with {worker.proc.returncode}; see {workdir / 'worker.log'}")
                return 1
            stream_end = time.time()
            if first.running or first.announced is not None:
                _await_first(first, api)
            first.stop()
            wait_idle(metrics, 10)
            _summary(api, world, watch, workdir, applied, t0_wall, first.announced, stream_end)
            return 0
        except KeyboardInterrupt:
            return 0
        finally:
            if first is not None:
                first.stop()
            worker.terminate()
