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
APPLIED_OFFSET = Gauge("hirflow_applied_offset", "Last offset whose effect is durable in state",
                       ["topic", "partition"], registry=REGISTRY)
BROKER_UP = Gauge("hirflow_broker_up", "1 while a Kafka client of this process reaches a broker "
                  "(librdkafka statistics), 0 through an outage", registry=REGISTRY)
TOPICS_REFUSED = Counter("hirflow_topics_refused_total", "Checks that found a consumed topic "
                         "recreated (another topic id than the state's): ingest stops",
                         registry=REGISTRY)
OUTBOX_RESENDS = Counter("hirflow_token_outbox_resends_total", "Token-change producers replaced "
                         "after acknowledgements did not come in time (the outbox produced again)",
                         registry=REGISTRY)
STATE_BYTES = Gauge("hirflow_state_bytes", "Estimated live bytes in RocksDB", registry=REGISTRY)
DIRTY_NODES = Gauge("hirflow_dirty_nodes", "Nodes waiting for a refresh", registry=REGISTRY)
CACHED_NODES = Gauge("hirflow_cached_nodes", "Node records in the write-back cache",
                     registry=REGISTRY)
EVICTED_EDGES = Gauge("hirflow_evicted_edges", "Edges evicted from bounded adjacency since start",
                      registry=REGISTRY)
NODES_EXPIRED = Counter("hirflow_nodes_expired_total",
                        "Idle nodes whose edges had all decayed, expired by the retention sweep",
                        registry=REGISTRY)

FRESHNESS = Histogram("hirflow_freshness_seconds",
                      "Event time of the oldest event behind a token change -> change emitted",
                      buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300),
                      registry=REGISTRY)
HISTORICAL_S = 86_400.0   # a change whose event is older than this is a replay of history,
                          # not a freshness: counted apart, kept out of the histogram
HISTORICAL_CHANGES = Counter("hirflow_token_changes_historical_total",
                             "Token changes from events older than a day when emitted (a replay "
                             "of historical data): kept out of hirflow_freshness_seconds",
                             registry=REGISTRY)
REFRESH_BATCH = Histogram("hirflow_refresh_batch_nodes", "Nodes per refresh micro-batch",
                          buckets=(1, 8, 32, 128, 256, 512, 1024, 4096), registry=REGISTRY)
REFRESH_SECONDS = Histogram("hirflow_refresh_batch_seconds",
                            "Encode + index write + emit per micro-batch (views sampled ahead)",
                            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
                            registry=REGISTRY)
VIEW_SAMPLE_SECONDS = Histogram("hirflow_view_sample_seconds",
                                "Store catch-up + view sampling per micro-batch, where it runs",
                                buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
                                registry=REGISTRY)
VIEW_WAIT_SECONDS = Histogram("hirflow_view_wait_seconds",
                              "Time the refresh thread waited for a micro-batch's views",
                              buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
                              registry=REGISTRY)
PEER_READS = Counter("hirflow_peer_reads_total",
                     "Nodes of other workers that view sampling asked their owners for: "
                     "read, or missing (the owner did not answer)", ["result"], registry=REGISTRY)
NEIGHBOR_REQUESTS = Counter("hirflow_neighbor_requests_total",
                            "Neighbour refresh requests for other workers' nodes: sent to their "
                            "owners, dropped (owner unreachable or far behind), received here",
                            ["direction"], registry=REGISTRY)
NODES_REFRESHED = Counter("hirflow_nodes_refreshed_total", "Nodes re-encoded", ["reason"],
                          registry=REGISTRY)
TOKEN_CHANGES = Counter("hirflow_token_changes_total", "Token changes acknowledged by Kafka",
                        registry=REGISTRY)
INDEX_NODES = Gauge("hirflow_index_nodes", "Nodes in the serving index generation",
                    registry=REGISTRY)
INDEX_GENERATION = Gauge("hirflow_index_generation", "Serving index generation", registry=REGISTRY)
INDEX_SWITCHES = Counter("hirflow_index_switches_total", "Index generations switched in",
                         registry=REGISTRY)
MODEL_INFO = Gauge("hirflow_model_info", "The model serving (value 1)", ["model"],
                   registry=REGISTRY)
MODEL_COLLAPSED = Gauge("hirflow_model_encoder_collapsed",
                        "1 when the serving model's encoder collapsed in training (its part "
                        "is not served: the collaborative block ranks)", ["model"], registry=REGISTRY)
SWAP_PROGRESS = Gauge("hirflow_hot_swap_progress",
                      "Fraction of nodes re-encoded for the checkpoint being swapped in "
                      "(1 when none is building)", registry=REGISTRY)
CHECKPOINTS_REFUSED = Counter("hirflow_checkpoints_refused_total",
                              "Announced checkpoints that failed verification or loading",
                              registry=REGISTRY)
PARTITIONS_OWNED = Gauge("hirflow_partitions_owned",
                         "Keyed partitions this worker owns (its share under the plan or worker.count)",
                         registry=REGISTRY)
RESTORED_CHANGES = Gauge("hirflow_changelog_restored_changes",
                         "Change-log records replayed at this start to restore the partitions it gained",
                         registry=REGISTRY)
SETTLE_SECONDS = Gauge("hirflow_changelog_settle_seconds",
                       "Time this start took to claim, restore and drop partitions through the change log",
                       registry=REGISTRY)
STANDBY_PARTITIONS = Gauge("hirflow_standby_partitions",
                           "Other workers' partitions this worker keeps standby copies of",
                           registry=REGISTRY)
STANDBY_LAG = Gauge("hirflow_standby_lag_records",
                    "Change-log records the standby copies have not read yet",
                    registry=REGISTRY)
STANDBY_APPLIED = Counter("hirflow_standby_applied_steps_total",
                          "Change-log commits and snapshots applied to the standby copies",
                          registry=REGISTRY)
PROMOTED_PARTITIONS = Gauge("hirflow_changelog_promoted_partitions",
                            "Partitions this start took over from their standby copies "
                            "(the others it gained were restored from the log)",
                            registry=REGISTRY)
NEIGHBOR_BACKLOG = Gauge("hirflow_neighbor_refresh_backlog",
                         "Neighbours queued for a budgeted refresh", registry=REGISTRY)


def exposition() -> bytes:
    """The text format Prometheus scrapes."""
    return generate_latest(REGISTRY)
