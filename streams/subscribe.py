"""Subscriber client for `hirflow.token-changes`: typed changes, deduplicated by (node, seq).

A refresh worker that crashed after writing a change but before Kafka acknowledged it sends
it again with the same seq and content; `Subscriber` drops anything at or below the highest
seq it has yielded for that node, so callers see each change once and in order per node.

    with Subscriber(cfg, group_id="ranker") as sub:
        for change in sub.changes(timeout=1.0):
            index.update(change.node, change.tokens)
"""
from __future__ import annotations

import logging
from typing import Iterator

import msgspec

from hirflow.streams import changes, clients
from hirflow.streams.config import HirflowConfig
from hirflow.streams.topics import Topics

log = logging.getLogger(__name__)


class Subscriber:
    def __init__(self, cfg: HirflowConfig, group_id: str = "hirflow-subscriber",
                 from_start: bool = True, commit: bool = True) -> None:
        self.topic = Topics(cfg.kafka.topic_prefix).token_changes
        self.consumer = clients.consumer(
            cfg.kafka, group_id, **{"auto.offset.reset": "earliest" if from_start else "latest",
                                    "enable.auto.commit": commit,
                                    "enable.auto.offset.store": True})
        self.consumer.subscribe([self.topic])
        self.last_seq: dict[str, int] = {}
        self.duplicates = 0
        self.invalid = 0

    def poll(self, timeout: float = 1.0, max_records: int = 1000) -> list[changes.TokenChange]:
        """New changes received within `timeout` (possibly none)."""
        out = []
        for m in self.consumer.consume(max_records, timeout=timeout):
            if m.error() is not None:
                log.warning("token-change consumer error: %s", m.error())
                continue
            try:
                c = changes.decode(m.value())
            except (msgspec.ValidationError, msgspec.DecodeError) as exc:
                self.invalid += 1
                log.warning("skipping an undecodable token change at %s[%d]@%d: %s",
                            m.topic(), m.partition(), m.offset(), exc)
                continue
            if c.seq <= self.last_seq.get(c.node, 0):
                self.duplicates += 1
                continue
            self.last_seq[c.node] = c.seq
            out.append(c)
        return out

    def changes(self, timeout: float = 1.0, idle_stop: float | None = None) -> Iterator[changes.TokenChange]:
        """Yield changes forever, or until nothing arrived for `idle_stop` seconds."""
        idle = 0.0
        while True:
            batch = self.poll(timeout)
            yield from batch
            idle = 0.0 if batch else idle + timeout
            if idle_stop is not None and idle >= idle_stop:
                return

    def close(self) -> None:
        self.consumer.close()

    def __enter__(self) -> "Subscriber":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
