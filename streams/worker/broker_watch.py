"""Whether this process reaches the Kafka cluster: the `hirflow_broker_up` gauge and, through
an outage, one log line when it starts, one every `every_s` while it lasts and one when it ends
(the clients' own reconnect lines are held back by `logs.Repeats`).

Read from librdkafka's statistics, which each client hands over every `INTERVAL_MS` from its
poll: a client reaches the cluster when one of its brokers is in state UP. The process is up
while any client's latest statistics say so (a producer with nothing to send keeps no
connection open, so one client alone cannot tell); a client that stopped reporting (closed)
is forgotten after three intervals.
"""
from __future__ import annotations

import json
import logging
import threading
import time

from hirflow.streams.metrics import BROKER_UP

log = logging.getLogger(__name__)

INTERVAL_MS = 5_000


class BrokerWatch:
    def __init__(self, every_s: float = 30.0, clock=time.monotonic) -> None:
        self.every_s, self.clock = every_s, clock
        self._lock = threading.Lock()
        self._clients: dict[str, tuple[float, bool]] = {}    # client name -> (seen, up)
        self.down_since: float | None = None
        self._last_line = 0.0
        self.outages = 0
        BROKER_UP.set(1)                   # until a client's statistics say otherwise

    def stats(self, raw: str) -> None:
        """librdkafka's `stats_cb`: one client's statistics (JSON)."""
        try:
            doc = json.loads(raw)
            name = str(doc["name"])
            up = any(b.get("state") == "UP" for b in (doc.get("brokers") or {}).values())
        except (ValueError, KeyError, TypeError, AttributeError):
            return                          # not statistics this watch understands
        self.report(name, up)

    def report(self, client: str, up: bool) -> None:
        now = self.clock()
        with self._lock:
            self._clients[client] = (now, up)
            stale = now - 3 * INTERVAL_MS / 1000.0
            self._clients = {c: v for c, v in self._clients.items() if v[0] >= stale}
            self._update(now, any(u for _, u in self._clients.values()))

    @property
    def up(self) -> bool:
        return self.down_since is None

    def _update(self, now: float, up: bool) -> None:
        if up:
            if self.down_since is not None:
                log.info("Kafka reachable again after %.0f s", now - self.down_since)
                self.down_since = None
            BROKER_UP.set(1)
            return
        BROKER_UP.set(0)
        if self.down_since is None:
            self.down_since, self._last_line = now, now
            self.outages += 1
            log.warning("Kafka unreachable: no client of this process reaches a broker "
                        "(consuming and producing wait; nothing is lost)")
        elif now - self._last_line >= self.every_s:
            self._last_line = now
            log.warning("Kafka still unreachable after %.0f s", now - self.down_since)


WATCH = BrokerWatch()
