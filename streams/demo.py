"""`hirflow demo`: the whole loop on the embedded default, with live progress in the terminal.

Starts the embedded broker, creates the topics, starts a worker process, streams a synthetic
world in real time (event time = now) and prints events/s applied, lag and dirty backlog
read from the worker's own /metrics until the stream ends or Ctrl-C.
"""
from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import replace
from pathlib import Path

from streams.broker import EmbeddedBroker, free_port
from streams.config import HirflowConfig
from streams.replay import produce
from streams.synth import SynthConfig, SynthWorld
from streams.topics import Topics, ensure_topics

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


def run_demo(cfg: HirflowConfig, workdir: Path, events: int, rate: float,
             duration: float | None, log_level: str = "WARNING") -> int:
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    with EmbeddedBroker(log_path=str(workdir / "broker.log")) as broker:
        port = free_port()
        env = {**os.environ, "HIRFLOW_KAFKA__BOOTSTRAP": broker.bootstrap,
               "HIRFLOW_GRAPH__PATH": str(workdir / "state"), "HIRFLOW_WORKER__WEB_PORT": str(port)}
        cfg = replace(cfg, kafka=replace(cfg.kafka, bootstrap=broker.bootstrap))
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
            t = threading.Thread(target=lambda: (produce(cfg, world.stream(), rate=rate,
                                                         progress=False), done.set()), daemon=True)
            t.start()
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
                print(f"[{now - t0:6.0f}s] applied {n:>10.0f}  {(n - last_n) / (now - last_t):8.0f} ev/s"
                      f"  lag {m.get('hirflow_consumer_lag', 0):6.0f}  dirty {m.get('hirflow_dirty_nodes', 0):7.0f}"
                      f"  dead-lettered {m.get('hirflow_events_dead_lettered_total', 0):.0f}", flush=True)
                last_n, last_t = n, now
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
