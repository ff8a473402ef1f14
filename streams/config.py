"""The top-level config: one frozen dataclass per component, loaded defaults < file < env < CLI."""
from __future__ import annotations

from dataclasses import dataclass, field

from hirflow.encoder.quantizer_config import QuantizerConfig
from hirflow.encoder.shape import EncoderShape
from hirflow.state.config import load_config
from hirflow.state.graph import GraphConfig
from hirflow.state.schema import SchemaConfig
from hirflow.trainer.block_config import CollaborativeConfig
from hirflow.trainer.train_settings import RunSettings, TrainSettings


@dataclass(frozen=True)
class KafkaConfig:
    bootstrap: str = "127.0.0.1:9092"   # any Kafka cluster; `hirflow broker` serves this default
    topic_prefix: str = ""              # namespaces every topic (tests, several tenants)
    partitions: int = 8                 # node keys depend on it: fixed for a store's lifetime
    replication: int = 1                # 3 on a real cluster
    session_timeout_ms: int = 6000      # tansu joins a group in ~session/2: keep it short there
    linger_ms: int = 5                  # measured best latency on the embedded broker
    fetch_wait_max_ms: int = 10         # longest time the broker holds a fetch waiting for data
    max_message_bytes: int = 16 * 1024 * 1024   # the DLQ must carry oversized originals
    compression: str = "none"           # faust's aiokafka reads gzip without extras, not lz4
    client: dict[str, str] = field(default_factory=dict)   # extra librdkafka settings (SASL/SSL)

    def __post_init__(self) -> None:
        if self.partitions < 1:
            raise ValueError(f"partitions must be >= 1, got {self.partitions}")


@dataclass(frozen=True)
class IngestConfig:
    group_id: str = "hirflow-ingest"    # consumer group used for committed offsets
    batch_max: int = 10_000             # most messages per consume call
    batch_wait_ms: int = 5              # longest wait of a consume call: it returns when full
                                        # or at this timeout, and records wait in the client's
                                        # queue meanwhile, so this adds to freshness directly
    commit_interval_ms: int = 100       # state + offsets become durable this often

    def __post_init__(self) -> None:
        if self.batch_max < 1 or self.batch_wait_ms < 0 or self.commit_interval_ms < 0:
            raise ValueError("batch_max must be >= 1, batch_wait_ms and commit_interval_ms >= 0")


@dataclass(frozen=True)
class WorkerConfig:
    app_id: str = "hirflow"             # faust app id (its own consumer group for agents)
    index: int = 0                      # this worker's index among `count` (StatefulSet ordinal)
    count: int = 1                      # partitions p with p % count == index are this worker's
    web_host: str = "127.0.0.1"         # address of the HTTP endpoints (0.0.0.0 in a pod)
    web_port: int = 6066                # health, readiness and /metrics
    metrics_interval_s: float = 5.0     # how often gauges (lag, backlog, store size) are updated
    log_format: str = "text"            # text or json
    log_level: str = "INFO"             # DEBUG, INFO, WARNING, ERROR
    knowledge: bool = True              # encode entity texts into world-knowledge vectors
    query_threads: int = 4              # threads answering /v1 queries (off the event loop)
    query_queue: int = 64               # queries that may wait for a thread; more get 429
    api_token: str = ""                 # when set, /v1 needs "Authorization: Bearer <token>"
                                        # (set it from a Secret: HIRFLOW_WORKER__API_TOKEN)
    peer_url: str = ""                  # worker k's API base URL, {index} standing for k
                                        # (http://hirflow-{index}.hirflow-headless:6066): queries
                                        # about another worker's node are forwarded to it
                                        # ("": answered here, 404 for another worker's node)
                                        # and view sampling reads another worker's nodes
                                        # from it ("": views stop at those nodes)
    peer_cache_s: float = 30.0          # how long a node read from another worker is reused
                                        # by view sampling (its owner's changes show after that)
    changelog: bool = False             # log each owned partition's state changes to
                                        # hirflow.changelog before writing them, so that
                                        # `count` can change: a worker restores the partitions
                                        # it gains from the log and drops those it loses
    changelog_snapshot_s: float = 3600.0  # full snapshot of each changed partition this often
                                        # (a restore replays from the newest one)
    standby_replicas: int = 0           # warm copies of each partition kept by other workers
                                        # (following the change log in a store beside
                                        # graph.path): scaling in by up to this many workers
                                        # takes partitions over from a copy, not a replay

    def __post_init__(self) -> None:
        if not 0 <= self.index < self.count:
            raise ValueError(f"worker index {self.index} must be in [0, {self.count})")
        if self.log_format not in ("text", "json"):
            raise ValueError(f"log_format must be text or json, got {self.log_format!r}")
        if self.query_threads < 1 or self.query_queue < 0:
            raise ValueError("worker.query_threads must be >= 1 and query_queue >= 0")
        if self.changelog_snapshot_s <= 0 or self.peer_cache_s <= 0:
            raise ValueError("worker.changelog_snapshot_s and peer_cache_s must be > 0")
        if self.standby_replicas < 0:
            raise ValueError("worker.standby_replicas must be >= 0")
        if self.standby_replicas and not self.changelog:
            raise ValueError("worker.standby_replicas needs worker.changelog = true: standby "
                             "copies follow the change log")
        if self.peer_url and "{index}" not in self.peer_url:
            raise ValueError(f"worker.peer_url must hold {{index}} where the worker's index goes, "
                             f"got {self.peer_url!r}")


