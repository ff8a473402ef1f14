"""Helpers for integration tests against the embedded broker."""
from __future__ import annotations

import time

from confluent_kafka import Consumer, TopicPartition

from hirflow.streams.config import HirflowConfig


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


def committed_total(cfg: HirflowConfig, topic: str, group_id: str | None = None) -> int:
    """Offsets the ingest group has committed to Kafka, summed over the topic's partitions."""
    c = Consumer({"bootstrap.servers": cfg.kafka.bootstrap, "group.id": group_id or cfg.ingest.group_id})
    tps = c.committed([TopicPartition(topic, p) for p in range(cfg.kafka.partitions)], timeout=10)
    c.close()
    return sum(max(0, tp.offset) for tp in tps)


def assert_ingest_equals_direct(cfg: HirflowConfig, topics, expected, tmp_path) -> None:
    """Ingest what the topics hold into the config's store until `expected` engagements are
    applied; the state must equal applying `expected` directly to a fresh store."""
    from hirflow.state.graph import GraphStore
    from hirflow.state.writer import GraphWriter
    from hirflow.streams.ingest import IngestLoop
    from tests.state.helpers import apply_direct, assert_same_state, digest

    with GraphStore(cfg.graph.path, cfg.schema, cfg.kafka.partitions) as store:
        loop = IngestLoop(cfg, GraphWriter(store, cfg.graph), topics)
        run_until(loop, lambda: loop.applied >= len(expected))
        loop.close()
        via_kafka = digest(store)
    with GraphStore(tmp_path / "direct", cfg.schema, cfg.kafka.partitions) as store:
        apply_direct(store, expected, cfg.graph)
        assert_same_state(via_kafka, digest(store))


def end_total(cfg: HirflowConfig, topic: str) -> int:
    """The topic's high watermarks, summed over its partitions: records ever written."""
    c = Consumer({"bootstrap.servers": cfg.kafka.bootstrap, "group.id": "test-watermarks"})
    total = sum(c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                for p in range(cfg.kafka.partitions))
    c.close()
    return total
