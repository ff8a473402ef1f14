"""The dead-letter topic: bad records keep their original bytes, origin and reason.

Headers carry the reason and origin (topic, partition, offset, timestamp), after the
producer's own headers, so a person or a repair job can find and replay them. Sent before the batch's offsets are committed, so a
crash may duplicate a dead letter but never lose one.

A dead letter must fit the broker's message limit with its headers added (a record refused
for its size is often near the limit already): past `max_bytes` the value is cut to fit,
and headers give its original length and sha256; the full original stays at its origin
offset for the topic's retention.
"""
from __future__ import annotations

import hashlib
import logging
import time

from confluent_kafka import Message, Producer

from hirflow.streams import clients
from hirflow.streams.clients import produce_blocking
from hirflow.streams.metrics import EVENTS_DEAD

log = logging.getLogger(__name__)


HEADROOM = 4096      # bytes kept for the headers and the record's framing
MAX_KEY = 16 * 1024  # a longer key is cut (hirflow keys are node ids, at most ~260 bytes)


class DeadLetters:
    def __init__(self, producer: Producer, topic: str, max_bytes: int = 1_000_000) -> None:
        self.producer = producer
        self.topic = topic
        self.max_bytes = max_bytes
        self._last_log = 0.0
        self._unlogged = 0

    def send(self, msg: Message, reason: str, detail: str = "") -> None:
        self.send_raw(msg.topic(), msg.partition(), msg.offset(), msg.key(), msg.value(),
                      msg.timestamp()[1], reason, detail, msg.headers())

    def send_raw(self, topic: str, partition: int, offset: int, key: bytes | None,
                 value: bytes | None, timestamp: int, reason: str, detail: str = "",
                 original_headers=None) -> None:
        # the producer's own headers first, as they were (a trace id, a schema tag): what a
        # person or a repair job needs to replay the record as it came
        headers = [(k, v if v is not None else b"") for k, v in (original_headers or [])
                   if not k.startswith("hirflow.")]
        headers += [
            ("hirflow.reason", reason.encode()),
            ("hirflow.detail", detail[:500].encode("utf-8", "replace")),
            ("hirflow.origin.topic", topic.encode()),
            ("hirflow.origin.partition", str(partition).encode()),
            ("hirflow.origin.offset", str(offset).encode()),
            ("hirflow.origin.timestamp", str(timestamp).encode()),
        ]
        value = value or b""
        if key is not None and len(key) > MAX_KEY:
            headers.append(("hirflow.truncated.key_length", str(len(key)).encode()))
            key = key[:MAX_KEY]
        room = self.max_bytes - HEADROOM - len(key or b"")
        if len(value) > room:
            headers += [("hirflow.truncated.length", str(len(value)).encode()),
                        ("hirflow.truncated.sha256", hashlib.sha256(value).hexdigest().encode())]
            value = value[:max(0, room)]
        produce_blocking(self.producer, self.topic, value=value, key=key, headers=headers)
        EVENTS_DEAD.labels(topic, reason).inc()
        self._log(topic, partition, offset, reason, detail)

    def flush_log(self) -> None:
        """The end of a burst: how many dead letters no line has reported yet, once a second
        has passed since the last line (the ingest loop calls it at every commit)."""
        if self._unlogged and time.monotonic() - self._last_log >= 1.0:
            log.warning("dead-lettered %d more records since the last line", self._unlogged)
            self._last_log, self._unlogged = time.monotonic(), 0

    def _log(self, topic: str, partition: int, offset: int, reason: str, detail: str) -> None:
        """At most one line per second, so a flood of garbage cannot flood the log."""
        now = time.monotonic()
        if now - self._last_log >= 1.0:
            log.warning("dead-lettered %s[%d]@%d: %s %s (+%d more since last line)",
                        topic, partition, offset, reason, detail, self._unlogged)
            self._last_log, self._unlogged = now, 0
        else:
            self._unlogged += 1


class LazyDeadLetters:
    """Dead letters for a part of the worker that seldom has any (entity records, checkpoint
    announcements): its producer is built on the first one, so an idle part holds no
    connection."""

    def __init__(self, kafka, topic: str) -> None:
        self.kafka, self.topic = kafka, topic
        self._dead: DeadLetters | None = None

    def _letters(self) -> DeadLetters:
        if self._dead is None:
            self._dead = DeadLetters(clients.producer(self.kafka), self.topic,
                                     self.kafka.max_message_bytes)
        return self._dead

    def send(self, msg: Message, reason: str, detail: str = "") -> None:
        self._letters().send(msg, reason, detail)

    def send_raw(self, *args, **kwargs) -> None:
        self._letters().send_raw(*args, **kwargs)

    def flush(self, timeout_s: float) -> int:
        """-> how many dead letters are still unacknowledged after `timeout_s` (0 when none
        was ever sent)."""
        return 0 if self._dead is None else self._dead.producer.flush(timeout_s)


def parse_headers(headers) -> dict[str, str]:
    """Dead-letter headers as a dict (for consumers of the dead-letter topic)."""
    return {k: v.decode() for k, v in (headers or [])}
