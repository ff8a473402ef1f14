"""confluent-kafka client settings in one place: producers, consumers, admin clients, and the
connection settings handed to the trainer (which builds its own clients from them: it does
not depend on this package)."""
from __future__ import annotations

import logging
import time

from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka.admin import AdminClient

from hirflow.streams.worker.broker_watch import INTERVAL_MS, WATCH
from hirflow.streams.config import KafkaConfig

# librdkafka's own log lines (connection refused, metadata errors) go through `logging`, so the
# JSON format holds and `logs.setup` rate-limits their repeats during an outage
KAFKA_LOG = logging.getLogger("hirflow.kafka")
# each client's statistics tell `broker_watch` whether it reaches a broker
WATCHED = {"stats_cb": WATCH.stats, "statistics.interval.ms": INTERVAL_MS}


def connection(cfg: KafkaConfig) -> dict:
    """Where the cluster is and how to authenticate (`kafka.client`: SASL, TLS)."""
    return {"bootstrap.servers": cfg.bootstrap, **cfg.client}


def admin(cfg: KafkaConfig) -> AdminClient:
    return AdminClient({**connection(cfg), "logger": KAFKA_LOG})


def wait_for_cluster(cfg: KafkaConfig, probe_s: float = 5.0) -> float:
    """Block until the cluster answers a metadata request (a worker started before its
    broker); while it does not, `broker_watch` logs the outage (one line when it starts, one
    every 30 s). -> the seconds waited."""
    client, t0 = admin(cfg), time.monotonic()
    while True:
        try:
            client.list_topics(timeout=probe_s)
        except KafkaException:
            WATCH.report("startup", False)
            continue
        WATCH.report("startup", True)
        return time.monotonic() - t0


def producer(cfg: KafkaConfig, **extra) -> Producer:
    """Idempotent, keyed by node id with Kafka's default murmur2 partitioner."""
    conf = {
        "bootstrap.servers": cfg.bootstrap,
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": cfg.linger_ms,
        "partitioner": "murmur2_random",
        "queue.buffering.max.messages": 1_000_000,
        "message.max.bytes": cfg.max_message_bytes,
        "compression.type": cfg.compression,
        "logger": KAFKA_LOG,
        **WATCHED,
        **cfg.client,
        **extra,
    }
    return Producer(conf)


def consumer(cfg: KafkaConfig, group_id: str, **extra) -> Consumer:
    """Manual offsets: nothing is committed to Kafka before the state that reflects it."""
    conf = {
        "bootstrap.servers": cfg.bootstrap,
        "group.id": group_id,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        "session.timeout.ms": cfg.session_timeout_ms,
        "heartbeat.interval.ms": max(500, cfg.session_timeout_ms // 6),
        "fetch.wait.max.ms": cfg.fetch_wait_max_ms,
        "fetch.max.bytes": max(52_428_800, cfg.max_message_bytes * 2),
        "max.partition.fetch.bytes": max(1_048_576, cfg.max_message_bytes),
        "logger": KAFKA_LOG,
        **WATCHED,
        **cfg.client,
        **extra,
    }
    return Consumer(conf)


def produce_blocking(p: Producer, topic: str, value: bytes, key: bytes | None = None, **kw) -> None:
    """produce() that waits for queue room instead of raising BufferError."""
    while True:
        try:
            p.produce(topic, value=value, key=key, **kw)
            return
        except BufferError:
            p.poll(0.05)
