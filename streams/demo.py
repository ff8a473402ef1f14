"""`hirflow demo`: the whole loop on the embedded default, with live progress in the terminal.

Starts the embedded broker, creates the topics, starts a worker process (serving cold-start
embeddings at first), streams a synthetic world in real time (event time = now), trains a
first checkpoint on the early window in the background and announces it (the worker hot-
swaps it in), and prints events/s, freshness p50/p99 (measured by a token-change
subscriber), lag, dirty backlog and the model in use, then example queries of the API.
"""
from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import replace
from pathlib import Path

from streams.broker import EmbeddedBroker, free_port
from streams.config import HirflowConfig
from streams.replay import produce
from streams.synth import SynthConfig, SynthWorld
from streams.topics import Topics, ensure_topics

# linger of the producer that streams the synthetic world: each linger window stores one more
# batch per partition in the embedded broker, which lists them all at every fetch, and at 5 ms
# it took a core from the worker within a minute or two (bench/broker.py, --linger-ms)
UPSTREAM_LINGER_MS = 20
# partitions of the keyed topics on the embedded broker: tansu stores each produced batch as
# one object per partition and lists all of a partition's objects at every fetch that finds
# new data there, so its CPU grows with partitions x log length; one worker on one machine
# gains nothing from more (bench/broker.py, bench/freshness.py --partitions)
EMBEDDED_PARTITIONS = 1


def upstream(cfg: HirflowConfig, linger_ms: int = UPSTREAM_LINGER_MS) -> HirflowConfig:
    """The config the synthetic world is produced with: `cfg` with the producer's linger."""
    return replace(cfg, kafka=replace(cfg.kafka, linger_ms=linger_ms))

log = logging.getLogger(__name__)


def scrape(url: str) -> dict[str, float]:
    """Sum each metric family over its labels from a Prometheus text page."""
    out: dict[str, float] = {}
    with urllib.request.urlopen(url, timeout=2) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("#") or not line.strip():
                continue
            m = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+([-+0-9.eEnaNIf]+)", line)
            if m:
                out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(3))
    return out


def wait_http(url: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url, timeout=1).read()
            return True
        except Exception:
            time.sleep(0.3)
    return False


def stamped_now(items):
    """Event time = the moment it is produced, so freshness reads as wall-clock latency."""
    import msgspec

    for it in items:
        yield msgspec.structs.replace(it, ts=int(time.time() * 1000))


def _subscribe(cfg: HirflowConfig, out: list[int], done: threading.Event) -> None:
    """Freshness as a subscriber sees it: emit time - oldest event time, per change."""
    from streams.subscribe import Subscriber
    with Subscriber(cfg, group_id="hirflow-demo", from_start=False) as sub:
        while not done.is_set():
            out.extend(c.ts - c.event_ts for c in sub.poll(0.5))


def _train_first(cfg: HirflowConfig, world: SynthWorld, workdir: Path, after_s: float,
                 out: dict) -> None:
    """Train a small first checkpoint on the events streamed so far, then announce it."""
    from encoder.model import EncoderConfig
    from state.events import Engagement, Entity
    from trainer.data import world_knowledge
    from trainer.publish import announce
    from trainer.train import TrainConfig, train
    try:
        time.sleep(after_s)
        cut = int(time.time() * 1000)
        items = [e for e in world.stream() if e.ts <= cut]
        evs = [e for e in items if isinstance(e, Engagement)]
        texts = None
        if cfg.worker.knowledge:                  # train on what the worker serves with
            from encoder.knowledge import TextEncoder
            texts = world_knowledge([e for e in items if isinstance(e, Entity)], cut,
                                    TextEncoder().encode) or None
        out["status"] = f"training on {len(evs)} events"
        tcfg = TrainConfig(chunk_hours=max(1e-3, (cut - world.cfg.start_ms) / 3_600_000 / 6),
                           max_steps_per_chunk=3)
        path = train(evs, cfg.schema, EncoderConfig.for_schema(cfg.schema), tcfg,
                     workdir / "checkpoints", texts=texts, progress=False)
        rec = announce({"bootstrap.servers": cfg.kafka.bootstrap, **cfg.kafka.client},
                       Topics(cfg.kafka.topic_prefix).checkpoints, path)
        out["status"] = f"announced {rec['id']}"
    except Exception as exc:                      # the demo goes on serving cold start
        out["status"] = f"training failed: {exc}"


def _model(api: str) -> str:
    try:
        with urllib.request.urlopen(api + "/v1/status", timeout=2) as r:
            s = json.loads(r.read())
        swap = s.get("hot_swap")
        return s["model"] + (f" (swapping {swap['done']}/{swap['total']})" if swap else "")
    except Exception:
        return "?"


