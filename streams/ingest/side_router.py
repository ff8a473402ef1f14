"""The sides of an engagement that another worker owns: forwarded on the reverse topic, and
applied at most once when they arrive (`streams.ingest.reverse_record` is the record).

The source side of an engagement lives on the partition its key (the source node) hashes
to; the destination side on the destination's. The worker that consumes the engagement
applies the sides it owns and forwards the others, keyed by their node, to the reverse
partition that owns them. Forwarded records are acknowledged before the batch that consumed
the engagement commits (`await_sends`), so a crash never loses a side.

At most once: per (reverse partition, origin partition) the receiver keeps a mark, the
position of the newest side it applied, `origin offset * 4 + side`. Sides from one origin
partition arrive in its offset order (one producer, idempotent), source before destination
for one engagement, so a record at or below the mark is a replay.
"""
from __future__ import annotations

from confluent_kafka import Producer

from hirflow.state.events import Engagement, EventError, Validator
from hirflow.state.writer import DST_SIDE, SRC_SIDE, GraphWriter
from hirflow.streams import clients
from hirflow.streams.ingest.deadletter import DeadLetters
from hirflow.streams.metrics import EVENTS_SKIPPED, REVERSE_SENT
from hirflow.streams.ingest.reverse_record import ReverseRecord


class DeliveryError(RuntimeError):
    """A dead letter or reverse record was not acknowledged: the batch must not commit."""


def mark_of(origin_offset: int, side: int) -> int:
    return origin_offset * 4 + side


class SideRouter:
    """Used by the ingest thread only. Also owns the acknowledgement of everything the
    ingest producer sends (dead letters included)."""

    def __init__(self, writer: GraphWriter, producer: Producer, reverse_topic: str,
                 owned: frozenset[int], validator: Validator, dead: DeadLetters) -> None:
        self.writer, self.producer, self.topic = writer, producer, reverse_topic
        self.owned, self.validator, self.dead = owned, validator, dead
        self._partition_of = writer.store.keys.partition
        self._sent = 0
        self._errors: list[str] = []

    def on_delivery(self, err, msg) -> None:
        if err is not None:
            self._errors.append(f"{msg.topic()}: {err}")

    def route(self, ev: Engagement, p: int, off: int) -> int:
        """Sides this worker applies; the others go to the reverse topic keyed by that node."""
        sides = 0
        for side, node in ((SRC_SIDE, ev.src), (DST_SIDE, ev.dst)):
            q = self._partition_of(node)
            if q in self.owned:
                sides |= side
            else:
                clients.produce_blocking(self.producer, self.topic,
                                         value=ReverseRecord(ev, side, p, off).encode(),
                                         key=node.encode(), partition=q)
                self._sent += 1
                REVERSE_SENT.inc()
        return sides

    def receive(self, m, q: int) -> tuple[Engagement, int] | None:
        """A forwarded side -> (engagement, side) to apply, or None: a replay, or a bad
        record (sent to the dead-letter topic with its reason)."""
        try:
            ev, side, op, oo = ReverseRecord.decode(m.value(), self.validator)
        except EventError as exc:
            self.dead.send(m, exc.reason, exc.detail)
            return None
        except Exception as exc:         # whatever a hostile record does, it must not stop ingest
            self.dead.send(m, "bad_reverse_record", f"{type(exc).__name__}: {exc}"[:1000])
            return None
        mark = mark_of(oo, side)
        if mark <= self.writer.reverse_mark(q, op):
            EVENTS_SKIPPED.labels(m.topic()).inc()
            return None
        self.writer.reverse_applied(q, op, mark)
        return ev, side

    def await_sends(self) -> None:
        """Wait until everything produced is acknowledged; DeliveryError otherwise."""
        if self._sent or len(self.producer):
            remaining = self.producer.flush(30)
            if remaining:
                raise DeliveryError(f"{remaining} dead-letter/reverse records unacknowledged")
        self._sent = 0
        if self._errors:
            errors, self._errors = self._errors, []
            raise DeliveryError(f"delivery failed: {errors[:3]}")
