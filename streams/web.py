"""The worker's HTTP endpoints: /health, /ready, /metrics, the query API under /v1 and
/openapi.json (faust's aiohttp web server)."""
from __future__ import annotations

import logging

import faust
from faust.web import Request, Response, View

from hirflow.streams.metrics import exposition
from hirflow.streams.openapi import document
from hirflow.streams.query import QueryError
from hirflow.streams.runtime import WorkerRuntime

log = logging.getLogger(__name__)


def register(app: faust.App, runtime: WorkerRuntime) -> None:
    def answer(view: View, fn, *args) -> Response:
        """Run a query; QueryError -> its 4xx, anything unexpected -> 500 with a log line."""
        if runtime.query is None:
            return view.json({"error": "refresh is disabled on this worker (refresh.enabled)"},
                             status=503)
        try:
            return view.json(fn(*args))
        except QueryError as exc:
            return view.json({"error": exc.message}, status=exc.status)
        except Exception:
            log.exception("query failed")
            return view.json({"error": "internal error; see the worker log"}, status=500)

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

    @app.page("/openapi.json")
    class OpenAPI(View):
        async def get(self, request: Request) -> Response:
            from importlib.metadata import version
            return self.json(document(version("hirflow")))

    @app.page("/v1/status")
    class Status(View):
        async def get(self, request: Request) -> Response:
            return answer(self, lambda: runtime.query.status())

    @app.page("/v1/nodes/{node}")
    class Node(View):
        async def get(self, request: Request, node: str) -> Response:
            return answer(self, lambda: runtime.query.node(node))

    @app.page("/v1/retrieve")
    class Retrieve(View):
        async def get(self, request: Request) -> Response:
            return answer(self, lambda: runtime.query.retrieve(request.query))

    @app.page("/v1/similar")
    class Similar(View):
        async def get(self, request: Request) -> Response:
            return answer(self, lambda: runtime.query.similar(request.query))

    @app.page("/v1/primitives/{level}/{prim}")
    class Primitive(View):
        async def get(self, request: Request, level: str, prim: str) -> Response:
            return answer(self, lambda: runtime.query.primitive(level, prim, request.query))

    @app.page("/v1/proximity")
    class Proximity(View):
        async def get(self, request: Request) -> Response:
            return answer(self, lambda: runtime.query.proximity(request.query))
