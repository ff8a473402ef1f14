"""A batch of nodes' adjacencies as columns: what the super-graph update and the neighbour
queue need of the nodes a refresh encodes, without their `NodeState` records.

The sampling process has just decoded those records for the views, so it builds these and
ships them with the views: a few arrays and one list of distinct neighbour names instead of
every edge as Python tuples, so the worker never decodes the same records again under the
interpreter lock it shares with ingest.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from hirflow.state.node import NodeState, edge_lists


@dataclass(frozen=True, eq=False)
class EdgeColumns:
    """Edges of `nodes`, node by node in each record's own order.

    nodes   tuple[str]        the nodes, in the order asked for
    present bool     (n,)     whether the node has a record (absent: no edges)
    bounds  int64    (n + 1,) node i's edges are rows bounds[i]:bounds[i + 1]
    names   tuple[str]        distinct neighbours, in order of first appearance
    nbr     int32    (e,)     index into `names`
    action  int16    (e,)     action code (`SchemaConfig.action_codes`: sorted names)
    w       float64  (e,)     stored decayed weight at t_ref (not decayed further)
    t_ref   int64    (e,)     the weight's reference time (ms)
    first   int64    (e,)     the edge's first event time (ms): it exists as of any time after
    """
    nodes: tuple[str, ...]
    present: np.ndarray
    bounds: np.ndarray
    names: tuple[str, ...]
    nbr: np.ndarray
    action: np.ndarray
    w: np.ndarray
    t_ref: np.ndarray
    first: np.ndarray

    @classmethod
    def from_states(cls, nodes: Sequence[str], states: Mapping[str, NodeState | None],
                    codes: Mapping[str, int]) -> "EdgeColumns":
        """Columns of the records `states[n]` of `nodes`; `codes`: action -> code."""
        records = [states.get(n) for n in nodes]
        e = edge_lists(records)
        nbr, acts, w, t, counts = e.nbr, e.action, e.w, e.t_ref, e.counts
        present = [s is not None for s in records]
        names = tuple(dict.fromkeys(nbr))
        pos = dict(zip(names, range(len(names))))
        return cls(nodes=tuple(nodes), present=np.array(present, bool),
                   bounds=np.r_[0, np.cumsum(counts, dtype=np.int64)].astype(np.int64),
                   names=names,
                   nbr=np.fromiter(map(pos.__getitem__, nbr), np.int32, len(nbr)),
                   action=np.fromiter(map(codes.__getitem__, acts), np.int16, len(acts)),
                   w=np.array(w, np.float64), t_ref=np.array(t, np.int64),
                   first=np.array(e.first, np.int64))

    @classmethod
    def concat(cls, parts: Sequence["EdgeColumns"]) -> "EdgeColumns":
        """The columns of all `parts`' nodes, in order (as if built from them at once)."""
        if len(parts) == 1:
            return parts[0]
        names = tuple(dict.fromkeys(n for p in parts for n in p.names))
        pos = dict(zip(names, range(len(names))))
        offsets = np.cumsum([0] + [int(p.bounds[-1]) for p in parts[:-1]])
        return cls(nodes=tuple(n for p in parts for n in p.nodes),
                   present=np.concatenate([p.present for p in parts]),
                   bounds=np.concatenate([[0]] + [p.bounds[1:] + o for p, o in zip(parts, offsets)]).astype(np.int64),
                   names=names,
                   nbr=np.concatenate([np.fromiter(map(pos.__getitem__, p.names), np.int32, len(p.names))[p.nbr]
                                       for p in parts]).astype(np.int32),
                   action=np.concatenate([p.action for p in parts]).astype(np.int16),
                   w=np.concatenate([p.w for p in parts]).astype(np.float64),
                   t_ref=np.concatenate([p.t_ref for p in parts]).astype(np.int64),
                   first=np.concatenate([p.first for p in parts]).astype(np.int64))

    def __len__(self) -> int:
        return len(self.nodes)

    @property
    def owner(self) -> np.ndarray:
        """Row -> index of the node whose edge it is."""
        return np.repeat(np.arange(len(self.nodes), dtype=np.int64), np.diff(self.bounds))

    def heaviest(self, i: int, k: int) -> list[str]:
        """Neighbours of node i's `k` heaviest edges by |stored weight| (ties: record order;
        a neighbour can appear once per action)."""
        a, b = int(self.bounds[i]), int(self.bounds[i + 1])
        order = np.argsort(-np.abs(self.w[a:b]), kind="stable")[:k]
        return [self.names[j] for j in self.nbr[a:b][order].tolist()]
