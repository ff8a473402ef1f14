"""A Kafka client that is not hirflow's own feeds it and reads what it publishes.

aiokafka is a separate implementation of the protocol (pure Python, the one faust uses), so
this checks the claims the README makes to producers: JSON objects are accepted, the key is
the `src` node id, and the Java client's murmur2 partitioner (aiokafka's default) puts each
record on the partition whose state owns the node.
"""
import asyncio
import json

import msgpack
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from hirflow.state.events import Engagement
from hirflow.state.keys import partition_of
from hirflow.streams import changes, clients
from hirflow.streams.topics import Topics, ensure_topics
from tests.streams.kafka_helpers import assert_ingest_equals_direct

NOW = 1_767_225_600_000


def _events(n: int = 200) -> list[Engagement]:
    return [Engagement(f"user:{i % 37}", f"ad:{i % 11}", ("impression", "click")[i % 2], NOW + i)
            for i in range(n)]


async def _produce_json(bootstrap: str, topic: str, evs: list[Engagement]) -> list[int]:
    """JSON engagements keyed by src with aiokafka's default (murmur2) partitioner."""
    async with AIOKafkaProducer(bootstrap_servers=bootstrap) as p:
        sent = [await p.send_and_wait(topic, key=e.src.encode(), value=json.dumps(
            {"src": e.src, "dst": e.dst, "action": e.action, "ts": e.ts}).encode()) for e in evs]
    return [md.partition for md in sent]


def test_json_from_aiokafka_is_applied_on_the_partition_of_its_node(cfg, tmp_path):
    topics = Topics(cfg.kafka.topic_prefix)
    ensure_topics(cfg.kafka, topics)
    evs = _events()
    parts = asyncio.run(_produce_json(cfg.kafka.bootstrap, topics.engagements, evs))
    assert parts == [partition_of(e.src, cfg.kafka.partitions) for e in evs]
    assert_ingest_equals_direct(cfg, topics, evs, tmp_path)


def test_aiokafka_reads_token_changes_as_hirflow_writes_them(cfg):
    """A subscriber in another client decodes the msgpack token change (wire-formats.md)."""
    topics = Topics(cfg.kafka.topic_prefix)
    ensure_topics(cfg.kafka, topics)
    change = changes.TokenChange("user:7", "cold-start", 1, [3, 260], [3, 260], [], [-1], NOW, NOW + 5)
    p = clients.producer(cfg.kafka)
    p.produce(topics.token_changes, key=b"user:7", value=changes.encode(change))
    assert p.flush(30) == 0

    async def read_one():
        c = AIOKafkaConsumer(topics.token_changes, bootstrap_servers=cfg.kafka.bootstrap,
                             auto_offset_reset="earliest", enable_auto_commit=False)
        await c.start()
        try:
            return await asyncio.wait_for(c.getone(), 30)
        finally:
            await c.stop()

    msg = asyncio.run(read_one())
    assert msg.key == b"user:7"
    assert msgpack.unpackb(msg.value) == {"node": "user:7", "model": "cold-start", "seq": 1,
                                          "tokens": [3, 260], "added": [3, 260], "removed": [],
                                          "assign": [-1], "event_ts": NOW, "ts": NOW + 5}
