"""Helpers for integration tests against the embedded broker."""
from __future__ import annotations

import time

from confluent_kafka import Consumer, KafkaError, TopicPartition

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
    from hirflow.streams.ingest.loop import IngestLoop
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
    """Records ever written to the topic, summed over its partitions (`end_offsets`)."""
    return sum(end_offsets(cfg, topic).values())


def end_offsets(cfg: HirflowConfig, topic: str) -> dict[int, int]:
    """Each partition's end offset, found by reading to its end. The embedded broker (tansu) reports a high
    watermark of the last record batch's *first* offset + 1, so a watermark alone can be a
    whole producer batch short of the end (Kafka reports the end itself); reading from
    `high - 1` to the partition's end gives the true end on both."""
    c = Consumer({"bootstrap.servers": cfg.kafka.bootstrap, "group.id": "test-watermarks",
                  "enable.auto.commit": False, "enable.partition.eof": True,
                  "fetch.wait.max.ms": 10})
    ends, todo = {}, []
    for p in range(cfg.kafka.partitions):
        _, high = c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
        ends[p] = high
        if high > 0:
            todo.append(TopicPartition(topic, p, high - 1))
    if todo:
        c.assign(todo)
        open_parts = {tp.partition for tp in todo}
        deadline = time.monotonic() + 30
        while open_parts:
            assert time.monotonic() < deadline, f"could not read {topic} to its end"
            for m in c.consume(10_000, timeout=0.5):
                if m.error() is None:
                    ends[m.partition()] = max(ends[m.partition()], m.offset() + 1)
                elif m.error().code() == KafkaError._PARTITION_EOF:
                    open_parts.discard(m.partition())
    c.close()
    return ends
