"""The knowledge agent: entity events (text, attributes, image embeddings) into state.

A faust agent, since `hirflow.entities` is low-volume and compacted. Each worker reads every
entity partition in its own group (like a global table) and keeps the nodes it owns; the
upsert keeps the newest `ts` per node, so a replay is harmless, and the offset is stored in
the same RocksDB batch as the entity. Texts become world-knowledge vectors (MiniLM, batched)
stored beside the entity.
"""
from __future__ import annotations

import asyncio
import logging

import faust

from hirflow.streams.runtime import WorkerRuntime

log = logging.getLogger(__name__)


def register(app: faust.App, runtime: WorkerRuntime) -> None:
    topic = app.topic(runtime.topics.entities, key_serializer="raw", value_serializer="raw")

    @app.agent(topic, name="hirflow-knowledge")
    async def knowledge(stream):
        loop = asyncio.get_running_loop()
        async for events in stream.take_events(256, within=0.2):   # texts encode in batches
            records = [(e.message.topic, e.message.partition, e.message.offset, e.message.key,
                        e.message.value, int(e.message.timestamp * 1000) if e.message.timestamp else 0)
                       for e in events]
            await loop.run_in_executor(None, runtime.apply_entities, records)
