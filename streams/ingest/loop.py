"""The engagement hot path: a confluent-kafka batch consumer applying events to state.

Per batch: consume up to `batch_max` records, skip anything at or below the offset stored in
RocksDB (a replay after a crash), validate, apply to the write-back cache, send bad records
to the dead-letter topic and the sides of an engagement that another worker owns to the
reverse topic, wait until those are acknowledged, then commit state + dirty markers +
offsets in one RocksDB batch, and only then commit the offsets to Kafka. So Kafka's
committed offset never runs ahead of durable state, and no event is applied twice.

Partitions are assigned statically (`p % worker.count == worker.index`) for the process's
life: a change of the worker set is a restart, with the change log (`streams.scaleout.changelog`)
moving the partitions' state before the loop starts.
"""
from __future__ import annotations

import logging
import time

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from hirflow.state.events import Engagement, EventError, Validator
from hirflow.state.writer import BOTH_SIDES, GraphWriter
from hirflow.streams import clients
from hirflow.streams.worker.broker_watch import WATCH
from hirflow.streams.config import HirflowConfig
from hirflow.streams.ingest.deadletter import DeadLetters
from hirflow.streams.scaleout.routing import partitions_of
from hirflow.streams.metrics import (APPLIED_OFFSET, BATCH_SECONDS, BATCH_SIZE, CACHED_NODES, EVENTS_APPLIED,
                                     EVICTED_EDGES, NODES_EXPIRED)
from hirflow.streams.ingest.positions import (assign_after_stored, confirm_offsets, count_records,
                                             refuse_collisions, report_lag, rewind, went_back)
from hirflow.streams.ingest.side_router import SideRouter
from hirflow.streams.ingest.topic_identity import IdentityGuard
from hirflow.streams.topics import Topics

log = logging.getLogger(__name__)

# a stream quiet this long is idle: Kafka's commit of the newest durable offsets is confirmed
IDLE_CONFIRM_S = 1.0


def owned_partitions(cfg: HirflowConfig) -> list[int]:
    return partitions_of(cfg.worker.index, cfg.worker.count, cfg.kafka.partitions)


