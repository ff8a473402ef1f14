"""The identity of the topics whose offsets the store keeps.

Offsets mean something only for the topic they were read from. A topic deleted and created
again under the same name (or a worker pointed at another cluster) starts its offsets at 0
again: a worker resuming after its stored offsets would skip every new record until the
offsets passed the old ones, silently. Kafka gives each topic a unique id; the store records
the id of every topic it consumes when it first sees it, and a worker that finds another id
refuses to start, with a message that says what to do.

A running worker checks again whenever the topic may have changed under it (`IdentityGuard`):
before applying the first records after a start whose check could not reach the broker, after
every outage of the broker, when a partition's offsets go back behind the stored ones (a topic
that starts over), and once a minute. Records are applied only after a check passed.
"""
from __future__ import annotations

import logging
import time
from typing import Iterable

from confluent_kafka import KafkaException, TopicCollection

from hirflow.state.graph import GraphStore, IncompatibleStoreError
from hirflow.streams import clients
from hirflow.streams.config import KafkaConfig
from hirflow.streams.metrics import TOPICS_REFUSED

log = logging.getLogger(__name__)


def topic_ids(cfg: KafkaConfig, names: Iterable[str], timeout_s: float = 15) -> dict[str, str]:
    """name -> Kafka topic id ("" where the broker keeps none, with a warning); a topic that
    could not be described (the broker is away, the topic does not exist) is left out."""
    names = list(names)
    admin = clients.admin(cfg)             # held until the answers are in
    futures = admin.describe_topics(TopicCollection(names), request_timeout=timeout_s)
    out = {}
    for name, fut in futures.items():
        try:
            tid = str(fut.result().topic_id or "")
        except KafkaException as exc:             # not created yet: nothing stored for it
            log.warning("cannot describe topic %s (%s); its records wait until it is checked",
                        name, exc.args[0] if exc.args else exc)
            continue
        if not tid.strip("A"):                    # an all-zero id: the broker keeps none
            log.warning("topic %s has no topic id on this broker: a recreated topic cannot "
                        "be told apart", name)
            tid = ""
        out[name] = tid
    return out


def check_topic_identity(store: GraphStore, cfg: KafkaConfig, names: Iterable[str],
                         timeout_s: float = 15) -> set[str]:
    """Record the ids of topics seen for the first time; refuse a topic whose id changed.
    -> the names that could not be checked (not described: the broker is away, or the topic
    does not exist); a broker that keeps no ids passes, since nothing can be compared."""
    names = list(names)
    described = topic_ids(cfg, names, timeout_s)
    known = store.topic_ids()
    now = {n: t for n, t in described.items() if t}
    for name, tid in now.items():
        if name in known and known[name] != tid:
            raise IncompatibleStoreError(
                f"topic {name} is not the topic this state was built from (id {tid}, the store "
                f"has {known[name]}): it was deleted and created again, or this is another "
                f"cluster (the embedded `hirflow broker` keeps topics in memory: a restart "
                f"starts it empty), so the stored offsets do not apply. Start this worker on "
                f"empty state (remove graph.path) to rebuild from the topic as it is, or point "
                f"it at the original.")
    new = {n: t for n, t in now.items() if n not in known}
    if new:
        store.set_topic_ids(new)
    return set(names) - set(described)


class IdentityGuard:
    """When the ingest loop must check its topics' identity before applying records."""

    EVERY_S = 60.0
    RETRY_S = 1.0

    def __init__(self, store: GraphStore, cfg: KafkaConfig, names: Iterable[str], watch) -> None:
        self.store, self.cfg, self.names, self.watch = store, cfg, list(names), watch
        self.verified = False                  # no check has passed since the last outage
        self._outages = watch.outages
        self._last = -1e9

    def due(self, went_back: bool) -> bool:
        """Whether to check now: offsets behind the stored ones (`went_back`); not verified
        (at the start, after a broker outage, after a failed check: at most once a second);
        or a minute since the last check."""
        if self.watch.outages != self._outages:
            self._outages, self.verified = self.watch.outages, False
        since = time.monotonic() - self._last
        return went_back or since >= (self.RETRY_S if not self.verified else self.EVERY_S)

    def check(self) -> bool:
        """-> True when every topic was checked (False: try again later, apply nothing);
        IncompatibleStoreError when one is not the topic the state was built from."""
        self._last = time.monotonic()
        try:
            unchecked = check_topic_identity(self.store, self.cfg, self.names, timeout_s=5)
        except IncompatibleStoreError:
            TOPICS_REFUSED.inc()
            raise
        self.verified = not unchecked
        return self.verified
