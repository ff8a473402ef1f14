"""Retention: which stored nodes are spent and may leave the store and the index.

A node is spent when it has been idle for `graph.expire_after_days` and every one of its
edges has decayed below `graph.expire_below` (an edge of an action without decay never
does, so owners of campaigns and ads stay). The sweep examines `expire_sweep_nodes` node
records per call, following a key cursor over the store and starting again after the end;
`GraphWriter.expire_slice` deletes what it finds.
"""
from __future__ import annotations

from typing import Callable

from hirflow.state.decay import value_at
from hirflow.state.graph import GraphConfig, GraphStore
from hirflow.state.node import NodeState


class RetentionSweep:
    def __init__(self, store: GraphStore, config: GraphConfig) -> None:
        self.store, self.config, self.rates = store, config, store.rates
        self.after: bytes | None = None        # the cursor: the last node key examined

    def spent(self, now_ms: int, busy: Callable[[str], bool]) -> list[str]:
        """The spent nodes of the next slice of the store, leaving out those `busy` names
        (dirty, or changed since the last commit)."""
        cfg = self.config
        ids, self.after = self.store.reader.node_ids_after(self.after, cfg.expire_sweep_nodes)
        states = self.store.load_nodes([n for n in ids if not busy(n)], collided=set())
        idle_before = now_ms - cfg.expire_after_days * 86_400_000
        return [n for n, s in states.items() if self._is_spent(s, idle_before, now_ms)]

    def _is_spent(self, s: NodeState, idle_before: float, now_ms: int) -> bool:
        if s.last is None or s.last >= idle_before:
            return False
        below, rates = self.config.expire_below, self.rates
        return all(abs(value_at(w, t, now_ms, rates[action])) < below
                   for (_, action, _), (w, t, _, _) in s.edges.items())
