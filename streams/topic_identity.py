"""The identity of the topics whose offsets the store keeps.

Offsets mean something only for the topic they were read from. A topic deleted and created
again under the same name (or a worker pointed at another cluster) starts its offsets at 0
again: a worker resuming after its stored offsets would skip every new record until the
offsets passed the old ones, silently. Kafka gives each topic a unique id; the store records
the id of every topic it consumes when it first sees it, and a worker that finds another id
refuses to start, with a message that says what to do.
"""
from __future__ import annotations

import logging
from typing import Iterable

from confluent_kafka import KafkaException, TopicCollection

from hirflow.state.graph import GraphStore, IncompatibleStoreError
from hirflow.streams import clients
from hirflow.streams.config import KafkaConfig

log = logging.getLogger(__name__)


def topic_ids(cfg: KafkaConfig, names: Iterable[str]) -> dict[str, str]:
    """name -> Kafka topic id (brokers without topic ids are left out, with a warning)."""
    names = list(names)
    admin = clients.admin(cfg)             # held until the answers are in
    futures = admin.describe_topics(TopicCollection(names), request_timeout=15)
    out = {}
    for name, fut in futures.items():
        try:
            tid = str(fut.result().topic_id or "")
        except KafkaException as exc:             # not created yet: nothing stored for it
            log.warning("cannot describe topic %s (%s); its identity is checked next start",
                        name, exc.args[0] if exc.args else exc)
            continue
        if tid.strip("A"):                        # an all-zero id: the broker keeps none
            out[name] = tid
        else:
            log.warning("topic %s has no topic id on this broker: a recreated topic cannot "
                        "be told apart", name)
    return out


def check_topic_identity(store: GraphStore, cfg: KafkaConfig, names: Iterable[str]) -> None:
    """Record the ids of topics seen for the first time; refuse a topic whose id changed."""
    now = topic_ids(cfg, names)
    known = store.topic_ids()
    for name, tid in now.items():
        if name in known and known[name] != tid:
            raise IncompatibleStoreError(
                f"topic {name} is not the topic this state was built from (id {tid}, the store "
                f"has {known[name]}): it was deleted and created again, or this is another "
                f"cluster, so the stored offsets do not apply. Start this worker on empty "
                f"state to rebuild from the topic as it is, or point it at the original.")
    new = {n: t for n, t in now.items() if n not in known}
    if new:
        store.set_topic_ids(new)
