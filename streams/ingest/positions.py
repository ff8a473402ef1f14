"""Where the ingest loop's consumer stands, and what it reads off a batch apart from applying
it: assigned after the stored offsets, records behind them, seeking back to re-read a batch,
Kafka's commit of durable offsets confirmed, consumer lag and record counts as metrics, and
the engagements refused for a node key that belongs to another node."""
from __future__ import annotations

import logging

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition

from hirflow.state.events import Engagement
from hirflow.streams.ingest.deadletter import DeadLetters
from hirflow.state.writer import GraphWriter
from hirflow.streams.metrics import APPLIED_OFFSET, CONSUMER_LAG, EVENTS_CONSUMED, EVENTS_SKIPPED

log = logging.getLogger(__name__)


def assign_after_stored(consumer: Consumer, writer: GraphWriter, topics, partitions) -> None:
    """Assign `partitions` of each topic, each from the record after its offset stored in
    state (from the beginning when none is)."""
    tps = []
    for topic in topics:
        for p in partitions:
            stored = writer.stored_offset(topic, p)
            APPLIED_OFFSET.labels(topic, str(p)).set(stored)
            tps.append(TopicPartition(topic, p, stored + 1 if stored >= 0 else OFFSET_BEGINNING))
    consumer.assign(tps)


def confirm_offsets(consumer: Consumer, offsets: dict[tuple[str, int], int]) -> bool:
    """Commit the (durable) `offsets` to Kafka and wait for the answer; False when it failed."""
    try:
        consumer.commit(offsets=[TopicPartition(tp, p, off + 1) for (tp, p), off in offsets.items()],
                        asynchronous=False)
    except KafkaException as exc:
        log.warning("committing offsets to Kafka failed (state is durable; retrying): %s", exc)
        return False
    return True


def went_back(msgs, stored: dict[tuple[str, int], int]) -> bool:
    """Whether a record lies at or behind its partition's `stored` offset: the consumer was
    assigned past them, so its topic started over (or a crash is being replayed)."""
    return any(m.error() is None and m.offset() <= stored.get((m.topic(), m.partition()), -1)
               for m in msgs)


def rewind(consumer: Consumer, msgs) -> None:
    """Seek each partition back to its first record of `msgs`: they are read again."""
    first: dict[tuple[str, int], int] = {}
    for m in msgs:
        if m.error() is None:
            k = (m.topic(), m.partition())
            first[k] = min(first.get(k, m.offset()), m.offset())
    for (topic, p), off in first.items():
        consumer.seek(TopicPartition(topic, p, off))


def report_lag(consumer: Consumer) -> None:
    """hirflow_consumer_lag per assigned partition, from the cached high watermarks."""
    try:
        for tp in consumer.position(consumer.assignment()):
            if tp.offset < 0:
                continue
            _, high = consumer.get_watermark_offsets(tp, cached=True) or (0, 0)
            CONSUMER_LAG.labels(tp.topic, str(tp.partition)).set(max(0, high - tp.offset))
    except Exception as exc:  # metrics must never stop ingest
        log.debug("lag metric failed: %s", exc)


def count_records(counts: dict[str, list[int]]) -> None:
    """Per topic [consumed, applied, skipped] of one batch -> the record counters."""
    for topic, (n_in, _, n_skip) in counts.items():
        if n_in:
            EVENTS_CONSUMED.labels(topic).inc(n_in)
        if n_skip:
            EVENTS_SKIPPED.labels(topic).inc(n_skip)


def refuse_collisions(dead: DeadLetters, good: list[tuple[Engagement, int]], msgs,
                      collided: set[str]) -> list[tuple[Engagement, int]]:
    """Dead-letter the engagements that touch a node whose key belongs to another node; the
    others, in order."""
    kept = []
    for item, m in zip(good, msgs):
        ev = item[0]
        if ev.src in collided or ev.dst in collided:
            dead.send(m, "node_key_collision",
                      f"the 8-byte key of {ev.src if ev.src in collided else ev.dst!r} "
                      f"belongs to another node")
        else:
            kept.append(item)
    return kept
