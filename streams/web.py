"""The worker's HTTP endpoints: /health (liveness), /ready (readiness), /metrics (Prometheus)."""
from __future__ import annotations

import faust
from faust.web import Request, Response, View

from streams.metrics import exposition
from streams.runtime import WorkerRuntime


def register(app: faust.App, runtime: WorkerRuntime) -> None:
    @app.page("/health")
    class Health(View):
        async def get(self, request: Request) -> Response:
            ok, why = runtime.healthy()
            return self.json({"ok": ok, "status": why}, status=200 if ok else 503)

    @app.page("/ready")
    class Ready(View):
        async def get(self, request: Request) -> Response:
            ok, why = runtime.ready()
            return self.json({"ready": ok, "status": why}, status=200 if ok else 503)

    @app.page("/metrics")
    class Metrics(View):
        async def get(self, request: Request) -> Response:
            runtime.update_gauges()
            # aiohttp refuses a charset inside content_type; text/plain 0.0.4 is what Prometheus reads
            return self.bytes(exposition(), content_type="text/plain; version=0.0.4")
