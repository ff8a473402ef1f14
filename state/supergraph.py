"""The super-graph: decayed weights from nodes to primitives and between primitives, per level.

A node's *contribution* is, per level and per (neighbour's primitive, action), the decay-
algebra sum of its edges to neighbours assigned to that primitive: that is the node ->
primitive weight (computed for a whole batch at once with numpy: `state.decay.group_sums`).
Primitive p <-> q at a level is the sum of the contributions towards q of
the nodes assigned to p (every edge is counted from both endpoints, so it is symmetric).
When a node is refreshed its old contribution is subtracted from the rows of its old
primitives and the new one added to its new primitives' rows; decayed sums are linear, so
this is exact and touches only the refreshed node's rows. A neighbour's new assignment
reaches a node's contribution when that node is next refreshed.

Keys in column family ``supergraph`` (gen = index generation, nk = node key)::

    b"n" + gen + nk                      -> NodeContribution (a msgpack array:
                                            [assign, levels, qs, actions, ws, t_refs])
    b"p" + gen + level + p(4) + q(4)      -> {action: [w, t_ref]}
"""
from __future__ import annotations

import itertools
import struct
from typing import Callable

import msgspec
import numpy as np

from hirflow.state.decay import add, group_sums, value_at
from hirflow.state.edge_columns import EdgeColumns
from hirflow.state.index import NO_PRIMITIVE, IndexBatch, TokenIndex, gen_prefix

_enc = msgspec.msgpack.Encoder().encode
_dec = msgspec.msgpack.Decoder().decode


class NodeContribution(msgspec.Struct, array_like=True, frozen=True):
    """A node's row: its primitive per level when the row was written (`assign`), and its
    contribution as columns, one entry per (level, neighbour primitive q, action): the
    decay-algebra sum `ws` of its edges there, as of `t_refs`."""
    assign: list[int]
    levels: list[int]
    qs: list[int]
    actions: list[str]
    ws: list[float]
    t_refs: list[int]

    def columns(self) -> tuple[list, list, list, list, list]:
        return self.levels, self.qs, self.actions, self.ws, self.t_refs


_dec_node = msgspec.msgpack.Decoder(NodeContribution).decode


class _Terms:
    """A batch's pair deltas as columns of decayed terms (level, p, q, action code, w, t):
    old contributions negated onto old primitives, new ones onto new primitives."""

    def __init__(self) -> None:
        self.cols: list[list[np.ndarray]] = [[] for _ in range(6)]

    def add(self, *cols) -> None:
        for c, x in zip(self.cols, cols):
            c.append(np.asarray(x))

    def arrays(self):
        return [np.concatenate(c) if c else np.zeros(0) for c in self.cols]


def _node_key(gen: int, nk: bytes) -> bytes:
    return b"n" + gen_prefix(gen) + nk


def _pair_keys(gen: int, level, p, q) -> list[bytes]:
    """The keys of primitive pairs (columns of levels, p and q), built as one record array."""
    rec = np.empty(len(level), [("level", "u1"), ("p", ">u4"), ("q", ">u4")])
    rec["level"], rec["p"], rec["q"] = level, p, q
    raw, pre, size = rec.tobytes(), b"p" + gen_prefix(gen), rec.itemsize
    return [pre + raw[i:i + size] for i in range(0, len(raw), size)]


