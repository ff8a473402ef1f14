"""Prometheus metrics of the worker (served on the worker's web port at /metrics)."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

REGISTRY = CollectorRegistry(auto_describe=True)

EVENTS_CONSUMED = Counter("hirflow_events_consumed_total", "Records read from Kafka",
                          ["topic"], registry=REGISTRY)
EVENTS_APPLIED = Counter("hirflow_events_applied_total", "Records applied to state",
                         ["topic"], registry=REGISTRY)
EVENTS_SKIPPED = Counter("hirflow_events_skipped_total",
                         "Records at or below the stored offset (replay after a crash)",
                         ["topic"], registry=REGISTRY)
EVENTS_DEAD = Counter("hirflow_events_dead_lettered_total", "Records sent to the dead-letter topic",
                      ["topic", "reason"], registry=REGISTRY)
REVERSE_SENT = Counter("hirflow_reverse_records_sent_total",
                       "Engagement sides forwarded to the worker that owns them", registry=REGISTRY)
BATCH_SECONDS = Histogram("hirflow_ingest_batch_seconds", "Apply + durable commit time per commit",
                          buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
                          registry=REGISTRY)
BATCH_SIZE = Histogram("hirflow_ingest_batch_records", "Records per consume call",
                       buckets=(1, 10, 100, 1000, 5000, 10000, 50000), registry=REGISTRY)
CONSUMER_LAG = Gauge("hirflow_consumer_lag", "High watermark minus position (clamped at 0; the "
                     "embedded broker reports the watermark short)", ["topic", "partition"],
                     registry=REGISTRY)
STATE_BYTES = Gauge("hirflow_state_bytes", "Estimated live bytes in RocksDB", registry=REGISTRY)
DIRTY_NODES = Gauge("hirflow_dirty_nodes", "Nodes waiting for a refresh", registry=REGISTRY)
CACHED_NODES = Gauge("hirflow_cached_nodes", "Node records in the write-back cache",
                     registry=REGISTRY)
EVICTED_EDGES = Gauge("hirflow_evicted_edges", "Edges evicted from bounded adjacency since start",
                      registry=REGISTRY)


def exposition() -> bytes:
    """The text format Prometheus scrapes."""
    return generate_latest(REGISTRY)
