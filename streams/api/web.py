"""The worker's HTTP endpoints: /health, /ready, /metrics, the query API under /v1 and
/openapi.json (faust's aiohttp web server).

Queries run in a pool of `worker.query_threads` threads, never on the event loop that also
answers health checks and runs the entity agent; at most `worker.query_queue` more wait, and
a request beyond that is answered 429 at once. With `worker.api_token` set, /v1 asks for
`Authorization: Bearer <token>` (the probes and /metrics stay open). A query about a node
another worker owns is forwarded to it when `worker.peer_url` is set (`streams.scaleout.routing`), and
the other workers' view samplers read this worker's nodes from `/v1/internal/records`
(`streams.scaleout.peer_reads`)."""
from __future__ import annotations

import asyncio
import hmac
import logging
from concurrent.futures import ThreadPoolExecutor

import faust
from faust.web import Request, Response, View

from hirflow.streams.refresh import neighbor_forward
from hirflow.streams.scaleout import peer_reads
from hirflow.streams.metrics import exposition
from hirflow.streams.api.openapi import document
from hirflow.streams.api.query import QueryError
from hirflow.streams.scaleout.routing import NodeRouter
from hirflow.streams.worker.runtime import WorkerRuntime

log = logging.getLogger(__name__)


def register(app: faust.App, runtime: WorkerRuntime) -> None:
    gate = _Gate(runtime)
    _probes(app, runtime)
    _queries(app, runtime, gate)
    _internal(app, runtime, gate)


class _Gate:
    """What every /v1 request passes: the bearer token, forwarding to the node's owner, and
    admission to the query pool (429 beyond `query_threads + query_queue` in flight)."""

    def __init__(self, runtime: WorkerRuntime) -> None:
        wcfg = runtime.cfg.worker
        self.runtime, self.limit = runtime, wcfg.query_threads + wcfg.query_queue
        self.pool = ThreadPoolExecutor(wcfg.query_threads, thread_name_prefix="hirflow-query")
        self.admitted = 0                  # queries running or waiting for a thread
        self.token = wcfg.api_token.encode()
        self.router = NodeRouter(wcfg.index, wcfg.count, runtime.cfg.kafka.partitions, wcfg.peer_url)

    def authorised(self, request: Request) -> bool:
        if not self.token:
            return True
        given = request.headers.get("Authorization", "")
        return given.startswith("Bearer ") and hmac.compare_digest(given[7:].encode(), self.token)

    @staticmethod
    def refused(view: View) -> Response:
        return view.json({"error": "missing or wrong bearer token (worker.api_token)"},
                         status=401, headers={"WWW-Authenticate": "Bearer"})

    def merge(self, request: Request):
        """`then` of a retrieval: the local answer merged with the other workers'."""
        return lambda local: self.router.merged(local, request.query, request.headers.get("Authorization"))

    async def answer(self, view: View, request: Request, fn, node: str | None = None,
                     then=None) -> Response:
        """Run a query in the pool; QueryError -> its 4xx, anything unexpected -> 500 with a
        log line. A query about `node`, which another worker owns, goes to that worker;
        `then` (async) completes a local answer (a retrieval merges the other workers')."""
        if not self.authorised(request):
            return self.refused(view)
        owner = self.router.remote(node, request.headers)
        if owner is not None:
            status, body = await self.router.forward(owner, request.path_qs,
                                                     request.headers.get("Authorization"))
            return view.bytes(body, status=status, content_type="application/json")
        if self.runtime.query is None:
            return view.json({"error": "refresh is disabled on this worker (refresh.enabled)"},
                             status=503)
        if self.admitted >= self.limit:
            return view.json({"error": "too many queries in flight; retry shortly"}, status=429,
                             headers={"Retry-After": "1"})
        self.admitted += 1
        try:
            out = await asyncio.get_running_loop().run_in_executor(self.pool, fn)
            return view.json(await then(out) if then is not None else out)
        except QueryError as exc:
            return view.json({"error": exc.message}, status=exc.status)
        except Exception:
            log.exception("query failed")
            return view.json({"error": "internal error; see the worker log"}, status=500)
        finally:
            self.admitted -= 1


def _probes(app: faust.App, runtime: WorkerRuntime) -> None:
    """/health, /ready, /metrics and /openapi.json: open, answered on the event loop."""

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


def _queries(app: faust.App, runtime: WorkerRuntime, gate: _Gate) -> None:
    """The query API under /v1 (`streams.api.query` answers; `streams.api.openapi` documents it)."""

    @app.page("/v1/status")
    class Status(View):
        async def get(self, request: Request) -> Response:
            return await gate.answer(self, request,
                                     lambda: {**runtime.query.status(),
                                              "assignment": {**gate.router.assignment(),
                                                             "standby": runtime.standby_partitions()}})

    @app.page("/v1/nodes/{node}")
    class Node(View):
        async def get(self, request: Request, node: str) -> Response:
            return await gate.answer(self, request, lambda: runtime.query.node(node), node)

    @app.page("/v1/nodes/{node}/view")
    class NodeView(View):
        async def get(self, request: Request, node: str) -> Response:
            return await gate.answer(self, request, lambda: runtime.query.view(node, request.query), node)

    @app.page("/v1/retrieve")
    class Retrieve(View):
        async def get(self, request: Request) -> Response:
            return await gate.answer(self, request, lambda: runtime.query.retrieve(request.query),
                                     request.query.get("user"), gate.merge(request))

    @app.page("/v1/similar")
    class Similar(View):
        async def get(self, request: Request) -> Response:
            return await gate.answer(self, request, lambda: runtime.query.similar(request.query),
                                     request.query.get("node"), gate.merge(request))

    @app.page("/v1/primitives/{level}/{prim}")
    class Primitive(View):
        async def get(self, request: Request, level: str, prim: str) -> Response:
            return await gate.answer(self, request,
                                     lambda: runtime.query.primitive(level, prim, request.query))

    @app.page("/v1/proximity")
    class Proximity(View):
        async def get(self, request: Request) -> Response:
            return await gate.answer(self, request, lambda: runtime.query.proximity(request.query),
                                     request.query.get("node"))


def _internal(app: faust.App, runtime: WorkerRuntime, gate: _Gate) -> None:
    """What workers ask each other: a shard's search, node records for view samplers, and
    neighbour refreshes."""

    @app.page("/v1/internal/search")
    class Search(View):
        async def get(self, request: Request) -> Response:
            return await gate.answer(self, request, lambda: runtime.query.search(request.query))

    @app.page(peer_reads.PATH)
    class Records(View):
        async def post(self, request: Request) -> Response:
            if not gate.authorised(request):
                return gate.refused(self)
            body = await request.read()
            try:
                out = await asyncio.get_running_loop().run_in_executor(
                    gate.pool, peer_reads.answer, runtime.store.reader, gate.router.owner,
                    runtime.cfg.worker.index, body)
            except ValueError as exc:
                return self.json({"error": str(exc)}, status=400)
            return self.bytes(out, content_type="application/msgpack")

    @app.page(neighbor_forward.PATH)
    class Neighbors(View):
        async def post(self, request: Request) -> Response:
            if not gate.authorised(request):
                return gate.refused(self)
            if runtime.refresh is None:
                return self.json({"error": "refresh is disabled on this worker (refresh.enabled)"},
                                 status=503)
            refresh = runtime.refresh
            try:
                kept = refresh.inbox.accept(await request.read(), refresh.owns or (lambda n: True))
            except ValueError as exc:
                return self.json({"error": str(exc)}, status=400)
            return self.json({"accepted": kept})
