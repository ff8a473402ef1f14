"""The dead-letter topic: bad records keep their original bytes, origin and reason.

Headers carry the reason and origin (topic, partition, offset, timestamp) so a person or a
repair job can find and replay them. Sent before the batch's offsets are committed, so a
crash may duplicate a dead letter but never lose one.
"""
from __future__ import annotations

import logging
import time

from confluent_kafka import Message, Producer

from hirflow.streams.clients import produce_blocking
from hirflow.streams.metrics import EVENTS_DEAD

log = logging.getLogger(__name__)


class DeadLetters:
    def __init__(self, producer: Producer, topic: str) -> None:
        self.producer = producer
        self.topic = topic
        self._last_log = 0.0
        self._unlogged = 0

    def send(self, msg: Message, reason: str, detail: str = "") -> None:
        self.send_raw(msg.topic(), msg.partition(), msg.offset(), msg.key(), msg.value(),
                      msg.timestamp()[1], reason, detail)

    def send_raw(self, topic: str, partition: int, offset: int, key: bytes | None,
                 value: bytes | None, timestamp: int, reason: str, detail: str = "") -> None:
        headers = [
            ("hirflow.reason", reason.encode()),
            ("hirflow.detail", detail[:500].encode("utf-8", "replace")),
            ("hirflow.origin.topic", topic.encode()),
            ("hirflow.origin.partition", str(partition).encode()),
            ("hirflow.origin.offset", str(offset).encode()),
            ("hirflow.origin.timestamp", str(timestamp).encode()),
        ]
        produce_blocking(self.producer, self.topic, value=value or b"", key=key, headers=headers)
        EVENTS_DEAD.labels(topic, reason).inc()
        self._log(topic, partition, offset, reason, detail)

    def _log(self, topic: str, partition: int, offset: int, reason: str, detail: str) -> None:
        """At most one line per second, so a flood of garbage cannot flood the log."""
        now = time.monotonic()
        if now - self._last_log >= 1.0:
            log.warning("dead-lettered %s[%d]@%d: %s %s (+%d more since last line)",
                        topic, partition, offset, reason, detail, self._unlogged)
            self._last_log, self._unlogged = now, 0
        else:
            self._unlogged += 1


def parse_headers(headers) -> dict[str, str]:
    """Dead-letter headers as a dict (for consumers of the dead-letter topic)."""
    return {k: v.decode() for k, v in (headers or [])}
