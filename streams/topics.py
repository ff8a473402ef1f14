"""Topic names, partition counts and configs, and their idempotent creation."""
from __future__ import annotations

import logging
from dataclasses import dataclass

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import NewTopic

from hirflow.streams import clients
from hirflow.streams.config import KafkaConfig

log = logging.getLogger(__name__)

COMPACT = {"cleanup.policy": "compact"}   # tansu accepts it but does not compact (see README)
DELETE = {"cleanup.policy": "delete"}
# kept until deleted by hand: a restore replays it from its newest snapshot (a retention
# longer than a few `worker.changelog_snapshot_s` is safe too)
KEEP = {"cleanup.policy": "delete", "retention.ms": "-1"}


class TopicMismatchError(RuntimeError):
    """An existing topic does not match the config (its partition count)."""


@dataclass(frozen=True)
class Topics:
    prefix: str = ""

    def _n(self, name: str) -> str:
        return f"{self.prefix}{name}"

    @property
    def engagements(self) -> str:
        return self._n("hirflow.engagements")

    @property
    def reverse(self) -> str:
        return self._n("hirflow.engagements.reverse")

    @property
    def entities(self) -> str:
        return self._n("hirflow.entities")

    @property
    def dead_letter(self) -> str:
        return self._n("hirflow.dead-letter")

    @property
    def token_changes(self) -> str:
        return self._n("hirflow.token-changes")

    @property
    def changelog(self) -> str:
        return self._n("hirflow.changelog")

    @property
    def checkpoints(self) -> str:
        return self._n("hirflow.checkpoints")

    @property
    def plan(self) -> str:
        return self._n("hirflow.plan")

    def specs(self, cfg: KafkaConfig) -> dict[str, tuple[int, dict]]:
        """name -> (partitions, config). Keyed topics share the partition count, so a node's
        engagements, reverse records, entity and token changes all live on one partition."""
        p = cfg.partitions
        return {
            self.engagements: (p, DELETE),
            self.reverse: (p, DELETE),
            self.entities: (p, COMPACT),
            self.dead_letter: (1, DELETE),
            self.token_changes: (p, DELETE),
            self.checkpoints: (1, COMPACT),
            self.changelog: (p, KEEP),
            self.plan: (1, KEEP),           # `streams.scaleout.plan`: a few records, the newest counts
        }


def ensure_topics(cfg: KafkaConfig, topics: Topics, timeout: float = 30.0) -> dict[str, str]:
    """Create missing topics; existing ones are left alone but checked for partition count.

    Returns name -> "created" | "exists". Raises when an existing keyed topic has another
    partition count than the config (node keys and partition ownership depend on it).
    """
    admin = clients.admin(cfg)
    specs = topics.specs(cfg)
    futures = admin.create_topics(
        [NewTopic(name, n, cfg.replication, config=conf) for name, (n, conf) in specs.items()],
        operation_timeout=timeout, request_timeout=timeout)
    result = {}
    for name, fut in futures.items():
        try:
            fut.result(timeout)
            result[name] = "created"
            log.info("created topic %s", name)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise
            result[name] = "exists"
    meta = admin.list_topics(timeout=timeout)
    for name, (n, _) in specs.items():
        have = len(meta.topics[name].partitions) if name in meta.topics else 0
        if have and have != n and n > 1:
            raise TopicMismatchError(f"topic {name} has {have} partitions, config says {n}: "
                               "set kafka.partitions to match or use a new topic_prefix")
    return result