def _examples(api: str) -> None:
    print("\nquery API (OpenAPI at /openapi.json); examples:")
    for path in ("/v1/status", "/v1/nodes/user:u0", "/v1/retrieve?user=user:u0&k=5",
                 "/v1/similar?node=user:u0&k=5", "/v1/primitives/0/0?k=5",
                 "/v1/proximity?node=user:u0&level=0&prim=0"):
        try:
            with urllib.request.urlopen(api + path, timeout=5) as r:
                body = r.read().decode()
        except urllib.error.HTTPError as e:
            body = f"{e.code} {e.read().decode()}"
        except OSError as e:
            body = str(e)
        print(f"  curl '{api}{path}'\n    -> {body[:300]}")


def run_demo(cfg: HirflowConfig, workdir: Path, events: int, rate: float,
             duration: float | None, log_level: str = "WARNING", train_after: float = 20.0) -> int:
    trainer: list[threading.Thread] = []
    rc = _run(cfg, workdir, events, rate, duration, log_level, train_after, trainer)
    if trainer and trainer[0].is_alive():
        # torch's threads cannot be stopped; leaving them to interpreter exit aborts the process
        print("the first checkpoint was still training when the stream ended; exiting without "
              "it (more --events or a longer --duration leave it time)", flush=True)
        sys.stderr.flush()
        os._exit(rc)
    return rc


def _run(cfg: HirflowConfig, workdir: Path, events: int, rate: float, duration: float | None,
         log_level: str, train_after: float, trainer: list[threading.Thread]) -> int:
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    with EmbeddedBroker(log_path=str(workdir / "broker.log")) as broker:
        port = free_port()
        env = {**os.environ, "HIRFLOW_KAFKA__BOOTSTRAP": broker.bootstrap,
               "HIRFLOW_KAFKA__PARTITIONS": str(EMBEDDED_PARTITIONS),
               "HIRFLOW_GRAPH__PATH": str(workdir / "state"), "HIRFLOW_WORKER__WEB_PORT": str(port)}
        cfg = replace(cfg, kafka=replace(cfg.kafka, bootstrap=broker.bootstrap,
                                         partitions=EMBEDDED_PARTITIONS))
        ensure_topics(cfg.kafka, Topics(cfg.kafka.topic_prefix))
        wlog = open(workdir / "worker.log", "wb")
        worker = subprocess.Popen([sys.executable, "-m", "streams.cli", "--log-level", log_level,
                                   "worker"], env=env, stdout=wlog, stderr=subprocess.STDOUT)
        metrics = f"http://127.0.0.1:{port}/metrics"
        try:
            print(f"broker {broker.bootstrap} | worker pid {worker.pid} | metrics {metrics}")
            if not wait_http(metrics, 60):
                print(f"worker did not come up; see {workdir / 'worker.log'}")
                return 1
            world = SynthWorld(SynthConfig(events=events, start_ms=int(time.time() * 1000),
                                           span_days=events / rate / 86400))
            done = threading.Event()
            t = threading.Thread(target=lambda: (produce(upstream(cfg), stamped_now(world.stream()), rate=rate,
                                                         progress=False), done.set()), daemon=True)
            t.start()
            fresh: list[int] = []
            threading.Thread(target=_subscribe, args=(cfg, fresh, done), daemon=True).start()
            trained: dict = {}
            trainer.append(threading.Thread(target=_train_first, daemon=True,
                                            args=(cfg, world, workdir, train_after, trained)))
            trainer[0].start()
            api = f"http://127.0.0.1:{port}"
            t0, last_n, last_t = time.monotonic(), 0.0, time.monotonic()
            while not done.is_set() and (duration is None or time.monotonic() - t0 < duration):
                time.sleep(2)
                if worker.poll() is not None:
                    print(f"worker exited with {worker.returncode}; see {workdir / 'worker.log'}")
                    return 1
                try:
                    m = scrape(metrics)
                except OSError as exc:
                    print(f"metrics unavailable: {exc}")
                    continue
                n = m.get("hirflow_events_applied_total", 0.0)
                now = time.monotonic()
                recent = sorted(fresh[-5000:])
                p50 = recent[len(recent) // 2] if recent else 0
                p99 = recent[int(len(recent) * 0.99)] if recent else 0
                print(f"[{now - t0:6.0f}s] applied {n:>9.0f} {(n - last_n) / (now - last_t):7.0f} ev/s"
                      f"  fresh p50 {p50:5d} ms p99 {p99:5d} ms  lag {m.get('hirflow_consumer_lag', 0):5.0f}"
                      f"  dirty {m.get('hirflow_dirty_nodes', 0):6.0f}  index {m.get('hirflow_index_nodes', 0):6.0f}"
                      f"  model {_model(api)}  {trained.get('status', '')}", flush=True)
                last_n, last_t = n, now
            _examples(api)
            print(f"done; state in {workdir / 'state'}; inspect with: "
                  f"hirflow --state {workdir / 'state'} state --node user:u0")
            return 0
        except KeyboardInterrupt:
            return 0
        finally:
            worker.terminate()
            try:
                worker.wait(30)
            except subprocess.TimeoutExpired:
                worker.kill()
