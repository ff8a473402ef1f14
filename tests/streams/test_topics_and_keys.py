from confluent_kafka.admin import AdminClient

from hirflow.state.keys import partition_of
from hirflow.streams import clients
from hirflow.streams.topics import Topics, ensure_topics


def test_topics_are_created_once_and_idempotently(cfg):
    topics = Topics(cfg.kafka.topic_prefix)
    assert set(ensure_topics(cfg.kafka, topics).values()) == {"exists"}   # fixture created them
    meta = AdminClient({"bootstrap.servers": cfg.kafka.bootstrap}).list_topics(timeout=10)
    assert len(meta.topics[topics.engagements].partitions) == cfg.kafka.partitions
    assert len(meta.topics[topics.dead_letter].partitions) == 1


def test_state_partition_matches_the_producers_partitioner(cfg):
    """Node keys must name the partition librdkafka's murmur2_random picks for the node id."""
    topics = Topics(cfg.kafka.topic_prefix)
    got = {}
    p = clients.producer(cfg.kafka, on_delivery=lambda err, m: got.__setitem__(m.key().decode(), m.partition()))
    ids = [f"user:{i}" for i in range(200)] + ["ad:981", "advertiser:x", "product:ü"]
    for n in ids:
        p.produce(topics.engagements, value=b"x", key=n.encode())
    assert p.flush(30) == 0
    assert got == {n: partition_of(n, cfg.kafka.partitions) for n in ids}


def test_a_recreated_topic_is_refused_not_silently_skipped(cfg, tmp_path):
    """Offsets stored for a topic mean nothing for a new topic of the same name: the worker
    refuses to start on them and says what to do."""
    import pytest

    from hirflow.state.graph import GraphStore, IncompatibleStoreError
    from hirflow.streams import clients
    from hirflow.streams.ingest.topic_identity import check_topic_identity
    from hirflow.streams.topics import Topics, ensure_topics
    topics = Topics(cfg.kafka.topic_prefix)
    with GraphStore(tmp_path / "s", cfg.schema, cfg.kafka.partitions) as store:
        check_topic_identity(store, cfg.kafka, [topics.engagements])
        check_topic_identity(store, cfg.kafka, [topics.engagements])     # same topic: fine
        assert set(store.topic_ids()) == {topics.engagements}
        admin = clients.admin(cfg.kafka)
        admin.delete_topics([topics.engagements])[topics.engagements].result()
        ensure_topics(cfg.kafka, topics)
        with pytest.raises(IncompatibleStoreError, match="deleted and created again"):
            check_topic_identity(store, cfg.kafka, [topics.engagements])
