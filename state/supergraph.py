"""The super-graph: decayed weights from nodes to primitives and between primitives, per level.

A node's *contribution* is, per level and per (neighbour's primitive, action), the decay-
algebra sum of its edges to neighbours assigned to that primitive: that is the node ->
primitive weight. Primitive p <-> q at a level is the sum of the contributions towards q of
the nodes assigned to p (every edge is counted from both endpoints, so it is symmetric).
When a node is refreshed its old contribution is subtracted from the rows of its old
primitives and the new one added to its new primitives' rows; decayed sums are linear, so
this is exact and touches only the refreshed node's rows. A neighbour's new assignment
reaches a node's contribution when that node is next refreshed.

Keys in column family ``supergraph`` (gen = index generation, nk = node key)::

    b"n" + gen + nk                      -> [assign, [[level, q, action, w, t_ref], ...]]
    b"p" + gen + level + p(4) + q(4)      -> {action: [w, t_ref]}
"""
from __future__ import annotations

import struct
from typing import Callable, Mapping, Sequence

import msgspec

from state.decay import add, value_at
from state.index import NO_PRIMITIVE, IndexBatch, TokenIndex, gen_prefix
from state.node import NodeState

_enc = msgspec.msgpack.Encoder().encode
_dec = msgspec.msgpack.Decoder().decode

Contribution = dict[tuple[int, int, str], tuple[float, int]]


def contribution(state: NodeState, assign_of: Callable[[str], Sequence[int] | None],
                 rates: Mapping[str, float]) -> Contribution:
    """(level, neighbour primitive, action) -> decayed (w, t_ref) over the node's edges."""
    out: Contribution = {}
    for (nbr, action, _d), (w, tref, _n, _f) in state.edges.items():
        a = assign_of(nbr)
        if not a:
            continue
        rate = rates[action]
        for level, q in enumerate(a):
            if q == NO_PRIMITIVE:
                continue
            k = (level, q, action)
            cur = out.get(k)
            out[k] = (w, tref) if cur is None else add(cur[0], cur[1], w, tref, rate)
    return out


def _node_key(gen: int, nk: bytes) -> bytes:
    return b"n" + gen_prefix(gen) + nk


def _pair_key(gen: int, level: int, p: int, q: int) -> bytes:
    return b"p" + gen_prefix(gen) + bytes([level]) + struct.pack(">II", p, q)


class SuperGraph:
    def __init__(self, index: TokenIndex) -> None:
        self.ix = index
        self.rates = index.store.rates

    @property
    def cf(self):
        # looked up per use: a held column-family handle would keep RocksDB's lock after close
        return self.ix.cf["supergraph"]

    def update(self, batch: IndexBatch, gen: int,
               nodes: Sequence[tuple[NodeState, Sequence[int]]],
               assign_of: Callable[[str], Sequence[int] | None]) -> None:
        """Replace the contributions of these (state, new assignment) nodes in `batch`."""
        if not nodes:
            return
        nks = [self.ix.key(s.id) for s, _ in nodes]
        olds = self.cf.get([_node_key(gen, nk) for nk in nks])
        deltas: dict[tuple[int, int, int], dict[str, tuple[float, int]]] = {}

        def bump(level, p, q, action, w, tref):
            row = deltas.setdefault((level, p, q), {})
            cur = row.get(action)
            row[action] = (w, tref) if cur is None else add(cur[0], cur[1], w, tref, self.rates[action])

        for (s, assign), nk, raw in zip(nodes, nks, olds):
            if raw is not None:
                old_assign, rows = _dec(raw)
                for level, q, action, w, tref in rows:
                    if level < len(old_assign) and old_assign[level] != NO_PRIMITIVE:
                        bump(level, old_assign[level], q, action, -w, tref)
            new = contribution(s, assign_of, self.rates)
            for (level, q, action), (w, tref) in new.items():
                if level < len(assign) and assign[level] != NO_PRIMITIVE:
                    bump(level, assign[level], q, action, w, tref)
            batch.put_raw("supergraph", _node_key(gen, nk), _enc(
                [list(assign), [[lv, q, a, w, t] for (lv, q, a), (w, t) in new.items()]]))
        keys = list(deltas)
        raws = self.cf.get([_pair_key(gen, *k) for k in keys])
        for k, raw in zip(keys, raws):
            row = {} if raw is None else {a: tuple(v) for a, v in _dec(raw).items()}
            for action, (w, tref) in deltas[k].items():
                cur = row.get(action)
                row[action] = (w, tref) if cur is None else add(cur[0], cur[1], w, tref, self.rates[action])
            batch.put_raw("supergraph", _pair_key(gen, *k), _enc({a: list(v) for a, v in row.items()}))

    # -- reads ----------------------------------------------------------------------------
    def node_primitives(self, gen: int, node_id: str, level: int, t: int) -> dict[int, float]:
        """Primitive -> decayed weight of this node's edges into it, at time t."""
        raw = self.cf.get(_node_key(gen, self.ix.key(node_id)))
        out: dict[int, float] = {}
        if raw is not None:
            for lv, q, action, w, tref in _dec(raw)[1]:
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
