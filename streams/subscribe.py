"""Subscriber client for `hirflow.token-changes`: typed changes, deduplicated by (node, seq).

A refresh worker that crashed after writing a change but before Kafka acknowledged it sends
it again with the same seq and content; `Subscriber` drops anything at or below the highest
seq it has yielded for that node, so callers see each change once and in order per node
(it remembers the last `dedup_nodes` nodes it saw: resends come soon after the original).

At least once: the group's offsets cover a batch only once the caller asks for the next one
(`poll` again, or the next item of `changes`), so a caller that crashes while handling a
change gets it again after a restart (dedup state is per process: handle changes
idempotently, e.g. by (node, seq)).

    with Subscriber(cfg, group_id="ranker") as sub:
        for change in sub.changes(timeout=1.0):
            index.update(change.node, change.tokens)
"""
from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Iterator

import msgspec
from confluent_kafka import TopicPartition

from hirflow.streams import changes, clients
from hirflow.streams.config import HirflowConfig
from hirflow.streams.topics import Topics

log = logging.getLogger(__name__)


class Subscriber:
    def __init__(self, cfg: HirflowConfig, group_id: str = "hirflow-subscriber",
                 from_start: bool = True, commit: bool = True, dedup_nodes: int = 1_000_000) -> None:
        self.topic = Topics(cfg.kafka.topic_prefix).token_changes
        self.commits = commit
        self.consumer = clients.consumer(
            cfg.kafka, group_id, **{"auto.offset.reset": "earliest" if from_start else "latest",
                                    "enable.auto.commit": commit,      # commits stored offsets
                                    "enable.auto.offset.store": False})  # stored when handled
        self.consumer.subscribe([self.topic])
        self.last_seq: OrderedDict[str, int] = OrderedDict()
        self.dedup_nodes = dedup_nodes
        self.duplicates = 0
        self.invalid = 0
        self._handed: dict[tuple[str, int], int] = {}   # offsets of the last batch handed out

    def _store_handed(self) -> None:
        """The caller asked for more: what it was handed before is handled."""
        if self._handed and self.commits:
            self.consumer.store_offsets(offsets=[TopicPartition(t, p, o + 1)
                                                 for (t, p), o in self._handed.items()])
        self._handed = {}

    def poll(self, timeout: float = 1.0, max_records: int = 1000) -> list[changes.TokenChange]:
        """New changes received within `timeout` (possibly none); asking again marks the
        previous batch handled."""
        self._store_handed()
        out = []
        for m in self.consumer.consume(max_records, timeout=timeout):
            if m.error() is not None:
                log.warning("token-change consumer error: %s", m.error())
                continue
            self._handed[(m.topic(), m.partition())] = m.offset()
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
            self.last_seq.move_to_end(c.node)
            if len(self.last_seq) > self.dedup_nodes:
                self.last_seq.popitem(last=False)
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
        """Leave the group; what was handed out is not marked handled (at least once)."""
        self.consumer.close()

    def __enter__(self) -> "Subscriber":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