class IngestLoop:
    """Owns one consumer and one producer; `run` until the stop event is set."""

    def __init__(self, cfg: HirflowConfig, writer: GraphWriter, topics: Topics,
                 consumer: Consumer | None = None, producer: Producer | None = None) -> None:
        self.cfg = cfg
        self.writer = writer
        self.topics = topics
        self.validator = Validator(cfg.schema)
        self.partitions = owned_partitions(cfg)
        self._owned = frozenset(self.partitions)
        self._single = cfg.worker.count == 1
        self.consumer = consumer or clients.consumer(cfg.kafka, cfg.ingest.group_id)
        self.producer = producer or clients.producer(
            cfg.kafka, on_delivery=lambda err, msg: self.sides.on_delivery(err, msg))
        self.dead = DeadLetters(self.producer, topics.dead_letter, cfg.kafka.max_message_bytes)
        self.sides = SideRouter(writer, self.producer, topics.reverse, self._owned,
                                self.validator, self.dead)
        self._last_lag = 0.0
        self._pending: dict[tuple[str, int], int] = {}   # consumed, not yet durable
        self._apply_seconds = 0.0
        self._last_commit = time.monotonic()
        # the newest durable offsets whose Kafka commit is not confirmed yet: commits are
        # asynchronous, and one that fails (a coordinator busy with a dead member's session
        # after a kill) is confirmed synchronously once the stream is idle, or Kafka's
        # committed offsets would lag the state forever at the end of a stream
        self._unconfirmed: dict[tuple[str, int], int] = {}
        self._last_record = time.monotonic()
        self._last_sweep = time.monotonic()
        self.applied = 0
        # records are applied only once their topics are known to be the state's
        self.identity = IdentityGuard(writer.store, cfg.kafka, [topics.engagements, topics.reverse],
                                      WATCH)
        self._assign()

    # -- setup ----------------------------------------------------------------------------
    def _assign(self) -> None:
        assign_after_stored(self.consumer, self.writer, (self.topics.engagements, self.topics.reverse),
                            self.partitions)
        log.info("ingest assigned partitions %s of %s (resuming after stored offsets)",
                 self.partitions, self.topics.engagements)

    # -- one batch --------------------------------------------------------------------------
    def poll_once(self, timeout: float | None = None) -> int:
        """Consume one batch into memory state; commit when the commit interval is up.
        Returns the number of records consumed."""
        t = self.cfg.ingest.batch_wait_ms / 1000 if timeout is None else timeout
        msgs = self.consumer.consume(self.cfg.ingest.batch_max, timeout=t)
        # the topics' identity, checked whenever it may have changed (with records in hand, or
        # as soon as the broker answers: a recreated topic may hold nothing past our offsets)
        if self.identity.due(bool(msgs) and went_back(msgs, self.writer.offsets)) \
                and (msgs or WATCH.up):
            self.identity.check()
        if msgs and not self.identity.verified:
            rewind(self.consumer, msgs)         # not known to be the state's topics: apply nothing
            time.sleep(0.5)                     # the broker is away: no busy loop
            msgs = []
        if msgs:
            t0 = time.perf_counter()
            with self.writer.lock:
                try:
                    self._pending.update(self._apply(msgs))
                except Exception:
                    self._forget_pending()
                    raise
            self._apply_seconds += time.perf_counter() - t0
            BATCH_SIZE.observe(len(msgs))
        # commit on the interval alone: with short consume waits an empty call is only a
        # gap between fetches, not an idle stream
        now = time.monotonic()
        if msgs:
            self._last_record = now
        due = now - self._last_commit >= self.cfg.ingest.commit_interval_ms / 1000
        if self._pending and due:
            self.commit()
        if self.cfg.graph.expire_after_days and now - self._last_sweep >= 1.0:
            self._last_sweep = now
            expired = self.writer.expire_slice(int(time.time() * 1000))
            if expired:
                NODES_EXPIRED.inc(len(expired))
        elif self._unconfirmed and not msgs and now - self._last_record >= IDLE_CONFIRM_S:
            self._confirm_kafka_offsets()
        self._maybe_lag()
        return len(msgs)

    def commit(self) -> None:
        """Make everything consumed so far durable: sends acked, then one RocksDB batch with
        state + dirty markers + offsets, then (only then) the offsets to Kafka."""
        t0 = time.perf_counter()
        last = self._pending
        with self.writer.lock:
            try:
                self.sides.await_sends()
                for (topic, p), off in last.items():
                    self.writer.applied(topic, p, off)
                self.writer.commit()
            except Exception:
                self._forget_pending()
                raise
        self.consumer.commit(offsets=[TopicPartition(tp, p, off + 1)
                                      for (tp, p), off in last.items()], asynchronous=True)
        self._unconfirmed.update(last)
        for (topic, p), off in last.items():
            APPLIED_OFFSET.labels(topic, str(p)).set(off)
        BATCH_SECONDS.observe(self._apply_seconds + time.perf_counter() - t0)
        self._pending = {}
        self._apply_seconds = 0.0
        self._last_commit = time.monotonic()
        CACHED_NODES.set(self.writer.cached_nodes)
        EVICTED_EDGES.set(self.writer.evicted_edges)
        self.dead.flush_log()

    def _apply(self, msgs) -> dict[tuple[str, int], int]:
        eng, rev = self.topics.engagements, self.topics.reverse
        stored = self.writer.offsets
        self.validator.refresh_clock()
        decode = self.validator.decode_engagement
        writer = self.writer
        last: dict[tuple[str, int], int] = {}
        good: list[tuple[Engagement, int]] = []
        good_msgs = []                              # the record each of `good` came from
        counts = {eng: [0, 0, 0], rev: [0, 0, 0]}   # consumed, applied, skipped
        for m in msgs:
            err = m.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    continue
                if err.fatal() or not err.retriable():
                    raise RuntimeError(f"consumer error: {err}")
                log.warning("transient consumer error: %s", err)
                continue
            topic, p, off = m.topic(), m.partition(), m.offset()
            c = counts[topic]
            c[0] += 1
            if off <= stored.get((topic, p), -1):
                c[2] += 1
                continue
            last[(topic, p)] = off
            if topic == eng:
                try:
                    ev = decode(m.value())
                except EventError as exc:
                    self.dead.send(m, exc.reason, exc.detail)
                    continue
                except Exception as exc:     # a hostile record must not stop ingest
                    self.dead.send(m, "undecodable", f"{type(exc).__name__}: {exc}"[:1000])
                    continue
                sides = BOTH_SIDES if self._single else self.sides.route(ev, p, off)
                if sides:
                    good.append((ev, sides))
                    good_msgs.append(m)
            else:
                item = self.sides.receive(m, p)
                if item is not None:
                    good.append(item)
                    good_msgs.append(m)
        collided = writer.apply_batch(good)
        if collided:                                # dead letters, sent before the commit
            good = refuse_collisions(self.dead, good, good_msgs, collided)
        count_records(counts)
        EVENTS_APPLIED.labels(eng).inc(len(good))
        self.applied += len(good)
        return last

    # -- metrics --------------------------------------------------------------------------
    def _maybe_lag(self) -> None:
        now = time.monotonic()
        if now - self._last_lag < self.cfg.worker.metrics_interval_s:
            return
        self._last_lag = now
        report_lag(self.consumer)

    # -- lifecycle ------------------------------------------------------------------------
    def _forget_pending(self) -> None:
        """After a failure: memory state since the last commit is dropped, and so are the
        offsets it covered (the consumer must resume from the stored offsets: restart)."""
        self.writer.discard_uncommitted()
        self._pending = {}

    def _confirm_kafka_offsets(self) -> None:
        """Commit the newest durable offsets to Kafka and wait for the answer (the stream is
        idle, so the wait costs nothing); on failure the next idle interval tries again."""
        if confirm_offsets(self.consumer, self._unconfirmed):
            self._unconfirmed = {}
        else:
            self._last_record = time.monotonic()       # wait another idle second

    def flush(self) -> None:
        """Commit whatever was consumed since the last commit (graceful shutdown)."""
        if self._pending:
            self.commit()

    def close(self) -> None:
        """Graceful stop: make what was consumed durable, then close the clients."""
        try:
            self.flush()
            self.producer.flush(10)
        finally:
            self.consumer.close()
