"""Several sampling processes that sample each batch together.

One sampling process keeps about one core busy (`bench/encode.py`: student views per second
per process); a refresh on a machine with more cores needs more of them. `ViewPool` has the
`submit` / `result` interface of one `state.view_source.ViewProcess` and runs several: a
batch's nodes are cut into consecutive, disjoint chunks, one per process (none smaller than
`min_chunk`), sampled at once, and the replies are joined in the batch's order. Every process
is told every node of the batch that changed, also one that samples nothing of it: its cached
records of those nodes (read as neighbours of earlier batches) would be stale otherwise.

Each process has its own walk seed (`seed + i`), so which process samples a node changes its
walks, as a different batch would; the sampling rules are the same.
"""
from __future__ import annotations

import dataclasses
import itertools
from typing import Any, NamedTuple

import numpy as np

from hirflow.state.edge_columns import EdgeColumns
from hirflow.state.graph import GraphStore
from hirflow.state.routed_reader import Peers
from hirflow.state.schema import SchemaConfig
from hirflow.state.view_source import Prepare, Sampled, ViewProcess
from hirflow.state.views import ViewConfig


class PreparedParts(NamedTuple):
    """What `prepare` made of consecutive parts of a batch: `sizes[i]` views made `parts[i]`
    (the encoder encodes the parts one after the other)."""
    sizes: list[int]
    parts: list[Any]


class ViewPool:
    def __init__(self, store: GraphStore, schema: SchemaConfig, config: ViewConfig, seed: int,
                 processes: int, min_chunk: int = 32, start_timeout_s: float = 120.0,
                 peers: Peers | None = None, peer_ttl_s: float = 30.0) -> None:
        if processes < 1:
            raise ValueError(f"a view pool needs at least one process, got {processes}")
        self.min_chunk = min_chunk
        self.children: list[ViewProcess] = []
        try:
            for i in range(processes):
                self.children.append(ViewProcess(store, schema, config, seed + i, start_timeout_s,
                                                 name="follower" if i == 0 else f"follower-{i}",
                                                 peers=peers, peer_ttl_s=peer_ttl_s))
        except BaseException:
            self.close()
            raise
        self._tickets = itertools.count()
        self._pending: dict[int, list[tuple[ViewProcess, int]]] = {}

    def __len__(self) -> int:
        return len(self.children)

    def submit(self, ids: list[str], cutoff: int, prepare: Prepare | None = None,
               changed: list[str] | None = None) -> int:
        ids = list(ids)
        changed = ids if changed is None else list(changed)
        used = max(1, min(len(self.children), len(ids) // self.min_chunk))
        cuts = np.linspace(0, len(ids), used + 1).round().astype(int).tolist()
        cuts += [len(ids)] * (len(self.children) - used)
        ticket = next(self._tickets)
        self._pending[ticket] = [(child, child.submit(ids[a:b], cutoff, prepare, changed))
                                 for child, a, b in zip(self.children, cuts[:-1], cuts[1:])]
        return ticket

    def result(self, ticket: int) -> Sampled:
        """The batch's views in its order; answers come in request order."""
        got = [child.result(t) for child, t in self._pending.pop(ticket)]
        parts = [g for g in got if g.views] or got[:1]
        reads = {"peer_reads": sum(g.peer_reads for g in got),
                 "peer_failures": sum(g.peer_failures for g in got)}
        if len(parts) == 1:
            return dataclasses.replace(parts[0], **reads)
        prepared = None
        if all(p.prepared is not None for p in parts):
            prepared = PreparedParts([len(p.views) for p in parts], [p.prepared for p in parts])
        knowledge: dict[str, np.ndarray] = {}
        for p in parts:
            knowledge.update(p.knowledge)
        return Sampled(views=[v for p in parts for v in p.views], knowledge=knowledge,
                       seconds=max(p.seconds for p in parts), prepared=prepared,
                       edges=EdgeColumns.concat([p.edges for p in got]), **reads)

    def sample(self, ids: list[str], cutoff: int, prepare: Prepare | None = None) -> Sampled:
        return self.result(self.submit(ids, cutoff, prepare))

    def close(self, timeout_s: float = 10.0) -> None:
        for child in self.children:
            child.close(timeout_s)
