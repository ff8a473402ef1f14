"""The query API's logic, independent of the web framework: parameters in, JSON-able out.

Answers come from the refresh loop's serving snapshot (one generation: its model and its
`MemoryIndex`, taken once per request so a hot swap cannot split an answer) and the
super-graph in RocksDB. Bad parameters raise `QueryError` with a 4xx status and a message that says
what is wrong; nothing a caller sends may produce a 500.
"""
from __future__ import annotations

import base64
import functools
import time
from typing import Callable, Iterable, Mapping

import numpy as np

from hirflow.encoder.serving import COLD_MODEL_ID
from hirflow.state.supergraph import SuperGraph
from hirflow.state.graph import GraphStore
from hirflow.state.routed_reader import RoutedReader
from hirflow.state.schema import SchemaConfig
from hirflow.state.views import STUDENT, View, ViewSampler
from hirflow.streams.api.neighbourhood import neighbourhood_items
from hirflow.streams.refresh.serving_snapshot import ServingSnapshot

MAX_K = 1000
MAX_PROBES = 4096
DEFAULT_PROBES = 48      # first-codebook cells probed beyond the query's own tokens: recall
                         # vs latency (bench/retrieve.py measures both)


class QueryError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


def _int(params: Mapping[str, str], name: str, default: int | None, lo: int, hi: int) -> int:
    raw = params.get(name)
    if raw is None or raw == "":
        if default is None:
            raise QueryError(400, f"missing parameter {name!r}")
        return default
    try:
        v = int(raw)
    except ValueError:
        raise QueryError(400, f"{name} must be an integer, got {raw!r}") from None
    if not lo <= v <= hi:
        raise QueryError(400, f"{name} must be in [{lo}, {hi}], got {v}")
    return v


def _query(embedding: np.ndarray, tokens, k: int) -> dict:
    """What the other workers search their own nodes with (`search`'s parameters)."""
    return {"embedding": base64.b64encode(embedding.tobytes()).decode(), "tokens": tokens, "k": k}


def student_view(store: GraphStore, peers, schema: SchemaConfig, node: str, cutoff: int,
                 seed: int) -> View | None:
    """The student view of `node` (None if this worker has no record of it) as of `cutoff`,
    its walks seeded by `seed`, sampled afresh from the committed state with other workers'
    nodes read from their owners (`peers`, None with one worker): what the encoder sees."""
    if store.reader.state(node) is None:
        return None
    reader = store.reader if peers is None else RoutedReader(store.reader, peers)
    return ViewSampler(reader, schema, STUDENT, seed=seed, cache_size=4096).sample([node], cutoff)[0]


