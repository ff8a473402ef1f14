"""`hirflow worker` as a child process, configured through its environment: the demo runs
its worker this way, and so do the tests and benchmarks that must kill it (SIGKILL) or
measure it from outside (its /metrics page)."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import re
import time
import urllib.request

from hirflow.streams.broker import free_port, terminate
from hirflow.streams.config import HirflowConfig


def scrape(url: str) -> dict[str, float]:
    """A Prometheus text page: each metric family summed over its labels (by name), and
    each labelled series by itself (`name{label="value",...}`, as the page spells it)."""
    out: dict[str, float] = {}
    with urllib.request.urlopen(url, timeout=2) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("#") or not line.strip():
                continue
            m = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+([-+0-9.eEnaNIf]+)", line)
            if m:
                out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(3))
                if m.group(2):
                    out[m.group(1) + m.group(2)] = float(m.group(3))
    return out


def wait_http(url: str, timeout: float) -> bool:
    """Whether `url` answered within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url, timeout=1).read()
            return True
        except Exception:
            time.sleep(0.3)
    return False


def peer_ports(count: int) -> tuple[list[int], str]:
    """`count` (<= 10) free loopback ports 10k, 10k + 1, ... and the `worker.peer_url` in
    which `{index}` names worker i's: for workers that route to each other on one machine."""
    if not 1 <= count <= 10:
        raise ValueError(f"1 to 10 workers, got {count}")
    for base in range(20_000, 60_000, 10):
        socks = [socket.socket() for _ in range(count)]
        try:
            for i, s in enumerate(socks):
                s.bind(("127.0.0.1", base + i))
            return [base + i for i in range(count)], f"http://127.0.0.1:{base // 10}" + "{index}"
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError(f"no {count} free neighbouring ports")


class WorkerProcess:
    """One worker process on `cfg`'s broker, topics and state directory, its API on a free
    loopback port (or `HIRFLOW_WORKER__WEB_PORT` in `extra_env`); its output goes to `log_path`."""

    def __init__(self, cfg: HirflowConfig, log_path, extra_env: dict | None = None,
                 log_level: str = "INFO") -> None:
        self.port = int((extra_env or {}).get("HIRFLOW_WORKER__WEB_PORT") or free_port())
        self.env = {**os.environ,
                    "HIRFLOW_KAFKA__BOOTSTRAP": cfg.kafka.bootstrap,
                    "HIRFLOW_KAFKA__TOPIC_PREFIX": cfg.kafka.topic_prefix,
                    "HIRFLOW_KAFKA__PARTITIONS": str(cfg.kafka.partitions),
                    "HIRFLOW_GRAPH__PATH": cfg.graph.path,
                    "HIRFLOW_WORKER__WEB_PORT": str(self.port),
                    **(extra_env or {})}
        self.log_path = log_path
        self.log_level = log_level
        self.proc: subprocess.Popen | None = None

    def start(self) -> "WorkerProcess":
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "hirflow.streams.tools.cli", "--log-level", self.log_level,
                                      "worker", "--no-create-topics"], env=self.env,
                                     stdout=log, stderr=subprocess.STDOUT)
        return self

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def metrics(self) -> dict[str, float]:
        try:
            return scrape(self.url("/metrics"))
        except OSError:
            return {}

    def get(self, path: str, headers: dict | None = None) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(urllib.request.Request(self.url(path), headers=headers or {}),
                                        timeout=2) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def wait_metric(self, name: str, at_least: float, timeout: float = 60.0) -> float:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"worker exited with {self.proc.returncode}; see {self.log_path}")
            v = self.metrics().get(name, 0.0)
            if v >= at_least:
                return v
            time.sleep(0.05)
        raise AssertionError(f"{name} did not reach {at_least}; see {self.log_path}")

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def close(self) -> None:
        """Kill the worker if a failed run left it running (its sampling child then exits on
        EOF); an orphaned worker would load the machine for every later run."""
        if self.proc is not None and self.proc.poll() is None:
            self.kill9()

    def stop(self) -> int:
        """Graceful stop (SIGTERM) once the worker is fully up: before faust installs its signal
        handlers a SIGTERM just ends the process, which is safe (see the kill -9 test) but not
        the graceful path this asserts."""
        deadline = time.monotonic() + 90        # faust waits out a killed member's session
        while self.proc.poll() is None and time.monotonic() < deadline:
            try:
                if self.get("/health")[0] in (200, 503):
                    break
            except OSError:
                pass
            time.sleep(0.2)
        return self.terminate()

    def terminate(self, timeout: float = 30.0) -> int:
        """SIGTERM now, SIGKILL after `timeout` seconds -> the exit status."""
        return terminate(self.proc, timeout)
