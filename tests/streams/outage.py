"""A broker the tests can cut off and bring back with its state: the embedded tansu behind a
TCP relay on the port its clients know (tansu advertises the relay's port, so every
connection goes through it). `cut()` closes every connection and stops listening, so
clients meet "connection refused" as in a network outage or a durable broker's restart;
`restore()` listens again on the same port, with tansu and its topics as they were."""
from __future__ import annotations

import socket
import subprocess
import threading

from hirflow.streams.broker import EmbeddedBroker, free_port, tansu_command


class RelayedBroker:
    def __init__(self) -> None:
        self.port = free_port()                     # what clients connect to
        self.broker = EmbeddedBroker()              # tansu listens on its own port
        self._listener: socket.socket | None = None
        self._open: list[socket.socket] = []
        self._lock = threading.Lock()

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> "RelayedBroker":
        b = self.broker
        b.proc = subprocess.Popen(tansu_command(f"tcp://127.0.0.1:{b.port}", f"tcp://127.0.0.1:{self.port}"),
                                  stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)
        self.restore()
        b._wait_ready(30)
        return self

    def restore(self) -> None:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", self.port))
        s.listen(64)
        self._listener = s
        threading.Thread(target=self._accept, args=(s,), daemon=True).start()

    def cut(self) -> None:
        with self._lock:
            listener, self._listener = self._listener, None
            conns, self._open = self._open, []
        if listener is not None:
            listener.close()
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            c.close()

    def stop(self) -> None:
        self.cut()
        self.broker.stop()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:                         # cut: the listener is closed
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.broker.port))
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._listener is not listener:  # cut meanwhile
                    client.close()
                    upstream.close()
                    return
                self._open += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pipe, args=(a, b), daemon=True).start()


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
