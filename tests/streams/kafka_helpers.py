"""Helpers for integration tests against the embedded broker."""
from __future__ import annotations

import time

from confluent_kafka import Consumer, TopicPartition

from streams.config import HirflowConfig


def drain(cfg: HirflowConfig, topic: str, expect: int, timeout: float = 30.0) -> list:
    """Read `expect` messages from every partition of a topic (no group, assign from start)."""
    c = Consumer({"bootstrap.servers": cfg.kafka.bootstrap, "group.id": "test-drain",
                  "enable.auto.commit": False, "fetch.wait.max.ms": 10})
    meta = c.list_topics(topic, timeout=10)
    c.assign([TopicPartition(topic, p, 0) for p in meta.topics[topic].partitions])
    out = []
    deadline = time.monotonic() + timeout
    while len(out) < expect and time.monotonic() < deadline:
        for m in c.consume(1000, timeout=0.2):
            if m.error() is None:
                out.append(m)
    c.close()
    return out


def run_until(loop, predicate, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        loop.poll_once()