class SuperGraph:
    def __init__(self, index: TokenIndex) -> None:
        self.ix = index
        self.rates = index.store.rates
        # action code -> name: the codes of `EdgeColumns` (`SchemaConfig.action_codes`)
        self.actions = sorted(self.rates)
        self.code = {a: i for i, a in enumerate(self.actions)}
        self.rate = np.array([self.rates[a] for a in self.actions], np.float64)

    @property
    def cf(self):
        # looked up per use: a held column-family handle would keep RocksDB's lock after close
        return self.ix.cf["supergraph"]

    def update(self, batch: IndexBatch, gen: int, edges: EdgeColumns, new_assign,
               assignments: Callable[[list[str]], np.ndarray]) -> None:
        """Replace the contributions of the nodes of `edges` that have a record, whose new
        assignments are the rows of `new_assign` (one per node of `edges`), in `batch`.
        `assignments(names)` -> (len(names), levels) assignment of each neighbour (rows of
        NO_PRIMITIVE for none). Rows: one `NodeContribution` per node."""
        keep = np.flatnonzero(edges.present)
        if not len(keep):
            return
        nodes = [edges.nodes[i] for i in keep.tolist()]
        new_assign = np.asarray(new_assign, np.int64).reshape(len(edges), -1)[keep]
        L = new_assign.shape[1]
        deltas = _Terms()
        if len(edges.nbr):
            # an absent node has no edges, so every row belongs to a kept one
            own = np.cumsum(edges.present) - 1
            own = own[edges.owner]
            na = np.asarray(assignments(list(edges.names)), np.int64).reshape(len(edges.names), -1)
            A = na[edges.nbr]                                                    # (E, levels)
            act = edges.action.astype(np.int64)
            w, t = edges.w, edges.t_ref
            e, lv = np.nonzero(A[:, :L] != NO_PRIMITIVE)                          # (edge, level)
        else:
            e = lv = np.zeros(0, np.int64)
        if len(e):
            q = A[e, lv]
            key = ((own[e] * L + lv) * (int(q.max()) + 1) + q) * len(self.actions) + act[e]
            _, first, cw, ct = group_sums(key, w[e], t[e], self.rate[act[e]])
            # groups come out in key order, so each node's rows are one contiguous run
            c_own, c_lv, c_q, c_act = own[e][first], lv[first], q[first], act[e][first]
            p = new_assign[c_own, c_lv]
            ok = p != NO_PRIMITIVE
            deltas.add(c_lv[ok], p[ok], c_q[ok], c_act[ok], cw[ok], ct[ok])
        else:
            c_own = c_lv = c_q = c_act = ct = np.zeros(0, np.int64)
            cw = np.zeros(0)
        bounds = np.searchsorted(c_own, np.arange(len(nodes) + 1)).tolist()
        keys = [_node_key(gen, self.ix.key(n)) for n in nodes]
        self._subtract([_dec_node(raw) for raw in self.cf.get(keys) if raw is not None], deltas)
        for i in range(len(nodes)):
            sl = slice(bounds[i], bounds[i + 1])
            row = NodeContribution(new_assign[i].tolist(), c_lv[sl].tolist(), c_q[sl].tolist(),
                                   [self.actions[x] for x in c_act[sl].tolist()], cw[sl].tolist(),
                                   ct[sl].tolist())
            batch.put_raw("supergraph", keys[i], _enc(row))
        self._apply_pairs(batch, gen, deltas)

    def remove(self, batch: IndexBatch, gen: int, nodes: list[str]) -> None:
        """Nodes that left the index: their contributions come off their primitives' rows
        and their own rows go."""
        keys = [_node_key(gen, self.ix.key(n)) for n in nodes]
        olds = [_dec_node(raw) for raw in self.cf.get(keys) if raw is not None]
        if not olds:
            return
        deltas = _Terms()
        self._subtract(olds, deltas)
        self._apply_pairs(batch, gen, deltas)
        for k in keys:
            batch.delete_raw("supergraph", k)

    def _subtract(self, olds: list[NodeContribution], deltas: _Terms) -> None:
        """The stored contributions of nodes, negated, onto their old primitives' rows (the
        rows' columns gathered by `np.fromiter` over chained lists: no Python step per row)."""
        if not olds:
            return
        chain = itertools.chain.from_iterable
        counts = np.fromiter((len(o.levels) for o in olds), np.int64, len(olds))
        n = int(counts.sum())
        if not n:
            return
        lv = np.fromiter(chain(o.levels for o in olds), np.int64, n)
        q = np.fromiter(chain(o.qs for o in olds), np.int64, n)
        act = np.fromiter(map(self.code.__getitem__, chain(o.actions for o in olds)), np.int64, n)
        w = np.fromiter(chain(o.ws for o in olds), np.float64, n)
        t = np.fromiter(chain(o.t_refs for o in olds), np.int64, n)
        # each row's old primitive: its node's assignment at the row's level (none past it)
        width = max(1, max(len(o.assign) for o in olds))
        assign = np.full((len(olds), width), NO_PRIMITIVE, np.int64)
        for i, o in enumerate(olds):
            assign[i, :len(o.assign)] = o.assign
        owner = np.repeat(np.arange(len(olds)), counts)
        p = np.where(lv < width, assign[owner, np.minimum(lv, width - 1)], NO_PRIMITIVE)
        ok = p != NO_PRIMITIVE
        deltas.add(lv[ok], p[ok], q[ok], act[ok], -w[ok], t[ok])

    def _apply_pairs(self, batch: IndexBatch, gen: int, deltas: _Terms) -> None:
        """Add the batch's deltas to the primitive <-> primitive rows (one multi-get)."""
        lv, p, q, act, w, t = deltas.arrays()
        if not len(lv):
            return
        lv, p, q, act = (x.astype(np.int64) for x in (lv, p, q, act))
        P, Q, NA = int(p.max()) + 1, int(q.max()) + 1, len(self.actions)
        key = ((lv * P + p) * Q + q) * NA + act
        _, first, dw, dt = group_sums(key, w.astype(np.float64), t.astype(np.int64), self.rate[act])
        g_lv, g_p, g_q = lv[first], p[first], q[first]       # sorted: a pair's actions adjacent
        rk = (g_lv * P + g_p) * Q + g_q
        starts = np.flatnonzero(np.r_[True, rk[1:] != rk[:-1]])
        keys = _pair_keys(gen, g_lv[starts], g_p[starts], g_q[starts])
        names = [self.actions[a] for a in act[first].tolist()]
        ws, ts = dw.tolist(), dt.tolist()
        bounds = starts.tolist() + [len(rk)]
        for i, old in enumerate(self.cf.get(keys)):
            row = {} if old is None else _dec(old)
            for j in range(bounds[i], bounds[i + 1]):
                action, cur = names[j], row.get(names[j])
                row[action] = [ws[j], ts[j]] if cur is None else \
                    list(add(cur[0], cur[1], ws[j], ts[j], self.rates[action]))
            batch.put_raw("supergraph", keys[i], _enc(row))

    # -- reads ----------------------------------------------------------------------------
    def node_primitives(self, gen: int, node_id: str, level: int, t: int) -> dict[int, float]:
        """Primitive -> decayed weight of this node's edges into it, at time t."""
        raw = self.cf.get(_node_key(gen, self.ix.key(node_id)))
        out: dict[int, float] = {}
        if raw is not None:
            for lv, q, action, w, tref in zip(*_dec_node(raw).columns()):
                if lv == level:
                    out[q] = out.get(q, 0.0) + value_at(w, tref, t, self.rates[action])
        return out

    def related(self, gen: int, level: int, prim: int, t: int, k: int = 10) -> list[tuple[int, float]]:
        """The primitives most strongly connected to `prim` at `level` (decayed to t)."""
        prefix = b"p" + gen_prefix(gen) + bytes([level]) + struct.pack(">I", prim)
        out = []
        for key, raw in self.ix._scan("supergraph", prefix):
            q = struct.unpack(">I", key[-4:])[0]
            w = sum(value_at(v[0], v[1], t, self.rates[a]) for a, v in _dec(raw).items())
            if q != prim:
                out.append((q, w))
        out.sort(key=lambda x: -x[1])
        return out[:k]

    def clear_generation(self, gen: int) -> None:
        for tag in (b"n", b"p"):
            self.ix.delete_prefix("supergraph", tag + gen_prefix(gen))

