"""Token changes on their way to `hirflow.token-changes`.

A change enters the outbox in the same RocksDB batch as the record it describes (see
`streams.refresh`); this object produces it and, once the broker acknowledged it, deletes
its outbox entry. The acks are checked just before the next send (one batch later, so the
wait overlaps that batch's encoding) or when the loop is idle. After a crash the entries
still in the outbox are produced again with the same seq and bytes, never other content.
"""
from __future__ import annotations

import functools
import logging
import time

from hirflow.state.index import TokenIndex, delete_outbox
from hirflow.state.keys import KeyCodec
from hirflow.streams import changes, clients
from hirflow.streams.metrics import FRESHNESS, HISTORICAL_CHANGES, HISTORICAL_S, TOKEN_CHANGES

log = logging.getLogger(__name__)


class TokenOutbox:
    """Used by the refresh thread only."""

    def __init__(self, index: TokenIndex, keys: KeyCodec, producer, topic: str) -> None:
        self.index, self.keys, self.producer, self.topic = index, keys, producer, topic
        self._errors: list[str] = []
        self._unacked: list[bytes] = []          # outbox keys produced, acks not yet checked

    @property
    def unacknowledged(self) -> int:
        return len(self._unacked)

    def key(self, c: changes.TokenChange) -> bytes:
        """The change's outbox key: node key + seq, so entries of one node sort by seq."""
        return self.keys.key(c.node) + c.seq.to_bytes(8, "big")

    def send(self, items: list[changes.TokenChange], fresh: bool = True) -> None:
        """Produce changes already committed to the outbox. `fresh`: they come from events,
        so their latency counts in the freshness histogram."""
        self._produce([(self.key(c), changes.encode(c), c) for c in items], fresh)

    def resend_pending(self) -> None:
        """Produce what a previous run committed but never saw acknowledged, and wait."""
        pending = list(self.index.outbox())
        if pending:
            log.info("re-sending %d token changes that were not acknowledged before a restart",
                     len(pending))
            self._produce([(k, v, None) for k, v in pending], fresh=False)
            self.confirm()

    def _produce(self, items: list[tuple[bytes, bytes, changes.TokenChange | None]],
                 fresh: bool) -> None:
        if not items:
            return
        self.confirm()
        t = int(time.time() * 1000)
        for key, value, c in items:
            node = (c or changes.decode(value)).node
            ets = c.event_ts if fresh and c is not None else None
            clients.produce_blocking(self.producer, self.topic, value, key=node.encode(),
                                     on_delivery=functools.partial(self._on_delivery, ets, t))
        self._unacked += [k for k, _, _ in items]

    def _on_delivery(self, event_ts: int | None, produced_ms: int, err, msg) -> None:
        if err is not None:
            self._errors.append(str(err))
        elif event_ts is not None:     # from an event: event -> acknowledged by the broker
            acked = produced_ms + 1000 * (msg.latency() or 0.0)
            age = max(0.0, acked - event_ts) / 1000
            if age > HISTORICAL_S:        # event time from a replayed year, not a delay
                HISTORICAL_CHANGES.inc()
            else:
                FRESHNESS.observe(age)

    def confirm(self) -> None:
        """Wait for the acks of what was produced, then drop those outbox entries."""
        if not self._unacked:
            return
        if self.producer.flush(30) or self._errors:
            errs, self._errors = self._errors, []
            raise RuntimeError(f"token changes were not acknowledged: {errs[:3]}")
        delete_outbox(self.index, self._unacked)
        TOKEN_CHANGES.inc(len(self._unacked))
        self._unacked = []
