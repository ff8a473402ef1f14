"""Freshness as a token-change subscriber sees it, over a sliding window and since start.

A change is an *endpoint* change when its node was touched by an event (an engagement's
endpoint, an entity record) stamped exactly its `event_ts` (the node's oldest pending event)
and is the first change for that (node, event time); other changes are neighbour refreshes
(paced by `refresh.neighbor_rate`, carrying the event time of the node whose move queued
them) or a hot swap's re-announcements. Endpoint freshness is what the worker promises.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Iterable, Iterator

import numpy as np


def touched_keys(item) -> tuple[tuple[str, int], ...]:
    """The (node, event time) pairs an event touches: both ends of an engagement, the node
    of an entity record."""
    if hasattr(item, "src"):
        return (item.src, item.ts), (item.dst, item.ts)
    return ((item.node, item.ts),)


def endpoint_flags(changes: Iterable[tuple[str, int]], touched: set[tuple[str, int]]) -> np.ndarray:
    """Per (node, event_ts) of the changes in arrival order: is it an endpoint change (the
    first change for a touched pair)?"""
    keys = list(changes)
    seen: set[tuple[str, int]] = set()
    out = np.zeros(len(keys), bool)
    for i, key in enumerate(keys):
        if key in touched and key not in seen:
            out[i] = True
            seen.add(key)
    return out


@dataclass(frozen=True)
class Quantiles:
    count: int
    p50_ms: float
    p99_ms: float

    def __str__(self) -> str:
        if not self.count:
            return "    -     -"
        return f"{self.p50_ms:5.0f} {self.p99_ms:5.0f}"


class FreshnessWatch:
    """Records produced events and received changes; answers quantiles per time window.

    Thread-safe: the producer thread calls `touched`, the subscriber thread `received`, the
    display thread `window` / `since_start`."""

    def __init__(self, keep_s: float = 600.0) -> None:
        self._touched: set[tuple[str, int]] = set()
        self._seen: set[tuple[str, int]] = set()
        # (receive time s, latency ms, endpoint?) per change, the last `keep_s` seconds
        self._changes: deque[tuple[float, float, bool]] = deque()
        self._keep_s = keep_s
        self._all_endpoint: list[float] = []    # since start (endpoint changes only)
        self.history: list[tuple[float, float, bool]] = []   # every change, for the plot
        self.produced = 0                          # items passed through `touched`
        self._pruned_s = time.time()
        self._lock = threading.Lock()

    def touched(self, items: Iterable) -> Iterator:
        """Pass-through for the produced stream: remembers which (node, ts) each event touches."""
        for it in items:
            self.produced += 1
            with self._lock:
                self._touched.update(touched_keys(it))
            yield it

    def received(self, changes: Iterable, now_s: float | None = None) -> None:
        now_s = time.time() if now_s is None else now_s
        with self._lock:
            for c in changes:
                key = (c.node, c.event_ts)
                endpoint = key in self._touched and key not in self._seen
                if endpoint:
                    self._seen.add(key)
                    self._touched.discard(key)
                lat = now_s * 1000 - c.event_ts
                self._changes.append((now_s, lat, endpoint))
                self.history.append((now_s, lat, endpoint))
                if endpoint:
                    self._all_endpoint.append(lat)
            while self._changes and self._changes[0][0] < now_s - self._keep_s:
                self._changes.popleft()
            if now_s - self._pruned_s > 10:     # events older than the window never count again
                horizon = (now_s - self._keep_s) * 1000
                self._touched = {k for k in self._touched if k[1] >= horizon}
                self._seen = {k for k in self._seen if k[1] >= horizon}
                self._pruned_s = now_s

    def window(self, seconds: float, endpoint_only: bool = True,
               now_s: float | None = None) -> Quantiles:
        """Quantiles of the changes received in the last `seconds`."""
        now_s = time.time() if now_s is None else now_s
        with self._lock:
            lat = [x for t, x, e in self._changes
                   if t >= now_s - seconds and (e or not endpoint_only)]
        return _quantiles(lat)

    def since_start(self) -> Quantiles:
        with self._lock:
            return _quantiles(list(self._all_endpoint))


def _quantiles(lat: list[float]) -> Quantiles:
    if not lat:
        return Quantiles(0, float("nan"), float("nan"))
    a = np.asarray(lat)
    return Quantiles(len(a), float(np.percentile(a, 50)), float(np.percentile(a, 99)))
