"""One node's state: behavioural stats and its bounded top-K adjacency, both directions.

The record is the unit of I/O: one RocksDB read when a node is first touched, one write per
flush, so the ingest hot path never does a read-modify-write per event. Edges and per-action
activity are decay-algebra sums (`state.decay`), so the record does not depend on the order
in which events arrived, as long as no edge was evicted from the bounded adjacency.

Eviction keeps the heaviest edges by |current weight| at the node's latest event time (ties
broken by neighbour id and action, so it is deterministic). A node never holds more than
`top_k` edges: when one more would exceed it, the node is trimmed to `top_k - slack`, so the
sort runs once per `slack` new edges instead of once per event.
"""
from __future__ import annotations

from typing import Iterable, Iterator, NamedTuple

import msgspec

from hirflow.state.decay import add as _add, value_at

OUT, IN = 0, 1   # edge direction as seen from this node: OUT means this node was the src

_encode = msgspec.msgpack.Encoder().encode
_Activity = dict[tuple[str, int], tuple[float, int]]
_Edges = dict[tuple[str, str, int], tuple[float, int, int, int]]
# typed: msgspec builds the dicts and tuples in C. Records written before the maps (each map
# as an array of [key, value] pairs) still decode: a union of one array and one map type.
_decode = msgspec.msgpack.Decoder(tuple[str, int | None, int | None, int,
                                        _Activity | list[tuple[tuple[str, int], tuple[float, int]]],
                                        _Edges | list[tuple[tuple[str, str, int],
                                                            tuple[float, int, int, int]]]]).decode


class _Head(msgspec.Struct, array_like=True):
    """A record's leading fields; msgspec skips the rest (activity, edges) unbuilt."""
    id: str
    first: int | None
    last: int | None


_decode_head = msgspec.msgpack.Decoder(_Head).decode


class NodeState:
    __slots__ = ("id", "first", "last", "events", "activity", "edges")

    def __init__(self, node_id: str) -> None:
        self.id = node_id
        self.first: int | None = None          # earliest event time seen (ms)
        self.last: int | None = None           # latest event time seen (ms)
        self.events = 0                        # events this node took part in
        # (action, direction) -> (w, t_ref): decayed activity per action
        self.activity: dict[tuple[str, int], tuple] = {}
        # (neighbour, action, direction) -> (w, t_ref, count, first_ts)
        self.edges: dict[tuple[str, str, int], tuple] = {}

    # -- writes ---------------------------------------------------------------------------
    # Cells are tuples, not lists: a tuple of numbers stops being tracked by Python's cyclic
    # GC after one collection, so a cache of millions of edges does not make every full
    # collection walk them (measured: 19.7k -> 33.8k events/s at 600k events in bench/ingest.py).
    def apply_sum(self, nbr: str, action: str, direction: int, w: float, t_ref: int, count: int,
                  first: int, last: int, rate: float) -> None:
        """Add a decayed sum of `count` events of one edge (decay algebra, order independent)."""
        self.events += count
        if self.first is None or first < self.first:
            self.first = first
        if self.last is None or last > self.last:
            self.last = last
        key = (action, direction)
        a = self.activity.get(key)
        aw = w if w >= 0 else -w
        self.activity[key] = (aw, t_ref) if a is None else _add(a[0], a[1], aw, t_ref, rate)
        key3 = (nbr, action, direction)
        e = self.edges.get(key3)
        if e is None:
            self.edges[key3] = (w, t_ref, count, first)
        else:
            nw, nt = _add(e[0], e[1], w, t_ref, rate)
            self.edges[key3] = (nw, nt, e[2] + count, first if first < e[3] else e[3])

    def trim(self, top_k: int, rates: dict[str, float]) -> int:
        """Evict all but the `top_k` heaviest edges; returns how many were evicted."""
        extra = len(self.edges) - top_k
        if extra <= 0:
            return 0
        t = self.last
        ranked = sorted(
            (-abs(value_at(w, tref, t, rates[a])), n, a, d)
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
        """msgpack: [id, first, last, events, {[action, dir]: [w, t]}, {[nbr, action, dir]:
        [w, t, count, first]}]: msgspec encodes the dicts as they are, in one C call (a
        record of 128 edges in about two thirds of the time its pairs took as lists; the
        ingest packs every changed record at each commit)."""
        return _encode((self.id, self.first, self.last, self.events, self.activity, self.edges))

    @staticmethod
    def id_and_last(raw: bytes) -> tuple[str, int | None]:
        """The node id and last event time of a packed record, without its edges (a
        restore marks every node of a partition dirty from these)."""
        h = _decode_head(raw)
        return h.id, h.last

    @classmethod
    def unpack(cls, raw: bytes) -> "NodeState":
        node_id, first, last, events, activity, edges = _decode(raw)
        s = cls(node_id)
        s.first, s.last, s.events = first, last, events
        s.activity = activity if type(activity) is dict else dict(activity)
        s.edges = edges if type(edges) is dict else dict(edges)
        return s


class EdgeLists(NamedTuple):
    """Every edge of some records as parallel lists, record after record in each record's
    own order, and how many edges each record gave."""
    nbr: list[str]
    action: list[str]
    direction: list[int]
    w: list[float]
    t_ref: list[int]
    first: list[int]
    counts: list[int]


def edge_lists(states: Iterable["NodeState | None"]) -> EdgeLists:
    """The edges of `states` (None: a node without a record, no edges), each record's
    transposed by `zip` (C, not a Python step per edge)."""
    out = EdgeLists([], [], [], [], [], [], [])
    for s in states:
        if s is None or not s.edges:
            out.counts.append(0)
            continue
        k = list(zip(*s.edges))
        v = list(zip(*s.edges.values()))
        out.nbr.extend(k[0])
        out.action.extend(k[1])
        out.direction.extend(k[2])
        out.w.extend(v[0])
        out.t_ref.extend(v[1])
        out.first.extend(v[3])
        out.counts.append(len(s.edges))
    return out
