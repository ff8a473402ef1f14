"""What a worker's web port answers while the worker waits before it can start (for a plan
that includes it, or for its broker): alive, not ready."""
from __future__ import annotations

import contextlib
import http.server
import json
import threading


@contextlib.contextmanager
def waiting_page(host: str, port: int, status: str = "waiting for a plan that includes this worker"):
    """While a worker waits before it can start (for a plan that includes it, or for its
    broker): /health answers 200 (alive: a liveness probe leaves it be) and everything else
    503 (/ready: not serving), with `status`."""
    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            alive = self.path.split("?")[0] == "/health"
            body = json.dumps({"status": status}).encode()
            self.send_response(200 if alive else 503)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:      # probes every few seconds: not logged
            pass

    server = http.server.ThreadingHTTPServer((host, port), Page)
    thread = threading.Thread(target=server.serve_forever, name="hirflow-waiting", daemon=True)
    thread.start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
