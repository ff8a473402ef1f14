"""Nodes waiting for a refresh, and the protocol by which the refresh thread claims them.

A node is dirty from the moment an event or entity touches it until a refresh has encoded a
state that includes it; its marker is the time of the oldest such event, so the token change
can say how fresh it is. Markers are durable (the ``dirty`` column family) and mirrored here.
Three threads share this queue, and every method takes its one lock:
- ingest `touch`es nodes as it applies engagements to memory, then makes the markers durable
  in the same RocksDB batch as the records (`commit_with`), which wakes the refresh thread;
- the entity agent does the same for entities (`touch_entity`, `commit_entities_with`);
- the refresh thread `claim`s nodes whose events are durable, and after encoding them deletes
  the markers of those not touched again meanwhile (`clear_settled`), in one critical section
  with the check, so no ingest commit can write a newer marker between the two.

Events may lead the clock (up to `schema.max_future_ms`), and a refresh samples as of now, so
an edge that starts in the future is not in a view yet. A node is claimed only once its
marker is current, and a node with an event still ahead (`defer`) is dirty again when that
event becomes current. The deferred times live in memory: after a restart such a node is
refreshed once, early, and then only when touched again.
"""
from __future__ import annotations

import threading
import time
from typing import Callable, Container, Mapping


class DirtyQueue:
    def __init__(self, durable: Mapping[str, int],
                 now_ms: Callable[[], int] = lambda: int(time.time() * 1000)) -> None:
        self._now_ms = now_ms
        self._future: dict[str, int] = {}    # node -> its newest event still ahead of the clock
        self._lock = threading.RLock()
        self._committed = threading.Condition(self._lock)
        self._marks: dict[str, int] = dict(durable)   # node -> oldest event not yet refreshed
        self._pending: dict[str, int] = {}   # ingest: oldest event applied, not committed
        self._new: dict[str, int] = {}       # markers for the next ingest commit
        self._entities: dict[str, int] = {}  # entity agent: markers for its next commit

    def __len__(self) -> int:
        return len(self._marks)

    def __contains__(self, node: str) -> bool:
        return node in self._marks

    def __getitem__(self, node: str) -> int:
        return self._marks[node]

    def _mark(self, node: str, ts: int) -> None:
        """Dirty as of `ts`, unless it already is as of an older event (lock held)."""
        old = self._marks.get(node)
        if old is None or ts < old:
            self._marks[node] = ts

    # -- writers ----------------------------------------------------------------------------
    def touch_many(self, touched: Mapping[str, int]) -> None:
        """Ingest applied events to these nodes in memory (not yet committed): node -> the
        time of its oldest such event."""
        with self._lock:
            pending, marks, new, entities = self._pending, self._marks, self._new, self._entities
            for node, ts in touched.items():
                p = pending.get(node)
                if p is None or ts < p:
                    pending[node] = ts
                old = marks.get(node)
                if old is None or ts < old:
                    marks[node] = new[node] = ts
                elif node in entities:
                    # the older marker is an uncommitted entity's: it may never become
                    # durable, so this commit writes it too
                    new[node] = old

    def defer(self, ahead: Mapping[str, int]) -> None:
        """These nodes have events ahead of the clock (node -> the newest): dirty again when
        it becomes current."""
        with self._lock:
            for node, ts in ahead.items():
                if ts > self._future.get(node, -1):
                    self._future[node] = ts

    def commit_with(self, write: Callable[[dict[str, int]], None]) -> None:
        """`write(markers)` durably writes ingest's pending records with these markers;
        afterwards their events are claimable, and a refresh waiting for work wakes up."""
        with self._lock:
            write(self._new)
            self._new, self._pending = {}, {}
            self._committed.notify_all()

    def touch_entity(self, node: str, ts: int) -> None:
        """The entity agent applied an entity of time `ts` to `node` (not yet committed)."""
        with self._lock:
            self._mark(node, ts)
            # always written with the entity: a marker pending on the ingest side may never
            # become durable if the worker dies first
            self._entities[node] = self._marks[node]

    def commit_entities_with(self, write: Callable[[dict[str, int]], None]) -> None:
        with self._lock:
            write(self._entities)
            self._entities = {}

    def drop_entities(self) -> None:
        """The entity markers of a failed entity commit: their nodes stay dirty in memory
        (a refresh costs little) but no longer wait for that commit."""
        with self._lock:
            self._entities = {}

    def mark_durably(self, markers: Mapping[str, int], write: Callable[[], None]) -> None:
        """`write()` makes these markers durable (with whatever else it writes: an expiry
        deletes the nodes' records); then they are claimable."""
        with self._lock:
            write()
            for n, ts in markers.items():
                self._mark(n, ts)

    def reset(self, durable: Mapping[str, int]) -> None:
        """Back to the durable markers: what was not committed is forgotten."""
        with self._lock:
            self._marks, self._pending, self._new, self._entities = dict(durable), {}, {}, {}
            self._future = {}

    # -- the refresh thread -----------------------------------------------------------------
    def wait_for_commit(self, timeout: float) -> None:
        with self._committed:
            self._committed.wait(timeout)

    def claim(self, limit: int) -> dict[str, int]:
        """Take up to `limit` dirty nodes (oldest marker first in insertion order) with
        durable events -> node: marker. The refresh reads committed state only, so it never
        encodes a state that a crash could still take back. A node with uncommitted events
        whose marker is older than those is claimed for its durable part and stays dirty,
        marked with its oldest uncommitted event (a hub touched between every two commits
        would otherwise wait until a commit window misses it); one whose every pending event
        is uncommitted, or whose entity is, waits for the commit."""
        with self._lock:
            now = self._now_ms()
            if self._future:
                for n, ts in [(n, ts) for n, ts in self._future.items() if ts <= now]:
                    del self._future[n]
                    self._mark(n, ts)
            out: dict[str, int] = {}
            again: dict[str, int] = {}
            for n, ts in self._marks.items():
                if n in self._entities or ts > now:      # not current yet: later
                    continue
                p = self._pending.get(n)
                if p is not None:
                    if ts >= p:
                        continue
                    again[n] = p
                out[n] = ts
                if len(out) >= limit:
                    break
            for n in out:
                del self._marks[n]
            self._marks.update(again)
            return out

    def unclaim(self, claimed: Mapping[str, int]) -> None:
        """Give claimed nodes back (a refresh failed before it committed)."""
        with self._lock:
            for n, ts in claimed.items():
                self._mark(n, ts)

    def clear_settled(self, claimed: Mapping[str, int], keep: Container[str],
                      commit: Callable[[list[str]], None]) -> None:
        """`commit(nodes)` deletes the durable markers of the claimed nodes not dirtied again
        since their claim and not in `keep` (claimed again by a batch in flight)."""
        with self._lock:
            commit([n for n in claimed if n not in self._marks and n not in keep])
