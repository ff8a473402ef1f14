"""One node's state: behavioural stats and its bounded top-K adjacency, both directions.

The record is the unit of I/O: one RocksDB read when a node is first touched, one write per
flush, so the ingest hot path never does a read-modify-write per event. Edges and per-action
activity are decay-algebra sums (`state.decay`), so the record does not depend on the order
in which events arrived, as long as no edge was evicted from the bounded adjacency.

Eviction keeps the heaviest edges by |current weight| at the node's latest event time (ties
broken by neighbour id and action, so it is deterministic). The live record may overshoot
the bound by `slack` between trims; what is persisted never holds more than `top_k`.
"""
from __future__ import annotations

import math
from typing import Iterator

import msgpack

from state.decay import value_at

OUT, IN = 0, 1   # edge direction as seen from this node: OUT means this node was the src

_exp = math.exp


class NodeState:
    __slots__ = ("id", "first", "last", "events", "activity", "edges")

    def __init__(self, node_id: str) -> None:
        self.id = node_id
        self.first: int | None = None          # earliest event time seen (ms)
        self.last: int | None = None           # latest event time seen (ms)
        self.events = 0                        # events this node took part in
        # (action, direction) -> [w, t_ref]: decayed activity per action
        self.activity: dict[tuple[str, int], list] = {}
        # (neighbour, action, direction) -> [w, t_ref, count, first_ts]
        self.edges: dict[tuple[str, str, int], list] = {}

    # -- writes ---------------------------------------------------------------------------
    def apply(self, nbr: str, action: str, direction: int, dw: float, ts: int, rate: float) -> None:
        """Add one engagement side to this node (decay algebra, order independent)."""
        self.events += 1
        if self.first is None or ts < self.first:
            self.first = ts
        if self.last is None or ts > self.last:
            self.last = ts
        key = (action, direction)
        a = self.activity.get(key)
        if a is None:
            self.activity[key] = [abs(dw), ts]
        else:
            _add_into(a, abs(dw), ts, rate)
        key3 = (nbr, action, direction)
        e = self.edges.get(key3)
        if e is None:
            self.edges[key3] = [dw, ts, 1, ts]
        else:
            _add_into(e, dw, ts, rate)
            e[2] += 1
            if ts < e[3]:
                e[3] = ts

    def apply_sum(self, nbr: str, action: str, direction: int, w: float, t_ref: int, count: int,
                  first: int, last: int, rate: float) -> None:
        """Add a pre-aggregated decayed sum of `count` events (same edge) in one step."""
        self.events += count
        if self.first is None or first < self.first:
            self.first = first
        if self.last is None or last > self.last:
            self.last = last
        key = (action, direction)
        a = self.activity.get(key)
        if a is None:
            self.activity[key] = [abs(w), t_ref]
        else:
            _add_into(a, abs(w), t_ref, rate)
        key3 = (nbr, action, direction)
        e = self.edges.get(key3)
        if e is None:
            self.edges[key3] = [w, t_ref, count, first]
        else:
            _add_into(e, w, t_ref, rate)
            e[2] += count
            if first < e[3]:
                e[3] = first

    def trim(self, top_k: int, rates: dict[str, float]) -> int:
        """Evict all but the `top_k` heaviest edges; returns how many were evicted."""
        extra = len(self.edges) - top_k
        if extra <= 0:
            return 0
        t = self.last
        exp = _exp
        ranked = sorted(
            (-abs(w * exp(-rates[a] * (t - tref)) if rates[a] else w), n, a, d)
            for (n, a, d), (w, tref, _, _) in self.edges.items())
        edges = self.edges
        for _, n, a, d in ranked[top_k:]:
            del edges[(n, a, d)]
        return extra

    # -- reads ----------------------------------------------------------------------------
    def edge_weights(self, as_of: int | None, rates: dict[str, float]) -> Iterator[tuple]:
        """(neighbour, action, direction, weight at as_of, t_ref, count, first_ts) for edges
        that existed at `as_of` (first event at or before it); as_of None means the latest."""
        t = self.last if as_of is None else as_of
        for (nbr, action, d), (w, tref, n, first) in self.edges.items():
            if as_of is not None and first > as_of:
                continue
            yield nbr, action, d, value_at(w, tref, t, rates[action]), tref, n, first

    # -- codec ----------------------------------------------------------------------------
    def pack(self) -> bytes:
        return msgpack.packb([
            self.id, self.first, self.last, self.events,
            [[a, d, w, t] for (a, d), (w, t) in self.activity.items()],
            [[n, a, d, w, t, c, f] for (n, a, d), (w, t, c, f) in self.edges.items()],
        ])

    @classmethod
    def unpack(cls, raw: bytes) -> "NodeState":
        node_id, first, last, events, activity, edges = msgpack.unpackb(raw)
        s = cls(node_id)
        s.first, s.last, s.events = first, last, events
        s.activity = {(a, d): [w, t] for a, d, w, t in activity}
        s.edges = {(n, a, d): [w, t, c, f] for n, a, d, w, t, c, f in edges}
        return s


def _add_into(cell: list, dw: float, t: int, rate: float) -> None:
    """In-place decay.add on [w, t_ref, ...] (inlined: this runs twice per event)."""
    tref = cell[1]
    if t >= tref:
        if rate and t != tref:
            cell[0] = cell[0] * _exp(-rate * (t - tref)) + dw
        else:
            cell[0] += dw
        cell[1] = t
    else:
        cell[0] += dw * _exp(-rate * (tref - t)) if rate else dw
