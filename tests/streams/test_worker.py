"""The real worker process: kill -9 mid-stream loses nothing and applies nothing twice;
health, readiness, metrics and the entity agent answer."""
import json
import random
import time

from confluent_kafka import Consumer, TopicPartition

from state.events import Engagement, Entity, encode_entity
from state.graph import GraphStore
from streams import clients
from streams.replay import produce
from streams.synth import SynthConfig, SynthWorld
from streams.topics import Topics
from tests.state.helpers import apply_direct, assert_same_state, digest
from tests.streams.worker_proc import WorkerProcess


def committed_total(cfg, topic: str) -> int:
    c = Consumer({"bootstrap.servers": cfg.kafka.bootstrap, "group.id": cfg.ingest.group_id})
    tps = c.committed([TopicPartition(topic, p) for p in range(cfg.kafka.partitions)], timeout=10)
    c.close()
    return sum(max(0, tp.offset) for tp in tps)


def test_kill_9_at_random_moments_loses_nothing_and_applies_nothing_twice(cfg, tmp_path):
    world = SynthWorld(SynthConfig(events=30_000, users=300, advertisers=8, seed=11))
    items = list(world.stream())
    evs = [e for e in items if isinstance(e, Engagement)]
    produce(cfg, items, progress=False)
    rnd = random.Random(5)
    env = {"HIRFLOW_INGEST__BATCH_MAX": "700", "HIRFLOW_GRAPH__TOP_K": str(cfg.graph.top_k),
           "HIRFLOW_WORKER__KNOWLEDGE": "false"}      # restarts stay quick without MiniLM    # many commits, so kills land between and in them
    topic = Topics(cfg.kafka.topic_prefix).engagements
    for round_ in range(3):
        w = WorkerProcess(cfg, tmp_path / "worker.log", env).start()
        remaining = len(evs) - committed_total(cfg, topic)
        target = rnd.randint(300, max(400, remaining // 4))    # kill well before the end
        w.wait_metric("hirflow_events_applied_total", target)
        time.sleep(rnd.random() * 0.05)
        w.kill9()
    w = WorkerProcess(cfg, tmp_path / "worker.log", env).start()
    deadline = time.monotonic() + 90
    while committed_total(cfg, topic) < len(evs):
        assert time.monotonic() < deadline, "worker did not finish the stream"
        time.sleep(0.3)
    assert w.stop() == 0
    with GraphStore(cfg.graph.path, cfg.schema, cfg.kafka.partitions, create=False) as store:
        after_crashes = digest(store)
    with GraphStore(tmp_path / "direct", cfg.schema, cfg.kafka.partitions) as store:
        apply_direct(store, evs, cfg.graph)
        assert_same_state(after_crashes, digest(store))


def test_worker_endpoints_and_entity_agent(cfg, tmp_path):
    topics = Topics(cfg.kafka.topic_prefix)
    now = int(time.time() * 1000)
    p = clients.producer(cfg.kafka)
    p.produce(topics.entities, encode_entity(Entity("ad:7", now, "trail running shoes")), b"ad:7")
    p.produce(topics.entities, b"\x00junk", b"ad:8")
    p.produce(topics.engagements, json.dumps({"src": "user:1", "dst": "ad:7", "action": "click",
                                              "ts": now}).encode(), b"user:1")
    assert p.flush(30) == 0
    w = WorkerProcess(cfg, tmp_path / "worker.log").start()
    try:
        w.wait_metric("hirflow_events_applied_total", 2)      # 1 engagement + 1 entity
        deadline = time.monotonic() + 30
        while w.get("/ready")[0] != 200:
            assert time.monotonic() < deadline, w.get("/ready")
            time.sleep(0.2)
        status, body = w.get("/health")
        assert status == 200 and json.loads(body)["ok"]
        w.wait_metric("hirflow_events_dead_lettered_total", 1)
        m = w.metrics()
        for name in ("hirflow_events_consumed_total", "hirflow_ingest_batch_seconds_count",
                     "hirflow_state_bytes", "hirflow_dirty_nodes", "hirflow_consumer_lag"):
            assert name in m, name
    finally:
        assert w.stop() == 0
    with GraphStore(cfg.graph.path, cfg.schema, cfg.kafka.partitions, create=False) as store:
        assert store.reader.entity("ad:7").text == "trail running shoes"
        vec = store.reader.knowledge(["ad:7"])["ad:7"]             # MiniLM world knowledge
        assert vec.shape == (384,) and abs(float(vec @ vec) - 1.0) < 1e-3
        assert store.reader.entity("ad:8") is None
        assert {"user:1", "ad:7"} <= set(store.reader.dirty())