@dataclass(frozen=True)
class RefreshConfig:
    enabled: bool = True                # re-encode dirty nodes and publish token changes
    batch_max: int = 512                # nodes per micro-batch
    batch_wait_ms: int = 50             # longest wait for dirty nodes before a smaller batch
    neighbor_rate: float = 500.0        # neighbour refreshes per second (endpoints: always)
    neighbor_batch_max: int = 64        # most neighbours per micro-batch: what they add to its time
    neighbors_per_node: int = 4         # heaviest neighbours queued when a node's tokens move
    swap_rate: float = 5000.0           # background re-encodes per second during a hot swap
    checkpoint: str = ""                # checkpoint to serve at first start (else cold start)
    checkpoints_root: str = ""          # announced checkpoints must lie under this folder
                                        # ("": anywhere; the Helm chart sets its volume)
    allow_rollback: bool = False        # act on an announced checkpoint trained on older data
                                        # than the serving one (else it is refused)
    device: str = "auto"                # auto (CUDA when present), cpu, cuda
    cpu_threads: int = 1                # torch + faiss threads on CPU (0: one per core)
    sample_process: bool = True         # sample views in child processes (store followers)
    sample_processes: int = 0           # how many, each sampling part of every batch
                                        # (0: one per two available cores, 1 to 8)
    seed: int = 0                       # seed of the view sampler's random walks

    def __post_init__(self) -> None:
        if self.batch_max < 1 or self.batch_wait_ms < 0:
            raise ValueError("refresh.batch_max must be >= 1 and batch_wait_ms >= 0")
        if self.neighbor_rate < 0 or self.swap_rate <= 0 or self.neighbors_per_node < 0 \
                or self.neighbor_batch_max < 0:
            raise ValueError("refresh.neighbor_rate, neighbor_batch_max and neighbors_per_node "
                             "must be >= 0, swap_rate > 0")
        if self.cpu_threads < 0:
            raise ValueError("refresh.cpu_threads must be >= 0")
        if self.sample_processes < 0:
            raise ValueError("refresh.sample_processes must be >= 0 (0: from the cores available)")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"refresh.device must be auto, cpu or cuda, got {self.device!r}")


@dataclass(frozen=True)
class TrainSection(TrainSettings, RunSettings):
    """`hirflow train`: where and how often it runs, beside what it inherits from the trainer:
    the training settings (`TrainSettings`) and the run's split and inputs (`RunSettings`)."""
    out: str = "var/checkpoints"        # where checkpoints are written (then announced)
    window: str = ""                    # only data this long before the cutoff, e.g. 14d ("": all)
    every: str = ""                     # train periodically, e.g. 1h, each round continuing
                                        # the previous checkpoint ("": once)
    rounds: int | None = None           # with `every`: stop after this many rounds (unset: never)
    announce: bool = True               # announce each complete checkpoint on hirflow.checkpoints
    collaborative: CollaborativeConfig = field(default_factory=CollaborativeConfig)   # the
                                        # served embedding's collaborative block

    def __post_init__(self) -> None:
        TrainSettings.__post_init__(self)
        RunSettings.__post_init__(self)
        if self.rounds is not None and self.rounds < 1:
            raise ValueError(f"rounds must be >= 1 or unset, got {self.rounds}")


@dataclass(frozen=True)
class HirflowConfig:
    schema: SchemaConfig = field(default_factory=SchemaConfig)
    graph: GraphConfig = field(default_factory=GraphConfig)
    kafka: KafkaConfig = field(default_factory=KafkaConfig)
    ingest: IngestConfig = field(default_factory=IngestConfig)
    worker: WorkerConfig = field(default_factory=WorkerConfig)
    refresh: RefreshConfig = field(default_factory=RefreshConfig)
    train: TrainSection = field(default_factory=TrainSection)
    encoder: EncoderShape = field(default_factory=EncoderShape)
    quantizer: QuantizerConfig = field(default_factory=QuantizerConfig)


SECRET_PARTS = ("password", "secret", "token", "key.pem", "credentials", "jaas")


def masked_client(client: dict[str, str]) -> dict[str, str]:
    """librdkafka settings with the values of secret ones (SASL and key passwords, OAuth
    secrets, inline private keys) replaced by '***', for printing."""
    return {k: "***" if any(p in k.lower() for p in SECRET_PARTS) else v for k, v in client.items()}


def load(file=None, env=None, overrides=None) -> HirflowConfig:
    return load_config(HirflowConfig, file=file, env=env, overrides=overrides)
