"""The entity path: entity events (text, attributes, image embeddings) into state, fed by the
knowledge agent.

A faust agent, since `hirflow.entities` is low-volume and compacted. Each worker reads every
entity partition in its own group (like a global table) and keeps the nodes it owns; the
upsert keeps the newest `ts` per node, so a replay is harmless, and the offset is stored in
the same RocksDB batch as the entity. Texts become world-knowledge vectors (MiniLM, batched)
stored beside the entity. A record that cannot be applied goes to the dead-letter topic with
its reason; a batch that cannot be committed makes the worker unhealthy, so that it restarts
and reads the batch again.
"""
from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

import faust

from hirflow.state.events import EventError, Validator
from hirflow.state.graph import GraphStore
from hirflow.state.writer import GraphWriter
from hirflow.streams.config import KafkaConfig
from hirflow.streams.ingest.deadletter import LazyDeadLetters
from hirflow.streams.metrics import EVENTS_APPLIED, EVENTS_CONSUMED, EVENTS_SKIPPED

if TYPE_CHECKING:
    from hirflow.streams.worker.runtime import WorkerRuntime

log = logging.getLogger(__name__)


def text_encoder(enabled: bool):
    """The MiniLM text encoder, or None when world knowledge is switched off."""
    if not enabled:
        return None
    from hirflow.encoder.knowledge import TextEncoder
    return TextEncoder()


class EntityApplier:
    """Applies entity records to the nodes this worker owns (in the agent's executor thread),
    under the writer's lock, with their offsets in the same commit."""

    def __init__(self, store: GraphStore, writer: GraphWriter, validator: Validator,
                 owned: frozenset[int], kafka: KafkaConfig, dead_letter_topic: str,
                 knowledge: bool) -> None:
        self.store, self.writer, self.validator, self.owned = store, writer, validator, owned
        self.error: BaseException | None = None   # a batch that failed to commit
        self._dead = LazyDeadLetters(kafka, dead_letter_topic)
        self.text_encoder = text_encoder(knowledge)

    def apply(self, records: list[tuple[str, int, int, bytes | None, bytes | None, int]]) -> list[str]:
        """Apply a batch of entity records (topic, partition, offset, key, value, timestamp);
        texts are encoded in one batch. Returns per record "applied", "skipped", "foreign" or
        the dead-letter reason."""
        outcomes: list[str] = []
        fresh = []
        offsets: dict[tuple[str, int], int] = {}
        with self.writer.lock:
            for topic, partition, offset, key, value, timestamp in records:
                if offset <= self.writer.stored_offset(topic, partition):
                    EVENTS_SKIPPED.labels(topic).inc()
                    outcomes.append("skipped")
                    continue
                EVENTS_CONSUMED.labels(topic).inc()
                try:
                    ent = self.validator.decode_entity(value)
                    if self.store.keys.partition(ent.node) not in self.owned:
                        outcomes.append("foreign")    # another worker owns this node's range
                    elif self.writer.entities.upsert(ent):
                        fresh.append(ent)
                        outcomes.append("applied")
                        EVENTS_APPLIED.labels(topic).inc()
                    else:
                        outcomes.append("applied")    # older than what is stored: no-op
                except Exception as exc:      # a hostile record must not stop the agent
                    reason, detail = (exc.reason, exc.detail) if isinstance(exc, EventError) \
                        else ("bad_entity", f"{type(exc).__name__}: {exc}"[:1000])
                    outcomes.append(reason)
                    self._dead.send_raw(topic, partition, offset, key, value, timestamp,
                                        reason, detail)
                offsets[(topic, partition)] = offset
            try:
                self._encode_texts([e for e in fresh if e.text])
                if self._dead.flush(30):
                    raise RuntimeError("dead letters for entities were not acknowledged")
                self.writer.entities.commit(offsets)
            except Exception as exc:
                # nothing of this batch is durable, its offsets included: the worker reports
                # unhealthy and restarts, and reads the batch again
                self.writer.entities.discard()
                self.error = exc
                log.exception("entity batch failed; the worker restarts to read it again")
                raise
        return outcomes

    def _encode_texts(self, ents: list) -> None:
        """World-knowledge vectors of these entities' texts, stored with the next commit. A
        failure of the text encoder costs the vectors, not the entities."""
        if not ents or self.text_encoder is None:
            return
        try:
            vectors = self.text_encoder.encode([e.text for e in ents])
        except Exception:
            log.exception("text encoding failed for %d entities; stored without vectors", len(ents))
            return
        for ent, vec in zip(ents, vectors):
            self.writer.entities.set_knowledge(ent.node, vec)

    def close(self) -> None:
        self._dead.flush(10)


def register(app: faust.App, runtime: WorkerRuntime) -> None:
    topic = app.topic(runtime.topics.entities, key_serializer="raw", value_serializer="raw")

    @app.agent(topic, name="hirflow-knowledge")
    async def knowledge(stream):
        loop = asyncio.get_running_loop()
        async for events in stream.take_events(256, within=0.2):   # texts encode in batches
            records = [(e.message.topic, e.message.partition, e.message.offset, e.message.key,
                        e.message.value, int(e.message.timestamp * 1000) if e.message.timestamp else 0)
                       for e in events]
            await loop.run_in_executor(None, runtime.entities.apply, records)
