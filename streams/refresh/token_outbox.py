"""Token changes on their way to `hirflow.token-changes`.

A change enters the outbox in the same RocksDB batch as the record it describes (see
`streams.refresh.loop`); this object produces it and, once the broker acknowledged it, deletes
its outbox entry. The acks are checked just before the next send (one batch later, so the
wait overlaps that batch's encoding) or when the loop is idle. After a crash the entries
still in the outbox are produced again with the same seq and bytes, never other content.

Acknowledgements that do not come within `ACK_DEADLINE_S` (a broker that is away, or one that
came back without the idempotent producer's state and never answers it) never stop the
refresh: the producer is replaced by a new one, which produces every entry still in the
outbox again (at least once, as after a crash; subscribers keep the highest seq), and the
entries stay until a producer's acknowledgement removes them.
"""
from __future__ import annotations

import functools
import logging
import time

from hirflow.state.index import TokenIndex, delete_outbox
from hirflow.state.keys import KeyCodec
from hirflow.streams import changes, clients
from hirflow.streams.metrics import (FRESHNESS, HISTORICAL_CHANGES, HISTORICAL_S, OUTBOX_RESENDS,
                                     TOKEN_CHANGES)

log = logging.getLogger(__name__)

ACK_DEADLINE_S = 10.0


class TokenOutbox:
    """Used by the refresh thread only."""

    def __init__(self, index: TokenIndex, keys: KeyCodec, make_producer, topic: str) -> None:
        self.index, self.keys, self.topic = index, keys, topic
        self._make_producer = make_producer
        self.producer = make_producer()
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
        self._send(items, fresh)

    def _send(self, items: list[tuple[bytes, bytes, changes.TokenChange | None]],
              fresh: bool) -> None:
        """Produce (outbox key, value, change or None), keyed by node; acks checked later."""
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

    def confirm(self, replace: bool = True) -> bool:
        """Wait for the acks of what was produced, then drop those outbox entries. -> False
        when they did not all come within `ACK_DEADLINE_S`: with `replace`, a new producer
        is re-sending the whole outbox, checked at the next call (else the entries wait for
        the next start)."""
        if not self._unacked:
            return True
        left = self.producer.flush(ACK_DEADLINE_S)
        if left or self._errors:
            errs, self._errors = self._errors, []
            why = f"{left} unacknowledged after {ACK_DEADLINE_S:g} s" if left \
                else f"delivery failed: {errs[:3]}"
            if replace:
                self._replace_producer(why)
            else:
                log.warning("token changes: %s; they are sent again at the next start", why)
            return False
        delete_outbox(self.index, self._unacked)
        TOKEN_CHANGES.inc(len(self._unacked))
        self._unacked = []
        return True

    def _replace_producer(self, why: str) -> None:
        """Drop the producer (and what it still queues) for a new one that produces every
        entry of the outbox again."""
        OUTBOX_RESENDS.inc()
        try:
            self.producer.purge()
        except Exception as exc:             # a producer in a fatal state: dropped anyway
            log.debug("purging the old producer failed: %s", exc)
        self.producer = self._make_producer()
        pending = list(self.index.outbox())
        log.warning("token changes: %s; a new producer re-sends the %d changes of the outbox",
                    why, len(pending))
        self._unacked = []
        self._send([(k, v, None) for k, v in pending], fresh=False)
