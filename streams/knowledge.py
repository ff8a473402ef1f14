"""The knowledge agent: entity events (text, attributes, image embeddings) into state.

A faust agent, since `hirflow.entities` is low-volume and compacted. Each worker reads every
entity partition in its own group (like a global table) and keeps the nodes it owns; the
upsert keeps the newest `ts` per node, so a replay is harmless, and the offset is stored in
the same RocksDB batch as the entity.
"""
from __future__ import annotations

import asyncio
import logging

import faust

from streams.runtime import WorkerRuntime

log = logging.getLogger(__name__)


def register(app: faust.App, runtime: WorkerRuntime) -> None:
    topic = app.topic(runtime.topics.entities, key_serializer="raw", value_serializer="raw")

    @app.agent(topic, name="hirflow-knowledge")
    async def knowledge(stream):
        loop = asyncio.get_running_loop()
        async for event in stream.events():
            m = event.message
            ts = int(m.timestamp * 1000) if m.timestamp else 0
            await loop.run_in_executor(None, runtime.apply_entity, m.topic, m.partition,
                                       m.offset, m.key, m.value, ts)
