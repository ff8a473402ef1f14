"""Reads for a view sampler on one of several workers: its own partitions' nodes from its
store, every other node from the worker that owns it.

With several workers each store holds only the nodes of its own partitions, so a view
sampled from the local store alone sees another worker's node as a bare id: no edges to
expand past it, no stats, no world knowledge. `RoutedReader` has the `states` / `knowledge`
interface of `GraphReader`: it reads local nodes from the store and asks each other node's
owner for the rest, one request per owner and batch (`Peers.fetch`, at most `chunk` ids a
request). A view sampled through it equals the one a single worker holding every partition
would sample, up to how fresh the fetched records are.

Freshness: the sampler caches what it reads, and the worker's own changes invalidate its
cache, another worker's cannot. So a record fetched from a peer is kept for `ttl_s` only:
`expired()` names the fetched nodes older than that (or beyond `size`, or whose owner did not
answer), and the sampler forgets them before its next batch. A peer that does not answer
leaves its nodes missing for that batch (sampled as a single store without them would) and
is not asked again for `retry_s`; nothing fails because a peer is restarting.
"""
from __future__ import annotations

import logging
import time
from collections import OrderedDict
from typing import Callable, Protocol, Sequence

import numpy as np

from hirflow.state.graph import GraphReader
from hirflow.state.node import NodeState

log = logging.getLogger(__name__)

Raw = tuple[bytes | None, bytes | None]      # a node's packed record and knowledge vector


class PeerUnavailable(Exception):
    """A peer did not answer a read (refused, timed out, or answered with an error)."""


class Peers(Protocol):
    """Who owns a node, and how to read nodes from their owner."""
    index: int                                  # this worker

    def owner(self, node: str) -> int: ...

    def fetch(self, owner: int, ids: list[str]) -> list[Raw]:
        """`ids`' records and knowledge vectors as `owner` holds them, in order (None where
        it has none); raises `PeerUnavailable`."""
        ...


class RoutedReader:
    def __init__(self, local: GraphReader, peers: Peers, ttl_s: float = 30.0,
                 size: int = 50_000, retry_s: float = 5.0, chunk: int = 2_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.local, self.peers = local, peers
        self.ttl_s, self.size, self.retry_s, self.chunk, self.clock = ttl_s, size, retry_s, chunk, clock
        # fetched remote nodes, oldest fetch first: when, and the knowledge vector if any
        self._fetched: OrderedDict[str, tuple[float, np.ndarray | None]] = OrderedDict()
        self._failed: dict[str, None] = {}        # remote nodes read as missing: ask again
        self._down_until: dict[int, float] = {}   # owner -> when to ask it again
        self.reads = 0                            # remote nodes fetched
        self.failures = 0                         # remote nodes read as missing: owner down

    def _split(self, ids: Sequence[str]) -> tuple[list[int], dict[int, list[int]]]:
        """Positions of `ids` owned here, and of the others by owner."""
        local: list[int] = []
        remote: dict[int, list[int]] = {}
        owner, me = self.peers.owner, self.peers.index
        for i, n in enumerate(ids):
            o = owner(n)
            if o == me:
                local.append(i)
            else:
                remote.setdefault(o, []).append(i)
        return local, remote

    def states(self, node_ids: list[str]) -> list[NodeState | None]:
        out: list[NodeState | None] = [None] * len(node_ids)
        local, remote = self._split(node_ids)
        if local:
            for i, s in zip(local, self.local.states([node_ids[i] for i in local])):
                out[i] = s
        for owner, at in remote.items():
            raws = self._fetch(owner, [node_ids[i] for i in at])
            for i, (record, _) in zip(at, raws):
                out[i] = None if record is None else NodeState.unpack(record)
        return out

    def knowledge(self, node_ids: list[str]) -> dict[str, np.ndarray]:
        local, remote = self._split(node_ids)
        out = self.local.knowledge([node_ids[i] for i in local])
        for owner, at in remote.items():
            names = [node_ids[i] for i in at]
            unread = [n for n in names if n not in self._fetched and n not in self._failed]
            if unread:
                self._fetch(owner, unread)
            for n in names:
                got = self._fetched.get(n)
                if got is not None and got[1] is not None:
                    out[n] = got[1]
        return out

    def _fetch(self, owner: int, names: list[str]) -> list[Raw]:
        now = self.clock()
        if self._down_until.get(owner, 0.0) > now:
            return self._missing(names)
        raws: list[Raw] = []
        try:
            for lo in range(0, len(names), self.chunk):
                part = names[lo:lo + self.chunk]
                got = self.peers.fetch(owner, part)
                if len(got) != len(part):
                    raise PeerUnavailable(f"answered {len(got)} nodes for {len(part)}")
                raws.extend(got)
        except PeerUnavailable as exc:
            self._down_until[owner] = now + self.retry_s
            log.warning("worker %d did not answer a read of %d nodes (%s); sampling without "
                        "them, asking again in %.0f s", owner, len(names), exc, self.retry_s)
            return self._missing(names)
        self._down_until.pop(owner, None)
        self.reads += len(names)
        fetched = self._fetched
        for n, (_, vector) in zip(names, raws):
            fetched[n] = (now, None if vector is None else np.frombuffer(vector, np.float32))
            fetched.move_to_end(n)
        return raws

    def _missing(self, names: list[str]) -> list[Raw]:
        self.failures += len(names)
        self._failed.update(dict.fromkeys(names))
        return [(None, None)] * len(names)

    def expired(self) -> list[str]:
        """Remote nodes whose cached reads must be forgotten now: fetched more than `ttl_s`
        ago, beyond the `size` newest, or read as missing because their owner was down."""
        out = list(self._failed)
        self._failed.clear()
        fetched, oldest = self._fetched, self.clock() - self.ttl_s
        while fetched:
            n, (when, _) = next(iter(fetched.items()))
            if when > oldest and len(fetched) <= self.size:
                break
            fetched.popitem(last=False)
            out.append(n)
        return out
