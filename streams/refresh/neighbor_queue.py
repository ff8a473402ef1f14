"""Neighbours waiting for a refresh because a node they are linked to changed tokens.

A node's embedding depends on its neighbours, so when a node's tokens move, its heaviest
neighbours are queued (`neighbors_per_node` each) and refreshed later within a rate budget
(`neighbor_rate` per second): the refresh of nodes dirtied by events comes first. Each
request carries the event time of the change that caused it, so its token change measures
freshness from that event. The queue is bounded: past `MAX_WAITING` the oldest requests go.
With several workers only this worker's own neighbours are queued (`owns`); requests for
another worker's nodes are set aside (`foreign`, bounded the same way) for
`streams.refresh.neighbor_forward` to send to their owners, whose queues take them with `add`.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Iterable, Mapping

from hirflow.state.edge_columns import EdgeColumns
from hirflow.streams.metrics import NEIGHBOR_BACKLOG
from hirflow.streams.refresh.rate_budget import RateBudget

MAX_WAITING = 100_000


class NeighborQueue:
    """Used by the refresh thread only."""

    def __init__(self, per_node: int, rate: float, owns: Callable[[str], bool] | None = None) -> None:
        self.per_node = per_node
        self.owns = owns                       # None: every node is this worker's
        self.budget = RateBudget(rate)
        self._waiting: OrderedDict[str, int] = OrderedDict()   # node -> causing event time
        self.foreign: OrderedDict[str, int] = OrderedDict()    # other workers' nodes, to send

    def __len__(self) -> int:
        return len(self._waiting)

    def __contains__(self, node: str) -> bool:
        return node in self._waiting

    def waiting(self) -> dict[str, int]:
        """A copy of the requests in queue order: node -> the event time that caused it."""
        return dict(self._waiting)

    def queue(self, moved: Iterable[int], edges: EdgeColumns, event_ts: Mapping[str, int],
              skip: Mapping[str, int]) -> None:
        """Queue the heaviest neighbours of the nodes whose tokens moved (their indices in
        `edges`); nodes in `event_ts` (this batch) or `skip` (the batch sampled ahead) are
        left out: their views were sampled after the event, so they already see it."""
        if not self.per_node or not self.budget.rate:
            return
        for i in moved:
            n = edges.nodes[i]
            for nbr in edges.heaviest(i, self.per_node):
                if self.owns is not None and not self.owns(nbr):
                    self.foreign.setdefault(nbr, event_ts[n])
                elif nbr not in self._waiting and nbr not in event_ts and nbr not in skip:
                    self._waiting[nbr] = event_ts[n]
        self._bound()

    def add(self, requests: Iterable[tuple[str, int]]) -> None:
        """Requests another worker sent for this worker's nodes: (node, causing event time)."""
        for node, ts in requests:
            self._waiting.setdefault(node, ts)
        self._bound()

    def take_foreign(self) -> dict[str, int]:
        """The requests set aside for other workers' nodes, handed over once."""
        out, self.foreign = self.foreign, OrderedDict()
        return out

    def _bound(self) -> None:
        for queue in (self._waiting, self.foreign):
            while len(queue) > MAX_WAITING:
                queue.popitem(last=False)
        NEIGHBOR_BACKLOG.set(len(self._waiting))

    def served(self, nodes: Iterable[str]) -> None:
        """These nodes are refreshed anyway: their requests are served too (the change then
        carries the node's own event time)."""
        for n in nodes:
            self._waiting.pop(n, None)

    def take(self, room: int) -> list[tuple[str, int]]:
        """Up to `room` oldest requests the rate budget allows now -> (node, event time)."""
        n = max(0, min(room, self.budget.available(), len(self._waiting)))
        out = [self._waiting.popitem(last=False) for _ in range(n)]
        self.budget.spend(len(out))
        NEIGHBOR_BACKLOG.set(len(self._waiting))
        return out
