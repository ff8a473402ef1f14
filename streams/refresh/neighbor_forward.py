"""Neighbour refreshes across workers: when a node's tokens move, its heaviest neighbours
are refreshed too (`streams.refresh.neighbor_queue`); a neighbour another worker owns is asked of
that worker.

The refresh thread hands the requests it set aside to `NeighborForwarder.send`, which never
blocks it: a daemon thread posts them, grouped by owner, to `POST /v1/internal/neighbors`
(a msgpack list of `[node, event time]`), and the owner's refresh queue takes them
(`NeighborInbox`, drained by its refresh thread) within its own `refresh.neighbor_rate`.
Neighbour refreshes are best effort on one worker too (a bounded queue, paced): a request
that cannot be delivered (the owner restarting) is dropped and counted, never retried.
"""
from __future__ import annotations

import logging
import queue
import threading
from collections import deque
from typing import Mapping

import msgpack

from hirflow.state.routed_reader import PeerUnavailable
from hirflow.streams.metrics import NEIGHBOR_REQUESTS
from hirflow.streams.scaleout.peer_reads import PeerRecords

log = logging.getLogger(__name__)

PATH = "/v1/internal/neighbors"
MAX_REQUESTS = 10_000        # most requests one post may carry (400 beyond)


class NeighborForwarder:
    def __init__(self, peers: PeerRecords, backlog: int = 64) -> None:
        self.peers = peers
        self._queue: queue.Queue[Mapping[str, int] | None] = queue.Queue(backlog)
        self._thread = threading.Thread(target=self._run, name="hirflow-neighbor-forward", daemon=True)
        self._thread.start()

    def send(self, requests: Mapping[str, int]) -> None:
        """Queue (node -> event time) requests for their owners; dropped when far behind."""
        if not requests:
            return
        try:
            self._queue.put_nowait(requests)
        except queue.Full:
            NEIGHBOR_REQUESTS.labels("dropped").inc(len(requests))

    def close(self, timeout_s: float = 5.0) -> None:
        try:
            self._queue.put(None, timeout=timeout_s)
        except queue.Full:          # still posting to an owner that does not answer
            return
        self._thread.join(timeout_s)

    def _run(self) -> None:
        while (requests := self._queue.get()) is not None:
            by_owner: dict[int, list[list]] = {}
            for node, ts in requests.items():
                by_owner.setdefault(self.peers.owner(node), []).append([node, int(ts)])
            for owner, rows in by_owner.items():
                for lo in range(0, len(rows), MAX_REQUESTS):
                    self._post(owner, rows[lo:lo + MAX_REQUESTS])

    def _post(self, owner: int, rows: list[list]) -> None:
        try:
            self.peers.post(owner, PATH, rows)
            NEIGHBOR_REQUESTS.labels("sent").inc(len(rows))
        except PeerUnavailable as exc:
            NEIGHBOR_REQUESTS.labels("dropped").inc(len(rows))
            log.warning("worker %d did not take %d neighbour refresh requests (%s); dropped",
                        owner, len(rows), exc)


class DroppedNeighbors:
    """Where a worker without `worker.peer_url` among several sends its requests for other
    workers' nodes: nowhere; they are counted as dropped."""

    def send(self, requests: Mapping[str, int]) -> None:
        if requests:
            NEIGHBOR_REQUESTS.labels("dropped").inc(len(requests))

    def close(self) -> None:
        pass


def neighbor_forwarder(peers: PeerRecords | None, workers: int) -> NeighborForwarder | DroppedNeighbors:
    """The forwarder to other workers' refresh queues; without peers, one that drops (said
    in one warning line when there are other workers)."""
    if peers is not None:
        return NeighborForwarder(peers)
    if workers > 1:
        log.warning("%d workers without worker.peer_url: views see this worker's nodes only, "
                    "and neighbour refreshes of other workers' nodes are dropped (counted in "
                    "hirflow_neighbor_requests_total{direction=\"dropped\"})", workers)
    return DroppedNeighbors()


class NeighborInbox:
    """Requests other workers sent, waiting for this worker's refresh thread (thread-safe:
    the web server appends, the refresh thread drains)."""

    def __init__(self) -> None:
        self._items: deque[tuple[str, int]] = deque(maxlen=100_000)

    def accept(self, body: bytes, owns) -> int:
        """Parse a post's body and keep the requests for nodes this worker owns (`owns`);
        returns how many. ValueError for a body that is not a list of [node, time]."""
        try:
            rows = msgpack.unpackb(body)
        except ValueError as exc:
            raise ValueError(f"the body must be a msgpack list of [node, event time] ({exc})") from None
        if not isinstance(rows, list) or len(rows) > MAX_REQUESTS or not all(
                isinstance(r, list) and len(r) == 2 and isinstance(r[0], str) and isinstance(r[1], int)
                for r in rows):
            raise ValueError(f"the body must be a msgpack list of at most {MAX_REQUESTS} "
                             f"[node, event time] pairs")
        mine = [(n, t) for n, t in rows if owns(n)]
        self._items.extend(mine)
        NEIGHBOR_REQUESTS.labels("received").inc(len(mine))
        return len(mine)

    def drain(self) -> list[tuple[str, int]]:
        out = []
        while self._items:
            out.append(self._items.popleft())
        return out