class QueryService:
    """Read-only: `serving` returns the current snapshot, `status` the worker's status."""

    def __init__(self, serving: Callable[[], ServingSnapshot], supergraph: SuperGraph,
                 types: Iterable[str], status: Callable[[], dict],
                 item_types: Iterable[str] = ("ad", "product"),
                 view_of: Callable[[str, int, int], View | None] | None = None,
                 actions: Iterable[str] = ()) -> None:
        self.serving, self.supergraph, self._status = serving, supergraph, status
        self.types = set(types)
        self.type_names = list(types)           # a view's type codes index these
        self.item_types = tuple(item_types)     # what `retrieve` returns without `types`
        self.view_of = view_of                  # (node, cutoff, seed) -> its student view
        self.actions = sorted(actions)          # a view's action codes index these

    @classmethod
    def of(cls, refresh) -> "QueryService":
        """The query service of a `RefreshLoop`."""
        schema = refresh.cfg.schema
        return cls(lambda: refresh.serving, refresh.supergraph, refresh.types, refresh.status,
                   schema.item_node_types, functools.partial(student_view, refresh.store,
                                                             refresh.peers, schema),
                   schema.all_actions)

    # -- parameter helpers ----------------------------------------------------------------
    def _types(self, params) -> list[str] | None:
        raw = params.get("types")
        if not raw:
            return None
        types = [t.strip() for t in raw.split(",") if t.strip()]
        bad = [t for t in types if t not in self.types]
        if bad:
            raise QueryError(400, f"unknown node type(s) {bad}; known: {sorted(self.types)}")
        return types

    def _node(self, params, name: str = "node") -> str:
        node = params.get(name)
        if not node:
            raise QueryError(400, f"missing parameter {name!r} (a node id such as user:42)")
        t, sep, key = node.partition(":")
        if not sep or not key or t not in self.types:
            raise QueryError(400, f"{name} must be 'type:key' with a known type, got {node!r}")
        return node

    @staticmethod
    def _level(params, snap: ServingSnapshot) -> int:
        return _int(params, "level", None, 0, snap.model.levels - 1)

    # -- endpoints ------------------------------------------------------------------------
    def node(self, node: str) -> dict:
        self._node({"node": node})
        mem = self.serving().memory
        out = mem.get(node)
        if out is None:
            raise QueryError(404, f"{node} is not in the index (unknown, or not refreshed yet)")
        return out

    def retrieve(self, params) -> dict:
        """Ads/products (or `types`) for a user: shared-token candidates re-ranked by dot.
        The answer also carries the user's `query` (embedding, base64 float32, and tokens),
        with which the other workers search their own items (`search`). Before the first
        checkpoint (`method` "neighbourhood"): what the user's co-users engaged."""
        user = self._node(params, "user")
        k = _int(params, "k", 50, 1, MAX_K)
        probes = _int(params, "probes", DEFAULT_PROBES, 0, MAX_PROBES)
        types = self._types(params) or list(self.item_types)
        snap = self.serving()
        mem = snap.memory
        t0 = time.perf_counter()
        got = mem.get(user)                  # one consistent row (a compaction reorders rows)
        if got is None:
            raise QueryError(404, f"{user} is not in the index")
        if mem.model == COLD_MODEL_ID and self.view_of is not None:
            # no checkpoint yet: the embedding knows only type and text; the graph knows more
            hits = neighbourhood_items(self.view_of, user, int(time.time() * 1000), k, types,
                                       self.type_names)
            if hits:
                return {"user": user, "model": mem.model, "quality": snap.model.quality,
                        "method": "neighbourhood", "types": types,
                        "took_ms": round((time.perf_counter() - t0) * 1000, 3),
                        "results": [{"node": n, "score": s} for n, s in hits]}
        q = np.asarray(got["embedding"], np.float32)
        hits = mem.search(q, got["tokens"], k, types, exclude=[user], probes=probes)
        return {"user": user, "model": mem.model, "quality": snap.model.quality,
                "method": "embedding", "types": types,
                "took_ms": round((time.perf_counter() - t0) * 1000, 3),
                "results": [{"node": n, "score": round(s, 6)} for n, s in hits],
                "query": _query(q, got["tokens"], k)}

    def search(self, params) -> dict:
        """This worker's items for another worker's query (`retrieve`'s `query`): `q` the
        embedding (base64 float32), `tokens` comma-separated, `model` the model it came
        from (another model's scores do not compare: 409)."""
        k = _int(params, "k", 50, 1, MAX_K)
        probes = _int(params, "probes", DEFAULT_PROBES, 0, MAX_PROBES)
        types = self._types(params) or list(self.item_types)
        mem = self.serving().memory
        if params.get("model") != mem.model:
            raise QueryError(409, f"this worker serves model {mem.model}, not {params.get('model')!r}")
        try:
            q = np.frombuffer(base64.b64decode(params.get("q", ""), validate=True), np.float32)
            tokens = [int(t) for t in params.get("tokens", "").split(",") if t]
        except ValueError:
            raise QueryError(400, "q must be base64 float32 and tokens comma-separated integers") from None
        if len(q) != mem.d:
            raise QueryError(400, f"q has {len(q)} floats, the index {mem.d}")
        hits = mem.search(q, tokens, k, types, probes=probes)
        return {"model": mem.model, "results": [{"node": n, "score": round(s, 6)} for n, s in hits]}

    def view(self, node: str, params) -> dict:
        """The node's student view as of `cutoff` (ms, default now) with walk seed `seed`
        (default 0): its nodes (hop, behavioural stats) and the edges between them, as the
        encoder sees them. The same parameters give the same view while the graph does not
        change, on whichever worker answers."""
        self._node({"node": node})
        cutoff = _int(params, "cutoff", int(time.time() * 1000), 0, 2 ** 62)
        seed = _int(params, "seed", 0, 0, 2 ** 31 - 1)
        v = self.view_of(node, cutoff, seed) if self.view_of is not None else None
        if v is None:
            raise QueryError(404, f"{node} is not in the graph")
        names = v.nodes
        return {"node": node, "cutoff": cutoff, "seed": seed,
                "nodes": [{"node": n, "type": self.type_names[t], "hop": int(h),
                           "stats": [round(float(x), 6) for x in s]}
                          for n, t, h, s in zip(names, v.types.tolist(), v.hop, v.stats)],
                "edges": [{"src": names[a], "dst": names[b], "action": self.actions[c],
                           "weight": round(float(w), 6), "age_s": round(float(g), 3)}
                          for a, b, c, w, g in zip(v.edge_src.tolist(), v.edge_dst.tolist(),
                                                   v.edge_action.tolist(), v.edge_weight, v.edge_age)]}

    def similar(self, params) -> dict:
        """Nodes nearest a node (of `types`, default all). Like `retrieve`, the answer carries
        the node's `query`, with which the other workers search their own nodes."""
        node = self._node(params)
        k = _int(params, "k", 20, 1, MAX_K)
        probes = _int(params, "probes", DEFAULT_PROBES, 0, MAX_PROBES)
        types = self._types(params) or sorted(self.types)
        snap = self.serving()
        mem = snap.memory
        got = mem.get(node)                  # one consistent row (a compaction reorders rows)
        if got is None:
            raise QueryError(404, f"{node} is not in the index")
        q = np.asarray(got["embedding"], np.float32)
        hits = mem.search(q, got["tokens"], k, types, exclude=[node], probes=probes)
        return {"node": node, "model": mem.model, "quality": snap.model.quality, "types": types,
                "results": [{"node": n, "score": round(s, 6)} for n, s in hits],
                "query": _query(q, got["tokens"], k)}

    def primitive(self, level: str, prim: str, params) -> dict:
        snap = self.serving()
        lv = _int({"level": level}, "level", None, 0, snap.model.levels - 1)
        mem = snap.memory
        if mem.prototypes is None:
            raise QueryError(409, "no checkpoint is serving yet: primitives do not exist (cold start)")
        p = _int({"prim": prim}, "prim", None, 0, len(mem.prototypes[lv]) - 1)
        k = _int(params, "k", 20, 1, MAX_K)
        t = int(time.time() * 1000)
        members = mem.members(lv, p, k, self._types(params))
        related = self.supergraph.related(mem.gen, lv, p, t, k)
        return {"level": lv, "primitive": p, "model": mem.model,
                "members": [{"node": n, "cosine": round(s, 6)} for n, s in members],
                "related": [{"primitive": q, "weight": round(w, 6)} for q, w in related]}

    def proximity(self, params) -> dict:
        """How close a node (user or ad) is to a primitive: cosine to its prototype, the
        decayed weight of its edges into the primitive, and whether it is assigned there."""
        node = self._node(params)
        snap = self.serving()
        lv = self._level(params, snap)
        mem = snap.memory
        if mem.prototypes is None:
            raise QueryError(409, "no checkpoint is serving yet: primitives do not exist (cold start)")
        p = _int(params, "prim", None, 0, len(mem.prototypes[lv]) - 1)
        rec = mem.get(node)                  # one consistent row (a compaction reorders rows)
        if rec is None:
            raise QueryError(404, f"{node} is not in the index")
        weights = self.supergraph.node_primitives(mem.gen, node, lv, int(time.time() * 1000))
        total = sum(abs(w) for w in weights.values())
        cos = mem.prototype_cosine(node, lv, p)
        if cos is None:
            raise QueryError(404, f"{node} is not in the index")
        return {"node": node, "level": lv, "primitive": p, "cosine": round(cos, 6),
                "assigned": rec["assign"][lv] == p,
                "behaviour_weight": round(weights.get(p, 0.0), 6),
                "behaviour_share": round(abs(weights.get(p, 0.0)) / total, 6) if total else 0.0}

    def status(self) -> dict:
        return self._status()
