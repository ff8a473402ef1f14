"""The OpenAPI 3.1 document of the worker's HTTP API (served at /openapi.json)."""
from __future__ import annotations

from hirflow.streams.api.query import DEFAULT_PROBES, MAX_PROBES


def _q(name, desc, required=False, schema=None):
    return {"name": name, "in": "query", "required": required, "description": desc,
            "schema": schema or {"type": "string"}}


def _p(name, desc, schema=None):
    return {"name": name, "in": "path", "required": True, "description": desc,
            "schema": schema or {"type": "string"}}


_K = _q("k", "results to return (1-1000)", schema={"type": "integer", "minimum": 1, "maximum": 1000})
_TYPES = _q("types", "comma-separated node types to keep, e.g. ad,product")
_PROBES = _q("probes", f"extra first-codebook tokens probed nearest the query (0-{MAX_PROBES}, "
                       f"default {DEFAULT_PROBES})",
             schema={"type": "integer", "minimum": 0, "maximum": MAX_PROBES})
_ERR = {"description": "bad parameter (400), not found (404) or no checkpoint yet (409)",
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}


def _op(summary, params, ok="JSON result"):
    return {"get": {"summary": summary, "parameters": params,
                    "responses": {"200": {"description": ok}, "4XX": _ERR}}}


def document(version: str) -> dict:
    return {
        "openapi": "3.1.0",
        "info": {"title": "hirflow worker API", "version": version,
                 "description": "Fresh HIR embeddings, BoM tokens and primitives of the nodes "
                                "this worker owns."},
        "paths": {
            "/health": _op("Liveness: ingest and refresh threads alive and not stalled", []),
            "/ready": _op("Readiness: caught up with the engagement topic once", []),
            "/metrics": _op("Prometheus metrics (text format)", []),
            "/v1/status": _op("Model, index generation, backlogs, hot-swap progress, and the "
                               "worker's assignment (index, count, partitions, standby copies)", []),
            "/v1/nodes/{node}": _op("Embedding, BoM tokens, assignment per level, seq",
                                    [_p("node", "node id, e.g. user:42")]),
            "/v1/nodes/{node}/view": _op(
                "The node's student view: the neighbourhood the encoder reads (nodes with hop "
                "and stats: log1p events, out-degree, in-degree, days since first and last "
                "seen, frequent flag, log1p recent edges; edges between them with action, "
                "decayed weight and age); other workers' nodes read from their owners",
                [_p("node", "node id, e.g. user:42"),
                 _q("cutoff", "as of this time, epoch ms (default now)", schema={"type": "integer"}),
                 _q("seed", "random-walk seed (default 0)", schema={"type": "integer"})]),
            "/v1/retrieve": _op("Ads/products for a user: shared-token candidates re-ranked by "
                                "inner product; with several workers and worker.peer_url, every "
                                "worker's items, merged by score (`workers`: asked, answered)",
                                [_q("user", "user node id", True), _K, _TYPES, _PROBES]),
            "/v1/internal/search": _op("Worker to worker: this worker's items for another "
                                       "worker's user query (409 when it serves another model)",
                                       [_q("q", "the user's embedding, base64 float32", True),
                                        _q("tokens", "the user's BoM tokens, comma-separated", True),
                                        _q("model", "the model the query comes from", True),
                                        _K, _TYPES, _PROBES]),
            "/v1/similar": _op("Nodes nearest a node (of `types`, default all); with several "
                               "workers and worker.peer_url, every worker's nodes, merged by "
                               "score (`workers`: asked, answered)",
                               [_q("node", "node id", True), _K, _TYPES, _PROBES]),
            "/v1/primitives/{level}/{prim}": _op(
                "Members of a primitive (closest to its prototype first) and related primitives "
                "by super-graph weight",
                [_p("level", "hierarchy level, 0 = coarsest", {"type": "integer"}),
                 _p("prim", "primitive index at that level", {"type": "integer"}), _K, _TYPES]),
            "/v1/proximity": _op("User <-> primitive proximity, or how closely an ad serves a "
                                 "primitive: cosine, behavioural weight and share, assigned",
                                 [_q("node", "node id", True),
                                  _q("level", "hierarchy level", True, {"type": "integer"}),
                                  _q("prim", "primitive index", True, {"type": "integer"})]),
        },
        "components": {"schemas": {"Error": {"type": "object", "required": ["error"],
                                             "properties": {"error": {"type": "string"}}}}},
    }
